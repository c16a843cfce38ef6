// SPDX-License-Identifier: MIT
// The progress engine: one thread per process, started on first need, that
// retries WRs waiting in QP backlogs (RNR waits, unreachable peers) when
// their timers expire.  Lock order: the progress lock, then a QP's sq_lock.
#include "c_boundary.h"
#include "loop.h"
#include "thread_start.h"

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <set>
#include <system_error>
#include <thread>
#include <unistd.h>

namespace loop {

namespace {

struct engine {
	std::mutex lock;
	std::condition_variable wake;
	std::set<loop_qp *> qps;
	pid_t started_by = 0; // A forked child has the engine but not its thread
};

engine &eng()
{
	static engine *e = new engine; // Lives as long as the process: the thread uses it
	return *e;
}

void run()
{
	engine &e = eng();
	std::unique_lock<std::mutex> g(e.lock);
	for (;;) {
		uint64_t next = 0;
		for (auto it = e.qps.begin(); it != e.qps.end();) {
			loop_qp *qp = *it;
			uint64_t t;
			try {
				t = qp_run_backlog(qp);
			} catch (abi::__forced_unwind &) {
				throw;
			} catch (...) {
				// Out of memory: the WRs stay in the backlog; try again
				// soon rather than end the process.
				t = now_ns() + kProgressRetryNs;
			}
			if (!t) {
				qp->in_progress_list = false;
				it = e.qps.erase(it);
				continue;
			}
			next = next ? std::min(next, t) : t;
			++it;
		}
		if (!next) {
			e.wake.wait(g);
			continue;
		}
		uint64_t now = now_ns();
		if (next > now)
			e.wake.wait_for(g, std::chrono::nanoseconds(next - now));
	}
}

} // namespace

// Called by post_send after its WRs are posted: it must not fail them.
// When memory or threads run out, the QP is not listed and its backlog
// waits for the next post that lists it (c_boundary.h: nothing throws out).
void progress_add(loop_qp *qp)
{
	engine &e = eng();
	std::lock_guard<std::mutex> g(e.lock);
	// A QP another thread is destroying (its post raced ibv_destroy_qp):
	// not listed again after the destroy's progress_remove, which takes
	// e.lock after the QP left the live state (loop_destroy_qp).
	if (!qp->life.is(kLifeQp))
		return;
	try {
		if (e.started_by != getpid()) {
			start_detached(run);
			e.started_by = getpid();
		}
		e.qps.insert(qp);
	} catch (abi::__forced_unwind &) {
		throw;
	} catch (const std::system_error &ex) {
		// No thread (RLIMIT_NPROC, or memory): said once, as the WRs of
		// this QP that wait for a timer now wait for its next post.
		static std::atomic<bool> said{false};
		if (!said.exchange(true))
			fprintf(stderr,
				"softverbs: cannot start the progress thread (%s): a WR that waits "
				"for an RNR or retry timer is retried only at the next "
				"ibv_post_send on its QP\n",
				ex.what());
		return;
	} catch (...) {
		return;
	}
	qp->in_progress_list = true;
	e.wake.notify_one();
}

void progress_remove(loop_qp *qp)
{
	engine &e = eng();
	std::lock_guard<std::mutex> g(e.lock);
	e.qps.erase(qp);
	qp->in_progress_list = false;
}

void progress_kick()
{
	eng().wake.notify_all();
}

} // namespace loop
