// SPDX-License-Identifier: MIT
// The responder: a request that needs the target's receive queue (SEND of
// any kind, RDMA WRITE WITH IMM, a UD datagram) meets it here.  It takes a
// receive WQE (none: RNR NAK), checks the WQE's keys, places the data,
// completes the receive into the target's CQ, and answers ACK or NAK
// with the requester's completion status.  It reaches the target only
// through the transport's responder calls (take_recv, resolve_key, move,
// post_cqe, responder_error), so the same code serves the loop transport,
// which runs it on the requester's thread against the peer's shared rings,
// and any transport that runs it on the target's side.
// One-sided operations (RDMA WRITE, READ, atomics) need no responder code
// of ours: the transport executes them (transport.h: move, atomic).
#include "engine.h"

#include <cerrno>
#include <cstring>

namespace loop {

namespace {

tp_answer ack(uint64_t len)
{
	return {tp_answer::kind::ack, IBV_WC_SUCCESS, static_cast<uint32_t>(len)};
}

tp_answer nak(ibv_wc_status st)
{
	return {tp_answer::kind::nak, st, 0};
}

constexpr tp_answer kRnr{tp_answer::kind::rnr, IBV_WC_SUCCESS, 0};
constexpr tp_answer kLost{tp_answer::kind::lost, IBV_WC_SUCCESS, 0};

// The segments of a receive WQE for len bytes.  Returns a status for the
// responder; *gone is set when a key's owner turned out to be dead (no
// answer: not the responder's error to report).
[[gnu::hot]] ibv_wc_status scatter(const transport_ops &t, loop_qp *qp, const peer &p,
		      const sv_recv_wqe *wqe, uint32_t pdn, uint64_t len, std::vector<rseg> &out,
		      bool *gone)
{
	out.clear();
	if (wqe->num_sge == SV_RECV_WQE_INVALID)
		return IBV_WC_LOC_PROT_ERR; // A malformed WQE in shared memory
	uint64_t room = 0;
	for (uint32_t i = 0; i < wqe->num_sge && room < len; i++) {
		const sv_sge &s = wqe->sge[i];
		if (!s.length)
			continue;
		uint64_t n = std::min<uint64_t>(s.length, len - room);
		if (int err = t.resolve_key(qp, p, s.lkey, pdn, s.addr, n, IBV_ACCESS_LOCAL_WRITE,
					    out, nullptr)) {
			// A dead owner may show as any key error (its mapping could
			// not be made, or a reaping freed the record first): ask.
			*gone = err == ESRCH || err == ETIMEDOUT || !t.alive(qp, p.qpn, false).alive;
			return IBV_WC_LOC_PROT_ERR;
		}
		room += n;
	}
	if (room < len)
		return IBV_WC_LOC_LEN_ERR;
	return IBV_WC_SUCCESS;
}

sv_cqe recv_cqe(const peer &p, const tp_request &r, uint64_t wr_id)
{
	sv_cqe e{};
	e.wr_id = wr_id;
	e.qp_num = p.qpn;
	e.src_qp = r.src_qpn;
	e.slid = r.slid;
	e.sl = r.sl;
	return e;
}

// A target that lives but did not take a message's bytes in time (the
// loop transport's service copy path, its thread stopped or stuck: move's
// and post_cqe's ETIMEDOUT), after its receive WQE was taken.  A retry
// would take the next WQE and leave this one consumed with no completion,
// so the receive completes in error (LOC_QP_OP_ERR), the responder's QP
// fails (QP_FATAL: flushing the rest) and the requester hears a remote
// operational error.  Nothing moved that the receiver is told of.
tp_answer stuck_target(const transport_ops &t, loop_qp *qp, const peer &p, sv_cqe &rcv, bool uc)
{
	rcv.status = IBV_WC_LOC_QP_OP_ERR;
	rcv.wc_flags = 0;
	rcv.byte_len = 0;
	t.post_cqe(qp, p, rcv, false, nullptr);
	if (!uc)
		t.responder_error(qp, p, IBV_EVENT_QP_FATAL);
	return nak(IBV_WC_REM_OP_ERR);
}

[[gnu::hot]] tp_answer respond_send(const transport_ops &t, loop_qp *qp, const peer &p, const tp_request &r,
		       const sv_recv_wqe *wqe, uint32_t pdn)
{
	const send_wr &w = *r.w;
	const local_buf &lb = *r.lb;
	bool uc = p.rec.qp_type == IBV_QPT_UC;
	std::vector<rseg> &riov = qp->resp_riov;
	bool gone = false;
	ibv_wc_status rs = scatter(t, qp, p, wqe, pdn, lb.len, riov, &gone);
	if (gone) {
		riov.clear(); // Pins nothing of the dead receiver's memory
		return kLost; // The receiver died: as if the request was lost
	}
	sv_cqe rcv = recv_cqe(p, r, wqe->wr_id);
	rcv.opcode = IBV_WC_RECV;
	rcv.byte_len = static_cast<uint32_t>(lb.len);
	if (w.opcode == IBV_WR_SEND_WITH_IMM) {
		rcv.imm_data = w.imm_data;
		rcv.wc_flags = IBV_WC_WITH_IMM;
	}
	if (w.opcode == IBV_WR_SEND_WITH_INV) {
		// The responder invalidates the key on behalf of its QP.
		if (rs == IBV_WC_SUCCESS) {
			if (t.invalidate(qp, p, w.invalidate_rkey))
				rs = IBV_WC_LOC_PROT_ERR;
			else
				rcv.wc_flags = IBV_WC_WITH_INV;
		}
		rcv.imm_data = w.invalidate_rkey; // Read back as wc.invalidated_rkey
	}
	bool solicited = w.flags & IBV_SEND_SOLICITED;
	int perr = 0;
	if (rs == IBV_WC_SUCCESS) {
		tp_payload d{&lb, wqe, riov.data(), static_cast<int>(riov.size())};
		rcv.status = IBV_WC_SUCCESS;
		perr = t.post_cqe(qp, p, rcv, solicited, &d);
		if (perr == ESRCH) {
			riov.clear();
			return kLost;
		}
		if (perr == EFAULT || perr == ETIMEDOUT) {
			rs = perr == EFAULT ? IBV_WC_LOC_PROT_ERR : IBV_WC_LOC_QP_OP_ERR;
			rcv.wc_flags &= ~IBV_WC_WITH_INV;
		}
	}
	if (rs != IBV_WC_SUCCESS) {
		rcv.status = rs;
		perr = t.post_cqe(qp, p, rcv, solicited, nullptr);
	}
	if (perr == ENOSPC)
		return nak(IBV_WC_REM_OP_ERR); // Its CQ overflowed: the message is lost
	if (rs != IBV_WC_SUCCESS) {
		if (!uc)
			t.responder_error(qp, p, rs == IBV_WC_LOC_QP_OP_ERR ? IBV_EVENT_QP_FATAL
									    : IBV_EVENT_QP_REQ_ERR);
		return nak(rs == IBV_WC_LOC_LEN_ERR ? IBV_WC_REM_INV_REQ_ERR : IBV_WC_REM_OP_ERR);
	}
	return ack(lb.len);
}

tp_answer respond_write_imm(const transport_ops &t, loop_qp *qp, const peer &p,
			    const tp_request &r, const sv_recv_wqe *wqe)
{
	const send_wr &w = *r.w;
	const local_buf &lb = *r.lb;
	bool uc = p.rec.qp_type == IBV_QPT_UC;
	sv_cqe rcv = recv_cqe(p, r, wqe->wr_id);
	rcv.opcode = IBV_WC_RECV_RDMA_WITH_IMM;
	std::vector<rseg> &riov = qp->resp_riov;
	riov.clear();
	uint32_t raccess = 0;
	// The QP's right whatever the length, the key only for bytes (as
	// run_rdma).
	int kerr = !(p.rec.access & IBV_ACCESS_REMOTE_WRITE) ? EACCES : 0;
	if (lb.len && !kerr)
		kerr = t.resolve_key(qp, p, w.rkey, p.rec.pdn, w.remote_addr, lb.len,
				     IBV_ACCESS_REMOTE_WRITE, riov, &raccess);
	if (kerr && (kerr == ESRCH || kerr == ETIMEDOUT || !t.alive(qp, p.qpn, false).alive)) {
		riov.clear();
		return kLost; // The target died: as if the request was lost
	}
	if (kerr) {
		// The consumed receive completes in error on the responder.
		rcv.status = IBV_WC_REM_ACCESS_ERR;
		t.post_cqe(qp, p, rcv, false, nullptr);
		if (!uc)
			t.responder_error(qp, p, IBV_EVENT_QP_ACCESS_ERR);
		return nak(IBV_WC_REM_ACCESS_ERR);
	}
	if (lb.len) {
		tp_move m{lb.iov.data(),
			  static_cast<int>(lb.iov.size()),
			  riov.data(),
			  static_cast<int>(riov.size()),
			  xfer_dir::to_peer,
			  lb.checked,
			  (raccess & IBV_ACCESS_RELAXED_ORDERING) != 0};
		int err = t.move(qp, p, &m, 1, nullptr);
		if (err == ESRCH) {
			riov.clear();
			return kLost;
		}
		if (err == ETIMEDOUT) {
			// The target lives but did not take the bytes (responder
			// stuck: stuck_target).  The receive WQE is taken, so a
			// retry would take another: it completes in error.
			riov.clear();
			return stuck_target(t, qp, p, rcv, uc);
		}
		if (err) {
			// The registered range is not mapped in the target any more.
			if (!uc)
				t.responder_error(qp, p, IBV_EVENT_QP_ACCESS_ERR);
			return nak(IBV_WC_REM_ACCESS_ERR);
		}
	}
	rcv.byte_len = static_cast<uint32_t>(lb.len);
	rcv.imm_data = w.imm_data;
	rcv.wc_flags = IBV_WC_WITH_IMM;
	int perr = t.post_cqe(qp, p, rcv, w.flags & IBV_SEND_SOLICITED, nullptr);
	if (perr == ESRCH || perr == ETIMEDOUT) {
		riov.clear();
		return kLost;
	}
	if (perr == ENOSPC)
		return nak(IBV_WC_REM_OP_ERR);
	return ack(lb.len);
}

// A datagram: whatever happens, the requester hears nothing back (UD has
// no acknowledgements), so every answer is an ACK.
tp_answer respond_ud(const transport_ops &t, loop_qp *qp, const peer &p, const tp_request &r)
{
	const send_wr &w = *r.w;
	const local_buf &lb = *r.lb;
	if (!peer_receives(p.rec) || p.rec.qp_type != IBV_QPT_UD || p.rec.qkey != r.qkey)
		return ack(0); // Dropped silently, as a UD packet with a bad Q_Key is
	std::vector<uint8_t> &wqe_buf = qp->resp_wqe_buf;
	std::vector<rseg> &riov = qp->resp_riov;
	sv_recv_wqe *wqe = nullptr;
	uint32_t pdn = 0;
	if (t.take_recv(qp, p, wqe_buf, wqe, pdn))
		return ack(0);
	bool gone = false;
	ibv_wc_status rs = scatter(t, qp, p, wqe, pdn, sizeof(ibv_grh) + lb.len, riov, &gone);
	if (gone)
		return ack(0); // The receiver died: the datagram is lost
	if (rs == IBV_WC_SUCCESS) {
		small_vec<iovec, 17> liov;
		liov.push_back({const_cast<ibv_grh *>(r.grh), sizeof(ibv_grh)});
		liov.insert_end(lb.iov.begin(), lb.iov.end());
		tp_move m{liov.data(),	       static_cast<int>(liov.size()),
			  riov.data(),	       static_cast<int>(riov.size()),
			  xfer_dir::to_peer, lb.checked,
			  false};
		if (t.move(qp, p, &m, 1, nullptr))
			rs = IBV_WC_LOC_PROT_ERR;
	}
	sv_cqe rcv = recv_cqe(p, r, wqe->wr_id);
	rcv.status = rs;
	rcv.opcode = IBV_WC_RECV;
	rcv.byte_len = static_cast<uint32_t>(lb.len + sizeof(ibv_grh));
	// The receiver's DLID path bits (the low LMC bits of the DLID it was
	// sent to): every port has LMC 0 (loop_query.cpp), so none.  Not the
	// sender's source path bits, which ibv_init_ah_from_wc would copy into
	// the reply's AH.
	rcv.dlid_path_bits = 0;
	if (r.grh_valid)
		rcv.wc_flags |= IBV_WC_GRH;
	if (w.opcode == IBV_WR_SEND_WITH_IMM) {
		rcv.imm_data = w.imm_data;
		rcv.wc_flags |= IBV_WC_WITH_IMM;
	}
	t.post_cqe(qp, p, rcv, w.flags & IBV_SEND_SOLICITED, nullptr);
	return ack(lb.len);
}

} // namespace

tp_answer respond_taken(const transport_ops &t, loop_qp *qp, const peer &p, const tp_request &r,
			const sv_recv_wqe *wqe, uint32_t pdn)
{
	if (r.w->opcode == IBV_WR_RDMA_WRITE_WITH_IMM)
		return respond_write_imm(t, qp, p, r, wqe);
	return respond_send(t, qp, p, r, wqe, pdn);
}

[[gnu::hot]] tp_answer respond(const transport_ops &t, loop_qp *qp, const peer &p, const tp_request &r)
{
	// A packet whose transport is not the QP's is invalid and dropped (IB
	// 9.6.1.1: a UD SEND to an RC QP's number is not an RC SEND; taken,
	// any UD QP of the fabric could write into any connected QP's
	// receives).  Connected requesters check the type before they come.
	if (r.datagram != (p.rec.qp_type == IBV_QPT_UD))
		return r.datagram ? ack(0) : kLost;
	if (p.rec.qp_type == IBV_QPT_UD)
		return respond_ud(t, qp, p, r);
	std::vector<uint8_t> &wqe_buf = qp->resp_wqe_buf;
	sv_recv_wqe *wqe = nullptr;
	uint32_t pdn = 0;
	if (int e = t.take_recv(qp, p, wqe_buf, wqe, pdn))
		return e == ENXIO ? kLost : kRnr;
	if (r.w->opcode == IBV_WR_RDMA_WRITE_WITH_IMM)
		return respond_write_imm(t, qp, p, r, wqe);
	return respond_send(t, qp, p, r, wqe, pdn);
}

// Sequence numbers are 24 bits and compared within half their range (IB
// 9.7.1): behind epsn is a duplicate, ahead of it a gap.
psn_class resp_seq_check(resp_seq &s, uint32_t psn)
{
	if (!s.started)
		return psn_class::expected;
	uint32_t d = (psn - s.epsn) & kPsnMask;
	if (d == 0)
		return psn_class::expected;
	return d >= (kPsnMask + 1) / 2 ? psn_class::duplicate : psn_class::future;
}

void resp_seq_advance(resp_seq &s, uint32_t psn)
{
	s.epsn = (psn + 1) & kPsnMask;
	s.started = true;
}

} // namespace loop
