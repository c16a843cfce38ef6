/* SPDX-License-Identifier: MIT */
/* Traffic scenarios between QPs of one process, through plain verbs.
 * Usage: sv_traffic SCENARIO [DEV_A [DEV_B]]   (default loop0 loop0)
 * Prints "OK SCENARIO" and exits 0 when every check held. */
#include "svt.h"

#include <pthread.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/time.h>

static const char *dev_a = "loop0", *dev_b = "loop0";

/* How long a check that nothing arrived (no completion, no event) waits
 * before it concludes so: long enough that a late delivery on a loaded
 * machine is seen, not just one that happens within a scheduler tick. */
#define NOTHING_MS 1000

/* Two connected QPs, A (requester side mostly) and B, each with its own CQs. */
struct pair {
	struct svt_dev a, b;
	struct ibv_cq *acq, *bcq;
	struct ibv_qp *qa, *qb;
};

static void pair_open(struct pair *p)
{
	svt_open(&p->a, dev_a);
	if (!strcmp(dev_a, dev_b) && 0)
		p->b = p->a;
	else
		svt_open(&p->b, dev_b);
	p->acq = ibv_create_cq(p->a.ctx, 256, NULL, NULL, 0);
	p->bcq = ibv_create_cq(p->b.ctx, 256, NULL, NULL, 0);
	CHECK(p->acq && p->bcq);
}

static void pair_connect(struct pair *p, enum ibv_qp_type t, int access_a, int access_b,
			 uint8_t rnr_timer_b, uint8_t rnr_retry_a, int sig_all,
			 uint32_t max_inline)
{
	struct svt_qpopt o = {t, p->acq, p->acq, NULL, sig_all, 64, 64, 4, max_inline};
	p->qa = svt_qp(&p->a, &o);
	o.scq = o.rcq = p->bcq;
	p->qb = svt_qp(&p->b, &o);
	struct svt_conn ca = {access_a, 1, 14, 2, rnr_retry_a};
	struct svt_conn cb = {access_b, rnr_timer_b, 14, 2, 7};
	svt_connect(p->qa, p->qb->qp_num, p->b.lid, &ca);
	svt_connect(p->qb, p->qa->qp_num, p->a.lid, &cb);
}

static void simple_pair(struct pair *p, enum ibv_qp_type t)
{
	pair_open(p);
	pair_connect(p, t, SVT_ALL_ACCESS, SVT_ALL_ACCESS, 1, 7, 0, 64);
}

/* ---- RC operations with data verified ---------------------------------- */
static void sc_rc_ops(void)
{
	struct pair p;
	simple_pair(&p, IBV_QPT_RC);
	const size_t N = 64 * 1024;
	struct ibv_mr *ma = svt_mr(&p.a, N, SVT_ALL_ACCESS);
	struct ibv_mr *mb = svt_mr(&p.b, N, SVT_ALL_ACCESS);
	char *A = ma->addr, *B = mb->addr;
	struct ibv_wc wc;

	/* SEND of several sizes (one above a page, one large) */
	size_t sizes[] = {1, 63, 4097, 60000};
	for (unsigned i = 0; i < 4; i++) {
		svt_fill(A, sizes[i], i + 1);
		memset(B, 0xee, N);
		struct ibv_sge rs = svt_sge(mb, 0, N);
		svt_post_recv1(p.qb, 100 + i, &rs, 1);
		struct ibv_sge ss = svt_sge(ma, 0, (uint32_t)sizes[i]);
		CHECK(svt_post_send1(p.qa, 200 + i, IBV_WR_SEND, &ss, 1, IBV_SEND_SIGNALED, 0, 0) == 0);
		wc = svt_wait(p.acq, "send");
		CHECK_WC(wc, IBV_WC_SUCCESS);
		CHECK_EQ(wc.wr_id, 200 + i);
		CHECK_EQ(wc.opcode, IBV_WC_SEND);
		wc = svt_wait(p.bcq, "recv");
		CHECK_WC(wc, IBV_WC_SUCCESS);
		CHECK_EQ(wc.wr_id, 100 + i);
		CHECK_EQ(wc.opcode, IBV_WC_RECV);
		CHECK_EQ(wc.byte_len, sizes[i]);
		CHECK_EQ(wc.qp_num, p.qb->qp_num);
		CHECK_EQ(wc.src_qp, p.qa->qp_num);
		CHECK_EQ(wc.wc_flags & IBV_WC_WITH_IMM, 0);
		CHECK(memcmp(A, B, sizes[i]) == 0);
		CHECK((unsigned char)B[sizes[i]] == 0xee); /* nothing beyond */
	}

	/* SEND_WITH_IMM */
	{
		svt_fill(A, 100, 9);
		struct ibv_sge rs = svt_sge(mb, 0, N);
		svt_post_recv1(p.qb, 7, &rs, 1);
		struct ibv_send_wr wr = {0}, *bad;
		struct ibv_sge ss = svt_sge(ma, 0, 100);
		wr.wr_id = 8;
		wr.opcode = IBV_WR_SEND_WITH_IMM;
		wr.sg_list = &ss;
		wr.num_sge = 1;
		wr.send_flags = IBV_SEND_SIGNALED;
		wr.imm_data = htonl(0x12345678);
		CHECK(ibv_post_send(p.qa, &wr, &bad) == 0);
		wc = svt_wait(p.acq, "send imm");
		CHECK_WC(wc, IBV_WC_SUCCESS);
		wc = svt_wait(p.bcq, "recv imm");
		CHECK_WC(wc, IBV_WC_SUCCESS);
		CHECK_EQ(wc.opcode, IBV_WC_RECV);
		CHECK(wc.wc_flags & IBV_WC_WITH_IMM);
		CHECK_EQ(ntohl(wc.imm_data), 0x12345678);
		CHECK_EQ(wc.byte_len, 100);
		CHECK(memcmp(A, B, 100) == 0);
	}

	/* RDMA_WRITE to an offset; the receiver's CQ stays empty */
	{
		svt_fill(A, 5000, 11);
		memset(B, 0, N);
		struct ibv_sge ss = svt_sge(ma, 0, 5000);
		CHECK(svt_post_send1(p.qa, 9, IBV_WR_RDMA_WRITE, &ss, 1, IBV_SEND_SIGNALED,
				     (uintptr_t)B + 1000, mb->rkey) == 0);
		wc = svt_wait(p.acq, "write");
		CHECK_WC(wc, IBV_WC_SUCCESS);
		CHECK_EQ(wc.opcode, IBV_WC_RDMA_WRITE);
		CHECK(memcmp(A, B + 1000, 5000) == 0);
		CHECK(B[999] == 0 && B[6000] == 0);
		svt_expect_empty(p.bcq, NOTHING_MS, "write without imm");
	}

	/* RDMA_WRITE_WITH_IMM consumes a receive, byte_len = length */
	{
		svt_fill(A, 3000, 12);
		struct ibv_sge rs = svt_sge(mb, N - 16, 16);
		svt_post_recv1(p.qb, 77, &rs, 1);
		struct ibv_send_wr wr = {0}, *bad;
		struct ibv_sge ss = svt_sge(ma, 0, 3000);
		wr.wr_id = 10;
		wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
		wr.sg_list = &ss;
		wr.num_sge = 1;
		wr.send_flags = IBV_SEND_SIGNALED;
		wr.imm_data = htonl(0xabcdef01);
		wr.wr.rdma.remote_addr = (uintptr_t)B + 8192;
		wr.wr.rdma.rkey = mb->rkey;
		CHECK(ibv_post_send(p.qa, &wr, &bad) == 0);
		wc = svt_wait(p.acq, "write imm");
		CHECK_WC(wc, IBV_WC_SUCCESS);
		CHECK_EQ(wc.opcode, IBV_WC_RDMA_WRITE);
		wc = svt_wait(p.bcq, "recv write imm");
		CHECK_WC(wc, IBV_WC_SUCCESS);
		CHECK_EQ(wc.wr_id, 77);
		CHECK_EQ(wc.opcode, IBV_WC_RECV_RDMA_WITH_IMM);
		CHECK(wc.wc_flags & IBV_WC_WITH_IMM);
		CHECK_EQ(ntohl(wc.imm_data), 0xabcdef01);
		CHECK_EQ(wc.byte_len, 3000);
		CHECK(memcmp(A, B + 8192, 3000) == 0);
	}

	/* RDMA_READ */
	{
		svt_fill(B + 20000, 7000, 13);
		memset(A, 0, N);
		struct ibv_sge ss = svt_sge(ma, 100, 7000);
		CHECK(svt_post_send1(p.qa, 11, IBV_WR_RDMA_READ, &ss, 1, IBV_SEND_SIGNALED,
				     (uintptr_t)B + 20000, mb->rkey) == 0);
		wc = svt_wait(p.acq, "read");
		CHECK_WC(wc, IBV_WC_SUCCESS);
		CHECK_EQ(wc.opcode, IBV_WC_RDMA_READ);
		CHECK_EQ(wc.byte_len, 7000);
		CHECK(memcmp(A + 100, B + 20000, 7000) == 0);
		CHECK(A[99] == 0 && A[7100] == 0);
	}

	/* Atomics: CMP_AND_SWP hit and miss, FETCH_AND_ADD */
	{
		uint64_t *target = (uint64_t *)(B + 32768);
		uint64_t *res = (uint64_t *)(A + 32768);
		*target = 5;
		struct ibv_send_wr wr = {0}, *bad;
		struct ibv_sge ss = svt_sge(ma, 32768, 8);
		wr.sg_list = &ss;
		wr.num_sge = 1;
		wr.send_flags = IBV_SEND_SIGNALED;
		wr.wr.atomic.remote_addr = (uintptr_t)target;
		wr.wr.atomic.rkey = mb->rkey;

		wr.wr_id = 20;
		wr.opcode = IBV_WR_ATOMIC_CMP_AND_SWP;
		wr.wr.atomic.compare_add = 5;
		wr.wr.atomic.swap = 0x1122334455667788ULL;
		*res = 0;
		CHECK(ibv_post_send(p.qa, &wr, &bad) == 0);
		wc = svt_wait(p.acq, "cas");
		CHECK_WC(wc, IBV_WC_SUCCESS);
		CHECK_EQ(wc.opcode, IBV_WC_COMP_SWAP);
		CHECK_EQ(*res, 5);
		CHECK(*target == 0x1122334455667788ULL);

		wr.wr_id = 21; /* miss: compare 5 again, target unchanged */
		wr.wr.atomic.swap = 99;
		CHECK(ibv_post_send(p.qa, &wr, &bad) == 0);
		wc = svt_wait(p.acq, "cas miss");
		CHECK_WC(wc, IBV_WC_SUCCESS);
		CHECK(*res == 0x1122334455667788ULL);
		CHECK(*target == 0x1122334455667788ULL);

		wr.wr_id = 22;
		wr.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
		wr.wr.atomic.compare_add = 0x10;
		CHECK(ibv_post_send(p.qa, &wr, &bad) == 0);
		wc = svt_wait(p.acq, "faa");
		CHECK_WC(wc, IBV_WC_SUCCESS);
		CHECK_EQ(wc.opcode, IBV_WC_FETCH_ADD);
		CHECK(*res == 0x1122334455667788ULL);
		CHECK(*target == 0x1122334455667798ULL);
	}

	/* Both directions: B sends to A */
	{
		svt_fill(B, 500, 14);
		memset(A, 0, 1000);
		struct ibv_sge rs = svt_sge(ma, 0, 1000);
		svt_post_recv1(p.qa, 30, &rs, 1);
		struct ibv_sge ss = svt_sge(mb, 0, 500);
		CHECK(svt_post_send1(p.qb, 31, IBV_WR_SEND, &ss, 1, IBV_SEND_SIGNALED, 0, 0) == 0);
		wc = svt_wait(p.bcq, "send b");
		CHECK_WC(wc, IBV_WC_SUCCESS);
		wc = svt_wait(p.acq, "recv a");
		CHECK_WC(wc, IBV_WC_SUCCESS);
		CHECK_EQ(wc.byte_len, 500);
		CHECK_EQ(wc.src_qp, p.qb->qp_num);
		CHECK_EQ(wc.slid, p.b.lid);
		CHECK(memcmp(A, B, 500) == 0);
	}
	svt_expect_empty(p.acq, NOTHING_MS, "end a");
	svt_expect_empty(p.bcq, NOTHING_MS, "end b");
}

/* ---- Inline data and multi-SGE on both sides --------------------------- */
static void sc_inline_sge(void)
{
	struct pair p;
	simple_pair(&p, IBV_QPT_RC);
	struct ibv_mr *ma = svt_mr(&p.a, 8192, SVT_ALL_ACCESS);
	struct ibv_mr *mb = svt_mr(&p.b, 8192, SVT_ALL_ACCESS);
	char *A = ma->addr, *B = mb->addr;
	struct ibv_wc wc;

	/* Inline: the source buffer is unregistered and overwritten right after posting */
	{
		char stackbuf[64];
		svt_fill(stackbuf, 64, 3);
		char expect[64];
		memcpy(expect, stackbuf, 64);
		struct ibv_sge rs = svt_sge(mb, 0, 128);
		svt_post_recv1(p.qb, 1, &rs, 1);
		struct ibv_sge ss = {(uintptr_t)stackbuf, 64, 0xdeadbeef /* ignored */};
		CHECK(svt_post_send1(p.qa, 2, IBV_WR_SEND, &ss, 1,
				     IBV_SEND_SIGNALED | IBV_SEND_INLINE, 0, 0) == 0);
		memset(stackbuf, 0, 64);
		wc = svt_wait(p.acq, "inline send");
		CHECK_WC(wc, IBV_WC_SUCCESS);
		wc = svt_wait(p.bcq, "inline recv");
		CHECK_WC(wc, IBV_WC_SUCCESS);
		CHECK_EQ(wc.byte_len, 64);
		CHECK(memcmp(B, expect, 64) == 0);

		/* Inline RDMA WRITE from two unregistered pieces */
		char x[10] = "abcdefghi", y[6] = "12345";
		struct ibv_sge two[2] = {{(uintptr_t)x, 9, 0}, {(uintptr_t)y, 5, 0}};
		memset(B, 0, 100);
		CHECK(svt_post_send1(p.qa, 3, IBV_WR_RDMA_WRITE, two, 2,
				     IBV_SEND_SIGNALED | IBV_SEND_INLINE, (uintptr_t)B + 50,
				     mb->rkey) == 0);
		wc = svt_wait(p.acq, "inline write");
		CHECK_WC(wc, IBV_WC_SUCCESS);
		CHECK(memcmp(B + 50, "abcdefghi12345", 14) == 0);
	}

	/* Multi-SGE gather (3 pieces) into multi-SGE scatter (4 pieces of other sizes) */
	{
		svt_fill(A, 8192, 5);
		memset(B, 0, 8192);
		struct ibv_sge ss[3] = {svt_sge(ma, 0, 100), svt_sge(ma, 1000, 300),
					svt_sge(ma, 5000, 600)};
		struct ibv_sge rs[4] = {svt_sge(mb, 0, 50), svt_sge(mb, 2000, 450),
					svt_sge(mb, 4000, 10), svt_sge(mb, 6000, 1000)};
		svt_post_recv1(p.qb, 10, rs, 4);
		CHECK(svt_post_send1(p.qa, 11, IBV_WR_SEND, ss, 3, IBV_SEND_SIGNALED, 0, 0) == 0);
		wc = svt_wait(p.acq, "sge send");
		CHECK_WC(wc, IBV_WC_SUCCESS);
		wc = svt_wait(p.bcq, "sge recv");
		CHECK_WC(wc, IBV_WC_SUCCESS);
		CHECK_EQ(wc.byte_len, 1000);
		char src[1000], dst[1000];
		memcpy(src, A, 100);
		memcpy(src + 100, A + 1000, 300);
		memcpy(src + 400, A + 5000, 600);
		memcpy(dst, B, 50);
		memcpy(dst + 50, B + 2000, 450);
		memcpy(dst + 500, B + 4000, 10);
		memcpy(dst + 510, B + 6000, 490);
		CHECK(memcmp(src, dst, 1000) == 0);
		CHECK(B[50] == 0 && B[6490] == 0);

		/* Multi-SGE RDMA READ scatters into 2 local pieces */
		memset(A, 0, 8192);
		svt_fill(B + 100, 700, 6);
		struct ibv_sge ls[2] = {svt_sge(ma, 10, 200), svt_sge(ma, 3000, 500)};
		CHECK(svt_post_send1(p.qa, 12, IBV_WR_RDMA_READ, ls, 2, IBV_SEND_SIGNALED,
				     (uintptr_t)B + 100, mb->rkey) == 0);
		wc = svt_wait(p.acq, "sge read");
		CHECK_WC(wc, IBV_WC_SUCCESS);
		CHECK(memcmp(A + 10, B + 100, 200) == 0);
		CHECK(memcmp(A + 3000, B + 300, 500) == 0);
	}
}

/* ---- Signaled vs unsignaled -------------------------------------------- */
static void sc_signaling(void)
{
	for (int sig_all = 0; sig_all < 2; sig_all++) {
		struct pair p;
		pair_open(&p);
		pair_connect(&p, IBV_QPT_RC, SVT_ALL_ACCESS, SVT_ALL_ACCESS, 1, 7, sig_all, 0);
		struct ibv_mr *ma = svt_mr(&p.a, 4096, SVT_ALL_ACCESS);
		struct ibv_mr *mb = svt_mr(&p.b, 4096, SVT_ALL_ACCESS);
		struct ibv_send_wr wr[4], *bad;
		struct ibv_sge ss = svt_sge(ma, 0, 16);
		memset(wr, 0, sizeof(wr));
		for (int i = 0; i < 4; i++) {
			wr[i].wr_id = i;
			wr[i].opcode = IBV_WR_RDMA_WRITE;
			wr[i].sg_list = &ss;
			wr[i].num_sge = 1;
			wr[i].wr.rdma.remote_addr = (uintptr_t)mb->addr + 16 * i;
			wr[i].wr.rdma.rkey = mb->rkey;
			wr[i].send_flags = i == 2 ? IBV_SEND_SIGNALED : 0;
			wr[i].next = i < 3 ? &wr[i + 1] : NULL;
		}
		svt_fill(ma->addr, 16, 1);
		CHECK(ibv_post_send(p.qa, wr, &bad) == 0);
		int want[4] = {0, 1, 2, 3};
		int n = sig_all ? 4 : 1;
		for (int i = 0; i < n; i++) {
			struct ibv_wc wc = svt_wait(p.acq, "signaled");
			CHECK_WC(wc, IBV_WC_SUCCESS);
			CHECK_EQ(wc.wr_id, sig_all ? want[i] : 2);
		}
		svt_expect_empty(p.acq, NOTHING_MS, "unsignaled must not complete");
		for (int i = 0; i < 4; i++)
			CHECK(memcmp((char *)mb->addr + 16 * i, ma->addr, 16) == 0);
		/* The init attr reports sq_sig_all back */
		struct ibv_qp_attr a;
		struct ibv_qp_init_attr ia;
		CHECK(ibv_query_qp(p.qa, &a, IBV_QP_STATE, &ia) == 0);
		CHECK_EQ(ia.sq_sig_all, sig_all);
	}
}

/* ---- Solicited events through a completion channel ---------------------- */
static int chan_ready(struct ibv_comp_channel *ch, int ms)
{
	struct pollfd pfd = {ch->fd, POLLIN, 0};
	int r = poll(&pfd, 1, ms);
	CHECK(r >= 0);
	return r == 1 && (pfd.revents & POLLIN);
}

static void sc_solicited(void)
{
	struct pair p;
	pair_open(&p);
	struct ibv_comp_channel *ch = ibv_create_comp_channel(p.b.ctx);
	CHECK(ch);
	struct ibv_cq *rcq = ibv_create_cq(p.b.ctx, 64, (void *)0x1234, ch, 0);
	CHECK(rcq);
	struct svt_qpopt o = {IBV_QPT_RC, p.acq, p.acq, NULL, 1, 64, 64, 4, 0};
	p.qa = svt_qp(&p.a, &o);
	o.scq = p.bcq;
	o.rcq = rcq;
	p.qb = svt_qp(&p.b, &o);
	struct svt_conn c = {SVT_ALL_ACCESS, 1, 14, 2, 7};
	svt_connect(p.qa, p.qb->qp_num, p.b.lid, &c);
	svt_connect(p.qb, p.qa->qp_num, p.a.lid, &c);
	struct ibv_mr *ma = svt_mr(&p.a, 4096, SVT_ALL_ACCESS);
	struct ibv_mr *mb = svt_mr(&p.b, 4096, SVT_ALL_ACCESS);
	struct ibv_sge rs = svt_sge(mb, 0, 4096), ss = svt_sge(ma, 0, 8);
	struct ibv_wc wc;
	for (int i = 0; i < 4; i++)
		svt_post_recv1(p.qb, i, &rs, 1);

	CHECK(!chan_ready(ch, 0));
	CHECK(ibv_req_notify_cq(rcq, 1) == 0);
	/* Unsolicited send: a completion but no event */
	CHECK(svt_post_send1(p.qa, 10, IBV_WR_SEND, &ss, 1, 0, 0, 0) == 0);
	wc = svt_wait(p.acq, "send 1");
	CHECK_WC(wc, IBV_WC_SUCCESS);
	CHECK(!chan_ready(ch, NOTHING_MS));
	wc = svt_wait(rcq, "recv 1");
	CHECK_EQ(wc.wr_id, 0);
	/* Solicited send: the channel fd becomes readable */
	CHECK(svt_post_send1(p.qa, 11, IBV_WR_SEND, &ss, 1, IBV_SEND_SOLICITED, 0, 0) == 0);
	wc = svt_wait(p.acq, "send 2");
	CHECK_WC(wc, IBV_WC_SUCCESS);
	CHECK(chan_ready(ch, 2000));
	struct ibv_cq *ecq;
	void *ectx;
	CHECK(ibv_get_cq_event(ch, &ecq, &ectx) == 0);
	CHECK(ecq == rcq);
	CHECK(ectx == (void *)0x1234);
	ibv_ack_cq_events(rcq, 1);
	wc = svt_wait(rcq, "recv 2");
	CHECK_WC(wc, IBV_WC_SUCCESS);
	CHECK_EQ(wc.wr_id, 1);
	/* Not re-armed: a second solicited send raises no event */
	CHECK(svt_post_send1(p.qa, 12, IBV_WR_SEND, &ss, 1, IBV_SEND_SOLICITED, 0, 0) == 0);
	wc = svt_wait(rcq, "recv 3");
	CHECK(!chan_ready(ch, NOTHING_MS));
	/* Armed for every completion: an unsolicited send raises one */
	CHECK(ibv_req_notify_cq(rcq, 0) == 0);
	CHECK(svt_post_send1(p.qa, 13, IBV_WR_SEND, &ss, 1, 0, 0, 0) == 0);
	CHECK(chan_ready(ch, 2000));
	CHECK(ibv_get_cq_event(ch, &ecq, &ectx) == 0);
	CHECK(ecq == rcq);
	ibv_ack_cq_events(rcq, 1);
	wc = svt_wait(rcq, "recv 4");
	CHECK_EQ(wc.wr_id, 3);
	while (ibv_poll_cq(p.acq, 1, &wc) > 0)
		;
	CHECK(ibv_destroy_qp(p.qb) == 0);
	CHECK(ibv_destroy_cq(rcq) == 0);
	CHECK(ibv_destroy_comp_channel(ch) == 0);
}

/* ---- UC ----------------------------------------------------------------- */
static void sc_uc(void)
{
	struct pair p;
	simple_pair(&p, IBV_QPT_UC);
	struct ibv_mr *ma = svt_mr(&p.a, 8192, SVT_ALL_ACCESS);
	struct ibv_mr *mb = svt_mr(&p.b, 8192, SVT_ALL_ACCESS);
	char *A = ma->addr, *B = mb->addr;
	struct ibv_wc wc;
	svt_fill(A, 8192, 21);
	struct ibv_sge ss = svt_sge(ma, 0, 3000), rs = svt_sge(mb, 0, 8192);

	svt_post_recv1(p.qb, 1, &rs, 1);
	CHECK(svt_post_send1(p.qa, 2, IBV_WR_SEND, &ss, 1, IBV_SEND_SIGNALED, 0, 0) == 0);
	wc = svt_wait(p.acq, "uc send");
	CHECK_WC(wc, IBV_WC_SUCCESS);
	wc = svt_wait(p.bcq, "uc recv");
	CHECK_WC(wc, IBV_WC_SUCCESS);
	CHECK_EQ(wc.byte_len, 3000);
	CHECK(memcmp(A, B, 3000) == 0);

	memset(B, 0, 8192);
	CHECK(svt_post_send1(p.qa, 3, IBV_WR_RDMA_WRITE, &ss, 1, IBV_SEND_SIGNALED,
			     (uintptr_t)B + 10, mb->rkey) == 0);
	wc = svt_wait(p.acq, "uc write");
	CHECK_WC(wc, IBV_WC_SUCCESS);
	CHECK(memcmp(A, B + 10, 3000) == 0);
	svt_expect_empty(p.bcq, NOTHING_MS, "uc write");

	/* No receive posted: dropped, the sender still succeeds, no RNR wait */
	memset(B, 0, 8192);
	uint64_t t0 = svt_now_ms();
	CHECK(svt_post_send1(p.qa, 4, IBV_WR_SEND, &ss, 1, IBV_SEND_SIGNALED, 0, 0) == 0);
	wc = svt_wait(p.acq, "uc dropped send");
	CHECK_WC(wc, IBV_WC_SUCCESS);
	CHECK_EQ(wc.wr_id, 4);
	CHECK(svt_now_ms() - t0 < 1000);
	svt_expect_empty(p.bcq, NOTHING_MS, "uc dropped");
	/* A receive posted afterwards does not see the dropped message */
	svt_post_recv1(p.qb, 5, &rs, 1);
	svt_expect_empty(p.bcq, NOTHING_MS, "uc late recv");
	CHECK(B[0] == 0);
	/* ...but takes the next one */
	struct ibv_sge s2 = svt_sge(ma, 100, 10);
	CHECK(svt_post_send1(p.qa, 6, IBV_WR_SEND, &s2, 1, IBV_SEND_SIGNALED, 0, 0) == 0);
	wc = svt_wait(p.bcq, "uc recv 2");
	CHECK_WC(wc, IBV_WC_SUCCESS);
	CHECK_EQ(wc.wr_id, 5);
	CHECK_EQ(wc.byte_len, 10);
	CHECK(memcmp(B, A + 100, 10) == 0);
	CHECK_EQ(svt_state(p.qa), IBV_QPS_RTS);
	CHECK_EQ(svt_state(p.qb), IBV_QPS_RTS);
	/* RDMA READ is not a UC operation */
	CHECK(svt_post_send1(p.qa, 7, IBV_WR_RDMA_READ, &ss, 1, IBV_SEND_SIGNALED,
			     (uintptr_t)B, mb->rkey) != 0);
}

/* ---- UD ----------------------------------------------------------------- */
static void sc_ud(void)
{
	struct pair p;
	pair_open(&p);
	struct svt_qpopt o = {IBV_QPT_UD, p.acq, p.acq, NULL, 0, 64, 64, 2, 0};
	p.qa = svt_qp(&p.a, &o);
	o.scq = o.rcq = p.bcq;
	p.qb = svt_qp(&p.b, &o);
	const uint32_t QK = 0x11111111;
	svt_ud_up(p.qa, QK);
	svt_ud_up(p.qb, QK);
	struct ibv_mr *ma = svt_mr(&p.a, 16384, SVT_ALL_ACCESS);
	struct ibv_mr *mb = svt_mr(&p.b, 16384, SVT_ALL_ACCESS);
	char *A = ma->addr, *B = mb->addr;
	struct ibv_wc wc;
	svt_fill(A, 16384, 31);

	struct ibv_ah_attr aa;
	memset(&aa, 0, sizeof(aa));
	aa.dlid = p.b.lid;
	aa.port_num = 1;
	aa.sl = 3;
	/* The sender's source path bits are not the receiver's DLID path
	 * bits, which with LMC 0 are none (a helper saw 3 reported). */
	aa.src_path_bits = 3;
	struct ibv_ah *ah_lid = ibv_create_ah(p.a.pd, &aa);
	CHECK(ah_lid);
	aa.src_path_bits = 0;
	aa.is_global = 1;
	aa.grh.dgid = p.b.gid;
	aa.grh.sgid_index = 0;
	aa.grh.hop_limit = 64;
	aa.grh.traffic_class = 0;
	aa.grh.flow_label = 0;
	struct ibv_ah *ah_grh = ibv_create_ah(p.a.pd, &aa);
	CHECK(ah_grh);

	struct ibv_send_wr wr = {0}, *bad;
	struct ibv_sge ss = svt_sge(ma, 0, 200);
	wr.sg_list = &ss;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_SEND;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.wr.ud.remote_qpn = p.qb->qp_num;
	wr.wr.ud.remote_qkey = QK;

	for (int g = 0; g < 2; g++) {
		memset(B, 0xcc, 16384);
		struct ibv_sge rs = svt_sge(mb, 0, 40 + 1024);
		svt_post_recv1(p.qb, 50 + g, &rs, 1);
		wr.wr_id = g;
		wr.wr.ud.ah = g ? ah_grh : ah_lid;
		CHECK(ibv_post_send(p.qa, &wr, &bad) == 0);
		wc = svt_wait(p.acq, "ud send");
		CHECK_WC(wc, IBV_WC_SUCCESS);
		CHECK_EQ(wc.wr_id, g);
		wc = svt_wait(p.bcq, "ud recv");
		CHECK_WC(wc, IBV_WC_SUCCESS);
		CHECK_EQ(wc.wr_id, 50 + g);
		CHECK_EQ(wc.byte_len, 200 + 40);
		CHECK_EQ(wc.src_qp, p.qa->qp_num);
		CHECK_EQ(wc.slid, p.a.lid);
		CHECK_EQ(wc.sl, 3);
		CHECK_EQ(wc.dlid_path_bits, 0);
		CHECK_EQ(!!(wc.wc_flags & IBV_WC_GRH), g);
		CHECK(memcmp(B + 40, A, 200) == 0);
		CHECK((unsigned char)B[240] == 0xcc);
		if (g) {
			struct ibv_grh *h = (struct ibv_grh *)B;
			CHECK(memcmp(&h->dgid, &p.b.gid, 16) == 0);
			CHECK(memcmp(&h->sgid, &p.a.gid, 16) == 0);
			CHECK_EQ(ntohs(h->paylen), 12 + 8 + 200 + 4); /* BTH DETH data ICRC */
			CHECK_EQ(h->next_hdr, 0x1b);
			CHECK_EQ(h->hop_limit, 64);
			CHECK_EQ(ntohl(h->version_tclass_flow) >> 28, 6);
		}
	}

	/* Q_Key mismatch: the sender completes, the packet is dropped */
	struct ibv_sge rs = svt_sge(mb, 0, 40 + 1024);
	svt_post_recv1(p.qb, 60, &rs, 1);
	wr.wr_id = 3;
	wr.wr.ud.ah = ah_lid;
	wr.wr.ud.remote_qkey = QK + 1;
	CHECK(ibv_post_send(p.qa, &wr, &bad) == 0);
	wc = svt_wait(p.acq, "qkey mismatch send");
	CHECK_WC(wc, IBV_WC_SUCCESS);
	svt_expect_empty(p.bcq, NOTHING_MS, "qkey mismatch must be dropped");
	/* The receive is still there for the next good one (with imm) */
	wr.wr_id = 4;
	wr.wr.ud.remote_qkey = QK;
	wr.opcode = IBV_WR_SEND_WITH_IMM;
	wr.imm_data = htonl(77);
	CHECK(ibv_post_send(p.qa, &wr, &bad) == 0);
	wc = svt_wait(p.acq, "ud imm send");
	CHECK_WC(wc, IBV_WC_SUCCESS);
	wc = svt_wait(p.bcq, "ud imm recv");
	CHECK_WC(wc, IBV_WC_SUCCESS);
	CHECK_EQ(wc.wr_id, 60);
	CHECK(wc.wc_flags & IBV_WC_WITH_IMM);
	CHECK_EQ(ntohl(wc.imm_data), 77);
	wr.opcode = IBV_WR_SEND;

	/* Larger than the MTU: nothing is sent and it is no error (IBTA
	 * C10-93.1.1, as rxe): SUCCESS, nothing delivered, the QP goes on */
	svt_post_recv1(p.qb, 61, &rs, 1);
	uint32_t mtu = 128u << p.a.mtu;
	struct ibv_sge big = svt_sge(ma, 0, mtu + 1);
	wr.sg_list = &big;
	wr.wr_id = 5;
	CHECK(ibv_post_send(p.qa, &wr, &bad) == 0);
	wc = svt_wait(p.acq, "ud too long");
	CHECK_WC(wc, IBV_WC_SUCCESS);
	CHECK_EQ(wc.wr_id, 5);
	svt_expect_empty(p.bcq, NOTHING_MS, "too long must not arrive");
	CHECK_EQ(svt_state(p.qa), IBV_QPS_RTS);
	/* Exactly the MTU passes (into a big enough buffer) */
	struct ibv_sge rbig = svt_sge(mb, 0, 40 + mtu);
	(void)rbig;
	big.length = mtu;
	wr.wr_id = 6;
	CHECK(ibv_post_send(p.qa, &wr, &bad) == 0);
	wc = svt_wait(p.acq, "ud mtu");
	CHECK_WC(wc, IBV_WC_SUCCESS);
	if (mtu <= 1024) {
		wc = svt_wait(p.bcq, "ud mtu recv");
		CHECK_WC(wc, IBV_WC_SUCCESS);
		CHECK_EQ(wc.byte_len, mtu + 40);
	}
}

/* ---- Multicast ---------------------------------------------------------- */
static void sc_mcast(void)
{
	struct svt_dev d;
	svt_open(&d, dev_a);
	struct ibv_cq *cq[4];
	struct ibv_qp *qp[4];
	struct ibv_mr *mr = svt_mr(&d, 4 * 4096, SVT_ALL_ACCESS);
	const uint32_t QK = 0x22;
	for (int i = 0; i < 4; i++) {
		cq[i] = ibv_create_cq(d.ctx, 16, NULL, NULL, 0);
		CHECK(cq[i]);
		struct svt_qpopt o = {IBV_QPT_UD, cq[i], cq[i], NULL, 1, 16, 16, 1, 0};
		qp[i] = svt_qp(&d, &o);
		svt_ud_up(qp[i], QK);
	}
	union ibv_gid mgid;
	memset(&mgid, 0, sizeof(mgid));
	mgid.raw[0] = 0xff;
	mgid.raw[1] = 0x12;
	mgid.raw[15] = 0x42;
	uint16_t mlid = 0xc001;
	for (int i = 1; i < 4; i++)
		CHECK(ibv_attach_mcast(qp[i], &mgid, mlid) == 0);
	struct ibv_ah_attr aa;
	memset(&aa, 0, sizeof(aa));
	aa.dlid = mlid;
	aa.port_num = 1;
	aa.is_global = 1;
	aa.grh.dgid = mgid;
	aa.grh.hop_limit = 1;
	struct ibv_ah *ah = ibv_create_ah(d.pd, &aa);
	CHECK(ah);
	char *buf = mr->addr;
	for (int round = 0; round < 2; round++) {
		for (int i = 1; i < 4; i++) {
			struct ibv_sge rs = svt_sge(mr, 4096 * i, 4096);
			svt_post_recv1(qp[i], 100 * round + i, &rs, 1);
		}
		svt_fill(buf, 100, 40 + round);
		struct ibv_sge ss = svt_sge(mr, 0, 100);
		struct ibv_send_wr wr = {0}, *bad;
		wr.wr_id = round;
		wr.sg_list = &ss;
		wr.num_sge = 1;
		wr.opcode = IBV_WR_SEND;
		wr.wr.ud.ah = ah;
		wr.wr.ud.remote_qpn = 0xffffff;
		wr.wr.ud.remote_qkey = QK;
		CHECK(ibv_post_send(qp[0], &wr, &bad) == 0);
		struct ibv_wc wc = svt_wait(cq[0], "mcast send");
		CHECK_WC(wc, IBV_WC_SUCCESS);
		for (int i = 1; i < 4; i++) {
			if (round == 1 && i == 2) {
				svt_expect_empty(cq[i], NOTHING_MS, "detached QP must not receive");
				continue;
			}
			wc = svt_wait(cq[i], "mcast recv");
			CHECK_WC(wc, IBV_WC_SUCCESS);
			CHECK_EQ(wc.wr_id, 100 * round + i);
			CHECK_EQ(wc.byte_len, 140);
			CHECK_EQ(wc.src_qp, qp[0]->qp_num);
			CHECK(wc.wc_flags & IBV_WC_GRH);
			CHECK(memcmp(buf + 4096 * i + 40, buf, 100) == 0);
			struct ibv_grh *h = (struct ibv_grh *)(buf + 4096 * i);
			CHECK(memcmp(&h->dgid, &mgid, 16) == 0);
		}
		if (round == 0)
			CHECK(ibv_detach_mcast(qp[2], &mgid, mlid) == 0);
	}
	/* Detaching what is not attached fails */
	CHECK(ibv_detach_mcast(qp[2], &mgid, mlid) != 0);
}

/*
 * A QP's own multicast datagram comes back to it when it is attached to the
 * group, as on an HCA, unless it was created with
 * IBV_QP_CREATE_BLOCK_SELF_MCAST_LB ("the QP will not receive self multicast
 * loopback traffic").  qp[0] plain, qp[1] with the flag, qp[2] plain; all
 * three attached; each sends once.
 */
static void sc_mcast_self(void)
{
	struct svt_dev d;
	svt_open(&d, dev_a);
	struct ibv_cq *cq[3];
	struct ibv_qp *qp[3];
	struct ibv_mr *mr = svt_mr(&d, 4 * 4096, SVT_ALL_ACCESS);
	const uint32_t QK = 0x23;
	for (int i = 0; i < 3; i++) {
		cq[i] = ibv_create_cq(d.ctx, 16, NULL, NULL, 0);
		CHECK(cq[i]);
		struct ibv_qp_init_attr_ex a;
		memset(&a, 0, sizeof(a));
		a.qp_type = IBV_QPT_UD;
		a.send_cq = a.recv_cq = cq[i];
		a.cap.max_send_wr = a.cap.max_recv_wr = 8;
		a.cap.max_send_sge = a.cap.max_recv_sge = 1;
		a.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS;
		a.pd = d.pd;
		a.create_flags = i == 1 ? IBV_QP_CREATE_BLOCK_SELF_MCAST_LB : 0;
		qp[i] = ibv_create_qp_ex(d.ctx, &a);
		CHECK(qp[i]);
		svt_ud_up(qp[i], QK);
	}
	union ibv_gid mgid;
	memset(&mgid, 0, sizeof(mgid));
	mgid.raw[0] = 0xff;
	mgid.raw[1] = 0x12;
	mgid.raw[15] = 0x43;
	uint16_t mlid = 0xc002;
	for (int i = 0; i < 3; i++)
		CHECK(ibv_attach_mcast(qp[i], &mgid, mlid) == 0);
	struct ibv_ah_attr aa;
	memset(&aa, 0, sizeof(aa));
	aa.dlid = mlid;
	aa.port_num = 1;
	aa.is_global = 1;
	aa.grh.dgid = mgid;
	aa.grh.hop_limit = 1;
	struct ibv_ah *ah = ibv_create_ah(d.pd, &aa);
	CHECK(ah);
	char *buf = mr->addr;
	/* The blocked one last: its receive of that round stays posted. */
	static const int order[3] = {0, 2, 1};
	for (int k = 0; k < 3; k++) {
		int from = order[k];
		for (int i = 0; i < 3; i++) {
			struct ibv_sge rs = svt_sge(mr, 4096 * (i + 1), 4096);
			svt_post_recv1(qp[i], 10 * from + i, &rs, 1);
		}
		svt_fill(buf, 200, 50 + from);
		struct ibv_sge ss = svt_sge(mr, 0, 200);
		struct ibv_send_wr wr = {0}, *bad;
		wr.wr_id = 100 + from;
		wr.sg_list = &ss;
		wr.num_sge = 1;
		wr.opcode = IBV_WR_SEND;
		wr.send_flags = IBV_SEND_SIGNALED;
		wr.wr.ud.ah = ah;
		wr.wr.ud.remote_qpn = 0xffffff;
		wr.wr.ud.remote_qkey = QK;
		CHECK(ibv_post_send(qp[from], &wr, &bad) == 0);
		int sent = 0;
		for (int i = 0; i < 3; i++) {
			int recvs = 0;
			/* The sender's CQ has its send completion too. */
			for (int n = 0; n < (i == from ? 2 : 1); n++) {
				if (i == 1 && from == 1 && n == 1)
					break;
				struct ibv_wc wc = svt_wait(cq[i], "mcast self");
				CHECK_WC(wc, IBV_WC_SUCCESS);
				if (wc.opcode == IBV_WC_SEND) {
					CHECK_EQ(wc.wr_id, (uint64_t)(100 + from));
					sent++;
					continue;
				}
				CHECK_EQ(wc.opcode, IBV_WC_RECV);
				CHECK_EQ(wc.wr_id, (uint64_t)(10 * from + i));
				CHECK_EQ(wc.byte_len, 240);
				CHECK_EQ(wc.src_qp, qp[from]->qp_num);
				CHECK(memcmp(buf + 4096 * (i + 1) + 40, buf, 200) == 0);
				recvs++;
			}
			if (i == 1 && from == 1) {
				/* Blocked: its receive stays posted */
				svt_expect_empty(cq[1], NOTHING_MS, "a QP with BLOCK_SELF_MCAST_LB got its own datagram");
				CHECK_EQ(recvs, 0);
			} else {
				CHECK_EQ(recvs, 1);
			}
		}
		CHECK_EQ(sent, 1);
	}
}

/* ---- SRQ shared by several QPs, limit event ------------------------------ */
static void sc_srq(void)
{
	struct svt_dev d;
	svt_open(&d, dev_a);
	struct ibv_cq *cq = ibv_create_cq(d.ctx, 256, NULL, NULL, 0);
	struct ibv_cq *scq = ibv_create_cq(d.ctx, 256, NULL, NULL, 0);
	CHECK(cq && scq);
	struct ibv_srq_init_attr sa;
	memset(&sa, 0, sizeof(sa));
	sa.srq_context = (void *)0x5151;
	sa.attr.max_wr = 32;
	sa.attr.max_sge = 2;
	struct ibv_srq *srq = ibv_create_srq(d.pd, &sa);
	CHECK(srq);
	struct ibv_mr *mr = svt_mr(&d, 64 * 256, SVT_ALL_ACCESS);
	const int NQ = 3;
	struct ibv_qp *rq[3], *sq[3];
	for (int i = 0; i < NQ; i++) {
		struct svt_qpopt o = {IBV_QPT_RC, scq, cq, srq, 1, 16, 0, 1, 0};
		rq[i] = svt_qp(&d, &o);
		struct svt_qpopt o2 = {IBV_QPT_RC, scq, scq, NULL, 1, 16, 4, 1, 0};
		sq[i] = svt_qp(&d, &o2);
		struct svt_conn c = {SVT_ALL_ACCESS, 1, 14, 2, 7};
		svt_connect(rq[i], sq[i]->qp_num, d.lid, &c);
		svt_connect(sq[i], rq[i]->qp_num, d.lid, &c);
	}
	/* Posting a receive to a QP with an SRQ fails */
	struct ibv_sge rs0 = svt_sge(mr, 0, 64);
	struct ibv_recv_wr rw0 = {0}, *rbad;
	rw0.sg_list = &rs0;
	rw0.num_sge = 1;
	CHECK(ibv_post_recv(rq[0], &rw0, &rbad) != 0);

	const int NR = 10;
	for (int i = 0; i < NR; i++) {
		struct ibv_sge rs = svt_sge(mr, 64 * (i + 1), 64);
		struct ibv_recv_wr w = {0};
		w.wr_id = 1000 + i;
		w.sg_list = &rs;
		w.num_sge = 1;
		CHECK(ibv_post_srq_recv(srq, &w, &rbad) == 0);
	}
	struct ibv_srq_attr at;
	at.srq_limit = 5;
	CHECK(ibv_modify_srq(srq, &at, IBV_SRQ_LIMIT) == 0);
	CHECK(ibv_query_srq(srq, &at) == 0);
	CHECK_EQ(at.srq_limit, 5);
	/* async fd non-blocking to check "no event yet" */
	int fl = fcntl(d.ctx->async_fd, F_GETFL);
	CHECK(fcntl(d.ctx->async_fd, F_SETFL, fl | O_NONBLOCK) == 0);
	struct ibv_async_event ev;
	char *buf = mr->addr;
	int seen[10] = {0};
	for (int k = 0; k < 6; k++) {
		int i = k % NQ;
		buf[k] = (char)(k + 1);
		struct ibv_sge ss = svt_sge(mr, k, 1);
		CHECK(svt_post_send1(sq[i], k, IBV_WR_SEND, &ss, 1, 0, 0, 0) == 0);
		struct ibv_wc wc = svt_wait(cq, "srq recv");
		CHECK_WC(wc, IBV_WC_SUCCESS);
		CHECK_EQ(wc.qp_num, rq[i]->qp_num);
		CHECK_EQ(wc.src_qp, sq[i]->qp_num);
		CHECK(wc.wr_id >= 1000 && wc.wr_id < 1000 + NR);
		CHECK(!seen[wc.wr_id - 1000]);
		seen[wc.wr_id - 1000] = 1;
		CHECK_EQ(buf[64 * (wc.wr_id - 1000 + 1)], k + 1);
		wc = svt_wait(scq, "srq send");
		CHECK_WC(wc, IBV_WC_SUCCESS);
		/* 10 posted, k+1 taken: below 5 left after the 6th */
		if (k < 5) {
			errno = 0;
			struct pollfd pfd = {d.ctx->async_fd, POLLIN, 0};
			CHECK(poll(&pfd, 1, NOTHING_MS) == 0);
		}
	}
	struct pollfd pfd = {d.ctx->async_fd, POLLIN, 0};
	CHECK(poll(&pfd, 1, 2000) == 1);
	CHECK(fcntl(d.ctx->async_fd, F_SETFL, fl) == 0);
	CHECK(ibv_get_async_event(d.ctx, &ev) == 0);
	CHECK_EQ(ev.event_type, IBV_EVENT_SRQ_LIMIT_REACHED);
	CHECK(ev.element.srq == srq);
	ibv_ack_async_event(&ev);
	/* The limit is disarmed after firing */
	CHECK(ibv_query_srq(srq, &at) == 0);
	CHECK_EQ(at.srq_limit, 0);
	for (int i = 0; i < NQ; i++) {
		CHECK(ibv_destroy_qp(rq[i]) == 0);
		CHECK(ibv_destroy_qp(sq[i]) == 0);
	}
	CHECK(ibv_destroy_srq(srq) == 0);
}

/* ---- CQ overflow --------------------------------------------------------- */
/*
 * A send CQ overrun: IBV_EVENT_CQ_ERR naming it.  With resize, the CQ is
 * resized (to a new ring) before the event is read: the event, raised on the
 * old ring, still names the CQ (it was dropped as an event of a CQ gone).
 */
static void cq_overflow(int resize)
{
	struct pair p;
	pair_open(&p);
	struct ibv_cq *small = ibv_create_cq(p.a.ctx, 4, (void *)0x77, NULL, 0);
	CHECK(small);
	int cap = small->cqe;
	CHECK(cap >= 4);
	struct svt_qpopt o = {IBV_QPT_RC, small, p.acq, NULL, 1, 256, 16, 1, 0};
	p.qa = svt_qp(&p.a, &o);
	struct svt_qpopt o2 = {IBV_QPT_RC, p.bcq, p.bcq, NULL, 1, 16, 16, 1, 0};
	p.qb = svt_qp(&p.b, &o2);
	struct svt_conn c = {SVT_ALL_ACCESS, 1, 14, 2, 7};
	svt_connect(p.qa, p.qb->qp_num, p.b.lid, &c);
	svt_connect(p.qb, p.qa->qp_num, p.a.lid, &c);
	struct ibv_mr *ma = svt_mr(&p.a, 4096, SVT_ALL_ACCESS);
	struct ibv_mr *mb = svt_mr(&p.b, 4096, SVT_ALL_ACCESS);
	struct ibv_sge ss = svt_sge(ma, 0, 8);
	for (int i = 0; i < cap + 2; i++)
		CHECK(svt_post_send1(p.qa, i, IBV_WR_RDMA_WRITE, &ss, 1, 0, (uintptr_t)mb->addr,
				     mb->rkey) == 0);
	struct pollfd pfd = {p.a.ctx->async_fd, POLLIN, 0};
	CHECK(poll(&pfd, 1, 3000) == 1);
	if (resize) {
		CHECK(ibv_resize_cq(small, 64) == 0);
		CHECK(small->cqe >= 64);
	}
	/* Non-blocking: an event the library drops must fail here, not hang */
	int fl = fcntl(p.a.ctx->async_fd, F_GETFL);
	CHECK(fcntl(p.a.ctx->async_fd, F_SETFL, fl | O_NONBLOCK) == 0);
	struct ibv_async_event ev;
	CHECK(ibv_get_async_event(p.a.ctx, &ev) == 0);
	CHECK_EQ(ev.event_type, IBV_EVENT_CQ_ERR);
	CHECK(ev.element.cq == small);
	ibv_ack_async_event(&ev);
	CHECK(fcntl(p.a.ctx->async_fd, F_SETFL, fl) == 0);
}

static void sc_cq_overflow(void)
{
	cq_overflow(0);
	cq_overflow(1);
}

/* ---- Error statuses ----------------------------------------------------- */
/* After an error on A's send queue: A and B in ERR, outstanding WRs flushed. */
static void check_flushed(struct pair *p, int b_in_err)
{
	CHECK_EQ(svt_state(p->qa), IBV_QPS_ERR);
	if (b_in_err)
		CHECK_EQ(svt_state(p->qb), IBV_QPS_ERR);
}

static void drain_cq(struct ibv_cq *cq)
{
	struct ibv_wc wc;
	while (svt_poll(cq, &wc, 20))
		;
}

static void sc_errors(void)
{
	struct ibv_wc wc;
	/* 1. bad lkey -> LOC_PROT_ERR; then the QP is in ERR: a posted receive and
	 * the next sends flush. */
	{
		struct pair p;
		simple_pair(&p, IBV_QPT_RC);
		struct ibv_mr *ma = svt_mr(&p.a, 4096, SVT_ALL_ACCESS);
		struct ibv_mr *mb = svt_mr(&p.b, 4096, SVT_ALL_ACCESS);
		struct ibv_sge rs = svt_sge(ma, 0, 4096);
		svt_post_recv1(p.qa, 500, &rs, 1);
		svt_post_recv1(p.qa, 501, &rs, 1);
		struct ibv_sge ss = svt_sge(ma, 0, 16);
		ss.lkey ^= 0x5a5a00;
		CHECK(svt_post_send1(p.qa, 1, IBV_WR_RDMA_WRITE, &ss, 1, 0, (uintptr_t)mb->addr,
				     mb->rkey) == 0);
		wc = svt_wait(p.acq, "bad lkey");
		/* Unsignaled, but errors always complete */
		CHECK_EQ(wc.wr_id, 1);
		CHECK_WC(wc, IBV_WC_LOC_PROT_ERR);
		/* Range outside the MR is a bad lkey as well (needs fresh pair) */
		int got500 = 0, got501 = 0;
		for (int i = 0; i < 2; i++) {
			wc = svt_wait(p.acq, "flushed recv");
			CHECK_WC(wc, IBV_WC_WR_FLUSH_ERR);
			got500 += wc.wr_id == 500;
			got501 += wc.wr_id == 501;
		}
		CHECK(got500 == 1 && got501 == 1);
		check_flushed(&p, 0);
		struct ibv_sge good = svt_sge(ma, 0, 16);
		CHECK(svt_post_send1(p.qa, 2, IBV_WR_RDMA_WRITE, &good, 1, 0, (uintptr_t)mb->addr,
				     mb->rkey) == 0);
		wc = svt_wait(p.acq, "flushed send");
		CHECK_EQ(wc.wr_id, 2);
		CHECK_WC(wc, IBV_WC_WR_FLUSH_ERR);
		svt_post_recv1(p.qa, 502, &rs, 1);
		wc = svt_wait(p.acq, "recv posted in ERR");
		CHECK_EQ(wc.wr_id, 502);
		CHECK_WC(wc, IBV_WC_WR_FLUSH_ERR);
		svt_expect_empty(p.bcq, NOTHING_MS, "B sees nothing");
	}
	/* 1b. local SGE beyond the MR's bounds -> LOC_PROT_ERR */
	{
		struct pair p;
		simple_pair(&p, IBV_QPT_RC);
		struct ibv_mr *ma = svt_mr(&p.a, 4096, SVT_ALL_ACCESS);
		struct ibv_mr *mb = svt_mr(&p.b, 4096, SVT_ALL_ACCESS);
		struct ibv_sge ss = svt_sge(ma, 4000, 200);
		CHECK(svt_post_send1(p.qa, 1, IBV_WR_RDMA_WRITE, &ss, 1, IBV_SEND_SIGNALED,
				     (uintptr_t)mb->addr, mb->rkey) == 0);
		wc = svt_wait(p.acq, "local oob");
		CHECK_WC(wc, IBV_WC_LOC_PROT_ERR);
		/* RDMA READ into a local MR without LOCAL_WRITE -> LOC_PROT_ERR */
		struct pair q;
		simple_pair(&q, IBV_QPT_RC);
		struct ibv_mr *ro = svt_mr(&q.a, 4096, 0);
		struct ibv_mr *mb2 = svt_mr(&q.b, 4096, SVT_ALL_ACCESS);
		struct ibv_sge rs = svt_sge(ro, 0, 16);
		CHECK(svt_post_send1(q.qa, 2, IBV_WR_RDMA_READ, &rs, 1, IBV_SEND_SIGNALED,
				     (uintptr_t)mb2->addr, mb2->rkey) == 0);
		wc = svt_wait(q.acq, "read into read-only");
		CHECK_WC(wc, IBV_WC_LOC_PROT_ERR);
	}
	/* 2. remote access errors, each on a fresh pair; the target is left intact.
	 * Kinds 6-8 are zero-length: no key is checked (IBTA 9.4.3), but the
	 * QP's rights are, as rxe's check_op_valid (they completed SUCCESS). */
	for (int kind = 0; kind < 9; kind++) {
		struct pair p;
		pair_open(&p);
		int qp_access_b = SVT_ALL_ACCESS;
		if (kind == 3 || kind == 6 || kind == 8)
			qp_access_b = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ; /* no remote write */
		if (kind == 7)
			qp_access_b = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE; /* no remote read */
		pair_connect(&p, IBV_QPT_RC, SVT_ALL_ACCESS, qp_access_b, 1, 7, 0, 0);
		struct ibv_mr *ma = svt_mr(&p.a, 4096, SVT_ALL_ACCESS);
		int mr_access = SVT_ALL_ACCESS;
		if (kind == 2)
			mr_access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ;
		if (kind == 5)
			mr_access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
		struct ibv_mr *mb = svt_mr(&p.b, 4096, mr_access);
		memset(mb->addr, 0x55, 4096);
		svt_fill(ma->addr, 4096, 1);
		struct ibv_sge rs = svt_sge(mb, 0, 4096);
		svt_post_recv1(p.qb, 900, &rs, 1);
		struct ibv_sge ss = svt_sge(ma, 0, 64);
		uint64_t raddr = (uintptr_t)mb->addr;
		uint32_t rkey = mb->rkey;
		enum ibv_wr_opcode op = IBV_WR_RDMA_WRITE;
		const char *what = "";
		switch (kind) {
		case 0: rkey ^= 0x330000; what = "bad rkey"; break;
		case 1: raddr += 4096 - 32; what = "write beyond the MR"; break;
		case 2: what = "MR without REMOTE_WRITE"; break;
		case 3: what = "QP without REMOTE_WRITE"; break;
		case 4: raddr -= 8; op = IBV_WR_RDMA_READ; what = "read below the MR"; break;
		case 5: op = IBV_WR_RDMA_READ; what = "MR without REMOTE_READ"; break;
		case 6: what = "zero-length WRITE to a QP without REMOTE_WRITE"; break;
		case 7: op = IBV_WR_RDMA_READ; what = "zero-length READ from a QP without REMOTE_READ"; break;
		case 8:
			op = IBV_WR_RDMA_WRITE_WITH_IMM;
			what = "zero-length WRITE_WITH_IMM to a QP without REMOTE_WRITE";
			break;
		}
		int nsge = kind >= 6 ? 0 : 1;
		CHECK(svt_post_send1(p.qa, 10 + kind, op, &ss, nsge, IBV_SEND_SIGNALED, raddr, rkey) ==
		      0);
		/* A second WR behind it flushes */
		CHECK(svt_post_send1(p.qa, 20 + kind, IBV_WR_SEND, &ss, 1, IBV_SEND_SIGNALED, 0, 0) ==
		      0);
		wc = svt_wait(p.acq, what);
		CHECK_EQ(wc.wr_id, 10 + kind);
		if (wc.status != IBV_WC_REM_ACCESS_ERR)
			FAIL("%s: status %s, expected REM_ACCESS_ERR", what,
			     ibv_wc_status_str(wc.status));
		wc = svt_wait(p.acq, "flush after remote error");
		CHECK_EQ(wc.wr_id, 20 + kind);
		CHECK_WC(wc, IBV_WC_WR_FLUSH_ERR);
		unsigned char *b = mb->addr;
		for (int i = 0; i < 4096; i++)
			if (b[i] != 0x55)
				FAIL("%s: target byte %d changed", what, i);
		check_flushed(&p, 1);
		/* The responder's QP is in ERR and its outstanding receive flushed
		 * (a WRITE_WITH_IMM took it: completed in error, as its non-empty
		 * kind does) */
		wc = svt_wait(p.bcq, "responder flush");
		CHECK_EQ(wc.wr_id, 900);
		if (kind == 8 && wc.status != IBV_WC_REM_ACCESS_ERR)
			FAIL("%s: the taken receive completed %s, expected REM_ACCESS_ERR", what,
			     ibv_wc_status_str(wc.status));
		if (kind != 8)
			CHECK_WC(wc, IBV_WC_WR_FLUSH_ERR);
		/* The responder's owner hears of it: IBV_EVENT_QP_ACCESS_ERR on B */
		struct pollfd pfd = {p.b.ctx->async_fd, POLLIN, 0};
		if (poll(&pfd, 1, 2000) != 1)
			FAIL("%s: no async event at the responder", what);
		int fl = fcntl(p.b.ctx->async_fd, F_GETFL);
		CHECK(fcntl(p.b.ctx->async_fd, F_SETFL, fl | O_NONBLOCK) == 0);
		struct ibv_async_event ev;
		CHECK(ibv_get_async_event(p.b.ctx, &ev) == 0);
		CHECK_EQ(ev.event_type, IBV_EVENT_QP_ACCESS_ERR);
		CHECK(ev.element.qp == p.qb);
		ibv_ack_async_event(&ev);
	}
	/* 3. atomic without REMOTE_ATOMIC on the MR -> REM_ACCESS_ERR */
	{
		struct pair p;
		simple_pair(&p, IBV_QPT_RC);
		struct ibv_mr *ma = svt_mr(&p.a, 4096, SVT_ALL_ACCESS);
		struct ibv_mr *mb = svt_mr(&p.b, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
		*(uint64_t *)mb->addr = 1;
		struct ibv_send_wr wr = {0}, *bad;
		struct ibv_sge ss = svt_sge(ma, 0, 8);
		wr.wr_id = 3;
		wr.sg_list = &ss;
		wr.num_sge = 1;
		wr.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
		wr.send_flags = IBV_SEND_SIGNALED;
		wr.wr.atomic.remote_addr = (uintptr_t)mb->addr;
		wr.wr.atomic.rkey = mb->rkey;
		wr.wr.atomic.compare_add = 1;
		CHECK(ibv_post_send(p.qa, &wr, &bad) == 0);
		wc = svt_wait(p.acq, "atomic no rights");
		CHECK_WC(wc, IBV_WC_REM_ACCESS_ERR);
		CHECK_EQ(*(uint64_t *)mb->addr, 1);
	}
	/* 4. receive buffer too small: LOC_LEN_ERR at the responder, REM_INV_REQ_ERR
	 * at the requester; both QPs in ERR, outstanding WRs on both flushed. */
	{
		struct pair p;
		simple_pair(&p, IBV_QPT_RC);
		struct ibv_mr *ma = svt_mr(&p.a, 4096, SVT_ALL_ACCESS);
		struct ibv_mr *mb = svt_mr(&p.b, 4096, SVT_ALL_ACCESS);
		struct ibv_sge small = svt_sge(mb, 0, 100), ar = svt_sge(ma, 2048, 100);
		svt_post_recv1(p.qb, 70, &small, 1);
		svt_post_recv1(p.qb, 71, &small, 1);
		svt_post_recv1(p.qa, 80, &ar, 1);
		struct ibv_sge ss = svt_sge(ma, 0, 101);
		CHECK(svt_post_send1(p.qa, 1, IBV_WR_SEND, &ss, 1, IBV_SEND_SIGNALED, 0, 0) == 0);
		wc = svt_wait(p.acq, "requester of too long");
		CHECK_EQ(wc.wr_id, 1);
		CHECK_WC(wc, IBV_WC_REM_INV_REQ_ERR);
		wc = svt_wait(p.bcq, "responder of too long");
		CHECK_EQ(wc.wr_id, 70);
		CHECK_WC(wc, IBV_WC_LOC_LEN_ERR);
		wc = svt_wait(p.bcq, "responder flush");
		CHECK_EQ(wc.wr_id, 71);
		CHECK_WC(wc, IBV_WC_WR_FLUSH_ERR);
		wc = svt_wait(p.acq, "requester recv flush");
		CHECK_EQ(wc.wr_id, 80);
		CHECK_WC(wc, IBV_WC_WR_FLUSH_ERR);
		check_flushed(&p, 1);
		/* B's send queue: posting in ERR flushes */
		CHECK(svt_post_send1(p.qb, 5, IBV_WR_SEND, &small, 1, 0, 0, 0) == 0);
		wc = svt_wait(p.bcq, "B send flush");
		CHECK_EQ(wc.wr_id, 5);
		CHECK_WC(wc, IBV_WC_WR_FLUSH_ERR);
		/* Exactly fitting works on a fresh pair */
		struct pair q;
		simple_pair(&q, IBV_QPT_RC);
		ma = svt_mr(&q.a, 4096, SVT_ALL_ACCESS);
		mb = svt_mr(&q.b, 4096, SVT_ALL_ACCESS);
		small = svt_sge(mb, 0, 100);
		svt_post_recv1(q.qb, 1, &small, 1);
		ss = svt_sge(ma, 0, 100);
		CHECK(svt_post_send1(q.qa, 1, IBV_WR_SEND, &ss, 1, IBV_SEND_SIGNALED, 0, 0) == 0);
		CHECK_WC(svt_wait(q.acq, "fit"), IBV_WC_SUCCESS);
		CHECK_WC(svt_wait(q.bcq, "fit"), IBV_WC_SUCCESS);
	}
	/* 5. a RNR-blocked send queue: WRs behind a blocked one flush when the QP
	 * is moved to ERR by the application */
	{
		struct pair p;
		pair_open(&p);
		pair_connect(&p, IBV_QPT_RC, SVT_ALL_ACCESS, SVT_ALL_ACCESS, 31 /* 491 ms */, 7, 0, 0);
		struct ibv_mr *ma = svt_mr(&p.a, 4096, SVT_ALL_ACCESS);
		struct ibv_sge ss = svt_sge(ma, 0, 8);
		for (int i = 0; i < 3; i++)
			CHECK(svt_post_send1(p.qa, i, IBV_WR_SEND, &ss, 1, IBV_SEND_SIGNALED, 0, 0) == 0);
		svt_expect_empty(p.acq, NOTHING_MS, "blocked by RNR");
		struct ibv_qp_attr a = {.qp_state = IBV_QPS_ERR};
		CHECK(ibv_modify_qp(p.qa, &a, IBV_QP_STATE) == 0);
		for (int i = 0; i < 3; i++) {
			wc = svt_wait(p.acq, "flush of backlog");
			CHECK_EQ(wc.wr_id, i);
			CHECK_WC(wc, IBV_WC_WR_FLUSH_ERR);
		}
		drain_cq(p.bcq);
	}
}

/* ---- RNR ---------------------------------------------------------------- */
static void sc_rnr(void)
{
	struct ibv_wc wc;
	for (int retry = 0; retry <= 7; retry++) {
		struct pair p;
		pair_open(&p);
		/* min_rnr_timer 14 = 1.28 ms at B */
		pair_connect(&p, IBV_QPT_RC, SVT_ALL_ACCESS, SVT_ALL_ACCESS, 14, retry, 0, 0);
		struct ibv_mr *ma = svt_mr(&p.a, 4096, SVT_ALL_ACCESS);
		struct ibv_mr *mb = svt_mr(&p.b, 4096, SVT_ALL_ACCESS);
		svt_fill(ma->addr, 64, retry);
		struct ibv_sge ss = svt_sge(ma, 0, 64);
		uint64_t t0 = svt_now_ms();
		CHECK(svt_post_send1(p.qa, 1, IBV_WR_SEND, &ss, 1, IBV_SEND_SIGNALED, 0, 0) == 0);
		if (retry < 7) {
			wc = svt_wait(p.acq, "rnr exhausted");
			CHECK_WC(wc, IBV_WC_RNR_RETRY_EXC_ERR);
			CHECK_EQ(wc.wr_id, 1);
			uint64_t dt = svt_now_ms() - t0;
			/* retry tries after the first, 1.28 ms apart */
			if (dt + 1 < (uint64_t)retry * 1)
				FAIL("rnr_retry %d gave up after %llu ms", retry,
				     (unsigned long long)dt);
			CHECK_EQ(svt_state(p.qa), IBV_QPS_ERR);
			svt_expect_empty(p.bcq, NOTHING_MS, "nothing at B");
		} else {
			/* Infinite retries: a receive posted 300 ms later takes it */
			svt_expect_empty(p.acq, NOTHING_MS, "rnr 7 waits");
			struct ibv_sge rs = svt_sge(mb, 0, 4096);
			svt_post_recv1(p.qb, 9, &rs, 1);
			wc = svt_wait(p.acq, "rnr 7 send");
			CHECK_WC(wc, IBV_WC_SUCCESS);
			wc = svt_wait(p.bcq, "rnr 7 recv");
			CHECK_WC(wc, IBV_WC_SUCCESS);
			CHECK_EQ(wc.byte_len, 64);
			CHECK(memcmp(ma->addr, mb->addr, 64) == 0);
			CHECK_EQ(svt_state(p.qa), IBV_QPS_RTS);
		}
	}
	/* A finite rnr_retry also succeeds when the receive comes in time:
	 * rnr_retry 6 with a 491 ms timer leaves ~3 s */
	{
		struct pair p;
		pair_open(&p);
		pair_connect(&p, IBV_QPT_RC, SVT_ALL_ACCESS, SVT_ALL_ACCESS, 31, 6, 0, 0);
		struct ibv_mr *ma = svt_mr(&p.a, 4096, SVT_ALL_ACCESS);
		struct ibv_mr *mb = svt_mr(&p.b, 4096, SVT_ALL_ACCESS);
		struct ibv_sge ss = svt_sge(ma, 0, 64);
		CHECK(svt_post_send1(p.qa, 1, IBV_WR_SEND, &ss, 1, IBV_SEND_SIGNALED, 0, 0) == 0);
		/* A second WR queues behind the blocked one and keeps order */
		CHECK(svt_post_send1(p.qa, 2, IBV_WR_RDMA_WRITE, &ss, 1, IBV_SEND_SIGNALED,
				     (uintptr_t)mb->addr + 100, mb->rkey) == 0);
		svt_expect_empty(p.acq, NOTHING_MS, "blocked");
		struct ibv_sge rs = svt_sge(mb, 0, 64);
		svt_post_recv1(p.qb, 9, &rs, 1);
		wc = svt_wait(p.acq, "first");
		CHECK_WC(wc, IBV_WC_SUCCESS);
		CHECK_EQ(wc.wr_id, 1);
		wc = svt_wait(p.acq, "second");
		CHECK_WC(wc, IBV_WC_SUCCESS);
		CHECK_EQ(wc.wr_id, 2);
	}
}

/* Transport retries against a destroyed responder: each try, the last one
 * too, waits out the QP's timeout before the next or before the WR fails
 * (IBTA 9.7.6.1.3, rxe), so RETRY_EXC_ERR comes (retry_cnt + 1) timeouts
 * after the post at the earliest (a lower bound only: a loaded machine is
 * later).  With retry_cnt 0 it came at once. */
static void sc_retry(void)
{
	for (int retry = 0; retry <= 2; retry++) {
		struct pair p;
		pair_open(&p);
		struct svt_qpopt o = {IBV_QPT_RC, p.acq, p.acq, NULL, 0, 64, 64, 4, 0};
		p.qa = svt_qp(&p.a, &o);
		o.scq = o.rcq = p.bcq;
		p.qb = svt_qp(&p.b, &o);
		/* timeout 14: 4.096 us << 14 = 67.1 ms */
		struct svt_conn c = {SVT_ALL_ACCESS, 1, 14, (uint8_t)retry, 7};
		svt_connect(p.qa, p.qb->qp_num, p.b.lid, &c);
		svt_connect(p.qb, p.qa->qp_num, p.a.lid, &c);
		struct ibv_mr *ma = svt_mr(&p.a, 4096, SVT_ALL_ACCESS);
		uint64_t raddr = 0x1000;
		CHECK_EQ(ibv_destroy_qp(p.qb), 0);
		struct ibv_sge ss = svt_sge(ma, 0, 64);
		uint64_t t0 = svt_now_ms();
		CHECK(svt_post_send1(p.qa, 1, IBV_WR_RDMA_WRITE, &ss, 1, IBV_SEND_SIGNALED, raddr,
				     0x1234) == 0);
		CHECK(svt_post_send1(p.qa, 2, IBV_WR_SEND, &ss, 1, IBV_SEND_SIGNALED, 0, 0) == 0);
		struct ibv_wc wc = svt_wait(p.acq, "retries exhausted");
		uint64_t dt = svt_now_ms() - t0;
		CHECK_WC(wc, IBV_WC_RETRY_EXC_ERR);
		CHECK_EQ(wc.wr_id, 1);
		if (dt < (uint64_t)(retry + 1) * 67 - 2)
			FAIL("retry_cnt %d, timeout 67 ms: RETRY_EXC_ERR after %llu ms, expected "
			     "at least %d", retry, (unsigned long long)dt, (retry + 1) * 67);
		wc = svt_wait(p.acq, "flushed");
		CHECK_WC(wc, IBV_WC_WR_FLUSH_ERR);
		CHECK_EQ(wc.wr_id, 2);
		CHECK_EQ(svt_state(p.qa), IBV_QPS_ERR);
		printf("retry_cnt %d: RETRY_EXC_ERR after %llu ms\n", retry, (unsigned long long)dt);
	}
}

/*
 * A process out of descriptors cannot map its peer's receive queue or CQ
 * (segments in /dev/shm): its SEND is as if lost, and completes with
 * RETRY_EXC_ERR once retry_cnt timeouts ran out, even with rnr_retry 7
 * (infinite).  Nothing reaches the receiver, whose QP stays in RTS with its
 * receive still posted.  resized: one SEND first (both queues mapped), then
 * the receiver resizes its CQ (a new ring, not mapped yet).  Before, the
 * first case was taken for RNR and retried for ever; the second took the
 * receive, failed the receiver's QP with no event and no completion, and
 * the sender got REM_OP_ERR (the review of that fix).  With descriptors
 * again, a new pair carries data.
 */
static void emfile_case(int resized)
{
	struct pair p;
	pair_open(&p);
	struct svt_qpopt o = {IBV_QPT_RC, p.acq, p.acq, NULL, 0, 16, 16, 1, 0};
	p.qa = svt_qp(&p.a, &o);
	o.scq = o.rcq = p.bcq;
	p.qb = svt_qp(&p.b, &o);
	struct svt_conn c = {SVT_ALL_ACCESS, 1, 14, 2, 7}; /* 67 ms, retry_cnt 2, rnr_retry 7 */
	svt_connect(p.qa, p.qb->qp_num, p.b.lid, &c);
	svt_connect(p.qb, p.qa->qp_num, p.a.lid, &c);
	struct ibv_mr *ma = svt_mr(&p.a, 4096, SVT_ALL_ACCESS);
	struct ibv_mr *mb = svt_mr(&p.b, 4096, SVT_ALL_ACCESS);
	struct ibv_sge rs = svt_sge(mb, 0, 4096);
	struct ibv_sge ss = svt_sge(ma, 0, 64);
	struct ibv_wc wc;
	if (resized) {
		svt_post_recv1(p.qb, 5, &rs, 1);
		CHECK(svt_post_send1(p.qa, 6, IBV_WR_SEND, &ss, 1, IBV_SEND_SIGNALED, 0, 0) == 0);
		wc = svt_wait(p.acq, "first send");
		CHECK_WC(wc, IBV_WC_SUCCESS);
		wc = svt_wait(p.bcq, "first recv");
		CHECK_WC(wc, IBV_WC_SUCCESS);
		CHECK(ibv_resize_cq(p.bcq, 1024) == 0);
	}
	static struct svt_nofds nofds;
	svt_fds_exhaust(&nofds);
	svt_post_recv1(p.qb, 7, &rs, 1);
	svt_fill(ma->addr, 64, 9);
	CHECK(svt_post_send1(p.qa, 8, IBV_WR_SEND, &ss, 1, IBV_SEND_SIGNALED, 0, 0) == 0);
	wc = svt_wait(p.acq, "a SEND whose receiver cannot be mapped");
	svt_fds_back(&nofds);
	CHECK_WC(wc, IBV_WC_RETRY_EXC_ERR);
	CHECK_EQ(wc.wr_id, 8);
	CHECK_EQ(svt_state(p.qa), IBV_QPS_ERR);
	svt_expect_empty(p.bcq, NOTHING_MS, "the receiver got a SEND that was never delivered");
	CHECK_EQ(svt_state(p.qb), IBV_QPS_RTS);
	/* Its receive is still posted: flushed when its QP goes to ERR */
	struct ibv_qp_attr ea = {.qp_state = IBV_QPS_ERR};
	CHECK(ibv_modify_qp(p.qb, &ea, IBV_QP_STATE) == 0);
	wc = svt_wait(p.bcq, "the receive, flushed");
	CHECK_WC(wc, IBV_WC_WR_FLUSH_ERR);
	CHECK_EQ(wc.wr_id, 7);
}

static void sc_emfile(void)
{
	emfile_case(0);
	emfile_case(1);
	struct pair q;
	simple_pair(&q, IBV_QPT_RC);
	struct ibv_mr *qa = svt_mr(&q.a, 4096, SVT_ALL_ACCESS);
	struct ibv_mr *qb = svt_mr(&q.b, 4096, SVT_ALL_ACCESS);
	memset(qb->addr, 0, 4096);
	struct ibv_sge qrs = svt_sge(qb, 0, 4096);
	svt_post_recv1(q.qb, 1, &qrs, 1);
	svt_fill(qa->addr, 100, 3);
	struct ibv_sge qss = svt_sge(qa, 0, 100);
	CHECK(svt_post_send1(q.qa, 2, IBV_WR_SEND, &qss, 1, IBV_SEND_SIGNALED, 0, 0) == 0);
	struct ibv_wc wc = svt_wait(q.acq, "send");
	CHECK_WC(wc, IBV_WC_SUCCESS);
	wc = svt_wait(q.bcq, "recv");
	CHECK_WC(wc, IBV_WC_SUCCESS);
	CHECK_EQ(wc.byte_len, 100);
	CHECK(memcmp(qb->addr, qa->addr, 100) == 0);
}

/* Attribute values modify_qp judges as the kernel (uverbs' modify_qp) and
 * rxe do: PSNs keep their low 24 bits; the AV's port must be a port, and at
 * INIT -> RTR the QP's own; the alternate path's two ports must be ports
 * and agree; qp_access_flags may carry bits a QP has no use for. */
static void sc_modify_values(void)
{
	struct svt_dev d;
	svt_open(&d, dev_a);
	struct ibv_cq *cq = ibv_create_cq(d.ctx, 16, NULL, NULL, 0);
	CHECK(cq);
	struct svt_qpopt o = {IBV_QPT_RC, cq, cq, NULL, 0, 16, 16, 1, 0};
	struct ibv_qp *qp = svt_qp(&d, &o);
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_RELAXED_ORDERING;
	CHECK_EQ(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
					       IBV_QP_ACCESS_FLAGS),
		 0);
	struct ibv_qp_attr r;
	struct ibv_qp_init_attr ia;
	CHECK_EQ(ibv_query_qp(qp, &r, IBV_QP_ACCESS_FLAGS, &ia), 0);
	CHECK(r.qp_access_flags & IBV_ACCESS_REMOTE_WRITE);
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = qp->qp_num;
	a.rq_psn = 0xdeadbeef;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 1;
	a.ah_attr.dlid = d.lid;
	int mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
		   IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
	a.ah_attr.port_num = 0;
	CHECK_EQ(ibv_modify_qp(qp, &a, mask), EINVAL);
	a.ah_attr.port_num = 2; /* Not a port of a one-port device, nor the QP's */
	CHECK_EQ(ibv_modify_qp(qp, &a, mask), EINVAL);
	a.ah_attr.port_num = 1;
	a.alt_port_num = 0;
	a.alt_ah_attr.port_num = 0;
	CHECK_EQ(ibv_modify_qp(qp, &a, mask | IBV_QP_ALT_PATH), EINVAL);
	a.alt_port_num = 1;
	a.alt_ah_attr.port_num = 0;
	CHECK_EQ(ibv_modify_qp(qp, &a, mask | IBV_QP_ALT_PATH), EINVAL);
	CHECK_EQ(svt_state(qp), IBV_QPS_INIT); /* Refused: nothing changed */
	CHECK_EQ(ibv_modify_qp(qp, &a, mask), 0);
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 0x1abcdef;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = 1;
	CHECK_EQ(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT |
					       IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
					       IBV_QP_MAX_QP_RD_ATOMIC),
		 0);
	CHECK_EQ(ibv_query_qp(qp, &r, IBV_QP_RQ_PSN | IBV_QP_SQ_PSN | IBV_QP_AV, &ia), 0);
	CHECK_EQ(r.rq_psn, 0xadbeef);
	CHECK_EQ(r.sq_psn, 0xabcdef);
	CHECK_EQ(r.ah_attr.port_num, 1);
	/* The QP works: a WRITE to itself, data checked. */
	struct ibv_mr *mr = svt_mr(&d, 4096, SVT_ALL_ACCESS);
	svt_fill(mr->addr, 64, 5);
	memset((char *)mr->addr + 1024, 0, 64);
	struct ibv_sge ss = svt_sge(mr, 0, 64);
	CHECK(svt_post_send1(qp, 1, IBV_WR_RDMA_WRITE, &ss, 1, IBV_SEND_SIGNALED,
			     (uintptr_t)mr->addr + 1024, mr->rkey) == 0);
	CHECK_WC(svt_wait(cq, "WRITE"), IBV_WC_SUCCESS);
	CHECK(memcmp(mr->addr, (char *)mr->addr + 1024, 64) == 0);
}

/* ---- Posting errors ------------------------------------------------------ */
static void sc_post_errors(void)
{
	struct pair p;
	pair_open(&p);
	struct svt_qpopt o = {IBV_QPT_RC, p.acq, p.acq, NULL, 1, 16, 16, 2, 32};
	p.qa = svt_qp(&p.a, &o);
	o.scq = o.rcq = p.bcq;
	p.qb = svt_qp(&p.b, &o);
	struct ibv_mr *ma = svt_mr(&p.a, 4096, SVT_ALL_ACCESS);
	struct ibv_mr *mb = svt_mr(&p.b, 4096, SVT_ALL_ACCESS);
	struct ibv_sge ss = svt_sge(ma, 0, 8);
	struct ibv_send_wr wr[3], *bad;
	struct ibv_wc wc;
	memset(wr, 0, sizeof(wr));
	for (int i = 0; i < 3; i++) {
		wr[i].wr_id = i;
		wr[i].opcode = IBV_WR_RDMA_WRITE;
		wr[i].sg_list = &ss;
		wr[i].num_sge = 1;
		wr[i].wr.rdma.remote_addr = (uintptr_t)mb->addr + 8 * i;
		wr[i].wr.rdma.rkey = mb->rkey;
		wr[i].next = i < 2 ? &wr[i + 1] : NULL;
	}
	/* Wrong state: RESET, INIT and RTR refuse sends with EINVAL, bad_wr = first */
	for (int st = 0; st < 3; st++) {
		if (st == 1) {
			struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1,
						.qp_access_flags = SVT_ALL_ACCESS};
			CHECK(ibv_modify_qp(p.qa, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
							      IBV_QP_ACCESS_FLAGS) == 0);
		}
		if (st == 2) {
			struct ibv_qp_attr a;
			memset(&a, 0, sizeof(a));
			a.qp_state = IBV_QPS_RTR;
			a.path_mtu = IBV_MTU_1024;
			a.dest_qp_num = p.qb->qp_num;
			a.max_dest_rd_atomic = 1;
			a.min_rnr_timer = 1;
			a.ah_attr.dlid = p.b.lid;
			a.ah_attr.port_num = 1;
			CHECK(ibv_modify_qp(p.qa, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
							      IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
							      IBV_QP_MAX_DEST_RD_ATOMIC |
							      IBV_QP_MIN_RNR_TIMER) == 0);
		}
		bad = NULL;
		int r = ibv_post_send(p.qa, wr, &bad);
		if (r != EINVAL)
			FAIL("post_send in state %d returned %d, expected EINVAL", st, r);
		CHECK(bad == &wr[0]);
	}
	svt_expect_empty(p.acq, NOTHING_MS, "nothing posted in wrong states");
	{
		struct ibv_qp_attr a;
		memset(&a, 0, sizeof(a));
		a.qp_state = IBV_QPS_RTS;
		a.timeout = 14;
		a.retry_cnt = 2;
		a.rnr_retry = 7;
		a.max_rd_atomic = 1;
		CHECK(ibv_modify_qp(p.qa, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT |
						      IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
						      IBV_QP_MAX_QP_RD_ATOMIC) == 0);
		struct svt_conn c = {SVT_ALL_ACCESS, 1, 14, 2, 7};
		svt_connect(p.qb, p.qa->qp_num, p.a.lid, &c);
	}
	/* The bad WR in the middle; the first one runs, the third does not */
	for (int kind = 0; kind < 4; kind++) {
		memset(mb->addr, 0, 64);
		svt_fill(ma->addr, 8, 3);
		struct ibv_send_wr w[3];
		memcpy(w, wr, sizeof(w));
		w[0].next = &w[1];
		w[1].next = &w[2];
		struct ibv_sge three[3] = {ss, ss, ss};
		char big[1024];
		struct ibv_qp_attr qa_;
		struct ibv_qp_init_attr qia_;
		CHECK(ibv_query_qp(p.qa, &qa_, IBV_QP_CAP, &qia_) == 0);
		CHECK(qia_.cap.max_inline_data < sizeof(big));
		struct ibv_sge bigs = {(uintptr_t)big, qia_.cap.max_inline_data + 1, 0};
		for (int i = 0; i < 3; i++)
			w[i].send_flags = IBV_SEND_SIGNALED;
		const char *what = "";
		switch (kind) {
		case 0: w[1].sg_list = three; w[1].num_sge = 3; what = "too many SGEs"; break;
		case 1: w[1].opcode = (enum ibv_wr_opcode)77; what = "unknown opcode"; break;
		case 2: w[1].opcode = IBV_WR_BIND_MW + 100; what = "bogus opcode"; break;
		case 3: w[1].sg_list = &bigs; w[1].send_flags |= IBV_SEND_INLINE; what = "inline too long"; break;
		}
		bad = NULL;
		int r = ibv_post_send(p.qa, w, &bad);
		if (r == 0)
			FAIL("%s: post_send succeeded", what);
		if (bad != &w[1])
			FAIL("%s: bad_wr %p, expected the second WR %p", what, (void *)bad,
			     (void *)&w[1]);
		wc = svt_wait(p.acq, what);
		CHECK_WC(wc, IBV_WC_SUCCESS);
		CHECK_EQ(wc.wr_id, 0);
		svt_expect_empty(p.acq, NOTHING_MS, "nothing after the bad WR");
		CHECK(memcmp(mb->addr, ma->addr, 8) == 0);
		static const char zero[16];
		CHECK(memcmp((char *)mb->addr + 8, zero, 16) == 0);
		CHECK_EQ(svt_state(p.qa), IBV_QPS_RTS);
	}
	/* Inline exactly max_inline_data works */
	{
		struct ibv_qp_attr a;
		struct ibv_qp_init_attr ia;
		CHECK(ibv_query_qp(p.qa, &a, IBV_QP_CAP, &ia) == 0);
		CHECK(ia.cap.max_inline_data >= 32);
		char buf[512];
		svt_fill(buf, sizeof(buf), 8);
		struct ibv_sge s = {(uintptr_t)buf, ia.cap.max_inline_data, 0};
		CHECK(svt_post_send1(p.qa, 40, IBV_WR_RDMA_WRITE, &s, 1,
				     IBV_SEND_SIGNALED | IBV_SEND_INLINE, (uintptr_t)mb->addr,
				     mb->rkey) == 0);
		CHECK_WC(svt_wait(p.acq, "max inline"), IBV_WC_SUCCESS);
		CHECK(memcmp(mb->addr, buf, ia.cap.max_inline_data) == 0);
		s.length = ia.cap.max_inline_data + 1;
		CHECK(svt_post_send1(p.qa, 41, IBV_WR_RDMA_WRITE, &s, 1,
				     IBV_SEND_SIGNALED | IBV_SEND_INLINE, (uintptr_t)mb->addr,
				     mb->rkey) != 0);
		svt_expect_empty(p.acq, NOTHING_MS, "inline too long");
	}
	/* Receive side: too many SGEs, bad_wr at the first rejected */
	{
		struct ibv_sge three[3] = {ss, ss, ss};
		struct ibv_recv_wr rw[3], *rbad = NULL;
		memset(rw, 0, sizeof(rw));
		for (int i = 0; i < 3; i++) {
			rw[i].wr_id = 60 + i;
			rw[i].sg_list = three;
			rw[i].num_sge = i == 1 ? 3 : 1;
			rw[i].next = i < 2 ? &rw[i + 1] : NULL;
		}
		CHECK(ibv_post_recv(p.qa, rw, &rbad) != 0);
		CHECK(rbad == &rw[1]);
		/* Exactly one receive was posted: two sends, the second waits on RNR */
		struct ibv_sge bs = svt_sge(mb, 0, 8);
		CHECK(svt_post_send1(p.qb, 1, IBV_WR_SEND, &bs, 1, IBV_SEND_SIGNALED, 0, 0) == 0);
		wc = svt_wait(p.acq, "recv 60");
		CHECK_EQ(wc.wr_id, 60);
		CHECK_WC(wc, IBV_WC_SUCCESS);
		CHECK_WC(svt_wait(p.bcq, "send"), IBV_WC_SUCCESS);
	}
	/* UD: RDMA WRITE and READ are rejected; UD without an AH is rejected */
	{
		struct svt_qpopt u = {IBV_QPT_UD, p.acq, p.acq, NULL, 1, 16, 16, 1, 0};
		struct ibv_qp *ud = svt_qp(&p.a, &u);
		svt_ud_up(ud, 1);
		struct ibv_ah_attr aa = {.dlid = p.a.lid, .port_num = 1};
		struct ibv_ah *ah = ibv_create_ah(p.a.pd, &aa);
		CHECK(ah);
		enum ibv_wr_opcode bad_ops[] = {IBV_WR_RDMA_WRITE, IBV_WR_RDMA_READ,
						IBV_WR_ATOMIC_FETCH_AND_ADD};
		for (int i = 0; i < 3; i++) {
			struct ibv_send_wr w = {0};
			w.wr_id = 70 + i;
			w.opcode = bad_ops[i];
			w.sg_list = &ss;
			w.num_sge = 1;
			w.wr.ud.ah = ah;
			w.wr.ud.remote_qpn = ud->qp_num;
			w.wr.ud.remote_qkey = 1;
			bad = NULL;
			CHECK(ibv_post_send(ud, &w, &bad) != 0);
			CHECK(bad == &w);
		}
		svt_expect_empty(p.acq, NOTHING_MS, "UD rejected ops");
	}
}

/* ---- query_qp / modify_qp masks ----------------------------------------- */
static void sc_query_modify(void)
{
	struct pair p;
	pair_open(&p);
	/* Send and receive CQs apart, both of qa's context (a CQ of another
	 * context is EINVAL, as with the kernel's handles). */
	struct ibv_cq *arcq = ibv_create_cq(p.a.ctx, 64, NULL, NULL, 0);
	CHECK(arcq);
	struct svt_qpopt o = {IBV_QPT_RC, p.acq, arcq, NULL, 0, 20, 30, 3, 48};
	p.qa = svt_qp(&p.a, &o);
	o.scq = o.rcq = p.bcq;
	p.qb = svt_qp(&p.b, &o);
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr ia;
	CHECK(ibv_query_qp(p.qa, &a, IBV_QP_STATE | IBV_QP_CAP, &ia) == 0);
	CHECK_EQ(a.qp_state, IBV_QPS_RESET);
	CHECK(ia.cap.max_send_wr >= 20 && ia.cap.max_recv_wr >= 30);
	CHECK(ia.cap.max_send_sge >= 3 && ia.cap.max_recv_sge >= 3);
	CHECK(ia.cap.max_inline_data >= 48);
	CHECK(ia.send_cq == p.acq && ia.recv_cq == arcq);
	CHECK_EQ(ia.qp_type, IBV_QPT_RC);

	/* RESET->INIT without PORT: EINVAL, state unchanged */
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	a.pkey_index = 0;
	CHECK_EQ(ibv_modify_qp(p.qa, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_ACCESS_FLAGS),
		 EINVAL);
	CHECK_EQ(svt_state(p.qa), IBV_QPS_RESET);
	/* ... with an attribute not allowed on that transition: EINVAL */
	a.dest_qp_num = 5;
	CHECK_EQ(ibv_modify_qp(p.qa, &a,
			       IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
				       IBV_QP_ACCESS_FLAGS | IBV_QP_DEST_QPN),
		 EINVAL);
	/* RESET->RTR skips a state: EINVAL */
	a.qp_state = IBV_QPS_RTR;
	CHECK_EQ(ibv_modify_qp(p.qa, &a, IBV_QP_STATE), EINVAL);
	CHECK_EQ(svt_state(p.qa), IBV_QPS_RESET);
	a.qp_state = IBV_QPS_INIT;
	CHECK(ibv_modify_qp(p.qa, &a,
			    IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) ==
	      0);
	/* INIT->RTR missing DEST_QPN: EINVAL */
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_2048;
	a.dest_qp_num = p.qb->qp_num;
	a.rq_psn = 0x123456;
	a.max_dest_rd_atomic = 3;
	a.min_rnr_timer = 12;
	a.ah_attr.dlid = p.b.lid;
	a.ah_attr.sl = 2;
	a.ah_attr.port_num = 1;
	int rtr = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
		  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
	CHECK_EQ(ibv_modify_qp(p.qa, &a, rtr & ~IBV_QP_DEST_QPN), EINVAL);
	CHECK_EQ(svt_state(p.qa), IBV_QPS_INIT);
	CHECK(ibv_modify_qp(p.qa, &a, rtr) == 0);
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 0x654321;
	a.timeout = 17;
	a.retry_cnt = 5;
	a.rnr_retry = 3;
	a.max_rd_atomic = 2;
	int rts = IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
		  IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
	CHECK_EQ(ibv_modify_qp(p.qa, &a, rts & ~IBV_QP_SQ_PSN), EINVAL);
	CHECK(ibv_modify_qp(p.qa, &a, rts) == 0);

	memset(&a, 0, sizeof(a));
	CHECK(ibv_query_qp(p.qa, &a, IBV_QP_STATE | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
					    IBV_QP_RQ_PSN | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT |
					    IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
					    IBV_QP_MIN_RNR_TIMER | IBV_QP_ACCESS_FLAGS |
					    IBV_QP_AV | IBV_QP_PORT | IBV_QP_MAX_QP_RD_ATOMIC |
					    IBV_QP_MAX_DEST_RD_ATOMIC,
			    &ia) == 0);
	CHECK_EQ(a.qp_state, IBV_QPS_RTS);
	CHECK_EQ(a.path_mtu, IBV_MTU_2048);
	CHECK_EQ(a.dest_qp_num, p.qb->qp_num);
	CHECK_EQ(a.rq_psn, 0x123456);
	CHECK_EQ(a.sq_psn, 0x654321);
	CHECK_EQ(a.timeout, 17);
	CHECK_EQ(a.retry_cnt, 5);
	CHECK_EQ(a.rnr_retry, 3);
	CHECK_EQ(a.min_rnr_timer, 12);
	CHECK_EQ(a.qp_access_flags, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
	CHECK_EQ(a.ah_attr.dlid, p.b.lid);
	CHECK_EQ(a.ah_attr.sl, 2);
	CHECK_EQ(a.port_num, 1);
	CHECK_EQ(a.max_rd_atomic, 2);
	CHECK_EQ(a.max_dest_rd_atomic, 3);
	/* RTS->RTS with an attribute not modifiable there (PATH_MTU... allowed?) use DEST_QPN */
	a.dest_qp_num = 1;
	CHECK_EQ(ibv_modify_qp(p.qa, &a, IBV_QP_STATE | IBV_QP_DEST_QPN), EINVAL);
	/* RTS->RTS: TIMEOUT is not modifiable there, MIN_RNR_TIMER is */
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 9;
	CHECK_EQ(ibv_modify_qp(p.qa, &a, IBV_QP_STATE | IBV_QP_TIMEOUT), EINVAL);
	a.min_rnr_timer = 9;
	CHECK(ibv_modify_qp(p.qa, &a, IBV_QP_STATE | IBV_QP_MIN_RNR_TIMER) == 0);
	CHECK(ibv_query_qp(p.qa, &a, IBV_QP_TIMEOUT | IBV_QP_DEST_QPN | IBV_QP_MIN_RNR_TIMER, &ia) == 0);
	CHECK_EQ(a.timeout, 17);
	CHECK_EQ(a.min_rnr_timer, 9);
	CHECK_EQ(a.dest_qp_num, p.qb->qp_num);
	/* Mask bits past IBV_QP_DEST_QPN: EOPNOTSUPP, as rdma-core's
	 * ibv_cmd_modify_qp and the kernel's legacy modify_qp answer (rxe);
	 * nothing changed */
	CHECK_EQ(ibv_modify_qp(p.qa, &a, IBV_QP_STATE | (1 << 30)), EOPNOTSUPP);
	CHECK_EQ(ibv_modify_qp(p.qa, &a, IBV_QP_STATE | (1 << 21)), EOPNOTSUPP);
	CHECK_EQ(ibv_modify_qp(p.qa, &a, IBV_QP_STATE | IBV_QP_RATE_LIMIT), EOPNOTSUPP);
	CHECK_EQ(svt_state(p.qa), IBV_QPS_RTS);
	/* Any state -> ERR -> RESET */
	a.qp_state = IBV_QPS_ERR;
	CHECK(ibv_modify_qp(p.qa, &a, IBV_QP_STATE) == 0);
	CHECK_EQ(svt_state(p.qa), IBV_QPS_ERR);
	a.qp_state = IBV_QPS_RESET;
	CHECK(ibv_modify_qp(p.qa, &a, IBV_QP_STATE) == 0);
	CHECK_EQ(svt_state(p.qa), IBV_QPS_RESET);
	/* UD QKEY round trip */
	struct svt_qpopt u = {IBV_QPT_UD, p.acq, p.acq, NULL, 0, 4, 4, 1, 0};
	struct ibv_qp *ud = svt_qp(&p.a, &u);
	svt_ud_up(ud, 0x7abc);
	CHECK(ibv_query_qp(ud, &a, IBV_QP_QKEY | IBV_QP_STATE, &ia) == 0);
	CHECK_EQ(a.qkey, 0x7abc);
	CHECK_EQ(a.qp_state, IBV_QPS_RTS);
	CHECK_EQ(ia.qp_type, IBV_QPT_UD);
}

/* ---- Threads: each thread owns a pair of QPs and CQs --------------------- */
struct thr {
	struct svt_dev *da, *db;
	int idx;
	int iters;
	int fail;
};

static void *thr_main(void *arg)
{
	struct thr *t = arg;
	struct pair p;
	p.a = *t->da;
	p.b = *t->db;
	p.acq = ibv_create_cq(p.a.ctx, 64, NULL, NULL, 0);
	p.bcq = ibv_create_cq(p.b.ctx, 64, NULL, NULL, 0);
	CHECK(p.acq && p.bcq);
	pair_connect(&p, IBV_QPT_RC, SVT_ALL_ACCESS, SVT_ALL_ACCESS, 1, 7, 0, 0);
	const size_t N = 32768;
	struct ibv_mr *ma = svt_mr(&p.a, N, SVT_ALL_ACCESS);
	struct ibv_mr *mb = svt_mr(&p.b, N, SVT_ALL_ACCESS);
	char *A = ma->addr, *B = mb->addr;
	uint64_t *ctr = (uint64_t *)(B + N - 8);
	for (int it = 0; it < t->iters; it++) {
		unsigned seed = t->idx * 100000 + it;
		size_t len = 1 + (seed * 2654435761u) % 16000;
		svt_fill(A, len, seed);
		struct ibv_sge rs = svt_sge(mb, 0, 16384);
		svt_post_recv1(p.qb, it, &rs, 1);
		struct ibv_sge ss = svt_sge(ma, 0, (uint32_t)len);
		CHECK(svt_post_send1(p.qa, it, IBV_WR_SEND, &ss, 1, IBV_SEND_SIGNALED, 0, 0) == 0);
		struct ibv_wc wc = svt_wait(p.acq, "thr send");
		CHECK_WC(wc, IBV_WC_SUCCESS);
		CHECK_EQ(wc.wr_id, it);
		wc = svt_wait(p.bcq, "thr recv");
		CHECK_WC(wc, IBV_WC_SUCCESS);
		CHECK_EQ(wc.byte_len, len);
		CHECK_EQ(wc.qp_num, p.qb->qp_num);
		if (memcmp(A, B, len))
			FAIL("thread %d iter %d: data differs", t->idx, it);
		/* RDMA write + read back through another region */
		struct ibv_sge ws = svt_sge(ma, 0, (uint32_t)len);
		CHECK(svt_post_send1(p.qa, 1000000 + it, IBV_WR_RDMA_WRITE, &ws, 1, 0,
				     (uintptr_t)B + 16384, mb->rkey) == 0);
		struct ibv_sge rd = svt_sge(ma, 16384, (uint32_t)len);
		CHECK(svt_post_send1(p.qa, 2000000 + it, IBV_WR_RDMA_READ, &rd, 1,
				     IBV_SEND_SIGNALED, (uintptr_t)B + 16384, mb->rkey) == 0);
		wc = svt_wait(p.acq, "thr read");
		CHECK_WC(wc, IBV_WC_SUCCESS);
		CHECK_EQ(wc.wr_id, 2000000 + it);
		if (memcmp(A, A + 16384, len))
			FAIL("thread %d iter %d: read back differs", t->idx, it);
		struct ibv_send_wr aw = {0}, *bad;
		struct ibv_sge as = svt_sge(ma, N - 8, 8);
		aw.wr_id = 3000000 + it;
		aw.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
		aw.sg_list = &as;
		aw.num_sge = 1;
		aw.send_flags = IBV_SEND_SIGNALED;
		aw.wr.atomic.remote_addr = (uintptr_t)ctr;
		aw.wr.atomic.rkey = mb->rkey;
		aw.wr.atomic.compare_add = 1;
		CHECK(ibv_post_send(p.qa, &aw, &bad) == 0);
		wc = svt_wait(p.acq, "thr faa");
		CHECK_WC(wc, IBV_WC_SUCCESS);
		CHECK_EQ(*(uint64_t *)(A + N - 8), it);
	}
	CHECK_EQ(*ctr, t->iters);
	return NULL;
}

/* All threads also hammer one shared counter with atomics over their own QPs */
static uint64_t *g_shared_ctr;
static uint32_t g_shared_rkey;
static struct svt_dev *g_shared_dev;

struct athr {
	struct svt_dev *d;
	int n;
};

static void *athr_main(void *arg)
{
	struct athr *t = arg;
	struct pair p;
	p.a = *t->d;
	p.b = *g_shared_dev;
	p.acq = ibv_create_cq(p.a.ctx, 64, NULL, NULL, 0);
	p.bcq = ibv_create_cq(p.b.ctx, 64, NULL, NULL, 0);
	pair_connect(&p, IBV_QPT_RC, SVT_ALL_ACCESS, SVT_ALL_ACCESS, 1, 7, 1, 0);
	struct ibv_mr *ma = svt_mr(&p.a, 4096, SVT_ALL_ACCESS);
	for (int i = 0; i < t->n; i++) {
		struct ibv_send_wr aw = {0}, *bad;
		struct ibv_sge as = svt_sge(ma, 0, 8);
		aw.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
		aw.sg_list = &as;
		aw.num_sge = 1;
		aw.wr.atomic.remote_addr = (uintptr_t)g_shared_ctr;
		aw.wr.atomic.rkey = g_shared_rkey;
		aw.wr.atomic.compare_add = 1;
		CHECK(ibv_post_send(p.qa, &aw, &bad) == 0);
		CHECK_WC(svt_wait(p.acq, "shared faa"), IBV_WC_SUCCESS);
	}
	return NULL;
}

static void sc_threads(void)
{
	enum { NT = 4 };
	struct svt_dev da, db;
	svt_open(&da, dev_a);
	svt_open(&db, dev_b);
	pthread_t th[NT];
	struct thr t[NT];
	for (int i = 0; i < NT; i++) {
		t[i] = (struct thr){&da, &db, i, 300, 0};
		CHECK(pthread_create(&th[i], NULL, thr_main, &t[i]) == 0);
	}
	for (int i = 0; i < NT; i++)
		CHECK(pthread_join(th[i], NULL) == 0);
	struct ibv_mr *shared = svt_mr(&db, 4096, SVT_ALL_ACCESS);
	g_shared_ctr = shared->addr;
	g_shared_rkey = shared->rkey;
	g_shared_dev = &db;
	struct athr at[NT];
	for (int i = 0; i < NT; i++) {
		at[i] = (struct athr){&da, 500};
		CHECK(pthread_create(&th[i], NULL, athr_main, &at[i]) == 0);
	}
	for (int i = 0; i < NT; i++)
		CHECK(pthread_join(th[i], NULL) == 0);
	CHECK_EQ(*g_shared_ctr, NT * 500);
}

/* The GRH area of a UD receive from a to b: on an InfiniBand port the GRH
 * (next header the BTH); on a RoCE v2 port the datagram's IP header, as rxe
 * and mlx5 give it: IPv4 in the last 20 bytes (the first 20 zero, the
 * checksum valid) when both GIDs are IPv4-mapped, else IPv6 with next header
 * UDP.  With parse, ibv_init_ah_from_wc reads it back to an address of a,
 * answered from the GID index that received it (0 here); it queries the GID
 * table, which on an Ethernet port is read anew through netlink (a query,
 * not the data path: ud_grh_burst parses only its first datagram). */
static void check_grh(struct pair *p, const unsigned char *B, struct ibv_wc *wc, uint8_t hop,
		      int roce, int parse)
{
	static const unsigned char mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
	const struct ibv_grh *h = (const struct ibv_grh *)B;
	if (roce && !memcmp(p->a.gid.raw, mapped, 12) && !memcmp(p->b.gid.raw, mapped, 12)) {
		static const unsigned char zero[20];
		const unsigned char *ip = B + 20;
		CHECK(memcmp(B, zero, 20) == 0);
		CHECK(ip[0] == 0x45 && ip[9] == 17 && ip[8] == hop);
		CHECK(memcmp(ip + 12, p->a.gid.raw + 12, 4) == 0);
		CHECK(memcmp(ip + 16, p->b.gid.raw + 12, 4) == 0);
		uint32_t sum = 0;
		for (int i = 0; i < 20; i += 2)
			sum += (uint32_t)(ip[i] << 8 | ip[i + 1]);
		while (sum >> 16)
			sum = (sum & 0xffff) + (sum >> 16);
		CHECK(sum == 0xffff); /* The header's checksum holds */
		CHECK(((ip[2] << 8) | ip[3]) == 20 + 8 + 12 + 8 + ((wc->byte_len - 40 + 3) & ~3u) + 4);
	} else {
		CHECK(memcmp(&h->sgid, &p->a.gid, 16) == 0);
		CHECK(memcmp(&h->dgid, &p->b.gid, 16) == 0);
		CHECK(h->next_hdr == (roce ? 17 : 0x1b));
		CHECK(h->hop_limit == hop);
	}
	if (!parse)
		return;
	struct ibv_ah_attr back;
	CHECK(ibv_init_ah_from_wc(p->b.ctx, 1, wc, (struct ibv_grh *)B, &back) == 0);
	if (!back.is_global || memcmp(&back.grh.dgid, &p->a.gid, 16) || back.grh.sgid_index != 0 ||
	    back.grh.hop_limit != hop)
		FAIL("ibv_init_ah_from_wc: global %d, sgid_index %u, hop %u, dgid not the sender's "
		     "(%d)",
		     back.is_global, back.grh.sgid_index, back.grh.hop_limit,
		     memcmp(&back.grh.dgid, &p->a.gid, 16) != 0);
}

/* ---- UD with a GRH, many in a row (test_traffic_progs 'ud_grh_burst') ------
 * 500 datagrams with a GRH, each checked byte for byte with its GRH (the
 * port's GID 0 its source; check_grh).  On an Ethernet port the source GID
 * comes from the netdev's addresses: read once per datagram through netlink,
 * it cost 150-300 us each; the test counts the netlink sockets under strace. */
static void sc_ud_grh_burst(void)
{
	struct pair p;
	pair_open(&p);
	struct svt_qpopt o = {IBV_QPT_UD, p.acq, p.acq, NULL, 0, 64, 64, 2, 0};
	p.qa = svt_qp(&p.a, &o);
	o.scq = o.rcq = p.bcq;
	p.qb = svt_qp(&p.b, &o);
	const uint32_t QK = 0x2222;
	svt_ud_up(p.qa, QK);
	svt_ud_up(p.qb, QK);
	struct ibv_mr *ma = svt_mr(&p.a, 4096, SVT_ALL_ACCESS);
	struct ibv_mr *mb = svt_mr(&p.b, 4096, SVT_ALL_ACCESS);
	unsigned char *A = ma->addr, *B = mb->addr;
	struct ibv_ah_attr aa;
	memset(&aa, 0, sizeof(aa));
	aa.dlid = p.b.lid;
	aa.port_num = 1;
	aa.is_global = 1;
	aa.grh.dgid = p.b.gid;
	aa.grh.sgid_index = 0;
	aa.grh.hop_limit = 64;
	struct ibv_ah *ah = ibv_create_ah(p.a.pd, &aa);
	CHECK(ah);
	struct ibv_port_attr pa;
	CHECK(ibv_query_port(p.b.ctx, 1, &pa) == 0);
	int roce = pa.link_layer == IBV_LINK_LAYER_ETHERNET;
	for (int i = 0; i < 500; i++) {
		svt_fill(A, 100, (unsigned)i);
		memset(B, 0xcc, 4096);
		struct ibv_sge rs = svt_sge(mb, 0, 40 + 1024);
		svt_post_recv1(p.qb, 1000 + i, &rs, 1);
		struct ibv_sge ss = svt_sge(ma, 0, 100);
		struct ibv_send_wr wr = {0}, *bad;
		wr.wr_id = i;
		wr.sg_list = &ss;
		wr.num_sge = 1;
		wr.opcode = IBV_WR_SEND;
		wr.send_flags = IBV_SEND_SIGNALED;
		wr.wr.ud.ah = ah;
		wr.wr.ud.remote_qpn = p.qb->qp_num;
		wr.wr.ud.remote_qkey = QK;
		CHECK(ibv_post_send(p.qa, &wr, &bad) == 0);
		struct ibv_wc wc = svt_wait(p.acq, "ud send");
		CHECK_WC(wc, IBV_WC_SUCCESS);
		CHECK_EQ(wc.wr_id, i);
		wc = svt_wait(p.bcq, "ud recv");
		CHECK_WC(wc, IBV_WC_SUCCESS);
		CHECK_EQ(wc.wr_id, 1000 + i);
		CHECK_EQ(wc.byte_len, 100 + 40);
		CHECK(wc.wc_flags & IBV_WC_GRH);
		check_grh(&p, B, &wc, 64, roce, i == 0);
		CHECK(memcmp(B + 40, A, 100) == 0);
		CHECK(B[140] == 0xcc);
	}
	printf("ud_grh_burst: 500 datagrams checked\n");
}

/* ---- Registration inputs the kernel refuses (test_traffic_progs 'mr_inputs')
 * Found by a helper's probe, each was taken:
 *   - an IOVA whose offset in its page is not the address's (the kernel's
 *     ib_uverbs_reg_mr), and one whose range wraps past 2^64: EINVAL;
 *   - ibv_rereg_mr with no flags: IBV_REREG_MR_ERR_CMD, errno EINVAL (the
 *     kernel's ib_uverbs_rereg_mr);
 *   - rereg that drops IBV_ACCESS_ON_DEMAND pins as a registration would:
 *     a range with a hole is EFAULT, an implicit MR EINVAL (it became a
 *     plain MR of the whole address space, and a copy into a hole faulted in
 *     its own process). */
static void sc_mr_inputs(void)
{
	struct svt_dev d;
	svt_open(&d, "loop0");
	long page = sysconf(_SC_PAGESIZE);
	char *buf = mmap(NULL, 4 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(buf != MAP_FAILED);
	errno = 0;
	CHECK(!ibv_reg_mr_iova(d.pd, buf + 16, page, 0x100000, IBV_ACCESS_LOCAL_WRITE) &&
	      errno == EINVAL);
	errno = 0;
	CHECK(!ibv_reg_mr_iova(d.pd, buf, 4 * page, UINT64_MAX - 2 * page + 1,
			       IBV_ACCESS_LOCAL_WRITE) &&
	      errno == EINVAL);
	struct ibv_mr *mr = ibv_reg_mr_iova(d.pd, buf + 16, page, 0x100010, IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr);
	errno = 0;
	CHECK(ibv_rereg_mr(mr, 0, NULL, NULL, 0, 0) == IBV_REREG_MR_ERR_CMD && errno == EINVAL);
	CHECK_EQ(ibv_dereg_mr(mr), 0);
	/* On demand over a hole, then pinned by rereg: refused. */
	CHECK(munmap(buf + page, page) == 0);
	struct ibv_mr *odp = ibv_reg_mr(d.pd, buf, 3 * page,
					IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND);
	CHECK(odp);
	errno = 0;
	CHECK(ibv_rereg_mr(odp, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0,
			   IBV_ACCESS_LOCAL_WRITE) == IBV_REREG_MR_ERR_CMD &&
	      errno == EFAULT);
	CHECK_EQ(ibv_dereg_mr(odp), 0);
	struct ibv_mr *imp = ibv_reg_mr(d.pd, NULL, SIZE_MAX,
					IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND);
	CHECK(imp);
	errno = 0;
	CHECK(ibv_rereg_mr(imp, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0,
			   IBV_ACCESS_LOCAL_WRITE) == IBV_REREG_MR_ERR_CMD &&
	      errno == EINVAL);
	CHECK_EQ(ibv_dereg_mr(imp), 0);
	/* Mapped again, the same rereg of a range without a hole works. */
	CHECK(mmap(buf + page, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED,
		   -1, 0) == buf + page);
	odp = ibv_reg_mr(d.pd, buf, 3 * page, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND);
	CHECK(odp);
	CHECK_EQ(ibv_rereg_mr(odp, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0,
			      IBV_ACCESS_LOCAL_WRITE),
		 0);
	CHECK_EQ(ibv_dereg_mr(odp), 0);
	munmap(buf, 4 * page);
}

/* An alternate path at INIT -> RTR: accepted on an InfiniBand port, EINVAL
 * on an Ethernet one, where the kernel bans it ("ban them in roce mode",
 * _ib_modify_qp: RoCE has no path migration), the QP left in INIT. */
static void sc_alt_path(void)
{
	struct svt_dev d;
	svt_open(&d, dev_a);
	struct ibv_port_attr pa;
	CHECK_EQ(ibv_query_port(d.ctx, 1, &pa), 0);
	int eth = pa.link_layer == IBV_LINK_LAYER_ETHERNET;
	struct ibv_cq *cq = ibv_create_cq(d.ctx, 16, NULL, NULL, 0);
	CHECK(cq);
	struct svt_qpopt o = {IBV_QPT_RC, cq, cq, NULL, 0, 16, 16, 1, 0};
	struct ibv_qp *qp = svt_qp(&d, &o);
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	CHECK_EQ(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
					       IBV_QP_ACCESS_FLAGS),
		 0);
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = qp->qp_num;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 1;
	a.ah_attr.dlid = d.lid;
	a.ah_attr.port_num = 1;
	if (eth) {
		a.ah_attr.is_global = 1;
		a.ah_attr.grh.dgid = d.gid;
		a.ah_attr.grh.hop_limit = 64;
	}
	a.alt_ah_attr = a.ah_attr;
	a.alt_port_num = 1;
	a.alt_timeout = 14;
	int mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
		   IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
	CHECK_EQ(ibv_modify_qp(qp, &a, mask | IBV_QP_ALT_PATH), eth ? EINVAL : 0);
	CHECK_EQ(svt_state(qp), eth ? IBV_QPS_INIT : IBV_QPS_RTR);
	if (eth)
		CHECK_EQ(ibv_modify_qp(qp, &a, mask), 0);
	CHECK_EQ(ibv_destroy_qp(qp), 0);
	CHECK_EQ(ibv_destroy_cq(cq), 0);
	printf("alt path on %s: %s\n", eth ? "Ethernet" : "InfiniBand", eth ? "refused" : "taken");
}

static const struct {
	const char *name;
	void (*fn)(void);
} scenarios[] = {
	{"rc_ops", sc_rc_ops},	       {"inline_sge", sc_inline_sge},
	{"signaling", sc_signaling},   {"solicited", sc_solicited},
	{"uc", sc_uc},		       {"ud", sc_ud},
	{"mcast", sc_mcast},	       {"mcast_self", sc_mcast_self},	       {"emfile", sc_emfile},	       {"srq", sc_srq},
	{"cq_overflow", sc_cq_overflow}, {"errors", sc_errors},
	{"rnr", sc_rnr},	       {"post_errors", sc_post_errors},
	{"query_modify", sc_query_modify}, {"threads", sc_threads},
	{"ud_grh_burst", sc_ud_grh_burst}, {"mr_inputs", sc_mr_inputs},
	{"retry", sc_retry},	       {"modify_values", sc_modify_values},
	{"alt_path", sc_alt_path},
};

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IONBF, 0);
	if (argc < 2) {
		fprintf(stderr, "usage: %s SCENARIO [DEV_A [DEV_B]]\n", argv[0]);
		for (unsigned i = 0; i < sizeof(scenarios) / sizeof(scenarios[0]); i++)
			fprintf(stderr, "  %s\n", scenarios[i].name);
		return 2;
	}
	if (argc > 2)
		dev_a = dev_b = argv[2];
	if (argc > 3)
		dev_b = argv[3];
	/* Each "nothing arrived" check waits NOTHING_MS: rnr has ten of them. */
	svt_watchdog(120);
	for (unsigned i = 0; i < sizeof(scenarios) / sizeof(scenarios[0]); i++)
		if (!strcmp(argv[1], scenarios[i].name)) {
			scenarios[i].fn();
			printf("OK %s\n", argv[1]);
			return 0;
		}
	fprintf(stderr, "unknown scenario %s\n", argv[1]);
	return 2;
}
