/* SPDX-License-Identifier: MIT */
/* A receiver stopped for longer than the service copy path waits for it
 * (pyverbs-tests/test_service_path.py runs this with SOFTVERBS_CMA=0 and
 * SOFTVERBS_REMAP=0: every byte between the two processes goes through the
 * receiver's service thread, which a stopped process does not run).
 *
 *   sv_stuck send|write_imm|held
 *
 * Process 0, the receiver, posts NRECV receives of SLOT bytes and
 * registers a SLOT-byte WRITE target, all poisoned.  Process 1, the
 * sender, stops it (SIGSTOP), posts one SLOT-byte SEND or RDMA WRITE WITH
 * IMM (its QP with retry_cnt 1), waits at most 60 s for the completion,
 * lets the receiver go on (SIGCONT) and prints
 *   SENDER status=<n> secs=<whole seconds waited> qp=<state number>
 * The receiver then takes completions until none has come for 2 s and
 * prints
 *   RECEIVER n=<count> wc=<wr_id>:<status>,... qp=<state number> untouched=<0|1>
 * untouched=1: every receive buffer and the WRITE target still hold only
 * poison.
 * held: nobody is stopped.  Once connected the sender prints CONNECTED and
 * waits (at most 60 s) for the file $SV_STUCK_GO to exist, while the test
 * marks the service segments as holding a request of their own (SERVING),
 * and later as done; then it posts one SLOT-byte SEND.  The receiver adds
 * data_ok=1: receive 0 holds the sender's bytes, all else poison.
 * Exit status 0 whenever both ran to the end; the test judges the lines. */
#include "svmp.h"

#define NRECV 4
#define SLOT 4096

static int g_write_imm, g_held;

static void child(int me)
{
	struct svt_dev d;
	svt_open(&d, "loop0");
	struct ibv_cq *cq = ibv_create_cq(d.ctx, 64, NULL, NULL, 0);
	CHECK(cq);
	struct svt_qpopt o = {.scq = cq, .rcq = cq, .type = IBV_QPT_RC};
	struct ibv_qp *qp = svt_qp(&d, &o);
	/* Receive slots, then the WRITE target */
	struct ibv_mr *mr = svt_mr(&d, (NRECV + 1) * SLOT, SVT_ALL_ACCESS);
	memset(mr->addr, SVMP_POISON, (NRECV + 1) * SLOT);
	int peer = 1 - me;
	svmp_publish(peer, qp, d.lid, mr);
	svmp_barrier(20000, NULL, NULL);
	/* retry_cnt 1: a request answered by silence is tried twice */
	struct svt_conn c = {SVT_ALL_ACCESS, 1, 14, 1, 7};
	svt_connect(qp, svmp_b->ep[peer][me].qpn, svmp_b->ep[peer][me].lid, &c);
	_Atomic uint64_t *pid_word = &svmp_b->u[0][1][0];
	_Atomic uint64_t *done_word = &svmp_b->u[1][0][0];
	if (me == 0) {
		for (int i = 0; i < NRECV; i++) {
			struct ibv_sge s = svt_sge(mr, (size_t)i * SLOT, SLOT);
			svt_post_recv1(qp, (uint64_t)i, &s, 1);
		}
		atomic_store(pid_word, (uint64_t)getpid());
	}
	svmp_barrier(20000, NULL, NULL);
	if (me == 1) {
		pid_t rx = (pid_t)atomic_load(pid_word);
		if (g_held) {
			printf("CONNECTED\n");
			fflush(stdout);
			const char *go = getenv("SV_STUCK_GO");
			CHECK(go);
			uint64_t until = svt_now_ms() + 60000;
			while (access(go, F_OK)) {
				if (svt_now_ms() > until)
					FAIL("%s never appeared", go);
				usleep(1000);
			}
		}
		if (!g_held)
			CHECK(kill(rx, SIGSTOP) == 0);
		/* Stopped for sure before the post: /proc/PID/stat says T */
		char path[64], buf[256];
		snprintf(path, sizeof(path), "/proc/%d/stat", (int)rx);
		uint64_t until = svt_now_ms() + 5000;
		while (!g_held) {
			FILE *f = fopen(path, "r");
			CHECK(f);
			size_t n = fread(buf, 1, sizeof(buf) - 1, f);
			fclose(f);
			buf[n] = 0;
			const char *p = strrchr(buf, ')');
			if (p && p[1] == ' ' && p[2] == 'T')
				break;
			if (svt_now_ms() > until)
				FAIL("receiver %d not stopped after 5 s", (int)rx);
			usleep(1000);
		}
		struct ibv_mr *src = svt_mr(&d, SLOT, IBV_ACCESS_LOCAL_WRITE);
		svt_fill(src->addr, SLOT, 7);
		struct ibv_sge s = svt_sge(src, 0, SLOT);
		struct ibv_send_wr wr, *bad = NULL;
		memset(&wr, 0, sizeof(wr));
		wr.wr_id = 77;
		wr.sg_list = &s;
		wr.num_sge = 1;
		wr.send_flags = IBV_SEND_SIGNALED;
		if (g_write_imm) {
			wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
			wr.imm_data = htonl(0x5eed);
			wr.wr.rdma.remote_addr = svmp_b->ep[0][1].addr + NRECV * SLOT;
			wr.wr.rdma.rkey = svmp_b->ep[0][1].rkey;
		} else {
			wr.opcode = IBV_WR_SEND;
		}
		uint64_t t0 = svt_now_ms();
		int rc = ibv_post_send(qp, &wr, &bad);
		struct ibv_wc wc;
		memset(&wc, 0, sizeof(wc));
		int got = rc ? 0 : svt_poll(cq, &wc, 60000);
		uint64_t secs = (svt_now_ms() - t0) / 1000;
		if (!g_held)
			CHECK(kill(rx, SIGCONT) == 0);
		atomic_store(done_word, 1);
		if (rc)
			FAIL("post_send: %s", strerror(rc));
		if (got != 1)
			FAIL("no completion of the %s in 60 s", g_write_imm ? "WRITE WITH IMM" : "SEND");
		CHECK_EQ(wc.wr_id, 77);
		printf("SENDER status=%d secs=%llu qp=%d\n", (int)wc.status, (unsigned long long)secs,
		       (int)svt_state(qp));
		fflush(stdout);
		ibv_dereg_mr(src);
	} else {
		/* Runs again once the sender lets it; the flag says its wait is over */
		uint64_t until = svt_now_ms() + 90000;
		while (!atomic_load(done_word)) {
			if (svt_now_ms() > until)
				FAIL("the sender never finished");
			usleep(1000);
		}
		char list[512] = "";
		size_t len = 0;
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
			if (len < sizeof(list) - 32)
				len += (size_t)snprintf(list + len, sizeof(list) - len, "%s%llu:%d",
							len ? "," : "", (unsigned long long)wc.wr_id,
							(int)wc.status);
			quiet = svt_now_ms() + 2000;
		}
		int untouched = svmp_all(mr->addr, (NRECV + 1) * SLOT, SVMP_POISON);
		uint8_t want[SLOT];
		svt_fill(want, SLOT, 7);
		int data_ok = !memcmp(mr->addr, want, SLOT) &&
			      svmp_all((uint8_t *)mr->addr + SLOT, NRECV * SLOT, SVMP_POISON);
		printf("RECEIVER n=%d wc=%s qp=%d untouched=%d data_ok=%d\n", n, len ? list : "-",
		       (int)svt_state(qp), untouched, data_ok);
		fflush(stdout);
	}
	svmp_barrier(20000, NULL, NULL);
	CHECK(ibv_destroy_qp(qp) == 0);
	void *buf = mr->addr;
	CHECK(ibv_dereg_mr(mr) == 0);
	free(buf);
	CHECK(ibv_destroy_cq(cq) == 0);
	CHECK(ibv_dealloc_pd(d.pd) == 0);
	CHECK(ibv_close_device(d.ctx) == 0);
}

int main(int argc, char **argv)
{
	if (argc != 2 ||
	    (strcmp(argv[1], "send") && strcmp(argv[1], "write_imm") && strcmp(argv[1], "held")))
		FAIL("usage: sv_stuck send|write_imm|held");
	g_write_imm = !strcmp(argv[1], "write_imm");
	g_held = !strcmp(argv[1], "held");
	setvbuf(stdout, NULL, _IOLBF, 0);
	return svmp_run(2, 120000, child, 0);
}
