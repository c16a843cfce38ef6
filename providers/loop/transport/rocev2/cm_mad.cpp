// SPDX-License-Identifier: MIT
// CM MADs and the GSI packet that carries one (cm_mad.h).
#include "cm_mad.h"

#include "be_bytes.h"
#include "wire.h"

#include <cinttypes>
#include <cstdio>
#include <cstring>

namespace loop::rocev2::cm {

namespace {

// The CM data starts after the common MAD header.
uint8_t *at(uint8_t *mad, size_t off)
{
	return mad + kMadHdrLen + off;
}

const uint8_t *at(const uint8_t *mad, size_t off)
{
	return mad + kMadHdrLen + off;
}

// A field of width bits in byte *p, starting bit (from the most
// significant, 0..7) into it.
void put_bits(uint8_t *p, unsigned bit, unsigned width, unsigned v)
{
	unsigned shift = 8 - bit - width;
	unsigned mask = ((1u << width) - 1) << shift;
	*p = static_cast<uint8_t>((*p & ~mask) | ((v << shift) & mask));
}

uint8_t get_bits(const uint8_t *p, unsigned bit, unsigned width)
{
	unsigned shift = 8 - bit - width;
	return static_cast<uint8_t>((*p >> shift) & ((1u << width) - 1));
}

} // namespace

void put_hdr(uint8_t *mad, const mad_hdr &h)
{
	mad[0] = h.base_version;
	mad[1] = h.mgmt_class;
	mad[2] = h.class_version;
	mad[3] = h.method;
	put16(mad + 4, h.status);
	put16(mad + 6, h.class_specific);
	put64(mad + 8, h.tid);
	put16(mad + 16, h.attr_id);
	put16(mad + 18, 0);
	put32(mad + 20, h.attr_mod);
}

void get_hdr(const uint8_t *mad, mad_hdr &h)
{
	h.base_version = mad[0];
	h.mgmt_class = mad[1];
	h.class_version = mad[2];
	h.method = mad[3];
	h.status = get16(mad + 4);
	h.class_specific = get16(mad + 6);
	h.tid = get64(mad + 8);
	h.attr_id = get16(mad + 16);
	h.attr_mod = get32(mad + 20);
}

// Table 106.
void put_req(uint8_t *mad, const req &m)
{
	memset(at(mad, 0), 0, kDataLen);
	put32(at(mad, 0), m.local_comm_id);
	put64(at(mad, 8), m.service_id);
	put64(at(mad, 16), m.local_ca_guid);
	put32(at(mad, 28), m.local_qkey);
	put24(at(mad, 32), m.local_qpn);
	*at(mad, 35) = m.responder_resources;
	// Local EECN (36) and remote EECN (40): 0, no RD.
	*at(mad, 39) = m.initiator_depth;
	put_bits(at(mad, 43), 0, 5, m.remote_cm_response_timeout);
	put_bits(at(mad, 43), 5, 2, m.transport_service);
	put_bits(at(mad, 43), 7, 1, m.end_to_end_flow_control);
	put24(at(mad, 44), m.starting_psn);
	put_bits(at(mad, 47), 0, 5, m.local_cm_response_timeout);
	put_bits(at(mad, 47), 5, 3, m.retry_count);
	put16(at(mad, 48), m.pkey);
	put_bits(at(mad, 50), 0, 4, m.path_mtu);
	put_bits(at(mad, 50), 4, 1, 0); // RDC exists
	put_bits(at(mad, 50), 5, 3, m.rnr_retry_count);
	put_bits(at(mad, 51), 0, 4, m.max_cm_retries);
	put_bits(at(mad, 51), 4, 1, m.srq);
	put_bits(at(mad, 51), 5, 3, 0); // Extended transport type
	put16(at(mad, 52), m.primary_local_lid);
	put16(at(mad, 54), m.primary_remote_lid);
	memcpy(at(mad, 56), m.primary_local_gid, 16);
	memcpy(at(mad, 72), m.primary_remote_gid, 16);
	// Flow label: the top 20 bits of the word at 88; the packet rate the
	// low 6 bits of byte 91.
	put32(at(mad, 88), (m.primary_flow_label & 0xfffff) << 12);
	put_bits(at(mad, 91), 2, 6, m.primary_packet_rate);
	*at(mad, 92) = m.primary_traffic_class;
	*at(mad, 93) = m.primary_hop_limit;
	put_bits(at(mad, 94), 0, 4, m.primary_sl);
	put_bits(at(mad, 94), 4, 1, m.primary_subnet_local);
	put_bits(at(mad, 95), 0, 5, m.primary_local_ack_timeout);
	// The alternate path (96..139): none, all 0.
	memcpy(at(mad, 140), m.private_data, kReqPdata);
}

void get_req(const uint8_t *mad, req &m)
{
	m.local_comm_id = get32(at(mad, 0));
	m.service_id = get64(at(mad, 8));
	m.local_ca_guid = get64(at(mad, 16));
	m.local_qkey = get32(at(mad, 28));
	m.local_qpn = get24(at(mad, 32));
	m.responder_resources = *at(mad, 35);
	m.initiator_depth = *at(mad, 39);
	m.remote_cm_response_timeout = get_bits(at(mad, 43), 0, 5);
	m.transport_service = get_bits(at(mad, 43), 5, 2);
	m.end_to_end_flow_control = get_bits(at(mad, 43), 7, 1);
	m.starting_psn = get24(at(mad, 44));
	m.local_cm_response_timeout = get_bits(at(mad, 47), 0, 5);
	m.retry_count = get_bits(at(mad, 47), 5, 3);
	m.pkey = get16(at(mad, 48));
	m.path_mtu = get_bits(at(mad, 50), 0, 4);
	m.rnr_retry_count = get_bits(at(mad, 50), 5, 3);
	m.max_cm_retries = get_bits(at(mad, 51), 0, 4);
	m.srq = get_bits(at(mad, 51), 4, 1);
	m.primary_local_lid = get16(at(mad, 52));
	m.primary_remote_lid = get16(at(mad, 54));
	memcpy(m.primary_local_gid, at(mad, 56), 16);
	memcpy(m.primary_remote_gid, at(mad, 72), 16);
	m.primary_flow_label = get32(at(mad, 88)) >> 12;
	m.primary_packet_rate = get_bits(at(mad, 91), 2, 6);
	m.primary_traffic_class = *at(mad, 92);
	m.primary_hop_limit = *at(mad, 93);
	m.primary_sl = get_bits(at(mad, 94), 0, 4);
	m.primary_subnet_local = get_bits(at(mad, 94), 4, 1);
	m.primary_local_ack_timeout = get_bits(at(mad, 95), 0, 5);
	memcpy(m.private_data, at(mad, 140), kReqPdata);
}

// Table 110.
void put_rep(uint8_t *mad, const rep &m)
{
	memset(at(mad, 0), 0, kDataLen);
	put32(at(mad, 0), m.local_comm_id);
	put32(at(mad, 4), m.remote_comm_id);
	put32(at(mad, 8), m.local_qkey);
	put24(at(mad, 12), m.local_qpn);
	put24(at(mad, 20), m.starting_psn);
	*at(mad, 24) = m.responder_resources;
	*at(mad, 25) = m.initiator_depth;
	put_bits(at(mad, 26), 0, 5, m.target_ack_delay);
	put_bits(at(mad, 26), 5, 2, m.failover_accepted);
	put_bits(at(mad, 26), 7, 1, m.end_to_end_flow_control);
	put_bits(at(mad, 27), 0, 3, m.rnr_retry_count);
	put_bits(at(mad, 27), 3, 1, m.srq);
	put64(at(mad, 28), m.local_ca_guid);
	memcpy(at(mad, 36), m.private_data, kRepPdata);
}

void get_rep(const uint8_t *mad, rep &m)
{
	m.local_comm_id = get32(at(mad, 0));
	m.remote_comm_id = get32(at(mad, 4));
	m.local_qkey = get32(at(mad, 8));
	m.local_qpn = get24(at(mad, 12));
	m.starting_psn = get24(at(mad, 20));
	m.responder_resources = *at(mad, 24);
	m.initiator_depth = *at(mad, 25);
	m.target_ack_delay = get_bits(at(mad, 26), 0, 5);
	m.failover_accepted = get_bits(at(mad, 26), 5, 2);
	m.end_to_end_flow_control = get_bits(at(mad, 26), 7, 1);
	m.rnr_retry_count = get_bits(at(mad, 27), 0, 3);
	m.srq = get_bits(at(mad, 27), 3, 1);
	m.local_ca_guid = get64(at(mad, 28));
	memcpy(m.private_data, at(mad, 36), kRepPdata);
}

// Table 108.
void put_rej(uint8_t *mad, const rej &m)
{
	memset(at(mad, 0), 0, kDataLen);
	put32(at(mad, 0), m.local_comm_id);
	put32(at(mad, 4), m.remote_comm_id);
	put_bits(at(mad, 8), 0, 2, m.message_rejected);
	put_bits(at(mad, 9), 0, 7, m.ari_length);
	put16(at(mad, 10), m.reason);
	memcpy(at(mad, 12), m.ari, sizeof(m.ari));
	memcpy(at(mad, 84), m.private_data, kRejPdata);
}

void get_rej(const uint8_t *mad, rej &m)
{
	m.local_comm_id = get32(at(mad, 0));
	m.remote_comm_id = get32(at(mad, 4));
	m.message_rejected = get_bits(at(mad, 8), 0, 2);
	m.ari_length = get_bits(at(mad, 9), 0, 7);
	m.reason = get16(at(mad, 10));
	memcpy(m.ari, at(mad, 12), sizeof(m.ari));
	memcpy(m.private_data, at(mad, 84), kRejPdata);
}

// Tables 111 to 113: DREQ has the remote QPN at 8 and its private data at
// 12; RTU and DREP their private data at 8.
void put_short(uint8_t *mad, uint16_t attr, const short_msg &m)
{
	memset(at(mad, 0), 0, kDataLen);
	put32(at(mad, 0), m.local_comm_id);
	put32(at(mad, 4), m.remote_comm_id);
	if (attr == DREQ) {
		put24(at(mad, 8), m.remote_qpn);
		memcpy(at(mad, 12), m.private_data, kDreqPdata);
	} else {
		memcpy(at(mad, 8), m.private_data, kRtuPdata);
	}
}

void get_short(const uint8_t *mad, uint16_t attr, short_msg &m)
{
	m.local_comm_id = get32(at(mad, 0));
	m.remote_comm_id = get32(at(mad, 4));
	memset(m.private_data, 0, sizeof(m.private_data));
	if (attr == DREQ) {
		m.remote_qpn = get24(at(mad, 8));
		memcpy(m.private_data, at(mad, 12), kDreqPdata);
	} else {
		m.remote_qpn = 0;
		memcpy(m.private_data, at(mad, 8), kRtuPdata);
	}
}

// Table 119.
void put_sidr_req(uint8_t *mad, const sidr_req &m)
{
	memset(at(mad, 0), 0, kDataLen);
	put32(at(mad, 0), m.request_id);
	put16(at(mad, 4), m.pkey);
	put64(at(mad, 8), m.service_id);
	memcpy(at(mad, 16), m.private_data, kSidrReqPdata);
}

void get_sidr_req(const uint8_t *mad, sidr_req &m)
{
	m.request_id = get32(at(mad, 0));
	m.pkey = get16(at(mad, 4));
	m.service_id = get64(at(mad, 8));
	memcpy(m.private_data, at(mad, 16), kSidrReqPdata);
}

// Table 120.
void put_sidr_rep(uint8_t *mad, const sidr_rep &m)
{
	memset(at(mad, 0), 0, kDataLen);
	put32(at(mad, 0), m.request_id);
	*at(mad, 4) = m.status;
	put24(at(mad, 8), m.qpn);
	put64(at(mad, 12), m.service_id);
	put32(at(mad, 20), m.qkey);
	memcpy(at(mad, 96), m.private_data, kSidrRepPdata);
}

void get_sidr_rep(const uint8_t *mad, sidr_rep &m)
{
	m.request_id = get32(at(mad, 0));
	m.status = *at(mad, 4);
	m.qpn = get24(at(mad, 8));
	m.service_id = get64(at(mad, 12));
	m.qkey = get32(at(mad, 20));
	memcpy(m.private_data, at(mad, 96), kSidrRepPdata);
}

bool is_cm_mad(const uint8_t *mad, size_t len)
{
	if (len < kMadLen || mad[0] != kBaseVersion || mad[1] != kClassCm ||
	    mad[2] != kClassVersion || mad[3] != kMethodSend)
		return false;
	uint16_t a = get16(mad + 16);
	return a >= REQ && a <= APR;
}

bool route_of(const uint8_t *mad, size_t len, bool &by_service, uint64_t &key)
{
	if (!is_cm_mad(mad, len))
		return false;
	switch (get16(mad + 16)) {
	case REQ:
	case SIDR_REQ:
		by_service = true;
		key = get64(at(mad, 8));
		return true;
	case SIDR_REP:
		by_service = false;
		key = get32(at(mad, 0));
		return true;
	default: // MRA, REJ, REP, RTU, DREQ, DREP, LAP, APR: the receiver's ID at 4
		by_service = false;
		key = get32(at(mad, 4));
		return key != 0;
	}
}

size_t build_gsi_packet(uint8_t *buf, const uint8_t *mad, uint32_t psn)
{
	pkt_hdrs h{};
	h.b.opcode = UD_SEND_ONLY;
	h.b.pkey = kDefaultPkey;
	h.b.dqpn = kGsiQpn;
	h.b.psn = psn & 0xffffff;
	h.b.pad = 0; // 256 bytes: a multiple of 4
	h.d.qkey = kGsiQkey;
	h.d.sqpn = kGsiQpn;
	size_t n = build_headers(h, buf, kBthLen + kDethLen);
	memcpy(buf + n, mad, kMadLen);
	return n + kMadLen;
}

void put_cma_hdr(uint8_t *pdata, const cma_hdr &h)
{
	memset(pdata, 0, kCmaHdrLen);
	pdata[0] = 0; // rdma_cm's header version
	pdata[1] = static_cast<uint8_t>(h.ip_version << 4);
	put16(pdata + 2, h.src_port);
	if (h.ip_version == 4) {
		memcpy(pdata + 4 + 12, h.src, 4);
		memcpy(pdata + 20 + 12, h.dst, 4);
	} else {
		memcpy(pdata + 4, h.src, 16);
		memcpy(pdata + 20, h.dst, 16);
	}
}

bool get_cma_hdr(const uint8_t *pdata, cma_hdr &h)
{
	h = cma_hdr{};
	if (pdata[0] != 0)
		return false;
	h.ip_version = pdata[1] >> 4;
	h.src_port = get16(pdata + 2);
	if (h.ip_version == 4) {
		memcpy(h.src, pdata + 4 + 12, 4);
		memcpy(h.dst, pdata + 20 + 12, 4);
	} else if (h.ip_version == 6) {
		memcpy(h.src, pdata + 4, 16);
		memcpy(h.dst, pdata + 20, 16);
	} else {
		return false;
	}
	return true;
}

size_t gsi_socket_name(char *out, size_t cap, unsigned uid, uint16_t udp_port, bool by_service,
		       uint64_t key)
{
	int n = by_service ? snprintf(out, cap, "softverbs-gsi-%u-%u-s%016" PRIx64, uid, udp_port, key)
			   : snprintf(out, cap, "softverbs-gsi-%u-%u-c%08" PRIx32, uid, udp_port,
				      static_cast<uint32_t>(key));
	return n < 0 ? 0 : static_cast<size_t>(n) < cap ? static_cast<size_t>(n) : cap - 1;
}

} // namespace loop::rocev2::cm
