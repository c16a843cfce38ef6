// SPDX-License-Identifier: MIT
// The InfiniBand Communication Manager's messages (IBTA vol 1 ch. 12.6,
// tables 106 to 120) as MADs on the GSI (QP1), and the GSI packet that
// carries one over RoCE v2: what librdmacm sends to a host of another
// network and what the port's owner hands to the process a MAD is for.
// Pure functions over byte buffers, as wire.h: every field here is in host
// order, the MAD's bytes big-endian.
//
// Field positions are byte offsets into the CM data (after the 24-byte
// common MAD header), and bit fields count from the byte's most
// significant bit, as the spec's tables do.
#pragma once

#include <cstddef>
#include <cstdint>

namespace loop::rocev2::cm {

inline constexpr size_t kMadLen = 256;
inline constexpr size_t kMadHdrLen = 24;
inline constexpr size_t kDataLen = kMadLen - kMadHdrLen; // 232
inline constexpr uint8_t kBaseVersion = 1;
inline constexpr uint8_t kClassCm = 0x07;
inline constexpr uint8_t kClassVersion = 2;
inline constexpr uint8_t kMethodSend = 0x03;
inline constexpr uint32_t kGsiQpn = 1;
inline constexpr uint32_t kGsiQkey = 0x80010000; // The GSI's well-known Q_Key

enum attr : uint16_t {
	REQ = 0x0010,
	MRA = 0x0011,
	REJ = 0x0012,
	REP = 0x0013,
	RTU = 0x0014,
	DREQ = 0x0015,
	DREP = 0x0016,
	SIDR_REQ = 0x0017,
	SIDR_REP = 0x0018,
	LAP = 0x0019,
	APR = 0x001a,
};

// Private data room of each message (the spec's sizes).
inline constexpr size_t kReqPdata = 92, kRepPdata = 196, kRejPdata = 148, kRtuPdata = 224;
inline constexpr size_t kDreqPdata = 220, kDrepPdata = 224;
inline constexpr size_t kSidrReqPdata = 216, kSidrRepPdata = 136;

// REJ reasons (table 109) this code uses.
inline constexpr uint16_t kRejNoResources = 3;
inline constexpr uint16_t kRejTimeout = 4;
inline constexpr uint16_t kRejInvalidServiceId = 8;
inline constexpr uint16_t kRejConsumer = 28;
// REJ's "message rejected" (2 bits).
inline constexpr uint8_t kRejectedReq = 0, kRejectedRep = 1, kRejectedOther = 2;

struct mad_hdr {
	uint8_t base_version = kBaseVersion;
	uint8_t mgmt_class = kClassCm;
	uint8_t class_version = kClassVersion;
	uint8_t method = kMethodSend;
	uint16_t status = 0;
	uint16_t class_specific = 0;
	uint64_t tid = 0;
	uint16_t attr_id = 0;
	uint32_t attr_mod = 0;
};

struct req {
	uint32_t local_comm_id = 0;
	uint64_t service_id = 0;
	uint64_t local_ca_guid = 0;
	uint32_t local_qkey = 0;
	uint32_t local_qpn = 0; // 24 bits
	uint8_t responder_resources = 0;
	uint8_t initiator_depth = 0;
	uint8_t remote_cm_response_timeout = 20; // 5 bits
	uint8_t transport_service = 0;		 // 2 bits: 0 RC, 1 UC, 3 extended (XRC)
	bool end_to_end_flow_control = false;
	uint32_t starting_psn = 0;		// 24 bits
	uint8_t local_cm_response_timeout = 20; // 5 bits
	uint8_t retry_count = 7;		// 3 bits
	uint16_t pkey = 0xffff;
	uint8_t path_mtu = 3;	      // 4 bits, as enum ibv_mtu
	uint8_t rnr_retry_count = 7;  // 3 bits
	uint8_t max_cm_retries = 15;  // 4 bits
	bool srq = false;
	uint16_t primary_local_lid = 0xffff, primary_remote_lid = 0xffff;
	uint8_t primary_local_gid[16] = {}, primary_remote_gid[16] = {};
	uint32_t primary_flow_label = 0; // 20 bits
	uint8_t primary_packet_rate = 0; // 6 bits
	uint8_t primary_traffic_class = 0;
	uint8_t primary_hop_limit = 64;
	uint8_t primary_sl = 0; // 4 bits
	bool primary_subnet_local = true;
	uint8_t primary_local_ack_timeout = 14; // 5 bits
	uint8_t private_data[kReqPdata] = {};
};

struct rep {
	uint32_t local_comm_id = 0, remote_comm_id = 0;
	uint32_t local_qkey = 0;
	uint32_t local_qpn = 0; // 24 bits
	uint32_t starting_psn = 0; // 24 bits
	uint8_t responder_resources = 0, initiator_depth = 0;
	uint8_t target_ack_delay = 0; // 5 bits
	uint8_t failover_accepted = 0; // 2 bits
	bool end_to_end_flow_control = false;
	uint8_t rnr_retry_count = 7; // 3 bits
	bool srq = false;
	uint64_t local_ca_guid = 0;
	uint8_t private_data[kRepPdata] = {};
};

struct rej {
	uint32_t local_comm_id = 0, remote_comm_id = 0;
	uint8_t message_rejected = kRejectedReq; // 2 bits
	uint8_t ari_length = 0;			 // 7 bits
	uint16_t reason = 0;
	uint8_t ari[72] = {};
	uint8_t private_data[kRejPdata] = {};
};

// RTU, DREQ and DREP: the two comm IDs and private data (DREQ: also the
// remote QPN, and 4 bytes less of private data).
struct short_msg {
	uint32_t local_comm_id = 0, remote_comm_id = 0;
	uint32_t remote_qpn = 0; // DREQ only, 24 bits
	uint8_t private_data[kRtuPdata] = {};
};

struct sidr_req {
	uint32_t request_id = 0;
	uint16_t pkey = 0xffff;
	uint64_t service_id = 0;
	uint8_t private_data[kSidrReqPdata] = {};
};

struct sidr_rep {
	uint32_t request_id = 0;
	uint8_t status = 0;
	uint32_t qpn = 0; // 24 bits
	uint64_t service_id = 0;
	uint32_t qkey = 0;
	uint8_t private_data[kSidrRepPdata] = {};
};

void put_hdr(uint8_t *mad, const mad_hdr &h);
void get_hdr(const uint8_t *mad, mad_hdr &h);
void put_req(uint8_t *mad, const req &m);
void get_req(const uint8_t *mad, req &m);
void put_rep(uint8_t *mad, const rep &m);
void get_rep(const uint8_t *mad, rep &m);
void put_rej(uint8_t *mad, const rej &m);
void get_rej(const uint8_t *mad, rej &m);
// attr: RTU, DREQ or DREP.
void put_short(uint8_t *mad, uint16_t attr, const short_msg &m);
void get_short(const uint8_t *mad, uint16_t attr, short_msg &m);
void put_sidr_req(uint8_t *mad, const sidr_req &m);
void get_sidr_req(const uint8_t *mad, sidr_req &m);
void put_sidr_rep(uint8_t *mad, const sidr_rep &m);
void get_sidr_rep(const uint8_t *mad, sidr_rep &m);

// Whether mad (len bytes) is a CM MAD this code knows (base version 1,
// class 0x07 version 2, method Send, a CM attribute).
bool is_cm_mad(const uint8_t *mad, size_t len);

// Where a CM MAD goes on the receiving host: a REQ or SIDR REQ to whoever
// listens on its service ID (by_service true, key the service ID), every
// other message to the communication (or SIDR request) it names as the
// receiver's (key that ID).  False for a MAD that names neither.
bool route_of(const uint8_t *mad, size_t len, bool &by_service, uint64_t &key);

// The GSI packet of a MAD over RoCE v2: BTH (UD SEND ONLY to QP1, the
// default P_Key), DETH (the GSI Q_Key, from QP1) and the MAD; psn the
// BTH's.  Writes 276 bytes into buf (room for 280: the ICRC goes after,
// with rocev2::icrc and put_icrc).  The length written.
size_t build_gsi_packet(uint8_t *buf, const uint8_t *mad, uint32_t psn);

// rdma_cm's header at the start of a REQ's or SIDR REQ's private data
// (36 bytes: version 0, IP version in the top 4 bits of the next byte, the
// source port, then source and destination address, IPv4 in the last 4
// bytes of each 16).
inline constexpr size_t kCmaHdrLen = 36;
struct cma_hdr {
	uint8_t ip_version = 4; // 4 or 6
	uint16_t src_port = 0;
	uint8_t src[16] = {}, dst[16] = {}; // IPv4: the first 4 bytes used
};
void put_cma_hdr(uint8_t *pdata, const cma_hdr &h);
// False when the version byte is not 0 or the IP version not 4 or 6.
bool get_cma_hdr(const uint8_t *pdata, cma_hdr &h);

// rdma_cm's service IDs (RDMA_IB_IP_PS_TCP and its kin): the port space
// (RDMA_PS_TCP 0x0106, ...) in bits 16-31, the port below.
constexpr uint64_t service_id(int port_space, uint16_t port)
{
	return (static_cast<uint64_t>(port_space & 0xffff) << 16) | port;
}

// How the port's owner hands a CM MAD to the process it is for: a datagram
// to an abstract unix socket of that process, named after the user, the
// wire's UDP port and the route (route_of): gsi_socket_name.  The datagram
// is a gsi_fwd, then the MAD.  A process takes such a name for each of its
// listeners on the wire (the service ID) and each of its connections (the
// comm ID); the name being free is what makes an ID unique on the host.
struct gsi_fwd {
	char magic[4]; // "SVGM"
	uint8_t v4;
	uint8_t reserved;
	uint16_t from_port;
	uint8_t from[16]; // The sender's IP address (IPv4: the first 4 bytes)
	uint8_t to[16];	  // The address it was sent to: one of this host's
};
// Writes the name (without the abstract namespace's leading NUL) into out;
// its length.
size_t gsi_socket_name(char *out, size_t cap, unsigned uid, uint16_t udp_port, bool by_service,
		       uint64_t key);

} // namespace loop::rocev2::cm
