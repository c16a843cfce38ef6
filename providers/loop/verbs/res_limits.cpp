// SPDX-License-Identifier: MIT
#include "res_limits.h"

#include "loop_param.h"

#include <cerrno>

namespace loop {

namespace {

// What a table can hold, whatever the registry says.
uint32_t hard_cap(sv_res kind)
{
	switch (kind) {
	case SV_RES_QP:
		return SV_MAX_QPS;
	case SV_RES_CQ:
	case SV_RES_SRQ:
		return SV_MAX_OBJS;
	case SV_RES_MR:
	case SV_RES_MW:
		return SV_MAX_MRS - 1;
	default:
		return kMaxCountCap;
	}
}

bool valid(int lease, sv_res kind)
{
	return lease >= 0 && lease < SV_MAX_PROCS && kind >= 0 && kind < SV_RES_COUNT;
}

} // namespace

uint32_t res_limit(const fabric &fab, sv_res kind)
{
	if (kind < 0 || kind >= SV_RES_COUNT)
		return 0;
	uint32_t v = fab.reg()->limits.max[kind];
	return v < hard_cap(kind) ? v : hard_cap(kind);
}

int res_take_locked(fabric &fab, int lease, sv_res kind)
{
	if (!valid(lease, kind))
		return EINVAL;
	sv_registry *r = fab.reg();
	uint64_t used = 0;
	for (uint32_t i = 0; i < SV_MAX_PROCS; i++)
		used += r->usage[i][kind];
	if (used >= res_limit(fab, kind))
		return ENOMEM;
	r->usage[lease][kind]++;
	return 0;
}

int res_take(fabric &fab, int lease, sv_res kind)
{
	{
		registry_guard g(fab);
		int err = res_take_locked(fab, lease, kind);
		if (err != ENOMEM)
			return err;
	}
	// What a dead process held counts until it is reaped.
	if (!fab.reap_dead())
		return ENOMEM;
	registry_guard g(fab);
	return res_take_locked(fab, lease, kind);
}

void res_put_locked(fabric &fab, int lease, sv_res kind)
{
	if (!valid(lease, kind))
		return;
	uint32_t &n = fab.reg()->usage[lease][kind];
	if (n) // Never below 0, even for a peer that scribbled on the table
		n--;
}

void res_put(fabric &fab, int lease, sv_res kind)
{
	registry_guard g(fab);
	res_put_locked(fab, lease, kind);
}

} // namespace loop
