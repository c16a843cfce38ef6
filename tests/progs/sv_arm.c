/* SPDX-License-Identifier: MIT */
/* Arming a CQ that already holds completions (pyverbs-tests/test_cq_events.py).
 *
 *   sv_arm
 *
 * Two RC QPs of one process on loop0, connected to each other; each CQ has
 * its own completion channel, its descriptor non-blocking.  The program
 * checks, in order:
 *   1. arming an empty CQ raises nothing (300 ms), and the next completion
 *      raises one event;
 *   2. arming a CQ that holds two unpolled completions raises an event at
 *      once (a ConnectX arms at the consumer index it is given and fires
 *      when completions lie beyond it; perftest -e -Q N, which polls one
 *      batch per event, waited forever without it), exactly one: a third
 *      completion before the re-arm raises nothing more;
 *   3. a solicited-only arm over unpolled unsolicited successes raises
 *      nothing (300 ms); over a pending solicited completion, one event at
 *      once;
 *   4. the completion an event announced, still unpolled when the CQ is
 *      re-armed (ibv_get_cq_event, ack, arm, then poll: ib_send_lat -e's
 *      order), raises nothing more (300 ms): that second event, taken for
 *      the next message, put ib_send_lat -e out of step;
 *   5. completions an event announced and a poll leaves behind an armed
 *      CQ raise one event, at the poll that leaves them (perftest -e -Q N
 *      polls one batch per event); an arm after a poll that left some
 *      (armed or not) fires at once; a poll that empties it raises none;
 *   6. the same through an extended CQ: a start_poll/end_poll batch that
 *      ends before ENOENT leaves them, one that reaches ENOENT does not.
 * Every completion is polled and its wr_id checked.  Prints "ok" and exits
 * 0, or names the first check that failed and exits 1. */
#include "svt.h"

#include <fcntl.h>
#include <poll.h>

static struct ibv_comp_channel *g_sch, *g_rch;

static void take(struct ibv_cq *cq, int n, uint64_t first_id, const char *what)
{
	for (int i = 0; i < n; i++) {
		struct ibv_wc wc;
		if (svt_poll(cq, &wc, 5000) != 1)
			FAIL("%s: completion %d of %d missing", what, i + 1, n);
		CHECK_WC(wc, IBV_WC_SUCCESS);
		CHECK_EQ(wc.wr_id, first_id + (uint64_t)i);
	}
	struct ibv_wc wc;
	if (ibv_poll_cq(cq, 1, &wc) != 0)
		FAIL("%s: a completion more than %d", what, n);
}

static uint64_t g_next_send, g_next_recv;

static void send1(struct ibv_qp *qp, struct ibv_mr *mr, int solicited)
{
	struct ibv_sge s = svt_sge(mr, 0, 64);
	CHECK(svt_post_send1(qp, g_next_send++, IBV_WR_SEND, &s, 1,
			     IBV_SEND_SIGNALED | (solicited ? IBV_SEND_SOLICITED : 0), 0, 0) == 0);
}

static void recv1(struct ibv_qp *qp, struct ibv_mr *mr)
{
	struct ibv_sge s = svt_sge(mr, 4096, 64);
	svt_post_recv1(qp, g_next_recv++, &s, 1);
}

int main(void)
{
	svt_watchdog(60);
	struct svt_dev d;
	svt_open(&d, "loop0");
	g_sch = ibv_create_comp_channel(d.ctx);
	g_rch = ibv_create_comp_channel(d.ctx);
	CHECK(g_sch && g_rch);
	CHECK(fcntl(g_sch->fd, F_SETFL, fcntl(g_sch->fd, F_GETFL) | O_NONBLOCK) == 0);
	CHECK(fcntl(g_rch->fd, F_SETFL, fcntl(g_rch->fd, F_GETFL) | O_NONBLOCK) == 0);
	struct ibv_cq *scq = ibv_create_cq(d.ctx, 64, NULL, g_sch, 0);
	struct ibv_cq *rcq = ibv_create_cq(d.ctx, 64, NULL, g_rch, 0);
	CHECK(scq && rcq);
	struct svt_qpopt so = {.scq = scq, .rcq = scq, .type = IBV_QPT_RC};
	struct svt_qpopt ro = {.scq = rcq, .rcq = rcq, .type = IBV_QPT_RC};
	struct ibv_qp *a = svt_qp(&d, &so), *b = svt_qp(&d, &ro);
	struct svt_conn c = {SVT_ALL_ACCESS, 1, 14, 7, 7};
	svt_connect(a, b->qp_num, d.lid, &c);
	svt_connect(b, a->qp_num, d.lid, &c);
	struct ibv_mr *mr = svt_mr(&d, 8192, SVT_ALL_ACCESS);
	for (int i = 0; i < 20; i++)
		recv1(b, mr);

	/* 1. Empty, armed: nothing; then one completion: one event. */
	CHECK(ibv_req_notify_cq(scq, 0) == 0);
	if (svt_event_within(g_sch, scq, 300))
		FAIL("1: an event from an empty CQ");
	send1(a, mr, 0);
	if (!svt_event_within(g_sch, scq, 2000))
		FAIL("1: no event for a completion after the arm");
	take(scq, 1, 0, "1");

	/* 2. Two unpolled completions, then armed: one event at once. */
	send1(a, mr, 0);
	send1(a, mr, 0);
	struct ibv_wc wc;
	uint64_t until = svt_now_ms() + 5000;
	/* Both published before the arm: the receiver has taken them */
	int seen = 0;
	while (seen < 3 && svt_now_ms() < until) {
		int k = ibv_poll_cq(rcq, 1, &wc);
		CHECK(k >= 0);
		seen += k;
	}
	CHECK_EQ(seen, 3);
	usleep(50000); /* The sends' own completions too, before the arm */
	CHECK(ibv_req_notify_cq(scq, 0) == 0);
	if (!svt_event_within(g_sch, scq, 2000))
		FAIL("2: no event on arming a CQ that holds 2 completions");
	send1(a, mr, 0);
	if (svt_event_within(g_sch, scq, 300))
		FAIL("2: a second event without a re-arm");
	take(scq, 3, 1, "2");

	/* 3. Solicited-only arms over the receive CQ. */
	send1(a, mr, 0);
	send1(a, mr, 0);
	take(scq, 2, 4, "3 sends");
	usleep(50000); /* Both receives published well before the arm */
	CHECK(ibv_req_notify_cq(rcq, 1) == 0);
	if (svt_event_within(g_rch, rcq, 300))
		FAIL("3: a solicited-only arm fired for unsolicited successes");
	take(rcq, 3, 3, "3 unsolicited"); /* Step 2's third send and these two */
	send1(a, mr, 1);
	take(scq, 1, 6, "3 solicited send");
	/* The solicited receive came while armed: its own event */
	if (!svt_event_within(g_rch, rcq, 2000))
		FAIL("3: no event for a solicited receive while armed");
	send1(a, mr, 1);
	take(scq, 1, 7, "3 second solicited send");
	CHECK(ibv_req_notify_cq(rcq, 1) == 0);
	if (!svt_event_within(g_rch, rcq, 2000))
		FAIL("3: no event on a solicited-only arm over a pending solicited receive");
	take(rcq, 2, 6, "3 solicited");

	/* 4. Re-armed over the completion the event announced. */
	CHECK(ibv_req_notify_cq(scq, 0) == 0);
	send1(a, mr, 0);
	if (!svt_event_within(g_sch, scq, 2000))
		FAIL("4: no event for a completion after the arm");
	CHECK(ibv_req_notify_cq(scq, 0) == 0);
	if (svt_event_within(g_sch, scq, 300))
		FAIL("4: a second event for the completion the first announced");
	take(scq, 1, 8, "4");
	if (svt_event_within(g_sch, scq, 300))
		FAIL("4: an event after the poll that emptied the CQ");

	/* 5. Announced completions a poll leaves behind. The CQ is armed
	 * from step 4; three sends, each complete when posted: the first
	 * fires, the others come while disarmed, all before the event is
	 * taken (so it announces the three). */
	send1(a, mr, 0);
	send1(a, mr, 0);
	send1(a, mr, 0);
	if (!svt_event_within(g_sch, scq, 2000))
		FAIL("5: no event for three completions");
	CHECK(ibv_req_notify_cq(scq, 0) == 0);
	if (svt_event_within(g_sch, scq, 300))
		FAIL("5: an event on re-arming over the announced completions");
	struct ibv_wc w1;
	CHECK(ibv_poll_cq(scq, 1, &w1) == 1);
	CHECK_WC(w1, IBV_WC_SUCCESS);
	CHECK_EQ(w1.wr_id, (uint64_t)9);
	if (!svt_event_within(g_sch, scq, 2000))
		FAIL("5: no event when a poll left two announced completions");
	if (svt_event_within(g_sch, scq, 300))
		FAIL("5: a second event without a re-arm");
	/* Re-armed after that poll left two: they fire at once. */
	CHECK(ibv_req_notify_cq(scq, 0) == 0);
	if (!svt_event_within(g_sch, scq, 2000))
		FAIL("5: no event on arming over completions a poll left behind");
	struct ibv_wc w2[2];
	CHECK(ibv_poll_cq(scq, 2, w2) == 2); /* Both in one poll: none left */
	CHECK_WC(w2[0], IBV_WC_SUCCESS);
	CHECK_WC(w2[1], IBV_WC_SUCCESS);
	CHECK_EQ(w2[0].wr_id, (uint64_t)10);
	CHECK_EQ(w2[1].wr_id, (uint64_t)11);
	CHECK(ibv_req_notify_cq(scq, 0) == 0);
	if (svt_event_within(g_sch, scq, 300))
		FAIL("5: an event after the poll that emptied the CQ");
	/* The poll of a full array that emptied the CQ raises none either. */
	send1(a, mr, 0);
	if (!svt_event_within(g_sch, scq, 2000))
		FAIL("5: no event for the last completion");
	CHECK(ibv_req_notify_cq(scq, 0) == 0);
	CHECK(ibv_poll_cq(scq, 1, &w1) == 1);
	CHECK_EQ(w1.wr_id, (uint64_t)12);
	if (svt_event_within(g_sch, scq, 300))
		FAIL("5: an event from a poll that took the last completion");
	/* One batch per event, then the arm (the poll leaves two while the
	 * CQ is disarmed): the arm fires for them at once, as a ConnectX's
	 * over completions beyond its consumer index. */
	send1(a, mr, 0);
	send1(a, mr, 0);
	send1(a, mr, 0);
	if (!svt_event_within(g_sch, scq, 2000))
		FAIL("5: no event for three more completions");
	CHECK(ibv_poll_cq(scq, 1, &w1) == 1);
	CHECK_EQ(w1.wr_id, (uint64_t)13);
	if (svt_event_within(g_sch, scq, 300))
		FAIL("5: an event from a disarmed CQ");
	CHECK(ibv_req_notify_cq(scq, 0) == 0);
	if (!svt_event_within(g_sch, scq, 2000))
		FAIL("5: no event on arming after a batch that left two behind");
	CHECK(ibv_poll_cq(scq, 2, w2) == 2);
	CHECK_EQ(w2[0].wr_id, (uint64_t)14);
	CHECK_EQ(w2[1].wr_id, (uint64_t)15);

	/* 6. An extended CQ (its own channel) under a new pair x -> y. */
	struct ibv_comp_channel *xch = ibv_create_comp_channel(d.ctx);
	CHECK(xch);
	CHECK(fcntl(xch->fd, F_SETFL, fcntl(xch->fd, F_GETFL) | O_NONBLOCK) == 0);
	struct ibv_cq_init_attr_ex ax = {.cqe = 64, .channel = xch,
					 .wc_flags = IBV_WC_EX_WITH_BYTE_LEN};
	struct ibv_cq_ex *xcq = ibv_create_cq_ex(d.ctx, &ax);
	CHECK(xcq);
	struct ibv_cq *xc = ibv_cq_ex_to_cq(xcq);
	struct svt_qpopt xo = {.scq = xc, .rcq = xc, .type = IBV_QPT_RC};
	struct ibv_qp *x = svt_qp(&d, &xo), *y = svt_qp(&d, &ro);
	svt_connect(x, y->qp_num, d.lid, &c);
	svt_connect(y, x->qp_num, d.lid, &c);
	for (int i = 0; i < 4; i++)
		recv1(y, mr);
	CHECK(ibv_req_notify_cq(xc, 0) == 0);
	for (int i = 0; i < 3; i++)
		send1(x, mr, 0);
	if (!svt_event_within(xch, xc, 2000))
		FAIL("6: no event for three completions");
	CHECK(ibv_req_notify_cq(xc, 0) == 0);
	struct ibv_poll_cq_attr pa = {0};
	CHECK(ibv_start_poll(xcq, &pa) == 0);
	CHECK_EQ(xcq->status, IBV_WC_SUCCESS);
	CHECK_EQ(xcq->wr_id, (uint64_t)16);
	ibv_end_poll(xcq);
	if (!svt_event_within(xch, xc, 2000))
		FAIL("6: no event when a batch left two announced completions");
	CHECK(ibv_req_notify_cq(xc, 0) == 0);
	if (!svt_event_within(xch, xc, 2000))
		FAIL("6: no event on arming over completions a batch left behind");
	CHECK(ibv_start_poll(xcq, &pa) == 0);
	CHECK_EQ(xcq->wr_id, (uint64_t)17);
	CHECK(ibv_next_poll(xcq) == 0);
	CHECK_EQ(xcq->wr_id, (uint64_t)18);
	CHECK(ibv_next_poll(xcq) == ENOENT);
	ibv_end_poll(xcq);
	CHECK(ibv_req_notify_cq(xc, 0) == 0);
	if (svt_event_within(xch, xc, 300))
		FAIL("6: an event after a batch that emptied the CQ");
	CHECK(ibv_destroy_qp(x) == 0);
	CHECK(ibv_destroy_qp(y) == 0);

	CHECK(ibv_destroy_qp(a) == 0);
	CHECK(ibv_destroy_qp(b) == 0);
	void *buf = mr->addr;
	CHECK(ibv_dereg_mr(mr) == 0);
	free(buf);
	CHECK(ibv_destroy_cq(scq) == 0);
	CHECK(ibv_destroy_cq(rcq) == 0);
	CHECK(ibv_destroy_cq(xc) == 0);
	CHECK(ibv_destroy_comp_channel(xch) == 0);
	CHECK(ibv_destroy_comp_channel(g_sch) == 0);
	CHECK(ibv_destroy_comp_channel(g_rch) == 0);
	CHECK(ibv_dealloc_pd(d.pd) == 0);
	CHECK(ibv_close_device(d.ctx) == 0);
	printf("ok\n");
	return 0;
}
