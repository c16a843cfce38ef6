// SPDX-License-Identifier: MIT
// rdma_cm messages and events that come late or out of the usual order, in
// one process (pyverbs-tests/test_rdmacm.py); each case was found by a
// helper's probe:
//   notify     the passive side calls rdma_notify(IBV_EVENT_COMM_EST) right
//              after rdma_accept, as an application passing the QP's
//              COMM_EST on does: one ESTABLISHED each side, and the RTU that
//              comes after is dropped (the kernel's cm_establish); it tore
//              the connection down ("unexpected CM message type 3");
//   response   the REP arrived, but the connection went (the active side's
//              own rdma_disconnect, or the passive side's) before the
//              application read the response: an active id with a QP gets
//              CONNECT_ERROR, never the raw CONNECT_RESPONSE, which
//              rdma-core never hands out for an id with a QP;
//   rtu        the passive side disconnects while the RTU is on its way:
//              it still sees one ESTABLISHED (as the kernel's CM delivers
//              it) and one DISCONNECTED, in every round; the late RTU was
//              taken as a protocol error and its ESTABLISHED lost;
//   peek       rrecvmsg(MSG_PEEK) into two iovecs over two messages: the
//              bytes in order (the second iovec skipped the rest of the
//              first message).
//
//   sv_cm_late SCENARIO ADDR
//
// Prints "OK sv_cm_late SCENARIO" when every check held; else FAIL, exit 1.
#include <rdma/rdma_cma.h>
#include <rdma/rsocket.h>

#include "svt.h"

#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static struct rdma_event_channel *ch;
static char addr[64];
static uint16_t port; // The listener's, network order

// The next event within ms, or NULL.
static struct rdma_cm_event *next_event(int ms)
{
	struct pollfd p = {.fd = ch->fd, .events = POLLIN};
	if (poll(&p, 1, ms) <= 0)
		return NULL;
	struct rdma_cm_event *ev;
	CHECK(rdma_get_cm_event(ch, &ev) == 0);
	return ev;
}

static struct rdma_cm_event *expect(enum rdma_cm_event_type type, struct rdma_cm_id **id)
{
	struct rdma_cm_event *ev = next_event(5000);
	if (!ev)
		FAIL("no event in 5 s, expected %s", rdma_event_str(type));
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

// A client id with a QP, connecting; *s the passive id it made, accepted.
static struct rdma_cm_id *connect_pair(struct rdma_cm_id **s)
{
	struct rdma_cm_id *c;
	CHECK(rdma_create_id(ch, &c, NULL, RDMA_PS_TCP) == 0);
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = port};
	CHECK(inet_pton(AF_INET, addr, &sa.sin_addr) == 1);
	CHECK(rdma_resolve_addr(c, NULL, (struct sockaddr *)&sa, 2000) == 0);
	rdma_ack_cm_event(expect(RDMA_CM_EVENT_ADDR_RESOLVED, NULL));
	CHECK(rdma_resolve_route(c, 2000) == 0);
	rdma_ack_cm_event(expect(RDMA_CM_EVENT_ROUTE_RESOLVED, NULL));
	make_qp(c);
	struct rdma_conn_param cp = {.initiator_depth = 1, .responder_resources = 1,
				     .retry_count = 7, .rnr_retry_count = 7};
	CHECK(rdma_connect(c, &cp) == 0);
	rdma_ack_cm_event(expect(RDMA_CM_EVENT_CONNECT_REQUEST, s));
	make_qp(*s);
	struct rdma_conn_param ap = {.initiator_depth = 1, .responder_resources = 1};
	CHECK(rdma_accept(*s, &ap) == 0);
	return c;
}

static void drop_pair(struct rdma_cm_id *c, struct rdma_cm_id *s)
{
	rdma_destroy_qp(c);
	rdma_destroy_qp(s);
	CHECK(rdma_destroy_id(c) == 0);
	CHECK(rdma_destroy_id(s) == 0);
}

// Events until none comes for ms: counts of ESTABLISHED, DISCONNECTED and
// anything else for the ids c and s; CONNECT_RESPONSE fails at once.
struct tally {
	int est[2], disc[2], err[2], other[2];
};

static void collect(struct rdma_cm_id *c, struct rdma_cm_id *s, struct tally *t, int ms)
{
	struct rdma_cm_event *ev;
	while ((ev = next_event(ms))) {
		int i = ev->id == c ? 0 : ev->id == s ? 1 : -1;
		if (i < 0)
			FAIL("event %s for an id of neither side", rdma_event_str(ev->event));
		if (ev->event == RDMA_CM_EVENT_CONNECT_RESPONSE)
			FAIL("the %s side got the raw CONNECT_RESPONSE though its id has a QP",
			     i ? "passive" : "active");
		if (ev->event == RDMA_CM_EVENT_ESTABLISHED)
			t->est[i]++;
		else if (ev->event == RDMA_CM_EVENT_DISCONNECTED)
			t->disc[i]++;
		else if (ev->event == RDMA_CM_EVENT_CONNECT_ERROR)
			t->err[i]++;
		else if (ev->event != RDMA_CM_EVENT_TIMEWAIT_EXIT)
			t->other[i]++;
		rdma_ack_cm_event(ev);
	}
}

static void sc_notify(void)
{
	struct rdma_cm_id *s, *c = connect_pair(&s);
	CHECK(rdma_notify(s, IBV_EVENT_COMM_EST) == 0);
	struct tally t = {0};
	collect(c, s, &t, 500); // The RTU comes and goes meanwhile
	if (t.est[0] != 1 || t.est[1] != 1 || t.disc[0] || t.disc[1] || t.err[0] || t.err[1] ||
	    t.other[0] || t.other[1])
		FAIL("after rdma_notify: ESTABLISHED %d/%d, DISCONNECTED %d/%d, CONNECT_ERROR "
		     "%d/%d, other %d/%d (active/passive); expected one ESTABLISHED each",
		     t.est[0], t.est[1], t.disc[0], t.disc[1], t.err[0], t.err[1], t.other[0],
		     t.other[1]);
	// The connection works: a SEND, its bytes checked.
	static char buf[2][64];
	struct ibv_mr *rm = ibv_reg_mr(s->pd, buf[1], 64, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_mr *sm = ibv_reg_mr(c->pd, buf[0], 64, IBV_ACCESS_LOCAL_WRITE);
	CHECK(rm && sm);
	svt_fill(buf[0], 64, 7);
	struct ibv_sge rs = {(uintptr_t)buf[1], 64, rm->lkey}, ss = {(uintptr_t)buf[0], 64, sm->lkey};
	struct ibv_recv_wr rw = {.wr_id = 1, .sg_list = &rs, .num_sge = 1}, *rbad;
	CHECK(ibv_post_recv(s->qp, &rw, &rbad) == 0);
	struct ibv_send_wr sw = {.wr_id = 2, .sg_list = &ss, .num_sge = 1, .opcode = IBV_WR_SEND,
				 .send_flags = IBV_SEND_SIGNALED}, *sbad;
	CHECK(ibv_post_send(c->qp, &sw, &sbad) == 0);
	CHECK_WC(svt_wait(c->send_cq, "SEND"), IBV_WC_SUCCESS);
	CHECK_WC(svt_wait(s->recv_cq, "receive"), IBV_WC_SUCCESS);
	CHECK(memcmp(buf[0], buf[1], 64) == 0);
	CHECK(rdma_disconnect(c) == 0);
	memset(&t, 0, sizeof(t));
	collect(c, s, &t, 300);
	if (t.disc[0] != 1 || t.disc[1] != 1)
		FAIL("DISCONNECTED %d/%d after rdma_disconnect", t.disc[0], t.disc[1]);
	CHECK(ibv_dereg_mr(rm) == 0 && ibv_dereg_mr(sm) == 0);
	drop_pair(c, s);
}

static void sc_response(void)
{
	for (int round = 0; round < 2; round++) {
		struct rdma_cm_id *s, *c = connect_pair(&s);
		usleep(100000); // The REP arrives; its event waits unread
		CHECK(rdma_disconnect(round ? s : c) == 0);
		usleep(100000); // The passive side's DREQ arrives, before the read
		struct tally t = {0};
		collect(c, s, &t, 500);
		if (t.err[0] != 1 || t.est[0])
			FAIL("%s disconnected before the response was read: the active side saw "
			     "CONNECT_ERROR %d, ESTABLISHED %d; expected one CONNECT_ERROR",
			     round ? "the passive side" : "the active side", t.err[0], t.est[0]);
		drop_pair(c, s);
	}
}

static void sc_rtu(void)
{
	for (int round = 0; round < 40; round++) {
		struct rdma_cm_id *s, *c = connect_pair(&s);
		// The active side's response read: its RTU goes out now.
		struct rdma_cm_event *ev = expect(RDMA_CM_EVENT_ESTABLISHED, NULL);
		if (ev->id != c)
			FAIL("ESTABLISHED for the passive side before the active side's");
		rdma_ack_cm_event(ev);
		CHECK(rdma_disconnect(s) == 0); // Before or after the RTU lands
		struct tally t = {0};
		collect(c, s, &t, 300);
		if (t.est[1] != 1 || t.disc[1] != 1 || t.disc[0] != 1 || t.err[0] || t.err[1])
			FAIL("round %d: the passive side saw ESTABLISHED %d, DISCONNECTED %d; the "
			     "active DISCONNECTED %d; CONNECT_ERROR %d/%d",
			     round, t.est[1], t.disc[1], t.disc[0], t.err[0], t.err[1]);
		drop_pair(c, s);
	}
}

static void sc_peek(void)
{
	int l = rsocket(AF_INET, SOCK_STREAM, 0);
	CHECK(l >= 0);
	struct sockaddr_in sa = {.sin_family = AF_INET};
	CHECK(inet_pton(AF_INET, addr, &sa.sin_addr) == 1);
	CHECK(rbind(l, (struct sockaddr *)&sa, sizeof(sa)) == 0);
	socklen_t sl = sizeof(sa);
	CHECK(rgetsockname(l, (struct sockaddr *)&sa, &sl) == 0);
	CHECK(rlisten(l, 1) == 0);
	pid_t pid = fork();
	CHECK(pid >= 0);
	if (!pid) {
		int c = rsocket(AF_INET, SOCK_STREAM, 0);
		CHECK(c >= 0);
		CHECK(rconnect(c, (struct sockaddr *)&sa, sizeof(sa)) == 0);
		char m[100];
		for (int i = 0; i < 100; i++)
			m[i] = (char)i;
		CHECK(rsend(c, m, 30, 0) == 30);
		usleep(50000); // Two messages, not one
		CHECK(rsend(c, m + 30, 70, 0) == 70);
		char x;
		rrecv(c, &x, 1, 0); // Until the reader closes
		rclose(c);
		_exit(0);
	}
	int a = raccept(l, NULL, NULL);
	CHECK(a >= 0);
	char want[100], got[100];
	for (int i = 0; i < 100; i++)
		want[i] = (char)i;
	// Both messages in.
	for (int i = 0; i < 500; i++) {
		ssize_t n = rrecv(a, got, sizeof(got), MSG_PEEK | MSG_DONTWAIT);
		if (n == 100)
			break;
		usleep(2000);
	}
	char x[20], y[20];
	struct iovec v[2] = {{x, 20}, {y, 20}};
	struct msghdr mh = {.msg_iov = v, .msg_iovlen = 2};
	ssize_t n = rrecvmsg(a, &mh, MSG_PEEK);
	if (n != 40 || memcmp(x, want, 20) || memcmp(y, want + 20, 20))
		FAIL("MSG_PEEK into two iovecs: %zd bytes, y[0] = %d; expected 40 bytes in order", n,
		     y[0]);
	// Peeked, not taken: the reads see every byte once, in order.
	CHECK(rrecv(a, got, 100, MSG_WAITALL) == 100);
	CHECK(memcmp(got, want, 100) == 0);
	rclose(a);
	rclose(l);
	int st;
	CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

int main(int argc, char **argv)
{
	if (argc != 3)
		FAIL("usage: sv_cm_late notify|response|rtu|peek ADDR");
	alarm(90);
	snprintf(addr, sizeof(addr), "%s", argv[2]);
	const char *sc = argv[1];
	if (!strcmp(sc, "peek")) {
		sc_peek();
		printf("OK sv_cm_late %s\n", sc);
		return 0;
	}
	ch = rdma_create_event_channel();
	CHECK(ch);
	struct rdma_cm_id *l;
	CHECK(rdma_create_id(ch, &l, NULL, RDMA_PS_TCP) == 0);
	struct sockaddr_in sa = {.sin_family = AF_INET};
	CHECK(inet_pton(AF_INET, addr, &sa.sin_addr) == 1);
	CHECK(rdma_bind_addr(l, (struct sockaddr *)&sa) == 0);
	CHECK(rdma_listen(l, 4) == 0);
	port = rdma_get_src_port(l);
	if (!strcmp(sc, "notify"))
		sc_notify();
	else if (!strcmp(sc, "response"))
		sc_response();
	else if (!strcmp(sc, "rtu"))
		sc_rtu();
	else
		FAIL("unknown scenario %s", sc);
	CHECK(rdma_destroy_id(l) == 0);
	rdma_destroy_event_channel(ch);
	printf("OK sv_cm_late %s\n", sc);
	return 0;
}
