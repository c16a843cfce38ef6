// SPDX-License-Identifier: MIT
// Device memory (ibv_alloc_dm): memory "on the device", here an anonymous
// shared mapping that belongs to the context rather than to the application.
// Peers reach it through the same key checks and copy path as any MR.
#include "loop.h"
#include "objects.h"

#include <cerrno>
#include <cstring>
#include <sys/mman.h>

namespace loop {

namespace {

constexpr uint32_t kDmAlign = 4; // Copies to and from DM move whole 32-bit words

int dm_copy_check(loop_dm *dm, uint64_t offset, size_t length)
{
	if (!dm->life.is(kLifeDm))
		return life_bad("ibv_memcpy_to/from_dm", dm, dm->life, kLifeDm);
	if ((offset % kDmAlign) || (length % kDmAlign) || offset > dm->length ||
	    length > dm->length - offset)
		return EINVAL;
	return 0;
}

int dm_to(ibv_dm *ibdm, uint64_t offset, const void *host, size_t length)
{
	loop_dm *dm = to_loop_dm(ibdm);
	int err = dm_copy_check(dm, offset, length);
	if (err)
		return err;
	memcpy(static_cast<char *>(dm->addr) + offset, host, length);
	return 0;
}

int dm_from(void *host, ibv_dm *ibdm, uint64_t offset, size_t length)
{
	loop_dm *dm = to_loop_dm(ibdm);
	int err = dm_copy_check(dm, offset, length);
	if (err)
		return err;
	memcpy(host, static_cast<char *>(dm->addr) + offset, length);
	return 0;
}

std::mutex g_dm_lock;
std::atomic<uint32_t> g_next_handle{1};

} // namespace

ibv_dm *loop_alloc_dm(ibv_context *ctx, ibv_alloc_dm_attr *attr)
{
	if (ctx_closed(ctx, "ibv_alloc_dm"))
		return nullptr;
	loop_context *lctx = to_loop_context(ctx);
	if (attr->comp_mask || !attr->length) {
		errno = EINVAL;
		return nullptr;
	}
	if (attr->length > kMaxDmSize) {
		errno = EINVAL; // Beyond max_dm_size (mlx5's answer); ENOMEM is the pool used up
		return nullptr;
	}
	uint64_t len = (attr->length + kDmAlign - 1) & ~uint64_t(kDmAlign - 1);
	{
		std::lock_guard<std::mutex> g(g_dm_lock);
		if (len > kMaxDmSize || lctx->ldev->dm_used + len > kMaxDmSize) {
			errno = ENOMEM;
			return nullptr;
		}
		lctx->ldev->dm_used += len;
	}
	void *p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	auto *dm = p == MAP_FAILED ? nullptr : new (std::nothrow) loop_dm{};
	if (!dm) {
		if (p != MAP_FAILED)
			munmap(p, len);
		std::lock_guard<std::mutex> g(g_dm_lock);
		lctx->ldev->dm_used -= len;
		errno = ENOMEM;
		return nullptr;
	}
	dm->addr = p;
	dm->length = len;
	dm->ldev = lctx->ldev;
	dm->base.context = ctx;
	dm->base.memcpy_to_dm = dm_to;
	dm->base.memcpy_from_dm = dm_from;
	dm->base.comp_mask = 0;
	dm->base.handle = g_next_handle.fetch_add(1);
	objects_add(kObjDm, dm->base.handle, dm);
	owned_add(ctx, dm, kOwnDm);
	return &dm->base;
}

int loop_free_dm(ibv_dm *ibdm)
{
	if (ctx_orphaned(ibdm->context))
		return EBADF;
	loop_dm *dm = to_loop_dm(ibdm);
	if (dm->imported_from && dm->life.is(kLifeDm))
		return EINVAL; // An imported DM is unimported, not freed
	// EBUSY while MRs are registered on it, as the kernel answers.
	if (int e = dm->life.begin_destroy(kLifeDm, "ibv_free_dm", dm))
		return e;
	objects_remove(kObjDm, dm->base.handle);
	munmap(dm->addr, dm->length);
	{
		std::lock_guard<std::mutex> g(g_dm_lock);
		dm->ldev->dm_used -= dm->length;
	}
	dm->life.end_destroy(kLifeDm);
	quarantine(dm);
	return 0;
}

ibv_dm *loop_import_dm(ibv_context *ctx, uint32_t handle)
{
	if (ctx_closed(ctx, "ibv_import_dm"))
		return nullptr;
	auto *orig = static_cast<loop_dm *>(objects_find(kObjDm, handle));
	if (!orig || orig->imported_from) {
		errno = EINVAL;
		return nullptr;
	}
	auto *dm = new (std::nothrow) loop_dm{*orig};
	if (!dm) {
		errno = ENOMEM;
		return nullptr;
	}
	dm->base.context = ctx;
	dm->imported_from = orig;
	return &dm->base;
}

void loop_unimport_dm(ibv_dm *ibdm)
{
	loop_dm *dm = to_loop_dm(ibdm);
	if (dm->imported_from)
		delete dm;
}

ibv_mr *loop_reg_dm_mr(ibv_pd *pd, ibv_dm *ibdm, uint64_t offset, size_t length,
		       unsigned int access)
{
	if (ctx_orphaned(pd->context))
		return fail_orphaned<ibv_mr>();
	loop_dm *dm = to_loop_dm(ibdm);
	if (!dm->life.is(kLifeDm)) {
		errno = life_bad("ibv_reg_dm_mr", dm, dm->life, kLifeDm);
		return nullptr;
	}
	if (ibdm->context != pd->context) {
		errno = EINVAL;
		return nullptr;
	}
	// DM MRs are zero-based (rdma-core requires the flag).
	if (!(access & IBV_ACCESS_ZERO_BASED) || offset > dm->length ||
	    length > dm->length - offset) {
		errno = EINVAL;
		return nullptr;
	}
	// An empty DM MR is legal (HCAs accept it): register one byte, then
	// shrink the key's range to nothing.
	ibv_mr *mr = loop_reg_mr(pd, static_cast<char *>(dm->addr) + offset, length ? length : 1,
				 0, static_cast<int>(access & ~IBV_ACCESS_ZERO_BASED));
	if (!mr)
		return nullptr;
	// The MR holds the DM (ibv_free_dm is EBUSY until it is deregistered).
	if (!to_loop_mr(mr)->parents.add(dm->life, kLifeDm)) {
		loop_dereg_mr(reinterpret_cast<verbs_mr *>(mr));
		errno = EINVAL;
		return nullptr;
	}
	if (!length) {
		fabric &fab = *to_loop_context(pd->context)->fab;
		registry_guard g(fab);
		// As every change of a record: out of service, changed, a new
		// cookie, back (snapshot() in loop_mr.cpp).
		sv_mr_rec &m = fab.reg()->mrs[to_loop_mr(mr)->slot];
		mr_begin_change(m);
		m.length = 0;
		mr_publish_change(m);
	}
	auto *vmr = reinterpret_cast<verbs_mr *>(mr);
	vmr->access = static_cast<int>(access);
	mr->context = pd->context;
	mr->pd = pd;
	mr->addr = reinterpret_cast<void *>(static_cast<uintptr_t>(offset));
	mr->length = length;
	return mr;
}

} // namespace loop
