/* SPDX-License-Identifier: MIT */
/* Many fd-backed MRs of one process, written and read back by several
 * threads of another: the requester maps each peer MR into itself and keeps
 * at most 256 mappings cached, so with more MRs than that the cache evicts
 * all the time while other threads copy through mappings it handed out.
 * An eviction must never unmap memory a copy is using (it would crash with
 * SIGSEGV, or fail the copy).
 *
 *   sv_fdmaps [-m MRS] [-t THREADS] [-s SECONDS] [-d DEV]
 *
 * The owner registers MRS memfds of 4 KiB each (softverbs_reg_mr_fd, found
 * with dlsym: this program links the system's libibverbs) and one RC QP per
 * thread.  Each user thread owns 64 bytes at offset 64 * thread of every MR;
 * it picks random MRs, WRITEs a pattern of (thread, iteration) there and
 * READs it back, and compares every byte.  Prints
 * "OK sv_fdmaps mrs=M threads=T ops=N" when every op completed with
 * success and every byte matched; else a FAIL line and exit status 1.
 * The parent forks both processes before either touches verbs.
 *
 * With -x (and -m 1 -t 3): the owner truncates the file behind its MR
 * while the user holds a mapping of it; the user's WRITE, READ and atomic
 * then complete REM_ACCESS_ERR instead of killing it with SIGBUS.
 *
 * With -S: the memfds are sealed against shrinking (F_SEAL_SHRINK), so the
 * user copies into its mappings with plain memcpy, no system call
 * (`softverbs show` says mapped-direct instead of mapped-file). */
#include "svt.h"

#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/wait.h>

#define MAXT 8
#define MAXMR 2048
#define SLOT 64

typedef struct ibv_mr *(*reg_mr_fd_fn)(struct ibv_pd *, int, int, uint64_t, size_t, uint64_t,
				       unsigned int);

struct board {
	_Atomic int owner_ready, user_done, failed;
	uint16_t lid;
	uint32_t qpn[MAXT];	 /* owner's QPs */
	uint32_t user_qpn[MAXT]; /* user's QPs */
	_Atomic int user_ready;
	uint32_t rkey[MAXMR];
	uint64_t addr[MAXMR];
	_Atomic uint64_t ops;
	_Atomic int shrink_req, shrink_done; /* -x */
};

static struct {
	int mrs, threads, seconds;
	const char *dev;
	int shrink;
	int sealed;
} opt = {600, 4, 5, "loop0", 0, 0};

static struct board *B;

static void wait_flag(_Atomic int *f, int ms, const char *what)
{
	uint64_t end = svt_now_ms() + ms;
	while (!atomic_load(f)) {
		if (atomic_load(&B->failed))
			FAIL("peer failed while waiting for %s", what);
		if (svt_now_ms() > end)
			FAIL("timed out waiting for %s", what);
		usleep(1000);
	}
}

static const struct svt_conn conn = {
	.access = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_LOCAL_WRITE |
		  IBV_ACCESS_REMOTE_ATOMIC,
	.min_rnr_timer = 1,
	.timeout = 14,
	.retry_cnt = 7,
	.rnr_retry = 7,
};

static void owner(void)
{
	int shrink_fd = -1;
	struct svt_dev d;
	svt_open(&d, opt.dev);
	reg_mr_fd_fn reg = (reg_mr_fd_fn)dlsym(RTLD_DEFAULT, "softverbs_reg_mr_fd");
	if (!reg)
		FAIL("softverbs_reg_mr_fd not found: not softverbs' libibverbs");
	for (int i = 0; i < opt.mrs; i++) {
		int fd = memfd_create("sv_fdmaps", MFD_CLOEXEC | (opt.sealed ? MFD_ALLOW_SEALING : 0));
		CHECK(fd >= 0);
		CHECK(ftruncate(fd, 4096) == 0);
		if (opt.sealed)
			CHECK(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) == 0);
		uint64_t iova = 0x10000000ULL + (uint64_t)i * 0x10000;
		struct ibv_mr *mr = reg(d.pd, fd, 2 /* SOFTVERBS_FD_MEMFD */, 0, 4096, iova,
					IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
						IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC);
		if (!mr)
			FAIL("softverbs_reg_mr_fd #%d: %s", i, strerror(errno));
		if (opt.shrink)
			shrink_fd = fd; /* -x: shrunk below once the user asks */
		else
			close(fd); /* The MR keeps its own reference */
		B->rkey[i] = mr->rkey;
		B->addr[i] = iova;
	}
	struct ibv_cq *cq = ibv_create_cq(d.ctx, 16, NULL, NULL, 0);
	CHECK(cq);
	struct ibv_qp *qp[MAXT];
	for (int t = 0; t < opt.threads; t++) {
		struct svt_qpopt o = {.type = IBV_QPT_RC, .scq = cq, .rcq = cq};
		qp[t] = svt_qp(&d, &o);
		B->qpn[t] = qp[t]->qp_num;
	}
	B->lid = d.lid;
	atomic_store(&B->owner_ready, 1);
	wait_flag(&B->user_ready, 30000, "the user's QPs");
	for (int t = 0; t < opt.threads; t++)
		svt_connect(qp[t], B->user_qpn[t], B->lid, &conn);
	atomic_store(&B->owner_ready, 2);
	if (opt.shrink) {
		/* The file behind the MR shrinks under the peer's mappings. */
		wait_flag(&B->shrink_req, 60000, "the user's first pass");
		CHECK(ftruncate(shrink_fd, 0) == 0);
		atomic_store(&B->shrink_done, 1);
	}
	/* One-sided traffic: nothing to do but stay alive. */
	wait_flag(&B->user_done, (opt.seconds + 60) * 1000, "the user to finish");
	exit(0);
}

struct worker {
	struct svt_dev *d;
	int t;
	struct ibv_qp *qp;
	struct ibv_cq *cq;
	uint64_t ops;
};

static void one(struct worker *w, enum ibv_wr_opcode op, struct ibv_mr *mr, void *buf, int j)
{
	struct ibv_sge sge = {(uintptr_t)buf, SLOT, mr->lkey};
	struct ibv_send_wr wr, *bad;
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = j;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = op;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.wr.rdma.remote_addr = B->addr[j] + (uint64_t)w->t * SLOT;
	wr.wr.rdma.rkey = B->rkey[j];
	CHECK(ibv_post_send(w->qp, &wr, &bad) == 0);
	struct ibv_wc wc;
	if (!svt_poll(w->cq, &wc, 20000))
		FAIL("thread %d: no completion for %s into MR %d", w->t,
		     op == IBV_WR_RDMA_WRITE ? "WRITE" : "READ", j);
	CHECK_WC(wc, IBV_WC_SUCCESS);
}

static void *work(void *arg)
{
	struct worker *w = arg;
	struct ibv_mr *mr = svt_mr(w->d, 2 * SLOT, IBV_ACCESS_LOCAL_WRITE);
	uint8_t *out = mr->addr, *in = out + SLOT;
	uint64_t rng = 0x9e3779b97f4a7c15ULL * (w->t + 1);
	uint64_t end = svt_now_ms() + (uint64_t)opt.seconds * 1000;
	for (uint64_t it = 0; svt_now_ms() < end; it++) {
		rng ^= rng << 13;
		rng ^= rng >> 7;
		rng ^= rng << 17;
		int j = (int)(rng % (uint64_t)opt.mrs);
		for (int k = 0; k < SLOT; k++)
			out[k] = (uint8_t)(w->t * 131 + it * 7 + k + j);
		memset(in, 0xA5, SLOT);
		one(w, IBV_WR_RDMA_WRITE, mr, out, j);
		one(w, IBV_WR_RDMA_READ, mr, in, j);
		if (memcmp(in, out, SLOT))
			FAIL("thread %d op %llu: MR %d read back other bytes than written", w->t,
			     (unsigned long long)it, j);
		w->ops += 2;
	}
	return NULL;
}

/* -x: one WRITE, READ and FETCH_ADD (one QP each: an error takes its QP
 * down) into MR 0, which succeed; then the owner truncates the file behind
 * it to 0 bytes, and the same three, through the mapping this process has
 * cached, must complete REM_ACCESS_ERR: never SIGBUS here. */
static void shrink_pass(struct worker *w)
{
	static const enum ibv_wr_opcode ops[3] = {IBV_WR_RDMA_WRITE, IBV_WR_RDMA_READ,
						  IBV_WR_ATOMIC_FETCH_AND_ADD};
	struct ibv_mr *mr = svt_mr(w[0].d, 2 * SLOT, IBV_ACCESS_LOCAL_WRITE);
	for (int pass = 0; pass < 2; pass++) {
		if (pass == 1) {
			atomic_store(&B->shrink_req, 1);
			wait_flag(&B->shrink_done, 60000, "the owner's ftruncate");
		}
		for (int t = 0; t < 3; t++) {
			struct ibv_sge sge = {(uintptr_t)mr->addr, ops[t] == IBV_WR_ATOMIC_FETCH_AND_ADD
								  ? 8
								  : SLOT,
					      mr->lkey};
			struct ibv_send_wr wr, *bad;
			memset(&wr, 0, sizeof(wr));
			wr.wr_id = pass * 10 + t;
			wr.sg_list = &sge;
			wr.num_sge = 1;
			wr.opcode = ops[t];
			wr.send_flags = IBV_SEND_SIGNALED;
			if (ops[t] == IBV_WR_ATOMIC_FETCH_AND_ADD) {
				wr.wr.atomic.remote_addr = B->addr[0] + 1024;
				wr.wr.atomic.rkey = B->rkey[0];
				wr.wr.atomic.compare_add = 1;
			} else {
				wr.wr.rdma.remote_addr = B->addr[0] + (uint64_t)t * SLOT;
				wr.wr.rdma.rkey = B->rkey[0];
			}
			CHECK(ibv_post_send(w[t].qp, &wr, &bad) == 0);
			struct ibv_wc wc;
			if (!svt_poll(w[t].cq, &wc, 20000))
				FAIL("pass %d: no completion for op %d", pass, t);
			if (pass == 0)
				CHECK_WC(wc, IBV_WC_SUCCESS);
			else
				CHECK_WC(wc, IBV_WC_REM_ACCESS_ERR);
			atomic_fetch_add(&B->ops, 1);
		}
	}
}

static void user(void)
{
	wait_flag(&B->owner_ready, 60000, "the owner's MRs");
	struct svt_dev d;
	svt_open(&d, opt.dev);
	struct worker w[MAXT];
	for (int t = 0; t < opt.threads; t++) {
		w[t].d = &d;
		w[t].t = t;
		w[t].cq = ibv_create_cq(d.ctx, 16, NULL, NULL, 0);
		CHECK(w[t].cq);
		struct svt_qpopt o = {.type = IBV_QPT_RC, .scq = w[t].cq, .rcq = w[t].cq};
		w[t].qp = svt_qp(&d, &o);
		w[t].ops = 0;
		B->user_qpn[t] = w[t].qp->qp_num;
		svt_connect(w[t].qp, B->qpn[t], B->lid, &conn);
	}
	atomic_store(&B->user_ready, 1);
	uint64_t end = svt_now_ms() + 30000;
	while (atomic_load(&B->owner_ready) != 2) {
		if (svt_now_ms() > end || atomic_load(&B->failed))
			FAIL("the owner never connected");
		usleep(1000);
	}
	if (opt.shrink) {
		shrink_pass(w);
		atomic_store(&B->user_done, 1);
		exit(0);
	}
	pthread_t th[MAXT];
	for (int t = 0; t < opt.threads; t++)
		CHECK(pthread_create(&th[t], NULL, work, &w[t]) == 0);
	uint64_t ops = 0;
	for (int t = 0; t < opt.threads; t++) {
		pthread_join(th[t], NULL);
		ops += w[t].ops;
	}
	atomic_store(&B->ops, ops);
	atomic_store(&B->user_done, 1);
	exit(0);
}

int main(int argc, char **argv)
{
	int c;
	while ((c = getopt(argc, argv, "m:t:s:d:xS")) != -1) {
		switch (c) {
		case 'm':
			opt.mrs = atoi(optarg);
			break;
		case 't':
			opt.threads = atoi(optarg);
			break;
		case 's':
			opt.seconds = atoi(optarg);
			break;
		case 'd':
			opt.dev = optarg;
			break;
		case 'x':
			opt.shrink = 1;
			break;
		case 'S':
			opt.sealed = 1;
			break;
		default:
			fprintf(stderr,
				"usage: sv_fdmaps [-m MRS] [-t THREADS] [-s SECONDS] [-d DEV] [-x] [-S]\n");
			return 2;
		}
	}
	if (opt.mrs < 1 || opt.mrs > MAXMR || opt.threads < 1 || opt.threads > MAXT ||
	    opt.seconds < 1 || (opt.shrink && (opt.mrs != 1 || opt.threads != 3)) ||
	    (opt.shrink && opt.sealed))
		FAIL("bad arguments (-x needs -m 1 -t 3, and no -S)");
	svt_watchdog(opt.seconds + 120);
	B = mmap(NULL, sizeof(*B), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	CHECK(B != MAP_FAILED);
	memset(B, 0, sizeof(*B));
	pid_t po = fork();
	CHECK(po >= 0);
	if (po == 0)
		owner();
	pid_t pu = fork();
	CHECK(pu >= 0);
	if (pu == 0)
		user();
	int st_u, st_o;
	CHECK(waitpid(pu, &st_u, 0) == pu);
	if (!WIFEXITED(st_u) || WEXITSTATUS(st_u)) {
		atomic_store(&B->failed, 1);
		kill(po, SIGKILL);
		waitpid(po, &st_o, 0);
		if (WIFSIGNALED(st_u))
			FAIL("the user process died of signal %d (%s)", WTERMSIG(st_u),
			     strsignal(WTERMSIG(st_u)));
		FAIL("the user process exited %d", WEXITSTATUS(st_u));
	}
	CHECK(waitpid(po, &st_o, 0) == po);
	if (!WIFEXITED(st_o) || WEXITSTATUS(st_o))
		FAIL("the owner process ended with status 0x%x", st_o);
	printf("OK sv_fdmaps mrs=%d threads=%d ops=%llu\n", opt.mrs, opt.threads,
	       (unsigned long long)atomic_load(&B->ops));
	return 0;
}
