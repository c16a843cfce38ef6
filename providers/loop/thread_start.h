// SPDX-License-Identifier: MIT
// Starting the library's own threads (the service, engine, progress and
// RoCE v2 receive threads), each started lazily by the first verb that
// needs it.
#pragma once

#include <sched.h>

#include <atomic>
#include <memory>
#include <thread>

namespace loop {

// Runs fn on a new detached thread and returns once that thread runs our
// code: the thread's start (the C library's, and a sanitizer's, which
// allocate under their allocators' locks) is over by then.  An application
// that forks right after the verb that started the thread would otherwise
// copy into its child a lock that thread held, where nobody releases it
// (sv_open_qp under ASan hung in the child in 7 runs of 200 before the
// service thread waited so).  The wait is bounded: a thread that never gets
// a core is no reason to fail the verb.  Throws what std::thread throws.
inline void start_detached(void (*fn)())
{
	auto started = std::make_shared<std::atomic<bool>>(false);
	std::thread([fn, started] {
		started->store(true, std::memory_order_release);
		fn();
	}).detach();
	for (int i = 0; i < 100000 && !started->load(std::memory_order_acquire); i++)
		sched_yield();
}

} // namespace loop
