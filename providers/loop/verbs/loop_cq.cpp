// SPDX-License-Identifier: MIT
// Completion queues: a multi-producer ring in shared memory (the protocol is
// at sv_cq_ring in kernel-abi/softverbs-abi.h), polled by its owner.
#include "c_boundary.h"
#include "loop.h"
#include "mr_copiers.h"
#include "objects.h"
#include "queue_geom.h"
#include "res_limits.h"
#include "rocev2.h"
#include "xfer.h"

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <climits>
#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

namespace loop {

namespace {

int notify_socket()
{
	static int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	return fd;
}

// Sends one datagram without waiting.  Returns false if it was not sent
// (a full receive queue, or no such socket any more).
bool send_dgram(const uint8_t *addr, uint32_t len, const void *msg, size_t msg_len)
{
	if (!len || len > sizeof(sockaddr_un::sun_path))
		return false;
	sockaddr_un sa{};
	sa.sun_family = AF_UNIX;
	memcpy(sa.sun_path, addr, len);
	cancel_off hold; // The completion it announces is pushed already
	return sendto(notify_socket(), msg, msg_len, MSG_DONTWAIT,
		      reinterpret_cast<sockaddr *>(&sa),
		      static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + len)) ==
	       static_cast<ssize_t>(msg_len);
}

// Raises a CQ's completion event on its channel (the producer that disarmed
// it does, once).  The datagram is a doorbell the channel's socket may
// refuse when its queue is full; then the event is counted in the ring's
// lost_events, where ibv_get_cq_event finds it, and a cookie-0 datagram
// wakes a channel that drained its queue meanwhile (see channel.cpp).
void notify_channel(sv_cq_ring *ring)
{
	uint32_t len = ring->channel_len;
	if (!len)
		return;
	uint64_t cookie = ring->cookie;
	if (send_dgram(ring->channel_addr, len, &cookie, sizeof(cookie)))
		return;
	std::atomic_ref<uint32_t>(ring->lost_events).fetch_add(1, std::memory_order_seq_cst);
	uint64_t rescan = 0;
	send_dgram(ring->channel_addr, len, &rescan, sizeof(rescan));
}

void to_wc(const sv_cqe &e, ibv_wc &wc)
{
	wc.wr_id = e.wr_id;
	wc.status = static_cast<ibv_wc_status>(e.status);
	wc.opcode = static_cast<ibv_wc_opcode>(e.opcode);
	wc.vendor_err = e.vendor_err;
	wc.byte_len = e.byte_len;
	wc.imm_data = e.imm_data;
	wc.qp_num = e.qp_num;
	wc.src_qp = e.src_qp;
	wc.wc_flags = e.wc_flags;
	wc.pkey_index = e.pkey_index;
	wc.slid = e.slid;
	wc.sl = e.sl;
	wc.dlid_path_bits = e.dlid_path_bits;
}

// A ring's payload array, placed by the geometry checked when this process
// created or mapped the ring (queue_geom), never by the header a peer may
// rewrite; nullptr for a ring without one.
sv_cqe_payload *payloads(sv_cq_ring *r)
{
	queue_geom g;
	if (!queue_geometry(r, g) || !g.payload_offset)
		return nullptr;
	return reinterpret_cast<sv_cqe_payload *>(reinterpret_cast<char *>(r) + g.payload_offset);
}

int place_bytes(const mr_hit &hit, const uint8_t *data, uint32_t len)
{
	if (!hit.odp) {
		memcpy(reinterpret_cast<void *>(hit.addr), data, len);
		return 0;
	}
	iovec l{const_cast<uint8_t *>(data), len};
	iovec r{reinterpret_cast<void *>(hit.addr), len};
	return xfer(self_pid(), false, &l, 1, &r, 1, xfer_dir::to_peer);
}

// Publishes ring's geometry for push_own (loop_cq::geo), before the ring
// itself is.  Without memory (or a geometry) for it, push_own reads every
// ring's header from then on, as before.
void note_geometry(loop_cq *cq, sv_cq_ring *ring)
{
	queue_geom g;
	loop_cq::ring_geom *rg = nullptr;
	if (queue_geometry(ring, g))
		rg = new (std::nothrow)
			loop_cq::ring_geom{ring, g, cq->geo.load(std::memory_order_relaxed)};
	if (rg)
		cq->geo.store(rg, std::memory_order_release);
	else
		cq->geo_off.store(true, std::memory_order_seq_cst);
}

// Frees the records of rings before the current one: once no pusher is in
// an older ring (resize, after its wait), none holds their records.
void drop_old_geometry(loop_cq *cq)
{
	loop_cq::ring_geom *cur = cq->geo.load(std::memory_order_relaxed);
	if (!cur)
		return;
	for (loop_cq::ring_geom *p = cur->prev; p;) {
		loop_cq::ring_geom *prev = p->prev;
		delete p;
		p = prev;
	}
	cur->prev = nullptr;
}

// Puts a message that travelled in the CQE's payload into the receive
// buffer.  The payload came through shared memory: its length and key are
// checked against this process's own key table before a byte is written.
void place(loop_cq *cq, sv_cqe &e, const sv_cqe_payload &pl)
{
	uint32_t len = std::min<uint32_t>(pl.len, SV_CQE_INLINE_MAX);
	// Held against an ibv_dereg_mr or ibv_rereg_mr of the buffer in
	// another thread (mr_copiers.h): the registration in force now, for
	// the lookups and the copy below.  Once held it cannot change (a
	// deregistration waits for the hold), so the lookups answer for it; a
	// record out of service has no registration to hold, and its key
	// resolves to nothing below (LOC_PROT_ERR).
	uint32_t slot = pl.lkey >> SV_MR_KEY_BITS;
	if (!slot || slot >= SV_MAX_MRS) {
		e.status = IBV_WC_LOC_PROT_ERR;
		return;
	}
	sv_mr_rec *rec = &cq->ctx->fab->reg()->mrs[slot];
	mr_copy_guard hold;
	if (!hold.take(rec, std::atomic_ref<uint32_t>(rec->cookie).load(std::memory_order_relaxed))) {
		e.status = IBV_WC_LOC_PROT_ERR;
		return;
	}
	// The key of the last placement, its record unchanged and the bytes
	// in its window: plain memory of ours, one memcpy.
	const key_memo &km = cq->place_key;
	if (memo_key(cq->ctx->fab->reg(), km, pl.lkey, pl.iova, len)) {
		memcpy(reinterpret_cast<void *>(km.addr + (pl.iova - km.iova)), pl.data, len);
		return;
	}
	// The key the last messages named, still standing (key_cache): the
	// same, and kept for the next.
	iovec v;
	seg_kind k;
	uint32_t lease = static_cast<uint32_t>(cq->ctx->lease);
	if (mr_cached_own(*cq->ctx->fab, cq->keys, pl.lkey, lease, kAnyPdn, pl.iova, len,
			  IBV_ACCESS_LOCAL_WRITE, v, k) &&
	    k == seg_kind::peer) {
		memcpy(v.iov_base, pl.data, len);
		memo_key_keep(cq->place_key, cached_entry(cq->keys, pl.lkey, lease), pl.lkey, false);
		return;
	}
	// The full way, which fills the cache for the next.
	thread_local std::vector<rseg> segs;
	segs.clear();
	if (!mr_resolve_cached(*cq->ctx->fab, cq->keys, pl.lkey, static_cast<uint32_t>(cq->ctx->lease),
			       kAnyPdn, pl.iova, len, IBV_ACCESS_LOCAL_WRITE, 0, segs, nullptr) &&
	    segs.size() == 1 && segs[0].kind == seg_kind::peer) {
		memcpy(segs[0].base, pl.data, len);
		return;
	}
	mr_hit hit;
	if (mr_lookup(*cq->ctx->fab, pl.lkey, static_cast<uint32_t>(cq->ctx->lease), kAnyPdn,
		      pl.iova, len, IBV_ACCESS_LOCAL_WRITE, 0, hit) ||
	    hit.kind != SV_MR_KIND_MR) {
		e.status = IBV_WC_LOC_PROT_ERR;
		return;
	}
	// Ours, but on-demand memory may be unmapped: a checked copy then.
	if (place_bytes(hit, pl.data, len))
		e.status = IBV_WC_LOC_PROT_ERR;
}

// A thread's polling state, over all the CQs it polls: its consecutive
// empty polls and since when (0: not timed yet), and the CQs it found
// empty since it last found work on any CQ, so that a sleep waits on all of
// them.  UCX, MPI and most event loops poll a send CQ and a receive CQ
// (UCX: two per transport) in turn: sleeping on the one being polled while
// the completion lands in the other would wait the whole kCqSleepNs, and in
// a ping-pong both sides then stay idle past kCqSpinNs every turn, so every
// message paid it (UCX ud_verbs' tag_lat took 120-180 us per message; see
// docs/PERFORMANCE.md).  kIdleCqs: tunables.h.  One thread_local, not
// seven: in a shared library each thread_local a function touches costs a
// call to __tls_get_addr, and a poll that found a completion touched three
// (a third of its instructions in ib_send_lat).
struct poll_state {
	uint32_t empty_polls;
	uint64_t empty_since;
	bool counted; // Seen by one_poller()
	loop_cq *idle_cqs[kIdleCqs];
	int idle_n;
	bool idle_overflow; // More than kIdleCqs: no sleep, a yield
	loop_cq *idle_last; // The last one noted (the common repeat)
	uint64_t idle_gen;  // g_cq_gen when the list was started
};
thread_local poll_state t_poll;
// Bumped before any CQ's ring is unmapped or replaced (destroy, resize): a
// thread's list started before then may name a CQ that is gone, and is
// dropped unused.
std::atomic<uint64_t> g_cq_gen;
// futex_waitv (Linux 5.16): 1 usable, 0 not tried yet, -1 refused (an old
// kernel or a seccomp profile); then a thread polling several CQs yields
// instead of sleeping.
std::atomic<int> g_waitv_ok;

// The first thread of this process to poll a CQ, and whether another has
// polled since: sticky, for the life of the process (a fork's child starts
// with its parent's answer).
std::atomic<pid_t> g_first_poller;
std::atomic<bool> g_many_pollers;

// Whether this thread is the only one of its process that has polled.
// A poller may sleep in an empty poll only then: threads that share a
// progress engine poll under its lock (UCX's worker spinlock, with
// MPI_THREAD_MULTIPLE), so a sleep inside ibv_poll_cq keeps the lock from
// the threads that would post what it waits for, while they spin on it
// (Open MPI over UCX with 4 threads and 1 MiB messages hung).  Such
// processes spin in poll, as on an HCA.
bool one_poller(poll_state &t)
{
	if (g_many_pollers.load(std::memory_order_relaxed))
		return false;
	if (!t.counted) {
		t.counted = true;
		pid_t me = static_cast<pid_t>(syscall(SYS_gettid));
		pid_t first = 0;
		if (!g_first_poller.compare_exchange_strong(first, me) && first != me) {
			g_many_pollers.store(true, std::memory_order_relaxed);
			return false;
		}
	}
	return true;
}

void note_idle(poll_state &t, loop_cq *cq)
{
	if (cq == t.idle_last)
		return;
	t.idle_last = cq;
	for (int i = 0; i < t.idle_n; i++)
		if (t.idle_cqs[i] == cq)
			return;
	if (t.idle_n == 0)
		t.idle_gen = g_cq_gen.load(std::memory_order_acquire);
	if (t.idle_n < kIdleCqs)
		t.idle_cqs[t.idle_n++] = cq;
	else
		t.idle_overflow = true;
}

void clear_idle(poll_state &t)
{
	t.idle_n = 0;
	t.idle_overflow = false;
	t.idle_last = nullptr;
}

uint32_t *prod_word(sv_cq_ring *r)
{
	// The low half of prod (little endian): it changes with every reservation.
	return reinterpret_cast<uint32_t *>(&r->prod);
}

bool head_ready(const loop_cq *cq)
{
	const sv_cqe &slot = cq->slots[cq->head & cq->mask];
	return std::atomic_ref<const uint32_t>(slot.seq).load(std::memory_order_seq_cst) ==
	       static_cast<uint32_t>(cq->head + 1);
}

// Waits on several rings' producer words at once: 0 when woken, timed out
// or interrupted; -1 when the kernel refuses the call.
int wait_rings(sv_cq_ring *const *rings, const uint32_t *seen, int n)
{
	futex_waitv w[kIdleCqs]{};
	for (int i = 0; i < n; i++) {
		w[i].val = seen[i];
		w[i].uaddr = reinterpret_cast<uintptr_t>(prod_word(rings[i]));
		w[i].flags = FUTEX_32; // Shared (not FUTEX_PRIVATE_FLAG): peers wake it
	}
	timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	ts.tv_nsec += kCqSleepNs;
	if (ts.tv_nsec >= 1000000000L) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000L;
	}
	if (syscall(SYS_futex_waitv, w, n, 0, &ts, CLOCK_MONOTONIC) >= 0)
		return 0;
	return errno == ENOSYS || errno == EPERM || errno == EINVAL ? -1 : 0;
}

// Sleeps briefly until a producer reserves a slot in cq or in another CQ
// this thread found empty in the same idle stretch: on a machine with more
// pollers than cores, a spinning poller would hold the core its peer needs
// to produce the completion (see sv_cq_ring's contract).  Caller holds
// cq->lock; the other CQs' locks are tried, never waited for, and held
// while asleep (loop_destroy_cq and resize take the lock before they unmap
// a ring), so a ring cannot go away under the wait.
void cq_sleep(loop_cq *cq, const sv_cqe &slot, uint64_t c)
{
	poll_state &t = t_poll;
	loop_cq *cqs[kIdleCqs];
	int n = 0;
	cqs[n++] = cq;
	bool complete = !t.idle_overflow;
	if (complete && t.idle_n > 1) {
		if (g_waitv_ok.load(std::memory_order_relaxed) < 0 ||
		    t.idle_gen != g_cq_gen.load(std::memory_order_acquire)) {
			complete = false;
		} else {
			for (int i = 0; i < t.idle_n && complete; i++) {
				loop_cq *o = t.idle_cqs[i];
				if (o == cq)
					continue;
				if (!o->lock.try_lock()) {
					complete = false;
				} else if (!o->ring || !o->life.is(kLifeCq)) {
					o->lock.unlock();
					complete = false;
				} else {
					cqs[n++] = o;
				}
			}
		}
	}
	if (!complete) {
		// Not every CQ this thread polls can be watched: a sleep on some
		// could miss a completion on another; give the core away instead.
		for (int i = 1; i < n; i++)
			cqs[i]->lock.unlock();
		if (t.idle_gen != g_cq_gen.load(std::memory_order_acquire))
			clear_idle(t); // Names a CQ that may be gone: start again
		sched_yield();
		return;
	}
	sv_cq_ring *rings[kIdleCqs];
	uint32_t seen[kIdleCqs];
	for (int i = 0; i < n; i++) {
		rings[i] = cqs[i]->ring;
		seen[i] = static_cast<uint32_t>(
			std::atomic_ref<uint64_t>(rings[i]->prod).load(std::memory_order_acquire));
		std::atomic_ref<uint32_t>(rings[i]->waiters).fetch_add(1, std::memory_order_seq_cst);
	}
	bool ready = std::atomic_ref<const uint32_t>(slot.seq).load(std::memory_order_seq_cst) ==
		     static_cast<uint32_t>(c + 1);
	for (int i = 1; i < n && !ready; i++)
		ready = head_ready(cqs[i]);
	// A slot reserved before seen was read but not yet published: its
	// producer's wake may come before this thread is in FUTEX_WAIT, and
	// the word would not have changed since seen, so the wake would be
	// lost and the sleep run to its end.  Sleep only on rings with nothing
	// reserved past the owner's head; else give the core away and look
	// again.
	bool reserved = false;
	for (int i = 0; i < n && !ready && !reserved; i++)
		reserved = seen[i] != static_cast<uint32_t>(cqs[i]->head);
	if (reserved && !ready)
		sched_yield();
	else if (!ready) {
		if (n == 1) {
			timespec ts{0, kCqSleepNs};
			syscall(SYS_futex, prod_word(rings[0]), FUTEX_WAIT, seen[0], &ts, nullptr, 0);
		} else if (wait_rings(rings, seen, n) < 0) {
			g_waitv_ok.store(-1, std::memory_order_relaxed);
			sched_yield();
		}
	}
	for (int i = 0; i < n; i++)
		std::atomic_ref<uint32_t>(rings[i]->waiters).fetch_sub(1, std::memory_order_relaxed);
	for (int i = 1; i < n; i++)
		cqs[i]->lock.unlock();
}

// This process's QPs by slot, for the poller to find the QP a send-queue
// completion frees slots of.  Set at create, cleared at destroy.
std::atomic<loop_qp *> g_sq_owner[SV_MAX_QPS];

loop_qp *sq_owner(uint32_t qpn)
{
	loop_qp *qp = g_sq_owner[qpn & SV_QPN_SLOT_MASK].load(std::memory_order_acquire);
	return qp && qp->qpn == qpn ? qp : nullptr;
}

// Whether the sender that claimed entry c's placement is gone for good:
// its QP's owner lease is dead or the QP no longer exists.  Checked at most
// every kClaimCheckNs, since it takes the registry lock.
bool claimer_dead(loop_cq *cq, const sv_cqe &slot)
{
	uint64_t now = now_ns();
	if (!cq->claim_since) {
		cq->claim_since = now;
		return false;
	}
	if (now - cq->claim_since < kClaimCheckNs)
		return false;
	cq->claim_since = now;
	fabric &fab = *cq->ctx->fab;
	uint32_t qslot = slot.src_qp & SV_QPN_SLOT_MASK;
	const sv_qp_rec &q = fab.reg()->qps[qslot];
	uint32_t lease = std::atomic_ref<const uint32_t>(q.owner_lease).load(std::memory_order_relaxed);
	uint32_t gen = std::atomic_ref<const uint32_t>(q.owner_gen).load(std::memory_order_relaxed);
	return !std::atomic_ref<const uint32_t>(q.in_use).load(std::memory_order_acquire) ||
	       !fab.lease_alive(lease, gen);
}

// Decides who places entry c's payload (see SV_PLACE_TAG in the ABI).
// Returns false while the sender holds the claim; otherwise sets
// cq->placing_self when the owner must place the bytes itself.
bool take_placement(loop_cq *cq, sv_cqe &slot, uint64_t c)
{
	std::atomic_ref<uint32_t> w(slot.place);
	const uint32_t claimed = SV_PLACE_TAG(c, SV_PLACE_CLAIMED);
	const uint32_t done = SV_PLACE_TAG(c, SV_PLACE_DONE);
	uint32_t v = w.load(std::memory_order_acquire);
	for (;;) {
		if (v == done) {
			cq->placing_self = false; // The sender placed it
			cq->claim_since = 0;
			return true;
		}
		if (v == claimed) {
			if (!claimer_dead(cq, slot))
				return false;
			// Its copy either finished or never will: take over.
			if (!w.compare_exchange_strong(v, done, std::memory_order_acq_rel))
				continue;
			break;
		}
		// PENDING, or a word a buggy peer overwrote: the owner places it,
		// after checking the key against its own table.
		if (w.compare_exchange_weak(v, done, std::memory_order_acq_rel))
			break;
	}
	cq->placing_self = true;
	cq->claim_since = 0;
	return true;
}

// A send-queue completion frees its WR's slot and those of the unsignaled
// WRs posted before it (as on mlx5).
void retire_sq(loop_cq *cq, const sv_cqe &e)
{
	loop_qp *qp = sq_owner(e.qp_num);
	if (!qp || qp->scq != cq)
		return; // Destroyed meanwhile, or a forged entry
	uint64_t r = qp->sq_retired.load(std::memory_order_acquire);
	uint64_t posted = qp->sq_posted.load(std::memory_order_acquire);
	uint32_t delta = static_cast<uint32_t>(e.src_qp + 1) - static_cast<uint32_t>(r);
	// A stale index (the QP was reset since) or a forged one frees nothing.
	while (delta && delta <= posted - r &&
	       !qp->sq_retired.compare_exchange_weak(r, r + delta, std::memory_order_acq_rel))
		delta = static_cast<uint32_t>(e.src_qp + 1) - static_cast<uint32_t>(r);
	// A QP an agent posts to, whose completions the library polls: the
	// agent counts its free slots by the ring's retired word
	// (softverbs_dv_sq_next), which only softverbs_dv_sq_retire moved, so
	// its ring filled for good.  The word moves forward only, to what is
	// retired here, within what was posted.
	if (qp->agent.load(std::memory_order_acquire)) {
		uint64_t now = qp->sq_retired.load(std::memory_order_acquire);
		std::atomic_ref<uint64_t> word(qp->sq->retired);
		uint64_t w = word.load(std::memory_order_acquire);
		while (now - w - 1 < posted - w &&
		       !word.compare_exchange_weak(w, now, std::memory_order_acq_rel))
			;
	}
}

// A receive completion of one of our QPs' own receive queue (not an SRQ's):
// the WQE it used was taken, cons moved past it, before the entry was
// published (rq_take, then the push), so counting them gives rq_post a bound
// of cons.  A forged entry can only make that QP's posts write over WQEs not
// yet taken, which their consumer reports as damage (rq_take).  Caller
// holds cq->lock, the only writer of the count.
void note_recv_taken(loop_cq *cq, const sv_cqe &e)
{
	loop_qp *qp = sq_owner(e.qp_num);
	if (!qp || qp->rcq != cq || !qp->rq)
		return;
	qp->rq_polled.store(qp->rq_polled.load(std::memory_order_relaxed) + 1,
			    std::memory_order_release);
}

// Resolves the placement of entry `index` before the entry is moved to
// another index (cq_clean, resize): waits out a sender's claim (bounded by
// its liveness, and by kSettleNs against a frozen one), places the payload
// if the owner must, and leaves an entry with no SV_CQE_PLACE.  Caller holds
// cq->lock.
void settle_placement(loop_cq *cq, sv_cq_ring *r, sv_cqe &slot, uint64_t index)
{
	if (!(slot.flags & SV_CQE_PLACE))
		return;
	if (sv_cqe_payload *pls = payloads(r)) {
		uint64_t deadline = now_ns() + kSettleNs;
		while (!take_placement(cq, slot, index)) {
			if (now_ns() > deadline) {
				std::atomic_ref<uint32_t>(slot.place)
					.store(SV_PLACE_TAG(index, SV_PLACE_DONE), std::memory_order_release);
				cq->placing_self = true;
				break;
			}
			sched_yield();
		}
		if (cq->placing_self) {
			place(cq, slot, pls[index & cq->mask]);
		}
	} else {
		slot.status = IBV_WC_LOC_QP_OP_ERR;
	}
	slot.flags = static_cast<uint8_t>(slot.flags & ~SV_CQE_PLACE);
}

// The owner found an entry of its ring written over: raises
// IBV_EVENT_CQ_ERR once, to its own async fd (process memory, not the
// ring's copy of the address).
void cq_damaged(loop_cq *cq)
{
	if (std::atomic_ref<uint32_t>(cq->ring->overflow).exchange(1, std::memory_order_acq_rel))
		return;
	sv_async_msg m{IBV_EVENT_CQ_ERR, SV_OBJ_CQ, cq->ref.slot, cq->ref.gen};
	send_async(cq->ctx->async_addr, cq->ctx->async_len, m);
}

// Every so often an idle owner checks the ring's shared indices against its
// own: cons is published again (a peer may have written over it, and
// producers would find the ring full or overrun it), and a prod that no
// producer could have made (closed without a resize, behind cons, more than
// a lap ahead) is set back, the CQ reported damaged.  Caller holds cq->lock.
void cq_repair(loop_cq *cq)
{
	sv_cq_ring *r = cq->ring;
	std::atomic_ref<uint64_t> cons(r->cons);
	if (cons.load(std::memory_order_relaxed) != cq->head)
		cons.store(cq->head, std::memory_order_release);
	// The producers' bound of cons may not run ahead of it: they would
	// write over completions not yet taken.
	std::atomic_ref<uint64_t> seen(r->cons_seen);
	if (static_cast<int64_t>(seen.load(std::memory_order_relaxed) - cq->head) > 0)
		seen.store(cq->head, std::memory_order_release);
	std::atomic_ref<uint64_t> prod(r->prod);
	uint64_t p = prod.load(std::memory_order_acquire);
	if ((p & SV_CQ_RING_CLOSED) || static_cast<int64_t>(p - cq->head) < 0 ||
	    p - cq->head > static_cast<uint64_t>(cq->mask) + 1) {
		prod.compare_exchange_strong(p, cq->head, std::memory_order_acq_rel);
		cq_damaged(cq);
	}
}

// Takes the next completion, if any.  Caller holds cq->lock.
[[gnu::hot]] bool cq_take(loop_cq *cq, sv_cqe &out)
{
	if (cq->agent) [[unlikely]]
		return false; // An agent polls this ring (softverbs_dv_cq_agent)
	sv_cq_ring *r = cq->ring;
	// The owner's own copy of cons: the ring's is published for producers
	// and never read back (a peer may have written over it).
	uint64_t c = cq->head;
	sv_cqe &slot = cq->slots[c & cq->mask];
	uint32_t seq = std::atomic_ref<uint32_t>(slot.seq).load(std::memory_order_acquire);
	bool slept = false;
again:
	if (seq != static_cast<uint32_t>(c + 1)) {
		// Not written yet, the slot shows its previous lap (or 0 on the
		// first).  Anything else was written over: the entry is lost, and
		// the owner hears of it; polling goes on behind it.
		if (seq != static_cast<uint32_t>(c + 1 - (cq->mask + 1)) &&
		    !(c <= cq->mask && seq == 0)) {
			cq_damaged(cq);
			cq->head = c + 1;
			std::atomic_ref<uint64_t>(r->cons).store(c + 1, std::memory_order_release);
			return false;
		}
		if (slept)
			return false;
		// Timed per thread, over all its CQs: a thread that polls several
		// CQs and finds work on any of them never sleeps.  The clock is read
		// every 64 empty polls only.
		poll_state &t = t_poll;
		note_idle(t, cq);
		bool alone = one_poller(t);
		if ((++t.empty_polls & 63) == 0) {
			cq_repair(cq);
			// RDMA WRITEs of this process on a RoCE v2 wire: its receive
			// thread sends and completes them, and a spinning poller
			// would hold the core it needs (ib_write_bw over a veth on 2
			// cores: its poller took half a core, and the yield took
			// 64 KiB WRITEs from about 850 to about 1500 MB/s).
			if (rocev2_flying_qps.load(std::memory_order_relaxed))
				sched_yield();
			uint64_t now = now_ns();
			if (!t.empty_since) {
				t.empty_since = now;
			} else if (now - t.empty_since > kCqSpinNs && alone) {
				cq_sleep(cq, slot, c);
				// Look again before answering "empty": the completion
				// that woke the sleep (or came during it) is returned by
				// this poll.  An empty answer must describe the ring as it
				// is when the poll returns, not as it was before a sleep
				// of up to kCqSleepNs: a caller that finds its CQ empty
				// and then reads its connection events (libfabric's rxm:
				// an empty MSG CQ, then the EQ) would see the peer's
				// DISCONNECTED before the last message the peer sent
				// ahead of it, close the connection and drop that
				// message (fi_pingpong's "fin", a hang under ASan).
				slept = true;
				seq = std::atomic_ref<uint32_t>(slot.seq).load(std::memory_order_acquire);
				goto again;
			}
		}
		return false;
	}
	sv_cqe_payload *pls = nullptr;
	if (slot.flags & SV_CQE_PLACE) {
		// payloads() looks the ring's geometry up: once per ring.
		if (cq->pls_ring != r || cq->pls_mask != cq->mask) {
			cq->pls = payloads(r);
			cq->pls_ring = r;
			cq->pls_mask = cq->mask;
		}
		pls = cq->pls;
	}
	if (pls && !take_placement(cq, slot, c))
		return false; // Its sender is placing the bytes: not ready yet
	poll_state &t = t_poll;
	t.empty_polls = 0;
	t.empty_since = 0;
	if (t.idle_n)
		clear_idle(t);
	out = slot;
	if (out.flags & SV_CQE_PLACE) {
		if (!pls)
			out.status = IBV_WC_LOC_QP_OP_ERR; // A ring that lost its payload array
		else if (cq->placing_self)
			place(cq, out, pls[c & cq->mask]);
	}
	if (out.flags & SV_CQE_SQ_INDEX) {
		retire_sq(cq, out);
		out.src_qp = 0; // Not the application's to see
	} else if (out.opcode & IBV_WC_RECV) {
		note_recv_taken(cq, out);
	}
	// For TSan: the slot (and its payload) are read before cons moves past
	// them, and every producer refills them only after that; cons may reach
	// a producer of this process through another process (a peer's store
	// of cons_seen), an edge TSan cannot see, so the slot says it itself
	// (cq_push acquires it).
	QLOCK_TSAN(__tsan_release(&slot));
	cq->head = c + 1;
	std::atomic_ref<uint64_t>(r->cons).store(c + 1, std::memory_order_release);
	return true;
}

static_assert((uint64_t(kMaxCqe) + 1) * (sizeof(sv_cqe) + sizeof(sv_cqe_payload)) +
			      sizeof(sv_cq_ring) + 2 * 4096 <=
		      kMaxQueueBytes,
	      "a CQ of max_cqe entries fits the queue segment bound");

// Asks pd's allocator for the ring of a CQ of `entries` (SOFTVERBS_RES_TYPE_CQ).
// 0 with place.mem set (and cq->alloc_pd, cq->placed) when the ring goes in
// the application's memory; 0 with place.mem null for our own segment
// (IBV_ALLOCATOR_USE_DEFAULT, no allocator, or memory nobody published); or
// an errno (the allocator gave nothing, or memory that cannot hold a ring).
int place_cq(loop_cq *cq, ibv_pd *pd, uint32_t entries, queue_place &place)
{
	size_t bytes = queue_total_bytes(sizeof(sv_cq_ring), entries, sizeof(sv_cqe),
					 static_cast<size_t>(entries) * sizeof(sv_cqe_payload));
	if (int e = pd_place(pd, SOFTVERBS_RES_TYPE_CQ, bytes, place, cq->placed))
		return e;
	if (place.mem)
		cq->alloc_pd = pd;
	return 0;
}

// Before a placed ring goes back to the application, which may reuse the
// memory at once: producers that have yet to reserve a slot are refused
// (the closed bit: they find the CQ gone, as after a resize), and those
// that reserved one are waited for until they published it (seq), for at
// most kPlacedDrainNs: a producer that died mid-write never will.  What a
// producer does after publishing (the armed/waiters words, a few
// instructions) is not waited for; docs/agent.md says so.
void close_placed(loop_cq *cq)
{
	sv_cq_ring *r = cq->ring;
	uint64_t end = std::atomic_ref<uint64_t>(r->prod).fetch_or(SV_CQ_RING_CLOSED,
								  std::memory_order_acq_rel) &
		       ~SV_CQ_RING_CLOSED;
	uint64_t cons = std::atomic_ref<uint64_t>(r->cons).load(std::memory_order_acquire);
	uint64_t i = end - std::min<uint64_t>(end - cons, cq->capacity); // An agent may lie
	uint64_t deadline = now_ns() + kPlacedDrainNs;
	while (i != end) {
		if (std::atomic_ref<uint32_t>(cq->slots[i & cq->mask].seq)
			    .load(std::memory_order_acquire) == static_cast<uint32_t>(i + 1)) {
			i++;
			continue;
		}
		if (now_ns() > deadline)
			break;
		sched_yield();
	}
}

// Gives a placed ring back to its allocator (after queue_destroy).
void unplace_cq(loop_cq *cq, void *ring)
{
	if (!cq->alloc_pd)
		return;
	pd_free(cq->alloc_pd, ring, SOFTVERBS_RES_TYPE_CQ);
	cq->alloc_pd = nullptr;
	cq->placed.reset();
}

loop_cq *new_cq(ibv_context *ctx, int cqe, ibv_comp_channel *channel, ibv_pd *pd)
{
	if (cqe < 1 || cqe > kMaxCqe) {
		errno = EINVAL;
		return nullptr;
	}
	loop_context *lctx = to_loop_context(ctx);
	// max_cq is device-wide, across processes (res_limits.h).
	if (int e = res_take(*lctx->fab, lctx->lease, SV_RES_CQ)) {
		errno = e;
		return nullptr;
	}
	auto *cq = new (std::nothrow) loop_cq{};
	if (!cq) {
		res_put(*lctx->fab, lctx->lease, SV_RES_CQ);
		errno = ENOMEM;
		return nullptr;
	}
	uint32_t entries = round_pow2(static_cast<uint32_t>(cqe));
	queue_place place;
	void *map = nullptr;
	if (int e = place_cq(cq, pd, entries, place))
		errno = e;
	else
		map = queue_create(*lctx->fab, lctx->lease, SV_OBJ_CQ, entries, sizeof(sv_cqe),
				   sizeof(sv_cq_ring), 0, cq->ref,
				   static_cast<size_t>(entries) * sizeof(sv_cqe_payload),
				   place.mem ? &place : nullptr);
	if (!map) {
		int e = errno;
		if (place.mem)
			unplace_cq(cq, place.mem);
		delete cq;
		res_put(*lctx->fab, lctx->lease, SV_RES_CQ);
		errno = e;
		return nullptr;
	}
	cq->ctx = lctx;
	cq->ring = static_cast<sv_cq_ring *>(map);
	cq->slots = reinterpret_cast<sv_cqe *>(static_cast<char *>(map) + sizeof(sv_cq_ring));
	cq->mask = entries - 1;
	cq->capacity = entries;
	cq->ring->payload_offset =
		static_cast<uint32_t>(queue_bytes(sizeof(sv_cq_ring), entries, sizeof(sv_cqe)));
	note_geometry(cq, cq->ring);
	memcpy(cq->ring->async_addr, lctx->async_addr, lctx->async_len);
	cq->ring->async_len = lctx->async_len;
	(void)channel; // Wired after verbs_init_cq, which sets cq->channel.
	return cq;
}

void wire_channel(loop_cq *cq)
{
	ibv_comp_channel *ch = cq->vcq.cq.channel;
	if (!ch)
		return;
	char addr[VERBS_CHANNEL_ADDR_MAX];
	size_t len = sizeof(addr);
	if (verbs_comp_channel_address(ch, addr, &len) == 0 &&
	    len <= sizeof(cq->ring->channel_addr)) {
		memcpy(cq->ring->channel_addr, addr, len);
		cq->ring->channel_len = static_cast<uint32_t>(len);
	}
	cq->ring->cookie = verbs_comp_channel_cookie(&cq->vcq.cq);
	verbs_comp_channel_lost_word(&cq->vcq.cq, &cq->ring->lost_events);
}

} // namespace

bool cq_has_payload(const sv_cq_ring *ring)
{
	// The geometry this process checked when it mapped the ring.
	queue_geom g;
	return queue_geometry(ring, g) && g.payload_offset;
}

void cq_attach_sq(loop_qp *qp)
{
	g_sq_owner[qp->slot & SV_QPN_SLOT_MASK].store(qp, std::memory_order_release);
}

void cq_detach_sq(loop_qp *qp)
{
	loop_qp *expect = qp;
	g_sq_owner[qp->slot & SV_QPN_SLOT_MASK].compare_exchange_strong(expect, nullptr,
									 std::memory_order_acq_rel);
}

uint64_t now_ns()
{
	timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return static_cast<uint64_t>(ts.tv_sec) * 1000000000ULL + static_cast<uint64_t>(ts.tv_nsec);
}

void send_async(const uint8_t *addr, uint32_t len, const sv_async_msg &msg)
{
	send_dgram(addr, len, &msg, sizeof(msg));
}

int cq_place_deferred(sv_cq_ring *ring, uint64_t index, void *dst, pid_t pid, sv_mr_rec *mr,
		      uint32_t cookie)
{
	queue_geom g;
	sv_cqe_payload *pls = payloads(ring);
	if (!pls || !queue_geometry(ring, g))
		return 0;
	uint32_t mask = g.entries - 1;
	auto *slots = reinterpret_cast<sv_cqe *>(reinterpret_cast<char *>(ring) + g.slots_offset);
	sv_cqe &slot = slots[index & mask];
	// The claim names this entry's reservation index: it fails if the owner
	// took the entry, and on any later lap of the slot.
	std::atomic_ref<uint32_t> w(slot.place);
	uint32_t v = SV_PLACE_TAG(index, SV_PLACE_PENDING);
	if (!w.compare_exchange_strong(v, SV_PLACE_TAG(index, SV_PLACE_CLAIMED),
				       std::memory_order_acq_rel))
		return 0;
	// Claimed: the owner waits for DONE before it moves cons, so the slot
	// and its payload stay as they are until then.
	const sv_cqe_payload &pl = pls[index & mask];
	iovec l{const_cast<uint8_t *>(pl.data), std::min<uint32_t>(pl.len, SV_CQE_INLINE_MAX)};
	iovec r{dst, l.iov_len};
	// Held against the receiver's dereg of the buffer (mr_copiers.h): one
	// out of service now is left to the owner's place(), which checks the
	// key (LOC_PROT_ERR).
	int err = EACCES;
	if (!mr || mr_copy_hold(mr, cookie)) {
		err = xfer(pid, false, &l, 1, &r, 1, xfer_dir::to_peer);
		if (mr)
			mr_copy_release(mr, cookie);
	}
	// On failure the owner places it (and checks its key) instead.
	w.store(SV_PLACE_TAG(index, err ? SV_PLACE_PENDING : SV_PLACE_DONE),
		std::memory_order_release);
	return err;
}

[[gnu::hot]] int cq_push(sv_cq_ring *ring, sv_cqe &e, bool solicited, const sv_cqe_payload *payload,
	    uint64_t *index)
{
	// Indexed by the geometry checked at creation or mapping: a header a
	// peer rewrote cannot send this write outside the segment.
	queue_geom g;
	if (!queue_geometry(ring, g))
		return ENOSPC; // Not a ring we can trust: its QP fails, visibly
	return cq_push(ring, g, e, solicited, payload, index);
}

[[gnu::hot]] int cq_push(sv_cq_ring *ring, const queue_geom &g, sv_cqe &e, bool solicited,
			 const sv_cqe_payload *payload, uint64_t *index)
{
	if (g.kind != SV_OBJ_CQ)
		return ENOSPC; // Not a ring we can trust: its QP fails, visibly
	uint32_t entries = g.entries;
	uint32_t mask = entries - 1;
	auto *slots = reinterpret_cast<sv_cqe *>(reinterpret_cast<char *>(ring) + g.slots_offset);
	std::atomic_ref<uint64_t> prod(ring->prod);
	std::atomic_ref<uint64_t> seen(ring->cons_seen);
	uint64_t p = prod.load(std::memory_order_relaxed);
	for (int stale = 0;; stale++) {
		if (p & SV_CQ_RING_CLOSED)
			return ESTALE;
		// Room is judged by the bound on our line; the owner's cons is
		// read only when the bound shows the ring full (or is beyond p).
		// (And every 64 entries: a bound written over, or stored back
		// by a producer racing the owner's repair, lasts no longer.)
		uint64_t c = seen.load(std::memory_order_acquire);
		if (p - c >= entries || !(p & 63)) {
			c = std::atomic_ref<uint64_t>(ring->cons).load(std::memory_order_acquire);
			seen.store(c, std::memory_order_release);
		}
		if (static_cast<int64_t>(p - c) < 0 && stale < 64) {
			// p is stale: since it was read, other producers reserved
			// and the owner consumed past it.  Without this, p - c wraps
			// and a ring with room looks full: a completion was dropped.
			// (cons staying beyond prod is a damaged ring: full, below.)
			p = prod.load(std::memory_order_acquire);
			continue;
		}
		if (p - c >= entries) {
			if (!std::atomic_ref<uint32_t>(ring->overflow)
				     .exchange(1, std::memory_order_acq_rel)) {
				sv_async_msg m{IBV_EVENT_CQ_ERR, SV_OBJ_CQ, ring->hdr.obj_slot,
					       ring->hdr.obj_gen};
				send_async(ring->async_addr, ring->async_len, m);
			}
			return ENOSPC;
		}
		if (prod.compare_exchange_weak(p, p + 1, std::memory_order_acq_rel))
			break;
	}
	sv_cqe &slot = slots[p & mask];
	QLOCK_TSAN(__tsan_acquire(&slot)); // The owner's last take of it (cq_take)
	e.seq = 0;
	e.timestamp = (std::atomic_ref<uint32_t>(ring->flags).load(std::memory_order_relaxed) &
		       SV_CQ_STAMP)
			      ? now_ns()
			      : 0;
	e.flags = static_cast<uint8_t>((e.flags & SV_CQE_SQ_INDEX) | (solicited ? SV_CQE_SOLICITED : 0));
	e.place = SV_PLACE_NONE;
	if (payload) {
		// The caller checked the ring has a payload array (cq_has_payload).
		sv_cqe_payload &dst = reinterpret_cast<sv_cqe_payload *>(
			reinterpret_cast<char *>(ring) + g.payload_offset)[p & mask];
		dst.iova = payload->iova;
		dst.lkey = payload->lkey;
		dst.len = payload->len;
		memcpy(dst.data, payload->data, std::min<uint32_t>(payload->len, SV_CQE_INLINE_MAX));
		e.flags |= SV_CQE_PLACE;
		e.place = SV_PLACE_TAG(p, SV_PLACE_PENDING);
	}
	if (index)
		*index = p;
	memcpy(reinterpret_cast<char *>(&slot) + sizeof(uint32_t),
	       reinterpret_cast<char *>(&e) + sizeof(uint32_t), sizeof(e) - sizeof(uint32_t));
	std::atomic_ref<uint32_t>(slot.seq).store(static_cast<uint32_t>(p + 1),
						  std::memory_order_release);
	// Store-load against the owner arming then polling: both sides fence.
	std::atomic_thread_fence(std::memory_order_seq_cst);
	std::atomic_ref<uint32_t> armed(ring->armed);
	uint32_t a = armed.load(std::memory_order_relaxed);
	bool fire = a == SV_CQ_ARM_ALL ||
		    (a == SV_CQ_ARM_SOLICITED && (solicited || e.status != IBV_WC_SUCCESS));
	uint32_t mod = std::atomic_ref<uint32_t>(ring->mod_count).load(std::memory_order_relaxed);
	if (fire && a == SV_CQ_ARM_ALL && mod > 1 &&
	    std::atomic_ref<uint32_t>(ring->mod_pending).fetch_add(1, std::memory_order_acq_rel) + 1 <
		    mod)
		fire = false; // Moderated: not enough completions yet
	if (std::atomic_ref<uint32_t>(ring->waiters).load(std::memory_order_relaxed))
		syscall(SYS_futex, prod_word(ring), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
	if (fire && armed.compare_exchange_strong(a, SV_CQ_DISARMED, std::memory_order_acq_rel)) {
		std::atomic_ref<uint32_t>(ring->mod_pending).store(0, std::memory_order_relaxed);
		notify_channel(ring);
	}
	return 0;
}

void cq_clean(loop_cq *cq, uint32_t qpn)
{
	if (!cq)
		return;
	std::lock_guard<qlock> g(cq->lock);
	if (cq->agent)
		return; // The agent polling it has passed cq->head: nothing here is ours
	sv_cq_ring *r = cq->ring;
	uint64_t c = cq->head;
	cq->unsolicited_to = 0; // Entries move: look again
	// Only the published run from cons on is ours to rearrange: producers
	// write at reserved slots beyond it.
	uint64_t end = c;
	while (end - c < cq->capacity &&
	       std::atomic_ref<uint32_t>(cq->slots[end & cq->mask].seq)
			       .load(std::memory_order_acquire) == static_cast<uint32_t>(end + 1))
		end++;
	// Walk back from the newest entry, sliding kept entries towards it.
	uint64_t dst = end;
	for (uint64_t i = end; i-- > c;) {
		sv_cqe &s = cq->slots[i & cq->mask];
		if (s.qp_num == qpn) {
			// A sender may hold its claim: wait it out before the slot is reused.
			settle_placement(cq, r, s, i);
			continue;
		}
		dst--;
		if (dst != i) {
			settle_placement(cq, r, s, i);
			cq->slots[dst & cq->mask] = s;
			cq->slots[dst & cq->mask].seq = static_cast<uint32_t>(dst + 1);
			if (sv_cqe_payload *pls = payloads(r))
				pls[dst & cq->mask] = pls[i & cq->mask];
		}
	}
	cq->head = dst;
	std::atomic_ref<uint64_t>(r->cons).store(dst, std::memory_order_release);
}

loop_cq *cq_new(ibv_context *ctx, int cqe, ibv_comp_channel *channel, ibv_pd *pd)
{
	loop_cq *cq = new_cq(ctx, cqe, channel, pd);
	if (!cq)
		return nullptr;
	ibv_cq &c = cq->vcq.cq;
	c.cqe = static_cast<int>(cq->capacity);
	c.handle = cq->ref.slot;
	// The core runs verbs_init_cq after we return; the channel is known now.
	c.channel = channel;
	c.context = ctx;
	wire_channel(cq);
	// Async events (IBV_EVENT_CQ_ERR) name the CQ by its registry slot.
	objects_add(SV_OBJ_CQ, cq->ref.slot, &c);
	owned_add(ctx, cq, kOwnCq);
	return cq;
}

ibv_cq *loop_create_cq(ibv_context *ctx, int cqe, ibv_comp_channel *channel, int comp_vector)
{
	if (ctx_closed(ctx, "ibv_create_cq"))
		return nullptr;
	if (comp_vector < 0 || comp_vector >= ctx->num_comp_vectors) {
		errno = EINVAL;
		return nullptr;
	}
	loop_cq *cq = cq_new(ctx, cqe, channel);
	return cq ? &cq->vcq.cq : nullptr;
}

bool cq_pop(loop_cq *cq, sv_cqe &out)
{
	return cq_take(cq, out);
}

void cq_check_indices(loop_cq *cq)
{
	cq_repair(cq);
}

int loop_destroy_cq(ibv_cq *ibcq)
{
	if (ctx_orphaned(ibcq->context))
		return EBADF;
	loop_cq *cq = to_loop_cq(ibcq);
	// EBUSY while QPs or XRC SRQs complete into it.
	if (int e = cq->life.begin_destroy(kLifeCq, "ibv_destroy_cq", cq))
		return e;
	// No more events for it; block until those handed out are acked
	// (not when its context closes: the kernel's cleanup does not wait).
	if (!owned_closing())
		verbs_cq_wait_events(ibcq);
	objects_remove(SV_OBJ_CQ, cq->ref.slot);
	objects_forget_former(ibcq);
	void *ring = nullptr;
	{
		// A thread asleep in cq_sleep on this ring holds the lock: unmap
		// after it woke, and drop the idle lists that may name this CQ.
		g_cq_gen.fetch_add(1, std::memory_order_acq_rel);
		std::lock_guard<qlock> g(cq->lock);
		// And an arm in another thread (ibv_req_notify_cq takes arm_lock,
		// not the lock): it finds no ring after this, never an unmapped
		// one.  The order of resize's: the lock, then arm_lock.
		std::lock_guard<std::mutex> ag(cq->arm_lock);
		ring = cq->ring;
		if (cq->alloc_pd)
			close_placed(cq);
		queue_destroy(*cq->ctx->fab, cq->ref, ring, cq->alloc_pd != nullptr);
		cq->ring = nullptr;
	}
	// A placed ring goes back to the application (outside our locks: its
	// free is its own code).
	unplace_cq(cq, ring);
	res_put(*cq->ctx->fab, cq->ctx->lease, SV_RES_CQ);
	cq->parents.release();
	cq->life.end_destroy(kLifeCq);
	// Kept a while: a stale pointer reads the dead state, not reused memory.
	quarantine(cq);
	return 0;
}

[[gnu::hot]] int loop_poll_cq(ibv_cq *ibcq, int n, ibv_wc *wc)
{
	loop_cq *cq = to_loop_cq(ibcq);
	if (!cq->life.is(kLifeCq)) [[unlikely]]
		return -life_bad("ibv_poll_cq", cq, cq->life, kLifeCq);
	if (n < 0)
		return -EINVAL;
	std::lock_guard<qlock> g(cq->lock);
	// Destroyed by another thread between the look above and the lock:
	// its ring is gone (an application's race; an error, not a fault).
	if (!cq->ring) [[unlikely]]
		return -EINVAL;
	int i = 0;
	sv_cqe e;
	while (i < n && cq_take(cq, e)) {
		to_wc(e, wc[i]);
		i++;
	}
	if (n) [[likely]]
		cq_poll_end(cq, i == n);
	return i;
}

namespace {

// Whether the CQ holds a published completion not yet polled that an arm
// of kind arm fires for (any, or a solicited or failed one), at or after
// index from (from before the ring's cons: from cons).  The ring's cons
// is what the poller stores as it takes each entry.  Moderated CQs count
// only completions after the arm, as before.
bool pending_fires(const loop_cq *cq, sv_cq_ring *ring, uint32_t arm, uint64_t from)
{
	if (std::atomic_ref<uint32_t>(ring->mod_count).load(std::memory_order_relaxed) > 1)
		return false;
	uint64_t c = std::atomic_ref<uint64_t>(ring->cons).load(std::memory_order_acquire);
	uint64_t i = from - c <= cq->capacity ? from : c;
	for (; i - c < cq->capacity; i++) {
		const sv_cqe &e = cq->slots[i & cq->mask];
		if (std::atomic_ref<const uint32_t>(e.seq).load(std::memory_order_acquire) !=
		    static_cast<uint32_t>(i + 1))
			return false;
		if (arm == SV_CQ_ARM_ALL || (e.flags & SV_CQE_SOLICITED) || e.status != IBV_WC_SUCCESS)
			return true;
	}
	return false;
}

// Disarms the CQ and raises its event, unless a producer or another arm's
// look did first (the CAS makes one event of an arm).
void fire_armed(sv_cq_ring *ring, uint32_t arm)
{
	std::atomic_ref<uint32_t> armed(ring->armed);
	if (armed.compare_exchange_strong(arm, SV_CQ_DISARMED, std::memory_order_acq_rel)) {
		std::atomic_ref<uint32_t>(ring->mod_pending).store(0, std::memory_order_relaxed);
		notify_channel(ring);
	}
}

} // namespace

int loop_req_notify_cq(ibv_cq *ibcq, int solicited_only)
{
	loop_cq *cq = to_loop_cq(ibcq);
	if (!cq->life.is(kLifeCq))
		return life_bad("ibv_req_notify_cq", cq, cq->life, kLifeCq);
	if (!ibcq->channel)
		return EINVAL;
	// Against a concurrent ibv_resize_cq, which replaces (and unmaps) the
	// ring: the arm goes to the ring the CQ has, and moves with it.  Not
	// cq->lock, which an extended CQ's open poll batch holds.
	std::lock_guard<std::mutex> g(cq->arm_lock);
	sv_cq_ring *ring = cq->ring;
	if (!ring)
		return EINVAL; // Destroyed meanwhile by another thread
	uint32_t arm = solicited_only ? SV_CQ_ARM_SOLICITED : SV_CQ_ARM_ALL;
	std::atomic_ref<uint32_t> armed(ring->armed);
	armed.store(arm, std::memory_order_seq_cst);
	std::atomic_thread_fence(std::memory_order_seq_cst);
	// Completions already there, not yet polled, that no event the
	// application took announced (published after its last
	// ibv_get_cq_event of this CQ, or none taken), or that a poll left
	// behind: the event comes now.  A ConnectX arms at the consumer index
	// it is given and fires at once when completions lie beyond it, and
	// programs written against one count on that: perftest -e -Q N takes
	// one event, re-arms and polls one batch, leaving completions behind
	// (cq_poll_end fires for those when the arm came first), and a program
	// that polls one batch per event and then re-arms, waits.  But
	// ib_send_lat -e takes one event, re-arms before it polls the one
	// completion the event announced, and polls once per event: an event
	// for that completion, raised at the arm, was taken later as the next
	// message's, whose poll found nothing, and the ping-pong ran out of
	// step (its send queue of one WR full: "Couldn't post send").
	// A producer publishing meanwhile sees the arm (both sides fence): the
	// CAS makes one event of the two.
	// (An agent polls its CQ without us: every completion there counts,
	// as before.)
	if (pending_fires(cq, ring, arm, cq->agent ? 0 : cq->announced) ||
	    (cq->left_behind.load(std::memory_order_relaxed) && pending_fires(cq, ring, arm, 0)))
		fire_armed(ring, arm);
	return 0;
}

// The provider's half of ibv_get_cq_event: the completions published now
// are the ones this event announced.
void loop_cq_event(ibv_cq *ibcq)
{
	loop_cq *cq = to_loop_cq(ibcq);
	if (!cq->life.is(kLifeCq))
		return;
	std::lock_guard<std::mutex> g(cq->arm_lock);
	sv_cq_ring *ring = cq->ring;
	if (!ring)
		return;
	// From where the last event's look stopped: the entries before it were
	// published then, and stay so until polled.
	uint64_t c = std::atomic_ref<uint64_t>(ring->cons).load(std::memory_order_acquire);
	uint64_t end = cq->announced - c <= cq->capacity ? cq->announced : c;
	while (end - c < cq->capacity &&
	       std::atomic_ref<uint32_t>(cq->slots[end & cq->mask].seq)
			       .load(std::memory_order_acquire) == static_cast<uint32_t>(end + 1))
		end++;
	cq->announced = end;
}

// After a poll (under the poll lock) that filled its array (filled) or
// stopped short: notes whether it left published completions behind it
// (more than it asked for, or one whose placement the sender still holds,
// which cq_take waits for), and an armed CQ with such completions raises
// its event now, as a ConnectX's arm over them would have: the event the
// application took announced them, so neither a producer nor the arm
// fires for them.  A poll that stopped at the empty end changes nothing.
void cq_poll_end(loop_cq *cq, bool filled)
{
	sv_cq_ring *ring = cq->ring;
	if (cq->agent)
		return; // Its agent polls it: cq->head is not its consumer index
	if (!filled) {
		const sv_cqe &e = cq->slots[cq->head & cq->mask];
		if (std::atomic_ref<const uint32_t>(e.seq).load(std::memory_order_acquire) !=
		    static_cast<uint32_t>(cq->head + 1)) {
			if (cq->left_behind.load(std::memory_order_relaxed))
				cq->left_behind.store(false, std::memory_order_relaxed);
			return;
		}
	}
	bool left = pending_fires(cq, ring, SV_CQ_ARM_ALL, 0);
	cq->left_behind.store(left, std::memory_order_relaxed);
	if (!left)
		return;
	// Store-load against an arm in another thread, which stores the arm,
	// fences, then loads left_behind: one of the two sees the other.
	std::atomic_thread_fence(std::memory_order_seq_cst);
	uint32_t arm = std::atomic_ref<uint32_t>(ring->armed).load(std::memory_order_relaxed);
	if (arm == SV_CQ_ARM_ALL) {
		fire_armed(ring, arm);
		return;
	}
	if (arm != SV_CQ_ARM_SOLICITED)
		return;
	// Solicited only: a solicited or failed entry among those left.  The
	// arm stays set while none is, so each poll looks on from where the
	// last one stopped (unsolicited_to), not over the whole backlog again.
	uint64_t c = std::atomic_ref<uint64_t>(ring->cons).load(std::memory_order_acquire);
	uint64_t i = cq->unsolicited_to - c <= cq->capacity ? cq->unsolicited_to : c;
	for (; i - c < cq->capacity; i++) {
		const sv_cqe &e = cq->slots[i & cq->mask];
		if (std::atomic_ref<const uint32_t>(e.seq).load(std::memory_order_acquire) !=
		    static_cast<uint32_t>(i + 1))
			break;
		if ((e.flags & SV_CQE_SOLICITED) || e.status != IBV_WC_SUCCESS) {
			fire_armed(ring, arm);
			break;
		}
	}
	cq->unsolicited_to = i;
}

int loop_modify_cq(ibv_cq *ibcq, ibv_modify_cq_attr *attr)
{
	if (ctx_orphaned(ibcq->context))
		return EBADF;
	loop_cq *cq = to_loop_cq(ibcq);
	if (!cq->life.is(kLifeCq))
		return life_bad("ibv_modify_cq", cq, cq->life, kLifeCq);
	if (attr->attr_mask & ~static_cast<uint32_t>(IBV_CQ_ATTR_MODERATE))
		return EINVAL;
	if (!(attr->attr_mask & IBV_CQ_ATTR_MODERATE))
		return 0;
	// Count moderation only: a period would need a timer in the owner.
	if (attr->moderate.cq_period > kMaxCqModPeriod || attr->moderate.cq_count > kMaxCqModCount)
		return EINVAL;
	std::lock_guard<qlock> g(cq->lock);
	if (!cq->ring)
		return EINVAL; // Destroyed meanwhile by another thread
	std::atomic_ref<uint32_t>(cq->ring->mod_count)
		.store(attr->moderate.cq_count, std::memory_order_release);
	return 0;
}

int loop_resize_cq(ibv_cq *ibcq, int cqe)
{
	if (ctx_orphaned(ibcq->context))
		return EBADF;
	loop_cq *cq = to_loop_cq(ibcq);
	if (!cq->life.is(kLifeCq))
		return life_bad("ibv_resize_cq", cq, cq->life, kLifeCq);
	if (cqe < 1 || cqe > kMaxCqe)
		return EINVAL;
	g_cq_gen.fetch_add(1, std::memory_order_acq_rel); // Idle lists may name the old ring
	std::lock_guard<qlock> g(cq->lock);
	if (!cq->ring)
		return EINVAL; // Destroyed meanwhile by another thread
	if (cq->agent)
		return EBUSY; // An agent holds the ring's address
	if (cq->alloc_pd)
		return EOPNOTSUPP; // The application placed the ring (docs/agent.md, "Not yet")
	uint64_t pending = std::atomic_ref<uint64_t>(cq->ring->prod).load() - cq->head;
	if (static_cast<uint64_t>(cqe) < pending)
		return EINVAL;
	uint32_t entries = round_pow2(static_cast<uint32_t>(cqe));
	if (entries == cq->capacity)
		return 0;
	fabric &fab = *cq->ctx->fab;
	obj_ref nref;
	void *map = queue_create(fab, cq->ctx->lease, SV_OBJ_CQ, entries, sizeof(sv_cqe),
				 sizeof(sv_cq_ring), 0, nref,
				 static_cast<size_t>(entries) * sizeof(sv_cqe_payload));
	if (!map)
		return errno;
	auto *nr = static_cast<sv_cq_ring *>(map);
	nr->payload_offset =
		static_cast<uint32_t>(queue_bytes(sizeof(sv_cq_ring), entries, sizeof(sv_cqe)));
	memcpy(nr->async_addr, cq->ring->async_addr, sizeof(nr->async_addr));
	nr->async_len = cq->ring->async_len;
	memcpy(nr->channel_addr, cq->ring->channel_addr, sizeof(nr->channel_addr));
	nr->channel_len = cq->ring->channel_len;
	nr->cookie = cq->ring->cookie;
	nr->mod_count = cq->ring->mod_count;
	nr->flags = cq->ring->flags;
	// Close the old ring first: producers that find it closed (ESTALE) look
	// the CQ up again, and keep doing so until the QPs name the new ring,
	// which happens only once every entry of the old ring is across.  (The
	// other order let new producers write into the new ring's first slots
	// before the old entries were moved over them.)
	std::atomic_ref<uint64_t> prod(cq->ring->prod);
	uint64_t end = prod.fetch_or(SV_CQ_RING_CLOSED, std::memory_order_acq_rel);
	if ((end & ~SV_CQ_RING_CLOSED) - cq->head > entries) {
		// More arrived since the check above than the new size holds.
		prod.fetch_and(~SV_CQ_RING_CLOSED, std::memory_order_acq_rel);
		queue_destroy(fab, nref, map);
		return EINVAL;
	}
	// Producers that reserved before the close finish their entry quickly;
	// move everything up to `end` across in order.
	auto *ns = reinterpret_cast<sv_cqe *>(static_cast<char *>(map) + sizeof(sv_cq_ring));
	uint64_t moved = 0;
	uint64_t deadline = now_ns() + kResizeWaitNs;
	end &= ~SV_CQ_RING_CLOSED;
	for (uint64_t c = cq->head; c < end; c++) {
		sv_cqe &s = cq->slots[c & cq->mask];
		bool ready = true;
		while (std::atomic_ref<uint32_t>(s.seq).load(std::memory_order_acquire) !=
		       static_cast<uint32_t>(c + 1)) {
			if (now_ns() > deadline) {
				ready = false;
				break;
			}
			sched_yield();
		}
		if (!ready) {
			// A producer reserved this entry and never wrote it (it died or
			// froze mid-entry): the completion is lost, and the owner hears
			// of it as of an overflow, never silently.
			if (!nr->overflow) {
				nr->overflow = 1;
				sv_async_msg m{IBV_EVENT_CQ_ERR, SV_OBJ_CQ, nref.slot, nref.gen};
				send_async(nr->async_addr, nr->async_len, m);
			}
			continue;
		}
		settle_placement(cq, cq->ring, s, c);
		ns[moved] = s;
		ns[moved].seq = static_cast<uint32_t>(moved + 1);
		// (settle_placement left nothing in the payload to place)
		moved++;
	}
	nr->cons = 0;
	cq->head = 0;
	// The arm moves to the new ring, taken off the old one with an
	// exchange: a producer that published there before the close and has
	// yet to look at the arm finds it disarmed and raises nothing (copied
	// instead, the arm fired once there and stayed set here: two events
	// for one arm).  That producer's completion is among those moved, and
	// an arm over completions not yet polled fires at once, as
	// ibv_req_notify_cq does: one event.  One that fired there first left
	// it disarmed.  ibv_req_notify_cq waits on arm_lock until the CQ names
	// the new ring, so no arm lands on the old one.
	std::unique_lock<std::mutex> arm(cq->arm_lock);
	cq->announced = 0; // Indices of the old ring: none announced here
	cq->left_behind.store(false, std::memory_order_relaxed);
	cq->unsolicited_to = 0;
	uint32_t armed = std::atomic_ref<uint32_t>(cq->ring->armed)
				 .exchange(SV_CQ_DISARMED, std::memory_order_seq_cst);
	std::atomic_ref<uint32_t>(nr->armed).store(armed, std::memory_order_seq_cst);
	std::atomic_ref<uint64_t>(nr->prod).store(moved, std::memory_order_release);
	// A moderated CQ's count moves with its arm (a producer that counted
	// the last one there found the arm gone: the count fires here).
	uint32_t counted = std::atomic_ref<uint32_t>(cq->ring->mod_pending)
				   .exchange(0, std::memory_order_acq_rel);
	std::atomic_ref<uint32_t>(nr->mod_pending).store(counted, std::memory_order_relaxed);
	if (armed != SV_CQ_DISARMED) {
		bool fire = false;
		if (nr->mod_count > 1)
			fire = armed == SV_CQ_ARM_ALL && counted >= nr->mod_count;
		for (uint64_t i = 0; i < moved && !fire && nr->mod_count <= 1; i++)
			fire = armed == SV_CQ_ARM_ALL || (ns[i].flags & SV_CQE_SOLICITED) ||
			       ns[i].status != IBV_WC_SUCCESS;
		// No producer reaches this ring yet: the store is the disarm.
		if (fire) {
			std::atomic_ref<uint32_t>(nr->armed).store(SV_CQ_DISARMED,
								   std::memory_order_seq_cst);
			std::atomic_ref<uint32_t>(nr->mod_pending).store(0, std::memory_order_relaxed);
			notify_channel(nr);
		}
	}
	// Now producers may find the new ring: every QP and XRC SRQ that
	// completes into this CQ names it.
	{
		registry_guard rg(fab);
		sv_registry *reg = fab.reg();
		for (auto &q : reg->qps)
			if (q.in_use && q.rcq_obj == cq->ref.slot && q.rcq_gen == cq->ref.gen) {
				q.rcq_obj = nref.slot;
				q.rcq_gen = nref.gen;
			}
		for (auto &o : reg->objs)
			if (o.in_use && o.kind == SV_OBJ_SRQ && o.cq_obj == cq->ref.slot &&
			    o.cq_gen == cq->ref.gen) {
				o.cq_obj = nref.slot;
				o.cq_gen = nref.gen;
			}
	}
	// The channel counts events lost from here on in the new ring's word;
	// those counted in the old one move across below, as late as possible.
	if (ibcq->channel)
		verbs_comp_channel_lost_word(ibcq, &nr->lost_events);
	objects_remove(SV_OBJ_CQ, cq->ref.slot);
	objects_add_former(SV_OBJ_CQ, cq->ref.slot, cq->ref.gen, ibcq);
	objects_add(SV_OBJ_CQ, nref.slot, ibcq);
	obj_ref oref = cq->ref;
	sv_cq_ring *old = cq->ring;
	cq->ref = nref;
	cq->slots = ns;
	cq->mask = entries - 1;
	cq->capacity = entries;
	note_geometry(cq, nr); // Before the ring: a pusher that finds it finds this
	std::atomic_ref<sv_cq_ring *>(cq->ring).store(nr, std::memory_order_seq_cst);
	arm.unlock();
	ibcq->cqe = static_cast<int>(entries);
	// A thread of ours that loaded the old ring's address before the swap
	// (push_own) may still be in it, finding it closed: unmap it only once
	// none is.  They never block inside, so this wait is short.
	while (cq->pushers.load(std::memory_order_seq_cst))
		sched_yield();
	// Events counted lost on the old ring: after the wait, so that a
	// producer of ours that fired there before the arm moved and found the
	// channel full is counted.  (One in another process, between its
	// disarm and its count, can still miss: a window of a send call.)
	std::atomic_ref<uint32_t>(nr->lost_events)
		.fetch_add(std::atomic_ref<uint32_t>(old->lost_events).exchange(0),
			   std::memory_order_seq_cst);
	drop_old_geometry(cq);
	queue_destroy(fab, oref, old);
	return 0;
}

int loop_dv_cq_agent(ibv_cq *ibcq, int on, softverbs_dv_cq *out)
{
	loop_cq *cq = to_loop_cq(ibcq);
	if (!cq->life.is(kLifeCq))
		return life_bad("softverbs_dv_cq_agent", cq, cq->life, kLifeCq);
	std::lock_guard<qlock> g(cq->lock);
	if (!cq->ring)
		return EINVAL; // Destroyed meanwhile by another thread
	if (on) {
		if (!out)
			return EINVAL;
		if (cq->agent)
			return EBUSY;
		cq->agent = true;
		memset(out, 0, sizeof(*out));
		out->ring = cq->ring;
		out->slots = reinterpret_cast<softverbs_cqe *>(cq->slots);
		out->cons = &cq->ring->cons;
		out->count = cq->mask + 1;
		out->head = cq->head;
		return 0;
	}
	if (!cq->agent)
		return EINVAL;
	// The agent's progress, as far as it is believable: between what the
	// library last took and what producers have reserved.
	uint64_t c = std::atomic_ref<uint64_t>(cq->ring->cons).load(std::memory_order_acquire);
	uint64_t prod = std::atomic_ref<uint64_t>(cq->ring->prod).load(std::memory_order_acquire);
	if (c - cq->head <= (prod & ~SV_CQ_RING_CLOSED) - cq->head)
		cq->head = c;
	cq->agent = false;
	return 0;
}

} // namespace loop
