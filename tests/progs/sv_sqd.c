/* SPDX-License-Identifier: MIT */
/* The send queue's drain and error states, in one process:
 *
 *   sv_sqd
 *
 * SQD (IB 10.3.1, "SQ Drain"): RTS -> SQD with en_sqd_async_notify gives
 * IBV_EVENT_SQ_DRAINED once nothing started is left; a WR posted in SQD
 * does not start (no completion on either side, the target's bytes
 * untouched) until SQD -> RTS.  A SEND that was started before the drain
 * (waiting on an RNR retry) finishes first, sq_draining reads 1 meanwhile,
 * the QP leaves SQD only for ERR meanwhile, and the event comes only after
 * it.
 *
 * SQE: a UC QP's local send error parks it in SQE: the WRs behind it
 * complete flushed, its receive queue goes on taking the peer's SENDs, and
 * SQE -> RTS resumes it.
 *
 * Prints "OK sv_sqd" when every check held; else a FAIL line and exit 1. */
#include "svt.h"

static struct svt_dev D;

/* The next async event within ms, or -1 (none). */
static int next_event(int ms, struct ibv_qp **qp)
{
	struct pollfd pfd = {D.ctx->async_fd, POLLIN, 0};
	if (poll(&pfd, 1, ms) != 1)
		return -1;
	struct ibv_async_event ev;
	CHECK(ibv_get_async_event(D.ctx, &ev) == 0);
	int type = ev.event_type;
	*qp = ev.element.qp;
	ibv_ack_async_event(&ev);
	return type;
}

static void to_sqd(struct ibv_qp *qp, int notify)
{
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_SQD;
	a.en_sqd_async_notify = notify;
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_EN_SQD_ASYNC_NOTIFY) == 0);
}

static void to_rts(struct ibv_qp *qp, enum ibv_qp_state from)
{
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.cur_qp_state = from;
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_CUR_STATE) == 0);
}

static int draining(struct ibv_qp *qp)
{
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr i;
	CHECK(ibv_query_qp(qp, &a, IBV_QP_STATE, &i) == 0);
	CHECK_EQ(a.qp_state, IBV_QPS_SQD);
	return a.sq_draining;
}

static void expect_drained(struct ibv_qp *qp, const char *when)
{
	struct ibv_qp *eq = NULL;
	int ev = next_event(5000, &eq);
	if (ev != IBV_EVENT_SQ_DRAINED || eq != qp)
		FAIL("%s: event %d (qp %p), expected SQ_DRAINED for %p", when, ev, (void *)eq,
		     (void *)qp);
	ev = next_event(100, &eq);
	if (ev != -1)
		FAIL("%s: a second event %d after SQ_DRAINED", when, ev);
}

/* Two connected QPs of type, a on CQ ca with MR ma, b on cb with mb; RNR
 * retried forever. */
struct duo {
	struct ibv_cq *ca, *cb;
	struct ibv_mr *ma, *mb;
	struct ibv_qp *a, *b;
};

static void duo_up(struct duo *d, enum ibv_qp_type type)
{
	d->ca = ibv_create_cq(D.ctx, 64, NULL, NULL, 0);
	d->cb = ibv_create_cq(D.ctx, 64, NULL, NULL, 0);
	CHECK(d->ca && d->cb);
	d->ma = svt_mr(&D, 8192, SVT_ALL_ACCESS);
	d->mb = svt_mr(&D, 8192, SVT_ALL_ACCESS);
	struct svt_qpopt o = {.type = type, .scq = d->ca, .rcq = d->ca};
	d->a = svt_qp(&D, &o);
	o.scq = o.rcq = d->cb;
	d->b = svt_qp(&D, &o);
	struct svt_conn c = {SVT_ALL_ACCESS, 1, 14, 7, 7};
	svt_connect(d->a, d->b->qp_num, D.lid, &c);
	svt_connect(d->b, d->a->qp_num, D.lid, &c);
}

static void duo_down(struct duo *d)
{
	CHECK_EQ(ibv_destroy_qp(d->a), 0);
	CHECK_EQ(ibv_destroy_qp(d->b), 0);
	CHECK_EQ(ibv_destroy_cq(d->ca), 0);
	CHECK_EQ(ibv_destroy_cq(d->cb), 0);
	CHECK_EQ(ibv_dereg_mr(d->ma), 0);
	CHECK_EQ(ibv_dereg_mr(d->mb), 0);
}

static void sqd(void)
{
	struct duo d;
	duo_up(&d, IBV_QPT_RC);
	struct ibv_cq *ca = d.ca, *cb = d.cb;
	struct ibv_mr *ma = d.ma, *mb = d.mb;
	struct ibv_qp *a = d.a, *b = d.b;
	struct ibv_qp *eq;

	/* Nothing in flight: drained at once, asked for. */
	to_sqd(a, 1);
	expect_drained(a, "idle drain");
	CHECK_EQ(draining(a), 0);

	/* Posted in SQD: nothing starts. */
	svt_fill(ma->addr, 4096, 1);
	memset(mb->addr, 0xcc, 8192);
	struct ibv_sge rs = svt_sge(mb, 0, 4096), ss = svt_sge(ma, 0, 4096);
	svt_post_recv1(b, 100, &rs, 1);
	CHECK_EQ(svt_post_send1(a, 1, IBV_WR_SEND, &ss, 1, IBV_SEND_SIGNALED, 0, 0), 0);
	struct ibv_sge ws = svt_sge(ma, 0, 64);
	CHECK_EQ(svt_post_send1(a, 2, IBV_WR_RDMA_WRITE, &ws, 1, IBV_SEND_SIGNALED,
				(uintptr_t)mb->addr + 4096, mb->rkey),
		 0);
	svt_expect_empty(ca, 200, "a SEND posted in SQD");
	svt_expect_empty(cb, 0, "the receive of a SEND posted in SQD");
	for (int i = 0; i < 8192; i++)
		if (((unsigned char *)mb->addr)[i] != 0xcc)
			FAIL("byte %d of the target written while the QP was in SQD", i);

	/* SQD -> RTS: both run, in order, the data checked. */
	to_rts(a, IBV_QPS_SQD);
	struct ibv_wc w = svt_wait(ca, "the SEND after SQD -> RTS");
	CHECK_WC(w, IBV_WC_SUCCESS);
	CHECK_EQ(w.wr_id, 1);
	w = svt_wait(ca, "the WRITE after SQD -> RTS");
	CHECK_WC(w, IBV_WC_SUCCESS);
	CHECK_EQ(w.wr_id, 2);
	w = svt_wait(cb, "the receive after SQD -> RTS");
	CHECK_WC(w, IBV_WC_SUCCESS);
	CHECK_EQ(w.byte_len, 4096);
	CHECK(memcmp(mb->addr, ma->addr, 4096) == 0);
	CHECK(memcmp((char *)mb->addr + 4096, ma->addr, 64) == 0);
	if (next_event(0, &eq) != -1)
		FAIL("an event after SQD -> RTS");

	/* A SEND started before the drain (waiting for a receive: RNR) ends
	 * first; the event waits for it, and the one posted after waits for
	 * RTS. */
	CHECK_EQ(svt_post_send1(a, 3, IBV_WR_SEND, &ss, 1, IBV_SEND_SIGNALED, 0, 0), 0);
	svt_expect_empty(ca, 50, "a SEND with no receive posted");
	to_sqd(a, 1);
	if (next_event(100, &eq) != -1)
		FAIL("SQ_DRAINED while a started SEND waits for its receive");
	CHECK_EQ(draining(a), 1);
	/* While it drains, SQD leaves only for ERR (rxe's __qp_chk_state):
	 * SQD -> RTS and SQD -> SQD are EINVAL, and nothing changes. */
	{
		struct ibv_qp_attr x;
		memset(&x, 0, sizeof(x));
		x.qp_state = IBV_QPS_RTS;
		CHECK_EQ(ibv_modify_qp(a, &x, IBV_QP_STATE), EINVAL);
		x.qp_state = IBV_QPS_SQD;
		x.timeout = 3;
		CHECK_EQ(ibv_modify_qp(a, &x, IBV_QP_STATE | IBV_QP_TIMEOUT), EINVAL);
		CHECK_EQ(svt_state(a), IBV_QPS_SQD);
		CHECK_EQ(draining(a), 1);
	}
	CHECK_EQ(svt_post_send1(a, 4, IBV_WR_SEND, &ss, 1, IBV_SEND_SIGNALED, 0, 0), 0);
	svt_post_recv1(b, 101, &rs, 1);
	svt_post_recv1(b, 102, &rs, 1);
	w = svt_wait(ca, "the started SEND");
	CHECK_WC(w, IBV_WC_SUCCESS);
	CHECK_EQ(w.wr_id, 3);
	expect_drained(a, "drain behind a started SEND");
	CHECK_EQ(draining(a), 0);
	w = svt_wait(cb, "the started SEND's receive");
	CHECK_EQ(w.wr_id, 101);
	svt_expect_empty(ca, 200, "the SEND posted while draining");
	svt_expect_empty(cb, 0, "the receive of the SEND posted while draining");
	to_rts(a, IBV_QPS_SQD);
	w = svt_wait(ca, "the SEND posted while draining, after RTS");
	CHECK_WC(w, IBV_WC_SUCCESS);
	CHECK_EQ(w.wr_id, 4);
	w = svt_wait(cb, "its receive");
	CHECK_EQ(w.wr_id, 102);

	/* Without the notify flag: no event. */
	to_sqd(a, 0);
	if (next_event(100, &eq) != -1)
		FAIL("an event for a drain that did not ask for one");
	to_rts(a, IBV_QPS_SQD);
	duo_down(&d);
}

/* An XRC send QP made without a receive CQ: its events come all the same
 * (they were looked for only through the receive CQ's ring). */
static void xrc_send_drained(void)
{
	struct ibv_cq *cq = ibv_create_cq(D.ctx, 16, NULL, NULL, 0);
	CHECK(cq);
	struct ibv_xrcd_init_attr xa = {.comp_mask = IBV_XRCD_INIT_ATTR_FD |
						     IBV_XRCD_INIT_ATTR_OFLAGS,
					.fd = -1, .oflags = O_CREAT};
	struct ibv_xrcd *xrcd = ibv_open_xrcd(D.ctx, &xa);
	CHECK(xrcd);
	struct ibv_qp_init_attr_ex ia = {.qp_type = IBV_QPT_XRC_SEND, .send_cq = cq,
					 .cap = {.max_send_wr = 8, .max_send_sge = 1},
					 .comp_mask = IBV_QP_INIT_ATTR_PD, .pd = D.pd};
	struct ibv_qp *q = ibv_create_qp_ex(D.ctx, &ia);
	CHECK(q);
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	CHECK(ibv_modify_qp(q, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
					   IBV_QP_ACCESS_FLAGS) == 0);
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = 0x123;
	a.ah_attr.dlid = D.lid;
	a.ah_attr.port_num = 1;
	CHECK(ibv_modify_qp(q, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
					   IBV_QP_RQ_PSN) == 0);
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 1;
	a.rnr_retry = 1;
	a.max_rd_atomic = 1;
	CHECK(ibv_modify_qp(q, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
					   IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC) == 0);
	to_sqd(q, 1);
	expect_drained(q, "an XRC send QP without a receive CQ");
	CHECK_EQ(ibv_destroy_qp(q), 0);
	CHECK_EQ(ibv_close_xrcd(xrcd), 0);
	CHECK_EQ(ibv_destroy_cq(cq), 0);
}

static void uc_sqe(void)
{
	struct duo d;
	duo_up(&d, IBV_QPT_UC);
	struct ibv_cq *ca = d.ca, *cb = d.cb;
	struct ibv_mr *ma = d.ma, *mb = d.mb;
	struct ibv_qp *a = d.a, *b = d.b;

	/* A local protection error (a bad lkey): SQE, the WR behind flushed. */
	struct ibv_sge bad = svt_sge(ma, 0, 16);
	bad.lkey ^= 0x5a5a00;
	struct ibv_sge good = svt_sge(ma, 0, 16);
	svt_fill(ma->addr, 16, 3);
	struct ibv_send_wr w2 = {.wr_id = 11, .sg_list = &good, .num_sge = 1,
				 .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED};
	struct ibv_send_wr w1 = {.wr_id = 10, .next = &w2, .sg_list = &bad, .num_sge = 1,
				 .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED};
	struct ibv_send_wr *bw = NULL;
	struct ibv_sge rs = svt_sge(mb, 0, 64);
	svt_post_recv1(b, 200, &rs, 1);
	CHECK_EQ(ibv_post_send(a, &w1, &bw), 0);
	struct ibv_wc w = svt_wait(ca, "the SEND with a bad lkey");
	CHECK_EQ(w.wr_id, 10);
	CHECK_WC(w, IBV_WC_LOC_PROT_ERR);
	w = svt_wait(ca, "the SEND behind it");
	CHECK_EQ(w.wr_id, 11);
	CHECK_WC(w, IBV_WC_WR_FLUSH_ERR);
	CHECK_EQ(svt_state(a), IBV_QPS_SQE);
	svt_expect_empty(cb, 50, "a receive of a UC QP whose peer's SEND failed");

	/* Its receive queue goes on: b's SEND lands in a's receive. */
	struct ibv_sge ars = svt_sge(ma, 1024, 64), bs = svt_sge(mb, 2048, 32);
	svt_fill((char *)mb->addr + 2048, 32, 9);
	svt_post_recv1(a, 300, &ars, 1);
	CHECK_EQ(svt_post_send1(b, 12, IBV_WR_SEND, &bs, 1, IBV_SEND_SIGNALED, 0, 0), 0);
	CHECK_WC(svt_wait(cb, "b's SEND to a QP in SQE"), IBV_WC_SUCCESS);
	w = svt_wait(ca, "a's receive in SQE");
	CHECK_WC(w, IBV_WC_SUCCESS);
	CHECK_EQ(w.wr_id, 300);
	CHECK(memcmp((char *)ma->addr + 1024, (char *)mb->addr + 2048, 32) == 0);

	/* A WR posted in SQE completes flushed; SQE -> RTS resumes. */
	CHECK_EQ(svt_post_send1(a, 13, IBV_WR_SEND, &good, 1, IBV_SEND_SIGNALED, 0, 0), 0);
	w = svt_wait(ca, "a SEND posted in SQE");
	CHECK_EQ(w.wr_id, 13);
	CHECK_WC(w, IBV_WC_WR_FLUSH_ERR);
	to_rts(a, IBV_QPS_SQE);
	CHECK_EQ(svt_post_send1(a, 14, IBV_WR_SEND, &good, 1, IBV_SEND_SIGNALED, 0, 0), 0);
	CHECK_WC(svt_wait(ca, "a SEND after SQE -> RTS"), IBV_WC_SUCCESS);
	w = svt_wait(cb, "its receive");
	CHECK_WC(w, IBV_WC_SUCCESS);
	CHECK_EQ(w.wr_id, 200);
	CHECK(memcmp(mb->addr, ma->addr, 16) == 0);
	duo_down(&d);
}

int main(void)
{
	svt_watchdog(60);
	svt_open(&D, "loop0");
	sqd();
	xrc_send_drained();
	uc_sqe();
	CHECK_EQ(ibv_dealloc_pd(D.pd), 0);
	CHECK_EQ(ibv_close_device(D.ctx), 0);
	printf("OK sv_sqd\n");
	return 0;
}
