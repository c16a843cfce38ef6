// SPDX-License-Identifier: MIT
// The engine (requester, responder, completer) over the fake transport
// (providers/loop/transport/fake): two RC QPs of this process on a private
// fabric, and a wire that loses, delays, duplicates and reorders on
// command.  Every message carries its sequence number and a checksum, and
// every test checks the bytes that landed, not only the statuses.
// Threads only (the posting thread and the progress thread that runs the
// retries), so ThreadSanitizer sees the whole engine (the tsan lane).
#include <infiniband/verbs.h>

#include "fake_transport.h"

#include "own_fabric.h"
#include <gtest/gtest.h>

#include <chrono>
#include <endian.h>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

namespace {

constexpr uint32_t kMsgWords = 64; // 512-byte messages
constexpr uint32_t kSlots = 32;	   // Messages per buffer

test_fabric::own_fabric g_own_fabric("SVT_NO_SUCH_JOIN");

struct env {
	ibv_context *ctx = nullptr;
	ibv_pd *pd = nullptr;
	uint16_t lid = 0;

	env()
	{
		static std::string fabric = "utfake" + std::to_string(getpid());
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

env &the_env()
{
	static env *e = new env;
	return *e;
}

// Word 0 the sequence number, the others a function of it and their index,
// the last a checksum of the rest.
void fill(uint64_t *m, uint64_t seq)
{
	uint64_t sum = 0;
	m[0] = seq;
	for (uint32_t i = 1; i + 1 < kMsgWords; i++)
		m[i] = seq * 0x9e3779b97f4a7c15ULL + i;
	for (uint32_t i = 0; i + 1 < kMsgWords; i++)
		sum = sum * 31 + m[i];
	m[kMsgWords - 1] = sum;
}

// The sequence number of an intact message, or UINT64_MAX.
uint64_t check(const uint64_t *m)
{
	uint64_t sum = 0;
	for (uint32_t i = 0; i + 1 < kMsgWords; i++)
		sum = sum * 31 + m[i];
	if (sum != m[kMsgWords - 1])
		return UINT64_MAX;
	for (uint32_t i = 1; i + 1 < kMsgWords; i++)
		if (m[i] != m[0] * 0x9e3779b97f4a7c15ULL + i)
			return UINT64_MAX;
	return m[0];
}

struct qp_opts {
	uint8_t retry_cnt = 7;
	uint8_t rnr_retry = 7;
	uint8_t timeout = 1; // 8 us: retries come fast
	uint32_t sq_psn = 0;
};

bool connect(ibv_qp *qp, uint32_t dqpn, uint16_t lid, const qp_opts &o)
{
	ibv_qp_attr a{};
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
			    IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
					  IBV_QP_ACCESS_FLAGS))
		return false;
	a = {};
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = dqpn;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 1; // 10 us
	a.ah_attr.dlid = lid;
	a.ah_attr.port_num = 1;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
					  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
					  IBV_QP_MIN_RNR_TIMER))
		return false;
	a = {};
	a.qp_state = IBV_QPS_RTS;
	a.timeout = o.timeout;
	a.retry_cnt = o.retry_cnt;
	a.rnr_retry = o.rnr_retry;
	a.max_rd_atomic = 1;
	a.sq_psn = o.sq_psn;
	return !ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT |
					  IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
					  IBV_QP_MAX_QP_RD_ATOMIC);
}

// A requester QP and its responder, each with a CQ and a buffer of kSlots
// messages, over the fake transport.
struct pair {
	env &e = the_env();
	ibv_cq *scq = nullptr, *rcq = nullptr;
	ibv_qp *qp = nullptr, *peer = nullptr;
	std::vector<uint64_t> src, dst;
	ibv_mr *src_mr = nullptr, *dst_mr = nullptr;

	explicit pair(const qp_opts &o = {})
	    : src(kSlots * kMsgWords), dst(kSlots * kMsgWords)
	{
		if (!e.pd || loop::fake_transport_install())
			return;
		scq = ibv_create_cq(e.ctx, 256, nullptr, nullptr, 0);
		rcq = ibv_create_cq(e.ctx, 256, nullptr, nullptr, 0);
		ibv_qp_init_attr a{};
		a.qp_type = IBV_QPT_RC;
		a.cap.max_send_wr = 64;
		a.cap.max_recv_wr = 64;
		a.cap.max_send_sge = 1;
		a.cap.max_recv_sge = 1;
		a.send_cq = scq;
		a.recv_cq = scq;
		qp = ibv_create_qp(e.pd, &a);
		a.send_cq = rcq;
		a.recv_cq = rcq;
		peer = ibv_create_qp(e.pd, &a);
		int rights = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
			     IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
		src_mr = ibv_reg_mr(e.pd, src.data(), src.size() * 8, rights);
		dst_mr = ibv_reg_mr(e.pd, dst.data(), dst.size() * 8, rights);
		if (qp && peer &&
		    (!connect(qp, peer->qp_num, e.lid, o) || !connect(peer, qp->qp_num, e.lid, o)))
			qp = nullptr;
	}
	bool ok() const
	{
		return qp && peer && src_mr && dst_mr;
	}
	~pair()
	{
		loop::fake_transport_uninstall();
		if (qp)
			ibv_destroy_qp(qp);
		if (peer)
			ibv_destroy_qp(peer);
		if (src_mr)
			ibv_dereg_mr(src_mr);
		if (dst_mr)
			ibv_dereg_mr(dst_mr);
		if (scq)
			ibv_destroy_cq(scq);
		if (rcq)
			ibv_destroy_cq(rcq);
	}
	uint64_t *src_msg(uint32_t i)
	{
		return &src[(i % kSlots) * kMsgWords];
	}
	uint64_t *dst_msg(uint32_t i)
	{
		return &dst[(i % kSlots) * kMsgWords];
	}
	int post_recv(uint32_t slot)
	{
		ibv_sge s{reinterpret_cast<uintptr_t>(dst_msg(slot)), kMsgWords * 8, dst_mr->lkey};
		ibv_recv_wr w{}, *bad;
		w.wr_id = slot;
		w.sg_list = &s;
		w.num_sge = 1;
		return ibv_post_recv(peer, &w, &bad);
	}
	// Message seq from source slot seq % kSlots.
	int post(ibv_wr_opcode op, uint32_t seq, uint32_t remote_slot = 0)
	{
		fill(src_msg(seq), seq);
		ibv_sge s{reinterpret_cast<uintptr_t>(src_msg(seq)), kMsgWords * 8, src_mr->lkey};
		ibv_send_wr w{}, *bad;
		w.wr_id = seq;
		w.opcode = op;
		w.send_flags = IBV_SEND_SIGNALED;
		w.sg_list = &s;
		w.num_sge = 1;
		if (op == IBV_WR_RDMA_READ)
			fill(src_msg(seq), UINT32_MAX); // Overwritten by the response
		w.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(dst_msg(remote_slot));
		w.wr.rdma.rkey = dst_mr->rkey;
		w.imm_data = htobe32(seq);
		return ibv_post_send(qp, &w, &bad);
	}
	// FETCH_ADD of add to word 0 of dst slot remote_slot; the old value
	// lands in word 0 of src slot seq.
	int fetch_add(uint32_t seq, uint32_t remote_slot, uint64_t add)
	{
		ibv_sge s{reinterpret_cast<uintptr_t>(src_msg(seq)), 8, src_mr->lkey};
		ibv_send_wr w{}, *bad;
		w.wr_id = seq;
		w.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
		w.send_flags = IBV_SEND_SIGNALED;
		w.sg_list = &s;
		w.num_sge = 1;
		w.wr.atomic.remote_addr = reinterpret_cast<uintptr_t>(dst_msg(remote_slot));
		w.wr.atomic.rkey = dst_mr->rkey;
		w.wr.atomic.compare_add = add;
		return ibv_post_send(qp, &w, &bad);
	}
};

// Polls n completions of cq (5 s at most).
std::vector<ibv_wc> poll(ibv_cq *cq, size_t n)
{
	std::vector<ibv_wc> out;
	auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
	while (out.size() < n && std::chrono::steady_clock::now() < end) {
		ibv_wc wc;
		if (ibv_poll_cq(cq, 1, &wc) == 1)
			out.push_back(wc);
		else
			std::this_thread::yield();
	}
	return out;
}

// Nothing more arrives on cq for a while.
bool quiet(ibv_cq *cq)
{
	std::this_thread::sleep_for(std::chrono::milliseconds(20));
	ibv_wc wc;
	return ibv_poll_cq(cq, 1, &wc) == 0;
}

ibv_qp_state state_of(ibv_qp *qp)
{
	ibv_qp_attr a{};
	ibv_qp_init_attr i{};
	ibv_query_qp(qp, &a, IBV_QP_STATE, &i);
	return a.qp_state;
}

loop::fake_faults &faults()
{
	return loop::fake_transport_faults();
}

TEST(EngineFake, RegistrationChecksEveryCall)
{
	for (const char *call : {"resolve", "move", "deliver", "alive"}) {
		std::string name = std::string("lacks-") + call;
		EXPECT_EQ(loop::fake_register_partial(name.c_str(), call), EINVAL) << call;
		EXPECT_EQ(loop::transport_select(name.c_str()), ENOENT) << call;
	}
	EXPECT_EQ(loop::fake_register_partial("loop", nullptr), EINVAL); // Name taken
	EXPECT_EQ(loop::fake_register_partial("complete", nullptr), 0);
	EXPECT_EQ(loop::transport_select("none"), ENOENT);
}

TEST(EngineFake, WriteSendReadCarryTheirData)
{
	pair p;
	ASSERT_TRUE(p.ok());
	ASSERT_EQ(p.post(IBV_WR_RDMA_WRITE, 1, 3), 0);
	ASSERT_EQ(p.post_recv(5), 0);
	ASSERT_EQ(p.post(IBV_WR_SEND, 2), 0);
	ASSERT_EQ(p.post(IBV_WR_RDMA_READ, 7, 3), 0); // Reads back what WRITE 1 put
	auto wc = poll(p.scq, 3);
	ASSERT_EQ(wc.size(), 3u);
	uint64_t order[] = {1, 2, 7};
	for (size_t i = 0; i < 3; i++) {
		EXPECT_EQ(wc[i].status, IBV_WC_SUCCESS) << i;
		EXPECT_EQ(wc[i].wr_id, order[i]);
		EXPECT_EQ(wc[i].byte_len, kMsgWords * 8);
	}
	auto rc = poll(p.rcq, 1);
	ASSERT_EQ(rc.size(), 1u);
	EXPECT_EQ(rc[0].status, IBV_WC_SUCCESS);
	EXPECT_EQ(rc[0].wr_id, 5u);
	EXPECT_EQ(rc[0].byte_len, kMsgWords * 8);
	EXPECT_EQ(check(p.dst_msg(3)), 1u);
	EXPECT_EQ(check(p.dst_msg(5)), 2u);
	EXPECT_EQ(check(p.src_msg(7)), 1u);
	EXPECT_EQ(loop::fake_transport_stats().dropped, 0u);
}

TEST(EngineFake, LostRequestsAreRetriedAndCompleteOnce)
{
	pair p;
	ASSERT_TRUE(p.ok());
	// The SEND's first three tries are lost, then the WRITE's first two.
	faults().drop_requests = 3;
	ASSERT_EQ(p.post_recv(0), 0);
	ASSERT_EQ(p.post(IBV_WR_SEND, 10), 0);
	auto wc = poll(p.scq, 1);
	ASSERT_EQ(wc.size(), 1u);
	EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
	EXPECT_EQ(faults().drop_requests.load(), 0);
	faults().drop_requests = 2;
	ASSERT_EQ(p.post(IBV_WR_RDMA_WRITE, 11, 4), 0);
	wc = poll(p.scq, 1);
	ASSERT_EQ(wc.size(), 1u);
	EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
	EXPECT_EQ(wc[0].wr_id, 11u);
	auto rc = poll(p.rcq, 1);
	ASSERT_EQ(rc.size(), 1u);
	EXPECT_EQ(rc[0].status, IBV_WC_SUCCESS);
	EXPECT_EQ(check(p.dst_msg(0)), 10u);
	EXPECT_EQ(check(p.dst_msg(4)), 11u);
	EXPECT_TRUE(quiet(p.scq));
	EXPECT_TRUE(quiet(p.rcq));
	loop::fake_stats s = loop::fake_transport_stats();
	EXPECT_EQ(s.dropped, 5u);
	EXPECT_EQ(s.executed, 1u); // The SEND; the WRITE is one-sided
}

TEST(EngineFake, LossBeyondRetryCountFailsAndFlushes)
{
	qp_opts o;
	o.retry_cnt = 2;
	pair p(o);
	ASSERT_TRUE(p.ok());
	faults().drop_requests = 1000;
	ASSERT_EQ(p.post(IBV_WR_RDMA_WRITE, 1, 1), 0);
	ASSERT_EQ(p.post(IBV_WR_RDMA_WRITE, 2, 2), 0);
	ASSERT_EQ(p.post(IBV_WR_RDMA_WRITE, 3, 3), 0);
	auto wc = poll(p.scq, 3);
	int left = faults().drop_requests.exchange(0);
	ASSERT_EQ(wc.size(), 3u);
	EXPECT_EQ(wc[0].status, IBV_WC_RETRY_EXC_ERR);
	EXPECT_EQ(wc[0].wr_id, 1u);
	EXPECT_EQ(wc[1].status, IBV_WC_WR_FLUSH_ERR);
	EXPECT_EQ(wc[1].wr_id, 2u);
	EXPECT_EQ(wc[2].status, IBV_WC_WR_FLUSH_ERR);
	EXPECT_EQ(wc[2].wr_id, 3u);
	EXPECT_EQ(state_of(p.qp), IBV_QPS_ERR);
	// The posting thread's try and retry_cnt retries, as an HCA makes
	// them (1 + retry_cnt transmissions): all lost, and nothing landed.
	EXPECT_EQ(1000 - left, 1 + 2);
	EXPECT_EQ(loop::fake_transport_stats().dropped, 3u);
	for (uint32_t i = 1; i <= 3; i++)
		for (uint32_t w = 0; w < kMsgWords; w++)
			ASSERT_EQ(p.dst_msg(i)[w], 0u) << i;
}

TEST(EngineFake, DuplicatesConsumeOneReceiveEach)
{
	qp_opts o;
	o.sq_psn = 0xfffffa; // Sequence numbers wrap at 2^24 midway
	pair p(o);
	ASSERT_TRUE(p.ok());
	constexpr uint32_t kMsgs = 12;
	for (uint32_t i = 0; i < 2 * kMsgs; i++)
		ASSERT_EQ(p.post_recv(i), 0);
	// Every request arrives twice, and some answers are lost (so the
	// requester sends those again: more duplicates).
	faults().duplicate = 1000;
	for (uint32_t i = 0; i < kMsgs; i++) {
		if (i % 3 == 0)
			faults().drop_answers = 1;
		ASSERT_EQ(p.post(IBV_WR_SEND, 100 + i), 0);
		auto wc = poll(p.scq, 1);
		ASSERT_EQ(wc.size(), 1u);
		EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
		EXPECT_EQ(wc[0].wr_id, 100 + i);
	}
	faults().duplicate = 0;
	auto rc = poll(p.rcq, kMsgs);
	ASSERT_EQ(rc.size(), kMsgs);
	for (uint32_t i = 0; i < kMsgs; i++) {
		EXPECT_EQ(rc[i].status, IBV_WC_SUCCESS);
		EXPECT_EQ(rc[i].wr_id, i); // Receives are taken in order, once each
		EXPECT_EQ(check(p.dst_msg(i)), 100 + i);
	}
	EXPECT_TRUE(quiet(p.rcq));
	loop::fake_stats s = loop::fake_transport_stats();
	EXPECT_EQ(s.executed, kMsgs);
	EXPECT_GE(s.duplicates, kMsgs + kMsgs / 3);
	// The receives left are intact: the next SEND takes the next one.
	ASSERT_EQ(p.post(IBV_WR_SEND, 500), 0);
	ASSERT_EQ(poll(p.scq, 1).size(), 1u);
	rc = poll(p.rcq, 1);
	ASSERT_EQ(rc.size(), 1u);
	EXPECT_EQ(rc[0].wr_id, kMsgs);
	EXPECT_EQ(check(p.dst_msg(kMsgs)), 500u);
}

TEST(EngineFake, ReorderedRequestsCompleteInPostingOrder)
{
	pair p;
	ASSERT_TRUE(p.ok());
	constexpr uint32_t kMsgs = 16;
	for (uint32_t i = 0; i < kMsgs; i++)
		ASSERT_EQ(p.post_recv(i), 0);
	// Each request is overtaken by the one after it: the earlier one
	// arrives late, after its successor, and a delay holds some requests
	// on the wire past the QP's timeout.
	faults().replay_stale = 1000;
	faults().delay_ns = 20000; // Below retry_cnt timeouts of 8 us
	for (uint32_t i = 0; i < kMsgs; i++)
		ASSERT_EQ(p.post(i % 2 ? IBV_WR_SEND : IBV_WR_SEND_WITH_IMM, 200 + i), 0);
	auto wc = poll(p.scq, kMsgs);
	faults().replay_stale = 0;
	faults().delay_ns = 0;
	ASSERT_EQ(wc.size(), kMsgs);
	for (uint32_t i = 0; i < kMsgs; i++) {
		EXPECT_EQ(wc[i].status, IBV_WC_SUCCESS);
		EXPECT_EQ(wc[i].wr_id, 200 + i);
	}
	auto rc = poll(p.rcq, kMsgs);
	ASSERT_EQ(rc.size(), kMsgs);
	for (uint32_t i = 0; i < kMsgs; i++) {
		EXPECT_EQ(rc[i].wr_id, i);
		EXPECT_EQ(check(p.dst_msg(i)), 200 + i);
	}
	EXPECT_TRUE(quiet(p.rcq));
	loop::fake_stats s = loop::fake_transport_stats();
	EXPECT_EQ(s.executed, kMsgs);
	EXPECT_GE(s.duplicates, kMsgs - 1);
}

TEST(EngineFake, WriteWithImmDuplicatesConsumeOneReceive)
{
	pair p;
	ASSERT_TRUE(p.ok());
	for (uint32_t i = 0; i < 4; i++)
		ASSERT_EQ(p.post_recv(20 + i), 0);
	faults().duplicate = 1000;
	faults().drop_answers = 1;
	ASSERT_EQ(p.post(IBV_WR_RDMA_WRITE_WITH_IMM, 40, 6), 0);
	ASSERT_EQ(p.post(IBV_WR_RDMA_WRITE_WITH_IMM, 41, 7), 0);
	auto wc = poll(p.scq, 2);
	faults().duplicate = 0;
	ASSERT_EQ(wc.size(), 2u);
	EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
	EXPECT_EQ(wc[1].status, IBV_WC_SUCCESS);
	auto rc = poll(p.rcq, 2);
	ASSERT_EQ(rc.size(), 2u);
	for (uint32_t i = 0; i < 2; i++) {
		EXPECT_EQ(rc[i].status, IBV_WC_SUCCESS);
		EXPECT_EQ(rc[i].opcode, IBV_WC_RECV_RDMA_WITH_IMM);
		EXPECT_EQ(rc[i].wr_id, 20 + i);
		EXPECT_EQ(be32toh(rc[i].imm_data), 40 + i);
	}
	EXPECT_TRUE(quiet(p.rcq));
	EXPECT_EQ(check(p.dst_msg(6)), 40u);
	EXPECT_EQ(check(p.dst_msg(7)), 41u);
}

TEST(EngineFake, LostReadAnswersAndAtomicRequestsAreRetried)
{
	pair p;
	ASSERT_TRUE(p.ok());
	fill(p.dst_msg(8), 77);
	faults().drop_answers = 2; // The READ's responses: read again
	ASSERT_EQ(p.post(IBV_WR_RDMA_READ, 9, 8), 0);
	auto wc = poll(p.scq, 1);
	ASSERT_EQ(wc.size(), 1u);
	EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
	EXPECT_EQ(check(p.src_msg(9)), 77u);
	// Lost atomic requests never executed: the word moves once per WR.
	p.dst_msg(10)[0] = 1000;
	for (uint32_t i = 0; i < 5; i++) {
		faults().drop_requests = 2;
		ASSERT_EQ(p.fetch_add(11 + i, 10, 10), 0);
		wc = poll(p.scq, 1);
		ASSERT_EQ(wc.size(), 1u);
		EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
		EXPECT_EQ(wc[0].byte_len, 8u);
		EXPECT_EQ(p.src_msg(11 + i)[0], 1000u + 10 * i);
	}
	EXPECT_EQ(p.dst_msg(10)[0], 1050u);
	EXPECT_GE(loop::fake_transport_stats().dropped, 12u);
}

// Datagrams are not sequenced and never retried: a lost one is gone, and
// its sender completes it all the same.
TEST(EngineFake, LostDatagramIsGoneAndTheNextArrives)
{
	env &e = the_env();
	ASSERT_TRUE(e.pd);
	ASSERT_EQ(loop::fake_transport_install(), 0);
	ibv_cq *cq = ibv_create_cq(e.ctx, 16, nullptr, nullptr, 0);
	ASSERT_TRUE(cq);
	ibv_qp_init_attr ia{};
	ia.qp_type = IBV_QPT_UD;
	ia.send_cq = cq;
	ia.recv_cq = cq;
	ia.cap = {4, 4, 1, 1, 0};
	ibv_qp *qp[2] = {ibv_create_qp(e.pd, &ia), ibv_create_qp(e.pd, &ia)};
	ASSERT_TRUE(qp[0] && qp[1]);
	for (ibv_qp *q : qp) {
		ibv_qp_attr a{};
		a.qp_state = IBV_QPS_INIT;
		a.port_num = 1;
		a.qkey = 0x1111;
		ASSERT_EQ(ibv_modify_qp(q, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
						       IBV_QP_QKEY),
			  0);
		a = {};
		a.qp_state = IBV_QPS_RTR;
		ASSERT_EQ(ibv_modify_qp(q, &a, IBV_QP_STATE), 0);
		a.qp_state = IBV_QPS_RTS;
		ASSERT_EQ(ibv_modify_qp(q, &a, IBV_QP_STATE | IBV_QP_SQ_PSN), 0);
	}
	std::vector<uint64_t> buf(4 * kMsgWords + 64);
	ibv_mr *mr = ibv_reg_mr(e.pd, buf.data(), buf.size() * 8, IBV_ACCESS_LOCAL_WRITE);
	ASSERT_TRUE(mr);
	uint64_t *rbuf = buf.data() + 2 * kMsgWords; // 40 bytes of GRH, then the message
	ibv_sge rs{reinterpret_cast<uintptr_t>(rbuf), kMsgWords * 8 + 40, mr->lkey};
	ibv_recv_wr rw{}, *rbad;
	rw.wr_id = 1;
	rw.sg_list = &rs;
	rw.num_sge = 1;
	ASSERT_EQ(ibv_post_recv(qp[1], &rw, &rbad), 0);
	ibv_ah_attr aa{};
	aa.dlid = e.lid;
	aa.port_num = 1;
	ibv_ah *ah = ibv_create_ah(e.pd, &aa);
	ASSERT_TRUE(ah);
	faults().drop_requests = 1;
	for (uint64_t seq : {600, 601}) {
		fill(buf.data(), seq);
		ibv_sge ss{reinterpret_cast<uintptr_t>(buf.data()), kMsgWords * 8, mr->lkey};
		ibv_send_wr sw{}, *sbad;
		sw.wr_id = seq;
		sw.opcode = IBV_WR_SEND;
		sw.send_flags = IBV_SEND_SIGNALED;
		sw.sg_list = &ss;
		sw.num_sge = 1;
		sw.wr.ud.ah = ah;
		sw.wr.ud.remote_qpn = qp[1]->qp_num;
		sw.wr.ud.remote_qkey = 0x1111;
		ASSERT_EQ(ibv_post_send(qp[0], &sw, &sbad), 0);
	}
	auto wc = poll(cq, 3);
	ASSERT_EQ(wc.size(), 3u);
	int sends = 0, recvs = 0;
	for (const ibv_wc &c : wc) {
		EXPECT_EQ(c.status, IBV_WC_SUCCESS);
		if (c.opcode == IBV_WC_RECV) {
			recvs++;
			EXPECT_EQ(c.byte_len, kMsgWords * 8 + 40);
		} else {
			sends++;
		}
	}
	EXPECT_EQ(sends, 2);
	EXPECT_EQ(recvs, 1);
	EXPECT_EQ(check(reinterpret_cast<uint64_t *>(reinterpret_cast<char *>(rbuf) + 40)), 601u);
	EXPECT_TRUE(quiet(cq));
	loop::fake_transport_uninstall();
	ibv_destroy_ah(ah);
	ibv_destroy_qp(qp[0]);
	ibv_destroy_qp(qp[1]);
	ibv_dereg_mr(mr);
	ibv_destroy_cq(cq);
}

TEST(EngineFake, RnrThenSuccess)
{
	pair p;
	ASSERT_TRUE(p.ok());
	ASSERT_EQ(p.post(IBV_WR_SEND, 300), 0); // No receive yet: RNR NAKs
	std::this_thread::sleep_for(std::chrono::milliseconds(5));
	ibv_wc wc;
	EXPECT_EQ(ibv_poll_cq(p.scq, 1, &wc), 0);
	ASSERT_EQ(p.post_recv(9), 0);
	auto sc = poll(p.scq, 1);
	ASSERT_EQ(sc.size(), 1u);
	EXPECT_EQ(sc[0].status, IBV_WC_SUCCESS);
	auto rc = poll(p.rcq, 1);
	ASSERT_EQ(rc.size(), 1u);
	EXPECT_EQ(rc[0].wr_id, 9u);
	EXPECT_EQ(check(p.dst_msg(9)), 300u);
	EXPECT_EQ(loop::fake_transport_stats().executed, 1u);
}

TEST(EngineFake, RnrRetriesRunOut)
{
	qp_opts o;
	o.rnr_retry = 2;
	pair p(o);
	ASSERT_TRUE(p.ok());
	ASSERT_EQ(p.post(IBV_WR_SEND, 1), 0);
	ASSERT_EQ(p.post(IBV_WR_RDMA_WRITE, 2, 2), 0);
	auto wc = poll(p.scq, 2);
	ASSERT_EQ(wc.size(), 2u);
	EXPECT_EQ(wc[0].status, IBV_WC_RNR_RETRY_EXC_ERR);
	EXPECT_EQ(wc[1].status, IBV_WC_WR_FLUSH_ERR);
	EXPECT_EQ(state_of(p.qp), IBV_QPS_ERR);
	EXPECT_EQ(p.dst_msg(2)[0], 0u); // The WRITE behind it never ran
}

} // namespace
