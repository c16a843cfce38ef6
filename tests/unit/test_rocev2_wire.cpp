// SPDX-License-Identifier: MIT
// Unit tests for the RoCE v2 wire codec and pcap writer (providers/loop/
// transport/rocev2/).  The expectations come from outside the code under
// test: the opcode table is transcribed a second time from IBTA vol 1
// (table 38, and the header lists of 9.2-9.5, A14, A17), the wire layouts
// and the ICRC known answers are bytes written out by hand (their CRCs and
// checksums computed with Python's zlib.crc32 and a ones-complement sum of
// its own), and the fuzz test feeds parse() every kind of damaged packet,
// each in a heap block of its exact size so that ASan sees any over-read.
#include "providers/loop/transport/rocev2/cm_mad.h"
#include "providers/loop/transport/rocev2/pcap.h"
#include "providers/loop/transport/rocev2/wire.h"

#include <gtest/gtest.h>

#include <array>
#include <cerrno>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

using namespace loop::rocev2;

namespace {

// The headers of every opcode, from the spec rather than from wire.cpp.
constexpr uint32_t P = HDR_PAYLOAD, RE = HDR_RETH, AE = HDR_AETH, AT = HDR_ATMETH,
		   AA = HDR_ATMACK, IM = HDR_IMMDT, IE = HDR_IETH, DE = HDR_DETH, XR = HDR_XRCETH;
const std::map<uint8_t, uint32_t> &spec_table()
{
	static const std::map<uint8_t, uint32_t> t = [] {
		std::map<uint8_t, uint32_t> m;
		// RC (and, below, UC's and XRC's subsets of it)
		const std::pair<uint8_t, uint32_t> rc[] = {
			{0x00, P},	{0x01, P},	 {0x02, P},	 {0x03, IM | P},
			{0x04, P},	{0x05, IM | P},	 {0x06, RE | P}, {0x07, P},
			{0x08, P},	{0x09, IM | P},	 {0x0a, RE | P}, {0x0b, RE | IM | P},
			{0x0c, RE},	{0x0d, AE | P},	 {0x0e, P},	 {0x0f, AE | P},
			{0x10, AE | P}, {0x11, AE},	 {0x12, AE | AA}, {0x13, AT},
			{0x14, AT},	{0x16, IE | P},	 {0x17, IE | P},
		};
		for (auto [op, h] : rc) {
			m[op] = h;
			if (op <= 0x0b)
				m[0x20 | op] = h;
			// XRC: requests carry the XRCETH, responses (0x0d-0x12) not.
			m[0xa0 | op] = (op >= 0x0d && op <= 0x12) ? h : h | XR;
		}
		m[0x1d] = RE | P; // ATOMIC WRITE: RETH and 8 bytes of payload
		m[0x64] = DE | P;
		m[0x65] = DE | IM | P;
		m[0x81] = P; // CNP: 16 reserved bytes
		for (auto &[op, h] : m)
			h |= HDR_BTH;
		return m;
	}();
	return t;
}

size_t spec_len(uint32_t m)
{
	return 12 + ((m & DE) ? 8 : 0) + ((m & XR) ? 4 : 0) + ((m & RE) ? 16 : 0) +
	       ((m & AT) ? 28 : 0) + ((m & AE) ? 4 : 0) + ((m & AA) ? 8 : 0) + ((m & IM) ? 4 : 0) +
	       ((m & IE) ? 4 : 0);
}

std::vector<uint8_t> known_opcodes()
{
	std::vector<uint8_t> v;
	for (auto &[op, h] : spec_table())
		v.push_back(op);
	return v;
}

// Every field at random, each within its wire width.
pkt_hdrs random_hdrs(uint8_t opcode, std::mt19937_64 &rng)
{
	auto r = [&] { return rng(); };
	pkt_hdrs h{};
	h.b.opcode = opcode;
	h.b.se = r() & 1;
	h.b.mig = r() & 1;
	h.b.pad = r() & 3;
	h.b.tver = 0;
	h.b.pkey = static_cast<uint16_t>(r());
	h.b.fecn = r() & 1;
	h.b.becn = r() & 1;
	h.b.dqpn = r() & 0xffffff;
	h.b.ackreq = r() & 1;
	h.b.psn = r() & 0xffffff;
	h.r = {r(), static_cast<uint32_t>(r()), static_cast<uint32_t>(r())};
	h.a = {static_cast<uint8_t>(r()), static_cast<uint32_t>(r() & 0xffffff)};
	h.at = {r(), static_cast<uint32_t>(r()), r(), r()};
	h.atomic_ack_orig = r();
	h.imm_be = static_cast<uint32_t>(r());
	h.ieth_rkey = static_cast<uint32_t>(r());
	h.d = {static_cast<uint32_t>(r()), static_cast<uint32_t>(r() & 0xffffff)};
	h.xrc_srqn = r() & 0xffffff;
	return h;
}

// What parse() must give back of h: the headers the opcode carries, the
// others zero.
pkt_hdrs expected_back(pkt_hdrs h)
{
	const uint32_t m = spec_table().at(h.b.opcode);
	if (!(m & RE))
		h.r = {};
	if (!(m & AE))
		h.a = {};
	if (!(m & AT))
		h.at = {};
	if (!(m & AA))
		h.atomic_ack_orig = 0;
	if (!(m & IM))
		h.imm_be = 0;
	if (!(m & IE))
		h.ieth_rkey = 0;
	if (!(m & DE))
		h.d = {};
	if (!(m & XR))
		h.xrc_srqn = 0;
	return h;
}

#define EXPECT_HDRS_EQ(x, y)                                                                       \
	do {                                                                                       \
		EXPECT_EQ((x).b.opcode, (y).b.opcode);                                             \
		EXPECT_EQ((x).b.se, (y).b.se);                                                     \
		EXPECT_EQ((x).b.mig, (y).b.mig);                                                   \
		EXPECT_EQ((x).b.pad, (y).b.pad);                                                   \
		EXPECT_EQ((x).b.tver, (y).b.tver);                                                 \
		EXPECT_EQ((x).b.pkey, (y).b.pkey);                                                 \
		EXPECT_EQ((x).b.fecn, (y).b.fecn);                                                 \
		EXPECT_EQ((x).b.becn, (y).b.becn);                                                 \
		EXPECT_EQ((x).b.dqpn, (y).b.dqpn);                                                 \
		EXPECT_EQ((x).b.ackreq, (y).b.ackreq);                                             \
		EXPECT_EQ((x).b.psn, (y).b.psn);                                                   \
		EXPECT_EQ((x).r.va, (y).r.va);                                                     \
		EXPECT_EQ((x).r.rkey, (y).r.rkey);                                                 \
		EXPECT_EQ((x).r.dma_len, (y).r.dma_len);                                           \
		EXPECT_EQ((x).a.syndrome, (y).a.syndrome);                                         \
		EXPECT_EQ((x).a.msn, (y).a.msn);                                                   \
		EXPECT_EQ((x).at.va, (y).at.va);                                                   \
		EXPECT_EQ((x).at.rkey, (y).at.rkey);                                               \
		EXPECT_EQ((x).at.swap_add, (y).at.swap_add);                                       \
		EXPECT_EQ((x).at.compare, (y).at.compare);                                         \
		EXPECT_EQ((x).atomic_ack_orig, (y).atomic_ack_orig);                               \
		EXPECT_EQ((x).imm_be, (y).imm_be);                                                 \
		EXPECT_EQ((x).ieth_rkey, (y).ieth_rkey);                                           \
		EXPECT_EQ((x).d.qkey, (y).d.qkey);                                                 \
		EXPECT_EQ((x).d.sqpn, (y).d.sqpn);                                                 \
		EXPECT_EQ((x).xrc_srqn, (y).xrc_srqn);                                             \
	} while (0)

size_t legal_payload_len(uint8_t opcode, std::mt19937_64 &rng)
{
	const uint32_t m = spec_table().at(opcode);
	if (!(m & P))
		return 0;
	if (opcode == CNP)
		return 16;
	if (opcode == RC_ATOMIC_WRITE)
		return 8;
	return rng() % 80;
}

// A complete, valid UDP payload (ICRC bytes random: parse() does not check them).
std::vector<uint8_t> valid_packet(uint8_t opcode, std::mt19937_64 &rng, pkt_hdrs *hout = nullptr,
				  size_t *plen_out = nullptr)
{
	pkt_hdrs h = random_hdrs(opcode, rng);
	const size_t plen = legal_payload_len(opcode, rng);
	h.b.pad = pad_for(plen);
	const size_t hl = spec_len(spec_table().at(opcode));
	std::vector<uint8_t> v(hl + plen + h.b.pad + 4);
	EXPECT_EQ(build_headers(h, v.data(), v.size()), hl);
	for (size_t i = hl; i < v.size(); i++)
		v[i] = static_cast<uint8_t>(rng());
	for (size_t i = 0; i < h.b.pad; i++)
		v[hl + plen + i] = 0;
	if (hout)
		*hout = h;
	if (plen_out)
		*plen_out = plen;
	return v;
}

// A heap block of exactly the buffer's size: an over-read is ASan's.
parse_err parse_exact(const std::vector<uint8_t> &v, parsed &out, size_t len)
{
	std::unique_ptr<uint8_t[]> blk(new uint8_t[len]);
	if (len)
		std::memcpy(blk.get(), v.data(), len);
	const parse_err e = parse(blk.get(), len, out);
	// payload points into the block; keep only what stays meaningful.
	if (e == parse_err::ok) {
		EXPECT_EQ(out.payload, blk.get() + out.hdr_len);
		out.payload = v.data() + out.hdr_len;
	} else {
		out.payload = nullptr;
	}
	return e;
}

} // namespace

TEST(Rocev2Opcodes, TableMatchesTheSpecForAll256)
{
	const auto &t = spec_table();
	int known = 0;
	for (unsigned op = 0; op < 256; op++) {
		auto it = t.find(static_cast<uint8_t>(op));
		const uint32_t want = it == t.end() ? 0 : it->second;
		EXPECT_EQ(opcode_headers(static_cast<uint8_t>(op)), want) << "opcode " << op;
		EXPECT_EQ(opcode_header_len(static_cast<uint8_t>(op)), want ? spec_len(want) : 0)
			<< "opcode " << op;
		const std::string name = opcode_name(static_cast<uint8_t>(op));
		if (want) {
			known++;
			EXPECT_NE(name, "UNKNOWN") << op;
		}
	}
	// 23 RC + ATOMIC WRITE, 12 UC, 2 UD, CNP, 23 XRC.
	EXPECT_EQ(known, 24 + 12 + 2 + 1 + 23);
	// Names are the enum's, by value.
	EXPECT_STREQ(opcode_name(0x00), "RC_SEND_FIRST");
	EXPECT_STREQ(opcode_name(0x0b), "RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE");
	EXPECT_STREQ(opcode_name(0x17), "RC_SEND_ONLY_WITH_INVALIDATE");
	EXPECT_STREQ(opcode_name(0x1d), "RC_ATOMIC_WRITE");
	EXPECT_STREQ(opcode_name(0x2b), "UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE");
	EXPECT_STREQ(opcode_name(0x54), "RD_FETCH_ADD");
	EXPECT_STREQ(opcode_name(0x64), "UD_SEND_ONLY");
	EXPECT_STREQ(opcode_name(0x65), "UD_SEND_ONLY_WITH_IMMEDIATE");
	EXPECT_STREQ(opcode_name(0x81), "CNP");
	EXPECT_STREQ(opcode_name(0xb7), "XRC_SEND_ONLY_WITH_INVALIDATE");
	EXPECT_STREQ(opcode_name(0x15), "UNKNOWN");
	EXPECT_STREQ(opcode_name(0xff), "UNKNOWN");
	// Distinct names for distinct opcodes.
	std::set<std::string> names;
	int named = 0;
	for (unsigned op = 0; op < 256; op++) {
		std::string n = opcode_name(static_cast<uint8_t>(op));
		if (n != "UNKNOWN") {
			names.insert(n);
			named++;
		}
	}
	EXPECT_EQ(names.size(), static_cast<size_t>(named));
}

TEST(Rocev2Wire, PadFor)
{
	const uint8_t want[8] = {0, 3, 2, 1, 0, 3, 2, 1};
	for (size_t n = 0; n < 64; n++)
		EXPECT_EQ(pad_for(n), want[n % 8]) << n;
}

// Random values through build and parse, every opcode, many times.
TEST(Rocev2Wire, RoundTripEveryOpcode)
{
	std::mt19937_64 rng(14);
	for (uint8_t op : known_opcodes()) {
		for (int i = 0; i < 300; i++) {
			pkt_hdrs h;
			size_t plen;
			std::vector<uint8_t> v = valid_packet(op, rng, &h, &plen);
			parsed p;
			ASSERT_EQ(parse_exact(v, p, v.size()), parse_err::ok)
				<< opcode_name(op) << " len " << v.size();
			const pkt_hdrs want = expected_back(h);
			EXPECT_HDRS_EQ(p.h, want);
			EXPECT_EQ(p.hdr_len, spec_len(spec_table().at(op)));
			EXPECT_EQ(p.payload_len, plen);
			EXPECT_EQ(p.payload, v.data() + p.hdr_len);
			const uint8_t *ic = v.data() + v.size() - 4;
			EXPECT_EQ(p.icrc_wire, uint32_t{ic[0]} | uint32_t{ic[1]} << 8 |
						       uint32_t{ic[2]} << 16 | uint32_t{ic[3]} << 24);
			if (::testing::Test::HasFailure())
				return;
		}
	}
}

// Each bit of each field on its own: it must come back as itself, and land
// on a wire bit of its own (no two fields or bits share one).
TEST(Rocev2Wire, EveryFieldBitOnItsOwnWireBit)
{
	struct field {
		const char *name;
		unsigned bits;
		uint32_t needs; // The header that carries it
		void (*set)(pkt_hdrs &, uint64_t);
	};
	const field fields[] = {
		{"se", 1, HDR_BTH, [](pkt_hdrs &h, uint64_t v) { h.b.se = v; }},
		{"mig", 1, HDR_BTH, [](pkt_hdrs &h, uint64_t v) { h.b.mig = v; }},
		{"pad", 2, HDR_BTH, [](pkt_hdrs &h, uint64_t v) { h.b.pad = uint8_t(v); }},
		{"tver", 4, HDR_BTH, [](pkt_hdrs &h, uint64_t v) { h.b.tver = uint8_t(v); }},
		{"pkey", 16, HDR_BTH, [](pkt_hdrs &h, uint64_t v) { h.b.pkey = uint16_t(v); }},
		{"fecn", 1, HDR_BTH, [](pkt_hdrs &h, uint64_t v) { h.b.fecn = v; }},
		{"becn", 1, HDR_BTH, [](pkt_hdrs &h, uint64_t v) { h.b.becn = v; }},
		{"dqpn", 24, HDR_BTH, [](pkt_hdrs &h, uint64_t v) { h.b.dqpn = uint32_t(v); }},
		{"ackreq", 1, HDR_BTH, [](pkt_hdrs &h, uint64_t v) { h.b.ackreq = v; }},
		{"psn", 24, HDR_BTH, [](pkt_hdrs &h, uint64_t v) { h.b.psn = uint32_t(v); }},
		{"reth.va", 64, RE, [](pkt_hdrs &h, uint64_t v) { h.r.va = v; }},
		{"reth.rkey", 32, RE, [](pkt_hdrs &h, uint64_t v) { h.r.rkey = uint32_t(v); }},
		{"reth.len", 32, RE, [](pkt_hdrs &h, uint64_t v) { h.r.dma_len = uint32_t(v); }},
		{"aeth.syn", 8, AE, [](pkt_hdrs &h, uint64_t v) { h.a.syndrome = uint8_t(v); }},
		{"aeth.msn", 24, AE, [](pkt_hdrs &h, uint64_t v) { h.a.msn = uint32_t(v); }},
		{"at.va", 64, AT, [](pkt_hdrs &h, uint64_t v) { h.at.va = v; }},
		{"at.rkey", 32, AT, [](pkt_hdrs &h, uint64_t v) { h.at.rkey = uint32_t(v); }},
		{"at.swap", 64, AT, [](pkt_hdrs &h, uint64_t v) { h.at.swap_add = v; }},
		{"at.cmp", 64, AT, [](pkt_hdrs &h, uint64_t v) { h.at.compare = v; }},
		{"atack", 64, AA, [](pkt_hdrs &h, uint64_t v) { h.atomic_ack_orig = v; }},
		{"imm", 32, IM, [](pkt_hdrs &h, uint64_t v) { h.imm_be = uint32_t(v); }},
		{"ieth", 32, IE, [](pkt_hdrs &h, uint64_t v) { h.ieth_rkey = uint32_t(v); }},
		{"deth.qkey", 32, DE, [](pkt_hdrs &h, uint64_t v) { h.d.qkey = uint32_t(v); }},
		{"deth.sqpn", 24, DE, [](pkt_hdrs &h, uint64_t v) { h.d.sqpn = uint32_t(v); }},
		{"xrc", 24, XR, [](pkt_hdrs &h, uint64_t v) { h.xrc_srqn = uint32_t(v); }},
	};
	// Opcodes that among them carry every header.
	const uint8_t ops[] = {XRC_RDMA_WRITE_ONLY_WITH_IMMEDIATE, XRC_COMPARE_SWAP,
			       RC_ATOMIC_ACKNOWLEDGE, UD_SEND_ONLY_WITH_IMMEDIATE,
			       XRC_SEND_ONLY_WITH_INVALIDATE};
	std::map<uint8_t, std::set<std::pair<size_t, int>>> used; // opcode -> wire bits
	std::set<std::string> covered;
	for (uint8_t op : ops) {
		const uint32_t m = spec_table().at(op);
		for (const field &f : fields) {
			if (!(m & f.needs))
				continue;
			covered.insert(f.name);
			for (unsigned bit = 0; bit < f.bits; bit++) {
				pkt_hdrs h{};
				h.b.opcode = op;
				f.set(h, uint64_t{1} << bit);
				uint8_t buf[64];
				std::memset(buf, 0, sizeof(buf));
				const size_t n = build_headers(h, buf, sizeof(buf));
				ASSERT_EQ(n, spec_len(m));
				// Exactly one wire bit set, besides the opcode byte.
				int ones = 0;
				std::pair<size_t, int> where{};
				for (size_t i = 1; i < n; i++)
					for (int b = 0; b < 8; b++)
						if (buf[i] >> b & 1) {
							ones++;
							where = {i, b};
						}
				EXPECT_EQ(ones, 1) << opcode_name(op) << " " << f.name << " bit " << bit;
				EXPECT_TRUE(used[op].insert(where).second)
					<< opcode_name(op) << " " << f.name << " bit " << bit
					<< " shares wire byte " << where.first << " bit " << where.second;
				if (std::string(f.name) == "tver")
					continue; // parse() refuses any version but 0: BadVersion
				if (std::string(f.name) == "pad" && !(m & P)) {
					// No room for a pad where no payload may be.
					parsed p;
					EXPECT_EQ(parse(buf, n + 4, p), parse_err::bad_pad);
					continue;
				}
				// Back as itself: a packet with room for a pad of 3.
				uint8_t pkt[80] = {};
				std::memcpy(pkt, buf, n);
				size_t len = n + 4 + ((m & P) ? 4 : 0);
				if (op == RC_ATOMIC_WRITE)
					len = n + 8 + 4;
				parsed p;
				ASSERT_EQ(parse(pkt, len, p), parse_err::ok) << f.name << " bit " << bit;
				pkt_hdrs want = h;
				EXPECT_HDRS_EQ(p.h, want);
			}
		}
	}
	EXPECT_EQ(covered.size(), std::size(fields));
}

// Bits above a field's wire width are not written.
TEST(Rocev2Wire, WideValuesKeepTheirLowBits)
{
	pkt_hdrs h{};
	h.b.opcode = XRC_SEND_ONLY;
	h.b.dqpn = 0xff123456;
	h.b.psn = 0xfe654321;
	h.b.pad = 0xfc | 1;
	h.xrc_srqn = 0xab000042;
	uint8_t buf[16 + 4 + 4] = {};
	ASSERT_EQ(build_headers(h, buf, sizeof(buf)), 16u);
	const uint8_t want[16] = {0xa4, 0x10, 0, 0, 0, 0x12, 0x34, 0x56,
				  0,	0x65, 0x43, 0x21, 0, 0, 0, 0x42};
	EXPECT_EQ(0, std::memcmp(buf, want, 16));
	parsed p;
	ASSERT_EQ(parse(buf, sizeof(buf), p), parse_err::ok);
	EXPECT_EQ(p.h.b.dqpn, 0x123456u);
	EXPECT_EQ(p.h.b.psn, 0x654321u);
	EXPECT_EQ(p.h.b.pad, 1);
	EXPECT_EQ(p.h.xrc_srqn, 0x42u);
	EXPECT_EQ(p.payload_len, 3u);
}

// Layouts written out by hand from the spec, one per extension header.
TEST(Rocev2Wire, KnownLayouts)
{
	{ // UD SEND ONLY WITH IMMEDIATE: BTH, DETH, ImmDt
		pkt_hdrs h{};
		h.b = {UD_SEND_ONLY_WITH_IMMEDIATE, true, false, 2, 0, 0x8001, false, true,
		       0x000001, false, 0x000203};
		h.d = {0x80010000, 0x00abcd};
		const uint8_t imm[4] = {1, 2, 3, 4};
		std::memcpy(&h.imm_be, imm, 4);
		const uint8_t want[] = {0x65, 0xa0, 0x80, 0x01, 0x40, 0x00, 0x00, 0x01,
					0x00, 0x00, 0x02, 0x03, 0x80, 0x01, 0x00, 0x00,
					0x00, 0x00, 0xab, 0xcd, 0x01, 0x02, 0x03, 0x04};
		uint8_t buf[sizeof(want)];
		ASSERT_EQ(build_headers(h, buf, sizeof(buf)), sizeof(want));
		EXPECT_EQ(0, std::memcmp(buf, want, sizeof(want)));
		EXPECT_EQ(build_headers(h, buf, sizeof(buf) - 1), 0u); // cap too small
	}
	{ // XRC COMPARE SWAP: BTH, XRCETH, AtomicETH
		pkt_hdrs h{};
		h.b.opcode = XRC_COMPARE_SWAP;
		h.b.pkey = 0xffff;
		h.b.ackreq = true;
		h.xrc_srqn = 0x0a0b0c;
		h.at = {0x1112131415161718, 0x21222324, 0x3132333435363738, 0x4142434445464748};
		const uint8_t want[] = {
			0xb3, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x00, 0x80, 0x00, 0x00, 0x00,
			0x00, 0x0a, 0x0b, 0x0c, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18,
			0x21, 0x22, 0x23, 0x24, 0x31, 0x32, 0x33, 0x34, 0x35, 0x36, 0x37, 0x38,
			0x41, 0x42, 0x43, 0x44, 0x45, 0x46, 0x47, 0x48};
		uint8_t buf[sizeof(want)];
		ASSERT_EQ(build_headers(h, buf, sizeof(buf)), sizeof(want));
		EXPECT_EQ(0, std::memcmp(buf, want, sizeof(want)));
	}
	{ // RC ATOMIC ACKNOWLEDGE: BTH, AETH, AtomicAckETH
		pkt_hdrs h{};
		h.b.opcode = RC_ATOMIC_ACKNOWLEDGE;
		h.b.psn = 0xffffff;
		h.a = {aeth_nak(nak_code::remote_access_error), 0x010203};
		h.atomic_ack_orig = 0x0102030405060708;
		const uint8_t want[] = {0x12, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
					0x00, 0xff, 0xff, 0xff, 0x62, 0x01, 0x02, 0x03,
					0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08};
		uint8_t buf[sizeof(want)];
		ASSERT_EQ(build_headers(h, buf, sizeof(buf)), sizeof(want));
		EXPECT_EQ(0, std::memcmp(buf, want, sizeof(want)));
	}
	{ // RC SEND ONLY WITH INVALIDATE: BTH, IETH
		pkt_hdrs h{};
		h.b.opcode = RC_SEND_ONLY_WITH_INVALIDATE;
		h.b.mig = true;
		h.b.becn = true;
		h.ieth_rkey = 0xcafe0001;
		const uint8_t want[] = {0x17, 0x40, 0x00, 0x00, 0x40, 0x00, 0x00, 0x00,
					0x00, 0x00, 0x00, 0x00, 0xca, 0xfe, 0x00, 0x01};
		uint8_t buf[sizeof(want)];
		ASSERT_EQ(build_headers(h, buf, sizeof(buf)), sizeof(want));
		EXPECT_EQ(0, std::memcmp(buf, want, sizeof(want)));
	}
	{ // Unknown opcodes build nothing.
		pkt_hdrs h{};
		uint8_t buf[64];
		for (uint8_t op : {uint8_t{0x15}, uint8_t{RD_SEND_ONLY}, uint8_t{RC_FLUSH},
				   uint8_t{0x80}, uint8_t{0xe0}, uint8_t{0xff}}) {
			h.b.opcode = op;
			EXPECT_EQ(build_headers(h, buf, sizeof(buf)), 0u) << int(op);
		}
	}
}

TEST(Rocev2Parse, TruncationAtEveryLength)
{
	std::mt19937_64 rng(4791);
	for (uint8_t op : known_opcodes()) {
		for (int rep = 0; rep < 4; rep++) {
			std::vector<uint8_t> v = valid_packet(op, rng);
			const size_t hl = spec_len(spec_table().at(op));
			for (size_t len = 0; len < v.size(); len++) {
				parsed p;
				const parse_err e = parse_exact(v, p, len);
				if (len < hl + 4) {
					EXPECT_EQ(e, parse_err::truncated)
						<< opcode_name(op) << " len " << len;
				} else {
					// Shorter payload: legal again only on a
					// multiple of 4 with the pad still inside.
					EXPECT_NE(e, parse_err::truncated);
					if (e == parse_err::ok) {
						EXPECT_EQ(p.payload_len + p.hdr_len + p.h.b.pad + 4, len);
					}
				}
			}
		}
	}
	parsed p;
	EXPECT_EQ(parse(nullptr, 0, p), parse_err::truncated);
}

TEST(Rocev2Parse, BadVersion)
{
	std::mt19937_64 rng(1);
	for (uint8_t op : known_opcodes()) {
		std::vector<uint8_t> v = valid_packet(op, rng);
		for (uint8_t tv = 1; tv < 16; tv++) {
			v[1] = static_cast<uint8_t>((v[1] & 0xf0) | tv);
			parsed p;
			EXPECT_EQ(parse_exact(v, p, v.size()), parse_err::bad_version)
				<< opcode_name(op) << " tver " << int(tv);
			EXPECT_EQ(p.h.b.tver, tv);
		}
	}
}

TEST(Rocev2Parse, UnknownOpcode)
{
	int unknown = 0;
	for (unsigned op = 0; op < 256; op++) {
		if (spec_table().count(static_cast<uint8_t>(op)))
			continue;
		unknown++;
		// Long enough for any header; every pad count.
		for (uint8_t pad = 0; pad < 4; pad++) {
			std::vector<uint8_t> v(128, 0);
			v[0] = static_cast<uint8_t>(op);
			v[1] = static_cast<uint8_t>(pad << 4);
			parsed p;
			EXPECT_EQ(parse_exact(v, p, v.size()), parse_err::bad_opcode) << op;
		}
	}
	EXPECT_EQ(unknown, 256 - 62);
}

TEST(Rocev2Parse, BadPadAndBadLength)
{
	std::mt19937_64 rng(2);
	for (uint8_t op : known_opcodes()) {
		const uint32_t m = spec_table().at(op);
		const size_t hl = spec_len(m);
		pkt_hdrs h = random_hdrs(op, rng);
		std::vector<uint8_t> v(hl + 4 + 8, 0);
		for (uint8_t pad = 0; pad < 4; pad++) {
			h.b.pad = pad;
			ASSERT_EQ(build_headers(h, v.data(), v.size()), hl);
			parsed p;
			// No room at all: any pad is larger than the payload.
			EXPECT_EQ(parse_exact(v, p, hl + 4), pad ? parse_err::bad_pad : (op == CNP || op == RC_ATOMIC_WRITE) ? parse_err::bad_length : parse_err::ok)
				<< opcode_name(op) << " pad " << int(pad);
			// 4 bytes of room.
			const parse_err e4 = parse_exact(v, p, hl + 8);
			if (!(m & P))
				EXPECT_EQ(e4, parse_err::bad_length) << opcode_name(op);
			else if (op == CNP || op == RC_ATOMIC_WRITE)
				EXPECT_EQ(e4, parse_err::bad_length) << opcode_name(op);
			else {
				ASSERT_EQ(e4, parse_err::ok) << opcode_name(op);
				EXPECT_EQ(p.payload_len, 4u - pad);
			}
			// Room not a multiple of 4 (pad fits).
			for (size_t extra = 5; extra < 8; extra++)
				EXPECT_EQ(parse_exact(v, p, hl + 4 + extra), parse_err::bad_length)
					<< opcode_name(op) << " extra " << extra;
		}
	}
	// The two fixed payloads: 16 bytes for a CNP, 8 for an ATOMIC WRITE.
	std::vector<uint8_t> v(64, 0);
	pkt_hdrs h{};
	parsed p;
	h.b.opcode = CNP;
	ASSERT_EQ(build_headers(h, v.data(), v.size()), 12u);
	EXPECT_EQ(parse_exact(v, p, 12 + 16 + 4), parse_err::ok);
	EXPECT_EQ(p.payload_len, 16u);
	EXPECT_EQ(parse_exact(v, p, 12 + 20 + 4), parse_err::bad_length);
	EXPECT_EQ(parse_exact(v, p, 12 + 12 + 4), parse_err::bad_length);
	h.b.opcode = RC_ATOMIC_WRITE;
	ASSERT_EQ(build_headers(h, v.data(), v.size()), 28u);
	EXPECT_EQ(parse_exact(v, p, 28 + 8 + 4), parse_err::ok);
	EXPECT_EQ(p.payload_len, 8u);
	EXPECT_EQ(parse_exact(v, p, 28 + 4 + 4), parse_err::bad_length);
	EXPECT_EQ(parse_exact(v, p, 28 + 12 + 4), parse_err::bad_length);
	// A pad that eats the whole payload is legal (and means 0 bytes only
	// where the room is the pad itself: here 4 bytes, pad 3 -> 1 byte).
	h.b.opcode = RC_SEND_ONLY;
	h.b.pad = 3;
	ASSERT_EQ(build_headers(h, v.data(), v.size()), 12u);
	EXPECT_EQ(parse_exact(v, p, 12 + 4 + 4), parse_err::ok);
	EXPECT_EQ(p.payload_len, 1u);
	EXPECT_STREQ(parse_err_name(parse_err::ok), "ok");
	EXPECT_STREQ(parse_err_name(parse_err::truncated), "truncated");
	EXPECT_STREQ(parse_err_name(parse_err::bad_version), "bad_version");
	EXPECT_STREQ(parse_err_name(parse_err::bad_opcode), "bad_opcode");
	EXPECT_STREQ(parse_err_name(parse_err::bad_pad), "bad_pad");
	EXPECT_STREQ(parse_err_name(parse_err::bad_length), "bad_length");
}

TEST(Rocev2Aeth, Helpers)
{
	// Values from IBTA 9.7.5.2.1 (table 42/43), by hand.
	EXPECT_EQ(aeth_ack(0), 0x00);
	EXPECT_EQ(aeth_ack(kAethNoCredits), 0x1f);
	EXPECT_EQ(aeth_rnr(0), 0x20);
	EXPECT_EQ(aeth_rnr(0x12), 0x32);
	EXPECT_EQ(aeth_nak(nak_code::psn_seq_error), 0x60);
	EXPECT_EQ(aeth_nak(nak_code::invalid_request), 0x61);
	EXPECT_EQ(aeth_nak(nak_code::remote_access_error), 0x62);
	EXPECT_EQ(aeth_nak(nak_code::remote_op_error), 0x63);
	EXPECT_EQ(aeth_nak(nak_code::invalid_rd_request), 0x64);
	for (unsigned v = 0; v < 32; v++) {
		const uint8_t a = aeth_ack(static_cast<uint8_t>(v));
		const uint8_t r = aeth_rnr(static_cast<uint8_t>(v));
		EXPECT_EQ(aeth_kind_of(a), aeth_kind::ack);
		EXPECT_EQ(aeth_kind_of(r), aeth_kind::rnr_nak);
		EXPECT_EQ(aeth_value(a), v);
		EXPECT_EQ(aeth_value(r), v);
		EXPECT_EQ(a & 0x80, 0);
		EXPECT_EQ(r & 0x80, 0);
		// Above 5 bits the value does not leak into the kind.
		EXPECT_EQ(aeth_kind_of(aeth_ack(static_cast<uint8_t>(v | 0xe0))), aeth_kind::ack);
		EXPECT_EQ(aeth_kind_of(aeth_rnr(static_cast<uint8_t>(v | 0xe0))), aeth_kind::rnr_nak);
	}
	for (uint8_t c = 0; c <= 4; c++) {
		const uint8_t n = aeth_nak(static_cast<nak_code>(c));
		EXPECT_EQ(aeth_kind_of(n), aeth_kind::nak);
		EXPECT_EQ(aeth_value(n), c);
	}
	EXPECT_EQ(aeth_kind_of(0x40), aeth_kind::reserved);
	EXPECT_EQ(aeth_kind_of(0xe0), aeth_kind::nak); // Bit 7 reserved, ignored
}

// ----- ICRC -----

namespace {

// RC RDMA WRITE ONLY WITH IMMEDIATE, SE, pad 3, P_Key 0xffff, FECN set,
// dest QP 0x123456, AckReq, PSN 0xabcdef; RETH va 0x0102030405060708 rkey
// 0x11223344 length 5; ImmDt de ad be ef; payload "hello" and 3 zero pad
// bytes.  UDP 0xc123 -> 4791.  IPv4 10.0.0.1 -> 10.0.0.2, id 0, DF, TTL 64;
// IPv6 fe80::1 -> fe80::2, hop limit 64.  The whole packets, byte by byte;
// the IPv4 header checksum, the UDP checksum and the ICRC computed by a
// Python script apart from this code: the ICRC as
//   zlib.crc32(b'\xff' * 8 + ip_masked + udp_masked + bth_masked + rest)
// (ip_masked: IPv4 TOS, TTL, checksum, or IPv6 traffic class, flow label,
// hop limit set to 0xff bytes/bits; udp_masked: checksum 0xffff;
// bth_masked: byte 4 0xff), written least significant byte first; the UDP
// checksum as RFC 768's ones-complement sum over the pseudo header, the
// UDP header and payload, ICRC included.
// IPv4: ICRC 0x3881b934, UDP checksum 0x1d14, IP header checksum 0x26a3.
const uint8_t kPkt4[] = {
	0x45, 0x00, 0x00, 0x48, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x26, 0xa3, 0x0a, 0x00, 0x00,
	0x01, 0x0a, 0x00, 0x00, 0x02, 0xc1, 0x23, 0x12, 0xb7, 0x00, 0x34, 0x1d, 0x14, 0x0b, 0xb0,
	0xff, 0xff, 0x80, 0x12, 0x34, 0x56, 0x80, 0xab, 0xcd, 0xef, 0x01, 0x02, 0x03, 0x04, 0x05,
	0x06, 0x07, 0x08, 0x11, 0x22, 0x33, 0x44, 0x00, 0x00, 0x00, 0x05, 0xde, 0xad, 0xbe, 0xef,
	0x68, 0x65, 0x6c, 0x6c, 0x6f, 0x00, 0x00, 0x00, 0x34, 0xb9, 0x81, 0x38};
constexpr uint32_t kIcrc4 = 0x3881b934;
// IPv6: ICRC 0x64c8febb, UDP checksum 0x65a0.
const uint8_t kPkt6[] = {
	0x60, 0x00, 0x00, 0x00, 0x00, 0x34, 0x11, 0x40, 0xfe, 0x80, 0x00, 0x00, 0x00, 0x00, 0x00,
	0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0xfe, 0x80, 0x00, 0x00, 0x00, 0x00,
	0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0xc1, 0x23, 0x12, 0xb7, 0x00,
	0x34, 0x65, 0xa0, 0x0b, 0xb0, 0xff, 0xff, 0x80, 0x12, 0x34, 0x56, 0x80, 0xab, 0xcd, 0xef,
	0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x11, 0x22, 0x33, 0x44, 0x00, 0x00, 0x00,
	0x05, 0xde, 0xad, 0xbe, 0xef, 0x68, 0x65, 0x6c, 0x6c, 0x6f, 0x00, 0x00, 0x00, 0xbb, 0xfe,
	0xc8, 0x64};
constexpr uint32_t kIcrc6 = 0x64c8febb;

ip_info kat_ip(bool v6)
{
	ip_info ip{};
	ip.v6 = v6;
	if (v6) {
		ip.src[0] = ip.dst[0] = 0xfe;
		ip.src[1] = ip.dst[1] = 0x80;
		ip.src[15] = 1;
		ip.dst[15] = 2;
	} else {
		const uint8_t s[4] = {10, 0, 0, 1}, d[4] = {10, 0, 0, 2};
		std::memcpy(ip.src, s, 4);
		std::memcpy(ip.dst, d, 4);
	}
	ip.sport = 0xc123;
	ip.dport = kUdpPort;
	return ip;
}

pkt_hdrs kat_hdrs()
{
	pkt_hdrs h{};
	h.b = {RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE, true, false, 3, 0, 0xffff, true, false,
	       0x123456, true, 0xabcdef};
	h.r = {0x0102030405060708, 0x11223344, 5};
	const uint8_t imm[4] = {0xde, 0xad, 0xbe, 0xef};
	std::memcpy(&h.imm_be, imm, 4);
	return h;
}

} // namespace

TEST(Rocev2Icrc, Crc32CheckValues)
{
	// The CRC-32 check value (the catalogue's "123456789").
	const char *s = "123456789";
	EXPECT_EQ(crc32(0, reinterpret_cast<const uint8_t *>(s), 9), 0xcbf43926u);
	// rxe's seed: the register after 8 bytes of 0xff is 0xdebb20e3, i.e.
	// the CRC (inverted register) 0x2144df1c.
	const uint8_t ff[8] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
	EXPECT_EQ(crc32(0, ff, 8), ~0xdebb20e3u);
	// Continuation: two halves give the whole.
	EXPECT_EQ(crc32(crc32(0, reinterpret_cast<const uint8_t *>(s), 4),
			reinterpret_cast<const uint8_t *>(s) + 4, 5),
		  0xcbf43926u);
}

// The CRC one bit at a time, straight from the polynomial: what the
// folding (PCLMULQDQ) and table paths of crc32() must both give, at every
// length (the folding path takes 64 bytes and more in 16-byte steps, the
// tables the rest) and alignment.
static uint32_t crc32_bitwise(uint32_t crc, const uint8_t *p, size_t len)
{
	crc = ~crc;
	for (size_t i = 0; i < len; i++) {
		crc ^= p[i];
		for (int k = 0; k < 8; k++)
			crc = (crc >> 1) ^ (0xedb88320u & (0u - (crc & 1)));
	}
	return ~crc;
}

TEST(Rocev2Icrc, Crc32EveryLengthAndAlignment)
{
	std::vector<uint8_t> buf(4300 + 16);
	uint32_t x = 2463534242u;
	for (uint8_t &b : buf) {
		x ^= x << 13;
		x ^= x >> 17;
		x ^= x << 5;
		b = static_cast<uint8_t>(x);
	}
	for (size_t len = 0; len <= 4300; len++)
		for (size_t off : {0, 1, 5, 15}) {
			uint32_t want = crc32_bitwise(0x5a5a5a5au, buf.data() + off, len);
			ASSERT_EQ(crc32(0x5a5a5a5au, buf.data() + off, len), want)
				<< "length " << len << " offset " << off;
		}
}

TEST(Rocev2Icrc, KnownAnswers)
{
	for (bool v6 : {false, true}) {
		const uint8_t *pkt = v6 ? kPkt6 : kPkt4;
		const size_t n = v6 ? sizeof(kPkt6) : sizeof(kPkt4);
		const size_t iph = v6 ? 40 : 20;
		const uint8_t *udp_payload = pkt + iph + 8;
		const size_t ulen = n - iph - 8;
		SCOPED_TRACE(v6 ? "IPv6" : "IPv4");
		// The transport headers as build_headers() writes them.
		uint8_t hdr[32];
		ASSERT_EQ(build_headers(kat_hdrs(), hdr, sizeof(hdr)), 32u);
		EXPECT_EQ(0, std::memcmp(hdr, udp_payload, 32));
		// The ICRC, and its bytes on the wire.
		const uint32_t want = v6 ? kIcrc6 : kIcrc4;
		EXPECT_EQ(icrc(kat_ip(v6), udp_payload, ulen - 4), want);
		uint8_t w[4];
		put_icrc(w, want);
		EXPECT_EQ(0, std::memcmp(w, udp_payload + ulen - 4, 4));
		EXPECT_EQ(get_icrc(udp_payload + ulen - 4), want);
		// parse() reads the same.
		parsed p;
		ASSERT_EQ(parse(udp_payload, ulen, p), parse_err::ok);
		EXPECT_EQ(p.icrc_wire, want);
		EXPECT_EQ(p.payload_len, 5u);
		EXPECT_EQ(0, std::memcmp(p.payload, "hello", 5));
		// The IP and UDP headers, checksums included.
		uint8_t ipudp[48];
		EXPECT_EQ(build_ip_udp(kat_ip(v6), udp_payload, ulen, ipudp), iph + 8);
		EXPECT_EQ(0, std::memcmp(ipudp, pkt, iph + 8));
	}
}

// The ICRC ignores what routers may change, and nothing else.
TEST(Rocev2Icrc, VariantFieldsMaskedInvariantOnesCovered)
{
	for (bool v6 : {false, true}) {
		SCOPED_TRACE(v6 ? "IPv6" : "IPv4");
		const uint8_t *pkt = v6 ? kPkt6 : kPkt4;
		const size_t iph = v6 ? 40 : 20;
		std::vector<uint8_t> up(pkt + iph + 8, pkt + (v6 ? sizeof(kPkt6) : sizeof(kPkt4)));
		const size_t n = up.size() - 4;
		const uint32_t base = icrc(kat_ip(v6), up.data(), n);
		ASSERT_EQ(base, v6 ? kIcrc6 : kIcrc4);
		ip_info ip = kat_ip(v6);
		ip.tclass = 0xb8;
		ip.ttl = 3;
		ip.flow_label = 0xabcde;
		EXPECT_EQ(icrc(ip, up.data(), n), base);
		std::vector<uint8_t> m = up;
		m[4] ^= 0x40 | 0x3f; // BECN and the reserved bits (FECN was set)
		EXPECT_EQ(icrc(kat_ip(v6), m.data(), n), base);
		// Each other byte of the UDP payload counts.
		for (size_t i = 0; i < n; i++) {
			if (i == 4)
				continue;
			m = up;
			m[i] ^= 0x01;
			EXPECT_NE(icrc(kat_ip(v6), m.data(), n), base) << "byte " << i;
		}
		ip = kat_ip(v6);
		ip.sport ^= 1;
		EXPECT_NE(icrc(ip, up.data(), n), base);
		ip = kat_ip(v6);
		ip.dport ^= 1;
		EXPECT_NE(icrc(ip, up.data(), n), base);
		ip = kat_ip(v6);
		ip.src[v6 ? 15 : 3] ^= 4;
		EXPECT_NE(icrc(ip, up.data(), n), base);
		ip = kat_ip(v6);
		ip.dst[0] ^= 1;
		EXPECT_NE(icrc(ip, up.data(), n), base);
		if (!v6) {
			ip = kat_ip(v6);
			ip.ipv4_id = 1;
			EXPECT_NE(icrc(ip, up.data(), n), base);
			ip = kat_ip(v6);
			ip.ipv4_df = false;
			EXPECT_NE(icrc(ip, up.data(), n), base);
		} else {
			// An IPv4 address field's bytes beyond 4 do not matter for IPv4
			// but all 16 do for IPv6.
			ip = kat_ip(v6);
			ip.src[8] ^= 1;
			EXPECT_NE(icrc(ip, up.data(), n), base);
		}
		// The length counts (IP and UDP lengths): one byte less.
		EXPECT_NE(icrc(kat_ip(v6), up.data(), n - 1), base);
	}
	ip_info ip = kat_ip(false);
	std::vector<uint8_t> up(kPkt4 + 28, kPkt4 + sizeof(kPkt4));
	const uint32_t base = icrc(ip, up.data(), up.size() - 4);
	ip.src[8] = 0x77; // Beyond an IPv4 address: ignored
	EXPECT_EQ(icrc(ip, up.data(), up.size() - 4), base);
}

// The checksums build_ip_udp() writes verify by a sum of this test's own
// (RFC 1071: the ones-complement sum over the covered bytes is all ones).
namespace {

uint32_t ocsum(uint32_t acc, const uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		acc += (i & 1) ? p[i] : uint32_t{p[i]} << 8;
	return acc;
}
uint16_t ofold(uint32_t acc)
{
	while (acc >> 16)
		acc = (acc & 0xffff) + (acc >> 16);
	return static_cast<uint16_t>(acc);
}
// The UDP checksum's sum over pseudo header, UDP header and payload.
uint16_t udp_sum(const ip_info &ip, const uint8_t *hdrs, const std::vector<uint8_t> &pl)
{
	const size_t iph = ip.v6 ? 40 : 20;
	const uint32_t ulen = static_cast<uint32_t>(8 + pl.size());
	uint32_t acc = ocsum(0, ip.src, ip.v6 ? 16 : 4);
	acc = ocsum(acc, ip.dst, ip.v6 ? 16 : 4);
	acc += 17 + (ulen >> 16) + (ulen & 0xffff);
	acc = ocsum(acc, hdrs + iph, 8);
	// The payload after an 8-byte header: its bytes keep their parity.
	acc = ocsum(acc, pl.data(), pl.size());
	return ofold(acc);
}

} // namespace

TEST(Rocev2Ip, ChecksumsVerify)
{
	std::mt19937_64 rng(99);
	for (int i = 0; i < 2000; i++) {
		ip_info ip = kat_ip(i & 1);
		for (auto &b : ip.src)
			b = static_cast<uint8_t>(rng());
		for (auto &b : ip.dst)
			b = static_cast<uint8_t>(rng());
		ip.sport = static_cast<uint16_t>(rng());
		ip.ipv4_id = static_cast<uint16_t>(rng());
		ip.ipv4_df = rng() & 1;
		std::vector<uint8_t> pl(rng() % 300);
		for (auto &b : pl)
			b = static_cast<uint8_t>(rng());
		uint8_t h[48];
		const size_t n = build_ip_udp(ip, pl.data(), pl.size(), h);
		ASSERT_EQ(n, ip.v6 ? 48u : 28u);
		EXPECT_EQ(udp_sum(ip, h, pl), 0xffff) << i;
		const uint8_t *u = h + n - 8;
		EXPECT_EQ((u[4] << 8 | u[5]), static_cast<int>(8 + pl.size()));
		if (!ip.v6) {
			EXPECT_EQ(ofold(ocsum(0, h, 20)), 0xffff) << i;
			EXPECT_EQ((h[2] << 8 | h[3]), static_cast<int>(28 + pl.size()));
			EXPECT_EQ((h[4] << 8 | h[5]), ip.ipv4_id);
			EXPECT_EQ((h[6] << 8 | h[7]), ip.ipv4_df ? 0x4000 : 0);
		} else {
			EXPECT_EQ((h[4] << 8 | h[5]), static_cast<int>(8 + pl.size()));
		}
	}
}

// A datagram whose checksum computes to 0 carries 0xffff (RFC 768: 0 means
// "none" over IPv4 and is invalid over IPv6).
TEST(Rocev2Ip, ZeroUdpChecksumIsSentAsOnes)
{
	for (bool v6 : {false, true}) {
		const ip_info ip = kat_ip(v6);
		std::vector<uint8_t> pl(16, 0x5a);
		pl[14] = pl[15] = 0;
		uint8_t h[48];
		const size_t n = build_ip_udp(ip, pl.data(), pl.size(), h);
		// The last word set to the checksum makes the sum all ones,
		// so that the checksum proper computes to 0.
		pl[14] = h[n - 2];
		pl[15] = h[n - 1];
		build_ip_udp(ip, pl.data(), pl.size(), h);
		EXPECT_EQ(h[n - 2], 0xff);
		EXPECT_EQ(h[n - 1], 0xff);
		// Asked for none, there is none.
		build_ip_udp(ip, pl.data(), pl.size(), h, false);
		EXPECT_EQ(h[n - 2], 0);
		EXPECT_EQ(h[n - 1], 0);
	}
}

// ----- pcap -----

namespace {

std::vector<uint8_t> slurp(const std::string &path)
{
	std::ifstream f(path, std::ios::binary);
	return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}
uint32_t le32(const uint8_t *p)
{
	return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}
std::string tmp_path(const char *tag)
{
	const char *d = std::getenv("TMPDIR");
	return std::string(d ? d : "/tmp") + "/rocev2-" + tag + "-" + std::to_string(getpid()) +
	       ".pcap";
}

} // namespace

TEST(Rocev2Pcap, WritesTheKnownPackets)
{
	const std::string path = tmp_path("kat");
	pcap_writer *w = pcap_open(path.c_str());
	ASSERT_NE(w, nullptr);
	const uint64_t ts = 1700000000ull * 1000000000ull + 123456789ull;
	for (bool v6 : {false, true}) {
		const uint8_t *pkt = v6 ? kPkt6 : kPkt4;
		const size_t n = v6 ? sizeof(kPkt6) : sizeof(kPkt4);
		const size_t off = v6 ? 48 : 28;
		EXPECT_EQ(pcap_write(w, kat_ip(v6), pkt + off, n - off, ts), 0);
	}
	std::vector<uint8_t> big(70000);
	EXPECT_EQ(pcap_write(w, kat_ip(false), big.data(), big.size(), ts), -EMSGSIZE);
	ASSERT_EQ(pcap_close(w), 0);
	const std::vector<uint8_t> f = slurp(path);
	std::remove(path.c_str());
	ASSERT_EQ(f.size(), 24 + 16 + sizeof(kPkt4) + 16 + sizeof(kPkt6));
	// The classic header, little-endian: magic, 2.4, zone 0, sigfigs 0, snaplen, RAW.
	const uint8_t hdr[24] = {0xd4, 0xc3, 0xb2, 0xa1, 2, 0, 4, 0,    0, 0, 0, 0,
				 0,    0,    0,	   0,	 0xff, 0xff, 0, 0, 101, 0, 0, 0};
	EXPECT_EQ(0, std::memcmp(f.data(), hdr, 24));
	const uint8_t *r = f.data() + 24;
	for (bool v6 : {false, true}) {
		const size_t n = v6 ? sizeof(kPkt6) : sizeof(kPkt4);
		EXPECT_EQ(le32(r), 1700000000u);
		EXPECT_EQ(le32(r + 4), 123456u);
		EXPECT_EQ(le32(r + 8), n);
		EXPECT_EQ(le32(r + 12), n);
		EXPECT_EQ(0, std::memcmp(r + 16, v6 ? kPkt6 : kPkt4, n)) << (v6 ? "IPv6" : "IPv4");
		r += 16 + n;
	}
	EXPECT_EQ(pcap_open("/nonexistent-dir/x.pcap"), nullptr);
}

TEST(Rocev2Pcap, ConcurrentAppendsStayWhole)
{
	const std::string path = tmp_path("mt");
	pcap_writer *w = pcap_open(path.c_str());
	ASSERT_NE(w, nullptr);
	constexpr int kThreads = 4, kEach = 500;
	std::vector<std::thread> th;
	for (int t = 0; t < kThreads; t++)
		th.emplace_back([w, t] {
			std::vector<uint8_t> up(12 + 4 + 200);
			for (int i = 0; i < kEach; i++) {
				// Every byte the thread's tag: a record torn by
				// another thread's shows a foreign byte.
				const size_t n = 16 + static_cast<size_t>((i * 4 + t * 4) % 200);
				std::memset(up.data(), 0x10 + t, n);
				EXPECT_EQ(pcap_write(w, kat_ip(t & 1), up.data(), n, 0), 0);
			}
		});
	for (auto &x : th)
		x.join();
	ASSERT_EQ(pcap_close(w), 0);
	const std::vector<uint8_t> f = slurp(path);
	std::remove(path.c_str());
	size_t off = 24;
	int per[kThreads] = {};
	while (off + 16 <= f.size()) {
		const uint32_t n = le32(f.data() + off + 8);
		ASSERT_LE(off + 16 + n, f.size());
		const uint8_t *ip = f.data() + off + 16;
		const size_t hl = (ip[0] >> 4) == 6 ? 48 : 28;
		ASSERT_GT(n, hl);
		const uint8_t tag = ip[hl];
		ASSERT_GE(tag, 0x10);
		ASSERT_LT(tag, 0x10 + kThreads);
		EXPECT_EQ((ip[0] >> 4) == 6, ((tag - 0x10) & 1) == 1);
		for (size_t i = hl; i < n; i++)
			ASSERT_EQ(ip[i], tag) << "record at " << off;
		per[tag - 0x10]++;
		off += 16 + n;
	}
	EXPECT_EQ(off, f.size());
	for (int t = 0; t < kThreads; t++)
		EXPECT_EQ(per[t], kEach);
}

// ----- fuzz -----

// Valid packets damaged every way (bit flips, truncation, growth, random
// bytes), each in a heap block of its exact size.  parse() must not read
// outside it (ASan) and what it returns must hold together.
TEST(Rocev2Parse, Fuzz)
{
	std::mt19937_64 rng(20260);
	const std::vector<uint8_t> ops = known_opcodes();
	std::map<parse_err, long> seen;
	constexpr long kIters = 250000;
	for (long it = 0; it < kIters; it++) {
		std::vector<uint8_t> v;
		const unsigned kind = rng() % 6;
		if (kind == 5) { // Random bytes, a random opcode
			v.resize(rng() % 100);
			for (auto &b : v)
				b = static_cast<uint8_t>(rng());
		} else {
			v = valid_packet(ops[rng() % ops.size()], rng);
			switch (kind) {
			case 0: { // Bit flips
				const int flips = 1 + rng() % 4;
				for (int i = 0; i < flips; i++)
					v[rng() % v.size()] ^= static_cast<uint8_t>(1u << (rng() % 8));
				break;
			}
			case 1: // Truncated
				v.resize(rng() % v.size());
				break;
			case 2: // Grown
				for (size_t n = 1 + rng() % 9; n; n--)
					v.push_back(static_cast<uint8_t>(rng()));
				break;
			case 3: // Flips in the first two bytes: opcode, pad, version
				v[rng() % 2] ^= static_cast<uint8_t>(1u << (rng() % 8));
				break;
			case 4: // Left valid
				break;
			}
		}
		std::unique_ptr<uint8_t[]> blk(new uint8_t[v.size()]);
		if (!v.empty())
			std::memcpy(blk.get(), v.data(), v.size());
		const size_t len = v.size();
		parsed p;
		const parse_err e = parse(blk.get(), len, p);
		seen[e]++;
		const uint8_t op = len ? v[0] : 0;
		const size_t hl = spec_table().count(op) ? spec_len(spec_table().at(op)) : 0;
		switch (e) {
		case parse_err::ok:
			ASSERT_TRUE(spec_table().count(op));
			ASSERT_EQ(p.hdr_len, hl);
			ASSERT_EQ(p.payload, blk.get() + hl);
			ASSERT_EQ(p.payload_len + p.hdr_len + p.h.b.pad + 4, len);
			ASSERT_EQ((p.payload_len + p.h.b.pad) % 4, 0u);
			ASSERT_EQ(p.h.b.tver, 0);
			ASSERT_EQ(p.icrc_wire, le32(blk.get() + len - 4));
			if (!(spec_table().at(op) & P)) {
				ASSERT_EQ(p.payload_len + p.h.b.pad, 0u);
			}
			{ // Built again from what was read: the same header bytes,
			  // but for reserved bits the builder writes as 0.
				uint8_t again[64];
				ASSERT_EQ(build_headers(p.h, again, sizeof(again)), hl);
				parsed q;
				std::vector<uint8_t> w(again, again + hl);
				w.insert(w.end(), v.begin() + static_cast<long>(hl), v.end());
				ASSERT_EQ(parse(w.data(), w.size(), q), parse_err::ok);
				EXPECT_HDRS_EQ(q.h, p.h);
			}
			break;
		case parse_err::truncated:
			ASSERT_TRUE(len < 12 || len < hl + 4) << len;
			break;
		case parse_err::bad_version:
			ASSERT_GE(len, 12u);
			ASSERT_NE(v[1] & 0xf, 0);
			break;
		case parse_err::bad_opcode:
			ASSERT_GE(len, 12u);
			ASSERT_FALSE(spec_table().count(op));
			break;
		case parse_err::bad_pad:
			ASSERT_GT(((v[1] >> 4) & 3u) + hl + 4, len);
			break;
		case parse_err::bad_length:
			ASSERT_GE(len, hl + 4);
			break;
		}
		if (::testing::Test::HasFailure()) {
			ADD_FAILURE() << "iteration " << it << " kind " << kind << " len " << len;
			return;
		}
	}
	// Every outcome seen, and plenty of each: a fuzz that only ever saw
	// one answer would prove nothing.
	for (parse_err e : {parse_err::ok, parse_err::truncated, parse_err::bad_version,
			    parse_err::bad_opcode, parse_err::bad_pad, parse_err::bad_length})
		EXPECT_GT(seen[e], 100) << parse_err_name(e);
	for (auto &[e, n] : seen)
		std::printf("fuzz: %s %ld\n", parse_err_name(e), n);
}

// CM MADs (cm_mad.h): the fields at the byte and bit positions of the
// spec's tables 106, 108, 110 and 112, read back here by hand.
TEST(Rocev2CmMad, ReqFieldPlacement)
{
	namespace cm = loop::rocev2::cm;
	uint8_t mad[cm::kMadLen];
	memset(mad, 0xee, sizeof(mad));
	cm::mad_hdr h;
	h.tid = 0x0102030405060708ull;
	h.attr_id = cm::REQ;
	cm::put_hdr(mad, h);
	cm::req q;
	q.local_comm_id = 0xa1b2c3d4;
	q.service_id = cm::service_id(0x0106, 7174);
	q.local_qpn = 0x123456;
	q.responder_resources = 4;
	q.initiator_depth = 3;
	q.starting_psn = 0xabcdef;
	q.retry_count = 6;
	q.rnr_retry_count = 5;
	q.path_mtu = 5;
	q.srq = true;
	q.primary_local_gid[15] = 0x11;
	q.primary_remote_gid[15] = 0x22;
	q.primary_local_ack_timeout = 18;
	q.private_data[0] = 0x77;
	cm::put_req(mad, q);
	const uint8_t *d = mad + 24;
	EXPECT_EQ(mad[0], 1);
	EXPECT_EQ(mad[1], 0x07);
	EXPECT_EQ(mad[2], 2);
	EXPECT_EQ(mad[3], 0x03);
	EXPECT_EQ(mad[16], 0x00);
	EXPECT_EQ(mad[17], 0x10);
	EXPECT_EQ(mad[8], 0x01);
	EXPECT_EQ(mad[15], 0x08);
	EXPECT_EQ(d[0], 0xa1);
	EXPECT_EQ(d[3], 0xd4);
	// Service ID 0x0000000001061c06 at 8.
	EXPECT_EQ(d[12], 0x01);
	EXPECT_EQ(d[13], 0x06);
	EXPECT_EQ(d[14], 0x1c);
	EXPECT_EQ(d[15], 0x06);
	EXPECT_EQ(d[32], 0x12);
	EXPECT_EQ(d[33], 0x34);
	EXPECT_EQ(d[34], 0x56);
	EXPECT_EQ(d[35], 4);
	EXPECT_EQ(d[39], 3);
	EXPECT_EQ(d[44], 0xab);
	EXPECT_EQ(d[46], 0xef);
	EXPECT_EQ(d[47] & 7, 6);     // retry count: low 3 bits
	EXPECT_EQ(d[48], 0xff);      // P_Key
	EXPECT_EQ(d[50] >> 4, 5);    // path MTU: high nibble
	EXPECT_EQ(d[50] & 7, 5);     // RNR retry count: low 3 bits
	EXPECT_EQ((d[51] >> 3) & 1, 1); // SRQ
	EXPECT_EQ(d[71], 0x11);
	EXPECT_EQ(d[87], 0x22);
	EXPECT_EQ(d[95] >> 3, 18);   // local ACK timeout: high 5 bits
	EXPECT_EQ(d[140], 0x77);
	cm::req back;
	cm::get_req(mad, back);
	EXPECT_EQ(back.local_qpn, q.local_qpn);
	EXPECT_EQ(back.starting_psn, q.starting_psn);
	EXPECT_EQ(back.rnr_retry_count, 5);
	EXPECT_EQ(back.retry_count, 6);
	EXPECT_EQ(back.path_mtu, 5);
	EXPECT_TRUE(back.srq);
	bool by_service = false;
	uint64_t key = 0;
	ASSERT_TRUE(cm::route_of(mad, sizeof(mad), by_service, key));
	EXPECT_TRUE(by_service);
	EXPECT_EQ(key, 0x01061c06u);
	EXPECT_FALSE(cm::route_of(mad, sizeof(mad) - 1, by_service, key));
	mad[1] = 0x03; // Another class (SA)
	EXPECT_FALSE(cm::route_of(mad, sizeof(mad), by_service, key));
}

TEST(Rocev2CmMad, RepRejDreqAndRouting)
{
	namespace cm = loop::rocev2::cm;
	uint8_t mad[cm::kMadLen] = {};
	cm::mad_hdr h;
	h.attr_id = cm::REP;
	cm::put_hdr(mad, h);
	cm::rep r;
	r.local_comm_id = 0x11111111;
	r.remote_comm_id = 0x22222222;
	r.local_qpn = 0x654321;
	r.starting_psn = 0x000102;
	r.rnr_retry_count = 7;
	r.srq = true;
	cm::put_rep(mad, r);
	const uint8_t *d = mad + 24;
	EXPECT_EQ(d[12], 0x65);
	EXPECT_EQ(d[14], 0x21);
	EXPECT_EQ(d[22], 0x02);
	EXPECT_EQ(d[27] >> 5, 7);	 // RNR retry count: high 3 bits
	EXPECT_EQ((d[27] >> 4) & 1, 1); // SRQ
	bool by_service = true;
	uint64_t key = 0;
	ASSERT_TRUE(cm::route_of(mad, sizeof(mad), by_service, key));
	EXPECT_FALSE(by_service);
	EXPECT_EQ(key, 0x22222222u);
	h.attr_id = cm::REJ;
	cm::put_hdr(mad, h);
	cm::rej j;
	j.remote_comm_id = 0x33333333;
	j.message_rejected = cm::kRejectedRep;
	j.reason = 8;
	cm::put_rej(mad, j);
	EXPECT_EQ(d[8] >> 6, 1);
	EXPECT_EQ(d[10], 0);
	EXPECT_EQ(d[11], 8);
	ASSERT_TRUE(cm::route_of(mad, sizeof(mad), by_service, key));
	EXPECT_EQ(key, 0x33333333u);
	h.attr_id = cm::DREQ;
	cm::put_hdr(mad, h);
	cm::short_msg s;
	s.local_comm_id = 1;
	s.remote_comm_id = 2;
	s.remote_qpn = 0xabcdef;
	cm::put_short(mad, cm::DREQ, s);
	EXPECT_EQ(d[8], 0xab);
	EXPECT_EQ(d[10], 0xef);
	cm::short_msg back;
	cm::get_short(mad, cm::DREQ, back);
	EXPECT_EQ(back.remote_qpn, 0xabcdefu);
	// A message naming no receiver (remote comm ID 0) goes nowhere.
	s.remote_comm_id = 0;
	cm::put_short(mad, cm::DREQ, s);
	EXPECT_FALSE(cm::route_of(mad, sizeof(mad), by_service, key));
}

TEST(Rocev2CmMad, CmaHeaderAndGsiPacket)
{
	namespace cm = loop::rocev2::cm;
	uint8_t pd[cm::kCmaHdrLen];
	cm::cma_hdr c;
	c.ip_version = 4;
	c.src_port = 0x1234;
	const uint8_t s4[4] = {10, 1, 2, 3}, d4[4] = {10, 1, 2, 4};
	memcpy(c.src, s4, 4);
	memcpy(c.dst, d4, 4);
	cm::put_cma_hdr(pd, c);
	EXPECT_EQ(pd[0], 0);
	EXPECT_EQ(pd[1], 0x40);
	EXPECT_EQ(pd[2], 0x12);
	EXPECT_EQ(pd[19], 3);	// IPv4 source: the last 4 of its 16 bytes
	EXPECT_EQ(pd[35], 4);
	cm::cma_hdr back;
	ASSERT_TRUE(cm::get_cma_hdr(pd, back));
	EXPECT_EQ(back.src_port, 0x1234);
	EXPECT_EQ(0, memcmp(back.dst, d4, 4));
	pd[1] = 0x50; // IP version 5
	EXPECT_FALSE(cm::get_cma_hdr(pd, back));
	uint8_t mad[cm::kMadLen] = {};
	uint8_t pkt[cm::kMadLen + 64];
	size_t n = cm::build_gsi_packet(pkt, mad, 0x123);
	ASSERT_EQ(n, 12u + 8 + 256);
	parsed p;
	uint8_t full[cm::kMadLen + 64];
	memcpy(full, pkt, n);
	put_icrc(full + n, 0);
	ASSERT_EQ(parse(full, n + 4, p), parse_err::ok);
	EXPECT_EQ(p.h.b.opcode, UD_SEND_ONLY);
	EXPECT_EQ(p.h.b.dqpn, 1u);
	EXPECT_EQ(p.h.d.qkey, 0x80010000u);
	EXPECT_EQ(p.h.d.sqpn, 1u);
	EXPECT_EQ(p.payload_len, 256u);
}

TEST(Rocev2CmMad, SidrFieldPlacement)
{
	namespace cm = loop::rocev2::cm;
	uint8_t mad[cm::kMadLen] = {};
	const uint8_t *d = mad + 24;
	cm::sidr_req q;
	q.request_id = 0x01020304;
	q.service_id = cm::service_id(0x0111, 7174); // RDMA_PS_UDP
	q.private_data[0] = 0x5a;
	cm::put_sidr_req(mad, q);
	EXPECT_EQ(d[3], 0x04);
	EXPECT_EQ(d[4], 0xff); // P_Key
	EXPECT_EQ(d[5], 0xff);
	EXPECT_EQ(d[12], 0x01);
	EXPECT_EQ(d[13], 0x11);
	EXPECT_EQ(d[16], 0x5a);
	cm::mad_hdr h;
	h.attr_id = cm::SIDR_REQ;
	cm::put_hdr(mad, h);
	bool by_service = false;
	uint64_t key = 0;
	ASSERT_TRUE(cm::route_of(mad, sizeof(mad), by_service, key));
	EXPECT_TRUE(by_service);
	EXPECT_EQ(key, 0x01111c06u);
	cm::sidr_rep r;
	r.request_id = 0x0a0b0c0d;
	r.status = 2;
	r.qpn = 0x445566;
	r.service_id = q.service_id;
	r.qkey = 0x01234567;
	r.private_data[0] = 0x6b;
	cm::put_sidr_rep(mad, r);
	EXPECT_EQ(d[4], 2);
	EXPECT_EQ(d[8], 0x44);
	EXPECT_EQ(d[10], 0x66);
	EXPECT_EQ(d[19], 0x06);
	EXPECT_EQ(d[20], 0x01);
	EXPECT_EQ(d[23], 0x67);
	EXPECT_EQ(d[96], 0x6b);
	h.attr_id = cm::SIDR_REP;
	cm::put_hdr(mad, h);
	ASSERT_TRUE(cm::route_of(mad, sizeof(mad), by_service, key));
	EXPECT_FALSE(by_service);
	EXPECT_EQ(key, 0x0a0b0c0du);
	cm::sidr_rep back;
	cm::get_sidr_rep(mad, back);
	EXPECT_EQ(back.qpn, 0x445566u);
	EXPECT_EQ(back.qkey, 0x01234567u);
}
