// SPDX-License-Identifier: MIT
// librdmacm.so.1 without a kernel: the RDMA connection manager in user space,
// on a softverbs fabric.  See docs/rdmacm.md for the design, the address
// rules and what is not implemented.
//
// CM messages (REQ, REP, RTU, REJ, DREQ, DREP, SIDR REQ/REP) travel over
// AF_UNIX SOCK_SEQPACKET sockets in the abstract namespace.  A bound id owns
// a socket named after (uid, fabric, port space, address, port): bind()
// gives EADDRINUSE, a dead process frees its names, and a peer's death reads
// as end-of-file.  One thread per process (started by the first id) waits on
// every socket with epoll and turns messages into events; an event channel
// is an eventfd (EFD_SEMAPHORE) counting queued events, so poll/epoll and
// O_NONBLOCK work on channel->fd as they do on the kernel's.  To another
// host (a device with RoCE v2 on), the messages are the IB CM's own MADs
// on QP1 instead ("across hosts" below).
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>
#include <infiniband/ib.h>
#include <infiniband/verbs.h>

#include "../providers/loop/config.h"
#include "../providers/loop/thread_start.h"
#include "../providers/loop/transport/rocev2/cm_mad.h"
#include "../providers/loop/transport/rocev2/wire.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#define SV_API __attribute__((visibility("default")))

namespace {

int fail(int e)
{
	errno = e;
	return -1;
}

// The library's own sockets come from the system call, not socket(): under
// librspreload, socket() first offers every new socket to rsocket().
int raw_socket(int domain, int type, int protocol)
{
	return static_cast<int>(syscall(SYS_socket, domain, type, protocol));
}

// ---------------------------------------------------------------- wire ---

constexpr uint32_t kMagic = 0x53564d43; // "SVMC"
constexpr uint16_t kWireVersion = 1;

enum msg_type : uint8_t {
	M_REQ = 1,
	M_REP,
	M_RTU,
	M_REJ,
	M_DREQ,
	M_DREP,
	M_SIDR_REQ,
	M_SIDR_REP,
};

// Private data limits of the IB CM less the rdma_cm header, as the kernel's.
constexpr int kReqPdata = 56, kRepPdata = 196, kRejPdata = 148;
constexpr int kSidrReqPdata = 180, kSidrRepPdata = 136;
constexpr int kRejInvalidServiceId = 8, kRejConsumer = 28, kRejVendorOptionNotSupported = 35;

struct wire_msg {
	uint32_t magic;
	uint16_t version;
	uint8_t type;
	uint8_t pdata_len;
	uint32_t qpn, psn, qkey, status;
	uint8_t resp_res, init_depth, flow_control, retry_count;
	uint8_t rnr_retry, srq, mtu, port;
	uint16_t lid;
	uint8_t eth, pad;
	uint8_t sgid[16]; // sender's GID
	uint8_t dgid[16]; // the GID the sender addressed
	char dev[64];     // the device the sender resolved the address to
	sockaddr_storage src, dst;
	uint32_t ece_vendor, ece_options;
	uint8_t pdata[224];
};

// ------------------------------------------------------------- devices ---

struct dev_entry {
	ibv_context *ctx = nullptr;
	ibv_pd *pd = nullptr; // rdma_create_qp's default PD
	ibv_xrcd *xrcd = nullptr; // XRC QPs' and SRQs' domain, made on first use
	std::string name;
	ibv_device_attr attr{};
	// RoCE v2 to other hosts (the device's rocev2 key): connections to an
	// address of another host go over the wire, the CM's messages as MADs.
	bool wire = false;
	uint16_t udp_port = 4791;
	uint32_t ifindex = 0; // The netdev's, for IPv6 link-local peers
};

struct channel_priv;
struct cm_id;

struct event_priv {
	rdma_cm_event ev; // what the user sees: first member
	cm_id *counted = nullptr; // the id whose acks destroy waits for
	cm_id *about = nullptr;   // ev.id
	bool dead = false;
	bool conn_resp = false;
	uint8_t pdata[256];
};

struct channel_priv {
	rdma_event_channel ch; // first member
	std::deque<event_priv *> q;
	int readers = 0;        // threads inside rdma_get_cm_event
	bool destroyed = false; // destroyed (kept for readers; see its destroy)
};

enum class st {
	idle,
	bound,
	addr_resolved,
	route_resolved,
	connect,      // REQ sent, waiting for REP
	rep_rcvd,     // REP received, no QP: the user calls rdma_establish
	listen,
	pending_req,  // accepted socket, REQ not read yet (not visible)
	req_rcvd,     // CONNECT_REQUEST delivered
	accepted,     // REP sent, waiting for RTU
	established,
	disc_sent,
	disconnected,
	rejected,
	error,
};

struct cm_id {
	rdma_cm_id id; // first member
	uint64_t serial = 0;
	st state = st::idle;
	bool sync = false;
	bool destroying = false;
	// The parent's, in a child of fork(): nothing of it is served or sent
	// here any more (cm_atfork_child); only its destroy works.
	bool orphan = false;
	channel_priv *chan = nullptr;
	int bind_fd = -1, conn_fd = -1;
	dev_entry *dev = nullptr;
	// Local port.
	uint16_t lid = 0;
	ibv_gid gid{};
	int gid_index = 0;
	bool eth = false;
	ibv_mtu mtu = IBV_MTU_1024;
	// Peer, from REQ or REP.
	bool have_remote = false;
	uint32_t rqpn = 0, rpsn = 0, rqkey = 0;
	uint16_t rlid = 0;
	ibv_gid rgid{};
	ibv_mtu rmtu = IBV_MTU_1024;
	uint8_t r_resp = 0, r_init = 0, r_rnr = 7, r_retry = 7;
	uint32_t psn = 0;
	uint8_t resp_res = 1, init_depth = 1, retry = 7, rnr_retry = 7;
	ibv_sa_path_rec path{};
	cm_id *listener = nullptr;
	std::vector<cm_id *> children;
	event_priv *req_event = nullptr; // CONNECT_REQUEST not retrieved yet
	// A passive id that left `accepted` before the RTU came (rdma_notify's
	// COMM_EST, or rdma_disconnect): the RTU may still come, and is no
	// error then.  est_on_rtu: it brings the ESTABLISHED event, as the
	// kernel's CM still delivers it after a disconnect before the RTU.
	bool rtu_late = false, est_on_rtu = false;
	bool peer_gone = false;
	int reported = 0, acked = 0;
	int64_t deadline_ms = 0; // REP (connect) or RTU (accepted) expected by then
	// A REQ whose listener was refused or busy (see connect_listener): the
	// CM thread tries again every kReqRetryStepMs until req_retry_until,
	// so that rdma_connect never waits for it.
	int64_t req_retry_until = 0, req_retry_ms = 0;
	wire_msg req_msg{};
	sockaddr_storage req_dst{};
	int64_t timewait_ms = 0; // TIMEWAIT_EXIT due then
	uint8_t tos = 0, ack_timeout = 14;
	bool ack_timeout_set = false; // RDMA_OPTION_ID_ACK_TIMEOUT given: else from the path
	int afonly = 0, reuseaddr = 0;
	bool afonly_set = false; // RDMA_OPTION_ID_AFONLY given: else the family's default
	int own_fd = -1;          // the port-owner marker (see check_port)
	bool unnamed = false;     // bound beside a reuseaddr twin: takes the name at listen
	bool own_cqs = false;
	ibv_qp_init_attr_ex *ep_qp_attr = nullptr; // rdma_create_ep's, for rdma_get_request
	ibv_ece local_ece{}, remote_ece{};
	struct mcast {
		sockaddr_storage addr;
		ibv_gid mgid;
		uint16_t mlid;
		bool attached;
	};
	std::vector<mcast> mcs;
	// Over the wire (a peer on another host; docs/rdmacm.md, "Across
	// hosts"): the messages are IB CM MADs in RoCE v2 packets to the peer's
	// QP1, and conn_fd is a datagram socket named after lcomm, to which the
	// port's owner hands the MADs for this communication (cm_mad.h).  A
	// listener's gsi_fd, named after its service ID, gets the REQs.
	bool wire = false;
	int gsi_fd = -1;
	uint32_t lcomm = 0, rcomm = 0;
	uint64_t tid = 0;
	bool peer_v4 = false;
	uint8_t peer_ip[16] = {}, my_ip[16] = {};
	uint16_t udp_port = 4791;
	uint32_t ifindex = 0;
	// The message that waits for an answer (REQ, REP, DREQ), sent again
	// every resend interval until the answer or the deadline; and the last
	// answer sent (RTU, DREP), sent again when the peer repeats itself.
	std::vector<uint8_t> resend, answer;
	int64_t resend_ms = 0;
	int backlog = 128; // A listener's: requests from other hosts not yet accepted
};

// The path's packet lifetime: on RoCE the kernel's (CMA_IBOE_PACKET_LIFETIME,
// 16: 268 ms); on InfiniBand, where an SA would answer, 14 (67 ms).
uint8_t packet_life(const cm_id *p)
{
	return p->eth ? 16 : 14;
}

// A connected QP's local ACK timeout, as the kernel's CM computes it from
// the path's packet lifetime and the device's ACK delay (cm_ack_timeout;
// IBTA 12.7.34: twice the lifetime plus the delay), unless the id set its
// own (RDMA_OPTION_ID_ACK_TIMEOUT).  RoCE 17 (537 ms a try, 4.3 s with
// retry_cnt 7), InfiniBand 16.  It was 14 (67 ms, 0.54 s): a peer that
// stalled half a second failed the connection.
uint8_t qp_ack_timeout(const cm_id *p)
{
	if (p->ack_timeout_set)
		return p->ack_timeout;
	// SOFTVERBS_CM_ACK_TIMEOUT (0-31) sets every id's default (a test
	// under injected loss, where each lost last packet costs a timeout).
	static const int forced = [] {
		const char *e = getenv("SOFTVERBS_CM_ACK_TIMEOUT");
		char *end = nullptr;
		long n = e && *e ? strtol(e, &end, 10) : -1;
		return e && *e && end && !*end && n >= 0 && n <= 31 ? int(n) : -1;
	}();
	if (forced >= 0)
		return static_cast<uint8_t>(forced);
	int delay = p->dev ? p->dev->attr.local_ca_ack_delay : 15;
	int t = packet_life(p) + 1;
	if (t >= delay)
		t += delay >= t - 1;
	else
		t = delay + (t >= delay - 1);
	return static_cast<uint8_t>(std::min(t, 31));
}

struct global {
	std::mutex mu;
	std::condition_variable cv;
	bool inited = false;
	int init_err = 0;
	std::vector<dev_entry *> devs;
	std::map<uint64_t, cm_id *> ids;
	uint64_t next_serial = 1;
	int ep = -1;
	// Wakes the CM thread for a retry due sooner than its sleep (epoll key 0).
	int wake = -1;
	std::string fabric_key;
	// Marks of listeners destroyed lately (fd, when it goes): see
	// connect_listener.
	std::vector<std::pair<int, int64_t>> tombs;
	// The CM's own UDP sockets for MADs to other hosts (any source port).
	int udp4 = -1, udp6 = -1;
	uint16_t uport4 = 0, uport6 = 0;
	double drop_pct = 0; // SOFTVERBS_ROCEV2_DROP applies to MADs too
	bool any_wire = false;
	// Ids over the wire destroyed lately, by their socket (their time
	// wait): their socket and last answer stay, for a peer that missed it.
	std::map<int, cm_id *> lingers;
	// Event channels destroyed (rdma_destroy_event_channel): kept for a
	// reader that comes late, and reachable from here (not a leak to
	// LeakSanitizer).
	std::vector<channel_priv *> dead_channels;
	// Event channels not destroyed (and the ids' own, of synchronous ids):
	// a child of fork() gives each an event counter of its own.
	std::vector<channel_priv *> channels;
};

global &G()
{
	static global *g = new global; // never destroyed: the thread outlives exit
	return *g;
}

void log_msg(const char *fmt, const char *what)
{
	fprintf(stderr, "softverbs: rdma_cm: ");
	fprintf(stderr, fmt, what);
	fputc('\n', stderr);
}

// ----------------------------------------------------------- helpers ---

int64_t now_ms()
{
	timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return int64_t(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}

// How long a REQ waits for its REP, and a REP for its RTU, before the side
// waiting gets UNREACHABLE (-ETIMEDOUT), as the IB CM's retries run out.
// SOFTVERBS_CM_TIMEOUT_MS changes it (tests use a short one).
int64_t cm_timeout_ms()
{
	static int64_t v = [] {
		const char *e = getenv("SOFTVERBS_CM_TIMEOUT_MS");
		long n = e ? strtol(e, nullptr, 10) : 0;
		return n > 0 ? int64_t(n) : int64_t(30000);
	}();
	return v;
}

uint32_t rand24()
{
	uint32_t v = 0;
	if (getrandom(&v, sizeof(v), 0) != sizeof(v))
		v = static_cast<uint32_t>(random());
	return v & 0xffffff;
}

socklen_t addr_len(const sockaddr *a)
{
	switch (a->sa_family) {
	case AF_INET: return sizeof(sockaddr_in);
	case AF_INET6: return sizeof(sockaddr_in6);
	case AF_IB: return sizeof(sockaddr_ib);
	default: return 0;
	}
}

uint16_t get_port(const sockaddr *a)
{
	switch (a->sa_family) {
	case AF_INET: return ntohs(reinterpret_cast<const sockaddr_in *>(a)->sin_port);
	case AF_INET6: return ntohs(reinterpret_cast<const sockaddr_in6 *>(a)->sin6_port);
	case AF_IB:
		return static_cast<uint16_t>(be64toh(reinterpret_cast<const sockaddr_ib *>(a)->sib_sid) & 0xffff);
	default: return 0;
	}
}

void set_port(sockaddr *a, uint16_t port)
{
	switch (a->sa_family) {
	case AF_INET: reinterpret_cast<sockaddr_in *>(a)->sin_port = htons(port); break;
	case AF_INET6: reinterpret_cast<sockaddr_in6 *>(a)->sin6_port = htons(port); break;
	case AF_IB: {
		auto *s = reinterpret_cast<sockaddr_ib *>(a);
		uint64_t sid = be64toh(s->sib_sid);
		if (!sid)
			sid = RDMA_IB_IP_PS_TCP;
		s->sib_sid = htobe64((sid & ~0xffffULL) | port);
		s->sib_sid_mask = htobe64(~0ULL);
		break;
	}
	default: break;
	}
}

bool is_any(const sockaddr *a)
{
	switch (a->sa_family) {
	case AF_INET: return reinterpret_cast<const sockaddr_in *>(a)->sin_addr.s_addr == htonl(INADDR_ANY);
	case AF_INET6: return IN6_IS_ADDR_UNSPECIFIED(&reinterpret_cast<const sockaddr_in6 *>(a)->sin6_addr);
	case AF_IB: return ib_addr_any(&reinterpret_cast<const sockaddr_ib *>(a)->sib_addr);
	default: return false;
	}
}

// The text an address contributes to a socket name.
std::string addr_text(const sockaddr *a)
{
	char buf[INET6_ADDRSTRLEN + 8] = "";
	if (is_any(a))
		return a->sa_family == AF_INET ? "any4" : a->sa_family == AF_INET6 ? "any6" : "anyib";
	if (a->sa_family == AF_INET)
		inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in *>(a)->sin_addr, buf, sizeof(buf));
	else if (a->sa_family == AF_INET6)
		inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6 *>(a)->sin6_addr, buf, sizeof(buf));
	else if (a->sa_family == AF_IB)
		inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_ib *>(a)->sib_addr, buf, sizeof(buf));
	return buf;
}

// The abstract socket name of (port space, address, port) on our fabric.
sockaddr_un sock_name(int ps, const std::string &addr, uint16_t port, socklen_t &len)
{
	sockaddr_un un{};
	un.sun_family = AF_UNIX;
	int n = snprintf(un.sun_path + 1, sizeof(un.sun_path) - 1, "softverbs-cm/%u/%s/%x/%s/%u",
			 static_cast<unsigned>(getuid()), G().fabric_key.c_str(), ps, addr.c_str(), port);
	if (n < 0 || n >= static_cast<int>(sizeof(un.sun_path) - 1))
		n = sizeof(un.sun_path) - 2;
	len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
	return un;
}

// Is the IP address one of this host's (or loopback)?  A UDP bind answers.
bool ip_is_local(const sockaddr *a)
{
	if (a->sa_family != AF_INET && a->sa_family != AF_INET6)
		return false;
	if (is_any(a))
		return true;
	int s = raw_socket(a->sa_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (s < 0)
		return false;
	sockaddr_storage ss{};
	memcpy(&ss, a, addr_len(a));
	set_port(reinterpret_cast<sockaddr *>(&ss), 0);
	bool ok = bind(s, reinterpret_cast<sockaddr *>(&ss), addr_len(a)) == 0;
	close(s);
	return ok;
}

bool addr_gid(const sockaddr *a, ibv_gid &g)
{
	memset(&g, 0, sizeof(g));
	if (a->sa_family == AF_INET) {
		g.raw[10] = g.raw[11] = 0xff;
		memcpy(&g.raw[12], &reinterpret_cast<const sockaddr_in *>(a)->sin_addr, 4);
		return true;
	}
	if (a->sa_family == AF_INET6) {
		memcpy(g.raw, &reinterpret_cast<const sockaddr_in6 *>(a)->sin6_addr, 16);
		return true;
	}
	if (a->sa_family == AF_IB) {
		memcpy(g.raw, &reinterpret_cast<const sockaddr_ib *>(a)->sib_addr, 16);
		return true;
	}
	return false;
}

int fabric_init_locked()
{
	global &g = G();
	if (g.inited)
		return g.init_err;
	g.inited = true;
	loop::config cfg;
	std::string err;
	std::string fab = "default";
	bool have_cfg = loop::load_config(cfg, err);
	if (have_cfg)
		fab = cfg.fabric;
	else if (const char *e = getenv("SOFTVERBS_FABRIC"))
		fab = e;
	g.fabric_key = fab;
	int n = 0;
	ibv_device **list = ibv_get_device_list(&n);
	if (!list) {
		g.init_err = errno ? errno : ENODEV;
		return g.init_err;
	}
	for (int i = 0; i < n; i++) {
		ibv_context *ctx = ibv_open_device(list[i]);
		if (!ctx)
			continue;
		auto *d = new dev_entry;
		d->ctx = ctx;
		d->name = ibv_get_device_name(list[i]);
		if (ibv_query_device(ctx, &d->attr))
			memset(&d->attr, 0, sizeof(d->attr));
		if (have_cfg)
			for (const loop::device_config &dc : cfg.devices)
				if (dc.name == d->name && dc.rocev2 &&
				    dc.link_layer == IBV_LINK_LAYER_ETHERNET) {
					d->wire = true;
					d->udp_port = dc.udp_port;
					d->ifindex = if_nametoindex(dc.netdev.c_str());
					g.any_wire = true;
				}
		g.devs.push_back(d);
	}
	ibv_free_device_list(list);
	if (const char *d = getenv("SOFTVERBS_ROCEV2_DROP"))
		g.drop_pct = std::clamp(atof(d), 0.0, 100.0);
	if (g.devs.empty())
		g.init_err = ENODEV;
	return g.init_err;
}

dev_entry *dev_by_name(const char *name)
{
	for (dev_entry *d : G().devs)
		if (d->name == name)
			return d;
	return nullptr;
}

struct port_pick {
	dev_entry *dev = nullptr;
	uint8_t port = 0;
	int gid_index = 0;
	ibv_gid gid{};
	uint16_t lid = 0;
	bool eth = false;
	ibv_mtu mtu = IBV_MTU_1024;
};

bool fill_port(dev_entry *d, uint8_t port, port_pick &p)
{
	ibv_port_attr pa;
	if (ibv_query_port(d->ctx, port, &pa))
		return false;
	p.dev = d;
	p.port = port;
	p.lid = pa.lid;
	p.eth = pa.link_layer == IBV_LINK_LAYER_ETHERNET;
	p.mtu = pa.active_mtu;
	return true;
}

// The active MTU of a port (0 if it cannot be read).
uint8_t fill_port_mtu(dev_entry *d, uint8_t port)
{
	ibv_port_attr pa;
	return ibv_query_port(d->ctx, port, &pa) ? 0 : static_cast<uint8_t>(pa.active_mtu);
}

int gid_index_of(dev_entry *d, uint8_t port, const ibv_gid &want)
{
	ibv_port_attr pa;
	if (ibv_query_port(d->ctx, port, &pa))
		return -1;
	for (int i = 0; i < pa.gid_tbl_len; i++) {
		ibv_gid g;
		if (ibv_query_gid(d->ctx, port, i, &g))
			break;
		if (memcmp(&g, &want, sizeof(g)) == 0)
			return i;
	}
	return -1;
}

// Address resolution (docs/rdmacm.md, "Which device an address names"):
// 1. a GID of a port (RoCE: the netdev's addresses, AF_IB: any GID) names
//    that port, devices and ports taken in order;
// 2. otherwise a local IP address names the first active InfiniBand port.
bool resolve_local(const sockaddr *a, port_pick &out)
{
	ibv_gid want;
	if (!addr_gid(a, want))
		return false;
	bool v4any = a->sa_family == AF_INET && is_any(a);
	if (v4any) // INADDR_ANY as a destination means this host: 127.0.0.1
		inet_pton(AF_INET6, "::ffff:127.0.0.1", want.raw);
	for (dev_entry *d : G().devs) {
		for (uint8_t port = 1; port <= d->attr.phys_port_cnt; port++) {
			port_pick p;
			if (!fill_port(d, port, p))
				continue;
			if (!p.eth && a->sa_family != AF_IB)
				continue;
			int idx = gid_index_of(d, port, want);
			if (idx < 0)
				continue;
			p.gid_index = idx;
			p.gid = want;
			out = p;
			return true;
		}
	}
	if (a->sa_family == AF_IB || !ip_is_local(a))
		return false;
	for (dev_entry *d : G().devs) {
		for (uint8_t port = 1; port <= d->attr.phys_port_cnt; port++) {
			port_pick p;
			ibv_port_attr pa;
			if (ibv_query_port(d->ctx, port, &pa) || pa.state != IBV_PORT_ACTIVE ||
			    pa.link_layer == IBV_LINK_LAYER_ETHERNET || !fill_port(d, port, p))
				continue;
			p.gid_index = 0;
			if (ibv_query_gid(d->ctx, port, 0, &p.gid))
				continue;
			out = p;
			return true;
		}
	}
	return false;
}

bool is_mcast(const sockaddr *a)
{
	if (a->sa_family == AF_INET)
		return IN_MULTICAST(ntohl(reinterpret_cast<const sockaddr_in *>(a)->sin_addr.s_addr));
	if (a->sa_family == AF_INET6)
		return IN6_IS_ADDR_MULTICAST(&reinterpret_cast<const sockaddr_in6 *>(a)->sin6_addr);
	if (a->sa_family == AF_IB)
		return reinterpret_cast<const sockaddr_ib *>(a)->sib_addr.sib_raw[0] == 0xff;
	return false;
}

// The first active port of the first device (InfiniBand preferred).
bool first_port(port_pick &out)
{
	for (int want_eth = 0; want_eth < 2; want_eth++)
		for (dev_entry *d : G().devs)
			for (uint8_t port = 1; port <= d->attr.phys_port_cnt; port++) {
				port_pick p;
				ibv_port_attr pa;
				if (ibv_query_port(d->ctx, port, &pa) || pa.state != IBV_PORT_ACTIVE ||
				    (pa.link_layer == IBV_LINK_LAYER_ETHERNET) != (want_eth == 1) ||
				    !fill_port(d, port, p) || ibv_query_gid(d->ctx, port, 0, &p.gid))
					continue;
				out = p;
				return true;
			}
	return false;
}

void apply_pick(cm_id *p, const port_pick &pk)
{
	p->dev = pk.dev;
	p->id.verbs = pk.dev->ctx;
	p->id.port_num = pk.port;
	p->lid = pk.lid;
	p->gid = pk.gid;
	p->gid_index = pk.gid_index;
	p->eth = pk.eth;
	p->mtu = pk.mtu;
	p->id.route.addr.addr.ibaddr.sgid = pk.gid;
	p->id.route.addr.addr.ibaddr.pkey = htobe16(0xffff);
	// As in rdma-core, an id on a device carries the device's PD (one per
	// device and process, allocated at first use) unless the user set one.
	if (!pk.dev->pd)
		pk.dev->pd = ibv_alloc_pd(pk.dev->ctx);
	if (!p->id.pd || p->id.pd->context != pk.dev->ctx)
		p->id.pd = pk.dev->pd;
}

// ------------------------------------------------------------ events ---

cm_id *to_priv(rdma_cm_id *id) { return reinterpret_cast<cm_id *>(id); }
channel_priv *to_chan(rdma_event_channel *c) { return reinterpret_cast<channel_priv *>(c); }

event_priv *new_event(cm_id *about, rdma_cm_event_type type, int status)
{
	auto *e = new event_priv;
	memset(&e->ev, 0, sizeof(e->ev));
	memset(e->pdata, 0, sizeof(e->pdata));
	e->ev.id = &about->id;
	e->ev.event = type;
	e->ev.status = status;
	e->about = about;
	e->counted = about;
	return e;
}

void push_event(channel_priv *c, event_priv *e)
{
	c->q.push_back(e);
	uint64_t one = 1;
	if (write(c->ch.fd, &one, sizeof(one)) != sizeof(one))
		log_msg("%s", "cannot signal an event channel");
}

void push(cm_id *p, rdma_cm_event_type type, int status)
{
	push_event(p->chan, new_event(p, type, status));
}

// How long a disconnected id stays in time-wait before TIMEWAIT_EXIT.
constexpr int64_t kTimewaitMs = 1000;

void push_disconnected(cm_id *p)
{
	push(p, RDMA_CM_EVENT_DISCONNECTED, 0);
	p->timewait_ms = now_ms() + kTimewaitMs;
}

void set_conn_pdata(event_priv *e, const wire_msg &m, int maxlen)
{
	int n = std::min<int>(m.pdata_len, maxlen);
	memcpy(e->pdata, m.pdata, n);
	e->ev.param.conn.private_data = e->pdata;
	e->ev.param.conn.private_data_len = static_cast<uint8_t>(maxlen);
}

// ------------------------------------------------------------ sockets ---

bool send_msg(int fd, wire_msg &m)
{
	m.magic = kMagic;
	m.version = kWireVersion;
	return fd >= 0 && send(fd, &m, sizeof(m), MSG_NOSIGNAL | MSG_DONTWAIT) == sizeof(m);
}

wire_msg base_msg(cm_id *p, uint8_t type)
{
	wire_msg m;
	memset(&m, 0, sizeof(m));
	m.type = type;
	m.lid = p->lid;
	m.port = p->id.port_num;
	m.eth = p->eth;
	m.mtu = static_cast<uint8_t>(p->mtu);
	memcpy(m.sgid, p->gid.raw, 16);
	memcpy(m.dgid, p->rgid.raw, 16);
	if (p->dev)
		snprintf(m.dev, sizeof(m.dev), "%s", p->dev->name.c_str());
	memcpy(&m.src, &p->id.route.addr.src_storage, sizeof(m.src));
	memcpy(&m.dst, &p->id.route.addr.dst_storage, sizeof(m.dst));
	m.ece_vendor = p->local_ece.vendor_id;
	m.ece_options = p->local_ece.options;
	return m;
}

// Over the wire (see "across hosts" below) or the local socket.
bool send_peer(cm_id *p, wire_msg &m);
void on_wire_conn(cm_id *p);
void on_gsi_listener(cm_id *l);
void close_wire(cm_id *p);

void epoll_add(int fd, uint64_t key)
{
	epoll_event ev{};
	ev.events = EPOLLIN;
	ev.data.u64 = key;
	epoll_ctl(G().ep, EPOLL_CTL_ADD, fd, &ev);
}

void close_conn(cm_id *p)
{
	if (p->wire) {
		// The socket stays until the id goes: a peer that missed our
		// last answer repeats itself and hears it again.
		p->resend.clear();
		p->resend_ms = 0;
		return;
	}
	if (p->conn_fd >= 0) {
		epoll_ctl(G().ep, EPOLL_CTL_DEL, p->conn_fd, nullptr);
		close(p->conn_fd);
		p->conn_fd = -1;
	}
}

void remember_remote(cm_id *p, const wire_msg &m)
{
	p->have_remote = true;
	p->rqpn = m.qpn & 0xffffff;
	p->rpsn = m.psn & 0xffffff;
	p->rqkey = m.qkey;
	p->rlid = m.lid;
	memcpy(p->rgid.raw, m.sgid, 16);
	p->rmtu = (m.mtu >= IBV_MTU_256 && m.mtu <= IBV_MTU_4096) ? static_cast<ibv_mtu>(m.mtu) : IBV_MTU_1024;
	p->r_resp = m.resp_res;
	p->r_init = m.init_depth;
	p->r_rnr = m.rnr_retry;
	p->r_retry = m.retry_count;
	p->remote_ece.vendor_id = m.ece_vendor;
	p->remote_ece.options = m.ece_options;
	p->id.route.addr.addr.ibaddr.dgid = p->rgid;
}

void fill_path(cm_id *p)
{
	ibv_sa_path_rec &r = p->path;
	memset(&r, 0, sizeof(r));
	r.sgid = p->gid;
	r.dgid = p->have_remote ? p->rgid : p->gid;
	r.slid = htobe16(p->lid);
	r.dlid = htobe16(p->have_remote ? p->rlid : p->lid);
	r.reversible = 1;
	r.numb_path = 1;
	r.pkey = htobe16(0xffff);
	r.mtu_selector = 2;
	r.mtu = static_cast<uint8_t>(p->have_remote ? std::min(p->mtu, p->rmtu) : p->mtu);
	r.rate_selector = 2;
	r.rate = 7; // 40 Gb/s
	r.packet_life_time_selector = 2;
	r.packet_life_time = packet_life(p);
	r.hop_limit = p->eth ? 64 : 0;
	r.traffic_class = p->tos;
	p->id.route.path_rec = &p->path;
	p->id.route.num_paths = 1;
}

void ah_to_peer(cm_id *p, ibv_ah_attr &ah)
{
	memset(&ah, 0, sizeof(ah));
	ah.port_num = p->id.port_num;
	ah.dlid = p->eth ? 0 : p->rlid;
	if (p->eth) {
		ah.is_global = 1;
		ah.grh.dgid = p->rgid;
		ah.grh.sgid_index = static_cast<uint8_t>(p->gid_index);
		ah.grh.hop_limit = 64;
		ah.grh.traffic_class = p->tos;
	}
}

void destroy_locked(cm_id *p);

void on_eof(cm_id *p, bool garbage)
{
	close_conn(p);
	switch (p->state) {
	case st::connect:
		p->state = st::error;
		push(p, RDMA_CM_EVENT_UNREACHABLE, -ETIMEDOUT);
		break;
	case st::accepted:
		p->state = st::error;
		push(p, RDMA_CM_EVENT_UNREACHABLE, -ETIMEDOUT);
		break;
	case st::req_rcvd:
		p->peer_gone = true;
		break;
	case st::pending_req: {
		// Never seen by the user: forget it.
		destroy_locked(p);
		break;
	}
	case st::rep_rcvd:
	case st::established:
	case st::disc_sent:
		p->state = st::disconnected;
		push_disconnected(p);
		break;
	default:
		break;
	}
	(void)garbage;
}

bool valid_type_for(st s, uint8_t t)
{
	switch (s) {
	case st::pending_req: return t == M_REQ || t == M_SIDR_REQ;
	case st::connect: return t == M_REP || t == M_REJ || t == M_SIDR_REP;
	case st::accepted: return t == M_RTU || t == M_DREQ;
	case st::rep_rcvd:
	case st::established: return t == M_DREQ;
	case st::disc_sent: return t == M_DREQ || t == M_DREP;
	default: return false;
	}
}

bool effective_afonly(const cm_id *p, int family);
void tomb_listener(const cm_id *p);
int bind_abstract(int fd, const std::string &name);
void expire_tombs(int64_t now);

void on_request(cm_id *p, const wire_msg &m)
{
	cm_id *l = p->listener;
	char name[sizeof(m.dev) + 1];
	memcpy(name, m.dev, sizeof(m.dev));
	name[sizeof(m.dev)] = 0;
	dev_entry *d = dev_by_name(name);
	port_pick pk;
	// An IPv6 wildcard listener takes IPv4 connects unless it is AFONLY.
	bool v4_to_v6only = l && l->id.route.addr.src_addr.sa_family == AF_INET6 &&
			    m.dst.ss_family == AF_INET && effective_afonly(l, AF_INET6);
	if (!l || !d || v4_to_v6only || m.port < 1 || m.port > d->attr.phys_port_cnt ||
	    !fill_port(d, m.port, pk)) {
		wire_msg r = base_msg(p, m.type == M_REQ ? M_REJ : M_SIDR_REP);
		r.status = m.type == M_REQ ? kRejInvalidServiceId : 2;
		send_peer(p, r);
		destroy_locked(p);
		return;
	}
	ibv_gid dg;
	memcpy(dg.raw, m.dgid, 16);
	int idx = gid_index_of(d, m.port, dg);
	pk.gid_index = idx < 0 ? 0 : idx;
	if (ibv_query_gid(d->ctx, m.port, pk.gid_index, &pk.gid))
		memset(&pk.gid, 0, sizeof(pk.gid));
	apply_pick(p, pk);
	remember_remote(p, m);
	memcpy(&p->id.route.addr.dst_storage, &m.src, sizeof(m.src));
	memcpy(&p->id.route.addr.src_storage, &m.dst, sizeof(m.dst));
	p->id.ps = l->id.ps;
	// A connection's id is of its listener's type (XRC_RECV for an XRC
	// target's listener), as rdma-core's are.
	ibv_qp_type lt = l->id.qp_type;
	p->id.qp_type = m.type != M_REQ ? IBV_QPT_UD
		      : (lt == IBV_QPT_UC || lt == IBV_QPT_XRC_RECV) ? lt : IBV_QPT_RC;
	fill_path(p);
	p->state = st::req_rcvd;
	auto *e = new_event(p, RDMA_CM_EVENT_CONNECT_REQUEST, 0);
	e->ev.listen_id = &l->id;
	e->counted = l;
	if (m.type == M_REQ) {
		set_conn_pdata(e, m, kReqPdata);
		// From the receiver's side: the peer's initiator depth is our
		// responder resources and the other way round.
		e->ev.param.conn.responder_resources = m.init_depth;
		e->ev.param.conn.initiator_depth = m.resp_res;
		e->ev.param.conn.flow_control = m.flow_control;
		e->ev.param.conn.retry_count = m.retry_count;
		e->ev.param.conn.rnr_retry_count = m.rnr_retry;
		e->ev.param.conn.srq = m.srq;
		e->ev.param.conn.qp_num = m.qpn;
	} else {
		int n = std::min<int>(m.pdata_len, kSidrReqPdata);
		memcpy(e->pdata, m.pdata, n);
		e->ev.param.ud.private_data = e->pdata;
		e->ev.param.ud.private_data_len = kSidrReqPdata;
		ah_to_peer(p, e->ev.param.ud.ah_attr);
		e->ev.param.ud.qp_num = m.qpn;
		e->ev.param.ud.qkey = m.qkey;
	}
	p->req_event = e;
	push_event(l->chan, e);
}

void qp_to_err(cm_id *p);
uint8_t cap(uint8_t v, int max);
void channel_gone(channel_priv *c);

void on_message(cm_id *p, const wire_msg &m)
{
	switch (m.type) {
	case M_REQ:
	case M_SIDR_REQ:
		on_request(p, m);
		return;
	case M_REP: {
		remember_remote(p, m);
		fill_path(p);
		// The passive side's answer sets ours, as the IB CM moves the
		// active QP from the REP: its initiator depth is what we must
		// take as a responder, its responder resources what we may have
		// outstanding as a requester.
		// (Within this device's limits: a peer over RoCE v2 may offer
		// more than our QPs take.)
		p->resp_res = p->dev ? cap(m.init_depth, p->dev->attr.max_qp_rd_atom) : m.init_depth;
		p->init_depth = p->dev ? cap(m.resp_res, p->dev->attr.max_qp_init_rd_atom) : m.resp_res;
		p->state = st::rep_rcvd;
		auto *e = new_event(p, RDMA_CM_EVENT_CONNECT_RESPONSE, 0);
		set_conn_pdata(e, m, kRepPdata);
		e->ev.param.conn.responder_resources = m.init_depth;
		e->ev.param.conn.initiator_depth = m.resp_res;
		e->ev.param.conn.flow_control = m.flow_control;
		e->ev.param.conn.rnr_retry_count = m.rnr_retry;
		e->ev.param.conn.srq = m.srq;
		e->ev.param.conn.qp_num = m.qpn;
		e->conn_resp = true;
		push_event(p->chan, e);
		return;
	}
	case M_REJ: {
		p->state = st::rejected;
		// As rdma-core's rdma_get_cm_event: a rejected id's QP goes to
		// ERR, and what it had posted completes flushed.
		qp_to_err(p);
		auto *e = new_event(p, RDMA_CM_EVENT_REJECTED, static_cast<int>(m.status));
		set_conn_pdata(e, m, kRejPdata);
		push_event(p->chan, e);
		close_conn(p);
		return;
	}
	case M_SIDR_REP: {
		close_conn(p);
		if (m.status) {
			p->state = st::rejected;
			auto *e = new_event(p, RDMA_CM_EVENT_UNREACHABLE, -ECONNREFUSED);
			push_event(p->chan, e);
			return;
		}
		remember_remote(p, m);
		fill_path(p);
		p->state = st::established;
		auto *e = new_event(p, RDMA_CM_EVENT_ESTABLISHED, 0);
		int n = std::min<int>(m.pdata_len, kSidrRepPdata);
		memcpy(e->pdata, m.pdata, n);
		e->ev.param.ud.private_data = e->pdata;
		e->ev.param.ud.private_data_len = kSidrRepPdata;
		ah_to_peer(p, e->ev.param.ud.ah_attr);
		e->ev.param.ud.qp_num = m.qpn & 0xffffff;
		e->ev.param.ud.qkey = m.qkey;
		push_event(p->chan, e);
		return;
	}
	case M_RTU:
		if (p->state != st::accepted) {
			// Late (valid_type_for let it through for rtu_late only).
			if (p->est_on_rtu)
				push(p, RDMA_CM_EVENT_ESTABLISHED, 0);
			p->rtu_late = p->est_on_rtu = false;
			return;
		}
		p->state = st::established;
		push(p, RDMA_CM_EVENT_ESTABLISHED, 0);
		return;
	case M_DREQ: {
		wire_msg r = base_msg(p, M_DREP);
		send_peer(p, r);
		if (p->state == st::accepted) // DREQ overtook nothing: RTU came first
			p->state = st::established;
		p->state = st::disconnected;
		push_disconnected(p);
		close_conn(p);
		return;
	}
	case M_DREP:
		p->state = st::disconnected;
		push_disconnected(p);
		close_conn(p);
		return;
	default:
		return;
	}
}

cm_id *new_child(cm_id *l)
{
	auto *c = new cm_id;
	memset(&c->id, 0, sizeof(c->id));
	c->serial = G().next_serial++;
	c->state = st::pending_req;
	c->listener = l;
	c->sync = l->sync;
	c->id.context = l->id.context;
	c->id.ps = l->id.ps;
	c->tos = l->tos;
	if (l->sync) {
		auto *ch = new channel_priv;
		ch->ch.fd = eventfd(0, EFD_CLOEXEC | EFD_SEMAPHORE);
		c->chan = ch;
	} else {
		c->chan = l->chan;
	}
	c->id.channel = &c->chan->ch;
	l->children.push_back(c);
	G().ids[c->serial] = c;
	return c;
}

void on_listener(cm_id *l)
{
	for (;;) {
		int fd = accept4(l->bind_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
		if (fd < 0)
			return;
		ucred cr{};
		socklen_t cl = sizeof(cr);
		if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &cl) || cr.uid != getuid()) {
			log_msg("%s", "refused a connection from another user");
			close(fd);
			continue;
		}
		cm_id *c = new_child(l);
		c->conn_fd = fd;
		epoll_add(fd, c->serial << 2 | 1);
	}
}

// ------------------------------------------------------ across hosts ---
// A peer on another host (docs/rdmacm.md, "Across hosts"): the messages
// are the IB CM's MADs (cm_mad.h) in RoCE v2 packets to the peer's QP1,
// sent from a UDP socket of our own; the host's port owner (the provider's
// receive thread) hands those for us to the datagram socket named after
// the communication (conn_fd) or, for a REQ, the listener's service ID
// (gsi_fd).  A datagram may be lost: a REQ, REP or DREQ goes again until
// its answer comes or the CM timeout runs out, and a repeated REQ, REP or
// DREQ gets the answer it had again.

namespace cmw = loop::rocev2::cm;
namespace rv = loop::rocev2;

int64_t resend_interval_ms()
{
	return std::clamp<int64_t>(cm_timeout_ms() / 16, 100, 1000);
}

uint64_t rand64()
{
	uint64_t v = 0;
	if (getrandom(&v, sizeof(v), 0) != sizeof(v))
		v = static_cast<uint64_t>(random()) << 32 | static_cast<uint64_t>(random());
	return v;
}

// The IP address of a RoCE v2 GID: 16 bytes, IPv4 in the first 4.
void gid_ip(const ibv_gid &g, bool &v4, uint8_t ip[16])
{
	static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
	memset(ip, 0, 16);
	v4 = memcmp(g.raw, mapped, sizeof(mapped)) == 0;
	if (v4)
		memcpy(ip, g.raw + 12, 4);
	else
		memcpy(ip, g.raw, 16);
}

// The CM's UDP socket of a family (opened at first use): DF set, so that
// the IPv4 identification is 0 as the ICRC assumes (wire.h).
int wire_socket(bool v4, uint16_t &port)
{
	global &g = G();
	int &fd = v4 ? g.udp4 : g.udp6;
	uint16_t &bound = v4 ? g.uport4 : g.uport6;
	if (fd < 0) {
		int s = raw_socket(v4 ? AF_INET : AF_INET6, SOCK_DGRAM | SOCK_CLOEXEC, 0);
		if (s < 0)
			return -1;
		int one = 1;
		if (v4) {
			int pm = IP_PMTUDISC_DO;
			setsockopt(s, IPPROTO_IP, IP_MTU_DISCOVER, &pm, sizeof(pm));
		} else {
			int pm = IPV6_PMTUDISC_DO;
			setsockopt(s, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
			setsockopt(s, IPPROTO_IPV6, IPV6_MTU_DISCOVER, &pm, sizeof(pm));
		}
		sockaddr_storage ss{};
		ss.ss_family = static_cast<sa_family_t>(v4 ? AF_INET : AF_INET6);
		socklen_t sl = v4 ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
		if (bind(s, reinterpret_cast<sockaddr *>(&ss), sl) ||
		    getsockname(s, reinterpret_cast<sockaddr *>(&ss), &sl)) {
			close(s);
			return -1;
		}
		bound = get_port(reinterpret_cast<sockaddr *>(&ss));
		fd = s;
	}
	port = bound;
	return fd;
}

// Sends a MAD to p's peer's QP1.  A packet the loss knob takes counts as
// sent (lost on the wire).
bool wire_send_mad(cm_id *p, const uint8_t *mad)
{
	uint16_t sport = 0;
	int fd = wire_socket(p->peer_v4, sport);
	if (fd < 0)
		return false;
	uint8_t pkt[cmw::kMadLen + 64];
	size_t n = cmw::build_gsi_packet(pkt, mad, rand24());
	rv::ip_info ip;
	ip.v6 = !p->peer_v4;
	memcpy(ip.src, p->my_ip, 16);
	memcpy(ip.dst, p->peer_ip, 16);
	ip.sport = sport;
	ip.dport = p->udp_port;
	rv::put_icrc(pkt + n, rv::icrc(ip, pkt, n));
	n += rv::kIcrcLen;
	double pct = G().drop_pct;
	if (pct > 0 && rand24() % 1000000 < static_cast<uint32_t>(pct * 10000))
		return true;
	iovec iov{pkt, n};
	msghdr mh{};
	mh.msg_iov = &iov;
	mh.msg_iovlen = 1;
	alignas(cmsghdr) char cbuf[CMSG_SPACE(sizeof(in6_pktinfo))] = {};
	mh.msg_control = cbuf;
	sockaddr_in sa4{};
	sockaddr_in6 sa6{};
	if (p->peer_v4) {
		sa4.sin_family = AF_INET;
		sa4.sin_port = htons(p->udp_port);
		memcpy(&sa4.sin_addr, p->peer_ip, 4);
		mh.msg_name = &sa4;
		mh.msg_namelen = sizeof(sa4);
		mh.msg_controllen = CMSG_SPACE(sizeof(in_pktinfo));
		cmsghdr *c = CMSG_FIRSTHDR(&mh);
		c->cmsg_level = IPPROTO_IP;
		c->cmsg_type = IP_PKTINFO;
		c->cmsg_len = CMSG_LEN(sizeof(in_pktinfo));
		in_pktinfo pi{};
		memcpy(&pi.ipi_spec_dst, p->my_ip, 4);
		memcpy(CMSG_DATA(c), &pi, sizeof(pi));
	} else {
		bool ll = p->peer_ip[0] == 0xfe && (p->peer_ip[1] & 0xc0) == 0x80;
		sa6.sin6_family = AF_INET6;
		sa6.sin6_port = htons(p->udp_port);
		memcpy(&sa6.sin6_addr, p->peer_ip, 16);
		if (ll)
			sa6.sin6_scope_id = p->ifindex;
		mh.msg_name = &sa6;
		mh.msg_namelen = sizeof(sa6);
		mh.msg_controllen = CMSG_SPACE(sizeof(in6_pktinfo));
		cmsghdr *c = CMSG_FIRSTHDR(&mh);
		c->cmsg_level = IPPROTO_IPV6;
		c->cmsg_type = IPV6_PKTINFO;
		c->cmsg_len = CMSG_LEN(sizeof(in6_pktinfo));
		in6_pktinfo pi{};
		memcpy(&pi.ipi6_addr, p->my_ip, 16);
		pi.ipi6_ifindex = ll ? p->ifindex : 0;
		memcpy(CMSG_DATA(c), &pi, sizeof(pi));
	}
	return sendmsg(fd, &mh, MSG_DONTWAIT) >= 0 || errno == EAGAIN || errno == ENOBUFS;
}

uint16_t attr_of(uint8_t type)
{
	switch (type) {
	case M_REQ: return cmw::REQ;
	case M_REP: return cmw::REP;
	case M_RTU: return cmw::RTU;
	case M_REJ: return cmw::REJ;
	case M_DREQ: return cmw::DREQ;
	case M_DREP: return cmw::DREP;
	case M_SIDR_REQ: return cmw::SIDR_REQ;
	default: return cmw::SIDR_REP;
	}
}

// The address bytes of a socket address (IPv4: the first 4 of 16).
void sa_ip(const sockaddr *a, uint8_t ip[16])
{
	memset(ip, 0, 16);
	if (a->sa_family == AF_INET)
		memcpy(ip, &reinterpret_cast<const sockaddr_in *>(a)->sin_addr, 4);
	else if (a->sa_family == AF_INET6)
		memcpy(ip, &reinterpret_cast<const sockaddr_in6 *>(a)->sin6_addr, 16);
}

// rdma_cm's IP header of p's REQ or SIDR REQ, at the start of its
// private data: p's source and destination.
void put_ip_header(const cm_id *p, uint8_t *pdata)
{
	cmw::cma_hdr c;
	const sockaddr *src = &p->id.route.addr.src_addr;
	c.ip_version = src->sa_family == AF_INET ? 4 : 6;
	c.src_port = get_port(src);
	sa_ip(src, c.src);
	sa_ip(&p->id.route.addr.dst_addr, c.dst);
	cmw::put_cma_hdr(pdata, c);
}

// m (what the local protocol would carry) as p's MAD.
void encode_mad(cm_id *p, const wire_msg &m, uint8_t *mad)
{
	memset(mad, 0, cmw::kMadLen);
	cmw::mad_hdr h;
	h.tid = p->tid;
	h.attr_id = attr_of(m.type);
	cmw::put_hdr(mad, h);
	int plen = m.pdata_len;
	switch (m.type) {
	case M_REQ: {
		cmw::req q;
		q.local_comm_id = p->lcomm;
		q.service_id = cmw::service_id(p->id.ps, get_port(&p->id.route.addr.dst_addr));
		q.local_ca_guid = be64toh(p->dev->attr.node_guid);
		q.local_qpn = m.qpn & 0xffffff;
		q.responder_resources = m.resp_res;
		q.initiator_depth = m.init_depth;
		q.end_to_end_flow_control = m.flow_control;
		q.starting_psn = m.psn & 0xffffff;
		q.retry_count = m.retry_count & 7;
		q.rnr_retry_count = m.rnr_retry & 7;
		q.path_mtu = m.mtu;
		q.srq = m.srq;
		memcpy(q.primary_local_gid, p->gid.raw, 16);
		memcpy(q.primary_remote_gid, p->rgid.raw, 16);
		// Routed (hop limit above 1): permissive LIDs, not subnet local,
		// as the kernel's CM fills a RoCE path.
		q.primary_subnet_local = false;
		q.primary_traffic_class = p->tos;
		q.primary_hop_limit = 64;
		q.primary_packet_rate = p->path.rate;
		q.primary_local_ack_timeout = qp_ack_timeout(p);
		put_ip_header(p, q.private_data);
		memcpy(q.private_data + cmw::kCmaHdrLen, m.pdata, std::min(plen, kReqPdata));
		cmw::put_req(mad, q);
		return;
	}
	case M_REP: {
		cmw::rep r;
		r.local_comm_id = p->lcomm;
		r.remote_comm_id = p->rcomm;
		r.local_qpn = m.qpn & 0xffffff;
		r.starting_psn = m.psn & 0xffffff;
		r.responder_resources = m.resp_res;
		r.initiator_depth = m.init_depth;
		r.target_ack_delay = 15;
		r.end_to_end_flow_control = m.flow_control;
		r.rnr_retry_count = m.rnr_retry & 7;
		r.srq = m.srq;
		r.local_ca_guid = be64toh(p->dev->attr.node_guid);
		memcpy(r.private_data, m.pdata, std::min(plen, kRepPdata));
		cmw::put_rep(mad, r);
		return;
	}
	case M_SIDR_REQ: {
		cmw::sidr_req q;
		q.request_id = p->lcomm;
		q.service_id = cmw::service_id(p->id.ps, get_port(&p->id.route.addr.dst_addr));
		put_ip_header(p, q.private_data);
		memcpy(q.private_data + cmw::kCmaHdrLen, m.pdata, std::min(plen, kSidrReqPdata));
		cmw::put_sidr_req(mad, q);
		return;
	}
	case M_SIDR_REP: {
		cmw::sidr_rep r;
		r.request_id = p->rcomm;
		r.status = static_cast<uint8_t>(m.status);
		r.qpn = m.qpn & 0xffffff;
		r.qkey = m.qkey;
		r.service_id = cmw::service_id(p->id.ps, get_port(&p->id.route.addr.src_addr));
		memcpy(r.private_data, m.pdata, std::min(plen, kSidrRepPdata));
		cmw::put_sidr_rep(mad, r);
		return;
	}
	case M_REJ: {
		cmw::rej r;
		r.local_comm_id = p->lcomm;
		r.remote_comm_id = p->rcomm;
		r.message_rejected = p->state == st::rep_rcvd ? cmw::kRejectedRep : cmw::kRejectedReq;
		r.reason = static_cast<uint16_t>(m.status);
		memcpy(r.private_data, m.pdata, std::min(plen, kRejPdata));
		cmw::put_rej(mad, r);
		return;
	}
	default: { // RTU, DREQ, DREP
		cmw::short_msg s;
		s.local_comm_id = p->lcomm;
		s.remote_comm_id = p->rcomm;
		s.remote_qpn = p->rqpn;
		cmw::put_short(mad, h.attr_id, s);
		return;
	}
	}
}

// A MAD for connection p as the message on_message reads; false when it
// is not one for p (another communication's, or a kind not served).
bool decode_mad(cm_id *p, const uint8_t *mad, wire_msg &m)
{
	cmw::mad_hdr h;
	cmw::get_hdr(mad, h);
	memset(&m, 0, sizeof(m));
	memcpy(m.sgid, p->rgid.raw, 16);
	m.mtu = static_cast<uint8_t>(p->mtu);
	m.eth = 1;
	m.port = p->id.port_num;
	m.retry_count = p->retry;
	switch (h.attr_id) {
	case cmw::REP: {
		cmw::rep r;
		cmw::get_rep(mad, r);
		if (r.remote_comm_id != p->lcomm || !r.local_comm_id)
			return false;
		m.type = M_REP;
		m.qpn = r.local_qpn;
		m.psn = r.starting_psn;
		m.qkey = r.local_qkey;
		m.resp_res = r.responder_resources;
		m.init_depth = r.initiator_depth;
		m.flow_control = r.end_to_end_flow_control;
		m.rnr_retry = r.rnr_retry_count;
		m.srq = r.srq;
		memcpy(m.pdata, r.private_data, kRepPdata);
		m.pdata_len = kRepPdata;
		if (p->state == st::connect)
			p->rcomm = r.local_comm_id;
		return true;
	}
	case cmw::SIDR_REP: {
		cmw::sidr_rep r;
		cmw::get_sidr_rep(mad, r);
		if (r.request_id != p->lcomm)
			return false;
		m.type = M_SIDR_REP;
		m.status = r.status;
		m.qpn = r.qpn;
		m.qkey = r.qkey;
		memcpy(m.pdata, r.private_data, kSidrRepPdata);
		m.pdata_len = kSidrRepPdata;
		return true;
	}
	case cmw::REJ: {
		cmw::rej r;
		cmw::get_rej(mad, r);
		if (r.remote_comm_id != p->lcomm)
			return false;
		m.type = M_REJ;
		m.status = r.reason;
		memcpy(m.pdata, r.private_data, kRejPdata);
		m.pdata_len = kRejPdata;
		return true;
	}
	case cmw::RTU:
	case cmw::DREQ:
	case cmw::DREP: {
		cmw::short_msg s;
		cmw::get_short(mad, h.attr_id, s);
		if (s.remote_comm_id != p->lcomm || s.local_comm_id != p->rcomm)
			return false;
		m.type = h.attr_id == cmw::RTU ? M_RTU : h.attr_id == cmw::DREQ ? M_DREQ : M_DREP;
		return true;
	}
	default:
		return false;
	}
}

// Sends m to p's peer over the wire; a REQ, REP or DREQ is kept to be sent
// again until its answer, an RTU or DREP to answer a repeat with.
bool wire_send(cm_id *p, const wire_msg &m)
{
	uint8_t mad[cmw::kMadLen];
	encode_mad(p, m, mad);
	if (!wire_send_mad(p, mad))
		return false;
	if (m.type == M_REQ || m.type == M_REP || m.type == M_DREQ || m.type == M_SIDR_REQ) {
		p->resend.assign(mad, mad + cmw::kMadLen);
		p->resend_ms = now_ms() + resend_interval_ms();
	} else if (m.type == M_RTU || m.type == M_DREP || m.type == M_REJ || m.type == M_SIDR_REP) {
		p->answer.assign(mad, mad + cmw::kMadLen);
	}
	return true;
}

// A datagram socket named for the GSI's hand-over (cm_mad.h): of a
// connection (by_service false: a fresh local comm ID, free on this host)
// or of a listener (its service ID).  -1 with errno.
int gsi_socket(uint16_t udp_port, bool by_service, uint64_t &key)
{
	int fd = raw_socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return -1;
	int one = 1;
	setsockopt(fd, SOL_SOCKET, SO_PASSCRED, &one, sizeof(one));
	for (int tries = 0; tries < 64; tries++) {
		if (!by_service) {
			key = static_cast<uint32_t>(rand64());
			if (!key)
				continue;
		}
		sockaddr_un un{};
		un.sun_family = AF_UNIX;
		size_t n = cmw::gsi_socket_name(un.sun_path + 1, sizeof(un.sun_path) - 1, getuid(),
						 udp_port, by_service, key);
		if (!bind(fd, reinterpret_cast<sockaddr *>(&un),
			  static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n)))
			return fd;
		if (by_service || errno != EADDRINUSE)
			break;
	}
	int e = errno;
	close(fd);
	errno = e;
	return -1;
}

// p's connection socket and local comm ID.
bool open_comm(cm_id *p)
{
	uint64_t key = 0;
	int fd = gsi_socket(p->udp_port, false, key);
	if (fd < 0)
		return false;
	p->lcomm = static_cast<uint32_t>(key);
	p->conn_fd = fd;
	epoll_add(fd, p->serial << 2 | 1);
	return true;
}

// Reads one MAD the port's owner handed over: 1, 0 for a datagram that is
// not one (dropped), -1 when none is left.
int recv_gsi(int fd, cmw::gsi_fwd &f, uint8_t *mad)
{
	uint8_t buf[sizeof(cmw::gsi_fwd) + cmw::kMadLen + 1];
	iovec iov{buf, sizeof(buf)};
	alignas(cmsghdr) char cbuf[CMSG_SPACE(sizeof(ucred))];
	msghdr mh{};
	mh.msg_iov = &iov;
	mh.msg_iovlen = 1;
	mh.msg_control = cbuf;
	mh.msg_controllen = sizeof(cbuf);
	ssize_t n = recvmsg(fd, &mh, MSG_DONTWAIT);
	if (n < 0)
		return -1;
	bool ours = false;
	for (cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c))
		if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_CREDENTIALS) {
			ucred cr;
			memcpy(&cr, CMSG_DATA(c), sizeof(cr));
			ours = cr.uid == getuid();
		}
	if (!ours || static_cast<size_t>(n) != sizeof(buf) - 1)
		return 0;
	memcpy(&f, buf, sizeof(f));
	if (memcmp(f.magic, "SVGM", 4))
		return 0;
	memcpy(mad, buf + sizeof(f), cmw::kMadLen);
	return cmw::is_cm_mad(mad, cmw::kMadLen) ? 1 : 0;
}

// Sends p's last answer again to a peer that repeated the message it
// answered (REP: our RTU; DREQ: our DREP; REQ: our REP or REJ).
void answer_repeat(cm_id *p, uint16_t repeated)
{
	const std::vector<uint8_t> &a = p->state == st::accepted && repeated == cmw::REQ
						? p->resend
						: p->answer;
	if (a.size() != cmw::kMadLen)
		return;
	uint16_t kind = static_cast<uint16_t>(a[16] << 8 | a[17]);
	bool fits = (repeated == cmw::REP && kind == cmw::RTU) ||
		    (repeated == cmw::DREQ && kind == cmw::DREP) ||
		    (repeated == cmw::REQ && (kind == cmw::REP || kind == cmw::REJ)) ||
		    (repeated == cmw::SIDR_REQ && kind == cmw::SIDR_REP);
	if (fits)
		wire_send_mad(p, a.data());
}

// A DREQ for a connection that is over (disconnected, or its id gone):
// a DREP, as the IB CM answers one in its time wait.
void answer_dreq(cm_id *p)
{
	if (p->answer.size() == cmw::kMadLen && (p->answer[16] << 8 | p->answer[17]) == cmw::DREP) {
		wire_send_mad(p, p->answer.data());
		return;
	}
	wire_msg m;
	memset(&m, 0, sizeof(m));
	m.type = M_DREP;
	wire_send(p, m); // Kept as the answer to the next repeat
}

// How long an id over the wire lingers after its destruction.
int64_t linger_ms()
{
	return std::min<int64_t>(cm_timeout_ms(), 5000);
}

// A lingering id's socket got a MAD: a repeat gets the answer again.
void on_linger(int fd)
{
	auto it = G().lingers.find(fd);
	if (it == G().lingers.end())
		return;
	cm_id *g = it->second;
	for (;;) {
		cmw::gsi_fwd f;
		uint8_t mad[cmw::kMadLen];
		int r = recv_gsi(fd, f, mad);
		if (r < 0)
			return;
		if (!r || memcmp(f.from, g->peer_ip, 16))
			continue;
		auto attr = static_cast<uint16_t>(mad[16] << 8 | mad[17]);
		if (attr == cmw::DREP || attr == cmw::DREQ) {
			// Our DREQ is answered (or crossed the peer's): done.
			g->resend.clear();
			g->resend_ms = 0;
			g->state = st::disconnected;
		}
		if (attr == cmw::DREQ)
			answer_dreq(g);
		else
			answer_repeat(g, attr);
	}
}

// Whether a lingering id still sends a DREQ (the exit waits for those).
bool lingers_sending()
{
	for (auto &kv : G().lingers)
		if (!kv.second->resend.empty())
			return true;
	return false;
}

// At exit, DREQs not answered yet go on for their time wait: the peer's
// connection ends with DISCONNECTED, not never.  The CM thread sends them
// and hears the DREPs meanwhile.
void linger_cm_at_exit()
{
	std::unique_lock<std::mutex> lk(G().mu);
	int64_t until = now_ms() + linger_ms();
	while (lingers_sending() && now_ms() < until) {
		lk.unlock();
		usleep(10000);
		lk.lock();
	}
}

void expire_lingers(int64_t now, int64_t &next)
{
	for (auto it = G().lingers.begin(); it != G().lingers.end();) {
		cm_id *g = it->second;
		if (g->timewait_ms <= now) {
			epoll_ctl(G().ep, EPOLL_CTL_DEL, it->first, nullptr);
			close(it->first);
			delete g;
			it = G().lingers.erase(it);
			continue;
		}
		if (!g->resend.empty()) {
			if (g->resend_ms <= now) {
				wire_send_mad(g, g->resend.data());
				g->resend_ms = now + resend_interval_ms();
			}
			if (next < 0 || g->resend_ms < next)
				next = g->resend_ms;
		}
		if (next < 0 || g->timewait_ms < next)
			next = g->timewait_ms;
		++it;
	}
}

void on_wire_conn(cm_id *p)
{
	for (;;) {
		if (p->conn_fd < 0)
			return;
		cmw::gsi_fwd f;
		uint8_t mad[cmw::kMadLen];
		int r = recv_gsi(p->conn_fd, f, mad);
		if (r < 0)
			return;
		if (!r || memcmp(f.from, p->peer_ip, 16))
			continue; // Not a MAD, or not from our peer
		cmw::mad_hdr h;
		cmw::get_hdr(mad, h);
		// The peer repeats itself: it did not hear our answer.
		if (h.attr_id == cmw::REP && p->state == st::established) {
			answer_repeat(p, h.attr_id);
			continue;
		}
		if (h.attr_id == cmw::DREQ && p->state == st::disconnected) {
			answer_dreq(p);
			continue;
		}
		if (h.attr_id == cmw::MRA) { // "Wait longer": the peer is alive
			if (p->deadline_ms && (p->state == st::connect || p->state == st::accepted))
				p->deadline_ms = now_ms() + cm_timeout_ms();
			continue;
		}
		wire_msg m;
		if (!decode_mad(p, mad, m))
			continue;
		// A REJ may answer our REP too (the peer could not use it).
		bool rej_of_rep = m.type == M_REJ && p->state == st::accepted;
		if (!rej_of_rep && !valid_type_for(p->state, m.type) &&
		    !(m.type == M_RTU && p->rtu_late))
			continue; // Stray or late: a datagram tears nothing down
		p->resend.clear();
		p->resend_ms = 0;
		on_message(p, m);
	}
}

// Whether listener l takes a connection to dst.
bool listener_takes(const cm_id *l, const sockaddr *dst)
{
	const sockaddr *la = &l->id.route.addr.src_addr;
	if (is_any(la))
		return la->sa_family == dst->sa_family ||
		       (la->sa_family == AF_INET6 && dst->sa_family == AF_INET);
	if (la->sa_family != dst->sa_family)
		return false;
	uint8_t a[16], b[16];
	sa_ip(la, a);
	sa_ip(dst, b);
	return memcmp(a, b, 16) == 0;
}

// A REQ from another host to listener l: a new id, as a connection
// accepted on the local socket makes, and the request through on_request.
// A GID from an IP address in 16 bytes (IPv4: the first 4), as gid_ip's
// inverse.
void ip_gid(bool v4, const uint8_t ip[16], uint8_t gid[16])
{
	memset(gid, 0, 16);
	if (v4) {
		gid[10] = gid[11] = 0xff;
		memcpy(gid + 12, ip, 4);
	} else {
		memcpy(gid, ip, 16);
	}
}

// A REQ or SIDR REQ from another host to listener l: a new id, as a
// connection accepted on the local socket makes, and the request through
// on_request.
void on_gsi_listener(cm_id *l)
{
	for (;;) {
		if (l->gsi_fd < 0 || l->state != st::listen)
			return;
		cmw::gsi_fwd f;
		uint8_t mad[cmw::kMadLen];
		int r = recv_gsi(l->gsi_fd, f, mad);
		if (r < 0)
			return;
		cmw::mad_hdr h;
		cmw::get_hdr(mad, h);
		if (!r || (h.attr_id != cmw::REQ && h.attr_id != cmw::SIDR_REQ))
			continue;
		bool sidr = h.attr_id == cmw::SIDR_REQ;
		// What the two share: the requester's ID, the service, rdma_cm's
		// private data, and the GIDs (a SIDR REQ has none: the packet's
		// addresses).
		cmw::req q;
		cmw::sidr_req sq;
		uint32_t rid;
		uint64_t sid;
		const uint8_t *pdata;
		uint8_t our_gid[16], peer_gid[16];
		if (sidr) {
			cmw::get_sidr_req(mad, sq);
			rid = sq.request_id;
			sid = sq.service_id;
			pdata = sq.private_data;
			ip_gid(f.v4, f.to, our_gid);
			ip_gid(f.v4, f.from, peer_gid);
		} else {
			cmw::get_req(mad, q);
			rid = q.local_comm_id;
			sid = q.service_id;
			pdata = q.private_data;
			memcpy(our_gid, q.primary_remote_gid, 16);
			memcpy(peer_gid, q.primary_local_gid, 16);
		}
		// A repeat of a request one of our ids has: its answer again, if
		// sent (a REP or REJ, a SIDR REP).
		bool repeat = false;
		for (cm_id *c : l->children)
			if (c->wire && c->rcomm == rid && !memcmp(c->peer_ip, f.from, 16)) {
				repeat = true;
				answer_repeat(c, h.attr_id);
			}
		for (auto &kv : G().lingers) {
			cm_id *g = kv.second;
			if (g->rcomm == rid && !memcmp(g->peer_ip, f.from, 16)) {
				repeat = true;
				answer_repeat(g, h.attr_id);
			}
		}
		if (repeat)
			continue;
		// Requests not accepted yet, at most the listen backlog: beyond it
		// a REQ gets REJ "no resources" (a SIDR REQ a SIDR REP "rejected"),
		// so a flood of forged REQs takes no more than that many sockets.
		int pending = 0;
		for (cm_id *c : l->children)
			pending += c->wire && (c->state == st::pending_req || c->state == st::req_rcvd);
		// The device: the wire port whose GID the request names as ours.
		dev_entry *dev = nullptr;
		uint8_t port = 0;
		ibv_gid want;
		memcpy(want.raw, our_gid, 16);
		for (dev_entry *d : G().devs)
			for (uint8_t pn = 1; d->wire && !dev && pn <= d->attr.phys_port_cnt; pn++)
				if (gid_index_of(d, pn, want) >= 0) {
					dev = d;
					port = pn;
				}
		cm_id *c = new_child(l);
		c->wire = true;
		c->peer_v4 = f.v4 != 0;
		memcpy(c->peer_ip, f.from, 16);
		memcpy(c->my_ip, f.to, 16);
		c->tid = h.tid;
		c->rcomm = rid;
		c->udp_port = dev ? dev->udp_port : l->udp_port;
		c->ifindex = dev ? dev->ifindex : 0;
		if (!open_comm(c)) {
			destroy_locked(c);
			continue;
		}
		if (pending >= l->backlog) {
			wire_msg rj;
			memset(&rj, 0, sizeof(rj));
			rj.type = sidr ? M_SIDR_REP : M_REJ;
			rj.status = sidr ? 2 : cmw::kRejNoResources;
			wire_send(c, rj);
			c->answer.clear(); // No time wait: the name goes at once
			destroy_locked(c);
			continue;
		}
		wire_msg m;
		memset(&m, 0, sizeof(m));
		m.type = sidr ? M_SIDR_REQ : M_REQ;
		if (!sidr) {
			m.qpn = q.local_qpn;
			m.psn = q.starting_psn;
			m.qkey = q.local_qkey;
			m.resp_res = q.responder_resources;
			m.init_depth = q.initiator_depth;
			m.flow_control = q.end_to_end_flow_control;
			m.retry_count = q.retry_count;
			m.rnr_retry = q.rnr_retry_count;
			m.srq = q.srq;
			m.mtu = q.path_mtu;
		} else {
			uint8_t mtu = dev ? fill_port_mtu(dev, port) : 0;
			m.mtu = mtu ? mtu : static_cast<uint8_t>(IBV_MTU_1024);
		}
		m.port = port;
		m.eth = 1;
		memcpy(m.sgid, peer_gid, 16);
		memcpy(m.dgid, our_gid, 16);
		cmw::cma_hdr ch;
		bool ok = dev && cmw::get_cma_hdr(pdata, ch) &&
			  (sid >> 16) == static_cast<uint64_t>(l->id.ps);
		if (ok) {
			auto put = [](sockaddr_storage &ss, const cmw::cma_hdr &hd, const uint8_t *ip,
				      uint16_t pt) {
				if (hd.ip_version == 4) {
					auto &s4 = reinterpret_cast<sockaddr_in &>(ss);
					s4.sin_family = AF_INET;
					memcpy(&s4.sin_addr, ip, 4);
					s4.sin_port = htons(pt);
				} else {
					auto &s6 = reinterpret_cast<sockaddr_in6 &>(ss);
					s6.sin6_family = AF_INET6;
					memcpy(&s6.sin6_addr, ip, 16);
					s6.sin6_port = htons(pt);
				}
			};
			put(m.src, ch, ch.src, ch.src_port);
			put(m.dst, ch, ch.dst, static_cast<uint16_t>(sid & 0xffff));
			ok = listener_takes(l, reinterpret_cast<sockaddr *>(&m.dst));
		}
		if (ok)
			snprintf(m.dev, sizeof(m.dev), "%s", dev->name.c_str());
		int plen = sidr ? kSidrReqPdata : kReqPdata;
		memcpy(m.pdata, pdata + cmw::kCmaHdrLen, plen);
		m.pdata_len = static_cast<uint8_t>(plen);
		// A request for no device of ours, another port space or an
		// address this listener does not take: on_request rejects it
		// (invalid service ID), as it does a local one.
		on_request(c, m);
	}
}

// The listener's socket for REQs from other hosts: taken by the first of
// this user's processes to listen on the port (the port's rules make that
// the only one but for REUSEADDR twins and addresses of one port).
void open_listener_gsi(cm_id *l)
{
	if (l->gsi_fd >= 0)
		return;
	dev_entry *dev = nullptr;
	for (dev_entry *d : G().devs)
		if (d->wire && (!dev || d == l->dev))
			dev = d;
	if (!dev)
		return;
	l->udp_port = dev->udp_port;
	uint64_t sid = cmw::service_id(l->id.ps, get_port(&l->id.route.addr.src_addr));
	int fd = gsi_socket(l->udp_port, true, sid);
	if (fd < 0) {
		if (errno == EADDRINUSE)
			log_msg("%s", "another listener of this user has this port over RoCE v2: "
				      "requests from other hosts go to it");
		return;
	}
	l->gsi_fd = fd;
	epoll_add(fd, l->serial << 2 | 2);
}

// Closes what p holds of the wire, telling its peer first, as the IB CM
// does when an id goes mid-connection: a DREQ for a connection, a REJ for
// a request not answered.
void close_wire(cm_id *p)
{
	if (p->gsi_fd >= 0) {
		epoll_ctl(G().ep, EPOLL_CTL_DEL, p->gsi_fd, nullptr);
		close(p->gsi_fd);
		p->gsi_fd = -1;
	}
	if (!p->wire)
		return;
	if (p->conn_fd >= 0 && p->dev) {
		wire_msg m;
		memset(&m, 0, sizeof(m));
		switch (p->state) {
		case st::rep_rcvd:
		case st::accepted:
		case st::established:
			m.type = M_DREQ;
			wire_send(p, m);
			break;
		case st::req_rcvd:
		case st::connect:
			m.type = M_REJ;
			m.status = p->state == st::connect ? cmw::kRejTimeout : kRejConsumer;
			wire_send(p, m);
			break;
		default:
			break;
		}
	}
	// Only a DREQ is sent on after the id goes (a REQ or REP is not: the
	// REJ above withdrew it).
	if (p->resend.size() != cmw::kMadLen || (p->resend[16] << 8 | p->resend[17]) != cmw::DREQ)
		p->resend.clear();
	if (p->conn_fd >= 0 && (!p->answer.empty() || !p->resend.empty())) {
		// Its time wait: the socket and the last answer stay a while, and
		// a DREQ not answered yet goes on being sent, as the kernel's CM
		// sends it after the id is gone (a process that disconnects and
		// destroys its id at once, as rping does, would else leave a
		// peer that missed the one DREQ connected for good).
		auto *g = new cm_id;
		memset(&g->id, 0, sizeof(g->id));
		g->wire = true;
		g->state = p->resend.empty() ? st::disconnected : st::disc_sent;
		g->resend = p->resend;
		g->resend_ms = p->resend.empty() ? 0 : now_ms() + resend_interval_ms();
		g->peer_v4 = p->peer_v4;
		memcpy(g->peer_ip, p->peer_ip, 16);
		memcpy(g->my_ip, p->my_ip, 16);
		g->udp_port = p->udp_port;
		g->ifindex = p->ifindex;
		g->lcomm = p->lcomm;
		g->rcomm = p->rcomm;
		g->answer = p->answer;
		g->timewait_ms = now_ms() + linger_ms();
		epoll_ctl(G().ep, EPOLL_CTL_DEL, p->conn_fd, nullptr);
		G().lingers[p->conn_fd] = g;
		epoll_add(p->conn_fd, static_cast<uint64_t>(p->conn_fd) << 2 | 3);
		p->conn_fd = -1;
	}
	if (p->conn_fd >= 0) {
		epoll_ctl(G().ep, EPOLL_CTL_DEL, p->conn_fd, nullptr);
		close(p->conn_fd);
		p->conn_fd = -1;
	}
	p->resend.clear();
	p->resend_ms = 0;
}

bool send_peer(cm_id *p, wire_msg &m)
{
	if (p->wire)
		return wire_send(p, m);
	return send_msg(p->conn_fd, m);
}

// A destination on another host: the port of a RoCE v2 device whose
// address the host's route to dst leaves from (the source address a UDP
// socket connected to dst gets); src receives that address.
bool resolve_wire(const sockaddr *dst, port_pick &out, sockaddr_storage &src)
{
	if ((dst->sa_family != AF_INET && dst->sa_family != AF_INET6) || is_mcast(dst))
		return false;
	int s = raw_socket(dst->sa_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (s < 0)
		return false;
	sockaddr_storage d{};
	memcpy(&d, dst, addr_len(dst));
	set_port(reinterpret_cast<sockaddr *>(&d), 4791);
	socklen_t sl = sizeof(src);
	bool ok = connect(s, reinterpret_cast<sockaddr *>(&d), addr_len(dst)) == 0 &&
		  getsockname(s, reinterpret_cast<sockaddr *>(&src), &sl) == 0;
	close(s);
	port_pick pk;
	if (!ok || !resolve_local(reinterpret_cast<sockaddr *>(&src), pk) || !pk.dev->wire || !pk.eth)
		return false;
	out = pk;
	return true;
}

void on_conn(cm_id *p)
{
	if (p->wire) {
		on_wire_conn(p);
		return;
	}
	wire_msg m;
	for (;;) {
		if (p->conn_fd < 0)
			return;
		ssize_t r = recv(p->conn_fd, &m, sizeof(m), MSG_DONTWAIT | MSG_TRUNC);
		if (r < 0 && (errno == EAGAIN || errno == EINTR))
			return;
		if (r <= 0) {
			on_eof(p, false);
			return;
		}
		if (r != sizeof(m) || m.magic != kMagic || m.version != kWireVersion) {
			fprintf(stderr, "softverbs: rdma_cm: malformed CM message from a peer (%zd bytes), connection dropped\n", r);
			on_eof(p, true);
			return;
		}
		if (!valid_type_for(p->state, m.type) && !(m.type == M_RTU && p->rtu_late)) {
			// Two races the protocol allows end the connection as the
			// peer's close would, without a word: the active side
			// disconnected before this side accepted (a DREQ to a
			// delivered CONNECT_REQUEST), or this side disconnected
			// while the peer's REP was on its way.
			bool race = (p->state == st::req_rcvd && m.type == M_DREQ) ||
				    (p->state == st::disc_sent && m.type == M_REP);
			if (!race)
				fprintf(stderr, "softverbs: rdma_cm: unexpected CM message type %u from a peer, connection dropped\n",
					m.type);
			on_eof(p, !race);
			return;
		}
		st before = p->state;
		on_message(p, m);
		if (before == st::pending_req)
			return; // p may be gone
	}
}

// Connects to the listener of (ps, dst): the exact address first, then the
// wildcard of its family, then (IPv4) the IPv6 wildcard.  Never waits: a
// listener whose backlog is full is -EAGAIN, none -ECONNREFUSED.
int connect_listener_once(cm_id *p, const sockaddr *dst);

// A listener may be between two binds of its port (perftest -R closes the
// id that took its control connection and listens again for the data
// connection), or have a full backlog: such a REQ is tried again for up to
// kReqRetryMs before it counts as rejected, every kReqRetryStepMs, by the CM
// thread (rdma_connect returns at once).  A refused REQ is tried again only
// if the port has an owner (its marker, see check_port) or had a listener
// lately (a listener destroyed leaves a mark for 5 to 6 s, tomb_listener): a
// port nobody uses gets its REJECTED (reason 8) at once.  Both last 5 s: a
// perftest -R server sets up its device and QPs between the two listens,
// which took longer than the 1 s they once had on a loaded 2-core CI
// machine (REJECTED, error 8).
constexpr int kReqRetryMs = 5000;
constexpr int kReqRetryStepMs = 10;

// The REQ m of p (in st::connect) sent on fd, a connection to its listener,
// or (fd < 0, -errno) none: REJECTED (UNREACHABLE for SIDR).  Under G().mu.
void send_req(cm_id *p, int fd, wire_msg &m)
{
	bool ud = p->id.qp_type == IBV_QPT_UD;
	if (p->state != st::connect) { // Disconnected (or failed) meanwhile
		if (fd >= 0)
			close(fd);
		return;
	}
	if (fd >= 0) {
		p->conn_fd = fd;
		if (send_msg(fd, m)) {
			p->deadline_ms = now_ms() + cm_timeout_ms();
			epoll_add(fd, p->serial << 2 | 1);
			return;
		}
		close_conn(p);
	}
	p->state = st::rejected;
	if (!ud)
		qp_to_err(p); // As for a REJ (on_message)
	if (ud)
		push(p, RDMA_CM_EVENT_UNREACHABLE, -ECONNREFUSED);
	else
		push(p, RDMA_CM_EVENT_REJECTED, kRejInvalidServiceId);
}

// A REQ waiting for its listener (rdma_connect): tried again when due, and
// sent, or rejected once kReqRetryMs are over.  Under G().mu.
void retry_req(cm_id *p, int64_t now)
{
	if (p->state != st::connect) {
		p->req_retry_until = 0; // Disconnected meanwhile
		return;
	}
	if (p->req_retry_ms > now)
		return;
	int fd = connect_listener_once(p, reinterpret_cast<sockaddr *>(&p->req_dst));
	if (fd < 0 && (fd == -EAGAIN || fd == -ECONNREFUSED) && now < p->req_retry_until) {
		p->req_retry_ms = now + kReqRetryStepMs;
		return;
	}
	p->req_retry_until = 0;
	send_req(p, fd, p->req_msg);
}

void cm_thread()
{
	epoll_event evs[16];
	// At most a second asleep, so that deadlines set meanwhile are seen.
	int wait_ms = 1000;
	for (;;) {
		int n = epoll_wait(G().ep, evs, 16, wait_ms);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return;
		}
		std::lock_guard<std::mutex> lk(G().mu);
		// Setups that ran out of time, and when the next one does.
		int64_t now = now_ms(), next = -1;
		expire_tombs(now);
		expire_lingers(now, next);
		for (auto &kv : G().ids) {
			cm_id *p = kv.second;
			if (p->timewait_ms && p->timewait_ms <= now) {
				p->timewait_ms = 0;
				push(p, RDMA_CM_EVENT_TIMEWAIT_EXIT, 0);
			} else if (p->timewait_ms && (next < 0 || p->timewait_ms < next)) {
				next = p->timewait_ms;
			}
			if (p->wire && p->resend_ms && p->state != st::connect &&
			    p->state != st::accepted && p->state != st::disc_sent) {
				p->resend.clear(); // Nothing is awaited any more
				p->resend_ms = 0;
			}
			if (p->wire && p->resend_ms && !p->resend.empty()) {
				if (p->resend_ms <= now) {
					wire_send_mad(p, p->resend.data());
					p->resend_ms = now + resend_interval_ms();
				}
				if (next < 0 || p->resend_ms < next)
					next = p->resend_ms;
			}
			if (p->wire && p->state == st::disc_sent && p->deadline_ms) {
				// No DREP: the peer is gone, and so is the connection.
				if (p->deadline_ms <= now) {
					p->deadline_ms = 0;
					close_conn(p);
					p->state = st::disconnected;
					push_disconnected(p);
				} else if (next < 0 || p->deadline_ms < next) {
					next = p->deadline_ms;
				}
				continue;
			}
			if (p->req_retry_until) {
				retry_req(p, now);
				if (p->req_retry_until && (next < 0 || p->req_retry_ms < next))
					next = p->req_retry_ms;
				continue;
			}
			if ((p->state != st::connect && p->state != st::accepted) || !p->deadline_ms ||
			    p->conn_fd < 0)
				continue;
			if (p->deadline_ms <= now) {
				close_conn(p);
				p->state = st::error;
				push(p, RDMA_CM_EVENT_UNREACHABLE, -ETIMEDOUT);
			} else if (next < 0 || p->deadline_ms < next) {
				next = p->deadline_ms;
			}
		}
		wait_ms = next < 0 ? 1000 : static_cast<int>(std::min<int64_t>(next - now, 1000));
		for (int i = 0; i < n; i++) {
			uint64_t key = evs[i].data.u64;
			if (key == 0) {
				uint64_t v;
				while (read(G().wake, &v, sizeof(v)) > 0) {
				}
				continue;
			}
			if ((key & 3) == 3) {
				on_linger(static_cast<int>(key >> 2));
				continue;
			}
			auto it = G().ids.find(key >> 2);
			if (it == G().ids.end())
				continue;
			cm_id *p = it->second;
			if ((key & 3) == 1)
				on_conn(p);
			else if ((key & 3) == 2)
				on_gsi_listener(p);
			else if (p->state == st::listen)
				on_listener(p);
		}
	}
}

// fork(): the CM thread, the sockets it serves and the event channels'
// counters are the parent's, and stay so.  The child starts afresh, as a
// child of rdma-core's does with the kernel's rdma_cm (new channels and ids
// work there): the parent's ids become orphans (closed here, never sent on
// or served; rdma_destroy_id frees them, other calls are EINVAL), each
// channel gets an event counter of its own with nothing queued (the
// parent's events are the parent's to retrieve), and the CM thread and the
// devices are started again on the next call.  Before, the child had no CM
// thread: its calls that wait for a peer hung.
void cm_atfork_prepare()
{
	G().mu.lock(); // No CM step is half done in the copy the child gets
}

void cm_atfork_parent()
{
	G().mu.unlock();
}

void cm_atfork_child()
{
	global &g = G();
	g.mu.unlock(); // The forking thread's, which this one is
	// Waiters of the parent's are not here: a condition variable of our own.
	new (&g.cv) std::condition_variable;
	auto drop = [](int &fd) {
		if (fd >= 0)
			close(fd);
		fd = -1;
	};
	// First: the epoll set is the parent's too, and an EPOLL_CTL_DEL from
	// here would take the parent's sockets out of it.
	drop(g.ep);
	drop(g.wake);
	for (auto &kv : g.ids) {
		cm_id *p = kv.second;
		drop(p->bind_fd);
		drop(p->conn_fd);
		drop(p->own_fd);
		drop(p->gsi_fd);
		p->orphan = true;
		p->state = st::error;
		p->wire = false;
		p->resend.clear();
		p->answer.clear();
		p->resend_ms = p->deadline_ms = p->timewait_ms = 0;
		p->children.clear();
		p->listener = nullptr;
		p->req_event = nullptr;
	}
	g.ids.clear();
	for (auto &kv : g.lingers)
		close(kv.first);
	g.lingers.clear();
	for (auto &t : g.tombs)
		close(t.first);
	g.tombs.clear();
	drop(g.udp4);
	drop(g.udp6);
	g.uport4 = g.uport6 = 0;
	for (channel_priv *c : g.channels) {
		// The same descriptor number, a counter of the child's own.
		int fd = eventfd(0, EFD_CLOEXEC | EFD_SEMAPHORE);
		if (fd >= 0 && c->ch.fd >= 0 && dup3(fd, c->ch.fd, O_CLOEXEC) >= 0)
			close(fd);
		else if (fd >= 0)
			close(fd);
		for (event_priv *e : c->q)
			e->dead = true;
		c->q.clear(); // The parent's: left to it (their copies here leak)
		c->readers = 0;
	}
	// The parent's device contexts: a child opens its own.
	g.devs.clear();
	g.inited = false;
	g.init_err = 0;
	g.any_wire = false;
}

// Whether id is an orphan: the parent's, in a child of fork().
bool orphan(const rdma_cm_id *id)
{
	return id && reinterpret_cast<const cm_id *>(id)->orphan;
}

int ensure_started_locked()
{
	global &g = G();
	static bool forks = [] {
		return pthread_atfork(cm_atfork_prepare, cm_atfork_parent, cm_atfork_child) == 0;
	}();
	(void)forks;
	if (int e = fabric_init_locked())
		return e;
	if (g.ep < 0) {
		g.ep = epoll_create1(EPOLL_CLOEXEC);
		if (g.ep < 0)
			return errno;
		g.wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
		if (g.wake < 0) {
			int e = errno;
			close(g.ep);
			g.ep = -1;
			return e;
		}
		epoll_add(g.wake, 0); // Serial 0 is no id's
		loop::start_detached(cm_thread); // Returns once it runs (thread_start.h)
		static bool exit_hook = [] { return atexit(linger_cm_at_exit) == 0; }();
		(void)exit_hook;
	}
	return 0;
}

// ------------------------------------------------------- QP attributes ---

int qp_attr_locked(cm_id *p, ibv_qp_attr *a, int *mask)
{
	ibv_qp_state want = a->qp_state;
	memset(a, 0, sizeof(*a));
	a->qp_state = want;
	if (!p->dev)
		return EINVAL;
	bool ud = p->id.qp_type == IBV_QPT_UD;
	switch (want) {
	case IBV_QPS_INIT:
		a->pkey_index = 0;
		a->port_num = p->id.port_num;
		*mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
		if (ud) {
			a->qkey = p->id.ps == RDMA_PS_UDP ? RDMA_UDP_QKEY : RDMA_UDP_QKEY;
			*mask |= IBV_QP_QKEY;
		} else {
			a->qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
					     IBV_ACCESS_REMOTE_ATOMIC;
			*mask |= IBV_QP_ACCESS_FLAGS;
		}
		return 0;
	case IBV_QPS_RTR:
		*mask = IBV_QP_STATE;
		if (ud)
			return 0;
		if (!p->have_remote)
			return EINVAL;
		a->path_mtu = std::min(p->mtu, p->rmtu);
		a->dest_qp_num = p->rqpn;
		a->rq_psn = p->rpsn;
		ah_to_peer(p, a->ah_attr);
		*mask |= IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
		// The kernel CM's masks: a responder's attributes for RC and an
		// XRC target, a requester's for RC and an XRC initiator.  Its
		// RNR timer is 0, which IB encodes as the longest, 655.36 ms
		// (cm_init_qp_rtr_attr): a peer that runs out of receives for a
		// moment waits that long per RNR retry, so a finite
		// rnr_retry_count outlasts a late post.  (12, 0.64 ms, ran out
		// of a count of 3 in 2 ms: a helper's probe.)
		if (p->id.qp_type == IBV_QPT_RC || p->id.qp_type == IBV_QPT_XRC_RECV) {
			a->max_dest_rd_atomic = p->resp_res;
			a->min_rnr_timer = 0;
			*mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
		}
		return 0;
	case IBV_QPS_RTS:
		a->sq_psn = p->psn;
		*mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
		if (ud || !p->have_remote)
			return ud ? 0 : EINVAL;
		if (p->id.qp_type == IBV_QPT_RC || p->id.qp_type == IBV_QPT_XRC_SEND) {
			a->timeout = qp_ack_timeout(p);
			a->retry_cnt = p->retry;
			// As the IB CM: the RNR retry count is the one the peer
			// asked for (its REQ or REP), since it knows its receives.
			a->rnr_retry = p->r_rnr;
			a->max_rd_atomic = p->init_depth;
			*mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
		} else if (p->id.qp_type == IBV_QPT_XRC_RECV) {
			a->timeout = qp_ack_timeout(p);
			*mask |= IBV_QP_TIMEOUT;
		}
		return 0;
	default:
		return EINVAL;
	}
}

int modify_locked(cm_id *p, ibv_qp_state s)
{
	ibv_qp_attr a;
	int mask = 0;
	a.qp_state = s;
	if (int e = qp_attr_locked(p, &a, &mask))
		return e;
	return ibv_modify_qp(p->id.qp, &a, mask);
}

void qp_to_err(cm_id *p)
{
	if (!p->id.qp)
		return;
	ibv_qp_attr a{};
	a.qp_state = IBV_QPS_ERR;
	ibv_modify_qp(p->id.qp, &a, IBV_QP_STATE);
}

uint8_t cap(uint8_t v, int max)
{
	if (max <= 0)
		return v;
	return static_cast<uint8_t>(std::min<int>(v, max));
}

// rdma-core's ucma_valid_param: on an RDMA_PS_TCP id, a depth above the
// device's maximum is EINVAL, except RDMA_MAX_RESP_RES / RDMA_MAX_INIT_DEPTH
// (0xFF: "the most there is").  Other port spaces are not checked (there
// the values are capped where they are used).
bool depths_valid(const cm_id *p, const rdma_conn_param *cp)
{
	if (p->id.ps != RDMA_PS_TCP || !cp || !p->dev)
		return true;
	const ibv_device_attr &a = p->dev->attr;
	return (cp->responder_resources == RDMA_MAX_RESP_RES ||
		cp->responder_resources <= a.max_qp_rd_atom) &&
	       (cp->initiator_depth == RDMA_MAX_INIT_DEPTH ||
		cp->initiator_depth <= a.max_qp_init_rd_atom);
}

// ----------------------------------------------------- id lifecycle ---

// Drops the channel's dead events (their id was destroyed before they were
// retrieved) with the eventfd's count of each, so that the fd does not poll
// readable for events nobody will get.  Only while no thread is inside
// rdma_get_cm_event, which reads the count outside the lock: otherwise they
// stay, and the reader skips them.  Caller holds G().mu.
void reap_dead(channel_priv *c)
{
	if (c->readers || c->destroyed)
		return;
	for (auto it = c->q.begin(); it != c->q.end();) {
		if (!(*it)->dead) {
			++it;
			continue;
		}
		delete *it;
		it = c->q.erase(it);
		pollfd pfd{c->ch.fd, POLLIN, 0};
		uint64_t v;
		if (poll(&pfd, 1, 0) == 1 && read(c->ch.fd, &v, sizeof(v)) != sizeof(v))
			log_msg("%s", "cannot take a dropped event's count");
	}
}

void destroy_locked(cm_id *p)
{
	global &g = G();
	g.ids.erase(p->serial);
	close_wire(p); // Before close_conn, which forgets a DREQ to resend
	close_conn(p);
	if (p->state == st::listen)
		tomb_listener(p);
	if (p->bind_fd >= 0) {
		epoll_ctl(g.ep, EPOLL_CTL_DEL, p->bind_fd, nullptr);
		close(p->bind_fd);
		p->bind_fd = -1;
	}
	if (p->own_fd >= 0) {
		close(p->own_fd);
		p->own_fd = -1;
	}
	// Children the user never saw (or whose request is still queued) go
	// with their listener; peers see the socket close.
	for (cm_id *c : std::vector<cm_id *>(p->children)) {
		if (c->state == st::pending_req || c->req_event) {
			if (c->req_event)
				c->req_event->dead = true;
			c->req_event = nullptr;
			c->listener = nullptr;
			destroy_locked(c);
		} else {
			c->listener = nullptr;
		}
	}
	p->children.clear();
	if (p->listener) {
		auto &v = p->listener->children;
		v.erase(std::remove(v.begin(), v.end(), p), v.end());
	}
	for (event_priv *e : p->chan->q)
		if (e->about == p || e->counted == p)
			e->dead = true;
	if (!p->sync)
		reap_dead(p->chan);
	if (p->sync) {
		for (event_priv *e : p->chan->q)
			delete e;
		p->chan->q.clear();
		close(p->chan->ch.fd);
		channel_gone(p->chan);
		delete p->chan;
	}
	delete p->ep_qp_attr;
	delete p;
}

// ------------------------------------------------------ port ownership ---
// The kernel's rules for ids bound to one port of a port space
// (cma_check_port): a bind conflicts with every other owner of the port
// unless both have REUSEADDR, or both are AFONLY and of different
// families; a wildcard and anything else then conflict (EADDRNOTAVAIL), as
// do two binds of one address (EADDRINUSE).  A listener has no REUSEADDR.
// IPv4 ids are AFONLY unless told otherwise, IPv6 ids as
// net.ipv6.bindv6only (0: an IPv6 wildcard takes IPv4 too).
//
// Every owner, in any process, holds a marker socket named
//   softverbs-cm/<uid>/<fabric>/<ps>/o/<port>/<family><flags>/<address hash>/<random>
// (flags: r reuseaddr, a afonly, w wildcard); a bind reads the markers of
// its port from /proc/net/unix under a per-port lock socket.

bool effective_afonly(const cm_id *p, int family)
{
	if (p->afonly_set)
		return p->afonly != 0;
	if (family == AF_INET)
		return true;
	if (family == AF_INET6) {
		static int v6only = [] {
			int v = 0;
			if (FILE *f = fopen("/proc/sys/net/ipv6/bindv6only", "r")) {
				if (fscanf(f, "%d", &v) != 1)
					v = 0;
				fclose(f);
			}
			return v;
		}();
		return v6only != 0;
	}
	return false;
}

char family_char(int family)
{
	return family == AF_INET ? '4' : family == AF_INET6 ? '6' : 'b';
}

std::string owner_prefix(int ps, uint16_t port)
{
	char buf[160];
	snprintf(buf, sizeof(buf), "softverbs-cm/%u/%s/%x/o/%u/", static_cast<unsigned>(getuid()),
		 G().fabric_key.c_str(), ps, port);
	return buf;
}

uint64_t addr_hash(const std::string &text)
{
	uint64_t h = 1469598103934665603ull;
	for (unsigned char c : text)
		h = (h ^ c) * 1099511628211ull;
	return h;
}

struct owner {
	char family;
	bool reuse, afonly, any;
	std::string hash;
};

std::vector<owner> list_owners(int ps, uint16_t port, const std::string &except)
{
	std::vector<owner> out;
	std::string want = "@" + owner_prefix(ps, port);
	FILE *f = fopen("/proc/net/unix", "r");
	if (!f)
		return out;
	char line[512];
	while (fgets(line, sizeof(line), f)) {
		char *at = strstr(line, want.c_str());
		if (!at)
			continue;
		at[strcspn(at, "\n")] = 0;
		std::string rest = at + want.size(); // <family><flags>/<hash>/<random>
		if (rest.size() < 5 || rest[4] != '/' || except == at + 1)
			continue;
		owner o;
		o.family = rest[0];
		o.reuse = rest[1] == 'r';
		o.afonly = rest[2] == 'a';
		o.any = rest[3] == 'w';
		o.hash = rest.substr(5, rest.find('/', 5) - 5);
		out.push_back(o);
	}
	fclose(f);
	return out;
}

std::string tomb_prefix(int ps, uint16_t port)
{
	char buf[160];
	snprintf(buf, sizeof(buf), "softverbs-cm/%u/%s/%x/T/%u/", static_cast<unsigned>(getuid()),
		 G().fabric_key.c_str(), ps, port);
	return buf;
}

// A listener being destroyed leaves a mark on its port for a while (as long
// as a refused REQ is retried, see connect_listener).
constexpr int64_t kTombMs = 5000;

// A listener being destroyed leaves a mark on its port for a while.
void tomb_listener(const cm_id *p)
{
	uint16_t port = get_port(&p->id.route.addr.src_addr);
	int fd = raw_socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return;
	char tail[16];
	snprintf(tail, sizeof(tail), "%08x", rand24() << 8 | (rand24() & 0xff));
	if (bind_abstract(fd, tomb_prefix(p->id.ps, port) + tail)) {
		close(fd);
		return;
	}
	G().tombs.emplace_back(fd, now_ms() + kTombMs);
}

void expire_tombs(int64_t now)
{
	auto &t = G().tombs;
	for (size_t i = 0; i < t.size();) {
		if (t[i].second <= now) {
			close(t[i].first);
			t[i] = t.back();
			t.pop_back();
		} else {
			i++;
		}
	}
}

// Whether port of port space ps has an owner or had a listener lately.  The
// IP port spaces count together: a server that listens again on its port
// may change between them (perftest -c UD -R takes its control connection
// in RDMA_PS_TCP, destroys that listener, then listens in RDMA_PS_UDP for
// the data; a SIDR REQ in between was UNREACHABLE at once, about 1 run in
// 10, where the TCP one is retried).
bool port_in_use_lately(int ps, uint16_t port)
{
	std::string marks[4];
	int n = 0;
	{
		std::lock_guard<std::mutex> lk(G().mu); // G().fabric_key
		for (int s : {ps, ps == RDMA_PS_TCP ? int(RDMA_PS_UDP)
				 : ps == RDMA_PS_UDP ? int(RDMA_PS_TCP)
						     : -1}) {
			if (s < 0)
				continue;
			marks[n++] = "@" + owner_prefix(s, port);
			marks[n++] = "@" + tomb_prefix(s, port);
		}
	}
	FILE *f = fopen("/proc/net/unix", "r");
	if (!f)
		return true; // cannot tell: wait as before
	char line[512];
	bool found = false;
	while (!found && fgets(line, sizeof(line), f))
		for (int i = 0; i < n && !found; i++)
			found = strstr(line, marks[i].c_str());
	fclose(f);
	return found;
}

// The marker's name for p bound to sa (without the leading NUL).
std::string owner_name(const cm_id *p, const sockaddr *sa, bool reuse)
{
	char buf[200];
	snprintf(buf, sizeof(buf), "%s%c%c%c%c/%016llx/%08x", owner_prefix(p->id.ps, get_port(sa)).c_str(),
		 family_char(sa->sa_family), reuse ? 'r' : '-',
		 effective_afonly(p, sa->sa_family) ? 'a' : '-', is_any(sa) ? 'w' : '-',
		 static_cast<unsigned long long>(addr_hash(addr_text(sa))), rand24() << 8 | (rand24() & 0xff));
	return buf;
}

int bind_abstract(int fd, const std::string &name)
{
	sockaddr_un un{};
	un.sun_family = AF_UNIX;
	if (name.size() + 1 >= sizeof(un.sun_path))
		return ENAMETOOLONG;
	memcpy(un.sun_path + 1, name.data(), name.size());
	socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
	return bind(fd, reinterpret_cast<sockaddr *>(&un), len) ? errno : 0;
}

// Name of p's marker now, for list_owners to skip.
std::string own_marker(const cm_id *p)
{
	if (p->own_fd < 0)
		return "";
	sockaddr_un un{};
	socklen_t len = sizeof(un);
	if (getsockname(p->own_fd, reinterpret_cast<sockaddr *>(&un), &len) || len <= offsetof(sockaddr_un, sun_path) + 1)
		return "";
	return std::string(un.sun_path + 1, len - offsetof(sockaddr_un, sun_path) - 1);
}

// Publishes (or replaces) p's marker for sa with the flags of now.
int publish_owner(cm_id *p, const sockaddr *sa, bool reuse)
{
	int fd = raw_socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return errno;
	int e = EADDRINUSE;
	for (int tries = 0; tries < 8 && e == EADDRINUSE; tries++)
		e = bind_abstract(fd, owner_name(p, sa, reuse));
	if (e) {
		close(fd);
		return e;
	}
	if (p->own_fd >= 0)
		close(p->own_fd);
	p->own_fd = fd;
	return 0;
}

// May p own sa's port (reuse: its REUSEADDR counts)?  0, EADDRINUSE or
// EADDRNOTAVAIL.
int check_port(const cm_id *p, const sockaddr *sa, bool reuse)
{
	bool afonly = effective_afonly(p, sa->sa_family);
	bool any = is_any(sa);
	char fam = family_char(sa->sa_family);
	char hash[20];
	snprintf(hash, sizeof(hash), "%016llx", static_cast<unsigned long long>(addr_hash(addr_text(sa))));
	for (const owner &o : list_owners(p->id.ps, get_port(sa), own_marker(p))) {
		if (reuse && o.reuse)
			continue;
		if (afonly && o.afonly && fam != o.family)
			continue;
		if (any || o.any)
			return EADDRNOTAVAIL;
		if (fam == o.family && o.hash == hash)
			return EADDRINUSE;
	}
	return 0;
}

// Serialises check and bind of one port across processes: a socket name
// held meanwhile (a dead holder frees it).
struct port_lock {
	int fd = -1;
	port_lock(int ps, uint16_t port)
	{
		char buf[160];
		snprintf(buf, sizeof(buf), "softverbs-cm/%u/%s/%x/L/%u", static_cast<unsigned>(getuid()),
			 G().fabric_key.c_str(), ps, port);
		fd = raw_socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
		for (int i = 0; fd >= 0 && i < 5000; i++) {
			if (bind_abstract(fd, buf) != EADDRINUSE)
				return;
			usleep(1000);
		}
	}
	~port_lock()
	{
		if (fd >= 0)
			close(fd);
	}
};

// Takes sa's port for p: the rules above, then the name connects look for
// (unless a REUSEADDR twin has it: taken at listen), then the marker.
int take_port(cm_id *p, int fd, const sockaddr *sa)
{
	port_lock lock(p->id.ps, get_port(sa));
	if (int e = check_port(p, sa, p->reuseaddr != 0))
		return e;
	socklen_t len;
	sockaddr_un un = sock_name(p->id.ps, addr_text(sa), get_port(sa), len);
	bool unnamed = false;
	if (bind(fd, reinterpret_cast<sockaddr *>(&un), len)) {
		if (errno != EADDRINUSE || !p->reuseaddr)
			return errno;
		unnamed = true;
	}
	if (int e = publish_owner(p, sa, p->reuseaddr != 0))
		return e;
	p->unnamed = unnamed;
	return 0;
}

int bind_name_locked(cm_id *p, const sockaddr *addr)
{
	sockaddr_storage ss{};
	memcpy(&ss, addr, addr_len(addr));
	auto *sa = reinterpret_cast<sockaddr *>(&ss);
	int fd = raw_socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return errno;
	uint16_t port = get_port(sa);
	int err = 0;
	if (port) {
		err = take_port(p, fd, sa);
	} else {
		err = EADDRINUSE;
		for (int tries = 0; tries < 2000 && (err == EADDRINUSE || err == EADDRNOTAVAIL); tries++) {
			port = static_cast<uint16_t>(32768 + rand24() % (60999 - 32768 + 1));
			set_port(sa, port);
			err = take_port(p, fd, sa);
		}
		if (err == EADDRINUSE)
			err = EADDRNOTAVAIL; // no ephemeral port left, as the kernel says
	}
	if (err) {
		close(fd);
		if (p->own_fd >= 0) {
			close(p->own_fd);
			p->own_fd = -1;
		}
		return err;
	}
	set_port(sa, port);
	p->bind_fd = fd;
	memset(&p->id.route.addr.src_storage, 0, sizeof(p->id.route.addr.src_storage));
	memcpy(&p->id.route.addr.src_storage, sa, addr_len(sa));
	return 0;
}

int bind_locked(cm_id *p, const sockaddr *addr)
{
	if (!addr || !addr_len(addr))
		return addr ? EAFNOSUPPORT : EINVAL;
	if (p->state != st::idle)
		return EINVAL;
	if (addr->sa_family != AF_IB && !ip_is_local(addr))
		return EADDRNOTAVAIL;
	port_pick pk;
	bool have_dev = !is_any(addr) && resolve_local(addr, pk);
	if (addr->sa_family == AF_IB && !is_any(addr) && !have_dev)
		return EADDRNOTAVAIL;
	if (int e = bind_name_locked(p, addr))
		return e;
	if (have_dev)
		apply_pick(p, pk);
	p->state = st::bound;
	return 0;
}

cm_id *new_id(channel_priv *chan, void *context, rdma_port_space ps, ibv_qp_type qpt)
{
	auto *p = new cm_id;
	memset(&p->id, 0, sizeof(p->id));
	p->serial = G().next_serial++;
	p->id.context = context;
	p->id.ps = ps;
	p->id.qp_type = qpt;
	p->chan = chan;
	p->id.channel = &chan->ch;
	G().ids[p->serial] = p;
	return p;
}

// Caller holds G().mu.
channel_priv *new_channel()
{
	int fd = eventfd(0, EFD_CLOEXEC | EFD_SEMAPHORE);
	if (fd < 0)
		return nullptr;
	auto *c = new channel_priv;
	c->ch.fd = fd;
	try {
		G().channels.push_back(c);
	} catch (...) {
		close(fd);
		delete c;
		errno = ENOMEM;
		return nullptr;
	}
	return c;
}

// A channel destroyed: out of the live list.  Caller holds G().mu.
void channel_gone(channel_priv *c)
{
	auto &v = G().channels;
	v.erase(std::remove(v.begin(), v.end(), c), v.end());
}

// Synchronous ids: wait for the event the operation produces.
int sync_wait(cm_id *p, rdma_cm_event_type expect)
{
	if (p->id.event) {
		rdma_ack_cm_event(p->id.event);
		p->id.event = nullptr;
	}
	rdma_cm_event *ev;
	if (rdma_get_cm_event(&p->chan->ch, &ev))
		return -1;
	p->id.event = ev;
	if (ev->status) {
		if (ev->event == RDMA_CM_EVENT_REJECTED)
			return fail(ECONNREFUSED);
		return fail(ev->status < 0 ? -ev->status : ev->status);
	}
	// An id without a QP completes its connect at CONNECT_RESPONSE (the
	// application then calls rdma_establish): rdma-core's ucma_complete
	// answers 0 for it, with id->event that event.
	if (ev->event != expect &&
	    !(expect == RDMA_CM_EVENT_ESTABLISHED && ev->event == RDMA_CM_EVENT_CONNECT_RESPONSE))
		return fail(EINVAL);
	return 0;
}

int check_pdata(const void *data, int len, int max)
{
	if (len < 0 || len > max || (len && !data))
		return EINVAL;
	return 0;
}

void put_pdata(wire_msg &m, const void *data, int len)
{
	if (data && len > 0) {
		memcpy(m.pdata, data, len);
		m.pdata_len = static_cast<uint8_t>(len);
	}
}

bool port_in_use_lately(int ps, uint16_t port);

int connect_listener_once(cm_id *p, const sockaddr *dst)
{
	std::vector<std::string> names = {addr_text(dst)};
	if (dst->sa_family == AF_INET)
		names = {names[0], "any4", "any6"};
	else if (dst->sa_family == AF_INET6)
		names = {names[0], "any6"};
	else
		names = {names[0], "anyib"};
	bool busy = false;
	for (const std::string &n : names) {
		int fd = raw_socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
		if (fd < 0)
			return -errno;
		socklen_t len;
		sockaddr_un un = sock_name(p->id.ps, n, get_port(dst), len);
		if (connect(fd, reinterpret_cast<sockaddr *>(&un), len) == 0)
			return fd;
		busy |= errno == EAGAIN; // Its backlog full
		close(fd);
		if (busy)
			break; // The most specific listener is the one to wait for
	}
	return busy ? -EAGAIN : -ECONNREFUSED;
}

// The id's own receive CQ of depth entries, on a channel of its own.
int create_recv_cq(cm_id *p, uint32_t depth)
{
	p->own_cqs = true;
	p->id.recv_cq_channel = ibv_create_comp_channel(p->id.verbs);
	if (!p->id.recv_cq_channel)
		return errno;
	p->id.recv_cq = ibv_create_cq(p->id.verbs, std::max<uint32_t>(depth, 1), p,
				      p->id.recv_cq_channel, 0);
	if (!p->id.recv_cq)
		return errno;
	return 0;
}

int create_cqs(cm_id *p, ibv_qp_init_attr_ex *a)
{
	p->own_cqs = true; // What is made here goes with destroy_cqs, even half
	if (!a->recv_cq) {
		if (int e = create_recv_cq(p, a->cap.max_recv_wr))
			return e;
		a->recv_cq = p->id.recv_cq;
	}
	if (!a->send_cq) {
		p->id.send_cq_channel = ibv_create_comp_channel(p->id.verbs);
		if (!p->id.send_cq_channel)
			return errno;
		p->id.send_cq = ibv_create_cq(p->id.verbs, std::max<uint32_t>(a->cap.max_send_wr, 1), p,
					      p->id.send_cq_channel, 0);
		if (!p->id.send_cq)
			return errno;
		a->send_cq = p->id.send_cq;
	}
	p->own_cqs = true;
	return 0;
}

// The device's XRC domain for XRC QPs and SRQs made without one (rdma-core's
// ucma_get_xrcd: a new domain, not tied to a file).  Under G().mu.
ibv_xrcd *dev_xrcd(dev_entry *d)
{
	if (!d->xrcd) {
		ibv_xrcd_init_attr xa{};
		xa.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
		xa.fd = -1;
		xa.oflags = O_CREAT;
		d->xrcd = ibv_open_xrcd(d->ctx, &xa);
	}
	return d->xrcd;
}

void destroy_cqs(cm_id *p)
{
	if (!p->own_cqs)
		return;
	if (p->id.send_cq)
		ibv_destroy_cq(p->id.send_cq);
	if (p->id.recv_cq)
		ibv_destroy_cq(p->id.recv_cq);
	if (p->id.send_cq_channel)
		ibv_destroy_comp_channel(p->id.send_cq_channel);
	if (p->id.recv_cq_channel)
		ibv_destroy_comp_channel(p->id.recv_cq_channel);
	p->id.send_cq = p->id.recv_cq = nullptr;
	p->id.send_cq_channel = p->id.recv_cq_channel = nullptr;
	p->own_cqs = false;
}

} // namespace

// ================================================================ API ===

SV_API rdma_event_channel *rdma_create_event_channel(void)
{
	std::lock_guard<std::mutex> lk(G().mu);
	if (int e = ensure_started_locked()) {
		errno = e;
		return nullptr;
	}
	channel_priv *c = new_channel();
	return c ? &c->ch : nullptr;
}

SV_API void rdma_destroy_event_channel(rdma_event_channel *channel)
{
	if (!channel)
		return;
	channel_priv *c = to_chan(channel);
	std::lock_guard<std::mutex> lk(G().mu);
	channel_gone(c);
	for (event_priv *e : c->q)
		delete e;
	c->q.clear();
	if (c->readers) {
		// A thread is blocked reading the channel (rping's CM thread when
		// its main thread tears down): as with the kernel's file, which
		// stays open while a read() holds it, the reader stays blocked
		// and the channel is left to it rather than freed under it.
		c->destroyed = true;
		return;
	}
	close(c->ch.fd);
	c->ch.fd = -1;
	c->q.shrink_to_fit();
	try {
		G().dead_channels.push_back(c);
	} catch (...) {
		// No memory to keep it: still not freed (see below).
	}
	// Not freed either: a thread may still come to read it (rping's CM
	// thread, which loops on rdma_get_cm_event until an error while its
	// main thread destroys the channel and exits).  With rdma-core that
	// thread would read a freed channel and a closed fd, but the process
	// is gone first; here it may live on for the RoCE v2 linger at exit
	// (a DREQ's time wait), long enough for the thread to get EBADF and
	// exit(-1) (rping -> 255 about once in fifty runs).  The reader is
	// kept blocked instead (rdma_get_cm_event), as if its read had begun
	// before the close.  Costs the channel's few bytes per destroy, kept
	// in G().dead_channels.
	c->destroyed = true;
}

SV_API int rdma_create_id(rdma_event_channel *channel, rdma_cm_id **id, void *context,
			  rdma_port_space ps)
{
	if (!id)
		return fail(EINVAL);
	ibv_qp_type qpt;
	switch (ps) {
	case RDMA_PS_TCP: qpt = IBV_QPT_RC; break;
	case RDMA_PS_UDP: case RDMA_PS_IPOIB: qpt = IBV_QPT_UD; break;
	case RDMA_PS_IB: qpt = IBV_QPT_RC; break;
	default: return fail(EINVAL);
	}
	std::lock_guard<std::mutex> lk(G().mu);
	if (int e = ensure_started_locked())
		return fail(e);
	channel_priv *c = channel ? to_chan(channel) : new_channel();
	if (!c)
		return -1;
	if (c->destroyed)
		return fail(EINVAL); // Its events would go nowhere
	cm_id *p = new_id(c, context, ps, qpt);
	p->sync = !channel;
	*id = &p->id;
	return 0;
}

SV_API int rdma_destroy_id(rdma_cm_id *id)
{
	if (!id)
		return fail(EINVAL);
	cm_id *p = to_priv(id);
	if (p->id.event) {
		rdma_ack_cm_event(p->id.event);
		p->id.event = nullptr;
	}
	std::unique_lock<std::mutex> lk(G().mu);
	p->destroying = true;
	G().cv.wait(lk, [p] { return p->orphan || p->reported == p->acked; });
	destroy_locked(p);
	return 0;
}

SV_API int rdma_bind_addr(rdma_cm_id *id, sockaddr *addr)
{
	if (orphan(id))
		return fail(EINVAL); // The parent's (cm_atfork_child)
	if (!id)
		return fail(EINVAL);
	std::lock_guard<std::mutex> lk(G().mu);
	if (int e = bind_locked(to_priv(id), addr))
		return fail(e);
	return 0;
}

SV_API int rdma_resolve_addr(rdma_cm_id *id, sockaddr *src_addr, sockaddr *dst_addr, int timeout_ms)
{
	if (orphan(id))
		return fail(EINVAL); // The parent's (cm_atfork_child)
	(void)timeout_ms;
	if (!id || !dst_addr || !addr_len(dst_addr))
		return fail(EINVAL);
	cm_id *p = to_priv(id);
	{
		std::lock_guard<std::mutex> lk(G().mu);
		if (p->state != st::idle && p->state != st::bound)
			return fail(EINVAL);
		if (src_addr && src_addr->sa_family && src_addr->sa_family != dst_addr->sa_family &&
		    dst_addr->sa_family != AF_IB)
			return fail(EINVAL);
		memset(&p->id.route.addr.dst_storage, 0, sizeof(p->id.route.addr.dst_storage));
		memcpy(&p->id.route.addr.dst_storage, dst_addr, addr_len(dst_addr));
		port_pick pk;
		bool ok, wire = false;
		sockaddr_storage wsrc{}; // Over the wire: the address we leave from
		if (is_mcast(dst_addr)) {
			// A group: the port of the source, bound or given, else the
			// first port of the first device.
			const sockaddr *src = p->dev ? nullptr : src_addr;
			if (p->dev) {
				ok = fill_port(p->dev, p->id.port_num, pk);
				pk.gid = p->gid;
				pk.gid_index = p->gid_index;
			} else if (src && src->sa_family && !is_any(src)) {
				ok = resolve_local(src, pk);
			} else {
				ok = first_port(pk);
			}
		} else {
			ok = resolve_local(dst_addr, pk);
			// Not this host's: another's, reached by RoCE v2.
			if (!ok && G().any_wire && resolve_wire(dst_addr, pk, wsrc))
				ok = wire = true;
		}
		if (!ok) {
			push(p, RDMA_CM_EVENT_ADDR_ERROR, -EHOSTUNREACH);
		} else {
			if (p->state == st::idle) {
				// The source: the given one, or the destination's own
				// address (on one host the two are the same).
				sockaddr_storage ss{};
				if (src_addr && src_addr->sa_family)
					memcpy(&ss, src_addr, addr_len(src_addr));
				else if (is_mcast(dst_addr)) {
					ss.ss_family = dst_addr->sa_family; // the wildcard
				} else if (wire) {
					memcpy(&ss, &wsrc, sizeof(ss));
					set_port(reinterpret_cast<sockaddr *>(&ss), 0);
				} else {
					memcpy(&ss, dst_addr, addr_len(dst_addr));
					set_port(reinterpret_cast<sockaddr *>(&ss), 0);
				}
				if (int e = bind_name_locked(p, reinterpret_cast<sockaddr *>(&ss)))
					return fail(e);
			}
			apply_pick(p, pk);
			p->rgid = pk.gid;
			p->rlid = pk.lid;
			p->wire = wire;
			if (wire) {
				addr_gid(dst_addr, p->rgid);
				p->rlid = 0;
				gid_ip(p->rgid, p->peer_v4, p->peer_ip);
				bool v4;
				gid_ip(p->gid, v4, p->my_ip);
				p->udp_port = pk.dev->udp_port;
				p->ifindex = pk.dev->ifindex;
				if (dst_addr->sa_family == AF_INET6 &&
				    reinterpret_cast<const sockaddr_in6 *>(dst_addr)->sin6_scope_id)
					p->ifindex = reinterpret_cast<const sockaddr_in6 *>(dst_addr)->sin6_scope_id;
			}
			// Bound to a wildcard: the source address is the one the
			// destination is reached from, on one host the destination's.
			auto *src = &p->id.route.addr.src_addr;
			if (is_any(src) && src->sa_family == dst_addr->sa_family && !is_mcast(dst_addr)) {
				uint16_t port = get_port(src);
				if (wire)
					memcpy(&p->id.route.addr.src_storage, &wsrc, sizeof(wsrc));
				else
					memcpy(&p->id.route.addr.src_storage, dst_addr, addr_len(dst_addr));
				set_port(src, port);
			}
			p->state = st::addr_resolved;
			push(p, RDMA_CM_EVENT_ADDR_RESOLVED, 0);
		}
	}
	if (p->sync)
		return sync_wait(p, RDMA_CM_EVENT_ADDR_RESOLVED);
	return 0;
}

SV_API int rdma_resolve_route(rdma_cm_id *id, int timeout_ms)
{
	if (orphan(id))
		return fail(EINVAL); // The parent's (cm_atfork_child)
	(void)timeout_ms;
	if (!id)
		return fail(EINVAL);
	cm_id *p = to_priv(id);
	{
		std::lock_guard<std::mutex> lk(G().mu);
		if (p->state != st::addr_resolved)
			return fail(EINVAL);
		// The path to the port the destination resolved to.
		p->path = {};
		ibv_sa_path_rec &r = p->path;
		r.sgid = p->gid;
		r.dgid = p->rgid;
		r.slid = htobe16(p->lid);
		r.dlid = htobe16(p->rlid);
		r.reversible = 1;
		r.numb_path = 1;
		r.pkey = htobe16(0xffff);
		r.mtu_selector = 2;
		r.mtu = static_cast<uint8_t>(p->mtu);
		r.rate_selector = 2;
		r.rate = 7;
		r.packet_life_time_selector = 2;
		r.packet_life_time = packet_life(p);
		r.hop_limit = p->eth ? 64 : 0;
		r.traffic_class = p->tos;
		p->id.route.path_rec = &p->path;
		p->id.route.num_paths = 1;
		p->id.route.addr.addr.ibaddr.dgid = p->rgid; // As the kernel's ucma_copy_*_route
		p->state = st::route_resolved;
		push(p, RDMA_CM_EVENT_ROUTE_RESOLVED, 0);
	}
	if (p->sync)
		return sync_wait(p, RDMA_CM_EVENT_ROUTE_RESOLVED);
	return 0;
}

namespace {
// A new QP's ECE: the id's local ECE becomes the QP's; on the passive side
// (a REQ with ECE came) the QP is told the peer's options, or none if the
// peer is of another vendor.  A provider without ECE (EOPNOTSUPP) is no
// error: the id then has none.
int ece_on_new_qp(cm_id *p, ibv_qp *qp)
{
	ibv_ece e{};
	int r = ibv_query_ece(qp, &e);
	if (r && r != EOPNOTSUPP)
		return r;
	p->local_ece.vendor_id = r ? 0 : e.vendor_id;
	p->local_ece.options = r ? 0 : e.options;
	if (!p->remote_ece.vendor_id || r)
		return 0;
	ibv_ece want{};
	want.vendor_id = p->local_ece.vendor_id;
	if (p->remote_ece.vendor_id == p->local_ece.vendor_id)
		want.options = p->remote_ece.options;
	r = ibv_set_ece(qp, &want);
	if (r && r != EOPNOTSUPP)
		return r;
	// What the QP will use is what the REP offers back.
	if (!ibv_query_ece(qp, &e))
		p->local_ece.options = e.options;
	return 0;
}

// The active side's QP when the REP comes: its options are those the REP
// answered (none if the peer has no ECE); a REP naming another vendor than
// the REQ's is a broken handshake (EINVAL).
int ece_on_rep(cm_id *p)
{
	ibv_ece want{};
	if (!p->remote_ece.vendor_id) {
		if (!p->local_ece.vendor_id)
			return 0;
		want.vendor_id = p->local_ece.vendor_id;
	} else if (p->remote_ece.vendor_id != p->local_ece.vendor_id) {
		return EINVAL;
	} else {
		want = p->remote_ece;
		want.comp_mask = 0;
	}
	int r = ibv_set_ece(p->id.qp, &want);
	if (r && r != EOPNOTSUPP)
		return r;
	ibv_ece e{};
	r = ibv_query_ece(p->id.qp, &e);
	if (r && r != EOPNOTSUPP)
		return r;
	p->local_ece.options = r ? 0 : e.options;
	return 0;
}

} // namespace

SV_API int rdma_create_qp_ex(rdma_cm_id *id, ibv_qp_init_attr_ex *attr)
{
	if (orphan(id))
		return fail(EINVAL); // The parent's (cm_atfork_child)
	if (!id || !attr)
		return fail(EINVAL);
	cm_id *p = to_priv(id);
	std::lock_guard<std::mutex> lk(G().mu);
	if (!p->dev || p->id.qp)
		return fail(EINVAL);
	if (attr->qp_type != p->id.qp_type &&
	    !(p->id.qp_type == IBV_QPT_RC && (attr->qp_type == IBV_QPT_UC || attr->qp_type == IBV_QPT_RC)))
		return fail(EINVAL);
	p->id.qp_type = attr->qp_type;
	ibv_qp_init_attr_ex a = *attr;
	if (!(a.comp_mask & IBV_QP_INIT_ATTR_PD) || !a.pd) {
		if (!p->id.pd) {
			if (!p->dev->pd)
				p->dev->pd = ibv_alloc_pd(p->dev->ctx);
			if (!p->dev->pd)
				return -1;
		}
		a.pd = p->id.pd ? p->id.pd : p->dev->pd;
		a.comp_mask |= IBV_QP_INIT_ATTR_PD;
	}
	if (a.pd->context != p->id.verbs)
		return fail(EINVAL);
	if (a.qp_type == IBV_QPT_XRC_RECV && (!(a.comp_mask & IBV_QP_INIT_ATTR_XRCD) || !a.xrcd)) {
		a.xrcd = dev_xrcd(p->dev);
		if (!a.xrcd)
			return -1;
		a.comp_mask |= IBV_QP_INIT_ATTR_XRCD;
	}
	if (!a.srq && p->id.srq && a.qp_type != IBV_QPT_XRC_RECV && a.qp_type != IBV_QPT_XRC_SEND)
		a.srq = p->id.srq;
	if (!a.send_cq || !a.recv_cq) {
		if (int e = create_cqs(p, &a)) {
			destroy_cqs(p);
			return fail(e);
		}
	}
	ibv_qp *qp = ibv_create_qp_ex(p->id.verbs, &a);
	if (!qp) {
		int e = errno;
		destroy_cqs(p);
		return fail(e);
	}
	p->id.qp = qp;
	if (qp->pd) // The id's PD is its QP's (rdma-core's): rdma_reg_msgs uses it
		p->id.pd = qp->pd;
	int e = ece_on_new_qp(p, qp);
	if (!e)
		e = modify_locked(p, IBV_QPS_INIT);
	if (!e && a.qp_type == IBV_QPT_UD) {
		e = modify_locked(p, IBV_QPS_RTR);
		if (!e)
			e = modify_locked(p, IBV_QPS_RTS);
	}
	if (e) {
		ibv_destroy_qp(qp);
		p->id.qp = nullptr;
		destroy_cqs(p);
		return fail(e);
	}
	attr->cap = a.cap;
	return 0;
}

SV_API int rdma_create_qp(rdma_cm_id *id, ibv_pd *pd, ibv_qp_init_attr *qp_init_attr)
{
	if (orphan(id))
		return fail(EINVAL); // The parent's (cm_atfork_child)
	if (!id || !qp_init_attr)
		return fail(EINVAL);
	ibv_qp_init_attr_ex a;
	memset(&a, 0, sizeof(a));
	memcpy(&a, qp_init_attr, sizeof(*qp_init_attr));
	a.comp_mask = pd ? IBV_QP_INIT_ATTR_PD : 0;
	a.pd = pd;
	if (rdma_create_qp_ex(id, &a))
		return -1;
	qp_init_attr->cap = a.cap;
	qp_init_attr->send_cq = id->send_cq ? id->send_cq : qp_init_attr->send_cq;
	qp_init_attr->recv_cq = id->recv_cq ? id->recv_cq : qp_init_attr->recv_cq;
	return 0;
}

SV_API void rdma_destroy_qp(rdma_cm_id *id)
{
	if (orphan(id)) {
		id->qp = nullptr; // The parent's: not ours to destroy (cm_atfork_child)
		return;
	}
	if (!id)
		return;
	cm_id *p = to_priv(id);
	std::lock_guard<std::mutex> lk(G().mu);
	for (auto &m : p->mcs)
		if (m.attached && p->id.qp) {
			ibv_detach_mcast(p->id.qp, &m.mgid, m.mlid);
			m.attached = false;
		}
	if (p->id.qp)
		ibv_destroy_qp(p->id.qp);
	p->id.qp = nullptr;
	// An XRC target's CQ serves its SRQ: it goes with the SRQ (rdma-core's
	// rule), not with the QP.
	if (!(p->id.qp_type == IBV_QPT_XRC_RECV && p->id.srq))
		destroy_cqs(p);
}

SV_API int rdma_connect(rdma_cm_id *id, rdma_conn_param *conn_param)
{
	if (orphan(id))
		return fail(EINVAL); // The parent's (cm_atfork_child)
	if (!id)
		return fail(EINVAL);
	cm_id *p = to_priv(id);
	wire_msg m;
	sockaddr_storage dst;
	{
		std::lock_guard<std::mutex> lk(G().mu);
		if (p->state != st::route_resolved)
			return fail(EINVAL);
		bool ud = p->id.qp_type == IBV_QPT_UD;
		int maxp = ud ? kSidrReqPdata : kReqPdata;
		if (conn_param && check_pdata(conn_param->private_data, conn_param->private_data_len, maxp))
			return fail(EINVAL);
		// As rdma-core's ucma_valid_param: an RDMA_PS_TCP id without a
		// QP needs parameters (their qp_num, 0 too, goes out as given).
		if (!p->id.qp && p->id.ps == RDMA_PS_TCP && !conn_param)
			return fail(EINVAL);
		if (!depths_valid(p, conn_param))
			return fail(EINVAL);
		m = base_msg(p, ud ? M_SIDR_REQ : M_REQ);
		p->psn = rand24();
		// Without parameters, or with 0xFF, the REQ offers the device's
		// maximum, as rdma-core's rdma_connect does.
		p->resp_res = cap(conn_param ? conn_param->responder_resources : uint8_t(RDMA_MAX_RESP_RES),
				  p->dev->attr.max_qp_rd_atom);
		p->init_depth = cap(conn_param ? conn_param->initiator_depth : uint8_t(RDMA_MAX_INIT_DEPTH),
				    p->dev->attr.max_qp_init_rd_atom);
		if (conn_param) {
			// 3-bit fields of the REQ: capped at 7 as the kernel's cma does.
			p->retry = std::min<uint8_t>(conn_param->retry_count, 7);
			p->rnr_retry = std::min<uint8_t>(conn_param->rnr_retry_count, 7);
			put_pdata(m, conn_param->private_data, conn_param->private_data_len);
			m.flow_control = conn_param->flow_control;
			m.srq = conn_param->srq;
		}
		m.qpn = p->id.qp ? p->id.qp->qp_num : (conn_param ? conn_param->qp_num : 0);
		m.psn = p->psn;
		m.qkey = RDMA_UDP_QKEY;
		m.resp_res = p->resp_res;
		m.init_depth = p->init_depth;
		m.retry_count = p->retry;
		m.rnr_retry = p->rnr_retry;
		memcpy(&dst, &p->id.route.addr.dst_storage, sizeof(dst));
		p->state = st::connect; // further calls see a connecting id
		if (p->wire) {
			// To another host: the REQ (SIDR REQ) as a MAD, sent again
			// until the REP (SIDR REP).
			p->tid = rand64();
			if (!open_comm(p) || !wire_send(p, m)) {
				p->state = st::error;
				push(p, RDMA_CM_EVENT_UNREACHABLE, -EHOSTUNREACH);
			} else {
				p->deadline_ms = now_ms() + cm_timeout_ms();
			}
		}
	}
	if (p->wire) {
		if (p->sync)
			return sync_wait(p, RDMA_CM_EVENT_ESTABLISHED);
		return 0;
	}
	// One try, which does not wait; a listener that is busy, or was there
	// lately, is tried again by the CM thread (connect_listener_once).
	// port_in_use_lately takes the lock.
	int fd = connect_listener_once(p, reinterpret_cast<sockaddr *>(&dst));
	bool again = fd == -EAGAIN ||
		     (fd == -ECONNREFUSED &&
		      port_in_use_lately(p->id.ps, get_port(reinterpret_cast<sockaddr *>(&dst))));
	{
		std::lock_guard<std::mutex> lk(G().mu);
		if (fd < 0 && again && p->state == st::connect) {
			int64_t now = now_ms();
			p->req_msg = m;
			p->req_dst = dst;
			p->req_retry_until = now + kReqRetryMs;
			p->req_retry_ms = now + kReqRetryStepMs;
			uint64_t one = 1;
			if (write(G().wake, &one, sizeof(one)) < 0) {
				// Full (never, at 2^64 - 2): it is awake anyway
			}
		} else {
			send_req(p, fd, m);
		}
	}
	if (p->sync)
		return sync_wait(p, RDMA_CM_EVENT_ESTABLISHED);
	return 0;
}

SV_API int rdma_establish(rdma_cm_id *id)
{
	if (orphan(id))
		return fail(EINVAL); // The parent's (cm_atfork_child)
	if (!id)
		return fail(EINVAL);
	cm_id *p = to_priv(id);
	std::lock_guard<std::mutex> lk(G().mu);
	if (p->state != st::rep_rcvd)
		return fail(EINVAL);
	wire_msg m = base_msg(p, M_RTU);
	if (!send_peer(p, m))
		return fail(ECONNRESET);
	p->state = st::established;
	return 0;
}

SV_API int rdma_listen(rdma_cm_id *id, int backlog)
{
	if (orphan(id))
		return fail(EINVAL); // The parent's (cm_atfork_child)
	if (!id)
		return fail(EINVAL);
	cm_id *p = to_priv(id);
	std::lock_guard<std::mutex> lk(G().mu);
	if (p->state == st::listen)
		return 0;
	if (p->state == st::idle) {
		sockaddr_in any{};
		any.sin_family = AF_INET;
		if (int e = bind_locked(p, reinterpret_cast<sockaddr *>(&any)))
			return fail(e);
	}
	if (p->state != st::bound)
		return fail(EINVAL);
	{
		// A listener may share its port with no one the rules do not
		// allow, REUSEADDR or not, and is no longer reusable.
		const sockaddr *sa = &p->id.route.addr.src_addr;
		port_lock lock(p->id.ps, get_port(sa));
		if (int e = check_port(p, sa, false))
			return fail(e);
		if (p->unnamed) {
			socklen_t len;
			sockaddr_un un = sock_name(p->id.ps, addr_text(sa), get_port(sa), len);
			if (bind(p->bind_fd, reinterpret_cast<sockaddr *>(&un), len))
				return fail(errno == EADDRINUSE ? EADDRINUSE : errno);
			p->unnamed = false;
		}
		p->reuseaddr = 0;
		if (int e = publish_owner(p, sa, false))
			return fail(e);
	}
	p->backlog = backlog > 0 ? backlog : 128;
	if (listen(p->bind_fd, backlog > 0 ? backlog : 128))
		return -1;
	p->state = st::listen;
	epoll_add(p->bind_fd, p->serial << 2);
	if (G().any_wire)
		open_listener_gsi(p);
	return 0;
}

SV_API int rdma_get_request(rdma_cm_id *listen, rdma_cm_id **id)
{
	if (!listen || !id)
		return fail(EINVAL);
	cm_id *l = to_priv(listen);
	if (!l->sync || l->state != st::listen)
		return fail(EINVAL);
	if (l->id.event) {
		rdma_ack_cm_event(l->id.event);
		l->id.event = nullptr;
	}
	rdma_cm_event *ev;
	for (;;) {
		if (rdma_get_cm_event(&l->chan->ch, &ev))
			return -1;
		if (ev->status) {
			int s = ev->status;
			rdma_ack_cm_event(ev);
			return fail(s < 0 ? -s : s);
		}
		if (ev->event == RDMA_CM_EVENT_CONNECT_REQUEST)
			break;
		rdma_ack_cm_event(ev);
	}
	cm_id *c = to_priv(ev->id);
	c->id.event = ev;
	rdma_cm_id *got = ev->id;
	if (l->ep_qp_attr) {
		ibv_qp_init_attr_ex a = *l->ep_qp_attr;
		if (l->id.pd) {
			a.pd = l->id.pd;
			a.comp_mask |= IBV_QP_INIT_ATTR_PD;
		}
		if (rdma_create_qp_ex(got, &a)) {
			int e = errno;
			rdma_reject(got, nullptr, 0);
			rdma_destroy_id(got);
			return fail(e); // *id untouched: it would name a freed id
		}
	}
	*id = got;
	return 0;
}

SV_API int rdma_accept(rdma_cm_id *id, rdma_conn_param *conn_param)
{
	if (orphan(id))
		return fail(EINVAL); // The parent's (cm_atfork_child)
	if (!id)
		return fail(EINVAL);
	cm_id *p = to_priv(id);
	bool ud = p->id.qp_type == IBV_QPT_UD;
	{
		std::lock_guard<std::mutex> lk(G().mu);
		if (p->state != st::req_rcvd)
			return fail(EINVAL);
		int maxp = ud ? kSidrRepPdata : kRepPdata;
		if (conn_param && check_pdata(conn_param->private_data, conn_param->private_data_len, maxp))
			return fail(EINVAL);
		// As rdma-core's ucma_valid_param: an RDMA_PS_TCP id without a
		// QP needs parameters (their qp_num, 0 too, goes out as given).
		if (!p->id.qp && p->id.ps == RDMA_PS_TCP && !conn_param)
			return fail(EINVAL);
		if (!depths_valid(p, conn_param))
			return fail(EINVAL);
		if (p->peer_gone) {
			p->state = st::error;
			push(p, RDMA_CM_EVENT_UNREACHABLE, -ETIMEDOUT);
		} else {
			wire_msg m = base_msg(p, ud ? M_SIDR_REP : M_REP);
			p->psn = rand24();
			// Without parameters, or with 0xFF, what the REQ offered
			// within the device's maximum (rdma-core's rdma_accept): the
			// requester's initiator depth is our responder resources.
			uint8_t rr = conn_param ? conn_param->responder_resources : uint8_t(RDMA_MAX_RESP_RES);
			uint8_t id = conn_param ? conn_param->initiator_depth : uint8_t(RDMA_MAX_INIT_DEPTH);
			p->resp_res = cap(rr == RDMA_MAX_RESP_RES ? p->r_init : rr, p->dev->attr.max_qp_rd_atom);
			p->init_depth = cap(id == RDMA_MAX_INIT_DEPTH ? p->r_resp : id,
					    p->dev->attr.max_qp_init_rd_atom);
			if (conn_param) {
				p->rnr_retry = std::min<uint8_t>(conn_param->rnr_retry_count, 7);
				put_pdata(m, conn_param->private_data, conn_param->private_data_len);
				m.flow_control = conn_param->flow_control;
				m.srq = conn_param->srq;
			}
			p->retry = std::min<uint8_t>(p->r_retry, 7);
			if (p->id.qp && !ud) {
				int e = modify_locked(p, IBV_QPS_RTR);
				if (!e)
					e = modify_locked(p, IBV_QPS_RTS);
				if (e)
					return fail(e);
			}
			m.qpn = p->id.qp ? p->id.qp->qp_num : (conn_param ? conn_param->qp_num : 0);
			// The REP answers the REQ's vendor with our options, as the kernel's.
			m.ece_vendor = p->remote_ece.vendor_id;
			m.psn = p->psn;
			m.qkey = RDMA_UDP_QKEY;
			m.resp_res = p->resp_res;
			m.init_depth = p->init_depth;
			m.rnr_retry = p->rnr_retry;
			if (!send_peer(p, m)) {
				close_conn(p);
				if (ud)
					return fail(ECONNRESET);
				p->state = st::error;
				push(p, RDMA_CM_EVENT_UNREACHABLE, -ETIMEDOUT);
			} else if (ud) {
				p->state = st::established;
				close_conn(p);
			} else {
				p->state = st::accepted;
				p->deadline_ms = now_ms() + cm_timeout_ms();
			}
		}
	}
	if (p->sync && !ud)
		return sync_wait(p, RDMA_CM_EVENT_ESTABLISHED);
	return 0;
}

namespace {
int reject_with(rdma_cm_id *id, const void *private_data, uint8_t private_data_len, uint32_t reason)
{
	if (!id)
		return fail(EINVAL);
	cm_id *p = to_priv(id);
	std::lock_guard<std::mutex> lk(G().mu);
	if (p->state != st::req_rcvd)
		return fail(EINVAL);
	bool ud = p->id.qp_type == IBV_QPT_UD;
	if (check_pdata(private_data, private_data_len, ud ? kSidrRepPdata : kRejPdata))
		return fail(EINVAL);
	wire_msg m = base_msg(p, ud ? M_SIDR_REP : M_REJ);
	m.status = ud ? 1 : reason;
	put_pdata(m, private_data, private_data_len);
	send_peer(p, m);
	close_conn(p);
	p->state = st::rejected;
	return 0;
}
} // namespace

SV_API int rdma_reject(rdma_cm_id *id, const void *private_data, uint8_t private_data_len)
{
	if (orphan(id))
		return fail(EINVAL); // The parent's (cm_atfork_child)
	return reject_with(id, private_data, private_data_len, kRejConsumer);
}

// The REJ's reason is the IB CM's "vendor option not supported" (35): the
// peer's REJECTED has status 35.
SV_API int rdma_reject_ece(rdma_cm_id *id, const void *private_data, uint8_t private_data_len)
{
	if (orphan(id))
		return fail(EINVAL); // The parent's (cm_atfork_child)
	return reject_with(id, private_data, private_data_len, kRejVendorOptionNotSupported);
}

SV_API int rdma_notify(rdma_cm_id *id, ibv_event_type event)
{
	if (orphan(id))
		return fail(EINVAL); // The parent's (cm_atfork_child)
	if (!id)
		return fail(EINVAL);
	cm_id *p = to_priv(id);
	std::lock_guard<std::mutex> lk(G().mu);
	if (!p->dev)
		return fail(EINVAL);
	// Communication established before the RTU: the RTU is as good as here.
	if (event == IBV_EVENT_COMM_EST && p->state == st::accepted) {
		p->state = st::established;
		p->rtu_late = true; // Dropped when it comes (the kernel's cm_establish)
		p->resend.clear(); // The REP needs no more sending
		p->resend_ms = 0;
		push(p, RDMA_CM_EVENT_ESTABLISHED, 0);
	}
	return 0;
}

SV_API int rdma_disconnect(rdma_cm_id *id)
{
	if (orphan(id))
		return fail(EINVAL); // The parent's (cm_atfork_child)
	if (!id)
		return fail(EINVAL);
	cm_id *p = to_priv(id);
	std::lock_guard<std::mutex> lk(G().mu);
	switch (p->state) {
	case st::connect:
	case st::rep_rcvd:
	case st::accepted:
	case st::established: {
		qp_to_err(p);
		if (p->state == st::accepted)
			p->rtu_late = p->est_on_rtu = true; // The RTU may be on its way
		wire_msg m = base_msg(p, M_DREQ);
		if (!send_peer(p, m)) {
			close_conn(p);
			p->state = st::disconnected;
			push_disconnected(p);
		} else {
			p->state = st::disc_sent;
			if (p->wire)
				p->deadline_ms = now_ms() + cm_timeout_ms();
		}
		return 0;
	}
	case st::disc_sent:
	case st::disconnected:
	case st::error:
	case st::rejected:
		qp_to_err(p);
		return 0;
	default:
		return fail(EINVAL);
	}
}

SV_API int rdma_get_cm_event(rdma_event_channel *channel, rdma_cm_event **event)
{
	if (!channel || !event)
		return fail(EINVAL);
	channel_priv *c = to_chan(channel);
	{
		std::unique_lock<std::mutex> lk(G().mu);
		if (c->destroyed) {
			// Destroyed before this call (see rdma_destroy_event_channel):
			// no event will ever come.  (pause, not a condition variable:
			// glibc's pthread_cond_destroy at exit would wait for us.)
			lk.unlock();
			for (;;)
				pause();
		}
		c->readers++;
	}
	for (;;) {
		uint64_t v;
		ssize_t r = read(c->ch.fd, &v, sizeof(v));
		std::lock_guard<std::mutex> lk(G().mu);
		if (r < 0) {
			int e = errno;
			if (e == EINTR)
				continue;
			c->readers--;
			return fail(e);
		}
		if (c->q.empty())
			continue; // the count of an event dropped with its channel's destruction
		event_priv *e = c->q.front();
		c->q.pop_front();
		if (e->dead) {
			delete e;
			continue;
		}
		e->counted->reported++;
		cm_id *p = e->about;
		if (p->req_event == e)
			p->req_event = nullptr;
		if (e->conn_resp && p->id.qp && p->state == st::rep_rcvd) {
			int err = ece_on_rep(p);
			if (!err)
				err = modify_locked(p, IBV_QPS_RTR);
			if (!err)
				err = modify_locked(p, IBV_QPS_RTS);
			wire_msg m = base_msg(p, err ? M_REJ : M_RTU);
			m.status = kRejConsumer;
			if (!err && send_peer(p, m)) {
				p->state = st::established;
				e->ev.event = RDMA_CM_EVENT_ESTABLISHED;
			} else {
				if (err)
					send_peer(p, m);
				close_conn(p);
				qp_to_err(p); // As rdma-core's ucma_process_conn_resp
				p->state = st::error;
				e->ev.event = RDMA_CM_EVENT_CONNECT_ERROR;
				e->ev.status = err ? -err : -ECONNRESET;
			}
		} else if (e->conn_resp && p->id.qp) {
			// The connection went before its response was read (the peer
			// disconnected or died, or this side called rdma_disconnect):
			// rdma-core's ucma_process_conn_resp fails then, and the
			// application sees CONNECT_ERROR, never the raw response.
			qp_to_err(p);
			e->ev.event = RDMA_CM_EVENT_CONNECT_ERROR;
			e->ev.status = -ECONNRESET;
		}
		c->readers--;
		*event = &e->ev;
		return 0;
	}
}

SV_API int rdma_ack_cm_event(rdma_cm_event *event)
{
	if (!event)
		return fail(EINVAL);
	auto *e = reinterpret_cast<event_priv *>(event);
	std::lock_guard<std::mutex> lk(G().mu);
	e->counted->acked++;
	G().cv.notify_all();
	delete e;
	return 0;
}

SV_API ibv_context **rdma_get_devices(int *num_devices)
{
	std::lock_guard<std::mutex> lk(G().mu);
	if (int e = ensure_started_locked()) {
		if (num_devices)
			*num_devices = 0;
		errno = e;
		return nullptr;
	}
	size_t n = G().devs.size();
	auto **list = static_cast<ibv_context **>(calloc(n + 1, sizeof(ibv_context *)));
	if (!list) {
		errno = ENOMEM;
		return nullptr;
	}
	for (size_t i = 0; i < n; i++)
		list[i] = G().devs[i]->ctx;
	if (num_devices)
		*num_devices = static_cast<int>(n);
	return list;
}

SV_API void rdma_free_devices(ibv_context **list)
{
	free(list);
}

SV_API const char *rdma_event_str(rdma_cm_event_type event)
{
	switch (event) {
	case RDMA_CM_EVENT_ADDR_RESOLVED: return "RDMA_CM_EVENT_ADDR_RESOLVED";
	case RDMA_CM_EVENT_ADDR_ERROR: return "RDMA_CM_EVENT_ADDR_ERROR";
	case RDMA_CM_EVENT_ROUTE_RESOLVED: return "RDMA_CM_EVENT_ROUTE_RESOLVED";
	case RDMA_CM_EVENT_ROUTE_ERROR: return "RDMA_CM_EVENT_ROUTE_ERROR";
	case RDMA_CM_EVENT_CONNECT_REQUEST: return "RDMA_CM_EVENT_CONNECT_REQUEST";
	case RDMA_CM_EVENT_CONNECT_RESPONSE: return "RDMA_CM_EVENT_CONNECT_RESPONSE";
	case RDMA_CM_EVENT_CONNECT_ERROR: return "RDMA_CM_EVENT_CONNECT_ERROR";
	case RDMA_CM_EVENT_UNREACHABLE: return "RDMA_CM_EVENT_UNREACHABLE";
	case RDMA_CM_EVENT_REJECTED: return "RDMA_CM_EVENT_REJECTED";
	case RDMA_CM_EVENT_ESTABLISHED: return "RDMA_CM_EVENT_ESTABLISHED";
	case RDMA_CM_EVENT_DISCONNECTED: return "RDMA_CM_EVENT_DISCONNECTED";
	case RDMA_CM_EVENT_DEVICE_REMOVAL: return "RDMA_CM_EVENT_DEVICE_REMOVAL";
	case RDMA_CM_EVENT_MULTICAST_JOIN: return "RDMA_CM_EVENT_MULTICAST_JOIN";
	case RDMA_CM_EVENT_MULTICAST_ERROR: return "RDMA_CM_EVENT_MULTICAST_ERROR";
	case RDMA_CM_EVENT_ADDR_CHANGE: return "RDMA_CM_EVENT_ADDR_CHANGE";
	case RDMA_CM_EVENT_TIMEWAIT_EXIT: return "RDMA_CM_EVENT_TIMEWAIT_EXIT";
	default: return "UNKNOWN EVENT";
	}
}

SV_API __be16 rdma_get_src_port(rdma_cm_id *id)
{
	return id ? htons(get_port(&id->route.addr.src_addr)) : 0;
}

SV_API __be16 rdma_get_dst_port(rdma_cm_id *id)
{
	return id ? htons(get_port(&id->route.addr.dst_addr)) : 0;
}

SV_API int rdma_set_option(rdma_cm_id *id, int level, int optname, void *optval, size_t optlen)
{
	if (orphan(id))
		return fail(EINVAL); // The parent's (cm_atfork_child)
	if (!id || !optval)
		return fail(EINVAL);
	cm_id *p = to_priv(id);
	std::lock_guard<std::mutex> lk(G().mu);
	if (level == RDMA_OPTION_ID) {
		switch (optname) {
		case RDMA_OPTION_ID_TOS:
			if (optlen != sizeof(uint8_t))
				return fail(EINVAL);
			p->tos = *static_cast<uint8_t *>(optval);
			return 0;
		case RDMA_OPTION_ID_REUSEADDR: {
			if (optlen != sizeof(int))
				return fail(EINVAL);
			// As the kernel: set before a bind, or turned on before listening.
			int v = *static_cast<int *>(optval);
			if (p->state != st::idle && (!v || p->state == st::listen))
				return fail(EINVAL);
			p->reuseaddr = v;
			if (p->own_fd >= 0)
				if (int e = publish_owner(p, &p->id.route.addr.src_addr, v != 0))
					return fail(e);
			return 0;
		}
		case RDMA_OPTION_ID_AFONLY:
			if (optlen != sizeof(int))
				return fail(EINVAL);
			if (p->state != st::idle && p->state != st::bound)
				return fail(EINVAL);
			p->afonly = *static_cast<int *>(optval);
			p->afonly_set = true;
			if (p->own_fd >= 0)
				if (int e = publish_owner(p, &p->id.route.addr.src_addr, p->reuseaddr != 0))
					return fail(e);
			return 0;
		case RDMA_OPTION_ID_ACK_TIMEOUT:
			if (optlen != sizeof(uint8_t))
				return fail(EINVAL);
			p->ack_timeout = std::min<uint8_t>(*static_cast<uint8_t *>(optval), 31);
			p->ack_timeout_set = true;
			return 0;
		default:
			return fail(ENOSYS);
		}
	}
	if (level == RDMA_OPTION_IB && optname == RDMA_OPTION_IB_PATH) {
		if (!optlen || optlen % sizeof(ibv_path_data))
			return fail(EINVAL);
		if (p->state != st::addr_resolved)
			return fail(EINVAL);
		// The path is made up from the fabric (docs/rdmacm.md): accept
		// the user's record and resolve the route as we would.
		p->state = st::route_resolved;
		fill_path(p);
		return 0;
	}
	return fail(ENOSYS);
}

SV_API int rdma_migrate_id(rdma_cm_id *id, rdma_event_channel *channel)
{
	if (!id)
		return fail(EINVAL);
	cm_id *p = to_priv(id);
	// A synchronous id holds its last event: it goes first, as in rdma-core.
	if (p->sync && p->id.event) {
		rdma_ack_cm_event(p->id.event);
		p->id.event = nullptr;
	}
	std::unique_lock<std::mutex> lk(G().mu);
	channel_priv *to = channel ? to_chan(channel) : new_channel();
	if (!to)
		return -1;
	if (to->destroyed)
		return fail(EINVAL);
	if (p->orphan)
		return fail(EINVAL); // The parent's (cm_atfork_child)
	G().cv.wait(lk, [p] { return p->reported == p->acked; });
	channel_priv *from = p->chan;
	if (from == to)
		return 0;
	// Queued events of the id move with it, as the kernel's: those it counts
	// (a listener's CONNECT_REQUESTs too).  The event itself moves (a child
	// points at its CONNECT_REQUEST); a dead entry takes its place, which
	// the old channel's counter still counts.
	for (event_priv *&slot : from->q) {
		event_priv *e = slot;
		if (e->dead || e->counted != p)
			continue;
		auto *dead = new event_priv;
		dead->dead = true;
		slot = dead;
		push_event(to, e);
	}
	bool was_sync = p->sync;
	p->chan = to;
	p->id.channel = &to->ch;
	p->sync = !channel;
	// A synchronous id's private channel goes with it, unless ids it made
	// (a listener's children) still use it.
	if (was_sync)
		for (auto &kv : G().ids)
			if (kv.second->chan == from)
				was_sync = false;
	if (was_sync) {
		for (event_priv *e : from->q)
			delete e;
		close(from->ch.fd);
		delete from;
	}
	return 0;
}

// ---------------------------------------------------------- addrinfo ---

SV_API int rdma_getaddrinfo(const char *node, const char *service, const rdma_addrinfo *hints,
			    rdma_addrinfo **res)
{
	if (!res)
		return fail(EINVAL);
	if (!node && !service && !(hints && (hints->ai_src_addr || hints->ai_dst_addr)))
		return fail(EINVAL);
	auto *r = static_cast<rdma_addrinfo *>(calloc(1, sizeof(rdma_addrinfo)));
	if (!r)
		return fail(ENOMEM);
	if (hints) {
		r->ai_flags = hints->ai_flags;
		r->ai_family = hints->ai_family;
		r->ai_qp_type = hints->ai_qp_type;
		r->ai_port_space = hints->ai_port_space;
	}
	if (!r->ai_port_space)
		r->ai_port_space = r->ai_qp_type == IBV_QPT_UD ? RDMA_PS_UDP : RDMA_PS_TCP;
	if (!r->ai_qp_type)
		r->ai_qp_type = r->ai_port_space == RDMA_PS_UDP ? IBV_QPT_UD : IBV_QPT_RC;
	auto copy_addr = [](const sockaddr *a, socklen_t len, sockaddr **out, socklen_t *outlen) {
		*out = static_cast<sockaddr *>(malloc(len));
		if (!*out)
			return false;
		memcpy(*out, a, len);
		*outlen = len;
		return true;
	};
	if ((node || service) && r->ai_family == AF_IB) {
		// AF_IB: the node is a GID (numeric only), the service a port in
		// the port space's service ID.
		sockaddr_ib sib{};
		sib.sib_family = AF_IB;
		sib.sib_pkey = htobe16(0xffff);
		if (node && inet_pton(AF_INET6, node, &sib.sib_addr) != 1) {
			free(r);
			return EAI_NONAME;
		}
		char *end = nullptr;
		long port = service ? strtol(service, &end, 10) : 0;
		if (service && (*end || port < 0 || port > 0xffff)) {
			free(r);
			return EAI_SERVICE;
		}
		uint64_t ps = r->ai_port_space == RDMA_PS_UDP ? RDMA_IB_IP_PS_UDP
			      : r->ai_port_space == RDMA_PS_IB ? RDMA_IB_PS_IB : RDMA_IB_IP_PS_TCP;
		sib.sib_sid = htobe64(ps | static_cast<uint64_t>(port));
		sib.sib_sid_mask = htobe64(~0ULL);
		bool ok = (r->ai_flags & RAI_PASSIVE)
				  ? copy_addr(reinterpret_cast<sockaddr *>(&sib), sizeof(sib), &r->ai_src_addr, &r->ai_src_len)
				  : copy_addr(reinterpret_cast<sockaddr *>(&sib), sizeof(sib), &r->ai_dst_addr, &r->ai_dst_len);
		if (!ok) {
			rdma_freeaddrinfo(r);
			return fail(ENOMEM);
		}
	} else if (node || service) {
		addrinfo h{}, *ai = nullptr;
		h.ai_family = r->ai_family;
		h.ai_socktype = SOCK_STREAM;
		if (r->ai_flags & RAI_PASSIVE)
			h.ai_flags |= AI_PASSIVE;
		if (r->ai_flags & RAI_NUMERICHOST)
			h.ai_flags |= AI_NUMERICHOST;
		int ret = getaddrinfo(node, service, &h, &ai);
		if (ret) {
			free(r);
			return ret;
		}
		r->ai_family = ai->ai_family;
		bool ok;
		if (r->ai_flags & RAI_PASSIVE)
			ok = copy_addr(ai->ai_addr, ai->ai_addrlen, &r->ai_src_addr, &r->ai_src_len);
		else
			ok = copy_addr(ai->ai_addr, ai->ai_addrlen, &r->ai_dst_addr, &r->ai_dst_len);
		if (ok && ai->ai_canonname) {
			char *cn = strdup(ai->ai_canonname);
			if (r->ai_flags & RAI_PASSIVE)
				r->ai_src_canonname = cn;
			else
				r->ai_dst_canonname = cn;
		}
		freeaddrinfo(ai);
		if (!ok) {
			rdma_freeaddrinfo(r);
			return fail(ENOMEM);
		}
	}
	if (hints && hints->ai_src_addr && !r->ai_src_addr &&
	    !copy_addr(hints->ai_src_addr, hints->ai_src_len, &r->ai_src_addr, &r->ai_src_len)) {
		rdma_freeaddrinfo(r);
		return fail(ENOMEM);
	}
	if (hints && hints->ai_dst_addr && !r->ai_dst_addr &&
	    !copy_addr(hints->ai_dst_addr, hints->ai_dst_len, &r->ai_dst_addr, &r->ai_dst_len)) {
		rdma_freeaddrinfo(r);
		return fail(ENOMEM);
	}
	*res = r;
	return 0;
}

SV_API void rdma_freeaddrinfo(rdma_addrinfo *res)
{
	while (res) {
		rdma_addrinfo *next = res->ai_next;
		free(res->ai_src_addr);
		free(res->ai_dst_addr);
		free(res->ai_src_canonname);
		free(res->ai_dst_canonname);
		free(res->ai_route);
		free(res->ai_connect);
		free(res);
		res = next;
	}
}

SV_API int rdma_create_ep(rdma_cm_id **id, rdma_addrinfo *res, ibv_pd *pd, ibv_qp_init_attr *qp_init_attr)
{
	if (!id || !res)
		return fail(EINVAL);
	rdma_cm_id *cid;
	if (rdma_create_id(nullptr, &cid, nullptr, static_cast<rdma_port_space>(res->ai_port_space)))
		return -1;
	cid->qp_type = static_cast<ibv_qp_type>(res->ai_qp_type);
	cid->pd = pd;
	int ret;
	if (res->ai_flags & RAI_PASSIVE) {
		ret = rdma_bind_addr(cid, res->ai_src_addr);
		if (!ret && qp_init_attr) {
			auto *a = new ibv_qp_init_attr_ex;
			memset(a, 0, sizeof(*a));
			memcpy(a, qp_init_attr, sizeof(*qp_init_attr));
			// The QP type is the address's, as rdma-core sets it: callers
			// zero the attributes (rdma_server's 0 is no type at all).
			a->qp_type = static_cast<ibv_qp_type>(res->ai_qp_type);
			to_priv(cid)->ep_qp_attr = a;
		}
	} else {
		ret = rdma_resolve_addr(cid, res->ai_src_addr, res->ai_dst_addr, 2000);
		if (!ret)
			ret = rdma_resolve_route(cid, 2000);
		if (!ret && qp_init_attr) {
			qp_init_attr->qp_type = static_cast<ibv_qp_type>(res->ai_qp_type);
			ret = rdma_create_qp(cid, pd, qp_init_attr);
		}
	}
	if (ret) {
		int e = errno;
		rdma_destroy_id(cid);
		return fail(e);
	}
	*id = cid;
	return 0;
}

SV_API void rdma_destroy_ep(rdma_cm_id *id)
{
	if (!id)
		return;
	if (id->qp)
		rdma_destroy_qp(id);
	if (id->srq)
		rdma_destroy_srq(id);
	rdma_destroy_id(id);
}

SV_API int rdma_create_srq_ex(rdma_cm_id *id, ibv_srq_init_attr_ex *attr)
{
	if (orphan(id))
		return fail(EINVAL); // The parent's (cm_atfork_child)
	if (!id || !attr || !id->verbs)
		return fail(EINVAL);
	cm_id *p = to_priv(id);
	ibv_srq_init_attr_ex a = *attr;
	if (!(a.comp_mask & IBV_SRQ_INIT_ATTR_PD) || !a.pd) {
		std::lock_guard<std::mutex> lk(G().mu);
		if (!p->id.pd && !p->dev->pd)
			p->dev->pd = ibv_alloc_pd(p->dev->ctx);
		a.pd = p->id.pd ? p->id.pd : p->dev->pd;
		if (!a.pd)
			return -1;
		a.comp_mask |= IBV_SRQ_INIT_ATTR_PD;
	}
	if (!(a.comp_mask & IBV_SRQ_INIT_ATTR_TYPE))
		a.srq_type = IBV_SRQT_BASIC, a.comp_mask |= IBV_SRQ_INIT_ATTR_TYPE;
	if (a.srq_type == IBV_SRQT_XRC) {
		// rdma-core's: the device's XRC domain, and the id's receive CQ
		// (made here when it has none) for the SRQ's completions.
		std::lock_guard<std::mutex> lk(G().mu);
		if (!(a.comp_mask & IBV_SRQ_INIT_ATTR_XRCD) || !a.xrcd) {
			a.xrcd = dev_xrcd(p->dev);
			if (!a.xrcd)
				return -1;
		}
		if (!(a.comp_mask & IBV_SRQ_INIT_ATTR_CQ) || !a.cq) {
			if (!p->id.recv_cq) {
				if (int e = create_recv_cq(p, a.attr.max_wr)) {
					destroy_cqs(p);
					return fail(e);
				}
			}
			a.cq = p->id.recv_cq;
		}
		a.comp_mask |= IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ;
	} else if (a.srq_type != IBV_SRQT_BASIC) {
		return fail(ENOSYS); // Tag matching through rdma_cm: not here
	}
	ibv_srq *srq = ibv_create_srq_ex(id->verbs, &a);
	if (!srq)
		return -1;
	attr->attr = a.attr;
	id->srq = srq;
	return 0;
}

SV_API int rdma_create_srq(rdma_cm_id *id, ibv_pd *pd, ibv_srq_init_attr *attr)
{
	if (orphan(id))
		return fail(EINVAL); // The parent's (cm_atfork_child)
	if (!id || !attr)
		return fail(EINVAL);
	ibv_srq_init_attr_ex a;
	memset(&a, 0, sizeof(a));
	a.srq_context = attr->srq_context;
	a.attr = attr->attr;
	a.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | (pd ? IBV_SRQ_INIT_ATTR_PD : 0);
	a.srq_type = id->qp_type == IBV_QPT_XRC_RECV ? IBV_SRQT_XRC : IBV_SRQT_BASIC;
	a.pd = pd;
	if (rdma_create_srq_ex(id, &a))
		return -1;
	attr->attr = a.attr;
	return 0;
}

SV_API void rdma_destroy_srq(rdma_cm_id *id)
{
	if (orphan(id)) {
		id->srq = nullptr; // The parent's: not ours to destroy (cm_atfork_child)
		return;
	}
	if (!id || !id->srq)
		return;
	ibv_destroy_srq(id->srq);
	id->srq = nullptr;
	// An XRC target's CQs stayed for the SRQ (rdma_destroy_qp); a QP that
	// still uses them keeps them.
	cm_id *p = to_priv(id);
	std::lock_guard<std::mutex> lk(G().mu);
	if (!p->id.qp)
		destroy_cqs(p);
}

SV_API int rdma_init_qp_attr(rdma_cm_id *id, ibv_qp_attr *qp_attr, int *qp_attr_mask)
{
	if (orphan(id))
		return fail(EINVAL); // The parent's (cm_atfork_child)
	if (!id || !qp_attr || !qp_attr_mask)
		return fail(EINVAL);
	std::lock_guard<std::mutex> lk(G().mu);
	if (int e = qp_attr_locked(to_priv(id), qp_attr, qp_attr_mask))
		return fail(e);
	return 0;
}

// ----------------------------------------------------------- multicast ---
// Groups are loop's UD multicast (ibv_attach_mcast): the MGID is made from
// the address (docs/rdmacm.md), joining is local and immediate.

namespace {

void make_mgid(cm_id *p, const sockaddr *a, ibv_gid &mgid, uint16_t &mlid)
{
	memset(&mgid, 0, sizeof(mgid));
	if (a->sa_family == AF_INET6 || a->sa_family == AF_IB) {
		addr_gid(a, mgid);
	} else if (p->eth) {
		// RoCE: the IPv4-mapped group address.
		addr_gid(a, mgid);
		mgid.raw[0] = 0xff; // keep it a multicast GID for the provider
		mgid.raw[1] = 0x0e;
	} else {
		// IPoIB's mapping of an IPv4 group: ff12:401b:<pkey>::<group>.
		mgid.raw[0] = 0xff;
		mgid.raw[1] = 0x12;
		mgid.raw[2] = 0x40;
		mgid.raw[3] = 0x1b;
		mgid.raw[4] = 0xff;
		mgid.raw[5] = 0xff;
		memcpy(&mgid.raw[12], &reinterpret_cast<const sockaddr_in *>(a)->sin_addr, 4);
	}
	uint32_t h = 2166136261u;
	for (uint8_t b : mgid.raw)
		h = (h ^ b) * 16777619u;
	mlid = p->eth ? 0 : static_cast<uint16_t>(0xc000 | (h % 0x3fff));
}

int join_locked(cm_id *p, const sockaddr *addr, void *context, bool sendonly)
{
	if (!addr || !addr_len(addr) || !is_mcast(addr))
		return EINVAL;
	if (!p->dev || (p->state != st::bound && p->state != st::addr_resolved &&
			p->state != st::route_resolved))
		return EINVAL;
	cm_id::mcast mc{};
	memcpy(&mc.addr, addr, addr_len(addr));
	for (auto &m : p->mcs)
		if (memcmp(&m.addr, &mc.addr, sizeof(mc.addr)) == 0)
			return EADDRINUSE;
	make_mgid(p, addr, mc.mgid, mc.mlid);
	auto *e = new_event(p, RDMA_CM_EVENT_MULTICAST_JOIN, 0);
	if (p->id.qp && !sendonly) {
		if (int err = ibv_attach_mcast(p->id.qp, &mc.mgid, mc.mlid)) {
			e->ev.event = RDMA_CM_EVENT_MULTICAST_ERROR;
			e->ev.status = -err;
		} else {
			mc.attached = true;
		}
	}
	ibv_ah_attr &ah = e->ev.param.ud.ah_attr;
	ah.port_num = p->id.port_num;
	ah.dlid = mc.mlid;
	ah.is_global = 1;
	ah.grh.dgid = mc.mgid;
	ah.grh.sgid_index = static_cast<uint8_t>(p->gid_index);
	ah.grh.hop_limit = p->eth ? 64 : 1;
	ah.grh.traffic_class = p->tos;
	e->ev.param.ud.qp_num = 0xffffff;
	e->ev.param.ud.qkey = RDMA_UDP_QKEY;
	e->ev.param.ud.private_data = context; // as rdma-core: the join's context
	if (e->ev.event == RDMA_CM_EVENT_MULTICAST_JOIN)
		p->mcs.push_back(mc);
	push_event(p->chan, e);
	return 0;
}

} // namespace

SV_API int rdma_join_multicast(rdma_cm_id *id, sockaddr *addr, void *context)
{
	if (orphan(id))
		return fail(EINVAL); // The parent's (cm_atfork_child)
	if (!id)
		return fail(EINVAL);
	cm_id *p = to_priv(id);
	{
		std::lock_guard<std::mutex> lk(G().mu);
		if (int e = join_locked(p, addr, context, false))
			return fail(e);
	}
	if (p->sync)
		return sync_wait(p, RDMA_CM_EVENT_MULTICAST_JOIN);
	return 0;
}

SV_API int rdma_join_multicast_ex(rdma_cm_id *id, rdma_cm_join_mc_attr_ex *mc_join_attr, void *context)
{
	if (orphan(id))
		return fail(EINVAL); // The parent's (cm_atfork_child)
	if (!id || !mc_join_attr)
		return fail(EINVAL);
	uint32_t known = RDMA_CM_JOIN_MC_ATTR_ADDRESS | RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS;
	if ((mc_join_attr->comp_mask & ~known) ||
	    !(mc_join_attr->comp_mask & RDMA_CM_JOIN_MC_ATTR_ADDRESS) ||
	    !(mc_join_attr->comp_mask & RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS))
		return fail(EINVAL);
	if (mc_join_attr->join_flags != RDMA_MC_JOIN_FLAG_FULLMEMBER &&
	    mc_join_attr->join_flags != RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER)
		return fail(EINVAL);
	cm_id *p = to_priv(id);
	{
		std::lock_guard<std::mutex> lk(G().mu);
		if (int e = join_locked(p, mc_join_attr->addr, context,
					mc_join_attr->join_flags == RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER))
			return fail(e);
	}
	if (p->sync)
		return sync_wait(p, RDMA_CM_EVENT_MULTICAST_JOIN);
	return 0;
}

SV_API int rdma_leave_multicast(rdma_cm_id *id, sockaddr *addr)
{
	if (orphan(id))
		return fail(EINVAL); // The parent's (cm_atfork_child)
	if (!id || !addr || !addr_len(addr))
		return fail(EINVAL);
	cm_id *p = to_priv(id);
	std::lock_guard<std::mutex> lk(G().mu);
	sockaddr_storage ss{};
	memcpy(&ss, addr, addr_len(addr));
	for (auto it = p->mcs.begin(); it != p->mcs.end(); ++it) {
		if (memcmp(&it->addr, &ss, sizeof(ss)) != 0)
			continue;
		if (it->attached && p->id.qp)
			ibv_detach_mcast(p->id.qp, &it->mgid, it->mlid);
		p->mcs.erase(it);
		return 0;
	}
	return fail(EADDRNOTAVAIL);
}

// ----------------------------------------------------------------- ECE ---
// A REQ carries the id's local ECE; a REP the vendor of the REQ's and the
// passive side's options.  Ids with a QP take theirs from the QP
// (ibv_query_ece, in rdma_create_qp) and agree with the peer through
// ibv_set_ece (ece_on_new_qp, ece_on_rep); ids without one (an external
// QP) exchange what the user set, for the user to apply.

SV_API int rdma_set_local_ece(rdma_cm_id *id, ibv_ece *ece)
{
	if (orphan(id))
		return fail(EINVAL); // The parent's (cm_atfork_child)
	if (!id || id->qp || !ece || !ece->vendor_id || ece->comp_mask)
		return fail(EINVAL);
	std::lock_guard<std::mutex> lk(G().mu);
	cm_id *p = to_priv(id);
	p->local_ece.vendor_id = ece->vendor_id;
	p->local_ece.options = ece->options;
	p->local_ece.comp_mask = 0;
	return 0;
}

SV_API int rdma_get_remote_ece(rdma_cm_id *id, ibv_ece *ece)
{
	if (!id || id->qp || !ece)
		return fail(EINVAL);
	std::lock_guard<std::mutex> lk(G().mu);
	cm_id *p = to_priv(id);
	ece->vendor_id = p->remote_ece.vendor_id;
	ece->options = p->remote_ece.options;
	ece->comp_mask = 0;
	return 0;
}
