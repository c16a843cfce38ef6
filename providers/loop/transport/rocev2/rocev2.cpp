// SPDX-License-Identifier: MIT
// The rocev2 transport (rocev2.h; docs/rocev2.md).
//
// Requester: the engine calls deliver, move and atomic synchronously, one
// request of a QP at a time (under its sq_lock).  Each call sends the
// request's packets (segmented to the path MTU, the last asking for an
// ACK) and waits, up to the QP's local ACK timeout, for the answer that the
// receive thread files in the QP's inbox.  A PSN sequence NAK sends again
// from the PSN it names (go-back-N inside the message); no answer is
// "lost", and the engine retries the WR after the timeout, retry_cnt
// times, under the same PSNs (a retry is known by the engine's request
// sequence number, tp_move::psn), so a responder that executed the first
// try answers the retry as a duplicate.
//
// Responder: the receive thread checks each request's PSN against the
// QP's expected PSN (a duplicate is answered again, not executed again;
// one beyond a gap gets one sequence NAK), collects a multi-packet SEND
// or WRITE, and runs it through the engine's responder (respond()) with
// the loop transport on the local QP, as a local requester would: the
// receive WQE, the placement, the CQE and the errors are the same code.
// READ responses go out segmented; atomics keep a replay cache by PSN.
#include "rocev2.h"

#include "cm_mad.h"
#include "engine.h"
#include "fabric.h"
#include "loop.h"
#include "thread_start.h"
#include "objects.h"
#include "pcap.h"
#include "wire.h"
#include "xfer.h"

#include <arpa/inet.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <new>
#include <random>
#include <set>
#include <system_error>
#include <thread>
#include <unordered_map>

namespace loop {

std::atomic<uint32_t> rocev2_flying_qps{0};

namespace {

namespace rv = rocev2;

constexpr uint32_t kPsn24 = 0xffffff;
// The largest packet: BTH and the longest header set, 4096 bytes of
// payload, pad and ICRC.
constexpr size_t kMaxPkt = 4096 + 128;
// Answers kept for a requester that is not waiting (late or stale ones).
constexpr size_t kInboxMax = 4096;
// Sequence NAKs one request may answer with a resend before it counts
// as lost (and the engine's retry takes over).
constexpr int kMaxResends = 64;
// Packets of a SEND or WRITE in flight before an ACK (the last of each
// burst asks for one), and packets a READ request asks for at most: bursts
// the receiver's socket buffer holds, and the lost part of a message is
// never more than this.
constexpr uint32_t kWindow = 64;
// A multi-packet SEND or WRITE is collected whole (docs/rocev2.md).
constexpr uint64_t kMaxMessage = 1ULL << 31;
// The port's owner waits this long for room in another process's queue of
// forwarded packets, then drops that process's packets for the backoff
// (forward()).
constexpr long kForwardWaitMs = 5;
constexpr uint64_t kForwardBackoffMs = 20;

// PSN a minus b in the 24-bit sequence space, as a signed distance.
int32_t psn_diff(uint32_t a, uint32_t b)
{
	return static_cast<int32_t>((a - b) << 8) >> 8;
}

uint32_t psn_add(uint32_t a, uint32_t n)
{
	return (a + n) & kPsn24;
}

struct host_addr {
	bool v4 = true;
	uint8_t ip[16] = {}; // IPv4: the first 4 bytes
};

bool same_addr(const host_addr &a, const host_addr &b)
{
	return a.v4 == b.v4 && !memcmp(a.ip, b.ip, a.v4 ? 4 : 16);
}

// A RoCE v2 GID is an IPv6 address, or an IPv4 address mapped into one.
bool gid_addr(const ibv_gid &g, host_addr &out)
{
	static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
	static const uint8_t zero[16] = {};
	if (!memcmp(g.raw, zero, 16))
		return false;
	out = {};
	if (!memcmp(g.raw, mapped, 12)) {
		out.v4 = true;
		memcpy(out.ip, g.raw + 12, 4);
	} else {
		out.v4 = false;
		memcpy(out.ip, g.raw, 16);
	}
	return true;
}

bool link_local(const host_addr &a)
{
	return !a.v4 && a.ip[0] == 0xfe && (a.ip[1] & 0xc0) == 0x80;
}

// A SEND or WRITE message as its packets carry it.
struct message {
	uint8_t service;   // 0x00 RC, 0x20 UC, 0xa0 XRC
	uint32_t xrc_srqn; // XRC: the SRQ every request packet names (XRCETH)
	bool write;
	bool imm;
	bool inv;
	bool se;
	uint32_t imm_be;
	uint32_t inv_rkey;
	uint64_t va;
	uint32_t rkey;
	const iovec *iov;
	int niov;
	uint64_t len;
};

// What one QP keeps of the wire.  Its requester's calls and the receive
// thread meet under m.
struct qp_wire {
	std::mutex m;
	std::condition_variable cv;
	loop_context *ctx = nullptr;
	uint32_t qpn = 0;
	ibv_qp_type type = IBV_QPT_RC;
	bool dead = false;
	// The peer: its host and QP, our source address, the path MTU.
	bool remote = false;
	host_addr src, dst;
	uint32_t ifindex = 0; // For an IPv6 link-local peer
	uint32_t dqpn = 0;
	uint32_t pmtu = 1024;
	uint8_t timeout = 14;
	// Requester: the next PSN, the request in flight (by the engine's
	// sequence number), the answers the receive thread filed.
	uint32_t next_psn = 0;
	uint32_t cur_engine = UINT32_MAX;
	uint32_t cur_first = 0;
	// Its packets the responder acknowledged (or, for a READ, whose
	// responses were placed): a retry goes on from there.
	uint32_t cur_done = 0;
	uint32_t cur_asked = 0; // A READ's packets asked for so far
	uint32_t cur_srqn = 0;	// XRC: the SRQ the request names
	std::deque<std::vector<uint8_t>> inbox;
	uint8_t rnr_timer = 0; // The last RNR NAK's
	// Responder.
	uint32_t epsn = 0;
	uint32_t msn = 0;
	bool nak_sent = false; // A sequence NAK for epsn went out
	bool in_msg = false;   // A multi-packet SEND or WRITE is being collected
	bool msg_write = false;
	uint32_t msg_first = 0;
	uint64_t w_va = 0;
	uint32_t w_rkey = 0;
	uint32_t w_len = 0;
	uint64_t w_off = 0; // A plain WRITE's bytes placed so far
	// A SEND (or WRITE WITH IMMEDIATE) is collected here: a SEND's no
	// longer than the receive WQE it took at its first packet, a WRITE's
	// no longer than the range its key was checked for.
	std::vector<uint8_t> reasm;
	// The receive WQE a SEND took at its first packet (a copy), and its
	// room in bytes.
	bool have_wqe = false;
	std::vector<uint8_t> held_wqe;
	uint32_t held_pdn = 0;
	uint64_t held_room = 0;
	struct replay {
		uint32_t psn;
		uint64_t orig;
		bool valid;
	};
	replay atomics[16] = {};
	unsigned atomic_next = 0;
	// The last READs executed (their first PSN, packets, key and range):
	// a duplicate READ is answered only within one of them (IBTA 9.7.5.1.3,
	// as rxe's read resources), else dropped.
	struct read_done {
		uint32_t psn, n, rkey;
		uint64_t va, len;
		bool valid;
	};
	read_done reads[16] = {};
	unsigned read_next = 0;
	// Pipelined RDMA WRITEs (rocev2_write_start): an RC QP's WRITEs go out
	// as they are posted, several in flight, their PSNs contiguous from
	// the oldest's; the receive thread sends on as ACKs open the window,
	// sends again from a sequence NAK's PSN or after a timeout (retry_cnt
	// timeouts without progress fail the oldest with RETRY_EXC_ERR), and
	// completes them in order under the QP's sq_lock.
	struct flight {
		uint64_t sq_index = 0;
		uint64_t wr_id = 0;
		unsigned flags = 0;
		uint32_t first = 0, n = 0; // Its PSNs: [first, first + n)
		message m{};
		std::vector<iovec> iov; // m.iov: the WR's gather list
	};
	struct settled {
		uint64_t sq_index, wr_id;
		unsigned flags;
		uint32_t len;
		ibv_wc_status st;
	};
	loop_qp *lqp = nullptr; // For completions; valid while !dead
	std::deque<flight> flights;
	uint32_t snd_una = 0; // The first PSN not acknowledged
	uint32_t snd_nxt = 0; // The next PSN to send (back at snd_una after a loss)
	uint32_t snd_max = 0; // One past the highest PSN sent
	uint64_t fl_deadline = 0;
	uint8_t fl_retries = 7;
	uint8_t retry_cnt = 7;
	std::vector<settled> to_complete; // Answered, waiting for sq_lock
	// The QP went to ERR with WRITEs on the wire (not under sq_lock: a CQ
	// overflow, a responder error): they were dropped, the flush waits
	// for sq_lock.
	bool need_flush = false;
};


// What a destroyed RC QP's responder leaves for a while (its TIME_WAIT):
// a requester whose last ACK was lost sends its last request again after
// its timeout, and gets the ACK from here instead of running out of
// retries against a QP that is gone.  Only ACKs: nothing is executed.
struct tombstone {
	uint32_t epsn, msn, dqpn, ifindex;
	host_addr src, dst;
	uint64_t until_ns;
};

struct wire {
	std::mutex lock;
	std::unordered_map<uint32_t, tombstone> graves; // Under lock
	uint64_t linger_until = 0;			 // Under lock
	std::atomic<bool> exiting{false};
	bool tried = false;
	std::atomic<bool> up{false};
	// The host's UDP port (docs/rocev2.md, "Who owns the wire"): the
	// process that holds it receives every packet to the host and
	// forwards those for other processes' QPs to them.  Set by the
	// receive thread (at open, or when it takes the port over), read by
	// it alone.
	int fd4 = -1, fd6 = -1;
	uint16_t port = rv::kUdpPort;
	// A process that did not get the port sends from sockets of its own
	// (any source port will do) and receives what the owner forwards.
	int efd4 = -1, efd6 = -1;
	uint16_t eport4 = 0, eport6 = 0;
	int ufd = -1; // Forwarded packets in, and the owner's forwards out
	fabric *fab = nullptr; // Whose registry says which process owns a QP
	unsigned netdev_mtu = 1500;
	uint32_t ifindex = 0;
	std::unordered_map<uint32_t, std::shared_ptr<qp_wire>> qps;
	// QPs with WRITEs in flight or completions to make (under lock, taken
	// after a qp_wire's m): the receive thread wakes every millisecond
	// while there are any, for their timers.
	std::set<std::shared_ptr<qp_wire>> flying;
	int wake_fd = -1; // An eventfd: the first flight wakes the receive thread
	// The port's counters in the fabric's registry (sv_wire_counters),
	// shared by the host's processes; a private block until a device opens.
	sv_wire_counters own{};
	sv_wire_counters *n = &own;
	// Fault injection (SOFTVERBS_ROCEV2_DROP: percent of packets sent that
	// are dropped instead), for the loss tests.
	double drop_pct = 0;
	double dup_pct = 0;	// SOFTVERBS_ROCEV2_DUP: sent twice
	double reorder_pct = 0; // SOFTVERBS_ROCEV2_REORDER: sent after the next one
	// UDP segmentation offload for IPv6 bursts (UDP_SEGMENT; off by
	// SOFTVERBS_ROCEV2_GSO=0, or for good once the kernel refuses it),
	// and coalesced receives (UDP_GRO), both described in docs/rocev2.md.
	std::atomic<bool> gso6{true};
	bool gro = true;
	int rcvbuf = 0; // What the kernel gave the port's socket (SO_RCVBUF)
	// SOFTVERBS_PCAP: every packet sent and received, as a capture.
	rv::pcap_writer *pcap = nullptr;
	std::mutex rng_lock;
	std::mt19937_64 rng{std::random_device{}()};
};

wire &W()
{
	static wire *w = new wire; // Lives as long as the process: its thread uses it
	return *w;
}

void count(uint64_t sv_wire_counters::*field)
{
	__atomic_fetch_add(&(W().n->*field), 1, __ATOMIC_RELAXED);
}

std::shared_ptr<qp_wire> find_wire(uint32_t qpn)
{
	wire &w = W();
	std::lock_guard<std::mutex> g(w.lock);
	auto it = w.qps.find(qpn);
	return it == w.qps.end() ? nullptr : it->second;
}

uint32_t mtu_bytes(uint32_t mtu_enum)
{
	return mtu_enum >= IBV_MTU_256 && mtu_enum <= IBV_MTU_4096 ? 128u << mtu_enum : 1024;
}

// The largest IB MTU whose packets fit the interface's MTU.
uint32_t netdev_pmtu(unsigned netdev_mtu, bool v4)
{
	size_t overhead = (v4 ? rv::kIpv4HdrLen : rv::kIpv6HdrLen) + rv::kUdpHdrLen + rv::kBthLen +
			  rv::kRethLen + rv::kImmDtLen + rv::kIcrcLen;
	uint32_t best = 256;
	for (uint32_t m = 256; m <= 4096; m <<= 1)
		if (m + overhead <= netdev_mtu)
			best = m;
	return best;
}

uint64_t wall_ns()
{
	timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return static_cast<uint64_t>(ts.tv_sec) * 1000000000ULL + static_cast<uint64_t>(ts.tv_nsec);
}

// The source port of what this process sends (the ICRC covers it).
uint16_t tx_port(bool v4)
{
	wire &w = W();
	if (v4)
		return w.efd4 >= 0 ? w.eport4 : w.port;
	return w.efd6 >= 0 ? w.eport6 : w.port;
}

// The IP and UDP headers of what this process sends from src to dst, as
// the ICRC and the capture see them.
rv::ip_info tx_ip(const host_addr &src, const host_addr &dst)
{
	rv::ip_info ip;
	ip.v6 = !dst.v4;
	memcpy(ip.src, src.ip, 16);
	memcpy(ip.dst, dst.ip, 16);
	ip.sport = tx_port(dst.v4);
	ip.dport = W().port;
	return ip;
}

// The loss knobs' verdict on a packet about to be sent.
enum class fault { none, drop, duplicate, hold };

fault fault_for()
{
	wire &w = W();
	if (w.drop_pct <= 0 && w.dup_pct <= 0 && w.reorder_pct <= 0)
		return fault::none;
	std::lock_guard<std::mutex> g(w.rng_lock);
	double x = std::uniform_real_distribution<double>(0, 100)(w.rng);
	if (x < w.drop_pct)
		return fault::drop;
	if (x < w.drop_pct + w.dup_pct)
		return fault::duplicate;
	if (x < w.drop_pct + w.dup_pct + w.reorder_pct)
		return fault::hold;
	return fault::none;
}

void transmit(const host_addr &src, const host_addr &dst, uint32_t ifindex, const uint8_t *buf,
	      size_t len);

// A packet the reorder knob holds back: it goes out after the next packet
// this process sends, or when the receive thread finds it held for 2 ms.
struct held_packet {
	std::mutex lock;
	bool full = false;
	host_addr src, dst;
	uint32_t ifindex = 0;
	std::vector<uint8_t> bytes;
	uint64_t since = 0;
};

held_packet &held()
{
	static held_packet *h = new held_packet;
	return *h;
}

// Sends the held packet, if any (and, with max_age, only if it is older).
void release_held(uint64_t max_age = 0)
{
	held_packet &h = held();
	std::vector<uint8_t> bytes;
	host_addr src, dst;
	uint32_t ifindex;
	{
		std::lock_guard<std::mutex> g(h.lock);
		if (!h.full || (max_age && now_ns() - h.since < max_age))
			return;
		h.full = false;
		bytes.swap(h.bytes);
		src = h.src;
		dst = h.dst;
		ifindex = h.ifindex;
	}
	transmit(src, dst, ifindex, bytes.data(), bytes.size());
}

// Sends the packet in buf (len bytes, the ICRC not yet there: room for it
// after) from src to dst, through the loss knobs.
void send_packet(const host_addr &src, const host_addr &dst, uint32_t ifindex, uint8_t *buf,
		 size_t len)
{
	rv::ip_info ip = tx_ip(src, dst);
	rv::put_icrc(buf + len, rv::icrc(ip, buf, len));
	len += rv::kIcrcLen;
	switch (fault_for()) {
	case fault::drop:
		count(&sv_wire_counters::drop_injected);
		return;
	case fault::duplicate:
		transmit(src, dst, ifindex, buf, len);
		break;
	case fault::hold: {
		held_packet &h = held();
		std::lock_guard<std::mutex> g(h.lock);
		if (!h.full) {
			h.full = true;
			h.src = src;
			h.dst = dst;
			h.ifindex = ifindex;
			h.bytes.assign(buf, buf + len);
			h.since = now_ns();
			return;
		}
		break;
	}
	case fault::none:
		break;
	}
	transmit(src, dst, ifindex, buf, len);
	release_held();
}

// Where a datagram from src to dst goes: the destination and the source
// address (IP_PKTINFO / IPV6_PKTINFO) in mh, which points into sa4, sa6
// and cbuf; the socket to send it from (-1: none).
struct dest_msg {
	sockaddr_in sa4{};
	sockaddr_in6 sa6{};
	alignas(cmsghdr) char cbuf[CMSG_SPACE(sizeof(in6_pktinfo))] = {};
};

int address_msg(msghdr &mh, dest_msg &d, const host_addr &src, const host_addr &dst,
		uint32_t ifindex)
{
	wire &w = W();
	mh.msg_control = d.cbuf;
	if (dst.v4) {
		d.sa4.sin_family = AF_INET;
		d.sa4.sin_port = htons(w.port);
		memcpy(&d.sa4.sin_addr, dst.ip, 4);
		mh.msg_name = &d.sa4;
		mh.msg_namelen = sizeof(d.sa4);
		mh.msg_controllen = CMSG_SPACE(sizeof(in_pktinfo));
		cmsghdr *c = CMSG_FIRSTHDR(&mh);
		c->cmsg_level = IPPROTO_IP;
		c->cmsg_type = IP_PKTINFO;
		c->cmsg_len = CMSG_LEN(sizeof(in_pktinfo));
		in_pktinfo pi{};
		memcpy(&pi.ipi_spec_dst, src.ip, 4);
		memcpy(CMSG_DATA(c), &pi, sizeof(pi));
		return w.efd4 >= 0 ? w.efd4 : w.fd4;
	}
	d.sa6.sin6_family = AF_INET6;
	d.sa6.sin6_port = htons(w.port);
	memcpy(&d.sa6.sin6_addr, dst.ip, 16);
	if (link_local(dst))
		d.sa6.sin6_scope_id = ifindex;
	mh.msg_name = &d.sa6;
	mh.msg_namelen = sizeof(d.sa6);
	mh.msg_controllen = CMSG_SPACE(sizeof(in6_pktinfo));
	cmsghdr *c = CMSG_FIRSTHDR(&mh);
	c->cmsg_level = IPPROTO_IPV6;
	c->cmsg_type = IPV6_PKTINFO;
	c->cmsg_len = CMSG_LEN(sizeof(in6_pktinfo));
	in6_pktinfo pi{};
	memcpy(&pi.ipi6_addr, src.ip, 16);
	pi.ipi6_ifindex = link_local(dst) ? ifindex : 0;
	memcpy(CMSG_DATA(c), &pi, sizeof(pi));
	return w.efd6 >= 0 ? w.efd6 : w.fd6;
}

void capture(const host_addr &src, const host_addr &dst, const uint8_t *buf, size_t len)
{
	wire &w = W();
	rv::ip_info ip = tx_ip(src, dst);
	rv::pcap_write(w.pcap, ip, buf, len, wall_ns());
}

// One datagram on the wire (and in the capture: a packet the knob dropped
// never went out).
void transmit(const host_addr &src, const host_addr &dst, uint32_t ifindex, const uint8_t *buf,
	      size_t len)
{
	wire &w = W();
	if (w.pcap)
		capture(src, dst, buf, len);
	iovec iov{const_cast<uint8_t *>(buf), len};
	msghdr mh{};
	mh.msg_iov = &iov;
	mh.msg_iovlen = 1;
	dest_msg d;
	int fd = address_msg(mh, d, src, dst, ifindex);
	if (fd < 0)
		return;
	for (int tries = 0; tries < 1000; tries++) {
		if (sendmsg(fd, &mh, 0) >= 0) {
			count(&sv_wire_counters::tx_packets);
			return;
		}
		if (errno != ENOBUFS && errno != EAGAIN && errno != EINTR)
			break;
		sched_yield(); // The device queue is full: wait for room
	}
	count(&sv_wire_counters::drop_other);
}

// n packets (each with its ICRC) from src to dst in one system call
// (sendmmsg), as far as the socket takes them; the loss knobs are off.
// Over IPv6, consecutive packets of one length (the last of a run may be
// shorter) go as one datagram that the kernel cuts into them (UDP GSO):
// one trip through the stack for up to kGsoMax packets.  Not over IPv4:
// the kernel numbers the segments' identifications 0, 1, 2..., which the
// ICRC covers and a receiver cannot read (docs/rocev2.md).
void transmit_burst(const host_addr &src, const host_addr &dst, uint32_t ifindex,
		    uint8_t *const *bufs, const size_t *lens, unsigned n)
{
	wire &w = W();
	if (w.pcap)
		for (unsigned i = 0; i < n; i++)
			capture(src, dst, bufs[i], lens[i]);
	constexpr unsigned kMax = 32;
	constexpr size_t kGsoBytes = 65535 - 8; // An IPv6 payload, less the UDP header
	constexpr unsigned kGsoMax = 64;	// The kernel's UDP_MAX_SEGMENTS, at least
	constexpr size_t kCtl = CMSG_SPACE(sizeof(in6_pktinfo)) + CMSG_SPACE(sizeof(uint16_t));
	mmsghdr mm[kMax];
	iovec iov[kMax];
	unsigned segs[kMax];
	alignas(cmsghdr) char ctl[kMax][kCtl];
	dest_msg d;
	msghdr proto{};
	int fd = address_msg(proto, d, src, dst, ifindex);
	if (fd < 0)
		return;
	unsigned done = 0;
	int tries = 0;
	bool refused = false; // This destination refused a segmented send
	while (done < n) {
		bool gso = !dst.v4 && !refused && w.gso6.load(std::memory_order_relaxed);
		// Datagrams of this call: m of them, from packets done..done+used-1.
		unsigned m = 0, used = 0;
		while (m < kMax && done + used < n) {
			unsigned i = done + used, c = 1;
			iov[used] = {bufs[i], lens[i]};
			if (gso)
				while (c < kGsoMax && i + c < n && lens[i + c] <= lens[i] &&
				       (c + 1) * lens[i] <= kGsoBytes && lens[i + c - 1] == lens[i] &&
				       used + c < kMax) {
					iov[used + c] = {bufs[i + c], lens[i + c]};
					c++;
				}
			msghdr &mh = mm[m].msg_hdr;
			mh = proto;
			mh.msg_iov = &iov[used];
			mh.msg_iovlen = c;
			if (c > 1) {
				// Zeroed first: CMSG_NXTHDR of glibc before 2.36
				// reads the next header's length.
				memset(ctl[m], 0, kCtl);
				memcpy(ctl[m], proto.msg_control, proto.msg_controllen);
				mh.msg_control = ctl[m];
				mh.msg_controllen = kCtl;
				cmsghdr *cm = CMSG_FIRSTHDR(&mh);
				cm = CMSG_NXTHDR(&mh, cm);
				cm->cmsg_level = SOL_UDP;
				cm->cmsg_type = UDP_SEGMENT;
				cm->cmsg_len = CMSG_LEN(sizeof(uint16_t));
				uint16_t size = static_cast<uint16_t>(lens[i]);
				memcpy(CMSG_DATA(cm), &size, sizeof(size));
			}
			mm[m].msg_len = 0;
			segs[m++] = c;
			used += c;
		}
		int r = sendmmsg(fd, mm, m, 0);
		if (r > 0) {
			for (int i = 0; i < r; i++) {
				done += segs[i];
				for (unsigned k = 0; k < segs[i]; k++)
					count(&sv_wire_counters::tx_packets);
			}
			tries = 0;
			continue;
		}
		if (r < 0 && gso && segs[0] > 1 && (errno == EIO || errno == EINVAL || errno == ENOPROTOOPT)) {
			// Not segmented: one packet per datagram from here.  EIO is
			// the device's answer (no checksum offload), for good;
			// EINVAL this route's (a path MTU below the segment, an
			// address gone), for this burst only.
			if (errno != EINVAL)
				w.gso6.store(false, std::memory_order_relaxed);
			refused = true;
			continue;
		}
		if ((r < 0 && errno != ENOBUFS && errno != EAGAIN && errno != EINTR) || ++tries > 1000)
			break;
		sched_yield(); // The device queue is full: wait for room
	}
	for (; done < n; done++)
		count(&sv_wire_counters::drop_other);
}

// Writes h's headers, the payload (from a gather list at byte offset off,
// n bytes) and its pad into buf: the length without the ICRC.
size_t build_packet(uint8_t *buf, rv::pkt_hdrs &h, const iovec *iov, int niov, uint64_t off,
		    size_t n)
{
	h.b.pad = rv::pad_for(n);
	h.b.tver = rv::kTver;
	h.b.pkey = rv::kDefaultPkey;
	size_t len = rv::build_headers(h, buf, kMaxPkt);
	uint8_t *p = buf + len;
	for (int i = 0; i < niov && n; i++) {
		size_t l = iov[i].iov_len;
		if (off >= l) {
			off -= l;
			continue;
		}
		size_t c = std::min(l - off, n);
		memcpy(p, static_cast<const uint8_t *>(iov[i].iov_base) + off, c);
		p += c;
		n -= c;
		off = 0;
	}
	memset(p, 0, h.b.pad);
	return static_cast<size_t>(p - buf) + h.b.pad;
}

// Copies n bytes of src into a gather list at byte offset off.
void scatter_at(const iovec *iov, int niov, uint64_t off, const uint8_t *src, size_t n)
{
	for (int i = 0; i < niov && n; i++) {
		size_t l = iov[i].iov_len;
		if (off >= l) {
			off -= l;
			continue;
		}
		size_t c = std::min(l - off, n);
		memcpy(static_cast<uint8_t *>(iov[i].iov_base) + off, src, c);
		src += c;
		n -= c;
		off = 0;
	}
}

// The transport service's opcode bits (BTH opcode's top 3): RC, UC, XRC.
uint8_t service_of(ibv_qp_type t)
{
	switch (t) {
	case IBV_QPT_UC:
		return 0x20;
	case IBV_QPT_XRC_SEND:
	case IBV_QPT_XRC_RECV:
		return 0xa0;
	default:
		return 0x00;
	}
}

// Whether a QP of type t is reliable (acknowledged): RC and XRC.
bool reliable(ibv_qp_type t)
{
	return t == IBV_QPT_RC || t == IBV_QPT_XRC_SEND || t == IBV_QPT_XRC_RECV;
}

uint32_t packets_for(uint64_t len, uint32_t pmtu)
{
	return len ? static_cast<uint32_t>((len + pmtu - 1) / pmtu) : 1;
}

// ---------------------------------------------------------------------------
// Requester


uint8_t message_opcode(const message &m, uint32_t k, uint32_t n)
{
	bool first = k == 0, last = k + 1 == n;
	uint8_t op;
	if (m.write) {
		if (first && last)
			op = m.imm ? rv::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE : rv::RC_RDMA_WRITE_ONLY;
		else if (first)
			op = rv::RC_RDMA_WRITE_FIRST;
		else if (last)
			op = m.imm ? rv::RC_RDMA_WRITE_LAST_WITH_IMMEDIATE : rv::RC_RDMA_WRITE_LAST;
		else
			op = rv::RC_RDMA_WRITE_MIDDLE;
	} else if (first && last) {
		op = m.inv ? rv::RC_SEND_ONLY_WITH_INVALIDATE
			   : m.imm ? rv::RC_SEND_ONLY_WITH_IMMEDIATE : rv::RC_SEND_ONLY;
	} else if (first) {
		op = rv::RC_SEND_FIRST;
	} else if (last) {
		op = m.inv ? rv::RC_SEND_LAST_WITH_INVALIDATE
			   : m.imm ? rv::RC_SEND_LAST_WITH_IMMEDIATE : rv::RC_SEND_LAST;
	} else {
		op = rv::RC_SEND_MIDDLE;
	}
	return static_cast<uint8_t>(m.service | op);
}

// Sends packets from..to-1 of message m, whose first PSN is first; the
// last one sent asks for an ACK (the spec lets any packet ask).
// Packet k of the n of message m (first PSN first; the burst being sent
// ends at to) into buf: its length without the ICRC.
size_t message_packet(const qp_wire &qw, const message &m, uint32_t first, uint32_t k, uint32_t n,
		      uint32_t to, uint8_t *buf)
{
	rv::pkt_hdrs h{};
	h.b.opcode = message_opcode(m, k, n);
	h.b.dqpn = qw.dqpn;
	h.b.psn = psn_add(first, k);
	h.b.ackreq = k + 1 == to;
	h.b.se = m.se && k + 1 == n;
	h.r = {m.va, m.rkey, static_cast<uint32_t>(m.len)};
	h.imm_be = m.imm_be;
	h.ieth_rkey = m.inv_rkey;
	h.xrc_srqn = m.xrc_srqn;
	uint64_t off = static_cast<uint64_t>(k) * qw.pmtu;
	size_t chunk = static_cast<size_t>(std::min<uint64_t>(qw.pmtu, m.len - off));
	return build_packet(buf, h, m.iov, m.niov, off, m.len ? chunk : 0);
}

void send_message(qp_wire &qw, const message &m, uint32_t first, uint32_t from, uint32_t to)
{
	uint32_t n = packets_for(m.len, qw.pmtu);
	to = std::min(to, n);
	wire &w = W();
	if (from + 1 < to && w.drop_pct <= 0 && w.dup_pct <= 0 && w.reorder_pct <= 0) {
		// Without the loss knobs, 16 packets at a time in one sendmmsg.
		constexpr unsigned kBurst = 16;
		thread_local std::vector<uint8_t> room(kBurst * kMaxPkt);
		uint8_t *bufs[kBurst];
		size_t lens[kBurst];
		rv::ip_info ip = tx_ip(qw.src, qw.dst);
		for (uint32_t k = from; k < to;) {
			unsigned c = 0;
			for (; c < kBurst && k < to; c++, k++) {
				uint8_t *buf = room.data() + c * kMaxPkt;
				size_t len = message_packet(qw, m, first, k, n, to, buf);
				rv::put_icrc(buf + len, rv::icrc(ip, buf, len));
				bufs[c] = buf;
				lens[c] = len + rv::kIcrcLen;
			}
			transmit_burst(qw.src, qw.dst, qw.ifindex, bufs, lens, c);
		}
		return;
	}
	uint8_t buf[kMaxPkt];
	for (uint32_t k = from; k < to; k++) {
		size_t len = message_packet(qw, m, first, k, n, to, buf);
		send_packet(qw.src, qw.dst, qw.ifindex, buf, len);
	}
}

// The first PSN of a request of n packets: a retry of the request in
// flight (the same engine sequence number) keeps the PSNs of its first try.
uint32_t start_request(qp_wire &qw, uint32_t engine_psn, uint32_t n)
{
	if (engine_psn != UINT32_MAX && engine_psn == qw.cur_engine)
		return qw.cur_first;
	qw.inbox.clear(); // Answers to earlier requests: none is awaited now
	qw.cur_engine = engine_psn;
	qw.cur_done = 0;
	qw.cur_asked = 0;
	qw.cur_first = qw.next_psn;
	qw.next_psn = psn_add(qw.next_psn, n);
	return qw.cur_first;
}

// The next answer filed for the QP, or false at the deadline (or when the
// QP goes).
bool next_answer(qp_wire &qw, std::unique_lock<std::mutex> &g, uint64_t deadline,
		 std::vector<uint8_t> &out)
{
	while (qw.inbox.empty()) {
		if (qw.dead)
			return false;
		uint64_t now = now_ns();
		if (now >= deadline)
			return false;
		qw.cv.wait_for(g, std::chrono::nanoseconds(deadline - now));
	}
	out = std::move(qw.inbox.front());
	qw.inbox.pop_front();
	return true;
}

enum class outcome { ack, rnr, nak, lost };

ibv_wc_status nak_status(uint8_t code)
{
	switch (static_cast<rv::nak_code>(code)) {
	case rv::nak_code::invalid_request:
		return IBV_WC_REM_INV_REQ_ERR;
	case rv::nak_code::remote_access_error:
		return IBV_WC_REM_ACCESS_ERR;
	default:
		return IBV_WC_REM_OP_ERR;
	}
}

// Sends a SEND or WRITE of n packets from first and waits for its ACK:
// at most kWindow packets beyond the last acknowledged one are in flight,
// the last of each burst asking for an ACK.  A sequence NAK sends again
// from the PSN it names; a timeout after progress sends again from the
// first packet not acknowledged (progress renews the retries, as a
// requester's retry count is on an HCA); a timeout without progress is
// "lost", and the engine's retry goes on from the same place (cur_done).
// code receives a NAK's code.
outcome send_and_await(qp_wire &qw, std::unique_lock<std::mutex> &g, const message &m,
		       uint32_t first, uint32_t n, uint8_t &code)
{
	uint32_t last = psn_add(first, n - 1);
	uint64_t tmo = timeout_ns(qw.timeout);
	uint32_t sent = qw.cur_done;
	uint32_t at_timer = qw.cur_done; // Acknowledged when the timer was last set
	uint64_t deadline = now_ns() + tmo;
	int resends = 0;
	std::vector<uint8_t> pkt;
	for (;;) {
		uint32_t end = std::min(n, qw.cur_done + kWindow);
		if (sent < end) {
			send_message(qw, m, first, sent, end);
			sent = end;
		}
		if (!next_answer(qw, g, deadline, pkt)) {
			if (qw.dead || qw.cur_done == at_timer)
				return outcome::lost;
			// Progress since the timer was set: go on from the first
			// packet not acknowledged.
			count(&sv_wire_counters::retransmits);
			at_timer = qw.cur_done;
			sent = qw.cur_done;
			deadline = now_ns() + tmo;
			continue;
		}
		rv::parsed p;
		if (rv::parse(pkt.data(), pkt.size(), p) != rv::parse_err::ok ||
		    !(rv::opcode_headers(p.h.b.opcode) & rv::HDR_AETH))
			continue;
		int32_t from_first = psn_diff(p.h.b.psn, first);
		int32_t from_last = psn_diff(p.h.b.psn, last);
		uint8_t syn = p.h.a.syndrome;
		switch (rv::aeth_kind_of(syn)) {
		case rv::aeth_kind::ack:
			// Cumulative: an ACK of the last packet or later acknowledges
			// the whole message (never beyond what we sent).
			if (from_last >= 0 && psn_diff(p.h.b.psn, qw.next_psn) < 0)
				return outcome::ack;
			if (from_first >= 0 && static_cast<uint32_t>(from_first) < sent &&
			    static_cast<uint32_t>(from_first) + 1 > qw.cur_done)
				qw.cur_done = static_cast<uint32_t>(from_first) + 1;
			continue;
		case rv::aeth_kind::rnr_nak:
			if (from_first >= 0 && from_last <= 0) {
				qw.rnr_timer = rv::aeth_value(syn);
				qw.cur_done = 0; // The message is sent again whole
				return outcome::rnr;
			}
			continue;
		case rv::aeth_kind::nak:
			if (from_first < 0 || from_last > 0)
				continue;
			count(&sv_wire_counters::naks_received);
			if (rv::aeth_value(syn) == static_cast<uint8_t>(rv::nak_code::psn_seq_error)) {
				// Everything before the PSN it names arrived.
				auto k = static_cast<uint32_t>(from_first);
				qw.cur_done = std::max(qw.cur_done, k);
				if (++resends > kMaxResends + static_cast<int>(n / kWindow))
					return outcome::lost;
				count(&sv_wire_counters::retransmits);
				sent = k;
				deadline = now_ns() + tmo;
				continue;
			}
			code = rv::aeth_value(syn);
			return outcome::nak;
		default:
			continue;
		}
	}
}

// ---------------------------------------------------------------------------
// Pipelined WRITEs (qp_wire::flight)

// Packets of flights in flight beyond the first unacknowledged one: as
// many as half the receiver's socket buffer holds, taking ours for its
// (the same software asked the same kernel limits for it; the kernel
// counts a 4 KiB packet as up to 8 KiB), 512 at most.  Root gets 8 MiB,
// so 512 packets; a user the default net.core.rmem_max (208 KiB), so 26.
// A window beyond the buffer overflows it (losses and resends); one
// smaller than the bandwidth times the round trip leaves the wire idle
// (128 packets gave 750-810 MB/s on a veth pair where 512 gave 930-1130).
constexpr uint32_t kFlightMax = 512;

uint32_t flight_window(uint32_t pmtu)
{
	uint64_t per = uint64_t{pmtu} + 4096;
	uint64_t n = static_cast<uint64_t>(W().rcvbuf) / 2 / per;
	return static_cast<uint32_t>(std::clamp<uint64_t>(n, 8, kFlightMax));
}

// Set while the receive thread completes flights: flush_backlog, which it
// calls on an error, must not take the qp_wire's lock it holds.
thread_local bool tl_settling = false;

// Sends flight packets from snd_nxt on while the window allows; the last
// packet of a message, and the last one the window lets go, ask for an
// ACK.  Caller holds qw.m.
void flights_send(qp_wire &qw)
{
	uint32_t end = psn_add(qw.snd_una, flight_window(qw.pmtu));
	for (qp_wire::flight &f : qw.flights) {
		int32_t from = psn_diff(qw.snd_nxt, f.first);
		if (from >= static_cast<int32_t>(f.n))
			continue; // All of it out
		if (from < 0)
			from = 0;
		int32_t room = psn_diff(end, psn_add(f.first, static_cast<uint32_t>(from)));
		if (room <= 0)
			return;
		uint32_t to = std::min<uint32_t>(f.n, static_cast<uint32_t>(from + room));
		send_message(qw, f.m, f.first, static_cast<uint32_t>(from), to);
		qw.snd_nxt = psn_add(f.first, to);
		if (psn_diff(qw.snd_nxt, qw.snd_max) > 0)
			qw.snd_max = qw.snd_nxt;
		if (to < f.n)
			return;
	}
}

// Everything before PSN una is acknowledged: the flights it covers are
// done (in order), and the retries start over (progress).
void flights_acked(qp_wire &qw, uint32_t una)
{
	if (psn_diff(una, qw.snd_una) <= 0)
		return;
	qw.snd_una = una;
	if (psn_diff(qw.snd_nxt, una) < 0)
		qw.snd_nxt = una;
	qw.fl_retries = qw.retry_cnt;
	qw.fl_deadline = now_ns() + timeout_ns(qw.timeout);
	while (!qw.flights.empty()) {
		qp_wire::flight &f = qw.flights.front();
		if (psn_diff(una, psn_add(f.first, f.n)) < 0)
			break;
		qw.to_complete.push_back({f.sq_index, f.wr_id, f.flags, static_cast<uint32_t>(f.m.len),
					  IBV_WC_SUCCESS});
		qw.flights.pop_front();
	}
}

// The oldest flight fails with st (and the QP with it: the others are
// flushed when it completes).
void flights_fail(qp_wire &qw, ibv_wc_status st)
{
	if (qw.flights.empty())
		return;
	qp_wire::flight &f = qw.flights.front();
	qw.to_complete.push_back({f.sq_index, f.wr_id, f.flags, 0, st});
	qw.flights.clear();
}

// An ACK or NAK for a QP with flights (the receive thread, qw.m held).
void flights_answer(qp_wire &qw, const rv::parsed &p)
{
	if ((p.h.b.opcode & 0x1f) != rv::RC_ACKNOWLEDGE || (p.h.b.opcode & 0xe0) != service_of(qw.type))
		return;
	uint32_t q = p.h.b.psn;
	// Only PSNs we sent count: [snd_una, snd_max).
	if (psn_diff(q, qw.snd_una) < 0 || psn_diff(q, qw.snd_max) >= 0)
		return;
	uint8_t syn = p.h.a.syndrome;
	switch (rv::aeth_kind_of(syn)) {
	case rv::aeth_kind::ack: // Cumulative: q and everything before it
		flights_acked(qw, psn_add(q, 1));
		break;
	case rv::aeth_kind::nak:
		count(&sv_wire_counters::naks_received);
		flights_acked(qw, q); // Everything before the PSN it names arrived
		if (rv::aeth_value(syn) == static_cast<uint8_t>(rv::nak_code::psn_seq_error)) {
			count(&sv_wire_counters::retransmits);
			qw.snd_nxt = q; // Go back to it
		} else {
			flights_fail(qw, nak_status(rv::aeth_value(syn)));
		}
		break;
	default: // RNR: a plain WRITE takes no receive WQE; ignored, as a stray
		break;
	}
	flights_send(qw);
}

// The timer: no ACK for a timeout sends again from the first packet not
// acknowledged, retry_cnt times; then the oldest fails.
void flights_tick(qp_wire &qw, uint64_t now)
{
	if (qw.flights.empty() || now < qw.fl_deadline)
		return;
	if (!qw.fl_retries) {
		flights_fail(qw, IBV_WC_RETRY_EXC_ERR);
		return;
	}
	qw.fl_retries--;
	count(&sv_wire_counters::retransmits);
	qw.snd_nxt = qw.snd_una;
	qw.fl_deadline = now + timeout_ns(qw.timeout);
	flights_send(qw);
}

bool qp_in_error(const loop_qp *qp)
{
	sv_qp_rec &rec = qp->ctx->fab->reg()->qps[qp->slot];
	return std::atomic_ref<uint32_t>(rec.state).load(std::memory_order_acquire) == IBV_QPS_ERR;
}

// Completes the answered flights in order; the caller holds qw.m and the
// QP's sq_lock.  A QP in ERR (now, or since a completion here overflowed
// its CQ) flushes what is left.  WRs waiting behind the flights get the
// progress thread.
void settle_locked(qp_wire &qw, loop_qp *qp)
{
	tl_settling = true;
	for (const qp_wire::settled &c : qw.to_complete) {
		if (c.sq_index != qp->sq_cons)
			continue; // Flushed meanwhile
		send_wr w{};
		w.wr_id = c.wr_id;
		w.flags = c.flags;
		w.opcode = IBV_WR_RDMA_WRITE;
		w.sq_index = c.sq_index;
		complete(qp, w, c.st, c.len);
		sq_set_cons(qp, c.sq_index + 1);
		if (c.st != IBV_WC_SUCCESS || qp_in_error(qp)) {
			qw.need_flush = true;
			break;
		}
	}
	qw.to_complete.clear();
	if (qw.need_flush || qp_in_error(qp)) {
		// The QP is in ERR (complete() took it there on an error): the
		// rest completes flushed, and nothing more goes out.
		qw.flights.clear();
		qw.need_flush = false;
		flush_backlog(qp);
	}
	tl_settling = false;
	if (backlog_start(qp) != qp->sq_posted.load(std::memory_order_relaxed))
		progress_kick();
	// SQD waiting on these flights: drained now, if nothing else started.
	if (std::atomic_ref<uint32_t>(qp->ctx->fab->reg()->qps[qp->slot].state)
		    .load(std::memory_order_acquire) == IBV_QPS_SQD)
		qp_sq_drained(qp);
}

// Completes the answered flights in order, if the QP's sq_lock is free
// (never waited for: the QP's owner may hold it while it waits for this
// thread; it completes them itself when it lets go, rocev2_settle); else
// the receive thread tries again within a millisecond.
void flights_settle(qp_wire &qw)
{
	if (qw.to_complete.empty() && !qw.need_flush)
		return;
	loop_qp *qp = qw.lqp;
	if (qw.dead || !qp) {
		qw.to_complete.clear();
		qw.need_flush = false;
		return;
	}
	std::unique_lock<qlock> sl(qp->sq_lock, std::try_to_lock);
	if (sl.owns_lock())
		settle_locked(qw, qp);
}

// The receive thread's round of the QPs with flights: their timers and
// the completions sq_lock held up.
void flights_service()
{
	wire &w = W();
	std::vector<std::shared_ptr<qp_wire>> list;
	{
		std::lock_guard<std::mutex> g(w.lock);
		list.assign(w.flying.begin(), w.flying.end());
	}
	uint64_t now = now_ns();
	for (const std::shared_ptr<qp_wire> &qw : list) {
		std::lock_guard<std::mutex> g(qw->m);
		if (!qw->dead && qw->lqp && !qw->flights.empty() && qp_in_error(qw->lqp)) {
			// In ERR without sq_lock (a CQ overflow, a responder error):
			// nothing more goes out; the flush follows.
			qw->flights.clear();
			qw->need_flush = true;
		}
		if (!qw->dead)
			flights_tick(*qw, now);
		flights_settle(*qw);
		if (qw->dead ||
		    (qw->flights.empty() && qw->to_complete.empty() && !qw->need_flush)) {
			std::lock_guard<std::mutex> wg(w.lock);
			w.flying.erase(qw);
			rocev2_flying_qps.store(static_cast<uint32_t>(w.flying.size()),
						std::memory_order_relaxed);
		}
	}
}

int rv_resolve(loop_qp *qp, const tp_dest &d, peer &p)
{
	std::shared_ptr<qp_wire> qw = find_wire(qp->qpn);
	if (!qw || !W().up)
		return ENOENT; // Unreachable: the engine retries, then RETRY_EXC_ERR
	p = peer{};
	p.remote = true;
	p.qpn = d.qpn;
	p.rec.in_use = 1;
	p.rec.state = IBV_QPS_RTS;
	p.rec.qp_type = static_cast<uint8_t>(qp->type == IBV_QPT_XRC_SEND ? IBV_QPT_XRC_RECV
									   : qp->type);
	p.rec.access = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC;
	// XRC: the SRQ number travels in every request (XRCETH); the
	// responder checks it.
	if (d.xrc_srqn != kNoXrcSrq)
		p.xrc_srq = static_cast<int>(d.xrc_srqn & kPsn24);
	return 0;
}

void rv_mcast_members(loop_qp *, const send_wr &, bool, std::vector<peer> &)
{
}

int rv_resolve_key(loop_qp *, const peer &, uint32_t key, uint32_t, uint64_t addr, uint64_t len,
		   uint32_t, std::vector<rseg> &out, uint32_t *access)
{
	// The responder on the other host checks the key.
	rseg s{reinterpret_cast<void *>(addr), static_cast<size_t>(len), seg_kind::wire};
	s.key = key;
	out.push_back(std::move(s));
	if (access)
		*access = 0;
	return 0;
}

int rv_invalidate(loop_qp *, const peer &, uint32_t)
{
	return EINVAL; // A responder's call: never for a remote peer
}

// A UD datagram: one packet with a DETH, to the address its GRH names,
// unacknowledged (an address that is not a RoCE v2 one drops it, as a
// wire would).
tp_answer ud_deliver(qp_wire &qw, const peer &p, const tp_request &r)
{
	const send_wr &w = *r.w;
	host_addr src, dst;
	ibv_gid sgid{}, dgid{};
	if (r.grh_valid)
		grh_gids(*r.grh, sgid, dgid); // The GRH area is in RoCE v2's form
	if (!r.grh_valid || !gid_addr(sgid, src) || !gid_addr(dgid, dst) || src.v4 != dst.v4 ||
	    r.lb->len > qw.pmtu)
		return {tp_answer::kind::ack, IBV_WC_SUCCESS, 0};
	rv::pkt_hdrs h{};
	h.b.opcode = w.opcode == IBV_WR_SEND_WITH_IMM ? rv::UD_SEND_ONLY_WITH_IMMEDIATE
						      : rv::UD_SEND_ONLY;
	h.b.se = w.flags & IBV_SEND_SOLICITED;
	h.b.dqpn = p.qpn & kPsn24;
	h.b.psn = qw.next_psn;
	qw.next_psn = psn_add(qw.next_psn, 1);
	h.d = {r.qkey, r.src_qpn & kPsn24};
	h.imm_be = w.imm_data;
	uint8_t buf[kMaxPkt];
	size_t len = build_packet(buf, h, r.lb->iov.data(), static_cast<int>(r.lb->iov.size()), 0,
				  static_cast<size_t>(r.lb->len));
	send_packet(src, dst, W().ifindex, buf, len);
	return {tp_answer::kind::ack, IBV_WC_SUCCESS, static_cast<uint32_t>(r.lb->len)};
}

tp_answer rv_deliver(loop_qp *qp, const peer &p, const tp_request &r)
{
	std::shared_ptr<qp_wire> qw = find_wire(qp->qpn);
	if (!qw)
		return {tp_answer::kind::lost, IBV_WC_SUCCESS, 0};
	std::unique_lock<std::mutex> g(qw->m);
	if (qp->type == IBV_QPT_UD)
		return ud_deliver(*qw, p, r);
	const send_wr &w = *r.w;
	message m{};
	m.service = service_of(qw->type);
	qw->cur_srqn = p.xrc_srq >= 0 ? static_cast<uint32_t>(p.xrc_srq) : 0;
	m.xrc_srqn = qw->cur_srqn;
	m.write = w.opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
	m.imm = w.opcode == IBV_WR_SEND_WITH_IMM || w.opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
	m.inv = w.opcode == IBV_WR_SEND_WITH_INV;
	m.se = w.flags & IBV_SEND_SOLICITED;
	m.imm_be = w.imm_data;
	m.inv_rkey = w.invalidate_rkey;
	m.va = w.remote_addr;
	m.rkey = w.rkey;
	m.iov = r.lb->iov.data();
	m.niov = static_cast<int>(r.lb->iov.size());
	m.len = r.lb->len;
	if (m.len > kMaxMessage)
		return {tp_answer::kind::nak, IBV_WC_LOC_LEN_ERR, 0};
	uint32_t n = packets_for(m.len, qw->pmtu);
	uint32_t first = start_request(*qw, r.psn, n);
	if (qw->type == IBV_QPT_UC) { // Unacknowledged: done once sent
		send_message(*qw, m, first, 0, n);
		return {tp_answer::kind::ack, IBV_WC_SUCCESS, static_cast<uint32_t>(m.len)};
	}
	uint8_t code = 0;
	switch (send_and_await(*qw, g, m, first, n, code)) {
	case outcome::ack:
		return {tp_answer::kind::ack, IBV_WC_SUCCESS, static_cast<uint32_t>(m.len)};
	case outcome::rnr:
		return {tp_answer::kind::rnr, IBV_WC_SUCCESS, 0};
	case outcome::nak:
		return {tp_answer::kind::nak, nak_status(code), 0};
	case outcome::lost:
		break;
	}
	return {tp_answer::kind::lost, IBV_WC_SUCCESS, 0};
}

// An errno for the engine from a NAK's code: run_rdma and run_atomic
// complete EINVAL with REM_INV_REQ_ERR, EREMOTEIO with REM_OP_ERR, and
// anything else with REM_ACCESS_ERR (transport.h).
int nak_errno(uint8_t code)
{
	switch (static_cast<rv::nak_code>(code)) {
	case rv::nak_code::invalid_request:
		return EINVAL;
	case rv::nak_code::remote_access_error:
		return EACCES;
	default:
		return EREMOTEIO;
	}
}

uint64_t iov_bytes(const iovec *iov, int n)
{
	uint64_t t = 0;
	for (int i = 0; i < n; i++)
		t += iov[i].iov_len;
	return t;
}

int rdma_write(qp_wire &qw, std::unique_lock<std::mutex> &g, const tp_move &op)
{
	message m{};
	m.service = service_of(qw.type);
	m.xrc_srqn = qw.cur_srqn;
	m.write = true;
	m.va = reinterpret_cast<uint64_t>(op.remote[0].base);
	m.rkey = op.remote[0].key;
	m.iov = op.local;
	m.niov = op.nlocal;
	m.len = iov_bytes(op.local, op.nlocal);
	if (m.len > kMaxMessage)
		return EINVAL;
	uint32_t n = packets_for(m.len, qw.pmtu);
	uint32_t first = start_request(qw, op.psn, n);
	if (qw.type == IBV_QPT_UC) {
		send_message(qw, m, first, 0, n);
		return 0;
	}
	uint8_t code = 0;
	switch (send_and_await(qw, g, m, first, n, code)) {
	case outcome::ack:
		return 0;
	case outcome::nak:
		return nak_errno(code);
	default:
		return ETIMEDOUT;
	}
}

void send_read_request(qp_wire &qw, uint32_t psn, uint64_t va, uint32_t rkey, uint64_t len)
{
	uint8_t buf[kMaxPkt];
	rv::pkt_hdrs h{};
	h.b.opcode = static_cast<uint8_t>(service_of(qw.type) | rv::RC_RDMA_READ_REQUEST);
	h.xrc_srqn = qw.cur_srqn;
	h.b.dqpn = qw.dqpn;
	h.b.psn = psn;
	h.b.ackreq = true;
	h.r = {va, rkey, static_cast<uint32_t>(len)};
	size_t n = build_packet(buf, h, nullptr, 0, 0, 0);
	send_packet(qw.src, qw.dst, qw.ifindex, buf, n);
}

// An RDMA READ of n response packets, asked for in requests of at most
// kWindow packets each (PSN first + k, address va + k * pmtu), so that no
// burst outruns the receiver and a loss costs at most one request's worth.
// A gap in the responses asks again from the first missing packet, once
// per gap; a timeout after progress does too; a timeout without progress
// is "lost", and the engine's retry goes on from the packets placed
// (cur_done).
int rdma_read(qp_wire &qw, std::unique_lock<std::mutex> &g, const tp_move &op)
{
	uint64_t va = reinterpret_cast<uint64_t>(op.remote[0].base);
	uint32_t rkey = op.remote[0].key;
	uint64_t len = iov_bytes(op.local, op.nlocal);
	if (len > kMaxMessage)
		return EINVAL;
	uint32_t n = packets_for(len, qw.pmtu);
	uint32_t first = start_request(qw, op.psn, n);
	uint32_t &got = qw.cur_done;	    // Response packets placed, in order
	uint32_t &asked_end = qw.cur_asked; // The packets asked for: [.., asked_end)
	uint32_t gap_at = UINT32_MAX; // Where the last gap asked again
	uint32_t at_timer = got;
	uint64_t tmo = timeout_ns(qw.timeout);
	uint64_t deadline = now_ns() + tmo;
	int naks = 0;
	std::vector<uint8_t> pkt;
	// Asks for packets [from, to).  Asking again (from inside what was
	// asked) never goes beyond it: the responder moved its expected PSN by
	// the request it executed, and a duplicate that reached further would
	// answer PSNs it does not expect yet.
	auto ask = [&](uint32_t from, uint32_t to) {
		uint64_t off = static_cast<uint64_t>(from) * qw.pmtu;
		uint64_t l = std::min<uint64_t>(static_cast<uint64_t>(to - from) * qw.pmtu, len - off);
		send_read_request(qw, psn_add(first, from), va + off, rkey, l);
	};
	auto ask_again = [&] { ask(got, std::max(asked_end, got + 1)); };
	if (got < asked_end) // A retry of this READ: what is missing, as asked before
		ask_again();
	while (got < n) {
		if (asked_end <= got) {
			asked_end = std::min(n, got + kWindow);
			ask(got, asked_end);
		}
		if (!next_answer(qw, g, deadline, pkt)) {
			if (qw.dead || got == at_timer)
				return ETIMEDOUT;
			count(&sv_wire_counters::retransmits);
			at_timer = got;
			ask_again();
			deadline = now_ns() + tmo;
			continue;
		}
		rv::parsed p;
		if (rv::parse(pkt.data(), pkt.size(), p) != rv::parse_err::ok)
			continue;
		int32_t k = psn_diff(p.h.b.psn, first);
		if (k < 0 || k >= static_cast<int32_t>(n))
			continue;
		uint8_t opc = p.h.b.opcode;
		if ((opc & 0xe0) != service_of(qw.type))
			continue;
		opc &= 0x1f;
		if (opc == rv::RC_ACKNOWLEDGE) {
			uint8_t syn = p.h.a.syndrome;
			if (rv::aeth_kind_of(syn) != rv::aeth_kind::nak)
				continue;
			count(&sv_wire_counters::naks_received);
			if (rv::aeth_value(syn) == static_cast<uint8_t>(rv::nak_code::psn_seq_error)) {
				if (++naks > kMaxResends)
					return ETIMEDOUT;
				count(&sv_wire_counters::retransmits);
				ask_again();
				deadline = now_ns() + tmo;
				continue;
			}
			return nak_errno(rv::aeth_value(syn));
		}
		if (opc < rv::RC_RDMA_READ_RESPONSE_FIRST || opc > rv::RC_RDMA_READ_RESPONSE_ONLY)
			continue;
		if (static_cast<uint32_t>(k) != got) {
			// A response packet was lost: ask again from the first
			// missing one (the responder answers a duplicate READ again),
			// once for this gap.
			if (static_cast<uint32_t>(k) > got && gap_at != got) {
				gap_at = got;
				count(&sv_wire_counters::retransmits);
				ask_again();
			}
			continue;
		}
		uint64_t off = static_cast<uint64_t>(got) * qw.pmtu;
		size_t want = static_cast<size_t>(std::min<uint64_t>(qw.pmtu, len - off));
		if (len && p.payload_len != want)
			continue; // Not this request's segmentation: dropped
		if (len)
			scatter_at(op.local, op.nlocal, off, p.payload, want);
		got++;
		deadline = now_ns() + tmo;
	}
	return 0;
}

int rv_move(loop_qp *qp, const peer &p, const tp_move *ops, size_t n, size_t *done)
{
	if (done)
		*done = 0;
	std::shared_ptr<qp_wire> qw = find_wire(qp->qpn);
	if (!qw)
		return ESRCH;
	std::unique_lock<std::mutex> g(qw->m);
	qw->cur_srqn = p.xrc_srq >= 0 ? static_cast<uint32_t>(p.xrc_srq) : 0;
	for (size_t i = 0; i < n; i++) {
		const tp_move &op = ops[i];
		if (op.nremote < 1 || op.remote[0].kind != seg_kind::wire)
			return EFAULT;
		int err = op.dir == xfer_dir::to_peer ? rdma_write(*qw, g, op) : rdma_read(*qw, g, op);
		if (err)
			return err;
		if (done)
			*done = i + 1;
	}
	return 0;
}

int rv_atomic(loop_qp *qp, const peer &peer_, tp_atomic &op)
{
	if (op.op == tp_atomic::kind::write)
		return EINVAL; // ATOMIC WRITE does not go over the wire yet (docs/rocev2.md)
	std::shared_ptr<qp_wire> qw = find_wire(qp->qpn);
	if (!qw)
		return ESRCH;
	std::unique_lock<std::mutex> g(qw->m);
	uint32_t first = start_request(*qw, op.psn, 1);
	rv::pkt_hdrs h{};
	h.b.opcode = static_cast<uint8_t>(
		service_of(qw->type) |
		(op.op == tp_atomic::kind::cmp_swap ? rv::RC_COMPARE_SWAP : rv::RC_FETCH_ADD));
	h.xrc_srqn = peer_.xrc_srq >= 0 ? static_cast<uint32_t>(peer_.xrc_srq) : 0;
	h.b.dqpn = qw->dqpn;
	h.b.psn = first;
	h.b.ackreq = true;
	h.at.va = op.addr;
	h.at.rkey = op.rkey;
	if (op.op == tp_atomic::kind::cmp_swap) {
		h.at.swap_add = op.swap;
		h.at.compare = op.compare_add;
	} else {
		h.at.swap_add = op.compare_add;
	}
	uint8_t buf[kMaxPkt];
	size_t len = build_packet(buf, h, nullptr, 0, 0, 0);
	send_packet(qw->src, qw->dst, qw->ifindex, buf, len);
	uint64_t deadline = now_ns() + timeout_ns(qw->timeout);
	std::vector<uint8_t> pkt;
	while (next_answer(*qw, g, deadline, pkt)) {
		rv::parsed p;
		if (rv::parse(pkt.data(), pkt.size(), p) != rv::parse_err::ok || p.h.b.psn != first)
			continue;
		if ((p.h.b.opcode & 0xe0) != service_of(qw->type))
			continue;
		if ((p.h.b.opcode & 0x1f) == rv::RC_ATOMIC_ACKNOWLEDGE) {
			op.old = p.h.atomic_ack_orig;
			return 0;
		}
		if ((p.h.b.opcode & 0x1f) == rv::RC_ACKNOWLEDGE &&
		    rv::aeth_kind_of(p.h.a.syndrome) == rv::aeth_kind::nak) {
			count(&sv_wire_counters::naks_received);
			uint8_t code = rv::aeth_value(p.h.a.syndrome);
			if (code == static_cast<uint8_t>(rv::nak_code::psn_seq_error)) {
				count(&sv_wire_counters::retransmits);
				send_packet(qw->src, qw->dst, qw->ifindex, buf, len);
				continue;
			}
			return nak_errno(code);
		}
	}
	return ETIMEDOUT;
}

int rv_take_recv(loop_qp *, const peer &, std::vector<uint8_t> &, sv_recv_wqe *&, uint32_t &)
{
	return ENXIO; // A responder's call: never for a remote peer
}

int rv_post_cqe(loop_qp *, const peer &, sv_cqe &, bool, const tp_payload *)
{
	return ESRCH; // A responder's call: never for a remote peer
}

void rv_responder_error(loop_qp *, const peer &, ibv_event_type)
{
	// The responder on the other host moved its own QP to ERR.
}

tp_liveness rv_alive(loop_qp *qp, uint32_t, bool)
{
	// A host that vanished answers nothing: its WRs run out of retries.
	std::shared_ptr<qp_wire> qw = find_wire(qp->qpn);
	uint8_t timer = 0;
	if (qw) {
		std::lock_guard<std::mutex> g(qw->m);
		timer = qw->rnr_timer;
	}
	return {true, timer};
}

// ---------------------------------------------------------------------------
// Responder (the receive thread)

// The requesting QP the engine's responder runs on: its scratch lists and
// its cache of mapped queues.  One per context, used by the receive
// thread only; it never posts and is never in the registry.
loop_qp *proxy_for(loop_context *ctx)
{
	static std::unordered_map<loop_context *, std::unique_ptr<loop_qp>> proxies;
	auto &p = proxies[ctx];
	if (!p) {
		p = std::make_unique<loop_qp>();
		p->ctx = ctx;
		p->type = IBV_QPT_RC;
		p->deferred.reserve(kMaxDeferred + 1);
	}
	return p.get();
}

void send_aeth_to(const host_addr &src, const host_addr &dst, uint32_t ifindex, uint32_t dqpn,
		  uint32_t msn, uint8_t opcode, uint32_t psn, uint8_t syndrome, uint64_t orig)
{
	uint8_t buf[kMaxPkt];
	rv::pkt_hdrs h{};
	h.b.opcode = opcode;
	h.b.dqpn = dqpn;
	h.b.psn = psn;
	h.a.syndrome = syndrome;
	h.a.msn = msn & kPsn24;
	h.atomic_ack_orig = orig;
	size_t len = build_packet(buf, h, nullptr, 0, 0, 0);
	send_packet(src, dst, ifindex, buf, len);
}

// An ACK, NAK or atomic ACK (opcode: the RC one; the QP's service is ORed in).
void send_aeth(qp_wire &qw, uint8_t opcode, uint32_t psn, uint8_t syndrome, uint64_t orig = 0)
{
	send_aeth_to(qw.src, qw.dst, qw.ifindex, qw.dqpn, qw.msn,
		     static_cast<uint8_t>(service_of(qw.type) | opcode), psn, syndrome, orig);
}

void send_nak(qp_wire &qw, uint32_t psn, rv::nak_code code)
{
	if (!reliable(qw.type))
		return;
	count(&sv_wire_counters::naks_sent);
	send_aeth(qw, rv::RC_ACKNOWLEDGE, psn, rv::aeth_nak(code));
}

void send_ack(qp_wire &qw, uint32_t psn)
{
	if (!reliable(qw.type))
		return;
	send_aeth(qw, rv::RC_ACKNOWLEDGE, psn, rv::aeth_ack(rv::kAethNoCredits));
}

// The responder's view of one request packet.
struct request {
	const rv::parsed &p;
	loop_qp *proxy;
	peer &tp; // The local QP, resolved through the loop transport
};

void advance(qp_wire &qw)
{
	qw.epsn = psn_add(qw.epsn, 1);
	qw.nak_sent = false;
}

// A responder error: the QP goes to ERR (its owner hears ev) and the
// requester gets a NAK.
// The receive WQE a SEND took, completed as flushed: its QP is in ERR.
void flush_held(qp_wire &qw, const request &q)
{
	if (!qw.have_wqe)
		return;
	qw.have_wqe = false;
	const auto *wqe = reinterpret_cast<const sv_recv_wqe *>(qw.held_wqe.data());
	sv_cqe e{};
	e.wr_id = wqe->wr_id;
	e.status = IBV_WC_WR_FLUSH_ERR;
	e.opcode = IBV_WC_RECV;
	e.qp_num = q.tp.qpn;
	e.src_qp = q.tp.rec.dest_qpn;
	loop_transport_ops.post_cqe(q.proxy, q.tp, e, false, nullptr);
}

// A request the responder refuses.  RC: the QP goes to ERR (its owner
// hears ev) and the requester gets a NAK.  UC has neither: the message is
// dropped, and a WQE it took waits for the next one.
void fail(qp_wire &qw, const request &q, uint32_t psn, rv::nak_code code, ibv_event_type ev)
{
	qw.in_msg = false;
	qw.reasm.clear();
	if (!reliable(qw.type)) {
		count(&sv_wire_counters::drop_other);
		return;
	}
	loop_transport_ops.responder_error(q.proxy, q.tp, ev);
	flush_held(qw, q);
	send_nak(qw, psn, code);
}

// Runs a whole SEND or WRITE WITH IMMEDIATE through the engine's responder.
void run_message(qp_wire &qw, const request &q, ibv_wr_opcode opcode)
{
	const rv::pkt_hdrs &h = q.p.h;
	send_wr w{};
	w.opcode = opcode;
	w.imm_data = h.imm_be;
	w.invalidate_rkey = h.ieth_rkey;
	w.flags = h.b.se ? IBV_SEND_SOLICITED : 0;
	w.remote_addr = qw.w_va;
	w.rkey = qw.w_rkey;
	local_buf lb;
	if (!qw.reasm.empty())
		lb.iov.push_back({qw.reasm.data(), qw.reasm.size()});
	lb.len = qw.reasm.size();
	tp_request r{};
	r.w = &w;
	r.lb = &lb;
	r.psn = h.b.psn;
	r.src_qpn = q.tp.rec.dest_qpn;
	tp_answer a;
	if (qw.have_wqe) {
		qw.have_wqe = false;
		a = respond_taken(loop_transport_ops, q.proxy, q.tp, r,
				  reinterpret_cast<const sv_recv_wqe *>(qw.held_wqe.data()),
				  qw.held_pdn);
	} else {
		a = respond(loop_transport_ops, q.proxy, q.tp, r);
	}
	qw.in_msg = false;
	switch (a.k) {
	case tp_answer::kind::ack:
		qw.msn++;
		advance(qw);
		qw.reasm.clear();
		send_ack(qw, h.b.psn);
		return;
	case tp_answer::kind::rnr:
		// No receive WQE: the requester sends the message again from its
		// first packet after our RNR timer (UC: the message is dropped).
		if (reliable(qw.type)) {
			qw.epsn = qw.msg_first;
			qw.nak_sent = false;
			send_aeth(qw, rv::RC_ACKNOWLEDGE, qw.msg_first,
				  rv::aeth_rnr(q.tp.rec.min_rnr_timer & 31));
		} else {
			advance(qw);
		}
		qw.reasm.clear();
		return;
	case tp_answer::kind::nak:
		qw.reasm.clear();
		send_nak(qw, h.b.psn,
			 a.status == IBV_WC_REM_ACCESS_ERR ? rv::nak_code::remote_access_error
			 : a.status == IBV_WC_REM_INV_REQ_ERR ? rv::nak_code::invalid_request
							       : rv::nak_code::remote_op_error);
		return;
	case tp_answer::kind::lost:
		// Not executed: a retry of the whole message is no duplicate.
		qw.epsn = qw.msg_first;
		qw.nak_sent = false;
		qw.reasm.clear();
		return;
	}
}

// The rights on [va, va + len) under rkey, checked (segments in the proxy's
// scratch): 0, or the errno of the loop transport's key check.
int check_range(const request &q, uint32_t rkey, uint64_t va, uint64_t len, uint32_t right)
{
	// The QP's right whatever the length (as the loop transport's
	// run_rdma), the key only for bytes.
	if (!(q.tp.rec.access & right))
		return EACCES;
	if (!len)
		return 0;
	std::vector<rseg> &riov = q.proxy->resp_riov;
	riov.clear();
	uint32_t acc = 0;
	return loop_transport_ops.resolve_key(q.proxy, q.tp, rkey, q.tp.rec.pdn, va, len, right,
					      riov, &acc);
}

// One WRITE packet's payload, placed at va in the target MR.
int place_write(const request &q, uint32_t rkey, uint64_t va, const uint8_t *data, size_t n)
{
	if (!n)
		return 0;
	int err = check_range(q, rkey, va, n, IBV_ACCESS_REMOTE_WRITE);
	if (err)
		return err;
	std::vector<rseg> &riov = q.proxy->resp_riov;
	iovec v{const_cast<uint8_t *>(data), n};
	tp_move m{&v, 1, riov.data(), static_cast<int>(riov.size()), xfer_dir::to_peer, false, false};
	return loop_transport_ops.move(q.proxy, q.tp, &m, 1, nullptr);
}

// An RDMA READ request: the data goes back as READ RESPONSE packets from
// the request's PSN on.  fresh: not a duplicate (the expected PSN moves).
// A duplicate that fails (its MR gone since) is dropped, counted: it
// changes nothing, as an answer to a request already answered.
void run_read(qp_wire &qw, const request &q, bool fresh)
{
	const rv::pkt_hdrs &h = q.p.h;
	uint32_t psn = h.b.psn;
	uint64_t va = h.r.va, len = h.r.dma_len;
	auto refuse = [&](rv::nak_code code, ibv_event_type ev) {
		if (fresh)
			fail(qw, q, psn, code, ev);
		else
			count(&sv_wire_counters::drop_other);
	};
	if (len > kMaxMsgSize) {
		refuse(rv::nak_code::invalid_request, IBV_EVENT_QP_REQ_ERR);
		return;
	}
	uint32_t n = packets_for(len, qw.pmtu);
	std::vector<rseg> &riov = q.proxy->resp_riov;
	auto read_range = [&](uint64_t at, uint8_t *dst, size_t c) {
		riov.clear();
		uint32_t acc = 0;
		int err = loop_transport_ops.resolve_key(q.proxy, q.tp, h.r.rkey, q.tp.rec.pdn, at,
							 c, IBV_ACCESS_REMOTE_READ, riov, &acc);
		if (!err) {
			iovec v{dst, c};
			tp_move m{&v, 1, riov.data(), static_cast<int>(riov.size()),
				  xfer_dir::from_peer, false, false};
			err = loop_transport_ops.move(q.proxy, q.tp, &m, 1, nullptr);
		}
		return err;
	};
	// The whole range first: a key, right or range fault NAKs before any
	// data goes.
	if (!(q.tp.rec.access & IBV_ACCESS_REMOTE_READ) ||
	    (len && loop_transport_ops.resolve_key(q.proxy, q.tp, h.r.rkey, q.tp.rec.pdn, va, len,
						   IBV_ACCESS_REMOTE_READ, riov, nullptr))) {
		refuse(rv::nak_code::remote_access_error, IBV_EVENT_QP_ACCESS_ERR);
		return;
	}
	if (fresh) {
		qw.epsn = psn_add(qw.epsn, n);
		qw.nak_sent = false;
		qw.msn++;
		qw.reads[qw.read_next++ % 16] = {psn, n, h.r.rkey, va, len, true};
	}
	uint8_t data[4096];
	uint8_t buf[kMaxPkt];
	for (uint32_t k = 0; k < n; k++) {
		uint64_t off = static_cast<uint64_t>(k) * qw.pmtu;
		size_t c = static_cast<size_t>(std::min<uint64_t>(qw.pmtu, len - off));
		if (c && read_range(va + off, data, c)) {
			refuse(rv::nak_code::remote_access_error, IBV_EVENT_QP_ACCESS_ERR);
			return;
		}
		rv::pkt_hdrs r{};
		r.b.opcode = static_cast<uint8_t>(
			service_of(qw.type) | (n == 1	      ? rv::RC_RDMA_READ_RESPONSE_ONLY
					       : k == 0	      ? rv::RC_RDMA_READ_RESPONSE_FIRST
					       : k + 1 == n ? rv::RC_RDMA_READ_RESPONSE_LAST
							    : rv::RC_RDMA_READ_RESPONSE_MIDDLE));
		r.b.dqpn = qw.dqpn;
		r.b.psn = psn_add(psn, k);
		r.a.syndrome = rv::aeth_ack(rv::kAethNoCredits);
		r.a.msn = qw.msn & kPsn24;
		iovec v{data, c};
		size_t l = build_packet(buf, r, &v, 1, 0, c);
		send_packet(qw.src, qw.dst, qw.ifindex, buf, l);
	}
}

void run_atomic_req(qp_wire &qw, const request &q)
{
	const rv::pkt_hdrs &h = q.p.h;
	tp_atomic op{};
	op.rkey = h.at.rkey;
	op.addr = h.at.va;
	op.right = IBV_ACCESS_REMOTE_ATOMIC;
	if ((h.b.opcode & 0x1f) == rv::RC_COMPARE_SWAP) {
		op.op = tp_atomic::kind::cmp_swap;
		op.compare_add = h.at.compare;
		op.swap = h.at.swap_add;
	} else {
		op.op = tp_atomic::kind::fetch_add;
		op.compare_add = h.at.swap_add;
	}
	int err = loop_transport_ops.atomic(q.proxy, q.tp, op);
	if (err) {
		if (err == EINVAL)
			fail(qw, q, h.b.psn, rv::nak_code::invalid_request, IBV_EVENT_QP_REQ_ERR);
		else
			fail(qw, q, h.b.psn, rv::nak_code::remote_access_error,
			     IBV_EVENT_QP_ACCESS_ERR);
		return;
	}
	qw.atomics[qw.atomic_next++ % 16] = {h.b.psn, op.old, true};
	qw.msn++;
	advance(qw);
	send_aeth(qw, rv::RC_ATOMIC_ACKNOWLEDGE, h.b.psn, rv::aeth_ack(rv::kAethNoCredits), op.old);
}

// A request whose PSN is before the expected one: answered, not executed
// again (a READ is read again; an atomic's answer comes from the cache).
void duplicate(qp_wire &qw, const request &q)
{
	const rv::pkt_hdrs &h = q.p.h;
	uint8_t low = h.b.opcode & 0x1f;
	if (low == rv::RC_RDMA_READ_REQUEST) {
		// Read again, if it stays within what was executed: its answers
		// must not take PSNs the responder does not expect yet, and it
		// must ask again for (part of) a READ executed lately, from a PSN
		// of its responses on, with its key: anything else (a SEND's
		// PSN, another key or range, a READ too old) is no request of
		// this connection's, and is dropped.
		uint32_t n = packets_for(h.r.dma_len, qw.pmtu);
		if (h.r.dma_len > kMaxMsgSize || psn_diff(psn_add(h.b.psn, n), qw.epsn) > 0) {
			count(&sv_wire_counters::drop_other);
			return;
		}
		uint64_t va = h.r.va, len = h.r.dma_len;
		for (const qp_wire::read_done &r : qw.reads)
			if (r.valid && r.rkey == h.r.rkey && psn_diff(h.b.psn, r.psn) >= 0 &&
			    psn_diff(h.b.psn, psn_add(r.psn, r.n)) < 0 && va >= r.va &&
			    len <= r.len && va - r.va <= r.len - len) {
				run_read(qw, q, false);
				return;
			}
		count(&sv_wire_counters::drop_other);
		return;
	}
	if (low == rv::RC_COMPARE_SWAP || low == rv::RC_FETCH_ADD) {
		for (const qp_wire::replay &r : qw.atomics)
			if (r.valid && r.psn == h.b.psn) {
				send_aeth(qw, rv::RC_ATOMIC_ACKNOWLEDGE, h.b.psn,
					  rv::aeth_ack(rv::kAethNoCredits), r.orig);
				return;
			}
		// Too old, or never executed: the requester's retries run out.
		count(&sv_wire_counters::drop_other);
		return;
	}
	if (h.b.ackreq)
		send_ack(qw, psn_add(qw.epsn, kPsn24)); // epsn - 1: everything before it
}

void respond_packet(qp_wire &qw, const rv::parsed &p)
{
	loop_qp *proxy = proxy_for(qw.ctx);
	const rv::pkt_hdrs &h = p.h;
	uint8_t op = h.b.opcode, low = op & 0x1f;
	bool rc = reliable(qw.type);
	bool xrc = qw.type == IBV_QPT_XRC_RECV;
	peer tp;
	int rerr = loop_transport_ops.resolve(proxy, {qw.qpn, 0, true,
						      xrc ? h.xrc_srqn : kNoXrcSrq},
					      tp);
	if (rerr == EINVAL && xrc && peer_receives(tp.rec)) {
		// XRC: the SRQ named is not in the target's domain.
		loop_transport_ops.responder_error(proxy, tp, IBV_EVENT_QP_REQ_ERR);
		send_nak(qw, h.b.psn, rv::nak_code::invalid_request);
		return;
	}
	// The QP is ours (it has a qp_wire here); an XRC target's SRQ may be
	// another process's of the domain (the loop transport copies to it).
	if (rerr || (!tp.self && !xrc) || !peer_receives(tp.rec)) {
		count(&sv_wire_counters::drop_other); // Not a QP of ours that receives (RESET, INIT, ERR)
		return;
	}
	request q{p, proxy, tp};
	if ((op & 0xe0) != service_of(qw.type)) {
		count(&sv_wire_counters::drop_other); // Another service's packet
		return;
	}
	note_comm_est(*proxy->ctx->fab, tp); // The first packet of a QP in RTR
	uint32_t psn = h.b.psn;
	int32_t d = psn_diff(psn, qw.epsn);
	bool starts = low == rv::RC_SEND_FIRST || low == rv::RC_SEND_ONLY ||
		      low == rv::RC_SEND_ONLY_WITH_IMMEDIATE || low == rv::RC_SEND_ONLY_WITH_INVALIDATE ||
		      low == rv::RC_RDMA_WRITE_FIRST || low == rv::RC_RDMA_WRITE_ONLY ||
		      low == rv::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE;
	if (rc) {
		if (d > 0) {
			// Beyond a gap: one NAK, until the expected PSN arrives.
			if (!qw.nak_sent) {
				qw.nak_sent = true;
				send_nak(qw, qw.epsn, rv::nak_code::psn_seq_error);
			}
			count(&sv_wire_counters::drop_other);
			return;
		}
		if (d < 0) {
			duplicate(qw, q);
			return;
		}
	} else if (d != 0) {
		// UC: packets were lost; the message in progress is gone, and a
		// new one may start here.
		qw.in_msg = false;
		qw.reasm.clear();
		qw.epsn = psn;
		if (!starts) {
			advance(qw);
			count(&sv_wire_counters::drop_other);
			return;
		}
	}
	bool send_op = low <= rv::RC_SEND_ONLY_WITH_IMMEDIATE ||
		       low == rv::RC_SEND_LAST_WITH_INVALIDATE ||
		       low == rv::RC_SEND_ONLY_WITH_INVALIDATE;
	bool write_op = low >= rv::RC_RDMA_WRITE_FIRST && low <= rv::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE;
	if (send_op || write_op) {
		bool first = starts;
		bool last = low == rv::RC_SEND_LAST || low == rv::RC_SEND_LAST_WITH_IMMEDIATE ||
			    low == rv::RC_SEND_LAST_WITH_INVALIDATE || low == rv::RC_SEND_ONLY ||
			    low == rv::RC_SEND_ONLY_WITH_IMMEDIATE ||
			    low == rv::RC_SEND_ONLY_WITH_INVALIDATE || low == rv::RC_RDMA_WRITE_LAST ||
			    low == rv::RC_RDMA_WRITE_LAST_WITH_IMMEDIATE ||
			    low == rv::RC_RDMA_WRITE_ONLY ||
			    low == rv::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE;
		if (first == qw.in_msg || (!first && qw.msg_write != write_op)) {
			// A FIRST inside a message, or a MIDDLE or LAST outside one
			// (or of the other kind): out of sequence.
			fail(qw, q, psn, rv::nak_code::invalid_request, IBV_EVENT_QP_REQ_ERR);
			return;
		}
		if (last ? p.payload_len > qw.pmtu : p.payload_len != qw.pmtu) {
			// FIRST and MIDDLE packets carry exactly the path MTU, a LAST
			// or ONLY no more.
			fail(qw, q, psn, rv::nak_code::invalid_request, IBV_EVENT_QP_REQ_ERR);
			return;
		}
		bool imm = low == rv::RC_RDMA_WRITE_LAST_WITH_IMMEDIATE ||
			   low == rv::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE;
		if (first) {
			qw.msg_write = write_op;
			qw.msg_first = psn;
			qw.reasm.clear();
			if (write_op) {
				// The whole range is checked now: nothing is collected or
				// placed for a key that does not cover it.
				qw.w_va = h.r.va;
				qw.w_rkey = h.r.rkey;
				qw.w_len = h.r.dma_len;
				qw.w_off = 0;
				if (h.r.dma_len > kMaxMsgSize) {
					fail(qw, q, psn, rv::nak_code::invalid_request,
					     IBV_EVENT_QP_REQ_ERR);
					return;
				}
				if (check_range(q, h.r.rkey, h.r.va, h.r.dma_len,
						IBV_ACCESS_REMOTE_WRITE)) {
					fail(qw, q, psn, rv::nak_code::remote_access_error,
					     IBV_EVENT_QP_ACCESS_ERR);
					return;
				}
			} else if (!qw.have_wqe) {
				// A SEND takes its receive WQE at its first packet (none:
				// RNR now, not after the whole message arrived).
				sv_recv_wqe *wqe = nullptr;
				int te = loop_transport_ops.take_recv(q.proxy, q.tp, qw.held_wqe,
								      wqe, qw.held_pdn);
				if (te == ENXIO) {
					// Our own queue out of reach (out of descriptors):
					// dropped, as if lost; the requester sends again.
					count(&sv_wire_counters::drop_other);
					return;
				}
				if (te) {
					if (rc) {
						qw.nak_sent = false;
						send_aeth(qw, rv::RC_ACKNOWLEDGE, psn,
							  rv::aeth_rnr(q.tp.rec.min_rnr_timer & 31));
					} else {
						advance(qw); // UC: the message is dropped
					}
					return;
				}
				qw.have_wqe = true;
				qw.held_room = 0;
				if (wqe->num_sge != SV_RECV_WQE_INVALID)
					for (uint32_t i = 0; i < wqe->num_sge; i++)
						qw.held_room += wqe->sge[i].length;
			}
			qw.in_msg = true;
		}
		// Collected: a SEND up to its WQE's room (one byte more is enough to
		// fail it), a WRITE within the range checked at its first packet.
		uint64_t room = write_op ? qw.w_len : qw.held_room + 1;
		ibv_wr_opcode send_opcode =
			(low == rv::RC_SEND_LAST_WITH_INVALIDATE || low == rv::RC_SEND_ONLY_WITH_INVALIDATE)
				? IBV_WR_SEND_WITH_INV
			: (low == rv::RC_SEND_LAST_WITH_IMMEDIATE || low == rv::RC_SEND_ONLY_WITH_IMMEDIATE)
				? IBV_WR_SEND_WITH_IMM
				: IBV_WR_SEND;
		if (qw.reasm.size() + p.payload_len > room) {
			if (write_op) {
				fail(qw, q, psn, rv::nak_code::invalid_request, IBV_EVENT_QP_REQ_ERR);
				return;
			}
			// Longer than its receive WQE: the engine's responder fails it
			// now (a length error at the receiver, an invalid request NAK).
			qw.reasm.insert(qw.reasm.end(), p.payload,
					p.payload + (room - qw.reasm.size()));
			run_message(qw, q, send_opcode);
			return;
		}
		qw.reasm.insert(qw.reasm.end(), p.payload, p.payload + p.payload_len);
		if (!last) {
			advance(qw);
			if (h.b.ackreq)
				send_ack(qw, psn);
			return;
		}
		if (!write_op) {
			run_message(qw, q, send_opcode);
		} else if (qw.reasm.size() != qw.w_len) {
			// Shorter than its RETH said.
			fail(qw, q, psn, rv::nak_code::invalid_request, IBV_EVENT_QP_REQ_ERR);
		} else if (imm) {
			run_message(qw, q, IBV_WR_RDMA_WRITE_WITH_IMM);
		} else if (place_write(q, qw.w_rkey, qw.w_va, qw.reasm.data(), qw.reasm.size())) {
			// The range was unmapped or its key invalidated since.
			fail(qw, q, psn, rv::nak_code::remote_access_error, IBV_EVENT_QP_ACCESS_ERR);
		} else {
			qw.in_msg = false;
			qw.reasm.clear();
			qw.msn++;
			advance(qw);
			send_ack(qw, psn);
		}
		return;
	}
	if (!rc) {
		count(&sv_wire_counters::drop_other);
		return;
	}
	if (qw.in_msg) {
		fail(qw, q, psn, rv::nak_code::invalid_request, IBV_EVENT_QP_REQ_ERR);
		return;
	}
	switch (low) {
	case rv::RC_RDMA_READ_REQUEST:
		run_read(qw, q, true);
		return;
	case rv::RC_COMPARE_SWAP:
	case rv::RC_FETCH_ADD:
		run_atomic_req(qw, q);
		return;
	default:
		fail(qw, q, psn, rv::nak_code::invalid_request, IBV_EVENT_QP_REQ_ERR);
		return;
	}
}

// A UD datagram for one of our UD QPs: the engine's responder checks its
// Q_Key and places it behind a GRH made of the packet's addresses.
void respond_datagram(qp_wire &qw, const rv::parsed &p, const host_addr &from,
		      const host_addr &to)
{
	// A datagram is one packet, no longer than the port's MTU: a longer
	// one is malformed, and dropped as a NIC drops it (ud_deliver never
	// sends one).
	if (p.payload_len > qw.pmtu) {
		count(&sv_wire_counters::drop_malformed);
		return;
	}
	loop_qp *proxy = proxy_for(qw.ctx);
	peer tp;
	if (loop_transport_ops.resolve(proxy, {qw.qpn, 0, true, kNoXrcSrq}, tp) || !tp.self) {
		count(&sv_wire_counters::drop_other);
		return;
	}
	const rv::pkt_hdrs &h = p.h;
	send_wr w{};
	w.opcode = h.b.opcode == rv::UD_SEND_ONLY_WITH_IMMEDIATE ? IBV_WR_SEND_WITH_IMM : IBV_WR_SEND;
	w.imm_data = h.imm_be;
	w.flags = h.b.se ? IBV_SEND_SOLICITED : 0;
	local_buf lb;
	if (p.payload_len)
		lb.iov.push_back({const_cast<uint8_t *>(p.payload), p.payload_len});
	lb.len = p.payload_len;
	auto gid_of = [](const host_addr &a) {
		ibv_gid g{};
		if (a.v4) {
			g.raw[10] = g.raw[11] = 0xff;
			memcpy(g.raw + 12, a.ip, 4);
		} else {
			memcpy(g.raw, a.ip, 16);
		}
		return g;
	};
	ibv_grh grh{};
	// The datagram's IP header as it came (its TOS and TTL are not read
	// from the socket yet: 0 and 64, the sender's defaults).
	build_grh(grh, gid_of(from), gid_of(to),
		  ud_grh_paylen(p.payload_len, h.b.opcode == rv::UD_SEND_ONLY_WITH_IMMEDIATE), 0, 0,
		  64, true);
	tp_request r{};
	r.w = &w;
	r.lb = &lb;
	r.psn = kNoPsn;
	r.src_qpn = h.d.sqpn;
	r.qkey = h.d.qkey;
	r.grh = &grh;
	r.grh_valid = true;
	r.datagram = true;
	respond(loop_transport_ops, proxy, tp, r);
}

bool is_answer(uint8_t op)
{
	uint8_t service = op & 0xe0, low = op & 0x1f;
	return (service == 0x00 || service == 0xa0) && low >= rv::RC_RDMA_READ_RESPONSE_FIRST &&
	       low <= rv::RC_ATOMIC_ACKNOWLEDGE;
}

// A request for a QP destroyed lately: a duplicate of one it executed gets
// its ACK again.  True when a grave answered.
bool answer_from_grave(const rv::parsed &p, const host_addr &from)
{
	wire &w = W();
	tombstone t;
	{
		std::lock_guard<std::mutex> g(w.lock);
		auto it = w.graves.find(p.h.b.dqpn);
		if (it == w.graves.end())
			return false;
		t = it->second;
	}
	if (now_ns() > t.until_ns || !same_addr(from, t.dst) || psn_diff(p.h.b.psn, t.epsn) >= 0)
		return false;
	uint8_t low = p.h.b.opcode & 0x1f;
	if ((p.h.b.opcode & 0xe0) || low == rv::RC_RDMA_READ_REQUEST || low == rv::RC_COMPARE_SWAP ||
	    low == rv::RC_FETCH_ADD || !p.h.b.ackreq)
		return false; // Only an RC SEND or WRITE is answered without its QP
	send_aeth_to(t.src, t.dst, t.ifindex, t.dqpn, t.msn, rv::RC_ACKNOWLEDGE,
		     psn_add(t.epsn, kPsn24), rv::aeth_ack(rv::kAethNoCredits), 0);
	return true;
}

// At exit, the receive thread answers from the graves of QPs destroyed
// lately (no live QP is served any more) for as long as they last.
void linger_at_exit()
{
	wire &w = W();
	uint64_t until;
	{
		std::lock_guard<std::mutex> g(w.lock);
		until = w.linger_until;
	}
	w.exiting = true;
	uint64_t now = now_ns();
	if (until > now)
		std::this_thread::sleep_for(std::chrono::nanoseconds(until - now));
}

// A packet forwarded between the processes of a host: where it came from
// and went to, then its bytes.
struct fwd_hdr {
	char magic[4]; // "SVRF"
	uint8_t v4;
	uint8_t reserved;
	uint16_t from_port;
	uint8_t from[16];
	uint8_t to[16];
};

void unix_name(pid_t pid, sockaddr_un &sa, socklen_t &len)
{
	sa = {};
	sa.sun_family = AF_UNIX;
	// Abstract (sun_path[0] is NUL): gone with the socket, per network
	// namespace, that is per host.
	int n = snprintf(sa.sun_path + 1, sizeof(sa.sun_path) - 1, "softverbs-rocev2-%u-%d",
			 static_cast<unsigned>(getuid()), static_cast<int>(pid));
	len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
}

// The live process of this host's fabric that owns QP qpn (0: none, or us).
pid_t qp_owner(uint32_t qpn)
{
	wire &w = W();
	if (!w.fab)
		return 0;
	sv_registry *r = w.fab->reg();
	uint32_t slot = qpn & SV_QPN_SLOT_MASK;
	if (slot >= SV_MAX_QPS)
		return 0;
	const sv_qp_rec &q = r->qps[slot];
	uint32_t in_use = __atomic_load_n(&q.in_use, __ATOMIC_ACQUIRE);
	uint32_t gen = __atomic_load_n(&q.generation, __ATOMIC_RELAXED);
	uint32_t lease = __atomic_load_n(&q.owner_lease, __ATOMIC_RELAXED);
	// The generation again after the owner: a destroy and a new QP in the
	// slot between the two loads would pair this QPN with the new QP's
	// owner (which would drop the packet, but need not get it).
	__atomic_thread_fence(__ATOMIC_ACQUIRE);
	if (!in_use || (gen & SV_QPN_SLOT_MASK) != (qpn >> SV_QPN_SLOT_BITS) ||
	    lease >= SV_MAX_PROCS || __atomic_load_n(&q.generation, __ATOMIC_RELAXED) != gen ||
	    !__atomic_load_n(&q.in_use, __ATOMIC_RELAXED))
		return 0;
	auto pid = static_cast<pid_t>(__atomic_load_n(&r->leases[lease].pid, __ATOMIC_RELAXED));
	return pid > 0 && pid != getpid() ? pid : 0;
}

// The port's owner hands a packet for another process's QP to it.
bool forward(const uint8_t *buf, size_t len, const host_addr &from, uint16_t from_port,
	     const host_addr &to, uint32_t qpn)
{
	wire &w = W();
	pid_t pid = qp_owner(qpn);
	if (!pid || w.ufd < 0)
		return false;
	fwd_hdr h{};
	memcpy(h.magic, "SVRF", 4);
	h.v4 = from.v4;
	h.from_port = from_port;
	memcpy(h.from, from.ip, 16);
	memcpy(h.to, to.ip, 16);
	sockaddr_un sa;
	socklen_t sl;
	unix_name(pid, sa, sl);
	iovec iov[2] = {{&h, sizeof(h)}, {const_cast<uint8_t *>(buf), len}};
	msghdr mh{};
	mh.msg_name = &sa;
	mh.msg_namelen = sl;
	mh.msg_iov = iov;
	mh.msg_iovlen = 2;
	// A datagram socket's queue holds net.unix.max_dgram_qlen datagrams
	// (10 by default), whatever its buffer: far fewer than a window of
	// WRITEs in flight.  So wait for room (SO_SNDTIMEO, kForwardWaitMs;
	// the kernel wakes us as the process reads).  A process whose queue
	// stays full for a whole wait (frozen, dying) has its packets dropped
	// without a wait for kForwardBackoffMs, so that it cannot stall the
	// port for the host's others; its peers resend what was dropped, as
	// after a loss on the wire.  A process that reads, if slowly, paces
	// this thread, and so the port, while its packets come: a budget of
	// waits per process was tried and dropped (bulk WRITEs to such a
	// process went from about 100 MB/s to 2, by the resends after each
	// backoff); a queue per process, drained as each has room, is the
	// way out (docs/rocev2.md).
	struct slow_rec {
		pid_t pid;
		uint64_t until; // Dropped without a wait before this
	};
	static thread_local slow_rec slow[64];
	uint64_t now = now_ns();
	slow_rec *spare = &slow[0];
	for (slow_rec &b : slow) {
		if (b.pid == pid && now < b.until) {
			count(&sv_wire_counters::drop_other);
			return true;
		}
		if (b.until < spare->until)
			spare = &b; // Free, expired or ending first
	}
	ssize_t r;
	do
		r = sendmsg(w.ufd, &mh, 0);
	while (r < 0 && errno == EINTR);
	if (r >= 0)
		return true;
	if (errno != EAGAIN && errno != EWOULDBLOCK)
		return false; // Gone: not that process's QP any more
	*spare = {pid, now_ns() + kForwardBackoffMs * 1000000ULL};
	count(&sv_wire_counters::drop_other);
	return true;
}

// A REQ no process of this host listens for: a REJ with "invalid service
// ID", as the IB CM of a host without the service answers.
void reject_unlistened(const uint8_t *mad, const host_addr &from, const host_addr &to)
{
	namespace cm = rv::cm;
	cm::req q;
	cm::get_req(mad, q);
	cm::mad_hdr h;
	cm::get_hdr(mad, h);
	h.attr_id = cm::REJ;
	h.status = 0;
	h.attr_mod = 0;
	cm::rej r;
	r.remote_comm_id = q.local_comm_id;
	r.message_rejected = cm::kRejectedReq;
	r.reason = cm::kRejInvalidServiceId;
	uint8_t out[cm::kMadLen];
	cm::put_hdr(out, h);
	cm::put_rej(out, r);
	uint8_t pkt[cm::kMadLen + 64];
	size_t n = cm::build_gsi_packet(pkt, out, 0);
	send_packet(to, from, W().ifindex, pkt, n);
}

// A MAD for the GSI (QP1): the CM's go to the process that listens on the
// REQ's service ID or holds the communication the message names
// (cm_mad.h, gsi_socket_name); other classes are not served.
void gsi_packet(const rv::parsed &p, const host_addr &from, uint16_t from_port,
		const host_addr &to)
{
	namespace cm = rv::cm;
	wire &w = W();
	bool by_service = false;
	uint64_t key = 0;
	if (p.h.b.opcode != rv::UD_SEND_ONLY || p.h.d.qkey != cm::kGsiQkey ||
	    p.payload_len < cm::kMadLen || !cm::route_of(p.payload, p.payload_len, by_service, key) ||
	    w.ufd < 0) {
		count(&sv_wire_counters::drop_other);
		return;
	}
	cm::gsi_fwd h{};
	memcpy(h.magic, "SVGM", 4);
	h.v4 = from.v4;
	h.from_port = from_port;
	memcpy(h.from, from.ip, 16);
	memcpy(h.to, to.ip, 16);
	sockaddr_un sa{};
	sa.sun_family = AF_UNIX;
	size_t n = cm::gsi_socket_name(sa.sun_path + 1, sizeof(sa.sun_path) - 1, getuid(), w.port,
				       by_service, key);
	auto sl = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
	iovec iov[2] = {{&h, sizeof(h)}, {const_cast<uint8_t *>(p.payload), cm::kMadLen}};
	msghdr mh{};
	mh.msg_name = &sa;
	mh.msg_namelen = sl;
	mh.msg_iov = iov;
	mh.msg_iovlen = 2;
	if (sendmsg(w.ufd, &mh, MSG_DONTWAIT) >= 0)
		return;
	count(&sv_wire_counters::drop_unknown_qp);
	if (by_service && (errno == ECONNREFUSED || errno == ENOENT) &&
	    (p.payload[16] << 8 | p.payload[17]) == cm::REQ)
		reject_unlistened(p.payload, from, to);
}

void handle_packet(const uint8_t *buf, size_t len, const host_addr &from, uint16_t from_port,
		   const host_addr &to, bool forwarded)
{
	wire &w = W();
	count(&sv_wire_counters::rx_packets);
	rv::ip_info ip;
	ip.v6 = !from.v4;
	memcpy(ip.src, from.ip, 16);
	memcpy(ip.dst, to.ip, 16);
	ip.sport = from_port;
	ip.dport = w.port;
	if (w.pcap)
		rv::pcap_write(w.pcap, ip, buf, len, wall_ns());
	rv::parsed p;
	if (rv::parse(buf, len, p) != rv::parse_err::ok) {
		count(&sv_wire_counters::drop_malformed);
		return;
	}
	if (rv::icrc(ip, buf, len - rv::kIcrcLen) != p.icrc_wire) {
		count(&sv_wire_counters::drop_bad_icrc);
		return;
	}
	if (p.h.b.opcode == rv::CNP)
		return; // Congestion notification: nothing to slow down here
	if (p.h.b.pkey != rv::kDefaultPkey) {
		count(&sv_wire_counters::drop_other); // P_Key table: the default key only
		return;
	}
	if (p.h.b.dqpn == rv::cm::kGsiQpn) {
		if (!forwarded)
			gsi_packet(p, from, from_port, to);
		return;
	}
	std::shared_ptr<qp_wire> qw = w.exiting ? nullptr : find_wire(p.h.b.dqpn);
	if (!qw) {
		if (!is_answer(p.h.b.opcode) && answer_from_grave(p, from))
			return;
		// Another process's QP: the port's owner forwards it there (a
		// forwarded packet is never forwarded again).
		if (!forwarded && forward(buf, len, from, from_port, to, p.h.b.dqpn))
			return;
		count(&sv_wire_counters::drop_unknown_qp);
		return;
	}
	std::lock_guard<std::mutex> g(qw->m);
	if (qw->dead) {
		count(&sv_wire_counters::drop_other);
		return;
	}
	if (p.h.b.opcode == rv::UD_SEND_ONLY || p.h.b.opcode == rv::UD_SEND_ONLY_WITH_IMMEDIATE) {
		if (qw->type == IBV_QPT_UD)
			respond_datagram(*qw, p, from, to);
		else
			count(&sv_wire_counters::drop_other);
		return;
	}
	if (!qw->remote || !same_addr(from, qw->dst)) {
		count(&sv_wire_counters::drop_other); // Not from this QP's peer
		return;
	}
	if (is_answer(p.h.b.opcode)) {
		if (!qw->flights.empty()) {
			flights_answer(*qw, p);
			flights_settle(*qw);
			return;
		}
		if (qw->inbox.size() >= kInboxMax)
			qw->inbox.pop_front();
		qw->inbox.emplace_back(buf, buf + len);
		qw->cv.notify_all();
		return;
	}
	respond_packet(*qw, p);
}

host_addr addr_of(const sockaddr_storage &ss, uint16_t &port)
{
	host_addr a;
	if (ss.ss_family == AF_INET) {
		auto &s = reinterpret_cast<const sockaddr_in &>(ss);
		a.v4 = true;
		memcpy(a.ip, &s.sin_addr, 4);
		port = ntohs(s.sin_port);
	} else {
		auto &s = reinterpret_cast<const sockaddr_in6 &>(ss);
		a.v4 = false;
		memcpy(a.ip, &s.sin6_addr, 16);
		port = ntohs(s.sin6_port);
	}
	return a;
}

int open_socket(int family, uint16_t port);

// Packets the port's owner forwarded: only from a process of our user.
void receive_forwarded(std::vector<uint8_t> &buf)
{
	wire &w = W();
	for (;;) {
		iovec iov{buf.data(), buf.size()};
		alignas(cmsghdr) char cbuf[CMSG_SPACE(sizeof(ucred))];
		msghdr mh{};
		mh.msg_iov = &iov;
		mh.msg_iovlen = 1;
		mh.msg_control = cbuf;
		mh.msg_controllen = sizeof(cbuf);
		ssize_t n = recvmsg(w.ufd, &mh, MSG_DONTWAIT);
		if (n < 0)
			return;
		bool ours = false;
		for (cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c))
			if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_CREDENTIALS) {
				ucred cr;
				memcpy(&cr, CMSG_DATA(c), sizeof(cr));
				ours = cr.uid == getuid();
			}
		fwd_hdr h;
		if (!ours || static_cast<size_t>(n) < sizeof(h)) {
			count(&sv_wire_counters::drop_other);
			continue;
		}
		memcpy(&h, buf.data(), sizeof(h));
		if (memcmp(h.magic, "SVRF", 4)) {
			count(&sv_wire_counters::drop_other);
			continue;
		}
		host_addr from, to;
		from.v4 = to.v4 = h.v4 != 0;
		memcpy(from.ip, h.from, 16);
		memcpy(to.ip, h.to, 16);
		try {
			handle_packet(buf.data() + sizeof(h), static_cast<size_t>(n) - sizeof(h),
				      from, h.from_port, to, true);
		} catch (...) {
			count(&sv_wire_counters::drop_other);
		}
	}
}

// A process without the port takes it when its owner is gone (the kernel
// freed it with the owner's sockets).
void try_take_port()
{
	wire &w = W();
	if (w.fd4 < 0 && w.efd4 >= 0)
		w.fd4 = open_socket(AF_INET, w.port);
	if (w.fd6 < 0 && w.efd6 >= 0)
		w.fd6 = open_socket(AF_INET6, w.port);
}

// What the port's socket holds, 16 datagrams per system call (recvmmsg).
// A datagram the kernel coalesced (UDP_GRO: packets of one flow and one
// size, the last maybe shorter) is cut back into its packets.
void receive_port(int fd)
{
	constexpr unsigned kBatch = 16;
	constexpr size_t kRoom = 65536; // Larger than any datagram, coalesced or not
	struct slot {
		sockaddr_storage from;
		iovec iov;
		alignas(cmsghdr) char cbuf[256];
	};
	thread_local std::vector<uint8_t> room(kBatch * kRoom);
	thread_local std::vector<slot> slots(kBatch);
	mmsghdr mm[kBatch];
	for (;;) {
		for (unsigned i = 0; i < kBatch; i++) {
			slots[i].iov = {room.data() + i * kRoom, kRoom};
			msghdr &mh = mm[i].msg_hdr;
			mh = {};
			mh.msg_name = &slots[i].from;
			mh.msg_namelen = sizeof(slots[i].from);
			mh.msg_iov = &slots[i].iov;
			mh.msg_iovlen = 1;
			mh.msg_control = slots[i].cbuf;
			mh.msg_controllen = sizeof(slots[i].cbuf);
			mm[i].msg_len = 0;
		}
		int got = recvmmsg(fd, mm, kBatch, MSG_DONTWAIT, nullptr);
		if (got <= 0)
			return;
		for (int i = 0; i < got; i++) {
			msghdr &mh = mm[i].msg_hdr;
			const sockaddr_storage &from = slots[i].from;
			host_addr to;
			to.v4 = from.ss_family == AF_INET;
			bool have_to = false;
			size_t seg = 0; // The coalesced packets' size (0: one packet)
			for (cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
				if (c->cmsg_level == SOL_UDP && c->cmsg_type == UDP_GRO) {
					int v;
					memcpy(&v, CMSG_DATA(c), sizeof(v));
					seg = v > 0 ? static_cast<size_t>(v) : 0;
				} else if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_PKTINFO) {
					in_pktinfo pi;
					memcpy(&pi, CMSG_DATA(c), sizeof(pi));
					memcpy(to.ip, &pi.ipi_addr, 4);
					have_to = true;
				} else if (c->cmsg_level == IPPROTO_IPV6 && c->cmsg_type == IPV6_PKTINFO) {
					in6_pktinfo pi;
					memcpy(&pi, CMSG_DATA(c), sizeof(pi));
					memcpy(to.ip, &pi.ipi6_addr, 16);
					have_to = true;
				}
			}
			if (!have_to || (mh.msg_flags & MSG_TRUNC)) {
				count(&sv_wire_counters::drop_other);
				continue;
			}
			uint16_t port = 0;
			host_addr src = addr_of(from, port);
			const uint8_t *data = static_cast<const uint8_t *>(slots[i].iov.iov_base);
			size_t left = mm[i].msg_len;
			if (!seg || seg > left)
				seg = left;
			do {
				size_t len = std::min(seg, left);
				try {
					handle_packet(data, len, src, port, to, false);
				} catch (...) {
					count(&sv_wire_counters::drop_other); // Out of memory: as if lost on the wire
				}
				data += len;
				left -= len;
			} while (left);
		}
		if (static_cast<unsigned>(got) < kBatch)
			return;
	}
}

void receive_loop()
{
	wire &w = W();
	std::vector<uint8_t> buf(65536);
	for (;;) {
		pollfd fds[4];
		int nfds = 0;
		for (int fd : {w.fd4, w.fd6, w.ufd, w.wake_fd})
			if (fd >= 0)
				fds[nfds++] = {fd, POLLIN, 0};
		// A packet the reorder knob holds goes out within 2 ms; a process
		// without the port looks for it every 100 ms.
		bool owner = (w.efd4 < 0 || w.fd4 >= 0) && (w.efd6 < 0 || w.fd6 >= 0);
		bool flying;
		{
			std::lock_guard<std::mutex> g(w.lock);
			flying = !w.flying.empty();
		}
		int tmo = w.reorder_pct > 0 || flying ? 1 : owner ? -1 : 100;
		int ready = poll(fds, static_cast<nfds_t>(nfds), tmo);
		if (ready < 0 && errno != EINTR)
			return;
		if (w.reorder_pct > 0)
			release_held(2000000);
		if (!owner && !w.exiting)
			try_take_port();
		if (flying)
			flights_service();
		for (int i = 0; i < nfds; i++) {
			if (!(fds[i].revents & POLLIN))
				continue;
			if (fds[i].fd == w.ufd) {
				receive_forwarded(buf);
				continue;
			}
			if (fds[i].fd == w.wake_fd) {
				uint64_t v;
				ssize_t r = read(w.wake_fd, &v, sizeof(v)); // Only a wakeup
				(void)r;
				continue;
			}
			receive_port(fds[i].fd);
		}
	}
}

int open_socket(int family, uint16_t port)
{
	int fd = socket(family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	int one = 1;
	// Bursts of a large message: room for them, as far as we are allowed.
	int big = 8 << 20;
	if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &big, sizeof(big)))
		setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &big, sizeof(big));
	if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &big, sizeof(big)))
		setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &big, sizeof(big));
	// Coalesced receives (receive_port cuts them up); an older kernel
	// without UDP_GRO delivers packet by packet.
	if (W().gro)
		setsockopt(fd, SOL_UDP, UDP_GRO, &one, sizeof(one));
	int rc;
	if (family == AF_INET) {
		// DF set and the identification 0, as the ICRC assumes (wire.h).
		int pmtu = IP_PMTUDISC_DO;
		setsockopt(fd, IPPROTO_IP, IP_MTU_DISCOVER, &pmtu, sizeof(pmtu));
		setsockopt(fd, IPPROTO_IP, IP_PKTINFO, &one, sizeof(one));
		sockaddr_in sa{};
		sa.sin_family = AF_INET;
		sa.sin_port = htons(port);
		rc = bind(fd, reinterpret_cast<sockaddr *>(&sa), sizeof(sa));
	} else {
		int pmtu = IPV6_PMTUDISC_DO;
		setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
		setsockopt(fd, IPPROTO_IPV6, IPV6_MTU_DISCOVER, &pmtu, sizeof(pmtu));
		setsockopt(fd, IPPROTO_IPV6, IPV6_RECVPKTINFO, &one, sizeof(one));
		sockaddr_in6 sa{};
		sa.sin6_family = AF_INET6;
		sa.sin6_port = htons(port);
		rc = bind(fd, reinterpret_cast<sockaddr *>(&sa), sizeof(sa));
	}
	if (rc) {
		int e = errno;
		close(fd);
		errno = e;
		return -1;
	}
	return fd;
}

unsigned netdev_mtu_of(const std::string &netdev, uint32_t &ifindex)
{
	ifindex = if_nametoindex(netdev.c_str());
	int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return 1500;
	ifreq ifr{};
	snprintf(ifr.ifr_name, sizeof(ifr.ifr_name), "%s", netdev.c_str());
	unsigned mtu = ioctl(fd, SIOCGIFMTU, &ifr) == 0 ? static_cast<unsigned>(ifr.ifr_mtu) : 1500;
	close(fd);
	return mtu;
}

} // namespace

const transport_ops rocev2_transport_ops = {
	.name = "rocev2",
	.resolve = rv_resolve,
	.mcast_members = rv_mcast_members,
	.resolve_key = rv_resolve_key,
	.invalidate = rv_invalidate,
	.move = rv_move,
	.atomic = rv_atomic,
	.deliver = rv_deliver,
	.take_recv = rv_take_recv,
	.post_cqe = rv_post_cqe,
	.responder_error = rv_responder_error,
	.alive = rv_alive,
};

void rocev2_device_open(loop_context *lctx)
{
	const device_config &cfg = lctx->ldev->cfg;
	if (!cfg.rocev2 || cfg.link_layer != IBV_LINK_LAYER_ETHERNET)
		return;
	wire &w = W();
	std::lock_guard<std::mutex> g(w.lock);
	if (w.tried)
		return;
	w.tried = true;
	w.port = cfg.udp_port;
	w.netdev_mtu = netdev_mtu_of(cfg.netdev, w.ifindex);
	if (const char *gso = getenv("SOFTVERBS_ROCEV2_GSO"); gso && !strcmp(gso, "0")) {
		w.gso6 = false;
		w.gro = false;
	}
	if (const char *d = getenv("SOFTVERBS_ROCEV2_DROP"))
		w.drop_pct = std::clamp(atof(d), 0.0, 100.0);
	if (const char *d = getenv("SOFTVERBS_ROCEV2_DUP"))
		w.dup_pct = std::clamp(atof(d), 0.0, 100.0);
	if (const char *d = getenv("SOFTVERBS_ROCEV2_REORDER"))
		w.reorder_pct = std::clamp(atof(d), 0.0, 100.0);
	if (const char *f = getenv("SOFTVERBS_PCAP"); f && *f) {
		// "%p" in the name stands for the pid: one file per process.
		std::string path = f;
		if (size_t at = path.find("%p"); at != std::string::npos)
			path.replace(at, 2, std::to_string(getpid()));
		w.pcap = rv::pcap_open(path.c_str());
		if (!w.pcap)
			fprintf(stderr, "softverbs: SOFTVERBS_PCAP: cannot create '%s': %s\n",
				path.c_str(), strerror(errno));
	}
	w.fab = lctx->fab;
	w.fd4 = open_socket(AF_INET, w.port);
	int e4 = w.fd4 < 0 ? errno : 0;
	w.fd6 = open_socket(AF_INET6, w.port);
	int e6 = w.fd6 < 0 ? errno : 0;
	if (e4 == EADDRINUSE || e6 == EADDRINUSE) {
		// Another process of this host holds the port: send from ports of
		// our own, and receive what it forwards (docs/rocev2.md).
		auto ephemeral = [](int family, uint16_t &port) {
			int fd = open_socket(family, 0);
			sockaddr_storage ss{};
			socklen_t sl = sizeof(ss);
			if (fd >= 0 && !getsockname(fd, reinterpret_cast<sockaddr *>(&ss), &sl))
				port = ntohs(family == AF_INET
						     ? reinterpret_cast<sockaddr_in &>(ss).sin_port
						     : reinterpret_cast<sockaddr_in6 &>(ss).sin6_port);
			return fd;
		};
		if (w.fd4 < 0 && e4 == EADDRINUSE)
			w.efd4 = ephemeral(AF_INET, w.eport4);
		if (w.fd6 < 0 && e6 == EADDRINUSE)
			w.efd6 = ephemeral(AF_INET6, w.eport6);
	}
	for (int fd : {w.fd6, w.fd4, w.efd6, w.efd4}) {
		socklen_t sl = sizeof(w.rcvbuf);
		if (fd >= 0 && !getsockopt(fd, SOL_SOCKET, SO_RCVBUF, &w.rcvbuf, &sl))
			break;
	}
	w.ufd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (w.ufd >= 0) {
		int one = 1;
		int big = 8 << 20;
		setsockopt(w.ufd, SOL_SOCKET, SO_PASSCRED, &one, sizeof(one));
		timeval wait{0, kForwardWaitMs * 1000};
		setsockopt(w.ufd, SOL_SOCKET, SO_SNDTIMEO, &wait, sizeof(wait));
		// Datagrams queued at other processes are charged to the sender's
		// buffer: room for the host's windows of forwarded packets.
		if (setsockopt(w.ufd, SOL_SOCKET, SO_SNDBUFFORCE, &big, sizeof(big)))
			setsockopt(w.ufd, SOL_SOCKET, SO_SNDBUF, &big, sizeof(big));
		if (setsockopt(w.ufd, SOL_SOCKET, SO_RCVBUFFORCE, &big, sizeof(big)))
			setsockopt(w.ufd, SOL_SOCKET, SO_RCVBUF, &big, sizeof(big));
		sockaddr_un sa;
		socklen_t sl;
		unix_name(getpid(), sa, sl);
		if (bind(w.ufd, reinterpret_cast<sockaddr *>(&sa), sl)) {
			close(w.ufd);
			w.ufd = -1;
		}
	}
	if (w.fd4 < 0 && w.fd6 < 0 && w.efd4 < 0 && w.efd6 < 0) {
		fprintf(stderr, "softverbs: rocev2: no UDP socket for port %u (%s): this process "
				"reaches no other host\n",
			w.port, strerror(e4));
		return;
	}
	w.wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	w.n = &lctx->fab->reg()->wire[lctx->dev->index][0];
	// Up only with its receive thread: a wire without one would send
	// and never hear an answer.  Without one, its sockets go too: a port
	// it owned would hold the host's other processes' packets with nobody
	// to read or forward them, and they take the port over only once it
	// is free.  (Tried once, as the sockets are.)
	const char *why = nullptr;
	try {
		start_detached(receive_loop);
	} catch (const std::system_error &e) {
		why = e.what();
	} catch (const std::bad_alloc &) {
		why = "out of memory";
	}
	if (why) {
		fprintf(stderr, "softverbs: rocev2: no receive thread for port %u (%s): this "
				"process reaches no other host\n",
			w.port, why);
		for (int *fd : {&w.fd4, &w.fd6, &w.efd4, &w.efd6, &w.ufd, &w.wake_fd}) {
			if (*fd >= 0)
				close(*fd);
			*fd = -1;
		}
		return;
	}
	w.up = true;
	atexit(linger_at_exit);
}

void rocev2_qp_modified(loop_qp *qp, int mask)
{
	const device_config &cfg = qp->ctx->ldev->cfg;
	if (!cfg.rocev2 || cfg.link_layer != IBV_LINK_LAYER_ETHERNET ||
	    (qp->type != IBV_QPT_RC && qp->type != IBV_QPT_UC && qp->type != IBV_QPT_UD &&
	     qp->type != IBV_QPT_XRC_SEND && qp->type != IBV_QPT_XRC_RECV))
		return;
	wire &w = W();
	const ibv_qp_attr &a = qp->attr;
	if (a.qp_state == IBV_QPS_RESET) {
		qp->wire_remote = false;
		rocev2_qp_destroyed(qp);
		return;
	}
	if (!(mask & IBV_QP_STATE))
		return;
	std::shared_ptr<qp_wire> qw;
	{
		std::lock_guard<std::mutex> g(w.lock);
		w.graves.erase(qp->qpn); // The number names a new QP now
		auto &slot = w.qps[qp->qpn];
		if (!slot)
			slot = std::make_shared<qp_wire>();
		qw = slot;
	}
	std::lock_guard<std::mutex> g(qw->m);
	qw->ctx = qp->ctx;
	qw->qpn = qp->qpn;
	qw->type = qp->type;
	qw->dead = false;
	qw->timeout = a.timeout;
	qw->retry_cnt = a.retry_cnt;
	if (a.qp_state == IBV_QPS_RTR) {
		qw->epsn = a.rq_psn & kPsn24;
		qw->msn = 0;
		qw->nak_sent = false;
		qw->in_msg = false;
		qw->reasm.clear();
		qw->have_wqe = false; // The receive queue was emptied at RESET
		qw->dqpn = a.dest_qp_num & kPsn24;
		// Remote: a global address whose GID is none of this port's.
		bool remote = false;
		host_addr dst, src;
		if (a.ah_attr.is_global && gid_addr(a.ah_attr.grh.dgid, dst)) {
			gid_slot table[kGidTableLen];
			int n = loop_gid_table(qp->ctx, a.port_num, table, kGidTableLen, true);
			remote = true;
			for (int i = 0; i < n; i++)
				if (table[i].valid &&
				    !memcmp(table[i].gid.raw, a.ah_attr.grh.dgid.raw, 16))
					remote = false;
			uint8_t si = a.ah_attr.grh.sgid_index;
			if (remote && (si >= n || !table[si].valid || !gid_addr(table[si].gid, src) ||
				       src.v4 != dst.v4)) {
				debug_log("rocev2: QP %#x: source GID index %u is no address of "
					  "the destination's family",
					  qp->qpn, si);
				remote = false;
			}
		}
		qw->remote = remote;
		qw->src = src;
		qw->dst = dst;
		qw->ifindex = w.ifindex;
		qw->pmtu = qp->type == IBV_QPT_UD
				   ? netdev_pmtu(w.netdev_mtu, false)
				   : std::min(mtu_bytes(a.path_mtu), netdev_pmtu(w.netdev_mtu, dst.v4));
		qp->wire_remote = remote;
	}
	if (a.qp_state == IBV_QPS_RTS && (mask & IBV_QP_SQ_PSN)) {
		qw->next_psn = a.sq_psn & kPsn24;
		qw->cur_engine = UINT32_MAX;
		qw->inbox.clear();
	}
}

bool rocev2_remote_gid(loop_context *lctx, uint8_t port, const ibv_gid &dgid)
{
	host_addr a;
	if (!gid_addr(dgid, a) || gid_is_multicast(dgid.raw)) // No address, or multicast
		return false;
	gid_slot table[kGidTableLen];
	int n = loop_gid_table(lctx, port, table, kGidTableLen, true);
	for (int i = 0; i < n; i++)
		if (table[i].valid && !memcmp(table[i].gid.raw, dgid.raw, 16))
			return false;
	return true;
}

uint8_t rocev2_port_mtu(loop_context *lctx)
{
	static std::once_flag once;
	static unsigned mtu;
	std::call_once(once, [&] {
		uint32_t ifindex;
		mtu = netdev_mtu_of(lctx->ldev->cfg.netdev, ifindex);
	});
	// IPv6's header is the larger: what fits it fits IPv4.
	uint32_t bytes = netdev_pmtu(mtu, false);
	uint8_t e = IBV_MTU_256;
	while (e < IBV_MTU_4096 && (128u << (e + 1)) <= bytes)
		e++;
	return e;
}

bool rocev2_write_start(loop_qp *qp, const send_wr &wr, const iovec *iov, int niov, uint64_t len)
{
	wire &w = W();
	std::shared_ptr<qp_wire> qw = find_wire(qp->qpn);
	if (!qw || !w.up || len > kMaxMessage || !len)
		return false;
	std::lock_guard<std::mutex> g(qw->m);
	if (qw->dead || !qw->remote || qw->type != IBV_QPT_RC || qw->need_flush)
		return false;
	// After a failed WRITE nothing more goes out: it waits, and is flushed.
	for (const qp_wire::settled &c : qw->to_complete)
		if (c.st != IBV_WC_SUCCESS)
			return false;
	// Built aside first: out of memory changes nothing (the engine then
	// runs the WRITE itself).
	qp_wire::flight f;
	f.sq_index = wr.sq_index;
	f.wr_id = wr.wr_id;
	f.flags = wr.flags;
	f.iov.assign(iov, iov + niov);
	f.n = packets_for(len, qw->pmtu);
	f.first = qw->next_psn;
	f.m.service = service_of(qw->type);
	f.m.write = true;
	f.m.va = wr.remote_addr;
	f.m.rkey = wr.rkey;
	f.m.niov = niov;
	f.m.len = len;
	bool first;
	{
		std::lock_guard<std::mutex> wg(w.lock);
		first = w.flying.empty();
		w.flying.insert(qw);
		rocev2_flying_qps.store(static_cast<uint32_t>(w.flying.size()),
					std::memory_order_relaxed);
	}
	bool was_empty = qw->flights.empty();
	qw->flights.push_back(std::move(f));
	// Nothing below throws.
	qp_wire::flight &in = qw->flights.back();
	in.m.iov = in.iov.data();
	qw->next_psn = psn_add(qw->next_psn, in.n);
	uint64_t now = now_ns();
	if (was_empty) {
		// Nothing was in flight: no synchronous request is either (the
		// engine hands a WRITE over only when every WR before it is done
		// or handed over too).
		qw->inbox.clear();
		qw->cur_engine = UINT32_MAX;
		qw->snd_una = qw->snd_nxt = qw->snd_max = in.first;
		qw->fl_retries = qw->retry_cnt;
		qw->fl_deadline = now + timeout_ns(qw->timeout);
	}
	qw->lqp = qp;
	if (first && w.wake_fd >= 0) {
		// The receive thread may sleep with no timer: it has one now (a
		// failed write leaves it to its next packet or poll).
		uint64_t one = 1;
		ssize_t r = write(w.wake_fd, &one, sizeof(one));
		(void)r;
	}
	flights_send(*qw);
	return true;
}

void rocev2_settle(loop_qp *qp)
{
	std::shared_ptr<qp_wire> qw = find_wire(qp->qpn);
	if (!qw)
		return;
	std::lock_guard<std::mutex> g(qw->m);
	if (!qw->dead && (!qw->to_complete.empty() || qw->need_flush))
		settle_locked(*qw, qp);
}

void rocev2_drop_flights(loop_qp *qp)
{
	if (tl_settling)
		return; // The receive thread, completing them: it dropped them
	std::shared_ptr<qp_wire> qw = find_wire(qp->qpn);
	if (!qw)
		return;
	std::lock_guard<std::mutex> g(qw->m);
	qw->flights.clear();
	qw->to_complete.clear();
}

void rocev2_qp_destroyed(loop_qp *qp)
{
	wire &w = W();
	std::shared_ptr<qp_wire> qw;
	{
		std::lock_guard<std::mutex> g(w.lock);
		auto it = w.qps.find(qp->qpn);
		if (it == w.qps.end())
			return;
		qw = std::move(it->second);
		w.qps.erase(it);
	}
	std::lock_guard<std::mutex> g(qw->m); // The receive thread is done with it
	qw->dead = true;
	qw->flights.clear();
	qw->to_complete.clear();
	qw->lqp = nullptr;
	qw->cv.notify_all();
	if (qw->type != IBV_QPT_RC || !qw->remote)
		return;
	// Its grave lasts four of its timeouts (the peer's is likely the same:
	// three of its retries, on a loaded machine too), at most a second; at
	// exit the process waits for the last one.
	uint64_t now = now_ns();
	uint64_t until = now + std::min<uint64_t>(4 * timeout_ns(qw->timeout), kTimeoutCapNs);
	std::lock_guard<std::mutex> wg(w.lock);
	std::erase_if(w.graves, [&](const auto &e) { return e.second.until_ns < now; });
	if (w.graves.size() < 4096) {
		w.graves[qw->qpn] = {qw->epsn, qw->msn, qw->dqpn, qw->ifindex, qw->src, qw->dst, until};
		w.linger_until = std::max(w.linger_until, until);
	}
}

} // namespace loop
