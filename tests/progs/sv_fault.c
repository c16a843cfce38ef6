/* SPDX-License-Identifier: MIT */
/* The victim of pyverbs-tests/test_fault_injection.py: two processes (forked
 * before either touches verbs) exchange checked SENDs and WRITEs over RC
 * (and fetch-and-adds) while the test writes garbage into the fabric's
 * shared memory.
 *
 *   sv_fault SECONDS [srq]
 *
 * Each process keeps sending for SECONDS after both are up, with flow
 * control through a board in anonymous shared memory (so that a receiver
 * that falls behind never causes RNR in an undamaged run), checks every
 * message it receives (sequence number and checksum), stops posting at its
 * first error completion or refused post, drains, destroys everything and
 * prints one line:
 *   RESULT <i> sent=N recv_ok=N bad_data=N err_wc=N first_err=<status number, -1: none>
 *          post_err=N bogus=N stall=0|1 (<first error's name>)
 * async=N counts the fatal async events it got (CQ_ERR, QP_FATAL, QP_REQ_ERR,
 * QP_ACCESS_ERR): after one it stops waiting for completions, as an
 * application must, since a CQ in error owes it none.
 * bogus counts completions this program never asked for (a forged CQE);
 * stall=1 means a send stayed outstanding 8 s with no completion at all:
 * the provider neither finished nor failed it.  Exit status 0 whenever the
 * program ran to its end, whatever it counted; the test judges the counts.
 * Before traffic each process prints "INFO <i> qpn=... rkey=... cq=..." and
 * the parent prints "RUNNING" once both are connected. */
#include "svmp.h"

#include <fcntl.h>

#define NRECV 16
#define SLOT 4096
#define WINDOW 8
#define WRITE_AREA (64 * 1024)

struct fault_board {
	_Atomic uint32_t up, go;
	uint32_t qpn[2];
	uint16_t lid[2];
	uint64_t waddr[2];
	uint32_t wrkey[2];
	_Atomic uint64_t reposted[2]; /* receives i has consumed and posted again */
	_Atomic uint32_t done[2];
};

static struct fault_board *fb;

struct counts {
	uint64_t sent, recv_ok, bad_data, err_wc, post_err, bogus, async_err;
	int stall;
	enum ibv_wc_status first_err;
	int have_err;
};

static void note_err(struct counts *c, enum ibv_wc_status st)
{
	c->err_wc++;
	if (!c->have_err) {
		c->have_err = 1;
		c->first_err = st;
	}
}

static uint32_t msg_len(uint64_t seq)
{
	/* Small ones travel in the CQE payload; the others are copied. */
	return (seq & 1) ? 2048 : 64;
}

static int run(int me, int seconds, int use_srq)
{
	struct svt_dev d;
	svt_open(&d, "loop0");
	struct ibv_cq *cq = ibv_create_cq(d.ctx, 256, NULL, NULL, 0);
	CHECK(cq);
	struct ibv_srq *srq = NULL;
	if (use_srq && me == 1) {
		struct ibv_srq_init_attr sa;
		memset(&sa, 0, sizeof(sa));
		sa.attr.max_wr = 64;
		sa.attr.max_sge = 1;
		srq = ibv_create_srq(d.pd, &sa);
		CHECK(srq);
	}
	struct svt_qpopt o = {IBV_QPT_RC, cq, cq, srq, 0, 64, 32, 1, 0};
	struct ibv_qp *qp = svt_qp(&d, &o);
	struct ibv_mr *rmr = svt_mr(&d, NRECV * SLOT, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_mr *smr = svt_mr(&d, WINDOW * SLOT, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_mr *wmr = svt_mr(&d, WRITE_AREA, SVT_ALL_ACCESS);
	fb->qpn[me] = qp->qp_num;
	fb->lid[me] = d.lid;
	fb->waddr[me] = (uintptr_t)wmr->addr;
	fb->wrkey[me] = wmr->rkey;
	printf("INFO %d qpn=%u rkey=%u lkey=%u pid=%d\n", me, qp->qp_num, wmr->rkey, rmr->lkey,
	       (int)getpid());
	fflush(stdout);
	atomic_fetch_add(&fb->up, 1);
	uint64_t end = svt_now_ms() + 10000;
	while (atomic_load(&fb->up) < 2)
		if (svt_now_ms() > end)
			FAIL("peer never came up");
	int peer = 1 - me;
	struct svt_conn c = {IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
				     IBV_ACCESS_REMOTE_ATOMIC,
			     20, 14, 7, 6};
	svt_connect(qp, fb->qpn[peer], fb->lid[peer], &c);
	for (int i = 0; i < NRECV; i++) {
		struct ibv_sge s = svt_sge(rmr, (size_t)i * SLOT, SLOT);
		struct ibv_recv_wr wr = {.wr_id = 1000 + i, .sg_list = &s, .num_sge = 1}, *bad;
		CHECK((srq ? ibv_post_srq_recv(srq, &wr, &bad) : ibv_post_recv(qp, &wr, &bad)) == 0);
	}
	atomic_fetch_add(&fb->go, 1);
	while (atomic_load(&fb->go) < 2)
		if (svt_now_ms() > end)
			FAIL("peer never connected");

	struct counts k;
	memset(&k, 0, sizeof(k));
	uint64_t next_seq = 0, expect_seq = 0, outstanding = 0, consumed = 0;
	uint64_t stop_at = svt_now_ms() + (uint64_t)seconds * 1000;
	uint64_t last_progress = svt_now_ms();
	int posting = 1;
	int afl = fcntl(d.ctx->async_fd, F_GETFL);
	CHECK(afl >= 0 && fcntl(d.ctx->async_fd, F_SETFL, afl | O_NONBLOCK) == 0);
	uint64_t quiet_since = 0;
	for (;;) {
		uint64_t now = svt_now_ms();
		if (now > stop_at)
			posting = 0;
		/* Post while the window and the peer's receives allow. */
		while (posting && outstanding < WINDOW &&
		       next_seq < atomic_load(&fb->reposted[peer]) + NRECV) {
			uint32_t len = msg_len(next_seq);
			size_t off = (size_t)(next_seq % WINDOW) * SLOT;
			svmp_gen((char *)smr->addr + off, len, (uint32_t)me, (uint32_t)next_seq);
			struct ibv_sge s = svt_sge(smr, off, len);
			int r;
			if (next_seq % 4 == 3) {
				/* A WRITE first (unsignaled), every other time a
				 * fetch-and-add (unsignaled, into the end of the slot:
				 * the fabric's atomic locks are taken), then the SEND. */
				struct ibv_send_wr w2, aw, sw, *bad;
				struct ibv_sge as = svt_sge(smr, off + SLOT - 8, 8);
				memset(&w2, 0, sizeof(w2));
				memset(&aw, 0, sizeof(aw));
				memset(&sw, 0, sizeof(sw));
				w2.wr_id = 1;
				w2.opcode = IBV_WR_RDMA_WRITE;
				w2.sg_list = &s;
				w2.num_sge = 1;
				w2.wr.rdma.remote_addr = fb->waddr[peer] + (next_seq % 16) * 2048;
				w2.wr.rdma.rkey = fb->wrkey[peer];
				w2.next = &sw;
				if (next_seq % 8 == 7) {
					aw.wr_id = 2;
					aw.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
					aw.sg_list = &as;
					aw.num_sge = 1;
					aw.wr.atomic.remote_addr =
						fb->waddr[peer] + WRITE_AREA - 8 * (1 + next_seq % 64);
					aw.wr.atomic.rkey = fb->wrkey[peer];
					aw.wr.atomic.compare_add = 1;
					aw.next = &sw;
					w2.next = &aw;
				}
				sw.wr_id = 1u << 31 | next_seq;
				sw.opcode = IBV_WR_SEND;
				sw.sg_list = &s;
				sw.num_sge = 1;
				sw.send_flags = IBV_SEND_SIGNALED;
				r = ibv_post_send(qp, &w2, &bad);
			} else {
				r = svt_post_send1(qp, 1u << 31 | next_seq, IBV_WR_SEND, &s, 1,
						   IBV_SEND_SIGNALED, 0, 0);
			}
			if (r) {
				k.post_err++;
				posting = 0;
				break;
			}
			next_seq++;
			outstanding++;
		}
		struct ibv_wc wc[16];
		int n = ibv_poll_cq(cq, 16, wc);
		if (n < 0) {
			k.post_err++; /* A refused poll: counted as a refusal */
			break;
		}
		for (int i = 0; i < n; i++) {
			last_progress = svt_now_ms();
			if (wc[i].status != IBV_WC_SUCCESS) {
				note_err(&k, wc[i].status);
				posting = 0;
				if (wc[i].wr_id >= (1u << 31) && wc[i].wr_id < (1ull << 32) && outstanding)
					outstanding--;
				continue;
			}
			if (wc[i].opcode == IBV_WC_SEND && wc[i].wr_id >= (1u << 31) &&
			    wc[i].wr_id < (1ull << 32) && outstanding) {
				outstanding--;
				k.sent++;
			} else if (wc[i].opcode == IBV_WC_RECV && wc[i].wr_id >= 1000 &&
				   wc[i].wr_id < 1000 + NRECV) {
				int slot = (int)(wc[i].wr_id - 1000);
				char *buf = (char *)rmr->addr + (size_t)slot * SLOT;
				uint32_t len = msg_len(expect_seq);
				static uint8_t scratch[SLOT];
				uint32_t got;
				if (wc[i].byte_len == len &&
				    svmp_check(buf, len, (uint32_t)peer, (uint32_t)expect_seq, &got,
					       scratch) == SVMP_OK)
					k.recv_ok++;
				else
					k.bad_data++;
				expect_seq++;
				memset(buf, SVMP_POISON, 64);
				struct ibv_sge s = svt_sge(rmr, (size_t)slot * SLOT, SLOT);
				struct ibv_recv_wr wr = {.wr_id = wc[i].wr_id, .sg_list = &s,
							 .num_sge = 1},
						   *bad;
				int r = srq ? ibv_post_srq_recv(srq, &wr, &bad)
					    : ibv_post_recv(qp, &wr, &bad);
				if (r)
					k.post_err++;
				else
					atomic_store(&fb->reposted[me], ++consumed);
			} else {
				k.bogus++;
			}
		}
		struct ibv_async_event ev;
		while (ibv_get_async_event(d.ctx, &ev) == 0) {
			switch (ev.event_type) {
			case IBV_EVENT_CQ_ERR:
			case IBV_EVENT_QP_FATAL:
			case IBV_EVENT_QP_REQ_ERR:
			case IBV_EVENT_QP_ACCESS_ERR:
				/* The device said it failed: nothing more is owed. */
				k.async_err++;
				posting = 0;
				outstanding = 0;
				break;
			default:
				break;
			}
			ibv_ack_async_event(&ev);
		}
		now = svt_now_ms();
		if (outstanding && now - last_progress > 8000) {
			k.stall = 1;
			break;
		}
		if (!posting && !outstanding) {
			atomic_store(&fb->done[me], 1);
			/* Keep serving the peer's messages until it is done too, or
			 * until nothing has arrived for a second. */
			if (!quiet_since || n > 0)
				quiet_since = now;
			if ((atomic_load(&fb->done[peer]) && now - quiet_since > 200) ||
			    now - quiet_since > 1000)
				break;
		}
		if (!n)
			usleep(20);
	}
	printf("RESULT %d sent=%llu recv_ok=%llu bad_data=%llu err_wc=%llu first_err=%d "
	       "post_err=%llu bogus=%llu async=%llu stall=%d (%s)\n",
	       me, (unsigned long long)k.sent, (unsigned long long)k.recv_ok,
	       (unsigned long long)k.bad_data, (unsigned long long)k.err_wc,
	       k.have_err ? (int)k.first_err : -1, (unsigned long long)k.post_err,
	       (unsigned long long)k.bogus, (unsigned long long)k.async_err, k.stall,
	       k.have_err ? ibv_wc_status_str(k.first_err) : "no error");
	fflush(stdout);
	/* Tear down too: destroying objects whose rings were damaged must not
	 * crash or hang either.  Return codes are not judged. */
	ibv_destroy_qp(qp);
	if (srq)
		ibv_destroy_srq(srq);
	ibv_destroy_cq(cq);
	ibv_dereg_mr(rmr);
	ibv_dereg_mr(smr);
	ibv_dereg_mr(wmr);
	ibv_dealloc_pd(d.pd);
	ibv_close_device(d.ctx);
	printf("CLEAN %d\n", me);
	fflush(stdout);
	return 0;
}

int main(int argc, char **argv)
{
	int seconds = argc > 1 ? atoi(argv[1]) : 3;
	int use_srq = argc > 2 && !strcmp(argv[2], "srq");
	setvbuf(stdout, NULL, _IOLBF, 0);
	svmp_seed = 0x5f17;
	fb = mmap(NULL, sizeof(*fb), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	CHECK(fb != MAP_FAILED);
	memset(fb, 0, sizeof(*fb));
	pid_t kids[2];
	for (int i = 0; i < 2; i++) {
		kids[i] = fork();
		CHECK(kids[i] >= 0);
		if (kids[i] == 0) {
			/* A child that hangs is killed by its own alarm: the test sees
			 * the signal, and a hang is never mistaken for success. */
			svt_watchdog(seconds + 40);
			_exit(run(i, seconds, use_srq));
		}
	}
	uint64_t end = svt_now_ms() + 15000;
	while (atomic_load(&fb->go) < 2 && svt_now_ms() < end)
		usleep(1000);
	if (atomic_load(&fb->go) >= 2)
		printf("RUNNING\n");
	fflush(stdout);
	int rc = 0;
	for (int i = 0; i < 2; i++) {
		int st = 0;
		if (waitpid(kids[i], &st, 0) != kids[i])
			continue;
		if (WIFSIGNALED(st)) {
			printf("SIGNAL %d %d\n", i, WTERMSIG(st));
			rc = 2;
		} else if (WEXITSTATUS(st)) {
			printf("EXIT %d %d\n", i, WEXITSTATUS(st));
			if (!rc)
				rc = 1;
		}
	}
	return rc;
}
