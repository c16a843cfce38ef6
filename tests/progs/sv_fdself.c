/* SPDX-License-Identifier: MIT */
/* A process's own fd-backed MR whose file it shrinks: its own QPs' copies
 * into and out of it end in error completions, never SIGBUS.
 *
 *   sv_fdself
 *
 * One process, two RC QPs connected to each other.  A memfd of 64 KiB (not
 * sealed) is registered with softverbs_reg_mr_fd (found with dlsym: this
 * program links the system's libibverbs) and used by WRITEs, READs, an
 * atomic and SENDs between the two QPs, every byte checked through the
 * program's own mapping of the file.  Then the program truncates the file
 * to nothing.  An HCA would go on writing the pages it pinned; the
 * library's copies by address met a missing page and died of SIGBUS.  Now
 * each access completes with an error (the QPs are connected again after
 * each):
 *  - a WRITE and an atomic into it, a READ out of it: REM_ACCESS_ERR;
 *  - a WRITE whose local SGE lies in it: LOC_PROT_ERR;
 *  - a SEND into a receive buffer in it: not SUCCESS at either end.
 * And a READ into a read-only page of an on-demand MR: LOC_PROT_ERR, the
 * responder left in RTS.
 * Prints "OK sv_fdself". */
#include "svt.h"

#include <dlfcn.h>
#include <sys/mman.h>

#include "softverbs_dv.h"

#define LEN (64 * 1024)
#define IOVA 0x7000000ull

static struct svt_dev D;
static struct ibv_cq *cq, *bcq; /* qa's, qb's */
static struct ibv_qp *qa, *qb;

static void connect_both(void)
{
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_RESET};
	CHECK(ibv_modify_qp(qa, &a, IBV_QP_STATE) == 0);
	CHECK(ibv_modify_qp(qb, &a, IBV_QP_STATE) == 0);
	struct ibv_wc wc;
	while (ibv_poll_cq(cq, 1, &wc) > 0 || ibv_poll_cq(bcq, 1, &wc) > 0)
		;
	/* Short retries: a failed access ends at once, nothing waits long. */
	struct svt_conn c = {SVT_ALL_ACCESS, 1, 8, 1, 1};
	svt_connect(qa, qb->qp_num, D.lid, &c);
	svt_connect(qb, qa->qp_num, D.lid, &c);
}

/* One signaled WR on qa; its completion's status. */
static int one(enum ibv_wr_opcode op, struct ibv_sge *s, uint64_t raddr, uint32_t rkey)
{
	struct ibv_send_wr wr, *bad = NULL;
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = 1;
	wr.opcode = op;
	wr.sg_list = s;
	wr.num_sge = 1;
	wr.send_flags = IBV_SEND_SIGNALED;
	if (op == IBV_WR_ATOMIC_FETCH_AND_ADD) {
		wr.wr.atomic.remote_addr = raddr;
		wr.wr.atomic.rkey = rkey;
		wr.wr.atomic.compare_add = 1;
	} else {
		wr.wr.rdma.remote_addr = raddr;
		wr.wr.rdma.rkey = rkey;
	}
	CHECK(ibv_post_send(qa, &wr, &bad) == 0);
	struct ibv_wc wc = svt_wait(cq, "a WR on the fd-backed MR");
	CHECK_EQ(wc.wr_id, 1);
	return wc.status;
}

int main(void)
{
	svt_watchdog(60);
	typedef struct ibv_mr *(*reg_fd_fn)(struct ibv_pd *, int, int, uint64_t, size_t, uint64_t,
					    unsigned int);
	reg_fd_fn reg_fd = (reg_fd_fn)dlsym(RTLD_DEFAULT, "softverbs_reg_mr_fd");
	if (!reg_fd)
		FAIL("softverbs_reg_mr_fd not found: not softverbs' libibverbs");
	svt_open(&D, "loop0");
	cq = ibv_create_cq(D.ctx, 64, NULL, NULL, 0);
	bcq = ibv_create_cq(D.ctx, 64, NULL, NULL, 0);
	CHECK(cq && bcq);
	struct svt_qpopt o = {.type = IBV_QPT_RC, .scq = cq, .rcq = cq};
	struct svt_qpopt ob = {.type = IBV_QPT_RC, .scq = bcq, .rcq = bcq};
	qa = svt_qp(&D, &o);
	qb = svt_qp(&D, &ob);
	connect_both();

	int fd = memfd_create("sv_fdself", MFD_CLOEXEC);
	CHECK(fd >= 0);
	CHECK(ftruncate(fd, LEN) == 0);
	unsigned char *view = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	CHECK(view != MAP_FAILED);
	struct ibv_mr *fmr = reg_fd(D.pd, fd, SOFTVERBS_FD_MEMFD, 0, LEN, IOVA, SVT_ALL_ACCESS);
	CHECK(fmr);
	struct ibv_mr *lm = svt_mr(&D, LEN, SVT_ALL_ACCESS);
	unsigned char *l = lm->addr;

	/* While the file is whole: WRITEs (the caches and memos warm), a READ,
	 * an atomic and a SEND, every byte checked. */
	for (int i = 0; i < 16; i++) {
		svt_fill(l, 256, 10 + i);
		struct ibv_sge s = svt_sge(lm, 0, 256);
		CHECK_EQ(one(IBV_WR_RDMA_WRITE, &s, IOVA + 256 * i, fmr->rkey), IBV_WC_SUCCESS);
		if (memcmp(view + 256 * i, l, 256))
			FAIL("WRITE %d into the fd-backed MR: bytes differ", i);
	}
	svt_fill(view + 8192, 512, 77);
	struct ibv_sge rs = svt_sge(lm, 4096, 512);
	CHECK_EQ(one(IBV_WR_RDMA_READ, &rs, IOVA + 8192, fmr->rkey), IBV_WC_SUCCESS);
	if (memcmp(l + 4096, view + 8192, 512))
		FAIL("READ from the fd-backed MR: bytes differ");
	memset(view + 16384, 0, 8);
	struct ibv_sge as = svt_sge(lm, 8192, 8);
	CHECK_EQ(one(IBV_WR_ATOMIC_FETCH_AND_ADD, &as, IOVA + 16384, fmr->rkey), IBV_WC_SUCCESS);
	CHECK_EQ(view[16384], 1);
	struct ibv_sge recv = {(uintptr_t)IOVA + 20480, 128, fmr->lkey};
	svt_post_recv1(qb, 9, &recv, 1);
	svt_fill(l, 100, 5);
	struct ibv_sge ss = svt_sge(lm, 0, 100);
	CHECK_EQ(one(IBV_WR_SEND, &ss, 0, 0), IBV_WC_SUCCESS);
	struct ibv_wc rw = svt_wait(bcq, "the SEND's receive");
	CHECK_WC(rw, IBV_WC_SUCCESS);
	if (memcmp(view + 20480, l, 100))
		FAIL("SEND into the fd-backed MR: bytes differ");

	/* The file cut to nothing under the registration. */
	CHECK(ftruncate(fd, 0) == 0);

	struct ibv_sge ws = svt_sge(lm, 0, 256);
	int st = one(IBV_WR_RDMA_WRITE, &ws, IOVA, fmr->rkey);
	if (st != IBV_WC_REM_ACCESS_ERR)
		FAIL("WRITE into the shrunk file: %s, expected REM_ACCESS_ERR",
		     ibv_wc_status_str(st));
	connect_both();
	st = one(IBV_WR_RDMA_READ, &rs, IOVA + 8192, fmr->rkey);
	if (st != IBV_WC_REM_ACCESS_ERR)
		FAIL("READ from the shrunk file: %s, expected REM_ACCESS_ERR",
		     ibv_wc_status_str(st));
	connect_both();
	st = one(IBV_WR_ATOMIC_FETCH_AND_ADD, &as, IOVA + 16384, fmr->rkey);
	if (st != IBV_WC_REM_ACCESS_ERR)
		FAIL("atomic on the shrunk file: %s, expected REM_ACCESS_ERR",
		     ibv_wc_status_str(st));
	connect_both();
	struct ibv_sge from = {(uintptr_t)IOVA + 256, 256, fmr->lkey};
	st = one(IBV_WR_RDMA_WRITE, &from, (uintptr_t)l + 4096, lm->rkey);
	if (st != IBV_WC_LOC_PROT_ERR)
		FAIL("WRITE out of the shrunk file: %s, expected LOC_PROT_ERR",
		     ibv_wc_status_str(st));
	connect_both();
	svt_post_recv1(qb, 9, &recv, 1);
	st = one(IBV_WR_SEND, &ss, 0, 0);
	if (st == IBV_WC_SUCCESS)
		FAIL("SEND into a receive buffer in the shrunk file completed SUCCESS");
	struct ibv_wc wc;
	while (svt_poll(bcq, &wc, 200))
		if (wc.wr_id == 9 && wc.status == IBV_WC_SUCCESS)
			FAIL("a receive into the shrunk file completed SUCCESS");

	/* The same attribution for on-demand memory: a READ into a page of
	 * an ODP MR the program made read-only is its own fault
	 * (LOC_PROT_ERR, rxe's do_read), and the responder stays in RTS; it
	 * was REM_ACCESS_ERR with the responder in ERR. */
	connect_both();
	unsigned char *ro = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
				 -1, 0);
	CHECK(ro != MAP_FAILED);
	struct ibv_mr *om = ibv_reg_mr(D.pd, ro, 8192,
				       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND);
	CHECK(om);
	CHECK(mprotect(ro + 4096, 4096, PROT_READ) == 0);
	struct ibv_sge into = {(uintptr_t)ro + 4096, 256, om->lkey};
	svt_fill(l, 256, 44);
	st = one(IBV_WR_RDMA_READ, &into, (uintptr_t)l, lm->rkey);
	if (st != IBV_WC_LOC_PROT_ERR)
		FAIL("READ into read-only on-demand memory: %s, expected LOC_PROT_ERR",
		     ibv_wc_status_str(st));
	CHECK_EQ(svt_state(qb), IBV_QPS_RTS);
	CHECK_EQ(ibv_dereg_mr(om), 0);
	munmap(ro, 8192);

	CHECK_EQ(ibv_destroy_qp(qa), 0);
	CHECK_EQ(ibv_destroy_qp(qb), 0);
	CHECK_EQ(ibv_dereg_mr(fmr), 0);
	CHECK_EQ(ibv_dereg_mr(lm), 0);
	CHECK_EQ(ibv_destroy_cq(cq), 0);
	CHECK_EQ(ibv_destroy_cq(bcq), 0);
	CHECK_EQ(ibv_dealloc_pd(D.pd), 0);
	CHECK_EQ(ibv_close_device(D.ctx), 0);
	munmap(view, LEN);
	close(fd);
	puts("OK sv_fdself");
	return 0;
}
