/* SPDX-License-Identifier: MIT */
/*
 * Agent test (b) of issue 12: a second process that maps only the ring
 * memory drives a QP.
 *
 * The owner creates a parent domain whose alloc callback places the QP's
 * send-queue ring (SOFTVERBS_RES_TYPE_SQ) and its send CQ's ring
 * (SOFTVERBS_RES_TYPE_CQ) in a memfd it maps MAP_SHARED and publishes with
 * softverbs_dv_alloc_fd; the same memfd holds the source records.  It
 * connects the QP to a second QP of its own (the target), hands the QP and
 * the send CQ to an agent (softverbs_dv_qp_agent, softverbs_dv_cq_agent)
 * and execs itself as the agent with every other descriptor closed; over a
 * Unix socket it sends the memfd (SCM_RIGHTS), the rings' offsets in it and
 * their descriptions.  The agent maps the memfd, moves the descriptions
 * onto its mapping (softverbs_dv_sq_rebase, softverbs_dv_cq_rebase), writes
 * N records into the memfd and posts them with the inline helpers: RDMA
 * WRITEs whose SGEs name the owner's addresses of those records, and every
 * fourth an inline SEND, which the target receives into buffers the agent
 * posted with softverbs_dv_rq_post on the target's receive queue
 * (SOFTVERBS_RES_TYPE_RQ, placed in the memfd too, handed over with
 * softverbs_dv_qp_rq).  N is ten times the send queue's depth: the agent
 * polls its send completions from the CQ ring (in order, successful, each
 * its WQE's wr_id) and retires their slots to post more.  The target checks
 * every SEND (sequence and checksum, in order) and every WRITE slot; at the
 * end each ring went back through the allocator's free once, with its type.
 */
#include "../progs/svt.h"

#include <infiniband/softverbs_dv.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>

#define DEPTH 64	  /* The send queue's max_send_wr */
#define N (10 * DEPTH) /* WQEs the agent posts */
#define REC 64
#define ARENA (4u << 20)
#define SRC_OFF (2u << 20) /* The records, in the memfd */

struct rec {
	uint64_t seq;
	uint64_t w[6];
	uint64_t csum;
};

static void rec_fill(struct rec *r, uint64_t seq)
{
	r->seq = seq;
	r->csum = seq ^ 0x5eedULL;
	for (int i = 0; i < 6; i++) {
		r->w[i] = (seq + 1) * 0x9e3779b97f4a7c15ULL ^ (uint64_t)i << 56;
		r->csum ^= r->w[i];
	}
}

static int rec_ok(const struct rec *r, uint64_t seq)
{
	struct rec want;
	rec_fill(&want, seq);
	return !memcmp(r, &want, sizeof(want));
}

static int is_send(int i)
{
	return (i & 3) == 3;
}

/* What the owner tells the agent. */
struct handoff {
	struct softverbs_dv_sq sq; /* Addresses in the owner's mapping */
	struct softverbs_dv_cq cq;
	uint64_t ring_off;	   /* The ring's offset in the memfd */
	uint64_t cq_off;	   /* The CQ ring's */
	struct softverbs_dv_rq rq; /* The target's receive queue */
	uint64_t rq_off;
	uint64_t rbuf_addr;	   /* The owner's receive buffers (N / 4 records) */
	uint32_t rbuf_lkey;
	uint32_t reserved;
	uint64_t owner_base;	   /* The owner's address of the memfd's byte 0 */
	uint32_t src_lkey;
	uint32_t dst_rkey;
	uint64_t dst_addr;
};

static char *arena;
static size_t arena_used;
/* What the allocator handed out and got back, per type (0: SQ, 1: CQ, 2: RQ). */
static void *given[3];
static int frees[3], bad_frees;
static int place_rq; /* Receive queues are placed only while set (the target's) */

static int type_index(uint64_t type)
{
	return type == SOFTVERBS_RES_TYPE_SQ ? 0 :
	       type == SOFTVERBS_RES_TYPE_CQ ? 1 :
	       type == SOFTVERBS_RES_TYPE_RQ ? 2 : -1;
}

static void *ring_alloc(struct ibv_pd *pd, void *ctx, size_t size, size_t align, uint64_t type)
{
	int t = type_index(type);
	if (t < 0 || given[t] || (t == 2 && !place_rq))
		return IBV_ALLOCATOR_USE_DEFAULT;
	size_t off = (arena_used + align - 1) & ~(align - 1);
	if (off + size > SRC_OFF)
		return NULL;
	arena_used = off + size;
	given[t] = arena + off;
	return arena + off;
}

static void ring_free(struct ibv_pd *pd, void *ctx, void *ptr, uint64_t type)
{
	int t = type_index(type);
	if (t < 0 || ptr != given[t])
		bad_frees++;
	else
		frees[t]++;
}

/* The agent's send completions, polled from the CQ ring: in order and
 * successful.  Returns how many it took. */
static int agent_poll(struct softverbs_dv_sq *sq, struct softverbs_dv_cq *cq, uint64_t *done)
{
	struct softverbs_cqe e;
	int n = 0;
	while (softverbs_dv_cq_poll(cq, &e)) {
		if (e.status != IBV_WC_SUCCESS || e.wr_id != *done ||
		    e.opcode != (uint32_t)(is_send((int)*done) ? IBV_WC_SEND : IBV_WC_RDMA_WRITE))
			FAIL("agent: completion %llu: status %u, wr_id %llu, opcode %u",
			     (unsigned long long)*done, e.status, (unsigned long long)e.wr_id,
			     e.opcode);
		softverbs_dv_sq_retire(sq, &e);
		(*done)++;
		n++;
	}
	return n;
}

static int agent(int sock)
{
	struct handoff h;
	char cbuf[CMSG_SPACE(sizeof(int))];
	struct iovec iov = {&h, sizeof(h)};
	struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf,
			   .msg_controllen = sizeof(cbuf)};
	CHECK(recvmsg(sock, &m, MSG_WAITALL) == (ssize_t)sizeof(h));
	struct cmsghdr *c = CMSG_FIRSTHDR(&m);
	CHECK(c && c->cmsg_type == SCM_RIGHTS);
	int fd;
	memcpy(&fd, CMSG_DATA(c), sizeof(fd));
	char *mine = mmap(NULL, ARENA, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	CHECK(mine != MAP_FAILED);
	struct softverbs_dv_sq sq = h.sq;
	softverbs_dv_sq_rebase(&sq, mine + h.ring_off);
	struct softverbs_dv_cq cq = h.cq;
	softverbs_dv_cq_rebase(&cq, mine + h.cq_off);
	CHECK(sq.max_wr == DEPTH && sq.max_inline >= REC);
	struct softverbs_dv_rq rq = h.rq;
	softverbs_dv_rq_rebase(&rq, mine + h.rq_off);
	CHECK(rq.format_version == SOFTVERBS_RQ_FORMAT_VERSION && rq.count >= N / 4);
	/* The target's receives first: buffers of the owner, named by its
	 * addresses and key. */
	for (int i = 0; i < N / 4; i++) {
		struct softverbs_sge s = {h.rbuf_addr + (uint64_t)i * REC, REC, h.rbuf_lkey};
		CHECK(softverbs_dv_rq_post(&rq, (uint64_t)i, &s, 1) == 0);
	}
	uint64_t done = 0, t0 = svt_now_ms();
	for (int i = 0; i < N; i++) {
		struct rec *r = (struct rec *)(mine + SRC_OFF + (size_t)i * REC);
		rec_fill(r, (uint64_t)i);
		struct softverbs_wqe *w;
		while (!(w = softverbs_dv_sq_next(&sq))) {
			/* Full: the slots come back as the completions are polled. */
			if (!agent_poll(&sq, &cq, &done)) {
				if (svt_now_ms() - t0 > 60000)
					FAIL("agent: after 60 s, %llu of %d completions",
					     (unsigned long long)done, N);
				usleep(50);
			}
		}
		if (is_send(i)) {
			softverbs_dv_wqe_ctrl(&sq, w, IBV_WR_SEND, IBV_SEND_SIGNALED, (uint64_t)i);
			CHECK(softverbs_dv_wqe_inline(&sq, w, r, REC) == 0);
		} else {
			softverbs_dv_wqe_ctrl(&sq, w, IBV_WR_RDMA_WRITE, IBV_SEND_SIGNALED,
					      (uint64_t)i);
			softverbs_dv_wqe_rdma(w, h.dst_addr + (uint64_t)i * REC, h.dst_rkey);
			/* The owner's address of the record: SGEs are the owner's. */
			softverbs_dv_wqe_sge(w, h.owner_base + SRC_OFF + (uint64_t)i * REC, REC,
					     h.src_lkey);
		}
		softverbs_dv_sq_post(&sq, (i & 7) == 7 || i == N - 1);
	}
	while (done < N) {
		if (!agent_poll(&sq, &cq, &done)) {
			if (svt_now_ms() - t0 > 60000)
				FAIL("agent: after 60 s, %llu of %d completions",
				     (unsigned long long)done, N);
			usleep(50);
		}
	}
	printf("agent (pid %d): %d WQEs posted through its own mapping of a %u-deep ring, "
	       "%llu completions polled from the CQ ring, %d receives posted\n",
	       (int)getpid(), N, sq.count, (unsigned long long)done, N / 4);
	return 0;
}

static const struct svt_conn conn = {
	.access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE,
	.min_rnr_timer = 1,
	.timeout = 14,
	.retry_cnt = 7,
	.rnr_retry = 7,
};

int main(int argc, char **argv)
{
	if (argc == 3 && !strcmp(argv[1], "agent"))
		return agent(atoi(argv[2]));
	svt_watchdog(120);
	struct svt_dev d;
	svt_open(&d, "loop0");
	/* Sealable: publishing seals it against shrinking (peers map it). */
	int mfd = memfd_create("sv-agent-rings", MFD_ALLOW_SEALING);
	CHECK(mfd >= 0);
	CHECK(ftruncate(mfd, ARENA) == 0);
	arena = mmap(NULL, ARENA, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
	CHECK(arena != MAP_FAILED);
	struct ibv_parent_domain_init_attr pa = {
		.pd = d.pd,
		.comp_mask = IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS,
		.alloc = ring_alloc,
		.free = ring_free,
	};
	struct ibv_pd *parent = ibv_alloc_parent_domain(d.ctx, &pa);
	CHECK(parent);
	/* Peers map rings in the memfd by its descriptor, which the library
	 * learns here: the whole arena, once. */
	CHECK(softverbs_dv_alloc_fd(parent, arena, ARENA, mfd, 0) == 0);
	/* The agent's send CQ, placed by the allocator; the target's receives
	 * go to a CQ of the library's, polled by the owner. */
	struct ibv_cq_init_attr_ex ca = {.cqe = 2 * DEPTH,
					 .comp_mask = IBV_CQ_INIT_ATTR_MASK_PD,
					 .parent_domain = parent};
	struct ibv_cq_ex *scq_ex = ibv_create_cq_ex(d.ctx, &ca);
	CHECK(scq_ex);
	struct ibv_cq *scq = ibv_cq_ex_to_cq(scq_ex);
	CHECK(given[1]);
	/* Placed CQs are not resized (docs/agent.md). */
	CHECK_EQ(ibv_resize_cq(scq, 4 * DEPTH), EOPNOTSUPP);
	struct ibv_cq *cq = ibv_create_cq(d.ctx, 2 * N, NULL, NULL, 0);
	CHECK(cq);
	struct ibv_qp_init_attr qa = {.send_cq = scq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
				      .cap = {.max_send_wr = DEPTH, .max_recv_wr = 1,
					      .max_send_sge = 1, .max_recv_sge = 1,
					      .max_inline_data = REC}};
	struct ibv_qp *a = ibv_create_qp(parent, &qa);
	CHECK(a);
	/* The target, under the parent domain too: its receive queue is
	 * placed in the memfd, for the agent to post to. */
	struct ibv_qp_init_attr qb = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
				      .cap = {.max_send_wr = 4, .max_recv_wr = N / 4,
					      .max_send_sge = 1, .max_recv_sge = 1}};
	place_rq = 1;
	struct ibv_qp *b = ibv_create_qp(parent, &qb);
	place_rq = 0;
	CHECK(b);
	CHECK(given[2]);
	svt_connect(a, b->qp_num, d.lid, &conn);
	svt_connect(b, a->qp_num, d.lid, &conn);
	struct ibv_mr *src = ibv_reg_mr(d.pd, arena + SRC_OFF, (size_t)N * REC,
					IBV_ACCESS_LOCAL_WRITE);
	CHECK(src);
	struct ibv_mr *dst = svt_mr(&d, (size_t)N * REC, IBV_ACCESS_LOCAL_WRITE |
							   IBV_ACCESS_REMOTE_WRITE);
	struct ibv_mr *rbuf = svt_mr(&d, (size_t)N / 4 * REC, IBV_ACCESS_LOCAL_WRITE);
	struct handoff h = {
		.rbuf_addr = (uintptr_t)rbuf->addr,
		.rbuf_lkey = rbuf->lkey,
		.owner_base = (uintptr_t)arena,
		.src_lkey = src->lkey,
		.dst_rkey = dst->rkey,
		.dst_addr = (uintptr_t)dst->addr,
	};
	CHECK(softverbs_dv_qp_agent(a, 1, &h.sq) == 0);
	CHECK(softverbs_dv_cq_agent(scq, 1, &h.cq) == 0);
	CHECK(softverbs_dv_qp_rq(b, 1, &h.rq) == 0);
	CHECK(h.rq.ring == given[2]);
	h.rq_off = (uint64_t)((char *)h.rq.ring - arena);
	{
		/* One producer at a time: the library's posting is refused. */
		struct ibv_sge s = svt_sge(rbuf, 0, REC);
		struct ibv_recv_wr wr = {.sg_list = &s, .num_sge = 1}, *bad;
		CHECK_EQ(ibv_post_recv(b, &wr, &bad), EINVAL);
	}
	/* The rings are where the allocator put them: in the memfd. */
	CHECK(h.sq.ring == given[0] && h.cq.ring == given[1]);
	h.ring_off = (uint64_t)((char *)h.sq.ring - arena);
	h.cq_off = (uint64_t)((char *)h.cq.ring - arena);

	int sv[2];
	CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
	pid_t pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		/* The agent keeps only stdio and its socket: no fabric, no memfd. */
		int s = dup2(sv[1], 3);
		if (s != 3)
			_exit(100);
		if (syscall(SYS_close_range, 4, ~0u, 0))
			for (int f = 4; f < 1024; f++)
				close(f);
		char arg[16];
		snprintf(arg, sizeof(arg), "%d", s);
		execl("/proc/self/exe", argv[0], "agent", arg, (char *)NULL);
		_exit(101);
	}
	close(sv[1]);
	char cbuf[CMSG_SPACE(sizeof(int))];
	memset(cbuf, 0, sizeof(cbuf));
	struct iovec iov = {&h, sizeof(h)};
	struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf,
			   .msg_controllen = sizeof(cbuf)};
	struct cmsghdr *c = CMSG_FIRSTHDR(&m);
	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(c), &mfd, sizeof(mfd));
	CHECK(sendmsg(sv[0], &m, 0) == (ssize_t)sizeof(h));

	/* The agent polls the send completions; the owner the N / 4
	 * receives, and finds nothing in the agent's CQ. */
	int recvs = 0;
	uint64_t next_send_seq = 3;
	uint64_t t0 = svt_now_ms();
	while (recvs < N / 4) {
		struct ibv_wc wc;
		CHECK_EQ(ibv_poll_cq(scq, 1, &wc), 0);
		int n = ibv_poll_cq(cq, 1, &wc);
		CHECK(n >= 0);
		if (!n) {
			if (svt_now_ms() - t0 > 60000)
				FAIL("after 60 s: %d of %d receives", recvs, N / 4);
			usleep(100);
			continue;
		}
		CHECK_WC(wc, IBV_WC_SUCCESS);
		CHECK_EQ(wc.qp_num, b->qp_num);
		CHECK_EQ(wc.opcode, IBV_WC_RECV);
		CHECK_EQ(wc.byte_len, REC);
		const struct rec *r = (const struct rec *)((char *)rbuf->addr + wc.wr_id * REC);
		if (!rec_ok(r, next_send_seq))
			FAIL("SEND %llu: record %llu, damaged or out of order",
			     (unsigned long long)next_send_seq, (unsigned long long)r->seq);
		next_send_seq += 4;
		recvs++;
	}
	for (int i = 0; i < N; i++) {
		if (is_send(i))
			continue;
		const struct rec *r = (const struct rec *)((char *)dst->addr + (size_t)i * REC);
		if (!rec_ok(r, (uint64_t)i))
			FAIL("WRITE slot %d holds record %llu", i, (unsigned long long)r->seq);
	}
	int st;
	CHECK(waitpid(pid, &st, 0) == pid);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	printf("owner: %d SENDs and %d WRITEs intact\n", recvs, N - recvs);
	CHECK(softverbs_dv_qp_agent(a, 0, NULL) == 0);
	CHECK(softverbs_dv_cq_agent(scq, 0, NULL) == 0);
	CHECK(softverbs_dv_qp_rq(b, 0, NULL) == 0);
	CHECK(ibv_destroy_qp(a) == 0 && ibv_destroy_qp(b) == 0);
	CHECK(frees[0] == 1 && frees[1] == 0 && frees[2] == 1 && !bad_frees);
	CHECK(ibv_destroy_cq(scq) == 0);
	CHECK(frees[0] == 1 && frees[1] == 1 && frees[2] == 1 && !bad_frees);
	CHECK(ibv_dealloc_pd(parent) == 0);
	printf("ok\n");
	return 0;
}
