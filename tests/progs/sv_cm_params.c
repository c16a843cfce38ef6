// SPDX-License-Identifier: MIT
// rdma_cm's QP attributes from the other side's answer, in one process
// (pyverbs-tests/test_rdmacm.py):
//   - the active side asks for initiator depth 3 and responder resources 5,
//     the passive side accepts with responder resources 2 and initiator
//     depth 1: once ESTABLISHED, the active QP has max_rd_atomic 2 (what
//     the responder takes) and max_dest_rd_atomic 1 (what it sends), as the
//     IB CM sets them from the REP, and both QPs' min_rnr_timer is the IB
//     CM's 0;
//   - the parameters as rdma-core's ucma_valid_param checks them on an
//     RDMA_PS_TCP id: a depth above the device's maximum is EINVAL on
//     rdma_connect and on rdma_accept (the id still usable), 0xFF is the
//     maximum; rdma_connect without parameters offers the maximum, and
//     rdma_accept without them (or with 0xFF) takes what the REQ offered;
//   - ids without a QP: rdma_connect and rdma_accept need parameters, and
//     their qp_num 0 goes out as given (EINVAL before), as rdma-core;
//   - the active side disconnecting before the passive side accepts: its
//     DISCONNECTED, the late accept's UNREACHABLE, nothing on stderr;
//   - a connect the passive side rejects, and one to a port with no
//     listener: REJECTED, and the active QP is in ERR with its posted
//     receive completed flushed, as rdma-core's rdma_get_cm_event does.
//
//   sv_cm_params ADDR
//
// Prints "OK sv_cm_params" when every check held; else a FAIL line, exit 1.
#include <rdma/rdma_cma.h>

#include "svt.h"

#include <arpa/inet.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static struct rdma_event_channel *ch;
static char addr[64];

static struct rdma_cm_event *expect(enum rdma_cm_event_type type, struct rdma_cm_id **id)
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

// A client id to port (network order), its route resolved.
static struct rdma_cm_id *resolved(uint16_t port)
{
	struct rdma_cm_id *c;
	CHECK(rdma_create_id(ch, &c, NULL, RDMA_PS_TCP) == 0);
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = port};
	CHECK(inet_pton(AF_INET, addr, &sa.sin_addr) == 1);
	CHECK(rdma_resolve_addr(c, NULL, (struct sockaddr *)&sa, 2000) == 0);
	rdma_ack_cm_event(expect(RDMA_CM_EVENT_ADDR_RESOLVED, NULL));
	CHECK(rdma_resolve_route(c, 2000) == 0);
	rdma_ack_cm_event(expect(RDMA_CM_EVENT_ROUTE_RESOLVED, NULL));
	return c;
}

// The passive side of the synchronous connect below, on the listener's
// channel: accepts without a QP, then waits for ESTABLISHED and
// DISCONNECTED.  Its verdict in *arg (0: as it should be).
static void *accept_no_qp(void *arg)
{
	struct rdma_cm_event *ev;
	struct rdma_cm_id *s;
	int *bad = arg;
	*bad = 1;
	if (rdma_get_cm_event(ch, &ev) || ev->event != RDMA_CM_EVENT_CONNECT_REQUEST)
		return NULL;
	s = ev->id;
	rdma_ack_cm_event(ev);
	struct rdma_conn_param zero = {.responder_resources = 1, .initiator_depth = 1};
	if (rdma_accept(s, &zero))
		return NULL;
	if (rdma_get_cm_event(ch, &ev) || ev->event != RDMA_CM_EVENT_ESTABLISHED)
		return NULL;
	rdma_ack_cm_event(ev);
	if (rdma_get_cm_event(ch, &ev) || ev->event != RDMA_CM_EVENT_DISCONNECTED)
		return NULL;
	rdma_ack_cm_event(ev);
	*bad = rdma_destroy_id(s) != 0;
	return NULL;
}

// A resolved client id with a QP of its own CQ, to port (network order).
static struct rdma_cm_id *client(uint16_t port, struct ibv_cq **cqp)
{
	struct rdma_cm_id *c = resolved(port);
	struct ibv_cq *cq = ibv_create_cq(c->verbs, 16, NULL, NULL, 0);
	CHECK(cq);
	struct ibv_qp_init_attr qa = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
				      .cap = {.max_send_wr = 4, .max_recv_wr = 4,
					      .max_send_sge = 1, .max_recv_sge = 1}};
	CHECK(rdma_create_qp(c, NULL, &qa) == 0);
	*cqp = cq;
	return c;
}

static void rejected_qp_flushed(struct rdma_cm_id *c, struct ibv_cq *cq, const char *how)
{
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr ia;
	CHECK(ibv_query_qp(c->qp, &a, IBV_QP_STATE, &ia) == 0);
	if (a.qp_state != IBV_QPS_ERR)
		FAIL("%s: the active QP is in state %d after REJECTED, not ERR", how, a.qp_state);
	struct ibv_wc wc;
	int n = 0;
	for (int i = 0; i < 2000 && !n; i++) {
		n = ibv_poll_cq(cq, 1, &wc);
		if (!n)
			usleep(1000);
	}
	if (n != 1 || wc.wr_id != 42 || wc.status != IBV_WC_WR_FLUSH_ERR)
		FAIL("%s: the posted receive did not complete flushed", how);
}

// The passive side's QP, with CQs rdma_create_qp makes (it writes them into
// the attributes it is given: a fresh set each time).
static int passive_qp(struct rdma_cm_id *s)
{
	struct ibv_qp_init_attr qa = {.qp_type = IBV_QPT_RC,
				      .cap = {.max_send_wr = 4, .max_recv_wr = 4,
					      .max_send_sge = 1, .max_recv_sge = 1}};
	return rdma_create_qp(s, NULL, &qa);
}

static void post_one_recv(struct rdma_cm_id *c, struct ibv_mr *mr)
{
	struct ibv_sge s = {(uintptr_t)mr->addr, 64, mr->lkey};
	struct ibv_recv_wr w = {.wr_id = 42, .sg_list = &s, .num_sge = 1}, *bad;
	CHECK(ibv_post_recv(c->qp, &w, &bad) == 0);
}

int main(int argc, char **argv)
{
	if (argc != 2 && argc != 3)
		FAIL("usage: sv_cm_params ADDR [ACK_TIMEOUT]");
	/* The QPs' local ACK timeout the kernel's CM would give on this link
	 * (16 on InfiniBand with our path's lifetime 14, 17 on RoCE). */
	int want_timeout = argc == 3 ? atoi(argv[2]) : -1;
	alarm(60);
	snprintf(addr, sizeof(addr), "%s", argv[1]);
	ch = rdma_create_event_channel();
	CHECK(ch);
	struct rdma_cm_id *l;
	CHECK(rdma_create_id(ch, &l, NULL, RDMA_PS_TCP) == 0);
	struct sockaddr_in sa = {.sin_family = AF_INET};
	CHECK(inet_pton(AF_INET, addr, &sa.sin_addr) == 1);
	CHECK(rdma_bind_addr(l, (struct sockaddr *)&sa) == 0);
	CHECK(rdma_listen(l, 4) == 0);
	uint16_t port = rdma_get_src_port(l);

	// The depths.
	struct ibv_cq *cq;
	struct rdma_cm_id *c = client(port, &cq);
	struct rdma_conn_param cp = {.initiator_depth = 3, .responder_resources = 5,
				     .retry_count = 7, .rnr_retry_count = 7};
	CHECK(rdma_connect(c, &cp) == 0);
	struct rdma_cm_id *s;
	struct rdma_cm_event *ev = expect(RDMA_CM_EVENT_CONNECT_REQUEST, &s);
	// Seen from the passive side: the active's depth is its resources.
	if (ev->param.conn.responder_resources != 3 || ev->param.conn.initiator_depth != 5)
		FAIL("the request carries %u/%u, not 3/5", ev->param.conn.responder_resources,
		     ev->param.conn.initiator_depth);
	rdma_ack_cm_event(ev);
	CHECK(passive_qp(s) == 0);
	struct rdma_conn_param ap = {.responder_resources = 2, .initiator_depth = 1};
	CHECK(rdma_accept(s, &ap) == 0);
	int established = 0;
	while (established < 2) {
		struct rdma_cm_id *who;
		ev = expect(RDMA_CM_EVENT_ESTABLISHED, &who);
		if (who == c && (ev->param.conn.responder_resources != 1 ||
				 ev->param.conn.initiator_depth != 2))
			FAIL("the active side's ESTABLISHED says %u/%u, not 1/2",
			     ev->param.conn.responder_resources, ev->param.conn.initiator_depth);
		rdma_ack_cm_event(ev);
		established++;
	}
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr ia;
	if (want_timeout >= 0) {
		CHECK(ibv_query_qp(c->qp, &a, IBV_QP_TIMEOUT, &ia) == 0);
		if (a.timeout != want_timeout)
			FAIL("the active QP's ACK timeout is %u, not %d", a.timeout, want_timeout);
		CHECK(ibv_query_qp(s->qp, &a, IBV_QP_TIMEOUT, &ia) == 0);
		if (a.timeout != want_timeout)
			FAIL("the passive QP's ACK timeout is %u, not %d", a.timeout, want_timeout);
	}
	CHECK(ibv_query_qp(c->qp, &a, IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_MAX_DEST_RD_ATOMIC, &ia) == 0);
	if (a.max_rd_atomic != 2 || a.max_dest_rd_atomic != 1)
		FAIL("the active QP has max_rd_atomic %u, max_dest_rd_atomic %u; the REP said 2, 1",
		     a.max_rd_atomic, a.max_dest_rd_atomic);
	CHECK(ibv_query_qp(s->qp, &a, IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_MAX_DEST_RD_ATOMIC, &ia) == 0);
	if (a.max_rd_atomic != 1 || a.max_dest_rd_atomic != 2)
		FAIL("the passive QP has max_rd_atomic %u, max_dest_rd_atomic %u; it accepted 1, 2",
		     a.max_rd_atomic, a.max_dest_rd_atomic);
	// The IB CM's RNR timer for both responders: 0, the longest (655.36
	// ms, cm_init_qp_rtr_attr), so a finite RNR retry count outlasts a
	// receive posted late.
	struct rdma_cm_id *both[2] = {c, s};
	for (int i = 0; i < 2; i++) {
		CHECK(ibv_query_qp(both[i]->qp, &a, IBV_QP_MIN_RNR_TIMER, &ia) == 0);
		if (a.min_rnr_timer != 0)
			FAIL("the %s QP's min_rnr_timer is %u, not the IB CM's 0",
			     i ? "passive" : "active", a.min_rnr_timer);
	}
	CHECK(rdma_disconnect(c) == 0);
	for (int i = 0; i < 2; i++)
		rdma_ack_cm_event(expect(RDMA_CM_EVENT_DISCONNECTED, NULL));
	rdma_destroy_qp(s);
	rdma_destroy_qp(c);
	CHECK(rdma_destroy_id(s) == 0);
	CHECK(rdma_destroy_id(c) == 0);
	CHECK(ibv_destroy_cq(cq) == 0);

	// The parameters' checks and defaults.
	struct ibv_device_attr da;
	c = client(port, &cq);
	CHECK(ibv_query_device(c->verbs, &da) == 0);
	CHECK(da.max_qp_init_rd_atom < 0xfe && da.max_qp_rd_atom < 0xfe);
	uint8_t max_init = (uint8_t)da.max_qp_init_rd_atom, max_resp = (uint8_t)da.max_qp_rd_atom;
	struct rdma_conn_param over = {.initiator_depth = max_init + 1, .responder_resources = 1};
	errno = 0;
	if (rdma_connect(c, &over) != -1 || errno != EINVAL)
		FAIL("rdma_connect with initiator depth %u (max %u): errno %d, not EINVAL",
		     over.initiator_depth, max_init, errno);
	over = (struct rdma_conn_param){.initiator_depth = 1, .responder_resources = max_resp + 1};
	errno = 0;
	if (rdma_connect(c, &over) != -1 || errno != EINVAL)
		FAIL("rdma_connect with responder resources %u (max %u): errno %d, not EINVAL",
		     over.responder_resources, max_resp, errno);
	CHECK(rdma_connect(c, NULL) == 0);
	ev = expect(RDMA_CM_EVENT_CONNECT_REQUEST, &s);
	if (ev->param.conn.responder_resources != max_init ||
	    ev->param.conn.initiator_depth != max_resp)
		FAIL("rdma_connect(NULL) offered %u/%u, not the maximum %u/%u",
		     ev->param.conn.responder_resources, ev->param.conn.initiator_depth, max_init,
		     max_resp);
	rdma_ack_cm_event(ev);
	CHECK(passive_qp(s) == 0);
	over = (struct rdma_conn_param){.responder_resources = max_resp + 1, .initiator_depth = 1};
	errno = 0;
	if (rdma_accept(s, &over) != -1 || errno != EINVAL)
		FAIL("rdma_accept with responder resources %u (max %u): errno %d, not EINVAL",
		     over.responder_resources, max_resp, errno);
	// 0xFF: the maximum, within what the REQ offered (all of it here).
	ap = (struct rdma_conn_param){.responder_resources = RDMA_MAX_RESP_RES, .initiator_depth = 2};
	CHECK(rdma_accept(s, &ap) == 0);
	for (int i = 0; i < 2; i++)
		rdma_ack_cm_event(expect(RDMA_CM_EVENT_ESTABLISHED, NULL));
	CHECK(ibv_query_qp(s->qp, &a, IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_MAX_DEST_RD_ATOMIC, &ia) == 0);
	if (a.max_rd_atomic != 2 || a.max_dest_rd_atomic != max_resp)
		FAIL("accepted with 0xFF/2: the passive QP has max_dest_rd_atomic %u, max_rd_atomic "
		     "%u; expected %u, 2", a.max_dest_rd_atomic, a.max_rd_atomic, max_resp);
	CHECK(rdma_disconnect(c) == 0);
	for (int i = 0; i < 2; i++)
		rdma_ack_cm_event(expect(RDMA_CM_EVENT_DISCONNECTED, NULL));
	rdma_destroy_qp(s);
	rdma_destroy_qp(c);
	CHECK(rdma_destroy_id(s) == 0);
	CHECK(rdma_destroy_id(c) == 0);
	CHECK(ibv_destroy_cq(cq) == 0);
	// rdma_accept(NULL): what the REQ offered (3/5 asked by cp).
	c = client(port, &cq);
	CHECK(rdma_connect(c, &cp) == 0);
	rdma_ack_cm_event(expect(RDMA_CM_EVENT_CONNECT_REQUEST, &s));
	CHECK(passive_qp(s) == 0);
	CHECK(rdma_accept(s, NULL) == 0);
	for (int i = 0; i < 2; i++)
		rdma_ack_cm_event(expect(RDMA_CM_EVENT_ESTABLISHED, NULL));
	CHECK(ibv_query_qp(s->qp, &a, IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_MAX_DEST_RD_ATOMIC, &ia) == 0);
	if (a.max_dest_rd_atomic != 3 || a.max_rd_atomic != 5)
		FAIL("rdma_accept(NULL) of a REQ offering 3/5: the passive QP has max_dest_rd_atomic "
		     "%u, max_rd_atomic %u", a.max_dest_rd_atomic, a.max_rd_atomic);
	CHECK(ibv_query_qp(c->qp, &a, IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_MAX_DEST_RD_ATOMIC, &ia) == 0);
	if (a.max_rd_atomic != 3 || a.max_dest_rd_atomic != 5)
		FAIL("rdma_accept(NULL) of a REQ offering 3/5: the active QP has max_rd_atomic %u, "
		     "max_dest_rd_atomic %u", a.max_rd_atomic, a.max_dest_rd_atomic);
	CHECK(rdma_disconnect(c) == 0);
	for (int i = 0; i < 2; i++)
		rdma_ack_cm_event(expect(RDMA_CM_EVENT_DISCONNECTED, NULL));
	rdma_destroy_qp(s);
	rdma_destroy_qp(c);
	CHECK(rdma_destroy_id(s) == 0);
	CHECK(rdma_destroy_id(c) == 0);
	CHECK(ibv_destroy_cq(cq) == 0);

	// A rejected connect: its QP goes to ERR, its receive flushes.
	c = client(port, &cq);
	void *buf = calloc(1, 4096);
	struct ibv_mr *mr = ibv_reg_mr(c->pd, buf, 4096, IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr);
	post_one_recv(c, mr);
	CHECK(rdma_connect(c, &cp) == 0);
	rdma_ack_cm_event(expect(RDMA_CM_EVENT_CONNECT_REQUEST, &s));
	CHECK(rdma_reject(s, "no", 2) == 0);
	ev = expect(RDMA_CM_EVENT_REJECTED, NULL);
	rdma_ack_cm_event(ev);
	rejected_qp_flushed(c, cq, "a consumer reject");
	CHECK(rdma_destroy_id(s) == 0);
	CHECK(ibv_dereg_mr(mr) == 0);
	rdma_destroy_qp(c);
	CHECK(rdma_destroy_id(c) == 0);
	CHECK(ibv_destroy_cq(cq) == 0);

	// The active side disconnects before the passive side accepts: a race
	// the protocol allows.  The active side has its DISCONNECTED, the
	// passive side's accept comes to UNREACHABLE, and nobody prints a word
	// (the pytest looks at stderr: an "unexpected CM message" came out).
	c = client(port, &cq);
	CHECK(rdma_connect(c, &cp) == 0);
	rdma_ack_cm_event(expect(RDMA_CM_EVENT_CONNECT_REQUEST, &s));
	CHECK(rdma_disconnect(c) == 0);
	struct rdma_cm_id *who;
	ev = expect(RDMA_CM_EVENT_DISCONNECTED, &who);
	if (who != c)
		FAIL("DISCONNECTED for the passive id of a connection it never accepted");
	rdma_ack_cm_event(ev);
	usleep(100000);
	CHECK(passive_qp(s) == 0);
	struct rdma_conn_param late = {.responder_resources = 1, .initiator_depth = 1};
	CHECK(rdma_accept(s, &late) == 0);
	ev = expect(RDMA_CM_EVENT_UNREACHABLE, &who);
	if (who != s)
		FAIL("UNREACHABLE for the active id, not the passive one that accepted late");
	rdma_ack_cm_event(ev);
	rdma_destroy_qp(s);
	CHECK(rdma_destroy_id(s) == 0);
	rdma_destroy_qp(c);
	CHECK(rdma_destroy_id(c) == 0);
	CHECK(ibv_destroy_cq(cq) == 0);

	// Ids without a QP (the application's QPs are its own business):
	// rdma-core's ucma_valid_param asks for parameters then, not for a QP
	// number in them; qp_num 0 goes out as it is (it was EINVAL here).
	c = resolved(port);
	errno = 0;
	if (rdma_connect(c, NULL) != -1 || errno != EINVAL)
		FAIL("rdma_connect of an id without a QP or parameters: not EINVAL (errno %d)",
		     errno);
	struct rdma_conn_param zero = {.responder_resources = 1, .initiator_depth = 1};
	CHECK(rdma_connect(c, &zero) == 0);
	ev = expect(RDMA_CM_EVENT_CONNECT_REQUEST, &s);
	if (ev->param.conn.qp_num != 0)
		FAIL("the REQ of qp_num 0 arrived naming QP %u", ev->param.conn.qp_num);
	rdma_ack_cm_event(ev);
	errno = 0;
	if (rdma_accept(s, NULL) != -1 || errno != EINVAL)
		FAIL("rdma_accept of an id without a QP or parameters: not EINVAL (errno %d)",
		     errno);
	CHECK(rdma_accept(s, &zero) == 0);
	// Without a QP the active side has CONNECT_RESPONSE, and its
	// rdma_establish gives the passive side ESTABLISHED.
	ev = expect(RDMA_CM_EVENT_CONNECT_RESPONSE, &who);
	if (who != c)
		FAIL("CONNECT_RESPONSE for the passive id");
	rdma_ack_cm_event(ev);
	CHECK(rdma_establish(c) == 0);
	ev = expect(RDMA_CM_EVENT_ESTABLISHED, &who);
	if (who != s)
		FAIL("ESTABLISHED for the active id after its rdma_establish");
	rdma_ack_cm_event(ev);
	CHECK(rdma_disconnect(c) == 0);
	for (int i = 0; i < 2; i++)
		rdma_ack_cm_event(expect(RDMA_CM_EVENT_DISCONNECTED, NULL));
	CHECK(rdma_destroy_id(s) == 0);
	CHECK(rdma_destroy_id(c) == 0);

	// The same through a synchronous id (no channel): its rdma_connect
	// returns 0 once CONNECT_RESPONSE came, with id->event that event, as
	// rdma-core's ucma_complete answers (it was EINVAL, "not ESTABLISHED";
	// a review's probe).
	{
		pthread_t t;
		int bad = 1;
		CHECK(pthread_create(&t, NULL, accept_no_qp, &bad) == 0);
		struct rdma_cm_id *sc;
		CHECK(rdma_create_id(NULL, &sc, NULL, RDMA_PS_TCP) == 0);
		struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = port};
		CHECK(inet_pton(AF_INET, addr, &sa.sin_addr) == 1);
		CHECK(rdma_resolve_addr(sc, NULL, (struct sockaddr *)&sa, 2000) == 0);
		CHECK(rdma_resolve_route(sc, 2000) == 0);
		if (rdma_connect(sc, &zero))
			FAIL("synchronous rdma_connect without a QP: errno %d", errno);
		if (!sc->event || sc->event->event != RDMA_CM_EVENT_CONNECT_RESPONSE)
			FAIL("synchronous rdma_connect without a QP: id->event %s",
			     sc->event ? rdma_event_str(sc->event->event) : "none");
		CHECK(rdma_establish(sc) == 0);
		CHECK(rdma_disconnect(sc) == 0);
		CHECK(pthread_join(t, NULL) == 0);
		if (bad)
			FAIL("the passive side of the synchronous connect without a QP");
		CHECK(rdma_destroy_id(sc) == 0);
	}

	// No listener on the port.
	CHECK(rdma_destroy_id(l) == 0);
	c = client(port, &cq);
	mr = ibv_reg_mr(c->pd, buf, 4096, IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr);
	post_one_recv(c, mr);
	CHECK(rdma_connect(c, &cp) == 0);
	rdma_ack_cm_event(expect(RDMA_CM_EVENT_REJECTED, NULL));
	rejected_qp_flushed(c, cq, "no listener");
	CHECK(ibv_dereg_mr(mr) == 0);
	rdma_destroy_qp(c);
	CHECK(rdma_destroy_id(c) == 0);
	CHECK(ibv_destroy_cq(cq) == 0);
	free(buf);
	rdma_destroy_event_channel(ch);
	printf("OK sv_cm_params\n");
	return 0;
}
