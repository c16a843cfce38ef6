/* SPDX-License-Identifier: MIT */
/* Object lifetimes as the kernel keeps them (docs/design.md, "Object
 * lifetimes"): EBUSY for a parent destroyed before its users, a CQ destroy
 * that waits for its events to be acknowledged, and a destroyed or foreign
 * object given to a verb answered with an errno, never a crash.
 *
 * Usage: sv_lifetimes SCENARIO; prints "OK SCENARIO" and exits 0 when every
 * check passed.  pyverbs refuses several of these orders itself, hence a C
 * program (driven by pyverbs-tests/test_lifetimes.py). */
#include "svt.h"

#include <pthread.h>
#include <stdatomic.h>
#include <sys/wait.h>

/* Two RC QPs of one process connected to each other, on one CQ each side
 * (or the same CQ), with one registered buffer. */
struct pair {
	struct svt_dev *d;
	struct ibv_cq *cq;
	struct ibv_qp *a, *b;
	struct ibv_mr *mr;
};

static void pair_up(struct pair *p, struct svt_dev *d, struct ibv_cq *cq)
{
	struct svt_qpopt o = {.type = IBV_QPT_RC, .scq = cq, .rcq = cq};
	struct svt_conn c = {.access = SVT_ALL_ACCESS, .min_rnr_timer = 1, .timeout = 14,
			     .retry_cnt = 7, .rnr_retry = 7};
	p->d = d;
	p->cq = cq;
	p->a = svt_qp(d, &o);
	p->b = svt_qp(d, &o);
	svt_connect(p->a, p->b->qp_num, d->lid, &c);
	svt_connect(p->b, p->a->qp_num, d->lid, &c);
	p->mr = svt_mr(d, 8192, SVT_ALL_ACCESS);
}

static void pair_down(struct pair *p)
{
	CHECK_EQ(ibv_destroy_qp(p->a), 0);
	CHECK_EQ(ibv_destroy_qp(p->b), 0);
	void *buf = p->mr->addr;
	CHECK_EQ(ibv_dereg_mr(p->mr), 0);
	free(buf);
}

/* An RDMA WRITE of a patterned 4 KiB from a to b's half of the buffer, then
 * a SEND of its checksum; checks both land and complete into p->cq. */
static void pair_traffic(struct pair *p, unsigned seed)
{
	unsigned char *buf = p->mr->addr;
	svt_fill(buf, 4096, seed);
	memset(buf + 4096, 0, 4096);
	struct ibv_sge s = svt_sge(p->mr, 0, 4096);
	CHECK_EQ(svt_post_send1(p->a, 1, IBV_WR_RDMA_WRITE, &s, 1, IBV_SEND_SIGNALED,
				(uintptr_t)buf + 4096, p->mr->rkey),
		 0);
	struct ibv_wc wc = svt_wait(p->cq, "rdma write");
	CHECK_WC(wc, IBV_WC_SUCCESS);
	CHECK_EQ(wc.wr_id, 1);
	if (memcmp(buf, buf + 4096, 4096))
		FAIL("RDMA WRITE data differs (seed %u)", seed);
	/* SEND of 8 bytes (the seed and a sum) into a posted receive. */
	uint32_t *msg = (uint32_t *)(buf + 100);
	msg[0] = seed;
	msg[1] = seed * 2654435761u;
	memset(buf + 200, 0, 8);
	struct ibv_sge r = svt_sge(p->mr, 200, 8);
	svt_post_recv1(p->b, 2, &r, 1);
	s = svt_sge(p->mr, 100, 8);
	CHECK_EQ(svt_post_send1(p->a, 3, IBV_WR_SEND, &s, 1, IBV_SEND_SIGNALED, 0, 0), 0);
	int got_send = 0, got_recv = 0;
	for (int i = 0; i < 2; i++) {
		wc = svt_wait(p->cq, "send or receive");
		CHECK_WC(wc, IBV_WC_SUCCESS);
		if (wc.wr_id == 3)
			got_send++;
		else if (wc.wr_id == 2 && wc.byte_len == 8)
			got_recv++;
		else
			FAIL("unexpected completion wr_id %llu", (unsigned long long)wc.wr_id);
	}
	CHECK_EQ(got_send, 1);
	CHECK_EQ(got_recv, 1);
	if (memcmp(buf + 100, buf + 200, 8))
		FAIL("SEND data differs (seed %u)", seed);
}

static struct ibv_cq *cq_ex(struct ibv_context *ctx, struct ibv_comp_channel *ch)
{
	struct ibv_cq_init_attr_ex a;
	memset(&a, 0, sizeof(a));
	a.cqe = 64;
	a.channel = ch;
	a.wc_flags = IBV_WC_STANDARD_FLAGS;
	struct ibv_cq_ex *x = ibv_create_cq_ex(ctx, &a);
	return x ? ibv_cq_ex_to_cq(x) : NULL;
}

static struct ibv_qp *qp_ex(struct svt_dev *d, struct ibv_pd *pd, struct ibv_cq *cq)
{
	struct ibv_qp_init_attr_ex a;
	memset(&a, 0, sizeof(a));
	a.qp_type = IBV_QPT_RC;
	a.send_cq = cq;
	a.recv_cq = cq;
	a.cap.max_send_wr = 8;
	a.cap.max_recv_wr = 8;
	a.cap.max_send_sge = 1;
	a.cap.max_recv_sge = 1;
	a.comp_mask = IBV_QP_INIT_ATTR_PD;
	a.pd = pd;
	return ibv_create_qp_ex(d->ctx, &a);
}

static struct ibv_srq *srq_ex(struct ibv_context *ctx, struct ibv_pd *pd, struct ibv_xrcd *xrcd,
			      struct ibv_cq *cq)
{
	struct ibv_srq_init_attr_ex a;
	memset(&a, 0, sizeof(a));
	a.attr.max_wr = 8;
	a.attr.max_sge = 1;
	a.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD;
	a.srq_type = IBV_SRQT_BASIC;
	a.pd = pd;
	if (xrcd) {
		a.comp_mask |= IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ;
		a.srq_type = IBV_SRQT_XRC;
		a.xrcd = xrcd;
		a.cq = cq;
	}
	return ibv_create_srq_ex(ctx, &a);
}

static struct ibv_xrcd *xrcd_open(struct ibv_context *ctx)
{
	struct ibv_xrcd_init_attr a;
	memset(&a, 0, sizeof(a));
	a.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
	a.fd = -1;
	a.oflags = O_CREAT;
	return ibv_open_xrcd(ctx, &a);
}

static struct ibv_qp *xrc_tgt(struct ibv_context *ctx, struct ibv_xrcd *xrcd)
{
	struct ibv_qp_init_attr_ex a;
	memset(&a, 0, sizeof(a));
	a.qp_type = IBV_QPT_XRC_RECV;
	a.comp_mask = IBV_QP_INIT_ATTR_XRCD;
	a.xrcd = xrcd;
	return ibv_create_qp_ex(ctx, &a);
}

static struct ibv_ah *ah_make(struct svt_dev *d, struct ibv_pd *pd)
{
	struct ibv_ah_attr a;
	memset(&a, 0, sizeof(a));
	a.dlid = d->lid;
	a.port_num = 1;
	return ibv_create_ah(pd, &a);
}

/* A UD SEND of 8 bytes through ah; returns ibv_post_send's answer. */
static int ud_send(struct svt_dev *d, struct ibv_cq *cq, struct ibv_ah *ah)
{
	struct svt_qpopt o = {.type = IBV_QPT_UD, .scq = cq, .rcq = cq};
	struct ibv_qp *qp = svt_qp(d, &o);
	svt_ud_up(qp, 0x1234);
	static char buf[64];
	struct ibv_mr *mr = ibv_reg_mr(d->pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr);
	struct ibv_sge s = svt_sge(mr, 0, 8);
	struct ibv_send_wr wr, *bad = NULL;
	memset(&wr, 0, sizeof(wr));
	wr.opcode = IBV_WR_SEND;
	wr.sg_list = &s;
	wr.num_sge = 1;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.wr.ud.ah = ah;
	wr.wr.ud.remote_qpn = qp->qp_num;
	wr.wr.ud.remote_qkey = 0x1234;
	int ret = ibv_post_send(qp, &wr, &bad);
	if (ret)
		CHECK(bad == &wr);
	else
		CHECK_WC(svt_wait(cq, "UD send"), IBV_WC_SUCCESS);
	CHECK_EQ(ibv_destroy_qp(qp), 0);
	CHECK_EQ(ibv_dereg_mr(mr), 0);
	return ret;
}

/* ---- ibv_dealloc_pd: EBUSY while anything uses the PD ---- */
static void scenario_pd(struct svt_dev *d)
{
	struct ibv_pd *pd = ibv_alloc_pd(d->ctx);
	CHECK(pd);
	struct ibv_cq *cq = ibv_create_cq(d->ctx, 64, NULL, NULL, 0);
	CHECK(cq);
	static char buf[4096];

	/* One user at a time: EBUSY while it exists, 0 once it is gone. */
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr);
	CHECK_EQ(ibv_dealloc_pd(pd), EBUSY);
	/* The PD still works: another MR on it, with its own key. */
	struct ibv_mr *mr2 = ibv_reg_mr(pd, buf, 64, IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr2);
	CHECK(mr2->lkey != mr->lkey);
	CHECK_EQ(ibv_dereg_mr(mr2), 0);
	CHECK_EQ(ibv_dereg_mr(mr), 0);

	struct ibv_mw *mw = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
	CHECK(mw);
	CHECK_EQ(ibv_dealloc_pd(pd), EBUSY);
	CHECK_EQ(ibv_dealloc_mw(mw), 0);

	struct ibv_qp_init_attr qa;
	memset(&qa, 0, sizeof(qa));
	qa.send_cq = qa.recv_cq = cq;
	qa.qp_type = IBV_QPT_RC;
	qa.cap.max_send_wr = qa.cap.max_recv_wr = 4;
	qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
	struct ibv_qp *qp = ibv_create_qp(pd, &qa);
	CHECK(qp);
	CHECK_EQ(ibv_dealloc_pd(pd), EBUSY);
	/* The QP still works after the refusal. */
	struct ibv_qp_attr at;
	memset(&at, 0, sizeof(at));
	at.qp_state = IBV_QPS_INIT;
	at.port_num = 1;
	CHECK_EQ(ibv_modify_qp(qp, &at,
			       IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS),
		 0);
	CHECK_EQ(svt_state(qp), IBV_QPS_INIT);
	CHECK_EQ(ibv_destroy_qp(qp), 0);

	qp = qp_ex(d, pd, cq);
	CHECK(qp);
	CHECK_EQ(ibv_dealloc_pd(pd), EBUSY);
	CHECK_EQ(ibv_destroy_qp(qp), 0);

	struct ibv_srq_init_attr sa;
	memset(&sa, 0, sizeof(sa));
	sa.attr.max_wr = 4;
	sa.attr.max_sge = 1;
	struct ibv_srq *srq = ibv_create_srq(pd, &sa);
	CHECK(srq);
	CHECK_EQ(ibv_dealloc_pd(pd), EBUSY);
	CHECK_EQ(ibv_destroy_srq(srq), 0);

	srq = srq_ex(d->ctx, pd, NULL, NULL);
	CHECK(srq);
	CHECK_EQ(ibv_dealloc_pd(pd), EBUSY);
	CHECK_EQ(ibv_destroy_srq(srq), 0);

	struct ibv_ah *ah = ah_make(d, pd);
	CHECK(ah);
	CHECK_EQ(ibv_dealloc_pd(pd), EBUSY);
	CHECK_EQ(ibv_destroy_ah(ah), 0);

	struct ibv_parent_domain_init_attr pa;
	memset(&pa, 0, sizeof(pa));
	pa.pd = pd;
	struct ibv_pd *parent = ibv_alloc_parent_domain(d->ctx, &pa);
	CHECK(parent);
	CHECK_EQ(ibv_dealloc_pd(pd), EBUSY);
	/* A QP on the parent domain holds the parent domain. */
	qp = qp_ex(d, parent, cq);
	CHECK(qp);
	CHECK_EQ(ibv_dealloc_pd(parent), EBUSY);
	CHECK_EQ(ibv_destroy_qp(qp), 0);
	CHECK_EQ(ibv_dealloc_pd(parent), 0);

	/* ibv_rereg_mr moving an MR to another PD moves its hold too. */
	struct ibv_pd *pd2 = ibv_alloc_pd(d->ctx);
	CHECK(pd2);
	mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr);
	CHECK_EQ(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_PD, pd2, NULL, 0, 0), 0);
	CHECK_EQ(ibv_dealloc_pd(pd2), EBUSY);
	CHECK_EQ(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_PD, pd, NULL, 0, 0), 0);
	CHECK_EQ(ibv_dealloc_pd(pd2), 0);
	CHECK_EQ(ibv_dealloc_pd(pd), EBUSY);
	CHECK_EQ(ibv_dereg_mr(mr), 0);

	/* ibv_free_dm while a DM MR exists; ibv_dealloc_td while a parent
	 * domain uses the TD: EBUSY, as the kernel and mlx5 answer. */
	struct ibv_alloc_dm_attr dma;
	memset(&dma, 0, sizeof(dma));
	dma.length = 4096;
	struct ibv_dm *dm = ibv_alloc_dm(d->ctx, &dma);
	CHECK(dm);
	mr = ibv_reg_dm_mr(pd, dm, 0, 64, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ZERO_BASED);
	CHECK(mr);
	CHECK_EQ(ibv_free_dm(dm), EBUSY);
	uint32_t word = 0x5a5a1234, back = 0;
	CHECK_EQ(ibv_memcpy_to_dm(dm, 0, &word, 4), 0); /* the DM still works */
	CHECK_EQ(ibv_memcpy_from_dm(&back, dm, 0, 4), 0);
	CHECK_EQ(back, word);
	CHECK_EQ(ibv_dealloc_pd(pd), EBUSY);
	CHECK_EQ(ibv_dereg_mr(mr), 0);
	CHECK_EQ(ibv_free_dm(dm), 0);
	struct ibv_td_init_attr tda = {0};
	struct ibv_td *td = ibv_alloc_td(d->ctx, &tda);
	CHECK(td);
	pa.td = td;
	parent = ibv_alloc_parent_domain(d->ctx, &pa);
	CHECK(parent);
	CHECK_EQ(ibv_dealloc_td(td), EBUSY);
	CHECK_EQ(ibv_dealloc_pd(parent), 0);
	CHECK_EQ(ibv_dealloc_td(td), 0);

	/* All of them at once, released in the right order. */
	mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr);
	qp = ibv_create_qp(pd, &qa);
	CHECK(qp);
	ah = ah_make(d, pd);
	CHECK(ah);
	CHECK_EQ(ibv_dealloc_pd(pd), EBUSY);
	CHECK_EQ(ibv_destroy_ah(ah), 0);
	CHECK_EQ(ibv_dealloc_pd(pd), EBUSY);
	CHECK_EQ(ibv_destroy_qp(qp), 0);
	CHECK_EQ(ibv_dealloc_pd(pd), EBUSY);
	CHECK_EQ(ibv_dereg_mr(mr), 0);
	CHECK_EQ(ibv_dealloc_pd(pd), 0);
	CHECK_EQ(ibv_destroy_cq(cq), 0);
}

/* ---- ibv_destroy_cq: EBUSY while a QP or SRQ uses the CQ ---- */
static void scenario_cq(struct svt_dev *d)
{
	for (int ex = 0; ex < 2; ex++) {
		struct ibv_cq *cq = ex ? cq_ex(d->ctx, NULL) : ibv_create_cq(d->ctx, 64, NULL, NULL, 0);
		CHECK(cq);
		struct pair p;
		pair_up(&p, d, cq);
		/* The crash: this succeeded and destroy_qp then used it. */
		CHECK_EQ(ibv_destroy_cq(cq), EBUSY);
		/* Still works: traffic completes into it, data checked. */
		pair_traffic(&p, 11 + ex);
		CHECK_EQ(ibv_destroy_cq(cq), EBUSY);
		CHECK_EQ(ibv_destroy_qp(p.a), 0);
		CHECK_EQ(ibv_destroy_cq(cq), EBUSY); /* b still uses it */
		CHECK_EQ(ibv_destroy_qp(p.b), 0);
		void *buf = p.mr->addr;
		CHECK_EQ(ibv_dereg_mr(p.mr), 0);
		free(buf);
		CHECK_EQ(ibv_destroy_cq(cq), 0);
	}
	/* A QP from ibv_create_qp_ex; a send CQ and a receive CQ apart. */
	struct ibv_cq *scq = ibv_create_cq(d->ctx, 16, NULL, NULL, 0);
	struct ibv_cq *rcq = cq_ex(d->ctx, NULL);
	CHECK(scq && rcq);
	struct ibv_qp_init_attr_ex a;
	memset(&a, 0, sizeof(a));
	a.qp_type = IBV_QPT_UD;
	a.send_cq = scq;
	a.recv_cq = rcq;
	a.cap.max_send_wr = a.cap.max_recv_wr = 4;
	a.cap.max_send_sge = a.cap.max_recv_sge = 1;
	a.comp_mask = IBV_QP_INIT_ATTR_PD;
	a.pd = d->pd;
	struct ibv_qp *qp = ibv_create_qp_ex(d->ctx, &a);
	CHECK(qp);
	CHECK_EQ(ibv_destroy_cq(scq), EBUSY);
	CHECK_EQ(ibv_destroy_cq(rcq), EBUSY);
	CHECK_EQ(ibv_destroy_qp(qp), 0);
	CHECK_EQ(ibv_destroy_cq(scq), 0);
	CHECK_EQ(ibv_destroy_cq(rcq), 0);

	/* An XRC SRQ completes into its CQ. */
	struct ibv_xrcd *x = xrcd_open(d->ctx);
	CHECK(x);
	struct ibv_cq *cq = ibv_create_cq(d->ctx, 16, NULL, NULL, 0);
	CHECK(cq);
	struct ibv_srq *srq = srq_ex(d->ctx, d->pd, x, cq);
	CHECK(srq);
	CHECK_EQ(ibv_destroy_cq(cq), EBUSY);
	CHECK_EQ(ibv_destroy_srq(srq), 0);
	CHECK_EQ(ibv_destroy_cq(cq), 0);
	CHECK_EQ(ibv_close_xrcd(x), 0);
}

/* ---- ibv_destroy_comp_channel: EBUSY while a CQ uses it ---- */
static void scenario_channel(struct svt_dev *d)
{
	struct ibv_comp_channel *ch = ibv_create_comp_channel(d->ctx);
	CHECK(ch);
	struct ibv_cq *cq1 = ibv_create_cq(d->ctx, 64, NULL, ch, 0);
	CHECK(cq1);
	CHECK_EQ(ibv_destroy_comp_channel(ch), EBUSY);
	struct ibv_cq *cq2 = cq_ex(d->ctx, ch);
	CHECK(cq2);
	CHECK_EQ(ibv_destroy_comp_channel(ch), EBUSY);
	CHECK_EQ(ibv_destroy_cq(cq2), 0);
	CHECK_EQ(ibv_destroy_comp_channel(ch), EBUSY);

	/* A CQ in use (EBUSY) keeps its events: the channel still works. */
	struct pair p;
	pair_up(&p, d, cq1);
	CHECK_EQ(ibv_destroy_cq(cq1), EBUSY);
	CHECK_EQ(ibv_req_notify_cq(cq1, 0), 0);
	pair_traffic(&p, 21);
	struct ibv_cq *ev_cq = NULL;
	void *ev_ctx = NULL;
	struct pollfd pf = {.fd = ch->fd, .events = POLLIN};
	if (poll(&pf, 1, 5000) != 1)
		FAIL("no completion event within 5 s");
	CHECK_EQ(ibv_get_cq_event(ch, &ev_cq, &ev_ctx), 0);
	CHECK(ev_cq == cq1);
	ibv_ack_cq_events(cq1, 1);
	pair_down(&p);
	CHECK_EQ(ibv_destroy_cq(cq1), 0);
	CHECK_EQ(ibv_destroy_comp_channel(ch), 0);
}

/* ---- ibv_close_xrcd: EBUSY while it has SRQs or QPs ---- */
static void scenario_xrcd(struct svt_dev *d)
{
	struct ibv_xrcd *x = xrcd_open(d->ctx);
	CHECK(x);
	struct ibv_cq *cq = ibv_create_cq(d->ctx, 16, NULL, NULL, 0);
	CHECK(cq);
	struct ibv_srq *srq = srq_ex(d->ctx, d->pd, x, cq);
	CHECK(srq);
	CHECK_EQ(ibv_close_xrcd(x), EBUSY);
	/* Still works: a second SRQ and a target QP in it. */
	struct ibv_qp *tgt = xrc_tgt(d->ctx, x);
	CHECK(tgt);
	uint32_t num = 0;
	CHECK_EQ(ibv_get_srq_num(srq, &num), 0);
	CHECK(num != 0);
	CHECK_EQ(ibv_destroy_srq(srq), 0);
	CHECK_EQ(ibv_close_xrcd(x), EBUSY); /* the target QP */
	CHECK_EQ(ibv_destroy_qp(tgt), 0);
	CHECK_EQ(ibv_close_xrcd(x), 0);
	CHECK_EQ(ibv_destroy_cq(cq), 0);
}

/* ---- ibv_destroy_cq blocks until its events are acknowledged ---- */
static volatile int acked;

static void *ack_later(void *arg)
{
	usleep(300 * 1000);
	acked = 1;
	ibv_ack_cq_events(arg, 1);
	return NULL;
}

static void scenario_unacked(struct svt_dev *d)
{
	struct ibv_comp_channel *ch = ibv_create_comp_channel(d->ctx);
	CHECK(ch);
	for (int ex = 0; ex < 2; ex++) {
		struct ibv_cq *cq = ex ? cq_ex(d->ctx, ch) : ibv_create_cq(d->ctx, 64, NULL, ch, 0);
		CHECK(cq);
		struct pair p;
		pair_up(&p, d, cq);
		CHECK_EQ(ibv_req_notify_cq(cq, 0), 0);
		pair_traffic(&p, 31 + ex);
		struct ibv_cq *ev_cq = NULL;
		void *ev_ctx = NULL;
		struct pollfd pf = {.fd = ch->fd, .events = POLLIN};
		if (poll(&pf, 1, 5000) != 1)
			FAIL("no completion event within 5 s");
		CHECK_EQ(ibv_get_cq_event(ch, &ev_cq, &ev_ctx), 0);
		CHECK(ev_cq == cq);
		pair_down(&p);
		/* One event not acked: destroy waits for the thread's ack. */
		acked = 0;
		pthread_t t;
		CHECK_EQ(pthread_create(&t, NULL, ack_later, cq), 0);
		int ret = ibv_destroy_cq(cq);
		int acked_at_return = acked;
		CHECK_EQ(pthread_join(t, NULL), 0);
		CHECK_EQ(ret, 0);
		if (!acked_at_return)
			FAIL("ibv_destroy_cq returned before its event was acknowledged");
	}
	/* No event handed out: no wait, and no thread needed. */
	struct ibv_cq *cq = ibv_create_cq(d->ctx, 64, NULL, ch, 0);
	CHECK(cq);
	CHECK_EQ(ibv_destroy_cq(cq), 0);
	CHECK_EQ(ibv_destroy_comp_channel(ch), 0);
}

/* ---- ibv_destroy_qp and ibv_destroy_cq wait for async event acks ---- */
static struct ibv_async_event later_ev;

static void *ack_async_later(void *arg)
{
	(void)arg;
	usleep(300 * 1000);
	acked = 1;
	ibv_ack_async_event(&later_ev);
	return NULL;
}

static void get_async(struct svt_dev *d, enum ibv_event_type want, struct ibv_async_event *ev)
{
	struct pollfd pf = {.fd = d->ctx->async_fd, .events = POLLIN};
	for (;;) {
		if (poll(&pf, 1, 5000) != 1)
			FAIL("no async event %s within 5 s", ibv_event_type_str(want));
		CHECK_EQ(ibv_get_async_event(d->ctx, ev), 0);
		if (ev->event_type == want)
			return;
		ibv_ack_async_event(ev); /* another one (e.g. the peer QP's) */
	}
}

/* Runs destroy while a thread acks later_ev after 300 ms; checks it waited. */
static void destroy_waits(int (*destroy)(void *), void *obj, const char *what)
{
	acked = 0;
	pthread_t t;
	CHECK_EQ(pthread_create(&t, NULL, ack_async_later, NULL), 0);
	int ret = destroy(obj);
	int acked_at_return = acked;
	CHECK_EQ(pthread_join(t, NULL), 0);
	CHECK_EQ(ret, 0);
	if (!acked_at_return)
		FAIL("%s returned before its async event was acknowledged", what);
}

static int destroy_qp_v(void *p)
{
	return ibv_destroy_qp(p);
}

static int destroy_cq_v(void *p)
{
	return ibv_destroy_cq(p);
}

static void scenario_async(struct svt_dev *d)
{
	/* A WRITE with a bad rkey: the responder QP gets QP_ACCESS_ERR. */
	struct ibv_cq *cq = ibv_create_cq(d->ctx, 64, NULL, NULL, 0);
	CHECK(cq);
	struct pair p;
	pair_up(&p, d, cq);
	struct ibv_sge s = svt_sge(p.mr, 0, 64);
	CHECK_EQ(svt_post_send1(p.a, 1, IBV_WR_RDMA_WRITE, &s, 1, IBV_SEND_SIGNALED,
				(uintptr_t)p.mr->addr + 4096, p.mr->rkey ^ 0x80),
		 0);
	struct ibv_wc wc = svt_wait(cq, "bad rkey write");
	CHECK_WC(wc, IBV_WC_REM_ACCESS_ERR);
	get_async(d, IBV_EVENT_QP_ACCESS_ERR, &later_ev);
	CHECK(later_ev.element.qp == p.b);
	CHECK_EQ(ibv_destroy_qp(p.a), 0);
	destroy_waits(destroy_qp_v, p.b, "ibv_destroy_qp");
	void *buf = p.mr->addr;
	CHECK_EQ(ibv_dereg_mr(p.mr), 0);
	free(buf);
	CHECK_EQ(ibv_destroy_cq(cq), 0);

	/* A CQ that overflows: IBV_EVENT_CQ_ERR, acked after a delay. */
	struct ibv_cq *small = ibv_create_cq(d->ctx, 1, NULL, NULL, 0);
	struct ibv_cq *big = ibv_create_cq(d->ctx, 64, NULL, NULL, 0);
	CHECK(small && big);
	struct svt_qpopt o = {.type = IBV_QPT_RC, .scq = small, .rcq = big};
	struct svt_qpopt o2 = {.type = IBV_QPT_RC, .scq = big, .rcq = big};
	struct svt_conn c = {.access = SVT_ALL_ACCESS, .min_rnr_timer = 1, .timeout = 14,
			     .retry_cnt = 7, .rnr_retry = 7};
	struct ibv_qp *qa = svt_qp(d, &o), *qb = svt_qp(d, &o2);
	svt_connect(qa, qb->qp_num, d->lid, &c);
	svt_connect(qb, qa->qp_num, d->lid, &c);
	struct ibv_mr *mr = svt_mr(d, 8192, SVT_ALL_ACCESS);
	s = svt_sge(mr, 0, 8);
	for (int i = 0; i < small->cqe + 2; i++)
		if (svt_post_send1(qa, 10 + i, IBV_WR_RDMA_WRITE, &s, 1, IBV_SEND_SIGNALED,
				   (uintptr_t)mr->addr + 4096, mr->rkey))
			break; /* the send queue may refuse once the QP is in error */
	get_async(d, IBV_EVENT_CQ_ERR, &later_ev);
	CHECK(later_ev.element.cq == small);
	CHECK_EQ(ibv_destroy_qp(qa), 0);
	CHECK_EQ(ibv_destroy_qp(qb), 0);
	destroy_waits(destroy_cq_v, small, "ibv_destroy_cq");
	CHECK_EQ(ibv_destroy_cq(big), 0);
	buf = mr->addr;
	CHECK_EQ(ibv_dereg_mr(mr), 0);
	free(buf);
}

/* ---- a destroyed object: an errno, never a crash; double destroy ---- */
static void scenario_stale(struct svt_dev *d)
{
	struct ibv_cq *cq = ibv_create_cq(d->ctx, 16, NULL, NULL, 0);
	CHECK(cq);
	struct pair p;
	pair_up(&p, d, cq);
	struct ibv_qp *qa = p.a;

	/* The ibv_wr_* API on a destroyed extended QP: the batch fails, and
	 * nothing touches the QP's freed posting state. */
	{
		struct ibv_qp_init_attr_ex xa;
		memset(&xa, 0, sizeof(xa));
		xa.qp_type = IBV_QPT_RC;
		xa.send_cq = cq;
		xa.recv_cq = cq;
		xa.cap.max_send_wr = 8;
		xa.cap.max_recv_wr = 8;
		xa.cap.max_send_sge = 1;
		xa.cap.max_recv_sge = 1;
		xa.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
		xa.pd = d->pd;
		xa.send_ops_flags = IBV_QP_EX_WITH_SEND;
		struct ibv_qp *xq = ibv_create_qp_ex(d->ctx, &xa);
		CHECK(xq);
		struct ibv_qp_ex *qx = ibv_qp_to_qp_ex(xq);
		CHECK(qx);
		CHECK_EQ(ibv_destroy_qp(xq), 0);
		ibv_wr_start(qx);
		ibv_wr_send(qx);
		ibv_wr_set_sge(qx, 0, 0, 0);
		CHECK_EQ(ibv_wr_complete(qx), EINVAL);
		ibv_wr_abort(qx);
	}

	/* Multicast on a destroyed UD QP */
	{
		struct svt_qpopt uo = {IBV_QPT_UD, cq, cq, NULL, 0, 8, 8, 1, 0};
		struct ibv_qp *uq = svt_qp(d, &uo);
		CHECK_EQ(ibv_destroy_qp(uq), 0);
		union ibv_gid mg;
		memset(&mg, 0, sizeof(mg));
		mg.raw[0] = 0xff;
		mg.raw[15] = 1;
		CHECK_EQ(ibv_attach_mcast(uq, &mg, 0xc001), EINVAL);
		CHECK_EQ(ibv_detach_mcast(uq, &mg, 0xc001), EINVAL);
	}

	CHECK_EQ(ibv_destroy_qp(qa), 0);
	struct ibv_qp_attr at;
	struct ibv_qp_init_attr ia;
	memset(&at, 0, sizeof(at));
	at.qp_state = IBV_QPS_ERR;
	CHECK_EQ(ibv_modify_qp(qa, &at, IBV_QP_STATE), EINVAL);
	CHECK_EQ(ibv_query_qp(qa, &at, IBV_QP_STATE, &ia), EINVAL);
	struct ibv_sge s = svt_sge(p.mr, 0, 8);
	struct ibv_send_wr swr, *sbad = NULL;
	memset(&swr, 0, sizeof(swr));
	swr.opcode = IBV_WR_SEND;
	swr.sg_list = &s;
	swr.num_sge = 1;
	CHECK_EQ(ibv_post_send(qa, &swr, &sbad), EINVAL);
	CHECK(sbad == &swr);
	struct ibv_recv_wr rwr, *rbad = NULL;
	memset(&rwr, 0, sizeof(rwr));
	rwr.sg_list = &s;
	rwr.num_sge = 1;
	CHECK_EQ(ibv_post_recv(qa, &rwr, &rbad), EINVAL);
	CHECK(rbad == &rwr);
	CHECK_EQ(ibv_destroy_qp(qa), ENOENT); /* double destroy */
	CHECK_EQ(ibv_destroy_qp(p.b), 0);
	void *buf = p.mr->addr;
	struct ibv_mr *mr = p.mr;
	CHECK_EQ(ibv_dereg_mr(mr), 0);
	CHECK_EQ(ibv_dereg_mr(mr), ENOENT);
	free(buf);

	CHECK_EQ(ibv_destroy_cq(cq), 0);
	struct ibv_wc wc;
	CHECK(ibv_poll_cq(cq, 1, &wc) < 0);
	CHECK_EQ(ibv_req_notify_cq(cq, 0), EINVAL);
	CHECK_EQ(ibv_resize_cq(cq, 64), EINVAL);
	struct ibv_modify_cq_attr mca;
	memset(&mca, 0, sizeof(mca));
	mca.attr_mask = IBV_CQ_ATTR_MODERATE;
	mca.moderate.cq_count = 2;
	CHECK_EQ(ibv_modify_cq(cq, &mca), EINVAL);
	CHECK_EQ(ibv_destroy_cq(cq), ENOENT);
	/* A destroyed CQ given to create_qp. */
	struct ibv_qp_init_attr qia;
	memset(&qia, 0, sizeof(qia));
	qia.send_cq = qia.recv_cq = cq;
	qia.qp_type = IBV_QPT_RC;
	qia.cap.max_send_wr = qia.cap.max_recv_wr = 1;
	qia.cap.max_send_sge = qia.cap.max_recv_sge = 1;
	errno = 0;
	CHECK(!ibv_create_qp(d->pd, &qia));
	CHECK_EQ(errno, EINVAL);

	/* PD */
	struct ibv_pd *pd = ibv_alloc_pd(d->ctx);
	CHECK(pd);
	CHECK_EQ(ibv_dealloc_pd(pd), 0);
	static char area[4096];
	errno = 0;
	CHECK(!ibv_reg_mr(pd, area, sizeof(area), IBV_ACCESS_LOCAL_WRITE));
	CHECK_EQ(errno, EINVAL);
	errno = 0;
	CHECK(!ah_make(d, pd));
	CHECK_EQ(errno, EINVAL);
	CHECK_EQ(ibv_dealloc_pd(pd), ENOENT);

	/* SRQ */
	struct ibv_srq_init_attr sa;
	memset(&sa, 0, sizeof(sa));
	sa.attr.max_wr = 4;
	sa.attr.max_sge = 1;
	struct ibv_srq *srq = ibv_create_srq(d->pd, &sa);
	CHECK(srq);
	CHECK_EQ(ibv_destroy_srq(srq), 0);
	struct ibv_srq_attr sat;
	CHECK_EQ(ibv_query_srq(srq, &sat), EINVAL);
	sat.srq_limit = 1;
	CHECK_EQ(ibv_modify_srq(srq, &sat, IBV_SRQ_LIMIT), EINVAL);
	rbad = NULL;
	CHECK_EQ(ibv_post_srq_recv(srq, &rwr, &rbad), EINVAL);
	CHECK(rbad == &rwr);
	CHECK_EQ(ibv_destroy_srq(srq), ENOENT);

	/* MW, AH, XRCD, TD, DM */
	struct ibv_mw *mw = ibv_alloc_mw(d->pd, IBV_MW_TYPE_2);
	CHECK(mw);
	CHECK_EQ(ibv_dealloc_mw(mw), 0);
	CHECK_EQ(ibv_dealloc_mw(mw), ENOENT);
	struct ibv_ah *ah = ah_make(d, d->pd);
	CHECK(ah);
	struct ibv_cq *ucq = ibv_create_cq(d->ctx, 16, NULL, NULL, 0);
	CHECK(ucq);
	CHECK_EQ(ud_send(d, ucq, ah), 0); /* the live AH works */
	CHECK_EQ(ibv_destroy_ah(ah), 0);
	CHECK_EQ(ud_send(d, ucq, ah), EINVAL);
	CHECK_EQ(ibv_destroy_ah(ah), ENOENT);
	CHECK_EQ(ibv_destroy_cq(ucq), 0);
	struct ibv_xrcd *x = xrcd_open(d->ctx);
	CHECK(x);
	CHECK_EQ(ibv_close_xrcd(x), 0);
	errno = 0;
	CHECK(!xrc_tgt(d->ctx, x));
	CHECK_EQ(errno, EINVAL);
	CHECK_EQ(ibv_close_xrcd(x), ENOENT);
	struct ibv_td_init_attr tda = {0};
	struct ibv_td *td = ibv_alloc_td(d->ctx, &tda);
	CHECK(td);
	CHECK_EQ(ibv_dealloc_td(td), 0);
	CHECK_EQ(ibv_dealloc_td(td), ENOENT);
	struct ibv_alloc_dm_attr dma;
	memset(&dma, 0, sizeof(dma));
	dma.length = 4096;
	struct ibv_dm *dm = ibv_alloc_dm(d->ctx, &dma);
	CHECK(dm);
	CHECK_EQ(ibv_free_dm(dm), 0);
	uint32_t word = 0;
	CHECK_EQ(ibv_memcpy_to_dm(dm, 0, &word, 4), EINVAL);
	CHECK_EQ(ibv_free_dm(dm), ENOENT);

	/* Completion channel */
	struct ibv_comp_channel *ch = ibv_create_comp_channel(d->ctx);
	CHECK(ch);
	CHECK_EQ(ibv_destroy_comp_channel(ch), 0);
	errno = 0;
	CHECK(!ibv_create_cq(d->ctx, 16, NULL, ch, 0));
	CHECK_EQ(errno, EINVAL);
	errno = 0;
	CHECK(!cq_ex(d->ctx, ch));
	CHECK_EQ(errno, EINVAL);
	CHECK_EQ(ibv_destroy_comp_channel(ch), ENOENT);
}

/* ---- an object of another context: EINVAL ---- */
static void scenario_foreign(struct svt_dev *d)
{
	struct svt_dev e;
	svt_open(&e, "loop0");
	struct ibv_cq *ecq = ibv_create_cq(e.ctx, 16, NULL, NULL, 0);
	CHECK(ecq);
	struct ibv_cq *cq = ibv_create_cq(d->ctx, 16, NULL, NULL, 0);
	CHECK(cq);
	struct ibv_qp_init_attr qia;
	memset(&qia, 0, sizeof(qia));
	qia.send_cq = cq;
	qia.recv_cq = ecq;
	qia.qp_type = IBV_QPT_RC;
	qia.cap.max_send_wr = qia.cap.max_recv_wr = 1;
	qia.cap.max_send_sge = qia.cap.max_recv_sge = 1;
	errno = 0;
	CHECK(!ibv_create_qp(d->pd, &qia));
	CHECK_EQ(errno, EINVAL);
	qia.send_cq = ecq;
	qia.recv_cq = cq;
	errno = 0;
	CHECK(!ibv_create_qp(d->pd, &qia));
	CHECK_EQ(errno, EINVAL);
	/* The PD of the other context through create_qp_ex. */
	errno = 0;
	CHECK(!qp_ex(d, e.pd, cq));
	CHECK_EQ(errno, EINVAL);
	/* An SRQ of the other context. */
	struct ibv_srq_init_attr sa;
	memset(&sa, 0, sizeof(sa));
	sa.attr.max_wr = 4;
	sa.attr.max_sge = 1;
	struct ibv_srq *esrq = ibv_create_srq(e.pd, &sa);
	CHECK(esrq);
	qia.send_cq = qia.recv_cq = cq;
	qia.srq = esrq;
	errno = 0;
	CHECK(!ibv_create_qp(d->pd, &qia));
	CHECK_EQ(errno, EINVAL);
	/* XRC: the other context's CQ or domain for an XRC SRQ. */
	struct ibv_xrcd *x = xrcd_open(d->ctx);
	struct ibv_xrcd *ex = xrcd_open(e.ctx);
	CHECK(x && ex);
	errno = 0;
	CHECK(!srq_ex(d->ctx, d->pd, x, ecq));
	CHECK_EQ(errno, EINVAL);
	errno = 0;
	CHECK(!srq_ex(d->ctx, d->pd, ex, cq));
	CHECK_EQ(errno, EINVAL);
	errno = 0;
	CHECK(!xrc_tgt(d->ctx, ex));
	CHECK_EQ(errno, EINVAL);
	/* The other context's channel for ibv_create_cq_ex. */
	struct ibv_comp_channel *ech = ibv_create_comp_channel(e.ctx);
	CHECK(ech);
	errno = 0;
	CHECK(!cq_ex(d->ctx, ech));
	CHECK_EQ(errno, EINVAL);
	/* A DM of the other context for ibv_reg_dm_mr. */
	struct ibv_alloc_dm_attr dma;
	memset(&dma, 0, sizeof(dma));
	dma.length = 4096;
	struct ibv_dm *edm = ibv_alloc_dm(e.ctx, &dma);
	CHECK(edm);
	errno = 0;
	CHECK(!ibv_reg_dm_mr(d->pd, edm, 0, 64, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ZERO_BASED));
	CHECK_EQ(errno, EINVAL);
	/* An AH of the other context for a UD SEND. */
	struct ibv_ah *eah = ah_make(&e, e.pd);
	CHECK(eah);
	CHECK_EQ(ud_send(d, cq, eah), EINVAL);
	CHECK_EQ(ibv_destroy_ah(eah), 0);
	/* Nothing was taken by the refused calls: all goes in order. */
	CHECK_EQ(ibv_free_dm(edm), 0);
	CHECK_EQ(ibv_destroy_comp_channel(ech), 0);
	CHECK_EQ(ibv_close_xrcd(x), 0);
	CHECK_EQ(ibv_close_xrcd(ex), 0);
	CHECK_EQ(ibv_destroy_srq(esrq), 0);
	CHECK_EQ(ibv_destroy_cq(cq), 0);
	CHECK_EQ(ibv_destroy_cq(ecq), 0);
	CHECK_EQ(ibv_dealloc_pd(e.pd), 0);
	CHECK_EQ(ibv_close_device(e.ctx), 0);
}

/* ---- closing a context with live objects ---- */

/* A UD QP attached to a multicast group: ibv_destroy_qp is EBUSY until it
 * is detached, as the kernel answers. */
static void scenario_mcast(struct svt_dev *d)
{
	struct ibv_cq *cq = ibv_create_cq(d->ctx, 16, NULL, NULL, 0);
	CHECK(cq);
	struct svt_qpopt uo = {IBV_QPT_UD, cq, cq, NULL, 0, 8, 8, 1, 0};
	struct ibv_qp *uq = svt_qp(d, &uo);
	union ibv_gid mg;
	memset(&mg, 0, sizeof(mg));
	mg.raw[0] = 0xff;
	mg.raw[15] = 7;
	/* On an InfiniBand port a group's LID is a multicast LID (the
	 * kernel's is_valid_mcast_lid): 0xc000 to 0xfffe, else EINVAL. */
	static const uint16_t not_mlid[] = {0, 5, 0xbfff, 0xffff};
	for (unsigned i = 0; i < sizeof(not_mlid) / sizeof(not_mlid[0]); i++)
		CHECK_EQ(ibv_attach_mcast(uq, &mg, not_mlid[i]), EINVAL);
	CHECK_EQ(ibv_attach_mcast(uq, &mg, 0xc007), 0);
	CHECK_EQ(ibv_destroy_qp(uq), EBUSY);
	/* Still a working QP. */
	svt_ud_up(uq, 0x11);
	CHECK_EQ(svt_state(uq), IBV_QPS_RTS);
	for (unsigned i = 0; i < sizeof(not_mlid) / sizeof(not_mlid[0]); i++) {
		CHECK_EQ(ibv_attach_mcast(uq, &mg, not_mlid[i]), EINVAL);
		CHECK_EQ(ibv_detach_mcast(uq, &mg, not_mlid[i]), EINVAL);
	}
	CHECK_EQ(ibv_detach_mcast(uq, &mg, 0xc007), 0);
	CHECK_EQ(ibv_detach_mcast(uq, &mg, 0xc007), EINVAL);
	/* An IPv4-mapped GID of an IPv4 multicast address is a multicast GID
	 * (rdma_is_multicast_addr); of a unicast address it is not. */
	union ibv_gid v4;
	memset(&v4, 0, sizeof(v4));
	v4.raw[10] = v4.raw[11] = 0xff;
	v4.raw[12] = 239;
	v4.raw[15] = 9;
	CHECK_EQ(ibv_attach_mcast(uq, &v4, 0xc009), 0);
	CHECK_EQ(ibv_detach_mcast(uq, &v4, 0xc009), 0);
	v4.raw[12] = 10;
	CHECK_EQ(ibv_attach_mcast(uq, &v4, 0xc009), EINVAL);
	CHECK_EQ(ibv_destroy_qp(uq), 0);
	CHECK_EQ(ibv_destroy_cq(cq), 0);
}

/* ibv_close_device with every kind of object still live: it destroys them
 * (as closing the uverbs file does), the peer's traffic to them stops
 * working, no event wait blocks the close, and the application's stale
 * pointers answer ENOENT. */
static void scenario_close(struct svt_dev *d)
{
	struct svt_dev e;
	svt_open(&e, "loop0");
	struct ibv_comp_channel *ch = ibv_create_comp_channel(e.ctx);
	CHECK(ch);
	struct ibv_cq *ecq = ibv_create_cq(e.ctx, 16, NULL, ch, 0);
	struct ibv_cq *cq = ibv_create_cq(d->ctx, 16, NULL, NULL, 0);
	CHECK(ecq && cq);
	struct svt_qpopt o = {.type = IBV_QPT_RC, .scq = cq, .rcq = cq};
	struct svt_qpopt eo = {.type = IBV_QPT_RC, .scq = ecq, .rcq = ecq};
	struct svt_conn c = {.access = SVT_ALL_ACCESS, .min_rnr_timer = 1, .timeout = 10,
			     .retry_cnt = 1, .rnr_retry = 1};
	struct ibv_qp *qa = svt_qp(d, &o), *qe = svt_qp(&e, &eo);
	svt_connect(qa, qe->qp_num, e.lid, &c);
	svt_connect(qe, qa->qp_num, d->lid, &c);
	struct ibv_mr *mr = svt_mr(d, 8192, SVT_ALL_ACCESS);
	struct ibv_mr *emr = svt_mr(&e, 8192, SVT_ALL_ACCESS);
	unsigned char *buf = mr->addr, *ebuf = emr->addr;

	/* Traffic works before the close: a WRITE lands, a SEND arrives and
	 * raises a completion event that is never acknowledged. */
	svt_fill(buf, 4096, 5);
	struct ibv_sge s = svt_sge(mr, 0, 4096);
	CHECK_EQ(svt_post_send1(qa, 1, IBV_WR_RDMA_WRITE, &s, 1, IBV_SEND_SIGNALED,
				(uintptr_t)ebuf, emr->rkey),
		 0);
	CHECK_WC(svt_wait(cq, "write before close"), IBV_WC_SUCCESS);
	CHECK(!memcmp(buf, ebuf, 4096));
	CHECK_EQ(ibv_req_notify_cq(ecq, 0), 0);
	struct ibv_sge es = svt_sge(emr, 4096, 64);
	svt_post_recv1(qe, 2, &es, 1);
	s = svt_sge(mr, 0, 64);
	CHECK_EQ(svt_post_send1(qa, 3, IBV_WR_SEND, &s, 1, IBV_SEND_SIGNALED, 0, 0), 0);
	CHECK_WC(svt_wait(cq, "send before close"), IBV_WC_SUCCESS);
	struct ibv_cq *evcq;
	void *evctx;
	CHECK_EQ(ibv_get_cq_event(ch, &evcq, &evctx), 0);
	CHECK(evcq == ecq); /* not acknowledged: the close must not wait for it */

	/* One of every other kind, on e. */
	struct ibv_srq_init_attr sa;
	memset(&sa, 0, sizeof(sa));
	sa.attr.max_wr = 4;
	sa.attr.max_sge = 1;
	struct ibv_srq *esrq = ibv_create_srq(e.pd, &sa);
	struct ibv_ah *eah = ah_make(&e, e.pd);
	struct ibv_mw *emw = ibv_alloc_mw(e.pd, IBV_MW_TYPE_2);
	struct ibv_xrcd *ex = xrcd_open(e.ctx);
	CHECK(esrq && eah && emw && ex);
	struct ibv_srq *exsrq = srq_ex(e.ctx, e.pd, ex, ecq);
	struct ibv_qp *extgt = xrc_tgt(e.ctx, ex);
	CHECK(exsrq && extgt);
	struct ibv_td_init_attr ta = {0};
	struct ibv_td *etd = ibv_alloc_td(e.ctx, &ta);
	CHECK(etd);
	struct ibv_parent_domain_init_attr pa;
	memset(&pa, 0, sizeof(pa));
	pa.pd = e.pd;
	pa.td = etd;
	struct ibv_pd *epar = ibv_alloc_parent_domain(e.ctx, &pa);
	CHECK(epar);
	struct ibv_alloc_dm_attr da = {.length = 4096};
	struct ibv_dm *edm = ibv_alloc_dm(e.ctx, &da);
	CHECK(edm);
	struct ibv_mr *dmmr = ibv_reg_dm_mr(e.pd, edm, 0, 4096,
					    IBV_ACCESS_ZERO_BASED | IBV_ACCESS_LOCAL_WRITE);
	CHECK(dmmr);
	struct svt_qpopt uo = {IBV_QPT_UD, ecq, ecq, NULL, 0, 8, 8, 1, 0};
	struct ibv_qp *euq = svt_qp(&e, &uo);
	union ibv_gid mg;
	memset(&mg, 0, sizeof(mg));
	mg.raw[0] = 0xff;
	mg.raw[15] = 9;
	CHECK_EQ(ibv_attach_mcast(euq, &mg, 0xc009), 0);

	CHECK_EQ(ibv_close_device(e.ctx), 0);

	/* The peer's WRITE to the closed side's memory fails, and the memory
	 * keeps its old bytes. */
	unsigned char before[4096];
	memcpy(before, ebuf, sizeof(before));
	svt_fill(buf, 4096, 6);
	s = svt_sge(mr, 0, 4096);
	CHECK_EQ(svt_post_send1(qa, 4, IBV_WR_RDMA_WRITE, &s, 1, IBV_SEND_SIGNALED,
				(uintptr_t)ebuf, emr->rkey),
		 0);
	struct ibv_wc wc = svt_wait(cq, "write after close");
	if (wc.status == IBV_WC_SUCCESS)
		FAIL("a WRITE to a closed context's MR completed SUCCESS");
	CHECK(!memcmp(before, ebuf, sizeof(before)));

	/* The stale pointers: ENOENT, never a crash or a hang. */
	CHECK_EQ(ibv_destroy_qp(qe), ENOENT);
	CHECK_EQ(ibv_destroy_qp(euq), ENOENT);
	CHECK_EQ(ibv_destroy_qp(extgt), ENOENT);
	CHECK_EQ(ibv_dereg_mr(emr), ENOENT);
	CHECK_EQ(ibv_dereg_mr(dmmr), ENOENT);
	CHECK_EQ(ibv_dealloc_mw(emw), ENOENT);
	CHECK_EQ(ibv_destroy_srq(esrq), ENOENT);
	CHECK_EQ(ibv_destroy_srq(exsrq), ENOENT);
	CHECK_EQ(ibv_destroy_ah(eah), ENOENT);
	CHECK_EQ(ibv_destroy_cq(ecq), ENOENT);
	CHECK_EQ(ibv_dealloc_pd(epar), ENOENT);
	CHECK_EQ(ibv_dealloc_pd(e.pd), ENOENT);
	CHECK_EQ(ibv_close_xrcd(ex), ENOENT);
	CHECK_EQ(ibv_free_dm(edm), ENOENT);
	CHECK_EQ(ibv_dealloc_td(etd), ENOENT);
	struct ibv_send_wr wr, *bad = NULL;
	memset(&wr, 0, sizeof(wr));
	wr.opcode = IBV_WR_SEND;
	CHECK_EQ(ibv_post_send(qe, &wr, &bad), EINVAL);
	/* Nothing new is made on the closed context (EINVAL, where rdma-core's
	 * would be a use after free), and closing it again is EINVAL, not a
	 * second free. */
	errno = 0;
	CHECK(!ibv_alloc_pd(e.ctx) && errno == EINVAL);
	errno = 0;
	CHECK(!ibv_create_cq(e.ctx, 4, NULL, NULL, 0) && errno == EINVAL);
	struct ibv_xrcd_init_attr xa = {.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS,
					.fd = -1, .oflags = O_CREAT};
	errno = 0;
	CHECK(!ibv_open_xrcd(e.ctx, &xa) && errno == EINVAL);
	struct ibv_alloc_dm_attr dma = {.length = 64};
	errno = 0;
	CHECK(!ibv_alloc_dm(e.ctx, &dma) && errno == EINVAL);
	struct ibv_td_init_attr tda = {0};
	errno = 0;
	CHECK(!ibv_alloc_td(e.ctx, &tda) && errno == EINVAL);
	CHECK_EQ(ibv_close_device(e.ctx), EINVAL);
	/* A context closed with nothing on it is freed: a second close is
	 * EINVAL too, without touching its memory. */
	struct ibv_device **list = ibv_get_device_list(NULL);
	CHECK(list && list[0]);
	struct ibv_context *once = ibv_open_device(list[0]);
	CHECK(once);
	ibv_free_device_list(list);
	CHECK_EQ(ibv_close_device(once), 0);
	CHECK_EQ(ibv_close_device(once), EINVAL);
	/* The CQ that used the channel is gone, so the channel can go. */
	ibv_ack_cq_events(ecq, 1);
	CHECK_EQ(ibv_destroy_comp_channel(ch), 0);

	CHECK_EQ(ibv_destroy_qp(qa), 0);
	CHECK_EQ(ibv_destroy_cq(cq), 0);
	CHECK_EQ(ibv_dereg_mr(mr), 0);
	free(buf);
	free(ebuf);
}

static void *no_op(void *arg)
{
	return arg;
}

/* A fork right after the verb that started one of the library's own
 * threads: a SEND that finds no receive (RNR) hands its QP to the progress
 * thread, which that post starts, and the application forks at once.  The
 * child starts a thread of its own and exits.  Before the library waited
 * for each of its threads to run its code (thread_start.h), a child could
 * inherit a lock the new thread's start held (ASan's allocator's) and hang
 * in its first pthread_create; the service thread did, in 7 runs of 200.
 * Each round is a fresh process, so that its post starts the thread; every
 * process of it has an alarm, so a hang fails the round, never the suite. */
static void scenario_fork(struct svt_dev *d)
{
	(void)d;
	for (int round = 0; round < 20; round++) {
		pid_t w = fork();
		CHECK(w >= 0);
		if (w == 0) {
			alarm(30);
			struct svt_dev e;
			svt_open(&e, "loop0");
			struct ibv_cq *cq = ibv_create_cq(e.ctx, 16, NULL, NULL, 0);
			CHECK(cq);
			struct pair p;
			pair_up(&p, &e, cq);
			struct ibv_sge s = svt_sge(p.mr, 0, 64);
			svt_fill(p.mr->addr, 64, (unsigned)round);
			CHECK_EQ(svt_post_send1(p.a, 1, IBV_WR_SEND, &s, 1, IBV_SEND_SIGNALED, 0, 0), 0);
			pid_t c = fork();
			CHECK(c >= 0);
			if (c == 0) {
				alarm(10);
				pthread_t t;
				if (pthread_create(&t, NULL, no_op, NULL) || pthread_join(t, NULL))
					_exit(3);
				_exit(0);
			}
			int st = 0;
			CHECK_EQ(waitpid(c, &st, 0), c);
			if (!WIFEXITED(st) || WEXITSTATUS(st))
				FAIL("round %d: the child forked after the post ended with status %#x",
				     round, st);
			/* The parent's thread works: the receive posted now takes
			 * the SEND waiting on it, bytes intact. */
			struct ibv_sge r = svt_sge(p.mr, 4096, 64);
			svt_post_recv1(p.b, 2, &r, 1);
			for (int n = 0; n < 2; n++) {
				struct ibv_wc wc = svt_wait(cq, "send after rnr");
				CHECK_WC(wc, IBV_WC_SUCCESS);
			}
			unsigned char *buf = p.mr->addr;
			CHECK(!memcmp(buf, buf + 4096, 64));
			pair_down(&p);
			CHECK_EQ(ibv_destroy_cq(cq), 0);
			_exit(0);
		}
		int st = 0;
		CHECK_EQ(waitpid(w, &st, 0), w);
		if (!WIFEXITED(st) || WEXITSTATUS(st))
			FAIL("round %d ended with status %#x", round, st);
	}
}

/* A forked child that closes the context it inherited (ibv_close_device)
 * closes its own reference to a device file the parent still has open:
 * with the kernel nothing is destroyed.  Before, the child's close
 * destroyed every object of the context in the registry, the parent's QPs
 * went to RESET and its posts failed EINVAL.  Round 0: the child closes it
 * and exits; round 1: the child first opens a context of its own (its own
 * lease), closes the inherited one, uses its own with traffic, and closes
 * it; round 2: after the close the child modifies, resizes, re-registers,
 * registers on and destroys the inherited objects, which answers EBADF (a
 * command on a closed device file) and changes nothing.  After each, the parent's pair is still in RTS and its traffic
 * lands byte for byte, and its memory and CQ still work. */
static void scenario_forkclose(struct svt_dev *d)
{
	struct ibv_cq *cq = ibv_create_cq(d->ctx, 16, NULL, NULL, 0);
	CHECK(cq);
	struct pair p;
	pair_up(&p, d, cq);
	pair_traffic(&p, 11);
	for (int round = 0; round < 3; round++) {
		fflush(stdout);
		pid_t c = fork();
		CHECK(c >= 0);
		if (c == 0) {
			alarm(30);
			struct svt_dev own = {0};
			if (round == 1)
				svt_open(&own, "loop0");
			if (ibv_close_device(d->ctx))
				_exit(3);
			if (round == 2) {
				struct ibv_qp_attr e = {.qp_state = IBV_QPS_ERR};
				char page[64];
				errno = 0;
				struct ibv_modify_cq_attr mc = {
					.attr_mask = IBV_CQ_ATTR_MODERATE,
					.moderate = {.cq_count = 8, .cq_period = 0}};
				if (ibv_modify_qp(p.a, &e, IBV_QP_STATE) != EBADF ||
				    ibv_resize_cq(cq, 64) != EBADF || ibv_modify_cq(cq, &mc) != EBADF ||
				    ibv_alloc_null_mr(d->pd) || errno != EBADF ||
				    ibv_create_cq(d->ctx, 4, NULL, NULL, 0) || errno != EBADF ||
				    ibv_rereg_mr(p.mr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0,
						 IBV_ACCESS_LOCAL_WRITE) != IBV_REREG_MR_ERR_CMD ||
				    ibv_reg_mr(d->pd, page, sizeof(page), 0) || errno != EBADF)
					_exit(7);
				if (ibv_destroy_qp(p.a) != EBADF || ibv_destroy_qp(p.b) != EBADF ||
				    ibv_dereg_mr(p.mr) != EBADF || ibv_destroy_cq(cq) != EBADF ||
				    ibv_dealloc_pd(d->pd) != EBADF)
					_exit(6);
			}
			if (round == 1) {
				struct ibv_cq *oc = ibv_create_cq(own.ctx, 16, NULL, NULL, 0);
				if (!oc)
					_exit(4);
				struct pair q;
				pair_up(&q, &own, oc);
				pair_traffic(&q, 99);
				pair_down(&q);
				if (ibv_destroy_cq(oc) || ibv_dealloc_pd(own.pd) ||
				    ibv_close_device(own.ctx))
					_exit(5);
			}
			_exit(0);
		}
		int st = 0;
		CHECK_EQ(waitpid(c, &st, 0), c);
		if (!WIFEXITED(st) || WEXITSTATUS(st))
			FAIL("round %d: the child ended with status %#x", round, st);
		if (svt_state(p.a) != IBV_QPS_RTS || svt_state(p.b) != IBV_QPS_RTS)
			FAIL("round %d: after the child closed its inherited context the parent's "
			     "QPs are in states %d and %d",
			     round, svt_state(p.a), svt_state(p.b));
		pair_traffic(&p, 12 + (unsigned)round);
	}
	pair_down(&p);
	CHECK_EQ(ibv_destroy_cq(cq), 0);
}

/* A CQ no QP uses, destroyed while other threads poll it (ibv_poll_cq,
 * and an extended CQ's start_poll) and arm it: the destroy succeeds, the
 * others get errors from then on, never a fault (the destroy used to land
 * between the poller's look at the CQ and its lock, which then read the
 * unmapped ring). */
static struct {
	struct ibv_cq *cq;
	struct ibv_cq_ex *cqx;
	_Atomic int stop;
	_Atomic long calls, errors;
} g_polled;

static void *polled_poller(void *arg)
{
	int kind = (int)(intptr_t)arg;
	while (!atomic_load(&g_polled.stop)) {
		int bad;
		if (kind == 0) {
			struct ibv_wc wc[4];
			bad = ibv_poll_cq(g_polled.cq, 4, wc) < 0;
		} else if (kind == 1) {
			struct ibv_poll_cq_attr pa = {0};
			int e = ibv_start_poll(g_polled.cqx, &pa);
			if (!e)
				ibv_end_poll(g_polled.cqx);
			bad = e && e != ENOENT;
		} else {
			bad = ibv_req_notify_cq(g_polled.cq, 0) != 0;
		}
		atomic_fetch_add(&g_polled.calls, 1);
		if (bad)
			atomic_fetch_add(&g_polled.errors, 1);
	}
	return NULL;
}

static void scenario_polled(struct svt_dev *d)
{
	struct ibv_comp_channel *ch = ibv_create_comp_channel(d->ctx);
	CHECK(ch);
	for (int round = 0; round < 100; round++) {
		struct ibv_cq_init_attr_ex ca = {.cqe = 16, .channel = ch,
						 .wc_flags = IBV_WC_STANDARD_FLAGS};
		struct ibv_cq_ex *cqx = ibv_create_cq_ex(d->ctx, &ca);
		CHECK(cqx);
		g_polled.cqx = cqx;
		g_polled.cq = ibv_cq_ex_to_cq(cqx);
		atomic_store(&g_polled.stop, 0);
		atomic_store(&g_polled.calls, 0);
		atomic_store(&g_polled.errors, 0);
		pthread_t t[3];
		for (int i = 0; i < 3; i++)
			CHECK_EQ(pthread_create(&t[i], NULL, polled_poller, (void *)(intptr_t)i), 0);
		while (atomic_load(&g_polled.calls) < 30)
			sched_yield();
		CHECK_EQ(ibv_destroy_cq(g_polled.cq), 0);
		long seen = atomic_load(&g_polled.calls);
		while (atomic_load(&g_polled.calls) < seen + 30)
			sched_yield();
		atomic_store(&g_polled.stop, 1);
		for (int i = 0; i < 3; i++)
			pthread_join(t[i], NULL);
		if (!atomic_load(&g_polled.errors))
			FAIL("round %d: no error from a destroyed CQ's verbs", round);
	}
	CHECK_EQ(ibv_destroy_comp_channel(ch), 0);
}

/* scenario_posting: a thread posting to a QP while another destroys it. */
static struct {
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	int recv;
	_Atomic int stop;
	_Atomic long posted, refused;
} g_post;

static void *post_until_stopped(void *arg)
{
	(void)arg;
	char *buf = g_post.mr->addr;
	while (!atomic_load(&g_post.stop)) {
		struct ibv_sge s = {(uintptr_t)buf, 64, g_post.mr->lkey};
		int e;
		if (g_post.recv) {
			struct ibv_recv_wr wr = {.wr_id = 1, .sg_list = &s, .num_sge = 1}, *bad;
			e = ibv_post_recv(g_post.qp, &wr, &bad);
		} else {
			struct ibv_send_wr wr = {.wr_id = 1, .sg_list = &s, .num_sge = 1,
						 .opcode = IBV_WR_RDMA_WRITE}, *bad;
			wr.wr.rdma.remote_addr = (uintptr_t)buf + 4096;
			wr.wr.rdma.rkey = g_post.mr->rkey;
			e = ibv_post_send(g_post.qp, &wr, &bad);
		}
		if (!e)
			atomic_fetch_add(&g_post.posted, 1);
		else if (e == EINVAL)
			atomic_fetch_add(&g_post.refused, 1); // Destroyed (or being destroyed)
		else if (e != ENOMEM) // ENOMEM: the queue is full
			FAIL("a post racing ibv_destroy_qp returned %d (%s)", e, strerror(e));
	}
	return NULL;
}

/* Another thread posts sends (to a QP whose peer is gone, so each waits in
 * the backlog the progress thread retries) or receives (to a QP in ERR,
 * flushed at once, or in RTS) while ibv_destroy_qp runs: each post is taken
 * or refused with EINVAL (ENOMEM for a full queue), never a crash.  The
 * progress thread ran a destroyed QP's backlog (the post listed it again
 * after the destroy took it off), and a receive wrote into the unmapped
 * ring (a helper's probe: SIGSEGV in 5 of 5 runs each). */
static void scenario_posting(struct svt_dev *d)
{
	struct ibv_cq *cq = ibv_create_cq(d->ctx, 4096, NULL, NULL, 0);
	CHECK(cq);
	g_post.mr = svt_mr(d, 8192, SVT_ALL_ACCESS);
	for (int round = 0; round < 120; round++) {
		g_post.recv = round % 3 != 0;
		struct svt_qpopt o = {.type = IBV_QPT_RC, .scq = cq, .rcq = cq, .max_send_wr = 64,
				      .max_recv_wr = 64, .max_sge = 1};
		struct svt_conn c = {.access = SVT_ALL_ACCESS, .min_rnr_timer = 1, .timeout = 4,
				     .retry_cnt = 2, .rnr_retry = 7};
		struct ibv_qp *a = svt_qp(d, &o), *b = svt_qp(d, &o);
		svt_connect(a, b->qp_num, d->lid, &c);
		svt_connect(b, a->qp_num, d->lid, &c);
		CHECK_EQ(ibv_destroy_qp(b), 0);
		if (round % 3 == 2) {
			struct ibv_qp_attr e = {.qp_state = IBV_QPS_ERR};
			CHECK_EQ(ibv_modify_qp(a, &e, IBV_QP_STATE), 0);
		}
		g_post.qp = a;
		atomic_store(&g_post.stop, 0);
		pthread_t t;
		CHECK_EQ(pthread_create(&t, NULL, post_until_stopped, NULL), 0);
		usleep(100 + (round * 37) % 500);
		CHECK_EQ(ibv_destroy_qp(a), 0);
		usleep(200);
		atomic_store(&g_post.stop, 1);
		pthread_join(t, NULL);
		struct ibv_wc wc[64];
		while (ibv_poll_cq(cq, 64, wc) > 0)
			;
	}
	if (!atomic_load(&g_post.posted) || !atomic_load(&g_post.refused))
		FAIL("posts taken %ld, refused %ld: the race was not run", atomic_load(&g_post.posted),
		     atomic_load(&g_post.refused));
	void *buf = g_post.mr->addr;
	CHECK_EQ(ibv_dereg_mr(g_post.mr), 0);
	free(buf);
	usleep(10000); /* The progress thread's next pass meets nothing */
	CHECK_EQ(ibv_destroy_cq(cq), 0);
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: %s pd|cq|channel|xrcd|unacked|async|stale|foreign|mcast|close|fork|forkclose|polled|posting\n", argv[0]);
		return 2;
	}
	svt_watchdog(60);
	struct svt_dev d;
	svt_open(&d, "loop0");
	const char *s = argv[1];
	if (!strcmp(s, "pd"))
		scenario_pd(&d);
	else if (!strcmp(s, "cq"))
		scenario_cq(&d);
	else if (!strcmp(s, "channel"))
		scenario_channel(&d);
	else if (!strcmp(s, "xrcd"))
		scenario_xrcd(&d);
	else if (!strcmp(s, "unacked"))
		scenario_unacked(&d);
	else if (!strcmp(s, "async"))
		scenario_async(&d);
	else if (!strcmp(s, "stale"))
		scenario_stale(&d);
	else if (!strcmp(s, "foreign"))
		scenario_foreign(&d);
	else if (!strcmp(s, "mcast"))
		scenario_mcast(&d);
	else if (!strcmp(s, "close"))
		scenario_close(&d);
	else if (!strcmp(s, "fork"))
		scenario_fork(&d);
	else if (!strcmp(s, "forkclose"))
		scenario_forkclose(&d);
	else if (!strcmp(s, "polled"))
		scenario_polled(&d);
	else if (!strcmp(s, "posting"))
		scenario_posting(&d);
	else
		FAIL("unknown scenario %s", s);
	CHECK_EQ(ibv_dealloc_pd(d.pd), 0);
	CHECK_EQ(ibv_close_device(d.ctx), 0);
	printf("OK %s\n", s);
	return 0;
}
