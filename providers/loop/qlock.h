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
#if defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>
#define QLOCK_TSAN(call) call
#else
#define QLOCK_TSAN(call) ((void)0)
#endif

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
	// Under ThreadSanitizer it is announced as a mutex (its atomics alone
	// would give the ordering, but not the lock-order and deadlock reports
	// TSan makes for mutexes).
	qlock()
	{
		QLOCK_TSAN(__tsan_mutex_create(this, __tsan_mutex_not_static));
	}
	~qlock()
	{
		QLOCK_TSAN(__tsan_mutex_destroy(this, __tsan_mutex_not_static));
	}
	qlock(const qlock &) = delete;
	qlock &operator=(const qlock &) = delete;

	void lock()
	{
		QLOCK_TSAN(__tsan_mutex_pre_lock(this, 0));
		uint32_t c = kFree;
		if (!s_.compare_exchange_strong(c, kHeld, std::memory_order_acquire,
						std::memory_order_relaxed)) [[unlikely]]
			contended();
		QLOCK_TSAN(__tsan_mutex_post_lock(this, 0, 0));
	}
	bool try_lock()
	{
		QLOCK_TSAN(__tsan_mutex_pre_lock(this, __tsan_mutex_try_lock));
		uint32_t c = kFree;
		bool ok = s_.compare_exchange_strong(c, kHeld, std::memory_order_acquire,
						     std::memory_order_relaxed);
		QLOCK_TSAN(__tsan_mutex_post_lock(
			this, ok ? __tsan_mutex_try_lock : __tsan_mutex_try_lock | __tsan_mutex_try_lock_failed,
			0));
		return ok;
	}
	void unlock()
	{
		QLOCK_TSAN(__tsan_mutex_pre_unlock(this, 0));
		if (s_.fetch_sub(1, std::memory_order_release) != kHeld) [[unlikely]]
			wake();
		QLOCK_TSAN(__tsan_mutex_post_unlock(this, 0));
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
