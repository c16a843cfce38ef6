// SPDX-License-Identifier: MIT
// Completion events of many CQs on one channel, raised by another process
// (issue 9, item 6): every armed CQ that gets a completion yields exactly
// one event, even when the channel's socket queue (net.unix.max_dgram_qlen,
// often 10) is far smaller than the number of events raised at once.
//
//   sv_cq_events owner N    creates one channel, N CQs on it and N UD QPs
//                           (one per CQ), posts a receive on each, arms
//                           each CQ, prints "ready <lid> <qpn>..." and
//                           counts events; after reading "done" on stdin
//                           (the sender finished) it checks that no event
//                           is left, then each CQ's one completion: its
//                           payload names that QP and carries a checksum.
//   sv_cq_events sender N LID QPN...
//                           sends one 64-byte message to each QPN.
// Both print "ok" and exit 0 on success.
#include "svt.h"

#include <poll.h>

#define QKEY 0x11111111u
#define MSG 64
#define GRH 40

static uint32_t checksum(const unsigned char *p, size_t n)
{
	uint32_t h = 2166136261u;
	for (size_t i = 0; i < n; i++)
		h = (h ^ p[i]) * 16777619u;
	return h;
}

// Payload: index (4 bytes), qpn (4 bytes), filler, checksum of the first 60.
static void fill(unsigned char *m, uint32_t i, uint32_t qpn)
{
	memcpy(m, &i, 4);
	memcpy(m + 4, &qpn, 4);
	svt_fill(m + 8, MSG - 12, i);
	uint32_t c = checksum(m, MSG - 4);
	memcpy(m + MSG - 4, &c, 4);
}

static int owner(int n)
{
	struct svt_dev d;
	svt_open(&d, "loop0");
	struct ibv_comp_channel *ch = ibv_create_comp_channel(d.ctx);
	CHECK(ch);
	struct ibv_cq **cqs = calloc(n, sizeof(*cqs));
	struct ibv_qp **qps = calloc(n, sizeof(*qps));
	int *events = calloc(n, sizeof(int));
	CHECK(cqs && qps && events);
	struct ibv_cq *scq = ibv_create_cq(d.ctx, 16, NULL, NULL, 0);
	CHECK(scq);
	struct ibv_mr *mr = svt_mr(&d, (size_t)n * (GRH + MSG), IBV_ACCESS_LOCAL_WRITE);
	for (int i = 0; i < n; i++) {
		cqs[i] = ibv_create_cq(d.ctx, 4, (void *)(intptr_t)i, ch, 0);
		CHECK(cqs[i]);
		struct svt_qpopt o = {.type = IBV_QPT_UD, .scq = scq, .rcq = cqs[i],
				      .max_send_wr = 1, .max_recv_wr = 2, .max_sge = 1};
		qps[i] = svt_qp(&d, &o);
		svt_ud_up(qps[i], QKEY);
		struct ibv_sge s = svt_sge(mr, (size_t)i * (GRH + MSG), GRH + MSG);
		svt_post_recv1(qps[i], i, &s, 1);
		CHECK_EQ(ibv_req_notify_cq(cqs[i], 0), 0);
	}
	printf("ready %u", d.lid);
	for (int i = 0; i < n; i++)
		printf(" %u", qps[i]->qp_num);
	printf("\n");
	fflush(stdout);

	// Count events until every CQ had one.  The channel is non-blocking, so
	// a wake-up that finds nothing (possible by design) never blocks us.
	CHECK(fcntl(ch->fd, F_SETFL, fcntl(ch->fd, F_GETFL) | O_NONBLOCK) == 0);
	int distinct = 0;
	uint64_t end = svt_now_ms() + 20000;
	while (distinct < n) {
		struct pollfd p = {.fd = ch->fd, .events = POLLIN};
		int r = poll(&p, 1, 200);
		CHECK(r >= 0);
		if (svt_now_ms() > end)
			FAIL("%d of %d CQs got their event within 20 s", distinct, n);
		if (r == 0)
			continue;
		struct ibv_cq *cq;
		void *ctx;
		while (ibv_get_cq_event(ch, &cq, &ctx) == 0) {
			int i = (int)(intptr_t)ctx;
			if (i < 0 || i >= n || cq != cqs[i])
				FAIL("event for an unknown CQ %p (context %d)", (void *)cq, i);
			if (events[i]++ == 0)
				distinct++;
			ibv_ack_cq_events(cq, 1);
		}
		if (errno != EAGAIN)
			FAIL("ibv_get_cq_event: %s", strerror(errno));
	}
	// The sender is done: every event it raised has been raised.
	char line[16];
	if (!fgets(line, sizeof(line), stdin) || strncmp(line, "done", 4))
		FAIL("expected 'done' on stdin");
	struct ibv_cq *cq;
	void *ctx;
	if (ibv_get_cq_event(ch, &cq, &ctx) == 0)
		FAIL("an extra event for CQ %d", (int)(intptr_t)ctx);
	CHECK_EQ(errno, EAGAIN);
	for (int i = 0; i < n; i++) {
		if (events[i] != 1)
			FAIL("CQ %d got %d events, expected exactly 1", i, events[i]);
		struct ibv_wc wc = svt_wait(cqs[i], "receive");
		CHECK_WC(wc, IBV_WC_SUCCESS);
		CHECK_EQ(wc.wr_id, i);
		CHECK_EQ(wc.byte_len, GRH + MSG);
		unsigned char *m = (unsigned char *)mr->addr + (size_t)i * (GRH + MSG) + GRH;
		uint32_t idx, qpn, c;
		memcpy(&idx, m, 4);
		memcpy(&qpn, m + 4, 4);
		memcpy(&c, m + MSG - 4, 4);
		if (idx != (uint32_t)i || qpn != qps[i]->qp_num || c != checksum(m, MSG - 4))
			FAIL("CQ %d: payload names message %u for QP %u (checksum %s)", i, idx,
			     qpn, c == checksum(m, MSG - 4) ? "ok" : "bad");
		svt_expect_empty(cqs[i], 0, "second completion");
	}
	for (int i = 0; i < n; i++) {
		CHECK_EQ(ibv_destroy_qp(qps[i]), 0);
		CHECK_EQ(ibv_destroy_cq(cqs[i]), 0);
	}
	CHECK_EQ(ibv_destroy_cq(scq), 0);
	CHECK_EQ(ibv_destroy_comp_channel(ch), 0);
	puts("ok");
	return 0;
}

static int sender(int n, uint16_t lid, char **qpns)
{
	struct svt_dev d;
	svt_open(&d, "loop0");
	struct ibv_cq *cq = ibv_create_cq(d.ctx, 2 * n + 16, NULL, NULL, 0);
	CHECK(cq);
	struct svt_qpopt o = {.type = IBV_QPT_UD, .scq = cq, .rcq = cq,
			      .max_send_wr = (uint32_t)n, .max_recv_wr = 1, .max_sge = 1};
	struct ibv_qp *qp = svt_qp(&d, &o);
	svt_ud_up(qp, QKEY);
	struct ibv_ah_attr aa = {.dlid = lid, .port_num = 1};
	struct ibv_ah *ah = ibv_create_ah(d.pd, &aa);
	CHECK(ah);
	struct ibv_mr *mr = svt_mr(&d, (size_t)n * MSG, IBV_ACCESS_LOCAL_WRITE);
	// All sends go out back to back: the events are raised together.
	for (int i = 0; i < n; i++) {
		uint32_t qpn = (uint32_t)strtoul(qpns[i], NULL, 10);
		unsigned char *m = (unsigned char *)mr->addr + (size_t)i * MSG;
		fill(m, (uint32_t)i, qpn);
		struct ibv_sge s = svt_sge(mr, (size_t)i * MSG, MSG);
		struct ibv_send_wr wr, *bad;
		memset(&wr, 0, sizeof(wr));
		wr.wr_id = i;
		wr.opcode = IBV_WR_SEND;
		wr.sg_list = &s;
		wr.num_sge = 1;
		wr.send_flags = IBV_SEND_SIGNALED;
		wr.wr.ud.ah = ah;
		wr.wr.ud.remote_qpn = qpn;
		wr.wr.ud.remote_qkey = QKEY;
		CHECK_EQ(ibv_post_send(qp, &wr, &bad), 0);
	}
	for (int i = 0; i < n; i++)
		CHECK_WC(svt_wait(cq, "send"), IBV_WC_SUCCESS);
	puts("ok");
	return 0;
}

int main(int argc, char **argv)
{
	svt_watchdog(60);
	if (argc == 3 && !strcmp(argv[1], "owner"))
		return owner(atoi(argv[2]));
	if (argc >= 4 && !strcmp(argv[1], "sender") && argc == 4 + atoi(argv[2]))
		return sender(atoi(argv[2]), (uint16_t)atoi(argv[3]), argv + 4);
	fprintf(stderr, "usage: %s owner N | sender N LID QPN...\n", argv[0]);
	return 2;
}
