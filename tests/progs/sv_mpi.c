// SPDX-License-Identifier: MIT
// sv_mpi: MPI traffic with every byte checked, for pyverbs-tests/test_mpi.py
// (Open MPI's pml ucx and osc ucx over loop0).
//
// Phases, each verified against values recomputed independently on the
// receiving side, never only by sizes or return codes:
//   pingpong    even rank r with r+1: 1 B to 4 MiB (powers of two and a
//               few odd sizes), a fresh pattern per size, iteration and
//               direction; receive buffers poisoned before each receive
//   allreduce   MPI_SUM of int64 vectors (1 to 256 Ki elements)
//   alltoall    a block per pair, patterned by (source, destination, round)
//   bcast       every rank is root once, 1 B to 1 MiB
//   put/get/acc in a window (MPI_Win_allocate, fence epochs and a
//               passive-target lock): put into the right neighbour, get from
//               the left one, accumulate from everyone into everyone
// Prints one "sv_mpi: PHASE ok ..." line per phase from rank 0 (counts and
// a checksum over what was verified), "sv_mpi: PASS" at the end; on a
// mismatch prints "sv_mpi: MISMATCH ..." and calls MPI_Abort (exit 3).
//   threads     only with SV_MPI_THREADS=N (1..8): MPI_THREAD_MULTIPLE, and
//               N threads per rank each exchange 1 MiB with the partner
//               rank 5 times on a tag of their own, all at once
// usage: sv_mpi [MAX_PINGPONG_BYTES]   (default 4 MiB)
#include <mpi.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int rank, nranks;
// Per phase: bytes verified by this rank, and a checksum over them (FNV-1a
// over the verified data), summed over ranks for the report.
static uint64_t verified_bytes, verified_sum;

static uint8_t pat(uint64_t seed, uint64_t i)
{
	uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed * 0xBF58476D1CE4E5B9ull;
	x ^= x >> 29;
	return (uint8_t)(x ^ (x >> 17));
}

static void fill(uint8_t *buf, size_t n, uint64_t seed)
{
	for (size_t i = 0; i < n; i++)
		buf[i] = pat(seed, i);
}

static void fail(const char *what, size_t n, size_t at, int got, int want)
{
	fprintf(stderr, "sv_mpi: MISMATCH rank %d %s len %zu at byte %zu: got 0x%02x, want 0x%02x\n",
		rank, what, n, at, got, want);
	fflush(stderr);
	MPI_Abort(MPI_COMM_WORLD, 3);
}

static void account(const uint8_t *buf, size_t n)
{
	uint64_t h = verified_sum ? verified_sum : 0xcbf29ce484222325ull;
	for (size_t i = 0; i < n; i++)
		h = (h ^ buf[i]) * 0x100000001b3ull;
	verified_sum = h;
	verified_bytes += n;
}

static void check(const uint8_t *buf, size_t n, uint64_t seed, const char *what)
{
	for (size_t i = 0; i < n; i++)
		if (buf[i] != pat(seed, i))
			fail(what, n, i, buf[i], pat(seed, i));
	account(buf, n);
}

static void mpi_ok(int rc, const char *what)
{
	if (rc != MPI_SUCCESS) {
		fprintf(stderr, "sv_mpi: rank %d: %s failed (%d)\n", rank, what, rc);
		MPI_Abort(MPI_COMM_WORLD, 2);
	}
}

static void report(const char *phase, const char *detail)
{
	uint64_t mine[2] = {verified_bytes, verified_sum}, all[2];
	mpi_ok(MPI_Reduce(&mine[0], &all[0], 1, MPI_UINT64_T, MPI_SUM, 0, MPI_COMM_WORLD), "Reduce");
	mpi_ok(MPI_Reduce(&mine[1], &all[1], 1, MPI_UINT64_T, MPI_SUM, 0, MPI_COMM_WORLD), "Reduce");
	if (rank == 0)
		printf("sv_mpi: %s ok %s verified %llu bytes checksum %016llx\n", phase, detail,
		       (unsigned long long)all[0], (unsigned long long)all[1]);
	fflush(stdout);
	verified_bytes = verified_sum = 0;
}

static void *xmalloc(size_t n)
{
	void *p = malloc(n ? n : 1);
	if (!p) {
		fprintf(stderr, "sv_mpi: out of memory (%zu)\n", n);
		MPI_Abort(MPI_COMM_WORLD, 2);
	}
	return p;
}

static void pingpong(size_t max)
{
	// Ranks pair up (0,1), (2,3), ...; an odd last rank sits out.
	int peer = rank ^ 1;
	size_t sizes[64], nsizes = 0;
	for (size_t s = 1; s <= max; s *= 2) {
		sizes[nsizes++] = s;
		if (s >= 4 && s * 3 / 2 + 1 <= max && nsizes < 60)
			sizes[nsizes++] = s * 3 / 2 + 1; // off the power of two
	}
	uint8_t *buf = xmalloc(max), *want = xmalloc(max);
	unsigned exchanges = 0;
	if (peer < nranks) {
		for (size_t k = 0; k < nsizes; k++) {
			size_t n = sizes[k];
			int iters = n <= 65536 ? 20 : 4;
			for (int it = 0; it < iters; it++) {
				uint64_t seed_ping = ((uint64_t)n << 20) ^ ((uint64_t)it << 4) ^ (uint64_t)(rank & ~1) << 1;
				uint64_t seed_pong = seed_ping ^ 0x5a5a5a5a00000001ull;
				if ((rank & 1) == 0) {
					fill(buf, n, seed_ping);
					mpi_ok(MPI_Send(buf, (int)n, MPI_BYTE, peer, 1, MPI_COMM_WORLD), "Send");
					memset(buf, 0xa5 ^ it, n);
					MPI_Status st;
					mpi_ok(MPI_Recv(buf, (int)n, MPI_BYTE, peer, 2, MPI_COMM_WORLD, &st), "Recv");
					int got;
					MPI_Get_count(&st, MPI_BYTE, &got);
					if ((size_t)got != n)
						fail("pong length", n, 0, got, (int)n);
					check(buf, n, seed_pong, "pong");
				} else {
					memset(buf, 0x5a ^ it, n);
					MPI_Status st;
					mpi_ok(MPI_Recv(buf, (int)n, MPI_BYTE, peer, 1, MPI_COMM_WORLD, &st), "Recv");
					int got;
					MPI_Get_count(&st, MPI_BYTE, &got);
					if ((size_t)got != n)
						fail("ping length", n, 0, got, (int)n);
					check(buf, n, seed_ping, "ping");
					fill(want, n, seed_pong);
					mpi_ok(MPI_Send(want, (int)n, MPI_BYTE, peer, 2, MPI_COMM_WORLD), "Send");
				}
				exchanges++;
			}
		}
	}
	free(buf);
	free(want);
	char d[128];
	snprintf(d, sizeof d, "sizes 1..%zu (%zu sizes, %u round trips per pair)", max, nsizes,
		 exchanges);
	report("pingpong", d);
}

static void allreduce(void)
{
	static const int counts[] = {1, 7, 1000, 65536, 262144};
	int64_t *in = xmalloc(262144 * sizeof(int64_t)), *out = xmalloc(262144 * sizeof(int64_t));
	int64_t rank_sum = (int64_t)nranks * (nranks - 1) / 2;
	for (int round = 0; round < 3; round++)
		for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
			int n = counts[c];
			for (int i = 0; i < n; i++)
				in[i] = (int64_t)rank * (i + 1) * 7919 + round * 1000003 + i;
			memset(out, 0xee, n * sizeof(int64_t));
			mpi_ok(MPI_Allreduce(in, out, n, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD),
			       "Allreduce");
			for (int i = 0; i < n; i++) {
				int64_t want = rank_sum * (i + 1) * 7919 + (int64_t)nranks * (round * 1000003 + i);
				if (out[i] != want) {
					fprintf(stderr, "sv_mpi: MISMATCH rank %d allreduce n %d [%d]: %lld != %lld\n",
						rank, n, i, (long long)out[i], (long long)want);
					MPI_Abort(MPI_COMM_WORLD, 3);
				}
			}
			account((const uint8_t *)out, n * sizeof(int64_t));
		}
	free(in);
	free(out);
	report("allreduce", "MPI_SUM int64, 1..262144 elements x 3 rounds");
}

static uint64_t a2a_seed(int src, int dst, int round, size_t blk)
{
	return ((uint64_t)src << 40) ^ ((uint64_t)dst << 24) ^ ((uint64_t)round << 8) ^ blk;
}

static void alltoall(void)
{
	static const size_t blks[] = {1, 100, 4096, 65536, 262144};
	uint8_t *snd = xmalloc(262144 * (size_t)nranks), *rcv = xmalloc(262144 * (size_t)nranks);
	for (int round = 0; round < 2; round++)
		for (size_t b = 0; b < sizeof blks / sizeof blks[0]; b++) {
			size_t blk = blks[b];
			for (int d = 0; d < nranks; d++)
				fill(snd + d * blk, blk, a2a_seed(rank, d, round, blk));
			memset(rcv, 0xc3, blk * nranks);
			mpi_ok(MPI_Alltoall(snd, (int)blk, MPI_BYTE, rcv, (int)blk, MPI_BYTE, MPI_COMM_WORLD),
			       "Alltoall");
			for (int s = 0; s < nranks; s++)
				check(rcv + s * blk, blk, a2a_seed(s, rank, round, blk), "alltoall");
		}
	free(snd);
	free(rcv);
	report("alltoall", "blocks 1..262144 bytes x 2 rounds");
}

static void bcast(void)
{
	static const size_t sizes[] = {1, 1000, 65536, 1048576};
	uint8_t *buf = xmalloc(1048576);
	for (int root = 0; root < nranks; root++)
		for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
			size_t n = sizes[k];
			uint64_t seed = 0xb0ca57ull ^ ((uint64_t)root << 32) ^ n;
			if (rank == root)
				fill(buf, n, seed);
			else
				memset(buf, 0x3c, n);
			mpi_ok(MPI_Bcast(buf, (int)n, MPI_BYTE, root, MPI_COMM_WORLD), "Bcast");
			check(buf, n, seed, "bcast");
		}
	free(buf);
	report("bcast", "every rank root, 1..1048576 bytes");
}

// One-sided: a window of WIN bytes per rank.  Layout:
//   [0, PUTLEN)              put target (written by the left neighbour)
//   [PUTLEN, 2*PUTLEN)       get source (read by the right neighbour)
//   [2*PUTLEN, +ACC*8)       accumulate target (int64, added to by everyone)
#define PUTLEN (1u << 20)
#define ACCN 4096

static void onesided(void)
{
	size_t winlen = 2 * (size_t)PUTLEN + ACCN * sizeof(int64_t);
	uint8_t *base;
	MPI_Win win;
	mpi_ok(MPI_Win_allocate((MPI_Aint)winlen, 1, MPI_INFO_NULL, MPI_COMM_WORLD, &base, &win),
	       "Win_allocate");
	int right = (rank + 1) % nranks, left = (rank + nranks - 1) % nranks;
	static const size_t sizes[] = {8, 4096, 65536, PUTLEN};
	uint8_t *src = xmalloc(PUTLEN), *dst = xmalloc(PUTLEN);
	unsigned puts = 0, gets = 0, accs = 0;

	for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
		size_t n = sizes[k];
		// PUT into the right neighbour's window, fence, the owner checks.
		memset(base, 0x11, PUTLEN);
		fill(base + PUTLEN, PUTLEN, 0x6e7 ^ ((uint64_t)rank << 36) ^ n); // get source
		fill(src, n, 0x907 ^ ((uint64_t)rank << 36) ^ n);
		mpi_ok(MPI_Win_fence(0, win), "Win_fence");
		mpi_ok(MPI_Put(src, (int)n, MPI_BYTE, right, 0, (int)n, MPI_BYTE, win), "Put");
		mpi_ok(MPI_Win_fence(0, win), "Win_fence");
		check(base, n, 0x907 ^ ((uint64_t)left << 36) ^ n, "put");
		for (size_t i = n; i < PUTLEN; i += 4093) // nothing written past the put
			if (base[i] != 0x11)
				fail("put overrun", n, i, base[i], 0x11);
		puts++;

		// GET from the left neighbour's get source.
		memset(dst, 0x22, n);
		mpi_ok(MPI_Win_fence(0, win), "Win_fence");
		mpi_ok(MPI_Get(dst, (int)n, MPI_BYTE, left, PUTLEN, (int)n, MPI_BYTE, win), "Get");
		mpi_ok(MPI_Win_fence(0, win), "Win_fence");
		check(dst, n, 0x6e7 ^ ((uint64_t)left << 36) ^ n, "get");
		gets++;
	}

	// Passive target: lock the right neighbour, put and get back, unlock.
	{
		size_t n = 65536;
		fill(src, n, 0x10c4ull ^ (uint64_t)rank);
		mpi_ok(MPI_Barrier(MPI_COMM_WORLD), "Barrier");
		mpi_ok(MPI_Win_lock(MPI_LOCK_SHARED, right, 0, win), "Win_lock");
		mpi_ok(MPI_Put(src, (int)n, MPI_BYTE, right, 0, (int)n, MPI_BYTE, win), "Put");
		mpi_ok(MPI_Win_flush(right, win), "Win_flush");
		memset(dst, 0x33, n);
		mpi_ok(MPI_Get(dst, (int)n, MPI_BYTE, right, 0, (int)n, MPI_BYTE, win), "Get");
		mpi_ok(MPI_Win_unlock(right, win), "Win_unlock");
		check(dst, n, 0x10c4ull ^ (uint64_t)rank, "lock put/get");
		mpi_ok(MPI_Barrier(MPI_COMM_WORLD), "Barrier");
		puts++;
		gets++;
	}

	// ACCUMULATE: every rank adds to every rank's counters, twice.
	int64_t *acc = (int64_t *)(base + 2 * (size_t)PUTLEN);
	int64_t *add = xmalloc(ACCN * sizeof(int64_t));
	mpi_ok(MPI_Win_fence(0, win), "Win_fence");
	for (int i = 0; i < ACCN; i++)
		acc[i] = 1000 + i;
	mpi_ok(MPI_Win_fence(0, win), "Win_fence");
	for (int pass = 0; pass < 2; pass++) {
		for (int t = 0; t < nranks; t++) {
			for (int i = 0; i < ACCN; i++)
				add[i] = (int64_t)(rank + 1) * (i + 3) + t * 11 + pass;
			mpi_ok(MPI_Accumulate(add, ACCN, MPI_INT64_T, t, 2 * (MPI_Aint)PUTLEN, ACCN,
					      MPI_INT64_T, MPI_SUM, win), "Accumulate");
			accs++;
		}
		// Accumulates in one epoch are element-wise atomic, not ordered
		// against the local loads of add[]: finish them before reuse.
		mpi_ok(MPI_Win_fence(0, win), "Win_fence");
	}
	int64_t ranksum1 = (int64_t)nranks * (nranks + 1) / 2;
	for (int i = 0; i < ACCN; i++) {
		int64_t want = 1000 + i;
		for (int pass = 0; pass < 2; pass++)
			want += ranksum1 * (i + 3) + (int64_t)nranks * (rank * 11 + pass);
		if (acc[i] != want) {
			fprintf(stderr, "sv_mpi: MISMATCH rank %d accumulate [%d]: %lld != %lld\n", rank, i,
				(long long)acc[i], (long long)want);
			MPI_Abort(MPI_COMM_WORLD, 3);
		}
	}
	account((const uint8_t *)acc, ACCN * sizeof(int64_t));
	mpi_ok(MPI_Win_free(&win), "Win_free");
	free(add);
	free(src);
	free(dst);
	char d[128];
	snprintf(d, sizeof d, "put %u get %u accumulate %u per rank, 8..%u bytes", puts, gets, accs,
		 PUTLEN);
	report("onesided", d);
}

#define TMSG (1u << 20)
#define TITER 5
static pthread_mutex_t account_lock = PTHREAD_MUTEX_INITIALIZER;

static uint64_t thread_seed(int from, int t, int it)
{
	return 0x7468726561647300ull ^ ((uint64_t)from << 40) ^ ((uint64_t)t << 20) ^ (uint64_t)it;
}

static void *thread_main(void *arg)
{
	int t = (int)(intptr_t)arg, peer = rank ^ 1;
	uint8_t *snd = xmalloc(TMSG), *rcv = xmalloc(TMSG);
	for (int it = 0; it < TITER; it++) {
		fill(snd, TMSG, thread_seed(rank, t, it));
		memset(rcv, 0xA5, TMSG);
		MPI_Request q[2];
		mpi_ok(MPI_Irecv(rcv, TMSG, MPI_BYTE, peer, 1000 + t, MPI_COMM_WORLD, &q[0]), "Irecv");
		mpi_ok(MPI_Isend(snd, TMSG, MPI_BYTE, peer, 1000 + t, MPI_COMM_WORLD, &q[1]), "Isend");
		mpi_ok(MPI_Waitall(2, q, MPI_STATUSES_IGNORE), "Waitall");
		pthread_mutex_lock(&account_lock);
		check(rcv, TMSG, thread_seed(peer, t, it), "threads");
		pthread_mutex_unlock(&account_lock);
	}
	free(snd);
	free(rcv);
	return NULL;
}

// Every thread of a rank in MPI at once: the progress engine's lock is
// passed between them (UCX's worker lock with MPI_THREAD_MULTIPLE).
static void threads(int n)
{
	pthread_t th[8];
	if ((rank ^ 1) < nranks) {
		for (int t = 0; t < n; t++)
			if (pthread_create(&th[t], NULL, thread_main, (void *)(intptr_t)t)) {
				fprintf(stderr, "sv_mpi: pthread_create failed\n");
				MPI_Abort(MPI_COMM_WORLD, 2);
			}
		for (int t = 0; t < n; t++)
			pthread_join(th[t], NULL);
	}
	char d[96];
	snprintf(d, sizeof d, "%d threads per rank, %d x %u bytes each", n, TITER, TMSG);
	report("threads", d);
}

int main(int argc, char **argv)
{
	const char *tenv = getenv("SV_MPI_THREADS");
	int nthreads = tenv ? atoi(tenv) : 0;
	if (nthreads < 0 || nthreads > 8) {
		fprintf(stderr, "sv_mpi: SV_MPI_THREADS is 1..8\n");
		return 2;
	}
	if (nthreads) {
		int got = 0;
		MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &got);
		if (got < MPI_THREAD_MULTIPLE) {
			fprintf(stderr, "sv_mpi: MPI_THREAD_MULTIPLE not provided (%d)\n", got);
			MPI_Abort(MPI_COMM_WORLD, 2);
		}
	} else {
		MPI_Init(&argc, &argv);
	}
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &nranks);
	size_t max = argc > 1 ? strtoull(argv[1], NULL, 0) : 4u << 20;
	if (max < 1 || max > (64u << 20)) {
		if (rank == 0)
			fprintf(stderr, "usage: sv_mpi [MAX_PINGPONG_BYTES (1..64 MiB)]\n");
		MPI_Finalize();
		return 2;
	}
	if (rank == 0)
		printf("sv_mpi: %d ranks\n", nranks);
	pingpong(max);
	allreduce();
	alltoall();
	bcast();
	onesided();
	if (nthreads)
		threads(nthreads);
	MPI_Barrier(MPI_COMM_WORLD);
	if (rank == 0)
		printf("sv_mpi: PASS\n");
	MPI_Finalize();
	return 0;
}
