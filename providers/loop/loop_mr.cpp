// SPDX-License-Identifier: MIT
// Memory regions and the key table.  Every access to memory, local or
// remote, goes through mr_lookup() before a byte moves.
#include "loop.h"

#include <atomic>
#include <cerrno>
#include <cstring>
#include <random>
#include <sys/random.h>

namespace loop {

namespace {

constexpr uint32_t kRemoteRights =
	IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
constexpr uint32_t kSupportedAccess = IBV_ACCESS_LOCAL_WRITE | kRemoteRights |
				      IBV_ACCESS_MW_BIND | IBV_ACCESS_RELAXED_ORDERING;

uint8_t random_key()
{
	static thread_local std::mt19937 rng{[] {
		uint32_t seed;
		if (getrandom(&seed, sizeof(seed), 0) != sizeof(seed))
			seed = static_cast<uint32_t>(now_ns());
		return seed;
	}()};
	return static_cast<uint8_t>(rng());
}

std::atomic_ref<uint32_t> mr_state(sv_mr_rec &m)
{
	return std::atomic_ref<uint32_t>(m.state);
}

// Checks the access flags as the spec and rdma-core do.
int check_access(int access)
{
	if (access & ~static_cast<int>(kSupportedAccess | IBV_ACCESS_OPTIONAL_RANGE))
		return EINVAL;
	// Remote write or atomic needs local write (IB spec o10-8.2).
	if ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) &&
	    !(access & IBV_ACCESS_LOCAL_WRITE))
		return EINVAL;
	return 0;
}

// Allocates a key slot and publishes the record.  Returns the slot or -errno.
int publish_mr(loop_context *lctx, uint32_t pdn, uint64_t iova, uint64_t length,
	       uint64_t addr, uint32_t access, uint32_t kind, uint32_t &key_out)
{
	fabric &fab = *lctx->fab;
	sv_registry *r = fab.reg();
	registry_guard g(fab);
	// Start the search at a random point: keys do not come in sequence.
	uint32_t start = (static_cast<uint32_t>(random_key()) << 6) % SV_MAX_MRS;
	for (uint32_t n = 0; n < SV_MAX_MRS; n++) {
		uint32_t i = (start + n) % SV_MAX_MRS;
		if (i == 0)
			continue; // Key 0 stays invalid: a zeroed WR never names memory.
		sv_mr_rec &m = r->mrs[i];
		if (mr_state(m).load(std::memory_order_acquire) != SV_MR_FREE)
			continue;
		uint8_t k = random_key();
		if (k == (m.key & 0xff))
			k++; // Never hand the previous key of this slot out again at once.
		m.key = k;
		m.owner_lease = static_cast<uint32_t>(lctx->lease);
		m.owner_gen = lctx->lease_gen;
		m.pdn = pdn;
		m.access = access;
		m.iova = iova;
		m.length = length;
		m.addr = addr;
		m.kind = kind;
		m.bound_qpn = 0;
		m.parent = 0;
		mr_state(m).store(SV_MR_VALID, std::memory_order_release);
		key_out = (i << SV_MR_KEY_BITS) | k;
		return static_cast<int>(i);
	}
	return -ENOMEM;
}

void unpublish_mr(fabric &fab, uint32_t slot)
{
	registry_guard g(fab);
	mr_state(fab.reg()->mrs[slot]).store(SV_MR_FREE, std::memory_order_release);
}

} // namespace

int mr_lookup(fabric &fab, uint32_t key, uint32_t owner_lease, uint32_t pdn, uint64_t iova,
	      uint64_t len, uint32_t need, uint32_t qpn, mr_hit &hit)
{
	uint32_t slot = key >> SV_MR_KEY_BITS;
	if (slot == 0 || slot >= SV_MAX_MRS)
		return ENOENT;
	sv_mr_rec &m = fab.reg()->mrs[slot];
	if (mr_state(m).load(std::memory_order_acquire) != SV_MR_VALID)
		return ENOENT;
	// Copy the record, then confirm it did not change under us.
	sv_mr_rec c;
	memcpy(&c, &m, sizeof(c));
	std::atomic_thread_fence(std::memory_order_acquire);
	if (mr_state(m).load(std::memory_order_relaxed) != SV_MR_VALID || c.key != m.key)
		return ENOENT;
	if ((c.key & 0xff) != (key & 0xff) || c.owner_lease != owner_lease)
		return ENOENT;
	if (c.pdn != pdn)
		return EACCES;
	if ((c.access & need) != need)
		return EACCES;
	if (c.kind == SV_MR_KIND_MW2 && c.bound_qpn != qpn)
		return EACCES;
	if (len && (iova < c.iova || len > c.length || iova - c.iova > c.length - len))
		return ERANGE;
	if (!len && c.length && (iova < c.iova || iova - c.iova > c.length))
		return ERANGE;
	hit.addr = c.addr + (iova - c.iova);
	hit.kind = c.kind;
	hit.slot = slot;
	return 0;
}

ibv_mr *loop_reg_mr(ibv_pd *pd, void *addr, size_t length, uint64_t hca_va, int access)
{
	access &= ~IBV_ACCESS_OPTIONAL_RANGE | IBV_ACCESS_RELAXED_ORDERING;
	int err = check_access(access);
	if (err) {
		errno = err;
		return nullptr;
	}
	if (!length || length > kMaxMrSize || (!addr && length)) {
		errno = EINVAL;
		return nullptr;
	}
	loop_context *lctx = to_loop_context(pd->context);
	auto *mr = new (std::nothrow) loop_mr{};
	if (!mr) {
		errno = ENOMEM;
		return nullptr;
	}
	uint32_t key;
	int slot = publish_mr(lctx, to_loop_pd(pd)->pdn, hca_va, length,
			      reinterpret_cast<uintptr_t>(addr), static_cast<uint32_t>(access),
			      SV_MR_KIND_MR, key);
	if (slot < 0) {
		delete mr;
		errno = -slot;
		return nullptr;
	}
	mr->slot = static_cast<uint32_t>(slot);
	mr->vmr.mr_type = IBV_MR_TYPE_MR;
	mr->vmr.access = access;
	ibv_mr &m = mr->vmr.ibv_mr;
	m.lkey = m.rkey = key;
	m.handle = key;
	return &m;
}

ibv_mr *loop_alloc_null_mr(ibv_pd *pd)
{
	loop_context *lctx = to_loop_context(pd->context);
	auto *mr = new (std::nothrow) loop_mr{};
	if (!mr) {
		errno = ENOMEM;
		return nullptr;
	}
	uint32_t key;
	int slot = publish_mr(lctx, to_loop_pd(pd)->pdn, 0, UINT64_MAX, 0,
			      IBV_ACCESS_LOCAL_WRITE, SV_MR_KIND_NULL, key);
	if (slot < 0) {
		delete mr;
		errno = -slot;
		return nullptr;
	}
	mr->slot = static_cast<uint32_t>(slot);
	mr->vmr.mr_type = IBV_MR_TYPE_NULL_MR;
	ibv_mr &m = mr->vmr.ibv_mr;
	m.context = pd->context;
	m.pd = pd;
	m.lkey = m.rkey = key;
	m.handle = key;
	return &m;
}

int loop_dereg_mr(verbs_mr *vmr)
{
	loop_mr *mr = to_loop_mr(&vmr->ibv_mr);
	loop_context *lctx = to_loop_context(vmr->ibv_mr.context);
	unpublish_mr(*lctx->fab, mr->slot);
	delete mr;
	return 0;
}

int loop_rereg_mr(verbs_mr *vmr, int flags, ibv_pd *pd, void *addr, size_t length, int access)
{
	loop_mr *mr = to_loop_mr(&vmr->ibv_mr);
	loop_context *lctx = to_loop_context(vmr->ibv_mr.context);
	fabric &fab = *lctx->fab;
	if (flags & IBV_REREG_MR_CHANGE_ACCESS) {
		access &= ~IBV_ACCESS_OPTIONAL_RANGE | IBV_ACCESS_RELAXED_ORDERING;
		int err = check_access(access);
		if (err)
			return err;
	}
	if ((flags & IBV_REREG_MR_CHANGE_TRANSLATION) && length > kMaxMrSize)
		return EINVAL;
	registry_guard g(fab);
	sv_mr_rec &m = fab.reg()->mrs[mr->slot];
	// Take the key out of service while the record changes.
	mr_state(m).store(SV_MR_INVALID, std::memory_order_release);
	if (flags & IBV_REREG_MR_CHANGE_PD)
		m.pdn = to_loop_pd(pd)->pdn;
	if (flags & IBV_REREG_MR_CHANGE_ACCESS)
		m.access = static_cast<uint32_t>(access);
	if (flags & IBV_REREG_MR_CHANGE_TRANSLATION) {
		m.addr = reinterpret_cast<uintptr_t>(addr);
		m.iova = reinterpret_cast<uintptr_t>(addr);
		m.length = length;
	}
	// The keys stay as they were, as on mlx5: peers that hold the rkey keep
	// using it against the new translation and rights.
	mr_state(m).store(SV_MR_VALID, std::memory_order_release);
	return 0;
}

} // namespace loop
