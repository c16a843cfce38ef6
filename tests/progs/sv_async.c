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
 *   than the SRQ's buffer: its IBV_EVENT_QP_REQ_ERR comes first).
 * - An event still queued for a QP when it is destroyed is not handed to
 *   the new QP that takes its registry slot.
 * - A UD QP attached to two multicast groups that share a LID gets one copy
 *   of a datagram sent to that LID without a GRH.
 *
 * Prints "OK sv_async" when every check held; else a FAIL line and exit 1. */
#include "svt.h"

#include <fcntl.h>

static struct svt_dev D;

/* The async events for qp within ms, in the order they came (others are
 * acked and ignored): how many (the first max of them in types). */
static int events_of(struct ibv_qp *qp, int ms, int *types, int max)
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
		if (ev.element.qp == qp) {
			if (n < max)
				types[n] = (int)ev.event_type;
			n++;
		}
		ibv_ack_async_event(&ev);
	}
}

/* Counts the async events of type for qp within ms. */
static int count_events(int type, struct ibv_qp *qp, int ms)
{
	int types[64];
	int n = events_of(qp, ms, types, 64), c = 0;
	if (n > 64)
		FAIL("%d async events for one QP", n);
	for (int i = 0; i < n; i++)
		c += types[i] == type;
	return c;
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
	/* The error's own event first (an invalid request: the message is
	 * longer than the buffer), then LAST_WQE_REACHED, which follows the
	 * move to ERR (IB 11.6.3); it came first before. */
	int ev[4];
	int nev = events_of(b, 300, ev, 4);
	if (nev != 2 || ev[0] != IBV_EVENT_QP_REQ_ERR || ev[1] != IBV_EVENT_QP_LAST_WQE_REACHED)
		FAIL("events of an SRQ QP failed as a responder: %d (%s, %s), expected QP_REQ_ERR "
		     "then LAST_WQE_REACHED",
		     nev, nev > 0 ? ibv_event_type_str(ev[0]) : "-",
		     nev > 1 ? ibv_event_type_str(ev[1]) : "-");

	CHECK_EQ(ibv_destroy_qp(a), 0);
	CHECK_EQ(ibv_destroy_qp(b), 0);
	CHECK_EQ(ibv_destroy_qp(pb), 0);
	CHECK_EQ(ibv_destroy_srq(srq), 0);
	CHECK_EQ(ibv_destroy_cq(cq), 0);
	CHECK_EQ(ibv_dereg_mr(m), 0);
}

/* An event raised for QP a and still queued when a is destroyed goes with
 * a: a new QP that took a's registry slot never gets it (uverbs drops a
 * destroyed object's events).  It was handed to the new QP, by slot. */
static void stale_event(void)
{
	struct ibv_cq *cq = ibv_create_cq(D.ctx, 64, NULL, NULL, 0);
	CHECK(cq);
	struct ibv_mr *m = svt_mr(&D, 4096, SVT_ALL_ACCESS);
	struct svt_qpopt o = {.type = IBV_QPT_RC, .scq = cq, .rcq = cq};
	struct svt_conn rw = {SVT_ALL_ACCESS, 1, 14, 1, 1};
	struct svt_conn ro = {IBV_ACCESS_LOCAL_WRITE, 1, 14, 1, 1}; /* no remote write */
	int flags = fcntl(D.ctx->async_fd, F_GETFL);
	CHECK(flags >= 0);
	CHECK(fcntl(D.ctx->async_fd, F_SETFL, flags | O_NONBLOCK) == 0);
	int reused = 0;
	for (int round = 0; round < 8; round++) {
		struct ibv_qp *s = svt_qp(&D, &o), *a = svt_qp(&D, &o);
		svt_connect(s, a->qp_num, D.lid, &rw);
		svt_connect(a, s->qp_num, D.lid, &ro);
		struct ibv_sge g = svt_sge(m, 0, 64);
		CHECK_EQ(svt_post_send1(s, 1, IBV_WR_RDMA_WRITE, &g, 1, IBV_SEND_SIGNALED,
					(uintptr_t)m->addr + 1024, m->rkey),
			 0);
		CHECK_WC(svt_wait(cq, "a WRITE to a QP without the right"), IBV_WC_REM_ACCESS_ERR);
		usleep(20000); /* Its QP_ACCESS_ERR is queued for a */
		uint32_t aslot = a->qp_num & 0xfff;
		CHECK_EQ(ibv_destroy_qp(a), 0);
		struct ibv_qp *b = svt_qp(&D, &o);
		reused += (b->qp_num & 0xfff) == aslot;
		struct ibv_async_event ev;
		while (ibv_get_async_event(D.ctx, &ev) == 0) {
			if (ev.element.qp == b)
				FAIL("the new QP 0x%x got %s, raised for the destroyed QP in its slot",
				     b->qp_num, ibv_event_type_str(ev.event_type));
			ibv_ack_async_event(&ev);
		}
		CHECK_EQ(errno, EAGAIN);
		struct ibv_wc wc;
		while (ibv_poll_cq(cq, 1, &wc) > 0)
			;
		CHECK_EQ(ibv_destroy_qp(b), 0);
		CHECK_EQ(ibv_destroy_qp(s), 0);
	}
	if (!reused)
		FAIL("no new QP took a destroyed one's slot in 8 rounds: the case was not run");
	CHECK(fcntl(D.ctx->async_fd, F_SETFL, flags) == 0);
	CHECK_EQ(ibv_dereg_mr(m), 0);
	CHECK_EQ(ibv_destroy_cq(cq), 0);
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

/* sv_async listen MS: "READY", then one line "EVENT type element" for each
 * async event within MS ms (test_segments.py raises some from another
 * user, which must not arrive, and some from its own). */
static void listen_events(int ms)
{
	printf("READY\n");
	fflush(stdout);
	uint64_t end = svt_now_ms() + (uint64_t)ms;
	for (;;) {
		int left = (int)(end - svt_now_ms());
		if (left <= 0)
			break;
		struct pollfd pfd = {D.ctx->async_fd, POLLIN, 0};
		if (poll(&pfd, 1, left) != 1)
			continue;
		struct ibv_async_event ev;
		CHECK(ibv_get_async_event(D.ctx, &ev) == 0);
		printf("EVENT %d %d\n", (int)ev.event_type, ev.element.port_num);
		fflush(stdout);
		ibv_ack_async_event(&ev);
	}
	printf("DONE\n");
}

int main(int argc, char **argv)
{
	svt_watchdog(60);
	svt_open(&D, "loop0");
	if (argc == 3 && !strcmp(argv[1], "listen")) {
		listen_events(atoi(argv[2]));
		CHECK_EQ(ibv_dealloc_pd(D.pd), 0);
		CHECK_EQ(ibv_close_device(D.ctx), 0);
		return 0;
	}
	comm_est();
	last_wqe();
	stale_event();
	mcast_once();
	CHECK_EQ(ibv_dealloc_pd(D.pd), 0);
	CHECK_EQ(ibv_close_device(D.ctx), 0);
	printf("OK sv_async\n");
	return 0;
}
