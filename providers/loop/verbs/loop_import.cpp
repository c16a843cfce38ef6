// SPDX-License-Identifier: MIT
// Importing a context's PDs and MRs into a context made by
// ibv_import_device(): the imported object is a second handle on the same
// protection domain or key, which is what rdma-core's shared PD tests expect.
#include "loop.h"
#include "objects.h"

#include <cerrno>

namespace loop {

ibv_pd *loop_import_pd(ibv_context *ctx, uint32_t handle)
{
	if (ctx_closed(ctx, "ibv_import_pd"))
		return nullptr;
	auto *orig = static_cast<loop_pd *>(objects_find(kObjPd, handle));
	if (!orig || orig->imported) {
		errno = EINVAL;
		return nullptr;
	}
	auto *pd = new (std::nothrow) loop_pd{};
	if (!pd) {
		errno = ENOMEM;
		return nullptr;
	}
	pd->pdn = orig->pdn;
	pd->imported = true;
	pd->base.context = ctx;
	pd->base.handle = orig->pdn;
	owned_add(ctx, pd, kOwnImportedPd);
	return &pd->base;
}

void loop_unimport_pd(ibv_pd *ibpd)
{
	loop_pd *pd = to_loop_pd(ibpd);
	if (!pd->imported)
		return;
	// Objects made on the imported PD point at this copy: while they live
	// it stays (and stays usable), as a PD with users is never freed.
	if (pd->life.begin_destroy(kLifePd, "ibv_unimport_pd", pd))
		return;
	pd->life.end_destroy(kLifePd);
	// Kept a while, like every destroyed object: a stale pointer reads the
	// dead state rather than reused memory.
	quarantine(pd);
}

ibv_mr *loop_import_mr(ibv_pd *pd, uint32_t handle)
{
	loop_context *lctx = to_loop_context(pd->context);
	uint32_t slot = handle >> SV_MR_KEY_BITS;
	if (!slot || slot >= SV_MAX_MRS) {
		errno = EINVAL;
		return nullptr;
	}
	sv_mr_rec rec;
	{
		registry_guard g(*lctx->fab);
		rec = lctx->fab->reg()->mrs[slot];
	}
	if (rec.state != SV_MR_VALID || (rec.key & 0xff) != (handle & 0xff) ||
	    rec.owner_lease != static_cast<uint32_t>(lctx->lease) ||
	    rec.pdn != to_loop_pd(pd)->pdn) {
		errno = EINVAL;
		return nullptr;
	}
	auto *mr = new (std::nothrow) loop_mr{};
	if (!mr) {
		errno = ENOMEM;
		return nullptr;
	}
	mr->slot = slot;
	mr->vmr.mr_type = IBV_MR_TYPE_IMPORTED_MR;
	mr->vmr.access = static_cast<int>(rec.access);
	ibv_mr &m = mr->vmr.ibv_mr;
	m.context = pd->context;
	m.pd = pd;
	m.addr = reinterpret_cast<void *>(rec.addr);
	m.length = rec.length;
	m.lkey = m.rkey = handle;
	m.handle = handle;
	owned_add(pd->context, mr, kOwnImportedMr);
	return &m;
}

void loop_unimport_mr(ibv_mr *ibmr)
{
	auto *vmr = reinterpret_cast<verbs_mr *>(ibmr);
	if (vmr->mr_type != IBV_MR_TYPE_IMPORTED_MR)
		return;
	loop_mr *mr = to_loop_mr(ibmr);
	if (mr->life.begin_destroy(kLifeMr, "ibv_unimport_mr", mr))
		return;
	mr->life.end_destroy(kLifeMr);
	quarantine(mr);
}

} // namespace loop
