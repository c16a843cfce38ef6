/* SPDX-License-Identifier: MIT */
/* Helpers for the traffic test programs: plain verbs, nothing of ours.
 * Every check that fails prints where and exits 1; a scenario that passes
 * prints "OK <name>".  A watchdog alarm bounds every program. */
#ifndef SVT_H
#define SVT_H

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#define FAIL(...)                                                                  \
	do {                                                                       \
		fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);               \
		fprintf(stderr, __VA_ARGS__);                                      \
		fputc('\n', stderr);                                               \
		exit(1);                                                           \
	} while (0)
#define CHECK(c)                                                                   \
	do {                                                                       \
		if (!(c))                                                          \
			FAIL("%s (errno %d %s)", #c, errno, strerror(errno));      \
	} while (0)
#define CHECK_EQ(a, b)                                                             \
	do {                                                                       \
		long long _a = (long long)(a), _b = (long long)(b);                \
		if (_a != _b)                                                      \
			FAIL("%s == %lld, expected %s == %lld", #a, _a, #b, _b);   \
	} while (0)
#define CHECK_WC(wc, st)                                                           \
	do {                                                                       \
		if ((wc).status != (st))                                           \
			FAIL("wc wr_id %llu status %s, expected %s",               \
			     (unsigned long long)(wc).wr_id,                       \
			     ibv_wc_status_str((wc).status), ibv_wc_status_str(st)); \
	} while (0)

static inline uint64_t svt_now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Polls one completion within ms milliseconds; returns 1 or 0 if none. */
static inline int svt_poll(struct ibv_cq *cq, struct ibv_wc *wc, int ms)
{
	uint64_t end = svt_now_ms() + ms;
	for (;;) {
		int n = ibv_poll_cq(cq, 1, wc);
		CHECK(n >= 0);
		if (n == 1)
			return 1;
		if (svt_now_ms() > end)
			return 0;
		usleep(50);
	}
}

static inline struct ibv_wc svt_wait(struct ibv_cq *cq, const char *what)
{
	struct ibv_wc wc;
	if (!svt_poll(cq, &wc, 5000))
		FAIL("no completion for %s within 5 s", what);
	return wc;
}

static inline void svt_expect_empty(struct ibv_cq *cq, int ms, const char *what)
{
	struct ibv_wc wc;
	if (svt_poll(cq, &wc, ms))
		FAIL("unexpected completion (%s): wr_id %llu status %s opcode %d", what,
		     (unsigned long long)wc.wr_id, ibv_wc_status_str(wc.status), wc.opcode);
}

/* A completion event on ch within ms milliseconds: 1 (taken and acked; for
 * cq, unless cq is NULL), or 0.  Makes ch's descriptor non-blocking. */
static inline int svt_event_within(struct ibv_comp_channel *ch, struct ibv_cq *cq, int ms)
{
	int fl = fcntl(ch->fd, F_GETFL);
	CHECK(fl >= 0);
	if (!(fl & O_NONBLOCK))
		CHECK(fcntl(ch->fd, F_SETFL, fl | O_NONBLOCK) == 0);
	struct pollfd p = {ch->fd, POLLIN, 0};
	uint64_t end = svt_now_ms() + (uint64_t)ms;
	for (;;) {
		uint64_t now = svt_now_ms();
		int r = poll(&p, 1, now < end ? (int)(end - now) : 0);
		CHECK(r >= 0);
		if (r == 1) {
			struct ibv_cq *got;
			void *ctx;
			if (ibv_get_cq_event(ch, &got, &ctx) == 0) {
				if (cq && got != cq)
					FAIL("an event for another CQ");
				ibv_ack_cq_events(got, 1);
				return 1;
			}
			CHECK(errno == EAGAIN); /* A wake-up with no event behind it */
		}
		if (svt_now_ms() >= end)
			return 0;
	}
}

struct svt_dev {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	uint16_t lid;
	union ibv_gid gid;
	enum ibv_mtu mtu;
};

static inline void svt_open(struct svt_dev *d, const char *name)
{
	int n;
	struct ibv_device **l = ibv_get_device_list(&n);
	CHECK(l);
	d->ctx = NULL;
	for (int i = 0; i < n; i++)
		if (!strcmp(ibv_get_device_name(l[i]), name))
			d->ctx = ibv_open_device(l[i]);
	if (!d->ctx)
		FAIL("device %s not found or not opened (%d devices)", name, n);
	ibv_free_device_list(l);
	d->pd = ibv_alloc_pd(d->ctx);
	CHECK(d->pd);
	struct ibv_port_attr pa;
	CHECK(ibv_query_port(d->ctx, 1, &pa) == 0);
	d->lid = pa.lid;
	d->mtu = pa.active_mtu;
	CHECK(ibv_query_gid(d->ctx, 1, 0, &d->gid) == 0);
}

static inline struct ibv_mr *svt_mr(struct svt_dev *d, size_t len, int access)
{
	void *p = aligned_alloc(4096, (len + 4095) & ~(size_t)4095);
	CHECK(p);
	memset(p, 0, len);
	struct ibv_mr *mr = ibv_reg_mr(d->pd, p, len, access);
	CHECK(mr);
	return mr;
}

#define SVT_ALL_ACCESS                                                             \
	(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |    \
	 IBV_ACCESS_REMOTE_ATOMIC)

struct svt_qpopt {
	enum ibv_qp_type type;
	struct ibv_cq *scq, *rcq;
	struct ibv_srq *srq;
	int sq_sig_all;
	uint32_t max_send_wr, max_recv_wr, max_sge, max_inline;
};

static inline struct ibv_qp *svt_qp(struct svt_dev *d, const struct svt_qpopt *o)
{
	struct ibv_qp_init_attr a;
	memset(&a, 0, sizeof(a));
	a.send_cq = o->scq;
	a.recv_cq = o->rcq;
	a.srq = o->srq;
	a.qp_type = o->type;
	a.sq_sig_all = o->sq_sig_all;
	a.cap.max_send_wr = o->max_send_wr ? o->max_send_wr : 64;
	a.cap.max_recv_wr = o->srq ? 0 : (o->max_recv_wr ? o->max_recv_wr : 64);
	a.cap.max_send_sge = o->max_sge ? o->max_sge : 4;
	a.cap.max_recv_sge = o->srq ? 0 : (o->max_sge ? o->max_sge : 4);
	a.cap.max_inline_data = o->max_inline;
	struct ibv_qp *qp = ibv_create_qp(d->pd, &a);
	CHECK(qp);
	return qp;
}

/* Connection parameters of an RC/UC QP. */
struct svt_conn {
	int access;	       /* qp_access_flags of the local QP */
	uint8_t min_rnr_timer; /* of the local (responder) side */
	uint8_t timeout, retry_cnt, rnr_retry;
};

/* RESET -> INIT -> RTR toward dqpn at dlid: a responder that stays there. */
static inline void svt_to_rtr(struct ibv_qp *qp, uint32_t dqpn, uint16_t dlid,
			      const struct svt_conn *c)
{
	int uc = qp->qp_type == IBV_QPT_UC;
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.pkey_index = 0;
	a.port_num = 1;
	a.qp_access_flags = c->access;
	CHECK(ibv_modify_qp(qp, &a,
			    IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
				    IBV_QP_ACCESS_FLAGS) == 0);
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = dqpn;
	a.rq_psn = 0;
	a.max_dest_rd_atomic = 4;
	a.min_rnr_timer = c->min_rnr_timer;
	a.ah_attr.dlid = dlid;
	a.ah_attr.port_num = 1;
	int mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
	if (!uc)
		mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
	CHECK(ibv_modify_qp(qp, &a, mask) == 0);
}

static inline void svt_connect(struct ibv_qp *qp, uint32_t dqpn, uint16_t dlid,
			       const struct svt_conn *c)
{
	int uc = qp->qp_type == IBV_QPT_UC;
	svt_to_rtr(qp, dqpn, dlid, c);
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 0;
	a.timeout = c->timeout;
	a.retry_cnt = c->retry_cnt;
	a.rnr_retry = c->rnr_retry;
	a.max_rd_atomic = 4;
	int mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
	if (!uc)
		mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
	CHECK(ibv_modify_qp(qp, &a, mask) == 0);
}

static inline void svt_ud_up(struct ibv_qp *qp, uint32_t qkey)
{
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	a.qkey = qkey;
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY) ==
	      0);
	a.qp_state = IBV_QPS_RTR;
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE) == 0);
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 0;
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN) == 0);
}

static inline int svt_post_send1(struct ibv_qp *qp, uint64_t wr_id, enum ibv_wr_opcode op,
				 struct ibv_sge *sge, int nsge, int flags, uint64_t raddr,
				 uint32_t rkey)
{
	struct ibv_send_wr wr, *bad = NULL;
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = wr_id;
	wr.opcode = op;
	wr.sg_list = sge;
	wr.num_sge = nsge;
	wr.send_flags = flags;
	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	return ibv_post_send(qp, &wr, &bad);
}

static inline void svt_post_recv1(struct ibv_qp *qp, uint64_t wr_id, struct ibv_sge *sge,
				  int nsge)
{
	struct ibv_recv_wr wr, *bad = NULL;
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = wr_id;
	wr.sg_list = sge;
	wr.num_sge = nsge;
	CHECK(ibv_post_recv(qp, &wr, &bad) == 0);
}

static inline struct ibv_sge svt_sge(struct ibv_mr *mr, size_t off, uint32_t len)
{
	struct ibv_sge s = {(uintptr_t)mr->addr + off, len, mr->lkey};
	return s;
}

static inline void svt_fill(void *p, size_t len, unsigned seed)
{
	unsigned char *c = p;
	for (size_t i = 0; i < len; i++)
		c[i] = (unsigned char)(seed * 131 + i * 7 + (i >> 8));
}

static inline void svt_watchdog(int seconds)
{
	alarm(seconds); /* SIGALRM's default action ends the process */
}

/* A process out of descriptors: the soft limit lowered to at most 512, and
 * the table filled with /dev/null until EMFILE.  svt_fds_back gives them
 * back and restores the limit. */
struct svt_nofds {
	struct rlimit old;
	int fds[1024];
	int n;
};

static inline void svt_fds_exhaust(struct svt_nofds *z)
{
	CHECK(getrlimit(RLIMIT_NOFILE, &z->old) == 0);
	struct rlimit low = z->old;
	low.rlim_cur = 512 < z->old.rlim_cur ? 512 : z->old.rlim_cur;
	CHECK(setrlimit(RLIMIT_NOFILE, &low) == 0);
	z->n = 0;
	while (z->n < 1024 && (z->fds[z->n] = open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0)
		z->n++;
	CHECK(z->n < 1024 && errno == EMFILE);
}

static inline void svt_fds_back(struct svt_nofds *z)
{
	for (int i = 0; i < z->n; i++)
		close(z->fds[i]);
	z->n = 0;
	CHECK(setrlimit(RLIMIT_NOFILE, &z->old) == 0);
}

static inline enum ibv_qp_state svt_state(struct ibv_qp *qp)
{
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr i;
	CHECK(ibv_query_qp(qp, &a, IBV_QP_STATE, &i) == 0);
	return a.qp_state;
}

#endif
