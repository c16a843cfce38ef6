/* SPDX-License-Identifier: MIT */
/* Multi-process helpers for sv_stress and sv_soak: plain verbs and POSIX.
 *
 * The parent forks every process of a run BEFORE any of them touches verbs
 * (a verbs context must not cross fork), so the QP numbers and keys are
 * exchanged through a board in anonymous shared memory rather than through
 * the test harness.  The parent only supervises: it waits for its children
 * with a deadline, kills them all when one fails or the deadline passes, and
 * exits non-zero with a line that says why.
 *
 * Payloads are self-describing so that a receiver can tell a lost message
 * from a duplicate, from a stale buffer and from torn bytes (see svmp_gen).
 */
#ifndef SVMP_H
#define SVMP_H

#include "svt.h"

#include <signal.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>

#define SVMP_MAXP 16
#define SVMP_POISON 0xA5
#define SVMP_NU 16 /* free per-pair words on the board */

/* One QP's address as its peers need it. */
struct svmp_ep {
	uint32_t qpn;
	uint16_t lid;
	uint64_t addr; /* a region the peer may access remotely, if any */
	uint32_t rkey;
	uint64_t len;
};

struct svmp_board {
	_Atomic uint32_t count, gen; /* the barrier */
	_Atomic int failed;	     /* set by the parent when any child failed */
	_Atomic int stop;	     /* scenario-defined: "producers, stop now" */
	_Atomic int hold, released;  /* svmp_run's hold: see there */
	_Atomic uint32_t done;
	int nprocs;
	struct svmp_ep ep[SVMP_MAXP][SVMP_MAXP]; /* ep[i][j]: i's QP for peer j */
	_Atomic uint64_t u[SVMP_MAXP][SVMP_MAXP][SVMP_NU];
};

static struct svmp_board *svmp_b;
static int svmp_me = -1; /* this child's index, -1 in the parent */

static inline void svmp_abort_if_failed(void)
{
	if (atomic_load(&svmp_b->failed)) {
		fprintf(stderr, "proc %d: stopping, a peer failed\n", svmp_me);
		_exit(3);
	}
}

/* Every process arrives; waits at most ms.  progress() runs while waiting:
 * a process whose peer needs its receives reposted must keep polling. */
static inline void svmp_barrier(int ms, void (*progress)(void *), void *arg)
{
	struct svmp_board *b = svmp_b;
	uint32_t g = atomic_load(&b->gen);
	if (atomic_fetch_add(&b->count, 1) + 1 == (uint32_t)b->nprocs) {
		atomic_store(&b->count, 0);
		atomic_fetch_add(&b->gen, 1);
		return;
	}
	uint64_t end = svt_now_ms() + ms;
	while (atomic_load(&b->gen) == g) {
		svmp_abort_if_failed();
		if (svt_now_ms() > end)
			FAIL("proc %d: barrier not reached by all within %d ms", svmp_me, ms);
		if (progress)
			progress(arg);
		else
			usleep(200);
	}
}

/* splitmix64: the one source of every pattern and random choice. */
static inline uint64_t svmp_mix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ULL;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
	return x ^ (x >> 31);
}

static inline uint64_t svmp_rand(uint64_t *s)
{
	*s += 0x9e3779b97f4a7c15ULL;
	return svmp_mix(*s);
}

static uint64_t svmp_seed;

static inline uint32_t svmp_csum(const uint8_t *p, size_t n, uint32_t stream)
{
	uint32_t h = 2166136261u ^ stream;
	for (size_t i = 0; i < n; i++)
		h = (h ^ p[i]) * 16777619u;
	return h;
}

/* The message (stream, seq) of len bytes.  len >= 8: bytes 0..3 are seq,
 * the last 4 an FNV-1a checksum of the rest (seeded by the stream); from
 * 12 bytes on, bytes 4..7 are the stream.  The rest, and messages under 8
 * bytes, are a pattern drawn from (seed, stream, seq). */
static inline void svmp_gen(void *buf, size_t len, uint32_t stream, uint32_t seq)
{
	uint8_t *p = buf;
	uint64_t s = svmp_mix(svmp_seed ^ ((uint64_t)stream << 32 | seq));
	size_t i = 0;
	for (; i + 8 <= len; i += 8) {
		uint64_t v = svmp_rand(&s);
		memcpy(p + i, &v, 8);
	}
	if (i < len) {
		uint64_t v = svmp_rand(&s);
		memcpy(p + i, &v, len - i);
	}
	if (len < 8)
		return;
	memcpy(p, &seq, 4);
	if (len >= 12)
		memcpy(p + 4, &stream, 4);
	uint32_t c = svmp_csum(p, len - 4, stream);
	memcpy(p + len - 4, &c, 4);
}

enum svmp_verdict {
	SVMP_OK,      /* the expected message */
	SVMP_OLD,     /* a whole, valid, earlier message: duplicate or old buffer */
	SVMP_AHEAD,   /* a whole, valid, later message: the ones between are lost */
	SVMP_STALE,   /* the buffer still holds the poison written before reposting */
	SVMP_CORRUPT, /* anything else: torn, partly placed, garbage */
};

static const char *const svmp_verdict_name[] = {"ok", "old", "ahead", "stale", "corrupt"};

static inline int svmp_all(const uint8_t *p, size_t n, uint8_t v)
{
	for (size_t i = 0; i < n; i++)
		if (p[i] != v)
			return 0;
	return 1;
}

/* Classifies a received buffer of len bytes against message (stream, want).
 * *seq gets the sequence number found in it (want where there is none). */
static inline enum svmp_verdict svmp_check(const void *buf, size_t len, uint32_t stream,
					   uint32_t want, uint32_t *seq, uint8_t *scratch)
{
	const uint8_t *p = buf;
	uint32_t s = want;
	if (len >= 8)
		memcpy(&s, p, 4);
	*seq = s;
	if (len == 0)
		return SVMP_OK;
	svmp_gen(scratch, len, stream, s);
	if (!memcmp(scratch, p, len))
		return s == want ? SVMP_OK : (int32_t)(s - want) < 0 ? SVMP_OLD : SVMP_AHEAD;
	if (svmp_all(p, len, SVMP_POISON))
		return SVMP_STALE;
	return SVMP_CORRUPT;
}

/* Where the first difference from message (stream, seq) lies, for reports. */
static inline long svmp_first_diff(const void *buf, size_t len, uint32_t stream, uint32_t seq,
				   uint8_t *scratch)
{
	svmp_gen(scratch, len, stream, seq);
	for (size_t i = 0; i < len; i++)
		if (((const uint8_t *)buf)[i] != scratch[i])
			return (long)i;
	return -1;
}

/* The receive buffers of an RQ in the order they were posted: RC completes
 * receives in that order, so a completion for another buffer than the
 * first means the completions of those before it were skipped. */
#define SVMP_FIFO 512
struct svmp_fifo {
	uint32_t id[SVMP_FIFO];
	uint32_t head, tail;
};

static inline void svmp_fifo_push(struct svmp_fifo *f, uint32_t id)
{
	if (f->tail - f->head >= SVMP_FIFO)
		FAIL("proc %d: more than %d receives in flight", svmp_me, SVMP_FIFO);
	f->id[f->tail++ % SVMP_FIFO] = id;
}

/* Removes id; returns how many buffers posted before it were passed over
 * (removed too), or -1 if id was not posted at all. */
static inline int svmp_fifo_take(struct svmp_fifo *f, uint32_t id)
{
	for (uint32_t k = f->head; k != f->tail; k++) {
		if (f->id[k % SVMP_FIFO] != id)
			continue;
		int skipped = (int)(k - f->head);
		f->head = k + 1;
		return skipped;
	}
	return -1;
}

/* Counts of what a receiver saw, per stream or in all. */
struct svmp_stats {
	uint64_t ok, lost, dup, ahead, stale, corrupt, badlen, badwc, reported;
};

static inline uint64_t svmp_bad(const struct svmp_stats *s)
{
	return s->lost + s->dup + s->stale + s->corrupt + s->badlen + s->badwc;
}

/* Accounts one received message: *next is the sequence number expected
 * from this stream (RC delivers in order).  A message carrying a later
 * number means the ones between were lost; a stale or torn one is taken to
 * be the expected message with bad contents. */
static inline enum svmp_verdict svmp_account(struct svmp_stats *st, const char *what,
					     const void *buf, size_t len, uint32_t stream,
					     uint32_t *next, uint32_t *which, uint8_t *scratch)
{
	uint32_t seq, want = *next;
	enum svmp_verdict v = svmp_check(buf, len, stream, want, &seq, scratch);
	/* The message this was: the one it names if whole, else the expected one */
	*which = v == SVMP_STALE || v == SVMP_CORRUPT ? *next : seq;
	switch (v) {
	case SVMP_OK:
		st->ok++;
		(*next)++;
		return v;
	case SVMP_AHEAD:
		st->lost += seq - *next;
		st->ahead++;
		*next = seq + 1;
		break;
	case SVMP_OLD:
		st->dup++;
		break;
	case SVMP_STALE:
		st->stale++;
		(*next)++;
		break;
	case SVMP_CORRUPT:
		st->corrupt++;
		(*next)++;
		break;
	}
	if (st->reported++ < 8) {
		long d = v == SVMP_CORRUPT ? svmp_first_diff(buf, len, stream, want, scratch) : -1;
		const uint8_t *p = buf;
		fprintf(stderr,
			"proc %d: %s stream %u: %s message, expected seq %u, found seq %u, len %zu"
			", first bad byte %ld, bytes %02x %02x %02x %02x\n",
			svmp_me, what, stream, svmp_verdict_name[v], want, seq, len, d,
			len > 0 ? p[0] : 0, len > 1 ? p[1] : 0, len > 2 ? p[2] : 0,
			len > 3 ? p[3] : 0);
	}
	return v;
}

/* Bytes [len, len + n) of a buffer must still hold poison: nothing was
 * written past the message.  Counts a failure as corrupt. */
static inline void svmp_guard(struct svmp_stats *st, const char *what, const void *buf, size_t len,
			      size_t n)
{
	const uint8_t *p = (const uint8_t *)buf + len;
	if (svmp_all(p, n, SVMP_POISON))
		return;
	st->corrupt++;
	if (st->reported++ < 8)
		fprintf(stderr, "proc %d: %s: bytes written past the %zu-byte message\n", svmp_me,
			what, len);
}

static inline void svmp_print_stats(const char *name, const struct svmp_stats *s, const char *extra)
{
	printf("STAT %s proc=%d ok=%llu lost=%llu dup=%llu stale=%llu corrupt=%llu badlen=%llu "
	       "badwc=%llu%s%s\n",
	       name, svmp_me, (unsigned long long)s->ok, (unsigned long long)s->lost,
	       (unsigned long long)s->dup, (unsigned long long)s->stale,
	       (unsigned long long)s->corrupt, (unsigned long long)s->badlen,
	       (unsigned long long)s->badwc, extra ? " " : "", extra ? extra : "");
	fflush(stdout);
}

/* With hold, a child that is done waits, devices open, until the parent
 * (told by the harness through stdin) releases it. */
static inline void svmp_hold_point(void)
{
	if (!atomic_load(&svmp_b->hold))
		return;
	atomic_fetch_add(&svmp_b->done, 1);
	while (!atomic_load(&svmp_b->released)) {
		svmp_abort_if_failed();
		usleep(1000);
	}
}

/* Runs child(i) in n processes; returns 0 if all exit 0 within ms.  With
 * hold, once all are done the parent prints HOLDING and waits for a line on
 * stdin before it lets them exit. */
/* svmp_run's freezer: with svmp_freeze_ms > 0 the parent stops one running
 * child at a time (SIGSTOP) for that long, then lets it go on (SIGCONT),
 * then waits svmp_freeze_gap_ms before the next: a peer that is descheduled
 * or stopped in a debugger must cost time, never a message or an error. */
static int svmp_freeze_ms, svmp_freeze_gap_ms = 300;

static inline int svmp_run(int n, int ms, void (*child)(int), int hold)
{
	if (n < 1 || n > SVMP_MAXP)
		FAIL("process count %d out of 1..%d", n, SVMP_MAXP);
	svmp_b =
	    mmap(NULL, sizeof(*svmp_b), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	CHECK(svmp_b != MAP_FAILED);
	memset(svmp_b, 0, sizeof(*svmp_b));
	svmp_b->nprocs = n;
	svmp_b->hold = hold;
	fflush(stdout);
	fflush(stderr);
	pid_t pid[SVMP_MAXP], parent = getpid();
	for (int i = 0; i < n; i++) {
		pid[i] = fork();
		CHECK(pid[i] >= 0);
		if (pid[i] == 0) {
			svmp_me = i;
			/* Our own bound, beyond the parent's, should the parent die */
			svt_watchdog(ms / 1000 + 30);
			/* A child the freezer stopped hears no alarm: should the
			 * parent die meanwhile (killed by a harness's timeout), the
			 * kernel's SIGKILL ends it, stopped or not. */
			if (svmp_freeze_ms > 0) {
				prctl(PR_SET_PDEATHSIG, SIGKILL);
				if (getppid() != parent)
					_exit(1); /* It died before the prctl */
			}
			child(i);
			fflush(stdout);
			svmp_hold_point();
			exit(0);
		}
	}
	int status[SVMP_MAXP], left = n, bad = 0, timed_out = 0;
	for (int i = 0; i < n; i++)
		status[i] = -1;
	uint64_t end = svt_now_ms() + ms, grace = 0;
	int held = 0;
	int frozen = -1, freezes = 0;
	uint64_t thaw = 0, next_freeze = svt_now_ms() + (uint64_t)svmp_freeze_gap_ms;
	uint64_t fz = svmp_seed ^ 0xf7eeeULL;
	while (left) {
		if (svmp_freeze_ms > 0) {
			uint64_t t = svt_now_ms();
			if (frozen >= 0 && (t >= thaw || status[frozen] != -1 || bad)) {
				kill(pid[frozen], SIGCONT);
				frozen = -1;
				next_freeze = t + (uint64_t)svmp_freeze_gap_ms;
			} else if (frozen < 0 && !bad && t >= next_freeze) {
				int i = (int)(svmp_rand(&fz) % (uint64_t)n);
				if (status[i] == -1 && kill(pid[i], SIGSTOP) == 0) {
					frozen = i;
					freezes++;
					thaw = t + (uint64_t)svmp_freeze_ms;
				}
			}
		}
		if (hold && !held && !bad && atomic_load(&svmp_b->done) == (uint32_t)n) {
			/* Every child is done and keeps its device open: let the
			 * harness look at the live processes, then release them. */
			printf("HOLDING\n");
			fflush(stdout);
			char line[64];
			if (!fgets(line, sizeof(line), stdin))
				line[0] = 0;
			held = 1;
			atomic_store(&svmp_b->released, 1);
		}
		int st;
		pid_t w = waitpid(-1, &st, WNOHANG);
		if (w > 0) {
			for (int i = 0; i < n; i++)
				if (pid[i] == w) {
					status[i] = st;
					left--;
					if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
						bad = 1;
						atomic_store(&svmp_b->failed, 1);
						if (!grace)
							grace = svt_now_ms() + 5000;
					}
				}
			continue;
		}
		uint64_t now = svt_now_ms();
		if (now > end || (grace && now > grace)) {
			timed_out = now > end;
			if (frozen >= 0)
				kill(pid[frozen], SIGCONT);
			for (int i = 0; i < n; i++)
				if (status[i] == -1)
					kill(pid[i], SIGKILL);
			while (left) {
				w = waitpid(-1, &st, 0);
				if (w < 0)
					break;
				for (int i = 0; i < n; i++)
					if (pid[i] == w && status[i] == -1) {
						status[i] = -2; /* killed by us */
						left--;
					}
			}
			bad = 1;
			break;
		}
		usleep(5000);
	}
	if (svmp_freeze_ms > 0)
		printf("FREEZES %d of %d ms\n", freezes, svmp_freeze_ms);
	for (int i = 0; i < n; i++) {
		int st = status[i];
		if (st == -2)
			fprintf(stderr, "proc %d: killed (%s)\n", i,
				timed_out ? "run past its deadline" : "a peer failed");
		else if (WIFSIGNALED(st))
			fprintf(stderr, "proc %d: died of signal %d%s\n", i, WTERMSIG(st),
				WTERMSIG(st) == SIGALRM ? " (its watchdog)" : "");
		else if (WEXITSTATUS(st))
			fprintf(stderr, "proc %d: exited %d\n", i, WEXITSTATUS(st));
	}
	return bad;
}

/* The usual RC connection of these programs: unbounded RNR retries (a
 * receiver reposts when it polls), transport retries on a slow machine. */
static inline void svmp_connect(struct ibv_qp *qp, const struct svmp_ep *peer)
{
	struct svt_conn c = {SVT_ALL_ACCESS, 1, 18, 7, 7};
	svt_connect(qp, peer->qpn, peer->lid, &c);
}

static inline void svmp_publish(int peer, struct ibv_qp *qp, uint16_t lid, struct ibv_mr *mr)
{
	struct svmp_ep *e = &svmp_b->ep[svmp_me][peer];
	e->qpn = qp->qp_num;
	e->lid = lid;
	if (mr) {
		e->addr = (uintptr_t)mr->addr;
		e->rkey = mr->rkey;
		e->len = mr->length;
	}
}

/* Posts [off, off + len) of mr as one receive, after poisoning its first
 * poison bytes (the rest must still hold poison from before). */
static inline int svmp_post_recv_buf(struct ibv_qp *qp, struct ibv_srq *srq, uint64_t wr_id,
				     struct ibv_mr *mr, size_t off, uint32_t len, uint32_t poison)
{
	struct ibv_sge s = svt_sge(mr, off, len);
	struct ibv_recv_wr wr, *bad = NULL;
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = wr_id;
	wr.sg_list = &s;
	wr.num_sge = 1;
	/* Poison first: a completion whose data never landed shows as stale. */
	memset((char *)mr->addr + off, SVMP_POISON, poison);
	return srq ? ibv_post_srq_recv(srq, &wr, &bad) : ibv_post_recv(qp, &wr, &bad);
}

static inline uint64_t svmp_parse_u64(const char *s, const char *what)
{
	char *e;
	errno = 0;
	unsigned long long v = strtoull(s, &e, 0);
	if (errno || *e || e == s)
		FAIL("bad %s '%s'", what, s);
	return v;
}

#endif
