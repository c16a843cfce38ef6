// SPDX-License-Identifier: MIT
// A pcap writer for RoCE v2 traffic: the classic libpcap file format
// (microsecond timestamps, link type LINKTYPE_RAW = 101: each packet starts
// with its IP header), each UDP payload wrapped in the IPv4 or IPv6 and UDP
// headers that Linux puts around it (build_ip_udp() in wire.h), so that
// Wireshark shows a capture of the transport as a capture on the wire would.
#pragma once

#include <cstddef>
#include <cstdint>

#include "wire.h"

namespace loop::rocev2 {

inline constexpr uint32_t kPcapLinktypeRaw = 101;
inline constexpr uint32_t kPcapSnaplen = 65535;

struct pcap_writer; // Opaque: a file and the mutex that orders its appends

// Creates (truncates) path and writes the file header; nullptr with errno set
// on failure.
pcap_writer *pcap_open(const char *path);
// Appends one packet: ip's headers around the len bytes of udp_payload (the
// BTH on, ICRC included), stamped ts_ns nanoseconds after the epoch (kept
// to the microsecond).  Safe from several threads.  0, or -errno (-EMSGSIZE
// for a datagram longer than 65535 bytes or than the snap length).
int pcap_write(pcap_writer *w, const ip_info &ip, const uint8_t *udp_payload, size_t len,
	       uint64_t ts_ns);
// Flushes and closes; 0 or -errno of the flush.  w is freed either way.
int pcap_close(pcap_writer *w);

} // namespace loop::rocev2
