/* SPDX-License-Identifier: MIT */
/* Affiliated asynchronous events a consumer waits for, and multicast
 * delivery, in one process:
 *
 *   sv_async
 *
 * - IBV_EVENT_COMM_EST (IB 11.6.3): raised on a QP in RTR by the first
 *   request that reaches it, once: a SEND, and (on another pair) an RDMA
 *   WRITE; none for a QP that was in RTS before its first request, and none
 *   for a SEND that failed at its requester (a bad lkey: nothing went out).
 * - IBV_EVENT_QP_LAST_WQE_REACHED: raised on a QP attached to an SRQ when it
 *   goes to ERR, by ibv_modify_qp and by a responder error (a SEND longer
 *   than the SRQ's buffer).
 * - A UD QP attached to two multicast groups that share a LID gets one copy
 *   of a datagram sent to that LID without a GRH.
 *
 * Prints "OK sv_async" when every check held; else a FAIL line and exit 1. */
#include "svt.h"

static struct svt_dev D;

/* Counts the async events of type for qp (others are acked and ignored)
 * within ms. */
static int count_events(int type, struct ibv_qp *qp, int ms)
{
	int n = 0;
	uint64_t end = svt_now_ms() + ms;
	for (;;) {
		int left = (int)(end - svt_now_ms());
		if (left <= 0)
			return n;
		struct pollfd pfd = {D.ctx->async_fd, POLLIN, 0};
		if (poll(&pfd, 1, left) != 1)
			return n;
		struct ibv_async_event ev;
		CHECK(ibv_get_async_event(D.ctx, &ev) == 0);
		if ((int)ev.event_type == type && ev.element.qp == qp)
			n++;
		ibv_ack_async_event(&ev);
	}
}


static void comm_est(void)
{
	struct ibv_cq *cq = ibv_create_cq(D.ctx, 64, NULL, NULL, 0);
	CHECK(cq);
	struct ibv_mr *m = svt_mr(&D, 8192, SVT_ALL_ACCESS);
	struct svt_qpopt o = {.type = IBV_QPT_RC, .scq = cq, .rcq = cq};
	struct svt_conn c = {SVT_ALL_ACCESS, 1, 14, 7, 7};
	struct ibv_qp *q[6];
	for (int i = 0; i < 6; i++)
		q[i] = svt_qp(&D, &o);
	/* q0 -> q1 (SEND), q2 -> q3 (WRITE): responders left in RTR; q4 -> q5:
	 * the responder in RTS first. */
	for (int i = 0; i < 6; i += 2) {
		svt_connect(q[i], q[i + 1]->qp_num, D.lid, &c);
		if (i < 4)
			svt_to_rtr(q[i + 1], q[i]->qp_num, D.lid, &c);
		else
			svt_connect(q[i + 1], q[i]->qp_num, D.lid, &c);
	}
	struct ibv_sge s = svt_sge(m, 0, 64), r = svt_sge(m, 4096, 64);
	svt_fill(m->addr, 64, 5);
	for (int k = 0; k < 3; k++) {
		int t = 2 * k;
		for (int round = 0; round < 2; round++) {
			if (t == 2) {
				CHECK_EQ(svt_post_send1(q[t], round, IBV_WR_RDMA_WRITE, &s, 1,
							IBV_SEND_SIGNALED,
							(uintptr_t)m->addr + 2048 + 64 * round, m->rkey),
					 0);
				CHECK_WC(svt_wait(cq, "a WRITE to a QP in RTR"), IBV_WC_SUCCESS);
				CHECK(memcmp((char *)m->addr + 2048 + 64 * round, m->addr, 64) == 0);
			} else {
				svt_post_recv1(q[t + 1], 100 + round, &r, 1);
				CHECK_EQ(svt_post_send1(q[t], round, IBV_WR_SEND, &s, 1,
							IBV_SEND_SIGNALED, 0, 0),
					 0);
				for (int j = 0; j < 2; j++)
					CHECK_WC(svt_wait(cq, "a SEND and its receive"),
						 IBV_WC_SUCCESS);
				CHECK(memcmp((char *)m->addr + 4096, m->addr, 64) == 0);
			}
			int want = t < 4 && round == 0;
			int got = count_events(IBV_EVENT_COMM_EST, q[t + 1], 300);
			if (got != want)
				FAIL("pair %d, request %d: %d COMM_EST events, expected %d", k, round,
				     got, want);
		}
	}
	/* A SEND that fails at the requester (a bad lkey) sends nothing. */
	struct ibv_qp *x = svt_qp(&D, &o), *y = svt_qp(&D, &o);
	svt_connect(x, y->qp_num, D.lid, &c);
	svt_to_rtr(y, x->qp_num, D.lid, &c);
	svt_post_recv1(y, 200, &r, 1);
	struct ibv_sge bad = s;
	bad.lkey ^= 0x77700;
	CHECK_EQ(svt_post_send1(x, 9, IBV_WR_SEND, &bad, 1, IBV_SEND_SIGNALED, 0, 0), 0);
	CHECK_WC(svt_wait(cq, "a SEND with a bad lkey"), IBV_WC_LOC_PROT_ERR);
	if (count_events(IBV_EVENT_COMM_EST, y, 300) != 0)
		FAIL("COMM_EST for a request that never left its requester");
	CHECK_EQ(ibv_destroy_qp(x), 0);
	CHECK_EQ(ibv_destroy_qp(y), 0);
	for (int i = 0; i < 6; i++)
		CHECK_EQ(ibv_destroy_qp(q[i]), 0);
	CHECK_EQ(ibv_destroy_cq(cq), 0);
	CHECK_EQ(ibv_dereg_mr(m), 0);
}

static void last_wqe(void)
{
	struct ibv_cq *cq = ibv_create_cq(D.ctx, 64, NULL, NULL, 0);
	CHECK(cq);
	struct ibv_srq_init_attr sa = {.attr = {.max_wr = 16, .max_sge = 1}};
	struct ibv_srq *srq = ibv_create_srq(D.pd, &sa);
	CHECK(srq);
	struct ibv_mr *m = svt_mr(&D, 8192, SVT_ALL_ACCESS);
	struct svt_qpopt so = {.type = IBV_QPT_RC, .scq = cq, .rcq = cq, .srq = srq};
	struct svt_qpopt po = {.type = IBV_QPT_RC, .scq = cq, .rcq = cq};
	struct svt_conn c = {SVT_ALL_ACCESS, 1, 14, 7, 7};
	struct ibv_qp *a = svt_qp(&D, &so), *b = svt_qp(&D, &so), *pb = svt_qp(&D, &po);
	svt_connect(a, pb->qp_num, D.lid, &c); /* a: no peer traffic, moved to ERR */
	svt_connect(b, pb->qp_num, D.lid, &c);
	svt_connect(pb, b->qp_num, D.lid, &c);

	struct ibv_qp_attr at = {.qp_state = IBV_QPS_ERR};
	CHECK(ibv_modify_qp(a, &at, IBV_QP_STATE) == 0);
	if (count_events(IBV_EVENT_QP_LAST_WQE_REACHED, a, 300) != 1)
		FAIL("no single LAST_WQE_REACHED for an SRQ QP moved to ERR");

	/* b fails as a responder: a 256-byte SEND into a 64-byte SRQ buffer. */
	struct ibv_sge r = svt_sge(m, 4096, 64), s = svt_sge(m, 0, 256);
	struct ibv_recv_wr rw = {.wr_id = 7, .sg_list = &r, .num_sge = 1}, *bad;
	CHECK(ibv_post_srq_recv(srq, &rw, &bad) == 0);
	CHECK_EQ(svt_post_send1(pb, 1, IBV_WR_SEND, &s, 1, IBV_SEND_SIGNALED, 0, 0), 0);
	int seen = 0;
	for (int j = 0; j < 2; j++) {
		struct ibv_wc w = svt_wait(cq, "the long SEND and its receive");
		seen |= w.wr_id == 7 ? 1 : 2;
		CHECK(w.status != IBV_WC_SUCCESS);
	}
	CHECK_EQ(seen, 3);
	CHECK_EQ(svt_state(b), IBV_QPS_ERR);
	if (count_events(IBV_EVENT_QP_LAST_WQE_REACHED, b, 300) != 1)
		FAIL("no single LAST_WQE_REACHED for an SRQ QP failed as a responder");

	CHECK_EQ(ibv_destroy_qp(a), 0);
	CHECK_EQ(ibv_destroy_qp(b), 0);
	CHECK_EQ(ibv_destroy_qp(pb), 0);
	CHECK_EQ(ibv_destroy_srq(srq), 0);
	CHECK_EQ(ibv_destroy_cq(cq), 0);
	CHECK_EQ(ibv_dereg_mr(m), 0);
}

static void mcast_once(void)
{
	struct ibv_cq *scq = ibv_create_cq(D.ctx, 16, NULL, NULL, 0);
	struct ibv_cq *rcq = ibv_create_cq(D.ctx, 16, NULL, NULL, 0);
	CHECK(scq && rcq);
	struct ibv_mr *m = svt_mr(&D, 8192, SVT_ALL_ACCESS);
	struct svt_qpopt o = {.type = IBV_QPT_UD, .scq = scq, .rcq = scq};
	struct ibv_qp *u1 = svt_qp(&D, &o);
	o.scq = o.rcq = rcq;
	struct ibv_qp *u2 = svt_qp(&D, &o);
	svt_ud_up(u1, 0x1234);
	svt_ud_up(u2, 0x1234);
	union ibv_gid g1 = {.raw = {0xff, 0x0e, [15] = 1}}, g2 = {.raw = {0xff, 0x0e, [15] = 2}};
	CHECK_EQ(ibv_attach_mcast(u2, &g1, 0xc055), 0);
	CHECK_EQ(ibv_attach_mcast(u2, &g2, 0xc055), 0);
	CHECK_EQ(ibv_attach_mcast(u2, &g1, 0xc055), 0); /* Again: still one member */
	for (int i = 0; i < 4; i++) {
		struct ibv_sge r = svt_sge(m, 4096 + 128 * i, 128);
		svt_post_recv1(u2, 10 + i, &r, 1);
	}
	struct ibv_ah_attr aa = {.dlid = 0xc055, .port_num = 1};
	struct ibv_ah *ah = ibv_create_ah(D.pd, &aa);
	CHECK(ah);
	struct ibv_sge s = svt_sge(m, 0, 32);
	svt_fill(m->addr, 32, 7);
	struct ibv_send_wr w = {.wr_id = 1, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_SEND,
				.send_flags = IBV_SEND_SIGNALED};
	w.wr.ud.ah = ah;
	w.wr.ud.remote_qpn = 0xffffff;
	w.wr.ud.remote_qkey = 0x1234;
	struct ibv_send_wr *bad;
	CHECK(ibv_post_send(u1, &w, &bad) == 0);
	CHECK_WC(svt_wait(scq, "the multicast SEND"), IBV_WC_SUCCESS);
	struct ibv_wc wc = svt_wait(rcq, "its copy");
	CHECK_WC(wc, IBV_WC_SUCCESS);
	CHECK_EQ(wc.wr_id, 10);
	CHECK(memcmp((char *)m->addr + 4096 + 40, m->addr, 32) == 0);
	svt_expect_empty(rcq, 200, "a second copy for a QP in two groups of one LID");
	CHECK_EQ(ibv_detach_mcast(u2, &g1, 0xc055), 0);
	CHECK_EQ(ibv_detach_mcast(u2, &g2, 0xc055), 0);
	CHECK_EQ(ibv_destroy_ah(ah), 0);
	CHECK_EQ(ibv_destroy_qp(u1), 0);
	CHECK_EQ(ibv_destroy_qp(u2), 0);
	CHECK_EQ(ibv_destroy_cq(scq), 0);
	CHECK_EQ(ibv_destroy_cq(rcq), 0);
	CHECK_EQ(ibv_dereg_mr(m), 0);
}

int main(void)
{
	svt_watchdog(60);
	svt_open(&D, "loop0");
	comm_est();
	last_wqe();
	mcast_once();
	CHECK_EQ(ibv_dealloc_pd(D.pd), 0);
	CHECK_EQ(ibv_close_device(D.ctx), 0);
	printf("OK sv_async\n");
	return 0;
}
