// SPDX-License-Identifier: MIT
// Queue pairs: creation, the state machine, receive queues.
#include "engine.h"
#include "loop.h"
#include "objects.h"
#include "qp_state.h"
#include "queue_geom.h"
#include "res_limits.h"
#include "rocev2/rocev2.h"

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace loop {

namespace {

std::atomic_ref<uint32_t> qp_state_ref(sv_qp_rec &q)
{
	return std::atomic_ref<uint32_t>(q.state);
}

uint32_t wqe_size(uint32_t max_sge)
{
	uint32_t b = sizeof(sv_recv_wqe) + max_sge * sizeof(sv_sge);
	return (b + 63) & ~63u;
}

// Slot idx of a ring, placed by the geometry checked when the ring was
// created or mapped (queue_geom), never by its header: a peer may rewrite
// the header, and an index from it could point anywhere.
sv_recv_wqe *rq_slot(sv_rq_ring *rq, const queue_geom &g, uint64_t idx)
{
	return reinterpret_cast<sv_recv_wqe *>(reinterpret_cast<char *>(rq) + g.slots_offset +
					       (idx & (g.entries - 1)) * uint64_t(g.entry_size));
}

bool rq_debug()
{
	static const bool on = [] {
		const char *s = getenv("SOFTVERBS_DEBUG");
		return s && *s && strcmp(s, "0") != 0;
	}();
	return on;
}

void rq_report(const sv_rq_ring *rq, const char *what, uint64_t p, uint64_t c)
{
	if (rq_debug())
		fprintf(stderr, "softverbs: receive queue at %p %s (prod %llu, cons %llu)\n",
			static_cast<const void *>(rq), what, static_cast<unsigned long long>(p),
			static_cast<unsigned long long>(c));
}

bool valid_type(ibv_qp_type t)
{
	return t == IBV_QPT_RC || t == IBV_QPT_UC || t == IBV_QPT_UD || t == IBV_QPT_XRC_SEND ||
	       t == IBV_QPT_XRC_RECV;
}

int check_caps(const ibv_qp_init_attr_ex &a, bool has_rq)
{
	const ibv_qp_cap &c = a.cap;
	if (a.qp_type != IBV_QPT_XRC_RECV &&
	    (c.max_send_wr > kMaxQpWr || c.max_send_sge > kMaxSge ||
	     c.max_inline_data > kMaxInlineData))
		return EINVAL;
	if (has_rq && (c.max_recv_wr > kMaxQpWr || c.max_recv_sge > kMaxSge))
		return EINVAL;
	return 0;
}

void report(const char *what, ibv_qp_state cur, ibv_qp_state next, int missing, int extra)
{
	static bool verbose = [] {
		const char *s = getenv("SOFTVERBS_DEBUG");
		return s && *s && strcmp(s, "0") != 0;
	}();
	if (!verbose)
		return;
	fprintf(stderr, "softverbs: modify_qp %s -> %s refused: %s", qp_state_name(cur),
		qp_state_name(next), what);
	if (missing)
		fprintf(stderr, "; missing %s", qp_mask_names(missing).c_str());
	if (extra)
		fprintf(stderr, "; not allowed %s", qp_mask_names(extra).c_str());
	fputc('\n', stderr);
}

// Values the state machine does not check.
int check_values(loop_qp *qp, const ibv_qp_attr &a, int mask)
{
	loop_context *lctx = qp->ctx;
	if ((mask & IBV_QP_PORT) && (a.port_num < 1 || a.port_num > lctx->dev->num_ports))
		return EINVAL;
	if ((mask & IBV_QP_PKEY_INDEX) && a.pkey_index >= kMaxPkeys)
		return EINVAL;
	// qp_access_flags: any bits, as the kernel (uverbs' modify_qp takes
	// them as given) and rxe and mlx5 (each reads the bits it knows): a
	// program that hands its MR's flags (RELAXED_ORDERING...) to the QP
	// works on them.  Only the remote rights are enforced.
	if ((mask & IBV_QP_PATH_MTU) && (a.path_mtu < IBV_MTU_256 || a.path_mtu > IBV_MTU_4096))
		return EINVAL;
	if ((mask & IBV_QP_MAX_QP_RD_ATOMIC) && a.max_rd_atomic > kMaxQpInitRdAtom)
		return EINVAL;
	if ((mask & IBV_QP_MAX_DEST_RD_ATOMIC) && a.max_dest_rd_atomic > kMaxQpRdAtom)
		return EINVAL;
	if ((mask & IBV_QP_TIMEOUT) && a.timeout > 31)
		return EINVAL;
	if ((mask & IBV_QP_RETRY_CNT) && a.retry_cnt > 7)
		return EINVAL;
	if ((mask & IBV_QP_RNR_RETRY) && a.rnr_retry > 7)
		return EINVAL;
	if ((mask & IBV_QP_MIN_RNR_TIMER) && a.min_rnr_timer > 31)
		return EINVAL;
	if ((mask & IBV_QP_DEST_QPN) && a.dest_qp_num > 0xffffff)
		return EINVAL;
	// rq_psn, sq_psn: the low 24 bits, as rxe masks them (the kernel
	// passes them on as given): loop_modify_qp keeps those.
	auto port_ok = [&](uint8_t p) { return p >= 1 && p <= lctx->dev->num_ports; };
	if (mask & IBV_QP_AV) {
		// The kernel's rules (uverbs' modify_qp): the AV's port is a port
		// of the device; at INIT -> RTR it is the QP's own, and elsewhere
		// (SQD -> SQD) it is the new port with IBV_QP_PORT, or becomes it.
		const ibv_ah_attr &ah = a.ah_attr;
		uint8_t port = ah.port_num;
		if (!port_ok(port))
			return EINVAL;
		bool to_rtr = (mask & IBV_QP_STATE) && a.qp_state == IBV_QPS_RTR;
		if (to_rtr && port != qp->attr.port_num)
			return EINVAL;
		if (!to_rtr && (mask & IBV_QP_PORT) && a.port_num != port)
			return EINVAL;
		if (ah.is_global)
			if (int e = loop_sgid_check(lctx, port, ah.grh.sgid_index))
				return e;
		bool eth = lctx->dev->ports[port - 1].link_layer == SV_LINK_ETH;
		if (eth && !ah.is_global)
			return EINVAL; // RoCE addresses by GID only
	}
	// The alternate path's ports, as the kernel judges them, and none on
	// an Ethernet port ("ban them in roce mode", the kernel's
	// _ib_modify_qp: RoCE has no path migration).
	if ((mask & IBV_QP_ALT_PATH) &&
	    (!port_ok(a.alt_port_num) || a.alt_ah_attr.port_num != a.alt_port_num))
		return EINVAL;
	if (mask & IBV_QP_ALT_PATH) {
		uint8_t own = (mask & IBV_QP_PORT) ? a.port_num : qp->attr.port_num;
		if (lctx->dev->ports[a.alt_port_num - 1].link_layer == SV_LINK_ETH ||
		    (port_ok(own) && lctx->dev->ports[own - 1].link_layer == SV_LINK_ETH))
			return EINVAL;
	}
	return 0;
}

} // namespace

void rq_flush(sv_rq_ring *rq, uint32_t qpn, cqe_sink sink, void *ctx)
{
	queue_geom g;
	if (!rq || !queue_geometry(rq, g))
		return;
	// Only the WR ids are needed: no SGEs are copied.  At most two laps:
	// a ring whose indices a peer damaged ends the flush, not the process.
	sv_recv_wqe w[1];
	for (uint64_t n = 0; n < 2 * uint64_t(g.entries) && rq_take(rq, w, 0); n++) {
		if (!sink)
			continue;
		sv_cqe e{};
		e.wr_id = w->wr_id;
		e.status = IBV_WC_WR_FLUSH_ERR;
		e.opcode = IBV_WC_RECV;
		e.qp_num = qpn;
		sink(ctx, e);
	}
}

void rq_flush(sv_rq_ring *rq, sv_cq_ring *cq, uint32_t qpn)
{
	rq_flush(
		rq, qpn, cq ? [](void *c, sv_cqe &e) {
			return cq_push(static_cast<sv_cq_ring *>(c), e, false);
		} : cqe_sink{nullptr},
		cq);
}

namespace {

// The receive CQ of a QP of any process, named afresh from the registry on
// each try: a resize closes the old ring (ESTALE) and then points the QP at
// the new one.
struct qp_rcq {
	fabric *fab;
	uint32_t slot;
};

int push_qp_rcq(void *c, sv_cqe &e)
{
	auto *t = static_cast<qp_rcq *>(c);
	sv_qp_rec &q = t->fab->reg()->qps[t->slot];
	uint64_t deadline = 0;
	for (;;) {
		obj_ref ref{q.rcq_obj, q.rcq_gen};
		queue_hold h = queue_map(*t->fab, ref, SV_OBJ_CQ);
		int err = ESTALE;
		if (auto *ring = h.as<sv_cq_ring>())
			err = cq_push(ring, e, false);
		else if (q.rcq_obj == ref.slot && q.rcq_gen == ref.gen)
			return 0; // The CQ is gone
		if (err != ESTALE)
			return err;
		uint64_t now = now_ns();
		if (!deadline)
			deadline = now + kResizeWaitNs + kClosedRingGraceNs;
		else if (now > deadline)
			return ENOSPC;
		sched_yield();
	}
}

int push_own_sink(void *c, sv_cqe &e)
{
	return push_own(static_cast<loop_cq *>(c), e);
}

} // namespace

[[gnu::hot]] bool rq_take(sv_rq_ring *rq, sv_recv_wqe *out, uint32_t max_sge, bool *damaged)
{
	queue_geom g;
	if (!queue_geometry(rq, g)) {
		if (damaged)
			*damaged = true;
		return false;
	}
	return rq_take(rq, g, out, max_sge, damaged);
}

[[gnu::hot]] bool rq_take(sv_rq_ring *rq, const queue_geom &g, sv_recv_wqe *out, uint32_t max_sge,
			  bool *damaged)
{
	if (damaged)
		*damaged = false;
	// The caller's buffer holds max_sge SGEs; a slot holds what its size
	// allows.  Copy no more than either.
	uint32_t slot_sge = (g.entry_size - uint32_t(sizeof(sv_recv_wqe))) / uint32_t(sizeof(sv_sge));
	uint32_t n_sge = std::min(max_sge, slot_sge);
	size_t bytes = sizeof(sv_recv_wqe) + size_t(n_sge) * sizeof(sv_sge);
	std::atomic_ref<uint64_t> cons(rq->cons);
	std::atomic_ref<uint64_t> prod(rq->prod);
	std::atomic_ref<uint64_t> seen(rq->prod_seen);
	uint64_t c = cons.load(std::memory_order_acquire);
	bool by_prod = false; // Judge by prod itself, not by the bound
	for (;;) {
		// The consumers' bound of prod, on cons's line; the producer's
		// line is read only when the bound shows no WQE (or a lap and
		// more), or the WQE it promised is not stamped with its index.
		// A bound read from prod is stored back only when sound.
		uint64_t p = seen.load(std::memory_order_acquire);
		bool bounded = !by_prod && p - c - 1 < g.entries;
		if (!bounded) {
			p = prod.load(std::memory_order_acquire);
			if (p - c <= g.entries)
				seen.store(p, std::memory_order_release);
		}
		if (c == p)
			return false;
		if (p - c > g.entries) {
			// Our c may be old: a consumer preempted after reading it
			// sees others take a lap and more meanwhile.  Judge a pair
			// read while cons stood still: then cons <= prod <= cons +
			// entries in any sound ring (consumers never pass prod, the
			// producer never laps the cons it read).
			uint64_t c1 = cons.load(std::memory_order_acquire);
			uint64_t p1 = prod.load(std::memory_order_acquire);
			uint64_t c2 = cons.load(std::memory_order_acquire);
			if (c1 != c2 || p1 - c1 <= g.entries) {
				c = c2; // Moving, or sound after all: try again
				continue;
			}
			// A producer index beyond a full lap, or cons beyond prod:
			// nothing in the ring can be believed.
			rq_report(rq, "has impossible indices", p1, c1);
			if (damaged)
				*damaged = true;
			return false;
		}
		sv_recv_wqe *slot = rq_slot(rq, g, c);
		uint32_t seq = std::atomic_ref<uint32_t>(slot->seq).load(std::memory_order_acquire);
		if (seq != static_cast<uint32_t>(c + 1)) {
			// A later lap's stamp in a slot cons has not passed: the
			// producer wrote over a WQE nobody took (its bound of cons
			// was written over).  One WQE is lost and another would be
			// taken twice: the ring cannot be believed.
			uint32_t ahead = seq - static_cast<uint32_t>(c + 1);
			if (seq && !(ahead & (g.entries - 1)) && static_cast<int32_t>(ahead) > 0 &&
			    cons.load(std::memory_order_acquire) == c) {
				rq_report(rq, "had a WQE written over before it was taken", p, c);
				if (damaged)
					*damaged = true;
				return false;
			}
			if (bounded) {
				by_prod = true; // Unstamped, or the bound ran ahead of prod
				continue;
			}
		}
		memcpy(out, slot, bytes);
		if (cons.compare_exchange_weak(c, c + 1, std::memory_order_acq_rel)) {
			// The next WQE, already posted, is read by the next message:
			// start bringing its line over now.
			if (p - c > 1)
				__builtin_prefetch(rq_slot(rq, g, c + 1));
			break;
		}
	}
	// The WQE came from shared memory: bound what we will believe.
	uint32_t limit = std::min(n_sge, g.max_sge ? g.max_sge : n_sge);
	if (out->num_sge > limit)
		out->num_sge = SV_RECV_WQE_INVALID; // For the caller's lkey check
	return true;
}

static_assert(sizeof(softverbs_recv_wqe) == sizeof(sv_recv_wqe));
static_assert(offsetof(softverbs_recv_wqe, num_sge) == offsetof(sv_recv_wqe, num_sge));
static_assert(sizeof(softverbs_sge) == sizeof(sv_sge));

int loop_dv_qp_rq(ibv_qp *ibqp, int on, softverbs_dv_rq *out)
{
	loop_qp *qp = to_loop_qp(ibqp);
	if (!qp->life.is(kLifeQp))
		return life_bad("softverbs_dv_qp_rq", qp, qp->life, kLifeQp);
	if (!qp->rq)
		return EINVAL; // An SRQ's, or no receive queue
	std::lock_guard<qlock> g(qp->rq_lock);
	if (!on) {
		if (!qp->rq_agent)
			return EINVAL;
		qp->rq_agent = false; // The library posts after the agent's prod
		return 0;
	}
	if (qp->rq_agent)
		return EBUSY;
	queue_geom geom;
	if (!queue_geometry(qp->rq, geom))
		return EINVAL;
	char *base = reinterpret_cast<char *>(qp->rq);
	softverbs_dv_rq d{};
	d.ring = base;
	d.slots = base + geom.slots_offset;
	d.prod = &qp->rq->prod;
	d.cons = &qp->rq->cons;
	d.format_version = SOFTVERBS_RQ_FORMAT_VERSION;
	d.count = geom.entries;
	d.stride = geom.entry_size;
	d.max_sge = qp->cap.max_recv_sge;
	d.qpn = qp->qpn;
	d.next = std::atomic_ref<uint64_t>(qp->rq->prod).load(std::memory_order_acquire);
	*out = d;
	qp->rq_agent = true;
	return 0;
}

void rq_destroy(fabric &fab, loop_qp *qp)
{
	// Under rq_lock: an ibv_post_recv racing ibv_destroy_qp in another
	// thread (past its life check) finds no ring, not an unmapped one.
	std::lock_guard<qlock> g(qp->rq_lock);
	queue_destroy(fab, qp->rq_ref, qp->rq, qp->rq_alloc_pd != nullptr);
	if (qp->rq_alloc_pd)
		pd_free(qp->rq_alloc_pd, qp->rq, SOFTVERBS_RES_TYPE_RQ);
	qp->rq = nullptr;
	qp->rq_alloc_pd = nullptr;
	qp->rq_placed.reset();
}

[[gnu::hot]] int rq_post(sv_rq_ring *rq, uint32_t max_sge, ibv_recv_wr *wr, ibv_recv_wr **bad,
			  uint64_t taken)
{
	queue_geom g;
	if (!queue_geometry(rq, g)) {
		*bad = wr;
		return EINVAL;
	}
	return rq_post(rq, g, max_sge, wr, bad, taken);
}

[[gnu::hot]] int rq_post(sv_rq_ring *rq, const queue_geom &g, uint32_t max_sge, ibv_recv_wr *wr,
			  ibv_recv_wr **bad, uint64_t taken)
{
	if (g.kind != SV_OBJ_RQ && g.kind != SV_OBJ_SRQ) {
		*bad = wr;
		return EINVAL;
	}
	if (max_sge > (g.entry_size - sizeof(sv_recv_wqe)) / sizeof(sv_sge)) {
		*bad = wr;
		return EINVAL;
	}
	std::atomic_ref<uint64_t> prod(rq->prod);
	std::atomic_ref<uint64_t> seen(rq->cons_seen);
	uint64_t p = prod.load(std::memory_order_relaxed);
	for (; wr; wr = wr->next) {
		if (wr->num_sge < 0 || static_cast<uint32_t>(wr->num_sge) > max_sge) {
			*bad = wr;
			prod.store(p, std::memory_order_release);
			return EINVAL;
		}
		// A receive longer than the port's max_msg_sz: EINVAL, as rxe's
		// post_one_recv ("message length too long").
		uint64_t len = 0;
		for (int i = 0; i < wr->num_sge; i++)
			len += wr->sg_list[i].length;
		if (len > kMaxMsgSize) {
			*bad = wr;
			prod.store(p, std::memory_order_release);
			return EINVAL;
		}
		// Room by our bound of cons, or the caller's if higher (a QP's
		// polled receive completions: with a ring kept full, each post
		// follows the poll of one completion, and the bound read from
		// cons would say full every time); the consumers' line only when
		// both show the ring full, and every 64 posts (a bound written
		// over lasts no longer).
		uint64_t c = seen.load(std::memory_order_acquire);
		if (static_cast<int64_t>(taken - c) > 0 && p - taken <= g.entries)
			c = taken;
		if (p - c >= g.entries || !(p & 63)) {
			c = std::atomic_ref<uint64_t>(rq->cons).load(std::memory_order_acquire);
			seen.store(c, std::memory_order_release);
		}
		// p - c above a lap (cons beyond prod, or either index rewritten
		// by a peer) reads as full too: posting is refused, not misplaced.
		if (p - c >= g.entries) {
			if (p - c > g.entries)
				rq_report(rq, "has impossible indices; post_recv refused", p, c);
			*bad = wr;
			prod.store(p, std::memory_order_release);
			return ENOMEM;
		}
		sv_recv_wqe *w = rq_slot(rq, g, p);
		w->wr_id = wr->wr_id;
		w->num_sge = static_cast<uint32_t>(wr->num_sge);
		for (int i = 0; i < wr->num_sge; i++) {
			w->sge[i].addr = wr->sg_list[i].addr;
			w->sge[i].length = wr->sg_list[i].length;
			w->sge[i].lkey = wr->sg_list[i].lkey;
		}
		// Stamped last: consumers that go by their bound of prod take
		// only a WQE showing its index (kernel-abi).
		std::atomic_ref<uint32_t>(w->seq).store(static_cast<uint32_t>(p + 1),
							std::memory_order_release);
		p++;
	}
	prod.store(p, std::memory_order_release);
	return 0;
}

bool qp_set_sqe(fabric &fab, uint32_t slot)
{
	if (slot >= SV_MAX_QPS)
		return false;
	std::atomic_ref<uint32_t> st = qp_state_ref(fab.reg()->qps[slot]);
	uint32_t cur = st.load(std::memory_order_acquire);
	do {
		if (cur != IBV_QPS_RTS && cur != IBV_QPS_SQD)
			return false;
	} while (!st.compare_exchange_weak(cur, IBV_QPS_SQE, std::memory_order_acq_rel));
	return true;
}

bool qp_enter_error(fabric &fab, uint32_t slot)
{
	if (slot >= SV_MAX_QPS)
		return false;
	std::atomic_ref<uint32_t> st = qp_state_ref(fab.reg()->qps[slot]);
	uint32_t cur = st.load(std::memory_order_acquire);
	do {
		if (cur == IBV_QPS_ERR || cur == IBV_QPS_RESET)
			return false;
	} while (!st.compare_exchange_weak(cur, IBV_QPS_ERR, std::memory_order_acq_rel));
	return true;
}

void qp_error_drain(fabric &fab, uint32_t slot)
{
	sv_qp_rec &q = fab.reg()->qps[slot];
	// A QP on an SRQ takes no receive WQE from here on: the last one it
	// will consume is behind it (IB 11.6.3, "Last WQE Reached"; consumers
	// wait for this before they destroy such a QP).
	if (q.has_srq)
		raise_qp_event(fab, slot, IBV_EVENT_QP_LAST_WQE_REACHED);
	// Flush the receive queue (not a shared SRQ) into the receive CQ.
	if (!q.has_srq && q.qp_type != IBV_QPT_XRC_SEND) {
		queue_hold rqh = queue_map(fab, {q.rq_obj, q.rq_gen}, SV_OBJ_RQ);
		uint32_t qpn = ((q.generation & SV_QPN_SLOT_MASK) << SV_QPN_SLOT_BITS) | slot;
		qp_rcq target{&fab, slot};
		rq_flush(rqh.as<sv_rq_ring>(), qpn, push_qp_rcq, &target);
	}
}

bool qp_set_error(fabric &fab, uint32_t slot, ibv_event_type cause, loop_qp *own)
{
	if (!qp_enter_error(fab, slot))
		return false;
	if (cause != kNoQpEvent) {
		if (own)
			raise_own_qp_event(own, cause);
		else
			raise_qp_event(fab, slot, cause);
	}
	qp_error_drain(fab, slot);
	return true;
}

ibv_qp *loop_create_qp_ex(ibv_context *ctx, ibv_qp_init_attr_ex *attr)
{
	if (ctx_closed(ctx, "ibv_create_qp_ex"))
		return nullptr;
	loop_context *lctx = to_loop_context(ctx);
	if (!attr || !valid_type(attr->qp_type)) {
		errno = EOPNOTSUPP;
		return nullptr;
	}
	uint32_t known = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_XRCD |
			 IBV_QP_INIT_ATTR_SEND_OPS_FLAGS | IBV_QP_INIT_ATTR_CREATE_FLAGS;
	if (attr->comp_mask & ~known) {
		errno = EOPNOTSUPP;
		return nullptr;
	}
	if (attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) {
		if (int e = qp_ex_check(*attr)) {
			errno = e;
			return nullptr;
		}
	}
	// BLOCK_SELF_MCAST_LB (UD): the QP does not receive its own sends to a
	// group it is attached to; no other flag is offered.
	uint32_t cflags = (attr->comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS) ? attr->create_flags : 0;
	uint32_t allowed = attr->qp_type == IBV_QPT_UD ? IBV_QP_CREATE_BLOCK_SELF_MCAST_LB : 0;
	if (cflags & ~allowed) {
		errno = EOPNOTSUPP;
		return nullptr;
	}
	bool xrc_recv = attr->qp_type == IBV_QPT_XRC_RECV;
	bool xrc_send = attr->qp_type == IBV_QPT_XRC_SEND;
	ibv_pd *pd = (attr->comp_mask & IBV_QP_INIT_ATTR_PD) ? attr->pd : nullptr;
	if (!xrc_recv && !pd) {
		errno = EINVAL;
		return nullptr;
	}
	if (xrc_recv && !(attr->comp_mask & IBV_QP_INIT_ATTR_XRCD && attr->xrcd)) {
		errno = EINVAL;
		return nullptr;
	}
	if (!xrc_recv && !attr->send_cq) {
		errno = EINVAL;
		return nullptr;
	}
	bool has_rq = !xrc_recv && !xrc_send && !attr->srq;
	if (has_rq && !attr->recv_cq) {
		errno = EINVAL;
		return nullptr;
	}
	if (attr->srq && attr->qp_type != IBV_QPT_RC && attr->qp_type != IBV_QPT_UD &&
	    attr->qp_type != IBV_QPT_UC) {
		errno = EINVAL;
		return nullptr;
	}
	// The objects it uses: live, of this context, and held until it goes
	// (the kernel's usecnt: their destroy is EBUSY meanwhile).
	parent_guard parents;
	{
		const char *verb = "ibv_create_qp";
		loop_pd *lpd = pd ? to_loop_pd(pd) : nullptr;
		loop_cq *scq = attr->send_cq ? to_loop_cq(attr->send_cq) : nullptr;
		loop_cq *rcq = attr->recv_cq ? to_loop_cq(attr->recv_cq) : nullptr;
		loop_srq *lsrq = attr->srq ? to_loop_srq(attr->srq) : nullptr;
		auto *lx = xrc_recv ? reinterpret_cast<loop_xrcd *>(attr->xrcd) : nullptr;
		int bad = 0;
		if (lpd && !parents.add(lpd->life, kLifePd))
			bad = life_bad(verb, lpd, lpd->life, kLifePd);
		else if (scq && !parents.add(scq->life, kLifeCq))
			bad = life_bad(verb, scq, scq->life, kLifeCq);
		else if (rcq && !parents.add(rcq->life, kLifeCq))
			bad = life_bad(verb, rcq, rcq->life, kLifeCq);
		else if (lsrq && !parents.add(lsrq->life, kLifeSrq))
			bad = life_bad(verb, lsrq, lsrq->life, kLifeSrq);
		else if (lx && !parents.add(lx->life, kLifeXrcd))
			bad = life_bad(verb, lx, lx->life, kLifeXrcd);
		else if ((pd && pd->context != ctx) || (scq && attr->send_cq->context != ctx) ||
			 (rcq && attr->recv_cq->context != ctx) ||
			 (lsrq && attr->srq->context != ctx) ||
			 (lx && attr->xrcd->context != ctx))
			bad = EINVAL; // An object of another context
		if (bad) {
			errno = bad;
			return nullptr;
		}
	}
	int err = check_caps(*attr, has_rq);
	if (err) {
		errno = err;
		return nullptr;
	}
	fabric &fab = *lctx->fab;
	// max_qp is device-wide, across processes (res_limits.h).
	if (int e = res_take(fab, lctx->lease, SV_RES_QP)) {
		errno = e;
		return nullptr;
	}
	auto *qp = new (std::nothrow) loop_qp{};
	if (qp) {
		// The deferred-SEND list never allocates once a SEND is
		// published (note_deferred): its room is taken now.
		try {
			qp->deferred.reserve(kMaxDeferred + 1);
		} catch (...) {
			delete qp;
			qp = nullptr;
		}
	}
	if (!qp) {
		res_put(fab, lctx->lease, SV_RES_QP);
		errno = ENOMEM;
		return nullptr;
	}
	qp->ctx = lctx;
	qp->type = attr->qp_type;
	qp->pdn = pd ? to_loop_pd(pd)->pdn : 0;
	qp->scq = attr->send_cq ? to_loop_cq(attr->send_cq) : nullptr;
	qp->rcq = attr->recv_cq ? to_loop_cq(attr->recv_cq) : nullptr;
	qp->srq = attr->srq ? to_loop_srq(attr->srq) : nullptr;
	qp->sq_sig_all = attr->sq_sig_all;
	qp->block_self_mcast = cflags & IBV_QP_CREATE_BLOCK_SELF_MCAST_LB;
	qp->cap = attr->cap;
	if (xrc_recv) {
		qp->cap = {};
	} else {
		qp->cap.max_send_wr = std::max<uint32_t>(attr->cap.max_send_wr, 1);
		qp->cap.max_send_sge = std::max<uint32_t>(attr->cap.max_send_sge, 1);
		// sq_create sizes the slots for what was asked and reports what
		// fits (at least that), as an HCA reports its WQE's room.
		if (int e = sq_create(qp, pd)) {
			delete qp;
			res_put(fab, lctx->lease, SV_RES_QP);
			errno = e;
			return nullptr;
		}
	}
	if (has_rq) {
		uint32_t entries = round_pow2(std::max<uint32_t>(attr->cap.max_recv_wr, 1));
		uint32_t sge = std::max<uint32_t>(attr->cap.max_recv_sge, 1);
		// The application's placement first (a parent domain's
		// allocator, SOFTVERBS_RES_TYPE_RQ); peers take its WQEs.
		queue_place place;
		void *map = nullptr;
		if (int e = pd_place(pd, SOFTVERBS_RES_TYPE_RQ,
				     queue_total_bytes(sizeof(sv_rq_ring), entries, wqe_size(sge), 0),
				     place, qp->rq_placed))
			errno = e;
		else
			map = queue_create(*lctx->fab, lctx->lease, SV_OBJ_RQ, entries,
					   wqe_size(sge), sizeof(sv_rq_ring), sge, qp->rq_ref, 0,
					   place.mem ? &place : nullptr);
		if (map && place.mem)
			qp->rq_alloc_pd = pd;
		if (!map) {
			int e = errno;
			if (place.mem)
				pd_free(pd, place.mem, SOFTVERBS_RES_TYPE_RQ);
			qp->rq_placed.reset();
			sq_destroy(qp);
			delete qp;
			res_put(fab, lctx->lease, SV_RES_QP);
			errno = e;
			return nullptr;
		}
		qp->rq = static_cast<sv_rq_ring *>(map);
		// Its geometry as made (rq_post's, never read back from the
		// header, which a peer may rewrite).  A fresh ring always has one.
		if (!queue_geometry(qp->rq, qp->rq_geom))
			qp->rq_geom = {};
		memcpy(qp->rq->async_addr, lctx->async_addr, lctx->async_len);
		qp->rq->async_len = lctx->async_len;
		qp->cap.max_recv_wr = entries;
		qp->cap.max_recv_sge = sge;
	} else {
		qp->cap.max_recv_wr = 0;
		qp->cap.max_recv_sge = 0;
	}
	// Claim a QP number.  Undoing the creation (queue_destroy, res_put) is
	// done after the registry lock is released: under it, a lock that is not
	// recursive (as it once was not) deadlocks on itself, and, being in
	// shared memory, stalls the whole fabric; a recursive one would still
	// make every process wait out an unlink and an unmap.
	bool claimed = [&] {
		registry_guard g(fab);
		sv_registry *r = fab.reg();
		uint32_t slot = SV_MAX_QPS;
		for (uint32_t i = 0; i < SV_MAX_QPS; i++)
			if (!r->qps[i].in_use) {
				slot = i;
				break;
			}
		if (slot == SV_MAX_QPS)
			return false; // Only if the table was damaged: max_qp fits it
		sv_qp_rec &q = r->qps[slot];
		uint32_t gen = q.generation + 1;
		// 0 and 0xfff would give QPNs below 4096 or the multicast QPN.
		while ((gen & SV_QPN_SLOT_MASK) == 0 || (gen & SV_QPN_SLOT_MASK) == SV_QPN_SLOT_MASK)
			gen++;
		memset(&q, 0, sizeof(q));
		q.generation = gen;
		// The generation lands before the fields: a reader that copied
		// any field of this QP reads a generation not the old QP's
		// (find_qp_cached reads it again after its copy).
		std::atomic_thread_fence(std::memory_order_release);
		q.owner_lease = static_cast<uint32_t>(lctx->lease);
		q.owner_gen = lctx->lease_gen;
		q.state = IBV_QPS_RESET;
		q.qp_type = static_cast<uint8_t>(attr->qp_type);
		q.device = lctx->dev->index;
		q.pdn = qp->pdn;
		q.sq_sig_all = attr->sq_sig_all ? 1 : 0;
		if (qp->rq) {
			q.rq_obj = qp->rq_ref.slot;
			q.rq_gen = qp->rq_ref.gen;
		} else if (qp->srq) {
			q.has_srq = 1;
			q.rq_obj = qp->srq->ref.slot;
			q.rq_gen = qp->srq->ref.gen;
		}
		if (qp->rcq) {
			q.rcq_obj = qp->rcq->ref.slot;
			q.rcq_gen = qp->rcq->ref.gen;
		}
		if (xrc_recv) {
			q.xrcd = reinterpret_cast<verbs_xrcd *>(attr->xrcd)->handle;
			// The creator's handle: the QP lives while one is held.
			if (!xrc_qp_handle_add_locked(fab, lctx->lease, slot, gen, q.xrcd,
						      qp->xrc_handle))
				return false;
		}
		// Published with release: a reader that loads in_use with
		// acquire sees every field above.
		std::atomic_ref<uint32_t>(q.in_use).store(1, std::memory_order_release);
		qp->slot = slot;
		qp->qpn = ((gen & SV_QPN_SLOT_MASK) << SV_QPN_SLOT_BITS) | slot;
		return true;
	}();
	if (!claimed) {
		if (qp->rq)
			rq_destroy(fab, qp);
		sq_destroy(qp);
		delete qp;
		res_put(fab, lctx->lease, SV_RES_QP);
		errno = ENOMEM;
		return nullptr;
	}
	objects_add(kObjQp, qp->slot, &qp->vqp.qp);
	cq_attach_sq(qp);
	ibv_qp &q = qp->vqp.qp;
	q.context = ctx;
	q.qp_context = attr->qp_context;
	q.pd = pd;
	q.send_cq = attr->send_cq;
	q.recv_cq = attr->recv_cq;
	q.srq = attr->srq;
	q.handle = qp->slot;
	q.qp_num = qp->qpn;
	q.state = IBV_QPS_RESET;
	q.qp_type = attr->qp_type;
	q.events_completed = 0;
	pthread_mutex_init(&q.mutex, nullptr);
	pthread_cond_init(&q.cond, nullptr);
	if (attr->comp_mask & IBV_QP_INIT_ATTR_XRCD)
		qp->vqp.xrcd = reinterpret_cast<verbs_xrcd *>(attr->xrcd);
	if (attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS)
		qp_ex_init(qp, attr->send_ops_flags);
	attr->cap = qp->cap;
	qp->parents = parents.keep();
	owned_add(ctx, qp, kOwnQp);
	return &q;
}

ibv_qp *loop_create_qp(ibv_pd *pd, ibv_qp_init_attr *attr)
{
	if (!attr) {
		errno = EINVAL;
		return nullptr;
	}
	ibv_qp_init_attr_ex ex{};
	memcpy(&ex, attr, sizeof(*attr));
	ex.comp_mask = IBV_QP_INIT_ATTR_PD;
	ex.pd = pd;
	ibv_qp *qp = loop_create_qp_ex(pd->context, &ex);
	if (qp)
		attr->cap = ex.cap;
	return qp;
}

int loop_modify_qp(ibv_qp *ibqp, ibv_qp_attr *attr, int mask)
{
	if (ctx_orphaned(ibqp->context))
		return EBADF;
	loop_qp *qp = to_loop_qp(ibqp);
	if (!qp->life.is(kLifeQp))
		return life_bad("ibv_modify_qp", qp, qp->life, kLifeQp);
	// The kernel drops the attributes an XRC half has no use for before it
	// judges the mask (uverbs' modify_qp_mask), so callers that set them
	// as for RC (perftest -c XRC) work on every device: here too.
	if (qp->type == IBV_QPT_XRC_SEND)
		mask &= ~(IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
	else if (qp->type == IBV_QPT_XRC_RECV)
		mask &= ~(IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY);
	// Bits past the legacy command's last (IBV_QP_DEST_QPN): rdma-core's
	// ibv_cmd_modify_qp and the kernel's ib_uverbs_modify_qp answer
	// EOPNOTSUPP (IBV_QP_RATE_LIMIT too, on a device without raw packet
	// QPs, as rxe).
	if (mask & ~((IBV_QP_DEST_QPN << 1) - 1)) {
		report("attribute mask bits this device does not know", IBV_QPS_UNKNOWN,
		       IBV_QPS_UNKNOWN, 0, mask & ~((IBV_QP_DEST_QPN << 1) - 1));
		return EOPNOTSUPP;
	}
	fabric &fab = *qp->ctx->fab;
	sv_qp_rec &rec = fab.reg()->qps[qp->slot];
	std::unique_lock<qlock> sg(qp->sq_lock);
	auto cur = static_cast<ibv_qp_state>(qp_state_ref(rec).load(std::memory_order_acquire));
	auto next = (mask & IBV_QP_STATE) ? attr->qp_state : cur;
	// While a drain is under way, SQD leaves only for ERR (rxe's
	// __qp_chk_state): the send queue is not settled yet.
	if (cur == IBV_QPS_SQD && (mask & IBV_QP_STATE) && next != IBV_QPS_ERR && qp_sq_busy(qp)) {
		report("the send queue is still draining", cur, next, 0, 0);
		return EINVAL;
	}
	int missing = 0, extra = 0;
	// cur_qp_state is the caller's only with IBV_QP_CUR_STATE: unset, it may
	// hold any bits, and loading those as the enum is undefined (UBSan).
	auto cur_claim = (mask & IBV_QP_CUR_STATE) ? attr->cur_qp_state : cur;
	if (qp_modify_check(qp->type, cur, next, mask, cur_claim, &missing, &extra)) {
		report("illegal transition or attribute mask", cur, next, missing, extra);
		return EINVAL;
	}
	int err = check_values(qp, *attr, mask);
	if (err) {
		report("attribute value out of range", cur, next, 0, 0);
		return err;
	}
	ibv_qp_attr &a = qp->attr;
	if (mask & IBV_QP_PORT)
		a.port_num = attr->port_num;
	if (mask & IBV_QP_PKEY_INDEX)
		a.pkey_index = attr->pkey_index;
	if (mask & IBV_QP_ACCESS_FLAGS)
		a.qp_access_flags = attr->qp_access_flags;
	if (mask & IBV_QP_QKEY)
		a.qkey = attr->qkey;
	if (mask & IBV_QP_AV) {
		a.ah_attr = attr->ah_attr;
		if (!(mask & IBV_QP_PORT))
			a.port_num = a.ah_attr.port_num; // The same at RTR (check_values)
	}
	if (mask & IBV_QP_PATH_MTU)
		a.path_mtu = attr->path_mtu;
	if (mask & IBV_QP_DEST_QPN)
		a.dest_qp_num = attr->dest_qp_num;
	if (mask & IBV_QP_RQ_PSN)
		a.rq_psn = attr->rq_psn & kPsnMask;
	if (mask & IBV_QP_SQ_PSN)
		a.sq_psn = attr->sq_psn & kPsnMask;
	if (mask & IBV_QP_MAX_DEST_RD_ATOMIC)
		a.max_dest_rd_atomic = attr->max_dest_rd_atomic;
	if (mask & IBV_QP_MAX_QP_RD_ATOMIC)
		a.max_rd_atomic = attr->max_rd_atomic;
	if (mask & IBV_QP_MIN_RNR_TIMER)
		a.min_rnr_timer = attr->min_rnr_timer;
	if (mask & IBV_QP_TIMEOUT)
		a.timeout = attr->timeout;
	if (mask & IBV_QP_RETRY_CNT)
		a.retry_cnt = attr->retry_cnt;
	if (mask & IBV_QP_RNR_RETRY)
		a.rnr_retry = attr->rnr_retry;
	if (mask & IBV_QP_ALT_PATH) {
		a.alt_ah_attr = attr->alt_ah_attr;
		a.alt_pkey_index = attr->alt_pkey_index;
		a.alt_port_num = attr->alt_port_num;
		a.alt_timeout = attr->alt_timeout;
	}
	if (mask & IBV_QP_PATH_MIG_STATE)
		a.path_mig_state = attr->path_mig_state;
	if (mask & IBV_QP_EN_SQD_ASYNC_NOTIFY)
		a.en_sqd_async_notify = attr->en_sqd_async_notify;
	a.qp_state = next;
	{
		registry_guard g(fab);
		if (mask & (IBV_QP_PORT | IBV_QP_AV))
			rec.port = a.port_num;
		if (mask & IBV_QP_ACCESS_FLAGS)
			rec.access = static_cast<uint32_t>(attr->qp_access_flags);
		if (mask & IBV_QP_QKEY)
			rec.qkey = attr->qkey;
		if (mask & IBV_QP_PATH_MTU)
			rec.path_mtu = static_cast<uint8_t>(attr->path_mtu);
		if (mask & IBV_QP_DEST_QPN)
			rec.dest_qpn = attr->dest_qp_num;
		if (mask & IBV_QP_MIN_RNR_TIMER)
			rec.min_rnr_timer = attr->min_rnr_timer;
		if (next == IBV_QPS_RTR && cur != IBV_QPS_RTR)
			std::atomic_ref<uint8_t>(rec.comm_est).store(0, std::memory_order_relaxed);
		if (next == IBV_QPS_RESET && qp->rq) {
			// Back to RESET: the receive queue is emptied, nothing completes.
			std::atomic_ref<uint64_t>(qp->rq->cons)
				.store(std::atomic_ref<uint64_t>(qp->rq->prod).load(),
				       std::memory_order_release);
		}
	}
	if (next == IBV_QPS_ERR && cur != IBV_QPS_ERR) {
		qp_set_error(fab, qp->slot);
	} else {
		qp_state_ref(rec).store(next, std::memory_order_release);
	}
	if (next == IBV_QPS_RESET) {
		sq_reset(qp);
		cq_clean(qp->rcq, qp->qpn);
		if (qp->scq != qp->rcq)
			cq_clean(qp->scq, qp->qpn);
	}
	if (next == IBV_QPS_ERR)
		qp_flush_backlog(qp); // Under sq_lock, which we hold
	rocev2_qp_modified(qp, mask);
	// SQD: no WR starts; one already started finishes, and then the
	// drained event comes if it was asked for (at once if none was).
	bool resume = false;
	if (next == IBV_QPS_SQD && cur != IBV_QPS_SQD) {
		qp->sqd_notify = (mask & IBV_QP_EN_SQD_ASYNC_NOTIFY) && attr->en_sqd_async_notify;
		qp_sq_drained(qp);
	} else if (next != IBV_QPS_SQD) {
		qp->sqd_notify = false;
		// Back to RTS from SQD: what was posted meanwhile runs now.
		if (cur == IBV_QPS_SQD && next == IBV_QPS_RTS)
			resume = qp_resume_backlog(qp);
	}
	sg.unlock();
	if (resume)
		progress_add(qp); // The progress lock comes before sq_lock
	return 0;
}

int loop_query_qp(ibv_qp *ibqp, ibv_qp_attr *attr, int mask, ibv_qp_init_attr *init)
{
	(void)mask;
	loop_qp *qp = to_loop_qp(ibqp);
	if (!qp->life.is(kLifeQp))
		return life_bad("ibv_query_qp", qp, qp->life, kLifeQp);
	sv_qp_rec &rec = qp->ctx->fab->reg()->qps[qp->slot];
	*attr = qp->attr;
	attr->qp_state =
		static_cast<ibv_qp_state>(qp_state_ref(rec).load(std::memory_order_acquire));
	attr->cur_qp_state = attr->qp_state;
	attr->cap = qp->cap;
	attr->sq_draining = 0;
	if (attr->qp_state == IBV_QPS_SQD) {
		std::lock_guard<qlock> sg(qp->sq_lock);
		attr->sq_draining = qp_sq_busy(qp);
	}
	memset(init, 0, sizeof(*init));
	init->qp_context = ibqp->qp_context;
	init->send_cq = ibqp->send_cq;
	init->recv_cq = ibqp->recv_cq;
	init->srq = ibqp->srq;
	init->cap = qp->cap;
	init->qp_type = qp->type;
	init->sq_sig_all = qp->sq_sig_all;
	return 0;
}

int loop_destroy_qp(ibv_qp *ibqp)
{
	if (ctx_orphaned(ibqp->context))
		return EBADF;
	loop_qp *qp = to_loop_qp(ibqp);
	if (int e = qp->life.begin_destroy(kLifeQp, "ibv_destroy_qp", qp))
		return e;
	fabric &fab = *qp->ctx->fab;
	if (qp->opened) {
		// Closing an opened XRC target QP drops this handle; the QP lives
		// on while another process (its creator, or another opener)
		// holds one, and goes with the last.
		{
			registry_guard g(fab);
			xrc_qp_close_locked(fab, qp);
		}
		qp->parents.release();
		qp->life.end_destroy(kLifeQp);
		quarantine(qp);
		return 0;
	}
	// Attached to multicast groups: EBUSY, as the kernel answers until the
	// application detaches them (closing the context detaches them).
	if (qp->type == IBV_QPT_UD && mcast_attached(qp, owned_closing()) && !owned_closing()) {
		qp->life.abort_destroy(kLifeQp);
		debug_log("ibv_destroy_qp(%p): QP %#x is still attached to a multicast group: "
			  "EBUSY until ibv_detach_mcast", static_cast<void *>(qp), qp->qpn);
		return EBUSY;
	}
	progress_remove(qp);
	rocev2_qp_destroyed(qp);
	if (qp->agent)
		engine_remove(qp);
	{
		registry_guard g(fab);
		if (qp->type == IBV_QPT_XRC_RECV) {
			// A shared XRC target QP: the creator's destroy closes its
			// handle, and the QP lives on while an opener holds one.
			xrc_qp_close_locked(fab, qp);
		} else {
			sv_qp_rec &rec = fab.reg()->qps[qp->slot];
			qp_state_ref(rec).store(IBV_QPS_RESET, std::memory_order_release);
			rec.in_use = 0;
			res_put_locked(fab, qp->ctx->lease, SV_RES_QP);
		}
	}
	objects_remove(kObjQp, qp->slot);
	// No event names it now; wait for the acks of those handed out.
	if (!owned_closing())
		verbs_qp_wait_events(ibqp);
	cq_detach_sq(qp);
	cq_clean(qp->rcq, qp->qpn);
	if (qp->scq != qp->rcq)
		cq_clean(qp->scq, qp->qpn);
	if (qp->rq)
		rq_destroy(fab, qp);
	sq_destroy(qp);
	qp_ex_destroy(qp);
	// Its CQs, SRQ, PD and domain may go now; its memory is kept a while
	// so that a stale pointer reads the dead state.
	qp->parents.release();
	qp->life.end_destroy(kLifeQp);
	quarantine(qp);
	return 0;
}

[[gnu::hot]] int loop_post_recv(ibv_qp *ibqp, ibv_recv_wr *wr, ibv_recv_wr **bad)
{
	loop_qp *qp = to_loop_qp(ibqp);
	if (!qp->life.is(kLifeQp)) [[unlikely]] {
		*bad = wr;
		return life_bad("ibv_post_recv", qp, qp->life, kLifeQp);
	}
	sv_qp_rec &rec = qp->ctx->fab->reg()->qps[qp->slot];
	if (qp_state_ref(rec).load(std::memory_order_acquire) == IBV_QPS_RESET) {
		*bad = wr;
		return EINVAL;
	}
	std::lock_guard<qlock> g(qp->rq_lock);
	// No ring: an SRQ attached, a send-only QP, or destroyed by another
	// thread meanwhile (rq_destroy clears it under rq_lock).
	if (!qp->rq || !qp->life.is(kLifeQp)) [[unlikely]] {
		*bad = wr;
		return EINVAL;
	}
	if (qp->rq_agent) {
		*bad = wr;
		return EINVAL; // One producer at a time: an agent posts (softverbs_dv_qp_rq)
	}
	int ret = rq_post(qp->rq, qp->rq_geom, qp->cap.max_recv_sge, wr, bad,
			  qp->rq_polled.load(std::memory_order_acquire));
	// Receives posted to a QP in ERR complete at once as flushed.
	if (!ret && qp_state_ref(rec).load(std::memory_order_acquire) == IBV_QPS_ERR)
		rq_flush(qp->rq, qp->qpn, qp->rcq ? push_own_sink : nullptr, qp->rcq);
	return ret;
}

} // namespace loop
