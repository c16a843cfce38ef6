// SPDX-License-Identifier: MIT
// The copy engine: moves bytes between this process and a peer's registered
// memory.  Within one process it is memcpy; across processes it is one
// cross-memory-attach system call per message (process_vm_writev/readv),
// or per batch of messages (xfer_moves), which copies straight into the
// target's buffer with no staging.
#pragma once

#include <sys/types.h>
#include <sys/uio.h>

#include "tunables.h"

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>

struct sv_mr_rec;

namespace loop {

enum class xfer_dir { to_peer, from_peer };

// Copies the bytes described by local[] into (or from) remote[]; both lists
// cover the same number of bytes.  Returns 0 or an errno: ESRCH (the peer
// is gone), EFAULT (an address is not mapped on one side), EPERM (the kernel
// refuses cross-memory attach).
// This process's pid without a system call (glibc's getpid() is one, and
// the data path asked it on every copy): read once and kept in a page
// that the kernel zeroes in a child of any kind of fork (MADV_WIPEONFORK:
// fork, _Fork, clone without CLONE_VM), where it is read again.
pid_t self_pid();

int xfer(pid_t pid, bool same_process, const iovec *local, int nlocal, const iovec *remote,
	 int nremote, xfer_dir dir);

// Where a target-side segment lives.
enum class seg_kind : uint8_t {
	peer,	// In the target's address space: cross-memory attach (or memcpy in-process)
	peer_checked, // Like peer, but may be unmapped (ODP): a checked system call even in-process
	mapped, // Mapped into this process (an fd-backed MR): copied by the kernel between
		// two of our own addresses (a file shrunk under us is EFAULT, not SIGBUS)
	mapped_direct, // Mapped, of a memfd sealed against shrinking, writable: plain
		       // memcpy, no system call (peer_maps.cpp)
	null,	// The null MR: writes are dropped, reads give zeros
	wire,	// On another host (rocev2): base is the remote address, key the rkey
};

struct rseg {
	void *base;
	size_t len;
	seg_kind kind;
	// A mapped segment's hold on this process's mapping of the peer's
	// object: the mapping is unmapped only once no rseg (or mr_hit) that
	// points into it is left, so a cache eviction in another thread never
	// pulls it from under a copy.  Empty for the other kinds.
	std::shared_ptr<void> pin = {};
	uint32_t key = 0; // wire: the rkey the request carries
	// A mapped segment: the address of base's byte in the owner (atomics
	// lock by it, so that every process agrees on the lock of a word).
	uint64_t owner_addr = 0;
	// A segment of a registration (reached by the owner's addresses, or
	// through a mapping of its memory): the registration, which each copy
	// holds (mr_copiers.h) so that the owner's dereg or rereg waits it
	// out.
	sv_mr_rec *mr = nullptr;
	uint32_t mr_cookie = 0;
	// Memory over a file: base's byte as the file's (mr_file_word), for
	// the atomic locks' second stripe; 0 for anything else.
	uint64_t file_word = 0;
};

// Like xfer(), with target segments of mixed kinds.  Runs of peer segments
// go in one system call each.  relaxed: the target granted
// IBV_ACCESS_RELAXED_ORDERING, so a large write may be placed out of
// address order (see docs/memory.md); without it bytes land in order.
// local_checked: some local memory may be unmapped (ODP), so no copy
// touches it but the kernel's, even into a sealed mapping.
int xfer_segs(pid_t pid, bool same_process, const iovec *local, int nlocal, const rseg *remote,
	      int nremote, xfer_dir dir, bool relaxed = false, bool local_checked = false);

struct tp_move;

// Runs the transfers ops[0..n) (transport.h) with a peer in process pid
// (self: this process), in order, stopping at the first that fails:
// returns its errno (as xfer_segs) and *done receives how many finished
// before it.  The cross-memory-attach pieces of all of them share one
// system call per IOV_MAX iovecs; a call the kernel cuts short is mapped
// to the transfer holding the first byte that did not land, and one that
// fails as a whole is run again one transfer at a time, so each transfer
// gets the answer it would have got alone.
int xfer_moves(pid_t pid, bool self, const tp_move *ops, size_t n, size_t *done);

// Writes of kRelaxedMinBytes or more into a relaxed-ordering MR place
// their last kRelaxedChunk bytes first, then the rest in address order
// (tunables.h): code that wrongly takes the last byte for the whole
// message fails here, not on the first NIC that reorders, and the bulk
// still streams at memcpy's rate.  relaxed_copy is that order for memory
// mapped here; add_pieces (xfer.cpp) makes the same order of pieces.
//
// Without relaxed ordering, a WRITE's last kOrderedTail bytes are stored
// after all of its other bytes (ordered_copy): a poller that sees its last
// byte sees the whole message (docs/memory.md).  A single memcpy does not
// give that: glibc's copy of 256 bytes to 2 KiB (and of 256 KiB) on this
// machine's AVX-512 path stores the end before parts of the body
// (tests/unit/test_relaxed.cpp watches the order).  On x86 stores become
// visible in program order; the release fence keeps the compiler (and a
// weaker machine) from moving the tail's stores above the body's.
inline void ordered_copy(char *dst, const char *src, size_t len)
{
	if (len <= kOrderedTail) {
		memcpy(dst, src, len);
		return;
	}
	size_t head = len - kOrderedTail;
	memcpy(dst, src, head);
	std::atomic_thread_fence(std::memory_order_release);
	memcpy(dst + head, src + head, kOrderedTail);
}

inline void relaxed_copy(char *dst, const char *src, size_t len, bool relaxed)
{
	if (!relaxed) {
		ordered_copy(dst, src, len);
	} else if (len >= kRelaxedMinBytes) {
		size_t head = len - kRelaxedChunk;
		memcpy(dst + head, src + head, kRelaxedChunk);
		memcpy(dst, src, head);
	} else {
		memcpy(dst, src, len); // Any order is the target's to accept
	}
}

// Reads or writes 8 bytes at a peer address (for atomics).
// An 8-byte word of a peer's fd-backed object mapped into this process:
// through the kernel, so that a file its owner shrank gives EFAULT rather
// than SIGBUS here.
int xfer_mapped_word(uint64_t addr, uint64_t *value, xfer_dir dir);
int xfer_word(pid_t pid, bool same_process, uint64_t remote_addr, uint64_t *value, xfer_dir dir);

} // namespace loop
