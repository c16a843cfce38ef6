// SPDX-License-Identifier: MIT
// The copy path for kernels that refuse cross-memory attach: each process
// has a service segment and a thread that copies between its own registered
// memory and the segment's bounce buffer on behalf of peers.  The protocol
// is at sv_svc_ring in kernel-abi/softverbs-abi.h.
#include "service.h"

#include "loop.h"
#include "queue_geom.h"
#include "xfer.h"

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <linux/futex.h>
#include <mutex>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/syscall.h>
#include <thread>
#include <unistd.h>
#include <vector>

namespace loop {

namespace {


long futex(uint32_t *word, int op, uint32_t val, const timespec *ts)
{
	return syscall(SYS_futex, word, op, val, ts, nullptr, 0);
}

std::atomic_ref<uint32_t> word(uint32_t &w)
{
	return std::atomic_ref<uint32_t>(w);
}


struct service {
	fabric *fab = nullptr;
	uint32_t lease = 0;
	obj_ref ref;
	sv_svc_ring *ring = nullptr;
	std::vector<uint32_t> my_mrs; // Cache of MR slots this process owns
	std::atomic<bool> stop{false};
	std::atomic<bool> started{false}; // The thread runs our code (service_start waits)
	pthread_t thread{};
	bool running = false; // thread is ours to join (not a forked parent's)
};

// One per process, reused across start and stop: service_xfer() and
// service_note() read fab and lease without the lock, so the object itself
// never goes away.
service *g_service;
pid_t g_service_pid; // A forked child has the pointer but not the thread
std::mutex g_service_lock;

// Whether the record m, valid, is this lease's plain MR and holds [addr,
// addr + len) (with local write for a write).  Read as loop_mr.cpp's
// snapshot() reads a record, a sequence lock over state and cookie: a
// rereg (or a dereg and a new registration in the slot) by the
// application's threads while this one looks takes the record out of
// service first and draws a new cookie, so fields read between two equal
// looks at both are one registration's, never an address of one and a
// length of another.
bool covered(const sv_mr_rec &m, uint32_t lease, uint64_t addr, uint64_t len, bool write)
{
	auto u32 = [](const uint32_t &f) {
		return std::atomic_ref<const uint32_t>(f).load(std::memory_order_relaxed);
	};
	auto u64 = [](const uint64_t &f) {
		return std::atomic_ref<const uint64_t>(f).load(std::memory_order_relaxed);
	};
	if (std::atomic_ref<const uint32_t>(m.state).load(std::memory_order_acquire) != SV_MR_VALID)
		return false;
	uint32_t cookie = std::atomic_ref<const uint32_t>(m.cookie).load(std::memory_order_acquire);
	uint32_t owner = u32(m.owner_lease), kind = u32(m.kind), access = u32(m.access);
	uint64_t base = u64(m.addr), length = u64(m.length);
	std::atomic_thread_fence(std::memory_order_acquire);
	if (u32(m.state) != SV_MR_VALID || u32(m.cookie) != cookie)
		return false; // Changed meanwhile: the caller looks again or refuses
	return owner == lease && kind == SV_MR_KIND_MR && (!write || (access & IBV_ACCESS_LOCAL_WRITE)) &&
	       addr >= base && len <= length && addr - base <= length - len;
}

// Whether [addr, addr + len) of this process lies inside one of its MRs:
// a peer asked for it, so the peer's word is not taken for it.
bool registered(service &s, uint64_t addr, uint64_t len, bool write)
{
	sv_registry *r = s.fab->reg();
	for (uint32_t slot : s.my_mrs)
		if (covered(r->mrs[slot], s.lease, addr, len, write))
			return true;
	s.my_mrs.clear();
	bool found = false;
	for (uint32_t i = 1; i < SV_MAX_MRS; i++) {
		const sv_mr_rec &m = r->mrs[i];
		// The state first, with acquire, as covered() reads it: this
		// thread scans while the application's threads register (a
		// record being filled reads as free until its state is stored
		// after its fields), and a plain load of a word that others
		// store atomically is a data race (the TSan run of the service
		// path's tests named this scan).
		if (std::atomic_ref<const uint32_t>(m.state).load(std::memory_order_acquire) ==
			    SV_MR_FREE ||
		    std::atomic_ref<const uint32_t>(m.owner_lease).load(std::memory_order_relaxed) !=
			    s.lease)
			continue;
		s.my_mrs.push_back(i);
		found = found || covered(m, s.lease, addr, len, write);
	}
	return found;
}

// SOFTVERBS_TEST_SERVICE_STALL_MS: the service thread sleeps that long
// after it claims each request, as one stopped there would (the tests of
// the give-up; docs/configuration.md).  0 when unset.
uint64_t test_stall_ms()
{
	static const uint64_t ms = [] {
		const char *v = getenv("SOFTVERBS_TEST_SERVICE_STALL_MS");
		return v ? strtoull(v, nullptr, 10) : 0ULL;
	}();
	return ms;
}

void serve(service *s)
{
	sv_svc_ring *r = s->ring;
	for (;;) {
		if (s->stop.load(std::memory_order_acquire))
			return;
		uint32_t st = word(r->state).load(std::memory_order_acquire);
		if ((st == SV_SVC_SERVING || st == SV_SVC_ABANDONED) &&
		    word(r->state).compare_exchange_strong(st, SV_SVC_IDLE, std::memory_order_relaxed)) {
			// Only this thread claims, and it holds nothing here: an
			// outside writer's SERVING, which requesters would wait out
			// forever, 10 s a request.  Freed, and they are told.
			futex(&r->state, FUTEX_WAKE, INT_MAX, nullptr);
			continue;
		}
		if (st != SV_SVC_POSTED) {
			// Bounded: a stop request's wake-up may come just before
			// the wait, and the state word is the peers', not ours.
			timespec ts{0, kServiceStopPollNs};
			futex(&r->state, FUTEX_WAIT, st, &ts);
			continue;
		}
		// Claimed first: a requester that gives up withdraws a request
		// still POSTED (and it never runs), and leaves one SERVING alone,
		// so that nobody rewrites req or bounce under this copy.
		if (!word(r->state).compare_exchange_strong(st, SV_SVC_SERVING,
							    std::memory_order_acquire))
			continue;
		uint64_t addr = r->addr, len = r->len;
		uint32_t op = r->op;
		int status = 0;
		if (uint64_t ms = test_stall_ms()) [[unlikely]] {
			timespec ts{static_cast<time_t>(ms / 1000), static_cast<long>(ms % 1000) * 1000000};
			nanosleep(&ts, nullptr);
		}
		if (len > SV_SVC_BOUNCE || (op != SV_SVC_WRITE && op != SV_SVC_READ) ||
		    !registered(*s, addr, len, op == SV_SVC_WRITE)) {
			status = EFAULT;
		} else if (word(r->state).load(std::memory_order_acquire) == SV_SVC_ABANDONED) {
			// Its requester gave up (this thread was stopped or stuck
			// since the claim) and completed the message's receive in
			// error: the application may have that buffer back, so no
			// byte goes into it now.
			status = ECANCELED;
		} else {
			// Through the kernel even here: a registered range may have been
			// unmapped by the application (ODP), which must not crash us.
			iovec mine{reinterpret_cast<void *>(addr), len};
			iovec buf{r->bounce, len};
			// A WRITE's last kOrderedTail bytes in an iovec of their own,
			// copied after the rest (ordered_copy, xfer.h).
			iovec parts[2] = {mine, {}};
			int nparts = 1;
			if (op == SV_SVC_WRITE && len > kOrderedTail) {
				parts[0].iov_len = len - kOrderedTail;
				parts[1] = {reinterpret_cast<void *>(addr + len - kOrderedTail), kOrderedTail};
				nparts = 2;
			}
			ssize_t n = op == SV_SVC_WRITE
					    ? process_vm_writev(getpid(), &buf, 1, parts, nparts, 0)
					    : process_vm_readv(getpid(), &buf, 1, &mine, 1, 0);
			if (n < 0 && errno == EPERM) {
				// Even our own pid refused: the data is ours to touch.
				if (op == SV_SVC_WRITE)
					ordered_copy(static_cast<char *>(mine.iov_base),
						     static_cast<const char *>(buf.iov_base), len);
				else
					memcpy(buf.iov_base, mine.iov_base, len);
				n = static_cast<ssize_t>(len);
			}
			status = n == static_cast<ssize_t>(len) ? 0 : EFAULT;
		}
		r->status = static_cast<uint32_t>(status);
		word(r->state).store(SV_SVC_DONE, std::memory_order_release);
		futex(&r->state, FUTEX_WAKE, INT_MAX, nullptr);
	}
}

bool forced()
{
	static const bool f = [] {
		const char *s = getenv("SOFTVERBS_CMA");
		return s && strcmp(s, "0") == 0;
	}();
	return f;
}

// Frees the ring for the next request: IDLE, unless the service holds a
// request (SERVING: it was stopped in the middle of one a requester gave
// up on), which it finishes with DONE, and the next requester waits out.
void release_state(sv_svc_ring *r)
{
	uint32_t s = word(r->state).load(std::memory_order_acquire);
	while (s != SV_SVC_SERVING && s != SV_SVC_ABANDONED &&
	       !word(r->state).compare_exchange_weak(s, SV_SVC_IDLE, std::memory_order_acq_rel))
		;
}

// The clock of a wait on a peer's service: the peer's lease looked at
// every kPeerTimeoutNs, the wait given up on a live peer after
// kServiceGiveUpNs.
struct peer_clock {
	fabric &fab;
	uint32_t lease, gen;
	uint64_t first = now_ns(), start = first;
	// 0 to wait on, ESRCH (the peer is gone) or ETIMEDOUT.
	int check()
	{
		uint64_t now = now_ns();
		if (now - start <= kPeerTimeoutNs)
			return 0;
		if (!fab.lease_alive(lease, gen))
			return ESRCH;
		if (now - first > kServiceGiveUpNs)
			return ETIMEDOUT;
		start = now;
		return 0;
	}
};

// Takes the requesters' lock of a peer's ring; a dead holder's is taken
// over.  Returns 0, ESRCH when the peer is gone, or ETIMEDOUT when a live
// holder kept it for kServiceGiveUpNs (it may itself wait that long twice
// on a stopped peer: out a request the service holds, then for its own).
// Never ESRCH for a live peer: a responder takes that for a dead receiver
// and lets the requester retry, which would take another receive WQE.
int lock_ring(fabric &fab, uint32_t peer_lease, uint32_t peer_gen, sv_svc_ring *r)
{
	auto me = static_cast<uint32_t>(getpid());
	peer_clock clock{fab, peer_lease, peer_gen};
	for (;;) {
		uint32_t holder = 0;
		if (word(r->lock).compare_exchange_weak(holder, me, std::memory_order_acquire))
			return 0;
		if (holder && kill(static_cast<pid_t>(holder), 0) < 0 && errno == ESRCH &&
		    word(r->lock).compare_exchange_strong(holder, me, std::memory_order_acquire)) {
			release_state(r); // Its request withdrawn, unless being served
			return 0;
		}
		if (int e = clock.check())
			return e;
		sched_yield();
	}
}

// Waits while the ring's state is busy or also (the service's work in
// progress): spins, then sleeps on the futex (peer_clock's looks and
// give-up).  Returns 0 with st the state that ended the wait, ESRCH when
// the peer is gone, or ETIMEDOUT when it lives but has not moved the state
// for kServiceGiveUpNs (stopped, or stuck).
int wait_state(fabric &fab, uint32_t peer_lease, uint32_t peer_gen, sv_svc_ring *r,
	       uint32_t busy, uint32_t also, uint32_t &st)
{
	peer_clock clock{fab, peer_lease, peer_gen};
	for (int i = 0;; i++) {
		st = word(r->state).load(std::memory_order_acquire);
		if (st != busy && st != also)
			return 0;
		if (i < kServiceSpinIters)
			continue;
		timespec ts{0, kServiceWaitNs}; // Then look again
		futex(&r->state, FUTEX_WAIT, st, &ts);
		if (int e = clock.check())
			return e;
	}
}

// One request, synchronous, on a ring no earlier request holds.  Returns
// 0, or ESRCH when the peer stopped answering, or ETIMEDOUT when it lives
// but did not serve the request in kServiceGiveUpNs (withdrawn: nothing
// moved; or held by the service, which may still move it), or the
// service's status.
int call(fabric &fab, uint32_t peer_lease, uint32_t peer_gen, sv_svc_ring *r, uint32_t op,
	 uint64_t addr, uint64_t len)
{
	r->op = op;
	r->addr = addr;
	r->len = len;
	r->status = 0;
	word(r->state).store(SV_SVC_POSTED, std::memory_order_release);
	futex(&r->state, FUTEX_WAKE, INT_MAX, nullptr);
	uint32_t st;
	int err = wait_state(fab, peer_lease, peer_gen, r, SV_SVC_POSTED, SV_SVC_SERVING, st);
	if (err == ETIMEDOUT) {
		st = SV_SVC_POSTED;
		if (word(r->state).compare_exchange_strong(st, SV_SVC_IDLE,
							   std::memory_order_acq_rel))
			return ETIMEDOUT; // Withdrawn: the service will not run it
		// Running: the ring stays the service's, told that nobody
		// waits for it any more (it moves nothing it has not moved).
		if (st == SV_SVC_SERVING &&
		    word(r->state).compare_exchange_strong(st, SV_SVC_ABANDONED,
							   std::memory_order_acq_rel))
			return ETIMEDOUT;
		std::atomic_thread_fence(std::memory_order_acquire);
		err = 0; // Finished just now: its answer below
	}
	if (err)
		return err;
	if (st != SV_SVC_DONE)
		return EIO; // Someone else wrote the state word: the request is lost
	// The status is the peer's word: only the answers a service gives.
	uint32_t status = r->status;
	return status == 0 || status == EFAULT ? static_cast<int>(status) : EIO;
}

void *serve_thread(void *arg)
{
	auto *s = static_cast<service *>(arg);
	s->started.store(true, std::memory_order_release);
	serve(s);
	return nullptr;
}

} // namespace

int service_start(fabric &fab, uint32_t lease)
{
	std::lock_guard<std::mutex> g(g_service_lock);
	if (g_service && g_service_pid == getpid() && g_service->running)
		return 0;
	if (!g_service)
		g_service = new service;
	service *s = g_service;
	if (g_service_pid != getpid()) {
		// A forked child: the parent's thread is not here and its segment
		// is the parent's to remove.  Start afresh.
		s->running = false;
		s->ring = nullptr;
		s->my_mrs.clear();
	}
	g_service_pid = getpid();
	s->fab = &fab;
	s->lease = lease;
	s->stop.store(false, std::memory_order_relaxed);
	void *map = queue_create(fab, static_cast<int>(lease), SV_OBJ_SVC, 1, 64,
				 static_cast<uint32_t>(sizeof(sv_svc_ring)), 0, s->ref);
	if (!map)
		return errno;
	s->ring = static_cast<sv_svc_ring *>(map);
	s->started.store(false, std::memory_order_relaxed);
	if (int e = pthread_create(&s->thread, nullptr, serve_thread, s)) {
		queue_destroy(fab, s->ref, map);
		s->ring = nullptr;
		return e;
	}
	// Returns once the thread runs our code: its start (the C library's,
	// and a sanitizer's, which allocate under their allocator's lock) is
	// over.  A fork() by the application right after ibv_open_device
	// would otherwise copy a lock that thread holds into the child, where
	// nobody releases it (sv_open_qp under ASan: 7 runs in 200 hung in
	// the child's first thread start; none in 400 with this wait).
	// Bounded: a thread that never runs is no reason to fail the open.
	for (int i = 0; i < 100000 && !s->started.load(std::memory_order_acquire); i++)
		sched_yield();
	s->running = true;
	registry_guard rg(fab);
	sv_lease &l = fab.reg()->leases[lease];
	l.svc_obj = s->ref.slot;
	l.svc_gen = s->ref.gen;
	return 0;
}

void service_stop()
{
	std::lock_guard<std::mutex> g(g_service_lock);
	service *s = g_service;
	if (!s || g_service_pid != getpid() || !s->running)
		return;
	s->stop.store(true, std::memory_order_release);
	futex(&s->ring->state, FUTEX_WAKE, INT_MAX, nullptr);
	pthread_join(s->thread, nullptr);
	s->running = false;
	{
		registry_guard rg(*s->fab);
		sv_lease &l = s->fab->reg()->leases[s->lease];
		if (l.svc_obj == s->ref.slot && l.svc_gen == s->ref.gen) {
			l.svc_obj = 0;
			l.svc_gen = 0;
		}
	}
	// Unlinked and unmapped: a peer that still has it mapped keeps its own
	// mapping, and finds this process's lease gone when its wait times out.
	queue_destroy(*s->fab, s->ref, s->ring);
	s->ring = nullptr;
	s->my_mrs.clear();
}

bool service_forced()
{
	return forced();
}

void note_path(fabric &fab, uint32_t lease, uint32_t flag)
{
	if (lease >= SV_MAX_PROCS)
		return;
	std::atomic_ref<uint32_t> f(fab.reg()->leases[lease].flags);
	if ((f.load(std::memory_order_relaxed) & flag) != flag)
		f.fetch_or(flag, std::memory_order_relaxed);
}

void service_note(uint32_t flag)
{
	if (g_service)
		note_path(*g_service->fab, g_service->lease, flag);
}

int service_xfer(pid_t pid, const iovec *local, int nl, const iovec *remote, int nr,
		 xfer_dir dir)
{
	fabric *fab = g_service ? g_service->fab : nullptr;
	if (!fab)
		return EPERM;
	// The peer's lease, and through it its service segment.
	sv_registry *reg = fab->reg();
	uint32_t lease = SV_MAX_PROCS;
	for (uint32_t i = 0; i < SV_MAX_PROCS; i++)
		if (reg->leases[i].pid == static_cast<uint32_t>(pid)) {
			lease = i;
			break;
		}
	if (lease == SV_MAX_PROCS)
		return ESRCH;
	sv_lease l = reg->leases[lease];
	if (!l.svc_gen)
		return EPERM;
	queue_hold h = queue_map(*fab, {l.svc_obj, l.svc_gen}, SV_OBJ_SVC);
	auto *r = h.as<sv_svc_ring>();
	// The size mapped, as checked at mapping (not the header's seg_size,
	// which the peer may have rewritten since).
	queue_geom g;
	if (!r || !queue_geometry(r, g) || g.size < offsetof(sv_svc_ring, bounce) + SV_SVC_BOUNCE)
		return ESRCH;
	note_path(*fab, g_service->lease, SV_LEASE_SERVICE_USED);
	if (int e = lock_ring(*fab, lease, l.generation, r))
		return e;
	// A request an earlier requester gave up on, still in the service's
	// hands: req and bounce are its until it is done.
	uint32_t st;
	int err = wait_state(*fab, lease, l.generation, r, SV_SVC_SERVING, SV_SVC_ABANDONED, st);
	// Walk both lists; each request covers part of one remote iovec.
	int li = 0;
	size_t lo = 0;
	for (int ri = 0; ri < nr && !err; ri++) {
		char *rbase = static_cast<char *>(remote[ri].iov_base);
		size_t rlen = remote[ri].iov_len;
		// Adjacent remote iovecs go as one request: a WRITE's last
		// kOrderedTail bytes come in an iovec of their own (add_pieces),
		// and the service thread stores them last itself.
		while (ri + 1 < nr && static_cast<char *>(remote[ri + 1].iov_base) == rbase + rlen)
			rlen += remote[++ri].iov_len;
		for (size_t ro = 0; ro < rlen && !err;) {
			size_t chunk = std::min<size_t>(rlen - ro, SV_SVC_BOUNCE);
			if (dir == xfer_dir::to_peer) {
				// Gather the chunk from the local list into the bounce buffer.
				size_t got = 0;
				while (got < chunk && li < nl) {
					size_t n = std::min(chunk - got, local[li].iov_len - lo);
					memcpy(r->bounce + got, static_cast<char *>(local[li].iov_base) + lo, n);
					got += n;
					lo += n;
					if (lo == local[li].iov_len) {
						li++;
						lo = 0;
					}
				}
				err = call(*fab, lease, l.generation, r, SV_SVC_WRITE,
					   reinterpret_cast<uintptr_t>(rbase + ro), chunk);
			} else {
				err = call(*fab, lease, l.generation, r, SV_SVC_READ,
					   reinterpret_cast<uintptr_t>(rbase + ro), chunk);
				size_t put = 0;
				while (!err && put < chunk && li < nl) {
					size_t n = std::min(chunk - put, local[li].iov_len - lo);
					memcpy(static_cast<char *>(local[li].iov_base) + lo, r->bounce + put, n);
					put += n;
					lo += n;
					if (lo == local[li].iov_len) {
						li++;
						lo = 0;
					}
				}
			}
			ro += chunk;
		}
	}
	release_state(r);
	word(r->lock).store(0, std::memory_order_release);
	return err;
}

} // namespace loop
