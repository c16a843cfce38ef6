/* SPDX-License-Identifier: MIT */
/* Atomics on one word of memory reached through two registrations at two
 * different addresses must still be atomic: an HCA locks the physical
 * word, not the virtual address a key names.
 *
 *   sv_atomalias MODE [-N ops] [-d dev]
 *
 * A memfd of one page holds the words.  Two clients each run N FETCH_ADDs
 * of 1 on word 0 and N compare-and-swap increments of word 1 (each CAS
 * names the value its last one saw), every WR through its own owner's MR:
 *   twomaps   one owner maps the page twice, at two addresses, and
 *             registers each mapping (ibv_reg_mr); client 1 goes through
 *             the first, client 2 through the second
 *   twoowners two owners map the same page at different addresses, each
 *             registers its own mapping; client 1 goes to owner 1, client
 *             2 to owner 2
 *   fdmr      one owner registers the memfd itself (softverbs_reg_mr_fd)
 *             and a shared mapping of it (ibv_reg_mr)
 *   odp       one owner's private page: an MR (moved onto the arena
 *             memfd, so over a file) and an on-demand MR over the same
 *             page (nothing known of a file), at the same address
 *   overlap   an MR over a private page, then one over it and the pages
 *             around it (several mappings, nothing known of a file)
 *   stopped   odp's keys, with a process stopped (SIGSTOP) named as the
 *             holder of the file's stripe for 2.3 s, eight times, while three
 *             clients add through the remapped key (its address's stripe
 *             and the file's) and one through the on-demand key (the
 *             address's alone): a client that held its first stripe while
 *             it waited for the second lost the first after 2 s to the
 *             takeover of a running holder (a review's probe).  The stripe
 *             is found as the library finds it (stripe_of, mr_file_word)
 *   same      both clients through one MR (the control)
 * Checked: word 0 ends at 2N and every fetched value is distinct (each
 * client's grow, and the two sets do not meet); word 1 ends at the number
 * of successful swaps, and no swap succeeded on a value another swap had
 * already moved past.  Prints "ATOMALIAS OK" or fails (exit 1).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* memfd_create */
#endif
#include "svmp.h"

#include <dlfcn.h>
#include <softverbs_dv.h>
#include <stddef.h>

#include "../../kernel-abi/softverbs-abi.h"

typedef struct ibv_mr *(*reg_mr_fd_fn)(struct ibv_pd *, int, int, uint64_t, size_t, uint64_t,
					unsigned int);

#define PAGE 4096
static long N = 20000;
static const char *dev = "loop0", *mode;
static int memfd = -1;
/* Each client's fetched FETCH_ADD values and successful CAS values, in
 * memory shared with the parent (mapped before the fork). */
static uint64_t *fetched[4], *swapped[4];
static _Atomic uint64_t *nswapped;
static long *nfetched;
static int nclients = 2;

/* Index of the client (0..nclients-1) or -1 for an owner; the stopper
 * (mode stopped) is the last process, -2. */
static int client_of(int me)
{
	int owners = !strcmp(mode, "twoowners") ? 2 : 1;
	if (me >= owners + nclients)
		return -2;
	return me >= owners ? me - owners : -1;
}

/* The stripe of the registry's atomic locks that an id takes, as
 * loop_transport.cpp's stripe_of computes it. */
static unsigned stripe_of(uint64_t id)
{
	return (unsigned)((((id >> 3) * 0x9e3779b97f4a7c15ULL) >> 20) % SV_ATOMIC_LOCKS);
}

static void owner(int me)
{
	struct svt_dev d;
	svt_open(&d, dev);
	struct ibv_cq *cq = ibv_create_cq(d.ctx, 16, NULL, NULL, 0);
	CHECK(cq);
	int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_REMOTE_READ;
	struct ibv_mr *mr[2] = {NULL, NULL};
	/* The second owner maps the page into the middle of a reservation of
	 * its own: at another address than the first's (main checks). */
	char *at = NULL;
	int fixed = 0;
	if (me == 1) {
		at = mmap(NULL, 16 * PAGE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		CHECK(at != MAP_FAILED);
		at += 8 * PAGE;
		fixed = MAP_FIXED;
	}
	char *a;
	int odp = !strcmp(mode, "odp") || !strcmp(mode, "stopped");
	if (odp || !strcmp(mode, "overlap")) {
		/* Private memory: main reads the word back through the memfd,
		 * so it is published there at the end. */
		char *x = mmap(NULL, 3 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
			       -1, 0);
		CHECK(x != MAP_FAILED);
		memset(x, 0, 3 * PAGE);
		a = x + PAGE;
	} else {
		a = mmap(at, PAGE, PROT_READ | PROT_WRITE, MAP_SHARED | fixed, memfd, 0);
		CHECK(a != MAP_FAILED);
	}
	mr[0] = ibv_reg_mr(d.pd, a, PAGE, access);
	if (!mr[0])
		FAIL("ibv_reg_mr of the page: %s", strerror(errno));
	if (odp) {
		mr[1] = ibv_reg_mr(d.pd, a, PAGE, access | IBV_ACCESS_ON_DEMAND);
		if (!mr[1])
			FAIL("ibv_reg_mr on demand: %s", strerror(errno));
	} else if (!strcmp(mode, "overlap")) {
		/* The first MR moved its page onto the arena: this range is
		 * three mappings, and stays where it is */
		mr[1] = ibv_reg_mr(d.pd, a - PAGE, 3 * PAGE, access);
		if (!mr[1])
			FAIL("ibv_reg_mr around the page: %s", strerror(errno));
	} else if (!strcmp(mode, "twomaps")) {
		char *b = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
		CHECK(b != MAP_FAILED && b != a);
		mr[1] = ibv_reg_mr(d.pd, b, PAGE, access);
		CHECK(mr[1]);
	} else if (!strcmp(mode, "fdmr")) {
		reg_mr_fd_fn reg = (reg_mr_fd_fn)dlsym(RTLD_DEFAULT, "softverbs_reg_mr_fd");
		if (!reg)
			FAIL("softverbs_reg_mr_fd not found: not softverbs' libibverbs");
		/* At iova 0: the two keys name the word at different addresses */
		mr[1] = reg(d.pd, memfd, SOFTVERBS_FD_MEMFD, 0, PAGE, 0, (unsigned)access);
		if (!mr[1])
			FAIL("softverbs_reg_mr_fd: %s", strerror(errno));
	} else {
		mr[1] = mr[0];
	}
	/* The words' offset in the page: 0, or in mode stopped one whose
	 * address's stripe comes before the file's, so that a client of the
	 * remapped key holds the first while it waits for the second (the
	 * order the first fix took them in). */
	long w = 0;
	if (!strcmp(mode, "stopped")) {
		uint64_t ino = 0, foff = 0;
		FILE *m = fopen("/proc/self/maps", "r");
		CHECK(m);
		char line[512];
		while (fgets(line, sizeof(line), m)) {
			unsigned long lo, hi, off, in;
			char perms[8], devn[16];
			if (sscanf(line, "%lx-%lx %7s %lx %15s %lu", &lo, &hi, perms, &off, devn,
				   &in) == 6 &&
			    (uintptr_t)a >= lo && (uintptr_t)a < hi) {
				ino = in;
				foff = off + ((uintptr_t)a - lo);
			}
		}
		fclose(m);
		if (!ino)
			FAIL("the page was not moved onto the arena (SOFTVERBS_REMAP=0?)");
		for (w = 0; w < PAGE; w += 16) {
			uint64_t file = (1ULL << 63) | ((ino * 0x9e3779b97f4a7c15ULL) ^ (foff + w));
			unsigned sa = stripe_of((uintptr_t)a + w), sf = stripe_of(file);
			if (sa < sf) {
				svmp_b->u[0][0][0] = sf;
				break;
			}
		}
		CHECK(w < PAGE);
	}
	/* The clients this owner serves: a QP for each; the last client goes
	 * through the second key, the others through the first. */
	struct ibv_qp *qp[4] = {NULL, NULL, NULL, NULL};
	int owners = !strcmp(mode, "twoowners") ? 2 : 1;
	for (int c = 0; c < nclients; c++) {
		if (owners == 2 && c != me)
			continue;
		struct ibv_mr *k = c == nclients - 1 ? mr[1] : mr[0];
		struct svt_qpopt o = {IBV_QPT_RC, cq, cq, NULL, 0, 16, 16, 1, 0};
		qp[c] = svt_qp(&d, &o);
		svmp_publish(owners + c, qp[c], d.lid, k);
		/* The word's address as the key names it: the fd MR's iova is 0 */
		struct svmp_ep *e = &svmp_b->ep[me][owners + c];
		if (k != mr[0] && !strcmp(mode, "fdmr"))
			e->addr = 0;
		if (k != mr[0] && !strcmp(mode, "overlap"))
			e->addr = (uintptr_t)a;
		e->addr += (uint64_t)w;
	}
	svmp_barrier(20000, NULL, NULL);
	for (int c = 0; c < nclients; c++)
		if (qp[c])
			svmp_connect(qp[c], &svmp_b->ep[owners + c][me]);
	svmp_barrier(20000, NULL, NULL);
	/* The clients run */
	svmp_barrier(600000, NULL, NULL);
	if (odp || !strcmp(mode, "overlap")) {
		/* The words, where main reads them */
		char *f = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
		CHECK(f != MAP_FAILED);
		memcpy(f, a + w, 16);
		munmap(f, PAGE);
	}
	for (int c = 0; c < nclients; c++)
		if (qp[c])
			ibv_destroy_qp(qp[c]);
	if (mr[1] != mr[0])
		ibv_dereg_mr(mr[1]);
	ibv_dereg_mr(mr[0]);
	ibv_destroy_cq(cq);
	ibv_dealloc_pd(d.pd);
	ibv_close_device(d.ctx);
}

static uint64_t atomic1(struct ibv_qp *qp, struct ibv_cq *cq, struct ibv_mr *lmr,
			enum ibv_wr_opcode op, const struct svmp_ep *w, uint64_t off, uint64_t cmp,
			uint64_t swap)
{
	struct ibv_sge s = svt_sge(lmr, 0, 8);
	struct ibv_send_wr wr, *bad = NULL;
	memset(&wr, 0, sizeof(wr));
	wr.opcode = op;
	wr.sg_list = &s;
	wr.num_sge = 1;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.wr.atomic.remote_addr = w->addr + off;
	wr.wr.atomic.rkey = w->rkey;
	wr.wr.atomic.compare_add = cmp;
	wr.wr.atomic.swap = swap;
	CHECK(ibv_post_send(qp, &wr, &bad) == 0);
	struct ibv_wc wc = svt_wait(cq, "atomic");
	CHECK_WC(wc, IBV_WC_SUCCESS);
	uint64_t v;
	memcpy(&v, lmr->addr, 8);
	return v;
}

static void client(int me)
{
	int c = client_of(me);
	int owners = !strcmp(mode, "twoowners") ? 2 : 1;
	int to = owners == 2 ? c : 0;
	struct svt_dev d;
	svt_open(&d, dev);
	struct ibv_cq *cq = ibv_create_cq(d.ctx, 16, NULL, NULL, 0);
	CHECK(cq);
	struct svt_qpopt o = {IBV_QPT_RC, cq, cq, NULL, 0, 16, 16, 1, 0};
	struct ibv_qp *qp = svt_qp(&d, &o);
	struct ibv_mr *lmr = svt_mr(&d, 64, IBV_ACCESS_LOCAL_WRITE);
	svmp_publish(to, qp, d.lid, NULL);
	svmp_barrier(20000, NULL, NULL);
	const struct svmp_ep *w = &svmp_b->ep[to][me];
	svmp_connect(qp, w);
	svmp_barrier(20000, NULL, NULL);
	uint64_t last = 0, cas_seen = 0;
	long i;
	/* Mode stopped: until the stopper is done (at most N each) */
	for (i = 0; i < N && !atomic_load(&svmp_b->stop); i++) {
		uint64_t old = atomic1(qp, cq, lmr, IBV_WR_ATOMIC_FETCH_AND_ADD, w, 0, 1, 0);
		if (i && old <= last)
			FAIL("client %d: FETCH_ADD #%ld fetched %llu after %llu", c, i,
			     (unsigned long long)old, (unsigned long long)last);
		fetched[c][i] = old;
		last = old;
		if (!strcmp(mode, "stopped"))
			continue; /* Adds only: the most of them in the window */
		old = atomic1(qp, cq, lmr, IBV_WR_ATOMIC_CMP_AND_SWP, w, 8, cas_seen,
			      cas_seen + 1);
		if (old == cas_seen) {
			swapped[c][atomic_fetch_add(&nswapped[c], 1)] = old;
			cas_seen = old + 1;
		} else {
			if (old < cas_seen)
				FAIL("client %d: CMP_SWP found %llu, below %llu it had seen", c,
				     (unsigned long long)old, (unsigned long long)cas_seen);
			cas_seen = old;
		}
	}
	nfetched[c] = i;
	svmp_barrier(600000, NULL, NULL);
	ibv_destroy_qp(qp);
	ibv_dereg_mr(lmr);
	ibv_destroy_cq(cq);
	ibv_dealloc_pd(d.pd);
	ibv_close_device(d.ctx);
}

/* Mode stopped: eight times, a stopped process is named the holder of the
 * file's stripe of the word for 2.3 s, as a process stopped in a debugger
 * inside an atomic would be; then the clients stop. */
static void stopper(int me)
{
	(void)me;
	svmp_barrier(20000, NULL, NULL);
	svmp_barrier(20000, NULL, NULL);
	const char *fab = getenv("SOFTVERBS_FABRIC");
	if (!fab)
		FAIL("mode stopped needs SOFTVERBS_FABRIC");
	char path[256];
	snprintf(path, sizeof(path), "/dev/shm/softverbs-%u-%s", (unsigned)getuid(), fab);
	int fd = open(path, O_RDWR);
	if (fd < 0)
		FAIL("%s: %s", path, strerror(errno));
	struct sv_registry *r =
		mmap(NULL, sizeof(*r), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	CHECK(r != MAP_FAILED);
	close(fd);
	_Atomic uint32_t *lock = (_Atomic uint32_t *)&r->atomic_locks[svmp_b->u[0][0][0]];
	usleep(200000);
	for (int round = 0; round < 8; round++) {
		pid_t h = fork();
		CHECK(h >= 0);
		if (h == 0) {
			for (;;)
				pause();
		}
		CHECK(kill(h, SIGSTOP) == 0);
		/* Taken as a holder takes it: when free */
		uint32_t z = 0;
		uint64_t end = svt_now_ms() + 5000;
		while (!atomic_compare_exchange_weak(lock, &z, (uint32_t)h)) {
			z = 0;
			if (svt_now_ms() > end)
				FAIL("round %d: the stripe never came free", round);
		}
		usleep(2300000); /* Past the 2 s a running holder gets */
		z = (uint32_t)h;
		atomic_compare_exchange_strong(lock, &z, 0);
		kill(h, SIGKILL);
		waitpid(h, NULL, 0);
		usleep(200000);
	}
	atomic_store(&svmp_b->stop, 1);
	munmap(r, sizeof(*r));
	svmp_barrier(600000, NULL, NULL);
}

static void child(int me)
{
	int c = client_of(me);
	if (c == -2)
		stopper(me);
	else if (c < 0)
		owner(me);
	else
		client(me);
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
	if (argc < 2)
		FAIL("usage: sv_atomalias twomaps|twoowners|fdmr|odp|overlap|stopped|same "
		     "[-N ops] [-d dev]");
	mode = argv[1];
	if (strcmp(mode, "twomaps") && strcmp(mode, "twoowners") && strcmp(mode, "fdmr") &&
	    strcmp(mode, "odp") && strcmp(mode, "overlap") && strcmp(mode, "stopped") &&
	    strcmp(mode, "same"))
		FAIL("unknown mode '%s'", mode);
	for (int i = 2; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "-N"))
			N = (long)svmp_parse_u64(argv[i + 1], "-N");
		else if (!strcmp(argv[i], "-d"))
			dev = argv[i + 1];
		else
			FAIL("unknown option '%s'", argv[i]);
	}
	CHECK(N > 0 && N <= 1000000);
	int stopped = !strcmp(mode, "stopped");
	if (stopped)
		nclients = 4;
	memfd = memfd_create("sv_atomalias", 0);
	CHECK(memfd >= 0);
	CHECK(ftruncate(memfd, PAGE) == 0);
	size_t sz = 2 * (size_t)nclients * (size_t)N * 8 + 4096;
	char *shared = mmap(NULL, sz, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	CHECK(shared != MAP_FAILED);
	nswapped = (_Atomic uint64_t *)shared;
	nfetched = (long *)(shared + 1024);
	for (int c = 0; c < nclients; c++) {
		fetched[c] = (uint64_t *)(shared + 4096) + (size_t)c * N;
		swapped[c] = (uint64_t *)(shared + 4096) + (size_t)(nclients + c) * N;
	}
	int owners = !strcmp(mode, "twoowners") ? 2 : 1;
	if (svmp_run(owners + nclients + stopped, 900000, child, 0))
		FAIL("a process failed");
	/* The two keys' addresses of the word differ, or this proves nothing */
	const struct svmp_ep *k1 = owners == 2 ? &svmp_b->ep[0][2] : &svmp_b->ep[0][1];
	const struct svmp_ep *k2 = owners == 2 ? &svmp_b->ep[1][3] : &svmp_b->ep[0][nclients];
	int one_address = !strcmp(mode, "same") || !strcmp(mode, "odp") ||
			  !strcmp(mode, "overlap") || stopped;
	if ((k1->addr == k2->addr) != one_address)
		FAIL("the clients' keys name the word at %#llx and %#llx",
		     (unsigned long long)k1->addr, (unsigned long long)k2->addr);
	uint64_t *word = mmap(NULL, PAGE, PROT_READ, MAP_SHARED, memfd, 0);
	CHECK(word != MAP_FAILED);
	/* Word 0: every add of 1, and every value fetched once. */
	uint64_t adds = 0, ok = 0;
	for (int c = 0; c < nclients; c++) {
		memmove(fetched[0] + adds, fetched[c], (size_t)nfetched[c] * 8);
		adds += (uint64_t)nfetched[c];
	}
	qsort(fetched[0], adds, 8, cmp_u64);
	for (uint64_t i = 0; i < adds; i++)
		if (fetched[0][i] != i)
			FAIL("FETCH_ADD: the %llu-th smallest value fetched is %llu (lost or "
			     "doubled updates)",
			     (unsigned long long)i, (unsigned long long)fetched[0][i]);
	if (word[0] != adds)
		FAIL("FETCH_ADD: the word is %llu after %llu adds of 1",
		     (unsigned long long)word[0], (unsigned long long)adds);
	/* Word 1: one success per value, as many as the word says. */
	for (int c = 0; c < nclients; c++) {
		memmove(swapped[0] + ok, swapped[c], nswapped[c] * 8);
		ok += nswapped[c];
	}
	qsort(swapped[0], ok, 8, cmp_u64);
	for (uint64_t i = 0; i < ok; i++)
		if (swapped[0][i] != i)
			FAIL("CMP_SWP: the %llu-th successful swap was from %llu (two swaps from one "
			     "value)",
			     (unsigned long long)i, (unsigned long long)swapped[0][i]);
	if (word[1] != ok)
		FAIL("CMP_SWP: the word is %llu after %llu successful swaps",
		     (unsigned long long)word[1], (unsigned long long)ok);
	printf("ATOMALIAS OK %s: %llu adds and %llu swaps\n", mode, (unsigned long long)adds,
	       (unsigned long long)ok);
	return 0;
}
