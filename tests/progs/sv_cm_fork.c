// SPDX-License-Identifier: MIT
// rdma_cm across fork() (pyverbs-tests/test_rdmacm.py):
//   - the parent connects a pair of ids on its channel (its CM thread
//     running), then forks;
//   - the child, as a child of rdma-core's can with the kernel's rdma_cm,
//     makes a channel, a listener and a client of its own, connects them
//     and moves a message over the connection (bytes checked), then
//     disconnects; on the ids it inherited, rdma_connect, rdma_disconnect
//     and rdma_create_qp are EINVAL, rdma_destroy_qp forgets the QP without
//     destroying it, and rdma_destroy_id returns at once (the parent's
//     connection untouched: a review found a child's rdma_disconnect moved
//     the parent's QP to ERR, and its rdma_destroy_qp destroyed it);
//   - the parent, once the child exited 0, still has its connection: a
//     message each way (bytes checked), then rdma_disconnect gives
//     DISCONNECTED on both of its ids, on its own channel.
// Before, the child had no CM thread and its connect waited forever.
//
//   sv_cm_fork ADDR
//
// Prints "OK sv_cm_fork" when every check held; else a FAIL line, exit 1.
#include <rdma/rdma_cma.h>

#include "svt.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static char addr[64];

static struct rdma_cm_event *expect(struct rdma_event_channel *ch, enum rdma_cm_event_type type,
				    struct rdma_cm_id **id)
{
	struct rdma_cm_event *ev;
	CHECK(rdma_get_cm_event(ch, &ev) == 0);
	if (ev->event != type)
		FAIL("event %s (status %d), expected %s", rdma_event_str(ev->event), ev->status,
		     rdma_event_str(type));
	if (id)
		*id = ev->id;
	return ev;
}

static void make_qp(struct rdma_cm_id *id)
{
	struct ibv_qp_init_attr qa = {.qp_type = IBV_QPT_RC,
				      .cap = {.max_send_wr = 4, .max_recv_wr = 4,
					      .max_send_sge = 1, .max_recv_sge = 1}};
	CHECK(rdma_create_qp(id, NULL, &qa) == 0);
}

// A listener on a free port of ADDR, and a client connected to it; both
// ids of the connection in *srv and *cli, ESTABLISHED.
static struct rdma_cm_id *connect_pair(struct rdma_event_channel *ch, struct rdma_cm_id **srv,
				       struct rdma_cm_id **cli)
{
	struct rdma_cm_id *l, *c, *s;
	CHECK(rdma_create_id(ch, &l, NULL, RDMA_PS_TCP) == 0);
	struct sockaddr_in sa = {.sin_family = AF_INET};
	CHECK(inet_pton(AF_INET, addr, &sa.sin_addr) == 1);
	CHECK(rdma_bind_addr(l, (struct sockaddr *)&sa) == 0);
	CHECK(rdma_listen(l, 4) == 0);
	sa.sin_port = rdma_get_src_port(l);
	CHECK(rdma_create_id(ch, &c, NULL, RDMA_PS_TCP) == 0);
	CHECK(rdma_resolve_addr(c, NULL, (struct sockaddr *)&sa, 2000) == 0);
	rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_ADDR_RESOLVED, NULL));
	CHECK(rdma_resolve_route(c, 2000) == 0);
	rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_ROUTE_RESOLVED, NULL));
	make_qp(c);
	struct rdma_conn_param cp = {.initiator_depth = 1, .responder_resources = 1,
				     .retry_count = 7, .rnr_retry_count = 7};
	CHECK(rdma_connect(c, &cp) == 0);
	rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_CONNECT_REQUEST, &s));
	make_qp(s);
	CHECK(rdma_accept(s, &cp) == 0);
	for (int i = 0; i < 2; i++)
		rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_ESTABLISHED, NULL));
	*srv = s;
	*cli = c;
	return l;
}

// One SEND from a to b, its 64 bytes checked against a pattern of seed.
static void message(struct rdma_cm_id *a, struct rdma_cm_id *b, int seed, const char *what)
{
	unsigned char *sb = malloc(64), *rb = calloc(1, 64);
	CHECK(sb && rb);
	for (int i = 0; i < 64; i++)
		sb[i] = (unsigned char)(seed * 31 + i);
	struct ibv_mr *sm = ibv_reg_mr(a->pd, sb, 64, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_mr *rm = ibv_reg_mr(b->pd, rb, 64, IBV_ACCESS_LOCAL_WRITE);
	CHECK(sm && rm);
	struct ibv_sge rs = {(uintptr_t)rb, 64, rm->lkey};
	struct ibv_recv_wr rw = {.wr_id = 2, .sg_list = &rs, .num_sge = 1}, *rbad;
	CHECK(ibv_post_recv(b->qp, &rw, &rbad) == 0);
	struct ibv_sge ss = {(uintptr_t)sb, 64, sm->lkey};
	struct ibv_send_wr sw = {.wr_id = 1, .sg_list = &ss, .num_sge = 1,
				 .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED}, *sbad;
	CHECK(ibv_post_send(a->qp, &sw, &sbad) == 0);
	struct ibv_wc wc = svt_wait(a->send_cq, what);
	if (wc.status != IBV_WC_SUCCESS || wc.wr_id != 1)
		FAIL("%s: the SEND completed %s", what, ibv_wc_status_str(wc.status));
	wc = svt_wait(b->recv_cq, what);
	if (wc.status != IBV_WC_SUCCESS || wc.wr_id != 2 || wc.byte_len != 64)
		FAIL("%s: the receive completed %s, %u bytes", what, ibv_wc_status_str(wc.status),
		     wc.byte_len);
	if (memcmp(sb, rb, 64))
		FAIL("%s: the bytes differ", what);
	CHECK(ibv_dereg_mr(sm) == 0);
	CHECK(ibv_dereg_mr(rm) == 0);
	free(sb);
	free(rb);
}

static void disconnect_pair(struct rdma_event_channel *ch, struct rdma_cm_id *l,
			    struct rdma_cm_id *s, struct rdma_cm_id *c)
{
	CHECK(rdma_disconnect(c) == 0);
	for (int i = 0; i < 2; i++)
		rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_DISCONNECTED, NULL));
	rdma_destroy_qp(s);
	rdma_destroy_qp(c);
	CHECK(rdma_destroy_id(s) == 0);
	CHECK(rdma_destroy_id(c) == 0);
	CHECK(rdma_destroy_id(l) == 0);
}

int main(int argc, char **argv)
{
	if (argc != 2)
		FAIL("usage: sv_cm_fork ADDR");
	alarm(60);
	snprintf(addr, sizeof(addr), "%s", argv[1]);
	struct rdma_event_channel *ch = rdma_create_event_channel();
	CHECK(ch);
	struct rdma_cm_id *l, *s, *c;
	l = connect_pair(ch, &s, &c);
	message(c, s, 1, "the parent's connection before the fork");

	pid_t pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		alarm(30);
		// The inherited ids: the parent's.
		struct rdma_conn_param cp = {.initiator_depth = 1, .responder_resources = 1};
		errno = 0;
		if (rdma_connect(c, &cp) != -1 || errno != EINVAL)
			FAIL("child: rdma_connect on the parent's id: errno %d, not EINVAL", errno);
		errno = 0;
		if (rdma_disconnect(s) != -1 || errno != EINVAL)
			FAIL("child: rdma_disconnect on the parent's id: errno %d, not EINVAL", errno);
		struct ibv_qp_init_attr qa = {.qp_type = IBV_QPT_RC,
					      .cap = {.max_send_wr = 1, .max_recv_wr = 1,
						      .max_send_sge = 1, .max_recv_sge = 1}};
		errno = 0;
		if (rdma_create_qp(l, NULL, &qa) != -1 || errno != EINVAL)
			FAIL("child: rdma_create_qp on the parent's id: errno %d, not EINVAL", errno);
		/* Forgets the parent's QPs, which stay the parent's. */
		rdma_destroy_qp(c);
		rdma_destroy_qp(s);
		CHECK(!c->qp && !s->qp);
		// Its own channel, ids and connection.
		struct rdma_event_channel *mine = rdma_create_event_channel();
		CHECK(mine);
		struct rdma_cm_id *l2, *s2, *c2;
		l2 = connect_pair(mine, &s2, &c2);
		message(c2, s2, 2, "the child's connection");
		message(s2, c2, 3, "the child's connection, back");
		disconnect_pair(mine, l2, s2, c2);
		rdma_destroy_event_channel(mine);
		// The parent's ids go without a word to the parent's peer.
		CHECK(rdma_destroy_id(c) == 0);
		CHECK(rdma_destroy_id(s) == 0);
		CHECK(rdma_destroy_id(l) == 0);
		printf("OK child\n");
		fflush(stdout);
		_exit(0);
	}
	int status = 0;
	CHECK(waitpid(pid, &status, 0) == pid);
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
		FAIL("the child failed (status %#x)", status);
	message(c, s, 4, "the parent's connection after the child");
	message(s, c, 5, "the parent's connection after the child, back");
	disconnect_pair(ch, l, s, c);
	rdma_destroy_event_channel(ch);
	printf("OK sv_cm_fork\n");
	return 0;
}
