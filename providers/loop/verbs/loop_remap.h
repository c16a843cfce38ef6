// SPDX-License-Identifier: MIT
// Registered anonymous memory moved onto a shared file (the process's
// arena memfd), at the same addresses and with the same contents, so that
// peers map it and copy with memcpy instead of one cross-memory-attach
// system call per access.  docs/memory.md, "Remapped registrations", gives
// the rules and the hazards.
#pragma once

#include <cstddef>
#include <cstdint>
#include <sys/ioctl.h>

namespace loop {

// PROCMAP_QUERY (Linux 6.11): one VMA of /proc/self/maps by address,
// spelled here: Debian 12's headers predate it.
struct procmap_query_arg {
	uint64_t size, query_flags, query_addr, vma_start, vma_end, vma_flags, vma_page_size,
		vma_offset, inode;
	uint32_t dev_major, dev_minor, vma_name_size, build_id_size;
	uint64_t vma_name_addr, build_id_addr;
};
static_assert(sizeof(procmap_query_arg) == 104, "struct procmap_query");
constexpr unsigned long kProcmapQuery = _IOWR('f', 17, procmap_query_arg);
constexpr uint64_t kVmaReadable = 0x01, kVmaWritable = 0x02, kVmaExecutable = 0x04,
		   kVmaShared = 0x08, kVmaCoveringOrNext = 0x10;

// Whether SOFTVERBS_REMAP allows it (default yes; "0" turns it off).
bool remap_enabled();

// Moves [addr, addr + len) onto the arena, or shares the block of an
// earlier registration that holds the whole range.  Only page-aligned
// ranges of private anonymous memory (heap or mmap) whose mappings carry
// no attribute a move would lose qualify.  Returns true with the arena's
// descriptor, the range's offset in it and the arena's inode; false leaves
// the memory as it was (the MR then uses cross-memory attach).
bool remap_acquire(uintptr_t addr, size_t len, int &fd, uint64_t &off, uint64_t &ino);

// Whether one shared mapping of a file covers [addr, addr + len) (a memfd,
// a /dev/shm or other file mapped MAP_SHARED, or shared anonymous memory):
// then the file's inode and the offset of addr's byte in it.  The same
// bytes mapped at two addresses, in one process or two, give the same
// answer (what the atomic locks need, docs/design.md "Atomics").
bool shared_file_range(uintptr_t addr, size_t len, uint64_t &ino, uint64_t &off);

// Drops a hold taken by remap_acquire; the last one copies the range back
// into private anonymous memory (where it is still the arena's) and frees
// the arena's pages.
void remap_release(uintptr_t addr, size_t len);

// Plain MRs that stay where they are (reached by cross-memory attach) are
// noted here, added and removed: a peer's process_vm_writev into one may
// hold a page it pinned before a move and write it after, so no range that
// overlaps one moves in or out while it lives (a block waits for it).
void remap_note_plain(uintptr_t addr, size_t len, bool add);

} // namespace loop
