// SPDX-License-Identifier: MIT
// The lock of a queue's hot path: a QP's sq_lock and rq_lock, a CQ's poll
// lock, an SRQ's post lock.  Every ibv_post_send, ibv_post_recv and
// ibv_poll_cq takes one, almost always uncontended, and std::mutex's
// pthread_mutex_lock and unlock cost about 55 instructions a pair in calls
// into glibc (docs/PERFORMANCE.md): here the uncontended lock and unlock
// are one atomic instruction each, inline.  A futex mutex of three states
// (Drepper, "Futexes Are Tricky", mutex 3): a waiter spins a little, as the
// holder is most likely on another core for a few hundred nanoseconds,
// then sleeps on the futex.  Process-private (FUTEX_*_PRIVATE), not
// recursive, and, like std::mutex, no cancellation point.  Lockable:
// std::lock_guard, std::unique_lock and try_lock work as with std::mutex.
#pragma once

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace loop {

inline void cpu_relax()
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	asm volatile("yield");
#endif
}

class qlock {
public:
	qlock() = default;
	qlock(const qlock &) = delete;
	qlock &operator=(const qlock &) = delete;

	void lock()
	{
		uint32_t c = kFree;
		if (!s_.compare_exchange_strong(c, kHeld, std::memory_order_acquire,
						std::memory_order_relaxed)) [[unlikely]]
			contended();
	}
	bool try_lock()
	{
		uint32_t c = kFree;
		return s_.compare_exchange_strong(c, kHeld, std::memory_order_acquire,
						  std::memory_order_relaxed);
	}
	void unlock()
	{
		if (s_.fetch_sub(1, std::memory_order_release) != kHeld) [[unlikely]]
			wake();
	}

private:
	static constexpr uint32_t kFree = 0, kHeld = 1, kSleepers = 2; // kHeld, maybe sleepers
	static constexpr int kSpins = 128;
	std::atomic<uint32_t> s_{kFree};

	uint32_t *word()
	{
		static_assert(sizeof(s_) == sizeof(uint32_t));
		return reinterpret_cast<uint32_t *>(&s_);
	}
	[[gnu::noinline]] void contended()
	{
		for (int i = 0; i < kSpins; i++) {
			cpu_relax();
			uint32_t c = kFree;
			if (s_.load(std::memory_order_relaxed) == kFree &&
			    s_.compare_exchange_weak(c, kHeld, std::memory_order_acquire,
						     std::memory_order_relaxed))
				return;
		}
		// Marked as having sleepers from here on: the unlock that frees it
		// wakes one, and a woken waiter takes it marked again (it cannot
		// know whether others still sleep).  errno is the caller's, as
		// across std::mutex (FUTEX_WAIT may end in EAGAIN or EINTR).
		int e = errno;
		while (s_.exchange(kSleepers, std::memory_order_acquire) != kFree)
			syscall(SYS_futex, word(), FUTEX_WAIT_PRIVATE, kSleepers, nullptr, nullptr, 0);
		errno = e;
	}
	[[gnu::noinline]] void wake()
	{
		int e = errno;
		s_.store(kFree, std::memory_order_release);
		syscall(SYS_futex, word(), FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr, 0);
		errno = e;
	}
};

} // namespace loop
