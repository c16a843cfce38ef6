/* SPDX-License-Identifier: MIT */
/* A receiver whose service thread does not serve (pyverbs-tests/
 * test_service_path.py runs this with SOFTVERBS_CMA=0 and SOFTVERBS_REMAP=0:
 * every byte between the processes goes through the receiver's service
 * thread, which a stopped process does not run).
 *
 *   sv_stuck send|write_imm|held|stray|stall [SENDERS]
 *
 * Process 0, the receiver, has one RC QP per sender (SENDERS, default 1,
 * at most 4), each with NRECV receives of SLOT bytes posted (wr_id
 * 100 * sender + i), and a SLOT-byte WRITE target per sender, all
 * poisoned.  Each sender posts one SLOT-byte message on its own QP
 * (retry_cnt 1) and waits at most 60 s for its completion; then it prints
 *   SENDER <i> status=<n> secs=<whole seconds waited> qp=<state number>
 * Once every sender is done the receiver takes completions until none has
 * come for 2 s and prints
 *   RECEIVER n=<count> wc=<wr_id>:<status>,... qp=<states> untouched=<0|1> data_ok=<0|1>
 * untouched=1: every receive buffer and WRITE target holds only poison;
 * data_ok=1: each sender's receive 0 holds its bytes, all else poison.
 *
 * send, write_imm: sender 1 stops the receiver (SIGSTOP) and checks that
 * it is stopped, the senders post a SEND or an RDMA WRITE WITH IMM 2 ms
 * apart, and sender 1 lets the receiver go on (SIGCONT) once all are done.
 * held: as send, with one sender, but between the stop and the post the
 * sender prints "STOPPED <receiver pid>" and waits (at most 60 s) for the
 * file $SV_STUCK_GO: the test marks the receiver's service ring SERVING
 * (a request its service holds) and later DONE, and lets it go on itself.
 * stray: nobody is stopped; the sender prints "CONNECTED" and waits for
 * $SV_STUCK_GO while the test writes SERVING into every service ring.
 * stall: nobody is stopped; one sender's SEND goes at once (the test sets
 * SOFTVERBS_TEST_SERVICE_STALL_MS past the give-up: the receiver's service
 * thread sleeps after it claims the request), and the receiver looks at
 * its memory 4 s later than in the other modes, after the stall's end.
 * Exit status 0 whenever all ran to the end; the test judges the lines. */
#include "svmp.h"

#define NRECV 4
#define SLOT 4096
#define MAXS 4

enum mode { M_SEND, M_WRITE_IMM, M_HELD, M_STRAY, M_STALL };
static enum mode g_mode;
static int g_senders = 1;

static void wait_go(void)
{
	const char *go = getenv("SV_STUCK_GO");
	CHECK(go);
	uint64_t until = svt_now_ms() + 60000;
	while (access(go, F_OK)) {
		if (svt_now_ms() > until)
			FAIL("%s never appeared", go);
		usleep(1000);
	}
}

static void wait_stopped(pid_t pid)
{
	char path[64], buf[256];
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	uint64_t until = svt_now_ms() + 5000;
	for (;;) {
		FILE *f = fopen(path, "r");
		CHECK(f);
		size_t n = fread(buf, 1, sizeof(buf) - 1, f);
		fclose(f);
		buf[n] = 0;
		const char *p = strrchr(buf, ')');
		if (p && p[1] == ' ' && p[2] == 'T')
			return;
		if (svt_now_ms() > until)
			FAIL("receiver %d not stopped after 5 s", (int)pid);
		usleep(1000);
	}
}

static void child(int me)
{
	struct svt_dev d;
	svt_open(&d, "loop0");
	struct ibv_cq *cq = ibv_create_cq(d.ctx, 128, NULL, NULL, 0);
	CHECK(cq);
	struct svt_qpopt o = {.scq = cq, .rcq = cq, .type = IBV_QPT_RC};
	int nqp = me ? 1 : g_senders;
	struct ibv_qp *qp[MAXS];
	for (int q = 0; q < nqp; q++)
		qp[q] = svt_qp(&d, &o);
	/* The receiver's: per sender NRECV receive slots, then its WRITE target */
	size_t per = (NRECV + 1) * SLOT, len = (size_t)nqp * per;
	struct ibv_mr *mr = svt_mr(&d, len, SVT_ALL_ACCESS);
	memset(mr->addr, SVMP_POISON, len);
	if (me)
		svmp_publish(0, qp[0], d.lid, mr);
	else
		for (int q = 0; q < nqp; q++) {
			svmp_publish(q + 1, qp[q], d.lid, mr);
			svmp_b->ep[0][q + 1].addr = (uintptr_t)mr->addr + (size_t)q * per + NRECV * SLOT;
		}
	svmp_barrier(20000, NULL, NULL);
	/* retry_cnt 1: a request answered by silence is tried twice */
	struct svt_conn c = {SVT_ALL_ACCESS, 1, 14, 1, 7};
	for (int q = 0; q < nqp; q++) {
		int peer = me ? 0 : q + 1;
		svt_connect(qp[q], svmp_b->ep[peer][me].qpn, svmp_b->ep[peer][me].lid, &c);
	}
	_Atomic uint64_t *pid_word = &svmp_b->u[0][1][0];
	_Atomic uint64_t *done_word = &svmp_b->u[1][0][0];
	_Atomic uint64_t *stopped_word = &svmp_b->u[1][0][1];
	if (me == 0) {
		for (int q = 0; q < nqp; q++)
			for (int i = 0; i < NRECV; i++) {
				struct ibv_sge s = svt_sge(mr, (size_t)q * per + (size_t)i * SLOT, SLOT);
				svt_post_recv1(qp[q], (uint64_t)(100 * (q + 1) + i), &s, 1);
			}
		atomic_store(pid_word, (uint64_t)getpid());
	}
	svmp_barrier(20000, NULL, NULL);
	if (me) {
		pid_t rx = (pid_t)atomic_load(pid_word);
		if (me == 1 && g_mode != M_STRAY && g_mode != M_STALL) {
			CHECK(kill(rx, SIGSTOP) == 0);
			wait_stopped(rx);
			atomic_store(stopped_word, 1);
		}
		if (g_mode == M_HELD) {
			printf("STOPPED %d\n", (int)rx);
			fflush(stdout);
			wait_go();
		} else if (g_mode == M_STRAY) {
			printf("CONNECTED\n");
			fflush(stdout);
			wait_go();
		} else if (g_mode == M_STALL) {
			/* Nobody stopped: the service thread stalls by itself */
		} else {
			uint64_t until = svt_now_ms() + 10000;
			while (!atomic_load(stopped_word)) {
				if (svt_now_ms() > until)
					FAIL("the receiver was never stopped");
				usleep(1000);
			}
			usleep(2000 * (unsigned)(me - 1)); /* One after another */
		}
		struct ibv_mr *src = svt_mr(&d, SLOT, IBV_ACCESS_LOCAL_WRITE);
		svt_fill(src->addr, SLOT, (unsigned)(7 + me));
		struct ibv_sge s = svt_sge(src, 0, SLOT);
		struct ibv_send_wr wr, *bad = NULL;
		memset(&wr, 0, sizeof(wr));
		wr.wr_id = 77;
		wr.sg_list = &s;
		wr.num_sge = 1;
		wr.send_flags = IBV_SEND_SIGNALED;
		if (g_mode == M_WRITE_IMM) {
			wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
			wr.imm_data = htonl(0x5eed);
			wr.wr.rdma.remote_addr = svmp_b->ep[0][me].addr;
			wr.wr.rdma.rkey = svmp_b->ep[0][me].rkey;
		} else {
			wr.opcode = IBV_WR_SEND;
		}
		uint64_t t0 = svt_now_ms();
		int rc = ibv_post_send(qp[0], &wr, &bad);
		struct ibv_wc wc;
		memset(&wc, 0, sizeof(wc));
		int got = rc ? 0 : svt_poll(cq, &wc, 60000);
		uint64_t secs = (svt_now_ms() - t0) / 1000;
		atomic_fetch_add(done_word, 1);
		if (me == 1 && g_mode != M_STRAY && g_mode != M_STALL) {
			uint64_t until = svt_now_ms() + 90000;
			while (atomic_load(done_word) < (uint64_t)g_senders && svt_now_ms() < until)
				usleep(1000);
			CHECK(kill(rx, SIGCONT) == 0);
		}
		if (rc)
			FAIL("post_send: %s", strerror(rc));
		if (got != 1)
			FAIL("no completion of the message in 60 s");
		CHECK_EQ(wc.wr_id, 77);
		printf("SENDER %d status=%d secs=%llu qp=%d\n", me, (int)wc.status,
		       (unsigned long long)secs, (int)svt_state(qp[0]));
		fflush(stdout);
		ibv_dereg_mr(src);
	} else {
		/* Runs again once let go; the count says the senders are done */
		uint64_t until = svt_now_ms() + 90000;
		while (atomic_load(done_word) < (uint64_t)g_senders) {
			if (svt_now_ms() > until)
				FAIL("the senders never finished");
			usleep(1000);
		}
		char list[1024] = "";
		size_t used = 0;
		int n = 0;
		uint64_t quiet = svt_now_ms() + 2000;
		while (svt_now_ms() < quiet) {
			struct ibv_wc wc;
			int k = ibv_poll_cq(cq, 1, &wc);
			CHECK(k >= 0);
			if (!k) {
				usleep(1000);
				continue;
			}
			n++;
			if (used < sizeof(list) - 32)
				used += (size_t)snprintf(list + used, sizeof(list) - used, "%s%llu:%d",
							 used ? "," : "", (unsigned long long)wc.wr_id,
							 (int)wc.status);
			quiet = svt_now_ms() + 2000;
		}
		if (g_mode == M_STALL)
			usleep(4000000); /* Past the stalled service's end */
		char states[64] = "";
		size_t sl = 0;
		int data_ok = 1;
		for (int q = 0; q < nqp; q++) {
			sl += (size_t)snprintf(states + sl, sizeof(states) - sl, "%s%d", q ? "," : "",
					       (int)svt_state(qp[q]));
			uint8_t want[SLOT];
			svt_fill(want, SLOT, (unsigned)(7 + q + 1));
			uint8_t *b = (uint8_t *)mr->addr + (size_t)q * per;
			data_ok = data_ok && !memcmp(b, want, SLOT) &&
				  svmp_all(b + SLOT, per - SLOT, SVMP_POISON);
		}
		int untouched = svmp_all(mr->addr, len, SVMP_POISON);
		printf("RECEIVER n=%d wc=%s qp=%s untouched=%d data_ok=%d\n", n, used ? list : "-",
		       states, untouched, data_ok);
		fflush(stdout);
	}
	svmp_barrier(20000, NULL, NULL);
	for (int q = 0; q < nqp; q++)
		CHECK(ibv_destroy_qp(qp[q]) == 0);
	void *buf = mr->addr;
	CHECK(ibv_dereg_mr(mr) == 0);
	free(buf);
	CHECK(ibv_destroy_cq(cq) == 0);
	CHECK(ibv_dealloc_pd(d.pd) == 0);
	CHECK(ibv_close_device(d.ctx) == 0);
}

int main(int argc, char **argv)
{
	static const char *const names[] = {"send", "write_imm", "held", "stray", "stall"};
	int m = -1;
	for (int i = 0; argc >= 2 && i < 5; i++)
		if (!strcmp(argv[1], names[i]))
			m = i;
	if (m < 0 || argc > 3)
		FAIL("usage: sv_stuck send|write_imm|held|stray|stall [SENDERS]");
	g_mode = (enum mode)m;
	if (argc == 3)
		g_senders = (int)svmp_parse_u64(argv[2], "sender count");
	if (g_senders < 1 || g_senders > MAXS || (g_senders > 1 && m >= M_HELD))
		FAIL("senders: 1..%d, and 1 with held, stray or stall", MAXS);
	setvbuf(stdout, NULL, _IOLBF, 0);
	return svmp_run(1 + g_senders, 150000, child, 0);
}
