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

// Owner side: allocates an object slot and a segment of `bytes` bytes whose
// sv_queue_hdr is filled in.  Returns the mapping or nullptr with errno.
// extra_bytes are added after the slots (a CQ's payload array).
void *queue_create(fabric &fab, int lease, sv_obj_kind kind, uint32_t entries,
		   uint32_t entry_size, uint32_t header_size, uint32_t max_sge, obj_ref &ref,
		   size_t extra_bytes = 0);
// Owner side: unmaps, unlinks and frees the slot.
void queue_destroy(fabric &fab, const obj_ref &ref, void *map);

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
