// SPDX-License-Identifier: MIT
// The send queue ring (sv_sq_ring, kernel-abi/softverbs-abi.h) and the
// posting path.  ibv_post_send and the ibv_wr_* batches write each WR as a
// WQE into the QP's ring and ring its doorbell; the posting thread then
// runs the engine on it at once (the latency path).  A WQE that cannot
// finish now (RNR, an unreachable peer) stays at the head of the ring for
// the progress thread, and the WQEs behind it wait with it: the ring
// between the requester's consumer index and the producer index is the
// QP's backlog.  An agent's QP (softverbs_dv_qp_agent) is posted to by
// the agent, whose doorbell the engine thread serves (sq_serve_doorbell).
#include "c_boundary.h"
#include "engine.h"
#include "rocev2.h"

#include <cerrno>
#include <cstring>
#include <algorithm>
#include <sys/mman.h>

namespace loop {

namespace {

static_assert(SV_WQE_OP_FAST_REG == kWrFastReg, "the fast-register opcode is the ABI's");
static_assert(kMaxSge <= UINT8_MAX, "ctrl.num_sge holds any SGE count");
// <infiniband/softverbs_dv.h> mirrors the ABI's layouts for its inline helpers.
static_assert(SOFTVERBS_SQ_FORMAT_VERSION == SV_SQ_FORMAT_VERSION);
static_assert(SOFTVERBS_WQE_HDR_SIZE == SV_WQE_HDR_SIZE);
static_assert(SOFTVERBS_WQE_INLINE == SV_WQE_INLINE);
static_assert(SOFTVERBS_CQE_SQ_INDEX == SV_CQE_SQ_INDEX);
static_assert(SOFTVERBS_WQE_OP_FAST_REG == SV_WQE_OP_FAST_REG);
static_assert(SV_CQE_PLACE == 2, "softverbs_dv_cq_poll tests bit 2");
static_assert(sizeof(softverbs_wqe) == sizeof(sv_send_wqe));
static_assert(offsetof(softverbs_wqe, raddr) == offsetof(sv_send_wqe, raddr));
static_assert(offsetof(softverbs_wqe, atomic) == offsetof(sv_send_wqe, atomic));
static_assert(offsetof(softverbs_wqe, ud) == offsetof(sv_send_wqe, ud));
static_assert(offsetof(softverbs_wqe, mem) == offsetof(sv_send_wqe, mem));
static_assert(sizeof(softverbs_wqe_ctrl) == sizeof(sv_wqe_ctrl));
static_assert(offsetof(softverbs_wqe_ctrl, send_flags) == offsetof(sv_wqe_ctrl, send_flags));
static_assert(offsetof(softverbs_wqe_ctrl, wr_id) == offsetof(sv_wqe_ctrl, wr_id));
static_assert(offsetof(softverbs_wqe_ctrl, imm) == offsetof(sv_wqe_ctrl, imm));
static_assert(offsetof(softverbs_wqe_ctrl, inline_len) == offsetof(sv_wqe_ctrl, inline_len));
static_assert(offsetof(softverbs_wqe_ctrl, index) == offsetof(sv_wqe_ctrl, index));
static_assert(sizeof(softverbs_sge) == sizeof(sv_sge));
static_assert(sizeof(softverbs_cqe) == sizeof(sv_cqe));
static_assert(offsetof(softverbs_cqe, wr_id) == offsetof(sv_cqe, wr_id));
static_assert(offsetof(softverbs_cqe, byte_len) == offsetof(sv_cqe, byte_len));
static_assert(offsetof(softverbs_cqe, qp_num) == offsetof(sv_cqe, qp_num));
static_assert(offsetof(softverbs_cqe, src_qp) == offsetof(sv_cqe, src_qp));
static_assert(offsetof(softverbs_cqe, flags) == offsetof(sv_cqe, flags));
static_assert(offsetof(softverbs_cqe, timestamp) == offsetof(sv_cqe, timestamp));

sv_send_wqe *sq_slot(loop_qp *qp, uint64_t index)
{
	return reinterpret_cast<sv_send_wqe *>(reinterpret_cast<char *>(qp->sq) + SV_SQ_HDR_SIZE +
					       (index & qp->sq_mask) * size_t{qp->sq_stride});
}

bool is_mem_op(uint32_t op)
{
	return op == IBV_WR_BIND_MW || op == kWrFastReg;
}

bool is_inv_op(uint32_t op)
{
	return op == IBV_WR_LOCAL_INV || op == IBV_WR_SEND_WITH_INV;
}

// Writes w as WQE number `index`, whose slot is free.  Caller holds sq_lock.
// The control and remote address segments are written for every WQE; the
// atomic, UD and memory segments only for the opcodes and QP types that
// read them (the ring's contract, softverbs-abi.h), each whole.
[[gnu::hot]] void wqe_write(loop_qp *qp, const send_wr &w, uint64_t index)
{
	sv_send_wqe *slot = sq_slot(qp, index);
	sv_wqe_ctrl c{};
	c.opcode = static_cast<uint8_t>(w.opcode);
	c.num_sge = static_cast<uint8_t>(w.is_inline ? 0 : w.num_sge);
	c.flags = w.is_inline ? SV_WQE_INLINE : 0;
	c.send_flags = w.flags;
	c.wr_id = w.wr_id;
	c.imm = is_inv_op(w.opcode) ? w.invalidate_rkey : w.imm_data;
	c.inline_len = w.is_inline ? w.inline_len : 0;
	c.xrc_srqn = w.xrc_srqn;
	c.index = static_cast<uint32_t>(index);
	memcpy(&slot->ctrl, &c, sizeof(c));
	sv_wqe_raddr r{};
	r.remote_addr = w.remote_addr;
	r.rkey = w.rkey;
	memcpy(&slot->raddr, &r, sizeof(r));
	if (w.opcode == IBV_WR_ATOMIC_CMP_AND_SWP || w.opcode == IBV_WR_ATOMIC_FETCH_AND_ADD ||
	    w.opcode == IBV_WR_ATOMIC_WRITE) {
		sv_wqe_atomic at{};
		at.compare_add = w.compare_add;
		at.swap = w.swap;
		memcpy(&slot->atomic, &at, sizeof(at));
	}
	if (qp->type == IBV_QPT_UD) {
		sv_wqe_ud u{};
		u.remote_qpn = w.remote_qpn;
		u.qkey = w.remote_qkey;
		u.dlid = w.ah.dlid;
		u.sl = w.ah.sl;
		u.src_path_bits = w.ah.src_path_bits;
		u.static_rate = w.ah.static_rate;
		u.is_global = w.ah.is_global;
		u.port_num = w.ah.port_num;
		u.sgid_index = w.ah.grh.sgid_index;
		u.hop_limit = w.ah.grh.hop_limit;
		u.traffic_class = w.ah.grh.traffic_class;
		u.flow_label = w.ah.grh.flow_label;
		memcpy(u.dgid, w.ah.grh.dgid.raw, sizeof(u.dgid));
		memcpy(&slot->ud, &u, sizeof(u));
	}
	if (is_mem_op(w.opcode)) {
		sv_wqe_mem m{};
		m.slot = w.mw_slot;
		m.type = w.mw_type;
		m.lkey = w.bind_lkey;
		m.access = w.bind_access;
		m.addr = w.bind_addr;
		m.length = w.bind_len;
		m.npages = w.npages;
		m.page_shift = w.page_shift;
		m.new_key = w.rkey;
		memcpy(&slot->mem, &m, sizeof(m));
	}
	char *data = reinterpret_cast<char *>(slot) + SV_WQE_HDR_SIZE;
	if (w.is_inline) {
		memcpy(data, w.inline_data, w.inline_len);
	} else {
		for (uint32_t i = 0; i < w.num_sge; i++) {
			sv_sge s{w.sge[i].addr, w.sge[i].length, w.sge[i].lkey};
			memcpy(data + i * sizeof(sv_sge), &s, sizeof(s));
		}
	}
	loop_qp::lib_wqe &lib = qp->sq_lib[index & qp->sq_mask];
	lib.index1 = index + 1;
	lib.frmr = w.opcode == kWrFastReg ? w.frmr : nullptr;
	lib.bind1_slot =
		w.opcode == IBV_WR_BIND_MW && w.mw_type == IBV_MW_TYPE_1 ? w.mw_slot : 0;
}

} // namespace

// Reads WQE number `index` into w (with fresh retry state), checking it as
// any input from shared memory is checked.  Returns IBV_WC_SUCCESS, or the
// status a malformed WQE completes with.  Caller holds sq_lock.
ibv_wc_status wqe_read(loop_qp *qp, uint64_t index, send_wr &w)
{
	const sv_send_wqe *slot = sq_slot(qp, index);
	sv_send_wqe q;
	memcpy(&q, slot, sizeof(q));
	const char *data = reinterpret_cast<const char *>(slot) + SV_WQE_HDR_SIZE;
	w.sq_index = index;
	w.wr_id = q.ctrl.wr_id;
	w.flags = q.ctrl.send_flags;
	w.rnr_left = qp->attr.rnr_retry;
	w.retry_left = qp->attr.retry_cnt;
	w.inv_waiting = false;
	w.next_try_ns = 0;
	w.psn = kNoPsn;
	w.is_inline = false;
	w.inline_len = 0;
	w.num_sge = 0;
	w.frmr = nullptr;
	uint32_t op = q.ctrl.opcode;
	// The opcode is checked as an integer before it becomes the enum.
	if (op > IBV_WR_ATOMIC_WRITE || !opcode_ok(qp->type, static_cast<ibv_wr_opcode>(op))) {
		w.opcode = IBV_WR_SEND; // Completes as what it cannot be
		return IBV_WC_LOC_QP_OP_ERR;
	}
	w.opcode = static_cast<ibv_wr_opcode>(op);
	// Inline data is a SEND's or a WRITE's payload, or an atomic write's
	// value, which is nothing else: 8 bytes inline (the form the library
	// writes; softverbs_dv.h).  An agent's READ or atomic marked inline
	// would have no SGE for its response, and an atomic write without its
	// 8 bytes would write whatever an earlier WQE left (a helper's probe).
	bool may_inline = op == IBV_WR_SEND || op == IBV_WR_SEND_WITH_IMM ||
			  op == IBV_WR_SEND_WITH_INV || op == IBV_WR_RDMA_WRITE ||
			  op == IBV_WR_RDMA_WRITE_WITH_IMM || op == IBV_WR_ATOMIC_WRITE;
	if ((q.ctrl.flags & SV_WQE_INLINE) && !may_inline)
		return IBV_WC_LOC_QP_OP_ERR;
	if (op == IBV_WR_ATOMIC_WRITE &&
	    (!(q.ctrl.flags & SV_WQE_INLINE) || q.ctrl.inline_len != 8))
		return IBV_WC_LOC_LEN_ERR;
	if (q.ctrl.flags & SV_WQE_INLINE) {
		// (An atomic write's value is no inline data in max_inline_data's
		// sense: a QP made with none posts it all the same.)
		if ((q.ctrl.inline_len > qp->cap.max_inline_data && op != IBV_WR_ATOMIC_WRITE) ||
		    SV_WQE_HDR_SIZE + q.ctrl.inline_len > qp->sq_stride)
			return IBV_WC_LOC_LEN_ERR;
		w.is_inline = true;
		w.inline_len = q.ctrl.inline_len;
		memcpy(w.inline_data, data, w.inline_len);
	} else {
		if (q.ctrl.num_sge > qp->cap.max_send_sge ||
		    SV_WQE_HDR_SIZE + q.ctrl.num_sge * sizeof(sv_sge) > qp->sq_stride)
			return IBV_WC_LOC_LEN_ERR;
		w.num_sge = q.ctrl.num_sge;
		for (uint32_t i = 0; i < w.num_sge; i++) {
			sv_sge s;
			memcpy(&s, data + i * sizeof(sv_sge), sizeof(s));
			w.sge[i] = {s.addr, s.length, s.lkey};
		}
	}
	w.imm_data = is_inv_op(op) ? 0 : q.ctrl.imm;
	w.invalidate_rkey = is_inv_op(op) ? q.ctrl.imm : 0;
	w.xrc_srqn = q.ctrl.xrc_srqn;
	w.remote_addr = q.raddr.remote_addr;
	w.rkey = q.raddr.rkey;
	w.compare_add = q.atomic.compare_add;
	w.swap = q.atomic.swap;
	if (qp->type == IBV_QPT_UD) {
		w.remote_qpn = q.ud.remote_qpn;
		w.remote_qkey = q.ud.qkey;
		w.ah = {};
		w.ah.dlid = q.ud.dlid;
		w.ah.sl = q.ud.sl;
		w.ah.src_path_bits = q.ud.src_path_bits;
		w.ah.static_rate = q.ud.static_rate;
		w.ah.is_global = q.ud.is_global;
		w.ah.port_num = q.ud.port_num;
		w.ah.grh.sgid_index = q.ud.sgid_index;
		w.ah.grh.hop_limit = q.ud.hop_limit;
		w.ah.grh.traffic_class = q.ud.traffic_class;
		w.ah.grh.flow_label = q.ud.flow_label;
		memcpy(w.ah.grh.dgid.raw, q.ud.dgid, sizeof(q.ud.dgid));
	}
	if (is_mem_op(op)) {
		w.mw_slot = q.mem.slot;
		w.mw_type = q.mem.type;
		w.bind_lkey = q.mem.lkey;
		w.bind_access = q.mem.access;
		w.bind_addr = q.mem.addr;
		w.bind_len = q.mem.length;
		w.npages = q.mem.npages;
		w.page_shift = q.mem.page_shift;
		w.rkey = q.mem.new_key;
		// Checked here, where every WQE is run, whoever wrote it: a type 1
		// window is bound only by ibv_bind_mw, and only the library
		// fast-registers (its staged page list is in process memory).
		// The library's record of the slot says which WQE it wrote.
		const loop_qp::lib_wqe &lib = qp->sq_lib[index & qp->sq_mask];
		bool by_lib = lib.index1 == index + 1;
		if (op == IBV_WR_BIND_MW) {
			if (q.mem.type != IBV_MW_TYPE_1 && q.mem.type != IBV_MW_TYPE_2)
				return IBV_WC_MW_BIND_ERR;
			if (q.mem.type == IBV_MW_TYPE_1 &&
			    (!by_lib || !lib.bind1_slot || lib.bind1_slot != q.mem.slot))
				return IBV_WC_MW_BIND_ERR;
		} else {
			if (!by_lib || !lib.frmr || lib.frmr->slot != q.mem.slot)
				return IBV_WC_LOC_QP_OP_ERR;
			w.frmr = lib.frmr;
		}
	}
	return IBV_WC_SUCCESS;
}

// Publishes the requester's progress: WQEs before c are done.
[[gnu::hot]] void sq_set_cons(loop_qp *qp, uint64_t c)
{
	qp->sq_cons = c;
	qp->sq_head_valid = false;
	if (!qp->sq)
		return;
	std::atomic_ref<uint64_t>(qp->sq->acked).store(c, std::memory_order_release);
	std::atomic_ref<uint64_t>(qp->sq->cons).store(c, std::memory_order_release);
}

namespace {

// Publishes the producer index and rings the doorbell (the ring's contract,
// softverbs-abi.h).  The posting thread runs the requester itself next, so
// no engine needs waking.
[[gnu::hot]] void sq_doorbell(loop_qp *qp, uint64_t prod)
{
	std::atomic_ref<uint64_t>(qp->sq->prod).store(prod, std::memory_order_release);
	std::atomic_ref<uint64_t>(qp->sq->retired)
		.store(qp->sq_retired.load(std::memory_order_acquire), std::memory_order_release);
	std::atomic_ref<uint64_t>(qp->sq->db_record).store(prod, std::memory_order_seq_cst);
}

// Copies an ibv_send_wr into our own form, checking what a real provider
// checks at post time.  Returns 0 or the errno for post_send.
// Whether n SGEs add up to more than the port's max_msg_sz: EINVAL at
// post, as rxe's validate_send_wr and post_one_recv answer ("message length
// too long"), rather than a message no HCA would carry.
template <typename Sge> inline bool sges_too_long(const Sge *s, uint32_t n)
{
	uint64_t len = 0;
	for (uint32_t i = 0; i < n; i++)
		len += s[i].length;
	return len > kMaxMsgSize;
}

[[gnu::hot]] int copy_wr(loop_qp *qp, const ibv_send_wr *in, send_wr &w, const mem_wr_extra *x)
{
	// Any bits may come in (tests pass 77): check them as an integer first,
	// since loading a value beyond the enum's range is undefined (UBSan).
	uint32_t raw_op;
	static_assert(sizeof(raw_op) == sizeof(in->opcode));
	memcpy(&raw_op, &in->opcode, sizeof(raw_op));
	if (raw_op > IBV_WR_ATOMIC_WRITE || !opcode_ok(qp->type, in->opcode))
		return EINVAL;
	if (in->num_sge < 0 || static_cast<uint32_t>(in->num_sge) > qp->cap.max_send_sge)
		return EINVAL;
	w.wr_id = in->wr_id;
	w.opcode = in->opcode;
	w.flags = in->send_flags;
	w.num_sge = static_cast<uint32_t>(in->num_sge);
	w.is_inline = false;
	w.inline_len = 0;
	if ((in->send_flags & IBV_SEND_INLINE) &&
	    (in->opcode == IBV_WR_SEND || in->opcode == IBV_WR_SEND_WITH_IMM ||
	     in->opcode == IBV_WR_RDMA_WRITE || in->opcode == IBV_WR_RDMA_WRITE_WITH_IMM)) {
		uint64_t len = 0;
		for (int i = 0; i < in->num_sge; i++)
			len += in->sg_list[i].length;
		if (len > qp->cap.max_inline_data)
			return EINVAL;
		uint32_t off = 0;
		for (int i = 0; i < in->num_sge; i++) {
			// An empty entry may carry a null address (UCX's am_short
			// with no payload): memcpy's source must not be null even
			// for 0 bytes (UBSan: nonnull argument).
			if (in->sg_list[i].length)
				memcpy(w.inline_data + off,
				       reinterpret_cast<const void *>(in->sg_list[i].addr),
				       in->sg_list[i].length);
			off += in->sg_list[i].length;
		}
		w.is_inline = true;
		w.inline_len = off;
		w.num_sge = 0;
	} else {
		for (int i = 0; i < in->num_sge; i++)
			w.sge[i] = in->sg_list[i];
		if (sges_too_long(w.sge, w.num_sge))
			return EINVAL;
	}
	// imm_data and invalidate_rkey share a union in ibv_send_wr.
	w.imm_data = is_inv_op(in->opcode) ? 0 : in->imm_data;
	w.invalidate_rkey = is_inv_op(in->opcode) ? in->invalidate_rkey : 0;
	// Fields an opcode does not use are still defined: the WQE carries
	// its remote address segment whatever the opcode (wqe_write).  Before
	// mr_copy_wr, which sets the new key (rkey) and a fast-register's
	// iova (remote_addr).
	w.remote_addr = 0;
	w.rkey = 0;
	w.compare_add = 0;
	w.swap = 0;
	w.xrc_srqn = 0;
	if (in->opcode == IBV_WR_BIND_MW || in->opcode == kWrFastReg) {
		int err = mr_copy_wr(qp, in, w, x);
		if (err)
			return err;
	}
	switch (in->opcode) {
	case IBV_WR_RDMA_WRITE:
	case IBV_WR_RDMA_WRITE_WITH_IMM:
	case IBV_WR_RDMA_READ:
		w.remote_addr = in->wr.rdma.remote_addr;
		w.rkey = in->wr.rdma.rkey;
		break;
	case IBV_WR_ATOMIC_WRITE:
		// IBTA 1.5's atomic write through ibv_post_send (as rxe takes
		// it): wr.rdma names the target, one SGE of exactly 8 bytes the
		// value, which travels in the WR as ibv_wr_atomic_write's does
		// (read now, as inline data is).
		if (in->num_sge != 1 || in->sg_list[0].length != 8)
			return EINVAL;
		w.remote_addr = in->wr.rdma.remote_addr;
		w.rkey = in->wr.rdma.rkey;
		memcpy(w.inline_data, reinterpret_cast<const void *>(in->sg_list[0].addr), 8);
		w.is_inline = true;
		w.inline_len = 8;
		w.num_sge = 0;
		break;
	case IBV_WR_ATOMIC_CMP_AND_SWP:
	case IBV_WR_ATOMIC_FETCH_AND_ADD:
		w.remote_addr = in->wr.atomic.remote_addr;
		w.rkey = in->wr.atomic.rkey;
		w.compare_add = in->wr.atomic.compare_add;
		w.swap = in->wr.atomic.swap;
		break;
	default:
		break;
	}
	if (qp->type == IBV_QPT_UD) {
		// A destroyed AH, or one of another context: EINVAL (objects.h).
		if (!in->wr.ud.ah || !to_loop_ah(in->wr.ud.ah)->life.is(kLifeAh) ||
		    in->wr.ud.ah->context != qp->vqp.qp.context)
			return EINVAL;
		w.ah = to_loop_ah(in->wr.ud.ah)->attr;
		w.remote_qpn = in->wr.ud.remote_qpn;
		w.remote_qkey = in->wr.ud.remote_qkey;
	}
	if (qp->type == IBV_QPT_XRC_SEND)
		w.xrc_srqn = in->qp_type.xrc.remote_srqn;
	w.rnr_left = qp->attr.rnr_retry;
	w.retry_left = qp->attr.retry_cnt;
	w.inv_waiting = false;
	w.next_try_ns = 0;
	return 0;
}

// Whether w may join the doorbell batch: an RDMA WRITE or READ of a
// connected QP in RTS whose send queue holds nothing but the batch, and
// that is not a lone WR (more: WRs follow it in this posting call).
bool batchable(loop_qp *qp, const send_wr &w, uint32_t state, uint64_t posted, bool more)
{
	return (w.opcode == IBV_WR_RDMA_WRITE || w.opcode == IBV_WR_RDMA_READ) &&
	       (qp->type == IBV_QPT_RC || qp->type == IBV_QPT_UC) && state == IBV_QPS_RTS &&
	       qp->sq_cons + qp->batch_wrs.size() == posted && (more || !qp->batch_wrs.empty());
}

// Moves and completes the doorbell batch, if any; state is refreshed.
void flush_batch(loop_qp *qp, rdma_batch &b, uint32_t &state)
{
	if (qp->batch_wrs.empty())
		return;
	rdma_flush(qp, b);
	sv_qp_rec &rec = qp->ctx->fab->reg()->qps[qp->slot];
	state = std::atomic_ref<uint32_t>(rec.state).load(std::memory_order_acquire);
}

void publish(loop_qp *qp, send_wr &w, uint64_t posted)
{
	wqe_write(qp, w, posted);
	qp->sq_posted.store(posted + 1, std::memory_order_release);
	sq_doorbell(qp, posted + 1);
}

// Writes one WR that passed the posting checks into the send queue and
// rings the doorbell; then, as the NIC, runs it unless it waits behind the
// backlog.  An RDMA WRITE or READ may instead join the doorbell batch b
// (engine.h: rdma_batch), whose bytes move when a WR that cannot join it
// comes, or when the posting call ends (flush_batch).  A WR posted to a QP
// in ERR completes flushed (with any the requester had not finished).
// Caller holds sq_lock; state is refreshed for the next WR.  Returns 0 or
// ENOMEM.
[[gnu::hot]] int submit(loop_qp *qp, send_wr &w, uint32_t &state, bool &need_progress, rdma_batch &b,
	   bool more, bool express_declined = false)
{
	sv_qp_rec &rec = qp->ctx->fab->reg()->qps[qp->slot];
	if (!qp->sq)
		return EINVAL;
	// The WR takes a send-queue slot until its completion (or a later
	// one's) is polled: past cap.max_send_wr the queue is full.
	uint64_t posted = qp->sq_posted.load(std::memory_order_relaxed);
	if (posted - qp->sq_retired.load(std::memory_order_acquire) >= qp->cap.max_send_wr)
		return ENOMEM;
	w.sq_index = posted;
	if (batchable(qp, w, state, posted, more)) {
		const void *inl = reinterpret_cast<char *>(sq_slot(qp, posted)) + SV_WQE_HDR_SIZE;
		try { // c_boundary.h: out of memory leaves the WR unposted
			bool staged = rdma_stage(qp, w, inl, b);
			if (!staged && !qp->batch_wrs.empty()) {
				// It cannot join this batch: the batch goes first, and
				// the WR may begin the next.
				flush_batch(qp, b, state);
				posted = qp->sq_posted.load(std::memory_order_relaxed);
				staged = batchable(qp, w, state, posted, more) &&
					 rdma_stage(qp, w, inl, b);
			}
			if (staged) {
				publish(qp, w, posted);
				return 0;
			}
		} catch (abi::__forced_unwind &) {
			throw;
		} catch (...) {
			return current_exception_errno();
		}
	}
	// Any other WR runs after what the batch holds.
	flush_batch(qp, b, state);
	publish(qp, w, posted);
	if (state == IBV_QPS_ERR || state == IBV_QPS_SQE) {
		flush_backlog(qp);
		return 0;
	}
	if (state == IBV_QPS_SQD)
		return 0; // Queued: it starts at SQD -> RTS (qp_resume_backlog)
	// Over RoCE v2 an RDMA WRITE goes out now and completes from the wire,
	// with others in flight behind it (docs/rocev2.md).
	if (qp->wire_remote && state == IBV_QPS_RTS) {
		try { // c_boundary.h: out of memory runs it the usual way
			if (wire_handoff(qp, w, posted,
					 reinterpret_cast<char *>(sq_slot(qp, posted)) + SV_WQE_HDR_SIZE))
				return 0;
		} catch (abi::__forced_unwind &) {
			throw;
		} catch (...) {
		}
	}
	if (qp->sq_cons != posted)
		return 0; // Waits behind the backlog (or the wire's WRITEs)
	// The requester allocates (iovecs) before it moves a byte: out of
	// memory fails this WR with ENOMEM and gives its slot back; no
	// exception leaves through the C caller (c_boundary.h).
	try {
		// The WQE was written from w a moment ago by this thread, under
		// sq_lock, and copy_wr checked w as wqe_read would: the requester
		// runs w itself instead of reading the slot back (the latency path;
		// docs/PERFORMANCE.md, issue 12).  The ring still holds the WQE
		// for the backlog, the flush and whoever inspects it.  Bind and
		// fast-register take wqe_read's checks against the library's
		// record of the slot, which stay in one place.
		step s;
		send_wr *h = &w;
		if (is_mem_op(w.opcode)) [[unlikely]] {
			h = &qp->sq_head;
			ibv_wc_status st = wqe_read(qp, posted, *h);
			qp->sq_head_valid = true;
			if (st != IBV_WC_SUCCESS) {
				complete(qp, *h, st, 0);
				sq_set_cons(qp, posted + 1);
				state = std::atomic_ref<uint32_t>(rec.state).load(std::memory_order_acquire);
				return 0;
			}
		} else {
			w.psn = kNoPsn;
		}
		// A WRITE or SEND whose peer, keys and target memory are in the
		// QP's caches takes the express way (transport.h).
		if (h != &w || state != IBV_QPS_RTS || express_declined ||
		    (w.opcode != IBV_WR_RDMA_WRITE && w.opcode != IBV_WR_SEND &&
		     w.opcode != IBV_WR_SEND_WITH_IMM) ||
		    !run_express(qp, w, s))
			s = run_wr(qp, *h);
		if (s == step::done) {
			sq_set_cons(qp, posted + 1);
		} else {
			// This was the first try: the WR becomes the queue's head for
			// the progress thread, and the retry is booked (or fails at
			// once with no retries left), as drain() does after each later
			// one.
			if (h != &qp->sq_head) {
				qp->sq_head = w;
				qp->sq_head_valid = true;
				h = &qp->sq_head;
			}
			book_retry(qp, *h, s, now_ns());
			need_progress = qp->sq_cons != qp->sq_posted.load(std::memory_order_relaxed);
		}
	} catch (abi::__forced_unwind &) {
		throw;
	} catch (...) {
		if (qp->sq_cons == posted) {
			qp->sq_head_valid = false;
			qp->sq_posted.store(posted, std::memory_order_release);
			sq_doorbell(qp, posted);
		}
		return current_exception_errno();
	}
	state = std::atomic_ref<uint32_t>(rec.state).load(std::memory_order_acquire);
	return 0;
}

// The express way straight from the caller's WR (issue 13): an RDMA WRITE,
// SEND or SEND WITH IMM of one SGE (or inline), posted to a connected QP in
// RTS whose send queue is empty, runs from the ibv_send_wr without copy_wr's
// general decoding and without its WQE: a WR the express way finishes at
// once never sits in the ring, so nothing (backlog, flush, retry) would read
// the slot.  The WR takes its slot (sq_posted) before it runs, as publish()
// gives it, so that its completion, polled by another thread at once,
// retires it (retire_sq bounds by sq_posted); a WR the express way declines
// gives the slot back untouched, and one that did not finish (RNR, no
// answer) is written into the ring then and booked for its retry as
// submit() does.  Returns -1 when it declined before the express way, -2
// when the express way declined (the general way takes w, with nothing
// done, and need not ask the express way again), else what submit()
// returns.  Caller holds sq_lock, state is
// RTS and refreshed.
[[gnu::hot]] int post_direct(loop_qp *qp, const ibv_send_wr *in, send_wr &w, uint32_t &state,
			     bool &need_progress)
{
	uint32_t raw_op; // As copy_wr reads it: any bits may come in
	memcpy(&raw_op, &in->opcode, sizeof(raw_op));
	if ((raw_op != IBV_WR_RDMA_WRITE && raw_op != IBV_WR_SEND && raw_op != IBV_WR_SEND_WITH_IMM) ||
	    in->num_sge != 1 || !qp->sq || qp->wire_remote ||
	    (qp->type != IBV_QPT_RC && qp->type != IBV_QPT_UC) || qp->cap.max_send_sge < 1 ||
	    (in->send_flags & ~(IBV_SEND_SIGNALED | IBV_SEND_SOLICITED | IBV_SEND_INLINE |
				IBV_SEND_FENCE)))
		return -1;
	const ibv_sge &s = in->sg_list[0];
	uint64_t posted = qp->sq_posted.load(std::memory_order_relaxed);
	if (!s.length || s.length > kMaxMsgSize || qp->sq_cons != posted ||
	    posted - qp->sq_retired.load(std::memory_order_acquire) >= qp->cap.max_send_wr)
		return -1;
	// copy_wr's form of it, the fields the express way, the completion and
	// (when it does not finish) wqe_write read.
	w.wr_id = in->wr_id;
	w.opcode = in->opcode;
	w.flags = in->send_flags;
	if (in->send_flags & IBV_SEND_INLINE) {
		if (s.length > qp->cap.max_inline_data)
			return -1; // copy_wr's EINVAL
		memcpy(w.inline_data, reinterpret_cast<const void *>(s.addr), s.length);
		w.is_inline = true;
		w.inline_len = s.length;
		w.num_sge = 0;
	} else {
		w.sge[0] = s;
		w.is_inline = false;
		w.inline_len = 0;
		w.num_sge = 1;
	}
	w.imm_data = in->imm_data;
	w.invalidate_rkey = 0;
	bool write = raw_op == IBV_WR_RDMA_WRITE;
	w.remote_addr = write ? in->wr.rdma.remote_addr : 0;
	w.rkey = write ? in->wr.rdma.rkey : 0;
	w.compare_add = 0;
	w.swap = 0;
	w.xrc_srqn = 0;
	w.rnr_left = qp->attr.rnr_retry;
	w.retry_left = qp->attr.retry_cnt;
	w.inv_waiting = false;
	w.next_try_ns = 0;
	w.sq_index = posted;
	w.psn = kNoPsn;
	qp->sq_posted.store(posted + 1, std::memory_order_release);
	step st;
	try { // c_boundary.h: out of memory gives the slot back, as in submit()
		if (!run_express(qp, w, st)) {
			qp->sq_posted.store(posted, std::memory_order_relaxed);
			return -2;
		}
	} catch (abi::__forced_unwind &) {
		// Cancelled inside (a channel's notify, a queue's open): the WR
		// stays posted, with its WQE, as submit() leaves one.
		wqe_write(qp, w, posted);
		sq_doorbell(qp, posted + 1);
		throw;
	} catch (...) {
		qp->sq_posted.store(posted, std::memory_order_release);
		return current_exception_errno();
	}
	sv_sq_ring *r = qp->sq;
	if (st == step::done) {
		// Posted and finished: the ring's indices move past it together
		// (no engine waits on this QP's doorbell: it has no agent).
		std::atomic_ref<uint64_t>(r->prod).store(posted + 1, std::memory_order_release);
		std::atomic_ref<uint64_t>(r->retired).store(qp->sq_retired.load(std::memory_order_acquire),
							    std::memory_order_release);
		std::atomic_ref<uint64_t>(r->db_record).store(posted + 1, std::memory_order_release);
		sq_set_cons(qp, posted + 1);
	} else {
		// The first try of a WR that waits (RNR, no answer yet): it now
		// needs its WQE, and becomes the head the progress thread retries.
		wqe_write(qp, w, posted);
		sq_doorbell(qp, posted + 1);
		qp->sq_head = w;
		qp->sq_head_valid = true;
		book_retry(qp, qp->sq_head, st, now_ns());
		need_progress = qp->sq_cons != qp->sq_posted.load(std::memory_order_relaxed);
	}
	state = std::atomic_ref<uint32_t>(qp->ctx->fab->reg()->qps[qp->slot].state)
			.load(std::memory_order_acquire);
	return 0;
}

} // namespace

[[gnu::hot]] int loop_post_send(ibv_qp *ibqp, ibv_send_wr *wr, ibv_send_wr **bad)
{
	return post_send_mem(ibqp, wr, bad, nullptr);
}

[[gnu::hot]] int post_send_mem(ibv_qp *ibqp, ibv_send_wr *wr, ibv_send_wr **bad, const mem_wr_extra *x)
{
	loop_qp *qp = to_loop_qp(ibqp);
	if (!qp->life.is(kLifeQp)) [[unlikely]] { // A destroyed QP (objects.h)
		*bad = wr;
		return life_bad("ibv_post_send", qp, qp->life, kLifeQp);
	}
	fabric &fab = *qp->ctx->fab;
	sv_qp_rec &rec = fab.reg()->qps[qp->slot];
	int ret = 0;
	bool need_progress = false;
	{
		std::lock_guard<qlock> g(qp->sq_lock);
		uint32_t state = std::atomic_ref<uint32_t>(rec.state).load(std::memory_order_acquire);
		if (state == IBV_QPS_RESET || state == IBV_QPS_INIT || state == IBV_QPS_RTR ||
		    qp->type == IBV_QPT_XRC_RECV || qp->agent) {
			*bad = wr;
			return EINVAL;
		}
		if (const transport_ops &t = active_transport(); t.warm)
			t.warm(qp);
		send_wr w; // Filled by copy_wr (not a thread_local: small_vec.h)
		rdma_batch b;
		for (; wr; wr = wr->next) {
			bool declined = false;
			if (!x && state == IBV_QPS_RTS) {
				ret = post_direct(qp, wr, w, state, need_progress);
				if (!ret)
					continue;
				if (ret > 0) {
					*bad = wr;
					break;
				}
				declined = ret == -2;
				ret = 0;
			}
			try { // c_boundary.h: ENOMEM at this WR, those before it posted
				ret = copy_wr(qp, wr, w, x);
			} catch (abi::__forced_unwind &) {
				throw;
			} catch (...) {
				ret = current_exception_errno();
			}
			if (!ret)
				ret = submit(qp, w, state, need_progress, b, wr->next, declined);
			if (ret) {
				*bad = wr;
				break;
			}
		}
		flush_batch(qp, b, state);
		// WRITEs the wire answered while we held sq_lock: completed now.
		if (qp->wire_next > qp->sq_cons)
			rocev2_settle(qp);
		need_progress |= backlog_start(qp) != qp->sq_posted.load(std::memory_order_relaxed);
	}
	if (need_progress)
		progress_add(qp);
	return ret;
}

void qp_flush_backlog(loop_qp *qp)
{
	flush_backlog(qp);
}

uint64_t qp_run_backlog(loop_qp *qp)
{
	std::lock_guard<qlock> g(qp->sq_lock);
	if (!qp->sq)
		return 0; // Destroyed meanwhile (sq_destroy): nothing to run
	return drain(qp);
}

bool wr_opcode_supported(ibv_qp_type t, ibv_wr_opcode op)
{
	return opcode_ok(t, op);
}

// The loop of loop_post_send over WRs already in our form (ibv_wr_*).
int qp_post_batch(loop_qp *qp, send_wr *wrs, size_t n)
{
	fabric &fab = *qp->ctx->fab;
	sv_qp_rec &rec = fab.reg()->qps[qp->slot];
	bool need_progress = false;
	int ret = 0;
	{
		std::lock_guard<qlock> g(qp->sq_lock);
		uint32_t state = std::atomic_ref<uint32_t>(rec.state).load(std::memory_order_acquire);
		if (state == IBV_QPS_RESET || state == IBV_QPS_INIT || state == IBV_QPS_RTR ||
		    qp->type == IBV_QPT_XRC_RECV || qp->agent)
			return EINVAL;
		uint64_t used = qp->sq_posted.load(std::memory_order_relaxed) -
				qp->sq_retired.load(std::memory_order_acquire);
		if (used + n > qp->cap.max_send_wr)
			return ENOMEM;
		for (size_t i = 0; i < n; i++)
			if (!wrs[i].is_inline && sges_too_long(wrs[i].sge, wrs[i].num_sge))
				return EINVAL; // copy_wr's check: the batch fails whole
		// The room check above makes submit() succeed for every WR: the
		// batch posts whole, unless memory runs out (ENOMEM, with the WRs
		// before that one posted).
		rdma_batch b;
		for (size_t i = 0; i < n && !ret; i++) {
			send_wr &w = wrs[i];
			w.rnr_left = qp->attr.rnr_retry;
			w.retry_left = qp->attr.retry_cnt;
			w.inv_waiting = false;
			w.next_try_ns = 0;
			ret = submit(qp, w, state, need_progress, b, i + 1 < n);
		}
		flush_batch(qp, b, state);
		// WRITEs the wire answered while we held sq_lock: completed now.
		if (qp->wire_next > qp->sq_cons)
			rocev2_settle(qp);
		need_progress |= backlog_start(qp) != qp->sq_posted.load(std::memory_order_relaxed);
	}
	if (need_progress)
		progress_add(qp);
	return ret;
}

int sq_create(loop_qp *qp, ibv_pd *pd)
{
	uint32_t count = round_pow2(std::max<uint32_t>(qp->cap.max_send_wr, 1));
	uint32_t data = std::max<uint32_t>({qp->cap.max_send_sge * uint32_t{sizeof(sv_sge)},
					    qp->cap.max_inline_data, SV_SQ_MIN_INLINE});
	uint32_t stride = (SV_WQE_HDR_SIZE + data + SV_CACHELINE - 1) & ~uint32_t{SV_CACHELINE - 1};
	// The slot's room is the QP's inline limit, as an HCA reports what its
	// WQE holds: at least what was asked (checked against kMaxInlineData
	// at creation), at most kMaxInlineData.  A slot sized for 256 bytes
	// whatever the request made a depth-128 ring 60 KiB (bench/qp_scale.c).
	qp->cap.max_inline_data = std::min<uint32_t>(kMaxInlineData, stride - SV_WQE_HDR_SIZE);
	size_t bytes = SV_SQ_HDR_SIZE + size_t{count} * stride;
	try {
		qp->sq_lib.assign(count, loop_qp::lib_wqe{});
	} catch (...) {
		return ENOMEM;
	}
	// The application's placement first (a parent domain's allocator);
	// else shared memory of our own.  No peer maps it.
	void *map = pd_alloc(pd, bytes, 4096, SOFTVERBS_RES_TYPE_SQ);
	if (!map)
		return ENOMEM;
	if (map != IBV_ALLOCATOR_USE_DEFAULT) {
		if (reinterpret_cast<uintptr_t>(map) % SV_CACHELINE) {
			pd_free(pd, map, SOFTVERBS_RES_TYPE_SQ);
			return EINVAL; // The ring's lines must be cache lines
		}
		memset(map, 0, bytes);
		qp->sq_alloc_pd = pd;
	} else {
		map = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1,
			   0);
		if (map == MAP_FAILED)
			return ENOMEM;
	}
	auto *r = static_cast<sv_sq_ring *>(map);
	r->magic = SV_SQ_MAGIC;
	r->format_version = SV_SQ_FORMAT_VERSION;
	r->count = count;
	r->stride = stride;
	r->hdr_size = SV_SQ_HDR_SIZE;
	r->max_sge = qp->cap.max_send_sge;
	r->max_inline = qp->cap.max_inline_data;
	qp->sq = r;
	qp->sq_bytes = bytes;
	qp->sq_mask = count - 1;
	qp->sq_stride = stride;
	return 0;
}

void sq_destroy(loop_qp *qp)
{
	std::lock_guard<qlock> g(qp->sq_lock);
	if (qp->sq && qp->sq_alloc_pd)
		pd_free(qp->sq_alloc_pd, qp->sq, SOFTVERBS_RES_TYPE_SQ);
	else if (qp->sq)
		munmap(qp->sq, qp->sq_bytes);
	qp->sq = nullptr;
	qp->sq_alloc_pd = nullptr;
	qp->sq_head_valid = false;
	// A destroyed QP's memory stays a while (quarantine): it must not keep
	// its peers' queue mappings or segment pins alive with it.
	for (loop_qp::queue_cache &c : qp->tp_queues)
		c = {};
	std::vector<rseg>().swap(qp->req_segs);
	std::vector<rseg>().swap(qp->req_riov);
	std::vector<rseg>().swap(qp->resp_riov);
	std::vector<uint8_t>().swap(qp->resp_wqe_buf);
	std::vector<loop_qp::batch_wr>().swap(qp->batch_wrs);
	std::vector<iovec>().swap(qp->batch_local);
	std::vector<rseg>().swap(qp->batch_remote);
}

void sq_reset(loop_qp *qp)
{
	uint64_t posted = qp->sq_posted.load(std::memory_order_relaxed);
	sq_set_cons(qp, posted);
	// Nothing of the send queue is left to complete: every slot is free.
	qp->sq_retired.store(posted, std::memory_order_release);
	if (qp->sq)
		std::atomic_ref<uint64_t>(qp->sq->retired).store(posted, std::memory_order_release);
}

int sq_serve_doorbell(loop_qp *qp, bool &need_progress)
{
	std::lock_guard<qlock> g(qp->sq_lock);
	if (!qp->agent || !qp->sq)
		return 0;
	uint64_t db = std::atomic_ref<uint64_t>(qp->sq->db_record).load(std::memory_order_acquire);
	uint64_t posted = qp->sq_posted.load(std::memory_order_relaxed);
	if (db == posted || db == qp->sq_bad_db)
		return 0;
	fabric &fab = *qp->ctx->fab;
	sv_qp_rec &rec = fab.reg()->qps[qp->slot];
	uint32_t state = std::atomic_ref<uint32_t>(rec.state).load(std::memory_order_acquire);
	// A doorbell that goes back, or past the ring's slots, is refused; so
	// is one rung before the QP can send (ring again once it can).
	uint64_t count = uint64_t{qp->sq_mask} + 1;
	if (db - posted > count || db - qp->sq_cons > count || state == IBV_QPS_RESET ||
	    state == IBV_QPS_INIT || state == IBV_QPS_RTR) {
		qp->sq_bad_db = db;
		debug_log("QP %#x: agent doorbell %llu refused (posted %llu, state %u)", qp->qpn,
			  static_cast<unsigned long long>(db), static_cast<unsigned long long>(posted),
			  state);
		return 0;
	}
	qp->sq_posted.store(db, std::memory_order_release);
	int n = static_cast<int>(db - posted);
	if (state == IBV_QPS_ERR || state == IBV_QPS_SQE) {
		flush_backlog(qp);
		return n;
	}
	drain(qp);
	need_progress = qp->sq_cons != db;
	return n;
}

int loop_dv_qp_agent(ibv_qp *ibqp, int on, softverbs_dv_sq *out)
{
	loop_qp *qp = to_loop_qp(ibqp);
	if (!qp->life.is(kLifeQp))
		return life_bad("softverbs_dv_qp_agent", qp, qp->life, kLifeQp);
	if (!qp->sq || qp->opened ||
	    (qp->type != IBV_QPT_RC && qp->type != IBV_QPT_UC && qp->type != IBV_QPT_UD))
		return EINVAL;
	if (on) {
		if (!out)
			return EINVAL;
		{
			std::lock_guard<qlock> g(qp->sq_lock);
			if (qp->agent)
				return EBUSY;
			// Handed over empty: every WQE the library posted has
			// completed and been polled.
			uint64_t posted = qp->sq_posted.load(std::memory_order_relaxed);
			if (qp->sq_cons != posted ||
			    qp->sq_retired.load(std::memory_order_acquire) != posted)
				return EBUSY;
			sv_sq_ring *r = qp->sq;
			std::atomic_ref<uint64_t>(r->retired).store(posted, std::memory_order_relaxed);
			std::atomic_ref<uint64_t>(r->prod).store(posted, std::memory_order_relaxed);
			std::atomic_ref<uint32_t>(r->sleeping).store(0, std::memory_order_relaxed);
			std::atomic_ref<uint64_t>(r->db_record).store(posted, std::memory_order_release);
			qp->sq_bad_db = posted;
			qp->agent = true;
			memset(out, 0, sizeof(*out));
			out->ring = r;
			out->slots = reinterpret_cast<char *>(r) + SV_SQ_HDR_SIZE;
			out->prod = &r->prod;
			out->db_record = &r->db_record;
			out->sleeping = &r->sleeping;
			out->retired = &r->retired;
			out->format_version = SV_SQ_FORMAT_VERSION;
			out->count = qp->sq_mask + 1;
			out->stride = qp->sq_stride;
			out->max_sge = qp->cap.max_send_sge;
			out->max_inline = qp->cap.max_inline_data;
			out->max_wr = qp->cap.max_send_wr;
			out->qpn = qp->qpn;
			out->next = posted;
			out->freed = posted;
		}
		if (int e = engine_add(qp)) {
			std::lock_guard<qlock> g(qp->sq_lock);
			qp->agent = false;
			return e;
		}
		return 0;
	}
	{
		std::lock_guard<qlock> g(qp->sq_lock);
		if (!qp->agent)
			return EINVAL;
		uint64_t posted = qp->sq_posted.load(std::memory_order_relaxed);
		uint64_t db =
			std::atomic_ref<uint64_t>(qp->sq->db_record).load(std::memory_order_acquire);
		if (qp->sq_cons != posted || (db != posted && db != qp->sq_bad_db))
			return EBUSY; // Work is still in the ring
		qp->agent = false;
		// The agent's retired count, as far as it is believable; forward
		// only (a poll in another thread may be retiring: retire_sq).
		uint64_t r = std::atomic_ref<uint64_t>(qp->sq->retired).load(std::memory_order_acquire);
		uint64_t mine = qp->sq_retired.load(std::memory_order_acquire);
		while (r != mine && r - mine <= posted - mine &&
		       !qp->sq_retired.compare_exchange_weak(mine, r, std::memory_order_acq_rel))
			;
	}
	engine_remove(qp);
	return 0;
}

} // namespace loop
