// SPDX-License-Identifier: MIT
// The loop provider's objects.  Each embeds the libibverbs object it
// extends as its first member (standard layout, no virtual functions) and is
// recovered with a to_loop_*() helper, as rdma-core providers do.
#pragma once

#include "../../libibverbs-compat/driver.h"
#include "fabric.h"
#include "loop_param.h"
#include "objects.h"
#include "qlock.h"
#include "queue_geom.h"
#include "queue_seg.h"
#include "softverbs_dv.h"
#include "tunables.h"
#include "xfer.h"

#include <atomic>
#include <unistd.h>
#include <cerrno>
#include <cstddef>
#include <mutex>
#include <string>
#include <vector>

namespace loop {

struct loop_device {
	verbs_device vdev; // Must be first
	std::string name;
	device_config cfg;
	uint64_t dm_used; // Device memory handed out by this process, under the DM lock
};

struct gid_slot {
	ibv_gid gid;
	ibv_gid_type type;
	bool valid;
};

struct loop_context {
	verbs_context vctx; // Must be first
	fabric *fab;
	sv_device_rec *dev; // This device's record in the registry
	loop_device *ldev;
	int lease;
	uint32_t lease_gen;
	int async_fd; // Datagram socket: async events from any process
	uint8_t async_addr[108];
	uint32_t async_len;
	uint32_t identity;	       // Inode of cmd_fd: how ibv_import_device finds us
	loop_context *imported_from; // Set on a context made by ibv_import_device
	std::atomic<int> imports{0}; // Contexts ibv_import_device made from this one
	// Closed with objects live: the memory stays (loop_free_context) for
	// the application's destroys, but nothing new is made on it.
	std::atomic<bool> closed{false};
	// The process that opened it.  A forked child that closes its
	// inherited copy destroys nothing: the kernel's device file stays
	// open in the parent, and so do the objects.
	pid_t opener = 0;
};

struct loop_pd {
	ibv_pd base; // Must be first
	uint32_t pdn;
	bool parent_domain; // A loop_parent_domain (loop_td.cpp): pdn is its PD's
	bool imported;
	obj_life life{kLifePd}; // Users: MRs, MWs, QPs, SRQs, AHs, CQs, parent domains
};

struct loop_mr {
	verbs_mr vmr; // Must be first
	uint32_t slot; // In the registry's mrs[]
	// FD MRs: our dup of the descriptor and our mapping of the range.
	int fd = -1;
	void *map = nullptr;
	size_t map_len = 0;
	// Remapped plain MRs (loop_remap.h): the range held in the arena.
	uintptr_t remap_addr = 0;
	size_t remap_len = 0;
	// Plain MRs left where they are: the range noted (remap_note_plain).
	uintptr_t plain_addr = 0;
	size_t plain_len = 0;
	// BMME keys: the block list the record points at (max_pages entries;
	// peers read it from here) and the list a posted fast-reg WR staged.
	std::vector<uint64_t> pages;
	std::vector<uint64_t> staged;
	obj_life life{kLifeMr};
	parent_refs parents; // Its PD (and DM)
};

struct loop_mw {
	ibv_mw base; // Must be first
	uint32_t slot;
	obj_life life{kLifeMw};
	parent_refs parents; // Its PD
};

struct loop_dm {
	ibv_dm base; // Must be first
	void *addr;
	uint64_t length;
	loop_device *ldev;
	loop_dm *imported_from; // Set on an imported copy
	obj_life life{kLifeDm}; // Users: MRs on it
};

inline loop_dm *to_loop_dm(ibv_dm *d)
{
	return reinterpret_cast<loop_dm *>(d);
}

// loop_dm.cpp
ibv_dm *loop_alloc_dm(ibv_context *ctx, ibv_alloc_dm_attr *attr);
int loop_free_dm(ibv_dm *dm);
ibv_dm *loop_import_dm(ibv_context *ctx, uint32_t handle);
void loop_unimport_dm(ibv_dm *dm);
ibv_mr *loop_reg_dm_mr(ibv_pd *pd, ibv_dm *dm, uint64_t offset, size_t length,
		       unsigned int access);
ibv_mr *loop_reg_mr(ibv_pd *pd, void *addr, size_t length, uint64_t hca_va, int access);

// loop_import.cpp: sharing a context's objects with an imported context
verbs_context *loop_import_context(ibv_device *dev, int cmd_fd);
ibv_pd *loop_import_pd(ibv_context *ctx, uint32_t handle);
void loop_unimport_pd(ibv_pd *pd);
ibv_mr *loop_import_mr(ibv_pd *pd, uint32_t handle);
void loop_unimport_mr(ibv_mr *mr);

// The loop transport's last resolved keys of one QP (mr_resolve_cached,
// verbs/loop_mr.cpp): a connected QP names the same receive MR or target
// MR message after message, and a full resolution (the record's snapshot,
// its checks, the peer mapping's cache under a process-wide lock) cost
// about a quarter of a 64-byte SEND's instructions.  An entry is believed
// only while the record is unchanged (in use, the same key and cookie: every
// change of a record draws a new cookie) and the peer mapping is still in
// the process-wide cache (weak: the cache, not this, keeps a mapping, so a
// dead owner's memory still goes once the cache drops it), and for at most
// one tick of the coarse clock, after which the full path looks at the
// owner's liveness again.
// Whether the MR record of slot still is the registration of key byte
// kbyte and cookie, valid: its state, those fields, a fence, and the state
// again (a change of any field draws a new cookie).  The key cache's test
// (loop_mr.cpp: cache_lookup), and the express memo's.
[[gnu::always_inline]] inline bool mr_still(const sv_registry *r, uint32_t slot, uint32_t kbyte,
					    uint32_t cookie)
{
	const sv_mr_rec &m = r->mrs[slot];
	bool same = std::atomic_ref<const uint32_t>(m.state).load(std::memory_order_acquire) ==
			    SV_MR_VALID &&
		    std::atomic_ref<const uint32_t>(m.key).load(std::memory_order_relaxed) == kbyte &&
		    std::atomic_ref<const uint32_t>(m.cookie).load(std::memory_order_relaxed) == cookie;
	std::atomic_thread_fence(std::memory_order_acquire);
	return same &&
	       std::atomic_ref<const uint32_t>(m.state).load(std::memory_order_relaxed) == SV_MR_VALID;
}

struct key_cache {
	struct entry {
		bool valid = false;
		uint32_t key = 0;	  // The whole key asked for
		uint32_t owner_lease = 0; // As asked for
		sv_mr_rec rec{};	  // The record as resolved
		seg_kind kind{};	  // What resolve_body made of it
		char *base = nullptr;	  // Mapped kinds: our address of rec.iova's byte
		std::weak_ptr<void> map;  // Mapped kinds: the mapping base lies in
		int64_t tick = 0;	  // Coarse clock when resolved
	};
	entry e[2];
	uint8_t next = 0;
};

// One key as a lookup through a key_cache found it, kept so that the next
// use of the same key rechecks only what can change (its record, read by
// mr_still; its window) instead of looking it up again: the express memo
// (loop_transport.cpp) and a CQ's placements (loop_cq.cpp: place).  What
// it does not recheck (the record's PD, rights, range, kind) changes only
// with its cookie.
struct key_memo {
	uint32_t key = 0; // The whole key (0: none; slot 0 is never a key)
	uint32_t kbyte = 0, cookie = 0; // Its record's key byte and cookie
	uint64_t iova = 0, len = 0;	// The record's window
	uint32_t access = 0;		// The record's rights
	uint64_t addr = 0;		// Plain memory of ours: iova's byte here
	char *base = nullptr;		// Mapped here: our address of iova's byte
	std::weak_ptr<void> map;	// Mapped: the mapping base lies in
	int64_t tick = 0;		// Mapped: the coarse tick it was trusted in
};

// [iova, iova + len) within the window [lo, lo + wlen).
[[gnu::always_inline]] inline bool in_window(uint64_t iova, uint64_t len, uint64_t lo, uint64_t wlen)
{
	return iova >= lo && len <= wlen && iova - lo <= wlen - len;
}

// Whether k stands for key over [iova, iova + len): the same key, in its
// window, its record still the registration k was made from.
[[gnu::always_inline]] inline bool memo_key(const sv_registry *r, const key_memo &k, uint32_t key,
					    uint64_t iova, uint64_t len)
{
	return k.key && k.key == key && in_window(iova, len, k.iova, k.len) &&
	       mr_still(r, key >> SV_MR_KEY_BITS, k.kbyte, k.cookie);
}

// The entry of kc for key of owner_lease, if any (the entry a lookup just
// hit, for memo_key_keep).
const key_cache::entry *cached_entry(const key_cache &kc, uint32_t key, uint32_t owner_lease);
// Sets k from the key cache entry e of key (the entry a lookup just hit),
// or to none when e is not of the kind asked for (plain memory, or a
// mapping here).
void memo_key_keep(key_memo &k, const key_cache::entry *e, uint32_t key, bool mapped);

struct loop_cq {
	verbs_cq vcq; // Must be first
	loop_context *ctx;
	obj_ref ref;
	sv_cq_ring *ring;
	sv_cqe *slots;
	uint32_t mask;
	uint32_t capacity; // What the application asked for, rounded up
	qlock lock;	   // Polling (qlock.h)
	std::mutex arm_lock; // ibv_req_notify_cq against resize's swap of ring
	// Under arm_lock: the completions of the ring before this index were
	// published when the application took an event of this CQ
	// (ibv_get_cq_event), so that event announced them.  An arm fires at
	// once only for completions after it; those it announced and left
	// unpolled fire when a poll leaves them (loop_req_notify_cq).
	uint64_t announced = 0;
	// Set by a poll that left published completions behind it (it filled
	// its array, or stopped at one whose placement the sender still
	// holds): an arm fires at once for them, announced or not.
	std::atomic<bool> left_behind{false};
	// Under the poll lock: the entries from the ring's cons up to this
	// index are successes without the solicited flag, as a solicited-only
	// arm's look after a poll found them (cq_poll_end); it looks on from
	// here, not from cons each time.
	uint64_t unsolicited_to = 0;
	// Threads of this process inside push_own with the ring's address:
	// resize unmaps the old ring only once none is.
	std::atomic<uint32_t> pushers{0};
	// The geometry of each ring it had, checked when the ring was made
	// (creation, resize), so that push_own never reads it back from a
	// header a peer may rewrite (queue_geometry per push).  geo is the
	// newest, published before its ring is; each keeps the one before,
	// and all go with the CQ (a pusher may hold an older one).
	struct ring_geom {
		const sv_cq_ring *ring;
		queue_geom g;
		ring_geom *prev; // Freed by the resize after the next, or with the CQ
	};
	std::atomic<ring_geom *> geo{nullptr};
	// Set when a ring's record could not be made (no memory): push_own
	// then reads every ring's header, as before (a record of an older
	// ring could name the address of the new one).
	std::atomic<bool> geo_off{false};
	~loop_cq()
	{
		for (ring_geom *p = geo.load(std::memory_order_relaxed); p;) {
			ring_geom *prev = p->prev;
			delete p;
			p = prev;
		}
	}
	// Extended polling: the entry start_poll/next_poll made current.
	sv_cqe cur;
	uint64_t wc_flags_ex;
	bool locked; // start_poll took lock
	bool drained = true; // The batch's last start_poll/next_poll found the CQ empty
	bool single_threaded; // IBV_CREATE_CQ_ATTR_SINGLE_THREADED: polling takes no lock
	obj_life life{kLifeCq}; // Users: QPs, XRC SRQs
	parent_refs parents;	 // Its parent domain (create_cq_ex)
	// Placement of the head entry (under the poll lock): since when a
	// sender's claim was seen, and whether the owner places it itself.
	uint64_t claim_since;
	bool placing_self;
	uint64_t head; // Next entry to poll: the owner's own copy of the ring's cons
	std::atomic<bool> agent{false}; // Polled by an agent (softverbs_dv_cq_agent); set under lock
	// The poller's (under lock): the payload array of ring pls_ring with
	// pls_mask + 1 entries, as payloads() found it; and the receive keys
	// place() last resolved (key_cache).
	sv_cq_ring *pls_ring = nullptr;
	uint32_t pls_mask = 0;
	sv_cqe_payload *pls = nullptr;
	key_cache keys;
	key_memo place_key; // The key place() last placed into (plain memory of ours)
	// A ring placed by a parent domain's allocator: the domain (held in
	// parents) whose free gives it back, and the published file peers map.
	ibv_pd *alloc_pd = nullptr;
	std::shared_ptr<placed_file> placed;
};

struct loop_srq {
	verbs_srq vsrq; // Must be first
	loop_context *ctx;
	obj_ref ref;
	sv_rq_ring *ring;
	uint32_t max_wr;
	uint32_t max_sge;
	uint32_t limit;
	qlock lock; // Posting (qlock.h)
	obj_life life{kLifeSrq}; // Users: QPs
	parent_refs parents; // Its PD, and an XRC SRQ's domain and CQ
	// A ring placed by a parent domain's allocator (SOFTVERBS_RES_TYPE_SRQ).
	ibv_pd *alloc_pd = nullptr;
	std::shared_ptr<placed_file> placed;
};

struct loop_ah {
	ibv_ah base; // Must be first
	ibv_ah_attr attr;
	obj_life life{kLifeAh};
	parent_refs parents; // Its PD
};

// A send WR as the requester keeps it: copied at post time, so a WR that
// must wait (RNR, an unreachable peer) no longer refers to the caller's memory.
struct send_wr {
	uint64_t wr_id;
	ibv_wr_opcode opcode;
	unsigned int flags;
	uint32_t num_sge;
	ibv_sge sge[kMaxSge];
	uint32_t inline_len;
	bool is_inline;
	uint8_t inline_data[kMaxInlineData];
	uint64_t remote_addr;
	uint32_t rkey;
	__be32 imm_data;
	uint32_t invalidate_rkey; // LOCAL_INV, SEND_WITH_INV
	// BIND_MW: the window (slot in mrs[], type 1 or 2), the new rkey in
	// rkey, and the bind_info (bind_lkey 0 and bind_len 0: unbind a type 1).
	// kWrFastReg: mw_slot is the BMME key's slot, rkey its new key,
	// remote_addr the iova, bind_addr the first byte (virtual range) or the
	// offset into the first block (block list, staged in loop_mr::staged),
	// bind_len the length, bind_access the rights, npages/page_shift the list.
	uint32_t mw_slot;
	uint32_t mw_type;
	uint32_t bind_lkey;
	uint32_t bind_access;
	uint64_t bind_addr;
	uint64_t bind_len;
	uint32_t npages;
	uint32_t page_shift;
	loop_mr *frmr; // kWrFastReg: the key's object
	uint64_t compare_add;
	uint64_t swap;
	// UD
	ibv_ah_attr ah;
	uint32_t remote_qpn;
	uint32_t remote_qkey;
	// XRC
	uint32_t xrc_srqn;
	uint64_t sq_index; // Its WQE's number in the send queue (loop_qp::sq_posted when posted)
	// Retry state
	int rnr_left;
	int retry_left;
	uint64_t next_try_ns;
	// LOCAL_INV of a fast-register key, done, waiting for the copies in
	// flight through it to drain (registration inv_cookie of record
	// mw_slot) until inv_until_ns: it completes then (mr_local_inv).
	bool inv_waiting;
	uint32_t inv_cookie;
	uint64_t inv_until_ns;
	uint32_t psn; // Its request's sequence number (engine.h: kNoPsn until it is sent)
};


struct loop_qp {
	verbs_qp vqp; // Must be first
	loop_context *ctx;
	uint32_t slot; // In the registry's qps[]
	uint32_t qpn;
	uint32_t pdn;
	uint32_t ece_options = 0; // Accepted by ibv_set_ece (loop_query.cpp)
	ibv_qp_type type;
	bool opened; // A handle from ibv_open_qp on another's XRC target QP
	// XRC target QPs (created or opened): this handle's SV_OBJ_XRC_QP record
	obj_ref xrc_handle{SV_MAX_OBJS, 0};
	obj_ref rq_ref;
	sv_rq_ring *rq; // Null with an SRQ or for send-only QPs
	queue_geom rq_geom{}; // rq's, checked when it was made (rq_post)
	loop_cq *scq;
	loop_cq *rcq;
	loop_srq *srq;
	ibv_qp_cap cap;
	bool sq_sig_all;
	// IBV_QP_CREATE_BLOCK_SELF_MCAST_LB: its own multicast sends do not
	// come back to it (without it they do, as on an HCA: lt_mcast_members).
	bool block_self_mcast = false;
	qlock sq_lock; // Posting sends and running the requester (qlock.h)
	// Send-queue slots: a WR holds one from its post until its completion,
	// or a later one's, is polled.  posted moves under sq_lock, retired
	// when the send CQ's poller takes a completion (cq_take).
	std::atomic<uint64_t> sq_posted;
	std::atomic<uint64_t> sq_retired;
	qlock rq_lock; // Posting receives (qlock.h)
	// A receive queue placed by a parent domain's allocator
	// (SOFTVERBS_RES_TYPE_RQ): the domain whose free gives it back (held in
	// parents), and the published file peers map.
	ibv_pd *rq_alloc_pd = nullptr;
	std::shared_ptr<placed_file> rq_placed;
	bool rq_agent = false; // Posted to by an agent (softverbs_dv_qp_rq), under rq_lock
	// Receive completions of this QP's own receive queue that its receive
	// CQ's poller took (cq_take): each is a WQE some consumer took before
	// it pushed the completion, so the count is a lower bound of the ring's
	// cons that costs no look at the consumers' line (rq_post).  Written
	// by the poller under the CQ's lock, read by rq_post.
	std::atomic<uint64_t> rq_polled{0};
	ibv_qp_attr attr;   // What modify_qp set, for query_qp
	// The send queue: a ring of WQEs in shared memory (sv_sq_ring,
	// kernel-abi/softverbs-abi.h).  The WQEs in [sq_cons, sq_posted) are
	// the requester's backlog: the head one may wait for an RNR timer or
	// a retry, and those behind it wait with it.  The geometry and the
	// indices here are the trusted copies; the ring's header only
	// publishes them.  Under sq_lock, but for sq_retired.
	sv_sq_ring *sq = nullptr;
	size_t sq_bytes = 0;
	ibv_pd *sq_alloc_pd = nullptr; // The parent domain whose allocator gave the ring
	uint32_t sq_mask = 0;
	uint32_t sq_stride = 0;
	uint64_t sq_cons = 0;
	// The head WQE as the requester decoded it, with its retry state;
	// valid while sq_head_valid.
	bool sq_head_valid = false;
	send_wr sq_head;
	// RTS -> SQD asked for IBV_EVENT_SQ_DRAINED and it is not raised yet
	// (sq_drained, completer.cpp).  Under sq_lock.
	bool sqd_notify = false;
	uint32_t req_psn = 0; // The requester's next sequence number (requester.cpp)
	// The requester's scratch lists of resolved segments (local SGEs, the
	// remote key's range), used under sq_lock: per QP, not thread_local,
	// since every thread_local access in a shared library is a call
	// (small_vec.h).
	std::vector<rseg> req_segs;
	std::vector<rseg> req_riov;
	// The last local keys its SGEs named (key_cache above), under sq_lock.
	key_cache req_keys;
	// The same for the peer's responder, which runs on this QP's requester
	// (responder.cpp): the receive WQE taken, its segments.
	std::vector<uint8_t> resp_wqe_buf;
	std::vector<rseg> resp_riov;
	// The requester's doorbell batch (engine.h: rdma_batch), staged WRs in
	// WR order: what each completes with, and their local iovecs and
	// target segments, nlocal and nremote of them each, one after another.
	// Per QP for the capacity of the lists; empty outside a posting call.
	struct batch_wr {
		uint64_t wr_id;
		unsigned int flags;
		uint32_t psn;
		uint32_t len;
		uint32_t nlocal;
		uint32_t nremote;
		bool relaxed;
	};
	std::vector<batch_wr> batch_wrs;
	std::vector<iovec> batch_local;
	std::vector<rseg> batch_remote;
	// Per slot: the fast-register key object a library-posted WQE names
	// (process memory: never read from the ring).
	// What only the library knows of the WQEs it wrote (the ring is
	// writable by agents): slot i's entry describes WQE number index1 - 1.
	// A fast-register's key object, and the window of a type 1 bind that
	// ibv_bind_mw posted; an agent's WQE matches no entry.
	struct lib_wqe {
		uint64_t index1;
		loop_mr *frmr;
		uint32_t bind1_slot;
	};
	std::vector<lib_wqe> sq_lib;
	// Handed to an agent (softverbs_dv_qp_agent): the agent is the ring's
	// producer, the engine thread serves its doorbell, and ibv_post_send
	// fails with EINVAL.  sq_bad_db: a doorbell value refused (ignored
	// until the agent rings another).  Under sq_lock.
	std::atomic<bool> agent{false}; // Read unlocked by retire_sq
	uint64_t sq_bad_db = 0;
	bool in_progress_list;
	// book_retry's last liveness check of an RNR-waiting peer (under sq_lock).
	uint64_t rnr_checked_ns = 0;
	uint8_t rnr_timer = 0;
	bool rnr_peer_alive = true;
	// SENDs whose data waits in the peer's CQE payload for the peer to
	// place it.  Anything this QP moves later places them first, so that
	// bytes still land in the order the QP sent them.  Under sq_lock.
	struct deferred_send {
		obj_ref cq;	// Looked up again when used: the CQ may be gone
		uint64_t index; // Reservation index of the CQE
		void *dst;	// Receive buffer in the peer's address space
		pid_t pid;
		sv_mr_rec *mr;	 // dst's registration, held for the copy (mr_copiers.h)
		uint32_t cookie; // and its cookie
	};
	std::vector<deferred_send> deferred; // Room for kMaxDeferred + 1, reserved at creation
	// The loop transport's last two peer queues (the peer's receive queue
	// and its CQ, for a connected QP), held: a SEND maps them without the
	// process-wide map's lock (loop_transport.cpp: qp_queue_ref).  Used
	// under sq_lock, or by the one thread that uses a RoCE v2 proxy QP.
	struct queue_cache {
		obj_ref ref{};
		sv_obj_kind kind{};
		queue_hold hold;
		queue_geom geom{}; // As checked when the mapping was made
	};
	queue_cache tp_queues[2];
	uint8_t tp_queue_next = 0;
	// The peer the loop transport last found for this QP (find_qp), for
	// the address it was asked (QP number, LID, link layer): its record as
	// found, its port's LID, its owner's pid.  A connected QP asks for the
	// same peer every time; each use checks the record again (slot in use,
	// same generation and owner, the owner's lease not reaped) and reads
	// it afresh.  Not for UD, nor for a QP of this process.  Under sq_lock.
	struct peer_cache {
		bool valid = false;
		bool eth = false;
		uint16_t dlid = 0;
		uint16_t lid = 0;
		uint32_t qpn = 0;
		uint32_t slot = 0;
		int32_t pid = 0;
		sv_qp_rec rec{};
	} tp_peer;
	// Its last resolved keys (key_cache above).  Used under sq_lock, or
	// by the one thread that uses a RoCE v2 proxy QP.
	key_cache tp_keys;
	// The express way's memo (loop_transport.cpp: memo_write, memo_send):
	// what lt_express checked through the peer, queue and key caches for
	// its last express RDMA WRITE into mapped memory and its last SEND
	// (the peer, its receive queue and CQ, the keys), kept so that the
	// next WR rechecks only what can change (the records' state, key,
	// cookie and generation, the peer's state, port, rights and receive
	// CQ, the queues' records, the tick of a mapping) instead of looking
	// them up again.  Under sq_lock.
	using key_memo = loop::key_memo;
	// The peer an express memo was made for: the QP's address then, and
	// the peer QP's slot and the record fields of its life.
	struct peer_memo {
		bool valid = false;
		uint8_t port = 0; // The QP's address it was made for
		uint16_t dlid = 0;
		uint32_t dest_qpn = 0;
		uint32_t slot = 0;
		uint32_t gen = 0;
		uint32_t owner_lease = 0;
		uint32_t owner_gen = 0;
		uint32_t type = 0;
		uint32_t port_now = 0; // Its port (a QP may move, RESET->INIT)
		int32_t pid = 0;
		int64_t alive_tick = 0; // The coarse tick its owner was last found alive in
	};
	struct express_memo {
		// The local key of its last express WRITE or SEND (plain memory).
		key_memo local;
		// The last express SEND's receive key (mapped here, or plain
		// memory of the receiver), asked for a peer of this owner lease
		// and PD.
		key_memo recv;
		uint32_t recv_owner = 0, recv_pdn = 0;
		// The WRITE's: valid while the peer and target hold.
		peer_memo wpeer;
		bool relaxed = false; // The target granted relaxed ordering
		key_memo target;      // The target MR, mapped here
		// The SEND's: the peer's own receive queue (not an SRQ) and its
		// receive CQ, held mapped, with the geometry checked at mapping.
		peer_memo speer;
		uint32_t s_qpn = 0; // The peer's QP number (its CQEs' qp_num)
		uint32_t s_pdn = 0; // Its PD: its receive keys' domain
		uint16_t slid = 0;  // Our port's LID
		obj_ref rq{}, cq{};
		queue_hold rqh, cqh;
		queue_geom rqg{}, cqg{};
		// Where the next SEND will likely take and push (lt_warm's
		// prefetches, no load from the rings): the index after the last.
		uint64_t rq_next = 0, cq_next = 0;
	} xmemo;
	// The lease flags (SV_LEASE_*) its express WRs have noted already
	// (loop_transport.cpp: express_note).  Under sq_lock.
	uint32_t express_noted = 0;
	// Its connected peer is on another host (set at RTR from the address
	// vector's GID, rocev2/rocev2.cpp): its requests go over RoCE v2.
	// Under sq_lock.
	bool wire_remote = false;
	// The first send-queue index not handed to the wire (rocev2_write_start):
	// WRs in [sq_cons, wire_next) are in flight there, and the receive
	// thread completes them.  Under sq_lock.
	uint64_t wire_next = 0;
	struct wr_builder *builder; // ibv_wr_* state (loop_qp_ex.cpp); null without send_ops_flags
	obj_life life{kLifeQp};
	parent_refs parents; // Its PD, CQs, SRQ, XRC domain
};

template <typename T, typename M> inline T *container_of_first(M *m)
{
	static_assert(std::is_standard_layout_v<T>);
	return reinterpret_cast<T *>(m);
}

inline loop_device *to_loop_device(ibv_device *d)
{
	return container_of_first<loop_device>(d);
}
inline loop_context *to_loop_context(ibv_context *c)
{
	return reinterpret_cast<loop_context *>(reinterpret_cast<char *>(c) -
						offsetof(loop_context, vctx.context));
}
// A context a forked child inherited and then closed: the objects are the
// parent's, which that close left alone, and a command through it (a
// destroy, a modify, a registration on its PD) answers EBADF, as the
// kernel answers a command on a closed device file.  (Before
// the close, the child shares the parent's file, and a destroy is the
// parent's object's end, as with the kernel.)
inline bool ctx_orphaned(ibv_context *c)
{
	loop_context *l = to_loop_context(c);
	return l->closed.load(std::memory_order_acquire) && l->opener != getpid();
}
// ctx_orphaned's answer for a verb that returns an object: null, EBADF.
template <typename T> T *fail_orphaned()
{
	errno = EBADF;
	return nullptr;
}
inline loop_pd *to_loop_pd(ibv_pd *p)
{
	return container_of_first<loop_pd>(p);
}
inline loop_mr *to_loop_mr(ibv_mr *m)
{
	return container_of_first<loop_mr>(m);
}
inline loop_cq *to_loop_cq(ibv_cq *c)
{
	return container_of_first<loop_cq>(c);
}
inline loop_cq *to_loop_cq_ex(ibv_cq_ex *c)
{
	return container_of_first<loop_cq>(c);
}
inline loop_qp *to_loop_qp(ibv_qp *q)
{
	return container_of_first<loop_qp>(q);
}
inline loop_srq *to_loop_srq(ibv_srq *s)
{
	return container_of_first<loop_srq>(s);
}
inline loop_ah *to_loop_ah(ibv_ah *a)
{
	return container_of_first<loop_ah>(a);
}

// loop_query.cpp
int loop_query_device_ex(ibv_context *ctx, const ibv_query_device_ex_input *input,
			 ibv_device_attr_ex *attr, size_t attr_size);
int loop_query_port(ibv_context *ctx, uint8_t port, ibv_port_attr *attr);
int loop_query_gid_ex(ibv_context *ctx, uint32_t port, uint32_t index, ibv_gid_entry *entry,
		      uint32_t flags);
int loop_query_pkey(ibv_context *ctx, uint8_t port, int index, __be16 *pkey);
int loop_query_rt_values(ibv_context *ctx, ibv_values_ex *values);
// Fills the GID table of a port; returns the number of valid slots.  An
// Ethernet port's table is read from the netdev's addresses; cached: a copy
// at most a second old (the data path), else read now (queries).
int loop_gid_table(loop_context *lctx, uint32_t port, gid_slot *table, int max,
		   bool cached = false);
// An address's source GID index on port: 0 when the slot holds a GID,
// EINVAL beyond the table, ENODATA for an empty slot (the kernel's
// rdma_get_gid_attr, which create_ah and modify_qp's AV go through).
int loop_sgid_check(loop_context *lctx, uint32_t port, uint32_t index);

// loop_pd.cpp
ibv_pd *loop_alloc_pd(ibv_context *ctx);
int loop_dealloc_pd(ibv_pd *pd);

// loop_mr.cpp
ibv_mr *loop_reg_mr(ibv_pd *pd, void *addr, size_t length, uint64_t hca_va, int access);
int loop_dereg_mr(verbs_mr *vmr);
int loop_rereg_mr(verbs_mr *vmr, int flags, ibv_pd *pd, void *addr, size_t length, int access);
ibv_mr *loop_alloc_null_mr(ibv_pd *pd);
// Looks up a key for an access by (lease, pdn) of `need` rights to
// [iova, iova + len).  Returns the address in the owner's space, or an error
// (ENOENT bad key, EACCES rights or PD, ERANGE bounds).
// An fd-backed MR of a peer resolves to our own mapping of it (mapped).
// Byte off (from iova) of the MR record c (not a window) as a byte of the
// file under it, for memory over a file (an FD MR, a remapped MR, a plain
// MR over a shared mapping of a file): the same for every mapping of that
// byte in every process, as an HCA's atomics meet on the physical word.
// 0 for anything else.  Atomics take the stripe of this and that of the
// owner's address (atomic_guard): two keys of one owner at one address
// always meet, whatever each knows of the file, and so do two mappings of
// one file.  A collision of the hash costs only a shared lock.
inline uint64_t mr_file_word(const sv_mr_rec &c, uint64_t off)
{
	if (c.fd_ino && !(c.flags & SV_MR_BLOCK_LIST) &&
	    (c.kind == SV_MR_KIND_FD || (c.flags & (SV_MR_MAPPED | SV_MR_SHARED_FILE))))
		return (1ULL << 63) | ((c.fd_ino * 0x9e3779b97f4a7c15ULL) ^ (c.fd_offset + off));
	return 0;
}

struct mr_hit {
	uint64_t addr;
	uint32_t kind;
	uint32_t slot;
	uint32_t access; // The rights of the key that was named (a window's own)
	bool mapped;	 // addr is in this process (fd-backed MR of a peer)
	bool odp;	 // May be unmapped: copy with a checked call, even in-process
	std::shared_ptr<void> pin; // With mapped: keeps addr's mapping while this lives
	uint64_t owner_addr;	   // addr's byte in the owner's address space
	uint64_t file_word;	   // addr's byte in the file under it (mr_file_word), or 0
	// The registration the word is reached through, held for the copy
	// (mr_copiers.h).
	sv_mr_rec *mr = nullptr;
	uint32_t mr_cookie = 0;
};
// pdn for a lookup that does not check the PD (the owner placing data it
// was sent into its own memory: the sender checked the PD).
inline constexpr uint32_t kAnyPdn = UINT32_MAX;
int mr_lookup(fabric &fab, uint32_t key, uint32_t owner_lease, uint32_t pdn, uint64_t iova,
	      uint64_t len, uint32_t need, uint32_t qpn, mr_hit &hit);
// Resolves [iova, iova + len) of a key into target segments (a block-list
// MR may give several), appended to out.  Same checks and errors as
// mr_lookup, plus EFAULT when a peer's block list cannot be read.
int mr_resolve(fabric &fab, uint32_t key, uint32_t owner_lease, uint32_t pdn, uint64_t iova,
	       uint64_t len, uint32_t need, uint32_t qpn, std::vector<rseg> &out,
	       uint32_t *access = nullptr);
// Every change of a valid record goes: mr_begin_change (out of service),
// the fields, mr_publish_change (a new cookie, valid again): readers'
// snapshots and the key caches rely on it.  Under the registry lock.
void mr_begin_change(sv_mr_rec &m);
void mr_publish_change(sv_mr_rec &m);
// mr_resolve through a QP's key cache (key_cache above): the same answer,
// the same errors.
int mr_resolve_cached(fabric &fab, key_cache &kc, uint32_t key, uint32_t owner_lease, uint32_t pdn,
		      uint64_t iova, uint64_t len, uint32_t need, uint32_t qpn,
		      std::vector<rseg> &out, uint32_t *access);
// Its hit alone, for memory reached by its own address (no mapping to pin):
// true with the address of [iova, iova + len) in out and the segment's kind,
// or false when mr_resolve_cached must decide (a miss, a change, a mapped
// peer, a check that fails).  No list to build: a local SGE's fast path.
bool mr_cached_own(fabric &fab, key_cache &kc, uint32_t key, uint32_t owner_lease, uint32_t pdn,
		   uint64_t iova, uint64_t len, uint32_t need, iovec &out, seg_kind &kind);
// The express way's target (loop_transport.cpp: lt_express): a hit of
// kc as mr_resolve_cached would give it, as one segment: true with its
// address in dst, its kind, the key's rights in access, and pin holding a
// mapping dst lies in (mapped kinds); false when mr_resolve_cached must
// decide (a miss, a change, a stale mapping, a check that fails).
bool mr_cached_target(fabric &fab, key_cache &kc, uint32_t key, uint32_t owner_lease, uint32_t pdn,
		      uint64_t iova, uint64_t len, uint32_t need, char *&dst, seg_kind &kind,
		      uint32_t &access, std::shared_ptr<void> &pin);
// The private opcode of a BMME fast-register WR (softverbs_post_fast_reg).
inline constexpr ibv_wr_opcode kWrFastReg = IBV_WR_DRIVER1;
// Its completion opcode, SOFTVERBS_WC_FAST_REG (8: unused by verbs.h).
inline constexpr ibv_wc_opcode kWcFastReg = static_cast<ibv_wc_opcode>(8);
// Local memory operations, run by the requester in WR order: BIND_MW,
// LOCAL_INV, kWrFastReg.  kWrFastReg: returns the completion status.
ibv_wc_status mr_local_op(loop_qp *qp, send_wr &w);
// BIND_MW w: true with its status in st once done; false while copies
// through the bound window's old binding are still in flight (a type 1
// window bound again or unbound; w's next_try_ns set, as mr_local_inv).
bool mr_bind(loop_qp *qp, send_wr &w, ibv_wc_status &st);
// LOCAL_INV w: true with its status in st once done; false when the key
// is invalidated but copies through it are still in flight (w's
// next_try_ns set: run it again then; the WRs behind it wait).
bool mr_local_inv(loop_qp *qp, send_wr &w, ibv_wc_status &st);
// SEND_WITH_INV at the responder: invalidates rkey on behalf of the
// receiving QP (its owner, PD and, for type 2 windows, the QP itself).
// Returns 0 or an errno.
int mr_remote_invalidate(fabric &fab, uint32_t owner_lease, uint32_t pdn, uint32_t qpn,
			 uint32_t rkey);
// Copies a bind_mw / fast-reg ibv_send_wr into w; 0 or an errno.
// What ibv_bind_mw and softverbs_post_fast_reg give the posting path
// beyond the ibv_send_wr (an argument, not thread-local state): a type 1
// window may be bound, or the fast-register's own fields.
struct mem_wr_extra {
	bool bind_type1;
	const softverbs_fast_reg_wr *fast_reg;
};
int mr_copy_wr(loop_qp *qp, const ibv_send_wr *in, send_wr &w, const mem_wr_extra *x);
ibv_mw *loop_alloc_mw(ibv_pd *pd, ibv_mw_type type);
int loop_dealloc_mw(ibv_mw *mw);
int loop_bind_mw(ibv_qp *qp, ibv_mw *mw, ibv_mw_bind *bind);
int loop_advise_mr(ibv_pd *pd, ibv_advise_mr_advice advice, uint32_t flags, ibv_sge *sg,
		   uint32_t num_sge);
ibv_mr *loop_reg_dmabuf_mr(ibv_pd *pd, uint64_t offset, size_t length, uint64_t iova, int fd,
			   int access);
ibv_mr *loop_reg_mr_fd(ibv_pd *pd, int fd, int fd_type, uint64_t offset, size_t length,
		       uint64_t iova, unsigned int access);
int loop_rereg_mr_fd(ibv_mr *mr, int flags, ibv_pd *pd, int fd, int fd_type, uint64_t offset,
		     size_t length, uint64_t iova, unsigned int access);
ibv_mr *loop_alloc_fast_reg_mr(ibv_pd *pd, uint32_t max_pages);
int loop_post_fast_reg(ibv_qp *qp, const softverbs_fast_reg_wr *wr);

// loop_cq.cpp
ibv_cq *loop_create_cq(ibv_context *ctx, int cqe, ibv_comp_channel *channel, int comp_vector);
ibv_cq_ex *loop_create_cq_ex(ibv_context *ctx, ibv_cq_init_attr_ex *attr);
int loop_destroy_cq(ibv_cq *cq);
int loop_poll_cq(ibv_cq *cq, int n, ibv_wc *wc);
int loop_req_notify_cq(ibv_cq *cq, int solicited_only);
void loop_cq_event(ibv_cq *cq);
void cq_poll_end(loop_cq *cq, bool filled);
int loop_resize_cq(ibv_cq *cq, int cqe);
int loop_modify_cq(ibv_cq *cq, ibv_modify_cq_attr *attr);
// Pushes a completion into any CQ ring (ours or a peer's).  Returns 0, or
// ENOSPC when the ring overflowed (the owner then gets IBV_EVENT_CQ_ERR).
int cq_push(sv_cq_ring *ring, sv_cqe &e, bool solicited,
	    const sv_cqe_payload *payload = nullptr, uint64_t *index = nullptr);
// The same, with the geometry this process checked when it mapped the ring
// (queue_geometry), which a caller that keeps the mapping may keep too.
int cq_push(sv_cq_ring *ring, const queue_geom &g, sv_cqe &e, bool solicited,
	    const sv_cqe_payload *payload, uint64_t *index);
// The sender's side of SV_CQE_PLACE: places a deferred payload itself
// unless the owner already took it.  Returns 0 or an errno of the copy.
int cq_place_deferred(sv_cq_ring *ring, uint64_t index, void *dst, pid_t pid, sv_mr_rec *mr,
		      uint32_t cookie);
// Whether a (possibly peer's) CQ ring has a valid payload array.
bool cq_has_payload(const sv_cq_ring *ring);
// Makes a QP's send completions free its send-queue slots when polled
// (at create), and stops it (at destroy, before the QP is freed).
void cq_attach_sq(loop_qp *qp);
void cq_detach_sq(loop_qp *qp);
// Drops the unpolled completions of one QP (on RESET and destroy, as HCAs do).
void cq_clean(loop_cq *cq, uint32_t qpn);
uint64_t now_ns();

// loop_qp.cpp
ibv_qp *loop_create_qp(ibv_pd *pd, ibv_qp_init_attr *attr);
ibv_qp *loop_create_qp_ex(ibv_context *ctx, ibv_qp_init_attr_ex *attr);
int loop_modify_qp(ibv_qp *qp, ibv_qp_attr *attr, int mask);
int loop_query_qp(ibv_qp *qp, ibv_qp_attr *attr, int mask, ibv_qp_init_attr *init);
int loop_query_ece(ibv_qp *qp, ibv_ece *ece);
int loop_set_ece(ibv_qp *qp, ibv_ece *ece);
int loop_destroy_qp(ibv_qp *qp);
int loop_post_recv(ibv_qp *qp, ibv_recv_wr *wr, ibv_recv_wr **bad);
// rdma_is_multicast_addr: an IPv6 multicast GID (ff00::/8), or an
// IPv4-mapped one of an IPv4 multicast address (::ffff:224.0.0.0/100),
// which rdma_cm makes of a group joined by an IPv4 address on RoCE.
inline bool gid_is_multicast(const uint8_t *raw)
{
	if (raw[0] == 0xff)
		return true;
	for (int i = 0; i < 10; i++)
		if (raw[i])
			return false;
	return raw[10] == 0xff && raw[11] == 0xff && (raw[12] & 0xf0) == 0xe0;
}
// Moves a QP to ERR (if not already) and flushes its receive queue; usable on
// a peer's QP.  Returns true if this call made the transition.  The
// affiliated event of the error's cause, if given (own: a QP of this
// process, raised through its context's socket), is raised first, and then
// a QP on an SRQ gets IBV_EVENT_QP_LAST_WQE_REACHED, in that order (IB
// 11.6.3: Last WQE Reached follows the move to the Error state).
inline constexpr ibv_event_type kNoQpEvent = static_cast<ibv_event_type>(-1);
bool qp_set_error(fabric &fab, uint32_t slot, ibv_event_type cause = kNoQpEvent,
		  loop_qp *own = nullptr);
// qp_set_error in two halves: the move to ERR (true if this call made it),
// then, after whatever must be seen with the QP in ERR, LAST_WQE_REACHED
// and the flush of the receive queue.
bool qp_enter_error(fabric &fab, uint32_t slot);
void qp_error_drain(fabric &fab, uint32_t slot);
// Moves a UD or UC QP in RTS or SQD to SQE after a send error (IB 10.3.1:
// its send queue stops, its receive queue goes on).  True if it did.
bool qp_set_sqe(fabric &fab, uint32_t slot);
// Flushes receive WQEs of ring into the CQ ring with WR_FLUSH_ERR.
void rq_flush(sv_rq_ring *rq, sv_cq_ring *cq, uint32_t qpn);
// The same, each flushed completion handed to sink (which retries across a
// resize of the CQ, where pushing to one ring would lose it).
using cqe_sink = int (*)(void *ctx, sv_cqe &e);
void rq_flush(sv_rq_ring *rq, uint32_t qpn, cqe_sink sink, void *ctx);
// Pushes a completion into a CQ of this process, across a concurrent
// resize: 0, or ENOSPC when the CQ overflowed (or stayed closed).
int push_own(loop_cq *cq, sv_cqe &e);
// Takes one receive WQE from a ring, copying it into out (room for max_sge
// SGEs; a WQE claiming more has num_sge SV_RECV_WQE_INVALID).  Returns false when the
// ring is empty, or damaged (impossible indices, no trusted geometry: then
// *damaged is set, if given).
bool rq_take(sv_rq_ring *rq, sv_recv_wqe *out, uint32_t max_sge, bool *damaged = nullptr);
// The same, with the geometry checked when the ring was mapped (cq_push).
bool rq_take(sv_rq_ring *rq, const queue_geom &g, sv_recv_wqe *out, uint32_t max_sge,
	     bool *damaged);
// Posts receive WRs into ring (owner side).
// taken: a lower bound of the ring's cons the caller knows by other means
// (a QP's receive completions it polled: loop_qp::rq_polled), or 0.
int rq_post(sv_rq_ring *rq, uint32_t max_sge, ibv_recv_wr *wr, ibv_recv_wr **bad,
	    uint64_t taken = 0);
// The same, with the geometry checked when the ring was made.
int rq_post(sv_rq_ring *rq, const queue_geom &g, uint32_t max_sge, ibv_recv_wr *wr,
	    ibv_recv_wr **bad, uint64_t taken);
// Destroys a QP's receive queue (its segment, or its placed ring, given
// back through the allocator's free).
void rq_destroy(fabric &fab, loop_qp *qp);
void send_async(const uint8_t *addr, uint32_t len, const sv_async_msg &msg);

// loop_srq.cpp
ibv_srq *loop_create_srq(ibv_pd *pd, ibv_srq_init_attr *attr);
int loop_modify_srq(ibv_srq *srq, ibv_srq_attr *attr, int mask);
int loop_query_srq(ibv_srq *srq, ibv_srq_attr *attr);
int loop_destroy_srq(ibv_srq *srq);
int loop_post_srq_recv(ibv_srq *srq, ibv_recv_wr *wr, ibv_recv_wr **bad);

// loop_ah.cpp
ibv_ah *loop_create_ah(ibv_pd *pd, ibv_ah_attr *attr);
int loop_destroy_ah(ibv_ah *ah);

// engine/sq_ring.cpp: posting
int loop_post_send(ibv_qp *qp, ibv_send_wr *wr, ibv_send_wr **bad);
// loop_post_send with what a bind or fast-register carries beyond the WR.
int post_send_mem(ibv_qp *qp, ibv_send_wr *wr, ibv_send_wr **bad, const mem_wr_extra *x);
// Runs n WRs built by the ibv_wr_* API as post_send runs a list, taking
// sq_lock.  All or nothing: EINVAL (QP state) or ENOMEM (no room in the send
// queue) before any WR runs.  The caller has checked each WR (wr_valid).
int qp_post_batch(loop_qp *qp, send_wr *wrs, size_t n);
// Whether the requester carries out op on a QP of type t.
bool wr_opcode_supported(ibv_qp_type t, ibv_wr_opcode op);

// loop_qp_ex.cpp: ibv_wr_* (extended QPs)
// Checks send_ops_flags of a QP about to be created: 0 or EOPNOTSUPP.
int qp_ex_check(const ibv_qp_init_attr_ex &attr);
// Fills the ibv_qp_ex of a created QP; sets VERBS_QP_EX.
void qp_ex_init(loop_qp *qp, uint64_t send_ops_flags);
void qp_ex_destroy(loop_qp *qp);

// loop_cq.cpp, for loop_cq_ex.cpp: a CQ with its ring and channel wired, and
// the next completion (caller holds cq->lock unless single-threaded).
// pd: a parent domain whose allocator places the ring (SOFTVERBS_RES_TYPE_CQ),
// or nullptr.
loop_cq *cq_new(ibv_context *ctx, int cqe, ibv_comp_channel *channel, ibv_pd *pd = nullptr);
bool cq_pop(loop_cq *cq, sv_cqe &out);
// The idle owner's look at the ring's shared indices (cons, cons_seen,
// prod) against its own, as polling an empty CQ makes every so often.
// Caller holds cq->lock.
void cq_check_indices(loop_cq *cq);

// loop_td.cpp: thread domains and parent domains
ibv_td *loop_alloc_td(ibv_context *ctx, ibv_td_init_attr *attr);
int loop_dealloc_td(ibv_td *td);
ibv_pd *loop_alloc_parent_domain(ibv_context *ctx, ibv_parent_domain_init_attr *attr);
int loop_dealloc_parent_domain(loop_pd *pd);
// Memory from a parent domain's allocator: IBV_ALLOCATOR_USE_DEFAULT when pd
// is not a parent domain with allocators (or its alloc says so), nullptr
// when the allocator failed.  pd_free gives memory pd_alloc gave back.
void *pd_alloc(ibv_pd *pd, size_t size, size_t alignment, uint64_t resource_type);
void pd_free(ibv_pd *pd, void *ptr, uint64_t resource_type);
// A ring peers map (a CQ's, a receive queue's), `bytes` long, from pd's
// allocator with resource type `type`: 0 with place.mem set and file held
// when it goes in memory published with softverbs_dv_alloc_fd; 0 with
// place.mem null for the library's own (USE_DEFAULT, no allocator, or
// memory nobody published, which is given back at once); ENOMEM when alloc
// gave nothing, EINVAL for memory that cannot hold a ring (given back).
int pd_place(ibv_pd *pd, uint64_t type, size_t bytes, queue_place &place,
	     std::shared_ptr<placed_file> &file);
// Completes every WR of the backlog flushed (the QP went to ERR).  Caller
// holds sq_lock.
void qp_flush_backlog(loop_qp *qp);
// The QP left SQD for RTS: runs what waited (progress_add for a remainder).
// Caller holds sq_lock; returns whether the progress thread must take it.
bool qp_resume_backlog(loop_qp *qp);
// In SQD: whether a WR the requester started (a retry booked, WRITEs on
// the wire) has yet to finish; sq_draining of ibv_query_qp.  Caller holds
// sq_lock.
bool qp_sq_busy(const loop_qp *qp);
// In SQD with nothing started left: raises IBV_EVENT_SQ_DRAINED once if
// asked for.  Caller holds sq_lock.
void qp_sq_drained(loop_qp *qp);
// Runs the backlog of a QP (called by the progress thread); returns the time
// of the next retry or 0 when the backlog is empty.
uint64_t qp_run_backlog(loop_qp *qp);
// The send-queue ring of a QP: made at create (room for cap.max_send_wr
// WQEs of cap.max_send_sge SGEs or cap.max_inline_data bytes), unmapped at
// destroy.  0 or an errno.
// Under a parent domain with allocators, the ring's memory comes from its
// alloc callback (SOFTVERBS_RES_TYPE_SQ), unless that answers
// IBV_ALLOCATOR_USE_DEFAULT.
int sq_create(loop_qp *qp, ibv_pd *pd);
void sq_destroy(loop_qp *qp);
// Empties the send queue (back to RESET): nothing left completes.  Caller
// holds sq_lock.
void sq_reset(loop_qp *qp);
// The engine thread's part: takes the WQEs an agent rang for and runs
// them (takes sq_lock).  Returns how many WQEs the doorbell added; sets
// need_progress when some wait for a retry.
int sq_serve_doorbell(loop_qp *qp, bool &need_progress);
// softverbs_dv_qp_agent / softverbs_dv_cq_agent.
int loop_dv_qp_agent(ibv_qp *qp, int on, softverbs_dv_sq *sq);
int loop_dv_cq_agent(ibv_cq *cq, int on, softverbs_dv_cq *out);
// softverbs_dv_alloc_fd (loop_td.cpp).
int loop_dv_alloc_fd(ibv_pd *pd, void *addr, size_t len, int fd, uint64_t offset);
// softverbs_dv_qp_rq (loop_qp.cpp).
int loop_dv_qp_rq(ibv_qp *qp, int on, softverbs_dv_rq *rq);

// loop_engine.cpp: the thread that serves agents' doorbells.  0 or ENOMEM.
int engine_add(loop_qp *qp);
void engine_remove(loop_qp *qp);
// For tests only (tests/unit/test_sq_ring.cpp): while held, the engine
// thread serves no doorbell; engine_hold(false) lets it go on.  Returns
// with the engine outside any doorbell's service.
void engine_hold(bool on);

// The fabric-wide striped locks for an atomic on one word: the stripe of
// its owner's address, and that of its byte in the file under it when it
// is over a file (mr_file_word; 0: none), both held for the operation and
// never one held while waiting for the other.
class atomic_guard {
public:
	atomic_guard(fabric &fab, uint64_t owner_addr, uint64_t file_word);
	~atomic_guard();
	atomic_guard(const atomic_guard &) = delete;
	atomic_guard &operator=(const atomic_guard &) = delete;

private:
	uint32_t *first_ = nullptr, *second_ = nullptr;
};

// loop_xrc.cpp
struct loop_xrcd {
	verbs_xrcd vxrcd; // Must be first
	obj_life life{kLifeXrcd}; // Users: XRC SRQs, XRC target QPs (created or opened)
	obj_ref rec{SV_MAX_OBJS, 0}; // A file's domain: this handle's SV_OBJ_XRCD record
};
ibv_xrcd *loop_open_xrcd(ibv_context *ctx, ibv_xrcd_init_attr *attr);
int loop_close_xrcd(ibv_xrcd *xrcd);
ibv_srq *loop_create_srq_ex(ibv_context *ctx, ibv_srq_init_attr_ex *attr);
int loop_get_srq_num(ibv_srq *srq, uint32_t *srq_num);
ibv_qp *loop_open_qp(ibv_context *ctx, ibv_qp_open_attr *attr);
// Under the registry lock.  A handle record of lease on the XRC target QP
// in qps[qslot] of generation qgen (false: the object table is full), and
// the close of qp's handle: the QP's record passes to another holder when
// its owner's handle goes, and goes with the last handle.
bool xrc_qp_handle_add_locked(fabric &fab, int lease, uint32_t qslot, uint32_t qgen,
			      uint32_t xrcd, obj_ref &out);
void xrc_qp_close_locked(fabric &fab, loop_qp *qp);

// loop_mcast.cpp
int loop_attach_mcast(ibv_qp *qp, const ibv_gid *gid, uint16_t lid);
int loop_detach_mcast(ibv_qp *qp, const ibv_gid *gid, uint16_t lid);
// Whether qp is attached to a multicast group; with detach, takes it out of
// every group it is in.
bool mcast_attached(loop_qp *qp, bool detach);

// loop_progress.cpp
void progress_add(loop_qp *qp);
// Wakes the progress thread to look at its QPs now (no lock taken: a
// wakeup lost to a race costs at most its 1 ms look).
void progress_kick();
void progress_remove(loop_qp *qp);

} // namespace loop
