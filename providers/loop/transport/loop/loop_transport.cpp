// SPDX-License-Identifier: MIT
// The loop transport: peers are processes of this host on one fabric.  A
// destination is a record in the registry; a key resolves to the owner's
// addresses (cross-memory attach, or memcpy within a process) or to our
// mapping of its fd-backed memory (mr_resolve, loop_mr.cpp); receive
// queues and CQs are the peer's shared rings, mapped and held by
// queue_map.  Delivery is synchronous: the requester's thread runs the
// peer's responder (engine/responder.cpp) against those rings, so every
// request is delivered exactly once and no sequence state is kept.
// A connected QP whose peer is on another host (loop_qp::wire_remote)
// resolves to a remote peer, and every call for that peer goes on to the
// rocev2 transport (rocev2/rocev2.h): the engine sees one transport.
#include "engine.h"
#include "peer_maps.h"
#include "queue_geom.h"
#include "queue_seg.h"
#include "rocev2/rocev2.h"
#include "service.h"
#include "transport.h"
#include "xfer.h"
#include "mr_copiers.h"

#include <cerrno>
#include <cxxabi.h>
#include <cstring>
#include <algorithm>
#include <signal.h>

namespace loop {

namespace {

// Whether QP record q still holds the QP of generation gen: read after a
// copy (or loads) of its fields and an acquire fence, so that fields a
// destroy and a new QP in the slot tore are not taken for that QP's.
inline bool qp_rec_still(const sv_qp_rec &q, uint32_t gen)
{
	return std::atomic_ref<const uint32_t>(q.in_use).load(std::memory_order_relaxed) &&
	       std::atomic_ref<const uint32_t>(q.generation).load(std::memory_order_relaxed) == gen;
}

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
[[gnu::hot]] bool find_qp(loop_context *lctx, uint32_t qpn, uint16_t dlid, bool eth, peer &out)
{
	sv_registry *r = lctx->fab->reg();
	uint32_t slot = qpn & SV_QPN_SLOT_MASK;
	sv_qp_rec &q = r->qps[slot];
	if (!std::atomic_ref<uint32_t>(q.in_use).load(std::memory_order_acquire))
		return false;
	memcpy(&out.rec, &q, sizeof(q));
	std::atomic_thread_fence(std::memory_order_acquire);
	// The generation and in_use read again after the copy: a destroy and a
	// new QP in the slot during the copy could tear it (the old QP's
	// generation beside the new QP's fields).  See find_qp_cached.
	if ((out.rec.generation & SV_QPN_SLOT_MASK) != (qpn >> SV_QPN_SLOT_BITS) || !out.rec.in_use ||
	    !qp_rec_still(q, out.rec.generation))
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
	if (out.pid <= 0 || out.pid >= static_cast<pid_t>(kPidMaxLimit))
		return false;
	out.self = lease == static_cast<uint32_t>(lctx->lease) && out.pid == getpid();
	out.slot = slot;
	out.qpn = qpn;
	out.xrc_srq = -1;
	return true;
}

// find_qp through the QP's peer cache (loop.h: peer_cache): the answer
// find_qp would give, without the port and lease lookups when the record
// still is the QP found last time.
[[gnu::hot]] bool find_qp_cached(loop_qp *qp, uint32_t qpn, uint16_t dlid, bool eth, peer &out)
{
	loop_qp::peer_cache &c = qp->tp_peer;
	if (c.valid && c.qpn == qpn && c.dlid == dlid && c.eth == eth) {
		sv_registry *r = qp->ctx->fab->reg();
		sv_qp_rec &q = r->qps[c.slot];
		if (std::atomic_ref<uint32_t>(q.in_use).load(std::memory_order_acquire)) {
			memcpy(&out.rec, &q, sizeof(q));
			std::atomic_thread_fence(std::memory_order_acquire);
			const sv_lease &l = r->leases[c.rec.owner_lease];
			// The same QP on the same port (a QP may move to another
			// port, whose LID the address must carry; a port's LID and
			// link layer never change).  The generation and in_use are
			// read again after the copy: a copy that a destroy and a new
			// QP in the slot tore (its generation from before, its other
			// fields from the new QP) is not taken for the old QP.
			if (out.rec.in_use && out.rec.generation == c.rec.generation &&
			    qp_rec_still(q, c.rec.generation) &&
			    out.rec.device == c.rec.device && out.rec.port == c.rec.port &&
			    out.rec.owner_lease == c.rec.owner_lease &&
			    out.rec.owner_gen == c.rec.owner_gen &&
			    std::atomic_ref<const uint32_t>(l.generation).load(std::memory_order_relaxed) ==
				    c.rec.owner_gen &&
			    static_cast<int32_t>(std::atomic_ref<const uint32_t>(l.pid).load(
				    std::memory_order_relaxed)) == c.pid) {
				out.lid = c.lid;
				out.pid = c.pid;
				out.self = false;
				out.slot = c.slot;
				out.qpn = qpn;
				out.xrc_srq = -1;
				return true;
			}
		}
	}
	c.valid = false;
	if (!find_qp(qp->ctx, qpn, dlid, eth, out))
		return false;
	// Not for a QP of this process: "self" needs find_qp's look at our
	// pid (a child of fork is another process with the same lease).
	if (qp->type != IBV_QPT_UD && !out.self) {
		c.eth = eth;
		c.dlid = dlid;
		c.lid = out.lid;
		c.qpn = qpn;
		c.slot = out.slot;
		c.pid = out.pid;
		c.rec = out.rec;
		c.valid = true;
	}
	return true;
}

[[gnu::hot]] int lt_resolve(loop_qp *qp, const tp_dest &d, peer &p)
{
	if (d.dgid && qp->ctx->ldev->cfg.rocev2) [[unlikely]] {
		// A connected QP learnt at RTR where its peer is; a datagram's
		// address is looked up.
		if (qp->type == IBV_QPT_UD ? rocev2_remote_gid(qp->ctx, qp->attr.port_num, *d.dgid)
					   : qp->wire_remote)
			return rocev2_transport_ops.resolve(qp, d, p);
	}
	if (!find_qp_cached(qp, d.qpn, d.dlid, d.eth, p))
		return ENOENT;
	if (d.xrc_srqn == kNoXrcSrq)
		return 0;
	// XRC: the WR names the SRQ, which must share the receive QP's domain.
	sv_registry *reg = qp->ctx->fab->reg();
	uint32_t srq_slot = SV_MAX_OBJS;
	for (uint32_t i = 0; i < SV_MAX_OBJS; i++) {
		const sv_obj_rec &o = reg->objs[i];
		if (o.in_use && o.kind == SV_OBJ_SRQ && o.srq_num == d.xrc_srqn) {
			srq_slot = i;
			break;
		}
	}
	if (srq_slot == SV_MAX_OBJS || reg->objs[srq_slot].xrcd != p.rec.xrcd)
		return EINVAL;
	p.rec.has_srq = 1;
	p.rec.rq_obj = srq_slot;
	p.rec.rq_gen = reg->objs[srq_slot].generation;
	p.xrc_srq = static_cast<int>(srq_slot);
	// An XRC target QP has no PD: keys are checked against the SRQ's.
	p.rec.pdn = reg->objs[srq_slot].pdn;
	// Processes that open one XRC domain (by its file) share it: the SRQ
	// may be another's than the target QP's owner, and the receive lands
	// in the SRQ owner's memory, under its keys.
	const sv_obj_rec &so = reg->objs[srq_slot];
	if (so.owner_lease != p.rec.owner_lease) {
		uint32_t lease = so.owner_lease;
		if (lease >= SV_MAX_PROCS || reg->leases[lease].generation != so.owner_gen)
			return ENOENT;
		auto pid = static_cast<pid_t>(reg->leases[lease].pid);
		if (pid <= 0 || pid >= static_cast<pid_t>(kPidMaxLimit))
			return ENOENT;
		p.rec.owner_lease = lease;
		p.rec.owner_gen = so.owner_gen;
		p.pid = pid;
		p.self = lease == static_cast<uint32_t>(qp->ctx->lease) && pid == getpid();
	}
	return 0;
}

void lt_mcast_members(loop_qp *qp, const send_wr &w, bool eth, std::vector<peer> &out)
{
	fabric &fab = *qp->ctx->fab;
	sv_registry *reg = fab.reg();
	thread_local std::vector<uint32_t> qpns;
	qpns.clear();
	{
		registry_guard g(fab);
		for (const sv_mcast_rec &m : reg->mcast)
			if (m.num_qps && (memcmp(m.gid, w.ah.grh.dgid.raw, 16) == 0 ||
					  (!w.ah.is_global && m.lid == w.ah.dlid)))
				qpns.insert(qpns.end(), m.qpns,
					    m.qpns + std::min<uint32_t>(m.num_qps, SV_MAX_MCAST_QPS));
	}
	// One copy per QP: a QP attached to two groups that share the LID a
	// datagram without a GRH names is one member of both.
	std::sort(qpns.begin(), qpns.end());
	qpns.erase(std::unique(qpns.begin(), qpns.end()), qpns.end());
	for (uint32_t qpn : qpns) {
		if (qpn == qp->qpn && qp->block_self_mcast)
			continue; // Its own datagram: back to it only without the flag
		uint32_t slot = qpn & SV_QPN_SLOT_MASK;
		if (slot >= SV_MAX_QPS)
			continue;
		uint16_t lid = port_lid(reg, reg->qps[slot].device, reg->qps[slot].port);
		peer p;
		if (find_qp(qp->ctx, qpn, lid, eth, p))
			out.push_back(p);
	}
}

[[gnu::hot]] int lt_resolve_key(loop_qp *qp, const peer &p, uint32_t key, uint32_t pdn, uint64_t addr,
		   uint64_t len, uint32_t right, std::vector<rseg> &out, uint32_t *access)
{
	if (p.remote) [[unlikely]]
		return rocev2_transport_ops.resolve_key(qp, p, key, pdn, addr, len, right, out,
							access);
	return mr_resolve_cached(*qp->ctx->fab, qp->tp_keys, key, p.rec.owner_lease, pdn, addr, len,
				 right, p.qpn, out, access);
}

int lt_invalidate(loop_qp *qp, const peer &p, uint32_t rkey)
{
	if (p.remote) [[unlikely]]
		return rocev2_transport_ops.invalidate(qp, p, rkey);
	return mr_remote_invalidate(*qp->ctx->fab, p.rec.owner_lease, p.rec.pdn, p.qpn, rkey);
}

// queue_map through the QP's two-entry cache: a connected QP delivers to
// the same receive queue and CQ every time, and the process-wide map takes
// a lock and a hash lookup per call (three per SEND).  A hit is checked
// against the registry as queue_map checks it (the object in use, its
// generation, its kind), so a queue destroyed or replaced since misses.
// The hold is returned by value: the caller's copy keeps the mapping even
// if a nested call replaces the cache entry.  Caller holds qp->sq_lock.
// *geom (if given) receives the geometry this process checked when it
// mapped the queue; an empty hold leaves it as it was.
[[gnu::hot]] const queue_hold &qp_queue_ref(loop_qp *qp, const obj_ref &ref, sv_obj_kind kind,
					    queue_geom *geom = nullptr)
{
	static const queue_hold &none = *new queue_hold; // Never destroyed: threads outlive main
	fabric &fab = *qp->ctx->fab;
	loop_qp::queue_cache *slot = &qp->tp_queues[qp->tp_queue_next];
	if (ref.slot < SV_MAX_OBJS) {
		for (loop_qp::queue_cache &c : qp->tp_queues) {
			if (!c.hold || c.ref.slot != ref.slot || c.ref.gen != ref.gen || c.kind != kind)
				continue;
			sv_obj_rec &o = fab.reg()->objs[ref.slot];
			if (std::atomic_ref<uint32_t>(o.in_use).load(std::memory_order_acquire) &&
			    o.generation == ref.gen && o.kind == static_cast<uint32_t>(kind)) {
				if (geom)
					*geom = c.geom;
				return c.hold;
			}
			// Gone: this entry lets its mapping go, and takes the new one.
			c = {};
			slot = &c;
			break;
		}
	}
	queue_hold h = queue_map(fab, ref, kind);
	queue_geom g;
	if (h && queue_geometry(h.as<void>(), g)) {
		if (slot == &qp->tp_queues[qp->tp_queue_next])
			qp->tp_queue_next ^= 1;
		slot->ref = ref;
		slot->kind = kind;
		slot->hold = std::move(h);
		slot->geom = g;
		if (geom)
			*geom = g;
		return slot->hold;
	}
	// A mapping without a trusted geometry is no queue to use.
	return none;
}

// qp_queue_ref's hold as a copy of its own: for a caller that may look up
// another queue of the QP (which may replace the entry) while it uses this
// one.
queue_hold qp_queue(loop_qp *qp, const obj_ref &ref, sv_obj_kind kind, queue_geom *geom = nullptr)
{
	return qp_queue_ref(qp, ref, kind, geom);
}

// Places every deferred SEND of the QP that its peer has not taken yet.
// Called before the QP moves any other bytes, and on state changes.
[[gnu::noinline]] void flush_deferred_all(loop_qp *qp)
{
	for (const loop_qp::deferred_send &d : qp->deferred) {
		queue_hold h = qp_queue(qp, d.cq, SV_OBJ_CQ);
		auto *ring = h.as<sv_cq_ring>();
		if (ring && cq_has_payload(ring))
			cq_place_deferred(ring, d.index, d.dst, d.pid, d.mr, d.cookie);
	}
	qp->deferred.clear();
}

// The common case inline: nothing deferred (every express WR asks).
inline void flush_deferred(loop_qp *qp)
{
	if (!qp->deferred.empty()) [[unlikely]]
		flush_deferred_all(qp);
}

// Forgets deferred SENDs the peer has taken; bounds the list.
void note_deferred(loop_qp *qp, const obj_ref &cq, uint64_t index, void *dst, pid_t pid,
		   sv_mr_rec *mr, uint32_t cookie)
{
	auto &v = qp->deferred;
	if (v.size() >= kMaxDeferred) {
		std::erase_if(v, [&](const loop_qp::deferred_send &d) {
			queue_hold h = qp_queue(qp, d.cq, SV_OBJ_CQ);
			auto *ring = h.as<sv_cq_ring>();
			return !ring || std::atomic_ref<uint64_t>(ring->cons).load() > d.index;
		});
		if (v.size() >= kMaxDeferred)
			flush_deferred(qp);
	}
	// Never allocates (the room was reserved when the QP was made): the
	// SEND is published already, and an exception here would lose it.
	if (v.size() < v.capacity()) {
		v.push_back({cq, index, dst, pid, mr, cookie});
		return;
	}
	// No room (cannot happen while the reservation holds): place it now.
	queue_hold h = qp_queue(qp, cq, SV_OBJ_CQ);
	if (auto *ring = h.as<sv_cq_ring>(); ring && cq_has_payload(ring))
		cq_place_deferred(ring, index, dst, pid, mr, cookie);
}

// The peer queues a connected QP delivered to last (its queue cache): the
// receive WQE at the consumers' index and the CQ slot (and its payload) at
// the producers' index, each likely the next this QP will use.  Prefetches
// of a mapping the cache holds: an index that moved on only costs a line.
// Their owners write these lines between messages, so without this the
// requester waited for each in turn (a ping-pong's every SEND).
[[gnu::hot]] void lt_warm(loop_qp *qp)
{
	if (qp->wire_remote)
		return;
	if (const loop_qp::express_memo &m = qp->xmemo; m.speer.valid) {
		// The SEND memo's queues, at the indices after its last SEND's:
		// no load from the rings (a prefetch never faults, even in a
		// range truncated since), so no record to check first.
		char *rq = m.rqh.as<char>(), *cq = m.cqh.as<char>();
		__builtin_prefetch(rq + m.rqg.slots_offset +
				   (m.rq_next & (m.rqg.entries - 1)) * m.rqg.entry_size);
		uint64_t i = m.cq_next & (m.cqg.entries - 1);
		__builtin_prefetch(cq + m.cqg.slots_offset + i * sizeof(sv_cqe), 1);
		if (m.cqg.payload_offset)
			__builtin_prefetch(cq + m.cqg.payload_offset + i * sizeof(sv_cqe_payload), 1);
		return;
	}
	sv_registry *r = qp->ctx->fab->reg();
	for (const loop_qp::queue_cache &c : qp->tp_queues) {
		if (!c.hold || c.ref.slot >= SV_MAX_OBJS)
			continue;
		// The indices are real loads: only of a queue that still exists,
		// as qp_queue checks it.  A queue its owner placed in a file and
		// destroyed may lie in a range the owner has since truncated
		// (SIGBUS here).
		const sv_obj_rec &o = r->objs[c.ref.slot];
		if (!std::atomic_ref<const uint32_t>(o.in_use).load(std::memory_order_acquire) ||
		    o.generation != c.ref.gen || o.kind != static_cast<uint32_t>(c.kind))
			continue;
		char *base = c.hold.as<char>();
		uint64_t mask = c.geom.entries - 1;
		if (c.kind == SV_OBJ_RQ || c.kind == SV_OBJ_SRQ) {
			uint64_t i = std::atomic_ref<uint64_t>(c.hold.as<sv_rq_ring>()->cons)
					     .load(std::memory_order_relaxed);
			__builtin_prefetch(base + c.geom.slots_offset + (i & mask) * c.geom.entry_size);
		} else if (c.kind == SV_OBJ_CQ) {
			uint64_t i = std::atomic_ref<uint64_t>(c.hold.as<sv_cq_ring>()->prod)
					     .load(std::memory_order_relaxed);
			__builtin_prefetch(base + c.geom.slots_offset + (i & mask) * sizeof(sv_cqe), 1);
			if (c.geom.payload_offset)
				__builtin_prefetch(base + c.geom.payload_offset +
							   (i & mask) * sizeof(sv_cqe_payload),
						   1);
		}
	}
}

// A batch of copies shares its system calls (xfer_moves).
[[gnu::hot]] int lt_move(loop_qp *qp, const peer &p, const tp_move *ops, size_t n, size_t *done)
{
	if (p.remote) [[unlikely]]
		return rocev2_transport_ops.move(qp, p, ops, n, done);
	flush_deferred(qp); // Earlier SENDs land first
	size_t k;
	int err = xfer_moves(p.pid, p.self, ops, n, &k);
	if (done)
		*done = k;
	return err;
}

// Reads or writes an atomic's target word: in the peer (cross-memory attach,
// or memcpy in-process), or in our mapping of a peer's fd-backed MR through
// the kernel (a file shrunk under us is EFAULT, not SIGBUS); on-demand
// memory takes a checked call even in-process.
int atomic_word(const peer &p, const mr_hit &hit, uint64_t *v, xfer_dir dir)
{
	// Held against the owner's dereg or rereg (mr_copiers.h), by address
	// or through a mapping.
	mr_copy_guard hold;
	if (hit.mr && !hold.take(hit.mr, hit.mr_cookie))
		return EACCES;
	if (hit.mapped)
		return xfer_mapped_word(hit.addr, v, dir);
	return xfer_word(p.pid, p.self && !hit.odp, hit.addr, v, dir);
}

int lt_atomic(loop_qp *qp, const peer &p, tp_atomic &op)
{
	if (p.remote) [[unlikely]]
		return rocev2_transport_ops.atomic(qp, p, op);
	fabric &fab = *qp->ctx->fab;
	mr_hit hit{};
	// A key, right or range fault first, then alignment (as rxe's
	// responder checks them).
	int err = (p.rec.access & op.right) ? mr_lookup(fab, op.rkey, p.rec.owner_lease, p.rec.pdn,
							op.addr, 8, op.right, p.qpn, hit)
					    : EACCES;
	if (err)
		return err;
	if (op.addr & 7)
		return EINVAL;
	op.old = 0;
	if (hit.kind == SV_MR_KIND_NULL)
		return 0;
	flush_deferred(qp);
	atomic_guard g(fab, hit.owner_addr, hit.file_word);
	if (op.op == tp_atomic::kind::write) {
		uint64_t v = op.swap;
		return atomic_word(p, hit, &v, xfer_dir::to_peer);
	}
	err = atomic_word(p, hit, &op.old, xfer_dir::from_peer);
	if (err)
		return err;
	uint64_t nv = op.old;
	if (op.op == tp_atomic::kind::fetch_add)
		nv = op.old + op.compare_add;
	else if (op.old == op.compare_add)
		nv = op.swap;
	else
		return 0;
	return atomic_word(p, hit, &nv, xfer_dir::to_peer);
}

[[gnu::hot]] tp_answer lt_deliver(loop_qp *qp, const peer &p, const tp_request &r)
{
	if (p.remote) [[unlikely]]
		return rocev2_transport_ops.deliver(qp, p, r);
	// The peer's responder runs here, on its shared rings.
	return respond(loop_transport_ops, qp, p, r);
}

// Whether the queue ref of kind is still the object it was (qp_queue_ref's
// check of a cached mapping): in use, same generation and kind.
[[gnu::always_inline]] inline bool queue_still(const sv_registry *r, const obj_ref &ref,
					       sv_obj_kind kind)
{
	if (ref.slot >= SV_MAX_OBJS)
		return false;
	const sv_obj_rec &o = r->objs[ref.slot];
	return std::atomic_ref<const uint32_t>(o.in_use).load(std::memory_order_acquire) &&
	       std::atomic_ref<const uint32_t>(o.generation).load(std::memory_order_relaxed) ==
		       ref.gen &&
	       o.kind == static_cast<uint32_t>(kind);
}

[[gnu::hot]] int lt_take_recv(loop_qp *qp, const peer &p, std::vector<uint8_t> &buf, sv_recv_wqe *&wqe,
		 uint32_t &pdn)
{
	fabric &fab = *qp->ctx->fab;
	sv_registry *r = fab.reg();
	// A queue still there (queue_still) and not mapped: this process could
	// not map it (queue_map said why; out of descriptors).  Gone: its QP is
	// being destroyed.
	// The completion's CQ first: a WQE taken for a CQ this process then
	// cannot map would be consumed with no completion (push_peer could only
	// fail the responder's QP).  As lost, before anything is taken.  (A
	// resize between here and the push can still meet it.)
	{
		obj_ref cref = p.xrc_srq >= 0
				       ? obj_ref{r->objs[p.xrc_srq].cq_obj, r->objs[p.xrc_srq].cq_gen}
				       : obj_ref{r->qps[p.slot].rcq_obj, r->qps[p.slot].rcq_gen};
		if (!qp_queue_ref(qp, cref, SV_OBJ_CQ) && queue_still(r, cref, SV_OBJ_CQ))
			return ENXIO;
	}
	sv_obj_kind kind = p.rec.has_srq ? SV_OBJ_SRQ : SV_OBJ_RQ;
	queue_geom g;
	// By reference, no count taken: nothing below looks up another queue
	// of this QP (which could replace the entry), and the QP's one user
	// holds it (sq_lock, or the RoCE v2 proxy QP's receive thread).
	const queue_hold &h = qp_queue_ref(qp, {p.rec.rq_obj, p.rec.rq_gen}, kind, &g);
	auto *rq = h.as<sv_rq_ring>();
	if (!rq)
		return queue_still(r, {p.rec.rq_obj, p.rec.rq_gen}, kind) ? ENXIO : EAGAIN;
	// Sized by the geometry checked at mapping, not by the header.
	buf.resize(g.entry_size);
	wqe = reinterpret_cast<sv_recv_wqe *>(buf.data());
	bool damaged = false;
	if (!rq_take(rq, g, wqe, (g.entry_size - sizeof(sv_recv_wqe)) / sizeof(sv_sge), &damaged)) {
		if (damaged) {
			// Its indices are beyond belief: the responder's QP fails
			// (its owner hears of it), and the requester, finding it in
			// ERR, completes with an error after its retries.
			qp_set_error(fab, p.slot, IBV_EVENT_QP_FATAL);
		}
		return EAGAIN;
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
	// Receive lkeys belong to the PD of the queue they were posted to.
	pdn = p.rec.pdn;
	if (p.rec.has_srq && p.rec.rq_obj < SV_MAX_OBJS)
		pdn = r->objs[p.rec.rq_obj].pdn;
	return 0;
}

// Small SENDs to another process travel in the CQE's payload and the
// receiver places them when it polls: no system call on either side.  Only
// for a message that fits, from memory that is surely mapped, into one
// receive SGE of ordinary memory.
bool pack_inline(const tp_payload &d, const peer &p, sv_cqe_payload &pl)
{
	const local_buf &lb = *d.lb;
	if (p.self || lb.checked || !lb.len || lb.len > SV_CQE_INLINE_MAX || d.nriov != 1 ||
	    d.riov[0].kind != seg_kind::peer || d.wqe->num_sge == SV_RECV_WQE_INVALID)
		return false;
	const sv_sge *sge = nullptr;
	for (uint32_t i = 0; i < d.wqe->num_sge; i++)
		if (d.wqe->sge[i].length) {
			sge = &d.wqe->sge[i];
			break;
		}
	if (!sge)
		return false;
	pl.iova = sge->addr;
	pl.lkey = sge->lkey;
	pl.len = static_cast<uint32_t>(lb.len);
	uint32_t off = 0;
	for (const iovec &v : lb.iov) {
		memcpy(pl.data + off, v.iov_base, v.iov_len);
		off += static_cast<uint32_t>(v.iov_len);
	}
	return true;
}

// Returns 0, or ENOSPC when the responder's CQ overflowed (its QP is then
// in ERR with IBV_EVENT_QP_FATAL, its owner told of the CQ by CQ_ERR), or
// ESRCH when the responder's process is gone (no answer: the requester
// retries and ends in RETRY_EXC_ERR, as against any dead peer).
// The receive CQ is the QP's, or an XRC SRQ's; the reference is read
// afresh on every try, since a resize moves the ring.
[[gnu::hot]] int push_peer(loop_qp *qp, const peer &p, sv_cqe &e, bool solicited,
	      const sv_cqe_payload *payload, void *dst, sv_mr_rec *mr = nullptr,
	      uint32_t cookie = 0)
{
	fabric &fab = *qp->ctx->fab;
	sv_registry *r = fab.reg();
	// A receiver that died (its lease not reaped yet) answers nothing: a
	// completion pushed into its CQ would be read by nobody, and the SEND
	// must not complete SUCCESS (a small one touches none of its memory,
	// which would have told).  Believed alive for a coarse tick.
	if (!p.self && !fab.lease_alive(p.rec.owner_lease, p.rec.owner_gen))
		return ESRCH;
	auto cq_ref = [&] {
		return p.xrc_srq >= 0 ? obj_ref{r->objs[p.xrc_srq].cq_obj, r->objs[p.xrc_srq].cq_gen}
				      : obj_ref{r->qps[p.slot].rcq_obj, r->qps[p.slot].rcq_gen};
	};
	// A resize closes the old ring (ESTALE) and then points the QPs at the
	// new one: look again for as long as a resize may take.
	uint64_t deadline = 0;
	for (;;) {
		obj_ref ref = cq_ref();
		queue_geom g;
		// By reference, no count taken: the ring is used only until
		// cq_push returns, before note_deferred may look up other queues.
		const queue_hold &h = qp_queue_ref(qp, ref, SV_OBJ_CQ, &g);
		auto *ring = h.as<sv_cq_ring>();
		if (!ring) {
			// A resize may have replaced the ring between our reading the
			// reference and mapping it: only a reference that stays the
			// same names a CQ that cannot be had (its record damaged, or
			// gone from under a live QP).  The message is lost, so say
			// so, as for a CQ that overflowed: the responder's QP goes
			// to ERR and the sender gets REM_OP_ERR.
			// A dead owner's CQ goes with its reaping: that is a peer
			// that stopped answering, not a lost message to report.
			const sv_qp_rec &q = r->qps[p.slot];
			if (!std::atomic_ref<const uint32_t>(q.in_use).load(std::memory_order_acquire) ||
			    q.generation != p.rec.generation ||
			    !fab.lease_alive(p.rec.owner_lease, p.rec.owner_gen))
				return ESRCH;
			obj_ref again = cq_ref();
			if (again.slot == ref.slot && again.gen == ref.gen) {
				qp_set_error(fab, p.slot, IBV_EVENT_QP_FATAL);
				return ENOSPC;
			}
			continue;
		}
		if (payload && !g.payload_offset) {
			// Every ring of this ABI has the array; a damaged one loses
			// the message, visibly.
			e.status = IBV_WC_LOC_QP_OP_ERR;
			payload = nullptr;
		}
		uint64_t index = 0;
		int err = cq_push(ring, g, e, solicited, payload, &index);
		if (err == ENOSPC) {
			qp_set_error(fab, p.slot, IBV_EVENT_QP_FATAL);
			return err;
		}
		if (err != ESTALE) {
			if (payload)
				note_deferred(qp, ref, index, dst, p.pid, mr, cookie);
			return 0;
		}
		uint64_t now = now_ns();
		if (!deadline)
			deadline = now + kResizeWaitNs + kClosedRingGraceNs;
		else if (now > deadline)
			return ENOSPC;
		sched_yield();
	}
}

[[gnu::hot]] int lt_post_cqe(loop_qp *qp, const peer &p, sv_cqe &e, bool solicited, const tp_payload *d)
{
	if (!d)
		return push_peer(qp, p, e, solicited, nullptr, nullptr);
	thread_local sv_cqe_payload pl;
	if (pack_inline(*d, p, pl))
		return push_peer(qp, p, e, solicited, &pl, d->riov[0].base, d->riov[0].mr,
				 d->riov[0].mr_cookie);
	tp_move m{d->lb->iov.data(),
		  static_cast<int>(d->lb->iov.size()),
		  d->riov,
		  d->nriov,
		  xfer_dir::to_peer,
		  d->lb->checked,
		  false};
	if (int err = lt_move(qp, p, &m, 1, nullptr))
		return err == ESRCH || err == ETIMEDOUT ? err : EFAULT;
	return push_peer(qp, p, e, solicited, nullptr, nullptr);
}

// service_note once per QP and flag: the lease's flags only ever gain bits
// (a process's QPs all note into its one lease).
inline void express_note(loop_qp *qp, uint32_t flag)
{
	if ((qp->express_noted & flag) != flag) [[unlikely]] {
		service_note(flag);
		qp->express_noted |= flag;
	}
}

// The local source of w through the memo (its one SGE, plain memory of
// ours): what express_source's lookup would give, or null.
[[gnu::always_inline]] inline const char *memo_source(loop_qp *qp, const ibv_sge &s)
{
	const loop_qp::key_memo &k = qp->xmemo.local;
	if (!memo_key(qp->ctx->fab->reg(), k, s.lkey, s.addr, s.length))
		return nullptr;
	return reinterpret_cast<const char *>(k.addr + (s.addr - k.iova));
}

// Keeps the express WR w's local key (its one SGE, which the key cache just
// gave) for memo_source.
void memo_keep_local(loop_qp *qp, const send_wr &w)
{
	if (w.is_inline)
		return;
	uint32_t lease = static_cast<uint32_t>(qp->ctx->lease);
	memo_key_keep(qp->xmemo.local, cached_entry(qp->req_keys, w.sge[0].lkey, lease),
		      w.sge[0].lkey, false);
}

// The express way's local source of w: its inline bytes, or its one SGE
// when the QP's key cache holds the lkey for plain memory of ours.
[[gnu::hot]] bool express_source(loop_qp *qp, const send_wr &w, const char *&src, uint32_t &len)
{
	if (w.is_inline) {
		src = reinterpret_cast<const char *>(w.inline_data);
		len = w.inline_len;
		return len != 0;
	}
	if (w.num_sge != 1 || !w.sge[0].length)
		return false;
	const ibv_sge &s = w.sge[0];
	if ((src = memo_source(qp, s))) {
		len = s.length;
		return true;
	}
	iovec v;
	seg_kind k;
	if (!mr_cached_own(*qp->ctx->fab, qp->req_keys, s.lkey, static_cast<uint32_t>(qp->ctx->lease),
			   qp->pdn, s.addr, s.length, 0, v, k) ||
	    k != seg_kind::peer)
		return false;
	memo_keep_local(qp, w);
	src = static_cast<const char *>(v.iov_base);
	len = s.length;
	return true;
}

// The peer memo pm from the peer p the express way just used, for the QP's
// address now.
void memo_peer_keep(loop_qp *qp, loop_qp::peer_memo &pm, const peer &p)
{
	const ibv_qp_attr &at = qp->attr;
	pm.port = at.port_num;
	pm.dlid = at.ah_attr.dlid;
	pm.dest_qpn = at.dest_qp_num;
	pm.slot = p.slot;
	pm.gen = p.rec.generation;
	pm.owner_lease = p.rec.owner_lease;
	pm.owner_gen = p.rec.owner_gen;
	pm.type = p.rec.qp_type;
	pm.port_now = p.rec.port;
	pm.pid = p.pid;
	pm.alive_tick = 0;
	pm.valid = true;
}

// Whether the peer of pm is still the QP's: the QP's address unchanged,
// the peer QP's record in use with the same generation, owner (its lease
// not reaped: same generation and pid), type and port, in a state that
// receives, with the rights need.  With rcq, also that the peer's receive
// CQ is still *rcq (a resize moves it), read under the same generation.
[[gnu::always_inline]] inline bool memo_peer(const loop_qp *qp, const loop_qp::peer_memo &pm,
					     uint32_t need, const obj_ref *rcq)
{
	const ibv_qp_attr &at = qp->attr;
	if (!pm.valid || at.dest_qp_num != pm.dest_qpn || at.ah_attr.dlid != pm.dlid ||
	    at.port_num != pm.port)
		return false;
	const sv_registry *r = qp->ctx->fab->reg();
	const sv_qp_rec &q = r->qps[pm.slot];
	if (!std::atomic_ref<const uint32_t>(q.in_use).load(std::memory_order_acquire))
		return false;
	uint32_t gen = std::atomic_ref<const uint32_t>(q.generation).load(std::memory_order_relaxed);
	uint32_t lease = std::atomic_ref<const uint32_t>(q.owner_lease).load(std::memory_order_relaxed);
	uint32_t ogen = std::atomic_ref<const uint32_t>(q.owner_gen).load(std::memory_order_relaxed);
	uint32_t st = std::atomic_ref<const uint32_t>(q.state).load(std::memory_order_relaxed);
	uint32_t acc = std::atomic_ref<const uint32_t>(q.access).load(std::memory_order_relaxed);
	uint8_t type = std::atomic_ref<const uint8_t>(q.qp_type).load(std::memory_order_relaxed);
	uint8_t port = std::atomic_ref<const uint8_t>(q.port).load(std::memory_order_relaxed);
	// A peer in RTR that has not had its first request goes the way that
	// raises its IBV_EVENT_COMM_EST (note_comm_est).
	if (st == IBV_QPS_RTR &&
	    !std::atomic_ref<const uint8_t>(q.comm_est).load(std::memory_order_relaxed))
		return false;
	obj_ref cq{};
	if (rcq) {
		cq.slot = std::atomic_ref<const uint32_t>(q.rcq_obj).load(std::memory_order_relaxed);
		cq.gen = std::atomic_ref<const uint32_t>(q.rcq_gen).load(std::memory_order_relaxed);
	}
	std::atomic_thread_fence(std::memory_order_acquire);
	const sv_lease &l = r->leases[pm.owner_lease];
	return qp_rec_still(q, gen) && gen == pm.gen && lease == pm.owner_lease && ogen == pm.owner_gen && type == pm.type &&
	       port == pm.port_now && (st == IBV_QPS_RTR || st == IBV_QPS_RTS || st == IBV_QPS_SQD ||
				       st == IBV_QPS_SQE) &&
	       (acc & need) == need &&
	       (!rcq || (cq.slot == rcq->slot && cq.gen == rcq->gen)) &&
	       std::atomic_ref<const uint32_t>(l.generation).load(std::memory_order_relaxed) == ogen &&
	       static_cast<int32_t>(std::atomic_ref<const uint32_t>(l.pid).load(
		       std::memory_order_relaxed)) == pm.pid;
}

// The receive completion of w's len bytes into the WQE of wr_id, on the
// peer QP peer_qpn (respond_send's).
sv_cqe express_cqe(loop_qp *qp, const send_wr &w, uint64_t wr_id, uint32_t peer_qpn, uint16_t slid,
		   uint32_t len)
{
	sv_cqe e{};
	e.wr_id = wr_id;
	e.qp_num = peer_qpn;
	e.src_qp = qp->qpn;
	e.slid = slid;
	e.sl = qp->attr.ah_attr.sl;
	e.opcode = IBV_WC_RECV;
	e.byte_len = len;
	e.status = IBV_WC_SUCCESS;
	if (w.opcode == IBV_WR_SEND_WITH_IMM) {
		e.imm_data = w.imm_data;
		e.wc_flags = IBV_WC_WITH_IMM;
	}
	return e;
}

// The payload a small SEND carries in its CQE for the receiver to place
// (pack_inline's, for one receive SGE rs that holds it all).
void express_payload(sv_cqe_payload &pl, const sv_sge &rs, const char *src, uint32_t len)
{
	pl.iova = rs.addr;
	pl.lkey = rs.lkey;
	pl.len = len;
	memcpy(pl.data, src, len);
}

// The answer to a SEND whose completion push_peer (or cq_push) returned
// err for.
tp_answer express_answer(int err, uint32_t len)
{
	if (err == ESRCH || err == ETIMEDOUT)
		return {tp_answer::kind::lost, IBV_WC_SUCCESS, 0};
	if (err == ENOSPC)
		return {tp_answer::kind::nak, IBV_WC_REM_OP_ERR, 0}; // Its CQ overflowed
	return {tp_answer::kind::ack, IBV_WC_SUCCESS, len};
}

// Keeps what the express SEND to p just used for memo_send: the peer, its
// receive queue and receive CQ as this QP's queue cache holds them.
void memo_keep_send(loop_qp *qp, const peer &p, uint32_t pdn)
{
	loop_qp::express_memo &m = qp->xmemo;
	m.speer.valid = false;
	const loop_qp::peer_cache &c = qp->tp_peer;
	if (!c.valid || c.slot != p.slot || p.self || p.rec.has_srq || p.xrc_srq >= 0)
		return;
	const sv_qp_rec &q = qp->ctx->fab->reg()->qps[p.slot];
	obj_ref rq{p.rec.rq_obj, p.rec.rq_gen};
	obj_ref cq{std::atomic_ref<const uint32_t>(q.rcq_obj).load(std::memory_order_relaxed),
		   std::atomic_ref<const uint32_t>(q.rcq_gen).load(std::memory_order_relaxed)};
	queue_geom rg, cg;
	queue_hold rh = qp_queue(qp, rq, SV_OBJ_RQ, &rg);
	queue_hold ch = qp_queue(qp, cq, SV_OBJ_CQ, &cg);
	if (!rh || !ch)
		return;
	m.rq = rq;
	m.cq = cq;
	m.rqh = std::move(rh);
	m.cqh = std::move(ch);
	m.rqg = rg;
	m.cqg = cg;
	m.s_qpn = p.qpn;
	m.s_pdn = pdn;
	m.slid = fabric_port_lid(qp->ctx, qp->attr.port_num);
	memo_peer_keep(qp, m.speer, p);
}

// After the take of wqe from p's receive queue (of PD pdn): places w's len
// bytes from src and completes the receive, answering in a.  The common
// receive WQE (its first SGE holds the message, its lkey cached) is placed
// with one memcpy when mapped here, or travels in the CQE for the receiver
// to place when small; anything else takes respond_taken, the general way.
void express_taken(loop_qp *qp, send_wr &w, const peer &p, const char *src, uint32_t len,
		   sv_recv_wqe *wqe, uint32_t pdn, tp_answer &a)
{
	char *dst = nullptr;
	std::shared_ptr<void> pin; // Kept until the copy is done
	const sv_sge &rs = wqe->sge[0];
	loop_qp::express_memo &m = qp->xmemo;
	bool shaped = wqe->num_sge != SV_RECV_WQE_INVALID && wqe->num_sge >= 1 && rs.length >= len;
	bool mapped = true;
	// The receive key through the memo (the last SEND's), else the cache.
	if (shaped && p.rec.owner_lease == m.recv_owner && pdn == m.recv_pdn &&
	    memo_key(qp->ctx->fab->reg(), m.recv, rs.lkey, rs.addr, len)) {
		if (!m.recv.base)
			dst = reinterpret_cast<char *>(m.recv.addr + (rs.addr - m.recv.iova));
		else if (coarse_now() == m.recv.tick && (pin = m.recv.map.lock()))
			dst = m.recv.base + (rs.addr - m.recv.iova);
		mapped = m.recv.base != nullptr;
	}
	if (!dst) {
		seg_kind k;
		uint32_t access;
		if (!shaped ||
		    !mr_cached_target(*qp->ctx->fab, qp->tp_keys, rs.lkey, p.rec.owner_lease, pdn,
				      rs.addr, len, IBV_ACCESS_LOCAL_WRITE, dst, k, access, pin) ||
		    (k != seg_kind::mapped_direct && k != seg_kind::peer)) {
			dst = nullptr;
		} else {
			mapped = k == seg_kind::mapped_direct;
			memo_key_keep(m.recv, cached_entry(qp->tp_keys, rs.lkey, p.rec.owner_lease),
				      rs.lkey, mapped);
			m.recv_owner = p.rec.owner_lease;
			m.recv_pdn = pdn;
		}
	}
	// Plain memory of the receiver travels in the CQE: when it fits, and
	// its CQ has the payload array (every ring of this ABI has).
	bool carry = dst && !mapped;
	if (carry && len > SV_CQE_INLINE_MAX)
		dst = nullptr;
	// Mapped: the registration held for the copy, against the owner's
	// rereg of its rights or PD, which keeps the mapping (mr_copiers.h).
	mr_copy_guard hold;
	if (dst && !carry) {
		uint32_t mc = m.recv.key == rs.lkey && m.recv.base ? m.recv.cookie : 0;
		if (!mc)
			if (const key_cache::entry *ce =
				    cached_entry(qp->tp_keys, rs.lkey, p.rec.owner_lease))
				mc = ce->rec.cookie;
		if (!mc || !hold.take(&qp->ctx->fab->reg()->mrs[rs.lkey >> SV_MR_KEY_BITS], mc))
			dst = nullptr; // Not known, or out of service: the general way
	}
	// The receive buffer's registration, which the sender holds if it
	// places the payload itself later (cq_place_deferred, mr_copiers.h).
	uint32_t rcookie = 0;
	if (carry && dst) {
		if (m.recv.key == rs.lkey && !m.recv.base)
			rcookie = m.recv.cookie;
		else if (const key_cache::entry *ce =
				 cached_entry(qp->tp_keys, rs.lkey, p.rec.owner_lease))
			rcookie = ce->rec.cookie;
		if (!rcookie)
			dst = nullptr; // Not known: the general way
	}
	if (!dst) {
		local_buf lb;
		lb.iov.push_back({const_cast<char *>(src), len});
		lb.len = len;
		tp_request r{};
		r.w = &w;
		r.lb = &lb;
		r.psn = w.psn;
		r.src_qpn = qp->qpn;
		r.slid = fabric_port_lid(qp->ctx, qp->attr.port_num);
		r.sl = qp->attr.ah_attr.sl;
		a = respond_taken(loop_transport_ops, qp, p, r, wqe, pdn);
		return;
	}
	sv_cqe e = express_cqe(qp, w, wqe->wr_id, p.qpn, fabric_port_lid(qp->ctx, qp->attr.port_num),
			       len);
	int err;
	if (carry) {
		thread_local sv_cqe_payload pl;
		express_payload(pl, rs, src, len);
		err = push_peer(qp, p, e, w.flags & IBV_SEND_SOLICITED, &pl, dst,
				&qp->ctx->fab->reg()->mrs[rs.lkey >> SV_MR_KEY_BITS], rcookie);
	} else {
		flush_deferred(qp); // Earlier SENDs land first
		memcpy(dst, src, len);
		pin.reset(); // Before the push's stores, not after (below)
		hold.release();
		express_note(qp, SV_LEASE_DIRECT_USED | SV_LEASE_EXPRESS_USED);
		err = push_peer(qp, p, e, w.flags & IBV_SEND_SOLICITED, nullptr, nullptr);
	}
	a = express_answer(err, len);
	if (err)
		return;
	// Delivered: nothing may throw out of here now (post_direct would give
	// the slot back and the WR would run again).  The queue lookups hit the
	// cache the push just used, but a miss maps, which allocates.
	try {
		memo_keep_send(qp, p, pdn);
	} catch (abi::__forced_unwind &) {
		qp->xmemo.speer.valid = false;
		throw;
	} catch (...) {
		qp->xmemo.speer.valid = false;
	}
}

// The SEND part of lt_express: the peer's own receive queue (not an SRQ),
// through the same calls respond() makes.
[[gnu::hot]] bool express_send(loop_qp *qp, send_wr &w, const peer &p, const char *src,
			       uint32_t len, tp_answer &a)
{
	if (p.rec.has_srq || p.self)
		return false;
	w.psn = (qp->attr.sq_psn + qp->req_psn++) & kPsnMask;
	sv_recv_wqe *wqe = nullptr;
	uint32_t pdn = 0;
	if (int e = lt_take_recv(qp, p, qp->resp_wqe_buf, wqe, pdn)) {
		a = {e == ENXIO ? tp_answer::kind::lost : tp_answer::kind::rnr, IBV_WC_SUCCESS, 0};
		return true;
	}
	express_taken(qp, w, p, src, len, wqe, pdn, a);
	return true;
}

// The express SEND through the memo: the same answer lt_express would
// give, when the QP's peer, its receive queue and CQ and (after the take)
// the receive key are the ones of the last express SEND and nothing they
// were checked against has changed; the queues are the memo's mappings,
// so no lookup is made.  False (nothing taken) leaves w to lt_express.
[[gnu::hot]] bool memo_send(loop_qp *qp, send_wr &w, tp_answer &a)
{
	loop_qp::express_memo &m = qp->xmemo;
	const char *src;
	uint32_t len;
	if (w.is_inline) {
		src = reinterpret_cast<const char *>(w.inline_data);
		len = w.inline_len;
	} else {
		if (w.num_sge != 1 || !(src = memo_source(qp, w.sge[0])))
			return false;
		len = w.sge[0].length;
	}
	const sv_registry *r = qp->ctx->fab->reg();
	if (!len || !memo_peer(qp, m.speer, 0, &m.cq) || !queue_still(r, m.rq, SV_OBJ_RQ) ||
	    !queue_still(r, m.cq, SV_OBJ_CQ))
		return false;
	// Its owner alive (push_peer's look), once a coarse tick: a dead one
	// goes the general way, which answers nothing.
	int64_t tick = coarse_now();
	if (m.speer.alive_tick != tick) {
		if (!qp->ctx->fab->lease_alive(m.speer.owner_lease, m.speer.owner_gen))
			return false;
		m.speer.alive_tick = tick;
	}
	std::vector<uint8_t> &buf = qp->resp_wqe_buf;
	if (buf.size() != m.rqg.entry_size)
		buf.resize(m.rqg.entry_size);
	auto *wqe = reinterpret_cast<sv_recv_wqe *>(buf.data());
	bool damaged = false;
	if (!rq_take(m.rqh.as<sv_rq_ring>(), m.rqg, wqe,
		     (m.rqg.entry_size - sizeof(sv_recv_wqe)) / sizeof(sv_sge), &damaged)) {
		if (damaged)
			return false; // lt_take_recv finds it again, and fails the QP
		w.psn = (qp->attr.sq_psn + qp->req_psn++) & kPsnMask;
		a = {tp_answer::kind::rnr, IBV_WC_SUCCESS, 0};
		return true;
	}
	w.psn = (qp->attr.sq_psn + qp->req_psn++) & kPsnMask;
	m.rq_next = wqe->seq; // Stamped with its index + 1
	// Taken: from here the WR is answered.  The receive key through the
	// memo; anything else goes on the way express_send goes.
	const sv_sge &rs = wqe->sge[0];
	const loop_qp::key_memo &k = m.recv;
	char *dst = nullptr;
	std::shared_ptr<void> pin; // Kept until the copy is done
	mr_copy_guard hold;	   // The receive buffer's registration, for the copy
	if (wqe->num_sge != SV_RECV_WQE_INVALID && wqe->num_sge >= 1 && rs.length >= len &&
	    m.recv_owner == m.speer.owner_lease && m.recv_pdn == m.s_pdn &&
	    memo_key(r, k, rs.lkey, rs.addr, len)) {
		if (!k.base) {
			if (len <= SV_CQE_INLINE_MAX && m.cqg.payload_offset)
				dst = reinterpret_cast<char *>(k.addr + (rs.addr - k.iova));
		} else if (tick == k.tick && (pin = k.map.lock())) {
			if (hold.take(&qp->ctx->fab->reg()->mrs[rs.lkey >> SV_MR_KEY_BITS], k.cookie))
				dst = k.base + (rs.addr - k.iova);
			else
				pin.reset();
		}
	}
	peer p;
	if (!dst) {
		const ibv_qp_attr &at = qp->attr;
		if (!find_qp_cached(qp, at.dest_qp_num, at.ah_attr.dlid,
				    fabric_port_is_eth(qp->ctx, at.port_num), p) ||
		    p.slot != m.speer.slot || p.rec.generation != m.speer.gen) {
			a = {tp_answer::kind::lost, IBV_WC_SUCCESS, 0}; // Gone since
			return true;
		}
		express_taken(qp, w, p, src, len, wqe, m.s_pdn, a);
		return true;
	}
	sv_cqe e = express_cqe(qp, w, wqe->wr_id, m.s_qpn, m.slid, len);
	bool solicited = w.flags & IBV_SEND_SOLICITED;
	auto *ring = m.cqh.as<sv_cq_ring>();
	thread_local sv_cqe_payload pl;
	const sv_cqe_payload *payload = nullptr;
	if (!k.base) {
		express_payload(pl, rs, src, len);
		payload = &pl;
	} else {
		flush_deferred(qp); // Earlier SENDs land first
		memcpy(dst, src, len);
		// The mapping is needed for the copy only.  Dropped here, the
		// reference's locked decrement comes before the CQE's stores
		// into the peer's ring: after them it would wait for those
		// lines to leave the poller's cache (half the sender's time in
		// perf, docs/PERFORMANCE.md).  The same for the hold.
		pin.reset();
		hold.release();
		express_note(qp, SV_LEASE_DIRECT_USED | SV_LEASE_EXPRESS_USED);
	}
	// The CQ checked again right before the push, as push_peer checks it
	// (the copy above took time): a CQ gone since, or moved by a resize,
	// takes push_peer's way, which looks it up again.
	int err = ESTALE;
	uint64_t index = 0;
	const sv_qp_rec &q = r->qps[m.speer.slot];
	if (queue_still(r, m.cq, SV_OBJ_CQ) &&
	    std::atomic_ref<const uint32_t>(q.rcq_obj).load(std::memory_order_relaxed) == m.cq.slot &&
	    std::atomic_ref<const uint32_t>(q.rcq_gen).load(std::memory_order_relaxed) == m.cq.gen)
		err = cq_push(ring, m.cqg, e, solicited, payload, &index);
	if (!err) {
		m.cq_next = index + 1;
		if (payload)
			note_deferred(qp, m.cq, index, dst, m.speer.pid,
				      &qp->ctx->fab->reg()->mrs[rs.lkey >> SV_MR_KEY_BITS], k.cookie);
	} else if (err == ENOSPC) {
		// Its CQ overflowed (cq_push told its owner): the message is lost,
		// visibly, as push_peer reports it.
		fabric &fab = *qp->ctx->fab;
		qp_set_error(fab, m.speer.slot, IBV_EVENT_QP_FATAL);
	} else {
		const ibv_qp_attr &at = qp->attr;
		if (!find_qp_cached(qp, at.dest_qp_num, at.ah_attr.dlid,
				    fabric_port_is_eth(qp->ctx, at.port_num), p) ||
		    p.slot != m.speer.slot || p.rec.generation != m.speer.gen)
			err = ESRCH; // Gone since: no answer, as push_peer's ESRCH
		else
			err = push_peer(qp, p, e, solicited, payload, dst,
					payload ? &qp->ctx->fab->reg()->mrs[rs.lkey >> SV_MR_KEY_BITS] : nullptr,
					k.cookie);
	}
	a = express_answer(err, len);
	return true;
}

// Keeps what the express WRITE w (not inline, into mapped memory of peer p)
// was checked against, for memo_write.
void memo_keep(loop_qp *qp, const send_wr &w, const peer &p)
{
	loop_qp::express_memo &m = qp->xmemo;
	m.wpeer.valid = false;
	const loop_qp::peer_cache &c = qp->tp_peer;
	if (!c.valid || c.slot != p.slot)
		return;
	// The local key: express_source confirmed or refreshed it just now.
	memo_key_keep(m.target, cached_entry(qp->tp_keys, w.rkey, p.rec.owner_lease), w.rkey, true);
	if (m.local.key != w.sge[0].lkey || m.target.key != w.rkey)
		return;
	m.relaxed = m.target.access & IBV_ACCESS_RELAXED_ORDERING;
	memo_peer_keep(qp, m.wpeer, p);
}

// The express WRITE through the memo: the same answer lt_express would
// give, when w names the keys of the last one and nothing they were
// checked against has changed (the QP's address; the peer QP's life,
// state, type, port and rights, its owner's lease; each MR record's
// registration; the mapping's tick).  False leaves w to lt_express.
[[gnu::hot]] bool memo_write(loop_qp *qp, send_wr &w, tp_answer &a)
{
	loop_qp::express_memo &m = qp->xmemo;
	const loop_qp::key_memo &t = m.target;
	if (!m.wpeer.valid || w.rkey != t.key)
		return false;
	const sv_registry *r = qp->ctx->fab->reg();
	if (!w.is_inline && w.num_sge != 1)
		return false;
	uint64_t len = w.is_inline ? w.inline_len : w.sge[0].length;
	if (!len || !in_window(w.remote_addr, len, t.iova, t.len) ||
	    !memo_peer(qp, m.wpeer, IBV_ACCESS_REMOTE_WRITE, nullptr))
		return false;
	const char *src = w.is_inline ? reinterpret_cast<const char *>(w.inline_data)
				      : memo_source(qp, w.sge[0]);
	if (!src || !mr_still(r, t.key >> SV_MR_KEY_BITS, t.kbyte, t.cookie) ||
	    coarse_now() != t.tick)
		return false;
	std::shared_ptr<void> pin = t.map.lock(); // Kept until the copy is done
	if (!pin)
		return false;
	// Held against the owner's rereg of the rights or PD, which keeps the
	// mapping (mr_copiers.h); the record checked again under the hold.
	mr_copy_guard hold;
	if (!hold.take(&qp->ctx->fab->reg()->mrs[t.key >> SV_MR_KEY_BITS], t.cookie))
		return false;
	const ibv_qp_attr &at = qp->attr;
	w.psn = (at.sq_psn + qp->req_psn++) & kPsnMask;
	flush_deferred(qp); // Earlier SENDs land first
	relaxed_copy(t.base + (w.remote_addr - t.iova), src, len, m.relaxed);
	express_note(qp, SV_LEASE_DIRECT_USED | SV_LEASE_EXPRESS_USED);
	a = {tp_answer::kind::ack, IBV_WC_SUCCESS, static_cast<uint32_t>(len)};
	return true;
}
// SOFTVERBS_EXPRESS=0 turns the express way off (docs/configuration.md).
bool express_enabled()
{
	static const bool on = [] {
		const char *s = getenv("SOFTVERBS_EXPRESS");
		return !s || strcmp(s, "0") != 0;
	}();
	return on;
}

[[gnu::hot]] bool lt_express(loop_qp *qp, send_wr &w, tp_answer &a)
{
	if (!express_enabled() || qp->wire_remote || (qp->type != IBV_QPT_RC && qp->type != IBV_QPT_UC))
		return false;
	bool write = w.opcode == IBV_WR_RDMA_WRITE;
	if (!write && w.opcode != IBV_WR_SEND && w.opcode != IBV_WR_SEND_WITH_IMM)
		return false;
	if (write ? memo_write(qp, w, a) : memo_send(qp, w, a))
		return true;
	const char *src;
	uint32_t len;
	if (!express_source(qp, w, src, len))
		return false;
	const ibv_qp_attr &at = qp->attr;
	peer p;
	if (!find_qp_cached(qp, at.dest_qp_num, at.ah_attr.dlid,
			    fabric_port_is_eth(qp->ctx, at.port_num), p) ||
	    !peer_receives(p.rec) || p.rec.qp_type != qp->type)
		return false;
	note_comm_est(*qp->ctx->fab, p);
	if (!write)
		return express_send(qp, w, p, src, len, a);
	if (!(p.rec.access & IBV_ACCESS_REMOTE_WRITE))
		return false;
	char *dst;
	seg_kind k;
	uint32_t access;
	std::shared_ptr<void> pin;
	if (!mr_cached_target(*qp->ctx->fab, qp->tp_keys, w.rkey, p.rec.owner_lease, p.rec.pdn,
			      w.remote_addr, len, IBV_ACCESS_REMOTE_WRITE, dst, k, access, pin))
		return false;
	if (k != seg_kind::mapped_direct && !(k == seg_kind::peer && p.self))
		return false; // A system call's copy, the general way
	// Held against the owner's dereg or rereg (mr_copiers.h): our own
	// memory by address, or a peer's through our mapping of it (a rereg of
	// its rights or PD keeps the mapping); one out of service goes the
	// general way, which answers for the key.
	mr_copy_guard hold;
	{
		const key_cache::entry *ke = cached_entry(qp->tp_keys, w.rkey, p.rec.owner_lease);
		if (!ke || !hold.take(&qp->ctx->fab->reg()->mrs[w.rkey >> SV_MR_KEY_BITS],
				      ke->rec.cookie))
			return false;
	}
	w.psn = (at.sq_psn + qp->req_psn++) & kPsnMask;
	flush_deferred(qp); // Earlier SENDs land first
	bool relaxed = access & IBV_ACCESS_RELAXED_ORDERING;
	if (k == seg_kind::mapped_direct) {
		// A sealed memfd at least this long, mapped writable (xfer.cpp).
		relaxed_copy(dst, src, len, relaxed);
		if (!w.is_inline)
			memo_keep(qp, w, p);
		express_note(qp, SV_LEASE_DIRECT_USED | SV_LEASE_EXPRESS_USED);
	} else if (src + len <= dst || dst + len <= src) {
		relaxed_copy(dst, src, len, relaxed); // Within this process
		express_note(qp, SV_LEASE_EXPRESS_USED);
	} else {
		// Within this process, source and target overlapping: memmove's
		// result, in memmove's order (docs/memory.md).
		memmove(dst, src, len);
		express_note(qp, SV_LEASE_EXPRESS_USED);
	}
	a = {tp_answer::kind::ack, IBV_WC_SUCCESS, len};
	return true;
}

void lt_responder_error(loop_qp *qp, const peer &p, ibv_event_type ev)
{
	if (p.remote) // The responder on the other host moved itself to ERR
		return;
	fabric &fab = *qp->ctx->fab;
	qp_set_error(fab, p.slot, ev);
}

tp_liveness lt_alive(loop_qp *qp, uint32_t qpn, bool reap)
{
	if (qp->wire_remote)
		return rocev2_transport_ops.alive(qp, qpn, reap);
	fabric &fab = *qp->ctx->fab;
	const sv_qp_rec &pr = fab.reg()->qps[qpn & SV_QPN_SLOT_MASK];
	// The QP qpn names, not whichever QP holds its slot now: a record of
	// another generation (or none) is a responder that is gone.  The
	// generation and in_use again after the owner, as find_qp reads them.
	uint32_t in_use = std::atomic_ref<const uint32_t>(pr.in_use).load(std::memory_order_acquire);
	uint32_t gen = std::atomic_ref<const uint32_t>(pr.generation).load(std::memory_order_relaxed);
	uint32_t lease = std::atomic_ref<const uint32_t>(pr.owner_lease).load(std::memory_order_relaxed);
	uint32_t lgen = std::atomic_ref<const uint32_t>(pr.owner_gen).load(std::memory_order_relaxed);
	auto rnr = static_cast<uint8_t>(
		std::atomic_ref<const uint8_t>(pr.min_rnr_timer).load(std::memory_order_relaxed) & 31);
	std::atomic_thread_fence(std::memory_order_acquire);
	bool same = in_use && (gen & SV_QPN_SLOT_MASK) == (qpn >> SV_QPN_SLOT_BITS) &&
		    qp_rec_still(pr, gen);
	tp_liveness l{same && fab.lease_alive(lease, lgen), rnr};
	if (reap || !l.alive)
		fab.reap_dead();
	return l;
}

// Registered before main (and before any device is opened), as the first
// and so the active transport.
[[gnu::constructor]] void register_loop_transport()
{
	transport_register(&loop_transport_ops);
}

} // namespace

const transport_ops loop_transport_ops = {
	.name = "loop",
	.resolve = lt_resolve,
	.mcast_members = lt_mcast_members,
	.resolve_key = lt_resolve_key,
	.invalidate = lt_invalidate,
	.move = lt_move,
	.atomic = lt_atomic,
	.deliver = lt_deliver,
	.take_recv = lt_take_recv,
	.post_cqe = lt_post_cqe,
	.warm = lt_warm,
	.express = lt_express,
	.responder_error = lt_responder_error,
	.alive = lt_alive,
};

uint16_t fabric_port_lid(loop_context *lctx, uint8_t port)
{
	return port_lid(lctx->fab->reg(), lctx->dev->index, port);
}

bool fabric_port_is_eth(loop_context *lctx, uint8_t port)
{
	return port_is_eth(lctx->fab->reg(), lctx->dev->index, port);
}

uint8_t fabric_port_mtu(loop_context *lctx, uint8_t port)
{
	sv_registry *r = lctx->fab->reg();
	if (port < 1 || port > SV_MAX_PORTS)
		return IBV_MTU_4096;
	uint8_t mtu = r->devices[lctx->dev->index].ports[port - 1].active_mtu;
	// Over RoCE v2 a packet must fit the interface's MTU.
	if (lctx->ldev->cfg.rocev2 && port_is_eth(r, lctx->dev->index, port))
		mtu = std::min(mtu, rocev2_port_mtu(lctx));
	return mtu;
}

void raise_qp_event(fabric &fab, uint32_t qp_slot, ibv_event_type type)
{
	sv_qp_rec &q = fab.reg()->qps[qp_slot];
	sv_async_msg m{static_cast<uint32_t>(type), kObjQp, qp_slot, q.generation};
	// The owner's async socket is named in its receive CQ's ring, and in
	// its receive queue's (an XRC send QP may have no receive CQ).  An XRC
	// target QP has neither: its events are not delivered (docs/design.md).
	queue_hold h = queue_map(fab, {q.rcq_obj, q.rcq_gen}, SV_OBJ_CQ);
	if (auto *ring = h.as<sv_cq_ring>()) {
		send_async(ring->async_addr, ring->async_len, m);
		return;
	}
	if (q.has_srq || q.qp_type == IBV_QPT_XRC_SEND || q.qp_type == IBV_QPT_XRC_RECV)
		return;
	queue_hold rh = queue_map(fab, {q.rq_obj, q.rq_gen}, SV_OBJ_RQ);
	if (auto *rq = rh.as<sv_rq_ring>())
		send_async(rq->async_addr, rq->async_len, m);
}

void raise_own_qp_event(loop_qp *qp, ibv_event_type type)
{
	const sv_qp_rec &q = qp->ctx->fab->reg()->qps[qp->slot];
	sv_async_msg m{static_cast<uint32_t>(type), kObjQp, qp->slot, q.generation};
	send_async(qp->ctx->async_addr, qp->ctx->async_len, m);
}

void raise_comm_est(fabric &fab, const peer &p)
{
	if (p.slot >= SV_MAX_QPS || p.rec.qp_type == IBV_QPT_UD)
		return;
	sv_qp_rec &q = fab.reg()->qps[p.slot];
	std::atomic_ref<uint8_t> f(q.comm_est);
	if (f.load(std::memory_order_relaxed) ||
	    std::atomic_ref<uint32_t>(q.generation).load(std::memory_order_acquire) !=
		    p.rec.generation ||
	    f.exchange(1, std::memory_order_acq_rel))
		return;
	raise_qp_event(fab, p.slot, IBV_EVENT_COMM_EST);
}

namespace {

uint32_t *stripe_of(fabric &fab, uint64_t id)
{
	uint64_t h = (id >> 3) * 0x9e3779b97f4a7c15ULL;
	return &fab.reg()->atomic_locks[(h >> 20) % SV_ATOMIC_LOCKS];
}

void stripe_lock(uint32_t *word)
{
	auto me = static_cast<uint32_t>(getpid());
	std::atomic_ref<uint32_t> w(*word);
	uint32_t seen = 0;
	uint64_t since = 0;
	for (uint64_t spins = 0;; spins++) {
		uint32_t expect = 0;
		if (w.compare_exchange_weak(expect, me, std::memory_order_acquire))
			return;
		// The word is in shared memory: a value no pid can have is a stray
		// write, taken over at once.  A holder stays inside for two word
		// copies; one that died, or a value that has named the same running
		// process for 2 s (a stray write naming a live process) is taken
		// over too.  A holder that is stopped (SIGSTOP, a debugger) still
		// holds, as the registry lock's does: taken from it, its word copy
		// and ours would interleave when it runs again, and a FETCH_ADD
		// would lose an addend.  The wait lasts as long as the stop.
		bool broken = expect >= kPidMaxLimit;
		if (!broken && (spins & (kAtomicCheckEvery - 1)) == kAtomicCheckEvery - 1) {
			uint64_t now = now_ns();
			if (expect != seen) {
				seen = expect;
				since = now;
			}
			auto holder = static_cast<pid_t>(expect);
			broken = (kill(holder, 0) && errno == ESRCH) ||
				 (now - since > kAtomicTakeoverNs && !fabric::process_stopped(holder));
		}
		if (broken && w.compare_exchange_strong(expect, me, std::memory_order_acquire))
			return;
		if (spins > kAtomicSpins)
			sched_yield();
	}
}

// One try at a free stripe.
bool stripe_try(uint32_t *word)
{
	uint32_t expect = 0;
	return std::atomic_ref<uint32_t>(*word).compare_exchange_strong(
		expect, static_cast<uint32_t>(getpid()), std::memory_order_acquire);
}

void stripe_unlock(uint32_t *word)
{
	std::atomic_ref<uint32_t>(*word).store(0, std::memory_order_release);
}

} // namespace

atomic_guard::atomic_guard(fabric &fab, uint64_t owner_addr, uint64_t file_word)
{
	// The owner's address: any two keys of one owner that reach the word
	// at one address meet here, whatever each knows of a file under it.
	// The file's byte: two mappings of one file, at other addresses or in
	// other processes, meet there.
	first_ = stripe_of(fab, owner_addr);
	if (file_word) {
		uint32_t *f = stripe_of(fab, file_word);
		if (f != first_)
			second_ = f;
	}
	stripe_lock(first_);
	if (!second_)
		return;
	// Never one held while waiting for the other: stripe_lock takes over a
	// stripe whose running holder has kept it for 2 s (a stray write), so
	// a holder that waited behind a stopped one would lose the first to
	// other takers, and their read-modify-writes would interleave (a
	// review's probe).  The other is tried; taken, the two are held;
	// else the first goes back, the other is waited for alone, and the
	// first tried in turn.
	for (uint32_t *held = first_, *other = second_;;) {
		if (stripe_try(other))
			return;
		stripe_unlock(held);
		std::swap(held, other);
		stripe_lock(held);
	}
}

atomic_guard::~atomic_guard()
{
	if (second_)
		stripe_unlock(second_);
	stripe_unlock(first_);
}

} // namespace loop
