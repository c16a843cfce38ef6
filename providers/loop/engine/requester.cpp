// SPDX-License-Identifier: MIT
// The requester: turns the head WQE of a send queue into transport
// requests (transport.h).  It resolves the destination, gathers the local
// SGEs, and then either moves the bytes itself (RDMA WRITE and READ,
// atomics: one-sided, the target application never called) or hands the
// request to the peer's responder (SEND, WRITE WITH IMM, UD), and reports
// the answer to the completer.  Local memory operations (bind, local
// invalidate, fast-register) run here, in WR order.  Caller holds sq_lock.
#include "c_boundary.h"
#include "engine.h"
#include "objects.h"
#include "rocev2.h"
#include "wire.h"

#include <cerrno>
#include <cstring>
#include <algorithm>
#include <vector>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

namespace loop {

namespace {

constexpr uint32_t kMcastQpn = 0xffffff;

uint32_t mtu_bytes(uint8_t mtu)
{
	return mtu >= IBV_MTU_256 && mtu <= IBV_MTU_4096 ? 128u << mtu : 4096;
}

} // namespace

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

namespace {

// A scratch area standing behind the null MR: writes land here and are
// dropped, reads see whatever is here, which is zeros until written.
char g_null_area[kNullChunk];

void add_null(small_vec<iovec, 16> &v, uint64_t len)
{
	while (len) {
		size_t n = std::min<uint64_t>(len, kNullChunk);
		v.push_back({g_null_area, n});
		len -= n;
	}
}

// One resolved piece of a local SGE into b.
void add_seg(local_buf &b, const iovec &v, seg_kind k)
{
	if (k == seg_kind::null)
		add_null(b.iov, v.iov_len);
	else
		b.iov.push_back(v);
	b.checked |= k == seg_kind::peer_checked;
	b.mapped |= k == seg_kind::mapped || k == seg_kind::mapped_direct;
}

// Whether every page of b's pieces can be read now, and, if write, written.
// Asked only after a copy through the kernel failed with a checked local
// side (b.checked: on-demand memory, or an fd-backed MR of ours whose file
// can shrink): such a copy's EFAULT does not say which side faulted, and
// a request whose own buffer is at fault completes LOC_PROT_ERR at the
// requester, leaving the responder alone, as an HCA's gather or its
// placement of a response would (rxe's do_read).  One byte of each page:
// read into a sink, and for a write written back (the bytes of a request
// that failed are undefined anyway).
bool local_ok(const local_buf &b, bool write)
{
	constexpr size_t kBatch = 64;
	char sink[kBatch];
	iovec probe[kBatch];
	size_t n = 0;
	auto flush = [&] {
		iovec l{sink, n};
		pid_t me = self_pid();
		bool ok = syscall(SYS_process_vm_readv, me, &l, 1UL, probe, n, 0UL) ==
			  static_cast<ssize_t>(n);
		if (ok && write)
			ok = syscall(SYS_process_vm_writev, me, &l, 1UL, probe, n, 0UL) ==
			     static_cast<ssize_t>(n);
		n = 0;
		return ok;
	};
	for (const iovec &v : b.iov) {
		auto a = reinterpret_cast<uintptr_t>(v.iov_base);
		uintptr_t end = a + v.iov_len;
		while (a < end) {
			probe[n++] = {reinterpret_cast<void *>(a), 1};
			if (n == kBatch && !flush())
				return false;
			a = (a | uintptr_t(4095)) + 1; // The next 4 KiB page
		}
	}
	return !n || flush();
}

[[gnu::hot]] ibv_wc_status gather_local(loop_qp *qp, send_wr &w, bool need_write, local_buf &b)
{
	b.iov.clear();
	b.len = 0;
	b.holds.drop();
	// Inline data is in the WR: never on demand, whatever the last WR had.
	b.checked = false;
	b.mapped = false;
	if (w.is_inline) {
		b.iov.push_back({w.inline_data, w.inline_len});
		b.len = w.inline_len;
		return IBV_WC_SUCCESS;
	}
	fabric &fab = *qp->ctx->fab;
	std::vector<rseg> &segs = qp->req_segs;
	for (uint32_t i = 0; i < w.num_sge; i++) {
		const ibv_sge &s = w.sge[i];
		if (!s.length)
			continue;
		// A response's buffer is held before its key is resolved: the
		// registration in force now, which cannot change while held (a
		// dereg waits for it), so the lookup answers for it.  One out of
		// service has nothing to hold and its key resolves to nothing.
		if (need_write) {
			uint32_t slot = s.lkey >> SV_MR_KEY_BITS;
			if (!slot || slot >= SV_MAX_MRS)
				return IBV_WC_LOC_PROT_ERR;
			sv_mr_rec *rec = &fab.reg()->mrs[slot];
			if (!b.holds.add(rec, std::atomic_ref<uint32_t>(rec->cookie)
						       .load(std::memory_order_relaxed)))
				return IBV_WC_LOC_PROT_ERR;
		}
		iovec v;
		seg_kind k;
		if (mr_cached_own(fab, qp->req_keys, s.lkey, static_cast<uint32_t>(qp->ctx->lease),
				  qp->pdn, s.addr, s.length, need_write ? IBV_ACCESS_LOCAL_WRITE : 0, v,
				  k)) {
			add_seg(b, v, k);
			b.len += s.length;
			continue;
		}
		segs.clear();
		if (mr_resolve_cached(fab, qp->req_keys, s.lkey, static_cast<uint32_t>(qp->ctx->lease),
				      qp->pdn, s.addr, s.length,
				      need_write ? IBV_ACCESS_LOCAL_WRITE : 0, qp->qpn, segs, nullptr))
			return IBV_WC_LOC_PROT_ERR;
		for (const rseg &g : segs)
			add_seg(b, {g.base, g.len}, g.kind);
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
		return xfer(self_pid(), false, &src, 1, b.iov.data(), static_cast<int>(b.iov.size()),
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

bool ipv4_mapped(const ibv_gid &g)
{
	static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
	return !memcmp(g.raw, prefix, sizeof(prefix));
}

} // namespace

void build_grh(ibv_grh &g, const ibv_gid &sgid, const ibv_gid &dgid, uint32_t ib_paylen,
	       uint8_t tclass, uint32_t flow, uint8_t hop, bool roce)
{
	memset(&g, 0, sizeof(g));
	if (roce) {
		// The datagram's IP header as the wire code writes it (rocev2
		// wire.h), UDP payload the BTH to the ICRC; IPv4 in the GRH's last
		// 20 bytes, the first 20 zero (as rxe and mlx5 give it).
		rocev2::ip_info ip;
		ip.v6 = !(ipv4_mapped(sgid) && ipv4_mapped(dgid));
		memcpy(ip.src, ip.v6 ? sgid.raw : sgid.raw + 12, ip.v6 ? 16 : 4);
		memcpy(ip.dst, ip.v6 ? dgid.raw : dgid.raw + 12, ip.v6 ? 16 : 4);
		ip.tclass = tclass;
		ip.ttl = hop;
		ip.flow_label = flow;
		uint8_t hdr[rocev2::kIpv6HdrLen + rocev2::kUdpHdrLen];
		rocev2::build_ip_udp(ip, nullptr, ib_paylen, hdr, false);
		if (ip.v6)
			memcpy(&g, hdr, rocev2::kIpv6HdrLen);
		else
			memcpy(reinterpret_cast<uint8_t *>(&g) + 20, hdr, rocev2::kIpv4HdrLen);
		return;
	}
	// InfiniBand: the GRH, whose next header is the BTH (IB 8.3.1).
	g.version_tclass_flow =
		htobe32((6u << 28) | (static_cast<uint32_t>(tclass) << 20) | (flow & 0xfffff));
	g.paylen = htobe16(static_cast<uint16_t>(ib_paylen));
	g.next_hdr = 0x1b;
	g.hop_limit = hop;
	g.sgid = sgid;
	g.dgid = dgid;
}

void grh_gids(const ibv_grh &g, ibv_gid &sgid, ibv_gid &dgid)
{
	const auto *b = reinterpret_cast<const uint8_t *>(&g);
	static const uint8_t zero[20] = {};
	if (!memcmp(b, zero, sizeof(zero)) && b[20] == 0x45) {
		memset(&sgid, 0, sizeof(sgid));
		sgid.raw[10] = sgid.raw[11] = 0xff;
		dgid = sgid;
		memcpy(sgid.raw + 12, b + 32, 4);
		memcpy(dgid.raw + 12, b + 36, 4);
		return;
	}
	sgid = g.sgid;
	dgid = g.dgid;
}

namespace {

// A request's answer, as the step the completer books.
step finish(loop_qp *qp, send_wr &w, const tp_answer &a)
{
	switch (a.k) {
	case tp_answer::kind::ack:
		complete(qp, w, IBV_WC_SUCCESS, a.byte_len);
		return step::done;
	case tp_answer::kind::nak:
		complete(qp, w, a.status, 0);
		return step::done;
	case tp_answer::kind::rnr:
		if (qp->type == IBV_QPT_UC) {
			complete(qp, w, IBV_WC_SUCCESS, 0); // Dropped, as on the wire
			return step::done;
		}
		return step::rnr;
	case tp_answer::kind::lost:
		break;
	}
	return step::unreachable;
}

bool no_answer(int err)
{
	return err == ESRCH || err == ETIMEDOUT;
}

// The responder failed a one-sided request: a connected QP's responder
// goes to ERR (UC has no NAK, and completes as sent).
void remote_fail(const transport_ops &t, loop_qp *qp, send_wr &w, const peer &p,
		 ibv_wc_status st, ibv_event_type ev)
{
	if (qp->type != IBV_QPT_UC)
		t.responder_error(qp, p, ev);
	complete(qp, w, st, 0);
}

[[gnu::hot]] step run_rdma(const transport_ops &t, loop_qp *qp, send_wr &w, const peer &p, local_buf &lb)
{
	bool read = w.opcode == IBV_WR_RDMA_READ;
	uint32_t right = read ? IBV_ACCESS_REMOTE_READ : IBV_ACCESS_REMOTE_WRITE;
	std::vector<rseg> &riov = qp->req_riov;
	riov.clear();
	uint32_t raccess = 0;
	uint64_t len = read ? sge_bytes(w) : lb.len;
	// The QP's rights are checked whatever the length (rxe's
	// check_op_valid); the key only for bytes (a zero-length RDMA
	// operation names no memory, IBTA 9.4.3).
	int kerr = !(p.rec.access & right) ? EACCES : 0;
	if (len && !kerr)
		kerr = t.resolve_key(qp, p, w.rkey, p.rec.pdn, w.remote_addr, len, right, riov,
				     &raccess);
	if (no_answer(kerr))
		return step::unreachable; // The target is gone (its memory mapped here)
	if (kerr) {
		remote_fail(t, qp, w, p, IBV_WC_REM_ACCESS_ERR, IBV_EVENT_QP_ACCESS_ERR);
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
		tp_move m{lb.iov.data(),
			  static_cast<int>(lb.iov.size()),
			  riov.data(),
			  static_cast<int>(riov.size()),
			  read ? xfer_dir::from_peer : xfer_dir::to_peer,
			  lb.checked,
			  (raccess & IBV_ACCESS_RELAXED_ORDERING) != 0,
			  w.psn};
		int err = t.move(qp, p, &m, 1, nullptr);
		if (no_answer(err))
			return step::unreachable;
		if (err == EINVAL && p.remote) {
			// A responder over the wire refused it as an invalid request.
			remote_fail(t, qp, w, p, IBV_WC_REM_INV_REQ_ERR, IBV_EVENT_QP_REQ_ERR);
			return step::done;
		}
		if (err == EREMOTEIO) {
			remote_fail(t, qp, w, p, IBV_WC_REM_OP_ERR, IBV_EVENT_QP_FATAL);
			return step::done;
		}
		if (err && lb.checked && !p.remote && !local_ok(lb, read)) {
			// Our own buffer is at fault, not the target (local_ok).
			complete(qp, w, IBV_WC_LOC_PROT_ERR, 0);
			return step::done;
		}
		if (err) {
			// The registered range is not mapped in the target any more
			// (over the wire: the responder's access error).
			remote_fail(t, qp, w, p, IBV_WC_REM_ACCESS_ERR, IBV_EVENT_QP_ACCESS_ERR);
			return step::done;
		}
	}
	complete(qp, w, IBV_WC_SUCCESS, static_cast<uint32_t>(lb.len));
	return step::done;
}

step run_atomic(const transport_ops &t, loop_qp *qp, send_wr &w, const peer &p, local_buf &lb)
{
	tp_atomic op{};
	op.psn = w.psn;
	op.rkey = w.rkey;
	op.addr = w.remote_addr;
	if (w.opcode == IBV_WR_ATOMIC_WRITE) {
		// 8 bytes, aligned, needing remote write: they land whole, under
		// the same striped lock as the other atomics of the fabric.
		op.op = tp_atomic::kind::write;
		op.right = IBV_ACCESS_REMOTE_WRITE;
		memcpy(&op.swap, w.inline_data, 8);
	} else {
		// The response is 8 bytes: SGEs of another total length are a
		// local length error, found before the request goes out.
		if (sge_bytes(w) != 8) {
			complete(qp, w, IBV_WC_LOC_LEN_ERR, 0);
			return step::done;
		}
		op.op = w.opcode == IBV_WR_ATOMIC_FETCH_AND_ADD ? tp_atomic::kind::fetch_add
								 : tp_atomic::kind::cmp_swap;
		op.right = IBV_ACCESS_REMOTE_ATOMIC;
		op.compare_add = w.compare_add;
		op.swap = w.swap;
	}
	note_comm_est(*qp->ctx->fab, p); // The request goes out
	int err = t.atomic(qp, p, op);
	if (no_answer(err))
		return step::unreachable;
	if (err) {
		// A misaligned address is an invalid request; a key, right or
		// range fault (or a target gone from under the key) an access error.
		if (err == EINVAL)
			remote_fail(t, qp, w, p, IBV_WC_REM_INV_REQ_ERR, IBV_EVENT_QP_REQ_ERR);
		else if (err == EREMOTEIO)
			remote_fail(t, qp, w, p, IBV_WC_REM_OP_ERR, IBV_EVENT_QP_FATAL);
		else
			remote_fail(t, qp, w, p, IBV_WC_REM_ACCESS_ERR, IBV_EVENT_QP_ACCESS_ERR);
		return step::done;
	}
	if (op.op == tp_atomic::kind::write) {
		complete(qp, w, IBV_WC_SUCCESS, 8);
		return step::done;
	}
	// The response arrives: its local SGEs are checked now, so a bad lkey
	// fails the WR after the responder executed the atomic, as on an HCA.
	ibv_wc_status st = gather_local(qp, w, true, lb);
	if (st == IBV_WC_SUCCESS && put_response(lb, &op.old, 8))
		st = IBV_WC_LOC_PROT_ERR;
	complete(qp, w, st, st == IBV_WC_SUCCESS ? 8 : 0);
	return step::done;
}

[[gnu::hot]] step run_connected(loop_qp *qp, send_wr &w)
{
	const transport_ops &t = active_transport();
	loop_context *lctx = qp->ctx;
	const ibv_qp_attr &a = qp->attr;
	tp_dest d{a.dest_qp_num, a.ah_attr.dlid, fabric_port_is_eth(lctx, a.port_num),
		  qp->type == IBV_QPT_XRC_SEND ? w.xrc_srqn : kNoXrcSrq,
		  a.ah_attr.is_global ? &a.ah_attr.grh.dgid : nullptr};
	peer p;
	int rerr = t.resolve(qp, d, p);
	if (rerr == ENOENT || !peer_receives(p.rec) ||
	    p.rec.qp_type != (qp->type == IBV_QPT_XRC_SEND ? IBV_QPT_XRC_RECV : qp->type))
		return qp->type == IBV_QPT_UC ? (complete(qp, w, IBV_WC_SUCCESS, 0), step::done)
					      : step::unreachable;
	if (rerr) {
		// XRC: the WR names no SRQ of the target's domain.
		complete(qp, w, IBV_WC_REM_INV_REQ_ERR, 0);
		return step::done;
	}
	// One sequence number per request that reaches a responder, from the
	// QP's SQ PSN on, kept across its retries (a responder that keeps
	// state knows a duplicate by it).
	if (w.psn == kNoPsn)
		w.psn = (a.sq_psn + qp->req_psn++) & kPsnMask;
	// A READ's or an atomic's local SGEs receive the response: an HCA sends
	// the request first and checks them only when the response arrives, so
	// the responder's errors come first (docs/error-semantics.md).  Their
	// gather is done in their own cases, after the responder's checks.
	local_buf lb;
	switch (w.opcode) {
	case IBV_WR_RDMA_READ:
	case IBV_WR_ATOMIC_CMP_AND_SWP:
	case IBV_WR_ATOMIC_FETCH_AND_ADD:
		break;
	default:
		if (ibv_wc_status st = gather_local(qp, w, false, lb); st != IBV_WC_SUCCESS) {
			complete(qp, w, st, 0);
			return step::done;
		}
	}
	// The request goes out now (an atomic's, after its length check in
	// run_atomic): a responder in RTR has its first one.
	if (w.opcode != IBV_WR_ATOMIC_CMP_AND_SWP && w.opcode != IBV_WR_ATOMIC_FETCH_AND_ADD &&
	    w.opcode != IBV_WR_ATOMIC_WRITE)
		note_comm_est(*lctx->fab, p);
	switch (w.opcode) {
	case IBV_WR_SEND:
	case IBV_WR_SEND_WITH_INV:
	case IBV_WR_SEND_WITH_IMM:
	case IBV_WR_RDMA_WRITE_WITH_IMM: {
		tp_request r{};
		r.w = &w;
		r.lb = &lb;
		r.psn = w.psn;
		r.src_qpn = qp->qpn;
		r.slid = fabric_port_lid(lctx, a.port_num);
		r.sl = a.ah_attr.sl;
		return finish(qp, w, t.deliver(qp, p, r));
	}
	case IBV_WR_RDMA_WRITE:
	case IBV_WR_RDMA_READ:
		return run_rdma(t, qp, w, p, lb);
	case IBV_WR_ATOMIC_CMP_AND_SWP:
	case IBV_WR_ATOMIC_FETCH_AND_ADD:
	case IBV_WR_ATOMIC_WRITE:
		return run_atomic(t, qp, w, p, lb);
	default:
		complete(qp, w, IBV_WC_LOC_QP_OP_ERR, 0);
		return step::done;
	}
}

step run_ud(loop_qp *qp, send_wr &w)
{
	const transport_ops &t = active_transport();
	loop_context *lctx = qp->ctx;
	local_buf lb;
	ibv_wc_status st = gather_local(qp, w, false, lb);
	if (st != IBV_WC_SUCCESS) {
		complete(qp, w, st, 0);
		return step::done;
	}
	if (lb.len > mtu_bytes(fabric_port_mtu(lctx, qp->attr.port_num))) {
		// IBTA C10-93.1.1: a UD message longer than the port's MTU emits
		// nothing and is no error (rxe completes it as sent; the QP goes
		// on).  It went to LOC_LEN_ERR and SQE, which stopped every send
		// after it.
		debug_log("UD QP %u: a %llu-byte message is longer than the MTU (%u): not sent, "
			  "no error (IBTA C10-93.1.1)",
			  qp->qpn, static_cast<unsigned long long>(lb.len),
			  mtu_bytes(fabric_port_mtu(lctx, qp->attr.port_num)));
		complete(qp, w, IBV_WC_SUCCESS, static_cast<uint32_t>(lb.len));
		return step::done;
	}
	ibv_grh grh;
	bool global = w.ah.is_global;
	if (global) {
		ibv_gid sgid{};
		gid_slot table[kGidTableLen];
		int n = loop_gid_table(lctx, qp->attr.port_num, table, kGidTableLen, true);
		if (w.ah.grh.sgid_index < n)
			sgid = table[w.ah.grh.sgid_index].gid;
		build_grh(grh, sgid, w.ah.grh.dgid,
			  ud_grh_paylen(lb.len, w.opcode == IBV_WR_SEND_WITH_IMM),
			  w.ah.grh.traffic_class, w.ah.grh.flow_label, w.ah.grh.hop_limit,
			  fabric_port_is_eth(lctx, qp->attr.port_num));
	} else {
		memset(&grh, 0, sizeof(grh));
	}
	tp_request r{};
	r.w = &w;
	r.lb = &lb;
	r.psn = kNoPsn; // Datagrams are not sequenced
	r.src_qpn = qp->qpn;
	// A Q_Key with the high bit set means "use the QP's own" (IB 10.2.4.4).
	r.qkey = (w.remote_qkey & 0x80000000u) ? qp->attr.qkey : w.remote_qkey;
	r.slid = fabric_port_lid(lctx, qp->attr.port_num);
	r.sl = w.ah.sl;
	r.grh = &grh;
	r.grh_valid = global;
	r.datagram = true;
	bool eth = fabric_port_is_eth(lctx, qp->attr.port_num);
	bool mcast = (!eth && w.ah.dlid >= 0xc000 && w.ah.dlid != 0xffff) ||
		     (w.ah.is_global && gid_is_multicast(w.ah.grh.dgid.raw));
	if (mcast && w.remote_qpn == kMcastQpn) {
		thread_local std::vector<peer> members;
		members.clear();
		t.mcast_members(qp, w, eth, members);
		for (const peer &p : members)
			t.deliver(qp, p, r);
	} else {
		peer p;
		if (!t.resolve(qp, {w.remote_qpn, w.ah.dlid, eth, kNoXrcSrq,
				    w.ah.is_global ? &w.ah.grh.dgid : nullptr},
			       p))
			t.deliver(qp, p, r);
	}
	complete(qp, w, IBV_WC_SUCCESS, static_cast<uint32_t>(lb.len));
	return step::done;
}

} // namespace

[[gnu::hot]] step run_wr(loop_qp *qp, send_wr &w)
{
	// Local memory operations: run here, in WR order.  Every WR before
	// them has completed (the requester runs one WR at a time), so a fence
	// holds by construction.
	if (w.opcode == IBV_WR_LOCAL_INV || w.opcode == IBV_WR_BIND_MW) {
		ibv_wc_status st;
		if (!(w.opcode == IBV_WR_LOCAL_INV ? mr_local_inv(qp, w, st) : mr_bind(qp, w, st)))
			return step::wait; // Copies through the key (or old binding) in flight
		complete(qp, w, st, 0);
		return step::done;
	}
	if (w.opcode == kWrFastReg) {
		complete(qp, w, mr_local_op(qp, w), 0);
		return step::done;
	}
	if (qp->type == IBV_QPT_UD)
		return run_ud(qp, w);
	return run_connected(qp, w);
}

[[gnu::hot]] bool run_express(loop_qp *qp, send_wr &w, step &s)
{
	const transport_ops &t = active_transport();
	tp_answer a;
	if (!t.express || !t.express(qp, w, a))
		return false;
	// An unsignaled success completes nothing (complete()'s rule).
	if (a.k == tp_answer::kind::ack && !qp->sq_sig_all && !(w.flags & IBV_SEND_SIGNALED)) {
		s = step::done;
		return true;
	}
	s = finish(qp, w, a);
	return true;
}

bool wire_handoff(loop_qp *qp, send_wr &w, uint64_t posted, const void *inline_copy)
{
	if (!qp->wire_remote || qp->type != IBV_QPT_RC || w.opcode != IBV_WR_RDMA_WRITE ||
	    backlog_start(qp) != posted)
		return false;
	local_buf lb;
	// Memory the provider maps (fd-backed MRs, device memory) may be
	// unmapped by a dereg once post_send returns: such a WRITE, and one
	// with an error or nothing to send, the requester runs itself.
	if (gather_local(qp, w, false, lb) != IBV_WC_SUCCESS || lb.checked || lb.mapped || !lb.len)
		return false;
	if (w.is_inline) // w is the caller's scratch: the WQE's copy stays
		lb.iov[0].iov_base = const_cast<void *>(inline_copy);
	w.psn = (qp->attr.sq_psn + qp->req_psn) & kPsnMask;
	if (!rocev2_write_start(qp, w, lb.iov.data(), static_cast<int>(lb.iov.size()), lb.len))
		return false;
	qp->req_psn++; // Its sequence number, as run_connected gives it
	qp->wire_next = posted + 1;
	return true;
}

bool rdma_stage(loop_qp *qp, send_wr &w, const void *inline_copy, rdma_batch &b)
{
	bool read = w.opcode == IBV_WR_RDMA_READ;
	std::vector<loop_qp::batch_wr> &wrs = qp->batch_wrs;
	if (!wrs.empty() && read != b.read)
		return false;
	// run_connected's and run_rdma's checks, in their order; any that
	// fails leaves w to them.
	const transport_ops &t = active_transport();
	const ibv_qp_attr &a = qp->attr;
	peer p;
	if (qp->wire_remote) // Over RoCE v2: one WR at a time (run_rdma)
		return false;
	if (t.resolve(qp, {a.dest_qp_num, a.ah_attr.dlid, fabric_port_is_eth(qp->ctx, a.port_num),
			   kNoXrcSrq},
		      p) ||
	    !peer_receives(p.rec) || p.rec.qp_type != qp->type || p.self || p.remote)
		return false;
	if (!wrs.empty() && (p.pid != b.p.pid || p.slot != b.p.slot))
		return false;
	local_buf lb;
	if (!read && (gather_local(qp, w, false, lb) != IBV_WC_SUCCESS || lb.checked))
		return false;
	note_comm_est(*qp->ctx->fab, p);
	uint32_t right = read ? IBV_ACCESS_REMOTE_READ : IBV_ACCESS_REMOTE_WRITE;
	uint64_t len = read ? sge_bytes(w) : lb.len;
	std::vector<rseg> &riov = qp->req_riov;
	riov.clear();
	uint32_t raccess = 0;
	if (!(p.rec.access & right) ||
	    (len && t.resolve_key(qp, p, w.rkey, p.rec.pdn, w.remote_addr, len, right, riov, &raccess)))
		return false;
	// Memory mapped here (fd-backed), the null MR and on-demand memory
	// keep their own copies: the batch is for cross-memory attach.
	for (const rseg &g : riov)
		if (g.kind != seg_kind::peer)
			return false;
	if (read && (gather_local(qp, w, true, lb) != IBV_WC_SUCCESS || lb.checked))
		return false;
	// The response's buffer stays held until the batch is flushed (lb's
	// holds go with lb).  One out of service since: w runs alone.
	for (const auto &h : lb.holds.held)
		if (!b.holds.add(h.mr, h.cookie))
			return false;
	if (w.is_inline) // w is the caller's scratch: the WQE's copy stays
		lb.iov[0].iov_base = const_cast<void *>(inline_copy);
	// Staged whole or not at all.
	size_t nl = qp->batch_local.size();
	size_t nr = qp->batch_remote.size();
	try {
		qp->batch_local.insert(qp->batch_local.end(), lb.iov.begin(), lb.iov.end());
		qp->batch_remote.insert(qp->batch_remote.end(), riov.begin(), riov.end());
		b.ops.push_back({});
		wrs.push_back({w.wr_id, w.flags, (a.sq_psn + qp->req_psn) & kPsnMask,
			       static_cast<uint32_t>(lb.len), static_cast<uint32_t>(lb.iov.size()),
			       static_cast<uint32_t>(riov.size()),
			       (raccess & IBV_ACCESS_RELAXED_ORDERING) != 0});
	} catch (...) {
		qp->batch_local.resize(nl);
		qp->batch_remote.resize(nr);
		b.ops.shrink(wrs.size());
		throw;
	}
	qp->req_psn++; // Its sequence number, as run_connected gives it
	if (wrs.size() == 1) {
		b.p = p;
		b.read = read;
		b.first = w.sq_index;
	}
	return true;
}

void rdma_flush(loop_qp *qp, rdma_batch &b)
{
	std::vector<loop_qp::batch_wr> &wrs = qp->batch_wrs;
	size_t n = wrs.size();
	if (!n)
		return;
	const transport_ops &t = active_transport();
	sv_qp_rec &rec = qp->ctx->fab->reg()->qps[qp->slot];
	uint32_t state = std::atomic_ref<uint32_t>(rec.state).load(std::memory_order_acquire);
	size_t done = 0;
	int err = 0;
	// The QP left RTS since, or the copy ran out of memory: every WR runs
	// as the backlog (drain), as if it had never been staged.
	bool rerun = state != IBV_QPS_RTS;
	if (!rerun) {
		size_t lo = 0, ro = 0;
		for (size_t i = 0; i < n; i++) {
			const loop_qp::batch_wr &r = wrs[i];
			b.ops[i] = {qp->batch_local.data() + lo,
				    static_cast<int>(r.nlocal),
				    qp->batch_remote.data() + ro,
				    static_cast<int>(r.nremote),
				    b.read ? xfer_dir::from_peer : xfer_dir::to_peer,
				    false,
				    r.relaxed};
			lo += r.nlocal;
			ro += r.nremote;
		}
		try {
			err = t.move(qp, b.p, b.ops.data(), n, &done);
		} catch (abi::__forced_unwind &) {
			throw;
		} catch (...) {
			// Whatever moved moves again: the same bytes.
			done = 0;
			rerun = true;
		}
	}
	// The head's send_wr serves as each WR's for its completion: the WRs
	// are [sq_cons, sq_posted) and no head is decoded.
	send_wr &w = qp->sq_head;
	qp->sq_head_valid = false;
	w.opcode = b.read ? IBV_WR_RDMA_READ : IBV_WR_RDMA_WRITE;
	auto as_wr = [&](size_t i) -> send_wr & {
		w.wr_id = wrs[i].wr_id;
		w.flags = wrs[i].flags;
		w.sq_index = b.first + i;
		w.psn = wrs[i].psn;
		return w;
	};
	for (size_t i = 0; i < done; i++)
		complete(qp, as_wr(i), IBV_WC_SUCCESS, wrs[i].len);
	uint64_t next = b.first + done; // The first WR not completed
	if (rerun) {
		qp->req_psn -= static_cast<uint32_t>(n);
	} else if (err) {
		// The WRs from `done` on run again as the backlog, with the
		// sequence numbers they had.
		qp->req_psn -= static_cast<uint32_t>(n - done - 1);
		if (no_answer(err)) {
			// WR `done` never reached its target: it becomes the head
			// with its retry booked, as a first try in submit() does.
			if (wqe_read(qp, next, w) == IBV_WC_SUCCESS) {
				w.psn = wrs[done].psn;
				qp->sq_head_valid = true;
			} else {
				qp->req_psn--;
			}
		} else {
			// Its target range is not mapped any more: its own error,
			// after which an RC QP is in ERR and flushes the rest.
			remote_fail(t, qp, as_wr(done), b.p, IBV_WC_REM_ACCESS_ERR,
				    IBV_EVENT_QP_ACCESS_ERR);
			next++;
		}
	}
	wrs.clear();
	qp->batch_local.clear();
	qp->batch_remote.clear();
	b.ops.clear();
	b.holds.drop(); // Every response placed (or none will be, from here)
	// Completed WRs leave the queue only now (sq_set_cons drops the head).
	bool head = qp->sq_head_valid;
	sq_set_cons(qp, next);
	if (!err && !rerun)
		return;
	if (head) {
		qp->sq_head_valid = true;
		book_retry(qp, w, step::unreachable, now_ns());
		return; // The rest wait behind it
	}
	try { // c_boundary.h: what does not run now stays in the backlog
		drain(qp);
	} catch (abi::__forced_unwind &) {
		throw;
	} catch (...) {
	}
}

} // namespace loop
