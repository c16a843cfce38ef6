// SPDX-License-Identifier: MIT
// The generic verbs: argument checks shared by every provider, the fields of
// the public objects the core owns, then a jump through the provider's ops.
#include "core.h"

#include <arpa/inet.h>
#include <cstdlib>
#include <cstring>
#include <unistd.h>

#define OPS_OR(ctx, op, err)                                                                       \
	const verbs_context_ops *ops_ = get_ops(ctx);                                              \
	if (!ops_->op)                                                                             \
		return err;

// ---- queries ----

EXPORT int ibv_query_device(struct ibv_context *context, struct ibv_device_attr *device_attr)
{
	if (!context || !device_attr)
		return EINVAL;
	OPS_OR(context, query_device_ex, EOPNOTSUPP);
	ibv_device_attr_ex ex;
	memset(&ex, 0, sizeof(ex));
	int ret = ops_->query_device_ex(context, nullptr, &ex, sizeof(ex));
	if (ret)
		return ret;
	*device_attr = ex.orig_attr;
	return 0;
}

int core_query_port_ex(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr,
		       size_t attr_len)
{
	if (!ctx || !attr)
		return EINVAL;
	OPS_OR(ctx, query_port, EOPNOTSUPP);
	ibv_port_attr full;
	memset(&full, 0, sizeof(full));
	int ret = ops_->query_port(ctx, port, &full);
	if (ret)
		return ret;
	// Callers compiled against an older header pass a shorter struct.
	memcpy(attr, &full, std::min(attr_len, sizeof(full)));
	return 0;
}

// The exported ibv_query_port is what binaries built before verbs_context
// grew query_port call; their struct ends before the extended fields.
// Its struct is ibv_port_attr up to and including link_layer.
EXPORT int ibv_query_port(struct ibv_context *context, uint8_t port_num,
			  struct _compat_ibv_port_attr *port_attr)
{
	return core_query_port_ex(context, port_num, reinterpret_cast<ibv_port_attr *>(port_attr),
				  offsetof(ibv_port_attr, flags));
}

EXPORT int _ibv_query_gid_ex(struct ibv_context *context, uint32_t port_num, uint32_t gid_index,
			     struct ibv_gid_entry *entry, uint32_t flags, size_t entry_size)
{
	if (!context || !entry || flags)
		return EINVAL;
	if (entry_size < sizeof(*entry))
		return EINVAL;
	OPS_OR(context, query_gid_ex, EOPNOTSUPP);
	return ops_->query_gid_ex(context, port_num, gid_index, entry, flags);
}

EXPORT ssize_t _ibv_query_gid_table(struct ibv_context *context, struct ibv_gid_entry *entries,
				   size_t max_entries, uint32_t flags, size_t entry_size)
{
	if (!context || (!entries && max_entries) || flags || entry_size < sizeof(*entries))
		return -EINVAL;
	ibv_device_attr attr;
	int ret = ibv_query_device(context, &attr);
	if (ret)
		return -ret;
	size_t n = 0;
	for (uint32_t port = 1; port <= attr.phys_port_cnt; port++) {
		ibv_port_attr pattr;
		ret = core_query_port_ex(context, port, &pattr, sizeof(pattr));
		if (ret)
			return -ret;
		for (int i = 0; i < pattr.gid_tbl_len; i++) {
			ibv_gid_entry e;
			ret = _ibv_query_gid_ex(context, port, i, &e, 0, sizeof(e));
			if (ret == ENODATA)
				continue; // An empty slot of a RoCE GID table.
			if (ret)
				return -ret;
			if (n == max_entries)
				return -EINVAL;
			entries[n++] = e;
		}
	}
	return static_cast<ssize_t>(n);
}

EXPORT int ibv_query_gid(struct ibv_context *context, uint8_t port_num, int index,
			 union ibv_gid *gid)
{
	if (!context || !gid || index < 0) {
		errno = EINVAL;
		return -1;
	}
	ibv_gid_entry e;
	int ret = _ibv_query_gid_ex(context, port_num, index, &e, 0, sizeof(e));
	if (ret == ENODATA) {
		memset(gid, 0, sizeof(*gid)); // rdma-core reports an empty slot as zeros.
		return 0;
	}
	if (ret) {
		errno = ret;
		return -1;
	}
	*gid = e.gid;
	return 0;
}

EXPORT int ibv_query_gid_type(struct ibv_context *context, uint8_t port_num,
			      unsigned int index, enum ibv_gid_type_sysfs *type)
{
	ibv_gid_entry e;
	int ret = _ibv_query_gid_ex(context, port_num, index, &e, 0, sizeof(e));
	if (ret) {
		errno = ret;
		return -1;
	}
	*type = e.gid_type == IBV_GID_TYPE_ROCE_V2 ? IBV_GID_TYPE_SYSFS_ROCE_V2
						   : IBV_GID_TYPE_SYSFS_IB_ROCE_V1;
	return 0;
}

EXPORT int ibv_query_pkey(struct ibv_context *context, uint8_t port_num, int index, __be16 *pkey)
{
	if (!context || !pkey) {
		errno = EINVAL;
		return -1;
	}
	const verbs_context_ops *ops = get_ops(context);
	if (!ops->query_pkey) {
		errno = EOPNOTSUPP;
		return -1;
	}
	int ret = ops->query_pkey(context, port_num, index, pkey);
	if (ret) {
		errno = ret;
		return -1;
	}
	return 0;
}

EXPORT int ibv_get_pkey_index(struct ibv_context *context, uint8_t port_num, __be16 pkey)
{
	ibv_port_attr attr;
	if (core_query_port_ex(context, port_num, &attr, sizeof(attr)))
		return -1;
	for (int i = 0; i < attr.pkey_tbl_len; i++) {
		__be16 p;
		if (ibv_query_pkey(context, port_num, i, &p))
			return -1;
		if (p == pkey)
			return i;
	}
	errno = ENOENT;
	return -1;
}

// ---- PD ----

EXPORT struct ibv_pd *ibv_alloc_pd(struct ibv_context *context)
{
	if (!context)
		return fail_ptr<ibv_pd>(EINVAL);
	OPS_OR(context, alloc_pd, fail_ptr<ibv_pd>(EOPNOTSUPP));
	ibv_pd *pd = ops_->alloc_pd(context);
	if (pd)
		pd->context = context;
	return pd;
}

EXPORT int ibv_dealloc_pd(struct ibv_pd *pd)
{
	if (!pd)
		return EINVAL;
	OPS_OR(pd->context, dealloc_pd, EOPNOTSUPP);
	return ops_->dealloc_pd(pd);
}

EXPORT struct ibv_pd *ibv_import_pd(struct ibv_context *context, uint32_t pd_handle)
{
	if (!context)
		return fail_ptr<ibv_pd>(EINVAL);
	OPS_OR(context, import_pd, fail_ptr<ibv_pd>(EOPNOTSUPP));
	return ops_->import_pd(context, pd_handle);
}

EXPORT void ibv_unimport_pd(struct ibv_pd *pd)
{
	if (pd && get_ops(pd->context)->unimport_pd)
		get_ops(pd->context)->unimport_pd(pd);
}

// ---- MR ----

EXPORT struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t length,
				       uint64_t iova, unsigned int access)
{
	if (!pd)
		return fail_ptr<ibv_mr>(EINVAL);
	OPS_OR(pd->context, reg_mr, fail_ptr<ibv_mr>(EOPNOTSUPP));
	// No MADV_DONTFORK dance: the loop device pins nothing (fork.cpp).
	ibv_mr *mr = ops_->reg_mr(pd, addr, length, iova, static_cast<int>(access));
	if (mr) {
		mr->context = pd->context;
		mr->pd = pd;
		mr->addr = addr;
		mr->length = length;
	}
	return mr;
}

EXPORT struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access)
{
	return ibv_reg_mr_iova2(pd, addr, length, reinterpret_cast<uintptr_t>(addr),
				static_cast<unsigned>(access));
}

EXPORT struct ibv_mr *ibv_reg_mr_iova(struct ibv_pd *pd, void *addr, size_t length,
				      uint64_t iova, int access)
{
	return ibv_reg_mr_iova2(pd, addr, length, iova, static_cast<unsigned>(access));
}

EXPORT struct ibv_mr *ibv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t length,
					uint64_t iova, int fd, int access)
{
	if (!pd)
		return fail_ptr<ibv_mr>(EINVAL);
	OPS_OR(pd->context, reg_dmabuf_mr, fail_ptr<ibv_mr>(EOPNOTSUPP));
	ibv_mr *mr = ops_->reg_dmabuf_mr(pd, offset, length, iova, fd, access);
	if (mr) {
		mr->context = pd->context;
		mr->pd = pd;
		mr->addr = reinterpret_cast<void *>(static_cast<uintptr_t>(offset));
		mr->length = length;
	}
	return mr;
}

EXPORT int ibv_rereg_mr(struct ibv_mr *mr, int flags, struct ibv_pd *pd, void *addr,
			size_t length, int access)
{
	if (!mr) {
		errno = EINVAL;
		return IBV_REREG_MR_ERR_INPUT;
	}
	auto *vmr = reinterpret_cast<verbs_mr *>(mr);
	if (vmr->mr_type != IBV_MR_TYPE_MR || (flags & ~IBV_REREG_MR_FLAGS_SUPPORTED) ||
	    ((flags & IBV_REREG_MR_CHANGE_TRANSLATION) && (!length || !addr)) ||
	    (access && !(flags & IBV_REREG_MR_CHANGE_ACCESS)) ||
	    ((flags & IBV_REREG_MR_CHANGE_PD) && !pd)) {
		errno = EINVAL;
		return IBV_REREG_MR_ERR_INPUT;
	}
	const verbs_context_ops *ops = get_ops(mr->context);
	if (!ops->rereg_mr) {
		errno = EOPNOTSUPP;
		return IBV_REREG_MR_ERR_INPUT;
	}
	int err = ops->rereg_mr(vmr, flags, pd, addr, length, access);
	if (err) {
		errno = err;
		return IBV_REREG_MR_ERR_CMD;
	}
	if (flags & IBV_REREG_MR_CHANGE_PD)
		mr->pd = pd;
	if (flags & IBV_REREG_MR_CHANGE_ACCESS)
		vmr->access = access;
	if (flags & IBV_REREG_MR_CHANGE_TRANSLATION) {
		mr->addr = addr;
		mr->length = length;
	}
	return 0;
}

EXPORT int ibv_dereg_mr(struct ibv_mr *mr)
{
	if (!mr)
		return EINVAL;
	OPS_OR(mr->context, dereg_mr, EOPNOTSUPP);
	return ops_->dereg_mr(reinterpret_cast<verbs_mr *>(mr));
}

EXPORT struct ibv_mr *ibv_import_mr(struct ibv_pd *pd, uint32_t mr_handle)
{
	if (!pd)
		return fail_ptr<ibv_mr>(EINVAL);
	OPS_OR(pd->context, import_mr, fail_ptr<ibv_mr>(EOPNOTSUPP));
	return ops_->import_mr(pd, mr_handle);
}

EXPORT void ibv_unimport_mr(struct ibv_mr *mr)
{
	if (mr && get_ops(mr->context)->unimport_mr)
		get_ops(mr->context)->unimport_mr(mr);
}

EXPORT struct ibv_dm *ibv_import_dm(struct ibv_context *context, uint32_t dm_handle)
{
	if (!context)
		return fail_ptr<ibv_dm>(EINVAL);
	OPS_OR(context, import_dm, fail_ptr<ibv_dm>(EOPNOTSUPP));
	return ops_->import_dm(context, dm_handle);
}

EXPORT void ibv_unimport_dm(struct ibv_dm *dm)
{
	if (dm && get_ops(dm->context)->unimport_dm)
		get_ops(dm->context)->unimport_dm(dm);
}

// ---- CQ ----

EXPORT void verbs_init_cq(struct ibv_cq *cq, struct ibv_context *context,
			  struct ibv_comp_channel *channel, void *cq_context)
{
	cq->context = context;
	cq->channel = channel;
	cq->cq_context = cq_context;
	cq->comp_events_completed = 0;
	cq->async_events_completed = 0;
	pthread_mutex_init(&cq->mutex, nullptr);
	pthread_cond_init(&cq->cond, nullptr);
	if (channel) {
		pthread_mutex_lock(&context->mutex);
		++channel->refcnt;
		pthread_mutex_unlock(&context->mutex);
	}
}

EXPORT struct ibv_cq *ibv_create_cq(struct ibv_context *context, int cqe, void *cq_context,
				    struct ibv_comp_channel *channel, int comp_vector)
{
	if (!context)
		return fail_ptr<ibv_cq>(EINVAL);
	OPS_OR(context, create_cq, fail_ptr<ibv_cq>(EOPNOTSUPP));
	if (channel && verbs_comp_channel_check(channel, context))
		return fail_ptr<ibv_cq>(EINVAL);
	ibv_cq *cq = ops_->create_cq(context, cqe, channel, comp_vector);
	if (cq)
		verbs_init_cq(cq, context, channel, cq_context);
	return cq;
}

EXPORT int ibv_resize_cq(struct ibv_cq *cq, int cqe)
{
	if (!cq)
		return EINVAL;
	OPS_OR(cq->context, resize_cq, EOPNOTSUPP);
	return ops_->resize_cq(cq, cqe);
}

EXPORT int ibv_destroy_cq(struct ibv_cq *cq)
{
	if (!cq)
		return EINVAL;
	OPS_OR(cq->context, destroy_cq, EOPNOTSUPP);
	ibv_comp_channel *channel = cq->channel;
	ibv_context *ctx = cq->context;
	// The provider refuses a CQ in use (EBUSY) and, before it frees the
	// CQ, stops its events and waits for their acks (verbs_cq_wait_events).
	int ret = ops_->destroy_cq(cq);
	if (!ret && channel) {
		pthread_mutex_lock(&ctx->mutex);
		--channel->refcnt;
		pthread_mutex_unlock(&ctx->mutex);
	}
	return ret;
}

EXPORT void ibv_ack_cq_events(struct ibv_cq *cq, unsigned int nevents)
{
	pthread_mutex_lock(&cq->mutex);
	cq->comp_events_completed += nevents;
	pthread_cond_signal(&cq->cond);
	pthread_mutex_unlock(&cq->mutex);
}

// ---- SRQ ----

EXPORT struct ibv_srq *ibv_create_srq(struct ibv_pd *pd, struct ibv_srq_init_attr *srq_init_attr)
{
	if (!pd || !srq_init_attr)
		return fail_ptr<ibv_srq>(EINVAL);
	OPS_OR(pd->context, create_srq, fail_ptr<ibv_srq>(EOPNOTSUPP));
	ibv_srq *srq = ops_->create_srq(pd, srq_init_attr);
	if (srq) {
		srq->context = pd->context;
		srq->srq_context = srq_init_attr->srq_context;
		srq->pd = pd;
		srq->events_completed = 0;
		pthread_mutex_init(&srq->mutex, nullptr);
		pthread_cond_init(&srq->cond, nullptr);
	}
	return srq;
}

EXPORT int ibv_modify_srq(struct ibv_srq *srq, struct ibv_srq_attr *srq_attr, int srq_attr_mask)
{
	if (!srq || !srq_attr)
		return EINVAL;
	OPS_OR(srq->context, modify_srq, EOPNOTSUPP);
	return ops_->modify_srq(srq, srq_attr, srq_attr_mask);
}

EXPORT int ibv_query_srq(struct ibv_srq *srq, struct ibv_srq_attr *srq_attr)
{
	if (!srq || !srq_attr)
		return EINVAL;
	OPS_OR(srq->context, query_srq, EOPNOTSUPP);
	return ops_->query_srq(srq, srq_attr);
}

EXPORT int ibv_destroy_srq(struct ibv_srq *srq)
{
	if (!srq)
		return EINVAL;
	OPS_OR(srq->context, destroy_srq, EOPNOTSUPP);
	return ops_->destroy_srq(srq);
}

// ---- QP ----

EXPORT struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *qp_init_attr)
{
	if (!pd || !qp_init_attr)
		return fail_ptr<ibv_qp>(EINVAL);
	OPS_OR(pd->context, create_qp, fail_ptr<ibv_qp>(EOPNOTSUPP));
	return ops_->create_qp(pd, qp_init_attr);
}

EXPORT struct ibv_qp_ex *ibv_qp_to_qp_ex(struct ibv_qp *qp)
{
	auto *vqp = reinterpret_cast<verbs_qp *>(qp);
	if (vqp->comp_mask & VERBS_QP_EX)
		return &vqp->qp_ex;
	return nullptr;
}

EXPORT int ibv_query_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask,
			struct ibv_qp_init_attr *init_attr)
{
	if (!qp || !attr || !init_attr)
		return EINVAL;
	OPS_OR(qp->context, query_qp, EOPNOTSUPP);
	int ret = ops_->query_qp(qp, attr, attr_mask, init_attr);
	if (ret)
		return ret;
	if (attr_mask & IBV_QP_STATE)
		qp->state = attr->qp_state;
	return 0;
}

EXPORT int ibv_query_qp_data_in_order(struct ibv_qp *qp, enum ibv_wr_opcode op, uint32_t flags)
{
	if (!qp)
		return 0;
	const verbs_context_ops *ops = get_ops(qp->context);
	if (!ops->query_qp_data_in_order)
		return 0;
	return ops->query_qp_data_in_order(qp, op, flags);
}

EXPORT int ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask)
{
	if (!qp || !attr)
		return EINVAL;
	OPS_OR(qp->context, modify_qp, EOPNOTSUPP);
	int ret = ops_->modify_qp(qp, attr, attr_mask);
	if (ret)
		return ret;
	if (attr_mask & IBV_QP_STATE)
		qp->state = attr->qp_state;
	return 0;
}

EXPORT int ibv_destroy_qp(struct ibv_qp *qp)
{
	if (!qp)
		return EINVAL;
	OPS_OR(qp->context, destroy_qp, EOPNOTSUPP);
	return ops_->destroy_qp(qp);
}

EXPORT int ibv_query_ece(struct ibv_qp *qp, struct ibv_ece *ece)
{
	if (!qp || !ece)
		return EINVAL;
	OPS_OR(qp->context, query_ece, EOPNOTSUPP);
	return ops_->query_ece(qp, ece);
}

EXPORT int ibv_set_ece(struct ibv_qp *qp, struct ibv_ece *ece)
{
	if (!qp || !ece)
		return EINVAL;
	if (!ece->vendor_id) { // rdma-core's answer: no vendor, nothing to set
		errno = EOPNOTSUPP;
		return EOPNOTSUPP;
	}
	OPS_OR(qp->context, set_ece, EOPNOTSUPP);
	return ops_->set_ece(qp, ece);
}

// ---- AH and multicast ----

EXPORT struct ibv_ah *ibv_create_ah(struct ibv_pd *pd, struct ibv_ah_attr *attr)
{
	if (!pd || !attr)
		return fail_ptr<ibv_ah>(EINVAL);
	OPS_OR(pd->context, create_ah, fail_ptr<ibv_ah>(EOPNOTSUPP));
	ibv_ah *ah = ops_->create_ah(pd, attr);
	if (ah) {
		ah->context = pd->context;
		ah->pd = pd;
	}
	return ah;
}

EXPORT int ibv_destroy_ah(struct ibv_ah *ah)
{
	if (!ah)
		return EINVAL;
	OPS_OR(ah->context, destroy_ah, EOPNOTSUPP);
	return ops_->destroy_ah(ah);
}

// Which header the 40-byte GRH area holds, as rdma-core decides it: a GRH
// or RoCE v2's IPv6 header (version 6), or RoCE v2's IPv4 header in its last
// 20 bytes (the first 20 zero).  Version 6 is looked at first: bytes 20-39
// of a GRH are GID bytes, whatever they look like; they are an IPv4 header
// only if its length is 5 words and its checksum holds.  (The high nibble
// of byte 20 alone took GRHs whose source GID's byte 12 is 0x4X, such as
// ::ffff:64.0.0.1, for IPv4, and answered a wrong address.)
static int grh_version(const ibv_grh *grh)
{
	const auto *ip4 = reinterpret_cast<const uint8_t *>(grh) + 20;
	if ((be32toh(grh->version_tclass_flow) >> 28) != 6)
		return (ip4[0] >> 4) == 4 ? 4 : -1;
	if ((ip4[0] & 0xf) != 5)
		return 6;
	uint32_t sum = 0;
	for (int i = 0; i < 20; i += 2)
		sum += static_cast<uint32_t>(ip4[i] << 8 | ip4[i + 1]);
	while (sum >> 16)
		sum = (sum & 0xffff) + (sum >> 16);
	return sum == 0xffff ? 4 : 6;
}

// The index of gid in the port's table, or -1.
static int gid_index_of(struct ibv_context *context, uint8_t port_num, const union ibv_gid &gid)
{
	ibv_port_attr pattr;
	if (core_query_port_ex(context, port_num, &pattr, sizeof(pattr)))
		return -1;
	for (int i = 0; i < pattr.gid_tbl_len; i++) {
		union ibv_gid g;
		if (ibv_query_gid(context, port_num, i, &g) == 0 && memcmp(&g, &gid, sizeof(g)) == 0)
			return i;
	}
	return -1;
}

EXPORT int ibv_init_ah_from_wc(struct ibv_context *context, uint8_t port_num, struct ibv_wc *wc,
			       struct ibv_grh *grh, struct ibv_ah_attr *ah_attr)
{
	if (!context || !wc || !ah_attr) {
		errno = EINVAL;
		return -1;
	}
	memset(ah_attr, 0, sizeof(*ah_attr));
	ah_attr->dlid = wc->slid;
	ah_attr->sl = wc->sl;
	ah_attr->src_path_bits = wc->dlid_path_bits;
	ah_attr->port_num = port_num;
	if (!(wc->wc_flags & IBV_WC_GRH))
		return 0;
	if (!grh) {
		errno = EINVAL;
		return -1;
	}
	ah_attr->is_global = 1;
	uint32_t flow = be32toh(grh->version_tclass_flow);
	ah_attr->grh.flow_label = flow & 0xfffff;
	int version = grh_version(grh);
	// The answer goes from the GID that received it (rdma-core: none in
	// the table, or a multicast one, is an error).
	union ibv_gid local;
	if (version == 6) {
		// UDP: RoCE v2 over IPv6; the BTH: InfiniBand's GRH (or RoCE v1).
		if (grh->next_hdr != 17 && grh->next_hdr != 0x1b) {
			errno = EPROTONOSUPPORT;
			return -1;
		}
		local = grh->dgid;
		ah_attr->grh.dgid = grh->sgid;
		ah_attr->grh.traffic_class = (flow >> 20) & 0xff;
		ah_attr->grh.hop_limit = grh->hop_limit;
	} else if (version == 4) {
		const auto *ip4 = reinterpret_cast<const uint8_t *>(grh) + 20;
		// IPv4-mapped GIDs of the addresses.
		memset(&local, 0, sizeof(local));
		local.raw[10] = local.raw[11] = 0xff;
		memcpy(&local.raw[12], ip4 + 16, 4);
		ah_attr->grh.dgid = local;
		memcpy(&ah_attr->grh.dgid.raw[12], ip4 + 12, 4);
		ah_attr->grh.hop_limit = ip4[8];
		ah_attr->grh.traffic_class = ip4[1];
	} else {
		errno = EPROTONOSUPPORT;
		return -1;
	}
	bool mcast = version == 6 ? local.raw[0] == 0xff : (local.raw[12] & 0xf0) == 0xe0;
	int index = mcast ? -1 : gid_index_of(context, port_num, local);
	if (index < 0) {
		errno = EINVAL;
		return -1;
	}
	ah_attr->grh.sgid_index = static_cast<uint8_t>(index);
	return 0;
}

EXPORT struct ibv_ah *ibv_create_ah_from_wc(struct ibv_pd *pd, struct ibv_wc *wc,
					    struct ibv_grh *grh, uint8_t port_num)
{
	if (!pd)
		return fail_ptr<ibv_ah>(EINVAL);
	ibv_ah_attr attr;
	if (ibv_init_ah_from_wc(pd->context, port_num, wc, grh, &attr))
		return nullptr;
	return ibv_create_ah(pd, &attr);
}

EXPORT int ibv_attach_mcast(struct ibv_qp *qp, const union ibv_gid *gid, uint16_t lid)
{
	if (!qp || !gid)
		return EINVAL;
	OPS_OR(qp->context, attach_mcast, EOPNOTSUPP);
	return ops_->attach_mcast(qp, gid, lid);
}

EXPORT int ibv_detach_mcast(struct ibv_qp *qp, const union ibv_gid *gid, uint16_t lid)
{
	if (!qp || !gid)
		return EINVAL;
	OPS_OR(qp->context, detach_mcast, EOPNOTSUPP);
	return ops_->detach_mcast(qp, gid, lid);
}

EXPORT int ibv_resolve_eth_l2_from_gid(struct ibv_context *context, struct ibv_ah_attr *attr,
				       uint8_t eth_mac[6], uint16_t *vid)
{
	if (!context || !attr || !eth_mac) {
		errno = EINVAL;
		return -1;
	}
	// The loopback fabric has no Ethernet wire; derive a stable locally
	// administered MAC from the GID, as a link-local GID embeds its MAC.
	const uint8_t *g = attr->grh.dgid.raw;
	eth_mac[0] = static_cast<uint8_t>((g[8] ^ 0x02) | 0x02);
	eth_mac[1] = g[9];
	eth_mac[2] = g[10];
	eth_mac[3] = g[13];
	eth_mac[4] = g[14];
	eth_mac[5] = g[15];
	if (vid)
		*vid = 0xffff; // No VLAN.
	return 0;
}

// ---- async events ----

namespace {

// Which object an async event names (ibv_async_event.element).
enum class event_elem { none, cq, qp, srq, wq };

event_elem event_element(ibv_event_type t)
{
	switch (t) {
	case IBV_EVENT_CQ_ERR:
		return event_elem::cq;
	case IBV_EVENT_QP_FATAL:
	case IBV_EVENT_QP_REQ_ERR:
	case IBV_EVENT_QP_ACCESS_ERR:
	case IBV_EVENT_COMM_EST:
	case IBV_EVENT_SQ_DRAINED:
	case IBV_EVENT_PATH_MIG:
	case IBV_EVENT_PATH_MIG_ERR:
	case IBV_EVENT_QP_LAST_WQE_REACHED:
		return event_elem::qp;
	case IBV_EVENT_SRQ_ERR:
	case IBV_EVENT_SRQ_LIMIT_REACHED:
		return event_elem::srq;
	case IBV_EVENT_WQ_FATAL:
		return event_elem::wq;
	default:
		return event_elem::none;
	}
}

} // namespace

EXPORT int ibv_get_async_event(struct ibv_context *context, struct ibv_async_event *event)
{
	if (!context || !event) {
		errno = EINVAL;
		return -1;
	}
	const verbs_context_ops *ops = get_ops(context);
	if (!ops->get_async_event) {
		errno = EOPNOTSUPP;
		return -1;
	}
	int ret = ops->get_async_event(context, event);
	if (ret) {
		errno = ret;
		return -1;
	}
	if (ops->async_event)
		ops->async_event(context, event);
	// ibv_destroy_cq/qp/srq wait for the ack of what was handed out here.
	switch (event_element(event->event_type)) {
	case event_elem::cq:
		core_async_reported(event->element.cq);
		break;
	case event_elem::qp:
		core_async_reported(event->element.qp);
		break;
	case event_elem::srq:
		core_async_reported(event->element.srq);
		break;
	default:
		break;
	}
	return 0;
}

EXPORT void ibv_ack_async_event(struct ibv_async_event *event)
{
	switch (event_element(event->event_type)) {
	case event_elem::cq: {
		ibv_cq *cq = event->element.cq;
		pthread_mutex_lock(&cq->mutex);
		++cq->async_events_completed;
		pthread_cond_signal(&cq->cond);
		pthread_mutex_unlock(&cq->mutex);
		return;
	}
	case event_elem::qp: {
		ibv_qp *qp = event->element.qp;
		pthread_mutex_lock(&qp->mutex);
		++qp->events_completed;
		pthread_cond_signal(&qp->cond);
		pthread_mutex_unlock(&qp->mutex);
		return;
	}
	case event_elem::srq: {
		ibv_srq *srq = event->element.srq;
		pthread_mutex_lock(&srq->mutex);
		++srq->events_completed;
		pthread_cond_signal(&srq->cond);
		pthread_mutex_unlock(&srq->mutex);
		return;
	}
	case event_elem::wq: {
		ibv_wq *wq = event->element.wq;
		pthread_mutex_lock(&wq->mutex);
		++wq->events_completed;
		pthread_cond_signal(&wq->cond);
		pthread_mutex_unlock(&wq->mutex);
		return;
	}
	default:
		return;
	}
}
