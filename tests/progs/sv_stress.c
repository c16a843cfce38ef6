/* SPDX-License-Identifier: MIT */
/* Traffic as real applications make it, between processes, every byte
 * checked (driven by pyverbs-tests/test_stress.py).
 *
 *   sv_stress SCENARIO [-t ms] [-s bytes] [-w window] [-n senders] [-x] [-S seed]
 *                      [-d dev] [-H] [-F corrupt|skip] [-N bytes] [-R n]
 *
 *   bidir        two processes SEND to each other at once, receive buffers
 *                reposted after each completion; one CQ for send and
 *                receive (-x: separate CQs); -s fixes the size, else sizes
 *                cycle through 8 B .. 64 KiB; -w sends in flight (1: "send,
 *                wait for its completion")
 *   resize       the receiver grows and shrinks its receive CQ with
 *                ibv_resize_cq (every -R receive completions, default 50)
 *                while the other process produces into it
 *   srq          -n senders (default 4), each on its own RC QP, into one SRQ
 *   order-write  WRITE then SEND a notice (-N bytes, default 16): when the
 *                notice's completion is polled the WRITE's bytes must all
 *                be there
 *   order-read   the bytes of a READ are there when its completion is polled
 *   service      SEND, WRITE and READ at sizes up to 1 MiB, one at a time
 *                (run it with SOFTVERBS_CMA=0 for the service-copy path)
 *
 * Every received message carries a sequence number and a checksum over a
 * seeded pattern (svmp.h); each process prints "STAT <scenario> proc=N
 * ok=.. lost=.. dup=.. stale=.. corrupt=.. badlen=.. badwc=..", the parent
 * "OK <scenario>" when every count but ok is zero, else it exits 1.  -H:
 * once done, the processes keep their devices open until a line on stdin
 * (the parent prints HOLDING), so that the harness can inspect them.
 * -F: the senders of bidir, resize and srq flip a byte in some messages
 * (corrupt) or skip sequence number 500 (skip): the run must then fail.
 */
#include "svmp.h"

static struct {
	const char *dev;
	int ms;
	uint32_t size;
	int window, senders, separate, hold;
	int fault;	  /* the checker's self-test: FAULT_* */
	uint32_t notice;  /* bytes of order-write's notice SEND */
	int resize_every; /* resize: receive completions between two resizes */
} opt = {"loop0", 2000, 0, 1, 4, 0, 0, 0, 16, 50};

/* Faults a sender injects on purpose (-F), to show the checks fail */
enum { FAULT_NONE, FAULT_CORRUPT, FAULT_SKIP };

static const uint32_t mixed_sizes[] = {8, 64, 176, 177, 256, 4096, 65536};
#define NMIXED (sizeof(mixed_sizes) / sizeof(mixed_sizes[0]))

static uint32_t msg_size(uint32_t stream, uint32_t seq)
{
	return opt.size ? opt.size : mixed_sizes[(seq + stream) % NMIXED];
}

#define GUARD 64 /* poisoned bytes after each message that must stay so */

static int poll_cq(struct ibv_cq *cq, struct ibv_wc *wc, int n)
{
	int got = ibv_poll_cq(cq, n, wc);
	if (got < 0)
		FAIL("proc %d: ibv_poll_cq returned %d", svmp_me, got);
	return got;
}

static void check_wc(struct svmp_stats *st, const struct ibv_wc *wc, const char *what)
{
	if (wc->status == IBV_WC_SUCCESS)
		return;
	FAIL("proc %d: %s: completion wr_id %#llx status %s (vendor_err %u), opcode %d", svmp_me,
	     what, (unsigned long long)wc->wr_id, ibv_wc_status_str(wc->status), wc->vendor_err,
	     wc->opcode);
}

/* ---- bidir, resize and srq: streams of SENDs into reposted buffers ---- */

#define NRECV 32

struct stream_rx {
	struct svmp_stats st;
	uint32_t next;		 /* sequence number expected next */
	uint64_t recvd;		 /* receive completions */
	struct svmp_fifo posted; /* receive buffers, in post order (no SRQ) */
};

struct sendq {
	struct svt_dev d;
	struct ibv_cq *scq, *rcq;
	struct ibv_qp *qp[SVMP_MAXP]; /* by peer */
	struct ibv_srq *srq;
	struct ibv_mr *rmr, *smr;
	uint32_t bufsz;			/* each receive and send buffer */
	int nrecv;			/* receive buffers */
	int window;			/* sends in flight at most */
	uint64_t sent, scomp;		/* sends posted, send completions */
	uint32_t skipped;		/* sequence numbers skipped (-F skip) */
	struct stream_rx rx[SVMP_MAXP]; /* by sending peer */
	uint32_t qpn_peer[SVMP_MAXP];	/* local qp_num by peer, for SRQ completions */
	int npeers;
	uint64_t resizes, resize_every, recvd_all;
	int resize_k;
	uint8_t *scratch;
	int batch; /* completions per poll */
};

static const int resize_cycle[] = {4096, 40, 1024, 33, 256, 64, 2048, 48, 512, 36};

static void do_resize(struct sendq *q)
{
	int want = resize_cycle[q->resize_k++ % (sizeof(resize_cycle) / sizeof(int))];
	int rc = ibv_resize_cq(q->rcq, want);
	if (rc)
		FAIL("proc %d: ibv_resize_cq(%d) returned %d (%s) after %llu resizes", svmp_me,
		     want, rc, strerror(rc), (unsigned long long)q->resizes);
	if (q->rcq->cqe < want)
		FAIL("proc %d: ibv_resize_cq(%d) left cqe %d", svmp_me, want, q->rcq->cqe);
	q->resizes++;
}

static int peer_of_qpn(struct sendq *q, uint32_t qpn)
{
	for (int j = 0; j < SVMP_MAXP; j++)
		if (q->qp[j] && q->qpn_peer[j] == qpn)
			return j;
	FAIL("proc %d: completion for unknown qp_num %u", svmp_me, qpn);
}

/* In a receive's wr_id, with the buffer's index; a send's is its number */
#define RXTAG (1ULL << 63)

static void sendq_handle(struct sendq *q, const struct ibv_wc *wc)
{
	/* By wr_id: an error completion's opcode is undefined */
	if (!(wc->wr_id & RXTAG)) {
		check_wc(&q->rx[0].st, wc, "send");
		if (wc->opcode != IBV_WC_SEND)
			FAIL("proc %d: send completion with opcode %d", svmp_me, wc->opcode);
		if (wc->wr_id != q->scomp)
			FAIL("proc %d: send completion wr_id %llu, expected %llu (out of order "
			     "or lost)",
			     svmp_me, (unsigned long long)wc->wr_id, (unsigned long long)q->scomp);
		q->scomp++;
		return;
	}
	int peer = peer_of_qpn(q, wc->qp_num);
	struct stream_rx *rx = &q->rx[peer];
	check_wc(&rx->st, wc, "receive");
	if (wc->opcode != IBV_WC_RECV)
		FAIL("proc %d: receive completion opcode %d", svmp_me, wc->opcode);
	uint64_t buf = wc->wr_id & ~RXTAG;
	if (buf >= (uint64_t)q->nrecv)
		FAIL("proc %d: receive wr_id %llu out of range", svmp_me, (unsigned long long)buf);
	if (!q->srq) {
		int skipped = svmp_fifo_take(&rx->posted, (uint32_t)buf);
		if (skipped) {
			rx->st.badwc += skipped > 0 ? (uint64_t)skipped : 1;
			if (rx->st.reported++ < 8)
				fprintf(stderr,
					"proc %d: receive completion for buffer %llu: %d receives "
					"posted before it never completed\n",
					svmp_me, (unsigned long long)buf, skipped);
		}
		svmp_fifo_push(&rx->posted, (uint32_t)buf);
	}
	rx->recvd++;
	size_t off = (size_t)buf * q->bufsz;
	uint8_t *p = (uint8_t *)q->rmr->addr + off;
	uint32_t len = wc->byte_len;
	if (len + GUARD > q->bufsz) {
		rx->st.badlen++;
		FAIL("proc %d: byte_len %u larger than the buffer", svmp_me, len);
	}
	uint32_t seq;
	svmp_account(&rx->st, "SEND", p, len, (uint32_t)peer, &rx->next, &seq, q->scratch);
	if (len != msg_size((uint32_t)peer, seq)) {
		rx->st.badlen++;
		if (rx->st.reported++ < 8)
			fprintf(stderr, "proc %d: message %u from %d: byte_len %u, sent %u\n",
				svmp_me, seq, peer, len, msg_size((uint32_t)peer, seq));
	}
	svmp_guard(&rx->st, "SEND", p, len, GUARD);
	CHECK(svmp_post_recv_buf(q->qp[peer], q->srq, RXTAG | buf, q->rmr, off, q->bufsz,
				 len + GUARD) == 0);
	q->recvd_all++;
	/* Resize while completions may sit in the CQ and the peer produces */
	if (q->resize_every && q->recvd_all % q->resize_every == 0)
		do_resize(q);
}

static void sendq_poll(void *arg)
{
	struct sendq *q = arg;
	struct ibv_wc wc[16];
	int n = poll_cq(q->scq, wc, q->batch);
	for (int i = 0; i < n; i++)
		sendq_handle(q, &wc[i]);
	if (q->rcq != q->scq) {
		n = poll_cq(q->rcq, wc, q->batch);
		for (int i = 0; i < n; i++)
			sendq_handle(q, &wc[i]);
	}
}

static uint32_t round_up(uint32_t v, uint32_t a)
{
	return (v + a - 1) / a * a;
}

/* One process's side: a QP for each peer in peers[], receives posted. */
static void sendq_init(struct sendq *q, const int *peers, int npeers, int nrecv, int use_srq,
		       int rcq_entries)
{
	memset(q, 0, sizeof(*q));
	svt_open(&q->d, opt.dev);
	q->batch = 16;
	q->window = opt.window;
	q->nrecv = nrecv;
	q->bufsz = round_up((opt.size ? opt.size : 65536) + GUARD, 4096);
	q->scratch = malloc(q->bufsz);
	CHECK(q->scratch);
	q->scq = ibv_create_cq(q->d.ctx, 1024, NULL, NULL, 0);
	CHECK(q->scq);
	q->rcq = q->scq;
	if (opt.separate || rcq_entries) {
		q->rcq = ibv_create_cq(q->d.ctx, rcq_entries ? rcq_entries : 1024, NULL, NULL, 0);
		CHECK(q->rcq);
	}
	if (use_srq) {
		struct ibv_srq_init_attr sa;
		memset(&sa, 0, sizeof(sa));
		sa.attr.max_wr = (uint32_t)nrecv;
		sa.attr.max_sge = 1;
		q->srq = ibv_create_srq(q->d.pd, &sa);
		CHECK(q->srq);
	}
	q->rmr = svt_mr(&q->d, (size_t)nrecv * q->bufsz, IBV_ACCESS_LOCAL_WRITE);
	q->smr = svt_mr(&q->d, (size_t)q->window * q->bufsz, IBV_ACCESS_LOCAL_WRITE);
	memset(q->rmr->addr, SVMP_POISON, q->rmr->length);
	for (int k = 0; k < npeers; k++) {
		int j = peers[k];
		struct svt_qpopt o = {IBV_QPT_RC, q->scq,	   q->rcq, q->srq, 0,
				      256,	  (uint32_t)nrecv, 1,	   0};
		q->qp[j] = svt_qp(&q->d, &o);
		q->qpn_peer[j] = q->qp[j]->qp_num;
		svmp_publish(j, q->qp[j], q->d.lid, NULL);
	}
	q->npeers = npeers;
	svmp_barrier(30000, NULL, NULL);
	for (int k = 0; k < npeers; k++) {
		int j = peers[k];
		svmp_connect(q->qp[j], &svmp_b->ep[j][svmp_me]);
		if (!use_srq)
			for (int b = 0; b < nrecv; b++) {
				CHECK(svmp_post_recv_buf(q->qp[j], NULL, RXTAG | (uint64_t)b,
							 q->rmr, (size_t)b * q->bufsz, q->bufsz,
							 0) == 0);
				svmp_fifo_push(&q->rx[j].posted, (uint32_t)b);
			}
	}
	if (use_srq)
		for (int b = 0; b < nrecv; b++)
			CHECK(svmp_post_recv_buf(NULL, q->srq, RXTAG | (uint64_t)b, q->rmr,
						 (size_t)b * q->bufsz, q->bufsz, 0) == 0);
	/* Every side is connected with its receives posted before anyone sends */
	svmp_barrier(30000, NULL, NULL);
}

static void sendq_post(struct sendq *q, int peer)
{
	if (opt.fault == FAULT_SKIP && q->sent == 500 && !q->skipped)
		q->skipped = 1;
	uint32_t seq = (uint32_t)q->sent + q->skipped;
	uint32_t len = msg_size((uint32_t)svmp_me, seq);
	size_t off = (size_t)(q->sent % (uint64_t)q->window) * q->bufsz;
	uint8_t *p = (uint8_t *)q->smr->addr + off;
	svmp_gen(p, len, (uint32_t)svmp_me, seq);
	if (opt.fault == FAULT_CORRUPT && seq % 997 == 500)
		p[len / 2] ^= 0x10;
	struct ibv_sge s = svt_sge(q->smr, off, len);
	int rc = svt_post_send1(q->qp[peer], q->sent, IBV_WR_SEND, &s, 1, IBV_SEND_SIGNALED, 0, 0);
	if (rc)
		FAIL("proc %d: ibv_post_send returned %d (%s) with %llu in flight", svmp_me, rc,
		     strerror(rc), (unsigned long long)(q->sent - q->scomp));
	q->sent++;
}

static int stop_at_deadline(struct sendq *q, uint64_t end)
{
	return svt_now_ms() >= end;
}

static int stop_on_flag(struct sendq *q, uint64_t end)
{
	return atomic_load(&svmp_b->stop) != 0;
}

/* Sends to peer until stop() says so, then waits for every completion. */
static void sendq_run_sender(struct sendq *q, int peer, uint64_t end,
			     int (*stop)(struct sendq *, uint64_t))
{
	while (!stop(q, end)) {
		svmp_abort_if_failed();
		if (q->sent - q->scomp < (uint64_t)q->window)
			sendq_post(q, peer);
		sendq_poll(q);
	}
	uint64_t until = svt_now_ms() + 20000;
	while (q->scomp < q->sent) {
		svmp_abort_if_failed();
		if (svt_now_ms() > until)
			FAIL("proc %d: %llu of %llu sends never completed", svmp_me,
			     (unsigned long long)(q->sent - q->scomp), (unsigned long long)q->sent);
		sendq_poll(q);
	}
}

/* Publishes what this process sent, waits for what its peers sent to
 * arrive, prints the counts; returns the number of bad messages. */
static uint64_t sendq_finish(struct sendq *q, const char *name, const int *peers, int npeers)
{
	for (int k = 0; k < npeers; k++)
		atomic_store(&svmp_b->u[svmp_me][peers[k]][0], q->sent);
	svmp_barrier(opt.ms + 30000, sendq_poll, q);
	struct svmp_stats all;
	memset(&all, 0, sizeof(all));
	uint64_t expected = 0, recvd = 0;
	for (int k = 0; k < npeers; k++) {
		int j = peers[k];
		struct stream_rx *rx = &q->rx[j];
		uint64_t want = atomic_load(&svmp_b->u[j][svmp_me][0]);
		/* Every send completed at its sender: the receives are here, or lost */
		uint64_t until = svt_now_ms() + 5000;
		while (rx->recvd < want && svt_now_ms() < until)
			sendq_poll(q);
		if (rx->next < want) {
			fprintf(stderr,
				"proc %d: from %d: %llu messages sent, %llu completions, "
				"next expected seq %u\n",
				svmp_me, j, (unsigned long long)want, (unsigned long long)rx->recvd,
				rx->next);
			rx->st.lost += want - rx->next;
		}
		/* More completions than messages sent: duplicates, whatever they held */
		if (rx->recvd > want && rx->st.dup < rx->recvd - want)
			rx->st.dup = rx->recvd - want;
		expected += want;
		recvd += rx->recvd;
		all.ok += rx->st.ok;
		all.lost += rx->st.lost;
		all.dup += rx->st.dup;
		all.stale += rx->st.stale;
		all.corrupt += rx->st.corrupt;
		all.badlen += rx->st.badlen;
		all.badwc += rx->st.badwc;
	}
	/* Nobody exits while a peer still polls for its messages */
	svmp_barrier(30000, sendq_poll, q);
	char extra[160];
	snprintf(extra, sizeof(extra), "sent=%llu expected=%llu recvd=%llu resizes=%llu",
		 (unsigned long long)q->sent, (unsigned long long)expected,
		 (unsigned long long)recvd, (unsigned long long)q->resizes);
	svmp_print_stats(name, &all, extra);
	return svmp_bad(&all);
}

static void child_bidir(int me)
{
	struct sendq q;
	int peer = 1 - me;
	sendq_init(&q, &peer, 1, NRECV, 0, 0);
	sendq_run_sender(&q, peer, svt_now_ms() + opt.ms, stop_at_deadline);
	if (sendq_finish(&q, "bidir", &peer, 1))
		exit(1);
}

/* Process 0 receives and resizes its receive CQ; process 1 produces. */
static void child_resize(int me)
{
	struct sendq q;
	int peer = 1 - me;
	/* NRECV receives at most are outstanding: a CQ of more than NRECV
	 * entries can always hold them, so every resize in the cycle is legal. */
	sendq_init(&q, &peer, 1, NRECV, 0, me == 0 ? 64 : 0);
	if (me == 1) {
		sendq_run_sender(&q, peer, 0, stop_on_flag);
	} else {
		q.resize_every = (uint64_t)opt.resize_every;
		q.batch = 4; /* leave completions in the CQ across the resizes */
		uint64_t end = svt_now_ms() + opt.ms;
		/* At least 20 resizes however slow the machine: the watchdog bounds it */
		while (svt_now_ms() < end || q.resizes < 20) {
			svmp_abort_if_failed();
			sendq_poll(&q);
		}
		atomic_store(&svmp_b->stop, 1);
	}
	if (sendq_finish(&q, "resize", &peer, 1))
		exit(1);
}

/* Process 0 receives through one SRQ; processes 1..n send. */
static void child_srq(int me)
{
	struct sendq q;
	if (me == 0) {
		int peers[SVMP_MAXP];
		for (int j = 1; j <= opt.senders; j++)
			peers[j - 1] = j;
		sendq_init(&q, peers, opt.senders, 4 * NRECV, 1, 0);
		if (sendq_finish(&q, "srq", peers, opt.senders))
			exit(1);
	} else {
		int peer = 0;
		sendq_init(&q, &peer, 1, NRECV, 0, 0);
		sendq_run_sender(&q, peer, svt_now_ms() + opt.ms, stop_at_deadline);
		if (sendq_finish(&q, "srq", &peer, 1))
			exit(1);
	}
}

/* ---- order-write, order-read, service: process 0 acts on process 1 ---- */

#define MAXW (1u << 20)
#define NSLOT 8
#define SLOTSZ (MAXW + 4096)	       /* a message and its guard */
#define REG_W ((size_t)NSLOT * SLOTSZ) /* WRITE targets, at the target */
#define REG_R ((size_t)2 << 20)	       /* READ source, after them */
#define PRECV 8
#define NSMALL 64
#define OFF_SRC 0
#define OFF_RDST ((size_t)NSLOT * SLOTSZ)
#define OFF_RECV (2 * (size_t)NSLOT * SLOTSZ)
#define OFF_SMALL (OFF_RECV + (size_t)PRECV * SLOTSZ)
#define SMALLSZ 1024 /* notices and acks */
#define LOC_LEN (OFF_SMALL + NSMALL * SMALLSZ)

enum { K_RECV = 1, K_NOTICE, K_ACK, K_WRITE, K_READ, K_SEND };
#define WRID(k, i) ((uint64_t)(k) << 56 | (uint64_t)(i))
#define WRKIND(w) ((int)((w) >> 56))
#define WRIDX(w) ((w)&0xffffffffffffffULL)

enum { ST_WRITE = 2, ST_NOTICE = 3, ST_ACK = 4, ST_READ = 5, ST_SEND = 6 };
enum { PH_WRITE, PH_READ, PH_SEND };

static const uint32_t order_sizes[] = {8, 64, 176, 177, 4096, 65536, 262144};
static const uint32_t service_sizes[] = {1, 8, 176, 177, 4095, 4096, 65537, 262144, 1048576};

struct pair {
	struct svt_dev d;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *reg, *loc;
	struct svmp_ep rem;
	const uint32_t *sizes;
	int nsizes, phase, window;
	struct svmp_stats st;
	uint8_t *scratch, *rsrc; /* rsrc: what the target's READ source holds */
	/* the actor's side */
	uint64_t posted, acked, reads_done;
	uint32_t ack_next;
	uint32_t rd_off[NSLOT], rd_len[NSLOT];
	uint64_t writes, sends, reads;
	/* the target's side */
	uint32_t notice_next, wnext, send_next;
	uint64_t acks_sent, handled;
	uint64_t small_sent;
};

static uint32_t pair_size(struct pair *p, uint64_t seq)
{
	return opt.size ? opt.size : p->sizes[seq % (uint64_t)p->nsizes];
}

static uint8_t *loc_at(struct pair *p, size_t off)
{
	return (uint8_t *)p->loc->addr + off;
}

static void pair_small_send(struct pair *p, int kind, uint32_t stream, uint32_t seq, uint32_t len)
{
	size_t off = OFF_SMALL + (size_t)(p->small_sent++ % NSMALL) * SMALLSZ;
	svmp_gen(loc_at(p, off), len, stream, seq);
	struct ibv_sge s = svt_sge(p->loc, off, len);
	int rc =
	    svt_post_send1(p->qp, WRID(kind, seq), IBV_WR_SEND, &s, 1, IBV_SEND_SIGNALED, 0, 0);
	if (rc)
		FAIL("proc %d: post_send (small) returned %d", svmp_me, rc);
}

/* The target: a notice (after a WRITE) or a SEND arrived in buffer b. */
static void pair_target_recv(struct pair *p, uint8_t *buf, uint32_t len)
{
	uint32_t seq;
	if (p->phase == PH_WRITE) {
		uint32_t want = p->notice_next;
		/* A duplicate notice names an old WRITE: check the one due instead */
		if (svmp_account(&p->st, "notice", buf, len, ST_NOTICE, &p->notice_next, &seq,
				 p->scratch) == SVMP_OLD)
			seq = want;
		if (len != opt.notice)
			p->st.badlen++;
		uint32_t wlen = pair_size(p, seq);
		uint8_t *w = (uint8_t *)p->reg->addr + (size_t)(seq % NSLOT) * SLOTSZ;
		/* The point of the scenario: the WRITE before the notice is in place */
		svmp_account(&p->st, "WRITE data at notice", w, wlen, ST_WRITE, &p->wnext, &seq,
			     p->scratch);
		svmp_guard(&p->st, "WRITE data", w, wlen, GUARD);
		memset(w, SVMP_POISON, wlen + GUARD);
	} else {
		svmp_account(&p->st, "SEND", buf, len, ST_SEND, &p->send_next, &seq, p->scratch);
		if (len != pair_size(p, seq)) {
			p->st.badlen++;
			fprintf(stderr, "proc %d: SEND %u: byte_len %u, sent %u\n", svmp_me, seq,
				len, pair_size(p, seq));
		}
		svmp_guard(&p->st, "SEND", buf, len, GUARD);
	}
	p->handled++;
	pair_small_send(p, K_ACK, ST_ACK, (uint32_t)p->acks_sent++, 8);
}

static void pair_read_done(struct pair *p, uint32_t slot)
{
	uint8_t *dst = loc_at(p, OFF_RDST + (size_t)slot * SLOTSZ);
	uint32_t len = p->rd_len[slot], off = p->rd_off[slot];
	const uint8_t *want = p->rsrc + off;
	p->reads_done++;
	if (!memcmp(dst, want, len)) {
		p->st.ok++;
	} else {
		int stale = svmp_all(dst, len, SVMP_POISON);
		if (stale)
			p->st.stale++;
		else
			p->st.corrupt++;
		if (p->st.reported++ < 8) {
			size_t d = 0;
			while (d < len && dst[d] == want[d])
				d++;
			fprintf(stderr,
				"proc %d: READ of %u bytes at %u: %s when its completion "
				"was polled, first bad byte %zu\n",
				svmp_me, len, off, stale ? "not in place" : "wrong bytes", d);
		}
	}
	svmp_guard(&p->st, "READ", dst, len, GUARD);
}

static void pair_handle(struct pair *p, const struct ibv_wc *wc)
{
	int kind = WRKIND(wc->wr_id);
	uint64_t idx = WRIDX(wc->wr_id);
	check_wc(&p->st, wc, "pair");
	switch (kind) {
	case K_RECV: {
		if (idx >= PRECV)
			FAIL("proc %d: receive wr_id %llu", svmp_me, (unsigned long long)idx);
		size_t off = OFF_RECV + (size_t)idx * SLOTSZ;
		uint8_t *buf = loc_at(p, off);
		if (wc->byte_len + GUARD > SLOTSZ)
			FAIL("proc %d: byte_len %u", svmp_me, wc->byte_len);
		if (svmp_me == 0) {
			uint32_t seq;
			svmp_account(&p->st, "ack", buf, wc->byte_len, ST_ACK, &p->ack_next, &seq,
				     p->scratch);
			p->acked++;
		} else {
			pair_target_recv(p, buf, wc->byte_len);
		}
		CHECK(svmp_post_recv_buf(p->qp, NULL, wc->wr_id, p->loc, off, SLOTSZ,
					 wc->byte_len + GUARD) == 0);
		break;
	}
	case K_READ:
		pair_read_done(p, (uint32_t)idx);
		break;
	case K_NOTICE:
	case K_ACK:
	case K_SEND:
		break;
	default:
		FAIL("proc %d: completion for wr_id %#llx (unsignaled WRITE?)", svmp_me,
		     (unsigned long long)wc->wr_id);
	}
}

static void pair_poll(void *arg)
{
	struct pair *p = arg;
	struct ibv_wc wc[16];
	int n = poll_cq(p->cq, wc, 16);
	for (int i = 0; i < n; i++)
		pair_handle(p, &wc[i]);
}

static void pair_init(struct pair *p)
{
	memset(p, 0, sizeof(*p));
	int peer = 1 - svmp_me;
	svt_open(&p->d, opt.dev);
	p->cq = ibv_create_cq(p->d.ctx, 512, NULL, NULL, 0);
	CHECK(p->cq);
	struct svt_qpopt o = {IBV_QPT_RC, p->cq, p->cq, NULL, 0, 128, PRECV, 1, 0};
	p->qp = svt_qp(&p->d, &o);
	p->reg = svt_mr(&p->d, REG_W + REG_R, SVT_ALL_ACCESS);
	p->loc = svt_mr(&p->d, LOC_LEN, IBV_ACCESS_LOCAL_WRITE);
	p->scratch = malloc(SLOTSZ);
	p->rsrc = malloc(REG_R);
	CHECK(p->scratch && p->rsrc);
	memset(p->reg->addr, SVMP_POISON, REG_W);
	svmp_gen(p->rsrc, REG_R, ST_READ, 0);
	memcpy((uint8_t *)p->reg->addr + REG_W, p->rsrc, REG_R);
	memset(p->loc->addr, SVMP_POISON, LOC_LEN);
	svmp_publish(peer, p->qp, p->d.lid, p->reg);
	svmp_barrier(30000, NULL, NULL);
	p->rem = svmp_b->ep[peer][svmp_me];
	svmp_connect(p->qp, &p->rem);
	for (int b = 0; b < PRECV; b++)
		CHECK(svmp_post_recv_buf(p->qp, NULL, WRID(K_RECV, b), p->loc,
					 OFF_RECV + (size_t)b * SLOTSZ, SLOTSZ, 0) == 0);
	svmp_barrier(30000, NULL, NULL);
}

static void pair_post(struct pair *p)
{
	uint64_t seq = p->posted;
	uint32_t len = pair_size(p, seq);
	uint32_t slot = (uint32_t)(seq % NSLOT);
	size_t soff = OFF_SRC + (size_t)slot * SLOTSZ;
	int rc = 0;
	if (p->phase == PH_WRITE) {
		svmp_gen(loc_at(p, soff), len, ST_WRITE, (uint32_t)seq);
		struct ibv_sge s = svt_sge(p->loc, soff, len);
		/* Unsignaled: the notice's completion covers it */
		rc = svt_post_send1(p->qp, WRID(K_WRITE, seq), IBV_WR_RDMA_WRITE, &s, 1, 0,
				    p->rem.addr + (size_t)slot * SLOTSZ, p->rem.rkey);
		if (rc)
			FAIL("proc %d: post WRITE returned %d", svmp_me, rc);
		pair_small_send(p, K_NOTICE, ST_NOTICE, (uint32_t)seq, opt.notice);
		p->writes++;
	} else if (p->phase == PH_SEND) {
		svmp_gen(loc_at(p, soff), len, ST_SEND, (uint32_t)seq);
		struct ibv_sge s = svt_sge(p->loc, soff, len);
		rc = svt_post_send1(p->qp, WRID(K_SEND, seq), IBV_WR_SEND, &s, 1, IBV_SEND_SIGNALED,
				    0, 0);
		if (rc)
			FAIL("proc %d: post SEND returned %d", svmp_me, rc);
		p->sends++;
	} else {
		uint64_t r = svmp_mix(svmp_seed ^ seq);
		uint32_t off = (uint32_t)(r % (REG_R - len + 1));
		size_t doff = OFF_RDST + (size_t)slot * SLOTSZ;
		memset(loc_at(p, doff), SVMP_POISON, len + GUARD);
		p->rd_off[slot] = off;
		p->rd_len[slot] = len;
		struct ibv_sge s = svt_sge(p->loc, doff, len);
		rc = svt_post_send1(p->qp, WRID(K_READ, slot), IBV_WR_RDMA_READ, &s, 1,
				    IBV_SEND_SIGNALED, p->rem.addr + REG_W + off, p->rem.rkey);
		if (rc)
			FAIL("proc %d: post READ returned %d", svmp_me, rc);
		p->reads++;
	}
	p->posted++;
}

/* One phase: the actor posts for ms (and at least one pass through the
 * sizes) with at most window in flight; the target answers from within
 * the closing barrier.  Returns nothing: the counts are checked after. */
static void pair_phase(struct pair *p, int phase, const uint32_t *sizes, int nsizes, int ms)
{
	p->phase = phase;
	p->sizes = sizes;
	p->nsizes = nsizes;
	p->posted = p->acked = p->reads_done = 0;
	p->ack_next = p->notice_next = p->wnext = p->send_next = 0;
	p->acks_sent = p->handled = 0;
	int window = opt.window < NSLOT ? opt.window : NSLOT;
	svmp_barrier(30000, NULL, NULL);
	if (svmp_me == 0) {
		uint64_t end = svt_now_ms() + ms;
		/* WRITE/SEND: in flight until acknowledged; READ: until completed */
		uint64_t *done = phase == PH_READ ? &p->reads_done : &p->acked;
		while (svt_now_ms() < end || p->posted < (uint64_t)nsizes) {
			svmp_abort_if_failed();
			if (p->posted - *done < (uint64_t)window)
				pair_post(p);
			pair_poll(p);
		}
		uint64_t until = svt_now_ms() + 20000;
		while (*done < p->posted) {
			svmp_abort_if_failed();
			if (svt_now_ms() > until) {
				p->st.lost += p->posted - *done;
				fprintf(stderr, "proc 0: %llu of %llu operations never answered\n",
					(unsigned long long)(p->posted - *done),
					(unsigned long long)p->posted);
				break;
			}
			pair_poll(p);
		}
		atomic_store(&svmp_b->u[0][1][phase], p->posted);
	}
	svmp_barrier(ms + 30000, pair_poll, p);
	if (svmp_me == 1 && phase != PH_READ) {
		uint64_t want = atomic_load(&svmp_b->u[0][1][phase]);
		if (p->handled < want) {
			fprintf(stderr, "proc 1: %llu of %llu messages never arrived\n",
				(unsigned long long)(want - p->handled), (unsigned long long)want);
			p->st.lost += want - p->handled;
		}
	}
}

static void pair_end(struct pair *p, const char *name)
{
	/* The target's last acks complete before anyone exits */
	svmp_barrier(30000, pair_poll, p);
	char extra[128];
	snprintf(extra, sizeof(extra), "writes=%llu sends=%llu reads=%llu",
		 (unsigned long long)p->writes, (unsigned long long)p->sends,
		 (unsigned long long)p->reads);
	svmp_print_stats(name, &p->st, extra);
	if (svmp_bad(&p->st))
		exit(1);
}

#define NSIZES(a) ((int)(sizeof(a) / sizeof((a)[0])))

static void child_order_write(int me)
{
	struct pair p;
	pair_init(&p);
	pair_phase(&p, PH_WRITE, order_sizes, NSIZES(order_sizes), opt.ms);
	pair_end(&p, "order-write");
}

static void child_order_read(int me)
{
	struct pair p;
	pair_init(&p);
	pair_phase(&p, PH_READ, order_sizes, NSIZES(order_sizes), opt.ms);
	pair_end(&p, "order-read");
}

static void child_service(int me)
{
	struct pair p;
	pair_init(&p);
	int n = NSIZES(service_sizes);
	pair_phase(&p, PH_SEND, service_sizes, n, opt.ms / 3);
	pair_phase(&p, PH_WRITE, service_sizes, n, opt.ms / 3);
	pair_phase(&p, PH_READ, service_sizes, n, opt.ms / 3);
	pair_end(&p, "service");
}

static const struct {
	const char *name;
	void (*child)(int);
	int procs; /* 0: 1 + senders */
} scenarios[] = {
    {"bidir", child_bidir, 2},
    {"resize", child_resize, 2},
    {"srq", child_srq, 0},
    {"order-write", child_order_write, 2},
    {"order-read", child_order_read, 2},
    {"service", child_service, 2},
};

static void usage(void)
{
	fprintf(stderr, "usage: sv_stress SCENARIO [-t ms] [-s bytes] [-w window] [-n senders] "
			"[-x] [-S seed] [-d dev] [-H] [-F corrupt|skip] [-N bytes] [-R n]\n"
			"scenarios:");
	for (size_t i = 0; i < sizeof(scenarios) / sizeof(scenarios[0]); i++)
		fprintf(stderr, " %s", scenarios[i].name);
	fputc('\n', stderr);
	exit(2);
}

int main(int argc, char **argv)
{
	if (argc < 2)
		usage();
	const char *name = argv[1];
	svmp_seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
	int c;
	optind = 2;
	while ((c = getopt(argc, argv, "t:s:w:n:xS:d:HF:N:R:")) != -1) {
		switch (c) {
		case 't':
			opt.ms = (int)svmp_parse_u64(optarg, "duration");
			break;
		case 's':
			opt.size = (uint32_t)svmp_parse_u64(optarg, "size");
			if (opt.size < 8 || opt.size > MAXW)
				FAIL("size %u out of 8..%u", opt.size, MAXW);
			break;
		case 'w':
			opt.window = (int)svmp_parse_u64(optarg, "window");
			if (opt.window < 1 || opt.window > 64)
				FAIL("window %d out of 1..64", opt.window);
			break;
		case 'n':
			opt.senders = (int)svmp_parse_u64(optarg, "senders");
			if (opt.senders < 1 || opt.senders >= SVMP_MAXP)
				FAIL("senders %d out of 1..%d", opt.senders, SVMP_MAXP - 1);
			break;
		case 'x':
			opt.separate = 1;
			break;
		case 'R':
			opt.resize_every = (int)svmp_parse_u64(optarg, "resize interval");
			if (opt.resize_every < 1)
				FAIL("resize interval must be at least 1");
			break;
		case 'N':
			opt.notice = (uint32_t)svmp_parse_u64(optarg, "notice size");
			if (opt.notice < 8 || opt.notice > SMALLSZ)
				FAIL("notice size %u out of 8..%u", opt.notice, SMALLSZ);
			break;
		case 'S':
			svmp_seed = svmp_parse_u64(optarg, "seed");
			break;
		case 'd':
			opt.dev = optarg;
			break;
		case 'H':
			opt.hold = 1;
			break;
		case 'F':
			if (!strcmp(optarg, "corrupt"))
				opt.fault = FAULT_CORRUPT;
			else if (!strcmp(optarg, "skip"))
				opt.fault = FAULT_SKIP;
			else
				FAIL("fault '%s': corrupt or skip", optarg);
			break;
		default:
			usage();
		}
	}
	if (opt.size > 65536 &&
	    (!strcmp(name, "bidir") || !strcmp(name, "resize") || !strcmp(name, "srq")))
		FAIL("SEND streams take sizes up to 65536");
	setvbuf(stdout, NULL, _IOLBF, 0);
	for (size_t i = 0; i < sizeof(scenarios) / sizeof(scenarios[0]); i++) {
		if (strcmp(scenarios[i].name, name))
			continue;
		int n = scenarios[i].procs ? scenarios[i].procs : 1 + opt.senders;
		printf("SEED %llu scenario %s procs %d ms %d size %u window %d%s\n",
		       (unsigned long long)svmp_seed, name, n, opt.ms, opt.size, opt.window,
		       opt.separate ? " separate-cqs" : "");
		int bad = svmp_run(n, opt.ms + 90000, scenarios[i].child, opt.hold);
		if (bad) {
			printf("FAILED %s (seed %llu)\n", name, (unsigned long long)svmp_seed);
			return 1;
		}
		printf("OK %s\n", name);
		return 0;
	}
	usage();
}
