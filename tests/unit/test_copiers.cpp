// SPDX-License-Identifier: MIT
// The copy holds of providers/loop/mr_copiers.h, against the record's
// registrations: what the owner's dereg or rereg waits for (mr_copy_wait)
// is the count under the cookie in force, and no copier of another
// registration may change it.
#include "mr_copiers.h"

#include <gtest/gtest.h>

namespace {

// A registration as mr_new_cookie publishes it (loop_mr.cpp): the count
// starts at 0 under its cookie, before the state says VALID.
void publish(sv_mr_rec &m, uint32_t cookie)
{
	m.cookie = cookie;
	m.copiers = static_cast<uint64_t>(cookie) << 32;
	m.state = SV_MR_VALID;
}

uint32_t count_under(const sv_mr_rec &m, uint32_t cookie)
{
	return static_cast<uint32_t>(m.copiers >> 32) == cookie ? static_cast<uint32_t>(m.copiers)
								 : 0;
}

TEST(Copiers, HoldCountsAndReleaseDrops)
{
	sv_mr_rec m{};
	publish(m, 0xc1);
	ASSERT_TRUE(loop::mr_copy_hold(&m, 0xc1));
	ASSERT_TRUE(loop::mr_copy_hold(&m, 0xc1));
	EXPECT_EQ(count_under(m, 0xc1), 2u);
	loop::mr_copy_release(&m, 0xc1);
	loop::mr_copy_release(&m, 0xc1);
	EXPECT_EQ(count_under(m, 0xc1), 0u);
	loop::mr_copy_release(&m, 0xc1); // Never below 0
	EXPECT_EQ(count_under(m, 0xc1), 0u);
}

TEST(Copiers, OutOfServiceHoldsNothing)
{
	sv_mr_rec m{};
	publish(m, 0xc1);
	m.state = SV_MR_INVALID; // The owner's dereg began
	EXPECT_FALSE(loop::mr_copy_hold(&m, 0xc1));
	EXPECT_EQ(count_under(m, 0xc1), 0u);
}

// A review's interleaving: after a rereg (cookie C1 -> C2) copier B holds
// under C2 and copies; copier A, which resolved the key before the rereg,
// then asks for a hold under C1.  A must get none and leave B's count as it
// is, or the owner's next dereg would not wait for B.  (The first version
// took the word over for C1 and wiped B's count.)
TEST(Copiers, AStaleCopierNeverTouchesTheCurrentCount)
{
	sv_mr_rec m{};
	publish(m, 0xc1);
	m.state = SV_MR_INVALID; // rereg: out of service, ...
	publish(m, 0xc2);	 // ... a new cookie, back
	ASSERT_TRUE(loop::mr_copy_hold(&m, 0xc2)); // B
	EXPECT_FALSE(loop::mr_copy_hold(&m, 0xc1)); // A
	loop::mr_copy_release(&m, 0xc1);	      // A's stray release
	EXPECT_EQ(count_under(m, 0xc2), 1u) << "the owner would not wait for B's copy";
	loop::mr_copy_release(&m, 0xc2);
	EXPECT_EQ(count_under(m, 0xc2), 0u);
}

// A copier killed inside its copy leaves a count: the slot's next
// registration starts afresh, and holds work under it.
TEST(Copiers, ALeftCountGoesWithTheNextRegistration)
{
	sv_mr_rec m{};
	publish(m, 0xc1);
	ASSERT_TRUE(loop::mr_copy_hold(&m, 0xc1)); // Never released
	m.state = SV_MR_FREE;
	publish(m, 0xc3);
	EXPECT_EQ(count_under(m, 0xc3), 0u);
	EXPECT_TRUE(loop::mr_copy_hold(&m, 0xc3));
	loop::mr_copy_release(&m, 0xc1); // The dead copier's, never: no effect
	EXPECT_EQ(count_under(m, 0xc3), 1u);
}

TEST(Copiers, GuardReleasesOnScopeExit)
{
	sv_mr_rec m{};
	publish(m, 0xc1);
	{
		loop::mr_copy_guard g;
		ASSERT_TRUE(g.take(&m, 0xc1));
		EXPECT_EQ(count_under(m, 0xc1), 1u);
	}
	EXPECT_EQ(count_under(m, 0xc1), 0u);
}

} // namespace
