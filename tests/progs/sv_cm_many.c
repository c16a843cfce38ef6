// SPDX-License-Identifier: MIT
// Many RC connections through rdma_cm, one after the other, each with one
// checked message each way, then a disconnect and every object destroyed
// (pyverbs-tests/test_rdmacm.py, test_many_connections_leak_nothing).
//
//   sv_cm_many server ADDR PORT COUNT SHM_PREFIX
//   sv_cm_many client ADDR PORT COUNT SHM_PREFIX
//
// The server takes its QPs' CQs and PD from the library (rdma_create_qp
// with none), the client brings its own PD, CQ and MR per connection, so
// both of rdma_cm's ways are counted.  Each side counts its open fds
// (/proc/self/fd) and the fabric's segments it has mapped (/dev/shm/SHM_PREFIX*
// in /proc/self/maps) at the start, after the first connection is gone (the
// library's device contexts and CM thread exist by then), after the last
// one is gone (the least of the first and of the last ten: see sample), and
// after the listener and the channel are destroyed too; prints
//   DONE conns=N fds=START/FIRST/LAST/END shm=START/FIRST/LAST/END ms=ELAPSED
// and waits for end-of-file on stdin, so that the test can read the fabric's
// registry while both processes are alive, before they exit.
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>
#include <infiniband/verbs.h>

#include <dirent.h>
#include <errno.h>
#include <netdb.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MSG_MAGIC 0x53564d4eu
#define PAYLOAD 100
#define TIMEOUT_MS 20000

struct msg {
	uint32_t magic;
	uint32_t seq;
	uint32_t dir; // 1: client to server, 2: server to client
	uint8_t payload[PAYLOAD];
	uint32_t sum;
};

struct req_pdata {
	uint32_t seq;
	uint32_t sum;
};

static void die(const char *what, int seq)
{
	fprintf(stderr, "sv_cm_many: connection %d: %s (errno %d: %s)\n", seq, what, errno,
		strerror(errno));
	fflush(stdout);
	exit(1);
}

static int64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static uint32_t fnv(const void *p, size_t n)
{
	const uint8_t *b = p;
	uint32_t h = 2166136261u;
	for (size_t i = 0; i < n; i++)
		h = (h ^ b[i]) * 16777619u;
	return h;
}

static void fill_msg(struct msg *m, uint32_t seq, uint32_t dir)
{
	m->magic = MSG_MAGIC;
	m->seq = seq;
	m->dir = dir;
	for (int k = 0; k < PAYLOAD; k++)
		m->payload[k] = (uint8_t)(seq * 31 + k * 7 + dir * 13);
	m->sum = fnv(m, offsetof(struct msg, sum));
}

static void check_msg(const struct msg *m, uint32_t seq, uint32_t dir)
{
	struct msg want;
	fill_msg(&want, seq, dir);
	if (fnv(m, offsetof(struct msg, sum)) != m->sum) {
		fprintf(stderr, "sv_cm_many: connection %u: checksum mismatch\n", seq);
		exit(1);
	}
	if (memcmp(m, &want, sizeof(want))) {
		fprintf(stderr, "sv_cm_many: connection %u: got seq %u dir %u, want seq %u dir %u\n",
			seq, m->seq, m->dir, seq, dir);
		exit(1);
	}
}

static int count_dir(const char *path, const char *prefix)
{
	DIR *d = opendir(path);
	if (!d)
		return -1;
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		if (prefix && strncmp(e->d_name, prefix, strlen(prefix)))
			continue;
		n++;
	}
	closedir(d);
	return n; // /proc/self/fd counts the directory's own fd: the same every time
}

static void wait_wc(struct ibv_cq *cq, enum ibv_wc_opcode op, int seq)
{
	int64_t end = now_ms() + TIMEOUT_MS;
	struct ibv_wc wc;
	for (;;) {
		int n = ibv_poll_cq(cq, 1, &wc);
		if (n < 0)
			die("ibv_poll_cq", seq);
		if (n == 1) {
			if (wc.status != IBV_WC_SUCCESS) {
				fprintf(stderr, "sv_cm_many: connection %d: completion %s\n", seq,
					ibv_wc_status_str(wc.status));
				exit(1);
			}
			if (wc.opcode != op) {
				fprintf(stderr, "sv_cm_many: connection %d: opcode %d, want %d\n", seq,
					wc.opcode, op);
				exit(1);
			}
			if (op == IBV_WC_RECV && wc.byte_len != sizeof(struct msg)) {
				fprintf(stderr, "sv_cm_many: connection %d: %u bytes\n", seq, wc.byte_len);
				exit(1);
			}
			return;
		}
		if (now_ms() > end) {
			errno = ETIMEDOUT;
			die("no completion", seq);
		}
		sched_yield();
	}
}

static struct rdma_cm_event *get_event(struct rdma_event_channel *ch, int seq)
{
	struct rdma_cm_event *ev;
	if (rdma_get_cm_event(ch, &ev))
		die("rdma_get_cm_event", seq);
	return ev;
}

static void expect(struct rdma_event_channel *ch, struct rdma_cm_id *id,
		   enum rdma_cm_event_type type, int seq)
{
	struct rdma_cm_event *ev = get_event(ch, seq);
	if (ev->event != type || ev->id != id || ev->status) {
		fprintf(stderr, "sv_cm_many: connection %d: %s status %d, want %s\n", seq,
			rdma_event_str(ev->event), ev->status, rdma_event_str(type));
		exit(1);
	}
	rdma_ack_cm_event(ev);
}

// The fabric's segments this process has mapped (/proc/self/maps).
static int count_mapped(const char *prefix)
{
	char want[512], line[1024], seen[256][256];
	int n = 0;
	snprintf(want, sizeof(want), "/dev/shm/%s", prefix);
	FILE *f = fopen("/proc/self/maps", "r");
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f)) {
		char *path = strstr(line, want);
		if (!path)
			continue;
		path[strcspn(path, "\n")] = 0;
		int dup = 0;
		for (int i = 0; i < n && !dup; i++)
			dup = !strncmp(seen[i], path, sizeof(seen[i]) - 1);
		if (!dup && n < 256)
			snprintf(seen[n++], sizeof(seen[0]), "%s", path);
	}
	fclose(f);
	return n;
}

static struct counts {
	int fds[4], shm[4];
} counts;

static void take(int at, const char *prefix)
{
	counts.fds[at] = count_dir("/proc/self/fd", NULL);
	counts.shm[at] = count_mapped(prefix);
}

// After connection `done` (1-based) is gone.  The peer may already be
// setting up the next one (the server may hold its socket), so FIRST and
// LAST are the smallest counts seen over the first and the last ten
// connections: a leak per connection still shows as hundreds.
#define WINDOW 10
static void sample(int done, int count, const char *prefix)
{
	int at = done <= WINDOW ? 1 : done > count - WINDOW ? 2 : 0;
	if (!at)
		return;
	int fds = count_dir("/proc/self/fd", NULL), shm = count_mapped(prefix);
	int first = done == 1 || done == count - WINDOW + 1;
	if (first || fds < counts.fds[at])
		counts.fds[at] = fds;
	if (first || shm < counts.shm[at])
		counts.shm[at] = shm;
}

// One accepted connection on the server.
struct conn {
	struct rdma_cm_id *id;
	struct ibv_mr *mr;
	struct msg rx, tx;
	uint32_t seq;
};

static void server(struct rdma_addrinfo *ai, int count, const char *prefix)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *lid;
	if (!ch || rdma_create_id(ch, &lid, NULL, RDMA_PS_TCP))
		die("channel or listener", -1);
	if (rdma_bind_addr(lid, ai->ai_src_addr ? ai->ai_src_addr : ai->ai_dst_addr) ||
	    rdma_listen(lid, 16))
		die("bind or listen", -1);
	printf("LISTENING\n");
	fflush(stdout);
	int done = 0, reqs = 0;
	while (done < count) {
		struct rdma_cm_event *ev = get_event(ch, done);
		struct conn *c = ev->id->context;
		switch (ev->event) {
		case RDMA_CM_EVENT_CONNECT_REQUEST: {
			struct rdma_cm_id *id = ev->id;
			// private_data has no alignment promise (librdmacm points
			// into its event buffer): copied out before it is read.
			struct req_pdata pdv, *pd = &pdv;
			if (ev->param.conn.private_data_len < sizeof(*pd) ||
			    !ev->param.conn.private_data ||
			    !memcpy(pd, ev->param.conn.private_data, sizeof(*pd)) ||
			    pd->seq != (uint32_t)reqs || pd->sum != fnv(&pd->seq, 4)) {
				fprintf(stderr, "sv_cm_many: request %d: bad private data\n", reqs);
				exit(1);
			}
			rdma_ack_cm_event(ev);
			c = calloc(1, sizeof(*c));
			c->id = id;
			c->seq = reqs++;
			id->context = c;
			struct ibv_qp_init_attr qa = {
				.cap = {.max_send_wr = 2, .max_recv_wr = 2, .max_send_sge = 1,
					.max_recv_sge = 1},
				.qp_type = IBV_QPT_RC,
				.sq_sig_all = 1,
			};
			if (rdma_create_qp(id, NULL, &qa))
				die("rdma_create_qp", c->seq);
			c->mr = rdma_reg_msgs(id, &c->rx, sizeof(c->rx) * 2);
			if (!c->mr)
				die("rdma_reg_msgs", c->seq);
			if (rdma_post_recv(id, NULL, &c->rx, sizeof(c->rx), c->mr))
				die("rdma_post_recv", c->seq);
			struct rdma_conn_param cp = {.responder_resources = 1, .initiator_depth = 1,
						     .rnr_retry_count = 7, .retry_count = 7};
			if (rdma_accept(id, &cp))
				die("rdma_accept", c->seq);
			break;
		}
		case RDMA_CM_EVENT_ESTABLISHED:
			rdma_ack_cm_event(ev);
			wait_wc(c->id->recv_cq, IBV_WC_RECV, c->seq);
			check_msg(&c->rx, c->seq, 1);
			fill_msg(&c->tx, c->seq, 2);
			if (rdma_post_send(c->id, NULL, &c->tx, sizeof(c->tx), c->mr, 0))
				die("rdma_post_send", c->seq);
			wait_wc(c->id->send_cq, IBV_WC_SEND, c->seq);
			break;
		case RDMA_CM_EVENT_DISCONNECTED:
			rdma_ack_cm_event(ev);
			if (rdma_dereg_mr(c->mr))
				die("rdma_dereg_mr", c->seq);
			rdma_destroy_qp(c->id);
			if (rdma_destroy_id(c->id))
				die("rdma_destroy_id", c->seq);
			free(c);
			sample(++done, count, prefix);
			break;
		default:
			fprintf(stderr, "sv_cm_many: unexpected %s status %d after %d connections\n",
				rdma_event_str(ev->event), ev->status, done);
			exit(1);
		}
	}
	if (rdma_destroy_id(lid))
		die("rdma_destroy_id(listener)", -1);
	rdma_destroy_event_channel(ch);
}

static void client(struct rdma_addrinfo *ai, int count, const char *prefix)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	if (!ch)
		die("rdma_create_event_channel", -1);
	for (int i = 0; i < count; i++) {
		struct rdma_cm_id *id;
		if (rdma_create_id(ch, &id, NULL, RDMA_PS_TCP))
			die("rdma_create_id", i);
		if (rdma_resolve_addr(id, NULL, ai->ai_dst_addr, 2000))
			die("rdma_resolve_addr", i);
		expect(ch, id, RDMA_CM_EVENT_ADDR_RESOLVED, i);
		if (rdma_resolve_route(id, 2000))
			die("rdma_resolve_route", i);
		expect(ch, id, RDMA_CM_EVENT_ROUTE_RESOLVED, i);
		struct ibv_pd *pd = ibv_alloc_pd(id->verbs);
		struct ibv_cq *cq = pd ? ibv_create_cq(id->verbs, 4, NULL, NULL, 0) : NULL;
		struct msg *buf = calloc(2, sizeof(struct msg));
		struct ibv_mr *mr = cq ? ibv_reg_mr(pd, buf, 2 * sizeof(*buf), IBV_ACCESS_LOCAL_WRITE) : NULL;
		if (!mr)
			die("pd, cq or mr", i);
		struct ibv_qp_init_attr qa = {
			.send_cq = cq, .recv_cq = cq,
			.cap = {.max_send_wr = 2, .max_recv_wr = 2, .max_send_sge = 1, .max_recv_sge = 1},
			.qp_type = IBV_QPT_RC,
			.sq_sig_all = 1,
		};
		if (rdma_create_qp(id, pd, &qa))
			die("rdma_create_qp", i);
		if (rdma_post_recv(id, NULL, &buf[0], sizeof(buf[0]), mr))
			die("rdma_post_recv", i);
		struct req_pdata rp = {.seq = (uint32_t)i};
		rp.sum = fnv(&rp.seq, 4);
		struct rdma_conn_param cp = {.responder_resources = 1, .initiator_depth = 1,
					     .rnr_retry_count = 7, .retry_count = 7,
					     .private_data = &rp, .private_data_len = sizeof(rp)};
		if (rdma_connect(id, &cp))
			die("rdma_connect", i);
		expect(ch, id, RDMA_CM_EVENT_ESTABLISHED, i);
		fill_msg(&buf[1], i, 1);
		if (rdma_post_send(id, NULL, &buf[1], sizeof(buf[1]), mr, 0))
			die("rdma_post_send", i);
		// One CQ for both: a SEND and a RECV completion, in either order.
		int got_send = 0, got_recv = 0;
		int64_t end = now_ms() + TIMEOUT_MS;
		while (!got_send || !got_recv) {
			struct ibv_wc wc;
			int n = ibv_poll_cq(cq, 1, &wc);
			if (n < 0)
				die("ibv_poll_cq", i);
			if (n == 0) {
				if (now_ms() > end) {
					errno = ETIMEDOUT;
					die("no completion", i);
				}
				sched_yield();
				continue;
			}
			if (wc.status != IBV_WC_SUCCESS) {
				fprintf(stderr, "sv_cm_many: connection %d: completion %s\n", i,
					ibv_wc_status_str(wc.status));
				exit(1);
			}
			if (wc.opcode == IBV_WC_SEND)
				got_send++;
			else if (wc.opcode == IBV_WC_RECV && wc.byte_len == sizeof(struct msg))
				got_recv++;
			else
				die("unexpected completion", i);
		}
		check_msg(&buf[0], i, 2);
		if (rdma_disconnect(id))
			die("rdma_disconnect", i);
		expect(ch, id, RDMA_CM_EVENT_DISCONNECTED, i);
		rdma_destroy_qp(id);
		if (ibv_dereg_mr(mr) || ibv_destroy_cq(cq) || ibv_dealloc_pd(pd))
			die("dereg, destroy cq or dealloc pd", i);
		free(buf);
		if (rdma_destroy_id(id))
			die("rdma_destroy_id", i);
		sample(i + 1, count, prefix);
	}
	rdma_destroy_event_channel(ch);
}

int main(int argc, char **argv)
{
	if (argc != 6) {
		fprintf(stderr, "usage: %s server|client ADDR PORT COUNT SHM_PREFIX\n", argv[0]);
		return 2;
	}
	int is_server = !strcmp(argv[1], "server");
	int count = atoi(argv[4]);
	if (count < 2 * WINDOW) {
		fprintf(stderr, "sv_cm_many: COUNT must be at least %d\n", 2 * WINDOW);
		return 2;
	}
	const char *prefix = argv[5];
	setvbuf(stdout, NULL, _IOLBF, 0);
	take(0, prefix);
	struct rdma_addrinfo hints = {.ai_port_space = RDMA_PS_TCP}, *ai;
	if (is_server)
		hints.ai_flags = RAI_PASSIVE;
	if (rdma_getaddrinfo(argv[2], argv[3], &hints, &ai))
		die("rdma_getaddrinfo", -1);
	int64_t t0 = now_ms();
	if (is_server)
		server(ai, count, prefix);
	else
		client(ai, count, prefix);
	rdma_freeaddrinfo(ai);
	take(3, prefix);
	printf("DONE conns=%d fds=%d/%d/%d/%d shm=%d/%d/%d/%d ms=%lld\n", count, counts.fds[0],
	       counts.fds[1], counts.fds[2], counts.fds[3], counts.shm[0], counts.shm[1],
	       counts.shm[2], counts.shm[3], (long long)(now_ms() - t0));
	char b[64];
	while (fread(b, 1, sizeof(b), stdin) > 0)
		;
	return 0;
}
