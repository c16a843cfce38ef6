/* SPDX-License-Identifier: MIT */
/* One side of a two-process RC test; the test harness relays the lines.
 *
 *   sv_peer server DEV    prints "INFO lid qpn addr rkey", reads the
 *                         client's INFO, posts receives, prints "READY",
 *                         checks every message, prints "DONE n", then
 *                         keeps its memory until stdin closes.
 *   sv_peer client DEV    reads the server's INFO, prints its own, waits
 *                         for "READY", then SEND (sizes 1 B..1 MiB), RDMA
 *                         WRITE / READ, atomics, all verified; "DONE".
 *   sv_peer victim DEV    like server, but sits still (to be SIGKILLed).
 *   sv_peer survivor DEV [sends|small]  streams RDMA WRITEs and SENDs
 *                         (with "sends": SENDs only, slowly; "small": the
 *                         same of 64 bytes) at the victim,
 *                         prints "STREAMING" once traffic flows, and after
 *                         the victim dies reports "ERR <status> flushed=N
 *                         ok_after=0 posted=N first_err_wr=N" (flushed must
 *                         be exactly the WRs posted behind the failed one);
 *                         then checks that its other QPs still work: "OK".
 *   sv_peer batch-target DEV rc|uc  a target whose memory an mmap'd 1 MiB MR
 *                         (not fd-backed: cross-memory attach) fills with
 *                         0xA5; after the INFO exchange, "READY", then it
 *                         answers the client's commands, one line each:
 *                         PATTERN (fill slot i with slot_fill(i)), UNMAP
 *                         off len, CHECK n k after (slots before k hold
 *                         their pattern, those after k still 0xA5, or
 *                         their pattern too when after is 1; k = n: all).
 *   sv_peer batch DEV write|read|write-fault|read-fault|write-badkey|read-badlkey|
 *                     uc-write-fault
 *                         posts BATCH_N RDMA WRITEs (READs) in one
 *                         ibv_post_send, slot i to slot i, and checks each
 *                         completion in WR order and the bytes at the
 *                         target (here); the -fault forms unmap a page of
 *                         slot BATCH_K first: the WRs before it succeed,
 *                         it fails REM_ACCESS_ERR, the rest WR_FLUSH_ERR,
 *                         and no byte of theirs lands.  -badkey gives WR
 *                         BATCH_K a key the target never registered,
 *                         -badlkey a local key of none of ours: it fails
 *                         REM_ACCESS_ERR (LOC_PROT_ERR) after the WRs
 *                         before it completed.  uc-: on UC QPs, where the
 *                         faulting WR completes as sent and the WRs after
 *                         it run and land.  Commands go to the
 *                         target as lines (the harness relays the reply);
 *                         "DONE" at the end.
 */
#include "svt.h"

#include <stdarg.h>
#include <sys/mman.h>

#define MSGS 22 /* SEND sizes: 1, 2, 4 ... 1 MiB, and 3 odd ones */
#define BUF (4u << 20)

static size_t msg_len(int i)
{
	if (i <= 20)
		return (size_t)1 << i;
	return 12345;
}

static char *read_line(char *buf, size_t n)
{
	if (!fgets(buf, (int)n, stdin))
		FAIL("stdin closed early");
	buf[strcspn(buf, "\n")] = 0;
	return buf;
}

struct info {
	unsigned lid, qpn;
	unsigned long long addr;
	unsigned rkey;
};

static void get_info(struct info *i)
{
	char line[256];
	read_line(line, sizeof(line));
	if (sscanf(line, "INFO %u %u %llu %u", &i->lid, &i->qpn, &i->addr, &i->rkey) != 4)
		FAIL("bad info line '%s'", line);
}

static void expect_line(const char *want)
{
	char line[256];
	read_line(line, sizeof(line));
	if (strcmp(line, want))
		FAIL("got '%s', expected '%s'", line, want);
}

struct side {
	struct svt_dev d;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *mr;
};

static void side_open(struct side *s, const char *dev, uint32_t wr)
{
	svt_open(&s->d, dev);
	s->cq = ibv_create_cq(s->d.ctx, 4096, NULL, NULL, 0);
	CHECK(s->cq);
	struct svt_qpopt o = {IBV_QPT_RC, s->cq, s->cq, NULL, 0, wr, wr, 1, 0};
	s->qp = svt_qp(&s->d, &o);
	s->mr = svt_mr(&s->d, BUF, SVT_ALL_ACCESS);
	printf("INFO %u %u %llu %u\n", s->d.lid, s->qp->qp_num,
	       (unsigned long long)(uintptr_t)s->mr->addr, s->mr->rkey);
}

static void run_server(const char *dev, int victim)
{
	struct side s;
	side_open(&s, dev, 256);
	struct info peer;
	get_info(&peer);
	struct svt_conn c = {SVT_ALL_ACCESS, 1, 14, 3, 7};
	svt_connect(s.qp, peer.qpn, (uint16_t)peer.lid, &c);
	char *B = s.mr->addr;
	/* The upper 2 MiB is what the client reads */
	svt_fill(B + BUF / 2, BUF / 2, 99);
	if (victim) {
		for (int i = 0; i < 200; i++) {
			struct ibv_sge rs = svt_sge(s.mr, 0, 65536);
			svt_post_recv1(s.qp, i, &rs, 1);
		}
		printf("READY\n");
		for (;;)
			pause();
	}
	struct ibv_sge rs = svt_sge(s.mr, 0, BUF / 2);
	svt_post_recv1(s.qp, 0, &rs, 1);
	printf("READY\n");
	int ok = 0;
	for (int i = 0; i < MSGS; i++) {
		struct ibv_wc wc;
		if (!svt_poll(s.cq, &wc, 20000))
			FAIL("message %d did not arrive", i);
		CHECK_WC(wc, IBV_WC_SUCCESS);
		CHECK_EQ(wc.wr_id, i);
		CHECK_EQ(wc.byte_len, msg_len(i));
		CHECK_EQ(wc.src_qp, peer.qpn);
		static char expect[BUF / 2];
		svt_fill(expect, msg_len(i), (unsigned)i);
		if (memcmp(expect, B, msg_len(i)))
			FAIL("message %d (%zu bytes) corrupted", i, msg_len(i));
		ok++;
		/* The next receive is posted only now: the client's RNR retries cover it */
		if (i + 1 < MSGS)
			svt_post_recv1(s.qp, i + 1, &rs, 1);
	}
	printf("DONE %d\n", ok);
	/* Keep the memory for the client's one-sided operations */
	char line[256];
	while (fgets(line, sizeof(line), stdin))
		;
	/* The client wrote its pattern at offset BUF/4 and added to word BUF/2-8 */
	static char expect[65536];
	svt_fill(expect, 65536, 77);
	if (memcmp(B + BUF / 4, expect, 65536))
		FAIL("client's RDMA WRITE not visible");
	CHECK_EQ(*(uint64_t *)(B + BUF / 4 + 65536 + 64), 1000 + 3);
}

static void run_client(const char *dev)
{
	struct info peer;
	get_info(&peer);
	struct side s;
	side_open(&s, dev, 256);
	struct svt_conn c = {SVT_ALL_ACCESS, 1, 14, 3, 7};
	svt_connect(s.qp, peer.qpn, (uint16_t)peer.lid, &c);
	expect_line("READY");
	char *A = s.mr->addr;
	struct ibv_wc wc;
	for (int i = 0; i < MSGS; i++) {
		svt_fill(A, msg_len(i), (unsigned)i);
		struct ibv_sge ss = svt_sge(s.mr, 0, (uint32_t)msg_len(i));
		CHECK(svt_post_send1(s.qp, i, IBV_WR_SEND, &ss, 1, IBV_SEND_SIGNALED, 0, 0) == 0);
		wc = svt_wait(s.cq, "send");
		CHECK_WC(wc, IBV_WC_SUCCESS);
		CHECK_EQ(wc.wr_id, i);
	}
	/* RDMA READ of 2 MiB, verified */
	memset(A, 0, BUF);
	struct ibv_sge rd = svt_sge(s.mr, 0, BUF / 2);
	CHECK(svt_post_send1(s.qp, 100, IBV_WR_RDMA_READ, &rd, 1, IBV_SEND_SIGNALED,
			     peer.addr + BUF / 2, peer.rkey) == 0);
	wc = svt_wait(s.cq, "read");
	CHECK_WC(wc, IBV_WC_SUCCESS);
	{
		static char expect[BUF / 2];
		svt_fill(expect, BUF / 2, 99);
		if (memcmp(expect, A, BUF / 2))
			FAIL("RDMA READ data differs");
	}
	/* RDMA WRITE 64 KiB, then atomics on one word */
	svt_fill(A, 65536, 77);
	struct ibv_sge ws = svt_sge(s.mr, 0, 65536);
	CHECK(svt_post_send1(s.qp, 101, IBV_WR_RDMA_WRITE, &ws, 1, IBV_SEND_SIGNALED,
			     peer.addr + BUF / 4, peer.rkey) == 0);
	CHECK_WC(svt_wait(s.cq, "write"), IBV_WC_SUCCESS);
	uint64_t word = peer.addr + BUF / 4 + 65536 + 64;
	struct ibv_send_wr aw = {0}, *bad;
	struct ibv_sge as = svt_sge(s.mr, BUF - 8, 8);
	aw.sg_list = &as;
	aw.num_sge = 1;
	aw.send_flags = IBV_SEND_SIGNALED;
	aw.wr.atomic.remote_addr = word;
	aw.wr.atomic.rkey = peer.rkey;
	aw.opcode = IBV_WR_ATOMIC_CMP_AND_SWP;
	aw.wr.atomic.compare_add = 0;
	aw.wr.atomic.swap = 1000;
	CHECK(ibv_post_send(s.qp, &aw, &bad) == 0);
	CHECK_WC(svt_wait(s.cq, "cas"), IBV_WC_SUCCESS);
	CHECK_EQ(*(uint64_t *)(A + BUF - 8), 0);
	aw.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
	for (int i = 0; i < 3; i++) {
		aw.wr.atomic.compare_add = 1;
		CHECK(ibv_post_send(s.qp, &aw, &bad) == 0);
		CHECK_WC(svt_wait(s.cq, "faa"), IBV_WC_SUCCESS);
		CHECK_EQ(*(uint64_t *)(A + BUF - 8), 1000 + i);
	}
	printf("DONE\n");
}

/* sends: SENDs only (64 KiB into the victim's 200 receives; 2: 64 bytes,
 * which touch none of the victim's memory when it stays in place), and once
 * streaming one per millisecond, so that the first WR to meet the dead
 * victim after the requester's caches expire is surely a SEND. */
static void run_survivor(const char *dev, int sends)
{
	struct info peer;
	get_info(&peer);
	struct side s;
	side_open(&s, dev, 512);
	/* timeout 14: 67 ms, retry_cnt 3 */
	struct svt_conn c = {SVT_ALL_ACCESS, 1, 14, 3, 7};
	svt_connect(s.qp, peer.qpn, (uint16_t)peer.lid, &c);
	/* A pair of QPs of our own that must keep working */
	struct ibv_cq *cq2 = ibv_create_cq(s.d.ctx, 64, NULL, NULL, 0);
	struct svt_qpopt o = {IBV_QPT_RC, cq2, cq2, NULL, 0, 16, 16, 1, 0};
	struct ibv_qp *x = svt_qp(&s.d, &o), *y = svt_qp(&s.d, &o);
	svt_connect(x, y->qp_num, s.d.lid, &c);
	svt_connect(y, x->qp_num, s.d.lid, &c);
	expect_line("READY");
	char *A = s.mr->addr;
	svt_fill(A, BUF, 5);
	uint64_t posted = 0, done = 0, sent = 0;
	int streaming = 0;
	enum ibv_wc_status first_err = IBV_WC_SUCCESS;
	uint64_t first_err_wr = 0, flushed = 0, ok_after = 0;
	uint64_t deadline = svt_now_ms() + 40000;
	/* Keep up to 16 WRs outstanding: 64 KiB writes and, 1 in 8, a SEND */
	while (first_err == IBV_WC_SUCCESS || done < posted) {
		if (svt_now_ms() > deadline)
			FAIL("no error completion: posted %llu done %llu",
			     (unsigned long long)posted, (unsigned long long)done);
		while (first_err == IBV_WC_SUCCESS && posted - done < 16) {
			if (sends && (sent >= 190 || (streaming && posted != done)))
				break; /* The victim has 200 receives; one at a time */
			int send = sends || ((posted % 8) == 7 && sent < 150);
			struct ibv_sge ss =
				svt_sge(s.mr, (posted % 32) * 65536, sends == 2 ? 64 : 65536);
			int r;
			if (send) {
				r = svt_post_send1(s.qp, posted, IBV_WR_SEND, &ss, 1, IBV_SEND_SIGNALED, 0, 0);
				sent++;
			} else {
				r = svt_post_send1(s.qp, posted, IBV_WR_RDMA_WRITE, &ss, 1,
						   IBV_SEND_SIGNALED, peer.addr + (posted % 32) * 65536,
						   peer.rkey);
			}
			CHECK(r == 0);
			posted++;
		}
		struct ibv_wc wc[16];
		int n = ibv_poll_cq(s.cq, 16, wc);
		CHECK(n >= 0);
		for (int i = 0; i < n; i++) {
			if (wc[i].wr_id != done)
				FAIL("completion out of order: %llu, expected %llu",
				     (unsigned long long)wc[i].wr_id, (unsigned long long)done);
			done++;
			if (wc[i].status == IBV_WC_SUCCESS) {
				if (first_err != IBV_WC_SUCCESS)
					ok_after++;
			} else if (first_err == IBV_WC_SUCCESS) {
				first_err = wc[i].status;
				first_err_wr = wc[i].wr_id;
				printf("FIRSTERR %s\n", ibv_wc_status_str(first_err));
			} else if (wc[i].status == IBV_WC_WR_FLUSH_ERR) {
				flushed++;
			} else {
				FAIL("second error %s after %s", ibv_wc_status_str(wc[i].status),
				     ibv_wc_status_str(first_err));
			}
		}
		if (!streaming && done >= (sends ? 50u : 200u)) {
			streaming = 1;
			printf("STREAMING\n");
			if (sends) {
				/* Nothing in flight: the test kills the victim, then
				 * says GO; past a tick of the coarse clock every
				 * cached view of the victim is looked at again, and
				 * the next SEND is the first WR to meet it dead. */
				while (done < posted) {
					struct ibv_wc w1;
					int k = ibv_poll_cq(s.cq, 1, &w1);
					CHECK(k >= 0);
					if (k) {
						if (w1.wr_id != done || w1.status != IBV_WC_SUCCESS)
							FAIL("SEND %llu before GO: %s",
							     (unsigned long long)w1.wr_id,
							     ibv_wc_status_str(w1.status));
						done++;
					}
				}
				expect_line("GO");
				usleep(20000);
				deadline = svt_now_ms() + 40000;
			}
		}
		if (sends && streaming)
			usleep(1000); /* Paced: the kill comes while SENDs go on */
		else if (!n)
			usleep(streaming ? 200 : 20);
	}
	/* Every WR posted behind the one that failed is flushed, each exactly
	 * once: nothing after the error succeeds or vanishes. */
	printf("ERR %s flushed=%llu ok_after=%llu posted=%llu first_err_wr=%llu\n",
	       ibv_wc_status_str(first_err), (unsigned long long)flushed,
	       (unsigned long long)ok_after, (unsigned long long)posted,
	       (unsigned long long)first_err_wr);
	if (ok_after)
		FAIL("%llu successes after the first error", (unsigned long long)ok_after);
	if (flushed != posted - first_err_wr - 1)
		FAIL("%llu WR_FLUSH_ERR completions, expected %llu (posted %llu, first error on %llu)",
		     (unsigned long long)flushed, (unsigned long long)(posted - first_err_wr - 1),
		     (unsigned long long)posted, (unsigned long long)first_err_wr);
	/* ...and nothing more completes afterwards. */
	svt_expect_empty(s.cq, 1000, "after the flush");
	CHECK_EQ(svt_state(s.qp), IBV_QPS_ERR);
	/* The other QPs work */
	struct ibv_mr *m2 = svt_mr(&s.d, 8192, SVT_ALL_ACCESS);
	svt_fill(m2->addr, 4096, 8);
	struct ibv_sge rs = svt_sge(m2, 4096, 4096), ss = svt_sge(m2, 0, 4096);
	svt_post_recv1(y, 1, &rs, 1);
	CHECK(svt_post_send1(x, 2, IBV_WR_SEND, &ss, 1, IBV_SEND_SIGNALED, 0, 0) == 0);
	struct ibv_wc wc;
	for (int i = 0; i < 2; i++) {
		wc = svt_wait(cq2, "other QPs");
		CHECK_WC(wc, IBV_WC_SUCCESS);
	}
	CHECK(memcmp(m2->addr, (char *)m2->addr + 4096, 4096) == 0);
	/* A fresh QP can be created and used */
	struct ibv_qp *z = svt_qp(&s.d, &o);
	svt_connect(z, y->qp_num, s.d.lid, &c);
	(void)z;
	printf("OK\n");
}

/* The batch scenarios: slot i of both buffers is BATCH_STRIDE bytes at
 * i * BATCH_STRIDE; WR i moves its first slot_len(i) bytes, a sequence
 * number and a pattern of its own.  Every 8th WRITE is inline. */
#define BATCH_N 64
#define BATCH_K 37
#define BATCH_STRIDE 8192u
#define BATCH_BUF (1u << 20)
#define BATCH_INLINE 64
#define BATCH_POISON 0xA5

static uint32_t slot_len(int i)
{
	return i % 8 == 7 ? BATCH_INLINE : 6000 + 16 * (uint32_t)i;
}

static void slot_fill(char *buf, int i)
{
	svt_fill(buf, slot_len(i), 4000u + (unsigned)i);
	memcpy(buf, &i, sizeof(i));
}

/* Whether slot i of buf holds its pattern (want 1) or 0xA5 only (want 0). */
static int slot_is(const char *buf, int i, int want)
{
	static char expect[BATCH_STRIDE];
	if (want)
		slot_fill(expect, i);
	else
		memset(expect, BATCH_POISON, slot_len(i));
	return !memcmp(buf + (size_t)i * BATCH_STRIDE, expect, slot_len(i));
}

static void run_batch_target(const char *dev, const char *type)
{
	struct svt_dev d;
	svt_open(&d, dev);
	struct ibv_cq *cq = ibv_create_cq(d.ctx, 64, NULL, NULL, 0);
	CHECK(cq);
	enum ibv_qp_type t = type && !strcmp(type, "uc") ? IBV_QPT_UC : IBV_QPT_RC;
	struct svt_qpopt o = {t, cq, cq, NULL, 0, 16, 16, 1, 0};
	struct ibv_qp *qp = svt_qp(&d, &o);
	char *B = mmap(NULL, BATCH_BUF, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(B != MAP_FAILED);
	memset(B, BATCH_POISON, BATCH_BUF);
	struct ibv_mr *mr = ibv_reg_mr(d.pd, B, BATCH_BUF, SVT_ALL_ACCESS);
	CHECK(mr);
	printf("INFO %u %u %llu %u\n", d.lid, qp->qp_num, (unsigned long long)(uintptr_t)B,
	       mr->rkey);
	struct info peer;
	get_info(&peer);
	struct svt_conn c = {SVT_ALL_ACCESS, 1, 14, 3, 7};
	svt_connect(qp, peer.qpn, (uint16_t)peer.lid, &c);
	printf("READY\n");
	char line[256];
	size_t off, len;
	int n, k, after;
	while (fgets(line, sizeof(line), stdin)) {
		if (!strcmp(line, "PATTERN\n")) {
			for (int i = 0; i < BATCH_N; i++)
				slot_fill(B + (size_t)i * BATCH_STRIDE, i);
			printf("OK\n");
		} else if (sscanf(line, "UNMAP %zu %zu", &off, &len) == 2) {
			CHECK(munmap(B + off, len) == 0);
			printf("OK\n");
		} else if (sscanf(line, "CHECK %d %d %d", &n, &k, &after) == 3) {
			for (int i = 0; i < n; i++)
				if (i != k && !slot_is(B, i, i < k || after))
					FAIL("target slot %d: %s", i,
					     i < k ? "WRITE data missing" : "written after the fault");
			printf("OK\n");
		} else {
			FAIL("bad command '%s'", line);
		}
	}
}

/* One command to the batch target, through the harness. */
static void target_do(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
	expect_line("OK");
}

static void run_batch(const char *dev, const char *what)
{
	int read = strstr(what, "read") != NULL, fault = strstr(what, "fault") != NULL;
	int badkey = strstr(what, "badkey") != NULL, badlkey = strstr(what, "badlkey") != NULL;
	int uc = !strncmp(what, "uc-", 3);
	struct info peer;
	get_info(&peer);
	struct svt_dev d;
	svt_open(&d, dev);
	struct ibv_cq *cq = ibv_create_cq(d.ctx, 256, NULL, NULL, 0);
	CHECK(cq);
	struct svt_qpopt o = {uc ? IBV_QPT_UC : IBV_QPT_RC, cq, cq, NULL, 0, 128, 16, 1,
			      BATCH_INLINE};
	struct ibv_qp *qp = svt_qp(&d, &o);
	struct ibv_mr *mr = svt_mr(&d, BATCH_BUF, SVT_ALL_ACCESS);
	char *A = mr->addr;
	printf("INFO %u %u %llu %u\n", d.lid, qp->qp_num, (unsigned long long)(uintptr_t)A,
	       mr->rkey);
	struct svt_conn c = {SVT_ALL_ACCESS, 1, 14, 3, 7};
	svt_connect(qp, peer.qpn, (uint16_t)peer.lid, &c);
	expect_line("READY");
	memset(A, BATCH_POISON, BATCH_BUF);
	if (read)
		target_do("PATTERN");
	else
		for (int i = 0; i < BATCH_N; i++)
			slot_fill(A + (size_t)i * BATCH_STRIDE, i);
	/* The second page of slot K: the WR faults part way through */
	if (fault)
		target_do("UNMAP %u 4096", BATCH_K * BATCH_STRIDE + 4096);
	static struct ibv_send_wr wr[BATCH_N];
	static struct ibv_sge sge[BATCH_N];
	for (int i = 0; i < BATCH_N; i++) {
		size_t off = (size_t)i * BATCH_STRIDE;
		sge[i] = svt_sge(mr, off, slot_len(i));
		memset(&wr[i], 0, sizeof(wr[i]));
		wr[i].wr_id = 1000 + i;
		wr[i].sg_list = &sge[i];
		wr[i].num_sge = 1;
		wr[i].opcode = read ? IBV_WR_RDMA_READ : IBV_WR_RDMA_WRITE;
		wr[i].send_flags = IBV_SEND_SIGNALED | (!read && i % 8 == 7 ? IBV_SEND_INLINE : 0);
		wr[i].wr.rdma.remote_addr = peer.addr + off;
		wr[i].wr.rdma.rkey = peer.rkey;
		wr[i].next = i + 1 < BATCH_N ? &wr[i + 1] : NULL;
	}
	if (badkey)
		wr[BATCH_K].wr.rdma.rkey ^= 0x5500;
	if (badlkey)
		sge[BATCH_K].lkey ^= 0x5500;
	struct ibv_send_wr *bad = NULL;
	CHECK(ibv_post_send(qp, wr, &bad) == 0);
	/* Every completion is there when ibv_post_send returns */
	struct ibv_wc wc[BATCH_N];
	int got = ibv_poll_cq(cq, BATCH_N, wc);
	CHECK_EQ(got, BATCH_N);
	int k = fault || badkey || badlkey ? BATCH_K : BATCH_N;
	for (int i = 0; i < BATCH_N; i++) {
		/* UC: no NAK, so the fault completes as sent, and nothing stops */
		enum ibv_wc_status want = i < k || uc ? IBV_WC_SUCCESS
					  : i > k     ? IBV_WC_WR_FLUSH_ERR
					  : badlkey   ? IBV_WC_LOC_PROT_ERR
						      : IBV_WC_REM_ACCESS_ERR;
		CHECK_EQ(wc[i].wr_id, 1000 + i);
		CHECK_WC(wc[i], want);
		if (want == IBV_WC_SUCCESS && i != k) {
			CHECK_EQ(wc[i].opcode, read ? IBV_WC_RDMA_READ : IBV_WC_RDMA_WRITE);
			CHECK_EQ(wc[i].byte_len, slot_len(i));
		}
	}
	svt_expect_empty(cq, 100, "after the batch");
	CHECK_EQ(svt_state(qp), k < BATCH_N && !uc ? IBV_QPS_ERR : IBV_QPS_RTS);
	if (read) {
		for (int i = 0; i < BATCH_N; i++)
			if (i != k && !slot_is(A, i, i < k))
				FAIL("local slot %d: %s", i,
				     i < k ? "READ data missing" : "read after the fault");
	} else {
		target_do("CHECK %d %d %d", BATCH_N, k, uc);
	}
	printf("DONE\n");
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc < 3) {
		fprintf(stderr, "usage: %s server|client|victim|survivor DEV\n", argv[0]);
		return 2;
	}
	svt_watchdog(90);
	if (!strcmp(argv[1], "server"))
		run_server(argv[2], 0);
	else if (!strcmp(argv[1], "victim"))
		run_server(argv[2], 1);
	else if (!strcmp(argv[1], "client"))
		run_client(argv[2]);
	else if (!strcmp(argv[1], "survivor"))
		run_survivor(argv[2], argc < 4			 ? 0
				      : !strcmp(argv[3], "sends") ? 1
				      : !strcmp(argv[3], "small") ? 2
								  : 0);
	else if (!strcmp(argv[1], "batch-target"))
		run_batch_target(argv[2], argc > 3 ? argv[3] : NULL);
	else if (!strcmp(argv[1], "batch") && argc > 3)
		run_batch(argv[2], argv[3]);
	else
		return 2;
	fflush(stdout);
	return 0;
}
