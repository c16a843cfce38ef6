// SPDX-License-Identifier: MIT
// The RoCE v2 wire codec (wire.h).  Byte-by-byte big-endian access
// throughout: no casts of the buffer to wider types, so that any alignment
// and any host byte order give the same bytes.
#include "wire.h"

#include "be_bytes.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace loop::rocev2 {

namespace {


// The operations (low 5 bits of the opcode) and their headers, common to
// RC and XRC (XRC requests add the XRCETH: xrc_headers()).
constexpr uint32_t kP = HDR_PAYLOAD;
constexpr uint32_t rc_op_headers(uint8_t low)
{
	switch (low) {
	case 0x00: // SEND FIRST
	case 0x01: // SEND MIDDLE
	case 0x02: // SEND LAST
	case 0x04: // SEND ONLY
	case 0x07: // RDMA WRITE MIDDLE
	case 0x08: // RDMA WRITE LAST
		return kP;
	case 0x03: // SEND LAST WITH IMMEDIATE
	case 0x05: // SEND ONLY WITH IMMEDIATE
	case 0x09: // RDMA WRITE LAST WITH IMMEDIATE
		return HDR_IMMDT | kP;
	case 0x06: // RDMA WRITE FIRST
	case 0x0a: // RDMA WRITE ONLY
		return HDR_RETH | kP;
	case 0x0b: // RDMA WRITE ONLY WITH IMMEDIATE
		return HDR_RETH | HDR_IMMDT | kP;
	case 0x0c: // RDMA READ REQUEST
		return HDR_RETH;
	case 0x0d: // RDMA READ RESPONSE FIRST
	case 0x0f: // RDMA READ RESPONSE LAST
	case 0x10: // RDMA READ RESPONSE ONLY
		return HDR_AETH | kP;
	case 0x0e: // RDMA READ RESPONSE MIDDLE
		return kP;
	case 0x11: // ACKNOWLEDGE
		return HDR_AETH;
	case 0x12: // ATOMIC ACKNOWLEDGE
		return HDR_AETH | HDR_ATMACK;
	case 0x13: // COMPARE SWAP
	case 0x14: // FETCH ADD
		return HDR_ATMETH;
	case 0x16: // SEND LAST WITH INVALIDATE
	case 0x17: // SEND ONLY WITH INVALIDATE
		return HDR_IETH | kP;
	default:
		return 0;
	}
}

// The responses (read responses, ACKs) go back to the XRC initiator's QP,
// which the BTH names alone: only requests carry the XRCETH (Annex A14).
constexpr bool is_response(uint8_t low)
{
	return low >= 0x0d && low <= 0x12;
}

constexpr uint32_t compute_headers(unsigned opcode)
{
	const uint8_t low = opcode & 0x1f;
	uint32_t m = 0;
	switch (opcode >> 5) {
	case 0: // RC
		m = rc_op_headers(low);
		if (opcode == RC_ATOMIC_WRITE)
			m = HDR_RETH | kP; // 8 bytes of payload: parse() checks
		break;
	case 1: // UC: SENDs and RDMA WRITEs only
		if (low <= 0x0b)
			m = rc_op_headers(low);
		break;
	case 3: // UD
		if (opcode == UD_SEND_ONLY)
			m = HDR_DETH | kP;
		else if (opcode == UD_SEND_ONLY_WITH_IMMEDIATE)
			m = HDR_DETH | HDR_IMMDT | kP;
		break;
	case 4: // CNP, its 16 reserved bytes as payload
		if (opcode == CNP)
			m = kP;
		break;
	case 5: // XRC
		m = rc_op_headers(low);
		if (m && !is_response(low))
			m |= HDR_XRCETH;
		break;
	default: // RD (2) and the reserved or vendor classes
		break;
	}
	return m ? (m | HDR_BTH) : 0;
}

constexpr size_t headers_len(uint32_t m)
{
	if (!m)
		return 0;
	size_t n = kBthLen;
	n += (m & HDR_DETH) ? kDethLen : 0;
	n += (m & HDR_XRCETH) ? kXrcEthLen : 0;
	n += (m & HDR_RETH) ? kRethLen : 0;
	n += (m & HDR_ATMETH) ? kAtomicEthLen : 0;
	n += (m & HDR_AETH) ? kAethLen : 0;
	n += (m & HDR_ATMACK) ? kAtomicAckEthLen : 0;
	n += (m & HDR_IMMDT) ? kImmDtLen : 0;
	n += (m & HDR_IETH) ? kIethLen : 0;
	return n;
}

struct op_info {
	uint32_t mask;
	uint8_t len;
};

constexpr std::array<op_info, 256> make_table()
{
	std::array<op_info, 256> t{};
	for (unsigned i = 0; i < 256; i++) {
		const uint32_t m = compute_headers(i);
		t[i] = {m, static_cast<uint8_t>(headers_len(m))};
	}
	return t;
}
constexpr std::array<op_info, 256> kOps = make_table();

static_assert(kOps[RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE].len == 32);
static_assert(kOps[RC_COMPARE_SWAP].len == 40);
static_assert(kOps[RC_ATOMIC_ACKNOWLEDGE].len == 24);
static_assert(kOps[UD_SEND_ONLY_WITH_IMMEDIATE].len == 24);
static_assert(kOps[XRC_RDMA_WRITE_FIRST].len == 32);
static_assert(kOps[XRC_ACKNOWLEDGE].len == 16);
static_assert(kOps[CNP].len == 12);
static_assert(kOps[0x15].mask == 0 && kOps[RD_SEND_ONLY].mask == 0 && kOps[RC_FLUSH].mask == 0);

// The CRC-32 table (reflected 0x04C11DB7), built at compile time.
constexpr std::array<uint32_t, 256> make_crc_table()
{
	std::array<uint32_t, 256> t{};
	for (uint32_t i = 0; i < 256; i++) {
		uint32_t c = i;
		for (int k = 0; k < 8; k++)
			c = (c & 1) ? (c >> 1) ^ 0xedb88320u : c >> 1;
		t[i] = c;
	}
	return t;
}
constexpr std::array<uint32_t, 256> kCrcTable = make_crc_table();

// Slicing by 8: table k gives the register's change for a byte followed
// by k zero bytes, so eight bytes fold in with eight lookups and no
// dependency between them (the packet's payload is most of the ICRC's
// bytes: about four times the speed of the byte loop).
constexpr std::array<std::array<uint32_t, 256>, 8> make_slice_tables()
{
	std::array<std::array<uint32_t, 256>, 8> t{};
	t[0] = make_crc_table();
	for (size_t k = 1; k < 8; k++)
		for (size_t i = 0; i < 256; i++)
			t[k][i] = (t[k - 1][i] >> 8) ^ t[0][t[k - 1][i] & 0xff];
	return t;
}
constexpr std::array<std::array<uint32_t, 256>, 8> kSlice = make_slice_tables();

uint32_t crc_update_tables(uint32_t reg, const uint8_t *p, size_t len);

#if defined(__x86_64__)
// Carry-less multiplication folding (Intel, "Fast CRC Computation for
// Generic Polynomials Using PCLMULQDQ", 2009), for the reflected
// polynomial: four 128-bit lanes are folded 64 bytes at a time, then into
// one, then to 64 and 32 bits, and a Barrett reduction gives the register.
// The constants are x^k mod P(x) for the fold distances (bit-reflected,
// shifted by one, as the paper's reflected variant wants):
//   k1 = x^(4*128+32), k2 = x^(4*128-32)   fold by 512 bits
//   k3 = x^(128+32),   k4 = x^(128-32)     fold by 128 bits
//   k5 = x^64                               64 -> 32 bits
//   P' = P(x) reflected (33 bits), u' = floor(x^64 / P(x)) reflected.
// About 15 times the speed of slicing by 8 here; crc_selftest() checks it
// against the tables before it is used.
#define SV_CLMUL __attribute__((target("pclmul,sse4.1")))

SV_CLMUL inline __m128i clmul_load(const uint8_t *q)
{
	return _mm_loadu_si128(reinterpret_cast<const __m128i *>(q));
}

// x folded forward by the distance k's constants stand for, plus next.
SV_CLMUL inline __m128i clmul_fold(__m128i x, __m128i k, __m128i next)
{
	__m128i lo = _mm_clmulepi64_si128(x, k, 0x00);
	__m128i hi = _mm_clmulepi64_si128(x, k, 0x11);
	return _mm_xor_si128(_mm_xor_si128(lo, hi), next);
}

SV_CLMUL uint32_t crc_update_clmul(uint32_t reg, const uint8_t *p, size_t len)
{
	// len >= 64 and a multiple of 16.
	const __m128i k1k2 = _mm_set_epi64x(0x1c6e41596, 0x154442bd4);
	const __m128i k3k4 = _mm_set_epi64x(0x0ccaa009e, 0x1751997d0);
	const __m128i k5 = _mm_set_epi64x(0, 0x163cd6124);
	const __m128i poly = _mm_set_epi64x(0x1f7011641, 0x1db710641);
	const __m128i mask32 = _mm_set_epi32(0, 0, 0, -1);
	__m128i x1 = _mm_xor_si128(clmul_load(p), _mm_cvtsi32_si128(static_cast<int>(reg)));
	__m128i x2 = clmul_load(p + 16), x3 = clmul_load(p + 32), x4 = clmul_load(p + 48);
	p += 64;
	len -= 64;
	while (len >= 64) {
		x1 = clmul_fold(x1, k1k2, clmul_load(p));
		x2 = clmul_fold(x2, k1k2, clmul_load(p + 16));
		x3 = clmul_fold(x3, k1k2, clmul_load(p + 32));
		x4 = clmul_fold(x4, k1k2, clmul_load(p + 48));
		p += 64;
		len -= 64;
	}
	x1 = clmul_fold(x1, k3k4, x2);
	x1 = clmul_fold(x1, k3k4, x3);
	x1 = clmul_fold(x1, k3k4, x4);
	while (len >= 16) {
		x1 = clmul_fold(x1, k3k4, clmul_load(p));
		p += 16;
		len -= 16;
	}
	// 128 -> 64 bits.
	__m128i t = _mm_clmulepi64_si128(x1, k3k4, 0x10);
	x1 = _mm_xor_si128(_mm_srli_si128(x1, 8), t);
	// 64 -> 32 bits.
	t = _mm_and_si128(x1, mask32);
	x1 = _mm_srli_si128(x1, 4);
	x1 = _mm_xor_si128(x1, _mm_clmulepi64_si128(t, k5, 0x00));
	// Barrett reduction.
	t = _mm_and_si128(x1, mask32);
	t = _mm_clmulepi64_si128(t, poly, 0x10);
	t = _mm_and_si128(t, mask32);
	t = _mm_clmulepi64_si128(t, poly, 0x00);
	x1 = _mm_xor_si128(x1, t);
	return static_cast<uint32_t>(_mm_extract_epi32(x1, 1));
}

// Whether the folding path may be used: the CPU has it, and it agrees
// with the tables on a few lengths and seeds.
bool clmul_ok()
{
	static const bool ok = [] {
		if (!__builtin_cpu_supports("pclmul") || !__builtin_cpu_supports("sse4.1"))
			return false;
		uint8_t buf[1024];
		uint32_t x = 0x12345678;
		for (uint8_t &b : buf) {
			x = x * 1103515245 + 12345;
			b = static_cast<uint8_t>(x >> 16);
		}
		for (size_t len : {64, 80, 128, 144, 256, 1008, 1024})
			for (uint32_t seed : {0xffffffffu, 0u, 0xdebb20e3u})
				if (crc_update_clmul(seed, buf, len) != crc_update_tables(seed, buf, len))
					return false;
		return true;
	}();
	return ok;
}
#endif

// The register, without the final inversion.
uint32_t crc_update(uint32_t reg, const uint8_t *p, size_t len)
{
#if defined(__x86_64__)
	if (len >= 64 && clmul_ok()) {
		size_t n = len & ~size_t{15};
		reg = crc_update_clmul(reg, p, n);
		p += n;
		len -= n;
	}
#endif
	return crc_update_tables(reg, p, len);
}

uint32_t crc_update_tables(uint32_t reg, const uint8_t *p, size_t len)
{
	while (len >= 8) {
		uint32_t lo = (uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 |
			       uint32_t{p[3]} << 24) ^
			      reg;
		reg = kSlice[7][lo & 0xff] ^ kSlice[6][(lo >> 8) & 0xff] ^
		      kSlice[5][(lo >> 16) & 0xff] ^ kSlice[4][lo >> 24] ^ kSlice[3][p[4]] ^
		      kSlice[2][p[5]] ^ kSlice[1][p[6]] ^ kSlice[0][p[7]];
		p += 8;
		len -= 8;
	}
	for (size_t i = 0; i < len; i++)
		reg = kCrcTable[(reg ^ p[i]) & 0xff] ^ (reg >> 8);
	return reg;
}

// Ones-complement sum, for the IPv4 and UDP checksums (RFC 1071).
uint32_t sum16(uint32_t acc, const uint8_t *p, size_t len)
{
	size_t i = 0;
	for (; i + 1 < len; i += 2)
		acc += get16(p + i);
	if (i < len)
		acc += uint32_t{p[i]} << 8;
	return acc;
}
uint16_t fold(uint32_t acc)
{
	while (acc >> 16)
		acc = (acc & 0xffff) + (acc >> 16);
	return static_cast<uint16_t>(~acc);
}

} // namespace

uint32_t opcode_headers(uint8_t opcode)
{
	return kOps[opcode].mask;
}

size_t opcode_header_len(uint8_t opcode)
{
	return kOps[opcode].len;
}

const char *opcode_name(uint8_t opcode)
{
	switch (opcode) {
#define N(x)                                                                                       \
	case x:                                                                                    \
		return #x;
		N(RC_SEND_FIRST)
		N(RC_SEND_MIDDLE)
		N(RC_SEND_LAST)
		N(RC_SEND_LAST_WITH_IMMEDIATE)
		N(RC_SEND_ONLY)
		N(RC_SEND_ONLY_WITH_IMMEDIATE)
		N(RC_RDMA_WRITE_FIRST)
		N(RC_RDMA_WRITE_MIDDLE)
		N(RC_RDMA_WRITE_LAST)
		N(RC_RDMA_WRITE_LAST_WITH_IMMEDIATE)
		N(RC_RDMA_WRITE_ONLY)
		N(RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE)
		N(RC_RDMA_READ_REQUEST)
		N(RC_RDMA_READ_RESPONSE_FIRST)
		N(RC_RDMA_READ_RESPONSE_MIDDLE)
		N(RC_RDMA_READ_RESPONSE_LAST)
		N(RC_RDMA_READ_RESPONSE_ONLY)
		N(RC_ACKNOWLEDGE)
		N(RC_ATOMIC_ACKNOWLEDGE)
		N(RC_COMPARE_SWAP)
		N(RC_FETCH_ADD)
		N(RC_SEND_LAST_WITH_INVALIDATE)
		N(RC_SEND_ONLY_WITH_INVALIDATE)
		N(RC_FLUSH)
		N(RC_ATOMIC_WRITE)
		N(UC_SEND_FIRST)
		N(UC_SEND_MIDDLE)
		N(UC_SEND_LAST)
		N(UC_SEND_LAST_WITH_IMMEDIATE)
		N(UC_SEND_ONLY)
		N(UC_SEND_ONLY_WITH_IMMEDIATE)
		N(UC_RDMA_WRITE_FIRST)
		N(UC_RDMA_WRITE_MIDDLE)
		N(UC_RDMA_WRITE_LAST)
		N(UC_RDMA_WRITE_LAST_WITH_IMMEDIATE)
		N(UC_RDMA_WRITE_ONLY)
		N(UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE)
		N(RD_SEND_FIRST)
		N(RD_SEND_MIDDLE)
		N(RD_SEND_LAST)
		N(RD_SEND_LAST_WITH_IMMEDIATE)
		N(RD_SEND_ONLY)
		N(RD_SEND_ONLY_WITH_IMMEDIATE)
		N(RD_RDMA_WRITE_FIRST)
		N(RD_RDMA_WRITE_MIDDLE)
		N(RD_RDMA_WRITE_LAST)
		N(RD_RDMA_WRITE_LAST_WITH_IMMEDIATE)
		N(RD_RDMA_WRITE_ONLY)
		N(RD_RDMA_WRITE_ONLY_WITH_IMMEDIATE)
		N(RD_RDMA_READ_REQUEST)
		N(RD_RDMA_READ_RESPONSE_FIRST)
		N(RD_RDMA_READ_RESPONSE_MIDDLE)
		N(RD_RDMA_READ_RESPONSE_LAST)
		N(RD_RDMA_READ_RESPONSE_ONLY)
		N(RD_ACKNOWLEDGE)
		N(RD_ATOMIC_ACKNOWLEDGE)
		N(RD_COMPARE_SWAP)
		N(RD_FETCH_ADD)
		N(UD_SEND_ONLY)
		N(UD_SEND_ONLY_WITH_IMMEDIATE)
		N(CNP)
		N(XRC_SEND_FIRST)
		N(XRC_SEND_MIDDLE)
		N(XRC_SEND_LAST)
		N(XRC_SEND_LAST_WITH_IMMEDIATE)
		N(XRC_SEND_ONLY)
		N(XRC_SEND_ONLY_WITH_IMMEDIATE)
		N(XRC_RDMA_WRITE_FIRST)
		N(XRC_RDMA_WRITE_MIDDLE)
		N(XRC_RDMA_WRITE_LAST)
		N(XRC_RDMA_WRITE_LAST_WITH_IMMEDIATE)
		N(XRC_RDMA_WRITE_ONLY)
		N(XRC_RDMA_WRITE_ONLY_WITH_IMMEDIATE)
		N(XRC_RDMA_READ_REQUEST)
		N(XRC_RDMA_READ_RESPONSE_FIRST)
		N(XRC_RDMA_READ_RESPONSE_MIDDLE)
		N(XRC_RDMA_READ_RESPONSE_LAST)
		N(XRC_RDMA_READ_RESPONSE_ONLY)
		N(XRC_ACKNOWLEDGE)
		N(XRC_ATOMIC_ACKNOWLEDGE)
		N(XRC_COMPARE_SWAP)
		N(XRC_FETCH_ADD)
		N(XRC_SEND_LAST_WITH_INVALIDATE)
		N(XRC_SEND_ONLY_WITH_INVALIDATE)
#undef N
	}
	return "UNKNOWN";
}

size_t build_headers(const pkt_hdrs &h, uint8_t *buf, size_t cap)
{
	const uint32_t m = kOps[h.b.opcode].mask;
	const size_t len = kOps[h.b.opcode].len;
	if (!m || cap < len)
		return 0;
	const bth &b = h.b;
	buf[0] = b.opcode;
	buf[1] = static_cast<uint8_t>((b.se ? 0x80 : 0) | (b.mig ? 0x40 : 0) | (b.pad & 3) << 4 |
				      (b.tver & 0xf));
	put16(buf + 2, b.pkey);
	buf[4] = static_cast<uint8_t>((b.fecn ? 0x80 : 0) | (b.becn ? 0x40 : 0));
	put24(buf + 5, b.dqpn);
	buf[8] = b.ackreq ? 0x80 : 0;
	put24(buf + 9, b.psn);
	uint8_t *p = buf + kBthLen;
	if (m & HDR_DETH) {
		put32(p, h.d.qkey);
		p[4] = 0;
		put24(p + 5, h.d.sqpn);
		p += kDethLen;
	}
	if (m & HDR_XRCETH) {
		p[0] = 0;
		put24(p + 1, h.xrc_srqn);
		p += kXrcEthLen;
	}
	if (m & HDR_RETH) {
		put64(p, h.r.va);
		put32(p + 8, h.r.rkey);
		put32(p + 12, h.r.dma_len);
		p += kRethLen;
	}
	if (m & HDR_ATMETH) {
		put64(p, h.at.va);
		put32(p + 8, h.at.rkey);
		put64(p + 12, h.at.swap_add);
		put64(p + 20, h.at.compare);
		p += kAtomicEthLen;
	}
	if (m & HDR_AETH) {
		p[0] = h.a.syndrome;
		put24(p + 1, h.a.msn);
		p += kAethLen;
	}
	if (m & HDR_ATMACK) {
		put64(p, h.atomic_ack_orig);
		p += kAtomicAckEthLen;
	}
	if (m & HDR_IMMDT) {
		std::memcpy(p, &h.imm_be, 4); // Already in wire order
		p += kImmDtLen;
	}
	if (m & HDR_IETH) {
		put32(p, h.ieth_rkey);
		p += kIethLen;
	}
	return static_cast<size_t>(p - buf);
}

parse_err parse(const uint8_t *buf, size_t len, parsed &out)
{
	out = parsed{};
	if (len < kBthLen)
		return parse_err::truncated;
	bth &b = out.h.b;
	b.opcode = buf[0];
	b.se = buf[1] & 0x80;
	b.mig = buf[1] & 0x40;
	b.pad = (buf[1] >> 4) & 3;
	b.tver = buf[1] & 0xf;
	b.pkey = get16(buf + 2);
	b.fecn = buf[4] & 0x80;
	b.becn = buf[4] & 0x40;
	b.dqpn = get24(buf + 5);
	b.ackreq = buf[8] & 0x80;
	b.psn = get24(buf + 9);
	if (b.tver != kTver)
		return parse_err::bad_version;
	const uint32_t m = kOps[b.opcode].mask;
	const size_t hlen = kOps[b.opcode].len;
	if (!m)
		return parse_err::bad_opcode;
	if (len < hlen + kIcrcLen)
		return parse_err::truncated;
	const uint8_t *p = buf + kBthLen;
	pkt_hdrs &h = out.h;
	if (m & HDR_DETH) {
		h.d.qkey = get32(p);
		h.d.sqpn = get24(p + 5);
		p += kDethLen;
	}
	if (m & HDR_XRCETH) {
		h.xrc_srqn = get24(p + 1);
		p += kXrcEthLen;
	}
	if (m & HDR_RETH) {
		h.r.va = get64(p);
		h.r.rkey = get32(p + 8);
		h.r.dma_len = get32(p + 12);
		p += kRethLen;
	}
	if (m & HDR_ATMETH) {
		h.at.va = get64(p);
		h.at.rkey = get32(p + 8);
		h.at.swap_add = get64(p + 12);
		h.at.compare = get64(p + 20);
		p += kAtomicEthLen;
	}
	if (m & HDR_AETH) {
		h.a.syndrome = p[0];
		h.a.msn = get24(p + 1);
		p += kAethLen;
	}
	if (m & HDR_ATMACK) {
		h.atomic_ack_orig = get64(p);
		p += kAtomicAckEthLen;
	}
	if (m & HDR_IMMDT) {
		std::memcpy(&h.imm_be, p, 4);
		p += kImmDtLen;
	}
	if (m & HDR_IETH) {
		h.ieth_rkey = get32(p);
		p += kIethLen;
	}
	out.hdr_len = hlen;
	out.icrc_wire = get_icrc(buf + len - kIcrcLen);
	// Between the headers and the ICRC: payload and pad.
	const size_t room = len - hlen - kIcrcLen;
	if (b.pad > room)
		return parse_err::bad_pad;
	if (room & 3)
		return parse_err::bad_length;
	const size_t plen = room - b.pad;
	if (!(m & HDR_PAYLOAD) && room)
		return parse_err::bad_length;
	if (b.opcode == CNP && plen != kCnpPayloadLen)
		return parse_err::bad_length;
	if (b.opcode == RC_ATOMIC_WRITE && plen != kAtomicWritePayloadLen)
		return parse_err::bad_length;
	out.payload = buf + hlen;
	out.payload_len = plen;
	return parse_err::ok;
}

const char *parse_err_name(parse_err e)
{
	switch (e) {
	case parse_err::ok:
		return "ok";
	case parse_err::truncated:
		return "truncated";
	case parse_err::bad_version:
		return "bad_version";
	case parse_err::bad_opcode:
		return "bad_opcode";
	case parse_err::bad_pad:
		return "bad_pad";
	case parse_err::bad_length:
		return "bad_length";
	}
	return "unknown";
}

size_t build_ip_udp(const ip_info &ip, const uint8_t *udp_payload, size_t udp_len, uint8_t *out,
		    bool udp_csum)
{
	const size_t ulen = kUdpHdrLen + udp_len; // UDP length, header included
	uint8_t *u;
	uint32_t pseudo = 0; // The pseudo header's sum, for the UDP checksum
	if (!ip.v6) {
		std::memset(out, 0, kIpv4HdrLen);
		out[0] = 0x45; // Version 4, IHL 5 (no options)
		out[1] = ip.tclass;
		put16(out + 2, static_cast<uint16_t>(kIpv4HdrLen + ulen));
		put16(out + 4, ip.ipv4_id);
		put16(out + 6, ip.ipv4_df ? 0x4000 : 0); // Flags and fragment offset 0
		out[8] = ip.ttl;
		out[9] = 17; // UDP
		std::memcpy(out + 12, ip.src, 4);
		std::memcpy(out + 16, ip.dst, 4);
		put16(out + 10, fold(sum16(0, out, kIpv4HdrLen)));
		pseudo = sum16(sum16(0, ip.src, 4), ip.dst, 4) + 17 + static_cast<uint32_t>(ulen);
		u = out + kIpv4HdrLen;
	} else {
		put32(out, 6u << 28 | uint32_t{ip.tclass} << 20 | (ip.flow_label & 0xfffff));
		put16(out + 4, static_cast<uint16_t>(ulen));
		out[6] = 17; // Next header: UDP
		out[7] = ip.ttl;
		std::memcpy(out + 8, ip.src, 16);
		std::memcpy(out + 24, ip.dst, 16);
		// Upper-layer length as 32 bits; next header 17 (RFC 8200 8.1).
		pseudo = sum16(sum16(0, ip.src, 16), ip.dst, 16) + 17 +
			 static_cast<uint32_t>(ulen >> 16) + static_cast<uint32_t>(ulen & 0xffff);
		u = out + kIpv6HdrLen;
	}
	put16(u, ip.sport);
	put16(u + 2, ip.dport);
	put16(u + 4, static_cast<uint16_t>(ulen));
	put16(u + 6, 0);
	if (udp_csum) {
		uint32_t acc = sum16(pseudo, u, kUdpHdrLen);
		// Summed in 64 KiB pieces so that the 32-bit accumulator cannot
		// overflow; a piece of even length keeps the byte pairing.
		for (size_t off = 0; off < udp_len;) {
			const size_t n = udp_len - off < 0x10000 ? udp_len - off : 0x10000;
			acc = sum16(acc, udp_payload + off, n);
			acc = (acc & 0xffff) + (acc >> 16);
			off += n;
		}
		uint16_t c = fold(acc);
		// 0 would mean "no checksum" (IPv4) or be invalid (IPv6): all ones.
		put16(u + 6, c ? c : 0xffff);
	}
	return static_cast<size_t>(u + kUdpHdrLen - out);
}

uint32_t crc32(uint32_t crc, const uint8_t *p, size_t len)
{
	return ~crc_update(~crc, p, len);
}

uint32_t icrc(const ip_info &ip, const uint8_t *udp_payload, size_t len_without_icrc)
{
	static constexpr uint8_t lrh_mask[8] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
	uint8_t hdr[kIpv6HdrLen + kUdpHdrLen];
	const size_t hl = build_ip_udp(ip, nullptr, len_without_icrc + kIcrcLen, hdr, false);
	if (!ip.v6) {
		hdr[1] = 0xff;			// TOS
		hdr[8] = 0xff;			// TTL
		hdr[10] = hdr[11] = 0xff;	// Header checksum
	} else {
		hdr[0] |= 0x0f;			// Traffic class, its high nibble
		hdr[1] = hdr[2] = hdr[3] = 0xff; // The rest of it, and the flow label
		hdr[7] = 0xff;			// Hop limit
	}
	hdr[hl - 2] = hdr[hl - 1] = 0xff; // UDP checksum
	uint32_t reg = crc_update(0xffffffffu, lrh_mask, sizeof(lrh_mask));
	reg = crc_update(reg, hdr, hl);
	if (len_without_icrc < kBthLen) // Not a packet; no BTH byte to mask
		return ~crc_update(reg, udp_payload, len_without_icrc);
	uint8_t bth[kBthLen];
	std::memcpy(bth, udp_payload, kBthLen);
	bth[4] = 0xff; // FECN, BECN and the reserved bits
	reg = crc_update(reg, bth, kBthLen);
	reg = crc_update(reg, udp_payload + kBthLen, len_without_icrc - kBthLen);
	return ~reg;
}

void put_icrc(uint8_t *p, uint32_t v)
{
	p[0] = static_cast<uint8_t>(v);
	p[1] = static_cast<uint8_t>(v >> 8);
	p[2] = static_cast<uint8_t>(v >> 16);
	p[3] = static_cast<uint8_t>(v >> 24);
}

uint32_t get_icrc(const uint8_t *p)
{
	return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}

} // namespace loop::rocev2
