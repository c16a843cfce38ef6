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

char *g_page;			   // The protected first page of the target
const char *g_tail_dst, *g_tail_src; // The last kRelaxedChunk bytes, target and source
volatile sig_atomic_t g_faults, g_tail_landed;

void on_segv(int, siginfo_t *si, void *)
{
	char *a = static_cast<char *>(si->si_addr);
	if (a < g_page || a >= g_page + 4096)
		_exit(70); // Not the fault this test set up
	g_faults = g_faults + 1;
	g_tail_landed = memcmp(g_tail_dst, g_tail_src, loop::kRelaxedChunk) == 0;
	mprotect(g_page, 4096, PROT_READ | PROT_WRITE);
}

struct Order {
	bool fault_seen = false;
	bool tail_first = false;
	bool whole = false;
};

// Copies len bytes with relaxed_copy into a target whose first page faults
// once, and reports what had landed at that fault.
Order copy_observed(size_t len, bool relaxed)
{
	size_t map = (len + 4095) & ~size_t{4095};
	auto *dst = static_cast<char *>(
		mmap(nullptr, map, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
	EXPECT_NE(dst, MAP_FAILED);
	std::vector<char> src(len);
	for (size_t i = 0; i < len; i++)
		src[i] = static_cast<char>(i * 7 + 1);
	memset(dst, 0, map); // Every byte differs from the source's at first
	g_page = dst;
	g_tail_dst = dst + len - loop::kRelaxedChunk;
	g_tail_src = src.data() + len - loop::kRelaxedChunk;
	g_faults = 0;
	g_tail_landed = 0;
	struct sigaction sa = {}, old = {};
	sa.sa_sigaction = on_segv;
	sa.sa_flags = SA_SIGINFO;
	sigaction(SIGSEGV, &sa, &old);
	mprotect(dst, 4096, PROT_READ);
	relaxed_copy(dst, src.data(), len, relaxed);
	sigaction(SIGSEGV, &old, nullptr);
	Order o;
	o.fault_seen = g_faults == 1;
	o.tail_first = g_tail_landed;
	o.whole = memcmp(dst, src.data(), len) == 0;
	munmap(dst, map);
	return o;
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

namespace {

char *g_tail_page;    // The protected page, which holds the last kOrderedTail bytes
const char *g_body_dst, *g_body_src;
size_t g_body_len;
volatile sig_atomic_t g_tail_faults, g_body_landed;

void on_tail_segv(int, siginfo_t *si, void *)
{
	char *a = static_cast<char *>(si->si_addr);
	if (a < g_tail_page || a >= g_tail_page + 4096)
		_exit(71);
	g_tail_faults = g_tail_faults + 1;
	g_body_landed = memcmp(g_body_dst, g_body_src, g_body_len) == 0;
	mprotect(g_tail_page, 4096, PROT_READ | PROT_WRITE);
}

// Copies len bytes with copy into a target whose last kOrderedTail bytes
// start a write-protected page; true when everything before them had
// landed at the first store into that page (and the copy is whole).
template <typename F> bool body_before_tail(size_t len, F copy)
{
	size_t head = len - loop::kOrderedTail;
	size_t pages = (head + 4095) / 4096;
	size_t map = (pages + 2) * 4096;
	auto *m = static_cast<char *>(
		mmap(nullptr, map, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
	EXPECT_NE(m, MAP_FAILED);
	memset(m, 0, map);
	char *dst = m + pages * 4096 - head;
	std::vector<char> src(len);
	for (size_t i = 0; i < len; i++)
		src[i] = static_cast<char>(i * 7 + 1);
	g_tail_page = m + pages * 4096;
	g_body_dst = dst;
	g_body_src = src.data();
	g_body_len = head;
	g_tail_faults = 0;
	g_body_landed = 0;
	struct sigaction sa = {}, old = {};
	sa.sa_sigaction = on_tail_segv;
	sa.sa_flags = SA_SIGINFO;
	sigaction(SIGSEGV, &sa, &old);
	mprotect(g_tail_page, 4096, PROT_READ);
	copy(dst, src.data(), len);
	sigaction(SIGSEGV, &old, nullptr);
	bool ok = g_tail_faults == 1 && g_body_landed && memcmp(dst, src.data(), len) == 0;
	munmap(m, map);
	return ok;
}

} // namespace

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
