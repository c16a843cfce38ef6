// SPDX-License-Identifier: MIT
// Extended QPs: the ibv_wr_* posting API.  wr_start opens a batch, each
// ibv_wr_<op>() appends a send_wr (the requester's own form, so nothing
// refers to the caller's memory afterwards) and the ibv_wr_set_*() calls
// fill the newest one; wr_complete hands the whole batch to the requester
// (qp_post_batch, under sq_lock, as post_send) or, if any call of the batch
// was misused, posts none of it and returns the first error.
//
// Locking: the builder lock is held from wr_start to wr_complete/wr_abort,
// so two threads building on one QP take turns, as with rdma-core's mlx5.
//
// The ibv_wr_* functions are entry points that C code calls through the
// ibv_qp_ex's pointers, not through the ops table's c_boundary wrappers:
// each is noexcept and turns what could throw into the batch's error.
#include "c_boundary.h"
#include "loop.h"
#include "objects.h"

#include <cerrno>
#include <cstring>
#include <mutex>
#include <new>
#include <thread>
#include <vector>

namespace loop {

struct wr_builder {
	std::mutex lock; // Held from wr_start to wr_complete / wr_abort
	std::thread::id owner;
	bool active = false;
	int err = 0; // The first misuse of this batch
	uint64_t ops; // send_ops_flags
	std::vector<send_wr> wrs;
	std::vector<uint8_t> addressed; // Per WR: set_ud_addr / set_xrc_srqn called
};

namespace {

// The ops the requester can run, and what each needs.
struct op_info {
	uint64_t flag;
	ibv_wr_opcode opcode;
};
constexpr op_info kOps[] = {
	{IBV_QP_EX_WITH_RDMA_WRITE, IBV_WR_RDMA_WRITE},
	{IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM, IBV_WR_RDMA_WRITE_WITH_IMM},
	{IBV_QP_EX_WITH_SEND, IBV_WR_SEND},
	{IBV_QP_EX_WITH_SEND_WITH_IMM, IBV_WR_SEND_WITH_IMM},
	{IBV_QP_EX_WITH_RDMA_READ, IBV_WR_RDMA_READ},
	{IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP, IBV_WR_ATOMIC_CMP_AND_SWP},
	{IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD, IBV_WR_ATOMIC_FETCH_AND_ADD},
	{IBV_QP_EX_WITH_LOCAL_INV, IBV_WR_LOCAL_INV},
	{IBV_QP_EX_WITH_SEND_WITH_INV, IBV_WR_SEND_WITH_INV},
	{IBV_QP_EX_WITH_BIND_MW, IBV_WR_BIND_MW},
	{IBV_QP_EX_WITH_ATOMIC_WRITE, IBV_WR_ATOMIC_WRITE},
	// TSO: not offered (see qp_ex_check).
};

loop_qp *qp_of(ibv_qp_ex *qpx)
{
	return to_loop_qp(&qpx->qp_base);
}

void fail(wr_builder *b, int err)
{
	if (!b->err)
		b->err = err;
}

// The WR the setters act on, or null (and the batch fails) if there is none.
// Whether the QP behind qpx is live: a destroyed one (kept poisoned in the
// quarantine, its builder gone) takes no part in a batch.
bool live(ibv_qp_ex *qpx)
{
	return qp_of(qpx)->life.is(kLifeQp);
}

send_wr *cur(ibv_qp_ex *qpx)
{
	if (!live(qpx)) [[unlikely]]
		return nullptr;
	wr_builder *b = qp_of(qpx)->builder;
	if (!b->active || b->err)
		return nullptr;
	if (b->wrs.empty()) {
		fail(b, EINVAL);
		return nullptr;
	}
	return &b->wrs.back();
}

send_wr *new_wr(ibv_qp_ex *qpx, uint64_t flag, ibv_wr_opcode op)
{
	if (!live(qpx)) [[unlikely]]
		return nullptr;
	loop_qp *qp = qp_of(qpx);
	wr_builder *b = qp->builder;
	if (!b->active || b->err)
		return nullptr;
	if (!(b->ops & flag) || !wr_opcode_supported(qp->type, op)) {
		fail(b, EINVAL);
		return nullptr;
	}
	if (b->wrs.size() >= qp->cap.max_send_wr) {
		fail(b, ENOMEM);
		return nullptr;
	}
	try {
		b->wrs.emplace_back();
		b->addressed.push_back(0);
	} catch (...) { // c_boundary.h: ENOMEM, or what the exception stands for
		fail(b, current_exception_errno());
		return nullptr;
	}
	send_wr &w = b->wrs.back();
	w.wr_id = qpx->wr_id;
	w.opcode = op;
	w.flags = qpx->wr_flags;
	return &w;
}

void wr_send(ibv_qp_ex *qpx) noexcept
{
	new_wr(qpx, IBV_QP_EX_WITH_SEND, IBV_WR_SEND);
}

void wr_send_imm(ibv_qp_ex *qpx, __be32 imm) noexcept
{
	if (send_wr *w = new_wr(qpx, IBV_QP_EX_WITH_SEND_WITH_IMM, IBV_WR_SEND_WITH_IMM))
		w->imm_data = imm;
}

void wr_send_inv(ibv_qp_ex *qpx, uint32_t rkey) noexcept
{
	if (send_wr *w = new_wr(qpx, IBV_QP_EX_WITH_SEND_WITH_INV, IBV_WR_SEND_WITH_INV))
		w->invalidate_rkey = rkey;
}

void wr_local_inv(ibv_qp_ex *qpx, uint32_t rkey) noexcept
{
	if (send_wr *w = new_wr(qpx, IBV_QP_EX_WITH_LOCAL_INV, IBV_WR_LOCAL_INV))
		w->invalidate_rkey = rkey;
}

void set_rdma(send_wr *w, uint32_t rkey, uint64_t addr)
{
	if (!w)
		return;
	w->rkey = rkey;
	w->remote_addr = addr;
}

void wr_rdma_write(ibv_qp_ex *qpx, uint32_t rkey, uint64_t addr) noexcept
{
	set_rdma(new_wr(qpx, IBV_QP_EX_WITH_RDMA_WRITE, IBV_WR_RDMA_WRITE), rkey, addr);
}

void wr_rdma_write_imm(ibv_qp_ex *qpx, uint32_t rkey, uint64_t addr, __be32 imm) noexcept
{
	send_wr *w = new_wr(qpx, IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM, IBV_WR_RDMA_WRITE_WITH_IMM);
	set_rdma(w, rkey, addr);
	if (w)
		w->imm_data = imm;
}

void wr_rdma_read(ibv_qp_ex *qpx, uint32_t rkey, uint64_t addr) noexcept
{
	set_rdma(new_wr(qpx, IBV_QP_EX_WITH_RDMA_READ, IBV_WR_RDMA_READ), rkey, addr);
}

void wr_atomic_cmp_swp(ibv_qp_ex *qpx, uint32_t rkey, uint64_t addr, uint64_t compare,
		       uint64_t swap) noexcept
{
	send_wr *w = new_wr(qpx, IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP, IBV_WR_ATOMIC_CMP_AND_SWP);
	set_rdma(w, rkey, addr);
	if (w) {
		w->compare_add = compare;
		w->swap = swap;
	}
}

void wr_atomic_fetch_add(ibv_qp_ex *qpx, uint32_t rkey, uint64_t addr, uint64_t add) noexcept
{
	send_wr *w = new_wr(qpx, IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD, IBV_WR_ATOMIC_FETCH_AND_ADD);
	set_rdma(w, rkey, addr);
	if (w)
		w->compare_add = add;
}

// Type 2 windows only, as ibv_wr_bind_mw(3) says (type 1: ibv_bind_mw).
// The fields are those mr_copy_wr fills for a posted BIND_MW.
void wr_bind_mw(ibv_qp_ex *qpx, ibv_mw *mw, uint32_t rkey, const ibv_mw_bind_info *bi) noexcept
{
	send_wr *w = new_wr(qpx, IBV_QP_EX_WITH_BIND_MW, IBV_WR_BIND_MW);
	if (!w)
		return;
	if (!mw || !bi || mw->type != IBV_MW_TYPE_2) {
		fail(qp_of(qpx)->builder, EINVAL);
		return;
	}
	w->mw_slot = reinterpret_cast<loop_mw *>(mw)->slot;
	w->mw_type = mw->type;
	w->rkey = rkey;
	w->bind_lkey = bi->mr ? bi->mr->lkey : 0;
	w->bind_addr = bi->addr;
	w->bind_len = bi->length;
	w->bind_access = bi->mw_access_flags;
}

// Ops the QP never accepts in send_ops_flags: reaching one is misuse.
void wr_send_tso(ibv_qp_ex *qpx, void *, uint16_t, uint16_t) noexcept
{
	new_wr(qpx, IBV_QP_EX_WITH_TSO, IBV_WR_TSO);
}

// An 8-byte write that lands whole (IBTA 1.5 atomic write): the value travels
// in the WR like inline data.
void wr_atomic_write(ibv_qp_ex *qpx, uint32_t rkey, uint64_t remote_addr,
		     const void *atomic_wr) noexcept
{
	send_wr *w = new_wr(qpx, IBV_QP_EX_WITH_ATOMIC_WRITE, IBV_WR_ATOMIC_WRITE);
	if (!w)
		return;
	w->rkey = rkey;
	w->remote_addr = remote_addr;
	w->is_inline = true;
	w->inline_len = 8;
	w->num_sge = 0;
	memcpy(w->inline_data, atomic_wr, 8);
}

bool carries_data(ibv_wr_opcode op)
{
	return op == IBV_WR_SEND || op == IBV_WR_SEND_WITH_IMM || op == IBV_WR_SEND_WITH_INV ||
	       op == IBV_WR_RDMA_WRITE || op == IBV_WR_RDMA_WRITE_WITH_IMM ||
	       op == IBV_WR_RDMA_READ || op == IBV_WR_ATOMIC_CMP_AND_SWP ||
	       op == IBV_WR_ATOMIC_FETCH_AND_ADD;
}

bool may_inline(ibv_wr_opcode op)
{
	return op == IBV_WR_SEND || op == IBV_WR_SEND_WITH_IMM || op == IBV_WR_SEND_WITH_INV ||
	       op == IBV_WR_RDMA_WRITE || op == IBV_WR_RDMA_WRITE_WITH_IMM;
}

void wr_set_sge_list(ibv_qp_ex *qpx, size_t n, const ibv_sge *list) noexcept
{
	send_wr *w = cur(qpx);
	if (!w)
		return;
	loop_qp *qp = qp_of(qpx);
	if (!carries_data(w->opcode) || (n && !list)) {
		fail(qp->builder, EINVAL);
		return;
	}
	if (n > qp->cap.max_send_sge) {
		fail(qp->builder, ENOMEM);
		return;
	}
	for (size_t i = 0; i < n; i++)
		w->sge[i] = list[i];
	w->num_sge = static_cast<uint32_t>(n);
	w->is_inline = false;
	w->inline_len = 0;
}

void wr_set_sge(ibv_qp_ex *qpx, uint32_t lkey, uint64_t addr, uint32_t length) noexcept
{
	ibv_sge s{addr, length, lkey};
	wr_set_sge_list(qpx, 1, &s);
}

void wr_set_inline_data_list(ibv_qp_ex *qpx, size_t n, const ibv_data_buf *bufs) noexcept
{
	send_wr *w = cur(qpx);
	if (!w)
		return;
	loop_qp *qp = qp_of(qpx);
	if (!may_inline(w->opcode) || (n && !bufs)) {
		fail(qp->builder, EINVAL);
		return;
	}
	// Summed with a check at each step: lengths near SIZE_MAX would wrap.
	size_t len = 0;
	bool over = false;
	for (size_t i = 0; i < n && !over; i++) {
		over = bufs[i].length > qp->cap.max_inline_data - len;
		if (!over)
			len += bufs[i].length;
	}
	if (over || len > qp->cap.max_inline_data || len > sizeof(w->inline_data)) {
		fail(qp->builder, ENOMEM);
		return;
	}
	// Inline data is copied now: the caller may reuse its buffers at once.
	size_t off = 0;
	for (size_t i = 0; i < n; i++) {
		if (bufs[i].length)
			memcpy(w->inline_data + off, bufs[i].addr, bufs[i].length);
		off += bufs[i].length;
	}
	w->inline_len = static_cast<uint32_t>(len);
	w->is_inline = true;
	w->num_sge = 0;
}

void wr_set_inline_data(ibv_qp_ex *qpx, void *addr, size_t length) noexcept
{
	ibv_data_buf b{addr, length};
	wr_set_inline_data_list(qpx, 1, &b);
}

void wr_set_ud_addr(ibv_qp_ex *qpx, ibv_ah *ah, uint32_t remote_qpn, uint32_t remote_qkey) noexcept
{
	send_wr *w = cur(qpx);
	if (!w)
		return;
	loop_qp *qp = qp_of(qpx);
	// An AH that is destroyed or of another context is refused, as the
	// kernel refuses its handle.
	if (qp->type != IBV_QPT_UD || !ah || !to_loop_ah(ah)->life.is(kLifeAh) ||
	    ah->context != qpx->qp_base.context) {
		fail(qp->builder, EINVAL);
		return;
	}
	w->ah = to_loop_ah(ah)->attr;
	w->remote_qpn = remote_qpn;
	w->remote_qkey = remote_qkey;
	qp->builder->addressed.back() = 1;
}

void wr_set_xrc_srqn(ibv_qp_ex *qpx, uint32_t srqn) noexcept
{
	send_wr *w = cur(qpx);
	if (!w)
		return;
	loop_qp *qp = qp_of(qpx);
	if (qp->type != IBV_QPT_XRC_SEND) {
		fail(qp->builder, EINVAL);
		return;
	}
	w->xrc_srqn = srqn;
	qp->builder->addressed.back() = 1;
}

void wr_start(ibv_qp_ex *qpx) noexcept
{
	if (!live(qpx)) [[unlikely]]
		return; // wr_complete reports it
	wr_builder *b = qp_of(qpx)->builder;
	if (b->active && b->owner == std::this_thread::get_id()) {
		fail(b, EINVAL); // wr_start twice: the open batch fails
		return;
	}
	b->lock.lock();
	b->owner = std::this_thread::get_id();
	b->active = true;
	b->err = 0;
	b->wrs.clear();
	b->addressed.clear();
}

void close_batch(wr_builder *b)
{
	b->wrs.clear();
	b->addressed.clear();
	b->active = false;
	b->owner = std::thread::id();
	b->lock.unlock();
}

int wr_complete(ibv_qp_ex *qpx) noexcept
{
	loop_qp *qp = qp_of(qpx);
	if (!qp->life.is(kLifeQp)) [[unlikely]]
		return life_bad("ibv_wr_complete", qp, qp->life, kLifeQp);
	wr_builder *b = qp->builder;
	if (!b->active || b->owner != std::this_thread::get_id())
		return EINVAL;
	int ret = b->err;
	bool needs_addr = qp->type == IBV_QPT_UD || qp->type == IBV_QPT_XRC_SEND;
	for (size_t i = 0; !ret && needs_addr && i < b->wrs.size(); i++)
		if (!b->addressed[i] && b->wrs[i].opcode != IBV_WR_LOCAL_INV)
			ret = EINVAL;
	if (!ret && !b->wrs.empty()) {
		try { // c_boundary.h: the WRs before the one that failed are posted
			ret = qp_post_batch(qp, b->wrs.data(), b->wrs.size());
		} catch (...) {
			ret = current_exception_errno();
		}
	}
	close_batch(b);
	return ret;
}

void wr_abort(ibv_qp_ex *qpx) noexcept
{
	if (!live(qpx)) [[unlikely]]
		return;
	wr_builder *b = qp_of(qpx)->builder;
	if (b->active && b->owner == std::this_thread::get_id())
		close_batch(b);
}

} // namespace

int qp_ex_check(const ibv_qp_init_attr_ex &attr)
{
	uint64_t left = attr.send_ops_flags;
	if (attr.qp_type == IBV_QPT_XRC_RECV && left)
		return EOPNOTSUPP;
	for (const op_info &o : kOps) {
		if (!(left & o.flag))
			continue;
		if (!wr_opcode_supported(attr.qp_type, o.opcode))
			return EOPNOTSUPP;
		left &= ~o.flag;
	}
	return left ? EOPNOTSUPP : 0;
}

void qp_ex_init(loop_qp *qp, uint64_t send_ops_flags)
{
	qp->builder = new (std::nothrow) wr_builder;
	if (!qp->builder)
		return; // No ibv_qp_ex then: ibv_qp_to_qp_ex() answers NULL
	qp->builder->ops = send_ops_flags;
	ibv_qp_ex &x = qp->vqp.qp_ex;
	x.comp_mask = 0;
	x.wr_id = 0;
	x.wr_flags = 0;
	x.wr_atomic_cmp_swp = wr_atomic_cmp_swp;
	x.wr_atomic_fetch_add = wr_atomic_fetch_add;
	x.wr_bind_mw = wr_bind_mw;
	x.wr_local_inv = wr_local_inv;
	x.wr_rdma_read = wr_rdma_read;
	x.wr_rdma_write = wr_rdma_write;
	x.wr_rdma_write_imm = wr_rdma_write_imm;
	x.wr_send = wr_send;
	x.wr_send_imm = wr_send_imm;
	x.wr_send_inv = wr_send_inv;
	x.wr_send_tso = wr_send_tso;
	x.wr_set_ud_addr = wr_set_ud_addr;
	x.wr_set_xrc_srqn = wr_set_xrc_srqn;
	x.wr_set_inline_data = wr_set_inline_data;
	x.wr_set_inline_data_list = wr_set_inline_data_list;
	x.wr_set_sge = wr_set_sge;
	x.wr_set_sge_list = wr_set_sge_list;
	x.wr_start = wr_start;
	x.wr_complete = wr_complete;
	x.wr_abort = wr_abort;
	x.wr_atomic_write = wr_atomic_write;
	qp->vqp.comp_mask |= VERBS_QP_EX;
}

void qp_ex_destroy(loop_qp *qp)
{
	delete qp->builder;
	qp->builder = nullptr;
}

} // namespace loop
