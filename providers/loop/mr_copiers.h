// SPDX-License-Identifier: MIT
// Copies into (or out of) registered memory by its owner's addresses
// (cross-memory attach from a peer, memcpy within the owner, the owner's
// service thread) against the owner's ibv_dereg_mr and ibv_rereg_mr.
//
// An HCA's deregistration returns only once the key is out of service and
// no DMA through it is left: after it, the memory is the application's
// again, to reuse for anything.  A copier here resolves the key (the
// record VALID) and then copies with a system call that takes time; a
// deregistration in between used to return while the copy went on, and a
// whole late WRITE landed in memory the application had reused (found by a
// helper's probe: 64 KiB to 55 MB after ibv_dereg_mr returned).
//
// So each copy holds the record: sv_mr_rec.copiers counts the copies in
// flight under one registration (its cookie in the high 32 bits), taken
// before the record is checked once more and dropped after the copy; the
// owner takes the record out of service (INVALID, with a store-load
// fence), then waits until no copy of that registration holds it.  Either
// the copier sees the record out of service (and copies nothing), or the
// owner sees its count and waits for it (a Dekker pair: both sides fence
// between their store and their load).
//
// Each registration starts its count at 0 under its own cookie before it is
// published (mr_new_cookie, loop_mr.cpp), and a copier counts itself only
// under its own cookie: a copier of an older registration never touches
// the count of the one in force (it finds another cookie and copies
// nothing).  A count a copier frozen or killed inside its copy leaves is
// waited for at most kCopyWaitMs (tunables.h), and goes with the next
// registration of the slot.
#pragma once

#include "small_vec.h"
#include "softverbs-abi.h"

#include <atomic>
#include <cstdint>

namespace loop {

// Takes a hold of m for a copy under the registration of cookie: false
// (nothing held) when the record is out of service or of another
// registration now.
[[gnu::always_inline]] inline bool mr_copy_hold(sv_mr_rec *m, uint32_t cookie)
{
	std::atomic_ref<uint64_t> w(m->copiers);
	uint64_t v = w.load(std::memory_order_relaxed);
	uint64_t nv;
	do {
		if (static_cast<uint32_t>(v >> 32) != cookie || static_cast<uint32_t>(v) == UINT32_MAX)
			return false; // Another registration's count now, or none to add to
		nv = v + 1;
	} while (!w.compare_exchange_weak(v, nv, std::memory_order_seq_cst,
					  std::memory_order_relaxed));
	if (std::atomic_ref<uint32_t>(m->state).load(std::memory_order_seq_cst) == SV_MR_VALID &&
	    std::atomic_ref<uint32_t>(m->cookie).load(std::memory_order_relaxed) == cookie)
		return true;
	// Out of service since the copier checked it: given back at once.
	v = nv;
	while (static_cast<uint32_t>(v >> 32) == cookie && static_cast<uint32_t>(v) &&
	       !w.compare_exchange_weak(v, v - 1, std::memory_order_release,
					std::memory_order_relaxed))
		;
	return false;
}

// Drops a hold taken by mr_copy_hold (none left to drop if the slot was
// registered again since: the count is that registration's then).
inline void mr_copy_release(sv_mr_rec *m, uint32_t cookie)
{
	std::atomic_ref<uint64_t> w(m->copiers);
	uint64_t v = w.load(std::memory_order_relaxed);
	while (static_cast<uint32_t>(v >> 32) == cookie && static_cast<uint32_t>(v) &&
	       !w.compare_exchange_weak(v, v - 1, std::memory_order_release,
					std::memory_order_relaxed))
		;
}

// A hold dropped when this goes (an exception included).
struct mr_copy_guard {
	sv_mr_rec *m = nullptr;
	uint32_t cookie = 0;
	mr_copy_guard() = default;
	mr_copy_guard(const mr_copy_guard &) = delete;
	mr_copy_guard &operator=(const mr_copy_guard &) = delete;
	bool take(sv_mr_rec *mr, uint32_t c)
	{
		if (!mr_copy_hold(mr, c))
			return false;
		m = mr;
		cookie = c;
		return true;
	}
	// Drops the hold now (the copy is done), before the guard goes.
	void release()
	{
		if (m)
			mr_copy_release(m, cookie);
		m = nullptr;
	}
	~mr_copy_guard() { release(); }
};

// Several registrations held for one transfer, each once (its pieces may
// name one many times), all dropped when this goes.
struct mr_copy_holds {
	struct hold {
		sv_mr_rec *mr;
		uint32_t cookie;
	};
	small_vec<hold, 4> held;
	mr_copy_holds() = default;
	mr_copy_holds(const mr_copy_holds &) = delete;
	mr_copy_holds &operator=(const mr_copy_holds &) = delete;
	// False (nothing more held) when m is out of service or of another
	// registration than cookie.
	bool add(sv_mr_rec *m, uint32_t c)
	{
		for (const hold &h : held)
			if (h.mr == m && h.cookie == c)
				return true;
		if (!mr_copy_hold(m, c))
			return false;
		held.push_back({m, c});
		return true;
	}
	void drop()
	{
		for (const hold &h : held)
			mr_copy_release(h.mr, h.cookie);
		held.clear();
	}
	~mr_copy_holds() { drop(); }
};

// The owner, after taking m out of service (INVALID, then a seq_cst
// fence: mr_begin_change): waits until no copy under cookie holds it, at
// most kCopyWaitMs.  Not under the registry's lock (copies take none, but
// the wait may be long for every process that needs the lock).
void mr_copy_wait(sv_mr_rec &m, uint32_t cookie);
// Whether a copy under cookie holds m now (after m was taken out of
// service: mr_copy_wait's look, for a caller that must not block).
bool mr_copy_busy(sv_mr_rec &m, uint32_t cookie);

} // namespace loop
