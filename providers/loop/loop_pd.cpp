// SPDX-License-Identifier: MIT
// Protection domains.  A PD number is unique within its process; keys in the
// registry record (owner lease, PD number), which is unique on the fabric.
#include "loop.h"
#include "objects.h"

#include <atomic>
#include <cerrno>

namespace loop {

ibv_pd *loop_alloc_pd(ibv_context *ctx)
{
	static std::atomic<uint32_t> next_pdn{1};
	(void)ctx;
	auto *pd = new (std::nothrow) loop_pd{};
	if (!pd) {
		errno = ENOMEM;
		return nullptr;
	}
	pd->pdn = next_pdn.fetch_add(1, std::memory_order_relaxed);
	pd->base.handle = pd->pdn;
	objects_add(kObjPd, pd->pdn, pd);
	return &pd->base;
}

int loop_dealloc_pd(ibv_pd *ibpd)
{
	loop_pd *pd = to_loop_pd(ibpd);
	if (pd->imported && pd->life.is(kLifePd))
		return EINVAL; // Imported PDs are unimported
	// EBUSY while MRs, MWs, QPs, SRQs, AHs or parent domains use it.
	if (int e = pd->life.begin_destroy(kLifePd, "ibv_dealloc_pd", pd))
		return e;
	if (pd->parent_domain)
		return loop_dealloc_parent_domain(pd);
	objects_remove(kObjPd, pd->pdn);
	pd->life.end_destroy(kLifePd);
	quarantine(pd);
	return 0;
}

} // namespace loop
