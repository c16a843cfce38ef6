// SPDX-License-Identifier: MIT
// Many connected RC QPs between two processes, and what they cost.
//
//     qp_scale [NQP [DEPTH [SECONDS]]]        (defaults 1000, 128, 60)
//
// Forks; parent and child each open loop0 (port 1), create one PD, one MR
// and one CQ, then NQP RC QPs with max_send_wr = max_recv_wr = DEPTH.  The
// QP numbers go over a socketpair, every QP is connected to its partner,
// and each QP carries one SEND in each direction holding a sequence number,
// checked on arrival (the QP it came in on, its wr_id and its payload).
// Memory is measured around the QP creation: bytes allocated under
// /dev/shm by the fabric's files (softverbs-UID-FABRIC*, FABRIC from
// SOFTVERBS_FABRIC), the /dev/shm file system's used bytes (statvfs; other
// users of /dev/shm show up in it), and each process's VmRSS, RssAnon and
// RssShmem, and the size of its shared anonymous mappings (the send rings:
// their whole size, touched or not).  Per QP means divided by the QPs of
// both processes (2 * NQP); "in all" is /dev/shm files + shared anonymous
// mappings + anonymous RSS, each byte once.
// If fewer than NQP QPs could be created on either side, it says how many
// and the errno, connects and uses those, and exits with status 3.
// Prints human-readable lines and one "RESULT key=value ..." line that
// bench/bench.py parses.  Both processes give up after SECONDS (alarm).
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "pair.h"

#define MSG 16 // bytes per message: sequence number, QPN, magic

struct mem {
	long long rss, anon, shmem; // bytes, from /proc/self/status
	// Shared anonymous mappings (MAP_SHARED | MAP_ANONYMOUS, memfds), from
	// /proc/self/smaps: their whole size and the part touched.  The send
	// rings live there, outside /dev/shm, and a ring's pages count in RSS
	// only once written: the size is what a full ring takes.
	long long sanon_size, sanon_rss;
};

struct side_report {
	int created; // QPs created
	int err; // errno of the first creation that failed, 0 if none
	int ok_recv; // messages received and checked
	int ok_send; // send completions with success
	int bad; // wrong payload, QP or status
	struct mem m0, m1, m2; // before the CQ, before the QPs, after traffic
	double t_create, t_connect; // seconds
};

static struct mem mem_now(void)
{
	struct mem m;
	memset(&m, 0, sizeof(m));
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	if (!f)
		return m;
	while (fgets(line, sizeof(line), f)) {
		long long kb;
		if (sscanf(line, "VmRSS: %lld", &kb) == 1)
			m.rss = kb * 1024;
		else if (sscanf(line, "RssAnon: %lld", &kb) == 1)
			m.anon = kb * 1024;
		else if (sscanf(line, "RssShmem: %lld", &kb) == 1)
			m.shmem = kb * 1024;
	}
	fclose(f);
	f = fopen("/proc/self/smaps", "r");
	if (!f)
		return m;
	int in_sanon = 0;
	while (fgets(line, sizeof(line), f)) {
		unsigned long lo, hi;
		char perms[8];
		int off = 0;
		long long kb;
		if (sscanf(line, "%lx-%lx %7s %*s %*s %*s%n", &lo, &hi, perms, &off) == 3 && off) {
			const char *path = line + off;
			while (*path == ' ')
				path++;
			in_sanon = perms[3] == 's' && (!strncmp(path, "/dev/zero", 9) ||
						       !strncmp(path, "/memfd:", 7));
			if (in_sanon)
				m.sanon_size += hi - lo;
		} else if (in_sanon && sscanf(line, "Rss: %lld", &kb) == 1) {
			m.sanon_rss += kb * 1024;
		}
	}
	fclose(f);
	return m;
}

// Bytes allocated to the fabric's files in /dev/shm, and their count.
static long long fabric_shm(const char *prefix, int *files)
{
	long long sum = 0;
	size_t plen = strlen(prefix);
	DIR *d = opendir("/dev/shm");
	struct dirent *e;
	*files = 0;
	if (!d)
		return -1;
	while ((e = readdir(d))) {
		struct stat st;
		if (strncmp(e->d_name, prefix, plen))
			continue;
		if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0) {
			sum += (long long)st.st_blocks * 512;
			(*files)++;
		}
	}
	closedir(d);
	return sum;
}

static long long devshm_used(void)
{
	struct statvfs v;
	if (statvfs("/dev/shm", &v))
		return -1;
	return (long long)(v.f_blocks - v.f_bfree) * v.f_frsize;
}


int main(int argc, char **argv)
{
	prog = "qp_scale";
	int nqp = argc > 1 ? atoi(argv[1]) : 1000;
	int depth = argc > 2 ? atoi(argv[2]) : 128;
	int secs = argc > 3 ? atoi(argv[3]) : 60;
	if (nqp <= 0 || depth <= 0 || secs <= 0) {
		fprintf(stderr, "usage: %s [NQP [DEPTH [SECONDS]]]\n", argv[0]);
		return 2;
	}
	const char *fab = getenv("SOFTVERBS_FABRIC");
	char prefix[256];
	snprintf(prefix, sizeof(prefix), "softverbs-%u-%s", (unsigned)getuid(),
		 fab && *fab ? fab : "default");
	setvbuf(stdout, NULL, _IOLBF, 0);

	pid_t child = fork_pair(secs);
	int is_child = child == 0;

	struct side_report me;
	memset(&me, 0, sizeof(me));
	long long shm[4] = {0, 0, 0, 0}, vfs[4] = {0, 0, 0, 0};
	int files[4] = {0, 0, 0, 0};

	struct ibv_context *ctx = open_loop0();
	struct ibv_port_attr port;
	struct peer_info mine = my_port(ctx, &port), theirs;
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	if (!pd)
		die("ibv_alloc_pd", errno);
	size_t buf_bytes = (size_t)nqp * MSG * 2; // send half, receive half
	char *buf = aligned_alloc(4096, (buf_bytes + 4095) & ~(size_t)4095);
	if (!buf)
		die("aligned_alloc", ENOMEM);
	memset(buf, 0, buf_bytes);
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, buf_bytes, IBV_ACCESS_LOCAL_WRITE);
	if (!mr)
		die("ibv_reg_mr", errno);
	char *sbuf = buf, *rbuf = buf + (size_t)nqp * MSG;

	// Point 0: before the CQ.
	barrier();
	me.m0 = mem_now();
	if (!is_child) {
		shm[0] = fabric_shm(prefix, &files[0]);
		vfs[0] = devshm_used();
	}
	barrier();

	// One CQ for both directions: a send and a receive completion per QP.
	struct ibv_cq *cq = ibv_create_cq(ctx, 2 * nqp + 16, NULL, NULL, 0);
	if (!cq)
		die("ibv_create_cq", errno);

	// Point 1: before the QPs.
	barrier();
	me.m1 = mem_now();
	if (!is_child) {
		shm[1] = fabric_shm(prefix, &files[1]);
		vfs[1] = devshm_used();
	}
	barrier();

	struct ibv_qp **qp = calloc(nqp, sizeof(*qp));
	if (!qp)
		die("calloc", ENOMEM);
	double t = now();
	for (int i = 0; i < nqp; i++) {
		struct ibv_qp_init_attr a;
		memset(&a, 0, sizeof(a));
		a.send_cq = cq;
		a.recv_cq = cq;
		a.qp_type = IBV_QPT_RC;
		a.cap.max_send_wr = depth;
		a.cap.max_recv_wr = depth;
		a.cap.max_send_sge = 1;
		a.cap.max_recv_sge = 1;
		qp[i] = ibv_create_qp(pd, &a);
		if (!qp[i]) {
			me.err = errno;
			break;
		}
		me.created++;
	}
	me.t_create = now() - t;

	// Point 2: QPs created, not yet connected.
	barrier();
	if (!is_child) {
		shm[2] = fabric_shm(prefix, &files[2]);
		vfs[2] = devshm_used();
	}
	barrier();

	// Exchange: LID, GID, count, then the QPNs.
	mine.created = me.created;
	xwrite(&mine, sizeof(mine));
	xread(&theirs, sizeof(theirs));
	uint32_t *myqpn = calloc(nqp, sizeof(uint32_t));
	uint32_t *peerqpn = calloc(nqp, sizeof(uint32_t));
	if (!myqpn || !peerqpn)
		die("calloc", ENOMEM);
	for (int i = 0; i < me.created; i++)
		myqpn[i] = qp[i]->qp_num;
	xwrite(myqpn, sizeof(uint32_t) * me.created);
	xread(peerqpn, sizeof(uint32_t) * theirs.created);
	int n = me.created < theirs.created ? me.created : theirs.created;

	t = now();
	for (int i = 0; i < n; i++) {
		connect_rc(qp[i], &port, &theirs, peerqpn[i], IBV_ACCESS_LOCAL_WRITE);
		struct ibv_sge sge = {(uintptr_t)(rbuf + (size_t)i * MSG), MSG, mr->lkey};
		struct ibv_recv_wr rw = {.wr_id = i, .sg_list = &sge, .num_sge = 1}, *bad;
		if (ibv_post_recv(qp[i], &rw, &bad))
			die("ibv_post_recv", errno);
	}
	me.t_connect = now() - t;
	barrier(); // every receive is posted on both sides

	// Message i: the sender's side (1 child, 2 parent) << 32 | i, its QPN,
	// a magic word.
	uint64_t side = is_child ? 1 : 2, peer_side = is_child ? 2 : 1;
	int outstanding = 0;
	struct ibv_wc wc[64];
	int want = 2 * n, got = 0;
	for (int i = 0; i < n || got < want;) {
		if (i < n && outstanding < depth) {
			char *m = sbuf + (size_t)i * MSG;
			uint64_t seq = side << 32 | (uint64_t)i;
			uint32_t magic = 0x51534341;
			memcpy(m, &seq, 8);
			memcpy(m + 8, &qp[i]->qp_num, 4);
			memcpy(m + 12, &magic, 4);
			struct ibv_sge sge = {(uintptr_t)m, MSG, mr->lkey};
			struct ibv_send_wr sw = {.wr_id = (uint64_t)i, .sg_list = &sge, .num_sge = 1,
						 .opcode = IBV_WR_SEND,
						 .send_flags = IBV_SEND_SIGNALED},
					   *bad;
			if (ibv_post_send(qp[i], &sw, &bad))
				die("ibv_post_send", errno);
			outstanding++;
			i++;
		}
		int k = ibv_poll_cq(cq, 64, wc);
		if (k < 0)
			die("ibv_poll_cq", EIO);
		for (int j = 0; j < k; j++, got++) {
			uint64_t id = wc[j].wr_id;
			if (wc[j].status != IBV_WC_SUCCESS || id >= (uint64_t)n ||
			    wc[j].qp_num != qp[id]->qp_num) {
				fprintf(stderr, "qp_scale %s: completion wr_id %llu qp %u: %s\n", who,
					(unsigned long long)id, wc[j].qp_num,
					ibv_wc_status_str(wc[j].status));
				me.bad++;
				continue;
			}
			if (wc[j].opcode == IBV_WC_SEND) {
				outstanding--;
				me.ok_send++;
			} else if (wc[j].opcode == IBV_WC_RECV) {
				char *m = rbuf + id * MSG;
				uint64_t seq;
				uint32_t qpn, magic;
				memcpy(&seq, m, 8);
				memcpy(&qpn, m + 8, 4);
				memcpy(&magic, m + 12, 4);
				if (wc[j].byte_len != MSG || seq != (peer_side << 32 | id) ||
				    qpn != peerqpn[id] || magic != 0x51534341) {
					fprintf(stderr, "qp_scale %s: QP %llu got a wrong message\n",
						who, (unsigned long long)id);
					me.bad++;
				} else {
					me.ok_recv++;
				}
			} else {
				me.bad++;
			}
		}
	}
	me.m2 = mem_now();

	// Point 3: connected and used.
	barrier();
	if (!is_child) {
		shm[3] = fabric_shm(prefix, &files[3]);
		vfs[3] = devshm_used();
	}
	barrier();

	if (is_child) {
		xwrite(&me, sizeof(me));
		char b;
		xread(&b, 1); // the parent has it: tear down together
	} else {
		struct side_report ch;
		xread(&ch, sizeof(ch));
		int total = me.created + ch.created, used = n * 2;
		printf("QPs requested %d per process (depth %d): created %d (parent) and %d (child)\n",
		       nqp, depth, me.created, ch.created);
		if (me.err || ch.err)
			printf("QP creation stopped: parent %s, child %s\n",
			       me.err ? strerror(me.err) : "-", ch.err ? strerror(ch.err) : "-");
		printf("connected %d pairs in %.3f s; created %d QPs in %.3f s (parent)\n", n,
		       me.t_connect, me.created, me.t_create);
		printf("messages checked: parent %d/%d received, child %d/%d; bad %d\n",
		       me.ok_recv, n, ch.ok_recv, n, me.bad + ch.bad);
		printf("/dev/shm fabric files: %d -> %d -> %d files, %lld -> %lld -> %lld bytes "
		       "(before CQ, before QPs, after QPs+traffic)\n",
		       files[0], files[2], files[3], shm[0], shm[1], shm[3]);
		double per = used ? 1.0 / (total ? total : 1) : 0;
		long long d_shm = shm[3] - shm[1], d_vfs = vfs[3] - vfs[1];
		long long d_rss = (me.m2.rss - me.m1.rss) + (ch.m2.rss - ch.m1.rss);
		long long d_anon = (me.m2.anon - me.m1.anon) + (ch.m2.anon - ch.m1.anon);
		long long d_shmem = (me.m2.shmem - me.m1.shmem) + (ch.m2.shmem - ch.m1.shmem);
		long long d_ssize = (me.m2.sanon_size - me.m1.sanon_size) +
				    (ch.m2.sanon_size - ch.m1.sanon_size);
		long long d_srss = (me.m2.sanon_rss - me.m1.sanon_rss) +
				   (ch.m2.sanon_rss - ch.m1.sanon_rss);
		printf("per QP (%d QPs): /dev/shm fabric files %.0f B (statvfs %.0f B), "
		       "RSS %.0f B (anon %.0f B, shmem %.0f B), shared anonymous mappings "
		       "%.0f B (%.0f B touched); CQ of %d: %lld B /dev/shm\n",
		       total, d_shm * per, d_vfs * per, d_rss * per, d_anon * per, d_shmem * per,
		       d_ssize * per, d_srss * per, 2 * nqp + 16, shm[1] - shm[0]);
		printf("per QP in all: %.0f B (/dev/shm files + shared anonymous mappings + "
		       "anonymous RSS)\n",
		       (d_shm + d_ssize + d_anon) * per);
		printf("RESULT nqp=%d depth=%d created=%d peer_created=%d errno=%d peer_errno=%d "
		       "used=%d ok=%d bad=%d shm_per_qp=%.0f vfs_per_qp=%.0f rss_per_qp=%.0f "
		       "anon_per_qp=%.0f shmem_per_qp=%.0f sanon_per_qp=%.0f sanon_rss_per_qp=%.0f "
		       "total_per_qp=%.0f cq_shm=%lld files=%d\n",
		       nqp, depth, me.created, ch.created, me.err, ch.err, n,
		       me.ok_recv + ch.ok_recv, me.bad + ch.bad, d_shm * per, d_vfs * per,
		       d_rss * per, d_anon * per, d_shmem * per, d_ssize * per, d_srss * per,
		       (d_shm + d_ssize + d_anon) * per, shm[1] - shm[0], files[3]);
		char b = 'x';
		xwrite(&b, 1);
		int status = 0;
		waitpid(child, &status, 0);
		int ok = me.ok_recv == n && ch.ok_recv == n && !me.bad && !ch.bad &&
			 WIFEXITED(status) && WEXITSTATUS(status) == 0;
		if (!ok)
			return 1;
		if (n < nqp)
			return 3;
	}
	for (int i = 0; i < me.created; i++)
		ibv_destroy_qp(qp[i]);
	ibv_destroy_cq(cq);
	ibv_dereg_mr(mr);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	return 0;
}
