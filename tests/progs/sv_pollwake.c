// SPDX-License-Identifier: MIT
// sv_pollwake: an ibv_poll_cq that slept returns the completion that came
// during its sleep (pyverbs-tests/test_multicq.py).
//
// An idle poller sleeps inside ibv_poll_cq (futex, at most 200 us) after
// 100 us of empty polls; a completion wakes it.  The poll that slept used
// to answer "empty" all the same, describing the CQ as it was before the
// sleep.  A caller that reads its connection events after an empty poll
// then sees an event that came after the completion as if it came first:
// libfabric's rxm, polling its MSG CQ and then its EQ, closed the
// connection on the peer's DISCONNECTED with the peer's last message still
// in the CQ, and dropped it (fi_pingpong over verbs;ofi_rxm hung in its
// finalize, about 1 run in 6 under ASan).
//
// One process, two threads, RC QPs s -> r on loop0.  The poller polls r's
// receive CQ; the sender waits 2 ms (the poller is asleep by then), posts
// a SEND (its receive completion is in the CQ when ibv_post_send returns)
// and then raises `posted`.  An empty poll after which `posted` is already
// up is "stale": the completion was there before the poll returned, but
// for the few instructions between the poll's last look and the load of
// `posted`.  Fails when more than an eighth of the rounds saw a stale
// empty poll; before the fix most rounds did.
// usage: sv_pollwake [ROUNDS]   (default 200)
#include "svt.h"

#include <pthread.h>
#include <stdatomic.h>

#define MSG 64

static struct ibv_cq *cq_r, *cq_s;
static struct ibv_qp *qp_s, *qp_r;
static struct ibv_mr *mr_s, *mr_r;
static _Atomic int posted;   // messages whose ibv_post_send has returned
static _Atomic int received; // messages the poller has taken
static int rounds = 200;
static int stale_rounds;

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void *poller(void *arg)
{
	(void)arg;
	struct ibv_sge sge = svt_sge(mr_r, 0, MSG);
	for (int i = 0; i < rounds; i++) {
		struct ibv_wc wc;
		uint64_t deadline = now_ns() + 10000000000ull;
		int n = 0, stale = 0;
		while (n == 0) {
			n = ibv_poll_cq(cq_r, 1, &wc);
			if (n == 0 && atomic_load(&posted) > i)
				stale = 1;
			if (n == 0 && now_ns() > deadline)
				FAIL("message %d not received in 10 s", i);
		}
		CHECK(n == 1);
		CHECK_WC(wc, IBV_WC_SUCCESS);
		CHECK_EQ(wc.byte_len, MSG);
		uint32_t seq;
		memcpy(&seq, mr_r->addr, 4);
		CHECK_EQ(seq, (uint32_t)i);
		stale_rounds += stale;
		memset(mr_r->addr, 0, MSG);
		svt_post_recv1(qp_r, (uint64_t)i + 1, &sge, 1);
		atomic_store(&received, i + 1);
	}
	return NULL;
}

int main(int argc, char **argv)
{
	if (argc > 1)
		rounds = atoi(argv[1]);
	if (rounds < 10 || rounds > 100000)
		FAIL("usage: sv_pollwake [ROUNDS (10..100000)]");
	svt_watchdog(120);
	struct svt_dev d;
	svt_open(&d, "loop0");
	cq_r = ibv_create_cq(d.ctx, 16, NULL, NULL, 0);
	cq_s = ibv_create_cq(d.ctx, 16, NULL, NULL, 0);
	CHECK(cq_r && cq_s);
	mr_s = svt_mr(&d, 4096, IBV_ACCESS_LOCAL_WRITE);
	mr_r = svt_mr(&d, 4096, IBV_ACCESS_LOCAL_WRITE);
	struct svt_qpopt o = {.type = IBV_QPT_RC, .scq = cq_s, .rcq = cq_s, .sq_sig_all = 1};
	qp_s = svt_qp(&d, &o);
	o.rcq = cq_r;
	qp_r = svt_qp(&d, &o);
	struct svt_conn c = {.access = IBV_ACCESS_LOCAL_WRITE, .min_rnr_timer = 1, .timeout = 14,
			     .retry_cnt = 7, .rnr_retry = 7};
	svt_connect(qp_s, qp_r->qp_num, d.lid, &c);
	svt_connect(qp_r, qp_s->qp_num, d.lid, &c);
	struct ibv_sge rs = svt_sge(mr_r, 0, MSG);
	svt_post_recv1(qp_r, 0, &rs, 1);

	pthread_t th;
	CHECK(pthread_create(&th, NULL, poller, NULL) == 0);
	struct ibv_sge ss = svt_sge(mr_s, 0, MSG);
	for (int i = 0; i < rounds; i++) {
		struct timespec gap = {0, 2000000};
		nanosleep(&gap, NULL);
		uint32_t seq = (uint32_t)i;
		memcpy(mr_s->addr, &seq, 4);
		CHECK(svt_post_send1(qp_s, (uint64_t)i, IBV_WR_SEND, &ss, 1, IBV_SEND_SIGNALED, 0, 0) ==
		      0);
		atomic_store(&posted, i + 1);
		struct ibv_wc wc = svt_wait(cq_s, "send completion");
		CHECK_WC(wc, IBV_WC_SUCCESS);
		uint64_t deadline = now_ns() + 10000000000ull;
		while (atomic_load(&received) <= i)
			if (now_ns() > deadline)
				FAIL("poller took no message %d in 10 s", i);
			else
				sched_yield();
	}
	CHECK(pthread_join(th, NULL) == 0);
	printf("sv_pollwake: %d messages checked, %d rounds with an empty poll after the post\n",
	       rounds, stale_rounds);
	if (stale_rounds > rounds / 8)
		FAIL("ibv_poll_cq answered empty with a completion in the CQ in %d of %d rounds",
		     stale_rounds, rounds);
	printf("sv_pollwake: PASS\n");
	return 0;
}
