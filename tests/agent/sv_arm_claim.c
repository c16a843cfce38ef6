/* SPDX-License-Identifier: MIT */
/*
 * A completion event for an entry whose placement a sender holds
 * (docs/design.md, "CQ ring"; kernel-abi/softverbs-abi.h, SV_PLACE_TAG).
 *
 *   sv_arm_claim
 *
 * With remapping off, a small SEND from another process into plain memory
 * travels in the CQE, and the sender claims its placement before its next
 * byte moves.  While it holds the claim the owner's poll stops at the entry
 * (it is published, but not ready).  Here the sender (a child process)
 * sends one message and exits, and the parent, once its event came, writes
 * the entry's place word to CLAIMED: a sender that died holding its claim,
 * which the owner takes over after kClaimCheckNs.  The parent then waits as
 * ibv_get_cq_event(3) says (ack, arm, poll until empty, wait): each poll
 * that stops at the claimed entry must leave an event behind it, since the
 * event already taken announced the entry and the arm raises none for it.
 * Before, the poll found nothing, no event came, and the completion sat in
 * the CQ (a helper's probe lost 3 to 7 in 40,000).  The ring's address
 * comes from softverbs_dv_cq_agent, handed back at once.  Prints "ok".
 */
#include "../progs/svt.h"

#include <infiniband/softverbs_dv.h>

#include <sys/wait.h>

static const struct svt_conn conn = {SVT_ALL_ACCESS, 1, 14, 7, 7};

/* The place word's states (enum sv_place_state), in its low two bits. */
#define PLACE_CLAIMED 2u
#define CQE_PLACE 2u /* softverbs_cqe.flags: the payload travels in the CQE */

static void child(int rd, int wr)
{
	svt_watchdog(30);
	struct svt_dev d;
	svt_open(&d, "loop0");
	struct ibv_cq *cq = ibv_create_cq(d.ctx, 4, NULL, NULL, 0);
	struct svt_qpopt o = {.type = IBV_QPT_RC, .scq = cq, .rcq = cq, .max_inline = 64};
	struct ibv_qp *qp = svt_qp(&d, &o);
	uint32_t mine[2] = {qp->qp_num, d.lid}, peer;
	CHECK(write(wr, mine, sizeof(mine)) == sizeof(mine));
	CHECK(read(rd, &peer, sizeof(peer)) == sizeof(peer));
	svt_connect(qp, peer, d.lid, &conn);
	char go;
	CHECK(read(rd, &go, 1) == 1);
	uint64_t msg[2] = {0x5eed5eed5eed5eedULL, 0x0123456789abcdefULL};
	struct ibv_sge s = {(uintptr_t)msg, sizeof(msg), 0};
	CHECK(svt_post_send1(qp, 1, IBV_WR_SEND, &s, 1, IBV_SEND_SIGNALED | IBV_SEND_INLINE, 0,
			     0) == 0);
	struct ibv_wc wc = svt_wait(cq, "the SEND");
	CHECK_WC(wc, IBV_WC_SUCCESS);
	_exit(0); /* Gone, as a sender that died holding its claim */
}

int main(void)
{
	setenv("SOFTVERBS_REMAP", "0", 1); /* The receive buffer stays plain memory */
	int down[2], up[2];
	CHECK(pipe(down) == 0 && pipe(up) == 0);
	pid_t pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		close(down[1]);
		close(up[0]);
		child(down[0], up[1]);
	}
	close(down[0]);
	close(up[1]);
	svt_watchdog(60);
	struct svt_dev d;
	svt_open(&d, "loop0");
	struct ibv_comp_channel *ch = ibv_create_comp_channel(d.ctx);
	CHECK(ch);
	struct ibv_cq *cq = ibv_create_cq(d.ctx, 8, NULL, ch, 0);
	CHECK(cq);
	struct svt_qpopt o = {.type = IBV_QPT_RC, .scq = cq, .rcq = cq};
	struct ibv_qp *qp = svt_qp(&d, &o);
	struct ibv_mr *mr = svt_mr(&d, 4096, SVT_ALL_ACCESS);
	uint32_t peer[2];
	CHECK(read(up[0], peer, sizeof(peer)) == sizeof(peer));
	CHECK(write(down[1], &qp->qp_num, sizeof(qp->qp_num)) == sizeof(qp->qp_num));
	svt_connect(qp, peer[0], (uint16_t)peer[1], &conn);
	struct ibv_sge s = svt_sge(mr, 0, 64);
	svt_post_recv1(qp, 7, &s, 1);
	struct softverbs_dv_cq dc;
	CHECK(softverbs_dv_cq_agent(cq, 1, &dc) == 0);
	CHECK(softverbs_dv_cq_agent(cq, 0, NULL) == 0);
	CHECK(ibv_req_notify_cq(cq, 0) == 0);
	CHECK(write(down[1], "g", 1) == 1);
	if (!svt_event_within(ch, cq, 5000))
		FAIL("no event for the SEND");
	int st = 0;
	CHECK(waitpid(pid, &st, 0) == pid);
	if (!WIFEXITED(st) || WEXITSTATUS(st))
		FAIL("the sender failed (status %#x)", st);
	/* The first entry: published, its payload in the CQE. */
	struct softverbs_cqe *e = &dc.slots[0];
	CHECK_EQ(__atomic_load_n(&e->seq, __ATOMIC_ACQUIRE), 1u);
	if (!(e->flags & CQE_PLACE))
		FAIL("setup: the SEND's bytes did not travel in the CQE (flags %#x)", e->flags);
	__atomic_store_n(&e->place, (e->place & ~3u) | PLACE_CLAIMED, __ATOMIC_RELEASE);
	/* ibv_get_cq_event(3): ack (done), arm, poll until empty, wait. */
	struct ibv_wc wc;
	int events = 0;
	for (;;) {
		CHECK(ibv_req_notify_cq(cq, 0) == 0);
		int n = ibv_poll_cq(cq, 1, &wc);
		CHECK(n >= 0);
		if (n)
			break;
		if (!svt_event_within(ch, cq, 2000))
			FAIL("no event while the CQ holds a completion whose placement is claimed "
			     "(after %d events)",
			     events);
		events++;
	}
	CHECK_WC(wc, IBV_WC_SUCCESS);
	CHECK_EQ(wc.wr_id, (uint64_t)7);
	CHECK_EQ(wc.byte_len, 16u);
	uint64_t *got = (uint64_t *)mr->addr;
	CHECK_EQ(got[0], 0x5eed5eed5eed5eedULL);
	CHECK_EQ(got[1], 0x0123456789abcdefULL);
	printf("claimed entry taken over after %d events\n", events);
	CHECK(ibv_destroy_qp(qp) == 0);
	void *buf = mr->addr;
	CHECK(ibv_dereg_mr(mr) == 0);
	free(buf);
	CHECK(ibv_destroy_cq(cq) == 0);
	CHECK(ibv_destroy_comp_channel(ch) == 0);
	CHECK(ibv_dealloc_pd(d.pd) == 0);
	CHECK(ibv_close_device(d.ctx) == 0);
	printf("ok\n");
	return 0;
}
