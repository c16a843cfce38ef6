// SPDX-License-Identifier: MIT
// relaxed_copy and ordered_copy (transport/loop/xfer.h): the order a
// WRITE's bytes land in memory mapped here, with relaxed ordering and
// without.  Observed, not assumed: a page of the target is write-protected,
// and the fault the copy takes there records what had landed before.
#include "transport/loop/xfer.h"

#include <gtest/gtest.h>

#include <csignal>
#include <cstring>
#include <sys/mman.h>
#include <unistd.h>
#include <vector>

using loop::ordered_copy;
using loop::relaxed_copy;

namespace {

// The watch a test sets before a copy: the protected page, and the range of
// the target (with its source) compared when the copy first stores there.
char *g_page;
const char *g_cmp_dst, *g_cmp_src;
size_t g_cmp_len;
volatile sig_atomic_t g_faults, g_landed;

void on_segv(int, siginfo_t *si, void *)
{
	char *a = static_cast<char *>(si->si_addr);
	if (a < g_page || a >= g_page + 4096)
		_exit(70); // Not the fault this test set up
	g_faults = g_faults + 1;
	g_landed = memcmp(g_cmp_dst, g_cmp_src, g_cmp_len) == 0;
	mprotect(g_page, 4096, PROT_READ | PROT_WRITE);
}

struct Observed {
	bool one_fault = false; // The copy stored into the protected page, once
	bool landed = false;    // The compared range held the source's bytes then
	bool whole = false;     // The target equals the source afterwards
};

// Copies len bytes with copy into a zeroed target that starts lead bytes
// into a fresh mapping, the page at target offset prot (a page boundary of
// the mapping) write-protected; reports whether target bytes [cmp, cmp +
// cmp_len) had landed at the first store into that page.
template <typename F>
Observed observe(size_t len, size_t lead, size_t prot, size_t cmp, size_t cmp_len, F copy)
{
	size_t map = ((lead + len + 4095) / 4096 + 1) * 4096;
	auto *m = static_cast<char *>(
		mmap(nullptr, map, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
	EXPECT_NE(m, MAP_FAILED);
	memset(m, 0, map); // Every byte differs from the source's at first
	char *dst = m + lead;
	std::vector<char> src(len);
	for (size_t i = 0; i < len; i++)
		src[i] = static_cast<char>(i * 7 + 1);
	g_page = dst + prot;
	g_cmp_dst = dst + cmp;
	g_cmp_src = src.data() + cmp;
	g_cmp_len = cmp_len;
	g_faults = 0;
	g_landed = 0;
	struct sigaction sa = {}, old = {};
	sa.sa_sigaction = on_segv;
	sa.sa_flags = SA_SIGINFO;
	sigaction(SIGSEGV, &sa, &old);
	mprotect(g_page, 4096, PROT_READ);
	copy(dst, src.data(), len);
	sigaction(SIGSEGV, &old, nullptr);
	Observed o;
	o.one_fault = g_faults == 1;
	o.landed = g_landed;
	o.whole = memcmp(dst, src.data(), len) == 0;
	munmap(m, map);
	return o;
}

struct Order {
	bool fault_seen = false;
	bool tail_first = false;
	bool whole = false;
};

// Copies len bytes with relaxed_copy into a target whose first page faults
// once, and reports whether its last kRelaxedChunk bytes had landed then.
Order copy_observed(size_t len, bool relaxed)
{
	Observed r = observe(len, 0, 0, len - loop::kRelaxedChunk, loop::kRelaxedChunk,
			     [relaxed](char *d, const char *s, size_t n) { relaxed_copy(d, s, n, relaxed); });
	return {r.one_fault, r.landed, r.whole};
}

// Copies len bytes with copy into a target whose last kOrderedTail bytes
// start a write-protected page; true when everything before them had
// landed at the first store into that page (and the copy is whole).
template <typename F> bool body_before_tail(size_t len, F copy)
{
	size_t head = len - loop::kOrderedTail;
	size_t lead = (head + 4095) / 4096 * 4096 - head;
	Observed r = observe(len, lead, head, 0, head, copy);
	return r.one_fault && r.landed && r.whole;
}

} // namespace

TEST(RelaxedCopy, ALargeRelaxedWritePlacesItsLastChunkBeforeItsFirstPage)
{
	Order o = copy_observed(1 << 20, true);
	EXPECT_TRUE(o.fault_seen);
	EXPECT_TRUE(o.tail_first) << "the last 16 KiB had not landed when the first page was written";
	EXPECT_TRUE(o.whole);
	o = copy_observed(loop::kRelaxedMinBytes, true); // The threshold itself
	EXPECT_TRUE(o.fault_seen);
	EXPECT_TRUE(o.tail_first);
	EXPECT_TRUE(o.whole);
}

// The controls: the same observation sees the tail land after the first
// page when the copy is in order, so the test above can fail.
TEST(RelaxedCopy, OrderedAndSmallWritesLandInAddressOrder)
{
	Order o = copy_observed(1 << 20, false);
	EXPECT_TRUE(o.fault_seen);
	EXPECT_FALSE(o.tail_first);
	EXPECT_TRUE(o.whole);
	o = copy_observed(loop::kRelaxedMinBytes - 4096, true); // Below the threshold
	EXPECT_TRUE(o.fault_seen);
	EXPECT_FALSE(o.tail_first);
	EXPECT_TRUE(o.whole);
}

// A WRITE without relaxed ordering stores its last bytes after all of the
// others, at every size: a poller that sees the last byte sees the whole
// message.  (glibc's memcpy on an AVX-512 machine does not, for 256 bytes
// to 2 KiB and for 256 KiB: it stores the end before parts of the body.)
TEST(OrderedCopy, TheLastBytesLandAfterAllOthers)
{
	for (size_t len : {65ul, 100ul, 128ul, 256ul, 512ul, 1000ul, 2048ul, 4096ul, 8192ul,
			   65536ul, 262144ul, 1048576ul}) {
		EXPECT_TRUE(body_before_tail(len, ordered_copy)) << len << " bytes";
		EXPECT_TRUE(body_before_tail(len, [](char *d, const char *s, size_t n) {
			relaxed_copy(d, s, n, false);
		})) << len << " bytes, relaxed_copy without relaxed ordering";
	}
}
