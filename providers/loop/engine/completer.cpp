// SPDX-License-Identifier: MIT
// The completer: answers become completions.  It books the retries of the
// head WQE (RNR waits on the responder's timer, transport timeouts on the
// QP's), fails it when they run out (RNR_RETRY_EXC_ERR, RETRY_EXC_ERR),
// takes the QP to ERR on an error and flushes the WQEs behind it.  A WQE
// waits at the head of the send queue, and the ones behind it wait with
// it: so completions come in posting order and fences hold (the requester
// runs one WQE at a time).  Caller holds sq_lock, but for push_own.
#include "c_boundary.h"
#include "engine.h"
#include "rocev2.h"

#include <cerrno>
#include <algorithm>
#include <sched.h>

namespace loop {

namespace {

// IB's encoded RNR timer values, in microseconds (IB spec table 45).
constexpr uint32_t kRnrTimerUs[32] = {
	655360, 10,    20,    30,    40,    60,	 80,	 120,	 160,	 240,	  320,
	480,	640,   960,   1280,  1920,  2560,  3840,  5120,  7680,  10240, 15360,
	20480,	30720, 40960, 61440, 81920, 122880, 163840, 245760, 327680, 491520,
};

} // namespace

uint64_t timeout_ns(uint8_t timeout)
{
	// 4.096 us * 2^timeout; 0 means "infinite" in the spec, which would let a
	// dead peer hang a WR forever, so it is capped like every other value.
	uint64_t ns = timeout ? 4096ULL << std::min<uint8_t>(timeout, 31) : kTimeoutCapNs;
	return std::min<uint64_t>(ns, kTimeoutCapNs);
}

int push_own(loop_cq *cq, sv_cqe &e)
{
	if (!cq)
		return 0;
	// A concurrent resize closes the old ring; ESTALE means look again,
	// for as long as a resize may take.
	uint64_t deadline = 0;
	for (;;) {
		// Counted while the ring's address is in hand: a resize unmaps the
		// ring it replaced only once no thread here is inside (the counter
		// and the ring pointer are both seq_cst, as in Dekker's protocol).
		cq->pushers.fetch_add(1, std::memory_order_seq_cst);
		sv_cq_ring *ring = std::atomic_ref<sv_cq_ring *>(cq->ring).load(std::memory_order_seq_cst);
		const loop_cq::ring_geom *rg = cq->geo.load(std::memory_order_acquire);
		int err = rg && rg->ring == ring && !cq->geo_off.load(std::memory_order_relaxed)
				  ? cq_push(ring, rg->g, e, false, nullptr, nullptr)
				  : cq_push(ring, e, false);
		cq->pushers.fetch_sub(1, std::memory_order_release);
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

// A completion of the send queue: it names the WR's slot, which the poller
// frees.  A send CQ that overflowed takes the QP to ERR with
// IBV_EVENT_QP_FATAL: the completion is lost, but never silently.
[[gnu::hot]] void push_sq(loop_qp *qp, const send_wr &w, ibv_wc_status st, ibv_wc_opcode op,
	     uint32_t byte_len)
{
	sv_cqe e{};
	e.wr_id = w.wr_id;
	e.status = st;
	e.opcode = op;
	e.qp_num = qp->qpn;
	e.byte_len = byte_len;
	e.src_qp = static_cast<uint32_t>(w.sq_index);
	e.flags = SV_CQE_SQ_INDEX;
	if (push_own(qp->scq, e) == ENOSPC)
		qp_set_error(*qp->ctx->fab, qp->slot, IBV_EVENT_QP_FATAL, qp);
}

[[gnu::hot]] void complete(loop_qp *qp, const send_wr &w, ibv_wc_status st, uint32_t byte_len)
{
	// UC has no acknowledgements: a requester never learns what the
	// responder did with its message, so remote errors complete as sent.
	if (qp->type == IBV_QPT_UC && (st == IBV_WC_REM_ACCESS_ERR || st == IBV_WC_REM_INV_REQ_ERR ||
				       st == IBV_WC_REM_OP_ERR))
		st = IBV_WC_SUCCESS;
	bool signaled = qp->sq_sig_all || (w.flags & IBV_SEND_SIGNALED) || st != IBV_WC_SUCCESS;
	if (!signaled)
		return;
	if (st == IBV_WC_SUCCESS || st == IBV_WC_WR_FLUSH_ERR) {
		push_sq(qp, w, st, wc_opcode(w.opcode), byte_len);
		return;
	}
	// An error completion takes a reliable QP to ERR (IB C10-61, C10-96):
	// its receive queue and the WRs behind this one then complete flushed.
	// A UD or UC QP goes to SQE instead: the WRs behind complete flushed,
	// its receive queue goes on, and SQE -> RTS resumes it (IB 10.3.1).
	// The state changes before the completion is published, as on an
	// HCA: a poller that takes it and queries the QP finds it in ERR (the
	// progress thread's RNR and retry give-ups pushed first, and an ASan
	// run's ibv_query_qp right after the poll read RTS).  The receive
	// queue's flush follows the completion.
	fabric &fab = *qp->ctx->fab;
	bool drain = false;
	if (qp->type == IBV_QPT_UD || qp->type == IBV_QPT_UC)
		qp_set_sqe(fab, qp->slot);
	else
		drain = qp_enter_error(fab, qp->slot);
	push_sq(qp, w, st, wc_opcode(w.opcode), byte_len);
	if (drain)
		qp_error_drain(fab, qp->slot);
}

// Completes every WQE the requester has not finished flushed, in order.
// Caller holds sq_lock.
void flush_backlog(loop_qp *qp)
{
	if (qp->wire_next > qp->sq_cons)
		rocev2_drop_flights(qp); // No packet reads their buffers from now on
	uint64_t posted = qp->sq_posted.load(std::memory_order_relaxed);
	thread_local send_wr w;
	for (uint64_t i = qp->sq_cons; i != posted; i++) {
		const send_wr *f = &w;
		if (i == qp->sq_cons && qp->sq_head_valid)
			f = &qp->sq_head;
		else
			wqe_read(qp, i, w);
		push_sq(qp, *f, IBV_WC_WR_FLUSH_ERR, wc_opcode(f->opcode), 0);
	}
	sq_set_cons(qp, posted);
}

namespace {

// Fails w, the head of the send queue, with fail after its retries: the
// QP goes to ERR (SQE for UC) and the rest is flushed.  Returns 0.
uint64_t give_up(loop_qp *qp, send_wr &w, ibv_wc_status fail)
{
	complete(qp, w, fail, 0); // ERR, or SQE for UC (complete())
	sq_set_cons(qp, qp->sq_cons + 1);
	if (qp->type != IBV_QPT_UC && qp->type != IBV_QPT_UD)
		qp_set_error(*qp->ctx->fab, qp->slot);
	flush_backlog(qp);
	return 0;
}

} // namespace

// The head WQE w did not finish (s: RNR or unreachable): books its next
// try after the RNR timer or the QP's timeout, or, with no retries left,
// completes it in error, takes the QP to ERR and flushes the rest.  Returns
// the time of the next try, or 0 when w failed.  Caller holds sq_lock.
uint64_t book_retry(loop_qp *qp, send_wr &w, step s, uint64_t now)
{
	if (s == step::wait)
		return w.next_try_ns; // Its own time, no retry counted (step::wait)
	ibv_wc_status fail = IBV_WC_SUCCESS;
	const transport_ops &t = active_transport();
	tp_liveness live{};
	if (s == step::rnr) {
		// An RNR wait on a dead responder would last forever with
		// rnr_retry 7: a dead peer counts as unreachable instead.  The
		// check takes the registry's lock and reads /proc, so it is made
		// at most every kRnrAliveEveryNs per QP: with an RNR timer of
		// 10 us, checking on every try kept the progress threads of three
		// processes fighting for that lock while holding their QPs' send
		// locks, and their posting threads (which would have reposted the
		// receives the RNR waited for) starved: sv_xrc -p 3 hung.
		if (!qp->rnr_checked_ns || now - qp->rnr_checked_ns >= kRnrAliveEveryNs) {
			live = t.alive(qp, qp->attr.dest_qp_num, false);
			qp->rnr_checked_ns = now;
			qp->rnr_timer = live.min_rnr_timer;
			qp->rnr_peer_alive = live.alive;
		}
		live = {qp->rnr_peer_alive, qp->rnr_timer};
		if (!live.alive)
			s = step::unreachable;
	}
	if (s == step::rnr) {
		if (w.rnr_left == 0)
			fail = IBV_WC_RNR_RETRY_EXC_ERR;
		else if (w.rnr_left != 7)
			w.rnr_left--;
		w.next_try_ns = now + kRnrTimerUs[live.min_rnr_timer & 31] * 1000ULL;
	} else {
		// Each try, the last one too, waits out its own timeout before
		// the next or before the WR fails (IBTA 9.7.6.1.3, rxe's
		// completer): retry_cnt 0 fails one timeout after the request,
		// not at once, though this transport knows at once that nobody
		// answers.  retry_left -1: the last try's timeout is running
		// (drain fails the WR when it ends).
		t.alive(qp, qp->attr.dest_qp_num, true);
		w.retry_left = w.retry_left > 0 ? w.retry_left - 1 : -1;
		w.next_try_ns = now + timeout_ns(qp->attr.timeout);
	}
	if (fail != IBV_WC_SUCCESS)
		return give_up(qp, w, fail);
	return w.next_try_ns;
}

// Runs WQEs from the head of the send queue.  Caller holds sq_lock.
uint64_t drain(loop_qp *qp)
{
	fabric &fab = *qp->ctx->fab;
	sv_qp_rec &rec = fab.reg()->qps[qp->slot];
	uint64_t posted = qp->sq_posted.load(std::memory_order_relaxed);
	while (qp->sq_cons != posted) {
		uint32_t state = std::atomic_ref<uint32_t>(rec.state).load(std::memory_order_acquire);
		if (state == IBV_QPS_ERR || state == IBV_QPS_SQE) {
			flush_backlog(qp);
			return 0;
		}
		// The head is on the wire (rocev2_write_start), completed from
		// there: what waits behind it runs once it is done.
		// (In SQD a drained event may wait for them: looked at again.)
		if (qp->wire_next > qp->sq_cons)
			return qp->wire_next >= posted && !qp->sqd_notify ? 0
									 : now_ns() + kWireWaitNs;
		// SQD: a WR already started (its retry booked) finishes; none
		// starts until SQD -> RTS (qp_resume_backlog).
		if (state == IBV_QPS_SQD && !qp_sq_busy(qp)) {
			qp_sq_drained(qp);
			return 0;
		}
		send_wr &w = qp->sq_head;
		if (!qp->sq_head_valid) {
			ibv_wc_status st = wqe_read(qp, qp->sq_cons, w);
			qp->sq_head_valid = true;
			if (st != IBV_WC_SUCCESS) {
				complete(qp, w, st, 0);
				sq_set_cons(qp, qp->sq_cons + 1);
				continue;
			}
		}
		uint64_t now = now_ns();
		if (w.next_try_ns > now)
			return w.next_try_ns;
		if (w.retry_left < 0)
			return give_up(qp, w, IBV_WC_RETRY_EXC_ERR); // The last try's timeout ran out
		step s = run_wr(qp, w);
		if (s == step::done) {
			sq_set_cons(qp, qp->sq_cons + 1);
			continue;
		}
		return book_retry(qp, w, s, now);
	}
	if (std::atomic_ref<uint32_t>(rec.state).load(std::memory_order_acquire) == IBV_QPS_SQD)
		qp_sq_drained(qp);
	return 0;
}

bool qp_sq_busy(const loop_qp *qp)
{
	return qp->wire_next > qp->sq_cons ||
	       (qp->sq_head_valid && qp->sq_cons != qp->sq_posted.load(std::memory_order_relaxed) &&
		qp->sq_head.next_try_ns);
}

void qp_sq_drained(loop_qp *qp)
{
	if (!qp->sqd_notify || qp_sq_busy(qp))
		return;
	qp->sqd_notify = false;
	raise_own_qp_event(qp, IBV_EVENT_SQ_DRAINED);
}

bool qp_resume_backlog(loop_qp *qp)
{
	drain(qp);
	return qp->sq_cons != qp->sq_posted.load(std::memory_order_relaxed);
}

} // namespace loop
