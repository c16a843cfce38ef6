// SPDX-License-Identifier: MIT
// Queue segments: a CQ ring, RQ, SRQ or service ring in its own /dev/shm
// segment, created by its owner (O_EXCL, under a name with a random nonce)
// and mapped by any process that delivers into it, after fstat checks.
#pragma once

#include "fabric.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace loop {

// The largest queue segment anyone makes: a CQ of the most entries with its
// payload array, with room to spare (loop_cq.cpp asserts it).  A bigger file
// is not one of ours.
inline constexpr size_t kMaxQueueBytes = size_t(1) << 32;

struct obj_ref {
	uint32_t slot = 0;
	uint32_t gen = 0;
};

// ---- Queues in memory the application placed (parent-domain allocators) ----

// A file the application said its allocator's memory lives in
// (softverbs_dv_alloc_fd): our own duplicate of its descriptor, closed with
// the last holder (the published range, and every queue placed in it), so
// that the number peers read from sv_obj_rec.place_fd stays this file's
// while a queue in it lives.
struct placed_file {
	int fd;
	explicit placed_file(int f) : fd(f) {}
	placed_file(const placed_file &) = delete;
	placed_file &operator=(const placed_file &) = delete;
	~placed_file();
};

// Publishes [addr, addr + len) as bytes [offset, offset + len) of the file
// behind fd (duplicated; the caller may close fd), replacing any range that
// overlaps it; fd < 0 forgets the ranges that overlap it.  The file must be
// a tmpfs file sealed against shrinking; a memfd that allows sealing is
// sealed here.  0 or an errno: EINVAL (a range that wraps, an offset that
// is not page-aligned while addr is, a file that is not or cannot be
// sealed), EBADF, ENOMEM.
int place_publish(void *addr, size_t len, int fd, uint64_t offset);

// Fills the free object record o (under the registry lock) for a new
// object of kind owned by lease: a new generation, the fields of other
// kinds cleared.  The caller sets its kind's fields, then publishes it
// (in_use, with release).
void obj_rec_init(sv_registry *r, sv_obj_rec &o, int lease, sv_obj_kind kind);
// The published file holding [mem, mem + len) and mem's offset in it, or
// nullptr when no published range holds all of it.
std::shared_ptr<placed_file> place_find(const void *mem, size_t len, uint64_t &offset);

// Where queue_create puts the queue instead of a /dev/shm segment: `bytes`
// bytes at mem (page-aligned), which are bytes [offset, offset + bytes) of
// file's (page-aligned too).  The caller keeps file for the queue's life.
struct queue_place {
	void *mem = nullptr;
	const placed_file *file = nullptr;
	uint64_t offset = 0;
};

// Owner side: allocates an object slot and a segment of `bytes` bytes whose
// sv_queue_hdr is filled in.  Returns the mapping or nullptr with errno.
// extra_bytes are added after the slots (a CQ's payload array).  With
// place, the queue goes there (place->mem is returned), not into a segment.
void *queue_create(fabric &fab, int lease, sv_obj_kind kind, uint32_t entries,
		   uint32_t entry_size, uint32_t header_size, uint32_t max_sge, obj_ref &ref,
		   size_t extra_bytes = 0, const queue_place *place = nullptr);
// The bytes queue_create takes (or asks an allocator for).
size_t queue_total_bytes(uint32_t header_size, uint32_t entries, uint32_t entry_size,
			 size_t extra_bytes);
// Owner side: unmaps, unlinks and frees the slot.  A placed queue (placed:
// true) is neither unmapped nor unlinked: its memory goes back to whoever
// gave it, after this.
void queue_destroy(fabric &fab, const obj_ref &ref, void *map, bool placed = false);

struct queue_mapping;
// A peer's queue as this process maps it, held: the mapping stays while any
// holder has it, even after the slot is reused and the cache moved on (the
// same counting as peer_map's), so a thread still pushing through the old
// pointer never touches unmapped memory.
class queue_hold {
public:
	queue_hold() = default;
	queue_hold(std::shared_ptr<queue_mapping> m, void *addr) : m_(std::move(m)), addr_(addr) {}
	template <typename T> T *as() const
	{
		return static_cast<T *>(addr_);
	}
	explicit operator bool() const
	{
		return addr_ != nullptr;
	}

private:
	std::shared_ptr<queue_mapping> m_;
	void *addr_ = nullptr;
};

// Peer side: the mapping of a live object, or an empty hold if the object is
// gone (its slot freed or reused) or the segment is not a valid queue of
// `kind`.  Mappings are cached per process; the generation check makes a
// stale cache entry harmless, and a replaced one is unmapped when its last
// holder lets go.
queue_hold queue_map(fabric &fab, const obj_ref &ref, sv_obj_kind kind);

size_t queue_bytes(uint32_t header_size, uint32_t entries, uint32_t entry_size);
// The segment of a live object: <registry>-q<slot>.<gen>.<nonce>, the nonce
// read from the object's record (the caller knows the record is current).
std::string queue_name(const fabric &fab, const obj_ref &ref);
// Reports a refused segment on stderr, once per process per reason kind (and
// every time under SOFTVERBS_DEBUG).
void report_refused(const std::string &path, const std::string &why);

inline uint32_t round_pow2(uint32_t v)
{
	uint32_t p = 1;
	while (p < v)
		p <<= 1;
	return p;
}

} // namespace loop
