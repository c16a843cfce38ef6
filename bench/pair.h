// SPDX-License-Identifier: MIT
// What the two-process benchmarks (qp_scale.c, fd_write_bw.c) share: a
// forked pair joined by a socketpair, loop0 opened, RC QPs connected.
// Each process that hangs is ended by alarm(); its peer then reads EOF.
#ifndef SOFTVERBS_BENCH_PAIR_H
#define SOFTVERBS_BENCH_PAIR_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <infiniband/verbs.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static int sock = -1;
static const char *who = "parent";
static const char *prog = "bench";

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void die(const char *what, int e)
{
	fprintf(stderr, "%s %s: %s: %s\n", prog, who, what, strerror(e));
	exit(2);
}

static void xwrite(const void *p, size_t n)
{
	const char *c = p;
	while (n) {
		ssize_t r = write(sock, c, n);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			die("socket write", r < 0 ? errno : EPIPE);
		c += r;
		n -= r;
	}
}

static void xread(void *p, size_t n)
{
	char *c = p;
	while (n) {
		ssize_t r = read(sock, c, n);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			die("socket read (the other process died?)", r < 0 ? errno : EPIPE);
		c += r;
		n -= r;
	}
}

static void barrier(void)
{
	char b = 'b';
	xwrite(&b, 1);
	xread(&b, 1);
}

// Forks; returns 0 in the child, the child's pid in the parent.  The child
// dies with the parent, whatever kills it; both give up after secs seconds.
static pid_t fork_pair(int secs)
{
	int sv[2];
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv))
		die("socketpair", errno);
	pid_t parent_pid = getpid();
	pid_t child = fork();
	if (child < 0)
		die("fork", errno);
	if (child == 0) {
		who = "child";
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent_pid)
			_exit(2);
		close(sv[0]);
		sock = sv[1];
	} else {
		close(sv[1]);
		sock = sv[0];
	}
	alarm(secs);
	return child;
}

static struct ibv_context *open_loop0(void)
{
	int ndev = 0;
	struct ibv_device **devs = ibv_get_device_list(&ndev);
	struct ibv_context *ctx = NULL;
	for (int i = 0; devs && i < ndev; i++)
		if (!strcmp(ibv_get_device_name(devs[i]), "loop0"))
			ctx = ibv_open_device(devs[i]);
	if (!ctx)
		die("open loop0", errno ? errno : ENODEV);
	if (devs)
		ibv_free_device_list(devs);
	return ctx;
}

// How a process names its port to the other.
struct peer_info {
	uint16_t lid;
	uint8_t gid[16];
	int created; // QPs (qp_scale); 0 elsewhere
};

static struct peer_info my_port(struct ibv_context *ctx, struct ibv_port_attr *port)
{
	struct peer_info mine;
	memset(&mine, 0, sizeof(mine));
	if (ibv_query_port(ctx, 1, port))
		die("ibv_query_port", errno);
	mine.lid = port->lid;
	union ibv_gid gid;
	if (ibv_query_gid(ctx, 1, 0, &gid) == 0)
		memcpy(mine.gid, gid.raw, 16);
	return mine;
}

// INIT, RTR, RTS towards the peer's QP peer_qpn.
static void connect_rc(struct ibv_qp *qp, const struct ibv_port_attr *port,
		       const struct peer_info *theirs, uint32_t peer_qpn, unsigned int access)
{
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.pkey_index = 0;
	a.port_num = 1;
	a.qp_access_flags = access;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		die("modify_qp INIT", errno);
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = port->active_mtu;
	a.dest_qp_num = peer_qpn;
	a.rq_psn = 0;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.dlid = theirs->lid;
	a.ah_attr.port_num = 1;
	if (port->link_layer == IBV_LINK_LAYER_ETHERNET) {
		a.ah_attr.is_global = 1;
		memcpy(a.ah_attr.grh.dgid.raw, theirs->gid, 16);
		a.ah_attr.grh.hop_limit = 1;
	}
	if (ibv_modify_qp(qp, &a,
			  IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
				  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		die("modify_qp RTR", errno);
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = 0;
	a.max_rd_atomic = 1;
	if (ibv_modify_qp(qp, &a,
			  IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
				  IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
		die("modify_qp RTS", errno);
}

#endif
