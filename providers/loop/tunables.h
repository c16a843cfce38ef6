// SPDX-License-Identifier: MIT
// Every tunable of the loop provider, in one place (eRPC's config.h style):
// the timings and sizes that trade latency, CPU and memory against each
// other.  None is a promise to the application (the device's limits are in
// loop_param.h) nor part of the ABI (kernel-abi/softverbs-abi.h); each can
// change without breaking a peer of another build.  The file named after
// each one says how it is used.
#pragma once

#include <cstddef>
#include <cstdint>

namespace loop {

// ---- Completion queues (verbs/loop_cq.cpp) ----
// A thread whose CQ polls have found nothing for kCqSpinNs sleeps in each
// further empty poll (futex, woken by the next completion) for at most
// kCqSleepNs: spinning longer would hold the core a peer needs, when
// pollers outnumber cores.
inline constexpr uint64_t kCqSpinNs = 100 * 1000;
inline constexpr long kCqSleepNs = 200 * 1000;
// A thread's empty polls are noted on up to kIdleCqs CQs, so that its
// sleep waits on all of them (a thread polling more sleeps no more: it
// yields).
inline constexpr int kIdleCqs = 8;
// A poller that finds a small SEND's placement claimed by its sender (see
// SV_PLACE_TAG) checks the sender's lease every kClaimCheckNs; cq_clean and
// resize, which must settle it, wait at most kSettleNs for a frozen sender.
inline constexpr uint64_t kClaimCheckNs = 10 * 1000 * 1000;
inline constexpr uint64_t kSettleNs = 5ULL * 1000 * 1000 * 1000;
// ibv_resize_cq waits this long for a producer that reserved an entry of
// the old ring to write it; past that the entry is reported lost (CQ_ERR).
// A producer that finds a ring closed looks again for this long, plus
// kClosedRingGraceNs, before it reports the CQ unusable (engine/completer.cpp,
// transport/loop/loop_transport.cpp, verbs/loop_qp.cpp).
inline constexpr uint64_t kResizeWaitNs = 2ULL * 1000 * 1000 * 1000;
inline constexpr uint64_t kClosedRingGraceNs = 1000ULL * 1000 * 1000;
// How long the destroy of a CQ whose ring an application's allocator placed
// waits for producers that reserved a slot to publish it, before the ring
// goes back to the application (loop_cq.cpp, close_placed).
inline constexpr uint64_t kPlacedDrainNs = 1000ULL * 1000 * 1000;

// ---- The agents' engine thread (engine/loop_engine.cpp) ----
// In futex mode it spins this long after the last work it found before it
// sleeps on a futex over the doorbell records.
inline constexpr uint64_t kEngineSpinNs = 50 * 1000;
// Its futex sleep when every agent ring can wake it (a timeout only so
// that a lost wake-up costs a second, not forever).
inline constexpr long kEngineSleepNs = 1000L * 1000 * 1000;
// Its sleep when some rings cannot wake it (more than futex_waitv's 128,
// or futex_waitv refused): the most such a ring's doorbell waits.
inline constexpr long kEngineShortSleepNs = 200 * 1000;

// ---- The progress thread (engine/loop_progress.cpp) ----
// A backlog that could not be run for want of memory is tried again after
// this long.
inline constexpr uint64_t kProgressRetryNs = 1000 * 1000;
// How often the progress thread looks at a send queue whose head is an
// RDMA WRITE on the wire (rocev2) with WRs waiting behind it.
inline constexpr uint64_t kWireWaitNs = 1000 * 1000;
// How often an RNR-waiting requester asks whether its responder still
// lives (engine/completer.cpp: book_retry): the check takes the registry
// lock and reads /proc, too much for every try of a 10 us RNR timer.
inline constexpr uint64_t kRnrAliveEveryNs = 50 * 1000 * 1000;

// ---- Queue pairs (loop.h, transport/loop/loop_transport.cpp) ----
// Deferred SENDs a QP remembers (note_deferred) before it places them all
// itself.
inline constexpr size_t kMaxDeferred = 256;

// ---- Objects (verbs/objects.cpp) ----
// Destroyed objects kept, oldest first overwritten.  Bounded so that an
// application that creates and destroys objects forever does not grow: a
// pointer used long after its object was destroyed may read reused memory.
inline constexpr size_t kQuarantine = 1024;

// ---- Peer memory (transport/loop/peer_maps.cpp) ----
// Mappings of peers' fd-backed memory kept cached, beyond those pinned by
// segments in use.
inline constexpr size_t kMaxMaps = 256;

// ---- Port queries (verbs/loop_query.cpp) ----
// An Ethernet port's GID table, read from the netdev's addresses, is
// cached this long.
inline constexpr uint64_t kGidCacheNs = 1000ULL * 1000 * 1000;

// ---- Moving bytes (transport/loop/xfer.h) ----
// Writes of kRelaxedMinBytes or more into a relaxed-ordering MR place
// their last kRelaxedChunk bytes first, then the rest in address order
// (relaxed_copy, xfer.h).
inline constexpr size_t kRelaxedMinBytes = 64 * 1024;
inline constexpr size_t kRelaxedChunk = 16 * 1024;
static_assert(kRelaxedChunk <= kRelaxedMinBytes, "relaxed_copy's tail lies within the write");
// Without relaxed ordering, a write's last kOrderedTail bytes are stored
// after the rest (ordered_copy, xfer.h): a poller of the last byte sees the
// whole message.  A cache line.
inline constexpr size_t kOrderedTail = 64;

// ---- The service copy path (transport/loop/service.cpp) ----
// A requester spins this many looks at its request's state, then sleeps
// kServiceWaitNs per look.
inline constexpr int kServiceSpinIters = 2000;
inline constexpr long kServiceWaitNs = 1000 * 1000;
// A request unanswered this long makes the requester check the peer's lease.
inline constexpr uint64_t kPeerTimeoutNs = 2000000000ULL;
// A live peer whose service has not answered one request in this long is
// stuck, or its ring was written over: the copy fails (ETIMEDOUT) rather
// than waiting on.  A request is one bounce buffer, microseconds of work.
inline constexpr uint64_t kServiceGiveUpNs = 5 * kPeerTimeoutNs;
// The serving thread looks at its `stop` word this often.
inline constexpr long kServiceStopPollNs = 100000000;
// ibv_dereg_mr / ibv_rereg_mr wait this long at most for copies into the
// MR's memory in flight (mr_copiers.h): a copy is one system call of at
// most max_msg_sz bytes, well under a second; a copier frozen or killed in
// one is not waited for longer.
inline constexpr int kCopyWaitMs = 5000;
// A LOCAL_INV whose key still has copies in flight looks again this much
// later (mr_local_inv; the posting call returns at once).
inline constexpr uint64_t kInvPollNs = 20000;

// ---- The fabric registry (transport/loop/fabric.cpp) ----
// A process opening a fabric waits this long (in 1 ms steps) for its
// creator to size and initialise the segment.
inline constexpr int kReadyWaitMs = 2000;
// The registry lock (its protocol is written at fabric.cpp's "the
// registry lock"): tries spinning kLockSpins times, then sleeps at most
// kLockSleepNs per FUTEX_WAIT before judging the holder again; a holder's
// start time is checked once its value has stood kLockCheckNs, a zero
// holder_start once it has stood kLockZeroStartNs.
inline constexpr int kLockSpins = 100;
inline constexpr uint64_t kLockSleepNs = 20000000ULL;
inline constexpr uint64_t kLockCheckNs = 200000000ULL;
inline constexpr uint64_t kLockZeroStartNs = 2000000000ULL;

// ---- The engine (engine/, transport/loop/loop_transport.cpp) ----
// The QP's local ACK timeout, 4.096 us << timeout, is capped at
// kTimeoutCapNs, which also stands for timeout 0 ("infinite" in the spec):
// a dead peer never holds a WR forever (engine/completer.cpp, timeout_ns).
inline constexpr uint64_t kTimeoutCapNs = 1000ULL * 1000 * 1000;
// The scratch area behind the null MR, reused for any length
// (engine/requester.cpp).
inline constexpr size_t kNullChunk = 1 << 16;
// The fabric's striped atomic locks (loop_transport.cpp, atomic_guard): a
// waiter yields after kAtomicSpins tries, checks the holder every
// kAtomicCheckEvery tries (a power of two), and takes over a lock that
// has named the same running process for kAtomicTakeoverNs (a stray write;
// a stopped holder still holds).
inline constexpr uint64_t kAtomicSpins = 64;
inline constexpr uint64_t kAtomicCheckEvery = 0x1000;
inline constexpr uint64_t kAtomicTakeoverNs = 2ULL * 1000 * 1000 * 1000;

} // namespace loop
