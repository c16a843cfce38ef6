/* SPDX-License-Identifier: MIT */
/*
 * The engine's two modes (docs/agent.md, "The polling engine").
 *
 * Test (`sv_agent_poll poll` under SOFTVERBS_ENGINE=poll, and
 * `sv_agent_poll futex` as its control): an agent posts WRITEs with the
 * inline helpers, each after an idle gap of 1 ms (twenty times the
 * engine's spin), and polls each completion from its CQ ring.  A watcher
 * thread reads the ring's `sleeping` word all along, and the agent reads
 * it before each doorbell.  In poll mode every WRITE must complete and
 * `sleeping` must never be seen set, so softverbs_dv_sq_post never made
 * its FUTEX_WAKE call; in futex mode (the control) it must be seen set,
 * which shows the watcher can see it.
 *
 * Measurement (`sv_agent_poll bench`, run it in each mode): the CPU the
 * process burns while one agent QP sits idle, the latency from the
 * doorbell to the completion in the CQ ring (after 1 ms idle, and back to
 * back; with an agent that spins on its CQ ring and one that yields
 * between looks), and the WRITE rate of a peer process (a child posting
 * with ibv_post_send to itself) without and with this process's idle agent
 * QP, in turns.  Under `taskset -c 0` the peer, the agent and the engine
 * share one core.  bench/agent_engine.sh runs it all.
 */
#include "../progs/svt.h"

#include <infiniband/softverbs_dv.h>

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/wait.h>

static const struct svt_conn conn = {
	.access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE,
	.min_rnr_timer = 1,
	.timeout = 14,
	.retry_cnt = 7,
	.rnr_retry = 7,
};

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static void sleep_ns(long ns)
{
	struct timespec ts = {ns / 1000000000L, ns % 1000000000L};
	while (nanosleep(&ts, &ts))
		;
}

struct agent {
	struct svt_dev d;
	struct ibv_cq *cq;
	struct ibv_qp *qp, *peer;
	struct ibv_mr *dst;
	struct softverbs_dv_sq sq;
	struct softverbs_dv_cq cqr;
	uint64_t posted;
};

static void agent_open(struct agent *a)
{
	svt_open(&a->d, "loop0");
	a->cq = ibv_create_cq(a->d.ctx, 64, NULL, NULL, 0);
	CHECK(a->cq);
	struct svt_qpopt o = {.type = IBV_QPT_RC, .scq = a->cq, .rcq = a->cq, .max_send_wr = 16,
			      .max_recv_wr = 1, .max_sge = 1, .max_inline = 64};
	a->qp = svt_qp(&a->d, &o);
	a->peer = svt_qp(&a->d, &o);
	svt_connect(a->qp, a->peer->qp_num, a->d.lid, &conn);
	svt_connect(a->peer, a->qp->qp_num, a->d.lid, &conn);
	a->dst = svt_mr(&a->d, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	CHECK(softverbs_dv_qp_agent(a->qp, 1, &a->sq) == 0);
	CHECK(softverbs_dv_cq_agent(a->cq, 1, &a->cqr) == 0);
}

static void agent_close(struct agent *a)
{
	CHECK(softverbs_dv_cq_agent(a->cq, 0, NULL) == 0);
	CHECK(softverbs_dv_qp_agent(a->qp, 0, NULL) == 0);
	CHECK(ibv_destroy_qp(a->qp) == 0 && ibv_destroy_qp(a->peer) == 0);
	CHECK(ibv_destroy_cq(a->cq) == 0);
}

static int sleeping(struct agent *a)
{
	return __atomic_load_n(a->sq.sleeping, __ATOMIC_SEQ_CST) != 0;
}

/* Rings for one inline WRITE; returns the ns from the doorbell to its
 * completion in the CQ ring.  *saw_sleeping: the word was set at the
 * doorbell. */
static int yield_while_polling; /* bench: the agent gives its core away between looks */

static uint64_t one_write(struct agent *a, int *saw_sleeping)
{
	uint64_t v = ++a->posted;
	struct softverbs_wqe *w = softverbs_dv_sq_next(&a->sq);
	CHECK(w);
	softverbs_dv_wqe_ctrl(&a->sq, w, IBV_WR_RDMA_WRITE, IBV_SEND_SIGNALED, v);
	softverbs_dv_wqe_rdma(w, (uintptr_t)a->dst->addr + (v % 512) * 8, a->dst->rkey);
	CHECK(softverbs_dv_wqe_inline(&a->sq, w, &v, sizeof(v)) == 0);
	*saw_sleeping |= sleeping(a);
	uint64_t t0 = now_ns();
	softverbs_dv_sq_post(&a->sq, 1);
	struct softverbs_cqe e;
	uint64_t spins = 0;
	while (!softverbs_dv_cq_poll(&a->cqr, &e)) {
		*saw_sleeping |= sleeping(a);
		if (yield_while_polling)
			sched_yield();
		if (++spins % 1024 == 0 && now_ns() - t0 > 5000000000ULL)
			FAIL("no completion for WRITE %llu within 5 s", (unsigned long long)v);
	}
	uint64_t t = now_ns() - t0;
	CHECK_EQ(e.wr_id, v);
	CHECK_EQ(e.status, IBV_WC_SUCCESS);
	softverbs_dv_sq_retire(&a->sq, &e);
	CHECK_EQ(((uint64_t *)a->dst->addr)[v % 512], v);
	return t;
}

static atomic_int stop_watch;
static atomic_long watched, seen_set;

static void *watch(void *arg)
{
	struct agent *a = arg;
	while (!atomic_load(&stop_watch)) {
		if (sleeping(a))
			atomic_fetch_add(&seen_set, 1);
		atomic_fetch_add(&watched, 1);
		sleep_ns(20000);
	}
	return NULL;
}

static int test(int expect_poll)
{
	const char *mode = getenv("SOFTVERBS_ENGINE");
	if (expect_poll != (mode && !strcmp(mode, "poll")))
		FAIL("run with SOFTVERBS_ENGINE=poll for 'poll', unset for 'futex'");
	printf("agent: thread %d\n", (int)getpid()); /* The main thread */
	struct agent a = {0};
	agent_open(&a);
	pthread_t t;
	CHECK(pthread_create(&t, NULL, watch, &a) == 0);
	int saw = 0;
	const int n = 300;
	for (int i = 0; i < n; i++) {
		sleep_ns(1000000); /* Idle far past the engine's spin */
		one_write(&a, &saw);
	}
	atomic_store(&stop_watch, 1);
	CHECK(pthread_join(t, NULL) == 0);
	printf("%d WRITEs after 1 ms idle each; `sleeping` seen set %ld times in %ld looks, "
	       "and %s at a doorbell\n",
	       n, atomic_load(&seen_set), atomic_load(&watched), saw ? "once or more" : "never");
	agent_close(&a);
	if (expect_poll && (saw || atomic_load(&seen_set)))
		FAIL("poll mode: the engine set `sleeping`, so an agent would make a system call");
	if (!expect_poll && !saw && !atomic_load(&seen_set))
		FAIL("futex mode: `sleeping` never seen set; the check above could not see it");
	printf("ok\n");
	return 0;
}

/* ---- bench ---- */

static int cmp_u64(const void *x, const void *y)
{
	uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
	return a < b ? -1 : a > b;
}

static void latency(struct agent *a, long gap_ns, int n, const char *what)
{
	uint64_t *t = calloc((size_t)n, sizeof(*t));
	CHECK(t);
	int saw = 0;
	for (int i = 0; i < n; i++) {
		if (gap_ns)
			sleep_ns(gap_ns);
		t[i] = one_write(a, &saw);
	}
	qsort(t, (size_t)n, sizeof(*t), cmp_u64);
	printf("doorbell to completion, %s: median %.1f us, p90 %.1f us, p99 %.1f us (%d WRITEs)\n",
	       what, t[n / 2] / 1e3, t[n * 9 / 10] / 1e3, t[n * 99 / 100] / 1e3, n);
	free(t);
}

static double cpu_s(void)
{
	struct rusage r;
	CHECK(getrusage(RUSAGE_SELF, &r) == 0);
	return r.ru_utime.tv_sec + r.ru_stime.tv_sec +
	       (r.ru_utime.tv_usec + r.ru_stime.tv_usec) / 1e6;
}

/* The peer: a child that, for each byte read from `go`, posts WRITEs with
 * ibv_post_send on its own loopback QP pair for 1 s and writes back how
 * many completed. */
static void peer(int go, int back)
{
	struct svt_dev d;
	svt_open(&d, "loop0");
	struct ibv_cq *cq = ibv_create_cq(d.ctx, 64, NULL, NULL, 0);
	CHECK(cq);
	struct svt_qpopt o = {.type = IBV_QPT_RC, .scq = cq, .rcq = cq, .max_send_wr = 16,
			      .max_recv_wr = 1, .max_sge = 1, .max_inline = 64};
	struct ibv_qp *q = svt_qp(&d, &o), *r = svt_qp(&d, &o);
	svt_connect(q, r->qp_num, d.lid, &conn);
	svt_connect(r, q->qp_num, d.lid, &conn);
	struct ibv_mr *src = svt_mr(&d, 4096, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_mr *dst = svt_mr(&d, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	char c;
	while (read(go, &c, 1) == 1) {
		uint64_t done = 0, end = now_ns() + 1000000000ULL;
		while (now_ns() < end) {
			struct ibv_sge s = svt_sge(src, 0, 64);
			CHECK(svt_post_send1(q, done, IBV_WR_RDMA_WRITE, &s, 1, IBV_SEND_SIGNALED,
					     (uintptr_t)dst->addr, dst->rkey) == 0);
			struct ibv_wc wc;
			int n;
			while ((n = ibv_poll_cq(cq, 1, &wc)) == 0)
				;
			CHECK(n == 1);
			CHECK_WC(wc, IBV_WC_SUCCESS);
			done++;
		}
		CHECK(write(back, &done, sizeof(done)) == sizeof(done));
	}
	_exit(0);
}

static uint64_t peer_rate(int go, int back)
{
	uint64_t n;
	CHECK(write(go, "g", 1) == 1);
	CHECK(read(back, &n, sizeof(n)) == sizeof(n));
	return n;
}

static int bench(void)
{
	const char *mode = getenv("SOFTVERBS_ENGINE");
	printf("engine mode: %s\n", mode && *mode ? mode : "futex (default)");
	int to_peer[2], from_peer[2];
	CHECK(pipe(to_peer) == 0 && pipe(from_peer) == 0);
	pid_t child = fork();
	CHECK(child >= 0);
	if (!child) {
		close(to_peer[1]);
		close(from_peer[0]);
		peer(to_peer[0], from_peer[1]);
	}
	close(to_peer[0]);
	close(from_peer[1]);

	struct agent a = {0};
	agent_open(&a);
	int saw = 0;
	one_write(&a, &saw); /* The engine thread runs */
	double c0 = cpu_s();
	uint64_t w0 = now_ns();
	sleep_ns(1000000000L);
	double busy = (cpu_s() - c0) / ((now_ns() - w0) / 1e9);
	printf("CPU of this process while one agent QP is idle for 1 s: %.2f cores\n", busy);
	/* The peer's rate without and with the idle agent QP, in turns (the QP
	 * taken back leaves the engine thread asleep on its condition
	 * variable), 3 of each; the medians are compared. */
	uint64_t without[3], with[3];
	for (int k = 0; k < 3; k++) {
		CHECK(softverbs_dv_qp_agent(a.qp, 0, NULL) == 0);
		without[k] = peer_rate(to_peer[1], from_peer[0]);
		CHECK(softverbs_dv_qp_agent(a.qp, 1, &a.sq) == 0);
		with[k] = peer_rate(to_peer[1], from_peer[0]);
	}
	qsort(without, 3, sizeof(uint64_t), cmp_u64);
	qsort(with, 3, sizeof(uint64_t), cmp_u64);
	printf("peer's 64-byte WRITEs per s, median of 3: %llu with no agent QP here, %llu with "
	       "one idle (%.0f %%)\n",
	       (unsigned long long)without[1], (unsigned long long)with[1],
	       100.0 * (double)with[1] / (double)without[1]);
	latency(&a, 1000000, 500, "after 1 ms idle, agent spins on its CQ");
	latency(&a, 0, 2000, "back to back, agent spins on its CQ");
	yield_while_polling = 1;
	latency(&a, 1000000, 500, "after 1 ms idle, agent yields while polling");
	latency(&a, 0, 5000, "back to back, agent yields while polling");
	agent_close(&a);
	close(to_peer[1]);
	int st;
	CHECK(waitpid(child, &st, 0) == child);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 2 && !strcmp(argv[1], "poll")) {
		svt_watchdog(60);
		return test(1);
	}
	if (argc == 2 && !strcmp(argv[1], "futex")) {
		svt_watchdog(60);
		return test(0);
	}
	if (argc == 2 && !strcmp(argv[1], "bench")) {
		svt_watchdog(300);
		return bench();
	}
	fprintf(stderr, "usage: %s poll|futex|bench\n", argv[0]);
	return 2;
}
