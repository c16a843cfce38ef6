// SPDX-License-Identifier: MIT
// ibv_open_qp across processes: the parent creates an XRC domain (named by
// a file), an XRC SRQ and an XRC target QP; a forked child opens the same
// domain, opens the target QP by number, queries and modifies it through
// its handle, and closes the handle; the parent's QP then still answers
// queries with the state the child set.  Bad opens fail with EINVAL.
// Prints "ok" and exits 0 on success.
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define CHECK(c, ...)                                                                              \
	do {                                                                                       \
		if (!(c)) {                                                                        \
			fprintf(stderr, "%s:%d: ", __FILE__, __LINE__);                            \
			fprintf(stderr, __VA_ARGS__);                                              \
			fputc('\n', stderr);                                                       \
			exit(1);                                                                   \
		}                                                                                  \
	} while (0)

static struct ibv_context *open_dev(void)
{
	struct ibv_device **l = ibv_get_device_list(NULL);
	CHECK(l && l[0], "no device");
	struct ibv_context *c = ibv_open_device(l[0]);
	CHECK(c, "open_device: %s", strerror(errno));
	ibv_free_device_list(l);
	return c;
}

static struct ibv_xrcd *open_domain(struct ibv_context *c, const char *path)
{
	int fd = open(path, O_RDWR | O_CREAT, 0600);
	CHECK(fd >= 0, "open %s: %s", path, strerror(errno));
	struct ibv_xrcd_init_attr xa = {
		.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS,
		.fd = fd,
		.oflags = O_CREAT,
	};
	struct ibv_xrcd *x = ibv_open_xrcd(c, &xa);
	CHECK(x, "open_xrcd: %s", strerror(errno));
	close(fd);
	return x;
}

static int child(const char *path, uint32_t qpn)
{
	struct ibv_context *c = open_dev();
	struct ibv_xrcd *x = open_domain(c, path);
	struct ibv_qp_open_attr oa = {
		.comp_mask = IBV_QP_OPEN_ATTR_NUM | IBV_QP_OPEN_ATTR_XRCD | IBV_QP_OPEN_ATTR_TYPE,
		.qp_num = qpn,
		.xrcd = x,
		.qp_type = IBV_QPT_XRC_RECV,
	};
	struct ibv_qp *qp = ibv_open_qp(c, &oa);
	CHECK(qp, "open_qp: %s", strerror(errno));
	CHECK(qp->qp_num == qpn, "qp_num %u != %u", qp->qp_num, qpn);

	struct ibv_qp_attr a;
	struct ibv_qp_init_attr ia;
	CHECK(!ibv_query_qp(qp, &a, IBV_QP_STATE, &ia), "query_qp");
	CHECK(a.qp_state == IBV_QPS_INIT, "state %d, want INIT", a.qp_state);

	// Through the opened handle: INIT -> RTR.
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = qpn;
	a.rq_psn = 0;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.dlid = 1;
	a.ah_attr.port_num = 1;
	int err = ibv_modify_qp(qp, &a,
				IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
					IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
					IBV_QP_MIN_RNR_TIMER);
	CHECK(!err, "modify_qp through the opened handle: %s", strerror(err));

	// A wrong number, and a wrong type, fail.
	oa.qp_num = qpn ^ 0x800;
	errno = 0;
	CHECK(!ibv_open_qp(c, &oa) && errno == EINVAL, "bad qp_num opened (errno %d)", errno);
	oa.qp_num = qpn;
	oa.qp_type = IBV_QPT_RC;
	errno = 0;
	CHECK(!ibv_open_qp(c, &oa) && errno == EINVAL, "RC type opened (errno %d)", errno);

	CHECK(!ibv_destroy_qp(qp), "close opened qp");
	CHECK(!ibv_close_xrcd(x), "close_xrcd");
	CHECK(!ibv_close_device(c), "close_device");
	return 0;
}

int main(void)
{
	char path[] = "/tmp/sv_open_qp_XXXXXX";
	int tfd = mkstemp(path);
	CHECK(tfd >= 0, "mkstemp");
	close(tfd);

	struct ibv_context *c = open_dev();
	struct ibv_pd *pd = ibv_alloc_pd(c);
	CHECK(pd, "alloc_pd");
	struct ibv_xrcd *x = open_domain(c, path);
	struct ibv_cq *cq = ibv_create_cq(c, 16, NULL, NULL, 0);
	CHECK(cq, "create_cq");
	struct ibv_srq_init_attr_ex sa = {
		.attr = {.max_wr = 16, .max_sge = 1},
		.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_XRCD |
			     IBV_SRQ_INIT_ATTR_CQ | IBV_SRQ_INIT_ATTR_PD,
		.srq_type = IBV_SRQT_XRC,
		.pd = pd,
		.xrcd = x,
		.cq = cq,
	};
	struct ibv_srq *srq = ibv_create_srq_ex(c, &sa);
	CHECK(srq, "create_srq_ex: %s", strerror(errno));
	struct ibv_qp_init_attr_ex qa = {
		.qp_type = IBV_QPT_XRC_RECV,
		.comp_mask = IBV_QP_INIT_ATTR_XRCD,
		.xrcd = x,
	};
	struct ibv_qp *qp = ibv_create_qp_ex(c, &qa);
	CHECK(qp, "create_qp_ex XRC_RECV: %s", strerror(errno));
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_INIT,
		.pkey_index = 0,
		.port_num = 1,
		.qp_access_flags = 0,
	};
	CHECK(!ibv_modify_qp(qp, &a,
			     IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS),
	      "to INIT");

	pid_t pid = fork();
	CHECK(pid >= 0, "fork");
	if (pid == 0)
		_exit(child(path, qp->qp_num));
	int st;
	CHECK(waitpid(pid, &st, 0) == pid, "waitpid");
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child failed (%d)", st);

	// The QP outlived the child's handle, in the state the child set.
	struct ibv_qp_init_attr ia;
	CHECK(!ibv_query_qp(qp, &a, IBV_QP_STATE, &ia), "query_qp");
	CHECK(a.qp_state == IBV_QPS_RTR, "state %d after the child's modify, want RTR",
	      a.qp_state);
	CHECK(!ibv_destroy_qp(qp), "destroy_qp");
	CHECK(!ibv_destroy_srq(srq), "destroy_srq");
	CHECK(!ibv_destroy_cq(cq), "destroy_cq");
	CHECK(!ibv_close_xrcd(x), "close_xrcd");
	CHECK(!ibv_dealloc_pd(pd), "dealloc_pd");
	CHECK(!ibv_close_device(c), "close_device");
	unlink(path);
	puts("ok");
	return 0;
}
