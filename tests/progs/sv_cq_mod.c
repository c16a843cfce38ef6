// SPDX-License-Identifier: MIT
// CQ moderation (ibv_modify_cq, by count): with cq_count = 4, an armed CQ's
// completion channel stays quiet for three completions and signals on the
// fourth; a moderation period is refused (the device advertises none), and
// cq_mod_caps says so.  The count survives ibv_resize_cq: three completions,
// a resize, and the fourth signals.  Prints "ok" and exits 0 on success.
#include "svt.h"

#include <poll.h>

static int readable(int fd, int ms)
{
	struct pollfd p = {.fd = fd, .events = POLLIN};
	return poll(&p, 1, ms) == 1;
}

int main(void)
{
	svt_watchdog(30);
	struct svt_dev d;
	svt_open(&d, "loop0");

	struct ibv_device_attr_ex ax;
	CHECK(ibv_query_device_ex(d.ctx, NULL, &ax) == 0);
	CHECK(ax.cq_mod_caps.max_cq_count >= 4);
	CHECK_EQ(ax.cq_mod_caps.max_cq_period, 0);

	struct ibv_comp_channel *ch = ibv_create_comp_channel(d.ctx);
	CHECK(ch);
	struct ibv_cq *rcq = ibv_create_cq(d.ctx, 64, NULL, ch, 0);
	struct ibv_cq *scq = ibv_create_cq(d.ctx, 64, NULL, NULL, 0);
	CHECK(rcq && scq);

	struct ibv_modify_cq_attr m = {.attr_mask = IBV_CQ_ATTR_MODERATE,
				       .moderate = {.cq_count = 4, .cq_period = 10}};
	CHECK_EQ(ibv_modify_cq(rcq, &m), EINVAL);
	m.moderate.cq_period = 0;
	CHECK_EQ(ibv_modify_cq(rcq, &m), 0);

	struct svt_qpopt o = {.type = IBV_QPT_RC, .scq = scq, .rcq = rcq};
	struct ibv_qp *a = svt_qp(&d, &o), *b = svt_qp(&d, &o);
	struct svt_conn c = {.access = SVT_ALL_ACCESS, .min_rnr_timer = 1, .timeout = 14,
			     .retry_cnt = 7, .rnr_retry = 7};
	svt_connect(a, b->qp_num, d.lid, &c);
	svt_connect(b, a->qp_num, d.lid, &c);
	struct ibv_mr *mr = svt_mr(&d, 4096, SVT_ALL_ACCESS);
	for (int i = 0; i < 16; i++) {
		struct ibv_sge s = svt_sge(mr, 64 * (i % 8), 64);
		svt_post_recv1(b, i, &s, 1);
	}

	CHECK_EQ(ibv_req_notify_cq(rcq, 0), 0);
	for (int i = 0; i < 4; i++) {
		struct ibv_sge s = svt_sge(mr, 1024 + 64 * i, 64);
		CHECK_EQ(svt_post_send1(a, 100 + i, IBV_WR_SEND, &s, 1, IBV_SEND_SIGNALED, 0, 0), 0);
		if (i < 3 && readable(ch->fd, 100))
			FAIL("event after %d completions, moderation asked for 4", i + 1);
	}
	if (!readable(ch->fd, 2000))
		FAIL("no event after the 4th completion");
	struct ibv_cq *ecq;
	void *ectx;
	CHECK_EQ(ibv_get_cq_event(ch, &ecq, &ectx), 0);
	CHECK(ecq == rcq);
	ibv_ack_cq_events(rcq, 1);
	struct ibv_wc wc;
	for (int i = 0; i < 4; i++)
		CHECK_WC(svt_wait(rcq, "recv"), IBV_WC_SUCCESS);
	for (int i = 0; i < 4; i++) {
		wc = svt_wait(scq, "send");
		CHECK_WC(wc, IBV_WC_SUCCESS);
	}

	/* Three completions counted, the CQ resized, the fourth signals (the
	 * count used to start again on the new ring: eight were needed). */
	CHECK_EQ(ibv_req_notify_cq(rcq, 0), 0);
	for (int i = 0; i < 4; i++) {
		if (i == 3)
			CHECK_EQ(ibv_resize_cq(rcq, 256), 0);
		struct ibv_sge s = svt_sge(mr, 1024 + 64 * i, 64);
		CHECK_EQ(svt_post_send1(a, 200 + i, IBV_WR_SEND, &s, 1, IBV_SEND_SIGNALED, 0, 0), 0);
		CHECK_WC(svt_wait(scq, "send"), IBV_WC_SUCCESS);
		if (i < 3 && readable(ch->fd, 100))
			FAIL("event after %d completions (resize), moderation asked for 4", i + 1);
	}
	if (!readable(ch->fd, 2000))
		FAIL("no event after the 4th completion, with a resize after the 3rd");
	CHECK_EQ(ibv_get_cq_event(ch, &ecq, &ectx), 0);
	CHECK(ecq == rcq);
	ibv_ack_cq_events(rcq, 1);
	for (int i = 0; i < 4; i++)
		CHECK_WC(svt_wait(rcq, "recv"), IBV_WC_SUCCESS);
	puts("ok");
	return 0;
}
