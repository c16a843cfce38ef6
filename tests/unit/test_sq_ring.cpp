// SPDX-License-Identifier: MIT
// The send-queue ring (sv_sq_ring, kernel-abi/softverbs-abi.h) under
// threads, through the whole library:
//  - an agent thread posts with the inline helpers of softverbs_dv.h and
//    polls its CQ ring, while the engine thread serves its doorbells;
//  - several threads post with ibv_post_send into one small send queue
//    while another polls, so slots are reused all the time;
//  - a malformed WQE fails with an error completion and its QP only;
//  - a QP is not taken back while the engine has yet to serve its doorbell
//    (the engine held by the test hook loop::engine_hold).
// Threads stand in for processes, so ThreadSanitizer (the tsan lane of
// scripts/test.sh) sees every race on the ring's words.
#include <infiniband/verbs.h>

#include "providers/loop/softverbs_dv.h"

#include "own_fabric.h"
#include <gtest/gtest.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dirent.h>
#include <fcntl.h>
#include <set>
#include <string>
#include <thread>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

// The test hook of providers/loop/loop.h (which this file cannot include:
// its verbs.h is libibverbs-compat's, with other struct names).
namespace loop {
void engine_hold(bool on);
}

namespace {

#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
constexpr uint64_t kOps = 3000;
#else
constexpr uint64_t kOps = 60000;
#endif

test_fabric::own_fabric g_own_fabric("SVT_CQ_FABRIC");

struct env {
	ibv_context *ctx = nullptr;
	ibv_pd *pd = nullptr;
	uint16_t lid = 0;

	env()
	{
		// A peer process exec'd by CqRing.PeerWritesIntoPlacedRing joins
		// its parent's fabric.
		const char *joined = getenv("SVT_CQ_FABRIC");
		static std::string fabric = joined ? joined : "utsq" + std::to_string(getpid());
		setenv("SOFTVERBS_FABRIC", fabric.c_str(), 1);
		int n = 0;
		ibv_device **l = ibv_get_device_list(&n);
		for (int i = 0; l && i < n; i++)
			if (!strcmp(ibv_get_device_name(l[i]), "loop0"))
				ctx = ibv_open_device(l[i]);
		if (l)
			ibv_free_device_list(l);
		if (!ctx)
			return;
		pd = ibv_alloc_pd(ctx);
		ibv_port_attr pa{};
		ibv_query_port(ctx, 1, &pa);
		lid = pa.lid;
	}
	~env()
	{
		if (pd)
			ibv_dealloc_pd(pd);
		if (ctx)
			ibv_close_device(ctx);
	}
};

ibv_qp *make_qp(env &e, ibv_cq *cq, uint32_t depth)
{
	ibv_qp_init_attr a{};
	a.send_cq = cq;
	a.recv_cq = cq;
	a.qp_type = IBV_QPT_RC;
	a.cap.max_send_wr = depth;
	a.cap.max_recv_wr = 1;
	a.cap.max_send_sge = 2;
	a.cap.max_recv_sge = 1;
	return ibv_create_qp(e.pd, &a);
}

bool connect(ibv_qp *qp, uint32_t dqpn, uint16_t lid)
{
	ibv_qp_attr a{};
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
					  IBV_QP_ACCESS_FLAGS))
		return false;
	a = {};
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = dqpn;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 1;
	a.ah_attr.dlid = lid;
	a.ah_attr.port_num = 1;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
					  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
					  IBV_QP_MIN_RNR_TIMER))
		return false;
	a = {};
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = 1;
	return !ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT |
					  IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
					  IBV_QP_MAX_QP_RD_ATOMIC);
}

struct pair {
	env e;
	ibv_cq *cq = nullptr, *peer_cq = nullptr;
	ibv_qp *qp = nullptr, *peer = nullptr;
	std::vector<uint64_t> src, dst;
	ibv_mr *src_mr = nullptr, *dst_mr = nullptr;

	explicit pair(uint32_t depth, size_t words)
	    : src(words), dst(words)
	{
		if (!e.pd)
			return;
		cq = ibv_create_cq(e.ctx, 4096, nullptr, nullptr, 0);
		peer_cq = ibv_create_cq(e.ctx, 16, nullptr, nullptr, 0);
		qp = make_qp(e, cq, depth);
		peer = make_qp(e, peer_cq, 1);
		src_mr = ibv_reg_mr(e.pd, src.data(), words * 8, IBV_ACCESS_LOCAL_WRITE);
		dst_mr = ibv_reg_mr(e.pd, dst.data(), words * 8,
				    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
		if (qp && peer && (!connect(qp, peer->qp_num, e.lid) ||
				   !connect(peer, qp->qp_num, e.lid)))
			qp = nullptr;
	}
	bool ok() const
	{
		return qp && peer && src_mr && dst_mr;
	}
	~pair()
	{
		if (qp)
			ibv_destroy_qp(qp);
		if (peer)
			ibv_destroy_qp(peer);
		if (src_mr)
			ibv_dereg_mr(src_mr);
		if (dst_mr)
			ibv_dereg_mr(dst_mr);
		if (cq)
			ibv_destroy_cq(cq);
		if (peer_cq)
			ibv_destroy_cq(peer_cq);
	}
};

// An agent thread writes WRITE WQEs with the helpers; the engine thread
// runs them; the agent polls their completions off the CQ ring.  WRITE i
// puts i + 1 into word i % words, from the source word of its SQ slot.
TEST(SqRing, AgentThreadDrivesTheQueue)
{
	constexpr size_t kWords = 512;
	pair p(64, kWords);
	ASSERT_TRUE(p.ok()) << strerror(errno);
	softverbs_dv_sq sq;
	softverbs_dv_cq cq;
	ASSERT_EQ(softverbs_dv_qp_agent(p.qp, 1, &sq), 0);
	ASSERT_EQ(softverbs_dv_cq_agent(p.cq, 1, &cq), 0);
	EXPECT_EQ(softverbs_dv_qp_agent(p.qp, 1, &sq), EBUSY);
	ASSERT_GE(sq.count, 64u);
	ASSERT_LE(sq.count, kWords);
	uint64_t polled = 0, signaled = 0;
	std::string failure;
	// Every fourth WR is signaled, and the last, so that all have run when
	// the last completion is polled.
	auto is_signaled = [](uint64_t i) { return i % 4 == 0 || i + 1 == kOps; };
	auto next_signaled = [&](uint64_t i) {
		for (i++; i < kOps && !is_signaled(i); i++)
			;
		return i;
	};
	for (uint64_t i = 0; i < kOps; i++)
		signaled += is_signaled(i);
	std::thread agent([&] {
		softverbs_cqe e;
		uint64_t expect = 0;
		auto poll = [&] {
			while (softverbs_dv_cq_poll(&cq, &e)) {
				if (e.status != IBV_WC_SUCCESS || e.wr_id != expect) {
					failure = "completion " + std::to_string(e.wr_id) +
						  " status " + std::to_string(e.status) +
						  ", expected " + std::to_string(expect);
					return false;
				}
				expect = next_signaled(expect);
				polled++;
				softverbs_dv_sq_retire(&sq, &e);
			}
			return true;
		};
		for (uint64_t i = 0; i < kOps; i++) {
			softverbs_wqe *w;
			while (!(w = softverbs_dv_sq_next(&sq)))
				if (!poll())
					return;
			uint64_t slot = sq.next & (sq.count - 1);
			p.src[slot] = i + 1;
			softverbs_dv_wqe_ctrl(&sq, w, IBV_WR_RDMA_WRITE,
					      is_signaled(i) ? IBV_SEND_SIGNALED : 0, i);
			softverbs_dv_wqe_rdma(w, reinterpret_cast<uintptr_t>(&p.dst[i % kWords]),
					      p.dst_mr->rkey);
			softverbs_dv_wqe_sge(w, reinterpret_cast<uintptr_t>(&p.src[slot]), 8,
					     p.src_mr->lkey);
			softverbs_dv_sq_post(&sq, i % 3 == 0 || i + 1 == kOps);
		}
		while (expect < kOps)
			if (!poll())
				return;
	});
	agent.join();
	ASSERT_EQ(failure, "");
	EXPECT_EQ(polled, signaled);
	for (size_t k = 0; k < kWords; k++) {
		uint64_t last = k + (kOps - 1 - k) / kWords * kWords;
		ASSERT_EQ(p.dst[k], last + 1) << "word " << k;
	}
	EXPECT_EQ(softverbs_dv_cq_agent(p.cq, 0, nullptr), 0);
	EXPECT_EQ(softverbs_dv_qp_agent(p.qp, 0, nullptr), 0);
	// Back with the library: ibv_post_send works again.
	ibv_sge s{reinterpret_cast<uintptr_t>(&p.src[0]), 8, p.src_mr->lkey};
	ibv_send_wr wr{}, *bad = nullptr;
	wr.wr_id = 7;
	wr.opcode = IBV_WR_RDMA_WRITE;
	wr.sg_list = &s;
	wr.num_sge = 1;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(&p.dst[0]);
	wr.wr.rdma.rkey = p.dst_mr->rkey;
	ASSERT_EQ(ibv_post_send(p.qp, &wr, &bad), 0);
	ibv_wc wc{};
	ASSERT_EQ(ibv_poll_cq(p.cq, 1, &wc), 1);
	EXPECT_EQ(wc.wr_id, 7u);
	EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
}

// docs/agent.md, "Rules for mixing agent and library posting", walked in
// order on one QP.  Each WRITE puts a distinct value into its own word of
// dst; the words are checked at the end.
TEST(SqRing, LibraryAndAgentTakeTurns)
{
	constexpr size_t kWords = 64;
	pair p(16, kWords);
	ASSERT_TRUE(p.ok()) << strerror(errno);
	for (size_t k = 0; k < kWords; k++)
		p.src[k] = 1000 + k;
	auto lib_wr = [&](ibv_send_wr &wr, ibv_sge &s, uint64_t word) {
		s = {reinterpret_cast<uintptr_t>(&p.src[word]), 8, p.src_mr->lkey};
		wr = {};
		wr.wr_id = word;
		wr.opcode = IBV_WR_RDMA_WRITE;
		wr.sg_list = &s;
		wr.num_sge = 1;
		wr.send_flags = IBV_SEND_SIGNALED;
		wr.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(&p.dst[word]);
		wr.wr.rdma.rkey = p.dst_mr->rkey;
	};
	auto poll_lib = [&](ibv_wc &wc) {
		int n;
		while ((n = ibv_poll_cq(p.cq, 1, &wc)) == 0)
			;
		return n;
	};
	softverbs_dv_sq sq;
	softverbs_dv_cq cq;

	// Rule 2: handed over empty.  A library WRITE (word 0) whose
	// completion is not polled yet keeps the QP with the library.
	ibv_send_wr wr, *bad = nullptr;
	ibv_sge s;
	lib_wr(wr, s, 0);
	ASSERT_EQ(ibv_post_send(p.qp, &wr, &bad), 0);
	EXPECT_EQ(softverbs_dv_qp_agent(p.qp, 1, &sq), EBUSY);
	ibv_wc wc{};
	ASSERT_EQ(poll_lib(wc), 1);
	EXPECT_EQ(wc.wr_id, 0u);
	EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
	ASSERT_EQ(softverbs_dv_qp_agent(p.qp, 1, &sq), 0);
	ASSERT_EQ(softverbs_dv_cq_agent(p.cq, 1, &cq), 0);

	// Rule 1: one producer.  ibv_post_send fails and posts nothing: word 1
	// stays 0 to the end.
	lib_wr(wr, s, 1);
	bad = nullptr;
	EXPECT_EQ(ibv_post_send(p.qp, &wr, &bad), EINVAL);
	EXPECT_EQ(bad, &wr);

	// Rules 3 and 4: the agent posts WRITEs to words 2..9 and polls and
	// retires their completions; ibv_poll_cq finds none of them.  WRITE i
	// is polled before i + 1 is posted, so that ibv_poll_cq is called while
	// a completion waits.
	constexpr uint64_t kFirst = 2, kEnd = 10;
	for (uint64_t i = kFirst; i < kEnd; i++) {
		softverbs_wqe *w = softverbs_dv_sq_next(&sq);
		ASSERT_NE(w, nullptr) << i;
		softverbs_dv_wqe_ctrl(&sq, w, IBV_WR_RDMA_WRITE, IBV_SEND_SIGNALED, i);
		softverbs_dv_wqe_rdma(w, reinterpret_cast<uintptr_t>(&p.dst[i]), p.dst_mr->rkey);
		softverbs_dv_wqe_sge(w, reinterpret_cast<uintptr_t>(&p.src[i]), 8, p.src_mr->lkey);
		softverbs_dv_sq_post(&sq, 1);
		softverbs_cqe e;
		for (;;) {
			ibv_wc lwc{};
			ASSERT_EQ(ibv_poll_cq(p.cq, 1, &lwc), 0) << i;
			if (softverbs_dv_cq_poll(&cq, &e))
				break;
		}
		EXPECT_EQ(e.wr_id, i);
		EXPECT_EQ(e.status, IBV_WC_SUCCESS);
		softverbs_dv_sq_retire(&sq, &e);
	}

	// Rule 2: taken back, the engine having finished every WQE rung for
	// (each has completed and been polled above).
	ASSERT_EQ(softverbs_dv_cq_agent(p.cq, 0, nullptr), 0);
	ASSERT_EQ(softverbs_dv_qp_agent(p.qp, 0, nullptr), 0);
	EXPECT_EQ(softverbs_dv_qp_agent(p.qp, 0, nullptr), EINVAL);

	// Back with the library: two chains of WRITEs to words 10..29 complete
	// in order.  29 WRs in all pass through the 16-deep queue, so the
	// slots the agent retired must count as free.
	for (uint64_t base = kEnd; base < 30; base += 10) {
		ibv_send_wr wrs[10];
		ibv_sge sges[10];
		for (int j = 0; j < 10; j++) {
			lib_wr(wrs[j], sges[j], base + j);
			wrs[j].next = j + 1 < 10 ? &wrs[j + 1] : nullptr;
		}
		bad = nullptr;
		ASSERT_EQ(ibv_post_send(p.qp, wrs, &bad), 0);
		for (int j = 0; j < 10; j++) {
			ASSERT_EQ(poll_lib(wc), 1);
			EXPECT_EQ(wc.wr_id, base + j);
			EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
			EXPECT_EQ(wc.opcode, IBV_WC_RDMA_WRITE);
		}
	}
	EXPECT_EQ(ibv_poll_cq(p.cq, 1, &wc), 0);
	for (size_t k = 0; k < kWords; k++)
		EXPECT_EQ(p.dst[k], k == 1 || k >= 30 ? 0 : 1000 + k) << "word " << k;
}

// Rule 2's other half, deterministically: softverbs_dv_qp_agent(qp, 0) fails
// with EBUSY while the engine has yet to serve a doorbell.  The test holds
// the engine thread (loop::engine_hold, which returns only once the engine
// is outside any service and serves nothing more), rings, and tries to take
// the QP back; released, the engine runs the WRITE, and once its completion
// is polled the QP comes back.
TEST(SqRing, TakeBackWaitsForTheEngine)
{
	pair p(16, 16);
	ASSERT_TRUE(p.ok()) << strerror(errno);
	p.src[0] = 0xfeed;
	softverbs_dv_sq sq;
	ASSERT_EQ(softverbs_dv_qp_agent(p.qp, 1, &sq), 0);
	loop::engine_hold(true);
	softverbs_wqe *w = softverbs_dv_sq_next(&sq);
	ASSERT_NE(w, nullptr);
	softverbs_dv_wqe_ctrl(&sq, w, IBV_WR_RDMA_WRITE, IBV_SEND_SIGNALED, 3);
	softverbs_dv_wqe_rdma(w, reinterpret_cast<uintptr_t>(&p.dst[0]), p.dst_mr->rkey);
	softverbs_dv_wqe_sge(w, reinterpret_cast<uintptr_t>(&p.src[0]), 8, p.src_mr->lkey);
	softverbs_dv_sq_post(&sq, 1);
	EXPECT_EQ(softverbs_dv_qp_agent(p.qp, 0, nullptr), EBUSY);
	EXPECT_EQ(softverbs_dv_qp_agent(p.qp, 0, nullptr), EBUSY); // Still: nothing served
	ibv_wc wc{};
	EXPECT_EQ(ibv_poll_cq(p.cq, 1, &wc), 0);
	EXPECT_EQ(p.dst[0], 0u);
	loop::engine_hold(false);
	// The CQ stays the library's: the agent's completion is polled here.
	int n;
	while ((n = ibv_poll_cq(p.cq, 1, &wc)) == 0)
		std::this_thread::yield();
	ASSERT_EQ(n, 1);
	EXPECT_EQ(wc.wr_id, 3u);
	EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
	EXPECT_EQ(p.dst[0], 0xfeedu);
	ASSERT_EQ(softverbs_dv_qp_agent(p.qp, 0, nullptr), 0);
}

// Four threads post into an 8-deep send queue (ENOMEM: try again) while a
// fifth polls: every WR completes once, and each thread's in its order.
TEST(SqRing, ThreadsPostWhileOnePolls)
{
	constexpr int kThreads = 4;
	constexpr size_t kWords = 64;
	pair p(8, kWords);
	ASSERT_TRUE(p.ok()) << strerror(errno);
	const uint64_t per = kOps / kThreads / 4;
	std::atomic<bool> failed{false};
	std::vector<std::thread> ts;
	for (int t = 0; t < kThreads; t++)
		ts.emplace_back([&, t] {
			for (uint64_t i = 0; i < per && !failed; i++) {
				ibv_sge s{reinterpret_cast<uintptr_t>(&p.src[t]), 8, p.src_mr->lkey};
				ibv_send_wr wr{}, *bad = nullptr;
				wr.wr_id = (uint64_t(t) << 32) | i;
				wr.opcode = IBV_WR_RDMA_WRITE;
				wr.sg_list = &s;
				wr.num_sge = 1;
				wr.send_flags = IBV_SEND_SIGNALED;
				wr.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(&p.dst[t]);
				wr.wr.rdma.rkey = p.dst_mr->rkey;
				int r;
				while ((r = ibv_post_send(p.qp, &wr, &bad)) == ENOMEM)
					std::this_thread::yield();
				if (r)
					failed = true;
			}
		});
	std::vector<uint64_t> next(kThreads, 0);
	uint64_t got = 0;
	while (got < per * kThreads && !failed) {
		ibv_wc wc[8];
		int n = ibv_poll_cq(p.cq, 8, wc);
		ASSERT_GE(n, 0);
		for (int k = 0; k < n; k++) {
			ASSERT_EQ(wc[k].status, IBV_WC_SUCCESS);
			uint32_t t = static_cast<uint32_t>(wc[k].wr_id >> 32);
			ASSERT_LT(t, static_cast<uint32_t>(kThreads));
			ASSERT_EQ(wc[k].wr_id & 0xffffffffu, next[t]) << "thread " << t;
			next[t]++;
			got++;
		}
		if (!n)
			std::this_thread::yield();
	}
	for (auto &t : ts)
		t.join();
	EXPECT_FALSE(failed);
	EXPECT_EQ(got, per * kThreads);
}

// A WQE the engine cannot believe completes in error and fails its QP;
// the ring and the engine go on serving.
TEST(SqRing, MalformedWqeCompletesInError)
{
	pair p(16, 16);
	ASSERT_TRUE(p.ok()) << strerror(errno);
	softverbs_dv_sq sq;
	softverbs_dv_cq cq;
	ASSERT_EQ(softverbs_dv_qp_agent(p.qp, 1, &sq), 0);
	ASSERT_EQ(softverbs_dv_cq_agent(p.cq, 1, &cq), 0);
	softverbs_wqe *w = softverbs_dv_sq_next(&sq);
	ASSERT_NE(w, nullptr);
	softverbs_dv_wqe_ctrl(&sq, w, IBV_WR_RDMA_WRITE, IBV_SEND_SIGNALED, 1);
	w->ctrl.opcode = 200; // No such opcode
	softverbs_dv_sq_post(&sq, 1);
	w = softverbs_dv_sq_next(&sq);
	ASSERT_NE(w, nullptr);
	softverbs_dv_wqe_ctrl(&sq, w, IBV_WR_RDMA_WRITE, IBV_SEND_SIGNALED, 2);
	w->ctrl.num_sge = 200; // More than the QP's max_send_sge
	softverbs_dv_sq_post(&sq, 1);
	softverbs_cqe e[2];
	for (int k = 0; k < 2; k++) {
		uint64_t spins = 0;
		while (!softverbs_dv_cq_poll(&cq, &e[k])) {
			ASSERT_LT(++spins, 200000000u);
			std::this_thread::yield();
		}
	}
	EXPECT_EQ(e[0].wr_id, 1u);
	EXPECT_EQ(e[0].status, IBV_WC_LOC_QP_OP_ERR);
	EXPECT_EQ(e[1].wr_id, 2u); // Flushed: the QP is in ERR
	EXPECT_EQ(e[1].status, IBV_WC_WR_FLUSH_ERR);
	ibv_qp_attr a{};
	ibv_qp_init_attr ia{};
	ASSERT_EQ(ibv_query_qp(p.qp, &a, IBV_QP_STATE, &ia), 0);
	EXPECT_EQ(a.qp_state, IBV_QPS_ERR);
	softverbs_dv_sq_retire(&sq, &e[1]);
	EXPECT_EQ(softverbs_dv_cq_agent(p.cq, 0, nullptr), 0);
	EXPECT_EQ(softverbs_dv_qp_agent(p.qp, 0, nullptr), 0);
}

// The send-queue ring of a QP made under a parent domain with allocators
// comes from its alloc callback, with the SQ's resource type, and goes
// back through free; IBV_ALLOCATOR_USE_DEFAULT gets the library's memory.
struct alloc_log {
	bool use_default = false;
	int allocs = 0, frees = 0;
	int rq_allocs = 0; // The receive queue asks too (SOFTVERBS_RES_TYPE_RQ): ours
	void *given = nullptr, *freed = nullptr;
	size_t size = 0;
	uint64_t type = 0, freed_type = 0;
};

void *log_alloc(ibv_pd *, void *ctx, size_t size, size_t alignment, uint64_t type)
{
	auto *l = static_cast<alloc_log *>(ctx);
	if (type == SOFTVERBS_RES_TYPE_RQ) {
		l->rq_allocs++;
		return IBV_ALLOCATOR_USE_DEFAULT;
	}
	l->allocs++;
	l->type = type;
	if (l->use_default)
		return IBV_ALLOCATOR_USE_DEFAULT;
	l->size = size;
	l->given = aligned_alloc(alignment, (size + alignment - 1) / alignment * alignment);
	return l->given;
}

void log_free(ibv_pd *, void *ctx, void *ptr, uint64_t type)
{
	auto *l = static_cast<alloc_log *>(ctx);
	l->frees++;
	l->freed = ptr;
	l->freed_type = type;
	free(ptr);
}

TEST(SqRing, RingFromParentDomainAllocator)
{
	for (bool use_default : {false, true}) {
		env e;
		ASSERT_NE(e.pd, nullptr);
		alloc_log log;
		log.use_default = use_default;
		ibv_parent_domain_init_attr pa{};
		pa.pd = e.pd;
		pa.comp_mask = IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS |
			       IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT;
		pa.alloc = log_alloc;
		pa.free = log_free;
		pa.pd_context = &log;
		ibv_pd *parent = ibv_alloc_parent_domain(e.ctx, &pa);
		ASSERT_NE(parent, nullptr) << strerror(errno);
		ibv_cq *cq = ibv_create_cq(e.ctx, 64, nullptr, nullptr, 0);
		ASSERT_NE(cq, nullptr);
		ibv_qp_init_attr a{};
		a.send_cq = cq;
		a.recv_cq = cq;
		a.qp_type = IBV_QPT_RC;
		a.cap.max_send_wr = 16;
		a.cap.max_recv_wr = 1;
		a.cap.max_send_sge = 1;
		a.cap.max_recv_sge = 1;
		ibv_qp *qp = ibv_create_qp(parent, &a);
		ASSERT_NE(qp, nullptr) << strerror(errno);
		EXPECT_EQ(log.allocs, 1);
		EXPECT_EQ(log.rq_allocs, 1);
		EXPECT_EQ(log.type, SOFTVERBS_RES_TYPE_SQ);
		ibv_qp *peer = make_qp(e, cq, 1);
		ASSERT_NE(peer, nullptr);
		ASSERT_TRUE(connect(qp, peer->qp_num, e.lid));
		ASSERT_TRUE(connect(peer, qp->qp_num, e.lid));
		softverbs_dv_sq sq;
		ASSERT_EQ(softverbs_dv_qp_agent(qp, 1, &sq), 0);
		if (!use_default) {
			EXPECT_EQ(sq.ring, log.given);
			EXPECT_LE(size_t(sq.count) * sq.stride, log.size);
		} else {
			EXPECT_NE(sq.ring, nullptr);
		}
		ASSERT_EQ(softverbs_dv_qp_agent(qp, 0, nullptr), 0);
		// The library posts through it as through its own memory.
		uint64_t src = 42, dst = 0;
		ibv_mr *smr = ibv_reg_mr(e.pd, &src, 8, IBV_ACCESS_LOCAL_WRITE);
		ibv_mr *dmr = ibv_reg_mr(e.pd, &dst, 8,
					 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
		ASSERT_TRUE(smr && dmr);
		ibv_sge sge{reinterpret_cast<uintptr_t>(&src), 8, smr->lkey};
		ibv_send_wr wr{}, *bad = nullptr;
		wr.wr_id = 5;
		wr.opcode = IBV_WR_RDMA_WRITE;
		wr.sg_list = &sge;
		wr.num_sge = 1;
		wr.send_flags = IBV_SEND_SIGNALED;
		wr.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(&dst);
		wr.wr.rdma.rkey = dmr->rkey;
		ASSERT_EQ(ibv_post_send(qp, &wr, &bad), 0);
		ibv_wc wc{};
		ASSERT_EQ(ibv_poll_cq(cq, 1, &wc), 1);
		EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
		EXPECT_EQ(dst, 42u);
		ASSERT_EQ(ibv_destroy_qp(qp), 0);
		if (!use_default) {
			EXPECT_EQ(log.frees, 1);
			EXPECT_EQ(log.freed, log.given);
			EXPECT_EQ(log.freed_type, SOFTVERBS_RES_TYPE_SQ);
		} else {
			EXPECT_EQ(log.frees, 0);
		}
		ibv_destroy_qp(peer);
		ibv_dereg_mr(smr);
		ibv_dereg_mr(dmr);
		ibv_destroy_cq(cq);
		EXPECT_EQ(ibv_dealloc_pd(parent), 0);
	}
}

// ---- CQ rings from a parent domain's allocator (SOFTVERBS_RES_TYPE_CQ) ----

// A memfd arena the application publishes with softverbs_dv_alloc_fd, and
// an allocator that answers as a test asks.
enum class cq_answer { place, use_default, null, misaligned, unpublished, published_unaligned };

struct cq_alloc {
	cq_answer answer = cq_answer::place;
	char *arena = nullptr;
	size_t arena_len = 0, used = 0;
	int allocs = 0, frees = 0;
	void *given = nullptr, *freed = nullptr;
	size_t size = 0; // Of the CQ ring given
	uint64_t type = 0, freed_type = 0;
	// Receive queues (SOFTVERBS_RES_TYPE_RQ) with place_rq: from the arena.
	bool place_rq = false;
	void *rq_given = nullptr;
	int rq_frees = 0, bad_frees = 0;
	// SRQs (SOFTVERBS_RES_TYPE_SRQ) with place_srq: from the arena.
	bool place_srq = false;
	void *srq_given = nullptr;
	int srq_frees = 0;
};

void *cq_alloc_fn(ibv_pd *, void *ctx, size_t size, size_t alignment, uint64_t type)
{
	auto *a = static_cast<cq_alloc *>(ctx);
	if (type == SOFTVERBS_RES_TYPE_RQ && a->place_rq && !a->rq_given) {
		size_t off = (a->used + alignment - 1) / alignment * alignment;
		if (off + size > a->arena_len)
			return nullptr;
		a->used = off + size;
		a->rq_given = a->arena + off;
		return a->rq_given;
	}
	if (type == SOFTVERBS_RES_TYPE_SRQ && a->place_srq && !a->srq_given) {
		size_t off = (a->used + alignment - 1) / alignment * alignment;
		if (off + size > a->arena_len)
			return nullptr;
		a->used = off + size;
		a->srq_given = a->arena + off;
		return a->srq_given;
	}
	if (type != SOFTVERBS_RES_TYPE_CQ)
		return IBV_ALLOCATOR_USE_DEFAULT;
	a->allocs++;
	a->type = type;
	a->size = size;
	size_t off = (a->used + alignment - 1) / alignment * alignment;
	switch (a->answer) {
	case cq_answer::use_default:
		return IBV_ALLOCATOR_USE_DEFAULT;
	case cq_answer::null:
		return nullptr;
	case cq_answer::misaligned:
		a->given = a->arena + off + 8;
		break;
	case cq_answer::published_unaligned:
		a->given = a->arena + off + 64;
		break;
	case cq_answer::unpublished:
		a->given = aligned_alloc(alignment, (size + alignment - 1) / alignment * alignment);
		return a->given;
	case cq_answer::place:
		a->given = a->arena + off;
		break;
	}
	if (off + size + 64 > a->arena_len)
		return nullptr;
	a->used = off + size + 64;
	return a->given;
}

void cq_free_fn(ibv_pd *, void *ctx, void *ptr, uint64_t type)
{
	auto *a = static_cast<cq_alloc *>(ctx);
	if (type == SOFTVERBS_RES_TYPE_RQ) {
		if (ptr == a->rq_given)
			a->rq_frees++;
		else
			a->bad_frees++;
		return;
	}
	if (type == SOFTVERBS_RES_TYPE_SRQ) {
		if (ptr == a->srq_given)
			a->srq_frees++;
		else
			a->bad_frees++;
		return;
	}
	if (type != SOFTVERBS_RES_TYPE_CQ) {
		a->bad_frees++;
		return;
	}
	a->frees++;
	a->freed = ptr;
	a->freed_type = type;
	if (a->answer == cq_answer::unpublished)
		free(ptr);
}

// This process's open descriptors.
std::set<int> open_fds()
{
	std::set<int> fds;
	if (DIR *d = opendir("/proc/self/fd")) {
		while (dirent *de = readdir(d))
			if (de->d_name[0] != '.' && atoi(de->d_name) != dirfd(d))
				fds.insert(atoi(de->d_name));
		closedir(d);
	}
	return fds;
}

struct cq_arena {
	int fd = -1;
	char *base = nullptr;
	size_t len = size_t(4) << 20;
	explicit cq_arena(unsigned flags = MFD_CLOEXEC | MFD_ALLOW_SEALING)
	{
		fd = memfd_create("utcq", flags);
		if (fd < 0 || ftruncate(fd, static_cast<off_t>(len)))
			return;
		void *p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		base = p == MAP_FAILED ? nullptr : static_cast<char *>(p);
	}
	~cq_arena()
	{
		if (base)
			munmap(base, len);
		if (fd >= 0)
			close(fd);
	}
};

ibv_pd *placing_domain(env &e, cq_alloc &a)
{
	ibv_parent_domain_init_attr pa{};
	pa.pd = e.pd;
	pa.comp_mask = IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS | IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT;
	pa.alloc = cq_alloc_fn;
	pa.free = cq_free_fn;
	pa.pd_context = &a;
	return ibv_alloc_parent_domain(e.ctx, &pa);
}

ibv_cq *placed_cq(env &e, ibv_pd *parent, uint32_t cqe)
{
	ibv_cq_init_attr_ex ca{};
	ca.cqe = cqe;
	ca.comp_mask = IBV_CQ_INIT_ATTR_MASK_PD;
	ca.parent_domain = parent;
	ibv_cq_ex *x = ibv_create_cq_ex(e.ctx, &ca);
	return x ? ibv_cq_ex_to_cq(x) : nullptr;
}

// Peers map rings placed in a published file, so the file must be a tmpfs
// file sealed against shrinking (a page cut off under a peer's mapping was
// SIGBUS in the peer): a memfd made with MFD_ALLOW_SEALING is sealed by the
// publication; one that cannot be sealed, a /dev/shm file (sealing is not
// allowed on it) and a hugetlbfs memfd are refused with EINVAL.
TEST(CqRing, PublishedFileIsSealedAgainstShrinking)
{
	env e;
	ASSERT_NE(e.pd, nullptr);
	{
		cq_arena sealable;
		ASSERT_NE(sealable.base, nullptr);
		ASSERT_EQ(fcntl(sealable.fd, F_GET_SEALS) & F_SEAL_SHRINK, 0);
		ASSERT_EQ(softverbs_dv_alloc_fd(e.pd, sealable.base, sealable.len, sealable.fd, 0),
			  0);
		EXPECT_NE(fcntl(sealable.fd, F_GET_SEALS) & F_SEAL_SHRINK, 0);
		EXPECT_EQ(ftruncate(sealable.fd, 4096), -1);
		EXPECT_EQ(errno, EPERM);
		EXPECT_EQ(ftruncate(sealable.fd, static_cast<off_t>(sealable.len) * 2), 0)
			<< "growing stays allowed";
		ASSERT_EQ(softverbs_dv_alloc_fd(e.pd, sealable.base, sealable.len, -1, 0), 0);
	}
	{
		cq_arena plain(MFD_CLOEXEC); // Sealing not allowed
		ASSERT_NE(plain.base, nullptr);
		EXPECT_EQ(softverbs_dv_alloc_fd(e.pd, plain.base, plain.len, plain.fd, 0), EINVAL);
		EXPECT_EQ(ftruncate(plain.fd, 4096), 0) << "not sealed by the refusal";
	}
	{
		std::string name = "/sv-unit-seal-" + std::to_string(getpid());
		int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
		ASSERT_GE(fd, 0) << strerror(errno);
		shm_unlink(name.c_str());
		ASSERT_EQ(ftruncate(fd, 65536), 0);
		void *p = mmap(nullptr, 65536, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		ASSERT_NE(p, MAP_FAILED);
		EXPECT_EQ(softverbs_dv_alloc_fd(e.pd, p, 65536, fd, 0), EINVAL);
		munmap(p, 65536);
		close(fd);
	}
	{
		// Only where the kernel has huge pages to give.
		cq_arena huge(MFD_CLOEXEC | MFD_ALLOW_SEALING | MFD_HUGETLB);
		if (huge.base) {
			EXPECT_EQ(softverbs_dv_alloc_fd(e.pd, huge.base, huge.len, huge.fd, 0),
				  EINVAL);
		}
	}
}

// Each answer of the allocator: where the ring goes, the errno of a refused
// creation, and free called once with the CQ type (at destroy for a placed
// ring, at once for memory given back).
TEST(CqRing, RingFromParentDomainAllocator)
{
	env e;
	ASSERT_NE(e.pd, nullptr);
	cq_arena arena;
	ASSERT_NE(arena.base, nullptr);
	for (cq_answer ans : {cq_answer::place, cq_answer::use_default, cq_answer::null,
			      cq_answer::misaligned, cq_answer::unpublished,
			      cq_answer::published_unaligned}) {
		SCOPED_TRACE(static_cast<int>(ans));
		cq_alloc a;
		a.answer = ans;
		a.arena = arena.base;
		a.arena_len = arena.len;
		ibv_pd *parent = placing_domain(e, a);
		ASSERT_NE(parent, nullptr) << strerror(errno);
		EXPECT_EQ(softverbs_dv_alloc_fd(parent, arena.base, 4096, arena.fd, 1), EINVAL)
			<< "an offset that mmap could not map";
		ASSERT_EQ(softverbs_dv_alloc_fd(parent, arena.base, arena.len, arena.fd, 0), 0);
		errno = 0;
		ibv_cq *cq = placed_cq(e, parent, 32);
		EXPECT_EQ(a.allocs, 1);
		EXPECT_EQ(a.type, SOFTVERBS_RES_TYPE_CQ);
		if (ans == cq_answer::null || ans == cq_answer::misaligned ||
		    ans == cq_answer::published_unaligned) {
			EXPECT_EQ(cq, nullptr);
			EXPECT_EQ(errno, ans == cq_answer::null ? ENOMEM : EINVAL);
			EXPECT_EQ(a.frees, ans == cq_answer::null ? 0 : 1);
			if (ans != cq_answer::null) {
				EXPECT_EQ(a.freed, a.given);
				EXPECT_EQ(a.freed_type, SOFTVERBS_RES_TYPE_CQ);
			}
			EXPECT_EQ(ibv_dealloc_pd(parent), 0);
			continue;
		}
		ASSERT_NE(cq, nullptr) << strerror(errno);
		// Memory nobody published goes back at once; the CQ uses ours.
		EXPECT_EQ(a.frees, ans == cq_answer::unpublished ? 1 : 0);
		softverbs_dv_cq dv;
		ASSERT_EQ(softverbs_dv_cq_agent(cq, 1, &dv), 0);
		if (ans == cq_answer::place)
			EXPECT_EQ(dv.ring, a.given);
		else
			EXPECT_NE(dv.ring, a.given);
		ASSERT_EQ(softverbs_dv_cq_agent(cq, 0, nullptr), 0);
		EXPECT_EQ(ibv_resize_cq(cq, 64), ans == cq_answer::place ? EOPNOTSUPP : 0);
		// The library completes into it as into its own ring.
		ibv_qp *qp = make_qp(e, cq, 4), *peer = make_qp(e, cq, 1);
		ASSERT_TRUE(qp && peer);
		ASSERT_TRUE(connect(qp, peer->qp_num, e.lid) && connect(peer, qp->qp_num, e.lid));
		uint64_t src = 7, dst = 0;
		ibv_mr *smr = ibv_reg_mr(e.pd, &src, 8, IBV_ACCESS_LOCAL_WRITE);
		ibv_mr *dmr = ibv_reg_mr(e.pd, &dst, 8, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
		ASSERT_TRUE(smr && dmr);
		ibv_sge sge{reinterpret_cast<uintptr_t>(&src), 8, smr->lkey};
		ibv_send_wr wr{}, *bad = nullptr;
		wr.wr_id = 9;
		wr.opcode = IBV_WR_RDMA_WRITE;
		wr.sg_list = &sge;
		wr.num_sge = 1;
		wr.send_flags = IBV_SEND_SIGNALED;
		wr.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(&dst);
		wr.wr.rdma.rkey = dmr->rkey;
		ASSERT_EQ(ibv_post_send(qp, &wr, &bad), 0);
		ibv_wc wc{};
		for (int i = 0; i < 100000 && ibv_poll_cq(cq, 1, &wc) == 0; i++)
			usleep(10);
		EXPECT_EQ(wc.wr_id, 9u);
		EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
		EXPECT_EQ(dst, 7u);
		// EBUSY while QPs complete into it, as for any CQ; nothing freed.
		EXPECT_EQ(ibv_destroy_cq(cq), EBUSY);
		EXPECT_EQ(a.frees, ans == cq_answer::unpublished ? 1 : 0);
		ASSERT_EQ(ibv_destroy_qp(qp), 0);
		ASSERT_EQ(ibv_destroy_qp(peer), 0);
		ibv_dereg_mr(smr);
		ibv_dereg_mr(dmr);
		ASSERT_EQ(ibv_destroy_cq(cq), 0);
		if (ans == cq_answer::place) {
			EXPECT_EQ(a.frees, 1);
			EXPECT_EQ(a.freed, a.given);
			EXPECT_EQ(a.freed_type, SOFTVERBS_RES_TYPE_CQ);
		} else {
			EXPECT_EQ(a.frees, ans == cq_answer::unpublished ? 1 : 0);
		}
		// The domain is held by the CQ until then, and free once only.
		EXPECT_EQ(ibv_dealloc_pd(parent), 0);
		EXPECT_EQ(a.frees, ans == cq_answer::use_default ? 0 : 1);
	}
	// Forgetting the range: a later CQ's memory is not published.
	ASSERT_EQ(softverbs_dv_alloc_fd(e.pd, arena.base, arena.len, -1, 0), 0);
	cq_alloc a;
	a.arena = arena.base;
	a.arena_len = arena.len;
	ibv_pd *parent = placing_domain(e, a);
	ASSERT_NE(parent, nullptr);
	ibv_cq *cq = placed_cq(e, parent, 8);
	ASSERT_NE(cq, nullptr);
	EXPECT_EQ(a.frees, 1) << "given back at once, not placed";
	EXPECT_EQ(ibv_destroy_cq(cq), 0);
	EXPECT_EQ(a.frees, 1);
	EXPECT_EQ(ibv_dealloc_pd(parent), 0);
}

// Another process completes into a ring the allocator placed: it maps the
// memfd through the owner's descriptor (sv_obj_rec.place_fd), takes the
// receive WQEs from a receive queue placed there too, writes the receive
// completions and their small payloads into the CQ ring, and the owner
// polls them with the data intact.  Then, while the peer keeps sending
// (its completions land in the placed rings), the QP and the CQ are
// destroyed: free once, and nothing writes into the memory after it (it is
// poisoned and watched a while); then the peer is killed.
constexpr int kPeerSends = 200;

// The peer's half, run in a process of its own (exec'd with SVT_CQ_PEER =
// "<owner qpn> <owner lid> <fd to write its qpn to>").
// One signaled inline SEND of the 16 bytes {a, b}, and its completion
// polled for at most tries times 10 us: 1 (in wc), 0 (none came), or -1
// (the post failed).
int send_16(ibv_qp *qp, ibv_cq *cq, uint64_t wr_id, uint64_t a, uint64_t b, int tries, ibv_wc &wc)
{
	uint64_t msg[2] = {a, b};
	ibv_sge sge{reinterpret_cast<uintptr_t>(msg), sizeof(msg), 0};
	ibv_send_wr wr{}, *bad = nullptr;
	wr.wr_id = wr_id;
	wr.opcode = IBV_WR_SEND;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
	if (ibv_post_send(qp, &wr, &bad))
		return -1;
	int n = 0;
	for (int t = 0; t < tries && !(n = ibv_poll_cq(cq, 1, &wc)); t++)
		usleep(10);
	return n;
}

TEST(CqRing, PeerHalf)
{
	const char *arg = getenv("SVT_CQ_PEER");
	if (!arg)
		GTEST_SKIP() << "run by CqRing.PeerWritesIntoPlacedRing";
	unsigned qpn = 0, lid = 0;
	int wfd = -1;
	alarm(120); // Never outlives a failed owner for long
	ASSERT_EQ(sscanf(arg, "%u %u %d", &qpn, &lid, &wfd), 3);
	env e;
	ASSERT_NE(e.pd, nullptr);
	ibv_cq *cq = ibv_create_cq(e.ctx, kPeerSends + 1, nullptr, nullptr, 0);
	ibv_qp *qp = make_qp(e, cq, kPeerSends);
	ASSERT_TRUE(cq && qp);
	uint32_t mine = qp->qp_num;
	ASSERT_EQ(write(wfd, &mine, sizeof(mine)), static_cast<ssize_t>(sizeof(mine)));
	ASSERT_TRUE(connect(qp, qpn, static_cast<uint16_t>(lid)));
	char ready = 0;
	ASSERT_EQ(read(wfd, &ready, 1), 1); // The owner is in RTR, receives posted
	if (getenv("SVT_CQ_PEER_ONE")) {
		// One SEND; its status goes back to the owner.
		ibv_wc wc{};
		int n = send_16(qp, cq, 0, 1, 2, 1000000, wc);
		ASSERT_GE(n, 0);
		uint32_t st = n == 1 ? static_cast<uint32_t>(wc.status) : 0xffffffffu;
		ASSERT_EQ(write(wfd, &st, sizeof(st)), static_cast<ssize_t>(sizeof(st)));
		pause();
	}
	for (uint64_t i = 0; i < kPeerSends; i++) {
		ibv_wc wc{};
		ASSERT_EQ(send_16(qp, cq, i, i, i * 0x9e3779b97f4a7c15ULL, 1000000, wc), 1);
		ASSERT_EQ(wc.status, IBV_WC_SUCCESS);
	}
	ASSERT_EQ(write(wfd, &mine, 1), 1);
	// Then a stream the owner does not poll, while it destroys the QP and
	// the CQ: whatever becomes of these SENDs (the owner's CQ overflows,
	// its QP goes), this process only ever sees errors in its own CQ.
	for (uint64_t i = kPeerSends;; i++) {
		ibv_wc wc{};
		if (send_16(qp, cq, i, i, ~i, 100000, wc) != 1 || wc.status != IBV_WC_SUCCESS)
			break;
	}
	pause(); // Killed by the owner, objects and all
}

// The owner's half of a placed-ring test: an arena published through a
// placing parent domain, a placed receive CQ of rcq_depth entries and an
// RC QP under the domain (its receive queue placed too) with recv_depth
// receives posted into buf (16 bytes each), and the peer (CqRing.PeerHalf,
// with peer_env set if given) connected to it.  The peer waits for a byte
// on sock before it sends.
struct placed_owner {
	env e;
	cq_arena arena;
	cq_alloc a;
	ibv_pd *parent = nullptr;
	ibv_cq *rcq = nullptr, *scq = nullptr;
	ibv_qp *qp = nullptr;
	std::vector<uint64_t> buf;
	ibv_mr *mr = nullptr;
	int sock = -1;
	pid_t pid = -1;
};

void placed_owner_start(placed_owner &o, uint32_t rcq_depth, int recv_depth, const char *peer_env)
{
	ASSERT_NE(o.e.pd, nullptr);
	ASSERT_NE(o.arena.base, nullptr);
	o.a.arena = o.arena.base;
	o.a.arena_len = o.arena.len;
	o.a.place_rq = true;
	o.parent = placing_domain(o.e, o.a);
	ASSERT_NE(o.parent, nullptr);
	ASSERT_EQ(softverbs_dv_alloc_fd(o.parent, o.arena.base, o.arena.len, o.arena.fd, 0), 0);
	o.rcq = placed_cq(o.e, o.parent, rcq_depth);
	ASSERT_NE(o.rcq, nullptr) << strerror(errno);
	ASSERT_EQ(o.a.frees, 0);
	o.scq = ibv_create_cq(o.e.ctx, 4, nullptr, nullptr, 0);
	ibv_qp_init_attr qa{};
	qa.send_cq = o.scq;
	qa.recv_cq = o.rcq;
	qa.qp_type = IBV_QPT_RC;
	qa.cap.max_send_wr = 1;
	qa.cap.max_recv_wr = static_cast<uint32_t>(recv_depth);
	qa.cap.max_send_sge = 1;
	qa.cap.max_recv_sge = 1;
	o.qp = ibv_create_qp(o.parent, &qa);
	ASSERT_TRUE(o.scq && o.qp);
	ASSERT_NE(o.a.rq_given, nullptr) << "the receive queue was not placed";
	o.buf.assign(2 * static_cast<size_t>(recv_depth), 0);
	o.mr = ibv_reg_mr(o.e.pd, o.buf.data(), o.buf.size() * 8, IBV_ACCESS_LOCAL_WRITE);
	ASSERT_NE(o.mr, nullptr);
	int sv[2];
	ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	char arg[64];
	snprintf(arg, sizeof(arg), "%u %u %d", o.qp->qp_num, o.e.lid, sv[1]);
	o.pid = fork();
	ASSERT_GE(o.pid, 0);
	if (o.pid == 0) {
		close(sv[0]);
		setenv("SVT_CQ_PEER", arg, 1);
		if (peer_env)
			setenv(peer_env, "1", 1);
		setenv("SVT_CQ_FABRIC", getenv("SOFTVERBS_FABRIC"), 1);
		execl("/proc/self/exe", "unit-sq-ring", "--gtest_filter=CqRing.PeerHalf",
		      static_cast<char *>(nullptr));
		_exit(127);
	}
	close(sv[1]);
	o.sock = sv[0];
	uint32_t peer_qpn = 0;
	ASSERT_EQ(read(o.sock, &peer_qpn, sizeof(peer_qpn)), static_cast<ssize_t>(sizeof(peer_qpn)));
	ASSERT_TRUE(connect(o.qp, peer_qpn, o.e.lid));
	for (int i = 0; i < recv_depth; i++) {
		ibv_sge sge{reinterpret_cast<uintptr_t>(&o.buf[2 * static_cast<size_t>(i)]), 16,
			    o.mr->lkey};
		ibv_recv_wr wr{}, *bad = nullptr;
		wr.wr_id = static_cast<uint64_t>(i);
		wr.sg_list = &sge;
		wr.num_sge = 1;
		ASSERT_EQ(ibv_post_recv(o.qp, &wr, &bad), 0);
	}
}

// The descriptor, other than keep, that this process holds on a memfd
// named name ("/memfd:name (deleted)").
int memfd_other_than(const char *name, int keep)
{
	std::string want = std::string("/memfd:") + name + " (deleted)";
	for (int fd : open_fds()) {
		char link[256];
		std::string path = "/proc/self/fd/" + std::to_string(fd);
		ssize_t n = readlink(path.c_str(), link, sizeof(link) - 1);
		if (n > 0 && fd != keep && std::string(link, static_cast<size_t>(n)) == want)
			return fd;
	}
	return -1;
}

// The library's descriptor of a published file, which peers take, is
// the only way for them to meet an unsealed one (publication seals it or
// refuses it): an owner that put an unsealed copy of its rings in its
// place (dup2 over the descriptor) could shrink it under the peer's
// mapping.  The peer refuses to map it: its SEND completes with an
// error, and nothing lands in the copy.
TEST(CqRing, PeerRefusesAnUnsealedPlacedRing)
{
	placed_owner o;
	placed_owner_start(o, 8, 1, "SVT_CQ_PEER_ONE");
	if (HasFatalFailure())
		return;
	int libfd = memfd_other_than("utcq", o.arena.fd);
	ASSERT_GE(libfd, 0) << "the library's duplicate of the arena's descriptor";
	// The copy: the rings as they are now (the receive posted), in a memfd
	// that cannot be sealed, put where the library's descriptor was.
	int copy = memfd_create("utcq-copy", MFD_CLOEXEC);
	ASSERT_GE(copy, 0);
	ASSERT_EQ(ftruncate(copy, static_cast<off_t>(o.arena.len)), 0);
	ASSERT_EQ(pwrite(copy, o.arena.base, o.arena.len, 0), static_cast<ssize_t>(o.arena.len));
	ASSERT_EQ(dup2(copy, libfd), libfd);
	close(copy);
	ASSERT_EQ(write(o.sock, "g", 1), 1);
	uint32_t st = IBV_WC_SUCCESS;
	EXPECT_EQ(read(o.sock, &st, sizeof(st)), static_cast<ssize_t>(sizeof(st)));
	EXPECT_NE(st, static_cast<uint32_t>(IBV_WC_SUCCESS))
		<< "the peer wrote into a ring whose file could be shrunk under it";
	EXPECT_NE(st, 0xffffffffu) << "no completion at the peer";
	kill(o.pid, SIGKILL);
	int status = 0;
	waitpid(o.pid, &status, 0);
	ibv_wc wc{};
	EXPECT_EQ(ibv_poll_cq(o.rcq, 1, &wc), 0);
	EXPECT_EQ(o.buf[0], 0u);
	close(o.sock);
	EXPECT_EQ(ibv_destroy_qp(o.qp), 0);
	EXPECT_EQ(ibv_dereg_mr(o.mr), 0);
	EXPECT_EQ(ibv_destroy_cq(o.scq), 0);
	EXPECT_EQ(ibv_destroy_cq(o.rcq), 0);
	EXPECT_EQ(ibv_dealloc_pd(o.parent), 0);
}

TEST(CqRing, PeerWritesIntoPlacedRing)
{
	placed_owner o;
	// The stream after the checked SENDs needs receives of its own.
	placed_owner_start(o, kPeerSends, 2 * kPeerSends, nullptr);
	if (HasFatalFailure())
		return;
	cq_alloc &a = o.a;
	ibv_cq *rcq = o.rcq, *scq = o.scq;
	ibv_qp *qp = o.qp;
	std::vector<uint64_t> &buf = o.buf;
	ibv_mr *mr = o.mr;
	ibv_pd *parent = o.parent;
	int sv[2] = {o.sock, -1};
	pid_t pid = o.pid;
	ASSERT_EQ(write(sv[0], "g", 1), 1);
	int got = 0;
	for (int t = 0; got < kPeerSends && t < 2000000; t++) {
		ibv_wc wc{};
		int n = ibv_poll_cq(rcq, 1, &wc);
		ASSERT_GE(n, 0);
		if (!n) {
			usleep(10);
			continue;
		}
		ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
		ASSERT_EQ(wc.wr_id, static_cast<uint64_t>(got));
		ASSERT_EQ(wc.byte_len, 16u);
		EXPECT_EQ(buf[2 * got], static_cast<uint64_t>(got));
		EXPECT_EQ(buf[2 * got + 1], static_cast<uint64_t>(got) * 0x9e3779b97f4a7c15ULL);
		got++;
	}
	EXPECT_EQ(got, kPeerSends);
	char done = 0;
	EXPECT_EQ(read(sv[0], &done, 1), 1);
	// The peer's stream is under way: its first completions arrive.
	for (int t = 0; got < kPeerSends + 10 && t < 2000000; t++) {
		ibv_wc wc{};
		int n = ibv_poll_cq(rcq, 1, &wc);
		ASSERT_GE(n, 0);
		if (!n) {
			usleep(10);
			continue;
		}
		ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
		ASSERT_EQ(wc.wr_id, static_cast<uint64_t>(got));
		EXPECT_EQ(buf[2 * got + 1], ~static_cast<uint64_t>(got));
		got++;
	}
	ASSERT_EQ(got, kPeerSends + 10);
	ASSERT_EQ(ibv_destroy_qp(qp), 0);
	EXPECT_EQ(a.rq_frees, 1);
	ASSERT_EQ(ibv_destroy_cq(rcq), 0);
	EXPECT_EQ(a.bad_frees, 0);
	EXPECT_EQ(a.frees, 1);
	EXPECT_EQ(a.freed, a.given);
	EXPECT_EQ(a.freed_type, SOFTVERBS_RES_TYPE_CQ);
	// Given back: the application may reuse it now, and no late completion
	// of the peer's stream may land in it.
	memset(a.given, 0xa5, a.size);
	usleep(50000);
	size_t changed = 0;
	for (size_t i = 0; i < a.size; i++)
		changed += static_cast<unsigned char>(static_cast<char *>(a.given)[i]) != 0xa5;
	EXPECT_EQ(changed, 0u) << "bytes written into the CQ ring's memory after free";
	// The peer dies holding its mappings; nothing here waits on it.
	kill(pid, SIGKILL);
	int st = 0;
	ASSERT_EQ(waitpid(pid, &st, 0), pid);
	EXPECT_TRUE(WIFSIGNALED(st)) << "the peer half failed: status " << st;
	close(sv[0]);
	ibv_dereg_mr(mr);
	ibv_destroy_cq(scq);
	EXPECT_EQ(ibv_dealloc_pd(parent), 0);
}

// An SRQ made with a parent domain as its PD takes its ring from the
// allocator (SOFTVERBS_RES_TYPE_SRQ); receives posted to it take a SEND, and
// the ring goes back through free once when the SRQ is destroyed.
TEST(CqRing, SrqFromParentDomainAllocator)
{
	env e;
	ASSERT_NE(e.pd, nullptr);
	cq_arena arena;
	ASSERT_NE(arena.base, nullptr);
	cq_alloc a;
	a.answer = cq_answer::use_default;
	a.arena = arena.base;
	a.arena_len = arena.len;
	a.place_srq = true;
	ibv_pd *parent = placing_domain(e, a);
	ASSERT_NE(parent, nullptr);
	ASSERT_EQ(softverbs_dv_alloc_fd(parent, arena.base, arena.len, arena.fd, 0), 0);
	ibv_srq_init_attr sa{};
	sa.attr.max_wr = 8;
	sa.attr.max_sge = 1;
	ibv_srq *srq = ibv_create_srq(parent, &sa);
	ASSERT_NE(srq, nullptr) << strerror(errno);
	ASSERT_NE(a.srq_given, nullptr);
	ibv_cq *cq = ibv_create_cq(e.ctx, 16, nullptr, nullptr, 0);
	ASSERT_NE(cq, nullptr);
	ibv_qp_init_attr qa{};
	qa.send_cq = cq;
	qa.recv_cq = cq;
	qa.srq = srq;
	qa.qp_type = IBV_QPT_RC;
	qa.cap.max_send_wr = 1;
	qa.cap.max_send_sge = 1;
	ibv_qp *target = ibv_create_qp(e.pd, &qa);
	ibv_qp *sender = make_qp(e, cq, 2);
	ASSERT_TRUE(target && sender);
	ASSERT_TRUE(connect(sender, target->qp_num, e.lid) && connect(target, sender->qp_num, e.lid));
	uint64_t in = 0, out = 0x5eed;
	ibv_mr *mr = ibv_reg_mr(e.pd, &in, 8, IBV_ACCESS_LOCAL_WRITE);
	ASSERT_NE(mr, nullptr);
	ibv_sge rs{reinterpret_cast<uintptr_t>(&in), 8, mr->lkey};
	ibv_recv_wr rw{}, *rbad = nullptr;
	rw.wr_id = 77;
	rw.sg_list = &rs;
	rw.num_sge = 1;
	ASSERT_EQ(ibv_post_srq_recv(srq, &rw, &rbad), 0);
	ibv_sge ss{reinterpret_cast<uintptr_t>(&out), 8, 0};
	ibv_send_wr sw{}, *sbad = nullptr;
	sw.wr_id = 1;
	sw.opcode = IBV_WR_SEND;
	sw.sg_list = &ss;
	sw.num_sge = 1;
	sw.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
	ASSERT_EQ(ibv_post_send(sender, &sw, &sbad), 0);
	bool got_recv = false;
	for (int t = 0; t < 100000 && !got_recv; t++) {
		ibv_wc wc{};
		if (ibv_poll_cq(cq, 1, &wc) == 0) {
			usleep(10);
			continue;
		}
		EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
		if (wc.opcode == IBV_WC_RECV) {
			EXPECT_EQ(wc.wr_id, 77u);
			got_recv = true;
		}
	}
	EXPECT_TRUE(got_recv);
	EXPECT_EQ(in, 0x5eedu);
	ASSERT_EQ(ibv_destroy_qp(target), 0);
	ASSERT_EQ(ibv_destroy_qp(sender), 0);
	EXPECT_EQ(a.srq_frees, 0);
	ASSERT_EQ(ibv_destroy_srq(srq), 0);
	EXPECT_EQ(a.srq_frees, 1);
	EXPECT_EQ(a.bad_frees, 0);
	ibv_dereg_mr(mr);
	ibv_destroy_cq(cq);
	EXPECT_EQ(ibv_dealloc_pd(parent), 0);
}

} // namespace
