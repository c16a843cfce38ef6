// SPDX-License-Identifier: MIT
// The engine's stages and what they share (private to engine/ and the
// transports).  rxe's split:
//   sq_ring.cpp    the send queue ring: posting, WQE format, doorbell
//   requester.cpp  a WQE becomes transport requests (transport.h)
//   responder.cpp  a request meets the peer's RQ/SRQ: receive WQE,
//                  scatter, completion, or RNR; duplicates by sequence
//   completer.cpp  answers become CQEs; retries, RNR waits, timeouts,
//                  flushes; drain() runs the head of the send queue
// The posting thread runs them inline (the latency path); the engine
// thread (loop_engine.cpp) for agents' doorbells, and the progress thread
// (loop_progress.cpp) for WQEs waiting on a timer, through the same drain().
// Locks: everything here runs under the QP's sq_lock.
#pragma once

#include "loop.h"
#include "transport.h"

namespace loop {

// What running the head WQE came to.
enum class step {
	done,	     // Completed (successfully or not)
	rnr,	     // The responder had no receive WQE: retry after its RNR timer
	unreachable, // No live QP answered, or no answer came: retry after the QP's timeout
	wait,	     // A local operation waits (next_try_ns set): run it again then, nothing counted
};

// No sequence number given yet (send_wr::psn).
inline constexpr uint32_t kNoPsn = UINT32_MAX;
inline constexpr uint32_t kPsnMask = 0xffffff;

inline bool peer_receives(const sv_qp_rec &q)
{
	// SQE stops the send queue only (IB 10.3.1, C10-38).
	return q.state == IBV_QPS_RTR || q.state == IBV_QPS_RTS || q.state == IBV_QPS_SQD ||
	       q.state == IBV_QPS_SQE;
}

// A UD packet's GRH PayLen: the bytes after the GRH up to and including
// the ICRC (IB 8.3.1): BTH, DETH, the immediate if any, the payload padded
// to 4 bytes, ICRC.
inline uint32_t ud_grh_paylen(uint64_t payload, bool imm)
{
	return static_cast<uint32_t>(12 + 8 + (imm ? 4 : 0) + ((payload + 3) & ~uint64_t{3}) + 4);
}

// requester.cpp
// The 40-byte GRH a UD receive finds at the head of its buffer: on an
// InfiniBand port the GRH (next header the BTH), on a RoCE v2 port the IP
// header of the datagram (IPv4 in the last 20 bytes, the first 20 zero,
// when both GIDs are IPv4-mapped; else IPv6 with next header UDP), as rxe
// and mlx5 give it.  ib_paylen: ud_grh_paylen's.
void build_grh(ibv_grh &g, const ibv_gid &sgid, const ibv_gid &dgid, uint32_t ib_paylen,
	       uint8_t tclass, uint32_t flow, uint8_t hop, bool roce);
// The source and destination GIDs of a GRH area build_grh made, in either
// of its forms (IPv4 addresses as IPv4-mapped GIDs).
void grh_gids(const ibv_grh &g, ibv_gid &sgid, ibv_gid &dgid);
bool opcode_ok(ibv_qp_type t, ibv_wr_opcode op);
ibv_wc_opcode wc_opcode(ibv_wr_opcode op);
step run_wr(loop_qp *qp, send_wr &w);
// The first try of a connected QP's WRITE or SEND through the transport's
// express way (transport.h): false when it was not taken (run_wr then);
// true with what the try came to in s, as run_wr's.  Caller holds sq_lock,
// the QP in RTS, w at the head of the send queue.
bool run_express(loop_qp *qp, send_wr &w, step &s);
// A doorbell batch: consecutive RDMA WRITEs, or READs, of one posting call
// to one peer in another process, staged in WR order (loop_qp::batch_*)
// once each passed the checks run_rdma makes; their bytes then move in one
// transport call (one process_vm_writev/readv per IOV_MAX iovecs) and they
// complete in WR order, before the posting call returns.
struct rdma_batch {
	peer p;
	bool read = false;
	uint64_t first = 0;	       // The first WR's sq_index
	small_vec<tp_move, 64> ops; // One per WR, filled in by rdma_flush
	// READs: the registrations of their local buffers, held from the
	// gather until rdma_flush placed the responses (local_buf::holds).
	mr_copy_holds holds;
};
// Stages w, whose WQE is written next (its inline data at inline_copy),
// into b: false, having changed nothing, when w is not a WRITE or READ of
// b's direction and peer that would move bytes of unmapped peer memory
// once its checks pass (flush b, then run w as usual).  Caller holds sq_lock.
bool rdma_stage(loop_qp *qp, send_wr &w, const void *inline_copy, rdma_batch &b);
// Moves and completes every WR staged in b (none: nothing).  A WR whose
// bytes did not all land completes as it would have alone, and the WRs
// behind it run as the send queue's backlog.  Caller holds sq_lock.
void rdma_flush(loop_qp *qp, rdma_batch &b);
// Over RoCE v2: hands the RDMA WRITE w (just posted at index posted, its
// inline bytes at inline_copy) to the wire when every WR before it is
// done or handed over too; it completes from the receive thread.  False:
// the requester runs it as any other WR.
bool wire_handoff(loop_qp *qp, send_wr &w, uint64_t posted, const void *inline_copy);
// The first send-queue index the requester runs itself: the ones before
// it are done or on the wire.
inline uint64_t backlog_start(const loop_qp *qp)
{
	return qp->wire_next > qp->sq_cons ? qp->wire_next : qp->sq_cons;
}

// responder.cpp
// Runs request r at the responder of p, through t's responder calls.
tp_answer respond(const transport_ops &t, loop_qp *qp, const peer &p, const tp_request &r);
// The same, with the receive WQE already taken (t.take_recv: into wqe, its
// lkeys of PD pdn): a transport that takes it when a message begins.
tp_answer respond_taken(const transport_ops &t, loop_qp *qp, const peer &p, const tp_request &r,
			const sv_recv_wqe *wqe, uint32_t pdn);
// A responder's expected sequence number, for transports whose requests
// may be lost, duplicated or reordered (the fake; RoCE v2 later).  The
// loop transport delivers exactly once and keeps none.
struct resp_seq {
	uint32_t epsn = 0;
	bool started = false; // The first request sets epsn
};
enum class psn_class {
	expected,  // Execute it, then resp_seq_advance
	duplicate, // Executed before: answer again, do not execute
	future,	   // Beyond a gap: a sequence NAK (the requester retries)
};
psn_class resp_seq_check(resp_seq &s, uint32_t psn);
void resp_seq_advance(resp_seq &s, uint32_t psn);

// completer.cpp
// A QP's local ACK timeout in nanoseconds: 4.096 us << timeout, capped
// (timeout 0, "infinite", too) at kTimeoutCapNs.
uint64_t timeout_ns(uint8_t timeout);
// Completes w with st on the send CQ (signaled or an error); an error
// takes a connected QP to ERR.
void complete(loop_qp *qp, const send_wr &w, ibv_wc_status st, uint32_t byte_len);
void push_sq(loop_qp *qp, const send_wr &w, ibv_wc_status st, ibv_wc_opcode op,
	     uint32_t byte_len);
// Completes every WQE the requester has not finished flushed, in order.
void flush_backlog(loop_qp *qp);
// Runs WQEs from the head of the send queue: the time of the next retry,
// or 0 when nothing waits.
uint64_t drain(loop_qp *qp);
// After a try of the head WQE that did not finish: the next try's time,
// or 0 when its retries ran out (completed in error, QP in ERR).
uint64_t book_retry(loop_qp *qp, send_wr &w, step s, uint64_t now);

// sq_ring.cpp
ibv_wc_status wqe_read(loop_qp *qp, uint64_t index, send_wr &w);
void sq_set_cons(loop_qp *qp, uint64_t c);

// transport/loop/loop_transport.cpp: the fabric's own ports and events
extern const transport_ops loop_transport_ops;
uint16_t fabric_port_lid(loop_context *lctx, uint8_t port);
bool fabric_port_is_eth(loop_context *lctx, uint8_t port);
uint8_t fabric_port_mtu(loop_context *lctx, uint8_t port);
void raise_qp_event(fabric &fab, uint32_t qp_slot, ibv_event_type type);
// The same for a QP of this process, through its context's own socket
// (whatever CQs and queues it has).
void raise_own_qp_event(loop_qp *qp, ibv_event_type type);
// The first request that finds a connected QP of this fabric in RTR raises
// IBV_EVENT_COMM_EST on it (IB 11.6.3), once until it enters RTR again.
void raise_comm_est(fabric &fab, const peer &p);
inline void note_comm_est(fabric &fab, const peer &p)
{
	if (p.rec.state == IBV_QPS_RTR && !p.rec.comm_est && !p.remote) [[unlikely]]
		raise_comm_est(fab, p);
}

} // namespace loop
