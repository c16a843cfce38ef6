// SPDX-License-Identifier: MIT
// Protection domains.  A PD number is unique within its process; keys in the
// registry record (owner lease, PD number), which is unique on the fabric.
#include "loop.h"
#include "objects.h"
#include "res_limits.h"

#include <atomic>
#include <cerrno>

namespace loop {

ibv_pd *loop_alloc_pd(ibv_context *ctx)
{
	if (ctx_closed(ctx, "ibv_alloc_pd"))
		return nullptr;
	static std::atomic<uint32_t> next_pdn{1};
	loop_context *lctx = to_loop_context(ctx);
	// max_pd is device-wide, across processes (res_limits.h).
	if (int e = res_take(*lctx->fab, lctx->lease, SV_RES_PD)) {
		errno = e;
		return nullptr;
	}
	auto *pd = new (std::nothrow) loop_pd{};
	if (!pd) {
		res_put(*lctx->fab, lctx->lease, SV_RES_PD);
		errno = ENOMEM;
		return nullptr;
	}
	pd->pdn = next_pdn.fetch_add(1, std::memory_order_relaxed);
	pd->base.handle = pd->pdn;
	objects_add(kObjPd, pd->pdn, pd);
	owned_add(ctx, pd, kOwnPd);
	return &pd->base;
}

int loop_dealloc_pd(ibv_pd *ibpd)
{
	if (ctx_orphaned(ibpd->context))
		return EBADF;
	loop_pd *pd = to_loop_pd(ibpd);
	if (pd->imported && pd->life.is(kLifePd))
		return EINVAL; // Imported PDs are unimported
	// EBUSY while MRs, MWs, QPs, SRQs, AHs or parent domains use it.
	if (int e = pd->life.begin_destroy(kLifePd, "ibv_dealloc_pd", pd))
		return e;
	if (pd->parent_domain)
		return loop_dealloc_parent_domain(pd);
	objects_remove(kObjPd, pd->pdn);
	loop_context *lctx = to_loop_context(ibpd->context);
	res_put(*lctx->fab, lctx->lease, SV_RES_PD);
	pd->life.end_destroy(kLifePd);
	quarantine(pd);
	return 0;
}

} // namespace loop
