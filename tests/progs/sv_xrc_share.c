/* SPDX-License-Identifier: MIT */
/* A shared XRC target QP outlives its creator while another process holds
 * it open, as the kernel keeps it (ib_uverbs: the QP goes with its last
 * handle), and goes with the last handle.
 *
 *   sv_xrc_share destroy|exit|kill
 *
 * Three processes on one XRC domain (a file):
 *  - the receiver (this process): the XRC SRQ and its CQ, every message's
 *    bytes checked (a sequence number and a pattern seeded by it);
 *  - the creator (a child): creates the XRC target QP and takes it to INIT;
 *  - the sender (a child): an XRC send QP connected to the target QP.
 * The receiver opens the target QP (ibv_open_qp) and takes it to RTR
 * through its handle.  The sender sends a batch, every message checked on
 * arrival.  Then the creator's handle goes: it destroys its QP (destroy),
 * exits without cleaning up (exit), or is killed with SIGKILL (kill).  A
 * second batch must still arrive, whole and in order, and the QP must
 * still answer queries through the receiver's handle.  Then the receiver
 * closes its handle, the last: the sender's next SEND must fail (no QP
 * answers: IBV_WC_RETRY_EXC_ERR) and nothing may arrive.  Last, the QP of a
 * creator killed while it alone held it cannot be opened (EINVAL).
 * Prints "OK sv_xrc_share MODE". */
#include "svt.h"

#include <signal.h>
#include <sys/wait.h>

#define NBUF 32
#define BUFSZ 256
#define BATCH 200

struct msg_hdr {
	uint32_t seq;
	uint32_t len;
};

static void wr_all(int fd, const void *p, size_t n)
{
	CHECK(write(fd, p, n) == (ssize_t)n);
}

static void rd_all(int fd, void *p, size_t n)
{
	size_t got = 0;
	while (got < n) {
		ssize_t r = read(fd, (char *)p + got, n - got);
		if (r <= 0)
			FAIL("pipe closed or failed (%zd)", r);
		got += (size_t)r;
	}
}

static struct ibv_xrcd *open_domain(struct ibv_context *c, const char *path)
{
	int fd = open(path, O_RDWR | O_CREAT, 0600);
	CHECK(fd >= 0);
	struct ibv_xrcd_init_attr xa;
	memset(&xa, 0, sizeof(xa));
	xa.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
	xa.fd = fd;
	xa.oflags = O_CREAT;
	struct ibv_xrcd *x = ibv_open_xrcd(c, &xa);
	CHECK(x);
	close(fd);
	return x;
}

static uint32_t msg_len(uint32_t seq)
{
	return (uint32_t)sizeof(struct msg_hdr) + 16 + (seq * 37) % (BUFSZ - 24);
}

static void msg_fill(unsigned char *p, uint32_t seq)
{
	struct msg_hdr h = {seq, msg_len(seq)};
	memcpy(p, &h, sizeof(h));
	svt_fill(p + sizeof(h), h.len - sizeof(h), seq);
}

/* A new XRC target QP of domain x. */
static struct ibv_qp *target_qp(struct ibv_context *c, struct ibv_xrcd *x)
{
	struct ibv_qp_init_attr_ex qa;
	memset(&qa, 0, sizeof(qa));
	qa.qp_type = IBV_QPT_XRC_RECV;
	qa.comp_mask = IBV_QP_INIT_ATTR_XRCD;
	qa.xrcd = x;
	struct ibv_qp *qp = ibv_create_qp_ex(c, &qa);
	CHECK(qp);
	return qp;
}

/* The creator: the target QP, to INIT; its QPN to the receiver; then it
 * lets go of it as the mode says, on the receiver's word. */
static int creator(const char *path, const char *mode, int to_p, int from_p)
{
	struct svt_dev d;
	svt_open(&d, "loop0");
	struct ibv_xrcd *x = open_domain(d.ctx, path);
	struct ibv_qp *qp = target_qp(d.ctx, x);
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	CHECK(ibv_modify_qp(qp, &a,
			    IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) ==
	      0);
	wr_all(to_p, &qp->qp_num, sizeof(qp->qp_num));
	char cmd;
	rd_all(from_p, &cmd, 1); /* 'g': let go */
	if (!strcmp(mode, "exit"))
		_exit(0); /* No destroy, no close: the library's exit handler */
	if (!strcmp(mode, "kill")) {
		for (;;)
			pause(); /* The receiver kills us */
	}
	CHECK(ibv_destroy_qp(qp) == 0);
	CHECK(ibv_close_xrcd(x) == 0);
	cmd = 'k';
	wr_all(to_p, &cmd, 1);
	rd_all(from_p, &cmd, 1); /* 'q' */
	CHECK(ibv_dealloc_pd(d.pd) == 0);
	CHECK(ibv_close_device(d.ctx) == 0);
	return 0;
}

/* The sender: its QPN to the receiver, the target QP's number and the SRQ's
 * from it; then per command a batch ('n', every SEND must succeed), or one
 * SEND whose status it reports ('e'), or the end ('q'). */
static int sender(int to_p, int from_p)
{
	struct svt_dev d;
	svt_open(&d, "loop0");
	struct ibv_cq *cq = ibv_create_cq(d.ctx, 64, NULL, NULL, 0);
	CHECK(cq);
	struct ibv_mr *mr = svt_mr(&d, BUFSZ, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_qp_init_attr_ex qa;
	memset(&qa, 0, sizeof(qa));
	qa.qp_type = IBV_QPT_XRC_SEND;
	qa.comp_mask = IBV_QP_INIT_ATTR_PD;
	qa.pd = d.pd;
	qa.send_cq = cq;
	qa.cap.max_send_wr = 16;
	qa.cap.max_send_sge = 1;
	struct ibv_qp *qp = ibv_create_qp_ex(d.ctx, &qa);
	CHECK(qp);
	wr_all(to_p, &qp->qp_num, sizeof(qp->qp_num));
	uint32_t ids[2]; /* target QPN, SRQ number */
	rd_all(from_p, ids, sizeof(ids));
	/* Short timeouts: the last SEND, to no QP, must fail in well under a
	 * second; an RNR waits for ever (rnr_retry 7). */
	struct svt_conn c = {0, 1, 8, 7, 7};
	svt_connect(qp, ids[0], d.lid, &c);
	uint32_t seq = 0;
	for (;;) {
		char cmd;
		rd_all(from_p, &cmd, 1);
		if (cmd == 'q')
			break;
		int n = cmd == 'n' ? BATCH : 1;
		for (int i = 0; i < n; i++, seq++) {
			msg_fill(mr->addr, seq);
			struct ibv_sge sge = svt_sge(mr, 0, msg_len(seq));
			struct ibv_send_wr wr, *bad = NULL;
			memset(&wr, 0, sizeof(wr));
			wr.wr_id = seq;
			wr.opcode = IBV_WR_SEND;
			wr.sg_list = &sge;
			wr.num_sge = 1;
			wr.send_flags = IBV_SEND_SIGNALED;
			wr.qp_type.xrc.remote_srqn = ids[1];
			CHECK(ibv_post_send(qp, &wr, &bad) == 0);
			struct ibv_wc wc;
			if (!svt_poll(cq, &wc, 20000))
				FAIL("no send completion for message %u within 20 s", seq);
			if (cmd == 'n')
				CHECK_WC(wc, IBV_WC_SUCCESS);
			else
				wr_all(to_p, &wc.status, sizeof(wc.status));
		}
		if (cmd == 'n') {
			char ok = 'o';
			wr_all(to_p, &ok, 1);
		}
	}
	return 0;
}

/* Receives one batch, each message checked against the sequence expected. */
static void receive_batch(struct ibv_cq *cq, struct ibv_srq *srq, struct ibv_mr *mr,
			  uint32_t *next, int n)
{
	for (int i = 0; i < n; i++) {
		struct ibv_wc wc;
		if (!svt_poll(cq, &wc, 20000))
			FAIL("message %u did not arrive within 20 s", *next);
		CHECK_WC(wc, IBV_WC_SUCCESS);
		CHECK(wc.opcode == IBV_WC_RECV);
		CHECK(wc.wr_id < NBUF);
		unsigned char *b = (unsigned char *)mr->addr + wc.wr_id * BUFSZ;
		struct msg_hdr h;
		memcpy(&h, b, sizeof(h));
		if (h.seq != *next)
			FAIL("message %u arrived where %u was due", h.seq, *next);
		CHECK_EQ(wc.byte_len, msg_len(h.seq));
		CHECK_EQ(h.len, msg_len(h.seq));
		unsigned char want[BUFSZ];
		msg_fill(want, h.seq);
		if (memcmp(b, want, h.len))
			FAIL("message %u: bytes differ", h.seq);
		(*next)++;
		memset(b, 0xee, BUFSZ);
		struct ibv_sge sge = svt_sge(mr, wc.wr_id * BUFSZ, BUFSZ);
		struct ibv_recv_wr wr, *bad = NULL;
		memset(&wr, 0, sizeof(wr));
		wr.wr_id = wc.wr_id;
		wr.sg_list = &sge;
		wr.num_sge = 1;
		CHECK(ibv_post_srq_recv(srq, &wr, &bad) == 0);
	}
}

int main(int argc, char **argv)
{
	const char *mode = argc > 1 ? argv[1] : "destroy";
	if (strcmp(mode, "destroy") && strcmp(mode, "exit") && strcmp(mode, "kill"))
		FAIL("usage: sv_xrc_share destroy|exit|kill");
	svt_watchdog(120);
	char path[] = "/tmp/sv_xrc_share_XXXXXX";
	int tfd = mkstemp(path);
	CHECK(tfd >= 0);
	close(tfd);

	int c2p[2], p2c[2], s2p[2], p2s[2];
	CHECK(pipe(c2p) == 0 && pipe(p2c) == 0 && pipe(s2p) == 0 && pipe(p2s) == 0);
	/* Children first: a fork after ibv_open_device would share its state. */
	pid_t cpid = fork();
	CHECK(cpid >= 0);
	if (cpid == 0) {
		svt_watchdog(120);
		_exit(creator(path, mode, c2p[1], p2c[0]));
	}
	pid_t spid = fork();
	CHECK(spid >= 0);
	if (spid == 0) {
		svt_watchdog(120);
		_exit(sender(s2p[1], p2s[0]));
	}

	struct svt_dev d;
	svt_open(&d, "loop0");
	struct ibv_xrcd *x = open_domain(d.ctx, path);
	struct ibv_cq *cq = ibv_create_cq(d.ctx, NBUF * 2, NULL, NULL, 0);
	CHECK(cq);
	struct ibv_srq_init_attr_ex sa;
	memset(&sa, 0, sizeof(sa));
	sa.attr.max_wr = NBUF;
	sa.attr.max_sge = 1;
	sa.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ |
		       IBV_SRQ_INIT_ATTR_PD;
	sa.srq_type = IBV_SRQT_XRC;
	sa.pd = d.pd;
	sa.xrcd = x;
	sa.cq = cq;
	struct ibv_srq *srq = ibv_create_srq_ex(d.ctx, &sa);
	CHECK(srq);
	uint32_t srqn;
	CHECK(ibv_get_srq_num(srq, &srqn) == 0);
	struct ibv_mr *mr = svt_mr(&d, NBUF * BUFSZ, IBV_ACCESS_LOCAL_WRITE);
	memset(mr->addr, 0xee, NBUF * BUFSZ);
	for (uint32_t i = 0; i < NBUF; i++) {
		struct ibv_sge sge = svt_sge(mr, i * BUFSZ, BUFSZ);
		struct ibv_recv_wr wr, *bad = NULL;
		memset(&wr, 0, sizeof(wr));
		wr.wr_id = i;
		wr.sg_list = &sge;
		wr.num_sge = 1;
		CHECK(ibv_post_srq_recv(srq, &wr, &bad) == 0);
	}

	uint32_t tqpn, sqpn;
	rd_all(c2p[0], &tqpn, sizeof(tqpn));
	rd_all(s2p[0], &sqpn, sizeof(sqpn));
	struct ibv_qp_open_attr oa;
	memset(&oa, 0, sizeof(oa));
	oa.comp_mask = IBV_QP_OPEN_ATTR_NUM | IBV_QP_OPEN_ATTR_XRCD | IBV_QP_OPEN_ATTR_TYPE;
	oa.qp_num = tqpn;
	oa.xrcd = x;
	oa.qp_type = IBV_QPT_XRC_RECV;
	struct ibv_qp *tqp = ibv_open_qp(d.ctx, &oa);
	CHECK(tqp);
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = sqpn;
	a.min_rnr_timer = 1;
	a.ah_attr.dlid = d.lid;
	a.ah_attr.port_num = 1;
	CHECK(ibv_modify_qp(tqp, &a,
			    IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
				    IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
				    IBV_QP_MIN_RNR_TIMER) == 0);
	uint32_t ids[2] = {tqpn, srqn};
	wr_all(p2s[1], ids, sizeof(ids));

	uint32_t next = 0;
	char cmd = 'n', ok;
	wr_all(p2s[1], &cmd, 1);
	receive_batch(cq, srq, mr, &next, BATCH);
	rd_all(s2p[0], &ok, 1);
	CHECK(ok == 'o');

	/* The creator lets go of its handle. */
	cmd = 'g';
	wr_all(p2c[1], &cmd, 1);
	int st;
	if (!strcmp(mode, "destroy")) {
		rd_all(c2p[0], &cmd, 1);
		CHECK(cmd == 'k');
	} else {
		if (!strcmp(mode, "kill"))
			CHECK(kill(cpid, SIGKILL) == 0);
		CHECK(waitpid(cpid, &st, 0) == cpid);
		if (!strcmp(mode, "kill"))
			CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
		else
			CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	}

	/* A dead process is reaped when somebody next looks (opening an XRC
	 * domain does): its QP must pass to the receiver then, not go. */
	ibv_close_xrcd(open_domain(d.ctx, path));

	/* The QP lives on: the receiver's handle answers, and a batch arrives. */
	struct ibv_qp_init_attr ia;
	memset(&a, 0, sizeof(a));
	CHECK(ibv_query_qp(tqp, &a, IBV_QP_STATE, &ia) == 0);
	if (a.qp_state != IBV_QPS_RTR)
		FAIL("target QP in state %d once its creator's handle went, expected RTR (%d)",
		     a.qp_state, IBV_QPS_RTR);
	cmd = 'n';
	wr_all(p2s[1], &cmd, 1);
	receive_batch(cq, srq, mr, &next, BATCH);
	rd_all(s2p[0], &ok, 1);
	CHECK(ok == 'o');

	/* The last handle closed: the QP is no more.  The sender's SEND finds
	 * nobody (retries exhausted) and nothing arrives. */
	CHECK(ibv_destroy_qp(tqp) == 0);
	cmd = 'e';
	wr_all(p2s[1], &cmd, 1);
	enum ibv_wc_status ws;
	rd_all(s2p[0], &ws, sizeof(ws));
	if (ws != IBV_WC_RETRY_EXC_ERR)
		FAIL("SEND to the QP closed by its last handle: %s, expected %s",
		     ibv_wc_status_str(ws), ibv_wc_status_str(IBV_WC_RETRY_EXC_ERR));
	svt_expect_empty(cq, 100, "a SEND to a closed XRC target QP");

	/* A QP whose only holder died is gone: nobody can open it, even
	 * before anybody reaped the dead process (the kernel closed its
	 * handle when it exited). */
	int d2p[2];
	CHECK(pipe(d2p) == 0);
	pid_t dpid = fork();
	CHECK(dpid >= 0);
	if (dpid == 0) {
		struct svt_dev dd;
		svt_open(&dd, "loop0");
		struct ibv_qp *q = target_qp(dd.ctx, open_domain(dd.ctx, path));
		wr_all(d2p[1], &q->qp_num, sizeof(q->qp_num));
		for (;;)
			pause();
	}
	uint32_t dqpn;
	rd_all(d2p[0], &dqpn, sizeof(dqpn));
	CHECK(kill(dpid, SIGKILL) == 0);
	CHECK(waitpid(dpid, &st, 0) == dpid);
	oa.qp_num = dqpn;
	errno = 0;
	struct ibv_qp *revived = ibv_open_qp(d.ctx, &oa);
	if (revived || errno != EINVAL)
		FAIL("opened the XRC target QP of a killed sole holder (errno %d), expected EINVAL",
		     errno);

	cmd = 'q';
	wr_all(p2s[1], &cmd, 1);
	CHECK(waitpid(spid, &st, 0) == spid);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	if (!strcmp(mode, "destroy")) {
		wr_all(p2c[1], &cmd, 1);
		CHECK(waitpid(cpid, &st, 0) == cpid);
		CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	}
	CHECK(ibv_destroy_srq(srq) == 0);
	CHECK(ibv_destroy_cq(cq) == 0);
	CHECK(ibv_close_xrcd(x) == 0);
	CHECK(ibv_dereg_mr(mr) == 0);
	CHECK(ibv_dealloc_pd(d.pd) == 0);
	CHECK(ibv_close_device(d.ctx) == 0);
	unlink(path);
	printf("OK sv_xrc_share %s\n", mode);
	return 0;
}
