// SPDX-License-Identifier: MIT
// Address handles: a copy of the address, checked against the port.
#include "loop.h"

#include <cerrno>

namespace loop {

ibv_ah *loop_create_ah(ibv_pd *pd, ibv_ah_attr *attr)
{
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
	if (attr->is_global && attr->grh.sgid_index >= kGidTableLen) {
		errno = EINVAL;
		return nullptr;
	}
	auto *ah = new (std::nothrow) loop_ah{};
	if (!ah) {
		errno = ENOMEM;
		return nullptr;
	}
	ah->attr = *attr;
	return &ah->base;
}

int loop_destroy_ah(ibv_ah *ah)
{
	delete to_loop_ah(ah);
	return 0;
}

} // namespace loop
