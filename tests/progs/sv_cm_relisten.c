/* SPDX-License-Identifier: MIT */
/*
 * A server that listens again on its port in the other IP port space
 * (pyverbs-tests/test_rdmacm.py; a helper's probe of perftest -c UD -R).
 *
 *   sv_cm_relisten ADDR ud|rc
 *
 * The server (a child) listens on a port in RDMA_PS_TCP, destroys that
 * listener, and 300 ms later listens on the same port again, in RDMA_PS_UDP
 * ("ud": the client's REQ is a SIDR REQ) or RDMA_PS_TCP ("rc").  The client
 * connects in between: its REQ finds no listener, and must be tried again
 * until the new one is there (perftest's control connection is RC, its
 * data connection UD: the SIDR REQ came back UNREACHABLE at once, and the
 * client failed about 1 run in 10).  The server accepts (a UD QP answers a
 * SIDR REQ; an RC one waits for ESTABLISHED).  Prints "OK sv_cm_relisten
 * MODE", or names what failed and exits 1.
 */
#include <arpa/inet.h>
#include <rdma/rdma_cma.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void fail(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "FAIL ");
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "\n");
	va_end(ap);
	exit(1);
}

static struct rdma_cm_event *next_event(struct rdma_event_channel *ch, const char *who)
{
	struct rdma_cm_event *e;
	if (rdma_get_cm_event(ch, &e))
		fail("%s: rdma_get_cm_event: %m", who);
	return e;
}

/* A PD and a QP of one WR each way (UD or RC) for id; returns the PD. */
static struct ibv_pd *make_qp(struct rdma_cm_id *id, int ud, const char *who)
{
	struct ibv_pd *pd = ibv_alloc_pd(id->verbs);
	struct ibv_qp_init_attr a = {.qp_type = ud ? IBV_QPT_UD : IBV_QPT_RC,
				     .cap = {.max_send_wr = 1, .max_recv_wr = 1,
					     .max_send_sge = 1, .max_recv_sge = 1}};
	if (!pd || rdma_create_qp(id, pd, &a))
		fail("%s: QP: %m", who);
	return pd;
}

static void server(struct sockaddr_in any, int ud, int ready)
{
	alarm(20);
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *l;
	if (!ch || rdma_create_id(ch, &l, NULL, RDMA_PS_TCP))
		fail("server: first id: %m");
	if (rdma_bind_addr(l, (struct sockaddr *)&any) || rdma_listen(l, 1))
		fail("server: first listen: %m");
	if (rdma_destroy_id(l))
		fail("server: destroying the first listener: %m");
	if (write(ready, "x", 1) != 1)
		fail("server: pipe");
	usleep(300000); /* The client's REQ finds no listener now */
	struct rdma_cm_id *l2;
	if (rdma_create_id(ch, &l2, NULL, ud ? RDMA_PS_UDP : RDMA_PS_TCP))
		fail("server: second id: %m");
	if (rdma_bind_addr(l2, (struct sockaddr *)&any) || rdma_listen(l2, 1))
		fail("server: second listen: %m");
	struct rdma_cm_event *e = next_event(ch, "server");
	if (e->event != RDMA_CM_EVENT_CONNECT_REQUEST)
		fail("server: %s, not CONNECT_REQUEST", rdma_event_str(e->event));
	struct rdma_cm_id *id = e->id;
	rdma_ack_cm_event(e);
	make_qp(id, ud, "server");
	struct rdma_conn_param cp = {0};
	if (rdma_accept(id, &cp))
		fail("server: rdma_accept: %m");
	if (!ud) {
		e = next_event(ch, "server");
		if (e->event != RDMA_CM_EVENT_ESTABLISHED)
			fail("server: %s, not ESTABLISHED", rdma_event_str(e->event));
		rdma_ack_cm_event(e);
	}
	exit(0);
}

int main(int argc, char **argv)
{
	if (argc != 3 || (strcmp(argv[2], "ud") && strcmp(argv[2], "rc")))
		fail("usage: sv_cm_relisten ADDR ud|rc");
	int ud = !strcmp(argv[2], "ud");
	alarm(30);
	struct sockaddr_in sin = {.sin_family = AF_INET};
	if (inet_pton(AF_INET, argv[1], &sin.sin_addr) != 1)
		fail("bad address %s", argv[1]);
	sin.sin_port = htons((uint16_t)(30000 + getpid() % 20000));
	struct sockaddr_in any = sin;
	any.sin_addr.s_addr = htonl(INADDR_ANY);
	int p[2];
	if (pipe(p))
		fail("pipe: %m");
	pid_t pid = fork();
	if (pid < 0)
		fail("fork: %m");
	if (pid == 0) {
		close(p[0]);
		server(any, ud, p[1]);
	}
	close(p[1]);
	char b;
	if (read(p[0], &b, 1) != 1)
		fail("the server did not get to its first listen");
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *id;
	if (!ch || rdma_create_id(ch, &id, NULL, ud ? RDMA_PS_UDP : RDMA_PS_TCP))
		fail("client: id: %m");
	if (rdma_resolve_addr(id, NULL, (struct sockaddr *)&sin, 2000))
		fail("client: rdma_resolve_addr: %m");
	struct rdma_cm_event *e = next_event(ch, "client");
	if (e->event != RDMA_CM_EVENT_ADDR_RESOLVED)
		fail("client: %s, not ADDR_RESOLVED", rdma_event_str(e->event));
	rdma_ack_cm_event(e);
	if (rdma_resolve_route(id, 2000))
		fail("client: rdma_resolve_route: %m");
	e = next_event(ch, "client");
	if (e->event != RDMA_CM_EVENT_ROUTE_RESOLVED)
		fail("client: %s, not ROUTE_RESOLVED", rdma_event_str(e->event));
	rdma_ack_cm_event(e);
	struct ibv_pd *pd = make_qp(id, ud, "client");
	struct rdma_conn_param cp = {0};
	if (rdma_connect(id, &cp))
		fail("client: rdma_connect: %m");
	e = next_event(ch, "client");
	if (e->event != RDMA_CM_EVENT_ESTABLISHED)
		fail("client: %s (status %d), not ESTABLISHED: the REQ was not tried again "
		     "until the server listened again",
		     rdma_event_str(e->event), e->status);
	if (ud && !e->param.ud.qp_num)
		fail("client: no QP number in the SIDR reply");
	rdma_ack_cm_event(e);
	int st = 0;
	if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st))
		fail("the server failed (status %#x)", st);
	rdma_destroy_qp(id);
	ibv_dealloc_pd(pd);
	rdma_destroy_id(id);
	rdma_destroy_event_channel(ch);
	printf("OK sv_cm_relisten %s\n", argv[2]);
	return 0;
}
