// SPDX-License-Identifier: MIT
// The RoCE v2 wire codec (IBTA vol 1 ch. 9 and Annex A17): InfiniBand
// transport headers (BTH and its extension headers) carried in UDP to port
// 4791, and the invariant CRC that ends every packet.  Pure functions over
// byte buffers, nothing of the provider in them, so that they build into a
// unit test alone and so that the transport that sends and receives these
// packets holds none of the byte-level rules itself.
//
// Every multi-byte field is big-endian on the wire; the structs below hold
// host-order values, except imm_be (see pkt_hdrs).
#pragma once

#include <cstddef>
#include <cstdint>

namespace loop::rocev2 {

inline constexpr uint16_t kUdpPort = 4791;	 // IANA's RoCE v2 port (A17.4.1)
inline constexpr uint16_t kDefaultPkey = 0xffff; // The default (full member) P_Key
inline constexpr uint8_t kTver = 0;		 // The only transport header version

// Header sizes, bytes.
inline constexpr size_t kBthLen = 12;
inline constexpr size_t kRethLen = 16;
inline constexpr size_t kAethLen = 4;
inline constexpr size_t kAtomicEthLen = 28;
inline constexpr size_t kAtomicAckEthLen = 8;
inline constexpr size_t kImmDtLen = 4;
inline constexpr size_t kIethLen = 4;
inline constexpr size_t kDethLen = 8;
inline constexpr size_t kXrcEthLen = 4;
inline constexpr size_t kIcrcLen = 4;
// The payload of a CNP: 16 reserved bytes (A17.9.2).
inline constexpr size_t kCnpPayloadLen = 16;
// The payload of an ATOMIC WRITE: the 8 bytes written.
inline constexpr size_t kAtomicWritePayloadLen = 8;

// BTH opcodes: the top 3 bits name the transport service, the low 5 the
// operation (IBTA vol 1 table 38; the kernel's include/rdma/ib_pack.h).
enum op : uint8_t {
	RC_SEND_FIRST = 0x00,
	RC_SEND_MIDDLE = 0x01,
	RC_SEND_LAST = 0x02,
	RC_SEND_LAST_WITH_IMMEDIATE = 0x03,
	RC_SEND_ONLY = 0x04,
	RC_SEND_ONLY_WITH_IMMEDIATE = 0x05,
	RC_RDMA_WRITE_FIRST = 0x06,
	RC_RDMA_WRITE_MIDDLE = 0x07,
	RC_RDMA_WRITE_LAST = 0x08,
	RC_RDMA_WRITE_LAST_WITH_IMMEDIATE = 0x09,
	RC_RDMA_WRITE_ONLY = 0x0a,
	RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE = 0x0b,
	RC_RDMA_READ_REQUEST = 0x0c,
	RC_RDMA_READ_RESPONSE_FIRST = 0x0d,
	RC_RDMA_READ_RESPONSE_MIDDLE = 0x0e,
	RC_RDMA_READ_RESPONSE_LAST = 0x0f,
	RC_RDMA_READ_RESPONSE_ONLY = 0x10,
	RC_ACKNOWLEDGE = 0x11,
	RC_ATOMIC_ACKNOWLEDGE = 0x12,
	RC_COMPARE_SWAP = 0x13,
	RC_FETCH_ADD = 0x14,
	// 0x15 is reserved
	RC_SEND_LAST_WITH_INVALIDATE = 0x16,
	RC_SEND_ONLY_WITH_INVALIDATE = 0x17,
	// 0x1c (FLUSH, with its FETH) is not supported: opcode_headers() is 0.
	RC_FLUSH = 0x1c,
	RC_ATOMIC_WRITE = 0x1d,

	UC_SEND_FIRST = 0x20,
	UC_SEND_MIDDLE = 0x21,
	UC_SEND_LAST = 0x22,
	UC_SEND_LAST_WITH_IMMEDIATE = 0x23,
	UC_SEND_ONLY = 0x24,
	UC_SEND_ONLY_WITH_IMMEDIATE = 0x25,
	UC_RDMA_WRITE_FIRST = 0x26,
	UC_RDMA_WRITE_MIDDLE = 0x27,
	UC_RDMA_WRITE_LAST = 0x28,
	UC_RDMA_WRITE_LAST_WITH_IMMEDIATE = 0x29,
	UC_RDMA_WRITE_ONLY = 0x2a,
	UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE = 0x2b,

	// Reliable Datagram: named, but not supported (no RDETH here):
	// opcode_headers() is 0 and parse() says bad_opcode.
	RD_SEND_FIRST = 0x40,
	RD_SEND_MIDDLE = 0x41,
	RD_SEND_LAST = 0x42,
	RD_SEND_LAST_WITH_IMMEDIATE = 0x43,
	RD_SEND_ONLY = 0x44,
	RD_SEND_ONLY_WITH_IMMEDIATE = 0x45,
	RD_RDMA_WRITE_FIRST = 0x46,
	RD_RDMA_WRITE_MIDDLE = 0x47,
	RD_RDMA_WRITE_LAST = 0x48,
	RD_RDMA_WRITE_LAST_WITH_IMMEDIATE = 0x49,
	RD_RDMA_WRITE_ONLY = 0x4a,
	RD_RDMA_WRITE_ONLY_WITH_IMMEDIATE = 0x4b,
	RD_RDMA_READ_REQUEST = 0x4c,
	RD_RDMA_READ_RESPONSE_FIRST = 0x4d,
	RD_RDMA_READ_RESPONSE_MIDDLE = 0x4e,
	RD_RDMA_READ_RESPONSE_LAST = 0x4f,
	RD_RDMA_READ_RESPONSE_ONLY = 0x50,
	RD_ACKNOWLEDGE = 0x51,
	RD_ATOMIC_ACKNOWLEDGE = 0x52,
	RD_COMPARE_SWAP = 0x53,
	RD_FETCH_ADD = 0x54,

	// UD has only these two (the operation code of SEND ONLY is 0x04).
	UD_SEND_ONLY = 0x64,
	UD_SEND_ONLY_WITH_IMMEDIATE = 0x65,

	// Congestion Notification Packet (RoCE v2, A17.9.2).
	CNP = 0x81,

	// XRC (Annex A14): the RC operations; requests carry an XRCETH.
	XRC_SEND_FIRST = 0xa0,
	XRC_SEND_MIDDLE = 0xa1,
	XRC_SEND_LAST = 0xa2,
	XRC_SEND_LAST_WITH_IMMEDIATE = 0xa3,
	XRC_SEND_ONLY = 0xa4,
	XRC_SEND_ONLY_WITH_IMMEDIATE = 0xa5,
	XRC_RDMA_WRITE_FIRST = 0xa6,
	XRC_RDMA_WRITE_MIDDLE = 0xa7,
	XRC_RDMA_WRITE_LAST = 0xa8,
	XRC_RDMA_WRITE_LAST_WITH_IMMEDIATE = 0xa9,
	XRC_RDMA_WRITE_ONLY = 0xaa,
	XRC_RDMA_WRITE_ONLY_WITH_IMMEDIATE = 0xab,
	XRC_RDMA_READ_REQUEST = 0xac,
	XRC_RDMA_READ_RESPONSE_FIRST = 0xad,
	XRC_RDMA_READ_RESPONSE_MIDDLE = 0xae,
	XRC_RDMA_READ_RESPONSE_LAST = 0xaf,
	XRC_RDMA_READ_RESPONSE_ONLY = 0xb0,
	XRC_ACKNOWLEDGE = 0xb1,
	XRC_ATOMIC_ACKNOWLEDGE = 0xb2,
	XRC_COMPARE_SWAP = 0xb3,
	XRC_FETCH_ADD = 0xb4,
	XRC_SEND_LAST_WITH_INVALIDATE = 0xb6,
	XRC_SEND_ONLY_WITH_INVALIDATE = 0xb7,
};

// The extension headers an opcode carries, in the order they follow the
// BTH on the wire: DETH, XRCETH, RETH, AtomicETH, AETH, AtomicAckETH,
// ImmDt, IETH.
enum hdr : uint32_t {
	HDR_RETH = 1,
	HDR_AETH = 2,
	HDR_ATMETH = 4,
	HDR_ATMACK = 8,
	HDR_IMMDT = 16,
	HDR_IETH = 32,
	HDR_DETH = 64,
	HDR_XRCETH = 128,
	HDR_PAYLOAD = 256, // May carry payload (a zero-length SEND has none)
	HDR_BTH = 512,	   // Every opcode we know has it: the mask is never 0 then
};

uint32_t opcode_headers(uint8_t opcode);    // 0 for an opcode we do not know
size_t opcode_header_len(uint8_t opcode);   // BTH + its extension headers; 0 if unknown
const char *opcode_name(uint8_t opcode);    // "RC_SEND_FIRST"...; "UNKNOWN" if unknown

struct bth {
	uint8_t opcode;
	bool se, mig;
	uint8_t pad;  // 2 bits: bytes after the payload to a multiple of 4
	uint8_t tver; // 4 bits, kTver
	uint16_t pkey;
	bool fecn, becn;
	uint32_t dqpn; // 24 bits
	bool ackreq;
	uint32_t psn; // 24 bits
};
struct reth {
	uint64_t va;
	uint32_t rkey;
	uint32_t dma_len;
};
struct aeth {
	uint8_t syndrome;
	uint32_t msn; // 24 bits
};
struct atomic_eth {
	uint64_t va;
	uint32_t rkey;
	uint64_t swap_add;
	uint64_t compare;
};
struct deth {
	uint32_t qkey;
	uint32_t sqpn; // 24 bits
};

// A packet's headers in host order: what build_headers() writes and parse()
// reads.  Only the headers opcode_headers(b.opcode) names are written or
// read; the others are left alone (build) or zero (parse).  Fields wider
// than the wire's (dqpn, psn, msn, sqpn, xrc_srqn: 24 bits; pad: 2; tver:
// 4) are written with their low bits only.
struct pkt_hdrs {
	bth b;
	reth r;
	aeth a;
	atomic_eth at;
	uint64_t atomic_ack_orig;
	// Immediate data as on the wire: its 4 bytes in memory are the wire's
	// (big-endian) bytes, the way ibv_wc's imm_data and ibv_send_wr's
	// imm_data hold it, so that it passes through without a swap.
	uint32_t imm_be;
	uint32_t ieth_rkey;
	deth d;
	uint32_t xrc_srqn; // 24 bits
};

// The pad a payload of len bytes needs to reach a multiple of 4.
constexpr uint8_t pad_for(size_t len)
{
	return static_cast<uint8_t>((4 - (len & 3)) & 3);
}

// Writes the BTH and the opcode's extension headers; the bytes written, 0
// if cap is too small or the opcode unknown.
size_t build_headers(const pkt_hdrs &h, uint8_t *buf, size_t cap);

enum class parse_err : uint8_t {
	ok,
	truncated,   // Shorter than the BTH, or its opcode's headers and the ICRC
	bad_version, // BTH tver is not 0
	bad_opcode,  // Not an opcode we know (RD included)
	bad_pad,     // The pad is larger than the bytes between headers and ICRC
	// Bytes between the headers and the ICRC where the opcode allows none,
	// or not exactly 8 (ATOMIC WRITE) or 16 (CNP), or payload and pad not
	// a multiple of 4 (every RoCE packet is, as IB's LRH counts 4-byte words).
	bad_length,
};
const char *parse_err_name(parse_err e);

struct parsed {
	pkt_hdrs h;
	const uint8_t *payload; // Inside buf; buf + hdr_len
	size_t payload_len;	// Without pad and ICRC
	uint32_t icrc_wire;	// get_icrc() of the last 4 bytes
	size_t hdr_len;		// BTH and its extension headers
};

// buf/len: the whole UDP payload, ICRC included.  Never reads outside
// [buf, buf + len).  Checks the framing only, not the ICRC (icrc()).  On an
// error, out holds what was read so far (the BTH at least where the error
// is not truncated).
parse_err parse(const uint8_t *buf, size_t len, parsed &out);

// AETH syndrome (IBTA 9.7.5.2.1): bit 7 reserved, bits 6-5 the kind, bits
// 4-0 a credit count (ACK), an RNR timer code (RNR NAK) or a NAK code.
enum class aeth_kind : uint8_t { ack = 0, rnr_nak = 1, reserved = 2, nak = 3 };
enum class nak_code : uint8_t {
	psn_seq_error = 0,
	invalid_request = 1,
	remote_access_error = 2,
	remote_op_error = 3,
	invalid_rd_request = 4,
};
// Credit count 31 means "credits not tracked" (invalid credit count).
inline constexpr uint8_t kAethNoCredits = 31;

constexpr uint8_t aeth_ack(uint8_t credits)
{
	return credits & 0x1f;
}
constexpr uint8_t aeth_rnr(uint8_t timer5bits)
{
	return static_cast<uint8_t>(0x20 | (timer5bits & 0x1f));
}
constexpr uint8_t aeth_nak(nak_code code)
{
	return static_cast<uint8_t>(0x60 | (static_cast<uint8_t>(code) & 0x1f));
}
constexpr aeth_kind aeth_kind_of(uint8_t syndrome)
{
	return static_cast<aeth_kind>((syndrome >> 5) & 3);
}
// The low 5 bits: credits, RNR timer or NAK code, as the kind says.
constexpr uint8_t aeth_value(uint8_t syndrome)
{
	return syndrome & 0x1f;
}

// The IP and UDP headers around a packet, as far as the ICRC and the pcap
// writer need them.  The defaults are what Linux sends from an unconnected
// UDP socket with IP_MTU_DISCOVER = IP_PMTUDISC_DO (IPv4 identification 0,
// DF set; TOS/traffic class 0; TTL/hop limit 64).  The ICRC covers the
// version, lengths, identification, flags, protocol and addresses; the
// traffic class, flow label, TTL and checksums it masks.
struct ip_info {
	bool v6 = false;
	uint8_t src[16] = {}, dst[16] = {}; // IPv4: the first 4 bytes
	uint16_t ipv4_id = 0;
	bool ipv4_df = true;
	uint16_t sport = 0, dport = kUdpPort;
	uint8_t tclass = 0;	  // IPv4 TOS (DSCP and ECN), IPv6 traffic class
	uint8_t ttl = 64;	  // IPv4 TTL, IPv6 hop limit
	uint32_t flow_label = 0;  // IPv6 only, 20 bits
};

inline constexpr size_t kIpv4HdrLen = 20;
inline constexpr size_t kIpv6HdrLen = 40;
inline constexpr size_t kUdpHdrLen = 8;

// Writes the IP header and the UDP header of a datagram whose UDP payload
// (the BTH on, ICRC included) is udp_len bytes, into out (room for
// kIpv6HdrLen + kUdpHdrLen); the bytes written (28 or 48).  The IPv4
// header checksum is always computed; the UDP checksum over udp_payload
// where udp_csum says so, else it is left 0 (the ICRC masks it, and needs
// no pass over the payload for it).
size_t build_ip_udp(const ip_info &ip, const uint8_t *udp_payload, size_t udp_len, uint8_t *out,
		    bool udp_csum = true);

// The ICRC (IBTA Annex A17.3.3; checked against the kernel's rxe_icrc.c):
// CRC-32 of IEEE 802.3 (reflected, polynomial 0x04C11DB7 i.e. 0xEDB88320
// reversed), register seeded with 0xFFFFFFFF, over
//   8 bytes of 0xFF (the LRH of IB, masked: after them the register is
//     0xDEBB20E3, the seed rxe starts from),
//   the IP header with its variant fields set to all ones (IPv4: TOS, TTL,
//     header checksum; IPv6: traffic class, flow label, hop limit),
//   the UDP header with its checksum set to all ones,
//   the BTH with its byte 4 (FECN, BECN, 6 reserved bits) set to all ones,
//   everything after the BTH up to the ICRC (extension headers, payload, pad),
// and the register inverted at the end: the same value as zlib's crc32()
// of those bytes.  That is what icrc() returns.
uint32_t icrc(const ip_info &ip, const uint8_t *udp_payload, size_t len_without_icrc);
// On the wire the ICRC goes least significant byte first (as the Ethernet
// FCS; rxe stores its crc32_le() result in host order on little-endian
// machines).  These write and read the 4 bytes at p in that order.
void put_icrc(uint8_t *p, uint32_t icrc);
uint32_t get_icrc(const uint8_t *p);

// The plain CRC-32 (zlib's crc32()) of len bytes continued from crc (0 to
// start), for tests and for the ICRC's pieces.
uint32_t crc32(uint32_t crc, const uint8_t *p, size_t len);

} // namespace loop::rocev2
