// SPDX-License-Identifier: MIT
// RDMA WRITE bandwidth into an fd-backed MR, between two processes.
//
//     fd_write_bw [SIZE [ITERS [MODE [SECONDS]]]]   (defaults 1048576, 5000, sealed, 60)
//
// Forks.  The child is the target: it registers SIZE bytes as the MR the
// parent writes into, by MODE:
//   sealed  a memfd sealed against shrinking, softverbs_reg_mr_fd (what
//           docs/memory.md recommends: peers copy into it with memcpy)
//   memfd   the same memfd unsealed (peers must use the kernel's checked copy)
//   plain   aligned_alloc + ibv_reg_mr, for comparison
// The parent registers a SIZE-byte source buffer and posts ITERS RDMA WRITEs
// of SIZE bytes to the child's MR on one RC QP, at most 128 outstanding,
// every 64th signaled, as ib_write_bw does; the time from the first post to
// the last completion gives the bandwidth (MB/s, 2^20 bytes, as perftest).
// Then it writes one more buffer with a fresh pattern and the child checks
// every byte of its MR against it.  Prints one "RESULT ..." line.
#include "pair.h"

#include <fcntl.h>
#include <infiniband/softverbs_dv.h>
#include <sys/mman.h>
#include <sys/wait.h>

#define DEPTH 128
#define SIGNAL_EVERY 64
#define IOVA 0x40000000ull // Where the fd-backed MRs sit on the wire

struct target_info {
	struct peer_info port;
	uint32_t qpn, rkey;
	uint64_t addr;
};

static void fill(uint64_t *p, size_t words, uint64_t seed)
{
	for (size_t i = 0; i < words; i++)
		p[i] = seed ^ (i * 0x9e3779b97f4a7c15ull);
}

static size_t first_bad(const uint64_t *p, size_t words, uint64_t seed)
{
	for (size_t i = 0; i < words; i++)
		if (p[i] != (seed ^ (i * 0x9e3779b97f4a7c15ull)))
			return i;
	return words;
}

static struct ibv_qp *make_qp(struct ibv_pd *pd, struct ibv_cq *cq)
{
	struct ibv_qp_init_attr a;
	memset(&a, 0, sizeof(a));
	a.send_cq = cq;
	a.recv_cq = cq;
	a.qp_type = IBV_QPT_RC;
	a.cap.max_send_wr = DEPTH;
	a.cap.max_recv_wr = 1;
	a.cap.max_send_sge = 1;
	a.cap.max_recv_sge = 1;
	struct ibv_qp *qp = ibv_create_qp(pd, &a);
	if (!qp)
		die("ibv_create_qp", errno);
	return qp;
}

// Posts n WRITEs of the whole buffer and waits for them all.
static void write_n(struct ibv_qp *qp, struct ibv_cq *cq, struct ibv_mr *mr, size_t size,
		    const struct target_info *t, long n)
{
	long posted = 0, done = 0;
	struct ibv_wc wc[16];
	while (done < n) {
		while (posted < n && posted - done < DEPTH) {
			struct ibv_sge sge = {(uintptr_t)mr->addr, (uint32_t)size, mr->lkey};
			int last = posted == n - 1 || (posted + 1) % SIGNAL_EVERY == 0;
			struct ibv_send_wr w = {.wr_id = (uint64_t)posted + 1, .sg_list = &sge,
						.num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
						.send_flags = last ? IBV_SEND_SIGNALED : 0},
					   *bad;
			w.wr.rdma.remote_addr = t->addr;
			w.wr.rdma.rkey = t->rkey;
			int err = ibv_post_send(qp, &w, &bad);
			if (err)
				die("ibv_post_send", err);
			posted++;
		}
		int k = ibv_poll_cq(cq, 16, wc);
		if (k < 0)
			die("ibv_poll_cq", EIO);
		for (int i = 0; i < k; i++) {
			if (wc[i].status != IBV_WC_SUCCESS) {
				fprintf(stderr, "%s %s: WRITE %llu: %s\n", prog, who,
					(unsigned long long)wc[i].wr_id, ibv_wc_status_str(wc[i].status));
				exit(1);
			}
			done = (long)wc[i].wr_id; // Signaled WRs complete in order
		}
	}
}

int main(int argc, char **argv)
{
	prog = "fd_write_bw";
	size_t size = argc > 1 ? strtoull(argv[1], NULL, 0) : 1 << 20;
	long iters = argc > 2 ? atol(argv[2]) : 5000;
	const char *mode = argc > 3 ? argv[3] : "sealed";
	int secs = argc > 4 ? atoi(argv[4]) : 60;
	int sealed = !strcmp(mode, "sealed"), memfd = sealed || !strcmp(mode, "memfd");
	if (!size || size % 8 || size > (1u << 30) || iters <= 0 || secs <= 0 ||
	    (!memfd && strcmp(mode, "plain"))) {
		fprintf(stderr, "usage: %s [SIZE (multiple of 8) [ITERS [sealed|memfd|plain [SECONDS]]]]\n",
			argv[0]);
		return 2;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	pid_t child = fork_pair(secs);

	struct ibv_context *ctx = open_loop0();
	struct ibv_port_attr port;
	struct target_info mine = {.port = my_port(ctx, &port)}, theirs;
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	if (!pd)
		die("ibv_alloc_pd", errno);
	struct ibv_cq *cq = ibv_create_cq(ctx, 2 * DEPTH, NULL, NULL, 0);
	if (!cq)
		die("ibv_create_cq", errno);
	struct ibv_qp *qp = make_qp(pd, cq);
	mine.qpn = qp->qp_num;

	uint64_t *buf;
	struct ibv_mr *mr;
	if (child == 0 && memfd) {
		int fd = memfd_create("fd_write_bw", MFD_CLOEXEC | MFD_ALLOW_SEALING);
		if (fd < 0 || ftruncate(fd, (off_t)size))
			die("memfd", errno);
		if (sealed && fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK))
			die("F_SEAL_SHRINK", errno);
		buf = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		if (buf == MAP_FAILED)
			die("mmap memfd", errno);
		mr = softverbs_reg_mr_fd(pd, fd, SOFTVERBS_FD_MEMFD, 0, size, IOVA,
					 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
		if (!mr)
			die("softverbs_reg_mr_fd", errno);
		close(fd); // The library keeps its own duplicate
		mine.addr = IOVA;
	} else {
		buf = aligned_alloc(4096, size);
		if (!buf)
			die("aligned_alloc", ENOMEM);
		memset(buf, 0, size);
		mr = ibv_reg_mr(pd, buf, size, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
		if (!mr)
			die("ibv_reg_mr", errno);
		mine.addr = (uintptr_t)buf;
	}
	mine.rkey = mr->rkey;
	xwrite(&mine, sizeof(mine));
	xread(&theirs, sizeof(theirs));
	connect_rc(qp, &port, &theirs.port, theirs.qpn,
		   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	barrier();

	size_t words = size / 8;
	uint64_t seed = 0x5eed0000ull ^ (uint64_t)getpid();
	if (child == 0) {
		// Target: wait for the check's seed, then look at every byte.
		xread(&seed, sizeof(seed));
		size_t bad = first_bad(buf, words, seed);
		int ok = bad == words;
		if (!ok)
			fprintf(stderr, "%s target: word %zu of %zu is not what was written\n", prog,
				bad, words);
		xwrite(&ok, sizeof(ok));
		return ok ? 0 : 1;
	}

	fill(buf, words, seed);
	write_n(qp, cq, mr, size, &theirs, DEPTH); // Warm up: mappings, keys, pages
	double t0 = now();
	write_n(qp, cq, mr, size, &theirs, iters);
	double t = now() - t0;
	fill(buf, words, seed + 1);
	write_n(qp, cq, mr, size, &theirs, 1);
	seed++;
	xwrite(&seed, sizeof(seed));
	int ok = 0;
	xread(&ok, sizeof(ok));
	int status = 0;
	waitpid(child, &status, 0);
	double mbps = (double)size * iters / t / (1 << 20);
	printf("RDMA WRITE %zu B x %ld into a %s MR: %.0f MB/s, %.3f Mpps; data %s\n", size, iters,
	       mode, mbps, iters / t / 1e6, ok ? "checked" : "WRONG");
	printf("RESULT size=%zu iters=%ld bw=%.1f mpps=%.4f ok=%d\n", size, iters, mbps,
	       iters / t / 1e6, ok);
	ibv_destroy_qp(qp);
	ibv_destroy_cq(cq);
	ibv_dereg_mr(mr);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	return ok && WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}
