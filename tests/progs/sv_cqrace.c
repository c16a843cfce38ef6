/* SPDX-License-Identifier: MIT */
/* One CQ of this process resized over and over while other threads of the
 * same process complete into it and arm it:
 *   - two sender threads, each with an RC QP connected (in this process) to
 *     a peer QP, post signaled RDMA WRITEs whose send completions the
 *     provider pushes into the CQ from the posting thread (push_own);
 *   - a poller thread polls the CQ and checks that each sender's
 *     completions arrive in order, none lost or doubled;
 *   - an event thread arms the CQ, takes its event, checks that no second
 *     one follows for the same arm, and arms it again;
 *   - a resizer thread resizes the CQ between small and large sizes.
 * A resize used to unmap the old ring while a sender could still be pushing
 * into it, and an arm could land on the ring being replaced (and be lost).
 *
 *   sv_cqrace [-s SECONDS]
 *
 * At the end the CQ is armed once more and one more WRITE must raise an
 * event on its channel within 10 s.  Prints "OK sv_cqrace completions=N
 * resizes=N" when every check held; else a FAIL line and exit 1. */
#include "svt.h"

#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>

#define NS 2
#define DEPTH 32

static struct svt_dev D;
static struct ibv_cq *CQ;
static struct ibv_comp_channel *CH;
static struct ibv_qp *QA[NS], *QB[NS];
static struct ibv_mr *MR;
static _Atomic int stop, senders_done;
static _Atomic uint64_t posted[NS], done[NS], resizes, arms, events;

static void *sender(void *arg)
{
	int t = (int)(intptr_t)arg;
	char *buf = MR->addr;
	struct ibv_sge s = svt_sge(MR, (size_t)t * 64, 64);
	while (!atomic_load(&stop)) {
		if (atomic_load(&posted[t]) - atomic_load(&done[t]) >= DEPTH) {
			sched_yield();
			continue;
		}
		uint64_t n = atomic_load(&posted[t]);
		int e = svt_post_send1(QA[t], (uint64_t)t << 56 | n, IBV_WR_RDMA_WRITE, &s, 1,
				       IBV_SEND_SIGNALED, (uintptr_t)buf + 4096 + (size_t)t * 64,
				       MR->rkey);
		if (e == ENOMEM) { /* the send queue holds its slots until polled */
			sched_yield();
			continue;
		}
		if (e)
			FAIL("sender %d: ibv_post_send: %s", t, strerror(e));
		atomic_store(&posted[t], n + 1);
	}
	atomic_fetch_add(&senders_done, 1);
	return NULL;
}

static void *poller(void *arg)
{
	(void)arg;
	struct ibv_wc wc[16];
	for (;;) {
		int n = ibv_poll_cq(CQ, 16, wc);
		if (n < 0)
			FAIL("ibv_poll_cq: %d", n);
		for (int i = 0; i < n; i++) {
			CHECK_WC(wc[i], IBV_WC_SUCCESS);
			int t = (int)(wc[i].wr_id >> 56);
			uint64_t seq = wc[i].wr_id & ((1ULL << 56) - 1);
			if (t >= NS)
				FAIL("completion with wr_id %#llx", (unsigned long long)wc[i].wr_id);
			if (seq != atomic_load(&done[t]))
				FAIL("sender %d: completion %llu where %llu was due (lost or doubled)",
				     t, (unsigned long long)seq,
				     (unsigned long long)atomic_load(&done[t]));
			atomic_store(&done[t], seq + 1);
		}
		if (atomic_load(&senders_done) == NS) {
			int idle = 1;
			for (int t = 0; t < NS; t++)
				if (atomic_load(&done[t]) != atomic_load(&posted[t]))
					idle = 0;
			if (idle)
				return NULL;
		}
	}
}

/* Arms the CQ, takes its event, and before arming again makes sure no
 * second event comes: one arm, at most one event (a resize used to copy
 * the arm to the new ring while a producer of the old ring was about to
 * fire it there: two events for one arm). */
static void *eventer(void *arg)
{
	(void)arg;
	while (!atomic_load(&stop)) {
		struct pollfd pfd = {CH->fd, POLLIN, 0};
		if (poll(&pfd, 1, 20) != 1)
			continue;
		struct ibv_cq *ecq;
		void *ectx;
		CHECK_EQ(ibv_get_cq_event(CH, &ecq, &ectx), 0);
		CHECK(ecq == CQ);
		ibv_ack_cq_events(CQ, 1);
		atomic_fetch_add(&events, 1);
		if (poll(&pfd, 1, 2) != 0)
			FAIL("a second completion event for one arm (event %llu)",
			     (unsigned long long)atomic_load(&events));
		atomic_fetch_add(&arms, 1);
		CHECK_EQ(ibv_req_notify_cq(CQ, 0), 0);
	}
	return NULL;
}

static void *resizer(void *arg)
{
	(void)arg;
	static const int sizes[] = {64, 1024, 128, 4096, 256};
	for (unsigned i = 0; !atomic_load(&stop); i++) {
		int e = ibv_resize_cq(CQ, sizes[i % 5]);
		/* EINVAL: more completions pending than the smaller size holds */
		if (e && e != EINVAL)
			FAIL("ibv_resize_cq: %s", strerror(e));
		if (!e)
			atomic_fetch_add(&resizes, 1);
		usleep(200);
	}
	return NULL;
}

int main(int argc, char **argv)
{
	int seconds = 3, c;
	while ((c = getopt(argc, argv, "s:")) != -1) {
		if (c != 's') {
			fprintf(stderr, "usage: sv_cqrace [-s SECONDS]\n");
			return 2;
		}
		seconds = atoi(optarg);
	}
	svt_watchdog(seconds + 60);
	svt_open(&D, "loop0");
	CH = ibv_create_comp_channel(D.ctx);
	CHECK(CH);
	CQ = ibv_create_cq(D.ctx, 256, NULL, CH, 0);
	struct ibv_cq *other = ibv_create_cq(D.ctx, 16, NULL, NULL, 0);
	CHECK(CQ && other);
	MR = svt_mr(&D, 8192, SVT_ALL_ACCESS);
	struct svt_conn conn = {SVT_ALL_ACCESS, 1, 14, 7, 7};
	for (int t = 0; t < NS; t++) {
		struct svt_qpopt a = {.type = IBV_QPT_RC, .scq = CQ, .rcq = other,
				      .max_send_wr = DEPTH};
		struct svt_qpopt b = {.type = IBV_QPT_RC, .scq = other, .rcq = other};
		QA[t] = svt_qp(&D, &a);
		QB[t] = svt_qp(&D, &b);
		svt_connect(QA[t], QB[t]->qp_num, D.lid, &conn);
		svt_connect(QB[t], QA[t]->qp_num, D.lid, &conn);
	}
	atomic_store(&arms, 1);
	CHECK_EQ(ibv_req_notify_cq(CQ, 0), 0);
	pthread_t ts[NS], tp, tr, te;
	for (int t = 0; t < NS; t++)
		CHECK_EQ(pthread_create(&ts[t], NULL, sender, (void *)(intptr_t)t), 0);
	CHECK_EQ(pthread_create(&tp, NULL, poller, NULL), 0);
	CHECK_EQ(pthread_create(&tr, NULL, resizer, NULL), 0);
	CHECK_EQ(pthread_create(&te, NULL, eventer, NULL), 0);
	usleep((useconds_t)seconds * 1000000);
	atomic_store(&stop, 1);
	for (int t = 0; t < NS; t++)
		pthread_join(ts[t], NULL);
	pthread_join(tr, NULL);
	pthread_join(tp, NULL);
	pthread_join(te, NULL);

	/* Drain the events the run raised, then: armed once, one more
	 * completion must raise exactly one event. */
	int fl = fcntl(CH->fd, F_GETFL);
	CHECK(fcntl(CH->fd, F_SETFL, fl | O_NONBLOCK) == 0);
	struct ibv_cq *ecq;
	void *ectx;
	unsigned evs = 0;
	while (ibv_get_cq_event(CH, &ecq, &ectx) == 0)
		evs++;
	ibv_ack_cq_events(CQ, evs);
	uint64_t all = atomic_load(&events) + evs;
	if (evs > 1 || all > atomic_load(&arms))
		FAIL("%llu completion events for %llu arms (%u after the last): an arm fired twice",
		     (unsigned long long)all, (unsigned long long)atomic_load(&arms), evs);
	if (atomic_load(&events) < 2)
		FAIL("%llu completion events in the run: the arms were not exercised",
		     (unsigned long long)atomic_load(&events));
	CHECK(fcntl(CH->fd, F_SETFL, fl) == 0);
	struct ibv_wc wc;
	while (ibv_poll_cq(CQ, 1, &wc) > 0)
		;
	CHECK_EQ(ibv_req_notify_cq(CQ, 0), 0);
	struct ibv_sge s = svt_sge(MR, 0, 8);
	CHECK_EQ(svt_post_send1(QA[0], 7, IBV_WR_RDMA_WRITE, &s, 1, IBV_SEND_SIGNALED,
				(uintptr_t)MR->addr + 4096, MR->rkey),
		 0);
	struct pollfd pfd = {CH->fd, POLLIN, 0};
	if (poll(&pfd, 1, 10000) != 1)
		FAIL("no completion event within 10 s after the last arm");
	CHECK_EQ(ibv_get_cq_event(CH, &ecq, &ectx), 0);
	CHECK(ecq == CQ);
	ibv_ack_cq_events(CQ, 1);
	CHECK_WC(svt_wait(CQ, "last write"), IBV_WC_SUCCESS);

	uint64_t total = 0;
	for (int t = 0; t < NS; t++)
		total += atomic_load(&done[t]);
	if (!total || !atomic_load(&resizes))
		FAIL("nothing happened: %llu completions, %llu resizes", (unsigned long long)total,
		     (unsigned long long)atomic_load(&resizes));
	for (int t = 0; t < NS; t++) {
		CHECK_EQ(ibv_destroy_qp(QA[t]), 0);
		CHECK_EQ(ibv_destroy_qp(QB[t]), 0);
	}
	CHECK_EQ(ibv_destroy_cq(CQ), 0);
	CHECK_EQ(ibv_destroy_cq(other), 0);
	CHECK_EQ(ibv_destroy_comp_channel(CH), 0);
	void *buf = MR->addr;
	CHECK_EQ(ibv_dereg_mr(MR), 0);
	free(buf);
	CHECK_EQ(ibv_dealloc_pd(D.pd), 0);
	CHECK_EQ(ibv_close_device(D.ctx), 0);
	printf("OK sv_cqrace completions=%llu resizes=%llu arms=%llu events=%llu\n",
	       (unsigned long long)total, (unsigned long long)atomic_load(&resizes),
	       (unsigned long long)atomic_load(&arms), (unsigned long long)all);
	return 0;
}
