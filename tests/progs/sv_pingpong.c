/* SPDX-License-Identifier: MIT */
/* The ibv_*_pingpong tools' traffic with every byte checked: two processes,
 * one QP each, one CQ for sends and receives on each side (as the tools), a
 * ring of receive buffers reposted after each completion.  The client
 * sends message 2i, the server checks it and answers with 2i+1, N times.
 *
 *   sv_pingpong [-t rc|uc|ud|srq] [-n ITERS] [-s SIZE] [-r RX_DEPTH] [-S SEED]
 *               [-d DEV] [-D DEV] [-F SEQ]
 *
 * -t: the transport (default rc); srq is RC with the receives on a shared
 * receive queue, as ibv_srq_pingpong; ud messages are at most the port's
 * MTU and land after the 40-byte GRH space of each receive buffer.
 *
 * Each message is SEND_WITH_IMM: imm_data = its sequence number, byte_len =
 * SIZE, and its payload is a pattern seeded by (SEED, sequence number) with
 * the sequence number in its first 8 bytes (when SIZE >= 8); the receiver
 * compares every byte.  A receive buffer is filled with 0xA5 before it is
 * (re)posted, so a stale or partly placed buffer cannot pass for the next
 * message.  The parent forks the server before either touches verbs (-d:
 * the client's device, -D: the server's), exchanges addresses over a
 * socketpair, and prints "OK sv_pingpong iters=N size=S bytes=B" when both
 * sides checked every message; else a FAIL line and exit status 1.
 * -F SEQ flips one byte of message SEQ after it is filled: the receiver
 * must then fail (the checker's own test). */
#include "svt.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>

static struct {
	long iters;
	uint32_t size, rx;
	uint64_t seed;
	const char *cdev, *sdev;
	long long flip; /* -F: the checker's self-test */
	const char *transport;
} opt = {1000, 4096, 16, 1, "loop0", "loop0", -1, "rc"};

#define GRH 40 /* UD receive buffers start with room for a GRH */
#define QKEY 0x11111111

#define POISON 0xA5

/* Payload byte i of message seq: splitmix64 of (seed, seq, i / 8). */
static inline uint64_t mix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ULL;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
	return x ^ (x >> 31);
}

static void fill(uint8_t *p, uint32_t len, uint64_t seq)
{
	uint64_t base = mix(opt.seed * 0x100000001b3ULL ^ seq);
	for (uint32_t i = 0; i < len; i += 8) {
		uint64_t w = mix(base + i / 8);
		uint32_t n = len - i < 8 ? len - i : 8;
		memcpy(p + i, &w, n);
	}
	if (len >= 8)
		memcpy(p, &seq, 8);
}

/* Exits with a line naming the first wrong byte. */
static void check(const uint8_t *p, uint32_t len, uint64_t seq, uint8_t *scratch,
		  const char *who)
{
	fill(scratch, len, seq);
	if (!memcmp(p, scratch, len))
		return;
	uint32_t i = 0;
	while (p[i] == scratch[i])
		i++;
	uint32_t bad = 0;
	for (uint32_t j = i; j < len; j++)
		bad += p[j] != scratch[j];
	uint64_t got_seq = 0;
	if (len >= 8)
		memcpy(&got_seq, p, 8);
	FAIL("%s: message %llu (%u bytes): byte %u is 0x%02x, expected 0x%02x; %u bytes "
	     "differ%s; its first 8 bytes say message %llu",
	     who, (unsigned long long)seq, len, i, p[i], scratch[i], bad,
	     p[i] == POISON ? " (0xa5: the receive buffer's old contents)" : "",
	     (unsigned long long)got_seq);
}

/* Poisons receive slot s and posts it, to the SRQ if there is one. */
static void post_slot(struct ibv_qp *qp, struct ibv_srq *srq, struct ibv_mr *mr, size_t slot,
		      uint32_t s, uint32_t len)
{
	memset((uint8_t *)mr->addr + slot * s, POISON, len);
	struct ibv_sge rs = svt_sge(mr, slot * s, len);
	struct ibv_recv_wr wr, *bad = NULL;
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = s;
	wr.sg_list = &rs;
	wr.num_sge = 1;
	CHECK((srq ? ibv_post_srq_recv(srq, &wr, &bad) : ibv_post_recv(qp, &wr, &bad)) == 0);
}

struct addr {
	uint32_t qpn;
	uint16_t lid;
};

static void xfer(int fd, void *out, void *in, size_t n)
{
	CHECK(write(fd, out, n) == (ssize_t)n);
	size_t got = 0;
	while (got < n) {
		ssize_t r = read(fd, (char *)in + got, n - got);
		if (r <= 0)
			FAIL("peer went away during setup (read %zd)", r);
		got += (size_t)r;
	}
}

static void run(int fd, int server)
{
	struct svt_dev d;
	svt_open(&d, server ? opt.sdev : opt.cdev);
	int ud = !strcmp(opt.transport, "ud"), use_srq = !strcmp(opt.transport, "srq");
	enum ibv_qp_type type = ud ? IBV_QPT_UD
				   : !strcmp(opt.transport, "uc") ? IBV_QPT_UC : IBV_QPT_RC;
	if (ud && opt.size > (128u << d.mtu))
		FAIL("-s %u is more than the port's MTU %u", opt.size, 128u << d.mtu);
	struct ibv_cq *cq = ibv_create_cq(d.ctx, (int)opt.rx + 8, NULL, NULL, 0);
	CHECK(cq);
	struct ibv_srq *srq = NULL;
	if (use_srq) {
		struct ibv_srq_init_attr sa;
		memset(&sa, 0, sizeof(sa));
		sa.attr.max_wr = opt.rx;
		sa.attr.max_sge = 1;
		srq = ibv_create_srq(d.pd, &sa);
		CHECK(srq);
	}
	struct svt_qpopt o = {type, cq, cq, srq, 0, 4, opt.rx, 1, 0};
	struct ibv_qp *qp = svt_qp(&d, &o);
	/* rx receive slots, then one send buffer; a UD message lands at GRH */
	uint32_t off = ud ? GRH : 0, rlen = opt.size + off;
	size_t slot = ((size_t)rlen + 63) & ~(size_t)63;
	struct ibv_mr *mr = svt_mr(&d, slot * (opt.rx + 1), IBV_ACCESS_LOCAL_WRITE);
	uint8_t *buf = mr->addr, *sbuf = buf + slot * opt.rx;
	uint8_t *scratch = malloc(slot);
	CHECK(scratch);

	struct addr me = {qp->qp_num, d.lid}, peer;
	xfer(fd, &me, &peer, sizeof(me));
	struct ibv_ah *ah = NULL;
	if (ud) {
		svt_ud_up(qp, QKEY);
		struct ibv_ah_attr aa;
		memset(&aa, 0, sizeof(aa));
		aa.dlid = peer.lid;
		aa.port_num = 1;
		ah = ibv_create_ah(d.pd, &aa);
		CHECK(ah);
	} else {
		struct svt_conn c = {IBV_ACCESS_LOCAL_WRITE, 1, 14, 7, 7};
		svt_connect(qp, peer.qpn, peer.lid, &c);
	}
	for (uint32_t s = 0; s < opt.rx; s++)
		post_slot(qp, srq, mr, slot, s, rlen);
	/* Both sides' receives are posted before the first send. */
	char go = 'g', got;
	xfer(fd, &go, &got, 1);

	const char *who = server ? "server" : "client";
	uint64_t next_in = server ? 0 : 1; /* sequence number of the next receive */
	uint64_t next_out = server ? 1 : 0;
	uint64_t received = 0;
	int send_busy = 0;
	long todo_recv = opt.iters, todo_send = opt.iters;
	int may_send = !server; /* the client opens; each side answers a receive */
	while (todo_recv || todo_send || send_busy) {
		if (may_send && !send_busy && todo_send) {
			fill(sbuf, opt.size, next_out);
			if ((long long)next_out == opt.flip)
				sbuf[next_out % opt.size] ^= 0x10;
			struct ibv_sge ss = svt_sge(mr, slot * opt.rx, opt.size);
			struct ibv_send_wr wr, *bad;
			memset(&wr, 0, sizeof(wr));
			wr.wr_id = 1000000000ULL + next_out;
			wr.opcode = IBV_WR_SEND_WITH_IMM;
			wr.imm_data = htonl((uint32_t)next_out);
			wr.sg_list = &ss;
			wr.num_sge = 1;
			wr.send_flags = IBV_SEND_SIGNALED;
			if (ud) {
				wr.wr.ud.ah = ah;
				wr.wr.ud.remote_qpn = peer.qpn;
				wr.wr.ud.remote_qkey = QKEY;
			}
			CHECK(ibv_post_send(qp, &wr, &bad) == 0);
			send_busy = 1;
			may_send = 0;
			todo_send--;
		}
		struct ibv_wc wc;
		if (!svt_poll(cq, &wc, 10000))
			FAIL("%s: no completion within 10 s (%llu messages received)", who,
			     (unsigned long long)received);
		CHECK_WC(wc, IBV_WC_SUCCESS);
		if (wc.opcode == IBV_WC_SEND) {
			CHECK_EQ(wc.wr_id, 1000000000ULL + next_out);
			/* The send buffer is the application's again: refill it
			 * only now, as the next message. */
			send_busy = 0;
			next_out += 2;
			continue;
		}
		CHECK_EQ(wc.opcode, IBV_WC_RECV);
		if (!todo_recv)
			FAIL("%s: a receive beyond the %ld expected", who, opt.iters);
		uint32_t s = (uint32_t)wc.wr_id;
		CHECK(s < opt.rx);
		/* RC delivers in order into receives in posting order. */
		CHECK_EQ(s, received % opt.rx);
		if (!(wc.wc_flags & IBV_WC_WITH_IMM))
			FAIL("%s: message %llu came without its immediate", who,
			     (unsigned long long)next_in);
		if (ntohl(wc.imm_data) != (uint32_t)next_in)
			FAIL("%s: immediate says message %u, expected %llu (lost or reordered)", who,
			     ntohl(wc.imm_data), (unsigned long long)next_in);
		CHECK_EQ(wc.byte_len, rlen);
		CHECK_EQ(wc.qp_num, qp->qp_num);
		CHECK_EQ(wc.src_qp, peer.qpn);
		check(buf + slot * s + off, opt.size, next_in, scratch, who);
		post_slot(qp, srq, mr, slot, s, rlen);
		received++;
		next_in += 2;
		todo_recv--;
		may_send = 1;
	}
	/* Nothing more may arrive: wait a full second before concluding so. */
	svt_expect_empty(cq, 1000, "after the last message");
	printf("%s checked %llu messages of %u bytes\n", who, (unsigned long long)received,
	       opt.size);
	fflush(stdout);
	CHECK(ibv_destroy_qp(qp) == 0);
	if (srq)
		CHECK(ibv_destroy_srq(srq) == 0);
	if (ah)
		CHECK(ibv_destroy_ah(ah) == 0);
	CHECK(ibv_destroy_cq(cq) == 0);
	CHECK(ibv_dereg_mr(mr) == 0);
	CHECK(ibv_dealloc_pd(d.pd) == 0);
	CHECK(ibv_close_device(d.ctx) == 0);
	/* Tell the peer we are done only after our last check. */
	xfer(fd, &go, &got, 1);
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	int ch;
	while ((ch = getopt(argc, argv, "t:n:s:r:S:d:D:F:")) != -1) {
		switch (ch) {
		case 'n': opt.iters = atol(optarg); break;
		case 's': opt.size = (uint32_t)strtoul(optarg, NULL, 0); break;
		case 'r': opt.rx = (uint32_t)strtoul(optarg, NULL, 0); break;
		case 'S': opt.seed = strtoull(optarg, NULL, 0); break;
		case 'd': opt.cdev = optarg; break;
		case 'D': opt.sdev = optarg; break;
		case 'F': opt.flip = atoll(optarg); break;
		case 't': opt.transport = optarg; break;
		default:
			fprintf(stderr, "usage: %s [-t rc|uc|ud|srq] [-n iters] [-s size] [-r rx_depth] [-S seed] "
					"[-d client_dev] [-D server_dev] [-F seq]\n", argv[0]);
			return 2;
		}
	}
	if (opt.iters < 1 || opt.size < 1 || opt.rx < 1 || opt.rx > 4096 ||
	    (strcmp(opt.transport, "rc") && strcmp(opt.transport, "uc") &&
	     strcmp(opt.transport, "ud") && strcmp(opt.transport, "srq")))
		FAIL("bad arguments");
	int sv[2];
	CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
	/* Fork before any verbs call: a verbs context must not cross fork. */
	pid_t pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		close(sv[0]);
		/* Gone with the parent, whatever ends it. */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() == 1)
			_exit(1);
		svt_watchdog(280);
		run(sv[1], 1);
		_exit(0);
	}
	close(sv[1]);
	svt_watchdog(290);
	/* If the server dies, our reads see EOF and we fail; if we fail, exit()
	 * closes the socket and the server fails at its next exchange or its
	 * watchdog; the harness's timeout bounds both. */
	run(sv[0], 0);
	int st;
	CHECK(waitpid(pid, &st, 0) == pid);
	if (!WIFEXITED(st) || WEXITSTATUS(st))
		FAIL("server ended with status 0x%x", st);
	printf("OK sv_pingpong %s iters=%ld size=%u bytes=%llu\n", opt.transport, opt.iters,
	       opt.size, (unsigned long long)opt.iters * 2 * opt.size);
	return 0;
}
