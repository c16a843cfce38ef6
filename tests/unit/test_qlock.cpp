// SPDX-License-Identifier: MIT
// qlock (providers/loop/qlock.h), the futex mutex of the hot path's queue
// locks: mutual exclusion under contention (a plain counter, which the tsan
// lane also watches), try_lock, and a waiter asleep on the futex woken by
// the unlock.
#include "qlock.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

namespace {

TEST(Qlock, ExcludesUnderContention)
{
	loop::qlock l;
	uint64_t count = 0; // Plain: only ever touched under l
	constexpr int kThreads = 4, kRounds = 200000;
	std::vector<std::thread> t;
	for (int i = 0; i < kThreads; i++)
		t.emplace_back([&] {
			for (int r = 0; r < kRounds; r++) {
				std::lock_guard<loop::qlock> g(l);
				uint64_t c = count;
				if ((r & 1023) == 0)
					std::this_thread::yield(); // Held across a yield now and then
				count = c + 1;
			}
		});
	for (auto &th : t)
		th.join();
	EXPECT_EQ(count, uint64_t{kThreads} * kRounds);
}

TEST(Qlock, TryLock)
{
	loop::qlock l;
	ASSERT_TRUE(l.try_lock());
	bool other = true;
	std::thread([&] { other = l.try_lock(); }).join();
	EXPECT_FALSE(other);
	l.unlock();
	std::thread([&] {
		other = l.try_lock();
		if (other)
			l.unlock();
	}).join();
	EXPECT_TRUE(other);
}

TEST(Qlock, SleeperWokenByUnlock)
{
	// On the heap: a waiter never woken is left behind (detached) with
	// them, and the test fails instead of hanging in join.
	auto *l = new loop::qlock;
	auto *stage = new std::atomic<int>{0};
	l->lock();
	std::thread w([l, stage] {
		stage->store(1);
		l->lock(); // Spins, then sleeps on the futex
		stage->store(2);
		l->unlock();
	});
	while (stage->load() != 1)
		std::this_thread::yield();
	// Long past the waiter's spin: it is asleep (or about to be).
	std::this_thread::sleep_for(std::chrono::milliseconds(50));
	EXPECT_EQ(stage->load(), 1);
	l->unlock();
	auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
	while (stage->load() != 2 && std::chrono::steady_clock::now() < end)
		std::this_thread::sleep_for(std::chrono::milliseconds(1));
	if (stage->load() != 2) {
		w.detach();
		FAIL() << "the waiter was not woken by the unlock";
	}
	w.join();
	// Free again, and unmarked: an uncontended lock and unlock.
	ASSERT_TRUE(l->try_lock());
	l->unlock();
	delete stage;
	delete l;
}

TEST(Qlock, SeveralSleepersAllWoken)
{
	// Three waiters asleep at once (long past their spin) while the lock
	// is held; each unlock must hand it on until all have had it.
	auto *l = new loop::qlock;
	auto *got = new std::atomic<int>{0};
	l->lock();
	std::vector<std::thread> t;
	for (int i = 0; i < 3; i++)
		t.emplace_back([l, got] {
			l->lock();
			got->fetch_add(1);
			std::this_thread::sleep_for(std::chrono::milliseconds(5));
			l->unlock();
		});
	std::this_thread::sleep_for(std::chrono::milliseconds(100));
	EXPECT_EQ(got->load(), 0);
	l->unlock();
	auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
	while (got->load() != 3 && std::chrono::steady_clock::now() < end)
		std::this_thread::sleep_for(std::chrono::milliseconds(1));
	if (got->load() != 3) {
		for (auto &th : t)
			th.detach();
		FAIL() << got->load() << " of 3 sleepers had the lock";
	}
	for (auto &th : t)
		th.join();
	ASSERT_TRUE(l->try_lock());
	l->unlock();
	delete got;
	delete l;
}

} // namespace
