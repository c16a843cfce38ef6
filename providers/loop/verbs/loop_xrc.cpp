// SPDX-License-Identifier: MIT
// XRC domains and shared XRC target QPs.
#include "loop.h"
#include "objects.h"
#include "res_limits.h"

#include <atomic>
#include <cerrno>
#include <new>
#include <fcntl.h>
#include <sys/stat.h>

namespace loop {

namespace {

// A file domain's handle record, freed (if still this one).
void drop_record(fabric &fab, const obj_ref &rec)
{
	if (rec.slot >= SV_MAX_OBJS)
		return;
	registry_guard g(fab);
	sv_obj_rec &o = fab.reg()->objs[rec.slot];
	if (o.in_use && o.generation == rec.gen && o.kind == SV_OBJ_XRCD)
		std::atomic_ref<uint32_t>(o.in_use).store(0, std::memory_order_release);
}

} // namespace

ibv_xrcd *loop_open_xrcd(ibv_context *ctx, ibv_xrcd_init_attr *attr)
{
	if (ctx_closed(ctx, "ibv_open_xrcd"))
		return nullptr;
	loop_context *lctx = to_loop_context(ctx);
	// rdma-core's ibv_cmd_open_xrcd: bits it does not know are
	// EOPNOTSUPP, and both the descriptor and the flags must be given.
	uint32_t known = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
	if (attr->comp_mask & ~known) {
		errno = EOPNOTSUPP;
		return nullptr;
	}
	if ((attr->comp_mask & known) != known) {
		errno = EINVAL;
		return nullptr;
	}
	// The kernel looks at O_CREAT and O_EXCL only (ib_uverbs_open_xrcd).
	int oflags = attr->oflags;
	uint32_t id;
	obj_ref rec{SV_MAX_OBJS, 0};
	if (attr->fd < 0) {
		// A private domain: only this process's objects can name it.
		fabric &fab = *lctx->fab;
		registry_guard g(fab);
		id = ++fab.reg()->next_xrcd & 0x7fffffff;
	} else {
		// Processes share a domain by opening the same file: the domain is
		// named by the file's identity, as the kernel keys it by inode.
		struct stat st;
		if (fstat(attr->fd, &st) < 0)
			return nullptr;
		uint64_t h = (static_cast<uint64_t>(st.st_dev) * 0x9e3779b97f4a7c15ULL) ^ st.st_ino;
		id = static_cast<uint32_t>(h ^ (h >> 32)) | 0x80000000u;
		// The domain exists while a handle on it is open, in any live
		// process of the fabric: without O_CREAT there must be one
		// (EAGAIN), with O_EXCL there must be none (EINVAL), as the
		// kernel answers.  This handle is a record of its own.
		fabric &fab = *lctx->fab;
		sv_registry *r = fab.reg();
		fab.reap_dead(); // A dead process's handles are no more
		registry_guard g(fab);
		bool exists = false;
		uint32_t free_slot = SV_MAX_OBJS;
		for (uint32_t i = 0; i < SV_MAX_OBJS; i++) {
			const sv_obj_rec &o = r->objs[i];
			if (!o.in_use) {
				if (free_slot == SV_MAX_OBJS)
					free_slot = i;
				continue;
			}
			if (o.kind == SV_OBJ_XRCD && o.xrcd == id)
				exists = true;
		}
		if (!exists && !(oflags & O_CREAT)) {
			errno = EAGAIN;
			return nullptr;
		}
		if (exists && (oflags & O_EXCL)) {
			errno = EINVAL;
			return nullptr;
		}
		if (free_slot == SV_MAX_OBJS) {
			errno = ENOMEM;
			return nullptr;
		}
		sv_obj_rec &o = r->objs[free_slot];
		obj_rec_init(r, o, lctx->lease, SV_OBJ_XRCD);
		o.xrcd = id;
		std::atomic_ref<uint32_t>(o.in_use).store(1, std::memory_order_release);
		rec = {free_slot, o.generation};
	}
	auto *x = new (std::nothrow) loop_xrcd{};
	if (!x) {
		drop_record(*lctx->fab, rec);
		errno = ENOMEM;
		return nullptr;
	}
	x->rec = rec;
	x->vxrcd.handle = id;
	x->vxrcd.comp_mask = 0;
	x->vxrcd.xrcd.context = ctx;
	owned_add(ctx, x, kOwnXrcd);
	return &x->vxrcd.xrcd;
}

int loop_close_xrcd(ibv_xrcd *ibxrcd)
{
	if (ctx_orphaned(ibxrcd->context))
		return EBADF;
	auto *x = reinterpret_cast<loop_xrcd *>(ibxrcd);
	// EBUSY while XRC SRQs or target QPs (created or opened) use it.
	if (int e = x->life.begin_destroy(kLifeXrcd, "ibv_close_xrcd", x))
		return e;
	drop_record(*to_loop_context(ibxrcd->context)->fab, x->rec);
	x->life.end_destroy(kLifeXrcd);
	quarantine(x);
	return 0;
}

bool xrc_qp_handle_add_locked(fabric &fab, int lease, uint32_t qslot, uint32_t qgen,
			      uint32_t xrcd, obj_ref &out)
{
	sv_registry *r = fab.reg();
	for (uint32_t i = 0; i < SV_MAX_OBJS; i++) {
		sv_obj_rec &o = r->objs[i];
		if (o.in_use)
			continue;
		obj_rec_init(r, o, lease, SV_OBJ_XRC_QP);
		o.cq_obj = qslot;
		o.cq_gen = qgen;
		o.xrcd = xrcd;
		std::atomic_ref<uint32_t>(o.in_use).store(1, std::memory_order_release);
		out = {i, o.generation};
		return true;
	}
	return false;
}

void xrc_qp_close_locked(fabric &fab, loop_qp *qp)
{
	// A dead holder's handle is no handle: its process is reaped first
	// (the QP passes to a live holder, or goes), so that the last live
	// handle's close ends the QP.
	fab.reap_dead();
	sv_registry *r = fab.reg();
	obj_ref h = qp->xrc_handle;
	qp->xrc_handle = {SV_MAX_OBJS, 0};
	if (h.slot < SV_MAX_OBJS) {
		sv_obj_rec &o = r->objs[h.slot];
		if (o.in_use && o.generation == h.gen && o.kind == SV_OBJ_XRC_QP)
			std::atomic_ref<uint32_t>(o.in_use).store(0, std::memory_order_release);
	}
	sv_qp_rec &q = r->qps[qp->slot];
	// Still the QP this handle was on (reaping never frees a record while
	// a live process holds a handle, but a peer may have scribbled)?
	if (!q.in_use || q.qp_type != IBV_QPT_XRC_RECV ||
	    (q.generation & SV_QPN_SLOT_MASK) != qp->qpn >> SV_QPN_SLOT_BITS)
		return;
	// Another handle holds it: the record stays, and if it was ours it
	// passes to that holder.  (Handles of this process count as others:
	// the same process may have created the QP and opened it too.)
	auto lease = static_cast<uint32_t>(qp->ctx->lease);
	if (q.owner_lease == lease && q.owner_gen == qp->ctx->lease_gen) {
		if (xrc_qp_pass_on_locked(r, qp->slot, SV_MAX_OBJS, SV_MAX_PROCS, 0))
			return;
	} else {
		for (uint32_t i = 0; i < SV_MAX_OBJS; i++) {
			const sv_obj_rec &o = r->objs[i];
			if (o.in_use && o.kind == SV_OBJ_XRC_QP && o.cq_obj == qp->slot &&
			    o.cq_gen == q.generation)
				return;
		}
	}
	// The last handle: the QP goes, as the kernel destroys a shared QP
	// when its last handle is closed.
	std::atomic_ref<uint32_t>(q.state).store(IBV_QPS_RESET, std::memory_order_release);
	std::atomic_ref<uint32_t>(q.in_use).store(0, std::memory_order_release);
	uint32_t owner = q.owner_lease;
	if (owner < SV_MAX_PROCS && r->leases[owner].generation == q.owner_gen)
		res_put_locked(fab, static_cast<int>(owner), SV_RES_QP);
}

// Opens an XRC target QP that a process of the same XRC domain created: a
// handle on the shared QP record, through which the opener can modify,
// query and close it.  Receives reach it through its domain's SRQs.
ibv_qp *loop_open_qp(ibv_context *ctx, ibv_qp_open_attr *attr)
{
	if (ctx_closed(ctx, "ibv_open_qp"))
		return nullptr;
	constexpr uint32_t needed =
		IBV_QP_OPEN_ATTR_NUM | IBV_QP_OPEN_ATTR_XRCD | IBV_QP_OPEN_ATTR_TYPE;
	if (!attr || (attr->comp_mask & needed) != needed ||
	    (attr->comp_mask & ~(needed | IBV_QP_OPEN_ATTR_CONTEXT)) ||
	    attr->qp_type != IBV_QPT_XRC_RECV || !attr->xrcd) {
		errno = EINVAL;
		return nullptr;
	}
	auto *lx = reinterpret_cast<loop_xrcd *>(attr->xrcd);
	parent_guard parents;
	if (!parents.add(lx->life, kLifeXrcd)) {
		errno = life_bad("ibv_open_qp", lx, lx->life, kLifeXrcd);
		return nullptr;
	}
	if (attr->xrcd->context != ctx) {
		errno = EINVAL;
		return nullptr;
	}
	loop_context *lctx = to_loop_context(ctx);
	fabric &fab = *lctx->fab;
	uint32_t slot = attr->qp_num & SV_QPN_SLOT_MASK;
	uint32_t xrcd = reinterpret_cast<verbs_xrcd *>(attr->xrcd)->handle;
	auto *qp = new (std::nothrow) loop_qp{};
	if (!qp) {
		errno = ENOMEM;
		return nullptr;
	}
	sv_qp_rec rec;
	int bad = 0;
	{
		// The check and this process's handle on the QP in one step: the
		// QP cannot go between them (docs/design.md, "Object lifetimes").
		registry_guard g(fab);
		// A QP whose holders all died is gone, as the kernel closed their
		// handles when they exited: their processes are reaped first, so
		// that this open cannot take it over (a review's probe opened a
		// dead creator's QP, and kept it for good).
		fab.reap_dead();
		rec = fab.reg()->qps[slot];
		if (!rec.in_use ||
		    (rec.generation & SV_QPN_SLOT_MASK) != attr->qp_num >> SV_QPN_SLOT_BITS ||
		    rec.qp_type != IBV_QPT_XRC_RECV || rec.xrcd != xrcd)
			bad = EINVAL;
		else if (!xrc_qp_handle_add_locked(fab, lctx->lease, slot, rec.generation, xrcd,
						   qp->xrc_handle))
			bad = ENOMEM;
	}
	if (bad) {
		delete qp;
		errno = bad;
		return nullptr;
	}
	qp->ctx = lctx;
	qp->slot = slot;
	qp->qpn = attr->qp_num;
	qp->type = IBV_QPT_XRC_RECV;
	qp->opened = true;
	qp->attr.port_num = rec.port;
	qp->attr.qp_access_flags = static_cast<int>(rec.access);
	qp->attr.dest_qp_num = rec.dest_qpn;
	qp->attr.path_mtu = static_cast<ibv_mtu>(rec.path_mtu);
	qp->vqp.xrcd = reinterpret_cast<verbs_xrcd *>(attr->xrcd);
	qp->parents = parents.keep();
	ibv_qp &q = qp->vqp.qp;
	q.context = ctx;
	q.qp_context = (attr->comp_mask & IBV_QP_OPEN_ATTR_CONTEXT) ? attr->qp_context : nullptr;
	q.handle = slot;
	q.qp_num = attr->qp_num;
	q.state = static_cast<ibv_qp_state>(rec.state);
	q.qp_type = IBV_QPT_XRC_RECV;
	pthread_mutex_init(&q.mutex, nullptr);
	pthread_cond_init(&q.cond, nullptr);
	owned_add(ctx, qp, kOwnQp);
	return &q;
}

} // namespace loop
