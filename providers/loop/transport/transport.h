// SPDX-License-Identifier: MIT
// The transport interface: every call the engine (engine/) makes to reach
// a peer.  A transport is an ops table, registered once and checked for
// completeness when it is (as rdmavt checks its driver's callbacks): a
// table with a missing call is refused, with its name in the message.
//
// Calls by group:
//   addressing   resolve, mcast_members
//   keys         resolve_key, invalidate
//   data         move (a batch per call), atomic
//   delivery     deliver (the request to the peer's responder), and the
//                responder's own access to the peer: take_recv, post_cqe,
//                responder_error
//   liveness     alive
// Every call takes the requesting QP (the transport's per-QP context) and
// returns an errno or a plain answer: nothing throws through here but
// std::bad_alloc from vectors the caller owns (the caller catches it,
// c_boundary.h).  Two errnos have one meaning in every call:
//   ESRCH      the peer is gone: retry after the QP's timeout
//   ETIMEDOUT  no answer (a lost request or response): the same
//              (in the responder's own calls, move and post_cqe into the
//              target: the target lives but its copy path did not take
//              the bytes in time; nothing moved that it is told of, and
//              the receive WQE it was for completes in error)
#pragma once

#include "loop.h"
#include "mr_copiers.h"
#include "small_vec.h"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace loop {

// Where a request goes: QP number plus LID (IB) or GID (RoCE: the QP number
// decides, every port of a host answering for its addresses).
struct tp_dest {
	uint32_t qpn;
	uint16_t dlid;
	bool eth;
	uint32_t xrc_srqn; // XRC: the SRQ the WR names; kNoXrcSrq otherwise
	// RoCE: the destination GID when the address is global (null
	// otherwise).  A GID that is not one of this host's is another host's,
	// reached over RoCE v2 where the device speaks it (rocev2/rocev2.h).
	const ibv_gid *dgid = nullptr;
};
inline constexpr uint32_t kNoXrcSrq = UINT32_MAX;

// A resolved destination.  rec is a snapshot of the destination QP's record
// (type, state, access flags, Q_Key, PD): what the engine checks.  The
// other fields are the transport's own.
struct peer {
	uint32_t slot;
	uint32_t qpn;
	sv_qp_rec rec;
	pid_t pid;
	bool self;
	uint16_t lid;	  // Its port's LID
	int xrc_srq = -1; // XRC: the SRQ slot the WR named
	// On another host, over RoCE v2: every call for it goes to the rocev2
	// transport, and rec is what the requester assumes (the responder
	// there checks and NAKs); pid and slot mean nothing.
	bool remote = false;
};

// Local memory of a WR, as iovecs in this process.
struct local_buf {
	small_vec<iovec, 16> iov; // On the requester's stack (small_vec.h)
	uint64_t len = 0;
	bool checked = false; // Some local memory is on demand: copy with checked calls
	bool mapped = false;  // Some is an fd-backed mapping, which dereg may unmap
	// A response's buffer (a READ's, an atomic's): its registrations,
	// held from the gather until the response is placed and this goes,
	// against an ibv_dereg_mr or ibv_rereg_mr in another thread
	// (mr_copiers.h): after either returns, no byte lands.
	mr_copy_holds holds;
};

// One copy between local iovecs and a peer's segments.
struct tp_move {
	const iovec *local;
	int nlocal;
	const rseg *remote;
	int nremote;
	xfer_dir dir;
	bool local_checked; // Some local memory may be unmapped (ODP)
	bool relaxed;	    // The target granted IBV_ACCESS_RELAXED_ORDERING
	// The request's sequence number (tp_request.psn), kept across retries:
	// a transport with a wire sends a retry under the packet sequence
	// numbers of the first try.  UINT32_MAX: none (the responder's copies).
	uint32_t psn = UINT32_MAX;
};

// An 8-byte atomic at the responder.  old receives the word's value
// before the operation (CAS, FETCH_ADD).
struct tp_atomic {
	enum class kind : uint8_t { cmp_swap, fetch_add, write };
	kind op;
	uint32_t rkey;
	uint32_t right; // IBV_ACCESS_REMOTE_ATOMIC or _WRITE
	uint64_t addr;
	uint64_t compare_add;
	uint64_t swap; // write: the value stored
	uint64_t old;
	uint32_t psn = UINT32_MAX; // As tp_move's
};

// A request for the peer's responder: SEND (any), RDMA WRITE WITH IMM, or
// a UD datagram.  psn: the requester's sequence number of this request on
// its QP (one per request that reaches a responder, kept across retries),
// by which a responder that keeps state (responder.cpp: resp_seq) knows a
// duplicate.
struct tp_request {
	const send_wr *w;
	const local_buf *lb;
	uint32_t psn;
	uint32_t src_qpn;
	uint32_t qkey; // UD: the Q_Key the datagram carries
	uint16_t slid;
	uint8_t sl;
	const ibv_grh *grh; // UD: the GRH placed at the head of the receive buffer
	bool grh_valid;	    // UD: wc_flags gets IBV_WC_GRH
	bool datagram;	    // From a UD QP: only a UD QP takes it (respond)
};

// The responder's answer.
struct tp_answer {
	enum class kind : uint8_t {
		ack,  // Executed; byte_len bytes
		nak,  // Failed: status is the requester's completion status
		rnr,  // No receive WQE: retry after the responder's RNR timer
		lost, // No answer (the peer is gone, or the request or its answer lost)
	};
	kind k;
	ibv_wc_status status;
	uint32_t byte_len;
};

// The liveness of a destination QP's owner.
struct tp_liveness {
	bool alive;
	uint8_t min_rnr_timer; // The responder's RNR timer (IB's encoded value)
};

// What a SEND's payload is, for post_cqe to place with the completion.
struct tp_payload {
	const local_buf *lb;
	const sv_recv_wqe *wqe;
	const rseg *riov;
	int nriov;
};

struct transport_ops {
	const char *name;
	// 0; ENOENT (no live QP answers: unreachable); EINVAL (XRC: no such SRQ
	// in the target's domain).
	int (*resolve)(loop_qp *qp, const tp_dest &d, peer &out);
	// Every live QP of the multicast group a UD WR addresses (not qp itself),
	// resolved, appended to out.
	void (*mcast_members)(loop_qp *qp, const send_wr &w, bool eth, std::vector<peer> &out);
	// A peer's key for [addr, addr + len) with rights `right`, checked
	// against pdn, resolved into segments appended to out (the NAK, else:
	// ENOENT, EACCES, ERANGE, EFAULT).  access receives the key's rights.
	int (*resolve_key)(loop_qp *qp, const peer &p, uint32_t key, uint32_t pdn, uint64_t addr,
			   uint64_t len, uint32_t right, std::vector<rseg> &out, uint32_t *access);
	// SEND_WITH_INV at the responder: 0 or an errno.
	int (*invalidate)(loop_qp *qp, const peer &p, uint32_t rkey);
	// Runs n copies in order, stopping at the first that fails; 0, ESRCH,
	// ETIMEDOUT, or another errno (EFAULT: an address not mapped on one
	// side; a remote peer's NAK: EACCES for a remote access error, EINVAL
	// for an invalid request, EREMOTEIO for a remote operational error),
	// as that copy would have had alone.  *done (when not null)
	// receives how many copies before it finished: their bytes landed.
	// A copy's bytes land in order with the others', never before them.
	int (*move)(loop_qp *qp, const peer &p, const tp_move *ops, size_t n, size_t *done);
	// 0, a key's errno (as resolve_key), EINVAL (misaligned, or an invalid
	// request NAK), EREMOTEIO (a remote operational error NAK), ESRCH,
	// ETIMEDOUT.
	int (*atomic)(loop_qp *qp, const peer &p, tp_atomic &op);
	// Hands a request to the peer's responder and returns its answer.
	tp_answer (*deliver)(loop_qp *qp, const peer &p, const tp_request &r);
	// The responder's side.  Takes a receive WQE of the peer's RQ or SRQ
	// into buf; pdn receives the PD its lkeys belong to.  0, EAGAIN (none
	// posted: RNR), or ENXIO (the queue cannot be reached from this
	// process, e.g. out of descriptors: the request is as if lost, and the
	// requester's retries run out rather than its RNR retries).
	int (*take_recv)(loop_qp *qp, const peer &p, std::vector<uint8_t> &buf,
			 sv_recv_wqe *&wqe, uint32_t &pdn);
	// Publishes a completion in the peer's receive CQ, placing data first
	// (or with it) when given.  0, ESRCH, EFAULT or ETIMEDOUT (data not
	// placed: e was not published), or ENOSPC (the CQ overflowed; the
	// peer's QP is in ERR).
	int (*post_cqe)(loop_qp *qp, const peer &p, sv_cqe &e, bool solicited,
			const tp_payload *data);
	// A hint as a posting call begins (under sq_lock), or null: start
	// bringing in the lines the QP's next request will touch in its peer's
	// queues (the next receive WQE, the next CQ slot and its payload), so
	// that their transfer from the peer's core overlaps the posting work
	// before them instead of stalling it.  Never faults, never fails.
	void (*warm)(loop_qp *qp);
	// The express way of a connected QP's RDMA WRITE, SEND or SEND WITH
	// IMM, or null: what the requester and the peer's responder would do
	// for w, done at once when all it needs is in the QP's caches and the
	// target memory is a plain copy away (mapped here from a sealed memfd,
	// or, for a WRITE, in this process).  False, having changed nothing:
	// run w the general way, which answers every error and fills the
	// caches.  True: w ran, a is its answer as deliver (or, for a WRITE,
	// the requester's own ack) gives it; w.psn is set.  A SEND that took a
	// receive WQE its way cannot finish (a WQE of another shape, a key not
	// cached) is finished by respond_taken.  Under sq_lock, the QP in RTS,
	// w at the head of its send queue.
	bool (*express)(loop_qp *qp, send_wr &w, tp_answer &a);
	// The responder failed: its QP goes to ERR and its owner hears ev.
	void (*responder_error)(loop_qp *qp, const peer &p, ibv_event_type ev);
	// Whether QP qpn's owner lives; reap: reclaim what dead owners left.
	tp_liveness (*alive)(loop_qp *qp, uint32_t qpn, bool reap);
};

// Registers t: 0, or EINVAL when a call is missing (logged by name) or the
// name is taken.  The first registered becomes the active transport.
int transport_register(const transport_ops *t);
// Makes the registered transport `name` the one the engine calls: 0 or ENOENT.
int transport_select(const char *name);
const transport_ops *transport_find(const char *name);

// The transport the engine calls (set by registration and transport_select).
extern const transport_ops *g_transport;
inline const transport_ops &active_transport()
{
	return *__atomic_load_n(&g_transport, __ATOMIC_ACQUIRE);
}

} // namespace loop
