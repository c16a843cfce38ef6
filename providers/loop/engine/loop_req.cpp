// SPDX-License-Identifier: MIT
// The requester: ibv_post_send.  The posting thread acts as the NIC: it
// checks the WR, resolves the destination QP in the registry, plays the
// responder's part against the destination's shared rings (receive WQE,
// key checks), moves the data with one copy, and writes both completions.
// Posting writes the WR as a WQE into the QP's send-queue ring and rings its
// doorbell; the posting thread then runs the requester on it at once.  A
// WQE that cannot finish now (RNR, an unreachable peer) stays at the head
// of the ring for the progress thread, and the WQEs behind it wait with it:
// the ring between the requester's consumer index and the producer index
// is the QP's backlog.
#include "c_boundary.h"
#include "loop.h"
#include "objects.h"
#include "queue_geom.h"
#include "xfer.h"

#include <cerrno>
#include <cstring>
#include <algorithm>
#include <signal.h>
#include <sys/mman.h>
#include <vector>

namespace loop {

namespace {

enum class step {
	done,	     // Completed (successfully or not)
	rnr,	     // The responder had no receive WQE: retry after its RNR timer
	unreachable, // No live QP answered: retry after the QP's timeout
};

constexpr uint32_t kMcastQpn = 0xffffff;

// IB's encoded RNR timer values, in microseconds (IB spec table 45).
constexpr uint32_t kRnrTimerUs[32] = {
	655360, 10,    20,    30,    40,    60,	 80,	 120,	 160,	 240,	  320,
	480,	640,   960,   1280,  1920,  2560,  3840,  5120,  7680,  10240, 15360,
	20480,	30720, 40960, 61440, 81920, 122880, 163840, 245760, 327680, 491520,
};

uint32_t mtu_bytes(uint8_t mtu)
{
	return mtu >= IBV_MTU_256 && mtu <= IBV_MTU_4096 ? 128u << mtu : 4096;
}

ibv_wc_opcode wc_opcode(ibv_wr_opcode op)
{
	switch (op) {
	case IBV_WR_RDMA_WRITE:
	case IBV_WR_RDMA_WRITE_WITH_IMM:
		return IBV_WC_RDMA_WRITE;
	case IBV_WR_RDMA_READ:
		return IBV_WC_RDMA_READ;
	case IBV_WR_ATOMIC_CMP_AND_SWP:
		return IBV_WC_COMP_SWAP;
	case IBV_WR_ATOMIC_FETCH_AND_ADD:
		return IBV_WC_FETCH_ADD;
	case IBV_WR_LOCAL_INV:
		return IBV_WC_LOCAL_INV;
	case IBV_WR_BIND_MW:
		return IBV_WC_BIND_MW;
	case IBV_WR_ATOMIC_WRITE:
		return IBV_WC_ATOMIC_WRITE;
	default:
		return op == kWrFastReg ? kWcFastReg : IBV_WC_SEND;
	}
}

bool opcode_ok(ibv_qp_type t, ibv_wr_opcode op)
{
	switch (op) {
	case IBV_WR_SEND:
	case IBV_WR_SEND_WITH_IMM:
		return true;
	case IBV_WR_RDMA_WRITE:
	case IBV_WR_RDMA_WRITE_WITH_IMM:
		return t != IBV_QPT_UD;
	case IBV_WR_RDMA_READ:
	case IBV_WR_ATOMIC_CMP_AND_SWP:
	case IBV_WR_ATOMIC_FETCH_AND_ADD:
	case IBV_WR_ATOMIC_WRITE:
	case IBV_WR_SEND_WITH_INV:
		return t == IBV_QPT_RC || t == IBV_QPT_XRC_SEND;
	case IBV_WR_LOCAL_INV:
	case IBV_WR_BIND_MW:
		return t != IBV_QPT_UD;
	default:
		return op == kWrFastReg && t != IBV_QPT_UD;
	}
}

// A resolved destination QP.
struct peer {
	uint32_t slot;
	uint32_t qpn;
	sv_qp_rec rec; // A snapshot
	pid_t pid;
	bool self;
	uint16_t lid;	 // Its port's LID
	int xrc_srq = -1; // XRC: the SRQ slot the WR named
};

uint16_t port_lid(sv_registry *r, uint32_t dev, uint8_t port)
{
	if (dev >= SV_MAX_DEVICES || port < 1 || port > SV_MAX_PORTS)
		return 0;
	return r->devices[dev].ports[port - 1].lid;
}

bool port_is_eth(sv_registry *r, uint32_t dev, uint8_t port)
{
	if (dev >= SV_MAX_DEVICES || port < 1 || port > SV_MAX_PORTS)
		return false;
	return r->devices[dev].ports[port - 1].link_layer == SV_LINK_ETH;
}

// Finds the live QP qpn behind an address.  An IB address must carry the
// LID of the QP's port; RoCE addresses are GIDs, and on one host every
// port's GIDs are the host's addresses, so the QP number decides.
bool resolve(loop_context *lctx, uint32_t qpn, uint16_t dlid, bool eth, peer &out)
{
	sv_registry *r = lctx->fab->reg();
	uint32_t slot = qpn & SV_QPN_SLOT_MASK;
	sv_qp_rec &q = r->qps[slot];
	if (!std::atomic_ref<uint32_t>(q.in_use).load(std::memory_order_acquire))
		return false;
	memcpy(&out.rec, &q, sizeof(q));
	std::atomic_thread_fence(std::memory_order_acquire);
	if ((out.rec.generation & SV_QPN_SLOT_MASK) != (qpn >> SV_QPN_SLOT_BITS) || !out.rec.in_use)
		return false;
	out.lid = port_lid(r, out.rec.device, out.rec.port);
	if (!eth && out.lid != dlid)
		return false;
	if (eth && !port_is_eth(r, out.rec.device, out.rec.port))
		return false;
	uint32_t lease = out.rec.owner_lease;
	if (lease >= SV_MAX_PROCS || r->leases[lease].generation != out.rec.owner_gen)
		return false;
	out.pid = static_cast<pid_t>(r->leases[lease].pid);
	// A lease names a process: no pid, or one no process can have, means
	// the record was written over.  "Self" (plain memcpy, no checks by the
	// kernel) needs both our lease and our pid; anything else is copied
	// through the kernel, which checks the addresses.
	if (out.pid <= 0 || out.pid >= (1 << 22))
		return false;
	out.self = lease == static_cast<uint32_t>(lctx->lease) && out.pid == getpid();
	out.slot = slot;
	out.qpn = qpn;
	return true;
}

bool peer_receives(const sv_qp_rec &q)
{
	return q.state == IBV_QPS_RTR || q.state == IBV_QPS_RTS || q.state == IBV_QPS_SQD;
}

// Local memory of a WR, as iovecs in this process.
struct local_buf {
	std::vector<iovec> iov;
	uint64_t len = 0;
	bool checked = false; // Some local memory is on demand: copy with checked calls
};

// A scratch area standing behind the null MR: writes land here and are
// dropped, reads see whatever is here, which is zeros until written.
constexpr size_t kNullChunk = 1 << 16;
char g_null_area[kNullChunk];

void add_null(std::vector<iovec> &v, uint64_t len)
{
	while (len) {
		size_t n = std::min<uint64_t>(len, kNullChunk);
		v.push_back({g_null_area, n});
		len -= n;
	}
}

ibv_wc_status gather_local(loop_qp *qp, send_wr &w, bool need_write, local_buf &b)
{
	b.iov.clear();
	b.len = 0;
	if (w.is_inline) {
		b.iov.push_back({w.inline_data, w.inline_len});
		b.len = w.inline_len;
		return IBV_WC_SUCCESS;
	}
	fabric &fab = *qp->ctx->fab;
	b.checked = false;
	thread_local std::vector<rseg> segs;
	for (uint32_t i = 0; i < w.num_sge; i++) {
		const ibv_sge &s = w.sge[i];
		if (!s.length)
			continue;
		segs.clear();
		if (mr_resolve(fab, s.lkey, static_cast<uint32_t>(qp->ctx->lease), qp->pdn, s.addr,
			       s.length, need_write ? IBV_ACCESS_LOCAL_WRITE : 0, qp->qpn, segs))
			return IBV_WC_LOC_PROT_ERR;
		for (const rseg &g : segs) {
			if (g.kind == seg_kind::null)
				add_null(b.iov, g.len);
			else
				b.iov.push_back({g.base, g.len});
			b.checked |= g.kind == seg_kind::peer_checked;
		}
		b.len += s.length;
	}
	return IBV_WC_SUCCESS;
}

// Bytes a WR's SGEs name (not inline data).
uint64_t sge_bytes(const send_wr &w)
{
	uint64_t n = 0;
	for (uint32_t i = 0; i < w.num_sge && i < kMaxSge; i++)
		n += w.sge[i].length;
	return n;
}

// Places a response of len bytes into the local buffer gather_local built
// (at least len bytes).  Returns 0 or the errno of a checked copy.
int put_response(const local_buf &b, const void *data, size_t len)
{
	if (b.checked) {
		iovec src{const_cast<void *>(data), len};
		return xfer(getpid(), false, &src, 1, b.iov.data(), static_cast<int>(b.iov.size()),
			    xfer_dir::to_peer);
	}
	auto *p = static_cast<const char *>(data);
	for (const iovec &v : b.iov) {
		size_t n = std::min(v.iov_len, len);
		memcpy(v.iov_base, p, n);
		p += n;
		len -= n;
		if (!len)
			break;
	}
	return 0;
}

// Builds the iovecs of a peer's receive WQE for len bytes (after skip
// bytes, for the GRH of a UD receive).  Returns a status for the responder.
ibv_wc_status scatter_remote(loop_context *lctx, const peer &p, const sv_recv_wqe *wqe,
			     uint32_t pdn, uint64_t skip_plus_len, std::vector<rseg> &out)
{
	out.clear();
	if (wqe->num_sge == 0xffffffff)
		return IBV_WC_LOC_PROT_ERR; // A malformed WQE in shared memory
	uint64_t room = 0;
	for (uint32_t i = 0; i < wqe->num_sge && room < skip_plus_len; i++) {
		const sv_sge &s = wqe->sge[i];
		if (!s.length)
			continue;
		uint64_t n = std::min<uint64_t>(s.length, skip_plus_len - room);
		if (mr_resolve(*lctx->fab, s.lkey, p.rec.owner_lease, pdn, s.addr, n,
			       IBV_ACCESS_LOCAL_WRITE, p.qpn, out))
			return IBV_WC_LOC_PROT_ERR;
		room += n;
	}
	if (room < skip_plus_len)
		return IBV_WC_LOC_LEN_ERR;
	return IBV_WC_SUCCESS;
}

// Pushes a completion into our own CQ.  Returns 0 or ENOSPC (the CQ
// overflowed: its owner, us, got IBV_EVENT_CQ_ERR).
} // namespace

int push_own(loop_cq *cq, sv_cqe &e)
{
	if (!cq)
		return 0;
	// A concurrent resize closes the old ring; ESTALE means look again,
	// for as long as a resize may take.
	uint64_t deadline = 0;
	for (;;) {
		// Counted while the ring's address is in hand: a resize unmaps the
		// ring it replaced only once no thread here is inside (the counter
		// and the ring pointer are both seq_cst, as in Dekker's protocol).
		cq->pushers.fetch_add(1, std::memory_order_seq_cst);
		sv_cq_ring *ring = std::atomic_ref<sv_cq_ring *>(cq->ring).load(std::memory_order_seq_cst);
		int err = cq_push(ring, e, false);
		cq->pushers.fetch_sub(1, std::memory_order_release);
		if (err != ESTALE)
			return err;
		uint64_t now = now_ns();
		if (!deadline)
			deadline = now + kResizeWaitNs + 1000000000ULL;
		else if (now > deadline)
			return ENOSPC;
		sched_yield();
	}
}

namespace {

void raise_qp_event(fabric &fab, uint32_t qp_slot, ibv_event_type type);

// A completion of the send queue: it names the WR's slot, which the poller
// frees.  A send CQ that overflowed takes the QP to ERR with
// IBV_EVENT_QP_FATAL: the completion is lost, but never silently.
void push_sq(loop_qp *qp, const send_wr &w, ibv_wc_status st, ibv_wc_opcode op,
	     uint32_t byte_len)
{
	sv_cqe e{};
	e.wr_id = w.wr_id;
	e.status = st;
	e.opcode = op;
	e.qp_num = qp->qpn;
	e.byte_len = byte_len;
	e.src_qp = static_cast<uint32_t>(w.sq_index);
	e.flags = SV_CQE_SQ_INDEX;
	if (push_own(qp->scq, e) == ENOSPC && qp_set_error(*qp->ctx->fab, qp->slot))
		raise_qp_event(*qp->ctx->fab, qp->slot, IBV_EVENT_QP_FATAL);
}

// Completes into the peer's receive CQ: the QP's, or an XRC SRQ's.  The
// reference is read afresh on every try, since a resize moves the ring.
// Places every deferred SEND of the QP that its peer has not taken yet.
// Called before the QP moves any other bytes, and on state changes.
void flush_deferred(loop_qp *qp)
{
	if (qp->deferred.empty())
		return;
	fabric &fab = *qp->ctx->fab;
	for (const loop_qp::deferred_send &d : qp->deferred) {
		queue_hold h = queue_map(fab, d.cq, SV_OBJ_CQ);
		auto *ring = h.as<sv_cq_ring>();
		if (ring && cq_has_payload(ring))
			cq_place_deferred(ring, d.index, d.dst, d.pid);
	}
	qp->deferred.clear();
}

// Forgets deferred SENDs the peer has taken; bounds the list.
void note_deferred(loop_qp *qp, const obj_ref &cq, uint64_t index, void *dst, pid_t pid)
{
	auto &v = qp->deferred;
	if (v.size() >= kMaxDeferred) {
		fabric &fab = *qp->ctx->fab;
		std::erase_if(v, [&](const loop_qp::deferred_send &d) {
			queue_hold h = queue_map(fab, d.cq, SV_OBJ_CQ);
			auto *ring = h.as<sv_cq_ring>();
			return !ring || std::atomic_ref<uint64_t>(ring->cons).load() > d.index;
		});
		if (v.size() >= kMaxDeferred)
			flush_deferred(qp);
	}
	// Never allocates (the room was reserved when the QP was made): the
	// SEND is published already, and an exception here would lose it.
	if (v.size() < v.capacity()) {
		v.push_back({cq, index, dst, pid});
		return;
	}
	// No room (cannot happen while the reservation holds): place it now.
	queue_hold h = queue_map(*qp->ctx->fab, cq, SV_OBJ_CQ);
	if (auto *ring = h.as<sv_cq_ring>(); ring && cq_has_payload(ring))
		cq_place_deferred(ring, index, dst, pid);
}

// Returns 0, or ENOSPC when the responder's CQ overflowed (its QP is then
// in ERR with IBV_EVENT_QP_FATAL, its owner told of the CQ by CQ_ERR).
int push_peer(fabric &fab, const peer &p, sv_cqe &e, bool solicited,
	      const sv_cqe_payload *payload = nullptr, loop_qp *deferring = nullptr,
	      void *dst = nullptr)
{
	sv_registry *r = fab.reg();
	// A resize closes the old ring (ESTALE) and then points the QPs at the
	// new one: look again for as long as a resize may take.
	uint64_t deadline = 0;
	for (;;) {
		obj_ref ref = p.xrc_srq >= 0 ? obj_ref{r->objs[p.xrc_srq].cq_obj,
						       r->objs[p.xrc_srq].cq_gen}
					     : obj_ref{r->qps[p.slot].rcq_obj, r->qps[p.slot].rcq_gen};
		queue_hold h = queue_map(fab, ref, SV_OBJ_CQ);
		auto *ring = h.as<sv_cq_ring>();
		if (!ring) {
			// A resize may have replaced the ring between our reading the
			// reference and mapping it: only a reference that stays the
			// same names a CQ that is gone.
			obj_ref again = p.xrc_srq >= 0 ? obj_ref{r->objs[p.xrc_srq].cq_obj,
								 r->objs[p.xrc_srq].cq_gen}
						       : obj_ref{r->qps[p.slot].rcq_obj,
								 r->qps[p.slot].rcq_gen};
			if (again.slot == ref.slot && again.gen == ref.gen)
				return 0;
			continue;
		}
		if (payload && !cq_has_payload(ring)) {
			// Every ring of this ABI has the array; a damaged one loses
			// the message, visibly.
			e.status = IBV_WC_LOC_QP_OP_ERR;
			payload = nullptr;
		}
		uint64_t index = 0;
		int err = cq_push(ring, e, solicited, payload, &index);
		if (err == ENOSPC) {
			if (qp_set_error(fab, p.slot))
				raise_qp_event(fab, p.slot, IBV_EVENT_QP_FATAL);
			return err;
		}
		if (err != ESTALE) {
			if (payload && deferring)
				note_deferred(deferring, ref, index, dst, p.pid);
			return 0;
		}
		uint64_t now = now_ns();
		if (!deadline)
			deadline = now + kResizeWaitNs + 1000000000ULL;
		else if (now > deadline)
			return ENOSPC;
		sched_yield();
	}
}

// Small SENDs to another process travel in the CQE's payload and the
// receiver places them when it polls: no system call on either side.  Only
// for a message that fits, from memory that is surely mapped, into one
// receive SGE of ordinary memory.
bool pack_inline(const local_buf &lb, const sv_recv_wqe *wqe, const std::vector<rseg> &riov,
		 const peer &p, sv_cqe_payload &pl)
{
	if (p.self || lb.checked || lb.len > SV_CQE_INLINE_MAX || riov.size() != 1 ||
	    riov[0].kind != seg_kind::peer || wqe->num_sge == 0xffffffff)
		return false;
	const sv_sge *sge = nullptr;
	for (uint32_t i = 0; i < wqe->num_sge; i++)
		if (wqe->sge[i].length) {
			sge = &wqe->sge[i];
			break;
		}
	if (!sge && lb.len)
		return false;
	pl.iova = sge ? sge->addr : 0;
	pl.lkey = sge ? sge->lkey : 0;
	pl.len = static_cast<uint32_t>(lb.len);
	uint32_t off = 0;
	for (const iovec &v : lb.iov) {
		memcpy(pl.data + off, v.iov_base, v.iov_len);
		off += static_cast<uint32_t>(v.iov_len);
	}
	return true;
}

void raise_qp_event(fabric &fab, uint32_t qp_slot, ibv_event_type type)
{
	sv_qp_rec &q = fab.reg()->qps[qp_slot];
	queue_hold h = queue_map(fab, {q.rcq_obj, q.rcq_gen}, SV_OBJ_CQ);
	auto *ring = h.as<sv_cq_ring>();
	if (!ring)
		return;
	sv_async_msg m{static_cast<uint32_t>(type), kObjQp, qp_slot, q.generation};
	send_async(ring->async_addr, ring->async_len, m);
}

void complete(loop_qp *qp, const send_wr &w, ibv_wc_status st, uint32_t byte_len)
{
	// UC has no acknowledgements: a requester never learns what the
	// responder did with its message, so remote errors complete as sent.
	if (qp->type == IBV_QPT_UC && (st == IBV_WC_REM_ACCESS_ERR || st == IBV_WC_REM_INV_REQ_ERR ||
				       st == IBV_WC_REM_OP_ERR))
		st = IBV_WC_SUCCESS;
	bool signaled = qp->sq_sig_all || (w.flags & IBV_SEND_SIGNALED) || st != IBV_WC_SUCCESS;
	if (!signaled)
		return;
	push_sq(qp, w, st, wc_opcode(w.opcode), byte_len);
	// An error completion takes a connected QP to ERR (IB C10-61, C10-96):
	// its receive queue and the WRs behind this one then complete flushed.
	if (st != IBV_WC_SUCCESS && st != IBV_WC_WR_FLUSH_ERR && qp->type != IBV_QPT_UD)
		qp_set_error(*qp->ctx->fab, qp->slot);
}

// Takes a receive WQE of the peer (its RQ or SRQ).  Returns false if none.
bool take_recv(fabric &fab, const peer &p, std::vector<uint8_t> &buf, sv_recv_wqe *&wqe)
{
	sv_obj_kind kind = p.rec.has_srq ? SV_OBJ_SRQ : SV_OBJ_RQ;
	queue_hold h = queue_map(fab, {p.rec.rq_obj, p.rec.rq_gen}, kind);
	auto *rq = h.as<sv_rq_ring>();
	queue_geom g;
	if (!rq || !queue_geometry(rq, g))
		return false;
	// Sized by the geometry checked at mapping, not by the header.
	buf.resize(g.entry_size);
	wqe = reinterpret_cast<sv_recv_wqe *>(buf.data());
	bool damaged = false;
	if (!rq_take(rq, wqe, (g.entry_size - sizeof(sv_recv_wqe)) / sizeof(sv_sge), &damaged)) {
		if (damaged && qp_set_error(fab, p.slot)) {
			// Its indices are beyond belief: the responder's QP fails
			// (its owner hears of it), and the requester, finding it in
			// ERR, completes with an error after its retries.
			raise_qp_event(fab, p.slot, IBV_EVENT_QP_FATAL);
		}
		return false;
	}
	if (p.rec.has_srq) {
		// SRQ limit: the consumer that crosses it raises the event once.
		std::atomic_ref<uint32_t> lim(rq->limit);
		uint32_t l = lim.load(std::memory_order_acquire);
		uint64_t left = std::atomic_ref<uint64_t>(rq->prod).load() -
				std::atomic_ref<uint64_t>(rq->cons).load();
		if (l && left < l && lim.compare_exchange_strong(l, 0)) {
			sv_async_msg m{IBV_EVENT_SRQ_LIMIT_REACHED, SV_OBJ_SRQ, rq->hdr.obj_slot,
				       rq->hdr.obj_gen};
			send_async(rq->async_addr, rq->async_len, m);
		}
	}
	return true;
}

// Receive lkeys belong to the PD of the queue they were posted to.
uint32_t recv_pdn(fabric &fab, const peer &p)
{
	if (p.rec.has_srq && p.rec.rq_obj < SV_MAX_OBJS)
		return fab.reg()->objs[p.rec.rq_obj].pdn;
	return p.rec.pdn;
}

// The responder failed: its QP goes to ERR and its owner hears of it.
void responder_error(fabric &fab, const peer &p, ibv_event_type ev)
{
	if (qp_set_error(fab, p.slot))
		raise_qp_event(fab, p.slot, ev);
}

// The 8 aligned bytes an atomic targets, checked for the QP's and the key's
// `right`.  On failure the WR has completed in error (and the responder's
// QP is in ERR): returns false.
// Reads or writes an atomic's target word: in the peer (cross-memory attach,
// or memcpy in-process), or in our mapping of a peer's fd-backed MR through
// the kernel (a file shrunk under us is EFAULT, not SIGBUS); on-demand
// memory takes a checked call even in-process.
int atomic_word(const peer &p, const mr_hit &hit, uint64_t *v, xfer_dir dir)
{
	if (hit.mapped)
		return xfer_mapped_word(hit.addr, v, dir);
	return xfer_word(p.pid, p.self && !hit.odp, hit.addr, v, dir);
}

bool atomic_target(loop_qp *qp, const send_wr &w, const peer &p, uint32_t right, mr_hit &hit)
{
	fabric &fab = *qp->ctx->fab;
	int kerr = (p.rec.access & right) ? mr_lookup(fab, w.rkey, p.rec.owner_lease, p.rec.pdn,
						      w.remote_addr, 8, right, p.qpn, hit)
					  : EACCES;
	if (!kerr && (w.remote_addr & 7))
		kerr = EINVAL;
	if (!kerr)
		return true;
	// A misaligned address is an invalid request; a key, right or range
	// fault an access error (checked first, as rxe's responder does).
	responder_error(fab, p, kerr == EINVAL ? IBV_EVENT_QP_REQ_ERR : IBV_EVENT_QP_ACCESS_ERR);
	complete(qp, w, kerr == EINVAL ? IBV_WC_REM_INV_REQ_ERR : IBV_WC_REM_ACCESS_ERR, 0);
	return false;
}

step run_connected(loop_qp *qp, send_wr &w)
{
	loop_context *lctx = qp->ctx;
	fabric &fab = *lctx->fab;
	sv_registry *reg = fab.reg();
	const ibv_qp_attr &a = qp->attr;
	bool eth = port_is_eth(reg, lctx->dev->index, a.port_num);
	peer p;
	if (!resolve(lctx, a.dest_qp_num, a.ah_attr.dlid, eth, p) || !peer_receives(p.rec) ||
	    p.rec.qp_type != (qp->type == IBV_QPT_XRC_SEND ? IBV_QPT_XRC_RECV : qp->type))
		return qp->type == IBV_QPT_UC ? (complete(qp, w, IBV_WC_SUCCESS, 0), step::done)
					      : step::unreachable;
	// XRC: the WR names the SRQ, which must share the receive QP's domain.
	if (qp->type == IBV_QPT_XRC_SEND) {
		uint32_t srq_slot = SV_MAX_OBJS;
		for (uint32_t i = 0; i < SV_MAX_OBJS; i++) {
			const sv_obj_rec &o = reg->objs[i];
			if (o.in_use && o.kind == SV_OBJ_SRQ && o.srq_num == w.xrc_srqn) {
				srq_slot = i;
				break;
			}
		}
		if (srq_slot == SV_MAX_OBJS || reg->objs[srq_slot].xrcd != p.rec.xrcd) {
			complete(qp, w, IBV_WC_REM_INV_REQ_ERR, 0);
			return step::done;
		}
		p.rec.has_srq = 1;
		p.rec.rq_obj = srq_slot;
		p.rec.rq_gen = reg->objs[srq_slot].generation;
		p.xrc_srq = static_cast<int>(srq_slot);
		// An XRC target QP has no PD: keys are checked against the SRQ's.
		p.rec.pdn = reg->objs[srq_slot].pdn;
	}
	// A READ's or an atomic's local SGEs receive the response: an HCA sends
	// the request first and checks them only when the response arrives, so
	// the responder's errors come first (docs/error-semantics.md).  Their
	// gather is done in their own cases, after the responder's checks.
	bool response_placed = w.opcode == IBV_WR_RDMA_READ ||
			       w.opcode == IBV_WR_ATOMIC_CMP_AND_SWP ||
			       w.opcode == IBV_WR_ATOMIC_FETCH_AND_ADD;
	thread_local local_buf lb;
	lb.iov.clear();
	lb.len = 0;
	if (!response_placed) {
		ibv_wc_status st = gather_local(qp, w, false, lb);
		if (st != IBV_WC_SUCCESS) {
			complete(qp, w, st, 0);
			return step::done;
		}
	}
	uint16_t my_lid = port_lid(reg, lctx->dev->index, a.port_num);
	sv_cqe rcv{};
	rcv.qp_num = p.qpn;
	rcv.src_qp = qp->qpn;
	rcv.slid = my_lid;
	rcv.sl = a.ah_attr.sl;
	bool solicited = w.flags & IBV_SEND_SOLICITED;
	thread_local std::vector<rseg> riov;
	thread_local std::vector<uint8_t> wqe_buf;
	sv_recv_wqe *wqe = nullptr;

	switch (w.opcode) {
	case IBV_WR_SEND:
	case IBV_WR_SEND_WITH_INV:
	case IBV_WR_SEND_WITH_IMM: {
		if (!take_recv(fab, p, wqe_buf, wqe)) {
			if (qp->type == IBV_QPT_UC) {
				complete(qp, w, IBV_WC_SUCCESS, 0); // Dropped, as on the wire
				return step::done;
			}
			return step::rnr;
		}
		ibv_wc_status rs = scatter_remote(lctx, p, wqe, recv_pdn(fab, p), lb.len, riov);
		thread_local sv_cqe_payload pl;
		bool packed = rs == IBV_WC_SUCCESS && lb.len && pack_inline(lb, wqe, riov, p, pl);
		if (rs == IBV_WC_SUCCESS && !packed) {
			flush_deferred(qp); // Earlier SENDs land first
			int err = xfer_segs(p.pid, p.self && !lb.checked, lb.iov.data(),
					    static_cast<int>(lb.iov.size()), riov.data(),
					    static_cast<int>(riov.size()), xfer_dir::to_peer);
			if (err == ESRCH)
				return step::unreachable;
			if (err)
				rs = IBV_WC_LOC_PROT_ERR;
		}
		if (rs == IBV_WC_SUCCESS && w.opcode == IBV_WR_SEND_WITH_INV) {
			// The responder invalidates the key on behalf of its QP.
			if (mr_remote_invalidate(fab, p.rec.owner_lease, p.rec.pdn, p.qpn,
						 w.invalidate_rkey))
				rs = IBV_WC_LOC_PROT_ERR;
			else
				rcv.wc_flags = IBV_WC_WITH_INV;
			rcv.imm_data = w.invalidate_rkey; // Read back as wc.invalidated_rkey
		}
		rcv.wr_id = wqe->wr_id;
		rcv.opcode = IBV_WC_RECV;
		rcv.byte_len = static_cast<uint32_t>(lb.len);
		if (w.opcode == IBV_WR_SEND_WITH_IMM) {
			rcv.imm_data = w.imm_data;
			rcv.wc_flags = IBV_WC_WITH_IMM;
		}
		rcv.status = rs;
		int perr = packed && rs == IBV_WC_SUCCESS
				   ? push_peer(fab, p, rcv, solicited, &pl, qp, riov[0].base)
				   : push_peer(fab, p, rcv, solicited);
		if (perr == ENOSPC) {
			// The responder could not complete the message: its CQ overflowed.
			complete(qp, w, IBV_WC_REM_OP_ERR, 0);
			return step::done;
		}
		if (rs != IBV_WC_SUCCESS) {
			if (qp->type != IBV_QPT_UC)
				responder_error(fab, p, IBV_EVENT_QP_REQ_ERR);
			complete(qp, w,
				 rs == IBV_WC_LOC_LEN_ERR ? IBV_WC_REM_INV_REQ_ERR : IBV_WC_REM_OP_ERR,
				 0);
			return step::done;
		}
		complete(qp, w, IBV_WC_SUCCESS, static_cast<uint32_t>(lb.len));
		return step::done;
	}
	case IBV_WR_RDMA_WRITE:
	case IBV_WR_RDMA_WRITE_WITH_IMM:
	case IBV_WR_RDMA_READ: {
		bool read = w.opcode == IBV_WR_RDMA_READ;
		uint32_t right = read ? IBV_ACCESS_REMOTE_READ : IBV_ACCESS_REMOTE_WRITE;
		bool imm = w.opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
		if (imm && !take_recv(fab, p, wqe_buf, wqe)) {
			if (qp->type == IBV_QPT_UC) {
				complete(qp, w, IBV_WC_SUCCESS, 0);
				return step::done;
			}
			return step::rnr;
		}
		int kerr = 0;
		uint32_t raccess = 0;
		riov.clear();
		uint64_t len = read ? sge_bytes(w) : lb.len;
		if (len) {
			if (!(p.rec.access & right))
				kerr = EACCES;
			else
				kerr = mr_resolve(fab, w.rkey, p.rec.owner_lease, p.rec.pdn,
						  w.remote_addr, len, right, p.qpn, riov, &raccess);
		}
		if (kerr) {
			if (imm) {
				// The consumed receive completes in error on the responder.
				rcv.wr_id = wqe->wr_id;
				rcv.opcode = IBV_WC_RECV_RDMA_WITH_IMM;
				rcv.status = IBV_WC_REM_ACCESS_ERR;
				push_peer(fab, p, rcv, false);
			}
			if (qp->type != IBV_QPT_UC)
				responder_error(fab, p, IBV_EVENT_QP_ACCESS_ERR);
			complete(qp, w, IBV_WC_REM_ACCESS_ERR, 0);
			return step::done;
		}
		if (read) {
			// The response arrives: now its local SGEs are checked.
			ibv_wc_status st = gather_local(qp, w, true, lb);
			if (st != IBV_WC_SUCCESS) {
				complete(qp, w, st, 0);
				return step::done;
			}
		}
		if (lb.len) {
			flush_deferred(qp); // Earlier SENDs land first
			int err = xfer_segs(p.pid, p.self && !lb.checked, lb.iov.data(),
					    static_cast<int>(lb.iov.size()), riov.data(),
					    static_cast<int>(riov.size()),
					    read ? xfer_dir::from_peer : xfer_dir::to_peer,
					    raccess & IBV_ACCESS_RELAXED_ORDERING);
			if (err == ESRCH)
				return step::unreachable;
			if (err) {
				// The registered range is not mapped in the target any more.
				if (qp->type != IBV_QPT_UC)
					responder_error(fab, p, IBV_EVENT_QP_ACCESS_ERR);
				complete(qp, w, IBV_WC_REM_ACCESS_ERR, 0);
				return step::done;
			}
		}
		if (imm) {
			rcv.wr_id = wqe->wr_id;
			rcv.opcode = IBV_WC_RECV_RDMA_WITH_IMM;
			rcv.byte_len = static_cast<uint32_t>(lb.len);
			rcv.imm_data = w.imm_data;
			rcv.wc_flags = IBV_WC_WITH_IMM;
			if (push_peer(fab, p, rcv, solicited) == ENOSPC) {
				complete(qp, w, IBV_WC_REM_OP_ERR, 0);
				return step::done;
			}
		}
		complete(qp, w, IBV_WC_SUCCESS, static_cast<uint32_t>(lb.len));
		return step::done;
	}
	case IBV_WR_ATOMIC_CMP_AND_SWP:
	case IBV_WR_ATOMIC_FETCH_AND_ADD: {
		// The response is 8 bytes: SGEs of another total length are a
		// local length error, found before the request goes out.
		if (sge_bytes(w) != 8) {
			complete(qp, w, IBV_WC_LOC_LEN_ERR, 0);
			return step::done;
		}
		mr_hit hit{};
		if (!atomic_target(qp, w, p, IBV_ACCESS_REMOTE_ATOMIC, hit))
			return step::done;
		uint64_t old = 0;
		int err = 0;
		if (hit.kind != SV_MR_KIND_NULL) {
			flush_deferred(qp);
			atomic_guard g(fab, p.rec.owner_lease, hit.addr);
			err = atomic_word(p, hit, &old, xfer_dir::from_peer);
			if (!err) {
				uint64_t nv = old;
				bool store = true;
				if (w.opcode == IBV_WR_ATOMIC_FETCH_AND_ADD)
					nv = old + w.compare_add;
				else if (old == w.compare_add)
					nv = w.swap;
				else
					store = false;
				if (store)
					err = atomic_word(p, hit, &nv, xfer_dir::to_peer);
			}
		}
		if (err == ESRCH)
			return step::unreachable;
		if (err) {
			responder_error(fab, p, IBV_EVENT_QP_ACCESS_ERR);
			complete(qp, w, IBV_WC_REM_ACCESS_ERR, 0);
			return step::done;
		}
		// The response arrives: its local SGEs are checked now, so a bad
		// lkey fails the WR after the responder executed the atomic, as on
		// an HCA.
		ibv_wc_status st = gather_local(qp, w, true, lb);
		if (st == IBV_WC_SUCCESS && put_response(lb, &old, 8))
			st = IBV_WC_LOC_PROT_ERR;
		if (st != IBV_WC_SUCCESS) {
			complete(qp, w, st, 0);
			return step::done;
		}
		complete(qp, w, IBV_WC_SUCCESS, 8);
		return step::done;
	}
	case IBV_WR_ATOMIC_WRITE: {
		// 8 bytes, aligned, needing remote write: they land whole, under
		// the same striped lock as the other atomics of the fabric.
		mr_hit hit{};
		if (!atomic_target(qp, w, p, IBV_ACCESS_REMOTE_WRITE, hit))
			return step::done;
		int err = 0;
		if (hit.kind != SV_MR_KIND_NULL) {
			flush_deferred(qp);
			atomic_guard g(fab, p.rec.owner_lease, hit.addr);
			uint64_t v;
			memcpy(&v, w.inline_data, 8);
			err = atomic_word(p, hit, &v, xfer_dir::to_peer);
		}
		if (err == ESRCH)
			return step::unreachable;
		if (err) {
			responder_error(fab, p, IBV_EVENT_QP_ACCESS_ERR);
			complete(qp, w, IBV_WC_REM_ACCESS_ERR, 0);
			return step::done;
		}
		complete(qp, w, IBV_WC_SUCCESS, 8);
		return step::done;
	}
	default:
		complete(qp, w, IBV_WC_LOC_QP_OP_ERR, 0);
		return step::done;
	}
}

// The 40-byte GRH a UD receive finds at the head of its buffer.
void build_grh(ibv_grh &g, const ibv_gid &sgid, const ibv_gid &dgid, uint32_t payload,
	       const ibv_global_route &route)
{
	memset(&g, 0, sizeof(g));
	g.version_tclass_flow = htobe32((6u << 28) | (static_cast<uint32_t>(route.traffic_class) << 20) |
					(route.flow_label & 0xfffff));
	g.paylen = htobe16(static_cast<uint16_t>(payload));
	g.next_hdr = 0x1b;
	g.hop_limit = route.hop_limit;
	g.sgid = sgid;
	g.dgid = dgid;
}

void deliver_ud(loop_qp *qp, const send_wr &w, const peer &p, const local_buf &lb,
		uint32_t qkey)
{
	loop_context *lctx = qp->ctx;
	fabric &fab = *lctx->fab;
	if (!peer_receives(p.rec) || p.rec.qp_type != IBV_QPT_UD || p.rec.qkey != qkey)
		return; // Dropped silently, as a UD packet with a bad Q_Key is
	thread_local std::vector<uint8_t> wqe_buf;
	thread_local std::vector<rseg> riov;
	sv_recv_wqe *wqe = nullptr;
	if (!take_recv(fab, p, wqe_buf, wqe))
		return;
	ibv_grh grh;
	ibv_gid sgid{};
	bool global = w.ah.is_global;
	if (global) {
		gid_slot table[kGidTableLen];
		int n = loop_gid_table(lctx, qp->attr.port_num, table, kGidTableLen, true);
		if (w.ah.grh.sgid_index < n)
			sgid = table[w.ah.grh.sgid_index].gid;
		build_grh(grh, sgid, w.ah.grh.dgid, static_cast<uint32_t>(lb.len), w.ah.grh);
	} else {
		memset(&grh, 0, sizeof(grh));
	}
	ibv_wc_status rs = scatter_remote(lctx, p, wqe, recv_pdn(fab, p), sizeof(grh) + lb.len, riov);
	if (rs == IBV_WC_SUCCESS) {
		thread_local std::vector<iovec> liov;
		liov.clear();
		liov.push_back({&grh, sizeof(grh)});
		liov.insert(liov.end(), lb.iov.begin(), lb.iov.end());
		if (xfer_segs(p.pid, p.self && !lb.checked, liov.data(),
			      static_cast<int>(liov.size()), riov.data(),
			      static_cast<int>(riov.size()), xfer_dir::to_peer))
			rs = IBV_WC_LOC_PROT_ERR;
	}
	sv_cqe rcv{};
	rcv.wr_id = wqe->wr_id;
	rcv.status = rs;
	rcv.opcode = IBV_WC_RECV;
	rcv.byte_len = static_cast<uint32_t>(lb.len + sizeof(grh));
	rcv.qp_num = p.qpn;
	rcv.src_qp = qp->qpn;
	rcv.slid = port_lid(fab.reg(), lctx->dev->index, qp->attr.port_num);
	rcv.sl = w.ah.sl;
	rcv.dlid_path_bits = w.ah.src_path_bits;
	if (global)
		rcv.wc_flags |= IBV_WC_GRH;
	if (w.opcode == IBV_WR_SEND_WITH_IMM) {
		rcv.imm_data = w.imm_data;
		rcv.wc_flags |= IBV_WC_WITH_IMM;
	}
	push_peer(fab, p, rcv, w.flags & IBV_SEND_SOLICITED);
}

step run_ud(loop_qp *qp, send_wr &w)
{
	loop_context *lctx = qp->ctx;
	fabric &fab = *lctx->fab;
	sv_registry *reg = fab.reg();
	thread_local local_buf lb;
	ibv_wc_status st = gather_local(qp, w, false, lb);
	if (st != IBV_WC_SUCCESS) {
		complete(qp, w, st, 0);
		return step::done;
	}
	uint8_t mtu = reg->devices[lctx->dev->index].ports[qp->attr.port_num - 1].active_mtu;
	if (lb.len > mtu_bytes(mtu)) {
		complete(qp, w, IBV_WC_LOC_LEN_ERR, 0);
		return step::done;
	}
	// A Q_Key with the high bit set means "use the QP's own" (IB 10.2.4.4).
	uint32_t qkey = (w.remote_qkey & 0x80000000u) ? qp->attr.qkey : w.remote_qkey;
	bool eth = port_is_eth(reg, lctx->dev->index, qp->attr.port_num);
	bool mcast = (!eth && w.ah.dlid >= 0xc000 && w.ah.dlid != 0xffff) ||
		     (w.ah.is_global && w.ah.grh.dgid.raw[0] == 0xff);
	if (mcast && w.remote_qpn == kMcastQpn) {
		std::vector<uint32_t> qpns;
		{
			registry_guard g(fab);
			for (const sv_mcast_rec &m : reg->mcast)
				if (m.num_qps && (memcmp(m.gid, w.ah.grh.dgid.raw, 16) == 0 ||
						  (!w.ah.is_global && m.lid == w.ah.dlid)))
					qpns.insert(qpns.end(), m.qpns,
						    m.qpns + std::min<uint32_t>(m.num_qps, SV_MAX_MCAST_QPS));
		}
		for (uint32_t qpn : qpns) {
			if (qpn == qp->qpn)
				continue; // No loopback to the sender
			peer p;
			uint32_t slot = qpn & SV_QPN_SLOT_MASK;
			if (slot >= SV_MAX_QPS)
				continue;
			uint16_t lid = port_lid(reg, reg->qps[slot].device, reg->qps[slot].port);
			if (resolve(lctx, qpn, lid, eth, p))
				deliver_ud(qp, w, p, lb, qkey);
		}
	} else {
		peer p;
		if (resolve(lctx, w.remote_qpn, w.ah.dlid, eth, p))
			deliver_ud(qp, w, p, lb, qkey);
	}
	complete(qp, w, IBV_WC_SUCCESS, static_cast<uint32_t>(lb.len));
	return step::done;
}

step run_wr(loop_qp *qp, send_wr &w)
{
	// Local memory operations: run here, in WR order.  Every WR before
	// them has completed (the requester runs one WR at a time), so a fence
	// holds by construction.
	if (w.opcode == IBV_WR_LOCAL_INV || w.opcode == IBV_WR_BIND_MW || w.opcode == kWrFastReg) {
		complete(qp, w, mr_local_op(qp, w), 0);
		return step::done;
	}
	if (qp->type == IBV_QPT_UD)
		return run_ud(qp, w);
	return run_connected(qp, w);
}

uint64_t timeout_ns(uint8_t timeout)
{
	// 4.096 us * 2^timeout; 0 means "infinite" in the spec, which would let a
	// dead peer hang a WR forever, so it is capped like every other value.
	uint64_t ns = timeout ? 4096ULL << std::min<uint8_t>(timeout, 31) : 1000000000ULL;
	return std::min<uint64_t>(ns, 1000000000ULL);
}

// ---- The send queue ring (sv_sq_ring) ----

static_assert(SV_WQE_OP_FAST_REG == kWrFastReg, "the fast-register opcode is the ABI's");
static_assert(kMaxSge <= UINT8_MAX, "ctrl.num_sge holds any SGE count");
// <infiniband/softverbs_dv.h> mirrors the ABI's layouts for its inline helpers.
static_assert(SOFTVERBS_SQ_FORMAT_VERSION == SV_SQ_FORMAT_VERSION);
static_assert(SOFTVERBS_WQE_HDR_SIZE == SV_WQE_HDR_SIZE);
static_assert(SOFTVERBS_WQE_INLINE == SV_WQE_INLINE);
static_assert(SOFTVERBS_CQE_SQ_INDEX == SV_CQE_SQ_INDEX);
static_assert(SOFTVERBS_WQE_OP_FAST_REG == SV_WQE_OP_FAST_REG);
static_assert(SV_CQE_PLACE == 2, "softverbs_dv_cq_poll tests bit 2");
static_assert(sizeof(softverbs_wqe) == sizeof(sv_send_wqe));
static_assert(offsetof(softverbs_wqe, raddr) == offsetof(sv_send_wqe, raddr));
static_assert(offsetof(softverbs_wqe, atomic) == offsetof(sv_send_wqe, atomic));
static_assert(offsetof(softverbs_wqe, ud) == offsetof(sv_send_wqe, ud));
static_assert(offsetof(softverbs_wqe, mem) == offsetof(sv_send_wqe, mem));
static_assert(sizeof(softverbs_wqe_ctrl) == sizeof(sv_wqe_ctrl));
static_assert(offsetof(softverbs_wqe_ctrl, send_flags) == offsetof(sv_wqe_ctrl, send_flags));
static_assert(offsetof(softverbs_wqe_ctrl, wr_id) == offsetof(sv_wqe_ctrl, wr_id));
static_assert(offsetof(softverbs_wqe_ctrl, imm) == offsetof(sv_wqe_ctrl, imm));
static_assert(offsetof(softverbs_wqe_ctrl, inline_len) == offsetof(sv_wqe_ctrl, inline_len));
static_assert(offsetof(softverbs_wqe_ctrl, index) == offsetof(sv_wqe_ctrl, index));
static_assert(sizeof(softverbs_sge) == sizeof(sv_sge));
static_assert(sizeof(softverbs_cqe) == sizeof(sv_cqe));
static_assert(offsetof(softverbs_cqe, wr_id) == offsetof(sv_cqe, wr_id));
static_assert(offsetof(softverbs_cqe, byte_len) == offsetof(sv_cqe, byte_len));
static_assert(offsetof(softverbs_cqe, qp_num) == offsetof(sv_cqe, qp_num));
static_assert(offsetof(softverbs_cqe, src_qp) == offsetof(sv_cqe, src_qp));
static_assert(offsetof(softverbs_cqe, flags) == offsetof(sv_cqe, flags));
static_assert(offsetof(softverbs_cqe, timestamp) == offsetof(sv_cqe, timestamp));

sv_send_wqe *sq_slot(loop_qp *qp, uint64_t index)
{
	return reinterpret_cast<sv_send_wqe *>(reinterpret_cast<char *>(qp->sq) + SV_SQ_HDR_SIZE +
					       (index & qp->sq_mask) * size_t{qp->sq_stride});
}

bool is_mem_op(uint32_t op)
{
	return op == IBV_WR_BIND_MW || op == kWrFastReg;
}

bool is_inv_op(uint32_t op)
{
	return op == IBV_WR_LOCAL_INV || op == IBV_WR_SEND_WITH_INV;
}

// Writes w as WQE number `index`, whose slot is free.  Caller holds sq_lock.
void wqe_write(loop_qp *qp, const send_wr &w, uint64_t index)
{
	sv_send_wqe q{};
	q.ctrl.opcode = static_cast<uint8_t>(w.opcode);
	q.ctrl.num_sge = static_cast<uint8_t>(w.is_inline ? 0 : w.num_sge);
	q.ctrl.flags = w.is_inline ? SV_WQE_INLINE : 0;
	q.ctrl.send_flags = w.flags;
	q.ctrl.wr_id = w.wr_id;
	q.ctrl.imm = is_inv_op(w.opcode) ? w.invalidate_rkey : w.imm_data;
	q.ctrl.inline_len = w.is_inline ? w.inline_len : 0;
	q.ctrl.xrc_srqn = w.xrc_srqn;
	q.ctrl.index = static_cast<uint32_t>(index);
	q.raddr.remote_addr = w.remote_addr;
	q.raddr.rkey = w.rkey;
	q.atomic.compare_add = w.compare_add;
	q.atomic.swap = w.swap;
	if (qp->type == IBV_QPT_UD) {
		q.ud.remote_qpn = w.remote_qpn;
		q.ud.qkey = w.remote_qkey;
		q.ud.dlid = w.ah.dlid;
		q.ud.sl = w.ah.sl;
		q.ud.src_path_bits = w.ah.src_path_bits;
		q.ud.static_rate = w.ah.static_rate;
		q.ud.is_global = w.ah.is_global;
		q.ud.port_num = w.ah.port_num;
		q.ud.sgid_index = w.ah.grh.sgid_index;
		q.ud.hop_limit = w.ah.grh.hop_limit;
		q.ud.traffic_class = w.ah.grh.traffic_class;
		q.ud.flow_label = w.ah.grh.flow_label;
		memcpy(q.ud.dgid, w.ah.grh.dgid.raw, sizeof(q.ud.dgid));
	}
	if (is_mem_op(w.opcode)) {
		q.mem.slot = w.mw_slot;
		q.mem.type = w.mw_type;
		q.mem.lkey = w.bind_lkey;
		q.mem.access = w.bind_access;
		q.mem.addr = w.bind_addr;
		q.mem.length = w.bind_len;
		q.mem.npages = w.npages;
		q.mem.page_shift = w.page_shift;
		q.mem.new_key = w.rkey;
	}
	sv_send_wqe *slot = sq_slot(qp, index);
	char *data = reinterpret_cast<char *>(slot) + SV_WQE_HDR_SIZE;
	if (w.is_inline) {
		memcpy(data, w.inline_data, w.inline_len);
	} else {
		for (uint32_t i = 0; i < w.num_sge; i++) {
			sv_sge s{w.sge[i].addr, w.sge[i].length, w.sge[i].lkey};
			memcpy(data + i * sizeof(sv_sge), &s, sizeof(s));
		}
	}
	memcpy(slot, &q, sizeof(q));
	loop_qp::lib_wqe &lib = qp->sq_lib[index & qp->sq_mask];
	lib.index1 = index + 1;
	lib.frmr = w.opcode == kWrFastReg ? w.frmr : nullptr;
	lib.bind1_slot =
		w.opcode == IBV_WR_BIND_MW && w.mw_type == IBV_MW_TYPE_1 ? w.mw_slot : 0;
}

// Reads WQE number `index` into w (with fresh retry state), checking it as
// any input from shared memory is checked.  Returns IBV_WC_SUCCESS, or the
// status a malformed WQE completes with.  Caller holds sq_lock.
ibv_wc_status wqe_read(loop_qp *qp, uint64_t index, send_wr &w)
{
	const sv_send_wqe *slot = sq_slot(qp, index);
	sv_send_wqe q;
	memcpy(&q, slot, sizeof(q));
	const char *data = reinterpret_cast<const char *>(slot) + SV_WQE_HDR_SIZE;
	w.sq_index = index;
	w.wr_id = q.ctrl.wr_id;
	w.flags = q.ctrl.send_flags;
	w.rnr_left = qp->attr.rnr_retry;
	w.retry_left = qp->attr.retry_cnt;
	w.next_try_ns = 0;
	w.is_inline = false;
	w.inline_len = 0;
	w.num_sge = 0;
	w.frmr = nullptr;
	uint32_t op = q.ctrl.opcode;
	// The opcode is checked as an integer before it becomes the enum.
	if (op > IBV_WR_ATOMIC_WRITE || !opcode_ok(qp->type, static_cast<ibv_wr_opcode>(op))) {
		w.opcode = IBV_WR_SEND; // Completes as what it cannot be
		return IBV_WC_LOC_QP_OP_ERR;
	}
	w.opcode = static_cast<ibv_wr_opcode>(op);
	if (q.ctrl.flags & SV_WQE_INLINE) {
		if (q.ctrl.inline_len > qp->cap.max_inline_data ||
		    SV_WQE_HDR_SIZE + q.ctrl.inline_len > qp->sq_stride)
			return IBV_WC_LOC_LEN_ERR;
		w.is_inline = true;
		w.inline_len = q.ctrl.inline_len;
		memcpy(w.inline_data, data, w.inline_len);
	} else {
		if (q.ctrl.num_sge > qp->cap.max_send_sge ||
		    SV_WQE_HDR_SIZE + q.ctrl.num_sge * sizeof(sv_sge) > qp->sq_stride)
			return IBV_WC_LOC_LEN_ERR;
		w.num_sge = q.ctrl.num_sge;
		for (uint32_t i = 0; i < w.num_sge; i++) {
			sv_sge s;
			memcpy(&s, data + i * sizeof(sv_sge), sizeof(s));
			w.sge[i] = {s.addr, s.length, s.lkey};
		}
	}
	w.imm_data = is_inv_op(op) ? 0 : q.ctrl.imm;
	w.invalidate_rkey = is_inv_op(op) ? q.ctrl.imm : 0;
	w.xrc_srqn = q.ctrl.xrc_srqn;
	w.remote_addr = q.raddr.remote_addr;
	w.rkey = q.raddr.rkey;
	w.compare_add = q.atomic.compare_add;
	w.swap = q.atomic.swap;
	if (qp->type == IBV_QPT_UD) {
		w.remote_qpn = q.ud.remote_qpn;
		w.remote_qkey = q.ud.qkey;
		w.ah = {};
		w.ah.dlid = q.ud.dlid;
		w.ah.sl = q.ud.sl;
		w.ah.src_path_bits = q.ud.src_path_bits;
		w.ah.static_rate = q.ud.static_rate;
		w.ah.is_global = q.ud.is_global;
		w.ah.port_num = q.ud.port_num;
		w.ah.grh.sgid_index = q.ud.sgid_index;
		w.ah.grh.hop_limit = q.ud.hop_limit;
		w.ah.grh.traffic_class = q.ud.traffic_class;
		w.ah.grh.flow_label = q.ud.flow_label;
		memcpy(w.ah.grh.dgid.raw, q.ud.dgid, sizeof(q.ud.dgid));
	}
	if (is_mem_op(op)) {
		w.mw_slot = q.mem.slot;
		w.mw_type = q.mem.type;
		w.bind_lkey = q.mem.lkey;
		w.bind_access = q.mem.access;
		w.bind_addr = q.mem.addr;
		w.bind_len = q.mem.length;
		w.npages = q.mem.npages;
		w.page_shift = q.mem.page_shift;
		w.rkey = q.mem.new_key;
		// Checked here, where every WQE is run, whoever wrote it: a type 1
		// window is bound only by ibv_bind_mw, and only the library
		// fast-registers (its staged page list is in process memory).
		// The library's record of the slot says which WQE it wrote.
		const loop_qp::lib_wqe &lib = qp->sq_lib[index & qp->sq_mask];
		bool by_lib = lib.index1 == index + 1;
		if (op == IBV_WR_BIND_MW) {
			if (q.mem.type != IBV_MW_TYPE_1 && q.mem.type != IBV_MW_TYPE_2)
				return IBV_WC_MW_BIND_ERR;
			if (q.mem.type == IBV_MW_TYPE_1 &&
			    (!by_lib || !lib.bind1_slot || lib.bind1_slot != q.mem.slot))
				return IBV_WC_MW_BIND_ERR;
		} else {
			if (!by_lib || !lib.frmr || lib.frmr->slot != q.mem.slot)
				return IBV_WC_LOC_QP_OP_ERR;
			w.frmr = lib.frmr;
		}
	}
	return IBV_WC_SUCCESS;
}

// Publishes the requester's progress: WQEs before c are done.
void sq_set_cons(loop_qp *qp, uint64_t c)
{
	qp->sq_cons = c;
	qp->sq_head_valid = false;
	if (!qp->sq)
		return;
	std::atomic_ref<uint64_t>(qp->sq->acked).store(c, std::memory_order_release);
	std::atomic_ref<uint64_t>(qp->sq->cons).store(c, std::memory_order_release);
}

// Publishes the producer index and rings the doorbell (the ring's contract,
// softverbs-abi.h).  The posting thread runs the requester itself next, so
// no engine needs waking.
void sq_doorbell(loop_qp *qp, uint64_t prod)
{
	std::atomic_ref<uint64_t>(qp->sq->retired)
		.store(qp->sq_retired.load(std::memory_order_acquire), std::memory_order_release);
	std::atomic_ref<uint64_t>(qp->sq->prod).store(prod, std::memory_order_release);
	std::atomic_ref<uint64_t>(qp->sq->db_record).store(prod, std::memory_order_seq_cst);
}

// Completes every WQE the requester has not finished flushed, in order.
// Caller holds sq_lock.
void flush_backlog(loop_qp *qp)
{
	uint64_t posted = qp->sq_posted.load(std::memory_order_relaxed);
	thread_local send_wr w;
	for (uint64_t i = qp->sq_cons; i != posted; i++) {
		const send_wr *f = &w;
		if (i == qp->sq_cons && qp->sq_head_valid)
			f = &qp->sq_head;
		else
			wqe_read(qp, i, w);
		push_sq(qp, *f, IBV_WC_WR_FLUSH_ERR, wc_opcode(f->opcode), 0);
	}
	sq_set_cons(qp, posted);
}

// Runs WQEs from the head of the send queue.  Caller holds sq_lock.
uint64_t drain(loop_qp *qp)
{
	fabric &fab = *qp->ctx->fab;
	sv_qp_rec &rec = fab.reg()->qps[qp->slot];
	uint64_t posted = qp->sq_posted.load(std::memory_order_relaxed);
	while (qp->sq_cons != posted) {
		uint32_t state = std::atomic_ref<uint32_t>(rec.state).load(std::memory_order_acquire);
		if (state == IBV_QPS_ERR) {
			flush_backlog(qp);
			return 0;
		}
		send_wr &w = qp->sq_head;
		if (!qp->sq_head_valid) {
			ibv_wc_status st = wqe_read(qp, qp->sq_cons, w);
			qp->sq_head_valid = true;
			if (st != IBV_WC_SUCCESS) {
				complete(qp, w, st, 0);
				sq_set_cons(qp, qp->sq_cons + 1);
				continue;
			}
		}
		uint64_t now = now_ns();
		if (w.next_try_ns > now)
			return w.next_try_ns;
		step s = run_wr(qp, w);
		if (s == step::done) {
			sq_set_cons(qp, qp->sq_cons + 1);
			continue;
		}
		ibv_wc_status fail = IBV_WC_SUCCESS;
		if (s == step::rnr) {
			// An RNR wait on a dead responder would last forever with
			// rnr_retry 7: a dead peer counts as unreachable instead.
			uint32_t ps = qp->attr.dest_qp_num & SV_QPN_SLOT_MASK;
			const sv_qp_rec &pr = fab.reg()->qps[ps];
			if (!fab.lease_alive(pr.owner_lease, pr.owner_gen)) {
				fab.reap_dead();
				s = step::unreachable;
			}
		}
		if (s == step::rnr) {
			if (w.rnr_left == 0)
				fail = IBV_WC_RNR_RETRY_EXC_ERR;
			else if (w.rnr_left != 7)
				w.rnr_left--;
			uint32_t peer_slot = qp->attr.dest_qp_num & SV_QPN_SLOT_MASK;
			uint8_t t = fab.reg()->qps[peer_slot].min_rnr_timer & 31;
			w.next_try_ns = now + kRnrTimerUs[t] * 1000ULL;
		} else {
			fab.reap_dead();
			if (w.retry_left == 0)
				fail = IBV_WC_RETRY_EXC_ERR;
			else
				w.retry_left--;
			w.next_try_ns = now + timeout_ns(qp->attr.timeout);
		}
		if (fail != IBV_WC_SUCCESS) {
			complete(qp, w, fail, 0);
			sq_set_cons(qp, qp->sq_cons + 1);
			qp_set_error(fab, qp->slot);
			flush_backlog(qp);
			return 0;
		}
		return w.next_try_ns;
	}
	return 0;
}

// Copies an ibv_send_wr into our own form, checking what a real provider
// checks at post time.  Returns 0 or the errno for post_send.
int copy_wr(loop_qp *qp, const ibv_send_wr *in, send_wr &w, const mem_wr_extra *x)
{
	// Any bits may come in (tests pass 77): check them as an integer first,
	// since loading a value beyond the enum's range is undefined (UBSan).
	uint32_t raw_op;
	static_assert(sizeof(raw_op) == sizeof(in->opcode));
	memcpy(&raw_op, &in->opcode, sizeof(raw_op));
	if (raw_op > IBV_WR_ATOMIC_WRITE || !opcode_ok(qp->type, in->opcode))
		return EINVAL;
	if (in->num_sge < 0 || static_cast<uint32_t>(in->num_sge) > qp->cap.max_send_sge)
		return EINVAL;
	w.wr_id = in->wr_id;
	w.opcode = in->opcode;
	w.flags = in->send_flags;
	w.num_sge = static_cast<uint32_t>(in->num_sge);
	w.is_inline = false;
	w.inline_len = 0;
	if ((in->send_flags & IBV_SEND_INLINE) &&
	    (in->opcode == IBV_WR_SEND || in->opcode == IBV_WR_SEND_WITH_IMM ||
	     in->opcode == IBV_WR_RDMA_WRITE || in->opcode == IBV_WR_RDMA_WRITE_WITH_IMM)) {
		uint64_t len = 0;
		for (int i = 0; i < in->num_sge; i++)
			len += in->sg_list[i].length;
		if (len > qp->cap.max_inline_data)
			return EINVAL;
		uint32_t off = 0;
		for (int i = 0; i < in->num_sge; i++) {
			// An empty entry may carry a null address (UCX's am_short
			// with no payload): memcpy's source must not be null even
			// for 0 bytes (UBSan: nonnull argument).
			if (in->sg_list[i].length)
				memcpy(w.inline_data + off,
				       reinterpret_cast<const void *>(in->sg_list[i].addr),
				       in->sg_list[i].length);
			off += in->sg_list[i].length;
		}
		w.is_inline = true;
		w.inline_len = off;
		w.num_sge = 0;
	} else {
		for (int i = 0; i < in->num_sge; i++)
			w.sge[i] = in->sg_list[i];
	}
	w.imm_data = in->imm_data;
	w.invalidate_rkey = 0;
	if (in->opcode == IBV_WR_LOCAL_INV || in->opcode == IBV_WR_SEND_WITH_INV)
		w.invalidate_rkey = in->invalidate_rkey;
	if (in->opcode == IBV_WR_BIND_MW || in->opcode == kWrFastReg) {
		int err = mr_copy_wr(qp, in, w, x);
		if (err)
			return err;
	}
	switch (in->opcode) {
	case IBV_WR_RDMA_WRITE:
	case IBV_WR_RDMA_WRITE_WITH_IMM:
	case IBV_WR_RDMA_READ:
		w.remote_addr = in->wr.rdma.remote_addr;
		w.rkey = in->wr.rdma.rkey;
		break;
	case IBV_WR_ATOMIC_CMP_AND_SWP:
	case IBV_WR_ATOMIC_FETCH_AND_ADD:
		w.remote_addr = in->wr.atomic.remote_addr;
		w.rkey = in->wr.atomic.rkey;
		w.compare_add = in->wr.atomic.compare_add;
		w.swap = in->wr.atomic.swap;
		break;
	default:
		break;
	}
	if (qp->type == IBV_QPT_UD) {
		// A destroyed AH, or one of another context: EINVAL (objects.h).
		if (!in->wr.ud.ah || !to_loop_ah(in->wr.ud.ah)->life.is(kLifeAh) ||
		    in->wr.ud.ah->context != qp->vqp.qp.context)
			return EINVAL;
		w.ah = to_loop_ah(in->wr.ud.ah)->attr;
		w.remote_qpn = in->wr.ud.remote_qpn;
		w.remote_qkey = in->wr.ud.remote_qkey;
	}
	if (qp->type == IBV_QPT_XRC_SEND)
		w.xrc_srqn = in->qp_type.xrc.remote_srqn;
	w.rnr_left = qp->attr.rnr_retry;
	w.retry_left = qp->attr.retry_cnt;
	w.next_try_ns = 0;
	return 0;
}

// Writes one WR that passed the posting checks into the send queue and
// rings the doorbell; then, as the NIC, runs it unless it waits behind the
// backlog.  A WR posted to a QP in ERR completes flushed (with any the
// requester had not finished).  Caller holds sq_lock; state is refreshed
// for the next WR.  Returns 0 or ENOMEM.
int submit(loop_qp *qp, send_wr &w, uint32_t &state, bool &need_progress)
{
	sv_qp_rec &rec = qp->ctx->fab->reg()->qps[qp->slot];
	if (!qp->sq)
		return EINVAL;
	// The WR takes a send-queue slot until its completion (or a later
	// one's) is polled: past cap.max_send_wr the queue is full.
	uint64_t posted = qp->sq_posted.load(std::memory_order_relaxed);
	if (posted - qp->sq_retired.load(std::memory_order_acquire) >= qp->cap.max_send_wr)
		return ENOMEM;
	w.sq_index = posted;
	wqe_write(qp, w, posted);
	qp->sq_posted.store(posted + 1, std::memory_order_release);
	sq_doorbell(qp, posted + 1);
	if (state == IBV_QPS_ERR || state == IBV_QPS_SQE) {
		flush_backlog(qp);
		return 0;
	}
	if (qp->sq_cons != posted)
		return 0; // Waits behind the backlog
	// The requester allocates (iovecs) before it moves a byte: out of
	// memory fails this WR with ENOMEM and gives its slot back; no
	// exception leaves through the C caller (c_boundary.h).
	try {
		send_wr &h = qp->sq_head;
		ibv_wc_status st = wqe_read(qp, posted, h);
		qp->sq_head_valid = true;
		if (st != IBV_WC_SUCCESS) {
			complete(qp, h, st, 0);
			sq_set_cons(qp, posted + 1);
		} else if (run_wr(qp, h) == step::done) {
			sq_set_cons(qp, posted + 1);
		} else {
			h.next_try_ns = 0;
			drain(qp); // Books the retry (and fails at once with no retries left)
			need_progress = qp->sq_cons != qp->sq_posted.load(std::memory_order_relaxed);
		}
	} catch (abi::__forced_unwind &) {
		throw;
	} catch (...) {
		if (qp->sq_cons == posted) {
			qp->sq_head_valid = false;
			qp->sq_posted.store(posted, std::memory_order_release);
			sq_doorbell(qp, posted);
		}
		return current_exception_errno();
	}
	state = std::atomic_ref<uint32_t>(rec.state).load(std::memory_order_acquire);
	return 0;
}

} // namespace


atomic_guard::atomic_guard(fabric &fab, uint32_t lease, uint64_t addr)
{
	uint64_t h = (addr >> 3) * 0x9e3779b97f4a7c15ULL ^ lease;
	word_ = &fab.reg()->atomic_locks[(h >> 20) % SV_ATOMIC_LOCKS];
	auto me = static_cast<uint32_t>(getpid());
	std::atomic_ref<uint32_t> w(*word_);
	uint32_t seen = 0;
	uint64_t since = 0;
	for (uint64_t spins = 0;; spins++) {
		uint32_t expect = 0;
		if (w.compare_exchange_weak(expect, me, std::memory_order_acquire))
			return;
		// The word is in shared memory: a value no pid can have is a stray
		// write, taken over at once.  A holder stays inside for two word
		// copies; one that died, or a value that has named the same process
		// for 2 s (a stray write naming a live process, or a holder stopped
		// in a debugger) is taken over too: never a wait without end.
		bool broken = expect >= (1u << 22);
		if (!broken && (spins & 0xfff) == 0xfff) {
			uint64_t now = now_ns();
			if (expect != seen) {
				seen = expect;
				since = now;
			}
			broken = (kill(static_cast<pid_t>(expect), 0) && errno == ESRCH) ||
				 now - since > 2000000000ULL;
		}
		if (broken && w.compare_exchange_strong(expect, me, std::memory_order_acquire))
			return;
		if (spins > 64)
			sched_yield();
	}
}

atomic_guard::~atomic_guard()
{
	std::atomic_ref<uint32_t>(*word_).store(0, std::memory_order_release);
}

int loop_post_send(ibv_qp *ibqp, ibv_send_wr *wr, ibv_send_wr **bad)
{
	return post_send_mem(ibqp, wr, bad, nullptr);
}

int post_send_mem(ibv_qp *ibqp, ibv_send_wr *wr, ibv_send_wr **bad, const mem_wr_extra *x)
{
	loop_qp *qp = to_loop_qp(ibqp);
	if (!qp->life.is(kLifeQp)) [[unlikely]] { // A destroyed QP (objects.h)
		*bad = wr;
		return life_bad("ibv_post_send", qp, qp->life, kLifeQp);
	}
	fabric &fab = *qp->ctx->fab;
	sv_qp_rec &rec = fab.reg()->qps[qp->slot];
	int ret = 0;
	bool need_progress = false;
	{
		std::lock_guard<std::mutex> g(qp->sq_lock);
		uint32_t state = std::atomic_ref<uint32_t>(rec.state).load(std::memory_order_acquire);
		if (state == IBV_QPS_RESET || state == IBV_QPS_INIT || state == IBV_QPS_RTR ||
		    qp->type == IBV_QPT_XRC_RECV || qp->agent) {
			*bad = wr;
			return EINVAL;
		}
		thread_local send_wr w;
		for (; wr; wr = wr->next) {
			try { // c_boundary.h: ENOMEM at this WR, those before it posted
				ret = copy_wr(qp, wr, w, x);
			} catch (abi::__forced_unwind &) {
				throw;
			} catch (...) {
				ret = current_exception_errno();
			}
			if (!ret)
				ret = submit(qp, w, state, need_progress);
			if (ret) {
				*bad = wr;
				break;
			}
		}
	}
	if (need_progress)
		progress_add(qp);
	return ret;
}

void qp_flush_backlog(loop_qp *qp)
{
	flush_backlog(qp);
}

uint64_t qp_run_backlog(loop_qp *qp)
{
	std::lock_guard<std::mutex> g(qp->sq_lock);
	return drain(qp);
}

bool wr_opcode_supported(ibv_qp_type t, ibv_wr_opcode op)
{
	return opcode_ok(t, op);
}

// The loop of loop_post_send over WRs already in our form (ibv_wr_*).
int qp_post_batch(loop_qp *qp, send_wr *wrs, size_t n)
{
	fabric &fab = *qp->ctx->fab;
	sv_qp_rec &rec = fab.reg()->qps[qp->slot];
	bool need_progress = false;
	int ret = 0;
	{
		std::lock_guard<std::mutex> g(qp->sq_lock);
		uint32_t state = std::atomic_ref<uint32_t>(rec.state).load(std::memory_order_acquire);
		if (state == IBV_QPS_RESET || state == IBV_QPS_INIT || state == IBV_QPS_RTR ||
		    qp->type == IBV_QPT_XRC_RECV || qp->agent)
			return EINVAL;
		uint64_t used = qp->sq_posted.load(std::memory_order_relaxed) -
				qp->sq_retired.load(std::memory_order_acquire);
		if (used + n > qp->cap.max_send_wr)
			return ENOMEM;
		// The room check above makes submit() succeed for every WR: the
		// batch posts whole, unless memory runs out (ENOMEM, with the WRs
		// before that one posted).
		for (size_t i = 0; i < n && !ret; i++) {
			send_wr &w = wrs[i];
			w.rnr_left = qp->attr.rnr_retry;
			w.retry_left = qp->attr.retry_cnt;
			w.next_try_ns = 0;
			ret = submit(qp, w, state, need_progress);
		}
	}
	if (need_progress)
		progress_add(qp);
	return ret;
}

int sq_create(loop_qp *qp, ibv_pd *pd)
{
	uint32_t count = round_pow2(std::max<uint32_t>(qp->cap.max_send_wr, 1));
	uint32_t data = std::max<uint32_t>({qp->cap.max_send_sge * uint32_t{sizeof(sv_sge)},
					    qp->cap.max_inline_data, SV_SQ_MIN_INLINE});
	uint32_t stride = (SV_WQE_HDR_SIZE + data + SV_CACHELINE - 1) & ~uint32_t{SV_CACHELINE - 1};
	size_t bytes = SV_SQ_HDR_SIZE + size_t{count} * stride;
	try {
		qp->sq_lib.assign(count, loop_qp::lib_wqe{});
	} catch (...) {
		return ENOMEM;
	}
	// The application's placement first (a parent domain's allocator);
	// else shared memory of our own.  No peer maps it.
	void *map = pd_alloc(pd, bytes, 4096, SOFTVERBS_RES_TYPE_SQ);
	if (!map)
		return ENOMEM;
	if (map != IBV_ALLOCATOR_USE_DEFAULT) {
		if (reinterpret_cast<uintptr_t>(map) % SV_CACHELINE) {
			pd_free(pd, map, SOFTVERBS_RES_TYPE_SQ);
			return EINVAL; // The ring's lines must be cache lines
		}
		memset(map, 0, bytes);
		qp->sq_alloc_pd = pd;
	} else {
		map = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1,
			   0);
		if (map == MAP_FAILED)
			return ENOMEM;
	}
	auto *r = static_cast<sv_sq_ring *>(map);
	r->magic = SV_SQ_MAGIC;
	r->format_version = SV_SQ_FORMAT_VERSION;
	r->count = count;
	r->stride = stride;
	r->hdr_size = SV_SQ_HDR_SIZE;
	r->max_sge = qp->cap.max_send_sge;
	r->max_inline = qp->cap.max_inline_data;
	qp->sq = r;
	qp->sq_bytes = bytes;
	qp->sq_mask = count - 1;
	qp->sq_stride = stride;
	return 0;
}

void sq_destroy(loop_qp *qp)
{
	std::lock_guard<std::mutex> g(qp->sq_lock);
	if (qp->sq && qp->sq_alloc_pd)
		pd_free(qp->sq_alloc_pd, qp->sq, SOFTVERBS_RES_TYPE_SQ);
	else if (qp->sq)
		munmap(qp->sq, qp->sq_bytes);
	qp->sq = nullptr;
	qp->sq_alloc_pd = nullptr;
	qp->sq_head_valid = false;
}

void sq_reset(loop_qp *qp)
{
	uint64_t posted = qp->sq_posted.load(std::memory_order_relaxed);
	sq_set_cons(qp, posted);
	// Nothing of the send queue is left to complete: every slot is free.
	qp->sq_retired.store(posted, std::memory_order_release);
	if (qp->sq)
		std::atomic_ref<uint64_t>(qp->sq->retired).store(posted, std::memory_order_release);
}

int sq_serve_doorbell(loop_qp *qp, bool &need_progress)
{
	std::lock_guard<std::mutex> g(qp->sq_lock);
	if (!qp->agent || !qp->sq)
		return 0;
	uint64_t db = std::atomic_ref<uint64_t>(qp->sq->db_record).load(std::memory_order_acquire);
	uint64_t posted = qp->sq_posted.load(std::memory_order_relaxed);
	if (db == posted || db == qp->sq_bad_db)
		return 0;
	fabric &fab = *qp->ctx->fab;
	sv_qp_rec &rec = fab.reg()->qps[qp->slot];
	uint32_t state = std::atomic_ref<uint32_t>(rec.state).load(std::memory_order_acquire);
	// A doorbell that goes back, or past the ring's slots, is refused; so
	// is one rung before the QP can send (ring again once it can).
	uint64_t count = uint64_t{qp->sq_mask} + 1;
	if (db - posted > count || db - qp->sq_cons > count || state == IBV_QPS_RESET ||
	    state == IBV_QPS_INIT || state == IBV_QPS_RTR) {
		qp->sq_bad_db = db;
		debug_log("QP %#x: agent doorbell %llu refused (posted %llu, state %u)", qp->qpn,
			  static_cast<unsigned long long>(db), static_cast<unsigned long long>(posted),
			  state);
		return 0;
	}
	qp->sq_posted.store(db, std::memory_order_release);
	int n = static_cast<int>(db - posted);
	if (state == IBV_QPS_ERR || state == IBV_QPS_SQE) {
		flush_backlog(qp);
		return n;
	}
	drain(qp);
	need_progress = qp->sq_cons != db;
	return n;
}

int loop_dv_qp_agent(ibv_qp *ibqp, int on, softverbs_dv_sq *out)
{
	loop_qp *qp = to_loop_qp(ibqp);
	if (!qp->life.is(kLifeQp))
		return life_bad("softverbs_dv_qp_agent", qp, qp->life, kLifeQp);
	if (!qp->sq || qp->opened ||
	    (qp->type != IBV_QPT_RC && qp->type != IBV_QPT_UC && qp->type != IBV_QPT_UD))
		return EINVAL;
	if (on) {
		if (!out)
			return EINVAL;
		{
			std::lock_guard<std::mutex> g(qp->sq_lock);
			if (qp->agent)
				return EBUSY;
			// Handed over empty: every WQE the library posted has
			// completed and been polled.
			uint64_t posted = qp->sq_posted.load(std::memory_order_relaxed);
			if (qp->sq_cons != posted ||
			    qp->sq_retired.load(std::memory_order_acquire) != posted)
				return EBUSY;
			sv_sq_ring *r = qp->sq;
			std::atomic_ref<uint64_t>(r->retired).store(posted, std::memory_order_relaxed);
			std::atomic_ref<uint64_t>(r->prod).store(posted, std::memory_order_relaxed);
			std::atomic_ref<uint32_t>(r->sleeping).store(0, std::memory_order_relaxed);
			std::atomic_ref<uint64_t>(r->db_record).store(posted, std::memory_order_release);
			qp->sq_bad_db = posted;
			qp->agent = true;
			memset(out, 0, sizeof(*out));
			out->ring = r;
			out->slots = reinterpret_cast<char *>(r) + SV_SQ_HDR_SIZE;
			out->prod = &r->prod;
			out->db_record = &r->db_record;
			out->sleeping = &r->sleeping;
			out->retired = &r->retired;
			out->format_version = SV_SQ_FORMAT_VERSION;
			out->count = qp->sq_mask + 1;
			out->stride = qp->sq_stride;
			out->max_sge = qp->cap.max_send_sge;
			out->max_inline = qp->cap.max_inline_data;
			out->max_wr = qp->cap.max_send_wr;
			out->qpn = qp->qpn;
			out->next = posted;
			out->freed = posted;
		}
		if (int e = engine_add(qp)) {
			std::lock_guard<std::mutex> g(qp->sq_lock);
			qp->agent = false;
			return e;
		}
		return 0;
	}
	{
		std::lock_guard<std::mutex> g(qp->sq_lock);
		if (!qp->agent)
			return EINVAL;
		uint64_t posted = qp->sq_posted.load(std::memory_order_relaxed);
		uint64_t db =
			std::atomic_ref<uint64_t>(qp->sq->db_record).load(std::memory_order_acquire);
		if (qp->sq_cons != posted || (db != posted && db != qp->sq_bad_db))
			return EBUSY; // Work is still in the ring
		qp->agent = false;
		// The agent's retired count, as far as it is believable.
		uint64_t r = std::atomic_ref<uint64_t>(qp->sq->retired).load(std::memory_order_acquire);
		uint64_t mine = qp->sq_retired.load(std::memory_order_acquire);
		if (r - mine <= posted - mine)
			qp->sq_retired.store(r, std::memory_order_release);
	}
	engine_remove(qp);
	return 0;
}

} // namespace loop
