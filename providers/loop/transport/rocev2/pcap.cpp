// SPDX-License-Identifier: MIT
// The pcap writer (pcap.h).  The file is written in little-endian order,
// whatever the host's: the magic number tells readers which order it is.
#include "pcap.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <vector>

namespace loop::rocev2 {

struct pcap_writer {
	std::mutex mu;
	FILE *f = nullptr;
};

namespace {

void le32(uint8_t *p, uint32_t v)
{
	p[0] = static_cast<uint8_t>(v);
	p[1] = static_cast<uint8_t>(v >> 8);
	p[2] = static_cast<uint8_t>(v >> 16);
	p[3] = static_cast<uint8_t>(v >> 24);
}
void le16(uint8_t *p, uint16_t v)
{
	p[0] = static_cast<uint8_t>(v);
	p[1] = static_cast<uint8_t>(v >> 8);
}

} // namespace

pcap_writer *pcap_open(const char *path)
{
	FILE *f = std::fopen(path, "wb");
	if (!f)
		return nullptr;
	uint8_t h[24];
	le32(h, 0xa1b2c3d4); // Microsecond timestamps
	le16(h + 4, 2);	     // Version 2.4
	le16(h + 6, 4);
	le32(h + 8, 0);	 // thiszone: UTC
	le32(h + 12, 0); // sigfigs
	le32(h + 16, kPcapSnaplen);
	le32(h + 20, kPcapLinktypeRaw);
	if (std::fwrite(h, sizeof(h), 1, f) != 1) {
		const int e = errno ? errno : EIO;
		std::fclose(f);
		errno = e;
		return nullptr;
	}
	auto *w = new (std::nothrow) pcap_writer;
	if (!w) {
		std::fclose(f);
		errno = ENOMEM;
		return nullptr;
	}
	w->f = f;
	return w;
}

int pcap_write(pcap_writer *w, const ip_info &ip, const uint8_t *udp_payload, size_t len,
	       uint64_t ts_ns)
{
	const size_t iplen = (ip.v6 ? kIpv6HdrLen : kIpv4HdrLen) + kUdpHdrLen + len;
	// The IPv4 total length and the UDP length are 16 bits; the IPv6
	// payload length too (no jumbograms).
	if (kUdpHdrLen + len > 0xffff || (!ip.v6 && iplen > 0xffff) || iplen > kPcapSnaplen)
		return -EMSGSIZE;
	// Built outside the lock: only the append is ordered.
	std::vector<uint8_t> rec(16 + iplen);
	const uint64_t us = ts_ns / 1000;
	le32(rec.data(), static_cast<uint32_t>(us / 1000000));
	le32(rec.data() + 4, static_cast<uint32_t>(us % 1000000));
	le32(rec.data() + 8, static_cast<uint32_t>(iplen));  // Captured
	le32(rec.data() + 12, static_cast<uint32_t>(iplen)); // On the wire
	const size_t hl = build_ip_udp(ip, udp_payload, len, rec.data() + 16);
	std::memcpy(rec.data() + 16 + hl, udp_payload, len);
	std::lock_guard<std::mutex> g(w->mu);
	if (std::fwrite(rec.data(), rec.size(), 1, w->f) != 1)
		return errno ? -errno : -EIO;
	return 0;
}

int pcap_close(pcap_writer *w)
{
	if (!w)
		return 0;
	int rc = 0;
	if (std::fclose(w->f) != 0)
		rc = errno ? -errno : -EIO;
	delete w;
	return rc;
}

} // namespace loop::rocev2
