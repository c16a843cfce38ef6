// SPDX-License-Identifier: MIT
// Multicast: the registry keeps each group's attached QPs; a UD send to the
// group's LID/GID is delivered to every one of them.
#include "engine.h"
#include "loop.h"
#include "objects.h"

#include <atomic>
#include <cerrno>
#include <cstring>

namespace loop {

namespace {

// The kernel's is_valid_mcast_lid (ib_attach_mcast and ib_detach_mcast):
// on an InfiniBand port a group's LID must be a multicast LID (0xc000 to
// 0xfffe); the RoCE annex has the LID ignored.  A QP in INIT or later is
// judged by its port; before that, only a device with no Ethernet port
// checks the LID.
bool mcast_lid_ok(loop_qp *qp, uint16_t lid)
{
	if (lid >= 0xc000 && lid != 0xffff)
		return true;
	const sv_registry *r = qp->ctx->fab->reg();
	if (std::atomic_ref<const uint32_t>(r->qps[qp->slot].state).load(std::memory_order_acquire) !=
	    IBV_QPS_RESET)
		return fabric_port_is_eth(qp->ctx, qp->attr.port_num);
	uint32_t dev = qp->ctx->dev->index;
	uint32_t ports = dev < SV_MAX_DEVICES ? r->devices[dev].num_ports : 0;
	for (uint32_t p = 1; p <= ports && p <= SV_MAX_PORTS; p++)
		if (fabric_port_is_eth(qp->ctx, static_cast<uint8_t>(p)))
			return true;
	return false;
}

} // namespace

int loop_attach_mcast(ibv_qp *ibqp, const ibv_gid *gid, uint16_t lid)
{
	if (ctx_orphaned(ibqp->context))
		return EBADF;
	loop_qp *qp = to_loop_qp(ibqp);
	if (!qp->life.is(kLifeQp))
		return life_bad("ibv_attach_mcast", qp, qp->life, kLifeQp);
	if (qp->type != IBV_QPT_UD || !gid_is_multicast(gid->raw) || !mcast_lid_ok(qp, lid))
		return EINVAL;
	fabric &fab = *qp->ctx->fab;
	registry_guard g(fab);
	sv_mcast_rec *grp = nullptr, *free_rec = nullptr;
	for (sv_mcast_rec &m : fab.reg()->mcast) {
		if (m.num_qps && memcmp(m.gid, gid->raw, 16) == 0 && m.lid == lid)
			grp = &m;
		else if (!m.num_qps && !free_rec)
			free_rec = &m;
	}
	if (!grp) {
		if (!free_rec)
			return ENOMEM;
		grp = free_rec;
		memcpy(grp->gid, gid->raw, 16);
		grp->lid = lid;
	}
	if (grp->num_qps > SV_MAX_MCAST_QPS)
		grp->num_qps = SV_MAX_MCAST_QPS; // Damaged by a peer: the slots there are
	for (uint32_t i = 0; i < grp->num_qps; i++)
		if (grp->qpns[i] == qp->qpn)
			return 0;
	if (grp->num_qps >= SV_MAX_MCAST_QPS)
		return ENOMEM;
	grp->qpns[grp->num_qps++] = qp->qpn;
	return 0;
}

int loop_detach_mcast(ibv_qp *ibqp, const ibv_gid *gid, uint16_t lid)
{
	if (ctx_orphaned(ibqp->context))
		return EBADF;
	loop_qp *qp = to_loop_qp(ibqp);
	if (!qp->life.is(kLifeQp))
		return life_bad("ibv_detach_mcast", qp, qp->life, kLifeQp);
	if (qp->type != IBV_QPT_UD || !gid_is_multicast(gid->raw) || !mcast_lid_ok(qp, lid))
		return EINVAL;
	fabric &fab = *qp->ctx->fab;
	registry_guard g(fab);
	for (sv_mcast_rec &m : fab.reg()->mcast) {
		if (!m.num_qps || memcmp(m.gid, gid->raw, 16) != 0 || m.lid != lid)
			continue;
		if (m.num_qps > SV_MAX_MCAST_QPS)
			m.num_qps = SV_MAX_MCAST_QPS; // Damaged by a peer
		for (uint32_t i = 0; i < m.num_qps; i++)
			if (m.qpns[i] == qp->qpn) {
				m.qpns[i] = m.qpns[--m.num_qps];
				return 0;
			}
	}
	return EINVAL;
}

bool mcast_attached(loop_qp *qp, bool detach)
{
	fabric &fab = *qp->ctx->fab;
	registry_guard g(fab);
	bool found = false;
	for (sv_mcast_rec &m : fab.reg()->mcast) {
		uint32_t n = m.num_qps < SV_MAX_MCAST_QPS ? m.num_qps : SV_MAX_MCAST_QPS;
		for (uint32_t i = 0; i < n;) {
			if (m.qpns[i] != qp->qpn) {
				i++;
				continue;
			}
			found = true;
			if (!detach)
				return true;
			m.qpns[i] = m.qpns[--n];
			m.num_qps = n;
		}
	}
	return found;
}

} // namespace loop
