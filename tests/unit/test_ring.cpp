// SPDX-License-Identifier: MIT
// The two shared-memory ring protocols of kernel-abi/softverbs-abi.h, run by
// the provider's own code with several threads:
//  - sv_cq_ring: many producers (cq_push), one consumer (cq_pop, under the
//    CQ's poll lock);
//  - sv_rq_ring: one producer (rq_post), many consumers (rq_take).
// Threads stand in for processes: the protocols are written against
// atomics on the shared words only, so a thread is as good a peer as any
// and ThreadSanitizer (the tsan lane of scripts/test.sh) can see every race.
// Each entry carries its producer, a sequence number and a value derived
// from both, so a lost, duplicated, reordered or torn entry fails a check;
// nothing here depends on timing.
#include "providers/loop/loop.h"
#include "providers/loop/transport/loop/xfer.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <csignal>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <sys/un.h>
#include <thread>
#include <unistd.h>
#include <vector>

namespace {

#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
constexpr uint32_t kPerProducer = 4000; // Sanitizers are 5-20 times slower
#else
constexpr uint32_t kPerProducer = 40000;
#endif

uint32_t mix(uint32_t t, uint32_t seq)
{
	uint32_t h = (t + 1) * 0x9e3779b9u ^ seq * 0x85ebca6bu;
	return h ^ (h >> 15);
}

struct free_deleter {
	void operator()(void *p) const { free(p); }
};

// A CQ ring in process memory, laid out as queue_create lays out a segment
// (header, then the slots); no payload array: these entries carry none.
struct test_cq {
	std::unique_ptr<char, free_deleter> mem;
	loop::loop_cq cq{};
	sv_cq_ring *ring;

	explicit test_cq(uint32_t entries)
	{
		size_t bytes = sizeof(sv_cq_ring) + size_t(entries) * sizeof(sv_cqe);
		mem.reset(static_cast<char *>(aligned_alloc(SV_CACHELINE, bytes)));
		memset(mem.get(), 0, bytes);
		ring = reinterpret_cast<sv_cq_ring *>(mem.get());
		ring->hdr.kind = SV_OBJ_CQ;
		ring->hdr.entries = entries;
		ring->hdr.entry_size = sizeof(sv_cqe);
		ring->hdr.slots_offset = sizeof(sv_cq_ring);
		ring->hdr.seg.seg_size = static_cast<uint32_t>(bytes);
		cq.ring = ring;
		cq.slots = reinterpret_cast<sv_cqe *>(mem.get() + sizeof(sv_cq_ring));
		cq.mask = entries - 1;
		cq.capacity = entries;
	}

	bool pop(sv_cqe &out)
	{
		std::lock_guard<loop::qlock> g(cq.lock); // cq_pop's contract
		return loop::cq_pop(&cq, out);
	}
};

sv_cqe make_cqe(uint32_t t, uint32_t seq, ibv_wc_status status = IBV_WC_SUCCESS)
{
	sv_cqe e{};
	e.wr_id = (uint64_t(t) << 32) | seq;
	e.status = status;
	e.opcode = IBV_WC_RECV;
	e.qp_num = t;
	e.byte_len = mix(t, seq);
	e.imm_data = ~mix(t, seq);
	return e;
}

// Set when a check failed: threads that wait for room give up.
std::atomic<bool> g_stop{false};

// Pushes, waiting out a full ring (ENOSPC) as a producer that retries would.
void push_retry(sv_cq_ring *ring, sv_cqe e, bool solicited = false)
{
	while (!g_stop.load(std::memory_order_relaxed)) {
		int r = loop::cq_push(ring, e, solicited);
		if (r == 0)
			return;
		if (r != ENOSPC) {
			ADD_FAILURE() << "cq_push returned " << r;
			g_stop = true;
			return;
		}
		std::this_thread::yield();
	}
}

// Checks entry number n (in consumer order) against what its producer
// pushed; next[t] is the sequence number producer t must show next.
void check_entry(const sv_cqe &e, uint64_t n, std::vector<uint32_t> &next)
{
	uint32_t t = static_cast<uint32_t>(e.wr_id >> 32);
	uint32_t seq = static_cast<uint32_t>(e.wr_id);
	ASSERT_LT(t, next.size()) << "entry " << n;
	// One producer's entries are reserved in its program order.
	ASSERT_EQ(seq, next[t]) << "producer " << t << ", entry " << n;
	next[t]++;
	ASSERT_EQ(e.seq, static_cast<uint32_t>(n + 1));
	ASSERT_EQ(e.qp_num, t);
	ASSERT_EQ(e.byte_len, mix(t, seq));
	ASSERT_EQ(e.imm_data, ~mix(t, seq));
	ASSERT_EQ(e.opcode, uint32_t(IBV_WC_RECV));
}

// Pops until n entries arrived or a generous bound passed (never a hang).
void consume(test_cq &q, uint64_t total, std::vector<uint32_t> &next, uint64_t &got)
{
	auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
	sv_cqe e;
	while (got < total) {
		if (!q.pop(e)) {
			ASSERT_TRUE(std::chrono::steady_clock::now() < deadline)
				<< "only " << got << " of " << total << " entries arrived";
			continue;
		}
		check_entry(e, got, next);
		if (::testing::Test::HasFatalFailure())
			return;
		got++;
	}
}

void many_producers(uint32_t entries, uint32_t producers, uint32_t per, bool slow)
{
	test_cq q(entries);
	g_stop = false;
	std::vector<std::thread> ts;
	for (uint32_t t = 0; t < producers; t++)
		ts.emplace_back([&, t] {
			for (uint32_t s = 0; s < per; s++) {
				push_retry(q.ring, make_cqe(t, s));
				// Now and then let the consumer find the ring empty
				// long enough to sleep on the futex.
				if (slow && s % 64 == 63)
					std::this_thread::sleep_for(std::chrono::milliseconds(1));
			}
		});
	std::vector<uint32_t> next(producers, 0);
	uint64_t got = 0;
	consume(q, uint64_t(producers) * per, next, got);
	if (::testing::Test::HasFatalFailure())
		g_stop = true; // Producers may wait for room that never comes
	for (auto &t : ts)
		t.join();
	ASSERT_FALSE(::testing::Test::HasFatalFailure());
	EXPECT_EQ(got, uint64_t(producers) * per);
	for (uint32_t t = 0; t < producers; t++)
		EXPECT_EQ(next[t], per) << "producer " << t;
	EXPECT_EQ(q.ring->prod, got);
	EXPECT_EQ(q.ring->cons, got);
	EXPECT_EQ(q.ring->waiters, 0u);
	sv_cqe e;
	EXPECT_FALSE(q.pop(e)) << "an entry beyond what was pushed";
}

TEST(CqRing, ManyProducersOneConsumer)
{
	// A small ring: producers find it full all the time.
	many_producers(64, 4, kPerProducer, false);
}

TEST(CqRing, ManyProducersLargeRing)
{
	many_producers(4096, 3, kPerProducer, false);
}

TEST(CqRing, SleepingConsumerIsWoken)
{
	many_producers(256, 2, 2048, true);
}

TEST(CqRing, OverflowIsReportedAndKeepsEntries)
{
	test_cq q(16);
	for (uint32_t s = 0; s < 16; s++) {
		sv_cqe e = make_cqe(0, s);
		ASSERT_EQ(loop::cq_push(q.ring, e, false), 0);
	}
	EXPECT_EQ(q.ring->overflow, 0u);
	sv_cqe extra = make_cqe(0, 16);
	EXPECT_EQ(loop::cq_push(q.ring, extra, false), ENOSPC);
	EXPECT_EQ(q.ring->overflow, 1u) << "a full ring must be flagged";
	EXPECT_EQ(q.ring->prod, 16u) << "a refused entry reserves nothing";
	std::vector<uint32_t> next(1, 0);
	uint64_t got = 0;
	consume(q, 16, next, got);
	sv_cqe e;
	EXPECT_FALSE(q.pop(e));
	// Room again: the ring goes on.
	ASSERT_EQ(loop::cq_push(q.ring, extra, false), 0);
	ASSERT_TRUE(q.pop(e));
	EXPECT_EQ(e.wr_id, 16u);
}

// Producers judge room by cons_seen, a bound of cons on their own line: a
// stale bound (or one beyond prod, written over) sends them to cons itself,
// never to a false overflow; one written ahead of cons, which would let
// them overwrite entries not yet taken, is set back by the owner.
TEST(CqRing, ProducersBoundOfConsIsOnlyAHint)
{
	test_cq q(16);
	std::vector<uint32_t> next(1, 0);
	uint64_t got = 0;
	uint32_t seq = 0;
	for (; seq < 16; seq++) {
		sv_cqe e = make_cqe(0, seq);
		ASSERT_EQ(loop::cq_push(q.ring, e, false), 0);
	}
	consume(q, 16, next, got);
	// The bound still says 0: the ring looks full by it, and is not.
	EXPECT_EQ(q.ring->cons_seen, 0u);
	sv_cqe e = make_cqe(0, seq++);
	ASSERT_EQ(loop::cq_push(q.ring, e, false), 0) << "a stale bound is no overflow";
	EXPECT_EQ(q.ring->cons_seen, 16u) << "the bound follows cons when read";
	EXPECT_EQ(q.ring->overflow, 0u);
	// Written over with a value beyond prod: ignored for cons itself.
	q.ring->cons_seen = 1000;
	e = make_cqe(0, seq++);
	ASSERT_EQ(loop::cq_push(q.ring, e, false), 0);
	EXPECT_EQ(q.ring->overflow, 0u);
	consume(q, 18, next, got);
	// Fill the ring, then write the bound ahead of cons (as if everything
	// had been taken): the owner's look at its indices sets it back, and
	// the next producer finds the ring full instead of overwriting.
	for (uint32_t i = 0; i < 16; i++) {
		e = make_cqe(0, seq++);
		ASSERT_EQ(loop::cq_push(q.ring, e, false), 0);
	}
	q.ring->cons_seen = q.ring->prod;
	{
		std::lock_guard<loop::qlock> g(q.cq.lock);
		loop::cq_check_indices(&q.cq);
	}
	EXPECT_EQ(q.ring->cons_seen, q.ring->cons);
	EXPECT_EQ(q.ring->overflow, 0u) << "a bound set back is not damage";
	e = make_cqe(0, seq);
	EXPECT_EQ(loop::cq_push(q.ring, e, false), ENOSPC);
	consume(q, 34, next, got);
	EXPECT_EQ(got, 34u);
}

// An abstract AF_UNIX datagram socket standing in for a completion channel.
struct channel_sock {
	int fd = -1;
	std::string addr;

	channel_sock()
	{
		fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
		addr = std::string(1, '\0') + "sv-ring-test-" + std::to_string(getpid()) + "-" +
		       std::to_string(reinterpret_cast<uintptr_t>(this));
		sockaddr_un sa{};
		sa.sun_family = AF_UNIX;
		memcpy(sa.sun_path, addr.data(), addr.size());
		bind(fd, reinterpret_cast<sockaddr *>(&sa),
		     static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + addr.size()));
		timeval tv{0, 200 * 1000}; // Only bounds the "no further event" reads
		setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	}
	~channel_sock() { close(fd); }

	void wire(sv_cq_ring *r, uint64_t cookie)
	{
		memcpy(r->channel_addr, addr.data(), addr.size());
		r->channel_len = static_cast<uint32_t>(addr.size());
		r->cookie = cookie;
	}

	// Events queued now (the sends happened before the caller looked).
	int drain(uint64_t cookie)
	{
		int n = 0;
		uint64_t c;
		while (recv(fd, &c, sizeof(c), MSG_DONTWAIT) == sizeof(c)) {
			EXPECT_EQ(c, cookie);
			n++;
		}
		return n;
	}
};

TEST(CqRing, ArmFiresOncePerArm)
{
	test_cq q(64);
	channel_sock ch;
	ASSERT_GE(ch.fd, 0);
	ch.wire(q.ring, 0x5eed);
	sv_cqe e;
	// Not armed: no event.
	push_retry(q.ring, make_cqe(0, 0));
	EXPECT_EQ(ch.drain(0x5eed), 0);
	ASSERT_TRUE(q.pop(e));
	// Armed for all: one event, and the arm is consumed.
	q.ring->armed = SV_CQ_ARM_ALL;
	push_retry(q.ring, make_cqe(0, 1));
	push_retry(q.ring, make_cqe(0, 2));
	EXPECT_EQ(q.ring->armed, uint32_t(SV_CQ_DISARMED));
	EXPECT_EQ(ch.drain(0x5eed), 1);
	// Solicited only: a plain success does not fire; solicited and error
	// completions do.
	q.ring->armed = SV_CQ_ARM_SOLICITED;
	push_retry(q.ring, make_cqe(0, 3));
	EXPECT_EQ(q.ring->armed, uint32_t(SV_CQ_ARM_SOLICITED));
	EXPECT_EQ(ch.drain(0x5eed), 0);
	push_retry(q.ring, make_cqe(0, 4), true);
	EXPECT_EQ(q.ring->armed, uint32_t(SV_CQ_DISARMED));
	EXPECT_EQ(ch.drain(0x5eed), 1);
	q.ring->armed = SV_CQ_ARM_SOLICITED;
	push_retry(q.ring, make_cqe(0, 5, IBV_WC_REM_ACCESS_ERR));
	EXPECT_EQ(q.ring->armed, uint32_t(SV_CQ_DISARMED));
	EXPECT_EQ(ch.drain(0x5eed), 1);
	// Moderated by count: the third completion after arming fires.
	q.ring->mod_count = 3;
	q.ring->armed = SV_CQ_ARM_ALL;
	push_retry(q.ring, make_cqe(0, 6));
	push_retry(q.ring, make_cqe(0, 7));
	EXPECT_EQ(q.ring->armed, uint32_t(SV_CQ_ARM_ALL));
	EXPECT_EQ(ch.drain(0x5eed), 0);
	push_retry(q.ring, make_cqe(0, 8));
	EXPECT_EQ(q.ring->armed, uint32_t(SV_CQ_DISARMED));
	EXPECT_EQ(q.ring->mod_pending, 0u);
	EXPECT_EQ(ch.drain(0x5eed), 1);
	std::vector<uint32_t> next(1, 1);
	uint64_t got = 1;
	consume(q, 9, next, got);
}

TEST(CqRing, ConcurrentProducersFireOneEventPerArm)
{
	constexpr uint32_t kProducers = 4, kRounds = 200;
	test_cq q(64);
	channel_sock ch;
	ASSERT_GE(ch.fd, 0);
	ch.wire(q.ring, 42);
	std::vector<uint32_t> next(kProducers, 0);
	uint64_t got = 0;
	for (uint32_t r = 0; r < kRounds; r++) {
		std::atomic_ref<uint32_t>(q.ring->armed).store(SV_CQ_ARM_ALL);
		std::vector<std::thread> ts;
		for (uint32_t t = 0; t < kProducers; t++)
			ts.emplace_back([&, t] { push_retry(q.ring, make_cqe(t, r)); });
		for (auto &t : ts)
			t.join();
		ASSERT_EQ(ch.drain(42), 1) << "round " << r;
		consume(q, got + kProducers, next, got);
		ASSERT_FALSE(::testing::Test::HasFatalFailure());
	}
	EXPECT_EQ(got, uint64_t(kProducers) * kRounds);
}

// ---- receive queue rings ----

struct test_rq {
	std::unique_ptr<char, free_deleter> mem;
	sv_rq_ring *ring;
	uint32_t max_sge;

	test_rq(uint32_t entries, uint32_t sge) : max_sge(sge)
	{
		uint32_t esize = (sizeof(sv_recv_wqe) + sge * sizeof(sv_sge) + 63) & ~63u;
		size_t bytes = sizeof(sv_rq_ring) + size_t(entries) * esize;
		mem.reset(static_cast<char *>(aligned_alloc(SV_CACHELINE, bytes)));
		memset(mem.get(), 0, bytes);
		ring = reinterpret_cast<sv_rq_ring *>(mem.get());
		ring->hdr.kind = SV_OBJ_RQ;
		ring->hdr.entries = entries;
		ring->hdr.entry_size = esize;
		ring->hdr.slots_offset = sizeof(sv_rq_ring);
		ring->hdr.max_sge = sge;
		ring->hdr.seg.seg_size = static_cast<uint32_t>(bytes);
	}
};

// What WR number seq carries: its SGE count and every SGE are functions of
// seq, so a torn copy shows.
uint32_t sges_of(uint64_t seq, uint32_t max_sge)
{
	return 1 + static_cast<uint32_t>(seq % max_sge);
}

ibv_sge sge_of(uint64_t seq, uint32_t i)
{
	uint32_t m = mix(static_cast<uint32_t>(seq), i);
	// A length of 24 bits: a receive's SGEs add up to at most max_msg_sz
	// (2^31), or post_recv refuses it.
	return ibv_sge{(seq << 8) | i, m >> 8, ~m};
}

// Checks a taken WQE; returns its sequence number.
uint64_t check_wqe(const sv_recv_wqe *w, uint32_t max_sge)
{
	uint64_t seq = w->wr_id;
	EXPECT_EQ(w->num_sge, sges_of(seq, max_sge)) << "wr " << seq;
	for (uint32_t i = 0; i < w->num_sge && i < max_sge; i++) {
		ibv_sge s = sge_of(seq, i);
		EXPECT_EQ(w->sge[i].addr, s.addr) << "wr " << seq << " sge " << i;
		EXPECT_EQ(w->sge[i].length, s.length) << "wr " << seq << " sge " << i;
		EXPECT_EQ(w->sge[i].lkey, s.lkey) << "wr " << seq << " sge " << i;
	}
	return seq;
}

void one_producer_many_consumers(uint32_t entries, uint32_t kConsumers)
{
	constexpr uint32_t kMaxSge = 4, kChain = 8;
	const uint64_t total = uint64_t(kPerProducer) * 3;
	test_rq q(entries, kMaxSge);
	std::atomic<uint64_t> taken{0};
	g_stop = false;
	std::vector<std::vector<uint64_t>> seen(kConsumers);
	std::vector<std::thread> ts;
	for (uint32_t c = 0; c < kConsumers; c++)
		ts.emplace_back([&, c] {
			std::vector<uint8_t> buf(q.ring->hdr.entry_size);
			auto *w = reinterpret_cast<sv_recv_wqe *>(buf.data());
			auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
			while (taken.load() < total && !g_stop.load()) {
				if (!loop::rq_take(q.ring, w, kMaxSge)) {
					if (std::chrono::steady_clock::now() > deadline)
						return; // Counted as missing below
					std::this_thread::yield();
					continue;
				}
				seen[c].push_back(check_wqe(w, kMaxSge));
				taken.fetch_add(1);
			}
		});
	// The producer posts chains; a full ring refuses the rest of a chain
	// with ENOMEM and names the first WR it did not post.
	std::vector<ibv_recv_wr> wrs(kChain);
	std::vector<std::vector<ibv_sge>> sges(kChain, std::vector<ibv_sge>(kMaxSge));
	uint64_t seq = 0, refusals = 0;
	auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
	while (seq < total && std::chrono::steady_clock::now() < deadline) {
		uint32_t n = static_cast<uint32_t>(std::min<uint64_t>(1 + seq % kChain, total - seq));
		for (uint32_t i = 0; i < n; i++) {
			uint64_t s = seq + i;
			wrs[i] = ibv_recv_wr{};
			wrs[i].wr_id = s;
			wrs[i].num_sge = static_cast<int>(sges_of(s, kMaxSge));
			for (uint32_t k = 0; k < sges_of(s, kMaxSge); k++)
				sges[i][k] = sge_of(s, k);
			wrs[i].sg_list = sges[i].data();
			wrs[i].next = i + 1 < n ? &wrs[i + 1] : nullptr;
		}
		ibv_recv_wr *bad = nullptr;
		int r = loop::rq_post(q.ring, kMaxSge, wrs.data(), &bad);
		if (r == 0) {
			seq += n;
			continue;
		}
		if (r != ENOMEM || !(bad >= wrs.data() && bad < wrs.data() + n)) {
			ADD_FAILURE() << "rq_post returned " << r << ", bad_wr " << bad;
			break;
		}
		seq += static_cast<uint64_t>(bad - wrs.data());
		refusals++;
		std::this_thread::yield();
	}
	if (seq < total)
		g_stop = true; // Consumers would wait for WRs that never come
	for (auto &t : ts)
		t.join();
	ASSERT_EQ(seq, total) << "producer stopped early";
	std::vector<uint8_t> count(total, 0);
	uint64_t n = 0;
	for (uint32_t c = 0; c < kConsumers; c++) {
		for (size_t i = 0; i < seen[c].size(); i++) {
			uint64_t s = seen[c][i];
			ASSERT_LT(s, total);
			count[s]++;
			// cons only grows, so each consumer sees increasing numbers.
			if (i) {
				ASSERT_GT(s, seen[c][i - 1]) << "consumer " << c;
			}
		}
		n += seen[c].size();
	}
	EXPECT_EQ(n, total);
	for (uint64_t s = 0; s < total; s++)
		ASSERT_EQ(count[s], 1) << "WR " << s << " taken " << int(count[s]) << " times";
	EXPECT_EQ(q.ring->prod, total);
	EXPECT_EQ(q.ring->cons, total);
	::testing::Test::RecordProperty("producer_refusals", std::to_string(refusals));
}

TEST(RqRing, OneProducerManyConsumers)
{
	one_producer_many_consumers(32, 3);
}

// Four slots: the producer refills a slot as soon as a taker moves cons
// past it, while a slower taker may still be copying it (its CAS then
// fails and it drops the copy: the contract's "only a winning CAS owns the
// copy").
TEST(RqRing, TinyRingLapsUnderTakers)
{
	one_producer_many_consumers(4, 4);
}

TEST(RqRing, PostChecksAndFullRing)
{
	constexpr uint32_t kMaxSge = 2;
	test_rq q(4, kMaxSge);
	ibv_sge s[3] = {sge_of(0, 0), sge_of(0, 1), sge_of(0, 2)};
	ibv_recv_wr w[6]{};
	for (int i = 0; i < 6; i++) {
		w[i].wr_id = uint64_t(i);
		w[i].sg_list = s;
		w[i].num_sge = 1;
		w[i].next = i < 5 ? &w[i + 1] : nullptr;
	}
	// Too many SGEs on the second WR: EINVAL naming it; the first is posted.
	w[1].num_sge = 3;
	ibv_recv_wr *bad = nullptr;
	EXPECT_EQ(loop::rq_post(q.ring, kMaxSge, w, &bad), EINVAL);
	EXPECT_EQ(bad, &w[1]);
	EXPECT_EQ(q.ring->prod, 1u);
	w[1].num_sge = -1;
	EXPECT_EQ(loop::rq_post(q.ring, kMaxSge, &w[1], &bad), EINVAL);
	EXPECT_EQ(bad, &w[1]);
	w[1].num_sge = 2;
	// Four slots, one used: three more fit, the fourth WR of the chain is
	// refused with ENOMEM.
	EXPECT_EQ(loop::rq_post(q.ring, kMaxSge, &w[1], &bad), ENOMEM);
	EXPECT_EQ(bad, &w[4]);
	EXPECT_EQ(q.ring->prod, 4u);
	std::vector<uint8_t> buf(q.ring->hdr.entry_size);
	auto *out = reinterpret_cast<sv_recv_wqe *>(buf.data());
	for (uint64_t i = 0; i < 4; i++) {
		ASSERT_TRUE(loop::rq_take(q.ring, out, kMaxSge));
		EXPECT_EQ(out->wr_id, i);
		EXPECT_EQ(out->num_sge, i == 1 ? 2u : 1u);
		EXPECT_EQ(out->sge[0].addr, s[0].addr);
		EXPECT_EQ(out->sge[0].lkey, s[0].lkey);
	}
	EXPECT_FALSE(loop::rq_take(q.ring, out, kMaxSge)) << "empty ring";
	// A WQE with more SGEs than the taker allows is marked invalid, not
	// trusted.
	w[1].next = nullptr;
	ASSERT_EQ(loop::rq_post(q.ring, kMaxSge, &w[1], &bad), 0);
	ASSERT_TRUE(loop::rq_take(q.ring, out, 1));
	EXPECT_EQ(out->num_sge, SV_RECV_WQE_INVALID);
}

// Each side of an RQ keeps a bound of the other's index on its own line
// (prod_seen for consumers, cons_seen for the producer).  Neither may be
// believed beyond the index it stands for: a stale bound is read past, one
// beyond a lap (written over) sends the reader to the index itself, and
// nothing is taken that was not posted.
TEST(RqRing, BoundsOfTheOtherIndexAreOnlyHints)
{
	constexpr uint32_t kMaxSge = 1;
	test_rq q(4, kMaxSge);
	ibv_sge s = sge_of(0, 0);
	ibv_recv_wr w[4]{};
	for (int i = 0; i < 4; i++) {
		w[i].sg_list = &s;
		w[i].num_sge = 1;
	}
	std::vector<uint8_t> buf(q.ring->hdr.entry_size);
	auto *out = reinterpret_cast<sv_recv_wqe *>(buf.data());
	ibv_recv_wr *bad = nullptr;
	uint64_t posted = 0, taken = 0;
	auto post = [&] {
		w[0].wr_id = posted;
		int err = loop::rq_post(q.ring, kMaxSge, &w[0], &bad);
		if (!err)
			posted++;
		return err;
	};
	auto take = [&] {
		if (!loop::rq_take(q.ring, out, kMaxSge))
			return false;
		EXPECT_EQ(out->wr_id, taken);
		taken++;
		return true;
	};
	// Several laps of a 4-slot ring: each bound goes stale every lap.
	for (int lap = 0; lap < 5; lap++) {
		for (int i = 0; i < 4; i++)
			ASSERT_EQ(post(), 0) << "lap " << lap;
		EXPECT_EQ(post(), ENOMEM) << "full";
		for (int i = 0; i < 4; i++)
			ASSERT_TRUE(take()) << "lap " << lap;
		EXPECT_FALSE(take()) << "empty";
	}
	// The consumers' bound written beyond prod: nothing is taken that was
	// not posted, and the bound is set right by the next read of prod.
	q.ring->prod_seen = q.ring->cons + 3;
	EXPECT_FALSE(take()) << "a bound ahead of prod within a lap is believed only as far as posted";
	q.ring->prod_seen = q.ring->cons + 1000;
	EXPECT_FALSE(take()) << "a bound beyond a lap";
	ASSERT_EQ(post(), 0);
	q.ring->prod_seen = q.ring->cons + 1000;
	ASSERT_TRUE(take());
	EXPECT_EQ(q.ring->prod_seen, q.ring->prod);
	// The producer's bound written beyond prod, or far behind: posting
	// follows cons itself.
	q.ring->cons_seen = q.ring->prod + 1000;
	ASSERT_EQ(post(), 0);
	q.ring->cons_seen = 0;
	ASSERT_EQ(post(), 0);
	EXPECT_EQ(q.ring->cons_seen, q.ring->cons);
	while (take()) {
	}
	EXPECT_EQ(taken, posted);
	// The producer's bound written ahead of cons on a full ring: the
	// producer writes over a WQE nobody took.  The consumer finds a later
	// lap's stamp where it expected its own and reports the ring damaged,
	// rather than taking the newer WQE now and again at its own index.
	for (int i = 0; i < 4; i++)
		ASSERT_EQ(post(), 0);
	q.ring->cons_seen = q.ring->prod;
	ASSERT_EQ(post(), 0) << "the bound is believed between looks at cons";
	bool damaged = false;
	EXPECT_FALSE(loop::rq_take(q.ring, out, kMaxSge, &damaged));
	EXPECT_TRUE(damaged) << "a WQE written over must be reported";
}

TEST(RqRing, FlushCompletesEveryWqeInOrder)
{
	constexpr uint32_t kMaxSge = 1;
	test_rq rq(16, kMaxSge);
	test_cq cq(16);
	ibv_sge s = sge_of(0, 0);
	ibv_recv_wr w[10]{};
	for (int i = 0; i < 10; i++) {
		w[i].wr_id = 100 + uint64_t(i);
		w[i].sg_list = &s;
		w[i].num_sge = 1;
		w[i].next = i < 9 ? &w[i + 1] : nullptr;
	}
	ibv_recv_wr *bad = nullptr;
	ASSERT_EQ(loop::rq_post(rq.ring, kMaxSge, w, &bad), 0);
	loop::rq_flush(rq.ring, cq.ring, 0x1234);
	EXPECT_EQ(rq.ring->cons, 10u);
	sv_cqe e;
	for (uint64_t i = 0; i < 10; i++) {
		ASSERT_TRUE(cq.pop(e));
		EXPECT_EQ(e.wr_id, 100 + i);
		EXPECT_EQ(e.status, uint32_t(IBV_WC_WR_FLUSH_ERR));
		EXPECT_EQ(e.opcode, uint32_t(IBV_WC_RECV));
		EXPECT_EQ(e.qp_num, 0x1234u);
	}
	EXPECT_FALSE(cq.pop(e));
}

} // namespace

// ---- peer-side mappings (queue_map) ----

namespace {

// How many mappings of this process name a file whose path contains `name`.
int mappings_of(const std::string &name)
{
	FILE *f = fopen("/proc/self/maps", "r");
	if (!f)
		return -1;
	char line[4096];
	int n = 0;
	while (fgets(line, sizeof(line), f))
		if (strstr(line, name.c_str()))
			n++;
	fclose(f);
	return n;
}

} // namespace

// A peer's queue stays mapped while a holder uses it, even after its owner
// destroyed it and the cache let it go; it is unmapped with the last holder.
// (Before queue_hold, a generation change unmapped the cached mapping under
// a thread still pushing through the pointer it had been given.)
TEST(QueueMap, HeldMappingOutlivesTheQueue)
{
	loop::config c;
	c.fabric = "utqm" + std::to_string(getpid());
	loop::device_config d;
	d.name = "loop0";
	c.devices = {d};
	loop::fabric *fab = nullptr;
	std::string err;
	ASSERT_EQ(loop::fabric::open(c, fab, err), 0) << err;
	int lease = fab->lease();
	ASSERT_GE(lease, 0);
	uint32_t entry = 64; // The smallest entry a queue may have (queue_geom_valid)
	loop::obj_ref ref;
	void *own = loop::queue_create(*fab, lease, SV_OBJ_RQ, 8, entry, sizeof(sv_rq_ring), 1, ref);
	ASSERT_NE(own, nullptr) << strerror(errno);
	std::string name = loop::queue_name(*fab, ref);
	{
		loop::queue_hold h = loop::queue_map(*fab, ref, SV_OBJ_RQ);
		ASSERT_TRUE(h);
		auto *ring = h.as<sv_rq_ring>();
		ASSERT_NE(static_cast<void *>(ring), own); // A mapping of its own
		EXPECT_EQ(mappings_of(name), 2);
		loop::queue_hold again = loop::queue_map(*fab, ref, SV_OBJ_RQ);
		EXPECT_EQ(again.as<sv_rq_ring>(), ring); // Cached
		loop::queue_destroy(*fab, ref, own);
		// Gone for new lookups, still there for the holders.
		EXPECT_FALSE(loop::queue_map(*fab, ref, SV_OBJ_RQ));
		EXPECT_EQ(ring->hdr.obj_slot, ref.slot);
		EXPECT_EQ(ring->hdr.obj_gen, ref.gen);
		std::atomic_ref<uint64_t>(ring->prod).fetch_add(1); // Writable
		EXPECT_EQ(mappings_of(name), 1);
		again = {};
		EXPECT_EQ(mappings_of(name), 1);
	}
	EXPECT_EQ(mappings_of(name), 0); // The last holder unmapped it
	fab->release_lease();
	unlink(("/dev/shm" + loop::fabric::registry_name(c.fabric)).c_str());
	delete fab;
}

// self_pid() answers without a system call from a page the kernel wipes in
// a child: after fork(), glibc's _Fork() (no atfork handlers run) and a raw
// clone(SIGCHLD) (no glibc bookkeeping at all), the child gets its own pid,
// not its parent's cached one.  The data path decides with it whether a
// copy is within the process, so a stale pid would copy a peer's bytes
// into the child's own memory.
TEST(SelfPid, FollowsEveryKindOfFork)
{
	ASSERT_EQ(loop::self_pid(), getpid());
	ASSERT_EQ(loop::self_pid(), getpid()); // The cached answer
	auto child_ok = [](pid_t p) {
		if (p == 0)
			_exit(loop::self_pid() == static_cast<pid_t>(syscall(SYS_getpid)) ? 0 : 1);
		int st = 0;
		if (p < 0 || waitpid(p, &st, 0) != p)
			return false;
		return WIFEXITED(st) && WEXITSTATUS(st) == 0;
	};
	EXPECT_TRUE(child_ok(fork()));
	EXPECT_TRUE(child_ok(_Fork()));
	EXPECT_TRUE(child_ok(static_cast<pid_t>(syscall(SYS_clone, SIGCHLD, 0, 0, 0, 0))));
	EXPECT_EQ(loop::self_pid(), getpid()); // The parent's is untouched
}
