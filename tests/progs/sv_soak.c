/* SPDX-License-Identifier: MIT */
/* Soak: N processes, RC fully connected, random SEND, WRITE, READ and
 * atomics of random sizes for a given time, every byte checked.
 *
 *   sv_soak [-n procs] [-t seconds] [-S seed] [-d dev] [-F freeze_ms]
 *
 * -F: the parent stops one process at a time for freeze_ms (SIGSTOP, then
 * SIGCONT; svmp.h's freezer), so its peers' operations meet a peer that
 * does not run: they may take longer, never fail or lose a byte.
 * Every process has one RC QP to every other.  Per QP, with up to WINDOW
 * work requests in flight, it draws an operation:
 *   SEND         size 0..64 KiB (biased to small) drawn from (stream, seq),
 *                so the receiver knows what to expect; checked byte for
 *                byte, in order, into receive buffers reposted after each
 *                completion (svmp.h's sequence numbers and checksums)
 *   WRITE + READ a random-size WRITE into the writer's own area at the
 *                peer, READ back into a poisoned buffer and compared
 *   READ         a random range of the peer's read source (a known pattern)
 *   FETCH_ADD    random addends on the peer's counter: the fetched values
 *                of one adder must grow, the final value must be the sum
 *   CMP_SWP      increments of the peer's shared counter by compare and
 *                swap (final value = successful swaps of all), and of a
 *                counter private to the pair (every swap must succeed)
 * CQs: per peer, the QP's send and receive CQ are the process's shared CQ,
 * or two CQs of its own, or a mix, by (me + peer) % 3.
 *
 * The parent forks the processes before any verbs call, kills them all
 * when one fails or the run overruns by a minute, and prints
 * "SOAK OK seed=S" or "SOAK FAILED seed=S" (exit 1).  Every process prints
 * a STAT line.  The same seed gives every process the same choices.
 */
#include "svmp.h"

#define WINDOW 16
#define NRECVB 16
#define MAXMSG 65536u
#define GUARD 64
#define SLOT (MAXMSG + 4096u)
#define RSRC ((size_t)1 << 20)
#define RECV_TAG (1ULL << 63) /* in a receive's wr_id; a send's is peer << 48 | n */

enum { OP_SEND = 1, OP_WRITE, OP_READBACK, OP_READ, OP_FADD, OP_CAS, OP_PCAS };
static const char *const op_name[] = {"",     "SEND",	   "WRITE",   "READBACK",
				      "READ", "FETCH_ADD", "CMP_SWP", "CMP_SWP(private)"};

/* Board words, u[from][to][...] */
enum { U_SENDS, U_FADD_SUM, U_CAS_OK, U_PCAS };

static int nprocs = 4, secs = 30;
static const char *dev = "loop0";

/* The remote region of every process */
#define R_WA(i) ((size_t)(i)*SLOT)		/* written by peer i only */
#define R_RS ((size_t)SVMP_MAXP * SLOT)		/* read source */
#define R_FADD (R_RS + RSRC)			/* fetch-add counter */
#define R_CAS (R_FADD + 8)			/* shared CAS counter */
#define R_PCAS(i) (R_CAS + 8 + 8 * (size_t)(i)) /* private to peer i */
#define R_LEN (R_PCAS(SVMP_MAXP) + 64)

struct op {
	int kind;
	uint32_t len, seq, roff;
	uint64_t arg; /* add value, or the compare value */
};

struct conn {
	int peer, cqmode;
	struct ibv_qp *qp;
	struct ibv_cq *scq, *rcq;
	struct svmp_ep rem;
	struct ibv_mr *lmr;  /* WINDOW slots: send sources, READ destinations */
	struct ibv_mr *rbuf; /* NRECVB receive buffers */
	struct op ops[WINDOW];
	uint64_t posted, done; /* work requests, in order */
	uint32_t send_seq, write_seq;
	int write_busy, atomic_busy;
	uint64_t fadd_sum, fadd_last;
	int fadd_seen;
	uint64_t cas_known, cas_ok, cas_fail, pcas;
	/* receive side, from peer */
	uint32_t rx_next;
	uint64_t rx_count;
	struct svmp_fifo rx_posted; /* receive buffers in post order */
	uint8_t *rs_expect;	    /* the peer's read source */
};

static struct {
	struct svt_dev d;
	struct ibv_cq *shared;
	struct ibv_mr *reg;
	struct conn c[SVMP_MAXP];
	struct ibv_cq *cqs[3 * SVMP_MAXP];
	int ncqs;
	uint64_t rng;
	uint8_t *scratch;
	struct svmp_stats st;
	uint64_t nops[8], bytes, atomic_bad;
} S;

static uint32_t stream_send(int from, int to)
{
	return 1000u + (uint32_t)from * SVMP_MAXP + (uint32_t)to;
}

static uint32_t stream_write(int from, int to)
{
	return 2000u + (uint32_t)from * SVMP_MAXP + (uint32_t)to;
}

/* 0..64 KiB, biased to small: half up to 64 B, then 512 B, 8 KiB, 64 KiB */
static uint32_t draw_size(uint64_t r)
{
	uint32_t b = (uint32_t)(r % 100), v = (uint32_t)(r >> 8);
	if (b < 50)
		return v % 65;
	if (b < 75)
		return 65 + v % (512 - 65 + 1);
	if (b < 90)
		return 513 + v % (8192 - 513 + 1);
	return 8193 + v % (MAXMSG - 8193 + 1);
}

static uint32_t send_size(uint32_t stream, uint32_t seq)
{
	return draw_size(svmp_mix(svmp_seed ^ ((uint64_t)stream << 32 | seq) ^ 0x5e4d));
}

static uint8_t *lslot(struct conn *c, uint64_t n)
{
	return (uint8_t *)c->lmr->addr + (size_t)(n % WINDOW) * SLOT;
}

static void note_bad(const char *fmt, ...)
{
	if (S.st.reported++ >= 12)
		return;
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "proc %d: ", svmp_me);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
}

static void post(struct conn *c, const struct op *o, enum ibv_wr_opcode wop, int flags)
{
	uint64_t n = c->posted;
	c->ops[n % WINDOW] = *o;
	struct ibv_sge s = svt_sge(c->lmr, (size_t)(n % WINDOW) * SLOT, o->len);
	struct ibv_send_wr wr, *bad = NULL;
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = (uint64_t)c->peer << 48 | n;
	wr.opcode = wop;
	wr.sg_list = &s;
	wr.num_sge = o->len ? 1 : 0;
	wr.send_flags = IBV_SEND_SIGNALED | flags;
	if (wop == IBV_WR_ATOMIC_FETCH_AND_ADD || wop == IBV_WR_ATOMIC_CMP_AND_SWP) {
		wr.wr.atomic.remote_addr = c->rem.addr + o->roff;
		wr.wr.atomic.rkey = c->rem.rkey;
		wr.wr.atomic.compare_add = o->arg;
		wr.wr.atomic.swap = o->arg + 1;
	} else {
		wr.wr.rdma.remote_addr = c->rem.addr + o->roff;
		wr.wr.rdma.rkey = c->rem.rkey;
	}
	int rc = ibv_post_send(c->qp, &wr, &bad);
	if (rc)
		FAIL("proc %d: ibv_post_send %s to %d returned %d (%s), %llu in flight", svmp_me,
		     op_name[o->kind], c->peer, rc, strerror(rc),
		     (unsigned long long)(c->posted - c->done));
	c->posted++;
	S.nops[o->kind]++;
	S.bytes += o->len;
}

/* Draws and posts one operation on c; needs room for two work requests. */
static void post_random(struct conn *c)
{
	uint64_t r = svmp_rand(&S.rng);
	int pick = (int)(r % 1000);
	struct op o;
	memset(&o, 0, sizeof(o));
	if (pick < 450) {
		o.kind = OP_SEND;
		o.seq = c->send_seq++;
		uint32_t st = stream_send(svmp_me, c->peer);
		o.len = send_size(st, o.seq);
		svmp_gen(lslot(c, c->posted), o.len, st, o.seq);
		post(c, &o, IBV_WR_SEND, 0);
	} else if (pick < 650 && !c->write_busy) {
		/* One write area per pair: one WRITE + READBACK in flight */
		o.kind = OP_WRITE;
		o.seq = c->write_seq++;
		o.len = draw_size(r >> 12);
		o.roff = (uint32_t)R_WA(svmp_me);
		svmp_gen(lslot(c, c->posted), o.len, stream_write(svmp_me, c->peer), o.seq);
		post(c, &o, IBV_WR_RDMA_WRITE, 0);
		o.kind = OP_READBACK;
		memset(lslot(c, c->posted), SVMP_POISON, o.len + GUARD);
		post(c, &o, IBV_WR_RDMA_READ, 0);
		c->write_busy = 1;
	} else if (pick < 850 || c->atomic_busy) {
		o.kind = OP_READ;
		o.len = draw_size(r >> 12);
		o.roff = (uint32_t)(R_RS + (r >> 40) % (RSRC - o.len + 1));
		memset(lslot(c, c->posted), SVMP_POISON, o.len + GUARD);
		post(c, &o, IBV_WR_RDMA_READ, 0);
	} else {
		/* One atomic in flight per QP: a CAS needs the last one's result */
		o.len = 8;
		memset(lslot(c, c->posted), SVMP_POISON, 8);
		int which = (int)((r >> 20) % 3);
		if (which == 0) {
			o.kind = OP_FADD;
			o.roff = (uint32_t)R_FADD;
			o.arg = 1 + (r >> 32) % 1000;
			c->fadd_sum += o.arg;
			post(c, &o, IBV_WR_ATOMIC_FETCH_AND_ADD, 0);
		} else if (which == 1) {
			o.kind = OP_CAS;
			o.roff = (uint32_t)R_CAS;
			o.arg = c->cas_known;
			post(c, &o, IBV_WR_ATOMIC_CMP_AND_SWP, 0);
		} else {
			o.kind = OP_PCAS;
			o.roff = (uint32_t)R_PCAS(svmp_me);
			o.arg = c->pcas;
			post(c, &o, IBV_WR_ATOMIC_CMP_AND_SWP, 0);
		}
		c->atomic_busy = 1;
	}
}

static void check_read(struct conn *c, const struct op *o, const uint8_t *got, const uint8_t *want)
{
	if (!memcmp(got, want, o->len)) {
		S.st.ok++;
	} else {
		int stale = svmp_all(got, o->len, SVMP_POISON);
		if (stale)
			S.st.stale++;
		else
			S.st.corrupt++;
		size_t d = 0;
		while (d < o->len && got[d] == want[d])
			d++;
		note_bad("%s of %u bytes at peer %d offset %u: %s when its completion was polled, "
			 "first bad byte %zu",
			 op_name[o->kind], o->len, c->peer, o->roff,
			 stale ? "not in place" : "wrong bytes", d);
	}
	svmp_guard(&S.st, op_name[o->kind], got, o->len, GUARD);
}

static void send_side_done(struct conn *c, const struct ibv_wc *wc)
{
	uint64_t n = wc->wr_id & ((1ULL << 48) - 1);
	if (n != c->done)
		FAIL("proc %d: completion %llu on the QP to %d, expected %llu (lost or out of "
		     "order)",
		     svmp_me, (unsigned long long)n, c->peer, (unsigned long long)c->done);
	struct op *o = &c->ops[n % WINDOW];
	if (wc->status != IBV_WC_SUCCESS)
		FAIL("proc %d: %s to %d (%u bytes): %s", svmp_me, op_name[o->kind], c->peer, o->len,
		     ibv_wc_status_str(wc->status));
	static const int want_op[] = {0,
				      IBV_WC_SEND,
				      IBV_WC_RDMA_WRITE,
				      IBV_WC_RDMA_READ,
				      IBV_WC_RDMA_READ,
				      IBV_WC_FETCH_ADD,
				      IBV_WC_COMP_SWAP,
				      IBV_WC_COMP_SWAP};
	if ((int)wc->opcode != want_op[o->kind]) {
		S.st.badwc++;
		note_bad("%s to %d completed with opcode %d", op_name[o->kind], c->peer,
			 wc->opcode);
	}
	uint8_t *buf = lslot(c, n);
	uint64_t old;
	switch (o->kind) {
	case OP_READBACK:
		svmp_gen(S.scratch, o->len, stream_write(svmp_me, c->peer), o->seq);
		check_read(c, o, buf, S.scratch);
		c->write_busy = 0;
		break;
	case OP_READ:
		check_read(c, o, buf, c->rs_expect + (o->roff - R_RS));
		break;
	case OP_FADD:
		memcpy(&old, buf, 8);
		/* Our addends are positive and ordered on this QP */
		if (c->fadd_seen && old <= c->fadd_last) {
			S.atomic_bad++;
			note_bad("FETCH_ADD at %d fetched %llu after %llu", c->peer,
				 (unsigned long long)old, (unsigned long long)c->fadd_last);
		}
		c->fadd_seen = 1;
		c->fadd_last = old;
		c->atomic_busy = 0;
		break;
	case OP_CAS:
		memcpy(&old, buf, 8);
		if (old == o->arg) {
			c->cas_ok++;
			c->cas_known = o->arg + 1;
		} else {
			c->cas_fail++;
			c->cas_known = old;
		}
		c->atomic_busy = 0;
		break;
	case OP_PCAS:
		memcpy(&old, buf, 8);
		if (old != o->arg) {
			S.atomic_bad++;
			note_bad("private CMP_SWP at %d returned %llu, expected %llu", c->peer,
				 (unsigned long long)old, (unsigned long long)o->arg);
		} else {
			c->pcas++;
		}
		c->atomic_busy = 0;
		break;
	default:
		break;
	}
	c->done++;
}

static void recv_done(struct conn *c, const struct ibv_wc *wc)
{
	if (wc->status != IBV_WC_SUCCESS)
		FAIL("proc %d: receive from %d: %s", svmp_me, c->peer,
		     ibv_wc_status_str(wc->status));
	if (wc->opcode != IBV_WC_RECV) {
		S.st.badwc++;
		note_bad("receive from %d completed with opcode %d", c->peer, wc->opcode);
	}
	uint64_t b = wc->wr_id & ~RECV_TAG;
	if (b >= NRECVB)
		FAIL("proc %d: receive wr_id %#llx", svmp_me, (unsigned long long)wc->wr_id);
	int skipped = svmp_fifo_take(&c->rx_posted, (uint32_t)b);
	if (skipped) {
		S.st.badwc += skipped > 0 ? (uint64_t)skipped : 1;
		note_bad("receive from %d completed buffer %llu: %d receives posted before it "
			 "never completed",
			 c->peer, (unsigned long long)b, skipped);
	}
	c->rx_count++;
	size_t off = (size_t)b * SLOT;
	uint8_t *p = (uint8_t *)c->rbuf->addr + off;
	uint32_t len = wc->byte_len;
	if (len > MAXMSG)
		FAIL("proc %d: byte_len %u from %d", svmp_me, len, c->peer);
	uint32_t st = stream_send(c->peer, svmp_me), seq, want = c->rx_next;
	svmp_account(&S.st, "SEND", p, len, st, &c->rx_next, &seq, S.scratch);
	if (len != send_size(st, seq)) {
		S.st.badlen++;
		note_bad("SEND %u from %d: byte_len %u, sent %u (expected seq %u)", seq, c->peer,
			 len, send_size(st, seq), want);
	}
	svmp_guard(&S.st, "SEND", p, len, GUARD);
	CHECK(svmp_post_recv_buf(c->qp, NULL, wc->wr_id, c->rbuf, off, SLOT, len + GUARD) == 0);
	svmp_fifo_push(&c->rx_posted, (uint32_t)b);
}

static struct conn *conn_of_qpn(uint32_t qpn)
{
	for (int j = 0; j < nprocs; j++)
		if (j != svmp_me && S.c[j].qp->qp_num == qpn)
			return &S.c[j];
	FAIL("proc %d: completion for unknown qp_num %u", svmp_me, qpn);
}

static void poll_all(void *unused)
{
	struct ibv_wc wc[16];
	for (int k = 0; k < S.ncqs; k++) {
		int n = ibv_poll_cq(S.cqs[k], 16, wc);
		if (n < 0)
			FAIL("proc %d: ibv_poll_cq returned %d", svmp_me, n);
		for (int i = 0; i < n; i++) {
			struct conn *c = conn_of_qpn(wc[i].qp_num);
			/* By wr_id: an error completion's opcode is undefined */
			if (wc[i].wr_id & RECV_TAG)
				recv_done(c, &wc[i]);
			else
				send_side_done(c, &wc[i]);
		}
	}
}

static void setup(int me)
{
	svt_open(&S.d, dev);
	S.rng = svmp_mix(svmp_seed + 0x1234567 * (uint64_t)(me + 1));
	S.scratch = malloc(SLOT);
	CHECK(S.scratch);
	S.shared = ibv_create_cq(S.d.ctx, 4096, NULL, NULL, 0);
	CHECK(S.shared);
	S.cqs[S.ncqs++] = S.shared;
	S.reg = svt_mr(&S.d, R_LEN, SVT_ALL_ACCESS);
	uint8_t *R = S.reg->addr;
	memset(R, SVMP_POISON, R_RS);
	svmp_gen(R + R_RS, RSRC, 5000u + (uint32_t)me, 0);
	memset(R + R_FADD, 0, R_LEN - R_FADD);
	for (int j = 0; j < nprocs; j++) {
		if (j == me)
			continue;
		struct conn *c = &S.c[j];
		c->peer = j;
		c->cqmode = (me + j) % 3;
		c->scq = c->rcq = S.shared;
		if (c->cqmode == 1) {
			c->scq = ibv_create_cq(S.d.ctx, 2 * WINDOW, NULL, NULL, 0);
			CHECK(c->scq);
			S.cqs[S.ncqs++] = c->scq;
		}
		if (c->cqmode >= 1) {
			c->rcq = ibv_create_cq(S.d.ctx, 2 * NRECVB, NULL, NULL, 0);
			CHECK(c->rcq);
			S.cqs[S.ncqs++] = c->rcq;
		}
		struct svt_qpopt o = {IBV_QPT_RC, c->scq, c->rcq, NULL, 0,
				      2 * WINDOW, NRECVB, 1,	  0};
		c->qp = svt_qp(&S.d, &o);
		c->lmr = svt_mr(&S.d, (size_t)WINDOW * SLOT, IBV_ACCESS_LOCAL_WRITE);
		c->rbuf = svt_mr(&S.d, (size_t)NRECVB * SLOT, IBV_ACCESS_LOCAL_WRITE);
		memset(c->rbuf->addr, SVMP_POISON, c->rbuf->length);
		c->rs_expect = malloc(RSRC);
		CHECK(c->rs_expect);
		svmp_gen(c->rs_expect, RSRC, 5000u + (uint32_t)j, 0);
		svmp_publish(j, c->qp, S.d.lid, S.reg);
	}
	svmp_barrier(60000, NULL, NULL);
	for (int j = 0; j < nprocs; j++) {
		if (j == me)
			continue;
		struct conn *c = &S.c[j];
		c->rem = svmp_b->ep[j][me];
		svmp_connect(c->qp, &c->rem);
		for (uint64_t b = 0; b < NRECVB; b++) {
			CHECK(svmp_post_recv_buf(c->qp, NULL, RECV_TAG | b, c->rbuf,
						 (size_t)b * SLOT, SLOT, 0) == 0);
			svmp_fifo_push(&c->rx_posted, (uint32_t)b);
		}
	}
	svmp_barrier(60000, NULL, NULL);
}

static void child(int me)
{
	setup(me);
	uint64_t end = svt_now_ms() + (uint64_t)secs * 1000;
	while (svt_now_ms() < end) {
		svmp_abort_if_failed();
		for (int j = 0; j < nprocs; j++) {
			struct conn *c = &S.c[j];
			if (j != me && c->posted - c->done + 2 <= WINDOW)
				post_random(c);
		}
		poll_all(NULL);
	}
	/* Drain what is in flight; then tell the others what to expect */
	uint64_t until = svt_now_ms() + 30000;
	for (;;) {
		int busy = 0;
		for (int j = 0; j < nprocs; j++)
			if (j != me && S.c[j].done < S.c[j].posted)
				busy = 1;
		if (!busy)
			break;
		svmp_abort_if_failed();
		if (svt_now_ms() > until)
			FAIL("proc %d: work requests still in flight 30 s after the end", me);
		poll_all(NULL);
	}
	for (int j = 0; j < nprocs; j++) {
		if (j == me)
			continue;
		atomic_store(&svmp_b->u[me][j][U_SENDS], S.c[j].send_seq);
		atomic_store(&svmp_b->u[me][j][U_FADD_SUM], S.c[j].fadd_sum);
		atomic_store(&svmp_b->u[me][j][U_CAS_OK], S.c[j].cas_ok);
		atomic_store(&svmp_b->u[me][j][U_PCAS], S.c[j].pcas);
	}
	svmp_barrier(60000, poll_all, NULL);
	/* Every SEND completed at its sender: its receive is here, or lost */
	uint64_t recvs = 0;
	for (int j = 0; j < nprocs; j++) {
		if (j == me)
			continue;
		struct conn *c = &S.c[j];
		uint64_t want = atomic_load(&svmp_b->u[j][me][U_SENDS]);
		until = svt_now_ms() + 10000;
		while (c->rx_count < want && svt_now_ms() < until)
			poll_all(NULL);
		if (c->rx_next < want) {
			S.st.lost += want - c->rx_next;
			note_bad("from %d: %llu SENDs sent, %llu received, next expected %u", j,
				 (unsigned long long)want, (unsigned long long)c->rx_count,
				 c->rx_next);
		}
		if (c->rx_count > want) {
			S.st.dup += c->rx_count - want;
			note_bad("from %d: %llu SENDs sent, %llu received", j,
				 (unsigned long long)want, (unsigned long long)c->rx_count);
		}
		recvs += c->rx_count;
	}
	/* The final values of the counters in our memory */
	uint64_t fadd = 0, cas = 0;
	uint8_t *R = S.reg->addr;
	for (int j = 0; j < nprocs; j++) {
		if (j == me)
			continue;
		fadd += atomic_load(&svmp_b->u[j][me][U_FADD_SUM]);
		cas += atomic_load(&svmp_b->u[j][me][U_CAS_OK]);
		uint64_t pv, pw = atomic_load(&svmp_b->u[j][me][U_PCAS]);
		memcpy(&pv, R + R_PCAS(j), 8);
		if (pv != pw) {
			S.atomic_bad++;
			note_bad("private CAS counter of %d is %llu, %llu swaps succeeded", j,
				 (unsigned long long)pv, (unsigned long long)pw);
		}
	}
	uint64_t fv, cv;
	memcpy(&fv, R + R_FADD, 8);
	memcpy(&cv, R + R_CAS, 8);
	if (fv != fadd) {
		S.atomic_bad++;
		note_bad("FETCH_ADD counter is %llu, the addends sum to %llu",
			 (unsigned long long)fv, (unsigned long long)fadd);
	}
	if (cv != cas) {
		S.atomic_bad++;
		note_bad("CMP_SWP counter is %llu, %llu swaps succeeded", (unsigned long long)cv,
			 (unsigned long long)cas);
	}
	/* Nobody leaves while another still polls for its messages */
	svmp_barrier(60000, poll_all, NULL);
	uint64_t cas_fail = 0;
	for (int j = 0; j < nprocs; j++)
		cas_fail += S.c[j].cas_fail;
	char extra[320];
	snprintf(extra, sizeof(extra),
		 "atomic_bad=%llu sends=%llu recvs=%llu writes=%llu reads=%llu fadds=%llu "
		 "cas=%llu cas_lost_race=%llu pcas=%llu bytes=%llu",
		 (unsigned long long)S.atomic_bad, (unsigned long long)S.nops[OP_SEND],
		 (unsigned long long)recvs, (unsigned long long)S.nops[OP_WRITE],
		 (unsigned long long)S.nops[OP_READ], (unsigned long long)S.nops[OP_FADD],
		 (unsigned long long)S.nops[OP_CAS], (unsigned long long)cas_fail,
		 (unsigned long long)S.nops[OP_PCAS], (unsigned long long)S.bytes);
	svmp_print_stats("soak", &S.st, extra);
	if (svmp_bad(&S.st) || S.atomic_bad)
		exit(1);
}

int main(int argc, char **argv)
{
	svmp_seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 20);
	int c;
	while ((c = getopt(argc, argv, "n:t:S:d:F:")) != -1) {
		switch (c) {
		case 'n':
			nprocs = (int)svmp_parse_u64(optarg, "process count");
			if (nprocs < 2 || nprocs > SVMP_MAXP)
				FAIL("process count %d out of 2..%d", nprocs, SVMP_MAXP);
			break;
		case 't':
			secs = (int)svmp_parse_u64(optarg, "seconds");
			if (secs < 1 || secs > 24 * 3600)
				FAIL("duration %d s out of range", secs);
			break;
		case 'S':
			svmp_seed = svmp_parse_u64(optarg, "seed");
			break;
		case 'd':
			dev = optarg;
			break;
		case 'F':
			svmp_freeze_ms = (int)svmp_parse_u64(optarg, "freeze ms");
			if (svmp_freeze_ms < 1 || svmp_freeze_ms > 5000)
				FAIL("freeze %d ms out of 1..5000", svmp_freeze_ms);
			break;
		default:
			fprintf(stderr, "usage: sv_soak [-n procs] [-t seconds] [-S seed] [-d dev] "
					"[-F freeze_ms]\n");
			return 2;
		}
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	printf("SEED %llu procs %d seconds %d\n", (unsigned long long)svmp_seed, nprocs, secs);
	int bad = svmp_run(nprocs, secs * 1000 + 60000, child, 0);
	char fz[32] = "";
	if (svmp_freeze_ms)
		snprintf(fz, sizeof(fz), " -F %d", svmp_freeze_ms);
	printf("SOAK %s seed=%llu (rerun: sv_soak -n %d -t %d -S %llu%s)\n", bad ? "FAILED" : "OK",
	       (unsigned long long)svmp_seed, nprocs, secs, (unsigned long long)svmp_seed, fz);
	return bad ? 1 : 0;
}
