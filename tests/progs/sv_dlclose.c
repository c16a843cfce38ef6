/* SPDX-License-Identifier: MIT */
/* A plugin's life, as Open MPI's btl openib lives it: libibverbs.so.1 comes
 * in with dlopen(RTLD_LOCAL), a QP pair does some traffic, one SEND waits
 * in RNR retries (a receiver with no receive and a long RNR timer, so the
 * provider's progress thread sleeps on a timer), everything is destroyed
 * and the device closed, and the library is dlclose()d.  The program then
 * lives on for two seconds.  Our library starts threads; were it unmapped
 * at dlclose, the progress thread would wake into unmapped code (SIGSEGV,
 * "address not mapped", as mpirun's rank 0 died at MPI_Finalize).
 *
 * Prints "OK sv_dlclose" and exits 0 when it survived. */
#include <dlfcn.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FAIL(...)                                                                  \
	do {                                                                       \
		fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);               \
		fprintf(stderr, __VA_ARGS__);                                      \
		fputc('\n', stderr);                                               \
		exit(1);                                                           \
	} while (0)

static void *lib;

static void *sym(const char *name)
{
	void *p = dlsym(lib, name);
	if (!p)
		FAIL("dlsym %s: %s", name, dlerror());
	return p;
}

#define F(name) ((__typeof__(&name))sym(#name))

static void connect_qp(struct ibv_qp *qp, uint32_t dqpn, uint16_t dlid)
{
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE;
	if (F(ibv_modify_qp)(qp, &a,
			     IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		FAIL("INIT");
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = dqpn;
	a.ah_attr.dlid = dlid;
	a.ah_attr.port_num = 1;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 31; /* 491 ms between RNR retries */
	if (F(ibv_modify_qp)(qp, &a,
			     IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
				     IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
				     IBV_QP_MIN_RNR_TIMER))
		FAIL("RTR");
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7; /* forever */
	a.max_rd_atomic = 1;
	if (F(ibv_modify_qp)(qp, &a,
			     IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
				     IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC))
		FAIL("RTS");
}

int main(void)
{
	alarm(30);
	lib = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!lib)
		FAIL("dlopen: %s", dlerror());
	int n;
	struct ibv_device **l = F(ibv_get_device_list)(&n);
	if (!l || n < 1)
		FAIL("no device");
	struct ibv_context *ctx = F(ibv_open_device)(l[0]);
	if (!ctx)
		FAIL("open");
	F(ibv_free_device_list)(l);
	struct ibv_pd *pd = F(ibv_alloc_pd)(ctx);
	struct ibv_cq *cq = F(ibv_create_cq)(ctx, 16, NULL, NULL, 0);
	static char buf[4096];
	struct ibv_mr *mr = F(ibv_reg_mr)(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
	if (!pd || !cq || !mr)
		FAIL("pd/cq/mr");
	struct ibv_qp_init_attr ia;
	memset(&ia, 0, sizeof(ia));
	ia.send_cq = ia.recv_cq = cq;
	ia.qp_type = IBV_QPT_RC;
	ia.cap.max_send_wr = ia.cap.max_recv_wr = 4;
	ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
	struct ibv_qp *a = F(ibv_create_qp)(pd, &ia), *b = F(ibv_create_qp)(pd, &ia);
	if (!a || !b)
		FAIL("qp");
	struct ibv_port_attr pa;
	/* The symbol behind the header's inline ibv_query_port (not linked). */
	int (*query_port)(struct ibv_context *, uint8_t, struct ibv_port_attr *) =
		(int (*)(struct ibv_context *, uint8_t, struct ibv_port_attr *))sym("ibv_query_port");
	memset(&pa, 0, sizeof(pa));
	if (query_port(ctx, 1, &pa))
		FAIL("query_port");
	connect_qp(a, b->qp_num, pa.lid);
	connect_qp(b, a->qp_num, pa.lid);
	/* b has no receive: the SEND waits in RNR retries, 491 ms apart. */
	struct ibv_sge s = {(uintptr_t)buf, 64, mr->lkey};
	struct ibv_send_wr wr, *bad;
	memset(&wr, 0, sizeof(wr));
	wr.sg_list = &s;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_SEND;
	wr.send_flags = IBV_SEND_SIGNALED;
	if (ibv_post_send(a, &wr, &bad))
		FAIL("post_send");
	usleep(50 * 1000); /* the progress thread is now asleep on its timer */
	if (F(ibv_destroy_qp)(a) || F(ibv_destroy_qp)(b) || F(ibv_dereg_mr)(mr) ||
	    F(ibv_destroy_cq)(cq) || F(ibv_dealloc_pd)(pd) || F(ibv_close_device)(ctx))
		FAIL("teardown");
	if (dlclose(lib))
		FAIL("dlclose: %s", dlerror());
	sleep(2); /* the timer fires meanwhile */
	printf("OK sv_dlclose\n");
	return 0;
}
