// SPDX-License-Identifier: MIT
// sv_multicq: a thread that polls two CQs in turn is woken by a completion
// on either (pyverbs-tests/test_multicq.py).
//
// An idle poller sleeps (futex, at most 200 us at a time) after 100 us of
// empty polls.  UCX, MPI and most event loops poll a receive CQ and a send
// CQ in turn; the library used to sleep on whichever CQ the sleeping poll
// was for, so a completion landing in the other one waited out the sleep:
// UCX's ud_verbs tag_lat paid 120-180 us per message.
//
// One process, two threads, RC QPs s -> r on loop0.  The poller polls r's
// receive CQ B, and in "two CQ" rounds also an empty CQ A after it (so its
// sleeping polls, every 64th empty one, fall on A).  The sender waits 2 ms
// (the poller is asleep by then), stamps the time into a SEND and posts
// it; the poller checks the payload (sequence and pattern) and records the
// delay from post to poll.  Rounds alternate between one CQ and two CQs, so
// machine load hits both alike.  A delay past 120 us is "late": with the
// old sleep, about 40% of two-CQ messages were late (uniform over the
// 200 us sleep) against a few one-CQ ones.  Fails when the two-CQ rounds
// have more late messages than the one-CQ rounds by more than N/8.
// usage: sv_multicq [ROUNDS_PER_MODE]   (default 100)
#include "svt.h"

#include <pthread.h>
#include <stdatomic.h>

#define MSG 64
#define LATE_NS 120000ull

static struct ibv_cq *cq_a, *cq_b, *cq_c;
static struct ibv_qp *qp_s, *qp_r;
static struct ibv_mr *mr_s, *mr_r;
static _Atomic int received;  // messages the poller has taken
static int rounds = 100;
static uint64_t *delay[2];
static int ndelay[2];

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void fill_msg(uint8_t *p, uint32_t seq, uint64_t t)
{
	memcpy(p, &seq, 4);
	memcpy(p + 8, &t, 8);
	for (int i = 16; i < MSG; i++)
		p[i] = (uint8_t)(seq * 31 + i);
}

static void *poller(void *arg)
{
	(void)arg;
	struct ibv_sge sge = svt_sge(mr_r, 0, MSG);
	for (int i = 0; i < 2 * rounds; i++) {
		int m = i & 1; // 1: B then A; 0: B only
		struct ibv_wc wc;
		uint64_t deadline = now_ns() + 10000000000ull;
		int n = 0;
		while (n == 0) {
			n = ibv_poll_cq(cq_b, 1, &wc);
			if (n == 0 && m) {
				struct ibv_wc other;
				int k = ibv_poll_cq(cq_a, 1, &other);
				if (k != 0)
					FAIL("CQ A, which nothing completes into, returned %d", k);
			}
			if (n == 0 && now_ns() > deadline)
				FAIL("message %d not received in 10 s", i);
		}
		uint64_t t = now_ns();
		CHECK(n == 1);
		CHECK_WC(wc, IBV_WC_SUCCESS);
		CHECK_EQ(wc.byte_len, MSG);
		const uint8_t *p = mr_r->addr;
		uint32_t seq;
		uint64_t sent;
		memcpy(&seq, p, 4);
		memcpy(&sent, p + 8, 8);
		CHECK_EQ(seq, (uint32_t)i);
		for (int j = 16; j < MSG; j++)
			if (p[j] != (uint8_t)(seq * 31 + j))
				FAIL("message %u byte %d: 0x%02x", seq, j, p[j]);
		delay[m][ndelay[m]++] = t - sent;
		memset(mr_r->addr, 0, MSG);
		svt_post_recv1(qp_r, (uint64_t)i + 1, &sge, 1);
		atomic_store(&received, i + 1);
	}
	return NULL;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
	if (argc > 1)
		rounds = atoi(argv[1]);
	if (rounds < 10 || rounds > 100000)
		FAIL("usage: sv_multicq [ROUNDS_PER_MODE (10..100000)]");
	svt_watchdog(120);
	struct svt_dev d;
	svt_open(&d, "loop0");
	cq_a = ibv_create_cq(d.ctx, 16, NULL, NULL, 0);
	cq_b = ibv_create_cq(d.ctx, 16, NULL, NULL, 0);
	cq_c = ibv_create_cq(d.ctx, 16, NULL, NULL, 0);
	CHECK(cq_a && cq_b && cq_c);
	mr_s = svt_mr(&d, 4096, IBV_ACCESS_LOCAL_WRITE);
	mr_r = svt_mr(&d, 4096, IBV_ACCESS_LOCAL_WRITE);
	struct svt_qpopt o = {.type = IBV_QPT_RC, .scq = cq_c, .rcq = cq_c, .sq_sig_all = 1};
	qp_s = svt_qp(&d, &o);
	o.rcq = cq_b;
	qp_r = svt_qp(&d, &o);
	struct svt_conn c = {.access = IBV_ACCESS_LOCAL_WRITE, .min_rnr_timer = 1, .timeout = 14,
			     .retry_cnt = 7, .rnr_retry = 7};
	svt_connect(qp_s, qp_r->qp_num, d.lid, &c);
	svt_connect(qp_r, qp_s->qp_num, d.lid, &c);
	struct ibv_sge rs = svt_sge(mr_r, 0, MSG);
	svt_post_recv1(qp_r, 0, &rs, 1);
	for (int m = 0; m < 2; m++)
		CHECK(delay[m] = calloc((size_t)rounds, sizeof(uint64_t)));

	pthread_t th;
	CHECK(pthread_create(&th, NULL, poller, NULL) == 0);
	struct ibv_sge ss = svt_sge(mr_s, 0, MSG);
	for (int i = 0; i < 2 * rounds; i++) {
		// Message i is polled in mode i & 1; 2 ms of nothing first, so
		// that the poller sleeps.
		struct timespec gap = {0, 2000000};
		nanosleep(&gap, NULL);
		fill_msg(mr_s->addr, (uint32_t)i, now_ns());
		CHECK(svt_post_send1(qp_s, (uint64_t)i, IBV_WR_SEND, &ss, 1, IBV_SEND_SIGNALED, 0, 0) ==
		      0);
		struct ibv_wc wc = svt_wait(cq_c, "send completion");
		CHECK_WC(wc, IBV_WC_SUCCESS);
		uint64_t deadline = now_ns() + 10000000000ull;
		while (atomic_load(&received) <= i)
			if (now_ns() > deadline)
				FAIL("poller took no message %d in 10 s", i);
			else
				sched_yield();
	}
	CHECK(pthread_join(th, NULL) == 0);

	int late[2] = {0, 0};
	uint64_t med[2];
	for (int m = 0; m < 2; m++) {
		CHECK_EQ(ndelay[m], rounds);
		for (int i = 0; i < rounds; i++)
			late[m] += delay[m][i] > LATE_NS;
		qsort(delay[m], (size_t)rounds, sizeof(uint64_t), cmp_u64);
		med[m] = delay[m][rounds / 2];
	}
	printf("sv_multicq: one CQ: median %.1f us, late (>%llu us) %d of %d\n", med[0] / 1e3,
	       LATE_NS / 1000, late[0], rounds);
	printf("sv_multicq: two CQs: median %.1f us, late (>%llu us) %d of %d\n", med[1] / 1e3,
	       LATE_NS / 1000, late[1], rounds);
	printf("sv_multicq: %d messages checked\n", 2 * rounds);
	if (late[1] > late[0] + rounds / 8)
		FAIL("a poller of two CQs slept through completions: %d late against %d with one CQ",
		     late[1], late[0]);
	printf("sv_multicq: PASS\n");
	return 0;
}
