/* SPDX-License-Identifier: MIT */
/*
 * Agent checks, in one process (docs/agent.md):
 *  1. An agent's WQEs are validated like the library's, where they run: a
 *     BIND_MW WQE for a type 1 window (which only ibv_bind_mw binds)
 *     completes with IBV_WC_MW_BIND_ERR, and a fast-register WQE (which
 *     only the library posts) with IBV_WC_LOC_QP_OP_ERR.
 *  2. More agent QPs than futex_waitv takes (128): 200 QPs, each handed to
 *     the agent, post one WRITE each after the engine has gone to sleep;
 *     every one completes, and all 200 within 5 s (a ring the engine does
 *     not wait on would otherwise wait out the engine's 1 s sleep).
 *  3. Inline data where it cannot be: an ATOMIC_WRITE whose value is an
 *     SGE (not the 8 inline bytes the library writes) completes with
 *     IBV_WC_LOC_LEN_ERR, and a READ marked inline with
 *     IBV_WC_LOC_QP_OP_ERR, the target untouched.  Before, the first wrote
 *     the inline bytes an earlier WQE left and the second completed SUCCESS
 *     with its data nowhere (a helper's probe).
 *  4. A send queue whose completions the library polls (the QP handed to
 *     the agent, its CQ not): each completion ibv_poll_cq takes frees the
 *     agent's slots, so an agent ring of 4 carries 12 WRITEs posted one at
 *     a time (before, the library counted them free only for itself, and
 *     the agent's fifth WQE found no slot, forever); taken back, the
 *     library posts 4 at once.
 *  5. A CQ an agent polls keeps the arm's old rule: completions there when
 *     ibv_req_notify_cq arms it fire at once, whether the agent took one
 *     of three before the arm or after it (the library's rule for its own
 *     polls, which knows what an event announced, saw none of the agent's
 *     polls, and neither raised an event: a review's probe).
 * Completions are polled with ibv_poll_cq (the CQs stay the library's),
 * except in step 5.
 */
#include "../progs/svt.h"

#include <infiniband/softverbs_dv.h>

#define NQP 200

static const struct svt_conn conn = {
	.access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE,
	.min_rnr_timer = 1,
	.timeout = 14,
	.retry_cnt = 7,
	.rnr_retry = 7,
};

/* The memory segment of a WQE (sv_wqe_mem in kernel-abi/softverbs-abi.h). */
struct mem_seg {
	uint32_t slot, type, lkey, access;
	uint64_t addr, length;
	uint32_t npages, page_shift, new_key, reserved;
};

static void pair(struct svt_dev *d, struct ibv_cq *cq, struct ibv_qp **a, struct ibv_qp **b,
		 uint32_t depth)
{
	struct svt_qpopt o = {.type = IBV_QPT_RC, .scq = cq, .rcq = cq, .max_send_wr = depth,
			      .max_recv_wr = 1, .max_sge = 1, .max_inline = 64};
	*a = svt_qp(d, &o);
	*b = svt_qp(d, &o);
	svt_connect(*a, (*b)->qp_num, d->lid, &conn);
	svt_connect(*b, (*a)->qp_num, d->lid, &conn);
}

static void post_mem(struct softverbs_dv_sq *sq, enum ibv_wr_opcode op, const struct mem_seg *m,
		     uint64_t wr_id)
{
	struct softverbs_wqe *w = softverbs_dv_sq_next(sq);
	CHECK(w);
	softverbs_dv_wqe_ctrl(sq, w, op, IBV_SEND_SIGNALED, wr_id);
	memcpy(w->mem, m, sizeof(*m));
	softverbs_dv_sq_post(sq, 1);
}

static void untrusted_mem_wqes(struct svt_dev *d)
{
	struct ibv_cq *cq = ibv_create_cq(d->ctx, 16, NULL, NULL, 0);
	CHECK(cq);
	struct ibv_qp *a, *b;
	pair(d, cq, &a, &b, 8);
	struct ibv_mr *mr =
		svt_mr(d, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_MW_BIND);
	struct ibv_mw *mw = ibv_alloc_mw(d->pd, IBV_MW_TYPE_1);
	CHECK(mw);
	struct softverbs_dv_sq sq;
	CHECK(softverbs_dv_qp_agent(a, 1, &sq) == 0);
	struct mem_seg m = {
		.slot = mw->rkey >> 8,
		.type = IBV_MW_TYPE_1,
		.lkey = mr->lkey,
		.access = IBV_ACCESS_REMOTE_WRITE,
		.addr = (uintptr_t)mr->addr,
		.length = 4096,
		.new_key = (mw->rkey & ~0xffu) | ((mw->rkey + 1) & 0xff),
	};
	post_mem(&sq, IBV_WR_BIND_MW, &m, 1);
	struct ibv_wc wc = svt_wait(cq, "agent's type 1 bind");
	CHECK_EQ(wc.wr_id, 1);
	CHECK_WC(wc, IBV_WC_MW_BIND_ERR);
	CHECK_EQ(wc.opcode, IBV_WC_BIND_MW);
	printf("agent BIND_MW of a type 1 window: %s\n", ibv_wc_status_str(wc.status));
	/* The error moved the QP to ERR: take it back, and use a fresh pair. */
	CHECK(softverbs_dv_qp_agent(a, 0, NULL) == 0);
	struct ibv_qp *c, *e;
	pair(d, cq, &c, &e, 8);
	struct ibv_mr *fr = softverbs_alloc_fast_reg_mr(d->pd, 4);
	CHECK(fr);
	CHECK(softverbs_dv_qp_agent(c, 1, &sq) == 0);
	struct mem_seg f = {
		.slot = fr->lkey >> 8,
		.access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE,
		.addr = (uintptr_t)mr->addr,
		.length = 4096,
		.new_key = fr->lkey,
	};
	post_mem(&sq, (enum ibv_wr_opcode)SOFTVERBS_WQE_OP_FAST_REG, &f, 2);
	wc = svt_wait(cq, "agent's fast-register");
	CHECK_EQ(wc.wr_id, 2);
	CHECK_WC(wc, IBV_WC_LOC_QP_OP_ERR);
	printf("agent fast-register: %s\n", ibv_wc_status_str(wc.status));
	CHECK(softverbs_dv_qp_agent(c, 0, NULL) == 0);
	CHECK(ibv_destroy_qp(a) == 0 && ibv_destroy_qp(b) == 0);
	CHECK(ibv_destroy_qp(c) == 0 && ibv_destroy_qp(e) == 0);
	CHECK(ibv_dealloc_mw(mw) == 0);
}

static void misplaced_inline(struct svt_dev *d)
{
	struct ibv_cq *cq = ibv_create_cq(d->ctx, 16, NULL, NULL, 0);
	CHECK(cq);
	struct ibv_mr *mr = svt_mr(d, 4096,
				   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
					   IBV_ACCESS_REMOTE_READ);
	uint64_t *word = (uint64_t *)mr->addr;
	for (int round = 0; round < 2; round++) {
		struct ibv_qp *a, *b;
		pair(d, cq, &a, &b, 8);
		struct softverbs_dv_sq sq;
		CHECK(softverbs_dv_qp_agent(a, 1, &sq) == 0);
		word[0] = 0x1111111111111111ULL;
		word[1] = 0x2222222222222222ULL;
		/* An inline WRITE first, which leaves its bytes behind */
		const char secret[8] = "SECRET!!";
		struct softverbs_wqe *w = softverbs_dv_sq_next(&sq);
		CHECK(w);
		softverbs_dv_wqe_ctrl(&sq, w, IBV_WR_RDMA_WRITE, IBV_SEND_SIGNALED, 10);
		softverbs_dv_wqe_rdma(w, (uintptr_t)mr->addr + 64, mr->rkey);
		CHECK(softverbs_dv_wqe_inline(&sq, w, secret, sizeof(secret)) == 0);
		softverbs_dv_sq_post(&sq, 1);
		struct ibv_wc wc = svt_wait(cq, "inline WRITE");
		CHECK_WC(wc, IBV_WC_SUCCESS);
		w = softverbs_dv_sq_next(&sq);
		CHECK(w);
		if (round == 0) {
			/* ATOMIC_WRITE with its value in an SGE */
			word[2] = 0x1122334455667788ULL;
			softverbs_dv_wqe_ctrl(&sq, w, IBV_WR_ATOMIC_WRITE, IBV_SEND_SIGNALED, 11);
			softverbs_dv_wqe_rdma(w, (uintptr_t)mr->addr, mr->rkey);
			struct softverbs_sge *s = (struct softverbs_sge *)((char *)w + SOFTVERBS_WQE_HDR_SIZE);
			s->addr = (uintptr_t)&word[2];
			s->length = 8;
			s->lkey = mr->lkey;
			w->ctrl.num_sge = 1;
		} else {
			/* READ of 8 bytes into word 1, marked inline */
			softverbs_dv_wqe_ctrl(&sq, w, IBV_WR_RDMA_READ, IBV_SEND_SIGNALED, 11);
			softverbs_dv_wqe_rdma(w, (uintptr_t)mr->addr, mr->rkey);
			CHECK(softverbs_dv_wqe_inline(&sq, w, secret, sizeof(secret)) == 0);
		}
		softverbs_dv_sq_post(&sq, 1);
		wc = svt_wait(cq, round ? "a READ marked inline" : "an ATOMIC_WRITE from an SGE");
		CHECK_EQ(wc.wr_id, 11);
		CHECK_WC(wc, round ? IBV_WC_LOC_QP_OP_ERR : IBV_WC_LOC_LEN_ERR);
		CHECK_EQ(word[0], 0x1111111111111111ULL);
		CHECK_EQ(word[1], 0x2222222222222222ULL);
		printf("agent %s: %s\n", round ? "READ marked inline" : "ATOMIC_WRITE from an SGE",
		       ibv_wc_status_str(wc.status));
		CHECK(softverbs_dv_qp_agent(a, 0, NULL) == 0);
		CHECK(ibv_destroy_qp(a) == 0 && ibv_destroy_qp(b) == 0);
	}
}

static void many_rings(struct svt_dev *d)
{
	struct ibv_cq *cq = ibv_create_cq(d->ctx, 2 * NQP, NULL, NULL, 0);
	CHECK(cq);
	struct ibv_mr *dst = svt_mr(d, NQP * 8, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	static struct ibv_qp *qa[NQP], *qb[NQP];
	static struct softverbs_dv_sq sq[NQP];
	for (int i = 0; i < NQP; i++) {
		pair(d, cq, &qa[i], &qb[i], 4);
		CHECK(softverbs_dv_qp_agent(qa[i], 1, &sq[i]) == 0);
	}
	uint64_t t0 = svt_now_ms(), worst = 0;
	for (int i = 0; i < NQP; i++) {
		usleep(2000); /* Past the engine's spin: it sleeps */
		uint64_t v = 0x5ec0000000000000ULL | (uint64_t)i;
		struct softverbs_wqe *w = softverbs_dv_sq_next(&sq[i]);
		CHECK(w);
		softverbs_dv_wqe_ctrl(&sq[i], w, IBV_WR_RDMA_WRITE, IBV_SEND_SIGNALED, (uint64_t)i);
		softverbs_dv_wqe_rdma(w, (uintptr_t)dst->addr + (uint64_t)i * 8, dst->rkey);
		CHECK(softverbs_dv_wqe_inline(&sq[i], w, &v, sizeof(v)) == 0);
		uint64_t t1 = svt_now_ms();
		softverbs_dv_sq_post(&sq[i], 1);
		struct ibv_wc wc = svt_wait(cq, "a WRITE on an agent ring");
		CHECK_WC(wc, IBV_WC_SUCCESS);
		CHECK_EQ(wc.wr_id, (uint64_t)i);
		if (svt_now_ms() - t1 > worst)
			worst = svt_now_ms() - t1;
		CHECK_EQ(((uint64_t *)dst->addr)[i], v);
	}
	uint64_t ms = svt_now_ms() - t0;
	printf("%d agent rings, one WRITE each: %llu ms in all, %llu ms at worst\n", NQP,
	       (unsigned long long)ms, (unsigned long long)worst);
	if (ms > 5000)
		FAIL("%d WRITEs on %d agent rings took %llu ms (more than 5 s)", NQP, NQP,
		     (unsigned long long)ms);
	for (int i = 0; i < NQP; i++) {
		CHECK(softverbs_dv_qp_agent(qa[i], 0, NULL) == 0);
		CHECK(ibv_destroy_qp(qa[i]) == 0 && ibv_destroy_qp(qb[i]) == 0);
	}
}

static void library_polls_agent_sq(struct svt_dev *d)
{
	struct ibv_cq *cq = ibv_create_cq(d->ctx, 16, NULL, NULL, 0);
	CHECK(cq);
	struct ibv_mr *dst = svt_mr(d, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	struct ibv_qp *a, *b;
	pair(d, cq, &a, &b, 4);
	struct softverbs_dv_sq sq;
	CHECK(softverbs_dv_qp_agent(a, 1, &sq) == 0);
	CHECK_EQ(sq.max_wr, 4u);
	for (uint64_t i = 0; i < 12; i++) {
		struct softverbs_wqe *w = softverbs_dv_sq_next(&sq);
		if (!w)
			FAIL("WQE %llu: no free slot, though every completion was polled",
			     (unsigned long long)i);
		uint64_t v = 0xa6e0000000000000ULL | i;
		softverbs_dv_wqe_ctrl(&sq, w, IBV_WR_RDMA_WRITE, IBV_SEND_SIGNALED, i);
		softverbs_dv_wqe_rdma(w, (uintptr_t)dst->addr + i * 8, dst->rkey);
		CHECK(softverbs_dv_wqe_inline(&sq, w, &v, sizeof(v)) == 0);
		softverbs_dv_sq_post(&sq, 1);
		struct ibv_wc wc = svt_wait(cq, "a WRITE of the agent");
		CHECK_WC(wc, IBV_WC_SUCCESS);
		CHECK_EQ(wc.wr_id, i);
		CHECK_EQ(((uint64_t *)dst->addr)[i], v);
	}
	CHECK(softverbs_dv_qp_agent(a, 0, NULL) == 0);
	/* The library's again: its whole depth, at once. */
	for (uint64_t i = 0; i < 4; i++) {
		uint64_t v = 0x11b0000000000000ULL | i;
		struct ibv_sge s = {(uintptr_t)&v, 8, 0};
		struct ibv_send_wr wr = {.wr_id = 100 + i, .sg_list = &s, .num_sge = 1,
					 .opcode = IBV_WR_RDMA_WRITE,
					 .send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE};
		wr.wr.rdma.remote_addr = (uintptr_t)dst->addr + 512 + i * 8;
		wr.wr.rdma.rkey = dst->rkey;
		struct ibv_send_wr *bad;
		CHECK(ibv_post_send(a, &wr, &bad) == 0);
	}
	for (uint64_t i = 0; i < 4; i++) {
		struct ibv_wc wc = svt_wait(cq, "a WRITE of the library");
		CHECK_WC(wc, IBV_WC_SUCCESS);
		CHECK_EQ(wc.wr_id, 100 + i);
	}
	printf("agent ring of 4, completions polled by the library: 12 WRITEs\n");
	CHECK(ibv_destroy_qp(a) == 0 && ibv_destroy_qp(b) == 0);
}

static void agent_cq_arm(struct svt_dev *d)
{
	struct ibv_mr *mr = svt_mr(d, 8192, SVT_ALL_ACCESS);
	for (int take_first = 0; take_first < 2; take_first++) {
		struct ibv_comp_channel *ch = ibv_create_comp_channel(d->ctx);
		CHECK(ch);
		struct ibv_cq *cq = ibv_create_cq(d->ctx, 16, NULL, ch, 0);
		CHECK(cq);
		struct ibv_qp *a, *b;
		pair(d, cq, &a, &b, 8);
		struct softverbs_dv_cq dc;
		CHECK(softverbs_dv_cq_agent(cq, 1, &dc) == 0);
		CHECK(ibv_req_notify_cq(cq, 0) == 0);
		for (uint64_t i = 0; i < 3; i++) {
			struct ibv_sge s = svt_sge(mr, 0, 8);
			CHECK(svt_post_send1(a, i, IBV_WR_RDMA_WRITE, &s, 1, IBV_SEND_SIGNALED,
					     (uintptr_t)mr->addr + 4096, mr->rkey) == 0);
		}
		usleep(100000); /* All three complete before the event is taken */
		if (!svt_event_within(ch, cq, 2000))
			FAIL("5: no event for three completions at an agent's CQ");
		struct softverbs_cqe e;
		if (take_first)
			CHECK(softverbs_dv_cq_poll(&dc, &e) == 1);
		CHECK(ibv_req_notify_cq(cq, 0) == 0);
		if (!take_first)
			CHECK(softverbs_dv_cq_poll(&dc, &e) == 1);
		if (!svt_event_within(ch, cq, 2000))
			FAIL("5: no event on arming an agent's CQ over two completions (%s)",
			     take_first ? "taken one, then armed" : "armed, then taken one");
		int left = 0;
		while (softverbs_dv_cq_poll(&dc, &e) == 1)
			left++;
		CHECK_EQ(left, 2);
		CHECK(softverbs_dv_cq_agent(cq, 0, NULL) == 0);
		CHECK(ibv_destroy_qp(a) == 0 && ibv_destroy_qp(b) == 0);
		CHECK(ibv_destroy_cq(cq) == 0);
		CHECK(ibv_destroy_comp_channel(ch) == 0);
	}
	printf("an agent's CQ armed over completions: an event, either order\n");
}

int main(void)
{
	svt_watchdog(120);
	struct svt_dev d;
	svt_open(&d, "loop0");
	untrusted_mem_wqes(&d);
	misplaced_inline(&d);
	many_rings(&d);
	library_polls_agent_sq(&d);
	agent_cq_arm(&d);
	printf("ok\n");
	return 0;
}
