// SPDX-License-Identifier: MIT
// IB QP state machine checks for ibv_modify_qp().  See qp_state.h for the
// contract; the per-transition masks below are the kernel's (IBA 1.x chapter
// 11 "Modify Queue Pair" as Linux implements it), restated per QP type.
#include "qp_state.h"

#include <cerrno>
#include <cstdio>
#include <iterator>

namespace loop {

namespace {

// Short names for the ibv_qp_attr_mask bits, so that each rule fits on a
// line or two and can be compared against the spec by eye.
constexpr int kState = IBV_QP_STATE;
constexpr int kCur = IBV_QP_CUR_STATE;
constexpr int kSqdNotify = IBV_QP_EN_SQD_ASYNC_NOTIFY;
constexpr int kAccess = IBV_QP_ACCESS_FLAGS;
constexpr int kPkey = IBV_QP_PKEY_INDEX;
constexpr int kPort = IBV_QP_PORT;
constexpr int kQkey = IBV_QP_QKEY;
constexpr int kAv = IBV_QP_AV;
constexpr int kMtu = IBV_QP_PATH_MTU;
constexpr int kTimeout = IBV_QP_TIMEOUT;
constexpr int kRetry = IBV_QP_RETRY_CNT;
constexpr int kRnrRetry = IBV_QP_RNR_RETRY;
constexpr int kRqPsn = IBV_QP_RQ_PSN;
constexpr int kMaxQpRd = IBV_QP_MAX_QP_RD_ATOMIC;
constexpr int kAlt = IBV_QP_ALT_PATH;
constexpr int kMinRnr = IBV_QP_MIN_RNR_TIMER;
constexpr int kSqPsn = IBV_QP_SQ_PSN;
constexpr int kMaxDestRd = IBV_QP_MAX_DEST_RD_ATOMIC;
constexpr int kMig = IBV_QP_PATH_MIG_STATE;
constexpr int kDestQpn = IBV_QP_DEST_QPN;
constexpr int kRateLimit = IBV_QP_RATE_LIMIT;

// Recurring groups.  A connected QP may (re)load its alternate path and
// migration state and its remote access rights whenever it is sending.
constexpr int kPathOpts = kAlt | kAccess | kMig;
// What a responder needs before it can accept the first request packet.
constexpr int kRtrConnected = kAv | kMtu | kDestQpn | kRqPsn;
// What an RDMA read/atomic requester needs to start transmitting.
constexpr int kRtsRequester = kTimeout | kRetry | kRnrRetry | kSqPsn | kMaxQpRd;

// One legal transition for one QP type.  Transitions to RESET and to ERR are
// the same for every type and carry no attributes, so they are handled in
// find_rule() instead of being repeated here.
struct rule {
	ibv_qp_state from;
	ibv_qp_state to;
	ibv_qp_type type;
	int req; // Must be in attr_mask (besides IBV_QP_STATE)
	int opt; // May be in attr_mask
};

// XRC_SEND is the initiator half of an XRC connection (an RC requester
// without a receive queue) and XRC_RECV the target half (an RC responder
// without a send queue), so each carries only its half of the RC attributes
// that follow the transition where they are needed.  RAW_PACKET has no
// transport state at all: only the port matters.
constexpr rule rules[] = {
    // RESET -> INIT: bind to a port and P_Key; datagram QPs need their
    // Q_Key, connected ones the remote access rights they will grant.
    {IBV_QPS_RESET, IBV_QPS_INIT, IBV_QPT_RC, kPkey | kPort | kAccess, 0},
    {IBV_QPS_RESET, IBV_QPS_INIT, IBV_QPT_UC, kPkey | kPort | kAccess, 0},
    {IBV_QPS_RESET, IBV_QPS_INIT, IBV_QPT_UD, kPkey | kPort | kQkey, 0},
    {IBV_QPS_RESET, IBV_QPS_INIT, IBV_QPT_XRC_SEND, kPkey | kPort | kAccess, 0},
    {IBV_QPS_RESET, IBV_QPS_INIT, IBV_QPT_XRC_RECV, kPkey | kPort | kAccess, 0},
    {IBV_QPS_RESET, IBV_QPS_INIT, IBV_QPT_RAW_PACKET, kPort, 0},

    // INIT -> INIT: the RESET->INIT attributes may be changed again.
    {IBV_QPS_INIT, IBV_QPS_INIT, IBV_QPT_RC, 0, kPkey | kPort | kAccess},
    {IBV_QPS_INIT, IBV_QPS_INIT, IBV_QPT_UC, 0, kPkey | kPort | kAccess},
    {IBV_QPS_INIT, IBV_QPS_INIT, IBV_QPT_UD, 0, kPkey | kPort | kQkey},
    {IBV_QPS_INIT, IBV_QPS_INIT, IBV_QPT_XRC_SEND, 0, kPkey | kPort | kAccess},
    {IBV_QPS_INIT, IBV_QPS_INIT, IBV_QPT_XRC_RECV, 0, kPkey | kPort | kAccess},
    {IBV_QPS_INIT, IBV_QPS_INIT, IBV_QPT_RAW_PACKET, 0, 0},

    // INIT -> RTR: a connected QP learns its peer; a responder that
    // executes RDMA reads/atomics also needs their depth and the RNR
    // NAK timer.  UD needs nothing new.
    {IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPT_RC, kRtrConnected | kMaxDestRd | kMinRnr,
     kAlt | kAccess | kPkey},
    {IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPT_UC, kRtrConnected, kAlt | kAccess | kPkey},
    {IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPT_UD, 0, kPkey | kQkey},
    {IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPT_XRC_SEND, kRtrConnected, kAlt | kAccess | kPkey},
    {IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPT_XRC_RECV, kRtrConnected | kMaxDestRd | kMinRnr,
     kAlt | kAccess | kPkey},
    {IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPT_RAW_PACKET, 0, 0},

    // RTR -> RTS: the send side starts.  Every type numbers its packets;
    // an RC requester also needs its ack timeout, retry budgets and read
    // depth.  The XRC target keeps the timeout although it never sends
    // requests, because that is what the kernel asks of it.
    {IBV_QPS_RTR, IBV_QPS_RTS, IBV_QPT_RC, kRtsRequester, kCur | kPathOpts | kMinRnr},
    {IBV_QPS_RTR, IBV_QPS_RTS, IBV_QPT_UC, kSqPsn, kCur | kPathOpts},
    {IBV_QPS_RTR, IBV_QPS_RTS, IBV_QPT_UD, kSqPsn, kCur | kQkey},
    {IBV_QPS_RTR, IBV_QPS_RTS, IBV_QPT_XRC_SEND, kRtsRequester, kCur | kPathOpts},
    {IBV_QPS_RTR, IBV_QPS_RTS, IBV_QPT_XRC_RECV, kTimeout | kSqPsn, kCur | kPathOpts | kMinRnr},
    {IBV_QPS_RTR, IBV_QPS_RTS, IBV_QPT_RAW_PACKET, 0, kRateLimit},

    // RTS -> RTS: tune a live QP; path migration is driven from here.
    {IBV_QPS_RTS, IBV_QPS_RTS, IBV_QPT_RC, 0, kCur | kPathOpts | kMinRnr},
    {IBV_QPS_RTS, IBV_QPS_RTS, IBV_QPT_UC, 0, kCur | kPathOpts},
    {IBV_QPS_RTS, IBV_QPS_RTS, IBV_QPT_UD, 0, kCur | kQkey},
    {IBV_QPS_RTS, IBV_QPS_RTS, IBV_QPT_XRC_SEND, 0, kCur | kPathOpts},
    {IBV_QPS_RTS, IBV_QPS_RTS, IBV_QPT_XRC_RECV, 0, kCur | kPathOpts | kMinRnr},
    {IBV_QPS_RTS, IBV_QPS_RTS, IBV_QPT_RAW_PACKET, 0, kRateLimit},

    // RTS -> SQD: drain the send queue, optionally with an async event
    // once it is drained.
    {IBV_QPS_RTS, IBV_QPS_SQD, IBV_QPT_RC, 0, kSqdNotify},
    {IBV_QPS_RTS, IBV_QPS_SQD, IBV_QPT_UC, 0, kSqdNotify},
    {IBV_QPS_RTS, IBV_QPS_SQD, IBV_QPT_UD, 0, kSqdNotify},
    {IBV_QPS_RTS, IBV_QPS_SQD, IBV_QPT_XRC_SEND, 0, kSqdNotify},
    {IBV_QPS_RTS, IBV_QPS_SQD, IBV_QPT_XRC_RECV, 0, kSqdNotify},
    {IBV_QPS_RTS, IBV_QPS_SQD, IBV_QPT_RAW_PACKET, 0, 0},

    // SQD -> RTS: resume with what RTS -> RTS could change.
    {IBV_QPS_SQD, IBV_QPS_RTS, IBV_QPT_RC, 0, kCur | kPathOpts | kMinRnr},
    {IBV_QPS_SQD, IBV_QPS_RTS, IBV_QPT_UC, 0, kCur | kPathOpts},
    {IBV_QPS_SQD, IBV_QPS_RTS, IBV_QPT_UD, 0, kCur | kQkey},
    {IBV_QPS_SQD, IBV_QPS_RTS, IBV_QPT_XRC_SEND, 0, kCur | kPathOpts},
    {IBV_QPS_SQD, IBV_QPS_RTS, IBV_QPT_XRC_RECV, 0, kCur | kPathOpts | kMinRnr},
    {IBV_QPS_SQD, IBV_QPS_RTS, IBV_QPT_RAW_PACKET, 0, 0},

    // SQD -> SQD: with nothing in flight, the primary path (and for RC
    // the port and the transport parameters) may be changed; this is the
    // only place after RTR where they can be.
    {IBV_QPS_SQD, IBV_QPS_SQD, IBV_QPT_RC, 0,
     kPort | kAv | kTimeout | kRetry | kRnrRetry | kMaxQpRd | kMaxDestRd | kPathOpts | kPkey |
	 kMinRnr},
    {IBV_QPS_SQD, IBV_QPS_SQD, IBV_QPT_UC, 0, kAv | kPathOpts | kPkey},
    {IBV_QPS_SQD, IBV_QPS_SQD, IBV_QPT_UD, 0, kPkey | kQkey},
    {IBV_QPS_SQD, IBV_QPS_SQD, IBV_QPT_XRC_SEND, 0,
     kPort | kAv | kTimeout | kRetry | kRnrRetry | kMaxQpRd | kPathOpts | kPkey},
    {IBV_QPS_SQD, IBV_QPS_SQD, IBV_QPT_XRC_RECV, 0,
     kPort | kAv | kTimeout | kMaxDestRd | kPathOpts | kPkey | kMinRnr},
    {IBV_QPS_SQD, IBV_QPS_SQD, IBV_QPT_RAW_PACKET, 0, 0},

    // SQE -> RTS: only unreliable types park in SQE after a send error
    // (reliable ones go to ERR), and the consumer restarts them here.
    {IBV_QPS_SQE, IBV_QPS_RTS, IBV_QPT_UC, 0, kCur | kAccess},
    {IBV_QPS_SQE, IBV_QPS_RTS, IBV_QPT_UD, 0, kCur | kQkey},
    {IBV_QPS_SQE, IBV_QPS_RTS, IBV_QPT_RAW_PACKET, 0, 0},
};

bool type_supported(ibv_qp_type t)
{
	switch (t) {
	case IBV_QPT_RC:
	case IBV_QPT_UC:
	case IBV_QPT_UD:
	case IBV_QPT_RAW_PACKET:
	case IBV_QPT_XRC_SEND:
	case IBV_QPT_XRC_RECV:
		return true;
	default:
		return false;
	}
}

bool state_valid(ibv_qp_state s)
{
	return s >= IBV_QPS_RESET && s <= IBV_QPS_ERR;
}

// States a consumer may name in ibv_qp_attr::cur_qp_state.  The field exists
// because a live QP can change state behind the consumer's back (RTS->SQE on
// a send error, the SQD drain completing).  A QP in RESET or INIT cannot, and
// one in ERR only goes to RESET or ERR, which take no attributes at all.
bool cur_state_nameable(ibv_qp_state s)
{
	return s == IBV_QPS_RTR || s == IBV_QPS_RTS || s == IBV_QPS_SQD || s == IBV_QPS_SQE;
}

bool find_rule(ibv_qp_type type, ibv_qp_state from, ibv_qp_state to, int *req, int *opt)
{
	*req = 0;
	*opt = 0;

	// Reset discards everything, from anywhere.  Error flushes work
	// requests, which a QP in RESET does not have yet.
	if (to == IBV_QPS_RESET)
		return true;
	if (to == IBV_QPS_ERR)
		return from != IBV_QPS_RESET;

	for (const rule &r : rules) {
		if (r.from == from && r.to == to && r.type == type) {
			*req = r.req;
			*opt = r.opt;
			return true;
		}
	}
	return false;
}

void put(int *out, int v)
{
	if (out)
		*out = v;
}

// Indexed by bit number; gaps are bits rdma-core 44 does not expose.
constexpr const char *mask_bit_names[] = {
    "IBV_QP_STATE",
    "IBV_QP_CUR_STATE",
    "IBV_QP_EN_SQD_ASYNC_NOTIFY",
    "IBV_QP_ACCESS_FLAGS",
    "IBV_QP_PKEY_INDEX",
    "IBV_QP_PORT",
    "IBV_QP_QKEY",
    "IBV_QP_AV",
    "IBV_QP_PATH_MTU",
    "IBV_QP_TIMEOUT",
    "IBV_QP_RETRY_CNT",
    "IBV_QP_RNR_RETRY",
    "IBV_QP_RQ_PSN",
    "IBV_QP_MAX_QP_RD_ATOMIC",
    "IBV_QP_ALT_PATH",
    "IBV_QP_MIN_RNR_TIMER",
    "IBV_QP_SQ_PSN",
    "IBV_QP_MAX_DEST_RD_ATOMIC",
    "IBV_QP_PATH_MIG_STATE",
    "IBV_QP_CAP",
    "IBV_QP_DEST_QPN",
    nullptr,
    nullptr,
    nullptr,
    nullptr,
    "IBV_QP_RATE_LIMIT",
};

static_assert(IBV_QP_DEST_QPN == 1 << 20 && IBV_QP_RATE_LIMIT == 1 << 25,
	      "mask_bit_names[] must follow the ibv_qp_attr_mask bit numbers");

} // namespace

int qp_modify_check(ibv_qp_type qp_type, ibv_qp_state cur, ibv_qp_state next, int attr_mask,
		    ibv_qp_state attr_cur_state, int *missing, int *extra)
{
	int req, opt;
	int absent, foreign;

	put(missing, 0);
	put(extra, 0);

	if (!type_supported(qp_type) || !state_valid(cur) || !state_valid(next))
		return EINVAL;
	if (!find_rule(qp_type, cur, next, &req, &opt))
		return EINVAL;

	// Without IBV_QP_STATE the modify keeps the current state, so asking
	// for a different one that way is a missing-bit error.
	if (next != cur)
		req |= kState;
	opt |= kState;

	absent = req & ~attr_mask;
	foreign = attr_mask & ~(req | opt);

	// The table only offers IBV_QP_CUR_STATE where naming it is legal;
	// the explicit checks keep that true if an entry is ever mistyped, and
	// catch a consumer whose idea of the state is stale.
	if ((attr_mask & kCur) && (!cur_state_nameable(cur) || attr_cur_state != cur))
		foreign |= kCur;

	put(missing, absent);
	put(extra, foreign);
	return (absent || foreign) ? EINVAL : 0;
}

int qp_modify_check(ibv_qp_type qp_type, ibv_qp_state cur, ibv_qp_state next, int attr_mask,
		    int *missing, int *extra)
{
	// No separate value to compare against: IBV_QP_CUR_STATE is taken to
	// name cur, leaving only the "may it be named here" rules to apply.
	return qp_modify_check(qp_type, cur, next, attr_mask, cur, missing, extra);
}

const char *qp_state_name(ibv_qp_state s)
{
	switch (s) {
	case IBV_QPS_RESET:
		return "RESET";
	case IBV_QPS_INIT:
		return "INIT";
	case IBV_QPS_RTR:
		return "RTR";
	case IBV_QPS_RTS:
		return "RTS";
	case IBV_QPS_SQD:
		return "SQD";
	case IBV_QPS_SQE:
		return "SQE";
	case IBV_QPS_ERR:
		return "ERR";
	case IBV_QPS_UNKNOWN:
		return "UNKNOWN";
	}
	return "INVALID";
}

std::string qp_mask_names(int mask)
{
	unsigned int bits = static_cast<unsigned int>(mask);
	unsigned int unnamed = 0;
	std::string out;

	if (!bits)
		return "0";

	for (unsigned int i = 0; i < 32; i++) {
		unsigned int bit = 1u << i;
		const char *name = nullptr;

		if (!(bits & bit))
			continue;
		if (i < std::size(mask_bit_names))
			name = mask_bit_names[i];
		if (!name) {
			unnamed |= bit;
			continue;
		}
		if (!out.empty())
			out += '|';
		out += name;
	}

	if (unnamed) {
		char hex[16];

		std::snprintf(hex, sizeof(hex), "0x%x", unnamed);
		if (!out.empty())
			out += '|';
		out += hex;
	}
	return out;
}

} // namespace loop
