// SPDX-License-Identifier: MIT
// Address handles: a copy of the address, checked against the port.
#include "loop.h"
#include "res_limits.h"

#include <cerrno>

namespace loop {

ibv_ah *loop_create_ah(ibv_pd *pd, ibv_ah_attr *attr)
{
	if (ctx_orphaned(pd->context))
		return fail_orphaned<ibv_ah>();
	parent_guard parents;
	if (!parents.add(to_loop_pd(pd)->life, kLifePd)) {
		errno = life_bad("ibv_create_ah", pd, to_loop_pd(pd)->life, kLifePd);
		return nullptr;
	}
	loop_context *lctx = to_loop_context(pd->context);
	if (attr->port_num < 1 || attr->port_num > lctx->dev->num_ports) {
		errno = EINVAL;
		return nullptr;
	}
	bool eth = lctx->dev->ports[attr->port_num - 1].link_layer == SV_LINK_ETH;
	if (eth && !attr->is_global) {
		errno = EINVAL; // RoCE needs a GRH
		return nullptr;
	}
	if (attr->is_global) {
		if (int e = loop_sgid_check(lctx, attr->port_num, attr->grh.sgid_index)) {
			errno = e;
			return nullptr;
		}
	}
	// max_ah is device-wide, across processes (res_limits.h).
	if (int e = res_take(*lctx->fab, lctx->lease, SV_RES_AH)) {
		errno = e;
		return nullptr;
	}
	auto *ah = new (std::nothrow) loop_ah{};
	if (!ah) {
		res_put(*lctx->fab, lctx->lease, SV_RES_AH);
		errno = ENOMEM;
		return nullptr;
	}
	ah->attr = *attr;
	ah->parents = parents.keep();
	owned_add(pd->context, ah, kOwnAh);
	return &ah->base;
}

int loop_destroy_ah(ibv_ah *ibah)
{
	if (ctx_orphaned(ibah->context))
		return EBADF;
	loop_ah *ah = to_loop_ah(ibah);
	if (int e = ah->life.begin_destroy(kLifeAh, "ibv_destroy_ah", ah))
		return e;
	ah->parents.release();
	loop_context *lctx = to_loop_context(ibah->context);
	res_put(*lctx->fab, lctx->lease, SV_RES_AH);
	ah->life.end_destroy(kLifeAh);
	quarantine(ah);
	return 0;
}

} // namespace loop
