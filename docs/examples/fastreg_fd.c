// SPDX-License-Identifier: MIT
/*
 * fastreg_fd: the softverbs_dv.h memory extensions between two processes.
 *
 *   server                                   client
 *   memfd MR (softverbs_reg_mr_fd)
 *   BMME key: fast-register a block list
 *   of two non-adjacent pages (send queue)
 *                 ---- rkeys, addresses ---->
 *                                            RDMA WRITE into the memfd MR
 *                                            RDMA WRITE across both blocks
 *                                            SEND_WITH_INV of the BMME rkey
 *   receive: IBV_WC_WITH_INV, invalidated_rkey
 *   fast-register again (new key), LOCAL_INV, fast-register once more
 *                 ---- new rkey ------------>
 *                                            RDMA WRITE with the old rkey:
 *                                            IBV_WC_REM_ACCESS_ERR
 *
 * Exit status 0 when every step saw what it should.  Build against our
 * headers and run with LD_LIBRARY_PATH pointing at our libibverbs.so.1.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <infiniband/softverbs_dv.h>
#include <infiniband/verbs.h>

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define CHECK(c, ...)                                                                      \
	do {                                                                               \
		if (!(c)) {                                                                \
			fprintf(stderr, "%s: line %d: ", role, __LINE__);                   \
			fprintf(stderr, __VA_ARGS__);                                      \
			fprintf(stderr, "\n");                                             \
			exit(1);                                                           \
		}                                                                          \
	} while (0)

static const char *role = "?";
static long page;

struct info {
	uint32_t qpn;
	uint16_t lid;
	uint32_t fd_rkey;
	uint64_t fd_iova;
	uint32_t fr_rkey;
	uint64_t fr_iova;
};

struct node {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	uint16_t lid;
};

static void xwrite(int fd, const void *p, size_t n)
{
	CHECK(write(fd, p, n) == (ssize_t)n, "pipe write");
}

static void xread(int fd, void *p, size_t n)
{
	CHECK(read(fd, p, n) == (ssize_t)n, "pipe read");
}

static void open_node(struct node *n)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	CHECK(list && list[0], "no device");
	n->ctx = ibv_open_device(list[0]);
	ibv_free_device_list(list);
	CHECK(n->ctx, "open_device: %s", strerror(errno));
	n->pd = ibv_alloc_pd(n->ctx);
	n->cq = ibv_create_cq(n->ctx, 16, NULL, NULL, 0);
	struct ibv_qp_init_attr ia = {
		.send_cq = n->cq,
		.recv_cq = n->cq,
		.cap = {.max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1},
		.qp_type = IBV_QPT_RC,
	};
	n->qp = ibv_create_qp(n->pd, &ia);
	CHECK(n->pd && n->cq && n->qp, "resources: %s", strerror(errno));
	struct ibv_port_attr pa;
	CHECK(!ibv_query_port(n->ctx, 1, &pa), "query_port");
	n->lid = pa.lid;
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT,
				.port_num = 1,
				.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ};
	CHECK(!ibv_modify_qp(n->qp, &a,
			     IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS),
	      "INIT");
}

static void connect_node(struct node *n, const struct info *peer)
{
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_RTR,
				.path_mtu = IBV_MTU_1024,
				.dest_qp_num = peer->qpn,
				.max_dest_rd_atomic = 1,
				.min_rnr_timer = 1,
				.ah_attr = {.dlid = peer->lid, .port_num = 1}};
	CHECK(!ibv_modify_qp(n->qp, &a,
			     IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
				     IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER),
	      "RTR");
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = 1;
	CHECK(!ibv_modify_qp(n->qp, &a,
			     IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
				     IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC),
	      "RTS");
}

static struct ibv_wc wait_wc(struct node *n)
{
	struct ibv_wc wc;
	for (long i = 0; i < 200000000L; i++) {
		int r = ibv_poll_cq(n->cq, 1, &wc);
		CHECK(r >= 0, "poll_cq");
		if (r)
			return wc;
	}
	CHECK(0, "no completion");
	return wc;
}

static void fast_reg(struct node *n, struct ibv_mr *fr, uint8_t key, uint64_t iova,
		     const uint64_t *pages, uint32_t npages, uint64_t len)
{
	struct softverbs_fast_reg_wr w = {
		.wr_id = 0xf00 + key,
		.send_flags = IBV_SEND_SIGNALED,
		.mr = fr,
		.key = key,
		.access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE,
		.iova = iova,
		.length = len,
		.addr = 0,
		.page_list = pages,
		.num_pages = npages,
		.page_shift = __builtin_ctzl((unsigned long)page),
	};
	CHECK(!softverbs_post_fast_reg(n->qp, &w), "post_fast_reg");
	struct ibv_wc wc = wait_wc(n);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == SOFTVERBS_WC_FAST_REG &&
		      wc.wr_id == w.wr_id,
	      "fast-reg completion: status %d opcode %d", wc.status, wc.opcode);
	CHECK((fr->rkey & 0xff) == key, "rkey carries the new key");
}

static int server(int to_client, int from_client)
{
	role = "server";
	struct node n;
	open_node(&n);
	/* fd-backed memory: a memfd, registered, then the fd closed. */
	int mfd = memfd_create("fastreg_fd", MFD_CLOEXEC);
	CHECK(mfd >= 0 && !ftruncate(mfd, 4 * page), "memfd");
	char *view = mmap(NULL, 4 * page, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
	CHECK(view != MAP_FAILED, "mmap");
	struct ibv_mr *fdmr = softverbs_reg_mr_fd(n.pd, mfd, SOFTVERBS_FD_MEMFD, page, 2 * page,
						  0x100000,
						  IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
							  IBV_ACCESS_REMOTE_READ);
	CHECK(fdmr, "reg_mr_fd: %s", strerror(errno));
	close(mfd);
	/* Bad arguments register nothing. */
	CHECK(!softverbs_reg_mr_fd(n.pd, -1, SOFTVERBS_FD_MEMFD, 0, page, 0,
				   IBV_ACCESS_LOCAL_WRITE) && errno == EBADF,
	      "bad fd: errno %d", errno);
	/* A BMME key over pages 0 and 2 of a 3-page buffer. */
	char *buf = mmap(NULL, 3 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(buf != MAP_FAILED, "mmap buf");
	memset(buf, '.', 3 * page);
	uint64_t pages[2] = {(uintptr_t)buf, (uintptr_t)buf + 2 * page};
	struct ibv_mr *fr = softverbs_alloc_fast_reg_mr(n.pd, 2);
	CHECK(fr, "alloc_fast_reg_mr: %s", strerror(errno));
	/* One receive for the SEND_WITH_INV. */
	char rbuf[64];
	struct ibv_mr *rmr = ibv_reg_mr(n.pd, rbuf, sizeof(rbuf), IBV_ACCESS_LOCAL_WRITE);
	struct ibv_sge rs = {(uintptr_t)rbuf, sizeof(rbuf), rmr->lkey};
	struct ibv_recv_wr rw = {.wr_id = 7, .sg_list = &rs, .num_sge = 1}, *bad;
	CHECK(!ibv_post_recv(n.qp, &rw, &bad), "post_recv");

	struct info me = {.qpn = n.qp->qp_num, .lid = n.lid}, peer;
	xwrite(to_client, &me, sizeof(me));
	xread(from_client, &peer, sizeof(peer));
	connect_node(&n, &peer);
	fast_reg(&n, fr, 0x42, 0x200000, pages, 2, 2 * page);
	me.fd_rkey = fdmr->rkey;
	me.fd_iova = 0x100000;
	me.fr_rkey = fr->rkey;
	me.fr_iova = 0x200000;
	xwrite(to_client, &me, sizeof(me));

	struct ibv_wc wc = wait_wc(&n);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV && wc.wr_id == 7,
	      "receive: status %d", wc.status);
	CHECK((wc.wc_flags & IBV_WC_WITH_INV) && wc.invalidated_rkey == fr->rkey,
	      "receive carries the invalidated rkey (flags %#x rkey %#x)", wc.wc_flags,
	      wc.invalidated_rkey);
	/* The client wrote into the memfd (seen through our own mapping). */
	CHECK(!memcmp(view + page, "hello, fd", 9), "memfd contents");
	/* And across the two blocks: the end of page 0, the start of page 2. */
	CHECK(!memcmp(buf + page - 4, "ABCD", 4) && !memcmp(buf + 2 * page, "EFGH", 4) &&
		      buf[page] == '.',
	      "block-list contents");
	/* Register again with a new key, invalidate locally, register again. */
	fast_reg(&n, fr, 0x43, 0x200000, pages, 2, 2 * page);
	struct ibv_send_wr inv = {.wr_id = 9,
				  .opcode = IBV_WR_LOCAL_INV,
				  .send_flags = IBV_SEND_SIGNALED,
				  .invalidate_rkey = fr->rkey};
	struct ibv_send_wr *sbad;
	CHECK(!ibv_post_send(n.qp, &inv, &sbad), "post LOCAL_INV");
	wc = wait_wc(&n);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_LOCAL_INV, "LOCAL_INV: %d",
	      wc.status);
	fast_reg(&n, fr, 0x44, 0x200000, pages, 2, 2 * page);
	me.fr_rkey = fr->rkey;
	xwrite(to_client, &me, sizeof(me));
	char done;
	xread(from_client, &done, 1);
	CHECK(done == 'k', "client reported failure");
	CHECK(!ibv_dereg_mr(fdmr), "dereg fd MR");
	printf("server: fd MR, fast-register, SEND_WITH_INV, LOCAL_INV: ok\n");
	return 0;
}

static void post_write(struct node *n, struct ibv_mr *mr, char *src, uint32_t len,
		       uint64_t raddr, uint32_t rkey)
{
	struct ibv_sge s = {(uintptr_t)src, len, mr->lkey};
	struct ibv_send_wr w = {.wr_id = 1,
				.sg_list = &s,
				.num_sge = 1,
				.opcode = IBV_WR_RDMA_WRITE,
				.send_flags = IBV_SEND_SIGNALED,
				.wr.rdma = {raddr, rkey}},
			   *bad;
	CHECK(!ibv_post_send(n->qp, &w, &bad), "post write");
}

static int client(int to_server, int from_server)
{
	role = "client";
	struct node n;
	open_node(&n);
	struct info me = {.qpn = n.qp->qp_num, .lid = n.lid}, peer;
	xread(from_server, &peer, sizeof(peer));
	xwrite(to_server, &me, sizeof(me));
	connect_node(&n, &peer);
	xread(from_server, &peer, sizeof(peer));
	char src[64] = "hello, fd";
	struct ibv_mr *mr = ibv_reg_mr(n.pd, src, sizeof(src), IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr, "reg_mr");
	post_write(&n, mr, src, 9, peer.fd_iova, peer.fd_rkey);
	struct ibv_wc wc = wait_wc(&n);
	CHECK(wc.status == IBV_WC_SUCCESS, "write to fd MR: %d", wc.status);
	memcpy(src, "ABCDEFGH", 8);
	post_write(&n, mr, src, 8, peer.fr_iova + page - 4, peer.fr_rkey);
	wc = wait_wc(&n);
	CHECK(wc.status == IBV_WC_SUCCESS, "write across blocks: %d", wc.status);
	struct ibv_send_wr si = {.wr_id = 2,
				 .opcode = IBV_WR_SEND_WITH_INV,
				 .send_flags = IBV_SEND_SIGNALED,
				 .invalidate_rkey = peer.fr_rkey},
			   *bad;
	CHECK(!ibv_post_send(n.qp, &si, &bad), "post SEND_WITH_INV");
	wc = wait_wc(&n);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_SEND, "SEND_WITH_INV: %d",
	      wc.status);
	uint32_t old = peer.fr_rkey;
	xread(from_server, &peer, sizeof(peer));
	CHECK(peer.fr_rkey != old, "a new key");
	/* The invalidated key is dead. */
	post_write(&n, mr, src, 8, peer.fr_iova, old);
	wc = wait_wc(&n);
	CHECK(wc.status == IBV_WC_REM_ACCESS_ERR, "old rkey: status %d", wc.status);
	xwrite(to_server, "k", 1);
	printf("client: writes through both keys, SEND_WITH_INV, dead key refused: ok\n");
	return 0;
}

int main(void)
{
	page = sysconf(_SC_PAGESIZE);
	int a[2], b[2];
	if (pipe(a) || pipe(b))
		return 1;
	pid_t pid = fork();
	if (pid < 0)
		return 1;
	if (pid == 0) {
		close(a[1]);
		close(b[0]);
		exit(client(b[1], a[0]));
	}
	close(a[0]);
	close(b[1]);
	int rc = server(a[1], b[0]);
	int st = 0;
	waitpid(pid, &st, 0);
	return rc || !WIFEXITED(st) || WEXITSTATUS(st);
}
