/* SPDX-License-Identifier: MIT */
/* Remapped registrations (docs/memory.md): ibv_reg_mr moves the pages of a
 * page-aligned range of private anonymous memory onto a memfd, keeping
 * addresses and contents, so that peers copy into it without a system call.
 * Each scenario rules on one hazard of that move, with a peer process that
 * WRITEs and READs the memory over RC and every byte checked:
 *
 *   sv_remap SCENARIO [-d DEV]
 *
 *   traffic   which memory moves (mmap'd and heap ranges, whole pages) and
 *             which does not (a range sharing pages with other objects);
 *             contents kept across registration and deregistration; bytes
 *             from a peer land, neighbours untouched; MRs inside one block
 *             share it; anonymous memory again after deregistration
 *   kernel    the kernel reads and writes the moved range (read(), write())
 *   signals   a thread reading the range while it moves in and out never
 *             faults (its SIGSEGV blocked, a handler installed)
 *   writers   threads writing the range while it moves in and out lose
 *             nothing (their writes wait in the kernel, userfaultfd)
 *   dontneed  MADV_DONTNEED while registered keeps the contents (the
 *             memfd refills), and zero-fills again after deregistration
 *   attrs     memory with an attribute a move would lose stays in place
 *             and keeps it: huge-page advice, mlock, KSM, fork and dump
 *             advice, a memory policy, a protection key, read-only,
 *             shared, file-backed and stack memory
 *   maxmap    near vm.max_map_count nothing moves (the move splits mappings)
 *   memory    without address space for the copy nothing moves
 *   fork      the child gets a private copy (rdma-core's copy-on-fork), and
 *             its own registrations an arena of their own
 *   race      a peer WRITEing while the owner deregisters and reuses the
 *             memory never corrupts it; its WRITEs fail after
 *   race-rereg  the same with ibv_rereg_mr taking the peer's right away
 *             (CHANGE_ACCESS) or moving the MR to another PD (CHANGE_PD),
 *             which keeps moved memory on the arena: no WRITE lands after
 *             the rereg returned (copies through the mapping were not
 *             held, a helper's probe saw them land in 3 to 6 of 20 rounds)
 *   race-read  the peer READs into an MR of its own that another of its
 *             threads deregisters during the copy and then reuses: no byte
 *             of the READ lands after ibv_dereg_mr returned (the READ
 *             completes SUCCESS or LOC_PROT_ERR), on both transports' ways
 *             (the response's buffer was not held against the dereg); one
 *             READ, or two in one post (staged in a batch before the bytes
 *             move: its holds went with the staging, a review found)
 *   race-inv  a peer WRITEing through a fast-register key while the owner
 *             invalidates it (LOCAL_INV) and reuses the memory: no byte
 *             lands after the LOCAL_INV completed
 *   race-mw   the same through a memory window: LOCAL_INV of a type 2
 *             window, the unbind of a type 1 window, ibv_dealloc_mw of a
 *             bound one (the parent MR stays registered)
 *   deferred  a small SEND into memory that stays where it is travels in
 *             the CQE, and its sender places it before its next WR moves
 *             bytes: after the receiver deregistered (and reused) the
 *             buffer without polling, that placement lands nothing, and the
 *             receive completes LOC_PROT_ERR (a review found the bytes
 *             landing after ibv_dereg_mr returned)
 *   mremap    a registered range moved and grown with mremap, and glibc's
 *             realloc of a registered chunk: bytes follow, the grown part
 *             reads zeros, no other MR is touched
 *   sighandler  a signal handler writing into the range while this thread
 *             moves it (the thread's signals wait, not the handler)
 *   closedfd  the application closes the arena's descriptor and opens a
 *             file of its own under the same number: peers never write
 *             into that file, and the library never punches it
 *   munmap    a range unmapped and mapped anew before deregistration (as
 *             UCX does) keeps the new contents
 *   express-send  the same for a SEND: the receive WQE's first SGE taking
 *             the message in moved memory; two SGEs, too small a buffer,
 *             no receive posted (RNR), a receive SGE past its MR's end, a
 *             deregistered receive key
 *   express   the requester's express way (a WRITE copied at once from what
 *             its caches hold: the peer QP, both keys, the mapping) after
 *             each change behind a warm cache: the responder QP's rights
 *             taken away, the MR deregistered and registered again at the
 *             same address, a WRITE one byte past the MR's end, a read-only
 *             MR, the requester's SGE one byte past its own MR, its MR
 *             deregistered and registered again (the old lkey), the
 *             responder QP destroyed and a new one made: each fails
 *             as the general way fails it, and no byte lands where it may not
 *
 * With SOFTVERBS_REMAP=0 nothing may move, and the traffic checks hold all
 * the same.  Prints "OK sv_remap SCENARIO" or "SKIP ..." and exits 0; a
 * FAIL line and status 1 otherwise. */
#include "svt.h"
#include "softverbs_dv.h"

#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#define PAGE 4096
#define PEER_BUF (4u << 20)

enum { OP_WRITE = 1, OP_READ, OP_STORM, OP_RECONNECT, OP_QUIT, OP_SEND, OP_LOCAL_PAST, OP_STALE_LKEY,
       OP_SEND_STORM, OP_READ_RACE };
/* The SENDs of one OP_SEND_STORM (below the owner QP's 64 receives). */
#define STORM_SENDS 60

struct board {
	_Atomic int peer_up, owner_up;
	uint16_t lid[2];
	uint32_t qpn[2];
	_Atomic uint32_t req, done;
	int op;
	uint32_t rkey, len;
	uint64_t addr;
	unsigned seed;
	int status;		/* ibv_wc_status, or 1000: bytes read back differ */
	_Atomic int stop;
	_Atomic long storm_ok, storm_err;
	_Atomic uint32_t posted; /* The request whose WR the peer posted last */
	_Atomic long race_late, race_ok, race_prot; /* OP_READ_RACE's rounds */
};

static struct board *B;
static const char *dev = "loop0";
static int remap_on = 1;
static struct svt_dev D;
static struct ibv_cq *CQ;
static struct ibv_qp *QP;

/* ---- the peer: RDMA operations on request ---- */

/* OP_READ_RACE's second thread: deregisters the READ's local MR a while
 * after the READ is posted, and reuses its memory at once. */
struct read_race {
	struct ibv_mr *mr;
	char *buf;
	size_t len;
	unsigned delay_us;
	_Atomic int go;
};

static void *read_race_dereg(void *arg)
{
	struct read_race *r = arg;
	while (!atomic_load(&r->go))
		;
	struct timespec t0, t;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	do
		clock_gettime(CLOCK_MONOTONIC, &t);
	while ((t.tv_sec - t0.tv_sec) * 1000000 + (t.tv_nsec - t0.tv_nsec) / 1000 < r->delay_us);
	CHECK(ibv_dereg_mr(r->mr) == 0);
	memset(r->buf, 0x5a, r->len); /* The memory's next use */
	return NULL;
}

/* One round of OP_READ_RACE: a READ of len bytes from the owner's memory
 * into a fresh MR while read_race_dereg takes it away.  B->status: the
 * READ's status, or 1001 when a byte of it landed after the dereg. */
static int read_race_round(struct ibv_pd *pd, uint32_t len, unsigned delay_us)
{
	char *buf = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(buf != MAP_FAILED);
	memset(buf, 0x11, len);
	struct read_race r = {.buf = buf, .len = len, .delay_us = delay_us};
	r.mr = ibv_reg_mr(pd, buf, len, IBV_ACCESS_LOCAL_WRITE);
	CHECK(r.mr);
	/* Odd rounds: two READs of half each, in one post (the requester
	 * batches them, staging the first before the bytes move). */
	int chained = delay_us & 1;
	uint32_t half = len / 2;
	struct ibv_sge s[2] = {{(uintptr_t)buf, chained ? half : len, r.mr->lkey},
			       {(uintptr_t)buf + half, len - half, r.mr->lkey}};
	struct ibv_send_wr wr[2] = {
		{.wr_id = 1, .next = chained ? &wr[1] : NULL, .sg_list = &s[0], .num_sge = 1,
		 .opcode = IBV_WR_RDMA_READ, .send_flags = IBV_SEND_SIGNALED},
		{.wr_id = 2, .sg_list = &s[1], .num_sge = 1, .opcode = IBV_WR_RDMA_READ,
		 .send_flags = IBV_SEND_SIGNALED}};
	wr[0].wr.rdma.remote_addr = B->addr;
	wr[0].wr.rdma.rkey = B->rkey;
	wr[1].wr.rdma.remote_addr = B->addr + half;
	wr[1].wr.rdma.rkey = B->rkey;
	pthread_t t;
	CHECK(pthread_create(&t, NULL, read_race_dereg, &r) == 0);
	atomic_store(&r.go, 1);
	struct ibv_send_wr *bad;
	CHECK(ibv_post_send(QP, wr, &bad) == 0);
	struct ibv_wc wc = svt_wait(CQ, "a READ whose buffer goes");
	if (chained && wc.status == IBV_WC_SUCCESS) {
		struct ibv_wc w2 = svt_wait(CQ, "the second READ whose buffer goes");
		wc.status = w2.status;
	} else if (chained) {
		svt_wait(CQ, "the READ flushed behind the first");
	}
	CHECK(pthread_join(t, NULL) == 0);
	usleep(1000); /* Anything still on its way lands */
	int st = wc.status;
	static char reused[65536];
	memset(reused, 0x5a, sizeof(reused));
	for (size_t off = 0; off < len; off += sizeof(reused)) {
		size_t n = len - off < sizeof(reused) ? len - off : sizeof(reused);
		if (memcmp(buf + off, reused, n)) {
			st = 1001;
			break;
		}
	}
	munmap(buf, len);
	return st;
}

static void peer_main(void)
{
	svt_watchdog(120);
	svt_open(&D, dev);
	CQ = ibv_create_cq(D.ctx, 256, NULL, NULL, 0);
	CHECK(CQ);
	struct svt_qpopt o = {.type = IBV_QPT_RC, .scq = CQ, .rcq = CQ, .max_send_wr = 128};
	QP = svt_qp(&D, &o);
	struct ibv_mr *mr = svt_mr(&D, PEER_BUF, SVT_ALL_ACCESS);
	B->lid[1] = D.lid;
	B->qpn[1] = QP->qp_num;
	atomic_store(&B->peer_up, 1);
	while (!atomic_load(&B->owner_up))
		usleep(1000);
	struct svt_conn c = {SVT_ALL_ACCESS, 12, 14, 7, 7};
	svt_connect(QP, B->qpn[0], B->lid[0], &c);
	for (uint32_t seen = 0;;) {
		while (atomic_load(&B->req) == seen)
			usleep(50);
		seen = atomic_load(&B->req);
		struct ibv_sge s = svt_sge(mr, 0, B->len);
		struct ibv_wc wc;
		if (B->op == OP_QUIT) {
			atomic_store(&B->done, seen);
			exit(0);
		}
		if (B->op == OP_RECONNECT) {
			struct ibv_qp_attr a = {.qp_state = IBV_QPS_RESET};
			CHECK(ibv_modify_qp(QP, &a, IBV_QP_STATE) == 0);
			while (ibv_poll_cq(CQ, 1, &wc) > 0)
				;
			svt_connect(QP, B->qpn[0], B->lid[0], &c);
			atomic_store(&B->done, seen);
			continue;
		}
		if (B->op == OP_WRITE || B->op == OP_STORM || B->op == OP_SEND)
			svt_fill(mr->addr, B->len, B->seed);
		if (B->op == OP_SEND) {
			/* A SEND WITH IMM of len bytes, the seed as immediate. */
			struct ibv_send_wr wr = {.wr_id = 2, .sg_list = &s, .num_sge = 1,
						 .opcode = IBV_WR_SEND_WITH_IMM,
						 .send_flags = IBV_SEND_SIGNALED,
						 .imm_data = htonl(B->seed)};
			struct ibv_send_wr *bad;
			CHECK(ibv_post_send(QP, &wr, &bad) == 0);
			/* Its first try ran in the post (the requester's). */
			atomic_store(&B->posted, seen);
			wc = svt_wait(CQ, "peer SEND");
			B->status = wc.status;
			atomic_store(&B->done, seen);
			continue;
		}
		if (B->op == OP_SEND_STORM) {
			/* STORM_SENDS SENDs WITH IMM of len bytes, one at a time,
			 * the i-th filled with seed + i and carrying i. */
			int st = IBV_WC_SUCCESS;
			for (uint32_t i = 0; i < STORM_SENDS && st == IBV_WC_SUCCESS; i++) {
				svt_fill(mr->addr, B->len, B->seed + i);
				struct ibv_send_wr wr = {.wr_id = 3, .sg_list = &s, .num_sge = 1,
							 .opcode = IBV_WR_SEND_WITH_IMM,
							 .send_flags = IBV_SEND_SIGNALED,
							 .imm_data = htonl(i)};
				struct ibv_send_wr *bad;
				CHECK(ibv_post_send(QP, &wr, &bad) == 0);
				st = svt_wait(CQ, "storm SEND").status;
				if (st == IBV_WC_SUCCESS)
					atomic_fetch_add(&B->storm_ok, 1);
			}
			B->status = st;
			atomic_store(&B->done, seen);
			continue;
		}
		if (B->op == OP_STORM) {
			/* WRITEs until told to stop or one fails. */
			int st = IBV_WC_SUCCESS;
			while (!atomic_load(&B->stop) && st == IBV_WC_SUCCESS) {
				CHECK(svt_post_send1(QP, 1, IBV_WR_RDMA_WRITE, &s, 1, IBV_SEND_SIGNALED,
						     B->addr, B->rkey) == 0);
				wc = svt_wait(CQ, "storm WRITE");
				st = wc.status;
				if (st == IBV_WC_SUCCESS)
					atomic_fetch_add(&B->storm_ok, 1);
				else
					atomic_fetch_add(&B->storm_err, 1);
			}
			B->status = st;
			atomic_store(&B->done, seen);
			continue;
		}
		if (B->op == OP_LOCAL_PAST || B->op == OP_STALE_LKEY) {
			/* A WRITE whose local SGE is one byte past the peer's MR,
			 * or names the key of a small MR of the peer's used a few
			 * times (the caches hold it: its WRITEs carry the bytes the
			 * target already holds, filled with the same seed), then
			 * deregistered and the same memory registered again at
			 * once (a new key: a slot's key byte never repeats at
			 * once).  Whether the bad WR meets the express way's
			 * memo or the general way depends on the coarse clock's
			 * tick (1-4 ms) not passing between them: the status
			 * must be the same either way. */
			struct ibv_sge bad = s;
			struct ibv_mr *small = NULL;
			if (B->op == OP_LOCAL_PAST) {
				bad.addr = (uintptr_t)mr->addr + PEER_BUF - B->len + 1;
			} else {
				void *buf = aligned_alloc(PAGE, PAGE);
				CHECK(buf);
				svt_fill(buf, B->len, B->seed);
				small = ibv_reg_mr(D.pd, buf, PAGE, SVT_ALL_ACCESS);
				CHECK(small);
				struct ibv_sge ok = {(uintptr_t)buf, B->len, small->lkey};
				for (int i = 0; i < 3; i++) {
					CHECK(svt_post_send1(QP, 1, IBV_WR_RDMA_WRITE, &ok, 1,
							     IBV_SEND_SIGNALED, B->addr, B->rkey) == 0);
					CHECK_EQ(svt_wait(CQ, "peer WRITE from its small MR").status,
						 IBV_WC_SUCCESS);
				}
				bad = ok;
				CHECK(ibv_dereg_mr(small) == 0);
				small = ibv_reg_mr(D.pd, buf, PAGE, SVT_ALL_ACCESS);
				CHECK(small);
				CHECK(small->lkey != bad.lkey);
			}
			CHECK(svt_post_send1(QP, 1, IBV_WR_RDMA_WRITE, &bad, 1, IBV_SEND_SIGNALED,
					     B->addr, B->rkey) == 0);
			wc = svt_wait(CQ, "peer WRITE of a bad SGE");
			B->status = wc.status;
			if (small) {
				void *buf = small->addr;
				CHECK(ibv_dereg_mr(small) == 0);
				free(buf);
			}
			atomic_store(&B->done, seen);
			continue;
		}
		if (B->op == OP_READ_RACE) {
			/* Rounds with the dereg at 0 to 2 ms after the post; a
			 * READ in error leaves the QP in error: started again. */
			int st = IBV_WC_SUCCESS;
			for (unsigned i = 0; i < 40 && st != 1001; i++) {
				st = read_race_round(D.pd, B->len, (B->seed + i * 53) % 2000);
				if (st == IBV_WC_SUCCESS)
					atomic_fetch_add(&B->race_ok, 1);
				else if (st == IBV_WC_LOC_PROT_ERR)
					atomic_fetch_add(&B->race_prot, 1);
				else if (st == 1001)
					atomic_fetch_add(&B->race_late, 1);
				else
					break;
				if (st != IBV_WC_SUCCESS && st != 1001) {
					struct ibv_qp_attr a = {.qp_state = IBV_QPS_RESET};
					CHECK(ibv_modify_qp(QP, &a, IBV_QP_STATE) == 0);
					while (ibv_poll_cq(CQ, 1, &wc) > 0)
						;
					svt_connect(QP, B->qpn[0], B->lid[0], &c);
					st = IBV_WC_SUCCESS;
				}
			}
			B->status = st;
			atomic_store(&B->done, seen);
			continue;
		}
		if (B->op == OP_READ)
			memset(mr->addr, 0xee, B->len);
		CHECK(svt_post_send1(QP, 1, B->op == OP_WRITE ? IBV_WR_RDMA_WRITE : IBV_WR_RDMA_READ,
				     &s, 1, IBV_SEND_SIGNALED, B->addr, B->rkey) == 0);
		wc = svt_wait(CQ, "peer op");
		B->status = wc.status;
		if (wc.status == IBV_WC_SUCCESS && B->op == OP_READ) {
			unsigned char *want = malloc(B->len);
			CHECK(want);
			svt_fill(want, B->len, B->seed);
			if (memcmp(want, mr->addr, B->len))
				B->status = 1000;
			free(want);
		}
		atomic_store(&B->done, seen);
	}
}

/* Asks the peer for one operation on [mr->addr + off, + len) (a SEND:
 * len bytes, mr unused) and returns its completion status (1000: a READ
 * brought back other bytes), or 0 at once for a storm or when !wait. */
static int peer_req(int op, struct ibv_mr *mr, size_t off, uint32_t len, unsigned seed, int wait)
{
	B->op = op;
	B->rkey = mr ? mr->rkey : 0;
	B->addr = mr ? (uintptr_t)mr->addr + off : 0;
	B->len = len;
	B->seed = seed;
	uint32_t n = atomic_load(&B->req) + 1;
	atomic_store(&B->req, n);
	if (op == OP_STORM || !wait)
		return 0;
	/* OP_READ_RACE is 40 rounds of 16 MiB (a minute under TSan). */
	uint64_t end = svt_now_ms() + (op == OP_READ_RACE ? 180000 : 10000);
	while (atomic_load(&B->done) != n) {
		if (svt_now_ms() > end)
			FAIL("peer did not answer op %d", op);
		usleep(50);
	}
	return B->status;
}

static int peer_do(int op, struct ibv_mr *mr, size_t off, uint32_t len, unsigned seed)
{
	return peer_req(op, mr, off, len, seed, 1);
}

static void storm_wait(void)
{
	uint32_t n = atomic_load(&B->req);
	uint64_t end = svt_now_ms() + 10000;
	while (atomic_load(&B->done) != n) {
		if (svt_now_ms() > end)
			FAIL("peer's storm did not end");
		usleep(100);
	}
}

static pid_t peer_pid;

static void owner_up(void)
{
	svt_open(&D, dev);
	CQ = ibv_create_cq(D.ctx, 256, NULL, NULL, 0);
	CHECK(CQ);
	struct svt_qpopt o = {.type = IBV_QPT_RC, .scq = CQ, .rcq = CQ};
	QP = svt_qp(&D, &o);
	B->lid[0] = D.lid;
	B->qpn[0] = QP->qp_num;
	uint64_t end = svt_now_ms() + 20000;
	while (!atomic_load(&B->peer_up))
		if (svt_now_ms() > end)
			FAIL("peer did not come up");
		else
			usleep(1000);
	struct svt_conn c = {SVT_ALL_ACCESS, 12, 14, 7, 7};
	svt_connect(QP, B->qpn[1], B->lid[1], &c);
	atomic_store(&B->owner_up, 1);
}

static void peer_quit(void)
{
	if (!peer_pid)
		return;
	B->op = OP_QUIT;
	atomic_fetch_add(&B->req, 1);
	int st;
	CHECK(waitpid(peer_pid, &st, 0) == peer_pid);
	if (!WIFEXITED(st) || WEXITSTATUS(st))
		FAIL("peer ended with status 0x%x", st);
}

/* ---- what the process's mappings say ---- */

/* The line of /proc/self/maps holding addr, in buf. */
static int maps_line(const void *addr, char *buf, size_t n)
{
	FILE *f = fopen("/proc/self/maps", "r");
	CHECK(f);
	int found = 0;
	while (!found && fgets(buf, (int)n, f)) {
		unsigned long s, e;
		if (sscanf(buf, "%lx-%lx", &s, &e) == 2 && s <= (uintptr_t)addr &&
		    (uintptr_t)addr < e)
			found = 1;
	}
	fclose(f);
	return found;
}

/* Whether [p, p + len) lies in the arena: every page's mapping is the
 * softverbs-mr memfd. */
static int moved(const void *p, size_t len)
{
	char line[512];
	for (size_t o = 0; o < len; o += PAGE)
		if (!maps_line((const char *)p + o, line, sizeof(line)) ||
		    !strstr(line, "softverbs-mr"))
			return 0;
	return 1;
}

static void expect_moved(const void *p, size_t len, int want, const char *what)
{
	int m = moved(p, len);
	if (m != (want && remap_on))
		FAIL("%s: %s moved onto the arena", what, m ? "was" : "was not");
}

/* The VmFlags of the mapping holding addr contain flag. */
static int vmflag(const void *addr, const char *flag)
{
	FILE *f = fopen("/proc/self/smaps", "r");
	CHECK(f);
	char line[512];
	int in = 0, has = 0;
	while (fgets(line, sizeof(line), f)) {
		unsigned long s, e;
		if (sscanf(line, "%lx-%lx ", &s, &e) == 2) {
			in = s <= (uintptr_t)addr && (uintptr_t)addr < e;
			continue;
		}
		if (in && !strncmp(line, "VmFlags:", 8)) {
			char pat[8];
			snprintf(pat, sizeof(pat), " %s", flag);
			has = strstr(line + 7, pat) != NULL;
		}
	}
	fclose(f);
	return has;
}

static void *anon(size_t len)
{
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(p != MAP_FAILED);
	return p;
}

static void check_bytes(const void *p, size_t len, unsigned seed, const char *what)
{
	unsigned char *want = malloc(len);
	CHECK(want);
	svt_fill(want, len, seed);
	const unsigned char *got = p;
	for (size_t i = 0; i < len; i++)
		if (got[i] != want[i])
			FAIL("%s: byte %zu is 0x%02x, expected 0x%02x", what, i, got[i], want[i]);
	free(want);
}

static struct ibv_mr *reg(void *p, size_t len)
{
	struct ibv_mr *mr = ibv_reg_mr(D.pd, p, len, SVT_ALL_ACCESS);
	if (!mr)
		FAIL("ibv_reg_mr(%p, %zu): %s", p, len, strerror(errno));
	return mr;
}

/* A peer WRITE of len bytes at off and a READ back, every byte checked on
 * both sides. */
static void roundtrip(struct ibv_mr *mr, size_t off, uint32_t len, unsigned seed,
		      const char *what)
{
	CHECK_EQ(peer_do(OP_WRITE, mr, off, len, seed), IBV_WC_SUCCESS);
	check_bytes((char *)mr->addr + off, len, seed, what);
	svt_fill((char *)mr->addr + off, len, seed + 1);
	CHECK_EQ(peer_do(OP_READ, mr, off, len, seed + 1), IBV_WC_SUCCESS);
}

/* ---- scenarios ---- */

static void sc_traffic(void)
{
	/* mmap'd memory, 4 MiB. */
	size_t big = 4u << 20;
	char *m = anon(big);
	svt_fill(m, big, 1);
	struct ibv_mr *mm = reg(m, big);
	expect_moved(m, big, 1, "mmap'd 4 MiB");
	check_bytes(m, big, 1, "mmap'd range after registration");
	roundtrip(mm, 0, 64, 2, "64 B at 0");
	roundtrip(mm, 4096 - 32, 64, 3, "64 B across a page");
	roundtrip(mm, big - 64, 64, 4, "64 B at the end");
	roundtrip(mm, 1u << 20, 1u << 20, 5, "1 MiB");

	/* Heap memory, whole pages. */
	char *h = aligned_alloc(PAGE, 2 * PAGE);
	CHECK(h);
	svt_fill(h, 2 * PAGE, 6);
	struct ibv_mr *hm = reg(h, 2 * PAGE);
	expect_moved(h, 2 * PAGE, 1, "heap 8 KiB");
	check_bytes(h, 2 * PAGE, 6, "heap range after registration");
	roundtrip(hm, 100, 3000, 7, "heap 3000 B");

	/* A range that shares its pages with other objects stays put, and
	 * its neighbours keep their bytes. */
	char *u = malloc(3 * PAGE);
	CHECK(u);
	svt_fill(u, 3 * PAGE, 8);
	struct ibv_mr *um = reg(u + 100, 2 * PAGE);
	expect_moved(u + 100, PAGE, 0, "a range not made of whole pages");
	roundtrip(um, 0, 2 * PAGE, 9, "unaligned range");
	/* Whole pages under that MR (reached by address) never move: a
	 * peer's copy into it could strand a write. */
	char *pa = (char *)(((uintptr_t)u + 100 + PAGE - 1) & ~(uintptr_t)(PAGE - 1));
	struct ibv_mr *pm = reg(pa, PAGE);
	expect_moved(pa, PAGE, 0, "a page under an MR that stays where it is");
	CHECK_EQ(ibv_dereg_mr(pm), 0);
	check_bytes(u, 100, 8, "bytes before an unaligned MR");
	unsigned char *tail = malloc(3 * PAGE);
	CHECK(tail);
	svt_fill(tail, 3 * PAGE, 8);
	if (memcmp(u + 100 + 2 * PAGE, tail + 100 + 2 * PAGE, PAGE - 100))
		FAIL("bytes after an unaligned MR changed");
	free(tail);

	/* An MR inside a moved range shares its block and outlives the first. */
	struct ibv_mr *sub = reg(m + 8 * PAGE, 4 * PAGE);
	expect_moved(m + 8 * PAGE, 4 * PAGE, 1, "an MR inside a moved range");
	CHECK_EQ(ibv_dereg_mr(mm), 0);
	expect_moved(m + 8 * PAGE, 4 * PAGE, 1, "the inner MR after the outer's deregistration");
	roundtrip(sub, 0, 4 * PAGE, 10, "the inner MR");
	svt_fill(m + 8 * PAGE, 4 * PAGE, 13);
	/* One that only partly overlaps a block stays by address, and works. */
	char *q = anon(8 * PAGE);
	struct ibv_mr *qa = reg(q, 4 * PAGE);
	struct ibv_mr *qb = reg(q + 2 * PAGE, 4 * PAGE);
	expect_moved(q, 4 * PAGE, 1, "a second block");
	expect_moved(q + 4 * PAGE, 2 * PAGE, 0, "an MR partly over a block");
	roundtrip(qb, 0, 4 * PAGE, 12, "an MR partly over a block");
	CHECK_EQ(ibv_dereg_mr(qa), 0);
	check_bytes(q + 2 * PAGE, 4 * PAGE, 13, "an MR partly over a block, its block gone");
	roundtrip(qb, 0, 4 * PAGE, 14, "an MR partly over a block, its block gone");
	CHECK_EQ(ibv_dereg_mr(qb), 0);
	munmap(q, 8 * PAGE);
	CHECK_EQ(ibv_dereg_mr(sub), 0);
	expect_moved(m, big, 0, "the range after its last deregistration");
	check_bytes(m + 8 * PAGE, 4 * PAGE, 13, "contents after deregistration");
	/* Private anonymous memory again: DONTNEED zero-fills. */
	CHECK(madvise(m, big, MADV_DONTNEED) == 0);
	for (size_t i = 0; i < big; i += 512)
		if (m[i])
			FAIL("byte %zu not zero after MADV_DONTNEED past deregistration", i);
	CHECK_EQ(ibv_dereg_mr(hm), 0);
	check_bytes(h + 100, 3000, 8, "heap after deregistration"); /* seed 7+1 */
	CHECK_EQ(ibv_dereg_mr(um), 0);
	free(h);
	free(u);
	munmap(m, big);
}

static void sc_kernel(void)
{
	size_t len = 16 * PAGE;
	char *m = anon(len);
	struct ibv_mr *mr = reg(m, len);
	expect_moved(m, len, 1, "buffer");
	int p[2];
	CHECK(pipe(p) == 0);
	char src[PAGE];
	svt_fill(src, PAGE, 21);
	CHECK_EQ(write(p[1], src, PAGE), PAGE);
	CHECK_EQ(read(p[0], m + 3 * PAGE, PAGE), PAGE); /* The kernel writes into it */
	check_bytes(m + 3 * PAGE, PAGE, 21, "read() into the moved range");
	CHECK_EQ(write(p[1], m + 3 * PAGE, PAGE), PAGE); /* ...and reads from it */
	char back[PAGE];
	CHECK_EQ(read(p[0], back, PAGE), PAGE);
	check_bytes(back, PAGE, 21, "write() from the moved range");
	CHECK_EQ(peer_do(OP_READ, mr, 3 * PAGE, PAGE, 21), IBV_WC_SUCCESS);
	close(p[0]);
	close(p[1]);
	CHECK_EQ(ibv_dereg_mr(mr), 0);
	munmap(m, len);
}

static _Atomic int segv_seen, reader_stop;
static _Atomic long reader_bad, reader_rounds;
static char *reader_buf;
static size_t reader_len;

static void on_segv(int sig)
{
	(void)sig;
	atomic_fetch_add(&segv_seen, 1);
	_exit(3);
}

static void *reader(void *arg)
{
	(void)arg;
	sigset_t s;
	sigemptyset(&s);
	sigaddset(&s, SIGSEGV);
	pthread_sigmask(SIG_BLOCK, &s, NULL);
	unsigned char *want = malloc(reader_len);
	svt_fill(want, reader_len, 31);
	while (!atomic_load(&reader_stop)) {
		if (memcmp(reader_buf, want, reader_len))
			atomic_fetch_add(&reader_bad, 1);
		atomic_fetch_add(&reader_rounds, 1);
	}
	free(want);
	return NULL;
}

static void sc_signals(void)
{
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_segv;
	CHECK(sigaction(SIGSEGV, &sa, NULL) == 0);
	reader_len = 64 * PAGE;
	reader_buf = anon(reader_len);
	svt_fill(reader_buf, reader_len, 31);
	pthread_t t;
	CHECK(pthread_create(&t, NULL, reader, NULL) == 0);
	int moves = 0;
	for (int i = 0; i < 200; i++) {
		struct ibv_mr *mr = reg(reader_buf, reader_len);
		moves += moved(reader_buf, reader_len);
		if (i % 50 == 0)
			CHECK_EQ(peer_do(OP_READ, mr, 0, (uint32_t)reader_len, 31), IBV_WC_SUCCESS);
		CHECK_EQ(ibv_dereg_mr(mr), 0);
	}
	atomic_store(&reader_stop, 1);
	pthread_join(t, NULL);
	if (remap_on && moves != 200)
		FAIL("the range moved %d times of 200", moves);
	CHECK_EQ(atomic_load(&segv_seen), 0);
	if (atomic_load(&reader_bad))
		FAIL("the reader saw other bytes %ld times in %ld rounds", atomic_load(&reader_bad),
		     atomic_load(&reader_rounds));
	munmap(reader_buf, reader_len);
}

static _Atomic int writers_done;
static uint64_t *writers_buf;
static size_t writers_words;

/* Writer w fills its half of the words once, in order, each with its own
 * index, pausing a little between words: a write lost in a move is never
 * written again, so it shows. */
static void *writer(void *arg)
{
	long w = (long)arg;
	size_t half = writers_words / 2;
	volatile uint64_t *b = writers_buf + w * half;
	for (size_t i = 0; i < half; i++) {
		b[i] = w * half + i + 1;
		struct timespec t0, t1;
		clock_gettime(CLOCK_MONOTONIC, &t0);
		do /* About 5 us a word: the writes span many moves */
			clock_gettime(CLOCK_MONOTONIC, &t1);
		while ((t1.tv_sec - t0.tv_sec) * 1000000000L + (t1.tv_nsec - t0.tv_nsec) < 5000);
	}
	atomic_fetch_add(&writers_done, 1);
	return NULL;
}

static void sc_writers(void)
{
	size_t len = 64 * PAGE;
	writers_buf = anon(len);
	writers_words = len / 8;
	pthread_t t[2];
	for (long w = 0; w < 2; w++)
		CHECK(pthread_create(&t[w], NULL, writer, (void *)w) == 0);
	int moves = 0, cycles = 0;
	while (atomic_load(&writers_done) < 2) {
		struct ibv_mr *mr = reg(writers_buf, len);
		moves += moved(writers_buf, PAGE);
		CHECK_EQ(ibv_dereg_mr(mr), 0);
		cycles++;
	}
	for (int w = 0; w < 2; w++)
		pthread_join(t[w], NULL);
	if (remap_on && moves != cycles)
		FAIL("the range moved %d times of %d", moves, cycles);
	if (cycles < 10)
		FAIL("only %d registrations while the writers ran", cycles);
	size_t lost = 0, first = 0;
	for (size_t i = 0; i < writers_words; i++)
		if (writers_buf[i] != i + 1 && !lost++)
			first = i;
	if (lost)
		FAIL("%zu of %zu writes lost (first: word %zu holds %llu)", lost, writers_words,
		     first, (unsigned long long)writers_buf[first]);
	printf("writers: %d registrations, %d moves, %zu writes\n", cycles, moves, writers_words);
	munmap(writers_buf, len);
}

static void sc_dontneed(void)
{
	size_t len = 8 * PAGE;
	char *m = anon(len);
	svt_fill(m, len, 41);
	struct ibv_mr *mr = reg(m, len);
	expect_moved(m, len, 1, "buffer");
	CHECK(madvise(m, len, MADV_DONTNEED) == 0);
	if (remap_on)
		check_bytes(m, len, 41, "MADV_DONTNEED while registered (the memfd refills)");
	roundtrip(mr, 0, (uint32_t)len, 42, "after MADV_DONTNEED");
	CHECK_EQ(ibv_dereg_mr(mr), 0);
	CHECK(madvise(m, len, MADV_DONTNEED) == 0);
	for (size_t i = 0; i < len; i++)
		if (m[i])
			FAIL("MADV_DONTNEED after deregistration left byte %zu", i);
	munmap(m, len);
}

/* Registers a fresh mapping that setup() gave an attribute; it must stay
 * where it is, keep flag (if named) and carry a peer's bytes. */
static void stays(const char *what, char *m, size_t len, const char *flag, int readonly)
{
	struct ibv_mr *mr = ibv_reg_mr(D.pd, m, len,
				       readonly ? IBV_ACCESS_REMOTE_READ : SVT_ALL_ACCESS);
	if (!mr)
		FAIL("%s: ibv_reg_mr: %s", what, strerror(errno));
	if (moved(m, len))
		FAIL("%s: moved onto the arena", what);
	if (flag && !vmflag(m, flag))
		FAIL("%s: lost VmFlags %s", what, flag);
	if (readonly) {
		CHECK_EQ(peer_do(OP_READ, mr, 0, PAGE, 0), IBV_WC_SUCCESS);
	} else {
		CHECK_EQ(peer_do(OP_WRITE, mr, 0, (uint32_t)len, 51), IBV_WC_SUCCESS);
		check_bytes(m, len, 51, what);
	}
	CHECK_EQ(ibv_dereg_mr(mr), 0);
	if (flag && !vmflag(m, flag))
		FAIL("%s: lost VmFlags %s after deregistration", what, flag);
}

static void sc_attrs(void)
{
	size_t len = 16 * PAGE;
	static const struct {
		const char *what, *flag;
		int advice;
	} adv[] = {
		{"MADV_HUGEPAGE", "hg", MADV_HUGEPAGE}, {"MADV_NOHUGEPAGE", "nh", MADV_NOHUGEPAGE},
		{"MADV_DONTFORK", "dc", MADV_DONTFORK}, {"MADV_WIPEONFORK", "wf", MADV_WIPEONFORK},
		{"MADV_DONTDUMP", "dd", MADV_DONTDUMP}, {"MADV_MERGEABLE", "mg", MADV_MERGEABLE},
	};
	for (size_t i = 0; i < sizeof(adv) / sizeof(adv[0]); i++) {
		char *m = anon(len);
		if (madvise(m, len, adv[i].advice)) {
			printf("note: %s not available (%s)\n", adv[i].what, strerror(errno));
			munmap(m, len);
			continue;
		}
		stays(adv[i].what, m, len, adv[i].flag, 0);
		munmap(m, len);
	}
	char *m = anon(len);
	if (mlock(m, len) == 0 && vmflag(m, "lo"))
		stays("mlock", m, len, "lo", 0);
	else /* Refused, or a sanitizer's mlock that does nothing */
		printf("note: mlock refused or without effect (%s)\n", strerror(errno));
	munmap(m, len);
	/* A policy of its own (MPOL_PREFERRED on node 0). */
	m = anon(len);
	unsigned long node0 = 1;
	if (syscall(SYS_mbind, m, len, 1 /* MPOL_PREFERRED */, &node0, 64UL, 0U) == 0)
		stays("mbind", m, len, NULL, 0);
	else
		printf("note: mbind refused (%s)\n", strerror(errno));
	munmap(m, len);
	/* A protection key. */
	m = anon(len);
	long pkey = syscall(SYS_pkey_alloc, 0UL, 0UL);
	if (pkey > 0 && syscall(SYS_pkey_mprotect, m, len, PROT_READ | PROT_WRITE, pkey) == 0) {
		stays("pkey", m, len, NULL, 0);
		syscall(SYS_pkey_free, pkey);
	} else {
		printf("note: protection keys not available\n");
	}
	munmap(m, len);
	/* Read-only memory. */
	m = anon(len);
	svt_fill(m, PAGE, 0);
	CHECK(mprotect(m, len, PROT_READ) == 0);
	stays("read-only", m, len, NULL, 1);
	munmap(m, len);
	/* Shared anonymous memory (already shared: nothing to gain). */
	m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	CHECK(m != MAP_FAILED);
	stays("MAP_SHARED|MAP_ANONYMOUS", m, len, NULL, 0);
	munmap(m, len);
	/* A private file mapping. */
	char path[] = "/tmp/sv_remap.XXXXXX";
	int fd = mkstemp(path);
	CHECK(fd >= 0);
	unlink(path);
	CHECK(ftruncate(fd, (off_t)len) == 0);
	m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
	CHECK(m != MAP_FAILED);
	close(fd);
	stays("MAP_PRIVATE file", m, len, NULL, 0);
	munmap(m, len);
	/* The stack. */
	char stack[6 * PAGE];
	char *s = (char *)(((uintptr_t)stack + PAGE - 1) & ~(uintptr_t)(PAGE - 1));
	stays("stack", s, 4 * PAGE, NULL, 0);
}

static long map_count(void)
{
	FILE *f = fopen("/proc/self/maps", "r");
	CHECK(f);
	long n = 0;
	int c;
	while ((c = fgetc(f)) != EOF)
		n += c == '\n';
	fclose(f);
	return n;
}

static void sc_maxmap(void)
{
	FILE *f = fopen("/proc/sys/vm/max_map_count", "r");
	long limit = 0;
	CHECK(f && fscanf(f, "%ld", &limit) == 1);
	fclose(f);
	if (limit > 1000000) {
		printf("SKIP sv_remap maxmap: vm.max_map_count is %ld\n", limit);
		return;
	}
	/* Between the library's refusal point (an eighth below the limit) and
	 * the limit: every other page of a region read-only, two more
	 * mappings each. */
	long target = limit - limit / 16;
	long k = (target - map_count()) / 2;
	CHECK(k > 0);
	size_t pages = (size_t)k * 2 + 2;
	char *z = mmap(NULL, pages * PAGE, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	CHECK(z != MAP_FAILED);
	for (size_t i = 1; i < pages - 1; i += 2)
		CHECK(mprotect(z + i * PAGE, PAGE, PROT_READ) == 0);
	long n = map_count();
	if (n < limit - limit / 8 + 8 || n >= limit)
		FAIL("made %ld mappings, wanted about %ld of %ld", n, target, limit);
	size_t len = 8 * PAGE;
	char *m = anon(len);
	svt_fill(m, len, 61);
	struct ibv_mr *mr = reg(m, len);
	if (moved(m, len))
		FAIL("moved with %ld mappings of vm.max_map_count %ld", n, limit);
	check_bytes(m, len, 61, "near max_map_count");
	roundtrip(mr, 0, (uint32_t)len, 62, "near max_map_count");
	CHECK_EQ(ibv_dereg_mr(mr), 0);
	munmap(z, pages * PAGE);
	mr = reg(m, len);
	expect_moved(m, len, 1, "once the mappings are gone");
	CHECK_EQ(ibv_dereg_mr(mr), 0);
	munmap(m, len);
}

static int sanitized(void)
{
	char line[512];
	FILE *f = fopen("/proc/self/maps", "r");
	int found = 0;
	while (f && fgets(line, sizeof(line), f))
		found |= strstr(line, "libasan") || strstr(line, "libtsan");
	if (f)
		fclose(f);
	return found;
}

static void sc_memory(void)
{
	if (sanitized()) {
		printf("SKIP sv_remap memory: a sanitizer reserves the address space\n");
		return;
	}
	size_t len = 64u << 20;
	char *m = anon(len);
	svt_fill(m, len, 71);
	struct rlimit old, tight;
	CHECK(getrlimit(RLIMIT_AS, &old) == 0);
	FILE *f = fopen("/proc/self/statm", "r");
	unsigned long vm_pages;
	CHECK(f && fscanf(f, "%lu", &vm_pages) == 1);
	fclose(f);
	/* Room for the library's own allocations, not for a piece of the copy. */
	tight = old;
	tight.rlim_cur = vm_pages * PAGE + (8u << 20);
	CHECK(setrlimit(RLIMIT_AS, &tight) == 0);
	struct ibv_mr *mr = reg(m, len);
	CHECK(setrlimit(RLIMIT_AS, &old) == 0);
	if (moved(m, len))
		FAIL("moved without address space for the copy");
	check_bytes(m, len, 71, "after a move that could not be made");
	roundtrip(mr, len - (1u << 20), 1u << 20, 72, "64 MiB MR left in place");
	CHECK_EQ(ibv_dereg_mr(mr), 0);
	munmap(m, len);
}

static void sc_fork(void)
{
	size_t len = 32 * PAGE;
	char *m = anon(len);
	svt_fill(m, len, 81);
	struct ibv_mr *mr = reg(m, len);
	expect_moved(m, len, 1, "buffer");
	int to_child[2], to_parent[2];
	CHECK(pipe(to_child) == 0 && pipe(to_parent) == 0);
	pid_t c = fork();
	CHECK(c >= 0);
	char x;
	if (c == 0) {
		alarm(60);
		check_bytes(m, len, 81, "the child's copy at fork");
		if (moved(m, len))
			FAIL("the child still shares the arena");
		svt_fill(m, len, 82); /* Only the child's copy */
		CHECK_EQ(write(to_parent[1], "w", 1), 1);
		CHECK_EQ(read(to_child[0], &x, 1), 1); /* The parent took a peer WRITE */
		check_bytes(m, len, 82, "the child's copy after the parent's WRITE");
		/* A registration of the child's own: an arena of its own. */
		struct svt_dev d2;
		svt_open(&d2, dev);
		char *n = anon(4 * PAGE);
		svt_fill(n, 4 * PAGE, 83);
		struct ibv_mr *cm = ibv_reg_mr(d2.pd, n, 4 * PAGE, SVT_ALL_ACCESS);
		CHECK(cm);
		expect_moved(n, 4 * PAGE, 1, "the child's own MR");
		check_bytes(n, 4 * PAGE, 83, "the child's own MR");
		CHECK_EQ(ibv_dereg_mr(cm), 0);
		_exit(0);
	}
	CHECK_EQ(read(to_parent[0], &x, 1), 1);
	check_bytes(m, len, 81, "the parent's memory after the child wrote its copy");
	roundtrip(mr, 0, (uint32_t)len, 84, "the parent's MR after fork");
	CHECK_EQ(write(to_child[1], "r", 1), 1);
	int st;
	CHECK(waitpid(c, &st, 0) == c);
	if (!WIFEXITED(st) || WEXITSTATUS(st))
		FAIL("the child failed (status 0x%x)", st);
	CHECK_EQ(ibv_dereg_mr(mr), 0);
	munmap(m, len);

	/* The child's copy is the memory at fork, even when the parent
	 * writes it at once and deregisters it. */
	size_t big = 64u << 20;
	char *g = anon(big);
	svt_fill(g, big, 86);
	mr = reg(g, big);
	expect_moved(g, big, 1, "64 MiB buffer");
	c = fork();
	CHECK(c >= 0);
	if (c == 0) {
		alarm(60);
		check_bytes(g, big, 86, "the child's copy of 64 MiB at fork");
		_exit(0);
	}
	memset(g, 0x5a, big); /* While the child looks at its copy */
	CHECK_EQ(ibv_dereg_mr(mr), 0);
	CHECK(waitpid(c, &st, 0) == c);
	if (!WIFEXITED(st) || WEXITSTATUS(st))
		FAIL("the child's copy of 64 MiB changed after fork (status 0x%x)", st);
	munmap(g, big);
}

/* The application moves and grows a registered range with mremap (glibc's
 * realloc of a large chunk does): its bytes follow it, the grown part
 * reads as zeros, another MR's bytes are never touched, and deregistration
 * keeps all of it. */
static void sc_mremap(void)
{
	size_t len = 1u << 20;
	char *a = anon(len), *b = anon(len);
	svt_fill(a, len, 121);
	svt_fill(b, len, 122);
	struct ibv_mr *ma = reg(a, len), *mb = reg(b, len);
	expect_moved(a, len, 1, "first buffer");
	expect_moved(b, len, 1, "second buffer");
	/* Grown in place where there is room, else moved: either way. */
	char *g = mremap(a, len, 4 * len, MREMAP_MAYMOVE);
	CHECK(g != MAP_FAILED);
	check_bytes(g, len, 121, "the range after mremap");
	for (size_t i = len; i < 4 * len; i += 512)
		if (g[i])
			FAIL("the grown part holds byte 0x%02x at %zu, not zero", g[i], i);
	memset(g + len, 0x77, 3 * len); /* Writes into the grown part */
	check_bytes(b, len, 122, "another MR after the first one's mremap");
	CHECK_EQ(peer_do(OP_READ, mb, 0, (uint32_t)len, 122), IBV_WC_SUCCESS);
	CHECK_EQ(ibv_dereg_mr(ma), 0);
	check_bytes(g, len, 121, "the moved range after deregistration");
	for (size_t i = len; i < 4 * len; i += 512)
		if ((unsigned char)g[i] != 0x77)
			FAIL("the grown part lost a write at %zu after deregistration", i);
	if (moved(g, 4 * len))
		FAIL("the moved range is still the arena's after deregistration");
	CHECK_EQ(ibv_dereg_mr(mb), 0);
	check_bytes(b, len, 122, "the second buffer after deregistration");
	munmap(g, 4 * len);
	munmap(b, len);

	/* glibc's realloc of a registered mmap'd chunk, registered with its
	 * pages (as UCX's registration cache does). */
	size_t n = 1u << 20;
	char *r = malloc(n);
	CHECK(r);
	svt_fill(r, n, 123);
	uintptr_t lo = (uintptr_t)r & ~(uintptr_t)(PAGE - 1);
	uintptr_t hi = ((uintptr_t)r + n + PAGE - 1) & ~(uintptr_t)(PAGE - 1);
	struct ibv_mr *mr = reg((void *)lo, hi - lo);
	char *r2 = realloc(r, 4 * n);
	CHECK(r2);
	check_bytes(r2, n, 123, "a registered buffer after realloc");
	CHECK_EQ(ibv_dereg_mr(mr), 0);
	check_bytes(r2, n, 123, "a realloc'd buffer after deregistration");
	free(r2);
}

static volatile sig_atomic_t ticks;
static volatile uint64_t *tick_word;

static void on_tick(int sig)
{
	(void)sig;
	ticks++;
	(*tick_word)++; /* Into the range being moved */
}

/* A signal handler that writes into the range while this thread moves it
 * must not wait for itself. */
static void sc_sighandler(void)
{
	size_t len = 32u << 20;
	char *m = anon(len);
	tick_word = (volatile uint64_t *)(m + len / 2);
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_tick;
	sa.sa_flags = SA_RESTART;
	CHECK(sigaction(SIGALRM, &sa, NULL) == 0);
	/* A timer whose signal goes to this thread only (a process-directed
	 * one would also reach the library's threads, whose handlers would
	 * race this one's increments). */
	struct sigevent sev;
	memset(&sev, 0, sizeof(sev));
	sev.sigev_notify = SIGEV_THREAD_ID;
	sev.sigev_signo = SIGALRM;
	sev._sigev_un._tid = (pid_t)syscall(SYS_gettid); /* sigev_notify_thread_id */
	timer_t tm;
	CHECK(timer_create(CLOCK_MONOTONIC, &sev, &tm) == 0);
	struct itimerspec its = {{0, 200000}, {0, 200000}};
	CHECK(timer_settime(tm, 0, &its, NULL) == 0);
	uint64_t end = svt_now_ms() + 100;
	for (int i = 0; i < 20 || svt_now_ms() < end; i++) {
		struct ibv_mr *mr = reg(m, len);
		CHECK_EQ(ibv_dereg_mr(mr), 0);
	}
	CHECK(timer_delete(tm) == 0);
	signal(SIGALRM, SIG_DFL);
	svt_watchdog(240);
	if ((uint64_t)ticks != *tick_word)
		FAIL("%ld ticks, the word in the range counted %llu", (long)ticks,
		     (unsigned long long)*tick_word);
	if (ticks < 5)
		FAIL("only %ld ticks", (long)ticks);
	munmap(m, len);
}

/* Both ends back to RTS after the peer's QP went to ERR (the owner's QP
 * too, since a responder error takes it there). */
static void reconnect_both(void)
{
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_RESET};
	CHECK(ibv_modify_qp(QP, &a, IBV_QP_STATE) == 0);
	struct ibv_wc wc;
	while (ibv_poll_cq(CQ, 1, &wc) > 0)
		;
	struct svt_conn c = {SVT_ALL_ACCESS, 12, 14, 7, 7};
	svt_connect(QP, B->qpn[1], B->lid[1], &c);
	B->op = OP_RECONNECT;
	uint32_t n = atomic_load(&B->req) + 1;
	atomic_store(&B->req, n);
	storm_wait();
}

/* Starts the peer's storm of WRITEs of len bytes into mr (OP_STORM) and
 * waits until min_ok of them completed. */
static void storm_start(struct ibv_mr *mr, uint32_t len, unsigned seed, long min_ok)
{
	atomic_store(&B->stop, 0);
	atomic_store(&B->storm_ok, 0);
	atomic_store(&B->storm_err, 0);
	peer_do(OP_STORM, mr, 0, len, seed);
	while (atomic_load(&B->storm_ok) < min_ok)
		usleep(50);
}

/* After the storm's key went (what: how): the memory's next use, [m, m +
 * len) filled from seed, keeps every byte while the storm goes on, and
 * the storm ends in REM_ACCESS_ERR. */
static void storm_end(char *m, size_t len, unsigned seed, const char *what)
{
	svt_fill(m, len, seed);
	usleep(20000);
	atomic_store(&B->stop, 1);
	storm_wait();
	check_bytes(m, len, seed, what);
	if (B->status != IBV_WC_REM_ACCESS_ERR)
		FAIL("the peer's WRITEs after %s ended with %s", what,
		     ibv_wc_status_str(B->status));
}

static void sc_race(void)
{
	size_t len = 16 * PAGE;
	for (int round = 0; round < 20; round++) {
		char *m = anon(len);
		struct ibv_mr *mr = reg(m, len);
		storm_start(mr, 4 * PAGE, 91, 20);
		CHECK_EQ(ibv_dereg_mr(mr), 0);
		storm_end(m, len, 92, "ibv_dereg_mr");
		munmap(m, len);
		/* The peer's QP is in error now: both ends start again. */
		reconnect_both();
	}
}

static void sc_race_rereg(void)
{
	size_t len = 64 * PAGE;
	struct ibv_pd *pd2 = ibv_alloc_pd(D.ctx);
	CHECK(pd2);
	for (int round = 0; round < 20; round++) {
		char *m = anon(len);
		struct ibv_mr *mr = reg(m, len);
		storm_start(mr, (uint32_t)len, 97, 2 + round % 4);
		if (round % 2)
			CHECK_EQ(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_PD, pd2, NULL, 0, 0), 0);
		else
			CHECK_EQ(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0,
					      IBV_ACCESS_LOCAL_WRITE),
				 0);
		storm_end(m, len, 98,
			  round % 2 ? "ibv_rereg_mr(CHANGE_PD)" : "ibv_rereg_mr(CHANGE_ACCESS)");
		CHECK_EQ(ibv_dereg_mr(mr), 0);
		munmap(m, len);
		reconnect_both();
	}
	CHECK_EQ(ibv_dealloc_pd(pd2), 0);
}

static void sc_race_read(void)
{
	size_t len = 16u << 20;
	char *m = anon(len);
	svt_fill(m, len, 95);
	struct ibv_mr *mr = reg(m, len);
	/* The peer's QP goes to error on a READ that lost its buffer: ours
	 * starts again with it (reconnect_both, after the rounds). */
	int st = peer_do(OP_READ_RACE, mr, 0, (uint32_t)len, 7);
	printf("race-read: %ld READs completed, %ld refused (LOC_PROT_ERR), %ld landed late\n",
	       atomic_load(&B->race_ok), atomic_load(&B->race_prot), atomic_load(&B->race_late));
	if (st == 1001)
		FAIL("a READ's bytes landed in its buffer after ibv_dereg_mr returned");
	if (st != IBV_WC_SUCCESS)
		FAIL("a READ whose buffer went completed %s", ibv_wc_status_str(st));
	CHECK_EQ(ibv_dereg_mr(mr), 0);
	munmap(m, len);
	reconnect_both();
}

/* A fast-register key over [m, m + len) on QP, remote write allowed
 * (softverbs_dv.h, found with dlsym: this program links the system's
 * libibverbs). */
static struct ibv_mr *fast_reg(char *m, size_t len)
{
	__typeof__(softverbs_alloc_fast_reg_mr) *alloc =
		(__typeof__(softverbs_alloc_fast_reg_mr) *)dlsym(RTLD_DEFAULT,
								  "softverbs_alloc_fast_reg_mr");
	__typeof__(softverbs_post_fast_reg) *post =
		(__typeof__(softverbs_post_fast_reg) *)dlsym(RTLD_DEFAULT, "softverbs_post_fast_reg");
	if (!alloc || !post)
		FAIL("softverbs_alloc_fast_reg_mr not found: not softverbs' libibverbs");
	struct ibv_mr *mr = alloc(D.pd, 1);
	CHECK(mr);
	struct softverbs_fast_reg_wr fr = {
		.wr_id = 77, .send_flags = IBV_SEND_SIGNALED, .mr = mr, .key = 0x42,
		.access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE, .iova = (uintptr_t)m,
		.length = len, .addr = (uintptr_t)m};
	CHECK_EQ(post(QP, &fr), 0);
	struct ibv_wc wc = svt_wait(CQ, "fast-register");
	if (wc.status != IBV_WC_SUCCESS || wc.opcode != SOFTVERBS_WC_FAST_REG)
		FAIL("fast-register completed %s, opcode %d", ibv_wc_status_str(wc.status),
		     wc.opcode);
	return mr;
}

/* A QP of its own, connected to itself, with its CQ in *cq: the peer's
 * WRITE that meets an ended key takes QP to ERR, which would flush a
 * LOCAL_INV (or bind) still waiting for copies there. */
static struct ibv_qp *self_qp(struct ibv_cq **cq)
{
	*cq = ibv_create_cq(D.ctx, 16, NULL, NULL, 0);
	CHECK(*cq);
	struct svt_qpopt io = {.type = IBV_QPT_RC, .scq = *cq, .rcq = *cq, .max_send_wr = 16};
	struct ibv_qp *qp = svt_qp(&D, &io);
	struct svt_conn ic = {SVT_ALL_ACCESS, 12, 14, 7, 7};
	svt_connect(qp, qp->qp_num, D.lid, &ic);
	return qp;
}

static void sc_race_inv(void)
{
	size_t len = PEER_BUF;
	/* The LOCAL_INVs go on a QP of their own (self_qp). */
	struct ibv_cq *icq;
	struct ibv_qp *iqp = self_qp(&icq);
	for (int round = 0; round < 10; round++) {
		char *m = anon(len);
		struct ibv_mr *mr = fast_reg(m, len);
		storm_start(mr, (uint32_t)len, 93, 2 + round % 3);
		struct ibv_send_wr inv = {.wr_id = 78, .opcode = IBV_WR_LOCAL_INV,
					  .send_flags = IBV_SEND_SIGNALED,
					  .invalidate_rkey = mr->rkey};
		struct ibv_send_wr *bad;
		CHECK_EQ(ibv_post_send(iqp, &inv, &bad), 0);
		struct ibv_wc wc = svt_wait(icq, "LOCAL_INV");
		if (wc.status != IBV_WC_SUCCESS || wc.wr_id != 78)
			FAIL("LOCAL_INV completed %s (wr_id %llu)", ibv_wc_status_str(wc.status),
			     (unsigned long long)wc.wr_id);
		storm_end(m, len, 94, "LOCAL_INV");
		CHECK_EQ(ibv_dereg_mr(mr), 0);
		munmap(m, len);
		reconnect_both();
	}
	CHECK_EQ(ibv_destroy_qp(iqp), 0);
	CHECK_EQ(ibv_destroy_cq(icq), 0);
}

/* A peer WRITEing through a memory window over [m, m + len) while the
 * owner ends the window: LOCAL_INV of a type 2 window, an unbind (bind of
 * length 0) of a type 1 window, or ibv_dealloc_mw of a bound type 2
 * window.  Once that completed (or returned), the memory is reused and no
 * byte may land; the parent MR stays registered all along.  Copies through
 * a window held only the parent, and an invalidation did not wait for
 * them: a helper's probe saw up to 660 KB land after LOCAL_INV completed. */
static void sc_race_mw(void)
{
	size_t len = PEER_BUF;
	struct ibv_cq *icq;
	struct ibv_qp *iqp = self_qp(&icq); /* LOCAL_INVs and type 1 binds */
	static const char *const how[] = {"LOCAL_INV of a type 2 window",
					  "the unbind of a type 1 window",
					  "ibv_dealloc_mw of a bound type 2 window"};
	for (int round = 0; round < 9; round++) {
		int kind = round % 3;
		char *m = anon(len);
		struct ibv_mr *mr = ibv_reg_mr(D.pd, m, len, SVT_ALL_ACCESS | IBV_ACCESS_MW_BIND);
		CHECK(mr);
		struct ibv_mw *mw = ibv_alloc_mw(D.pd, kind == 1 ? IBV_MW_TYPE_1 : IBV_MW_TYPE_2);
		CHECK(mw);
		struct ibv_mw_bind_info bi = {.mr = mr, .addr = (uintptr_t)m, .length = len,
					      .mw_access_flags = IBV_ACCESS_REMOTE_WRITE};
		uint32_t rkey;
		struct ibv_wc wc;
		if (kind == 1) {
			struct ibv_mw_bind b = {.wr_id = 80, .send_flags = IBV_SEND_SIGNALED,
						.bind_info = bi};
			CHECK_EQ(ibv_bind_mw(iqp, mw, &b), 0);
			wc = svt_wait(icq, "type 1 bind");
			rkey = mw->rkey;
		} else {
			/* A type 2 window is bound to the QP the peer's WRITEs reach. */
			rkey = ibv_inc_rkey(mw->rkey);
			struct ibv_send_wr bw = {.wr_id = 80, .opcode = IBV_WR_BIND_MW,
						 .send_flags = IBV_SEND_SIGNALED};
			bw.bind_mw.mw = mw;
			bw.bind_mw.rkey = rkey;
			bw.bind_mw.bind_info = bi;
			struct ibv_send_wr *bad;
			CHECK_EQ(ibv_post_send(QP, &bw, &bad), 0);
			wc = svt_wait(CQ, "type 2 bind");
		}
		if (wc.status != IBV_WC_SUCCESS || wc.wr_id != 80)
			FAIL("bind completed %s (wr_id %llu)", ibv_wc_status_str(wc.status),
			     (unsigned long long)wc.wr_id);
		struct ibv_mr through = *mr;
		through.rkey = rkey;
		storm_start(&through, (uint32_t)len, 95, 2 + round % 4);
		if (kind == 0) {
			struct ibv_send_wr inv = {.wr_id = 81, .opcode = IBV_WR_LOCAL_INV,
						  .send_flags = IBV_SEND_SIGNALED,
						  .invalidate_rkey = rkey};
			struct ibv_send_wr *bad;
			CHECK_EQ(ibv_post_send(iqp, &inv, &bad), 0);
			wc = svt_wait(icq, "LOCAL_INV");
		} else if (kind == 1) {
			struct ibv_mw_bind b = {.wr_id = 81, .send_flags = IBV_SEND_SIGNALED,
						.bind_info = {.mr = mr}};
			CHECK_EQ(ibv_bind_mw(iqp, mw, &b), 0);
			wc = svt_wait(icq, "type 1 unbind");
		} else {
			CHECK_EQ(ibv_dealloc_mw(mw), 0);
			mw = NULL;
			wc.status = IBV_WC_SUCCESS;
			wc.wr_id = 81;
		}
		if (wc.status != IBV_WC_SUCCESS || wc.wr_id != 81)
			FAIL("%s completed %s (wr_id %llu)", how[kind], ibv_wc_status_str(wc.status),
			     (unsigned long long)wc.wr_id);
		storm_end(m, len, 96, how[kind]);
		if (mw)
			CHECK_EQ(ibv_dealloc_mw(mw), 0);
		CHECK_EQ(ibv_dereg_mr(mr), 0);
		munmap(m, len);
		reconnect_both();
	}
	CHECK_EQ(ibv_destroy_qp(iqp), 0);
	CHECK_EQ(ibv_destroy_cq(icq), 0);
}

/* Warm WRITEs of 64 bytes at 64 * i, checked. */
static void warm(struct ibv_mr *mr, unsigned seed, const char *what)
{
	for (int i = 0; i < 8; i++) {
		CHECK_EQ(peer_do(OP_WRITE, mr, 64 * i, 64, seed + i), IBV_WC_SUCCESS);
		check_bytes((char *)mr->addr + 64 * i, 64, seed + i, what);
	}
}

/* A peer WRITE that must fail with want, the memory left as it was. */
static void refused(struct ibv_mr *mr, size_t off, uint32_t len, int want, char *m, size_t mlen,
		    unsigned seed, const char *what)
{
	svt_fill(m, mlen, seed);
	int st = peer_do(OP_WRITE, mr, off, len, seed + 1);
	if (st != want)
		FAIL("%s: the peer's WRITE ended with %s, expected %s", what,
		     ibv_wc_status_str(st), ibv_wc_status_str(want));
	check_bytes(m, mlen, seed, what);
}

/* A peer WRITE to [mr->addr, + 64) whose local side op makes bad: it must
 * fail with LOC_PROT_ERR, the memory [m, m + mlen) left as it was (filled
 * with seed, which the peer's own WRITEs of OP_STALE_LKEY also carry). */
static void local_refused(int op, struct ibv_mr *mr, char *m, size_t mlen, unsigned seed,
			  const char *what)
{
	svt_fill(m, mlen, seed);
	int st = peer_do(op, mr, 0, 64, seed);
	if (st != IBV_WC_LOC_PROT_ERR)
		FAIL("%s: %s, expected LOC_PROT_ERR", what, ibv_wc_status_str(st));
	check_bytes(m, mlen, seed, what);
	reconnect_both();
}

static void sc_express(void)
{
	size_t len = 16 * PAGE;
	/* One page more, never registered: a WRITE past the MR lands nowhere. */
	char *m = anon(len + PAGE);
	struct ibv_mr *mr = reg(m, len);
	expect_moved(m, len, remap_on, "the express target");
	warm(mr, 200, "warm WRITEs");

	/* The responder QP stops granting remote writes. */
	struct ibv_qp_attr a = {.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ};
	CHECK(ibv_modify_qp(QP, &a, IBV_QP_ACCESS_FLAGS) == 0);
	refused(mr, 0, 64, IBV_WC_REM_ACCESS_ERR, m, len + PAGE, 210, "rights taken away");
	reconnect_both();
	warm(mr, 220, "WRITEs after the rights came back");

	/* Deregistered, and registered again at the same address. */
	uint32_t old_rkey = mr->rkey;
	CHECK_EQ(ibv_dereg_mr(mr), 0);
	mr = reg(m, len);
	struct ibv_mr stale = *mr;
	stale.rkey = old_rkey;
	if (old_rkey != mr->rkey)
		refused(&stale, 0, 64, IBV_WC_REM_ACCESS_ERR, m, len + PAGE, 230,
			"the key of a deregistered MR");
	reconnect_both();
	warm(mr, 240, "WRITEs with the new key");

	/* Past the end by one byte, after hits on the same key. */
	refused(mr, len - 63, 64, IBV_WC_REM_ACCESS_ERR, m, len + PAGE, 250,
		"a WRITE one byte past the MR");
	reconnect_both();
	warm(mr, 260, "WRITEs after the range error");

	/* The same memory under a key without remote write. */
	struct ibv_mr *ro = ibv_reg_mr(D.pd, m, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
	CHECK(ro);
	warm(mr, 270, "WRITEs before the read-only key");
	refused(ro, 0, 64, IBV_WC_REM_ACCESS_ERR, m, len + PAGE, 280, "a read-only MR");
	reconnect_both();
	CHECK_EQ(ibv_dereg_mr(ro), 0);
	warm(mr, 290, "WRITEs after the read-only key");

	/* The requester's own SGE one byte past its MR, then its MR
	 * deregistered and the memory registered again, each after hits on
	 * the same keys: LOC_PROT_ERR, and no byte lands. */
	warm(mr, 292, "WRITEs before the bad local SGE");
	local_refused(OP_LOCAL_PAST, mr, m, len + PAGE, 294, "a local SGE past the peer's MR");
	warm(mr, 296, "WRITEs before the peer's MR is registered again");
	local_refused(OP_STALE_LKEY, mr, m, len + PAGE, 297, "the key of the peer's deregistered MR");
	warm(mr, 299, "WRITEs from the peer's new MR");

	/* The responder QP destroyed and another made: the peer's QP still
	 * names the old number, which nobody answers (retries run out). */
	CHECK_EQ(ibv_destroy_qp(QP), 0);
	struct svt_qpopt o = {.type = IBV_QPT_RC, .scq = CQ, .rcq = CQ};
	QP = svt_qp(&D, &o);
	B->qpn[0] = QP->qp_num;
	refused(mr, 0, 64, IBV_WC_RETRY_EXC_ERR, m, len + PAGE, 300, "a destroyed responder QP");
	reconnect_both();
	warm(mr, 310, "WRITEs to the new QP");
	CHECK_EQ(ibv_dereg_mr(mr), 0);
	munmap(m, len + PAGE);
}

/* The owner's receive completion for wr_id, with its status. */
static struct ibv_wc recv_wc(uint64_t wr_id, const char *what)
{
	struct ibv_wc wc = svt_wait(CQ, what);
	if (wc.wr_id != wr_id || wc.opcode != IBV_WC_RECV)
		FAIL("%s: completion of wr_id %llu opcode %d, expected the receive %llu", what,
		     (unsigned long long)wc.wr_id, wc.opcode, (unsigned long long)wr_id);
	return wc;
}

/* A SEND of len bytes from the peer into the receive WQE sge/nsge: both
 * completions as expected, and the memory [m, m + mlen) holding the message
 * at off (success) and otherwise what it held. */
static void send_into(struct ibv_sge *sge, int nsge, uint32_t len, int want_recv, int want_send,
		      char *m, size_t mlen, size_t off, unsigned seed, const char *what)
{
	svt_fill(m, mlen, seed + 7);
	static uint64_t id = 1000;
	uint64_t wr_id = ++id;
	svt_post_recv1(QP, wr_id, sge, nsge);
	int st = peer_do(OP_SEND, NULL, 0, len, seed);
	struct ibv_wc wc = recv_wc(wr_id, what);
	if ((int)wc.status != want_recv || st != want_send)
		FAIL("%s: receive %s, SEND %s; expected %s and %s", what,
		     ibv_wc_status_str(wc.status), ibv_wc_status_str(st),
		     ibv_wc_status_str(want_recv), ibv_wc_status_str(want_send));
	unsigned char *want = malloc(mlen);
	CHECK(want);
	svt_fill(want, mlen, seed + 7);
	if (want_recv == IBV_WC_SUCCESS) {
		if (wc.byte_len != len || wc.wc_flags != IBV_WC_WITH_IMM ||
		    ntohl(wc.imm_data) != seed || wc.src_qp != B->qpn[1] || wc.qp_num != QP->qp_num ||
		    wc.slid != B->lid[1] || wc.sl != 0)
			FAIL("%s: byte_len %u flags 0x%x imm %u src_qp 0x%x qp 0x%x slid %u sl %u", what,
			     wc.byte_len, wc.wc_flags, ntohl(wc.imm_data), wc.src_qp, wc.qp_num, wc.slid,
			     wc.sl);
		svt_fill(want + off, len, seed);
	}
	for (size_t i = 0; i < mlen; i++)
		if ((unsigned char)m[i] != want[i])
			FAIL("%s: byte %zu is 0x%02x, expected 0x%02x", what, i, (unsigned char)m[i],
			     want[i]);
	free(want);
}

/* The express way of a SEND (the receive WQE's first SGE takes the whole
 * message, its lkey cached, in memory moved onto the arena), against the
 * general way behind it: every completion field and byte checked. */
static void sc_deferred(void)
{
	char *base = anon(4 * PAGE);
	char *m = base + 64; /* Not whole pages: it stays where it is */
	struct ibv_mr *mr = reg(m, 256);
	struct ibv_mr *tmr = reg(base + 2 * PAGE + 64, 256);
	/* Warm: the peer's key cache holds the receive key. */
	for (int i = 0; i < 4; i++) {
		struct ibv_sge s = svt_sge(mr, 0, 256);
		svt_post_recv1(QP, 90 + i, &s, 1);
		CHECK_EQ(peer_do(OP_SEND, NULL, 0, 64, 500 + i), IBV_WC_SUCCESS);
		CHECK_EQ(recv_wc(90 + i, "a warm SEND").status, IBV_WC_SUCCESS);
		check_bytes(m, 64, 500 + i, "a warm SEND's bytes");
	}
	struct ibv_sge s = svt_sge(mr, 0, 256);
	svt_post_recv1(QP, 95, &s, 1);
	CHECK_EQ(peer_do(OP_SEND, NULL, 0, 64, 510), IBV_WC_SUCCESS);
	/* Not polled: the buffer goes, and is the application's again. */
	CHECK_EQ(ibv_dereg_mr(mr), 0);
	memset(m, 0, 256);
	/* The peer's next WR moves bytes: its earlier SENDs are placed first. */
	CHECK_EQ(peer_do(OP_WRITE, tmr, 0, 64, 511), IBV_WC_SUCCESS);
	usleep(20000);
	for (int i = 0; i < 256; i++)
		if (m[i])
			FAIL("byte %d of the deregistered, reused buffer is 0x%02x", i,
			     (unsigned char)m[i]);
	struct ibv_wc wc = recv_wc(95, "the SEND whose buffer went");
	if (wc.status != IBV_WC_LOC_PROT_ERR)
		FAIL("the receive whose buffer was deregistered completed %s, expected "
		     "LOC_PROT_ERR", ibv_wc_status_str(wc.status));
	for (int i = 0; i < 256; i++)
		if (m[i])
			FAIL("after the poll, byte %d of the reused buffer is 0x%02x", i,
			     (unsigned char)m[i]);
	CHECK_EQ(ibv_dereg_mr(tmr), 0);
	munmap(base, 4 * PAGE);
}

static void sc_express_send(void)
{
	size_t len = 16 * PAGE;
	char *m = anon(len);
	struct ibv_mr *mr = reg(m, len);
	expect_moved(m, len, remap_on, "the receive buffer");
	for (int i = 0; i < 8; i++) {
		struct ibv_sge s = svt_sge(mr, 512 * i, 256);
		send_into(&s, 1, 64 + i, IBV_WC_SUCCESS, IBV_WC_SUCCESS, m, len, 512 * i, 400 + i,
			  "warm SENDs");
	}
	/* Two SGEs, the first too short for the message: split 40 + 60. */
	{
		struct ibv_sge two[2] = {svt_sge(mr, 100, 40), svt_sge(mr, 4096, 200)};
		svt_fill(m, len, 417);
		svt_post_recv1(QP, 88, two, 2);
		CHECK_EQ(peer_do(OP_SEND, NULL, 0, 100, 410), IBV_WC_SUCCESS);
		struct ibv_wc wc = recv_wc(88, "two SGEs");
		CHECK_EQ(wc.status, IBV_WC_SUCCESS);
		CHECK_EQ(wc.byte_len, 100);
		unsigned char *want = malloc(len), msg[100];
		CHECK(want);
		svt_fill(want, len, 417);
		svt_fill(msg, sizeof(msg), 410);
		memcpy(want + 100, msg, 40);
		memcpy(want + 4096, msg + 40, 60);
		for (size_t i = 0; i < len; i++)
			if ((unsigned char)m[i] != want[i])
				FAIL("two SGEs: byte %zu is 0x%02x, expected 0x%02x", i,
				     (unsigned char)m[i], want[i]);
		free(want);
	}
	/* Too small a receive buffer: LOC_LEN_ERR there, REM_INV_REQ_ERR here. */
	struct ibv_sge small = svt_sge(mr, 0, 32);
	send_into(&small, 1, 64, IBV_WC_LOC_LEN_ERR, IBV_WC_REM_INV_REQ_ERR, m, len, 0, 420,
		  "a receive buffer too small");
	reconnect_both();
	struct ibv_sge s0 = svt_sge(mr, 0, 256);
	send_into(&s0, 1, 64, IBV_WC_SUCCESS, IBV_WC_SUCCESS, m, len, 0, 430, "after the length error");
	/* No receive posted: the SEND waits (RNR) until one is. */
	{
		svt_fill(m, len, 437);
		peer_req(OP_SEND, NULL, 0, 64, 440, 0);
		/* Once the peer's post returned, its first try met the empty
		 * receive queue (RNR); it retries on the RNR timer (0.64 ms). */
		uint32_t n = atomic_load(&B->req);
		uint64_t end = svt_now_ms() + 10000;
		while (atomic_load(&B->posted) != n)
			if (svt_now_ms() > end)
				FAIL("the peer did not post its SEND");
			else
				usleep(50);
		usleep(5000);
		struct ibv_wc wc;
		if (ibv_poll_cq(CQ, 1, &wc) != 0)
			FAIL("a completion before any receive was posted");
		svt_post_recv1(QP, 77, &s0, 1);
		storm_wait();
		if (B->status != IBV_WC_SUCCESS)
			FAIL("the SEND that waited for a receive ended with %s",
			     ibv_wc_status_str(B->status));
		wc = recv_wc(77, "the receive posted late");
		CHECK_EQ(wc.status, IBV_WC_SUCCESS);
		check_bytes(m, 64, 440, "the SEND that waited for a receive");
	}
	/* A receive SGE running past the receive MR's end (its length would
	 * hold the message), right after SENDs into the same key: LOC_PROT_ERR
	 * there, REM_OP_ERR here, and no byte lands.  Three times: the express
	 * way's memo of the receive key serves only within one tick of the
	 * coarse clock (1-4 ms), which one try may straddle. */
	for (int t = 0; t < 3; t++) {
		for (int i = 0; i < 2; i++)
			send_into(&s0, 1, 64, IBV_WC_SUCCESS, IBV_WC_SUCCESS, m, len, 0, 443 + i,
				  "warm before the SGE past the end");
		struct ibv_sge past = svt_sge(mr, len - 32, 256);
		send_into(&past, 1, 64, IBV_WC_LOC_PROT_ERR, IBV_WC_REM_OP_ERR, m, len, 0, 447,
			  "a receive SGE past the MR's end");
		reconnect_both();
	}
	/* The receive key deregistered behind a warm cache: LOC_PROT_ERR there,
	 * REM_OP_ERR here, and no byte lands.  Three times, the memory
	 * registered again in between, as above: the memo of the receive key
	 * is warm again after two SENDs in one tick. */
	for (int t = 0; t < 3; t++) {
		if (t) {
			mr = reg(m, len);
			s0 = svt_sge(mr, 0, 256);
		}
		for (int i = 0; i < 3; i++)
			send_into(&s0, 1, 64, IBV_WC_SUCCESS, IBV_WC_SUCCESS, m, len, 0, 450 + i,
				  "warm again");
		struct ibv_mr stale = *mr;
		CHECK_EQ(ibv_dereg_mr(mr), 0);
		struct ibv_sge gone = svt_sge(&stale, 0, 256);
		send_into(&gone, 1, 64, IBV_WC_LOC_PROT_ERR, IBV_WC_REM_OP_ERR, m, len, 0, 460,
			  "a deregistered receive key");
		reconnect_both();
	}
	/* The receive CQ resized behind the SEND memo (the peer's last SENDs
	 * went the express way into the old ring): every SEND after it lands,
	 * whole, in the new ring.  Three sizes, each a new ring. */
	mr = reg(m, len);
	s0 = svt_sge(mr, 0, 256);
	for (int t = 0; t < 3; t++) {
		for (int i = 0; i < 2; i++)
			send_into(&s0, 1, 64, IBV_WC_SUCCESS, IBV_WC_SUCCESS, m, len, 0, 462 + i,
				  "warm before the CQ's resize");
		CHECK_EQ(ibv_resize_cq(CQ, 512 << t), 0);
		for (int i = 0; i < 3; i++)
			send_into(&s0, 1, 64 + 8 * i, IBV_WC_SUCCESS, IBV_WC_SUCCESS, m, len, 0, 464 + i,
				  "a SEND after the CQ's resize");
	}
	/* The receive CQ resized again and again while the peer SENDs: a
	 * resize that closes the ring between the express way's check of the
	 * CQ and its push sends the completion after it into the new ring.
	 * Every message lands once, in order, in its own receive. */
	for (int round = 0; round < 30; round++) {
		const size_t chunk = 128;
		svt_fill(m, STORM_SENDS * chunk, 900 + round);
		for (int i = 0; i < STORM_SENDS; i++) {
			struct ibv_sge c = svt_sge(mr, i * chunk, chunk);
			svt_post_recv1(QP, 5000 + i, &c, 1);
		}
		unsigned seed = 1000 + 64 * round;
		atomic_store(&B->storm_ok, 0);
		peer_req(OP_SEND_STORM, NULL, 0, 64, seed, 0);
		uint32_t n = atomic_load(&B->req);
		uint64_t end = svt_now_ms() + 10000;
		for (int k = 0; atomic_load(&B->done) != n; k++) {
			if (svt_now_ms() > end)
				FAIL("the peer's SEND storm did not end");
			CHECK_EQ(ibv_resize_cq(CQ, (k & 1) ? 1024 : 2048), 0);
		}
		if (B->status != IBV_WC_SUCCESS)
			FAIL("a SEND of the storm ended with %s", ibv_wc_status_str(B->status));
		unsigned char *want = malloc(STORM_SENDS * chunk);
		CHECK(want);
		svt_fill(want, STORM_SENDS * chunk, 900 + round);
		for (int i = 0; i < STORM_SENDS; i++) {
			struct ibv_wc wc = recv_wc(5000 + i, "a SEND of the storm");
			if (wc.status != IBV_WC_SUCCESS || wc.byte_len != 64 ||
			    !(wc.wc_flags & IBV_WC_WITH_IMM) || ntohl(wc.imm_data) != (uint32_t)i)
				FAIL("the storm's receive %d: %s, %u bytes, flags 0x%x, imm %u", i,
				     ibv_wc_status_str(wc.status), wc.byte_len, wc.wc_flags,
				     ntohl(wc.imm_data));
			svt_fill(want + i * chunk, 64, seed + i);
		}
		struct ibv_wc extra;
		if (ibv_poll_cq(CQ, 1, &extra) != 0)
			FAIL("a completion beyond the storm's (wr_id %llu)",
			     (unsigned long long)extra.wr_id);
		for (size_t i = 0; i < STORM_SENDS * chunk; i++)
			if ((unsigned char)m[i] != want[i])
				FAIL("the storm: byte %zu is 0x%02x, expected 0x%02x", i,
				     (unsigned char)m[i], want[i]);
		free(want);
	}
	/* This QP taken back to INIT behind the SEND memo, a receive posted
	 * to it there: a QP in INIT takes no message (a real HCA drops it), so
	 * the SEND fails once its retries are spent (RETRY_EXC_ERR), the
	 * receive stays posted and no byte lands.  Three times, both ends
	 * connected again in between. */
	for (int t = 0; t < 3; t++) {
		for (int i = 0; i < 2; i++)
			send_into(&s0, 1, 64, IBV_WC_SUCCESS, IBV_WC_SUCCESS, m, len, 0, 467 + i,
				  "warm before INIT");
		struct ibv_qp_attr a = {.qp_state = IBV_QPS_RESET};
		CHECK_EQ(ibv_modify_qp(QP, &a, IBV_QP_STATE), 0);
		a = (struct ibv_qp_attr){.qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1,
					 .qp_access_flags = SVT_ALL_ACCESS};
		CHECK_EQ(ibv_modify_qp(QP, &a,
				       IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
					       IBV_QP_ACCESS_FLAGS),
			 0);
		svt_fill(m, len, 469);
		svt_post_recv1(QP, 98, &s0, 1);
		int st = peer_do(OP_SEND, NULL, 0, 64, 470);
		if (st != IBV_WC_RETRY_EXC_ERR)
			FAIL("a SEND to a QP in INIT: %s, expected %s", ibv_wc_status_str(st),
			     ibv_wc_status_str(IBV_WC_RETRY_EXC_ERR));
		struct ibv_wc wc;
		if (ibv_poll_cq(CQ, 1, &wc) != 0)
			FAIL("a completion (wr_id %llu, %s) on a QP in INIT",
			     (unsigned long long)wc.wr_id, ibv_wc_status_str(wc.status));
		check_bytes(m, len, 469, "a SEND to a QP in INIT");
		reconnect_both();
	}
	/* Deregistered after the SEND arrived, before the poll, behind a warm
	 * key cache.  Memory that stayed in place gets small messages in the
	 * completion, placed by the poll: the key is checked then, and the
	 * bytes must not land (LOC_PROT_ERR).  Moved memory got them at once. */
	mr = reg(m, len);
	struct ibv_sge s1 = svt_sge(mr, 0, 256);
	for (int i = 0; i < 3; i++)
		send_into(&s1, 1, 64, IBV_WC_SUCCESS, IBV_WC_SUCCESS, m, len, 0, 470 + i,
			  "warm before the late deregistration");
	svt_fill(m, len, 477);
	svt_post_recv1(QP, 99, &s1, 1);
	CHECK_EQ(peer_do(OP_SEND, NULL, 0, 64, 480), IBV_WC_SUCCESS);
	CHECK_EQ(ibv_dereg_mr(mr), 0);
	struct ibv_wc wc = recv_wc(99, "deregistered before the poll");
	if (remap_on) {
		CHECK_EQ(wc.status, IBV_WC_SUCCESS);
		check_bytes(m, 64, 480, "moved memory, deregistered before the poll");
	} else {
		if (wc.status != IBV_WC_LOC_PROT_ERR)
			FAIL("deregistered before the poll: %s, expected %s",
			     ibv_wc_status_str(wc.status), ibv_wc_status_str(IBV_WC_LOC_PROT_ERR));
		check_bytes(m, len, 477, "memory deregistered before the poll");
	}
	/* Last (a CQ that overflowed is done with): the receive CQ overflows
	 * behind the SEND memo.  The SENDs it holds land; the one it has no
	 * room for fails with REM_OP_ERR, and this QP hears QP_FATAL and its
	 * CQ CQ_ERR, as the general way reports it; no later receive is
	 * touched. */
	{
		mr = reg(m, len);
		CHECK_EQ(ibv_resize_cq(CQ, 8), 0);
		int cap = CQ->cqe;
		CHECK(cap >= 8 && cap < STORM_SENDS);
		const size_t chunk = 128;
		svt_fill(m, STORM_SENDS * chunk, 990);
		for (int i = 0; i < STORM_SENDS; i++) {
			struct ibv_sge c = svt_sge(mr, i * chunk, chunk);
			svt_post_recv1(QP, 6000 + i, &c, 1);
		}
		atomic_store(&B->storm_ok, 0);
		int st = peer_do(OP_SEND_STORM, NULL, 0, 64, 2000);
		if (st != IBV_WC_REM_OP_ERR || atomic_load(&B->storm_ok) != cap)
			FAIL("SENDs into a CQ of %d: %ld landed, the last %s; expected %d and %s", cap,
			     atomic_load(&B->storm_ok), ibv_wc_status_str(st), cap,
			     ibv_wc_status_str(IBV_WC_REM_OP_ERR));
		int cq_err = 0, fatal = 0;
		struct pollfd pfd = {D.ctx->async_fd, POLLIN, 0};
		while ((!cq_err || !fatal) && poll(&pfd, 1, 3000) == 1) {
			struct ibv_async_event ev;
			CHECK_EQ(ibv_get_async_event(D.ctx, &ev), 0);
			if (ev.event_type == IBV_EVENT_CQ_ERR && ev.element.cq == CQ)
				cq_err = 1;
			else if (ev.event_type == IBV_EVENT_QP_FATAL && ev.element.qp == QP)
				fatal = 1;
			ibv_ack_async_event(&ev);
		}
		if (!cq_err || !fatal)
			FAIL("the overflow's events: CQ_ERR %d, QP_FATAL %d", cq_err, fatal);
		unsigned char *want = malloc(STORM_SENDS * chunk);
		CHECK(want);
		svt_fill(want, STORM_SENDS * chunk, 990);
		for (int i = 0; i < cap; i++) {
			struct ibv_wc wc = recv_wc(6000 + i, "a SEND the CQ held");
			if (wc.status != IBV_WC_SUCCESS || ntohl(wc.imm_data) != (uint32_t)i)
				FAIL("the CQ's receive %d: %s, imm %u", i, ibv_wc_status_str(wc.status),
				     ntohl(wc.imm_data));
			svt_fill(want + i * chunk, 64, 2000 + i);
		}
		/* The receive the lost SEND took never completes: its buffer's
		 * bytes are undefined (moved memory has them already, as an HCA
		 * writes the data before the completion).  Every other byte is
		 * checked: no receive after it was touched. */
		for (size_t i = 0; i < STORM_SENDS * chunk; i++)
			if (i / chunk != (size_t)cap && (unsigned char)m[i] != want[i])
				FAIL("the overflow: byte %zu is 0x%02x, expected 0x%02x", i,
				     (unsigned char)m[i], want[i]);
		free(want);
	}
	munmap(m, len);
}

/* The descriptor of this process's arena, or -1. */
static int arena_fd(void)
{
	for (int fd = 3; fd < 1024; fd++) {
		char link[64], target[256];
		snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
		ssize_t n = readlink(link, target, sizeof(target) - 1);
		if (n <= 0)
			continue;
		target[n] = 0;
		if (strstr(target, "memfd:softverbs-mr"))
			return fd;
	}
	return -1;
}

static void sc_closedfd(void)
{
	if (!remap_on) {
		printf("SKIP sv_remap closedfd: remapping is off (no arena)\n");
		return;
	}
	size_t len = 16 * PAGE;
	char *m = anon(len);
	svt_fill(m, len, 111);
	struct ibv_mr *mr = reg(m, len);
	expect_moved(m, len, 1, "buffer");
	int afd = arena_fd();
	CHECK(afd >= 0);
	/* A file of the application's own, under the arena's number. */
	char path[] = "/tmp/sv_remap_fd.XXXXXX";
	int f = mkstemp(path);
	CHECK(f >= 0);
	unlink(path);
	char *want = malloc(len);
	CHECK(want);
	svt_fill(want, len, 112);
	CHECK_EQ(write(f, want, len), (long long)len);
	CHECK(close(afd) == 0);
	CHECK(dup2(f, afd) == afd);
	close(f);
	/* The peer's WRITE reaches the buffer (by address), not the file. */
	roundtrip(mr, 0, (uint32_t)len, 113, "MR whose arena descriptor was closed");
	CHECK_EQ(ibv_dereg_mr(mr), 0);
	check_bytes(m, len, 114, "contents after deregistration without the arena's descriptor");
	char *got = malloc(len);
	CHECK(got);
	CHECK_EQ(pread(afd, got, len, 0), (long long)len);
	if (memcmp(got, want, len))
		FAIL("the application's file under the arena's old descriptor changed");
	/* A new registration starts a new arena. */
	mr = reg(m, len);
	expect_moved(m, len, 1, "buffer after the arena's descriptor was lost");
	roundtrip(mr, 0, 64, 115, "MR in the new arena");
	CHECK_EQ(ibv_dereg_mr(mr), 0);
	CHECK_EQ(pread(afd, got, len, 0), (long long)len);
	if (memcmp(got, want, len))
		FAIL("the application's file changed");
	close(afd);
	free(want);
	free(got);
	munmap(m, len);
}

static void sc_munmap(void)
{
	size_t len = 16 * PAGE;
	char *m = anon(len);
	struct ibv_mr *mr = reg(m, len);
	expect_moved(m, len, 1, "buffer");
	/* The application unmaps the range and gets new memory there. */
	CHECK(munmap(m, len) == 0);
	char *n = mmap(m, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
	CHECK(n == m);
	svt_fill(n, len, 101);
	/* A peer still holding the key writes into the old pages, not these
	 * (by address it could only reach the new ones, which an HCA never
	 * would: it holds the old pages). */
	if (remap_on)
		CHECK_EQ(peer_do(OP_WRITE, mr, 0, PAGE, 102), IBV_WC_SUCCESS);
	CHECK_EQ(ibv_dereg_mr(mr), 0);
	check_bytes(n, len, 101, "new memory at a deregistered range's address");
	if (moved(n, len))
		FAIL("new memory became the arena's");
	munmap(n, len);
}

/*
 * Deregistration in a process out of descriptors: it cannot read its maps
 * to copy the range back out of the arena.  The dereg still succeeds, and
 * the memory keeps its bytes: the range stays on the arena, its pages kept,
 * until a later release copies it back.  (Before, the arena's pages were
 * freed all the same: the application's buffer read zeros.)  Then, with
 * descriptors again, another registration's release settles it: private
 * memory, bytes intact.
 */
static void sc_emfile(void)
{
	size_t len = 32 * PAGE;
	char *m = anon(len);
	svt_fill(m, len, 61);
	struct ibv_mr *mr = reg(m, len);
	expect_moved(m, len, 1, "buffer");
	roundtrip(mr, 0, PAGE, 62, "before");
	svt_fill(m, len, 61);
	static struct svt_nofds nofds;
	svt_fds_exhaust(&nofds);
	int rc = ibv_dereg_mr(mr);
	svt_fds_back(&nofds);
	CHECK_EQ(rc, 0);
	check_bytes(m, len, 61, "a buffer deregistered out of descriptors");
	/* Another registration comes and goes: the stuck range is settled. */
	char *o = anon(4 * PAGE);
	struct ibv_mr *mr2 = reg(o, 4 * PAGE);
	CHECK_EQ(ibv_dereg_mr(mr2), 0);
	check_bytes(m, len, 61, "the buffer once settled");
	if (moved(m, len))
		FAIL("the deregistered buffer still maps the arena after a later release");
	munmap(o, 4 * PAGE);
	munmap(m, len);
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc < 2)
		FAIL("usage: sv_remap SCENARIO [-d DEV]");
	const char *sc = argv[1];
	for (int i = 2; i + 1 < argc; i++)
		if (!strcmp(argv[i], "-d"))
			dev = argv[++i];
	const char *r = getenv("SOFTVERBS_REMAP");
	remap_on = !r || strcmp(r, "0");
	svt_watchdog(240);
	B = mmap(NULL, sizeof(*B), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	CHECK(B != MAP_FAILED);
	memset(B, 0, sizeof(*B));
	peer_pid = fork();
	CHECK(peer_pid >= 0);
	if (!peer_pid)
		peer_main();
	owner_up();
	if (!strcmp(sc, "traffic"))
		sc_traffic();
	else if (!strcmp(sc, "kernel"))
		sc_kernel();
	else if (!strcmp(sc, "signals"))
		sc_signals();
	else if (!strcmp(sc, "writers"))
		sc_writers();
	else if (!strcmp(sc, "dontneed"))
		sc_dontneed();
	else if (!strcmp(sc, "attrs"))
		sc_attrs();
	else if (!strcmp(sc, "maxmap"))
		sc_maxmap();
	else if (!strcmp(sc, "memory"))
		sc_memory();
	else if (!strcmp(sc, "fork"))
		sc_fork();
	else if (!strcmp(sc, "race"))
		sc_race();
	else if (!strcmp(sc, "race-rereg"))
		sc_race_rereg();
	else if (!strcmp(sc, "race-inv"))
		sc_race_inv();
	else if (!strcmp(sc, "race-mw"))
		sc_race_mw();
	else if (!strcmp(sc, "race-read"))
		sc_race_read();
	else if (!strcmp(sc, "deferred"))
		sc_deferred();
	else if (!strcmp(sc, "mremap"))
		sc_mremap();
	else if (!strcmp(sc, "sighandler"))
		sc_sighandler();
	else if (!strcmp(sc, "closedfd"))
		sc_closedfd();
	else if (!strcmp(sc, "munmap"))
		sc_munmap();
	else if (!strcmp(sc, "emfile"))
		sc_emfile();
	else if (!strcmp(sc, "express"))
		sc_express();
	else if (!strcmp(sc, "express-send"))
		sc_express_send();
	else
		FAIL("unknown scenario %s", sc);
	peer_quit();
	printf("OK sv_remap %s\n", sc);
	return 0;
}
