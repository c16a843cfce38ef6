/* SPDX-License-Identifier: MIT */
/* Out of memory inside a verb is an error return, never an abort: no C++
 * exception may cross into the C caller (providers/loop/c_boundary.h).
 * Run with failmalloc.so preloaded, which fails this thread's allocations
 * on request.  Checks:
 *  - post_send of a chain whose second WR needs memory the first did not:
 *    ENOMEM, bad_wr at the second WR, the first WR done with its data, the
 *    second's target untouched; the same WR posts and lands once memory is
 *    back;
 *  - each create/register verb with its k-th allocation failing, for every
 *    k until it needs no more: the object, or NULL with errno ENOMEM;
 *  - post_recv and poll_cq with every allocation failing;
 *  - ibv_get_device_list likewise, once the device is closed.
 * Prints "OK enomem" and exits 0 when every check passed. */
#include "../progs/svt.h"

#include <dlfcn.h>
#include <glob.h>

static void (*arm)(long after);
static long (*disarm)(void);

#define NSGE 16
#define CHUNK 512

static char fabric[64];

static void remove_segments(void)
{
	char pat[128];
	glob_t g;
	snprintf(pat, sizeof(pat), "/dev/shm/softverbs-%u-%s*", (unsigned)getuid(), fabric);
	if (glob(pat, 0, NULL, &g) == 0) {
		for (size_t i = 0; i < g.gl_pathc; i++)
			unlink(g.gl_pathv[i]);
		globfree(&g);
	}
}

/* A create verb under allocation failure: NULL with ENOMEM, or an object.
 * Fails the k-th allocation of the call, for k = 0, 1, ... until a call
 * needs no more than k. */
#define SWEEP(what, type, create, destroy)                                         \
	do {                                                                       \
		long k;                                                            \
		for (k = 0; k < 100000; k++) {                                     \
			errno = 0;                                                 \
			arm(k);                                                    \
			type *o = (create);                                        \
			int e = errno;                                             \
			long failed = disarm();                                    \
			if (o) {                                                   \
				CHECK(destroy(o) == 0);                            \
				if (!failed)                                       \
					break;                                     \
			} else if (e != ENOMEM) {                                  \
				FAIL("%s with allocation %ld failing: NULL, errno %d (%s), " \
				     "expected ENOMEM", what, k, e, strerror(e));  \
			}                                                          \
		}                                                                  \
		printf("%s: each of its %ld allocations failed in turn: ENOMEM\n", what, k); \
	} while (0)

static int free_list(struct ibv_device **l)
{
	ibv_free_device_list(l);
	return 0;
}

int main(void)
{
	setvbuf(stdout, NULL, _IOLBF, 0); /* Each line out before a crash */
	svt_watchdog(120);
	arm = (void (*)(long))dlsym(RTLD_DEFAULT, "svfail_arm");
	disarm = (long (*)(void))dlsym(RTLD_DEFAULT, "svfail_disarm");
	if (!arm || !disarm)
		FAIL("failmalloc.so is not preloaded (LD_PRELOAD)");
	snprintf(fabric, sizeof(fabric), "enomem%d", (int)getpid());
	setenv("SOFTVERBS_FABRIC", fabric, 1);
	atexit(remove_segments);

	struct svt_dev d;
	svt_open(&d, "loop0");
	struct ibv_cq *cq = ibv_create_cq(d.ctx, 64, NULL, NULL, 0);
	CHECK(cq);
	struct svt_qpopt o = {IBV_QPT_RC, cq, cq, NULL, 0, 16, 16, NSGE, 0};
	struct ibv_qp *a = svt_qp(&d, &o), *b = svt_qp(&d, &o);
	struct svt_conn c = {SVT_ALL_ACCESS, 1, 14, 7, 7};
	svt_connect(a, b->qp_num, d.lid, &c);
	svt_connect(b, a->qp_num, d.lid, &c);
	size_t len = 2 * NSGE * CHUNK;
	struct ibv_mr *src = svt_mr(&d, len, SVT_ALL_ACCESS), *dst = svt_mr(&d, len, SVT_ALL_ACCESS);
	svt_fill(src->addr, len, 7);

	/* WR 1: one SGE; WR 2: NSGE SGEs gathered from every other chunk,
	 * more local pieces than any WR of this thread had before. */
	struct ibv_sge s1 = svt_sge(src, 0, CHUNK), s2[NSGE];
	for (int i = 0; i < NSGE; i++)
		s2[i] = svt_sge(src, (size_t)2 * i * CHUNK, CHUNK);
	struct ibv_send_wr w2 = {.wr_id = 2, .sg_list = s2, .num_sge = NSGE,
				 .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED};
	w2.wr.rdma.remote_addr = (uintptr_t)dst->addr + CHUNK;
	w2.wr.rdma.rkey = dst->rkey;
	struct ibv_send_wr w1 = {.wr_id = 1, .next = &w2, .sg_list = &s1, .num_sge = 1,
				 .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED};
	w1.wr.rdma.remote_addr = (uintptr_t)dst->addr;
	w1.wr.rdma.rkey = dst->rkey;
	/* Warm up with one single-SGE WRITE: what a first post sets up once is
	 * not what this test is about. */
	struct ibv_send_wr w0 = w1;
	w0.wr_id = 0;
	w0.next = NULL;
	struct ibv_send_wr *bad = NULL;
	CHECK(ibv_post_send(a, &w0, &bad) == 0);
	struct ibv_wc wc = svt_wait(cq, "warm-up WRITE");
	CHECK_WC(wc, IBV_WC_SUCCESS);
	memset(dst->addr, 0, len);

	arm(0);
	int rc = ibv_post_send(a, &w1, &bad);
	long failed = disarm();
	printf("post_send with allocations failing: rc %d, %ld allocation(s) refused\n", rc,
	       failed);
	if (failed) {
		CHECK_EQ(rc, ENOMEM);
		CHECK(bad == &w2);
		wc = svt_wait(cq, "WR 1 of the chain");
		CHECK_WC(wc, IBV_WC_SUCCESS);
		CHECK_EQ(wc.wr_id, 1);
		CHECK(memcmp(dst->addr, src->addr, CHUNK) == 0);
		/* WR 2 moved nothing and completes nothing. */
		for (size_t i = CHUNK; i < len; i++)
			if (((unsigned char *)dst->addr)[i])
				FAIL("WR 2 failed with ENOMEM but wrote byte %zu", i);
		svt_expect_empty(cq, 100, "the refused WR 2");
		CHECK(ibv_post_send(a, &w2, &bad) == 0);
	} else {
		/* The path needed no memory (pre-reserved): both ran. */
		CHECK_EQ(rc, 0);
		wc = svt_wait(cq, "WR 1 of the chain");
		CHECK_EQ(wc.wr_id, 1);
	}
	wc = svt_wait(cq, "WR 2");
	CHECK_WC(wc, IBV_WC_SUCCESS);
	CHECK_EQ(wc.wr_id, 2);
	for (int i = 0; i < NSGE; i++)
		if (memcmp((char *)dst->addr + CHUNK + (size_t)i * CHUNK,
			   (char *)src->addr + (size_t)2 * i * CHUNK, CHUNK))
			FAIL("WR 2: chunk %d differs", i);

	/* post_recv and poll_cq, every allocation failing. */
	struct ibv_recv_wr r = {.wr_id = 9, .sg_list = &s1, .num_sge = 1}, *rbad = NULL;
	arm(0);
	rc = ibv_post_recv(b, &r, &rbad);
	int n = ibv_poll_cq(cq, 1, &wc);
	disarm();
	if (rc != 0 && rc != ENOMEM)
		FAIL("post_recv with allocations failing: %d", rc);
	if (n != 0 && n != -ENOMEM)
		FAIL("poll_cq with allocations failing: %d", n);

	SWEEP("ibv_alloc_pd", struct ibv_pd, ibv_alloc_pd(d.ctx), ibv_dealloc_pd);
	SWEEP("ibv_create_cq", struct ibv_cq, ibv_create_cq(d.ctx, 16, NULL, NULL, 0),
	      ibv_destroy_cq);
	SWEEP("ibv_reg_mr", struct ibv_mr, ibv_reg_mr(d.pd, src->addr, len, SVT_ALL_ACCESS),
	      ibv_dereg_mr);
	struct ibv_qp_init_attr qa = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
				      .cap = {.max_send_wr = 4, .max_recv_wr = 4,
					      .max_send_sge = 1, .max_recv_sge = 1}};
	SWEEP("ibv_create_qp", struct ibv_qp, ibv_create_qp(d.pd, &qa), ibv_destroy_qp);
	struct ibv_srq_init_attr sa = {.attr = {.max_wr = 4, .max_sge = 1}};
	SWEEP("ibv_create_srq", struct ibv_srq, ibv_create_srq(d.pd, &sa), ibv_destroy_srq);
	SWEEP("ibv_create_comp_channel", struct ibv_comp_channel,
	      ibv_create_comp_channel(d.ctx), ibv_destroy_comp_channel);

	CHECK(ibv_destroy_qp(a) == 0);
	CHECK(ibv_destroy_qp(b) == 0);
	CHECK(ibv_dereg_mr(src) == 0);
	CHECK(ibv_dereg_mr(dst) == 0);
	CHECK(ibv_destroy_cq(cq) == 0);
	CHECK(ibv_dealloc_pd(d.pd) == 0);
	CHECK(ibv_close_device(d.ctx) == 0);
	/* Last: a failure inside the provider's listing is reported on stderr. */
	SWEEP("ibv_get_device_list", struct ibv_device *, ibv_get_device_list(NULL), free_list);
	printf("OK enomem\n");
	return 0;
}
