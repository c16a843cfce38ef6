// SPDX-License-Identifier: MIT
// Shared receive queues (plain and XRC): an sv_rq_ring that many QPs'
// requesters consume from.
#include "loop.h"
#include "objects.h"
#include "res_limits.h"

#include <cerrno>
#include <cstring>

namespace loop {

namespace {

uint32_t wqe_bytes(uint32_t max_sge)
{
	return (static_cast<uint32_t>(sizeof(sv_recv_wqe) + max_sge * sizeof(sv_sge)) + 63) & ~63u;
}

} // namespace

ibv_srq *loop_create_srq_ex(ibv_context *ctx, ibv_srq_init_attr_ex *attr)
{
	if (ctx_closed(ctx, "ibv_create_srq_ex"))
		return nullptr;
	loop_context *lctx = to_loop_context(ctx);
	uint32_t known = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_XRCD |
			 IBV_SRQ_INIT_ATTR_CQ;
	if (attr->comp_mask & ~known) {
		errno = EOPNOTSUPP;
		return nullptr;
	}
	ibv_srq_type type = (attr->comp_mask & IBV_SRQ_INIT_ATTR_TYPE) ? attr->srq_type
								       : IBV_SRQT_BASIC;
	if (type != IBV_SRQT_BASIC && type != IBV_SRQT_XRC) {
		errno = EOPNOTSUPP; // Tag matching SRQs are not implemented
		return nullptr;
	}
	if (!(attr->comp_mask & IBV_SRQ_INIT_ATTR_PD) || !attr->pd) {
		errno = EINVAL;
		return nullptr;
	}
	bool xrc = type == IBV_SRQT_XRC;
	if (xrc && (!(attr->comp_mask & IBV_SRQ_INIT_ATTR_XRCD) || !attr->xrcd ||
		    !(attr->comp_mask & IBV_SRQ_INIT_ATTR_CQ) || !attr->cq)) {
		errno = EINVAL;
		return nullptr;
	}
	// The objects it uses: live, of this context, and held until it goes.
	parent_guard parents;
	loop_pd *lpd = to_loop_pd(attr->pd);
	if (!parents.add(lpd->life, kLifePd)) {
		errno = life_bad("ibv_create_srq", lpd, lpd->life, kLifePd);
		return nullptr;
	}
	if (xrc) {
		auto *lx = reinterpret_cast<loop_xrcd *>(attr->xrcd);
		loop_cq *lcq = to_loop_cq(attr->cq);
		if (!parents.add(lx->life, kLifeXrcd)) {
			errno = life_bad("ibv_create_srq_ex", lx, lx->life, kLifeXrcd);
			return nullptr;
		}
		if (!parents.add(lcq->life, kLifeCq)) {
			errno = life_bad("ibv_create_srq_ex", lcq, lcq->life, kLifeCq);
			return nullptr;
		}
		if (attr->xrcd->context != ctx || attr->cq->context != ctx) {
			errno = EINVAL;
			return nullptr;
		}
	}
	if (attr->pd->context != ctx) {
		errno = EINVAL;
		return nullptr;
	}
	ibv_srq_attr &a = attr->attr;
	// srq_limit is not checked here: ibv_create_srq(3) calls it irrelevant
	// to create, and the kernel's rxe and mlx5 arm it as given without a
	// check (ibv_modify_srq's EINVAL above max_wr is where it is checked).
	if (a.max_wr < 1 || a.max_wr > kMaxSrqWr || a.max_sge > kMaxSrqSge) {
		errno = EINVAL;
		return nullptr;
	}
	// max_srq is device-wide, across processes (res_limits.h).
	if (int e = res_take(*lctx->fab, lctx->lease, SV_RES_SRQ)) {
		errno = e;
		return nullptr;
	}
	auto *srq = new (std::nothrow) loop_srq{};
	if (!srq) {
		res_put(*lctx->fab, lctx->lease, SV_RES_SRQ);
		errno = ENOMEM;
		return nullptr;
	}
	uint32_t entries = round_pow2(a.max_wr);
	uint32_t sge = std::max<uint32_t>(a.max_sge, 1);
	// The application's placement first (a parent domain's allocator).
	queue_place place;
	void *map = nullptr;
	if (int e = pd_place(attr->pd, SOFTVERBS_RES_TYPE_SRQ,
			     queue_total_bytes(sizeof(sv_rq_ring), entries, wqe_bytes(sge), 0), place,
			     srq->placed))
		errno = e;
	else
		map = queue_create(*lctx->fab, lctx->lease, SV_OBJ_SRQ, entries, wqe_bytes(sge),
				   sizeof(sv_rq_ring), sge, srq->ref, 0, place.mem ? &place : nullptr);
	if (map && place.mem)
		srq->alloc_pd = attr->pd;
	if (!map) {
		int e = errno;
		if (place.mem)
			pd_free(attr->pd, place.mem, SOFTVERBS_RES_TYPE_SRQ);
		delete srq;
		res_put(*lctx->fab, lctx->lease, SV_RES_SRQ);
		errno = e;
		return nullptr;
	}
	srq->ctx = lctx;
	srq->ring = static_cast<sv_rq_ring *>(map);
	memcpy(srq->ring->async_addr, lctx->async_addr, lctx->async_len);
	srq->ring->async_len = lctx->async_len;
	srq->ring->limit = a.srq_limit;
	srq->max_wr = entries;
	srq->max_sge = sge;
	srq->limit = a.srq_limit;
	uint32_t srq_num;
	{
		fabric &fab = *lctx->fab;
		registry_guard g(fab);
		sv_obj_rec &o = fab.reg()->objs[srq->ref.slot];
		// 24-bit SRQ number: generation above the 13-bit slot.
		srq_num = ((srq->ref.gen & 0x7ff) << 13) | srq->ref.slot;
		o.srq_num = srq_num;
		o.pdn = to_loop_pd(attr->pd)->pdn;
		if (xrc) {
			o.xrcd = reinterpret_cast<verbs_xrcd *>(attr->xrcd)->handle;
			loop_cq *cq = to_loop_cq(attr->cq);
			o.cq_obj = cq->ref.slot;
			o.cq_gen = cq->ref.gen;
		}
	}
	objects_add(SV_OBJ_SRQ, srq->ref.slot, &srq->vsrq.srq);
	verbs_srq &v = srq->vsrq;
	v.srq_type = type;
	v.srq_num = srq_num;
	v.xrcd = xrc ? reinterpret_cast<verbs_xrcd *>(attr->xrcd) : nullptr;
	v.cq = xrc ? attr->cq : nullptr;
	ibv_srq &s = v.srq;
	s.context = ctx;
	s.srq_context = attr->srq_context;
	s.pd = attr->pd;
	s.handle = srq->ref.slot;
	s.events_completed = 0;
	pthread_mutex_init(&s.mutex, nullptr);
	pthread_cond_init(&s.cond, nullptr);
	a.max_wr = entries;
	a.max_sge = sge;
	srq->parents = parents.keep();
	owned_add(ctx, srq, kOwnSrq);
	return &s;
}

ibv_srq *loop_create_srq(ibv_pd *pd, ibv_srq_init_attr *attr)
{
	ibv_srq_init_attr_ex ex{};
	ex.srq_context = attr->srq_context;
	ex.attr = attr->attr;
	ex.comp_mask = IBV_SRQ_INIT_ATTR_PD;
	ex.pd = pd;
	ibv_srq *srq = loop_create_srq_ex(pd->context, &ex);
	if (srq)
		attr->attr = ex.attr;
	return srq;
}

int loop_modify_srq(ibv_srq *ibsrq, ibv_srq_attr *attr, int mask)
{
	if (ctx_orphaned(ibsrq->context))
		return EBADF;
	loop_srq *srq = to_loop_srq(ibsrq);
	if (!srq->life.is(kLifeSrq))
		return life_bad("ibv_modify_srq", srq, srq->life, kLifeSrq);
	if (mask & ~(IBV_SRQ_MAX_WR | IBV_SRQ_LIMIT))
		return EINVAL;
	if (mask & IBV_SRQ_MAX_WR) {
		// Resizing is not advertised (no IBV_DEVICE_SRQ_RESIZE).
		return EINVAL;
	}
	if (mask & IBV_SRQ_LIMIT) {
		if (attr->srq_limit > srq->max_wr)
			return EINVAL;
		srq->limit = attr->srq_limit;
		std::atomic_ref<uint32_t>(srq->ring->limit)
			.store(attr->srq_limit, std::memory_order_release);
	}
	return 0;
}

int loop_query_srq(ibv_srq *ibsrq, ibv_srq_attr *attr)
{
	loop_srq *srq = to_loop_srq(ibsrq);
	if (!srq->life.is(kLifeSrq))
		return life_bad("ibv_query_srq", srq, srq->life, kLifeSrq);
	attr->max_wr = srq->max_wr;
	attr->max_sge = srq->max_sge;
	attr->srq_limit = std::atomic_ref<uint32_t>(srq->ring->limit).load();
	return 0;
}

int loop_destroy_srq(ibv_srq *ibsrq)
{
	if (ctx_orphaned(ibsrq->context))
		return EBADF;
	loop_srq *srq = to_loop_srq(ibsrq);
	// EBUSY while QPs use it (each holds a reference from its creation).
	if (int e = srq->life.begin_destroy(kLifeSrq, "ibv_destroy_srq", srq))
		return e;
	fabric &fab = *srq->ctx->fab;
	objects_remove(SV_OBJ_SRQ, srq->ref.slot);
	// No event names it now; wait for the acks of those handed out.
	if (!owned_closing())
		verbs_srq_wait_events(ibsrq);
	queue_destroy(fab, srq->ref, srq->ring, srq->alloc_pd != nullptr);
	if (srq->alloc_pd)
		pd_free(srq->alloc_pd, srq->ring, SOFTVERBS_RES_TYPE_SRQ);
	srq->alloc_pd = nullptr;
	srq->placed.reset();
	srq->ring = nullptr;
	res_put(fab, srq->ctx->lease, SV_RES_SRQ);
	srq->parents.release();
	srq->life.end_destroy(kLifeSrq);
	quarantine(srq);
	return 0;
}

int loop_post_srq_recv(ibv_srq *ibsrq, ibv_recv_wr *wr, ibv_recv_wr **bad)
{
	loop_srq *srq = to_loop_srq(ibsrq);
	if (!srq->life.is(kLifeSrq)) [[unlikely]] {
		*bad = wr;
		return life_bad("ibv_post_srq_recv", srq, srq->life, kLifeSrq);
	}
	std::lock_guard<qlock> g(srq->lock);
	return rq_post(srq->ring, srq->max_sge, wr, bad);
}

int loop_get_srq_num(ibv_srq *ibsrq, uint32_t *srq_num)
{
	loop_srq *srq = to_loop_srq(ibsrq);
	if (!srq->life.is(kLifeSrq))
		return life_bad("ibv_get_srq_num", srq, srq->life, kLifeSrq);
	*srq_num = srq->vsrq.srq_num;
	return 0;
}

} // namespace loop
