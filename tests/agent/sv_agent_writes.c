/* SPDX-License-Identifier: MIT */
/*
 * Agent test (a): a thread that uses only the inline helpers of
 * <infiniband/softverbs_dv.h> (no call into the library on its data path)
 * posts RDMA WRITEs and SENDs on an RC QP connected to another process,
 * rings the doorbell and polls its send completions from the CQ ring.
 *
 * Every message is a 64-byte record {sequence, 6 words derived from it, a
 * checksum}.  The target checks every SEND it receives (in order, intact)
 * and, at the end, the WRITE area: slot s must hold the last WRITE aimed
 * at it.  The initiator checks that every signaled completion arrives, in
 * order, successful.  Usage: sv_agent_writes [total WRs] (default 1000000).
 */
#include "../progs/svt.h"

#include <infiniband/softverbs_dv.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/wait.h>

#define REC 64
#define WSLOTS 1024	/* WRITE area: records */
#define RQ_DEPTH 512
#define SQ_DEPTH 256
#define SIGNAL_EVERY 32

struct rec {
	uint64_t seq;
	uint64_t w[6];
	uint64_t csum;
};

static uint64_t mix(uint64_t x)
{
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdULL;
	x ^= x >> 33;
	return x;
}

static void rec_fill(struct rec *r, uint64_t seq)
{
	r->seq = seq;
	r->csum = seq;
	for (int i = 0; i < 6; i++) {
		r->w[i] = mix(seq * 7 + i);
		r->csum ^= r->w[i];
	}
}

static int rec_ok(const struct rec *r, uint64_t seq)
{
	struct rec want;
	rec_fill(&want, seq);
	return !memcmp(r, &want, sizeof(want));
}

/* WR i is a SEND every fourth, a WRITE otherwise. */
static int is_send(uint64_t i)
{
	return (i & 3) == 3;
}

struct board {
	_Atomic int ready[2];
	_Atomic int done;
	uint32_t qpn[2];
	uint16_t lid[2];
	uint64_t addr;
	uint32_t rkey;
};

static struct board *b;
static uint64_t total = 1000000;

static uint64_t count_sends(uint64_t n)
{
	return n / 4;
}

static void wait_flag(_Atomic int *f, int v)
{
	uint64_t t0 = svt_now_ms();
	while (atomic_load(f) < v) {
		if (svt_now_ms() - t0 > 60000)
			FAIL("peer did not arrive");
		usleep(1000);
	}
}

static const struct svt_conn conn = {
	.access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE,
	.min_rnr_timer = 1,
	.timeout = 14,
	.retry_cnt = 7,
	.rnr_retry = 7,
};

static void target(void)
{
	struct svt_dev d;
	svt_open(&d, "loop0");
	struct ibv_cq *cq = ibv_create_cq(d.ctx, RQ_DEPTH * 2, NULL, NULL, 0);
	CHECK(cq);
	struct svt_qpopt o = {.type = IBV_QPT_RC, .scq = cq, .rcq = cq, .max_recv_wr = RQ_DEPTH};
	struct ibv_qp *qp = svt_qp(&d, &o);
	struct ibv_mr *area = svt_mr(&d, WSLOTS * REC, SVT_ALL_ACCESS);
	struct ibv_mr *rbuf = svt_mr(&d, RQ_DEPTH * REC, IBV_ACCESS_LOCAL_WRITE);
	b->qpn[1] = qp->qp_num;
	b->lid[1] = d.lid;
	b->addr = (uintptr_t)area->addr;
	b->rkey = area->rkey;
	atomic_store(&b->ready[1], 1);
	wait_flag(&b->ready[0], 1);
	svt_connect(qp, b->qpn[0], b->lid[0], &conn);
	for (uint64_t i = 0; i < RQ_DEPTH; i++) {
		struct ibv_sge s = svt_sge(rbuf, i * REC, REC);
		svt_post_recv1(qp, i, &s, 1);
	}
	atomic_store(&b->ready[1], 2);
	uint64_t want = count_sends(total), got = 0, next_seq = 3;
	struct ibv_wc wc[16];
	uint64_t t0 = svt_now_ms();
	while (got < want) {
		int n = ibv_poll_cq(cq, 16, wc);
		CHECK(n >= 0);
		for (int k = 0; k < n; k++) {
			CHECK_WC(wc[k], IBV_WC_SUCCESS);
			CHECK_EQ(wc[k].opcode, IBV_WC_RECV);
			CHECK_EQ(wc[k].byte_len, REC);
			uint64_t slot = wc[k].wr_id;
			const struct rec *r = (const struct rec *)((char *)rbuf->addr + slot * REC);
			if (!rec_ok(r, next_seq))
				FAIL("SEND %llu: got record %llu, damaged or out of order",
				     (unsigned long long)next_seq, (unsigned long long)r->seq);
			next_seq += 4;
			got++;
			struct ibv_sge s = svt_sge(rbuf, slot * REC, REC);
			svt_post_recv1(qp, slot, &s, 1);
		}
		if (!n && svt_now_ms() - t0 > 240000)
			FAIL("target: %llu of %llu SENDs after 240 s", (unsigned long long)got,
			     (unsigned long long)want);
	}
	wait_flag(&b->done, 1);
	/* Slot s holds the last WRITE aimed at it: WRITE i lands in slot
	 * (i / 4 * 3 + i % 4) % WSLOTS, the WRITEs numbered in order. */
	uint64_t nwrites = total - count_sends(total);
	for (uint64_t s = 0; s < WSLOTS && s < nwrites; s++) {
		uint64_t last_w = s + (nwrites - 1 - s) / WSLOTS * WSLOTS;
		uint64_t i = last_w / 3 * 4 + last_w % 3; /* back to the WR's number */
		const struct rec *r = (const struct rec *)((char *)area->addr + s * REC);
		if (!rec_ok(r, i))
			FAIL("WRITE area slot %llu holds record %llu, expected %llu",
			     (unsigned long long)s, (unsigned long long)r->seq,
			     (unsigned long long)i);
	}
	printf("target: %llu SENDs in order and intact, %llu WRITE slots checked\n",
	       (unsigned long long)got, (unsigned long long)(nwrites < WSLOTS ? nwrites : WSLOTS));
	exit(0);
}

struct agent_arg {
	struct softverbs_dv_sq sq;
	struct softverbs_dv_cq cq;
	struct ibv_mr *src; /* One record per SQ slot */
	uint64_t completions;
};

/* The agent: inline helpers only. */
static void *agent(void *p)
{
	struct agent_arg *a = p;
	struct softverbs_dv_sq *sq = &a->sq;
	uint64_t nwrites = 0, expect_sig = 0;
	struct softverbs_cqe e;
	for (uint64_t i = 0; i < total; i++) {
		struct softverbs_wqe *w;
		while (!(w = softverbs_dv_sq_next(sq))) {
			while (softverbs_dv_cq_poll(&a->cq, &e)) {
				if (e.status != IBV_WC_SUCCESS)
					FAIL("agent: completion of WR %llu: %s",
					     (unsigned long long)e.wr_id,
					     ibv_wc_status_str((enum ibv_wc_status)e.status));
				/* Signaled WRs complete in order. */
				while (expect_sig % SIGNAL_EVERY != SIGNAL_EVERY - 1 &&
				       expect_sig != total - 1)
					expect_sig++;
				if (e.wr_id != expect_sig)
					FAIL("agent: completion of WR %llu, expected %llu",
					     (unsigned long long)e.wr_id,
					     (unsigned long long)expect_sig);
				expect_sig++;
				a->completions++;
				softverbs_dv_sq_retire(sq, &e);
			}
		}
		unsigned flags = (i % SIGNAL_EVERY == SIGNAL_EVERY - 1 || i == total - 1)
					 ? IBV_SEND_SIGNALED
					 : 0;
		struct rec *r = (struct rec *)((char *)a->src->addr +
					       (size_t)(sq->next & (sq->count - 1)) * REC);
		rec_fill(r, i);
		if (is_send(i)) {
			softverbs_dv_wqe_ctrl(sq, w, IBV_WR_SEND, flags, i);
			if ((i & 7) == 7) {
				if (softverbs_dv_wqe_inline(sq, w, r, REC))
					FAIL("inline refused");
			} else {
				softverbs_dv_wqe_sge(w, (uintptr_t)r, REC, a->src->lkey);
			}
		} else {
			uint64_t slot = nwrites++ % WSLOTS;
			softverbs_dv_wqe_ctrl(sq, w, IBV_WR_RDMA_WRITE, flags, i);
			softverbs_dv_wqe_rdma(w, b->addr + slot * REC, b->rkey);
			softverbs_dv_wqe_sge(w, (uintptr_t)r, REC, a->src->lkey);
		}
		/* The doorbell every 8 WQEs, and on the last: batches share one. */
		softverbs_dv_sq_post(sq, (i & 7) == 7 || i == total - 1);
	}
	uint64_t t0 = svt_now_ms();
	while (expect_sig < total) {
		if (softverbs_dv_cq_poll(&a->cq, &e)) {
			if (e.status != IBV_WC_SUCCESS)
				FAIL("agent: completion of WR %llu: %s", (unsigned long long)e.wr_id,
				     ibv_wc_status_str((enum ibv_wc_status)e.status));
			while (expect_sig % SIGNAL_EVERY != SIGNAL_EVERY - 1 &&
			       expect_sig != total - 1)
				expect_sig++;
			if (e.wr_id != expect_sig)
				FAIL("agent: completion of WR %llu, expected %llu",
				     (unsigned long long)e.wr_id, (unsigned long long)expect_sig);
			expect_sig++;
			a->completions++;
			softverbs_dv_sq_retire(sq, &e);
		} else if (svt_now_ms() - t0 > 120000) {
			FAIL("agent: last completions missing");
		}
	}
	return NULL;
}

int main(int argc, char **argv)
{
	if (argc > 1)
		total = strtoull(argv[1], NULL, 0);
	CHECK(total >= 8);
	svt_watchdog(500);
	b = mmap(NULL, sizeof(*b), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	CHECK(b != MAP_FAILED);
	memset(b, 0, sizeof(*b));
	pid_t child = fork();
	CHECK(child >= 0);
	if (!child)
		target();

	struct svt_dev d;
	svt_open(&d, "loop0");
	struct ibv_cq *cq = ibv_create_cq(d.ctx, SQ_DEPTH * 2, NULL, NULL, 0);
	CHECK(cq);
	struct svt_qpopt o = {.type = IBV_QPT_RC, .scq = cq, .rcq = cq, .max_send_wr = SQ_DEPTH,
			      .max_recv_wr = 1, .max_inline = REC};
	struct ibv_qp *qp = svt_qp(&d, &o);
	struct agent_arg a;
	memset(&a, 0, sizeof(a));
	b->qpn[0] = qp->qp_num;
	b->lid[0] = d.lid;
	atomic_store(&b->ready[0], 1);
	wait_flag(&b->ready[1], 1);
	svt_connect(qp, b->qpn[1], b->lid[1], &conn);
	wait_flag(&b->ready[1], 2);

	CHECK(softverbs_dv_qp_agent(qp, 1, &a.sq) == 0);
	CHECK_EQ(a.sq.format_version, SOFTVERBS_SQ_FORMAT_VERSION);
	CHECK(a.sq.count >= SQ_DEPTH && a.sq.stride >= SOFTVERBS_WQE_HDR_SIZE + REC);
	CHECK(softverbs_dv_cq_agent(cq, 1, &a.cq) == 0);
	/* One producer at a time: the library refuses to post meanwhile. */
	struct ibv_sge none = {0};
	CHECK_EQ(svt_post_send1(qp, 0, IBV_WR_SEND, &none, 0, 0, 0, 0), EINVAL);
	a.src = svt_mr(&d, (size_t)a.sq.count * REC, IBV_ACCESS_LOCAL_WRITE);

	uint64_t t0 = svt_now_ms();
	pthread_t t;
	CHECK(pthread_create(&t, NULL, agent, &a) == 0);
	CHECK(pthread_join(t, NULL) == 0);
	uint64_t ms = svt_now_ms() - t0;
	atomic_store(&b->done, 1);

	CHECK(softverbs_dv_cq_agent(cq, 0, NULL) == 0);
	CHECK(softverbs_dv_qp_agent(qp, 0, NULL) == 0);
	int status;
	CHECK(waitpid(child, &status, 0) == child);
	if (!WIFEXITED(status) || WEXITSTATUS(status))
		FAIL("target failed (status %#x)", status);
	printf("agent: %llu WRs (%llu SENDs) in %llu ms, %llu completions polled\n",
	       (unsigned long long)total, (unsigned long long)count_sends(total),
	       (unsigned long long)ms, (unsigned long long)a.completions);
	CHECK(ibv_destroy_qp(qp) == 0);
	return 0;
}
