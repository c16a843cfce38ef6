// SPDX-License-Identifier: MIT
// Writes a pcap of one RoCE v2 packet of every opcode the codec knows
// (providers/loop/transport/rocev2/wire.h), over IPv4 and IPv6, to UDP port
// 4791 and to a second port given on the command line, each ICRC filled in.
// pyverbs-tests/test_rocev2_wire.py reads it back with code of its own and
// with tshark.  One line per packet on stdout, the manifest the test checks
// the file against:
//   index opcode(hex) v6 sport dport dqpn(hex) psn(hex) payload_len pad
//
// Usage: rocev2_pcap_sample OUT.pcap TEST_PORT
#include "providers/loop/transport/rocev2/pcap.h"
#include "providers/loop/transport/rocev2/wire.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

using namespace loop::rocev2;

namespace {

// The fields of a packet, derived from the opcode so that each packet is
// told apart from the others by its QP and PSN as well as by its opcode.
pkt_hdrs headers_for(uint8_t opcode, unsigned variant)
{
	pkt_hdrs h{};
	h.b.opcode = opcode;
	h.b.se = opcode & 1;
	h.b.mig = true;
	h.b.tver = kTver;
	h.b.pkey = kDefaultPkey;
	h.b.dqpn = 0x10000u | opcode << 4 | variant;
	h.b.ackreq = opcode & 2;
	h.b.psn = 0x800000u | opcode << 8 | variant;
	h.r = {0x00007f0012345000ull + opcode, 0x1000u + opcode, 64};
	h.a = {aeth_ack(kAethNoCredits), 0x000100u + opcode};
	h.at = {0x00007f0012346000ull, 0x2000u + opcode, 0x1111111122222222ull,
		0x3333333344444444ull};
	h.atomic_ack_orig = 0x5555555566666666ull;
	const uint8_t imm[4] = {0xde, 0xad, 0xbe, opcode};
	std::memcpy(&h.imm_be, imm, 4);
	h.ieth_rkey = 0x3000u + opcode;
	h.d = {0x11111111u, 0x000200u + opcode};
	h.xrc_srqn = 0x000300u + opcode;
	return h;
}

size_t payload_len_for(uint8_t opcode)
{
	if (!(opcode_headers(opcode) & HDR_PAYLOAD))
		return 0;
	if (opcode == CNP)
		return kCnpPayloadLen;
	if (opcode == RC_ATOMIC_WRITE)
		return kAtomicWritePayloadLen;
	return opcode % 7; // 0 to 6 bytes: every pad count, and none
}

} // namespace

int main(int argc, char **argv)
{
	if (argc != 3) {
		std::fprintf(stderr, "usage: %s OUT.pcap TEST_PORT\n", argv[0]);
		return 2;
	}
	const unsigned long test_port = std::strtoul(argv[2], nullptr, 10);
	if (test_port == 0 || test_port > 0xffff) {
		std::fprintf(stderr, "bad port %s\n", argv[2]);
		return 2;
	}
	pcap_writer *w = pcap_open(argv[1]);
	if (!w) {
		std::fprintf(stderr, "%s: %s\n", argv[1], std::strerror(errno));
		return 1;
	}
	const uint16_t ports[2] = {kUdpPort, static_cast<uint16_t>(test_port)};
	unsigned index = 0;
	for (unsigned v6 = 0; v6 < 2; v6++) {
		for (uint16_t dport : ports) {
			for (unsigned op = 0; op < 256; op++) {
				if (!opcode_headers(static_cast<uint8_t>(op)))
					continue;
				const unsigned variant = v6 * 2 + (dport != kUdpPort);
				pkt_hdrs h = headers_for(static_cast<uint8_t>(op), variant);
				const size_t plen = payload_len_for(static_cast<uint8_t>(op));
				h.b.pad = pad_for(plen);
				std::vector<uint8_t> pkt(opcode_header_len(static_cast<uint8_t>(op)) +
							 plen + h.b.pad + kIcrcLen);
				const size_t hl = build_headers(h, pkt.data(), pkt.size());
				if (!hl) {
					std::fprintf(stderr, "build_headers failed for 0x%02x\n", op);
					return 1;
				}
				for (size_t i = 0; i < plen; i++)
					pkt[hl + i] = static_cast<uint8_t>(0xa0 + i);
				// The pad bytes stay 0, as IBTA asks of a sender.
				ip_info ip{};
				ip.v6 = v6;
				if (v6) {
					const uint8_t s[16] = {0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0,
							       0,    0,	   0,	 0,    0, 0, 0, 1};
					std::memcpy(ip.src, s, 16);
					std::memcpy(ip.dst, s, 16);
					ip.dst[15] = 2;
				} else {
					const uint8_t s[4] = {192, 0, 2, 1}; // TEST-NET-1
					std::memcpy(ip.src, s, 4);
					std::memcpy(ip.dst, s, 4);
					ip.dst[3] = 2;
				}
				ip.sport = static_cast<uint16_t>(0xc000 + op);
				ip.dport = dport;
				const size_t n = pkt.size() - kIcrcLen;
				put_icrc(pkt.data() + n, icrc(ip, pkt.data(), n));
				const int rc = pcap_write(w, ip, pkt.data(), pkt.size(),
							  1700000000ull * 1000000000ull + index * 1000ull);
				if (rc) {
					std::fprintf(stderr, "pcap_write: %s\n", std::strerror(-rc));
					return 1;
				}
				std::printf("%u %02x %u %u %u %06x %06x %zu %u\n", index, op, v6,
					    ip.sport, dport, h.b.dqpn, h.b.psn, plen, h.b.pad);
				index++;
			}
		}
	}
	if (pcap_close(w)) {
		std::fprintf(stderr, "pcap_close failed\n");
		return 1;
	}
	return 0;
}
