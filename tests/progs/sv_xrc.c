/* SPDX-License-Identifier: MIT */
/* XRC traffic between processes with every byte checked: what
 * ibv_xsrq_pingpong exercises, which itself checks no data.
 *
 *   sv_xrc [-p PROCS] [-n MSGS] [-s SRQS] [-m MAXLEN] [-t SECONDS]
 *
 * Every process has an XRC domain with SRQS XRC SRQs, all completing into
 * one CQ that its send QPs share (so sends and receives mix on one CQ).
 * For each peer it has an XRC send QP connected to an XRC target QP of that
 * peer.  Each process sends MSGS messages to each peer, spread over the
 * peer's SRQs by a seeded random choice, with random lengths up to MAXLEN
 * (at least 12 bytes), both directions at once.  A message carries its
 * sequence number in its (sender, SRQ) stream and a checksum (svmp_gen);
 * receive buffers are poisoned and reposted after each completion.
 *
 * The receiver checks each completion: the SRQ it came from (wr_id) is the
 * one the message was sent to, the bytes are the message expected next in
 * that stream, byte_len is its length, nothing was written past it, and
 * src_qp is the sender's QP.  At the end every stream must have delivered
 * exactly what was sent.  Prints "OK sv_xrc procs=P msgs=M" when every
 * check held; else FAIL lines and a non-zero exit. */
#include "svmp.h"

#include <fcntl.h>

#define MAXS 6
#define NBUF 32 /* receive buffers per SRQ */

static struct {
	int procs, msgs, srqs, maxlen, seconds;
} opt = {2, 20000, 4, 4096, 60};

/* Board words: u[i][j][k] for k < MAXS is SRQ k's number of process i;
 * u[i][j][MAXS] is i's send QP number toward j; u[i][j][MAXS + 1] the
 * number of messages i sent to j, once done, and u[i][j][MAXS + 2 + k] how
 * many of them went to j's SRQ k. */
#define U_SRQN(k) (k)
#define U_SQPN MAXS
#define U_SENT (MAXS + 1)
#define U_SENT_K(k) (MAXS + 2 + (k))
_Static_assert(MAXS + 2 + MAXS <= SVMP_NU, "board words");

struct me {
	struct svt_dev d;
	struct ibv_xrcd *xrcd;
	struct ibv_cq *cq;
	struct ibv_srq *srq[MAXS];
	struct ibv_mr *rmr, *smr;
	struct ibv_qp *snd[SVMP_MAXP], *tgt[SVMP_MAXP];
	/* Posted and not completed.  Not a FIFO: an SRQ's WQEs are taken in
	 * order, but completions of messages from different senders (QPs)
	 * may reach the CQ in another order. */
	uint8_t posted[MAXS][NBUF];
	uint32_t next[SVMP_MAXP][MAXS]; /* expected seq per (sender, SRQ) */
	uint64_t got[SVMP_MAXP];
	uint32_t sent_seq[SVMP_MAXP][MAXS];
	int inflight[SVMP_MAXP];
	struct svmp_stats st;
	uint8_t *scratch;
	size_t bufsz;
};

static struct me M;

static void xrc_modify(struct ibv_qp *qp, uint32_t dqpn, uint16_t dlid, int target)
{
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	a.qp_access_flags = target ? IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE : 0;
	CHECK_EQ(ibv_modify_qp(qp, &a,
			       IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
				       IBV_QP_ACCESS_FLAGS),
		 0);
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = dqpn;
	a.ah_attr.dlid = dlid;
	a.ah_attr.port_num = 1;
	a.min_rnr_timer = 1;
	a.max_dest_rd_atomic = 1;
	int mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
	if (target)
		mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
	CHECK_EQ(ibv_modify_qp(qp, &a, mask), 0);
	if (target)
		return; /* A target QP only receives: RTR is enough */
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 18;
	a.retry_cnt = 7;
	a.rnr_retry = 7; /* the receiver reposts when it polls */
	a.max_rd_atomic = 1;
	CHECK_EQ(ibv_modify_qp(qp, &a,
			       IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
				       IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC),
		 0);
}

static void post_buf(int k, int b)
{
	size_t off = ((size_t)k * NBUF + b) * M.bufsz;
	uint64_t wr_id = (uint64_t)k << 32 | (uint32_t)b;
	CHECK_EQ(svmp_post_recv_buf(NULL, M.srq[k], wr_id, M.rmr, off, opt.maxlen, M.bufsz), 0);
	M.posted[k][b] = 1;
}

static int sender_of(uint32_t src_qp)
{
	for (int j = 0; j < opt.procs; j++)
		if (j != svmp_me && atomic_load(&svmp_b->u[j][svmp_me][U_SQPN]) == src_qp)
			return j;
	return -1;
}

static void on_recv(const struct ibv_wc *wc)
{
	int k = (int)(wc->wr_id >> 32), b = (int)(uint32_t)wc->wr_id;
	if (wc->status != IBV_WC_SUCCESS || k >= opt.srqs || b >= NBUF) {
		M.st.badwc++;
		FAIL("proc %d: receive completion status %s (%d), wr_id %#llx", svmp_me,
		     ibv_wc_status_str(wc->status), wc->status, (unsigned long long)wc->wr_id);
	}
	if (!M.posted[k][b])
		FAIL("proc %d: SRQ %d completed buffer %d, which was not posted", svmp_me, k, b);
	M.posted[k][b] = 0;
	int s = sender_of(wc->src_qp);
	if (s < 0)
		FAIL("proc %d: receive from unknown QP %#x", svmp_me, wc->src_qp);
	const uint8_t *p = (const uint8_t *)M.rmr->addr + ((size_t)k * NBUF + b) * M.bufsz;
	uint32_t stream = (uint32_t)(s * MAXS + k), which;
	enum svmp_verdict v = svmp_account(&M.st, "xrc", p, wc->byte_len, stream,
					   &M.next[s][k], &which, M.scratch);
	if (wc->byte_len < 12)
		M.st.badlen++;
	svmp_guard(&M.st, "xrc", p, wc->byte_len, M.bufsz - wc->byte_len);
	if (v != SVMP_OK)
		FAIL("proc %d: message %u from %d on SRQ %d was %s", svmp_me, which, s, k,
		     svmp_verdict_name[v]);
	M.got[s]++;
	post_buf(k, b);
}

static void progress(void *unused)
{
	struct ibv_wc wc[16];
	int n = ibv_poll_cq(M.cq, 16, wc);
	if (n < 0)
		FAIL("proc %d: ibv_poll_cq: %d", svmp_me, n);
	for (int i = 0; i < n; i++) {
		if (wc[i].opcode & IBV_WC_RECV) {
			on_recv(&wc[i]);
			continue;
		}
		int j = (int)(wc[i].wr_id >> 32);
		if (wc[i].status != IBV_WC_SUCCESS || j >= opt.procs)
			FAIL("proc %d: send completion status %s (%d), wr_id %#llx", svmp_me,
			     ibv_wc_status_str(wc[i].status), wc[i].status,
			     (unsigned long long)wc[i].wr_id);
		M.inflight[j]--;
	}
}

static void child(int me)
{
	svmp_seed = 0x5eed0000u;
	svt_open(&M.d, "loop0");
	struct ibv_xrcd_init_attr xa;
	memset(&xa, 0, sizeof(xa));
	xa.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
	xa.fd = -1;
	xa.oflags = O_CREAT;
	M.xrcd = ibv_open_xrcd(M.d.ctx, &xa);
	CHECK(M.xrcd);
	int peers = opt.procs - 1;
	M.cq = ibv_create_cq(M.d.ctx, opt.srqs * NBUF + peers * 16 + 16, NULL, NULL, 0);
	CHECK(M.cq);
	M.bufsz = (size_t)opt.maxlen + 64; /* 64 poisoned bytes past the longest */
	M.rmr = svt_mr(&M.d, (size_t)opt.srqs * NBUF * M.bufsz, IBV_ACCESS_LOCAL_WRITE);
	M.smr = svt_mr(&M.d, (size_t)peers * 16 * opt.maxlen, IBV_ACCESS_LOCAL_WRITE);
	M.scratch = malloc(M.bufsz);
	CHECK(M.scratch);
	for (int k = 0; k < opt.srqs; k++) {
		struct ibv_srq_init_attr_ex a;
		memset(&a, 0, sizeof(a));
		a.attr.max_wr = NBUF;
		a.attr.max_sge = 1;
		a.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_XRCD |
			      IBV_SRQ_INIT_ATTR_CQ;
		a.srq_type = IBV_SRQT_XRC;
		a.pd = M.d.pd;
		a.xrcd = M.xrcd;
		a.cq = M.cq;
		M.srq[k] = ibv_create_srq_ex(M.d.ctx, &a);
		CHECK(M.srq[k]);
		uint32_t n;
		CHECK_EQ(ibv_get_srq_num(M.srq[k], &n), 0);
		for (int j = 0; j < opt.procs; j++)
			atomic_store(&svmp_b->u[me][j][U_SRQN(k)], n);
		for (int b = 0; b < NBUF; b++)
			post_buf(k, b);
	}
	for (int j = 0; j < opt.procs; j++) {
		if (j == me)
			continue;
		struct ibv_qp_init_attr_ex s;
		memset(&s, 0, sizeof(s));
		s.qp_type = IBV_QPT_XRC_SEND;
		s.send_cq = M.cq;
		s.cap.max_send_wr = 16;
		s.cap.max_send_sge = 1;
		s.comp_mask = IBV_QP_INIT_ATTR_PD;
		s.pd = M.d.pd;
		M.snd[j] = ibv_create_qp_ex(M.d.ctx, &s);
		CHECK(M.snd[j]);
		struct ibv_qp_init_attr_ex t;
		memset(&t, 0, sizeof(t));
		t.qp_type = IBV_QPT_XRC_RECV;
		t.comp_mask = IBV_QP_INIT_ATTR_XRCD;
		t.xrcd = M.xrcd;
		M.tgt[j] = ibv_create_qp_ex(M.d.ctx, &t);
		CHECK(M.tgt[j]);
		atomic_store(&svmp_b->u[me][j][U_SQPN], M.snd[j]->qp_num);
		svmp_publish(j, M.tgt[j], M.d.lid, NULL);
	}
	svmp_barrier(30000, NULL, NULL);
	for (int j = 0; j < opt.procs; j++) {
		if (j == me)
			continue;
		xrc_modify(M.snd[j], svmp_b->ep[j][me].qpn, svmp_b->ep[j][me].lid, 0);
		xrc_modify(M.tgt[j], (uint32_t)atomic_load(&svmp_b->u[j][me][U_SQPN]),
			   svmp_b->ep[j][me].lid, 1);
	}
	svmp_barrier(30000, progress, NULL);

	uint64_t rng = svmp_mix(0xabc0000u + (uint64_t)me);
	int sent[SVMP_MAXP] = {0}, slot[SVMP_MAXP] = {0};
	uint64_t end = svt_now_ms() + (uint64_t)opt.seconds * 1000;
	for (;;) {
		int busy = 0;
		for (int j = 0; j < opt.procs; j++) {
			if (j == me || sent[j] == opt.msgs)
				continue;
			busy = 1;
			if (M.inflight[j] >= 16)
				continue;
			int k = (int)(svmp_rand(&rng) % (uint64_t)opt.srqs);
			uint32_t len = 12 + (uint32_t)(svmp_rand(&rng) % (uint64_t)(opt.maxlen - 11));
			int jj = j > me ? j - 1 : j;
			uint8_t *buf = (uint8_t *)M.smr->addr +
				       ((size_t)jj * 16 + (size_t)slot[j]) * opt.maxlen;
			slot[j] = (slot[j] + 1) % 16;
			svmp_gen(buf, len, (uint32_t)(me * MAXS + k), M.sent_seq[j][k]++);
			struct ibv_sge sge = svt_sge(M.smr, buf - (uint8_t *)M.smr->addr, len);
			struct ibv_send_wr wr, *bad = NULL;
			memset(&wr, 0, sizeof(wr));
			wr.wr_id = (uint64_t)j << 32 | (uint32_t)sent[j];
			wr.sg_list = &sge;
			wr.num_sge = 1;
			wr.opcode = IBV_WR_SEND;
			wr.send_flags = IBV_SEND_SIGNALED;
			wr.qp_type.xrc.remote_srqn =
				(uint32_t)atomic_load(&svmp_b->u[j][me][U_SRQN(k)]);
			int e = ibv_post_send(M.snd[j], &wr, &bad);
			if (e)
				FAIL("proc %d: ibv_post_send to %d: %s", me, j, strerror(e));
			M.inflight[j]++;
			sent[j]++;
		}
		progress(NULL);
		if (!busy)
			break;
		if (svt_now_ms() > end)
			FAIL("proc %d: sends not done within %d s", me, opt.seconds);
	}
	for (int j = 0; j < opt.procs; j++) {
		if (j == me)
			continue;
		for (int k = 0; k < opt.srqs; k++)
			atomic_store(&svmp_b->u[me][j][U_SENT_K(k)], M.sent_seq[j][k]);
		atomic_store(&svmp_b->u[me][j][U_SENT], (uint64_t)sent[j]);
	}
	/* Everything sent to us arrives, and our sends complete. */
	for (;;) {
		int done = 1;
		for (int j = 0; j < opt.procs; j++) {
			if (j == me)
				continue;
			if (M.inflight[j])
				done = 0;
			uint64_t want = atomic_load(&svmp_b->u[j][me][U_SENT]);
			if (!want || M.got[j] < want)
				done = 0;
			if (want && M.got[j] > want)
				FAIL("proc %d: %llu messages from %d, %llu sent", me,
				     (unsigned long long)M.got[j], j, (unsigned long long)want);
		}
		if (done)
			break;
		svmp_abort_if_failed();
		progress(NULL);
		if (svt_now_ms() > end)
			FAIL("proc %d: messages still missing after %d s", me, opt.seconds);
	}
	/* Per stream: the next sequence number expected is the count sent. */
	for (int j = 0; j < opt.procs; j++)
		for (int k = 0; j != me && k < opt.srqs; k++) {
			uint64_t want = atomic_load(&svmp_b->u[j][me][U_SENT_K(k)]);
			if (M.next[j][k] != want)
				FAIL("proc %d: stream from %d to SRQ %d ended at seq %u, %llu sent",
				     me, j, k, M.next[j][k], (unsigned long long)want);
		}
	if (svmp_bad(&M.st))
		FAIL("proc %d: %llu bad messages", me, (unsigned long long)svmp_bad(&M.st));
	svmp_barrier(30000, progress, NULL);
	/* Nothing more arrived after the last expected message. */
	struct ibv_wc wc;
	if (ibv_poll_cq(M.cq, 1, &wc) != 0)
		FAIL("proc %d: a completion after all traffic (wr_id %#llx)", me,
		     (unsigned long long)wc.wr_id);
	svmp_print_stats("xrc", &M.st, NULL);
	for (int j = 0; j < opt.procs; j++) {
		if (j == me)
			continue;
		CHECK_EQ(ibv_destroy_qp(M.snd[j]), 0);
		CHECK_EQ(ibv_destroy_qp(M.tgt[j]), 0);
	}
	for (int k = 0; k < opt.srqs; k++)
		CHECK_EQ(ibv_destroy_srq(M.srq[k]), 0);
	CHECK_EQ(ibv_destroy_cq(M.cq), 0);
	CHECK_EQ(ibv_close_xrcd(M.xrcd), 0);
}

int main(int argc, char **argv)
{
	int c;
	while ((c = getopt(argc, argv, "p:n:s:m:t:")) != -1) {
		switch (c) {
		case 'p':
			opt.procs = atoi(optarg);
			break;
		case 'n':
			opt.msgs = atoi(optarg);
			break;
		case 's':
			opt.srqs = atoi(optarg);
			break;
		case 'm':
			opt.maxlen = atoi(optarg);
			break;
		case 't':
			opt.seconds = atoi(optarg);
			break;
		default:
			fprintf(stderr, "usage: sv_xrc [-p PROCS] [-n MSGS] [-s SRQS] [-m MAXLEN] "
					"[-t SECONDS]\n");
			return 2;
		}
	}
	if (opt.procs < 2 || opt.procs > SVMP_MAXP || opt.msgs < 1 || opt.srqs < 1 ||
	    opt.srqs > MAXS || opt.maxlen < 12 || opt.maxlen > (1 << 20) || opt.seconds < 1)
		FAIL("bad arguments");
	if (svmp_run(opt.procs, (opt.seconds + 60) * 1000, child, 0))
		FAIL("a process failed (lines above)");
	printf("OK sv_xrc procs=%d msgs=%d\n", opt.procs, opt.msgs);
	return 0;
}
