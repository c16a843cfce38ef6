// SPDX-License-Identifier: MIT
// Device, port, GID and P_Key queries.
#include "engine.h"
#include "loop.h"
#include "loop_caps.h"
#include "res_limits.h"

#include <arpa/inet.h>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <mutex>
#include <string>
#include <algorithm>
#include <net/if.h>
#include <netlink/route/addr.h>
#include <netlink/route/link.h>

namespace loop {

namespace {

const sv_port_rec *port_rec(loop_context *lctx, uint32_t port)
{
	if (port < 1 || port > lctx->dev->num_ports || port > SV_MAX_PORTS)
		return nullptr;
	return &lctx->dev->ports[port - 1];
}

// RoCE v2 GIDs: one per IP address of the port's netdev, read through
// rtnetlink with libnl-route-3 (rdma-core's route to the same facts).
int roce_gids(const std::string &netdev, gid_slot *table, int max)
{
	nl_sock *sk = nl_socket_alloc();
	if (!sk)
		return 0;
	int n = 0;
	nl_cache *cache = nullptr;
	if (nl_connect(sk, NETLINK_ROUTE) == 0 && rtnl_addr_alloc_cache(sk, &cache) == 0) {
		int ifindex = static_cast<int>(if_nametoindex(netdev.c_str()));
		for (nl_object *o = nl_cache_get_first(cache); o && n < max;
		     o = nl_cache_get_next(o)) {
			auto *a = reinterpret_cast<rtnl_addr *>(o);
			if (rtnl_addr_get_ifindex(a) != ifindex)
				continue;
			nl_addr *local = rtnl_addr_get_local(a);
			if (!local)
				continue;
			gid_slot &s = table[n];
			memset(&s, 0, sizeof(s));
			if (nl_addr_get_family(local) == AF_INET &&
			    nl_addr_get_len(local) == 4) {
				s.gid.raw[10] = 0xff;
				s.gid.raw[11] = 0xff;
				memcpy(&s.gid.raw[12], nl_addr_get_binary_addr(local), 4);
			} else if (nl_addr_get_family(local) == AF_INET6 &&
				   nl_addr_get_len(local) == 16) {
				memcpy(s.gid.raw, nl_addr_get_binary_addr(local), 16);
			} else {
				continue;
			}
			s.type = IBV_GID_TYPE_ROCE_V2;
			s.valid = true;
			n++;
		}
		nl_cache_free(cache);
	}
	nl_socket_free(sk);
	return n;
}

// The last RoCE GID table read per netdev, for the data path: every UD
// datagram on an Ethernet port carries a GRH whose source GID comes from
// the table, and a netlink address dump per datagram (two sockets, a
// request and its replies) cost 150-300 us each, which was most of
// libfabric's fi_pingpong time on a RoCE port (docs/PERFORMANCE.md).
// Refreshed when older than kGidCacheNs (tunables.h), and by every
// uncached read.
struct gid_cache_entry {
	std::string netdev;
	uint64_t at = 0; // now_ns() of the read; 0: empty
	int n = 0;
	gid_slot table[kGidTableLen];
};
std::mutex g_gid_cache_lock;
gid_cache_entry g_gid_cache[4];

int roce_gids_cached(const std::string &netdev, gid_slot *table, int max, bool fresh)
{
	uint64_t now = now_ns();
	std::lock_guard<std::mutex> g(g_gid_cache_lock);
	gid_cache_entry *e = nullptr, *oldest = &g_gid_cache[0];
	for (auto &c : g_gid_cache) {
		if (c.at && c.netdev == netdev)
			e = &c;
		if (c.at < oldest->at)
			oldest = &c;
	}
	if (!e || fresh || now - e->at > kGidCacheNs) {
		if (!e)
			e = oldest;
		e->netdev = netdev;
		e->n = roce_gids(netdev, e->table, kGidTableLen);
		e->at = now;
	}
	int n = std::min(e->n, max);
	std::copy(e->table, e->table + n, table);
	return n;
}

} // namespace

int loop_gid_table(loop_context *lctx, uint32_t port, gid_slot *table, int max, bool cached)
{
	const sv_port_rec *pr = port_rec(lctx, port);
	if (!pr || max <= 0)
		return 0;
	if (pr->link_layer == SV_LINK_ETH)
		return roce_gids_cached(lctx->ldev->cfg.netdev, table, max, !cached);
	// InfiniBand: GID 0 is the link-local prefix with the port GUID.
	memset(&table[0], 0, sizeof(table[0]));
	table[0].gid.global.subnet_prefix = htobe64(0xfe80000000000000ULL);
	table[0].gid.global.interface_id = htobe64(pr->port_guid);
	table[0].type = IBV_GID_TYPE_IB;
	table[0].valid = true;
	return 1;
}

int loop_sgid_check(loop_context *lctx, uint32_t port, uint32_t index)
{
	if (index >= static_cast<uint32_t>(kGidTableLen))
		return EINVAL;
	gid_slot table[kGidTableLen];
	int n = loop_gid_table(lctx, port, table, kGidTableLen, true);
	return static_cast<int>(index) < n && table[index].valid ? 0 : ENODATA;
}

int loop_query_device_ex(ibv_context *ctx, const ibv_query_device_ex_input *input,
			 ibv_device_attr_ex *attr, size_t attr_size)
{
	if (input && input->comp_mask)
		return EINVAL;
	if (attr_size < sizeof(attr->orig_attr))
		return EINVAL;
	loop_context *lctx = to_loop_context(ctx);
	ibv_device_attr_ex a;
	memset(&a, 0, sizeof(a));
	ibv_device_attr &o = a.orig_attr;
	snprintf(o.fw_ver, sizeof(o.fw_ver), "%llu.0.0",
		 static_cast<unsigned long long>(kFwVersion));
	o.node_guid = htobe64(lctx->dev->node_guid);
	o.sys_image_guid = htobe64(lctx->dev->node_guid);
	o.max_mr_size = kMaxMrSize;
	o.page_size_cap = kPageSizeCap;
	o.vendor_id = kVendorId;
	o.vendor_part_id = kVendorPartId;
	o.hw_ver = kHwVer;
	fabric &fab = *lctx->fab;
	// The fabric's limits (res_limits.h): device-wide, enforced at create.
	o.max_qp = static_cast<int>(res_limit(fab, SV_RES_QP));
	o.max_qp_wr = kMaxQpWr;
	o.device_cap_flags = kDeviceCapFlags;
	o.max_sge = kMaxSge;
	o.max_sge_rd = kMaxSgeRd;
	o.max_cq = static_cast<int>(res_limit(fab, SV_RES_CQ));
	o.max_cqe = kMaxCqe;
	o.max_mr = static_cast<int>(res_limit(fab, SV_RES_MR));
	o.max_pd = static_cast<int>(res_limit(fab, SV_RES_PD));
	o.max_qp_rd_atom = kMaxQpRdAtom;
	o.max_res_rd_atom = kMaxQpRdAtom * o.max_qp;
	o.max_qp_init_rd_atom = kMaxQpInitRdAtom;
	o.atomic_cap = kAtomicCap;
	o.max_mw = static_cast<int>(res_limit(fab, SV_RES_MW));
	o.max_mcast_grp = kMaxMcastGrp;
	o.max_mcast_qp_attach = kMaxMcastQpAttach;
	o.max_total_mcast_qp_attach = kMaxMcastGrp * kMaxMcastQpAttach;
	o.max_ah = static_cast<int>(res_limit(fab, SV_RES_AH));
	o.max_srq = static_cast<int>(res_limit(fab, SV_RES_SRQ));
	o.max_srq_wr = kMaxSrqWr;
	o.max_srq_sge = kMaxSrqSge;
	o.max_pkeys = kMaxPkeys;
	o.local_ca_ack_delay = kLocalCaAckDelay;
	o.phys_port_cnt = static_cast<uint8_t>(lctx->dev->num_ports);
	a.device_cap_flags_ex = kDeviceCapFlags | kDeviceCapFlagsEx;
	a.completion_timestamp_mask = kCompletionTimestampMask;
	a.hca_core_clock = kHcaCoreClockKhz;
	a.phys_port_cnt_ex = lctx->dev->num_ports;
	a.odp_caps.general_caps = kOdpGeneralCaps;
	a.odp_caps.per_transport_caps.rc_odp_caps = kOdpRcCaps;
	a.odp_caps.per_transport_caps.uc_odp_caps = kOdpUcCaps;
	a.odp_caps.per_transport_caps.ud_odp_caps = kOdpUdCaps;
	a.xrc_odp_caps = kOdpRcCaps;
	a.max_dm_size = kMaxDmSize;
	a.cq_mod_caps.max_cq_count = kMaxCqModCount;
	a.cq_mod_caps.max_cq_period = kMaxCqModPeriod;
	// Fields past what the caller's header knows about are not written.
	memcpy(attr, &a, std::min(attr_size, sizeof(a)));
	return 0;
}

int loop_query_port(ibv_context *ctx, uint8_t port, ibv_port_attr *attr)
{
	loop_context *lctx = to_loop_context(ctx);
	const sv_port_rec *pr = port_rec(lctx, port);
	if (!pr)
		return EINVAL;
	memset(attr, 0, sizeof(*attr));
	bool eth = pr->link_layer == SV_LINK_ETH;
	attr->state = static_cast<ibv_port_state>(pr->state);
	attr->max_mtu = IBV_MTU_4096;
	attr->active_mtu = static_cast<ibv_mtu>(fabric_port_mtu(lctx, port));
	attr->gid_tbl_len = kGidTableLen; // IB ports fill only index 0, as HCAs do
	// A RoCE port: the connection manager's, and GIDs from IP addresses
	// (rxe says CM_SUP, mlx5 both).
	attr->port_cap_flags = eth ? IBV_PORT_CM_SUP | IBV_PORT_IP_BASED_GIDS
				   : IBV_PORT_SM | IBV_PORT_SYS_IMAGE_GUID_SUP;
	attr->max_msg_sz = kMaxMsgSize;
	attr->pkey_tbl_len = kMaxPkeys;
	attr->lid = pr->lid;
	attr->sm_lid = eth ? 0 : 1; // The loopback fabric is its own subnet manager
	attr->lmc = 0;
	attr->max_vl_num = 1; // Encoded: 1 means VL0 only
	attr->sm_sl = 0;
	attr->subnet_timeout = 18;
	attr->active_width = 2;	 // 4X
	attr->active_speed = 32; // EDR (25 Gb/s per lane): a fair label for memory speed
	attr->phys_state = pr->state == IBV_PORT_ACTIVE ? 5 /* LinkUp */ : 3 /* Disabled */;
	attr->link_layer = eth ? IBV_LINK_LAYER_ETHERNET : IBV_LINK_LAYER_INFINIBAND;
	return 0;
}

int loop_query_gid_ex(ibv_context *ctx, uint32_t port, uint32_t index, ibv_gid_entry *entry,
		      uint32_t flags)
{
	if (flags)
		return EINVAL;
	loop_context *lctx = to_loop_context(ctx);
	const sv_port_rec *pr = port_rec(lctx, port);
	if (!pr)
		return EINVAL;
	if (index >= static_cast<uint32_t>(kGidTableLen))
		return EINVAL;
	gid_slot table[kGidTableLen];
	int n = loop_gid_table(lctx, port, table, kGidTableLen);
	if (static_cast<int>(index) >= n)
		return ENODATA;
	memset(entry, 0, sizeof(*entry));
	entry->gid = table[index].gid;
	entry->gid_index = index;
	entry->port_num = port;
	entry->gid_type = table[index].type;
	entry->ndev_ifindex = pr->link_layer == SV_LINK_ETH
				      ? if_nametoindex(lctx->ldev->cfg.netdev.c_str())
				      : 0;
	return 0;
}

int loop_query_pkey(ibv_context *ctx, uint8_t port, int index, __be16 *pkey)
{
	loop_context *lctx = to_loop_context(ctx);
	if (!port_rec(lctx, port) || index < 0 || index >= kMaxPkeys)
		return EINVAL;
	*pkey = htobe16(kDefaultPkey);
	return 0;
}

int loop_query_rt_values(ibv_context *ctx, ibv_values_ex *values)
{
	(void)ctx;
	if (values->comp_mask & ~static_cast<uint32_t>(IBV_VALUES_MASK_RAW_CLOCK))
		return EINVAL;
	// The clock of CQE timestamps (read_completion_ts), in ns.
	timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	if (values->comp_mask & IBV_VALUES_MASK_RAW_CLOCK)
		values->raw_clock = ts;
	return 0;
}

// ECE (ibv_query_ece, ibv_set_ece): vendor_id is the device's, as in
// ibv_query_device.  loop has no optional behaviour for peers to agree on,
// so it accepts none of the options asked for: set_ece takes and records
// the request, and answers (its ece is IN/OUT), as query_ece does after,
// with the options in force, none.
namespace {
constexpr uint32_t kEceOptions = 0; // the option bits loop implements
} // namespace

int loop_query_ece(ibv_qp *ibqp, ibv_ece *ece)
{
	loop_qp *qp = to_loop_qp(ibqp);
	if (!qp->life.is(kLifeQp))
		return life_bad("ibv_query_ece", qp, qp->life, kLifeQp);
	ece->vendor_id = kVendorId;
	ece->options = qp->ece_options;
	ece->comp_mask = 0;
	return 0;
}

int loop_set_ece(ibv_qp *ibqp, ibv_ece *ece)
{
	loop_qp *qp = to_loop_qp(ibqp);
	if (!qp->life.is(kLifeQp))
		return life_bad("ibv_set_ece", qp, qp->life, kLifeQp);
	if (ece->comp_mask || ece->vendor_id != kVendorId) {
		errno = EINVAL;
		return EINVAL;
	}
	qp->ece_options = ece->options & kEceOptions;
	ece->options = qp->ece_options;
	return 0;
}

} // namespace loop
