// SPDX-License-Identifier: MIT
// rsockets (<rdma/rsocket.h>): stream sockets over an RC QP, set up by our
// own connection manager (cma.cpp).  docs/rdmacm.md describes the protocol;
// in short:
//
// - every rsocket owns an rdma_cm event channel; its fd is the number the
//   rsocket calls take (a real, unique fd of the process, as rdma-core's);
// - a connected rsocket has a PD, one CQ with a completion channel and an
//   RC QP; each side posts kRecvSlots receives of kSlot bytes, of which
//   kCredits may hold data and the rest are spares for control messages;
// - data goes as SEND_WITH_IMM of at most kSlot bytes from a registered
//   staging ring; the immediate (host order) carries the credits the sender
//   gives back (receive buffers the application has emptied), bit 31 marks
//   the end of the stream (rshutdown SHUT_WR / rclose);
// - credits the receiver owes are piggybacked on data or, once half the
//   window is owed, sent as an empty SEND_WITH_IMM;
// - the peer's end (rdma_cm DISCONNECTED, or a broken QP) reads as end of
//   file once the data already received is consumed; a send then fails with
//   EPIPE (ECONNRESET if the QP broke).
//
// Datagram rsockets are not implemented: rsocket(SOCK_DGRAM) fails with
// EOPNOTSUPP (librspreload then falls back to a real socket).  The iomap
// calls (riomap, riounmap, riowrite) work (riomap and the functions after it, below).
//
// Our own fds are waited on with the poll system call, not poll(): under
// librspreload, poll() is rpoll's front end.
#include <rdma/rdma_cma.h>
#include <rdma/rsocket.h>
#include <infiniband/ib.h>

#include <algorithm>
#include <cerrno>
#include <cstdarg>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <vector>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define SV_API __attribute__((visibility("default")))

namespace {

constexpr uint32_t kSlot = 64 * 1024;  // bytes per message
constexpr int kCredits = 16;           // data messages in flight
constexpr int kSpare = 8;              // receives for control messages
constexpr int kRecvSlots = kCredits + kSpare;
constexpr int kSendSlots = kCredits;
constexpr int kSqDepth = kSendSlots + kSpare;
constexpr uint32_t kFin = 1u << 31;
constexpr uint32_t kCtl = 1u << 30;  // a control message (iomap) in the payload
constexpr uint32_t kCreditMask = kCtl - 1;
constexpr uint32_t kCtlMagic = 0x53564d50;  // "SVMP"

// The payload of a kCtl message: a mapping made or removed by riomap/riounmap.
struct ctl_msg {
	uint32_t magic, op;  // 1 map, 2 unmap
	uint64_t offset, len, addr;
	uint32_t rkey, pad;
};

struct iomap {
	uint64_t offset, len, addr;  // addr: ours (local) or the peer's (remote)
	uint32_t rkey;
	ibv_mr *mr;                  // local mappings only
};
constexpr int kResolveMs = 2000;

enum class st { fresh, bound, listening, connecting, accepting, connected, closed, error };

struct rx_buf {
	int slot;
	uint32_t len, off;
};

struct rs {
	std::mutex mu;
	int fd = -1;
	int domain = AF_INET;
	rdma_event_channel *chan = nullptr;
	rdma_cm_id *id = nullptr;
	st state = st::fresh;
	bool nonblock = false;
	int err = 0;          // SO_ERROR: a failed nonblocking connect
	int conn_err = 0;     // what a send fails with once the connection is gone
	// options (stored; most only change nothing here)
	int reuseaddr = 0, keepalive = 0, nodelay = 0, keepidle = 7200;
	int v6only = 0; // IPV6_V6ONLY, as the CM's AFONLY
	int sndbuf = kSlot * kSendSlots, rcvbuf = kSlot * kCredits;
	int sqsize = kSqDepth, rqsize = kRecvSlots, inl = 0, iomapsize = 0;
	linger lin = {0, 0};
	// listener
	std::deque<rdma_cm_id *> pending;
	// connection
	ibv_pd *pd = nullptr;
	ibv_comp_channel *cc = nullptr;
	ibv_cq *cq = nullptr;
	char *rbuf = nullptr, *sbuf = nullptr;
	ibv_mr *rmr = nullptr, *smr = nullptr;
	std::deque<rx_buf> rxq;
	int tx_credits = kCredits;
	int owed = 0;          // credits to give back
	int sq_out = 0;        // send WRs not completed
	int slot_head = 0;     // next send slot
	int slots_used = 0;    // data slots not completed
	std::deque<bool> sq_kinds;  // per outstanding send WR: data?
	bool peer_fin = false, fin_sent = false, rd_shut = false, wr_shut = false;
	bool peer_gone = false;
	std::vector<iomap> lmaps, rmaps;
};

std::mutex g_mu;
std::map<int, rs *> g_socks;

int fail(int e)
{
	errno = e;
	return -1;
}

rs *lookup(int fd)
{
	std::lock_guard<std::mutex> lk(g_mu);
	auto it = g_socks.find(fd);
	return it == g_socks.end() ? nullptr : it->second;
}

int sys_poll(pollfd *fds, nfds_t n, int timeout_ms)
{
	timespec ts, *tp = nullptr;
	if (timeout_ms >= 0) {
		ts.tv_sec = timeout_ms / 1000;
		ts.tv_nsec = (timeout_ms % 1000) * 1000000L;
		tp = &ts;
	}
	return static_cast<int>(syscall(SYS_ppoll, fds, n, tp, nullptr, static_cast<size_t>(8)));
}

int64_t now_ms()
{
	timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return int64_t(t.tv_sec) * 1000 + t.tv_nsec / 1000000;
}

void set_nonblock_fd(int fd)
{
	int fl = static_cast<int>(syscall(SYS_fcntl, fd, F_GETFL, 0));
	if (fl >= 0)
		syscall(SYS_fcntl, fd, F_SETFL, fl | O_NONBLOCK);
}

// ------------------------------------------------------------ verbs ---

int post_recv(rs *s, int slot)
{
	ibv_sge sge;
	sge.addr = reinterpret_cast<uintptr_t>(s->rbuf + size_t(slot) * kSlot);
	sge.length = kSlot;
	sge.lkey = s->rmr->lkey;
	ibv_recv_wr wr = {}, *bad;
	wr.wr_id = static_cast<uint64_t>(slot);
	wr.sg_list = &sge;
	wr.num_sge = 1;
	return ibv_post_recv(s->id->qp, &wr, &bad);
}

void free_conn(rs *s)
{
	for (iomap &m : s->lmaps)
		ibv_dereg_mr(m.mr);
	s->lmaps.clear();
	s->rmaps.clear();
	if (s->id && s->id->qp)
		rdma_destroy_qp(s->id);
	if (s->cq) {
		ibv_destroy_cq(s->cq);
		s->cq = nullptr;
	}
	if (s->cc) {
		ibv_destroy_comp_channel(s->cc);
		s->cc = nullptr;
	}
	if (s->rmr)
		ibv_dereg_mr(s->rmr);
	if (s->smr)
		ibv_dereg_mr(s->smr);
	s->rmr = s->smr = nullptr;
	free(s->rbuf);
	free(s->sbuf);
	s->rbuf = s->sbuf = nullptr;
	if (s->pd) {
		ibv_dealloc_pd(s->pd);
		s->pd = nullptr;
	}
}

// The PD, CQ, buffers and QP of a connection on s->id, receives posted.
int setup_conn(rs *s)
{
	rdma_cm_id *id = s->id;
	if (!id->verbs)
		return EHOSTUNREACH;
	int e = ENOMEM;
	s->pd = ibv_alloc_pd(id->verbs);
	if (!s->pd)
		goto err;
	s->cc = ibv_create_comp_channel(id->verbs);
	if (!s->cc)
		goto err;
	set_nonblock_fd(s->cc->fd);
	s->cq = ibv_create_cq(id->verbs, kRecvSlots + kSqDepth, nullptr, s->cc, 0);
	if (!s->cq)
		goto err;
	s->rbuf = static_cast<char *>(calloc(kRecvSlots, kSlot));
	s->sbuf = static_cast<char *>(calloc(kSendSlots, kSlot));
	if (!s->rbuf || !s->sbuf)
		goto err;
	s->rmr = ibv_reg_mr(s->pd, s->rbuf, size_t(kRecvSlots) * kSlot, IBV_ACCESS_LOCAL_WRITE);
	s->smr = ibv_reg_mr(s->pd, s->sbuf, size_t(kSendSlots) * kSlot, 0);
	if (!s->rmr || !s->smr)
		goto err;
	{
		ibv_qp_init_attr a = {};
		a.send_cq = s->cq;
		a.recv_cq = s->cq;
		a.qp_type = IBV_QPT_RC;
		a.cap.max_send_wr = kSqDepth;
		a.cap.max_recv_wr = kRecvSlots;
		a.cap.max_send_sge = 1;
		a.cap.max_recv_sge = 1;
		a.sq_sig_all = 1;
		if (rdma_create_qp(id, s->pd, &a)) {
			e = errno ? errno : ENOMEM;
			goto err;
		}
	}
	for (int i = 0; i < kRecvSlots; i++)
		if (post_recv(s, i)) {
			e = EIO;
			goto err;
		}
	return 0;
err:
	if (errno && e == ENOMEM)
		e = errno;
	free_conn(s);
	return e;
}

rdma_conn_param conn_param()
{
	rdma_conn_param p = {};
	p.responder_resources = 1;
	p.initiator_depth = 1;
	p.retry_count = 7;
	p.rnr_retry_count = 7;
	return p;
}

void lost(rs *s, int e)
{
	if (!s->peer_gone) {
		s->peer_gone = true;
		s->conn_err = e;
	}
}

void apply_ctl(rs *s, const ctl_msg &m)
{
	auto &v = s->rmaps;
	v.erase(std::remove_if(v.begin(), v.end(), [&](const iomap &x) { return x.offset == m.offset; }),
		v.end());
	if (m.op == 1)
		v.push_back({m.offset, m.len, m.addr, m.rkey, nullptr});
}

// What a failed completion means: a reset, unless it is a flush or the
// peer had already ended its stream (a credit update it no longer takes).
int broken(const rs *s, ibv_wc_status st)
{
	return st == IBV_WC_WR_FLUSH_ERR || s->peer_fin ? EPIPE : ECONNRESET;
}

// Takes what the CQ has.
void drain_cq(rs *s)
{
	if (!s->cq)
		return;
	ibv_wc wc[16];
	for (;;) {
		int n = ibv_poll_cq(s->cq, 16, wc);
		if (n <= 0)
			return;
		for (int i = 0; i < n; i++) {
			ibv_wc &w = wc[i];
			if (w.opcode & IBV_WC_RECV) {
				int slot = static_cast<int>(w.wr_id);
				if (w.status != IBV_WC_SUCCESS) {
					lost(s, broken(s, w.status));
					continue;
				}
				uint32_t imm = (w.wc_flags & IBV_WC_WITH_IMM) ? ntohl(w.imm_data) : 0;
				s->tx_credits += static_cast<int>(imm & kCreditMask);
				if (imm & kFin)
					s->peer_fin = true;
				if (imm & kCtl) {
					ctl_msg m;
					if (w.byte_len == sizeof(m)) {
						memcpy(&m, s->rbuf + size_t(slot) * kSlot, sizeof(m));
						if (m.magic == kCtlMagic)
							apply_ctl(s, m);
					}
					if (s->id->qp)
						post_recv(s, slot);
				} else if (w.byte_len > 0)
					s->rxq.push_back({slot, w.byte_len, 0});
				else if (s->id->qp)
					post_recv(s, slot);
			} else {
				s->sq_out--;
				if (!s->sq_kinds.empty()) {
					if (s->sq_kinds.front())
						s->slots_used--;
					s->sq_kinds.pop_front();
				}
				if (w.status != IBV_WC_SUCCESS)
					lost(s, broken(s, w.status));
			}
		}
	}
}

// Posts a SEND_WITH_IMM of len bytes from send slot `slot` (len 0: none),
// or with a remote address an RDMA WRITE there.
int post_send(rs *s, int slot, uint32_t len, uint32_t imm, uint64_t raddr = 0, uint32_t rkey = 0)
{
	ibv_sge sge;
	ibv_send_wr wr = {}, *bad;
	if (len) {
		sge.addr = reinterpret_cast<uintptr_t>(s->sbuf + size_t(slot) * kSlot);
		sge.length = len;
		sge.lkey = s->smr->lkey;
		wr.sg_list = &sge;
		wr.num_sge = 1;
	}
	wr.opcode = IBV_WR_SEND_WITH_IMM;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.imm_data = htonl(imm);
	if (raddr) {
		wr.opcode = IBV_WR_RDMA_WRITE;
		wr.imm_data = 0;
		wr.wr.rdma.remote_addr = raddr;
		wr.wr.rdma.rkey = rkey;
	}
	int r = ibv_post_send(s->id->qp, &wr, &bad);
	if (r)
		return r;
	s->sq_out++;
	s->sq_kinds.push_back(len > 0);
	return 0;
}

// Gives credits back with an empty message once half the window is owed.
void maybe_credit(rs *s, bool force)
{
	if (!s->id || !s->id->qp || s->peer_gone || s->peer_fin || s->state != st::connected)
		return;  // (after the peer's end of stream it sends no more data)
	if (s->owed == 0 || (!force && s->owed < kCredits / 2) || s->sq_out >= kSqDepth)
		return;
	if (!post_send(s, 0, 0, static_cast<uint32_t>(s->owed)))
		s->owed = 0;
}

void handle_event(rs *s, rdma_cm_event *ev)
{
	rdma_cm_event_type t = ev->event;
	int status = ev->status;
	rdma_cm_id *about = ev->id;
	if (t == RDMA_CM_EVENT_CONNECT_REQUEST && s->state == st::listening) {
		rdma_ack_cm_event(ev);
		s->pending.push_back(about);
		return;
	}
	rdma_ack_cm_event(ev);
	if (about != s->id)
		return;  // a pending child's event on the listener: nothing to do
	switch (t) {
	case RDMA_CM_EVENT_ADDR_RESOLVED:
		if (s->state == st::connecting && rdma_resolve_route(s->id, kResolveMs)) {
			s->state = st::error;
			s->err = errno ? errno : EHOSTUNREACH;
		}
		break;
	case RDMA_CM_EVENT_ROUTE_RESOLVED:
		if (s->state == st::connecting) {
			int e = setup_conn(s);
			rdma_conn_param p = conn_param();
			if (!e && rdma_connect(s->id, &p))
				e = errno ? errno : ECONNREFUSED;
			if (e) {
				s->state = st::error;
				s->err = e;
			}
		}
		break;
	case RDMA_CM_EVENT_ESTABLISHED:
		if (s->state == st::connecting || s->state == st::accepting)
			s->state = st::connected;
		break;
	case RDMA_CM_EVENT_REJECTED:
		if (s->state == st::connecting) {
			s->state = st::error;
			s->err = ECONNREFUSED;
		}
		break;
	case RDMA_CM_EVENT_ADDR_ERROR:
	case RDMA_CM_EVENT_ROUTE_ERROR:
	case RDMA_CM_EVENT_UNREACHABLE:
	case RDMA_CM_EVENT_CONNECT_ERROR:
		if (s->state == st::connecting || s->state == st::accepting) {
			s->state = st::error;
			s->err = t == RDMA_CM_EVENT_UNREACHABLE ? ETIMEDOUT
				 : t == RDMA_CM_EVENT_CONNECT_ERROR ? ECONNREFUSED
				 : (status < 0 ? -status : EHOSTUNREACH);
		}
		break;
	case RDMA_CM_EVENT_DISCONNECTED:
	case RDMA_CM_EVENT_DEVICE_REMOVAL:
		drain_cq(s);
		if (s->state == st::accepting) {
			s->state = st::error;
			s->err = ECONNRESET;
		}
		lost(s, EPIPE);
		break;
	default:
		break;
	}
}

void drain_cm(rs *s)
{
	rdma_cm_event *ev;
	while (s->chan && rdma_get_cm_event(s->chan, &ev) == 0)
		handle_event(s, ev);
}

void progress(rs *s)
{
	drain_cm(s);
	drain_cq(s);
	maybe_credit(s, false);
}

// Sleeps until something may have changed (an event, a completion) or
// timeout_ms (-1: no limit; capped, the caller loops).  Locked on entry and
// return.
void wait_locked(rs *s, std::unique_lock<std::mutex> &lk, int timeout_ms)
{
	if (s->cq) {
		ibv_req_notify_cq(s->cq, 0);
		int before = static_cast<int>(s->rxq.size()) + s->sq_out + s->tx_credits;
		drain_cq(s);
		if (static_cast<int>(s->rxq.size()) + s->sq_out + s->tx_credits != before)
			return;
	}
	pollfd p[2];
	nfds_t n = 0;
	p[n++] = {s->chan->fd, POLLIN, 0};
	if (s->cc)
		p[n++] = {s->cc->fd, POLLIN, 0};
	int t = timeout_ms < 0 || timeout_ms > 1000 ? 1000 : timeout_ms;
	lk.unlock();
	sys_poll(p, n, t);
	lk.lock();
	if (s->cc) {
		ibv_cq *cq;
		void *ctx;
		while (ibv_get_cq_event(s->cc, &cq, &ctx) == 0)
			ibv_ack_cq_events(cq, 1);
	}
	progress(s);
}

int remaining(int64_t deadline)
{
	if (deadline < 0)
		return -1;
	int64_t r = deadline - now_ms();
	return r < 0 ? 0 : static_cast<int>(r);
}

// ------------------------------------------------------- readiness ---

short ready(rs *s, short events)
{
	short r = 0;
	switch (s->state) {
	case st::listening:
		if (!s->pending.empty())
			r |= POLLIN;
		break;
	case st::connected:
		if (!s->rxq.empty() || s->peer_fin || s->peer_gone || s->rd_shut)
			r |= POLLIN;
		// As TCP: the peer's orderly end is POLLIN|POLLRDHUP (data may still
		// be queued); POLLHUP only for a peer gone without one (killed),
		// once nothing is left to read, or a broken connection.
		if (s->peer_fin || s->peer_gone)
			r |= POLLRDHUP;
		if (s->peer_gone && s->rxq.empty() && (!s->peer_fin || s->conn_err == ECONNRESET))
			r |= POLLHUP;
		if (s->wr_shut || s->peer_gone ||
		    (s->tx_credits > 0 && s->slots_used < kSendSlots && s->sq_out < kSqDepth))
			r |= POLLOUT;
		if (s->peer_gone && s->conn_err == ECONNRESET && s->rxq.empty())
			r |= POLLERR;
		break;
	case st::error:
		r |= POLLOUT | POLLERR | POLLHUP;
		break;
	case st::connecting:
	case st::accepting:
		break;
	default:
		r |= POLLOUT | POLLHUP;
		break;
	}
	return static_cast<short>(r & (events | POLLERR | POLLHUP | POLLNVAL));
}

// --------------------------------------------------- data transfer ---

ssize_t do_recv(rs *s, const iovec *iov, int iovcnt, int flags)
{
	size_t total = 0;
	for (int i = 0; i < iovcnt; i++)
		total += iov[i].iov_len;
	std::unique_lock<std::mutex> lk(s->mu);
	if (s->state != st::connected && s->state != st::accepting)
		return fail(s->state == st::error ? (s->err ? s->err : ENOTCONN) : ENOTCONN);
	bool nb = s->nonblock || (flags & MSG_DONTWAIT);
	bool peek = flags & MSG_PEEK;
	size_t got = 0;
	int vi = 0;
	size_t voff = 0;
	for (;;) {
		progress(s);
		if (s->state == st::error)
			return got ? ssize_t(got) : fail(s->err ? s->err : ECONNRESET);
		if (s->state == st::connected) {
			size_t qi = 0;
			uint32_t poff = 0; // MSG_PEEK: bytes of rxq[qi] already copied
			while (got < total && qi < s->rxq.size()) {
				rx_buf &b = s->rxq[qi];
				while (vi < iovcnt && voff == iov[vi].iov_len) {
					vi++;
					voff = 0;
				}
				uint32_t at = b.off + poff;
				size_t n = std::min<size_t>(b.len - at, iov[vi].iov_len - voff);
				memcpy(static_cast<char *>(iov[vi].iov_base) + voff,
				       s->rbuf + size_t(b.slot) * kSlot + at, n);
				got += n;
				voff += n;
				if (peek) {
					// The next buffer only once this one is copied whole:
					// an iovec may fill before it does.
					poff += static_cast<uint32_t>(n);
					if (b.off + poff == b.len) {
						qi++;
						poff = 0;
					}
					continue;
				}
				b.off += static_cast<uint32_t>(n);
				if (b.off == b.len) {
					int slot = b.slot;
					s->rxq.pop_front();
					if (s->id->qp && !s->peer_gone)
						post_recv(s, slot);
					s->owed++;
				}
			}
			if (got)
				maybe_credit(s, s->rxq.empty() && s->owed >= kCredits / 2);
			if (got == total || total == 0)
				return ssize_t(got);
			if (got && (!(flags & MSG_WAITALL) || peek))
				return ssize_t(got);
			if (s->rxq.empty() && (s->peer_fin || s->peer_gone || s->rd_shut))
				return ssize_t(got);
		}
		if (nb)
			return got ? ssize_t(got) : fail(EAGAIN);
		wait_locked(s, lk, -1);
	}
}

ssize_t do_send(rs *s, const iovec *iov, int iovcnt, int flags)
{
	size_t total = 0;
	for (int i = 0; i < iovcnt; i++)
		total += iov[i].iov_len;
	std::unique_lock<std::mutex> lk(s->mu);
	if (s->state != st::connected && s->state != st::accepting)
		return fail(s->state == st::error ? (s->err ? s->err : ENOTCONN) : ENOTCONN);
	if (s->wr_shut)
		return fail(EPIPE);
	bool nb = s->nonblock || (flags & MSG_DONTWAIT);
	size_t sent = 0;
	int vi = 0;
	size_t voff = 0;
	for (;;) {
		progress(s);
		if (s->state == st::error)
			return sent ? ssize_t(sent) : fail(s->err ? s->err : ECONNRESET);
		if (s->peer_gone)
			return sent ? ssize_t(sent) : fail(s->conn_err ? s->conn_err : EPIPE);
		if (s->state == st::connected) {
			while (sent < total && s->tx_credits > 0 && s->slots_used < kSendSlots &&
			       s->sq_out < kSqDepth) {
				int slot = s->slot_head;
				char *dst = s->sbuf + size_t(slot) * kSlot;
				uint32_t len = 0;
				while (len < kSlot && vi < iovcnt) {
					size_t n = std::min<size_t>(kSlot - len, iov[vi].iov_len - voff);
					memcpy(dst + len, static_cast<const char *>(iov[vi].iov_base) + voff, n);
					len += static_cast<uint32_t>(n);
					voff += n;
					if (voff == iov[vi].iov_len) {
						vi++;
						voff = 0;
					}
				}
				if (post_send(s, slot, len, static_cast<uint32_t>(s->owed))) {
					lost(s, ECONNRESET);
					break;
				}
				s->owed = 0;
				s->sq_kinds.back() = true;
				s->slots_used++;
				s->tx_credits--;
				s->slot_head = (slot + 1) % kSendSlots;
				sent += len;
			}
			if (sent == total)
				return ssize_t(sent);
		}
		if (nb)
			return sent ? ssize_t(sent) : fail(EAGAIN);
		wait_locked(s, lk, -1);
	}
}

// Sends the end of the stream once (needs a send WR; waits for one).
void send_fin(rs *s, std::unique_lock<std::mutex> &lk)
{
	if (s->fin_sent || s->state != st::connected || !s->id->qp)
		return;
	int64_t deadline = now_ms() + 5000;
	while (!s->peer_gone && s->sq_out >= kSqDepth && now_ms() < deadline)
		wait_locked(s, lk, 100);
	if (s->peer_gone || s->sq_out >= kSqDepth)
		return;
	if (!post_send(s, 0, 0, kFin | static_cast<uint32_t>(s->owed))) {
		s->owed = 0;
		s->fin_sent = true;
	}
}

rs *new_rs(int domain)
{
	auto *s = new rs;
	s->domain = domain;
	s->chan = rdma_create_event_channel();
	if (!s->chan) {
		delete s;
		return nullptr;
	}
	set_nonblock_fd(s->chan->fd);
	s->fd = s->chan->fd;
	return s;
}

void destroy_rs(rs *s)
{
	free_conn(s);
	if (s->id)
		rdma_destroy_id(s->id);
	for (rdma_cm_id *c : s->pending) {
		rdma_reject(c, nullptr, 0);
		rdma_destroy_id(c);
	}
	if (s->chan)
		rdma_destroy_event_channel(s->chan);
	delete s;
}

void add(rs *s)
{
	std::lock_guard<std::mutex> lk(g_mu);
	g_socks[s->fd] = s;
}

#define GET(s, fd)                 \
	rs *s = lookup(fd);        \
	if (!s)                    \
		return fail(EBADF)

socklen_t sa_len(const sockaddr *a)
{
	switch (a->sa_family) {
	case AF_INET:
		return sizeof(sockaddr_in);
	case AF_INET6:
		return sizeof(sockaddr_in6);
	case AF_IB:
		return sizeof(sockaddr_ib);
	default:
		return sizeof(sockaddr_storage);
	}
}

int copy_addr(const sockaddr *a, sockaddr *out, socklen_t *len)
{
	// A null address with no room asks for the length only, as the
	// kernel answers it (librspreload's fallback to a real socket does).
	if (!len || (!out && *len))
		return fail(EFAULT);
	socklen_t n = sa_len(a);
	if (out)
		memcpy(out, a, std::min(n, *len));
	*len = n;
	return 0;
}

} // namespace

// ------------------------------------------------------------- API ---

SV_API int rsocket(int domain, int type, int protocol)
{
	if (domain != AF_INET && domain != AF_INET6 && domain != AF_IB)
		return fail(EAFNOSUPPORT);
	int base = type & ~(SOCK_NONBLOCK | SOCK_CLOEXEC);
	if (base != SOCK_STREAM)
		return fail(EOPNOTSUPP);
	if (protocol && protocol != IPPROTO_TCP)
		return fail(EPROTONOSUPPORT);
	rs *s = new_rs(domain);
	if (!s)
		return -1;
	if (rdma_create_id(s->chan, &s->id, s, RDMA_PS_TCP)) {
		int e = errno;
		destroy_rs(s);
		return fail(e);
	}
	s->nonblock = type & SOCK_NONBLOCK;
	add(s);
	return s->fd;
}

SV_API int rbind(int socket, const struct sockaddr *addr, socklen_t addrlen)
{
	GET(s, socket);
	std::lock_guard<std::mutex> lk(s->mu);
	if (!addr || addrlen < sizeof(sa_family_t))
		return fail(EINVAL);
	if (s->state != st::fresh)
		return fail(EINVAL);
	if (rdma_bind_addr(s->id, const_cast<sockaddr *>(addr)))
		return -1;
	s->state = st::bound;
	return 0;
}

SV_API int rlisten(int socket, int backlog)
{
	GET(s, socket);
	std::lock_guard<std::mutex> lk(s->mu);
	if (s->state == st::listening)
		return 0;
	if (s->state != st::bound && s->state != st::fresh)
		return fail(EINVAL);
	if (rdma_listen(s->id, backlog > 0 ? backlog : 128))
		return -1;
	s->state = st::listening;
	return 0;
}

SV_API int raccept(int socket, struct sockaddr *addr, socklen_t *addrlen)
{
	GET(s, socket);
	std::unique_lock<std::mutex> lk(s->mu);
	if (s->state != st::listening)
		return fail(EINVAL);
	for (;;) {
		drain_cm(s);
		if (!s->pending.empty())
			break;
		if (s->nonblock)
			return fail(EAGAIN);
		wait_locked(s, lk, -1);
	}
	rdma_cm_id *cid = s->pending.front();
	s->pending.pop_front();
	lk.unlock();
	rs *c = new_rs(s->domain);
	int e = ENOMEM;
	if (!c) {
		e = errno;
		goto reject;
	}
	if (rdma_migrate_id(cid, c->chan)) {
		e = errno;
		goto reject;
	}
	c->id = cid;
	cid->context = c;
	if ((e = setup_conn(c)) != 0)
		goto reject;
	{
		rdma_conn_param p = conn_param();
		if (rdma_accept(cid, &p)) {
			e = errno;
			destroy_rs(c);
			return fail(e);
		}
	}
	c->state = st::accepting;
	if (addr && addrlen)
		copy_addr(rdma_get_peer_addr(cid), addr, addrlen);
	add(c);
	return c->fd;
reject:
	rdma_reject(cid, nullptr, 0);
	if (c) {
		c->id = nullptr;
		destroy_rs(c);
	}
	rdma_destroy_id(cid);
	return fail(e);
}

SV_API int rconnect(int socket, const struct sockaddr *addr, socklen_t addrlen)
{
	GET(s, socket);
	std::unique_lock<std::mutex> lk(s->mu);
	if (!addr || addrlen < sizeof(sa_family_t))
		return fail(EINVAL);
	bool first = false;
	switch (s->state) {
	case st::fresh:
	case st::bound: {
		first = true;
		sockaddr *src = s->state == st::bound ? rdma_get_local_addr(s->id) : nullptr;
		s->state = st::connecting;
		if (rdma_resolve_addr(s->id, src, const_cast<sockaddr *>(addr), kResolveMs)) {
			s->state = st::error;
			s->err = errno;
			return -1;
		}
		break;
	}
	case st::connecting:
		if (s->nonblock)
			return fail(EALREADY);
		break;
	case st::connected:
	case st::accepting:
		return fail(EISCONN);
	case st::listening:
		return fail(EINVAL);
	case st::error: {
		int e = s->err ? s->err : ECONNREFUSED;
		s->err = 0;
		return fail(e);
	}
	default:
		return fail(EBADF);
	}
	for (;;) {
		progress(s);
		if (s->state == st::connected)
			return 0;
		// A nonblocking connect reports its failure through SO_ERROR, as
		// TCP's does, even when it is known at once.
		if (s->state == st::error && s->nonblock && first)
			return fail(EINPROGRESS);
		if (s->state == st::error) {
			int e = s->err ? s->err : ECONNREFUSED;
			s->err = 0;
			return fail(e);
		}
		if (s->nonblock)
			return fail(EINPROGRESS);
		wait_locked(s, lk, -1);
	}
}

SV_API int rshutdown(int socket, int how)
{
	GET(s, socket);
	std::unique_lock<std::mutex> lk(s->mu);
	if (how != SHUT_RD && how != SHUT_WR && how != SHUT_RDWR)
		return fail(EINVAL);
	if (s->state != st::connected && s->state != st::accepting)
		return fail(ENOTCONN);
	if (s->state == st::accepting) {
		int64_t deadline = now_ms() + 5000;
		while (s->state == st::accepting && now_ms() < deadline)
			wait_locked(s, lk, 100);
	}
	progress(s);
	if (how != SHUT_WR)
		s->rd_shut = true;
	if (how != SHUT_RD) {
		s->wr_shut = true;
		send_fin(s, lk);
	}
	return 0;
}

SV_API int rclose(int socket)
{
	rs *s;
	{
		std::lock_guard<std::mutex> lk(g_mu);
		auto it = g_socks.find(socket);
		if (it == g_socks.end())
			return fail(EBADF);
		s = it->second;
		g_socks.erase(it);
	}
	{
		std::unique_lock<std::mutex> lk(s->mu);
		if (s->state == st::accepting) {
			int64_t deadline = now_ms() + 2000;
			while (s->state == st::accepting && now_ms() < deadline)
				wait_locked(s, lk, 100);
		}
		if (s->state == st::connected) {
			progress(s);
			send_fin(s, lk);
			// What was sent (the end of stream last) is delivered once its
			// completions are in: then the disconnect cannot overtake it.
			int64_t deadline = now_ms() + 5000;
			while (s->sq_out > 0 && !s->peer_gone && now_ms() < deadline)
				wait_locked(s, lk, 100);
			rdma_disconnect(s->id);
		}
		// Events still queued are dropped with the id.
	}
	destroy_rs(s);
	return 0;
}

SV_API ssize_t rrecv(int socket, void *buf, size_t len, int flags)
{
	GET(s, socket);
	iovec v = {buf, len};
	return do_recv(s, &v, 1, flags);
}

SV_API ssize_t rrecvfrom(int socket, void *buf, size_t len, int flags, struct sockaddr *src_addr,
			 socklen_t *addrlen)
{
	GET(s, socket);
	iovec v = {buf, len};
	ssize_t r = do_recv(s, &v, 1, flags);
	if (r >= 0 && src_addr && addrlen)
		copy_addr(rdma_get_peer_addr(s->id), src_addr, addrlen);
	return r;
}

SV_API ssize_t rrecvmsg(int socket, struct msghdr *msg, int flags)
{
	GET(s, socket);
	if (!msg)
		return fail(EFAULT);
	if (msg->msg_control && msg->msg_controllen)
		return fail(ENOTSUP);
	msg->msg_flags = 0;
	return do_recv(s, msg->msg_iov, static_cast<int>(msg->msg_iovlen), flags);
}

SV_API ssize_t rsend(int socket, const void *buf, size_t len, int flags)
{
	GET(s, socket);
	iovec v = {const_cast<void *>(buf), len};
	return do_send(s, &v, 1, flags);
}

SV_API ssize_t rsendto(int socket, const void *buf, size_t len, int flags, const struct sockaddr *dest_addr,
		       socklen_t)
{
	GET(s, socket);
	if (dest_addr)
		return fail(EISCONN);
	iovec v = {const_cast<void *>(buf), len};
	return do_send(s, &v, 1, flags);
}

SV_API ssize_t rsendmsg(int socket, const struct msghdr *msg, int flags)
{
	GET(s, socket);
	if (!msg)
		return fail(EFAULT);
	if (msg->msg_control && msg->msg_controllen)
		return fail(ENOTSUP);
	return do_send(s, msg->msg_iov, static_cast<int>(msg->msg_iovlen), flags);
}

SV_API ssize_t rread(int socket, void *buf, size_t count) { return rrecv(socket, buf, count, 0); }

SV_API ssize_t rreadv(int socket, const struct iovec *iov, int iovcnt)
{
	GET(s, socket);
	if (iovcnt < 0)
		return fail(EINVAL);
	return do_recv(s, iov, iovcnt, 0);
}

SV_API ssize_t rwrite(int socket, const void *buf, size_t count) { return rsend(socket, buf, count, 0); }

SV_API ssize_t rwritev(int socket, const struct iovec *iov, int iovcnt)
{
	GET(s, socket);
	if (iovcnt < 0)
		return fail(EINVAL);
	return do_send(s, iov, iovcnt, 0);
}

SV_API int rpoll(struct pollfd *fds, nfds_t nfds, int timeout)
{
	int64_t deadline = timeout < 0 ? -1 : now_ms() + timeout;
	std::vector<rs *> socks(nfds);
	std::vector<pollfd> other;
	std::vector<nfds_t> other_idx;
	for (nfds_t i = 0; i < nfds; i++) {
		socks[i] = fds[i].fd >= 0 ? lookup(fds[i].fd) : nullptr;
		if (!socks[i] && fds[i].fd >= 0) {
			other.push_back(fds[i]);
			other_idx.push_back(i);
		}
	}
	for (;;) {
		int count = 0;
		for (nfds_t i = 0; i < nfds; i++) {
			fds[i].revents = 0;
			if (!socks[i])
				continue;
			std::lock_guard<std::mutex> lk(socks[i]->mu);
			progress(socks[i]);
			fds[i].revents = ready(socks[i], fds[i].events);
			if (fds[i].revents)
				count++;
		}
		if (!other.empty()) {
			for (auto &p : other)
				p.revents = 0;
			int r = sys_poll(other.data(), other.size(), 0);
			if (r < 0)
				return -1;
			for (size_t k = 0; k < other.size(); k++) {
				fds[other_idx[k]].revents = other[k].revents;
				if (other[k].revents)
					count++;
			}
		}
		if (count)
			return count;
		int left = remaining(deadline);
		if (left == 0)
			return 0;
		// Nothing yet: sleep on the rsockets' channels and the other fds.
		std::vector<pollfd> w(other);
		bool changed = false;
		for (nfds_t i = 0; i < nfds; i++) {
			rs *s = socks[i];
			if (!s)
				continue;
			std::lock_guard<std::mutex> lk(s->mu);
			if (s->cq) {
				ibv_req_notify_cq(s->cq, 0);
				progress(s);
				if (ready(s, fds[i].events))
					changed = true;
				w.push_back({s->cc->fd, POLLIN, 0});
			}
			w.push_back({s->chan->fd, POLLIN, 0});
		}
		if (changed)
			continue;
		int t = left < 0 || left > 1000 ? 1000 : left;
		if (sys_poll(w.data(), w.size(), t) < 0 && errno != EINTR)
			return -1;
		for (nfds_t i = 0; i < nfds; i++) {
			rs *s = socks[i];
			if (!s || !s->cc)
				continue;
			std::lock_guard<std::mutex> lk(s->mu);
			ibv_cq *cq;
			void *ctx;
			if (s->cc)
				while (ibv_get_cq_event(s->cc, &cq, &ctx) == 0)
					ibv_ack_cq_events(cq, 1);
		}
	}
}

SV_API int rselect(int nfds, fd_set *readfds, fd_set *writefds, fd_set *exceptfds, struct timeval *timeout)
{
	std::vector<pollfd> p;
	for (int fd = 0; fd < nfds; fd++) {
		short ev = 0;
		if (readfds && FD_ISSET(fd, readfds))
			ev |= POLLIN;
		if (writefds && FD_ISSET(fd, writefds))
			ev |= POLLOUT;
		if (exceptfds && FD_ISSET(fd, exceptfds))
			ev |= POLLPRI;
		if (ev)
			p.push_back({fd, ev, 0});
	}
	int t = timeout ? static_cast<int>(timeout->tv_sec * 1000 + timeout->tv_usec / 1000) : -1;
	int r = rpoll(p.data(), p.size(), t);
	if (r < 0)
		return r;
	if (readfds)
		FD_ZERO(readfds);
	if (writefds)
		FD_ZERO(writefds);
	if (exceptfds)
		FD_ZERO(exceptfds);
	int count = 0;
	for (auto &q : p) {
		if (readfds && (q.revents & (POLLIN | POLLHUP | POLLERR)) && (q.events & POLLIN)) {
			FD_SET(q.fd, readfds);
			count++;
		}
		if (writefds && (q.revents & (POLLOUT | POLLERR)) && (q.events & POLLOUT)) {
			FD_SET(q.fd, writefds);
			count++;
		}
		if (exceptfds && (q.revents & POLLPRI)) {
			FD_SET(q.fd, exceptfds);
			count++;
		}
	}
	if (timeout && !r) {
		timeout->tv_sec = 0;
		timeout->tv_usec = 0;
	}
	return count;
}

SV_API int rgetpeername(int socket, struct sockaddr *addr, socklen_t *addrlen)
{
	GET(s, socket);
	std::lock_guard<std::mutex> lk(s->mu);
	if (s->state != st::connected && s->state != st::accepting)
		return fail(ENOTCONN);
	return copy_addr(rdma_get_peer_addr(s->id), addr, addrlen);
}

SV_API int rgetsockname(int socket, struct sockaddr *addr, socklen_t *addrlen)
{
	GET(s, socket);
	std::lock_guard<std::mutex> lk(s->mu);
	sockaddr *a = rdma_get_local_addr(s->id);
	if (!a->sa_family) {
		sockaddr_storage z = {};
		z.ss_family = static_cast<sa_family_t>(s->domain);
		return copy_addr(reinterpret_cast<sockaddr *>(&z), addr, addrlen);
	}
	return copy_addr(a, addr, addrlen);
}

namespace {
int *int_opt(rs *s, int level, int name)
{
	if (level == SOL_SOCKET) {
		switch (name) {
		case SO_REUSEADDR: return &s->reuseaddr;
		case SO_KEEPALIVE: return &s->keepalive;
		case SO_SNDBUF: return &s->sndbuf;
		case SO_RCVBUF: return &s->rcvbuf;
		}
	} else if (level == IPPROTO_TCP) {
		switch (name) {
		case TCP_NODELAY: return &s->nodelay;
		case TCP_KEEPIDLE: return &s->keepidle;
		}
	} else if (level == IPPROTO_IPV6) {
		if (name == IPV6_V6ONLY)
			return &s->v6only;
	} else if (level == SOL_RDMA) {
		switch (name) {
		case RDMA_SQSIZE: return &s->sqsize;
		case RDMA_RQSIZE: return &s->rqsize;
		case RDMA_INLINE: return &s->inl;
		case RDMA_IOMAPSIZE: return &s->iomapsize;
		}
	}
	return nullptr;
}
} // namespace

SV_API int rsetsockopt(int socket, int level, int optname, const void *optval, socklen_t optlen)
{
	GET(s, socket);
	std::lock_guard<std::mutex> lk(s->mu);
	if (level == SOL_RDMA && optname == RDMA_ROUTE)
		return optval ? 0 : fail(EINVAL);  // our CM resolves routes itself
	if (level == SOL_SOCKET && optname == SO_LINGER) {
		if (!optval || optlen < sizeof(linger))
			return fail(EINVAL);
		memcpy(&s->lin, optval, sizeof(linger));
		return 0;
	}
	if (level == IPPROTO_TCP && optname == TCP_MAXSEG)
		return optval && optlen >= sizeof(int) ? 0 : fail(EINVAL);
	int *p = int_opt(s, level, optname);
	if (!p)
		return fail(ENOTSUP);
	if (!optval || optlen < sizeof(int))
		return fail(EINVAL);
	memcpy(p, optval, sizeof(int));
	if (level == SOL_SOCKET && (optname == SO_SNDBUF || optname == SO_RCVBUF))
		*p *= 2;  // as Linux reports it back
	if (level == SOL_SOCKET && optname == SO_KEEPALIVE)
		*p = *p != 0;
	if (level == SOL_SOCKET && optname == SO_REUSEADDR && s->id) {
		// The CM's own REUSEADDR (the kernel rdma_cm's port rules), as
		// rdma-core's rsockets do.  The CM refuses some late changes
		// (off once bound, anything once listening) that TCP allows:
		// then the stored value is all there is.
		int v = *p != 0;
		rdma_set_option(s->id, RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, &v, sizeof(v));
	}
	if (level == IPPROTO_IPV6 && optname == IPV6_V6ONLY) {
		// The CM's AFONLY (rdma-core's rsockets): a dual-stack listener
		// (iperf3's, IPV6_V6ONLY 0) takes IPv4 connections too.
		*p = *p != 0;
		if (s->id && rdma_set_option(s->id, RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY, p,
					     sizeof(*p)))
			return -1;
	}
	return 0;
}

SV_API int rgetsockopt(int socket, int level, int optname, void *optval, socklen_t *optlen)
{
	GET(s, socket);
	std::lock_guard<std::mutex> lk(s->mu);
	if (!optval || !optlen)
		return fail(EFAULT);
	int v;
	if (level == SOL_SOCKET && optname == SO_ERROR) {
		progress(s);
		v = s->state == st::error ? s->err : 0;
		s->err = 0;
	} else if (level == SOL_SOCKET && optname == SO_LINGER) {
		socklen_t n = std::min<socklen_t>(*optlen, sizeof(linger));
		memcpy(optval, &s->lin, n);
		*optlen = n;
		return 0;
	} else if (level == IPPROTO_TCP && optname == TCP_MAXSEG) {
		v = kSlot;
	} else {
		int *p = int_opt(s, level, optname);
		if (!p)
			return fail(ENOTSUP);
		v = *p;
	}
	socklen_t n = std::min<socklen_t>(*optlen, sizeof(int));
	memcpy(optval, &v, n);
	*optlen = n;
	return 0;
}

SV_API int rfcntl(int socket, int cmd, ...)
{
	GET(s, socket);
	va_list ap;
	va_start(ap, cmd);
	long arg = 0;
	if (cmd == F_SETFL || cmd == F_SETFD)
		arg = va_arg(ap, long);
	va_end(ap);
	std::lock_guard<std::mutex> lk(s->mu);
	switch (cmd) {
	case F_GETFL:
		return O_RDWR | (s->nonblock ? O_NONBLOCK : 0);
	case F_SETFL:
		s->nonblock = arg & O_NONBLOCK;
		return 0;
	case F_GETFD:
	case F_SETFD:
		return static_cast<int>(syscall(SYS_fcntl, s->fd, cmd, arg));
	default:
		return fail(ENOTSUP);
	}
}

// ------------------------------------------------------------- iomap ---
// riomap makes [buf, buf+len) writable by the peer at `offset` (PROT_WRITE
// only, as in rdma-core): the region is registered and its address and key
// go to the peer in a control message; riowrite copies through a send slot
// and RDMA WRITEs into the peer's mapping.  Nothing tells the mapping's owner
// that a write landed (it watches its memory, as riostream does); writes and
// later rsend data arrive in the order they were made.

namespace {
// Waits, locked, until the socket is connected (an accepted one is not at
// once); false with errno set when it never will be.
bool wait_connected(rs *s, std::unique_lock<std::mutex> &lk, bool nb)
{
	for (;;) {
		progress(s);
		if (s->state == st::connected)
			return true;
		if (s->state != st::accepting) {
			errno = s->state == st::error && s->err ? s->err : ENOTCONN;
			return false;
		}
		if (nb) {
			errno = EAGAIN;
			return false;
		}
		wait_locked(s, lk, -1);
	}
}

// A slot and a send WR for a message that needs no credit.
bool wait_slot(rs *s, std::unique_lock<std::mutex> &lk, bool nb)
{
	for (;;) {
		if (s->peer_gone) {
			errno = s->conn_err ? s->conn_err : EPIPE;
			return false;
		}
		if (s->slots_used < kSendSlots && s->sq_out < kSqDepth)
			return true;
		if (nb) {
			errno = EAGAIN;
			return false;
		}
		wait_locked(s, lk, -1);
	}
}

int send_ctl(rs *s, std::unique_lock<std::mutex> &lk, const ctl_msg &m)
{
	if (!wait_slot(s, lk, false))
		return -1;
	int slot = s->slot_head;
	memcpy(s->sbuf + size_t(slot) * kSlot, &m, sizeof(m));
	if (post_send(s, slot, sizeof(m), kCtl | static_cast<uint32_t>(s->owed)))
		return fail(ECONNRESET);
	s->owed = 0;
	s->slots_used++;
	s->slot_head = (slot + 1) % kSendSlots;
	return 0;
}
} // namespace

SV_API off_t riomap(int socket, void *buf, size_t len, int prot, int, off_t offset)
{
	GET(s, socket);
	std::unique_lock<std::mutex> lk(s->mu);
	if (!buf || !len || prot != PROT_WRITE || (offset < 0 && offset != -1))
		return fail(EINVAL);
	if (!wait_connected(s, lk, false))
		return -1;
	uint64_t off = static_cast<uint64_t>(offset);
	if (offset == -1) {
		off = 0;
		for (const iomap &m : s->lmaps)
			off = std::max(off, m.offset + m.len);
	}
	for (const iomap &m : s->lmaps)
		if (off < m.offset + m.len && m.offset < off + len)
			return fail(EINVAL);
	ibv_mr *mr = ibv_reg_mr(s->pd, buf, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	if (!mr)
		return -1;
	ctl_msg m = {kCtlMagic, 1, off, len, reinterpret_cast<uintptr_t>(buf), mr->rkey, 0};
	if (send_ctl(s, lk, m)) {
		int e = errno;
		ibv_dereg_mr(mr);
		return fail(e);
	}
	s->lmaps.push_back({off, len, reinterpret_cast<uintptr_t>(buf), mr->rkey, mr});
	return static_cast<off_t>(off);
}

SV_API int riounmap(int socket, void *buf, size_t len)
{
	GET(s, socket);
	std::unique_lock<std::mutex> lk(s->mu);
	auto it = std::find_if(s->lmaps.begin(), s->lmaps.end(), [&](const iomap &m) {
		return m.addr == reinterpret_cast<uintptr_t>(buf) && m.len == len;
	});
	if (it == s->lmaps.end())
		return fail(EINVAL);
	iomap m = *it;
	s->lmaps.erase(it);
	if (s->state == st::connected && !s->peer_gone) {
		ctl_msg c = {kCtlMagic, 2, m.offset, m.len, 0, 0, 0};
		send_ctl(s, lk, c);
		// Writes the peer made before it learns of the unmap may still be
		// coming: the key stays valid until they could have landed.
		int64_t deadline = now_ms() + 1000;
		while (s->sq_out > 0 && !s->peer_gone && now_ms() < deadline)
			wait_locked(s, lk, 100);
	}
	ibv_dereg_mr(m.mr);
	return 0;
}

SV_API size_t riowrite(int socket, const void *buf, size_t count, off_t offset, int flags)
{
	rs *s = lookup(socket);
	if (!s) {
		errno = EBADF;
		return static_cast<size_t>(-1);
	}
	std::unique_lock<std::mutex> lk(s->mu);
	bool nb = s->nonblock || (flags & MSG_DONTWAIT);
	if (offset < 0 || (count && !buf)) {
		errno = EINVAL;
		return static_cast<size_t>(-1);
	}
	if (!wait_connected(s, lk, nb))
		return static_cast<size_t>(-1);
	size_t done = 0;
	const auto *src = static_cast<const char *>(buf);
	while (done < count) {
		progress(s);
		if (s->peer_gone || s->wr_shut) {
			if (done)
				break;
			errno = s->wr_shut ? EPIPE : (s->conn_err ? s->conn_err : EPIPE);
			return static_cast<size_t>(-1);
		}
		uint64_t at = static_cast<uint64_t>(offset) + done;
		const iomap *m = nullptr;
		for (const iomap &x : s->rmaps)
			if (at >= x.offset && at < x.offset + x.len)
				m = &x;
		bool room = s->slots_used < kSendSlots && s->sq_out < kSqDepth;
		if (!m || !room) {
			// No mapping there (yet: the peer's riomap may be on its way).
			if (nb || done)
				break;
			wait_locked(s, lk, -1);
			continue;
		}
		uint32_t n = static_cast<uint32_t>(std::min<uint64_t>({count - done, kSlot, m->offset + m->len - at}));
		int slot = s->slot_head;
		memcpy(s->sbuf + size_t(slot) * kSlot, src + done, n);
		if (post_send(s, slot, n, 0, m->addr + (at - m->offset), m->rkey)) {
			lost(s, ECONNRESET);
			continue;
		}
		s->slots_used++;
		s->slot_head = (slot + 1) % kSendSlots;
		done += n;
	}
	if (!done && count) {
		errno = EAGAIN;
		return static_cast<size_t>(-1);
	}
	return done;
}
