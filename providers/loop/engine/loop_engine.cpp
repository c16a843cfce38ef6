// SPDX-License-Identifier: MIT
// The engine thread: serves the doorbells of send queues that an agent
// drives (softverbs_dv_qp_agent).  One thread per process, started when the
// first QP is handed to an agent; with no agent it sleeps on a condition
// variable and costs nothing.  With agents it spins over their doorbell
// records for kEngineSpinNs after the last work it found, then sets each
// ring's `sleeping` word, looks once more, and sleeps on a futex over the
// doorbell record of the rings (futex_waitv, or the first ring's with a
// short timeout where that is refused): an agent wakes it only when the
// word says it sleeps.  futex_waitv takes 128 words: past 128 agent rings
// only the first 128 get the word, and the engine sleeps briefly
// (kEngineShortSleepNs) rather than until a doorbell.
// With SOFTVERBS_ENGINE=poll (for agents that cannot make a system call, a
// GPU) it never sleeps while agent rings exist and never sets `sleeping`:
// it spins over the doorbell records for as long as any ring is handed
// over, yielding the core at every pass (docs/agent.md gives the cost).
// Lock order: the engine lock, then a QP's sq_lock.
#include "c_boundary.h"
#include "loop.h"
#include "thread_start.h"
#include "loop_param.h"

#include <climits>
#include <condition_variable>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <thread>
#include <unistd.h>
#include <vector>

#ifndef SYS_futex_waitv
#define SYS_futex_waitv 449
#endif

namespace loop {

namespace {

struct agent_engine {
	std::mutex lock;
	std::condition_variable wake;
	std::vector<loop_qp *> qps;
	pid_t started_by = 0; // A forked child has the list but not the thread
	bool waitv_refused = false;
	bool poll = false; // SOFTVERBS_ENGINE=poll: never sleeps while qps is not empty
	bool held = false; // engine_hold: serves nothing until released
};

agent_engine &aeng()
{
	static agent_engine *e = new agent_engine; // Lives as long as the process
	return *e;
}

struct waitv_entry { // struct futex_waitv (Linux 5.16)
	uint64_t val;
	uint64_t uaddr;
	uint32_t flags;
	uint32_t reserved;
};

uint32_t *db_word(loop_qp *qp)
{
	return reinterpret_cast<uint32_t *>(&qp->sq->db_record); // Its low half
}

// One pass over every agent QP; returns whether any had work.
bool serve_all(agent_engine &e)
{
	bool work = false;
	for (loop_qp *qp : e.qps) {
		bool need_progress = false;
		try {
			work |= sq_serve_doorbell(qp, need_progress) > 0;
		} catch (abi::__forced_unwind &) {
			throw;
		} catch (...) {
			// Out of memory: the WQEs stay in the ring for the next pass.
		}
		if (need_progress)
			progress_add(qp);
	}
	return work;
}

// futex_waitv waits on at most 128 words.  With more agent rings than that
// the engine never sleeps long: the rings past the limit keep `sleeping`
// at 0 (their agents ring no futex) and are looked at again after a short
// sleep, kEngineShortSleepNs.
constexpr size_t kMaxWait = 128;

void sleep_on_doorbells(agent_engine &e, std::unique_lock<std::mutex> &g)
{
	waitv_entry w[kMaxWait]{};
	size_t n = 0;
	bool all_waited = e.qps.size() <= kMaxWait;
	for (size_t i = 0; i < e.qps.size() && i < kMaxWait; i++)
		std::atomic_ref<uint32_t>(e.qps[i]->sq->sleeping).store(1, std::memory_order_seq_cst);
	// Looked at again after the flag is up: an agent that rang before it
	// saw no sleeper, and its doorbell is seen here.
	bool work = false;
	for (loop_qp *qp : e.qps) {
		uint64_t db =
			std::atomic_ref<uint64_t>(qp->sq->db_record).load(std::memory_order_seq_cst);
		if (db != qp->sq_posted.load(std::memory_order_relaxed))
			work = true;
		if (n < kMaxWait) {
			w[n].val = static_cast<uint32_t>(db);
			w[n].uaddr = reinterpret_cast<uintptr_t>(db_word(qp));
			w[n].flags = 2; // FUTEX2_SIZE_U32
			n++;
		}
	}
	if (!work && n) {
		g.unlock();
		timespec ts{};
		if (!e.waitv_refused) {
			// Absolute: long when every ring can wake us, else short.
			clock_gettime(CLOCK_MONOTONIC, &ts);
			ts.tv_nsec += all_waited ? kEngineSleepNs : kEngineShortSleepNs;
			ts.tv_sec += ts.tv_nsec / 1000000000L;
			ts.tv_nsec %= 1000000000L;
			if (syscall(SYS_futex_waitv, w, n, 0, &ts, CLOCK_MONOTONIC) < 0 &&
			    (errno == ENOSYS || errno == EPERM))
				e.waitv_refused = true;
		} else {
			// One ring's futex, and a short sleep for the others.
			bool one = n == 1 && all_waited;
			long ns = one ? kEngineSleepNs : kEngineShortSleepNs;
			ts.tv_sec = ns / 1000000000L;
			ts.tv_nsec = ns % 1000000000L;
			syscall(SYS_futex, reinterpret_cast<uint32_t *>(w[0].uaddr), FUTEX_WAIT,
				static_cast<uint32_t>(w[0].val), &ts, nullptr, 0);
		}
		g.lock();
	}
	for (size_t i = 0; i < e.qps.size() && i < kMaxWait; i++)
		std::atomic_ref<uint32_t>(e.qps[i]->sq->sleeping).store(0, std::memory_order_relaxed);
}

void run()
{
	agent_engine &e = aeng();
	std::unique_lock<std::mutex> g(e.lock);
	uint64_t idle_since = 0;
	for (;;) {
		if (e.qps.empty() || e.held) {
			e.wake.wait(g);
			idle_since = 0;
			continue;
		}
		if (serve_all(e)) {
			idle_since = 0;
			continue;
		}
		uint64_t now = now_ns();
		if (!idle_since)
			idle_since = now;
		if (e.poll || now - idle_since < kEngineSpinNs) {
			// Let an agent on this core run, and destroy_qp take the lock.
			g.unlock();
			cpu_relax();
			sched_yield();
			g.lock();
			continue;
		}
		sleep_on_doorbells(e, g);
		idle_since = 0;
	}
}

} // namespace

int engine_add(loop_qp *qp)
{
	agent_engine &e = aeng();
	std::lock_guard<std::mutex> g(e.lock);
	// Every fabric of a process has the process's configuration.
	e.poll = qp->ctx->fab->cfg().engine == engine_mode::poll;
	try {
		e.qps.push_back(qp);
		if (e.started_by != getpid()) {
			start_detached(run);
			e.started_by = getpid();
		}
	} catch (abi::__forced_unwind &) {
		throw;
	} catch (...) {
		std::erase(e.qps, qp);
		return ENOMEM;
	}
	e.wake.notify_one();
	// An engine asleep on the other rings' doorbells looks at its list
	// again, and so at this ring (which it does not wait on yet).
	if (!e.poll && e.qps.size() > 1 && e.qps[0]->sq)
		syscall(SYS_futex, db_word(e.qps[0]), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
	return 0;
}

void engine_remove(loop_qp *qp)
{
	agent_engine &e = aeng();
	std::lock_guard<std::mutex> g(e.lock);
	std::erase(e.qps, qp);
	// A sleeping engine may be waiting on this ring: wake it, so that it
	// looks at its list again before the ring goes.
	if (!e.poll && qp->sq)
		syscall(SYS_futex, db_word(qp), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

void engine_hold(bool on)
{
	agent_engine &e = aeng();
	std::lock_guard<std::mutex> g(e.lock);
	e.held = on;
	// The engine serves only under the lock: once `held` is set it serves
	// nothing more (an engine asleep on the doorbells wakes, finds `held`
	// and waits on the condition variable, which the release notifies).
	if (!on)
		e.wake.notify_one();
}

} // namespace loop
