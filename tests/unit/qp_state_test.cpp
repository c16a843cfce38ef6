// SPDX-License-Identifier: MIT
// Unit tests for the loop provider's QP state machine (providers/loop/verbs/
// qp_state.{h,cpp}).  The expected masks are transcribed here a second time,
// per QP type rather than per transition, straight from the kernel's
// qp_state_table; the sweeps then compare every (type, from, to, bit)
// combination, so a single wrong bit in either copy fails a test.  The
// hand-written cases further down pin the best-known transitions (the ones
// every verbs application issues) independently of both tables.
#include "providers/loop/verbs/qp_state.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <initializer_list>
#include <string>

using loop::qp_mask_names;
using loop::qp_modify_check;
using loop::qp_state_name;

namespace {

constexpr int STATE = IBV_QP_STATE;
constexpr int CUR = IBV_QP_CUR_STATE;
constexpr int SQD_NOTIFY = IBV_QP_EN_SQD_ASYNC_NOTIFY;
constexpr int ACCESS = IBV_QP_ACCESS_FLAGS;
constexpr int PKEY = IBV_QP_PKEY_INDEX;
constexpr int PORT = IBV_QP_PORT;
constexpr int QKEY = IBV_QP_QKEY;
constexpr int AV = IBV_QP_AV;
constexpr int MTU = IBV_QP_PATH_MTU;
constexpr int TIMEOUT = IBV_QP_TIMEOUT;
constexpr int RETRY = IBV_QP_RETRY_CNT;
constexpr int RNR_RETRY = IBV_QP_RNR_RETRY;
constexpr int RQ_PSN = IBV_QP_RQ_PSN;
constexpr int MAX_QP_RD = IBV_QP_MAX_QP_RD_ATOMIC;
constexpr int ALT = IBV_QP_ALT_PATH;
constexpr int MIN_RNR = IBV_QP_MIN_RNR_TIMER;
constexpr int SQ_PSN = IBV_QP_SQ_PSN;
constexpr int MAX_DEST_RD = IBV_QP_MAX_DEST_RD_ATOMIC;
constexpr int MIG = IBV_QP_PATH_MIG_STATE;
constexpr int CAP = IBV_QP_CAP;
constexpr int DEST_QPN = IBV_QP_DEST_QPN;
constexpr int RATE_LIMIT = IBV_QP_RATE_LIMIT;

constexpr ibv_qp_type kTypes[] = {IBV_QPT_RC,	    IBV_QPT_UC,	      IBV_QPT_UD,
				  IBV_QPT_XRC_SEND, IBV_QPT_XRC_RECV, IBV_QPT_RAW_PACKET};
constexpr ibv_qp_state kStates[] = {IBV_QPS_RESET, IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS,
				    IBV_QPS_SQD,   IBV_QPS_SQE,	 IBV_QPS_ERR};

struct expectation {
	bool legal;
	int req; // Without IBV_QP_STATE
	int opt;
};

constexpr expectation illegal{false, 0, 0};

expectation ok(int req, int opt)
{
	return {true, req, opt};
}

// RC and XRC_RECV share RESET->INIT, INIT->RTR and the optional sets from
// RTR on; XRC_SEND differs from RC only in dropping the responder's bits.
expectation expect_rc_family(ibv_qp_type t, ibv_qp_state from, ibv_qp_state to)
{
	const bool rc = t == IBV_QPT_RC;
	const bool send = t == IBV_QPT_XRC_SEND;
	const bool recv = t == IBV_QPT_XRC_RECV;
	// RC and XRC_RECV may touch the RNR timer once running; XRC_SEND not.
	const int live = CUR | ACCESS | ALT | MIG | ((rc || recv) ? MIN_RNR : 0);

	if (from == IBV_QPS_RESET && to == IBV_QPS_INIT)
		return ok(PKEY | PORT | ACCESS, 0);
	if (from == IBV_QPS_INIT && to == IBV_QPS_INIT)
		return ok(0, PKEY | PORT | ACCESS);
	if (from == IBV_QPS_INIT && to == IBV_QPS_RTR)
		return ok(AV | MTU | DEST_QPN | RQ_PSN | (send ? 0 : MAX_DEST_RD | MIN_RNR),
			  ALT | ACCESS | PKEY);
	if (from == IBV_QPS_RTR && to == IBV_QPS_RTS)
		return ok(recv ? TIMEOUT | SQ_PSN
			       : TIMEOUT | RETRY | RNR_RETRY | SQ_PSN | MAX_QP_RD,
			  live);
	if (from == IBV_QPS_RTS && to == IBV_QPS_RTS)
		return ok(0, live);
	if (from == IBV_QPS_RTS && to == IBV_QPS_SQD)
		return ok(0, SQD_NOTIFY);
	if (from == IBV_QPS_SQD && to == IBV_QPS_RTS)
		return ok(0, live);
	if (from == IBV_QPS_SQD && to == IBV_QPS_SQD) {
		int o = PORT | AV | TIMEOUT | ALT | ACCESS | PKEY | MIG;

		if (!recv)
			o |= RETRY | RNR_RETRY | MAX_QP_RD;
		if (!send)
			o |= MAX_DEST_RD | MIN_RNR;
		return ok(0, o);
	}
	return illegal;
}

expectation expect_uc(ibv_qp_state from, ibv_qp_state to)
{
	if (from == IBV_QPS_RESET && to == IBV_QPS_INIT)
		return ok(PKEY | PORT | ACCESS, 0);
	if (from == IBV_QPS_INIT && to == IBV_QPS_INIT)
		return ok(0, PKEY | PORT | ACCESS);
	if (from == IBV_QPS_INIT && to == IBV_QPS_RTR)
		return ok(AV | MTU | DEST_QPN | RQ_PSN, ALT | ACCESS | PKEY);
	if (from == IBV_QPS_RTR && to == IBV_QPS_RTS)
		return ok(SQ_PSN, CUR | ALT | ACCESS | MIG);
	if (from == IBV_QPS_RTS && to == IBV_QPS_RTS)
		return ok(0, CUR | ALT | ACCESS | MIG);
	if (from == IBV_QPS_RTS && to == IBV_QPS_SQD)
		return ok(0, SQD_NOTIFY);
	if (from == IBV_QPS_SQD && to == IBV_QPS_RTS)
		return ok(0, CUR | ALT | ACCESS | MIG);
	if (from == IBV_QPS_SQD && to == IBV_QPS_SQD)
		return ok(0, AV | ALT | ACCESS | PKEY | MIG);
	if (from == IBV_QPS_SQE && to == IBV_QPS_RTS)
		return ok(0, CUR | ACCESS);
	return illegal;
}

expectation expect_ud(ibv_qp_state from, ibv_qp_state to)
{
	if (from == IBV_QPS_RESET && to == IBV_QPS_INIT)
		return ok(PKEY | PORT | QKEY, 0);
	if (from == IBV_QPS_INIT && to == IBV_QPS_INIT)
		return ok(0, PKEY | PORT | QKEY);
	if (from == IBV_QPS_INIT && to == IBV_QPS_RTR)
		return ok(0, PKEY | QKEY);
	if (from == IBV_QPS_RTR && to == IBV_QPS_RTS)
		return ok(SQ_PSN, CUR | QKEY);
	if ((from == IBV_QPS_RTS || from == IBV_QPS_SQD || from == IBV_QPS_SQE) &&
	    to == IBV_QPS_RTS)
		return ok(0, CUR | QKEY);
	if (from == IBV_QPS_RTS && to == IBV_QPS_SQD)
		return ok(0, SQD_NOTIFY);
	if (from == IBV_QPS_SQD && to == IBV_QPS_SQD)
		return ok(0, PKEY | QKEY);
	return illegal;
}

expectation expect_raw(ibv_qp_state from, ibv_qp_state to)
{
	if (from == IBV_QPS_RESET && to == IBV_QPS_INIT)
		return ok(PORT, 0);
	if ((from == IBV_QPS_RTR || from == IBV_QPS_RTS) && to == IBV_QPS_RTS)
		return ok(0, RATE_LIMIT);
	if ((from == IBV_QPS_INIT && (to == IBV_QPS_INIT || to == IBV_QPS_RTR)) ||
	    (from == IBV_QPS_RTS && to == IBV_QPS_SQD) ||
	    (from == IBV_QPS_SQD && (to == IBV_QPS_RTS || to == IBV_QPS_SQD)) ||
	    (from == IBV_QPS_SQE && to == IBV_QPS_RTS))
		return ok(0, 0);
	return illegal;
}

expectation expected(ibv_qp_type t, ibv_qp_state from, ibv_qp_state to)
{
	// Common to all types: RESET from anywhere, ERR from anywhere but
	// RESET (the kernel has no RESET->ERR), never with attributes.
	if (to == IBV_QPS_RESET)
		return ok(0, 0);
	if (to == IBV_QPS_ERR)
		return from == IBV_QPS_RESET ? illegal : ok(0, 0);

	switch (t) {
	case IBV_QPT_UC:
		return expect_uc(from, to);
	case IBV_QPT_UD:
		return expect_ud(from, to);
	case IBV_QPT_RAW_PACKET:
		return expect_raw(from, to);
	default:
		return expect_rc_family(t, from, to);
	}
}

// Runs the 6-argument check and hands back the reported masks, which are
// pre-set to garbage so a forgotten store shows up.
struct result {
	int rc;
	int missing;
	int extra;
};

result check(ibv_qp_type t, ibv_qp_state from, ibv_qp_state to, int mask)
{
	result r{-1, 0x5a5a5a5a, 0x5a5a5a5a};

	r.rc = qp_modify_check(t, from, to, mask, &r.missing, &r.extra);
	return r;
}

result check_cur(ibv_qp_type t, ibv_qp_state from, ibv_qp_state to, int mask, ibv_qp_state named)
{
	result r{-1, 0x5a5a5a5a, 0x5a5a5a5a};

	r.rc = qp_modify_check(t, from, to, mask, named, &r.missing, &r.extra);
	return r;
}

std::string where(ibv_qp_type t, ibv_qp_state from, ibv_qp_state to, int mask)
{
	return "type " + std::to_string(t) + " " + qp_state_name(from) + "->" + qp_state_name(to) +
	       " mask " + qp_mask_names(mask);
}

#define EXPECT_PASS(r, ctx)                                                                        \
	do {                                                                                       \
		EXPECT_EQ((r).rc, 0) << (ctx);                                                     \
		EXPECT_EQ((r).missing, 0) << (ctx);                                                \
		EXPECT_EQ((r).extra, 0) << (ctx);                                                  \
	} while (0)

#define EXPECT_FAIL(r, miss, ext, ctx)                                                             \
	do {                                                                                       \
		EXPECT_EQ((r).rc, EINVAL) << (ctx);                                                \
		EXPECT_EQ((r).missing, (miss))                                                     \
		    << (ctx) << " missing " << qp_mask_names((r).missing);                         \
		EXPECT_EQ((r).extra, (ext)) << (ctx) << " extra " << qp_mask_names((r).extra);     \
	} while (0)

// Sweeps: every type x from x to, against the table above.

TEST(QpStateSweep, ExactlyRequiredMaskPasses)
{
	int legal = 0;

	for (auto t : kTypes)
		for (auto from : kStates)
			for (auto to : kStates) {
				expectation e = expected(t, from, to);
				int mask = STATE | e.req;

				if (!e.legal)
					continue;
				legal++;
				EXPECT_PASS(check(t, from, to, mask), where(t, from, to, mask));
			}
	// 6 types x (7 to-RESET + 6 to-ERR) + 9 RC-family/UC/UD/RAW edges
	// each, less SQE->RTS for RC and the two XRC types.
	EXPECT_EQ(legal, 6 * 13 + 6 * 9 - 3);
}

TEST(QpStateSweep, RequiredPlusAllOptionalPasses)
{
	for (auto t : kTypes)
		for (auto from : kStates)
			for (auto to : kStates) {
				expectation e = expected(t, from, to);
				int mask = STATE | e.req | e.opt;

				if (e.legal)
					EXPECT_PASS(check(t, from, to, mask),
						    where(t, from, to, mask));
			}
}

TEST(QpStateSweep, EachOptionalBitAloneIsAccepted)
{
	for (auto t : kTypes)
		for (auto from : kStates)
			for (auto to : kStates) {
				expectation e = expected(t, from, to);

				if (!e.legal)
					continue;
				for (int bit = 1; bit; bit <<= 1) {
					int mask = STATE | e.req | bit;

					if (e.opt & bit)
						EXPECT_PASS(check(t, from, to, mask),
							    where(t, from, to, mask));
				}
			}
}

TEST(QpStateSweep, EachRequiredBitRemovedIsReportedMissing)
{
	int probes = 0;

	for (auto t : kTypes)
		for (auto from : kStates)
			for (auto to : kStates) {
				expectation e = expected(t, from, to);

				if (!e.legal)
					continue;
				for (int bit = 1; bit; bit <<= 1) {
					int mask = (STATE | e.req | e.opt) & ~bit;

					if (!(e.req & bit))
						continue;
					probes++;
					EXPECT_FAIL(check(t, from, to, mask), bit, 0,
						    where(t, from, to, mask));
				}
			}
	// 16 at RESET->INIT, 20 at INIT->RTR, 14 at RTR->RTS.
	EXPECT_EQ(probes, 50);
}

TEST(QpStateSweep, EachForeignBitIsReportedExtra)
{
	for (auto t : kTypes)
		for (auto from : kStates)
			for (auto to : kStates) {
				expectation e = expected(t, from, to);

				if (!e.legal)
					continue;
				// All 32 bits, including ones libibverbs does not
				// define, so that unknown bits are refused too.
				for (unsigned int i = 0; i < 32; i++) {
					int bit = static_cast<int>(1u << i);
					int mask = STATE | e.req | bit;

					if ((STATE | e.req | e.opt) & bit)
						continue;
					EXPECT_FAIL(check(t, from, to, mask), 0, bit,
						    where(t, from, to, mask));
				}
			}
}

TEST(QpStateSweep, IllegalTransitionsFailWithAnyMask)
{
	int illegal_pairs = 0;

	for (auto t : kTypes)
		for (auto from : kStates)
			for (auto to : kStates) {
				if (expected(t, from, to).legal)
					continue;
				illegal_pairs++;
				// Bare, and with every bit: neither may help.
				EXPECT_FAIL(check(t, from, to, STATE), 0, 0,
					    where(t, from, to, STATE));
				EXPECT_FAIL(check(t, from, to, -1), 0, 0, where(t, from, to, -1));
			}
	EXPECT_EQ(illegal_pairs, 6 * 49 - (6 * 13 + 6 * 9 - 3));
}

TEST(QpStateSweep, MissingAndExtraAreReportedTogether)
{
	for (auto t : kTypes)
		for (auto from : kStates)
			for (auto to : kStates) {
				expectation e = expected(t, from, to);

				if (!e.legal || !e.req)
					continue;
				// Drop the lowest required bit, add CAP, which no
				// transition accepts.
				int drop = e.req & -e.req;
				int mask = (STATE | e.req | CAP) & ~drop;

				EXPECT_FAIL(check(t, from, to, mask), drop, CAP,
					    where(t, from, to, mask));
			}
}

// Hand-written cases: the masks applications really use.

TEST(QpStateRc, PingpongSequence)
{
	// The rc_pingpong / perftest sequence.
	EXPECT_PASS(check(IBV_QPT_RC, IBV_QPS_RESET, IBV_QPS_INIT,
			  IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS),
		    "rc init");
	EXPECT_PASS(check(IBV_QPT_RC, IBV_QPS_INIT, IBV_QPS_RTR,
			  IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
			      IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER),
		    "rc rtr");
	EXPECT_PASS(check(IBV_QPT_RC, IBV_QPS_RTR, IBV_QPS_RTS,
			  IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
			      IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC),
		    "rc rts");
}

TEST(QpStateRc, CommonMistakes)
{
	// Q_Key belongs to datagram QPs.
	EXPECT_FAIL(
	    check(IBV_QPT_RC, IBV_QPS_RESET, IBV_QPS_INIT, STATE | PKEY | PORT | ACCESS | QKEY), 0,
	    QKEY, "rc init + qkey");
	// Forgetting the RNR timer on the way to RTR.
	EXPECT_FAIL(check(IBV_QPT_RC, IBV_QPS_INIT, IBV_QPS_RTR,
			  STATE | AV | MTU | DEST_QPN | RQ_PSN | MAX_DEST_RD),
		    MIN_RNR, 0, "rc rtr - min_rnr");
	// SQ PSN belongs to RTR->RTS, RQ PSN to INIT->RTR.
	EXPECT_FAIL(check(IBV_QPT_RC, IBV_QPS_INIT, IBV_QPS_RTR,
			  STATE | AV | MTU | DEST_QPN | RQ_PSN | MAX_DEST_RD | MIN_RNR | SQ_PSN),
		    0, SQ_PSN, "rc rtr + sq_psn");
	EXPECT_FAIL(check(IBV_QPT_RC, IBV_QPS_RTR, IBV_QPS_RTS,
			  STATE | TIMEOUT | RETRY | RNR_RETRY | SQ_PSN | MAX_QP_RD | RQ_PSN),
		    0, RQ_PSN, "rc rts + rq_psn");
	// The path MTU cannot change once the QP is live.
	EXPECT_FAIL(check(IBV_QPT_RC, IBV_QPS_RTS, IBV_QPS_RTS, STATE | MTU), 0, MTU, "rts mtu");
	// Resizing a QP through modify is not supported.
	EXPECT_FAIL(check(IBV_QPT_RC, IBV_QPS_INIT, IBV_QPS_INIT, STATE | CAP), 0, CAP, "cap");
}

TEST(QpStateUc, Sequence)
{
	EXPECT_PASS(check(IBV_QPT_UC, IBV_QPS_RESET, IBV_QPS_INIT, STATE | PKEY | PORT | ACCESS),
		    "uc init");
	EXPECT_PASS(
	    check(IBV_QPT_UC, IBV_QPS_INIT, IBV_QPS_RTR, STATE | AV | MTU | DEST_QPN | RQ_PSN),
	    "uc rtr");
	// UC has no RDMA reads or atomics, so no read depth or RNR timer.
	EXPECT_FAIL(check(IBV_QPT_UC, IBV_QPS_INIT, IBV_QPS_RTR,
			  STATE | AV | MTU | DEST_QPN | RQ_PSN | MAX_DEST_RD | MIN_RNR),
		    0, MAX_DEST_RD | MIN_RNR, "uc rtr + rc bits");
	EXPECT_PASS(check(IBV_QPT_UC, IBV_QPS_RTR, IBV_QPS_RTS, STATE | SQ_PSN), "uc rts");
	EXPECT_FAIL(check(IBV_QPT_UC, IBV_QPS_RTR, IBV_QPS_RTS, STATE | SQ_PSN | TIMEOUT), 0,
		    TIMEOUT, "uc rts + timeout");
}

TEST(QpStateUd, Sequence)
{
	EXPECT_PASS(check(IBV_QPT_UD, IBV_QPS_RESET, IBV_QPS_INIT, STATE | PKEY | PORT | QKEY),
		    "ud init");
	EXPECT_FAIL(check(IBV_QPT_UD, IBV_QPS_RESET, IBV_QPS_INIT, STATE | PKEY | PORT | ACCESS),
		    QKEY, ACCESS, "ud init with access flags instead of qkey");
	// UD has no peer: RTR needs nothing, and an address is an error.
	EXPECT_PASS(check(IBV_QPT_UD, IBV_QPS_INIT, IBV_QPS_RTR, STATE), "ud rtr");
	EXPECT_FAIL(check(IBV_QPT_UD, IBV_QPS_INIT, IBV_QPS_RTR, STATE | AV), 0, AV, "ud rtr+av");
	EXPECT_PASS(check(IBV_QPT_UD, IBV_QPS_RTR, IBV_QPS_RTS, STATE | SQ_PSN), "ud rts");
	EXPECT_FAIL(check(IBV_QPT_UD, IBV_QPS_RTR, IBV_QPS_RTS, STATE), SQ_PSN, 0, "ud rts");
}

TEST(QpStateXrc, SendSideIsARequester)
{
	// Per the kernel, XRC_SEND needs access flags at RESET->INIT like RC.
	EXPECT_PASS(
	    check(IBV_QPT_XRC_SEND, IBV_QPS_RESET, IBV_QPS_INIT, STATE | PKEY | PORT | ACCESS),
	    "xrc send init");
	EXPECT_FAIL(check(IBV_QPT_XRC_SEND, IBV_QPS_RESET, IBV_QPS_INIT, STATE | PKEY | PORT),
		    ACCESS, 0, "xrc send init w/o access");
	// No receive queue, so no responder resources.
	EXPECT_PASS(check(IBV_QPT_XRC_SEND, IBV_QPS_INIT, IBV_QPS_RTR,
			  STATE | AV | MTU | DEST_QPN | RQ_PSN),
		    "xrc send rtr");
	EXPECT_FAIL(check(IBV_QPT_XRC_SEND, IBV_QPS_INIT, IBV_QPS_RTR,
			  STATE | AV | MTU | DEST_QPN | RQ_PSN | MAX_DEST_RD),
		    0, MAX_DEST_RD, "xrc send rtr + dest rd");
	EXPECT_PASS(check(IBV_QPT_XRC_SEND, IBV_QPS_RTR, IBV_QPS_RTS,
			  STATE | TIMEOUT | RETRY | RNR_RETRY | SQ_PSN | MAX_QP_RD),
		    "xrc send rts");
	EXPECT_FAIL(check(IBV_QPT_XRC_SEND, IBV_QPS_RTS, IBV_QPS_RTS, STATE | MIN_RNR), 0, MIN_RNR,
		    "xrc send rts min_rnr");
}

TEST(QpStateXrc, RecvSideIsAResponder)
{
	EXPECT_PASS(
	    check(IBV_QPT_XRC_RECV, IBV_QPS_RESET, IBV_QPS_INIT, STATE | PKEY | PORT | ACCESS),
	    "xrc recv init");
	EXPECT_PASS(check(IBV_QPT_XRC_RECV, IBV_QPS_INIT, IBV_QPS_RTR,
			  STATE | AV | MTU | DEST_QPN | RQ_PSN | MAX_DEST_RD | MIN_RNR),
		    "xrc recv rtr");
	// RTR->RTS asks for the timeout and SQ PSN only.
	EXPECT_PASS(check(IBV_QPT_XRC_RECV, IBV_QPS_RTR, IBV_QPS_RTS, STATE | TIMEOUT | SQ_PSN),
		    "xrc recv rts");
	EXPECT_FAIL(check(IBV_QPT_XRC_RECV, IBV_QPS_RTR, IBV_QPS_RTS, STATE | SQ_PSN), TIMEOUT, 0,
		    "xrc recv rts w/o timeout");
	EXPECT_FAIL(check(IBV_QPT_XRC_RECV, IBV_QPS_RTR, IBV_QPS_RTS,
			  STATE | TIMEOUT | SQ_PSN | RETRY | MAX_QP_RD),
		    0, RETRY | MAX_QP_RD, "xrc recv rts + requester bits");
}

TEST(QpStateRaw, PortOnly)
{
	EXPECT_PASS(check(IBV_QPT_RAW_PACKET, IBV_QPS_RESET, IBV_QPS_INIT, STATE | PORT),
		    "raw init");
	EXPECT_FAIL(check(IBV_QPT_RAW_PACKET, IBV_QPS_RESET, IBV_QPS_INIT, STATE | PORT | QKEY), 0,
		    QKEY, "raw init + qkey");
	EXPECT_PASS(check(IBV_QPT_RAW_PACKET, IBV_QPS_RTR, IBV_QPS_RTS, STATE | RATE_LIMIT),
		    "raw rts rate limit");
	// Rate limiting is a raw packet feature only.
	EXPECT_FAIL(check(IBV_QPT_UD, IBV_QPS_RTS, IBV_QPS_RTS, STATE | RATE_LIMIT), 0, RATE_LIMIT,
		    "ud rate limit");
}

// Transition structure.

TEST(QpStateGraph, NamedIllegalTransitions)
{
	struct {
		ibv_qp_state from, to;
	} const cases[] = {
	    {IBV_QPS_RESET, IBV_QPS_RTR}, {IBV_QPS_RESET, IBV_QPS_RTS},
	    {IBV_QPS_RESET, IBV_QPS_SQD}, {IBV_QPS_INIT, IBV_QPS_RTS},
	    {IBV_QPS_INIT, IBV_QPS_SQD},  {IBV_QPS_RTR, IBV_QPS_RTR},
	    {IBV_QPS_RTR, IBV_QPS_INIT},  {IBV_QPS_RTR, IBV_QPS_SQD},
	    {IBV_QPS_RTS, IBV_QPS_RTR},	  {IBV_QPS_RTS, IBV_QPS_INIT},
	    {IBV_QPS_SQD, IBV_QPS_INIT},  {IBV_QPS_SQE, IBV_QPS_SQD},
	    {IBV_QPS_SQE, IBV_QPS_SQE},	  {IBV_QPS_ERR, IBV_QPS_INIT},
	    {IBV_QPS_ERR, IBV_QPS_RTS},	  {IBV_QPS_RTS, IBV_QPS_SQE},
	};

	for (auto t : kTypes)
		for (const auto &c : cases)
			for (int mask : {STATE, STATE | PKEY | PORT | ACCESS | QKEY,
					 STATE | AV | MTU | DEST_QPN | RQ_PSN | MAX_DEST_RD |
					     MIN_RNR | SQ_PSN})
				EXPECT_FAIL(check(t, c.from, c.to, mask), 0, 0,
					    where(t, c.from, c.to, mask));
}

TEST(QpStateGraph, ToResetFromEveryStateNeedsOnlyState)
{
	for (auto t : kTypes)
		for (auto from : kStates) {
			EXPECT_PASS(check(t, from, IBV_QPS_RESET, STATE),
				    where(t, from, IBV_QPS_RESET, STATE));
			// Reset takes no attributes, not even ones the next
			// RESET->INIT will want.
			EXPECT_FAIL(check(t, from, IBV_QPS_RESET, STATE | PORT), 0, PORT,
				    where(t, from, IBV_QPS_RESET, STATE | PORT));
		}
}

TEST(QpStateGraph, ToErrFromEveryLiveStateNeedsOnlyState)
{
	for (auto t : kTypes)
		for (auto from : kStates) {
			if (from == IBV_QPS_RESET)
				continue;
			EXPECT_PASS(check(t, from, IBV_QPS_ERR, STATE),
				    where(t, from, IBV_QPS_ERR, STATE));
			EXPECT_FAIL(check(t, from, IBV_QPS_ERR, STATE | QKEY), 0, QKEY,
				    where(t, from, IBV_QPS_ERR, STATE | QKEY));
		}
}

TEST(QpStateGraph, ResetToErrIsRejectedAsByTheKernel)
{
	// qp_state_table has no RESET->ERR entry: nothing to flush yet.
	for (auto t : kTypes)
		EXPECT_FAIL(check(t, IBV_QPS_RESET, IBV_QPS_ERR, STATE), 0, 0,
			    where(t, IBV_QPS_RESET, IBV_QPS_ERR, STATE));
}

TEST(QpStateGraph, SqeRecoveryOnlyForUnreliableTypes)
{
	EXPECT_PASS(check(IBV_QPT_UC, IBV_QPS_SQE, IBV_QPS_RTS, STATE | ACCESS), "uc");
	EXPECT_PASS(check(IBV_QPT_UD, IBV_QPS_SQE, IBV_QPS_RTS, STATE | QKEY), "ud");
	EXPECT_FAIL(check(IBV_QPT_UC, IBV_QPS_SQE, IBV_QPS_RTS, STATE | ALT), 0, ALT, "uc alt");
	for (auto t : {IBV_QPT_RC, IBV_QPT_XRC_SEND, IBV_QPT_XRC_RECV})
		EXPECT_FAIL(check(t, IBV_QPS_SQE, IBV_QPS_RTS, STATE), 0, 0,
			    where(t, IBV_QPS_SQE, IBV_QPS_RTS, STATE));
}

TEST(QpStateGraph, SqdDrainAndResume)
{
	EXPECT_PASS(check(IBV_QPT_RC, IBV_QPS_RTS, IBV_QPS_SQD, STATE | SQD_NOTIFY), "notify");
	EXPECT_PASS(check(IBV_QPT_RC, IBV_QPS_SQD, IBV_QPS_SQD, STATE | AV | PORT | TIMEOUT),
		    "repath");
	EXPECT_FAIL(check(IBV_QPT_RC, IBV_QPS_SQD, IBV_QPS_SQD, STATE | MTU), 0, MTU, "sqd mtu");
	EXPECT_FAIL(check(IBV_QPT_UD, IBV_QPS_SQD, IBV_QPS_SQD, STATE | PORT), 0, PORT,
		    "ud sqd port");
	EXPECT_PASS(check(IBV_QPT_RC, IBV_QPS_SQD, IBV_QPS_RTS, STATE | MIN_RNR), "resume");
	EXPECT_FAIL(check(IBV_QPT_RC, IBV_QPS_SQD, IBV_QPS_RTS, STATE | SQD_NOTIFY), 0, SQD_NOTIFY,
		    "resume + notify");
}

// Modify without a state change.

TEST(QpStateNoStateBit, AllowedWhereASelfTransitionExists)
{
	EXPECT_PASS(check(IBV_QPT_RC, IBV_QPS_INIT, IBV_QPS_INIT, ACCESS), "init access");
	EXPECT_PASS(check(IBV_QPT_UD, IBV_QPS_INIT, IBV_QPS_INIT, QKEY), "ud init qkey");
	EXPECT_PASS(check(IBV_QPT_RC, IBV_QPS_RTS, IBV_QPS_RTS, ALT | MIG), "rts apm");
	EXPECT_PASS(check(IBV_QPT_UC, IBV_QPS_SQD, IBV_QPS_SQD, AV), "sqd av");
	EXPECT_PASS(check(IBV_QPT_RC, IBV_QPS_RESET, IBV_QPS_RESET, 0), "reset nop");
	EXPECT_PASS(check(IBV_QPT_RC, IBV_QPS_ERR, IBV_QPS_ERR, 0), "err nop");
	// Still bound by the self-transition's optional set.
	EXPECT_FAIL(check(IBV_QPT_RC, IBV_QPS_RTS, IBV_QPS_RTS, ALT | TIMEOUT), 0, TIMEOUT,
		    "rts timeout");
}

TEST(QpStateNoStateBit, RejectedWhereNoSelfTransitionExists)
{
	for (auto t : kTypes) {
		EXPECT_FAIL(check(t, IBV_QPS_RTR, IBV_QPS_RTR, 0), 0, 0, "rtr");
		EXPECT_FAIL(check(t, IBV_QPS_SQE, IBV_QPS_SQE, 0), 0, 0, "sqe");
	}
}

TEST(QpStateNoStateBit, StateChangeWithoutStateBitIsMissingState)
{
	EXPECT_FAIL(check(IBV_QPT_RC, IBV_QPS_RESET, IBV_QPS_INIT, PKEY | PORT | ACCESS), STATE, 0,
		    "init w/o state");
	EXPECT_FAIL(check(IBV_QPT_RC, IBV_QPS_RTS, IBV_QPS_ERR, 0), STATE, 0, "err w/o state");
	EXPECT_FAIL(check(IBV_QPT_UD, IBV_QPS_RTR, IBV_QPS_RTS, 0), STATE | SQ_PSN, 0,
		    "rts w/o anything");
}

// IBV_QP_CUR_STATE.

TEST(QpStateCurState, AcceptedWhereNameableAndMatching)
{
	// Implicit form: the bit names cur.
	EXPECT_PASS(check(IBV_QPT_RC, IBV_QPS_RTR, IBV_QPS_RTS,
			  STATE | CUR | TIMEOUT | RETRY | RNR_RETRY | SQ_PSN | MAX_QP_RD),
		    "rtr->rts cur");
	EXPECT_PASS(check_cur(IBV_QPT_RC, IBV_QPS_RTS, IBV_QPS_RTS, STATE | CUR, IBV_QPS_RTS),
		    "rts cur");
	EXPECT_PASS(check_cur(IBV_QPT_UD, IBV_QPS_SQE, IBV_QPS_RTS, STATE | CUR, IBV_QPS_SQE),
		    "sqe cur");
	EXPECT_PASS(check_cur(IBV_QPT_UC, IBV_QPS_SQD, IBV_QPS_RTS, STATE | CUR, IBV_QPS_SQD),
		    "sqd cur");
}

TEST(QpStateCurState, MismatchIsRejected)
{
	// The consumer thinks RTS, but the QP already fell into SQE.
	EXPECT_FAIL(check_cur(IBV_QPT_UD, IBV_QPS_SQE, IBV_QPS_RTS, STATE | CUR, IBV_QPS_RTS), 0,
		    CUR, "sqe named rts");
	EXPECT_FAIL(check_cur(IBV_QPT_RC, IBV_QPS_RTS, IBV_QPS_RTS, STATE | CUR, IBV_QPS_RTR), 0,
		    CUR, "rts named rtr");
	EXPECT_FAIL(check_cur(IBV_QPT_RC, IBV_QPS_SQD, IBV_QPS_RTS, STATE | CUR, IBV_QPS_UNKNOWN),
		    0, CUR, "unknown");
	// Other problems are still reported alongside.
	EXPECT_FAIL(
	    check_cur(IBV_QPT_RC, IBV_QPS_RTR, IBV_QPS_RTS, STATE | CUR | SQ_PSN, IBV_QPS_INIT),
	    TIMEOUT | RETRY | RNR_RETRY | MAX_QP_RD, CUR, "mismatch + missing");
}

TEST(QpStateCurState, IgnoredWithoutTheBit)
{
	EXPECT_PASS(check_cur(IBV_QPT_RC, IBV_QPS_RTS, IBV_QPS_RTS, STATE | ALT, IBV_QPS_ERR),
		    "named but not flagged");
}

TEST(QpStateCurState, NotNameableFromResetInitErrOrOnNonListingEdges)
{
	EXPECT_FAIL(check_cur(IBV_QPT_RC, IBV_QPS_INIT, IBV_QPS_INIT, STATE | CUR, IBV_QPS_INIT), 0,
		    CUR, "init");
	EXPECT_FAIL(check_cur(IBV_QPT_RC, IBV_QPS_RESET, IBV_QPS_INIT,
			      STATE | CUR | PKEY | PORT | ACCESS, IBV_QPS_RESET),
		    0, CUR, "reset");
	EXPECT_FAIL(check_cur(IBV_QPT_RC, IBV_QPS_ERR, IBV_QPS_RESET, STATE | CUR, IBV_QPS_ERR), 0,
		    CUR, "err");
	// RTS is nameable, but RTS->SQD and RTS->ERR do not list the bit.
	EXPECT_FAIL(check_cur(IBV_QPT_RC, IBV_QPS_RTS, IBV_QPS_SQD, STATE | CUR, IBV_QPS_RTS), 0,
		    CUR, "rts->sqd");
	EXPECT_FAIL(check_cur(IBV_QPT_RC, IBV_QPS_RTS, IBV_QPS_ERR, STATE | CUR, IBV_QPS_RTS), 0,
		    CUR, "rts->err");
}

// Argument validation.

TEST(QpStateArgs, UnsupportedTypesAndStates)
{
	EXPECT_FAIL(check(IBV_QPT_DRIVER, IBV_QPS_RESET, IBV_QPS_INIT, STATE | PKEY | PORT), 0, 0,
		    "driver qp");
	EXPECT_FAIL(check(static_cast<ibv_qp_type>(0), IBV_QPS_RESET, IBV_QPS_RESET, STATE), 0, 0,
		    "type 0");
	EXPECT_FAIL(check(IBV_QPT_RC, IBV_QPS_UNKNOWN, IBV_QPS_RESET, STATE), 0, 0, "unknown cur");
	EXPECT_FAIL(check(IBV_QPT_RC, IBV_QPS_RTS, IBV_QPS_UNKNOWN, STATE), 0, 0, "unknown next");
	EXPECT_FAIL(check(IBV_QPT_RC, static_cast<ibv_qp_state>(-1), IBV_QPS_ERR, STATE), 0, 0,
		    "negative cur");
	EXPECT_FAIL(check(IBV_QPT_RC, IBV_QPS_RTS, static_cast<ibv_qp_state>(42), STATE), 0, 0,
		    "big next");
}

TEST(QpStateArgs, NullOutputsAreFine)
{
	EXPECT_EQ(qp_modify_check(IBV_QPT_RC, IBV_QPS_RESET, IBV_QPS_INIT, STATE, nullptr, nullptr),
		  EINVAL);
	EXPECT_EQ(qp_modify_check(IBV_QPT_RC, IBV_QPS_RESET, IBV_QPS_INIT,
				  STATE | PKEY | PORT | ACCESS, nullptr, nullptr),
		  0);
	int missing = -1;

	EXPECT_EQ(qp_modify_check(IBV_QPT_UD, IBV_QPS_RTR, IBV_QPS_RTS, STATE, &missing, nullptr),
		  EINVAL);
	EXPECT_EQ(missing, SQ_PSN);
	int extra = -1;

	EXPECT_EQ(qp_modify_check(IBV_QPT_UD, IBV_QPS_RTR, IBV_QPS_RTS, STATE | SQ_PSN | AV,
				  nullptr, &extra),
		  EINVAL);
	EXPECT_EQ(extra, AV);
}

// Names.

TEST(QpStateNames, States)
{
	EXPECT_STREQ(qp_state_name(IBV_QPS_RESET), "RESET");
	EXPECT_STREQ(qp_state_name(IBV_QPS_INIT), "INIT");
	EXPECT_STREQ(qp_state_name(IBV_QPS_RTR), "RTR");
	EXPECT_STREQ(qp_state_name(IBV_QPS_RTS), "RTS");
	EXPECT_STREQ(qp_state_name(IBV_QPS_SQD), "SQD");
	EXPECT_STREQ(qp_state_name(IBV_QPS_SQE), "SQE");
	EXPECT_STREQ(qp_state_name(IBV_QPS_ERR), "ERR");
	EXPECT_STREQ(qp_state_name(IBV_QPS_UNKNOWN), "UNKNOWN");
	EXPECT_STREQ(qp_state_name(static_cast<ibv_qp_state>(99)), "INVALID");
}

TEST(QpStateNames, MaskFormatting)
{
	EXPECT_EQ(qp_mask_names(0), "0");
	EXPECT_EQ(qp_mask_names(IBV_QP_STATE), "IBV_QP_STATE");
	EXPECT_EQ(qp_mask_names(IBV_QP_PORT | IBV_QP_PKEY_INDEX), "IBV_QP_PKEY_INDEX|IBV_QP_PORT");
	EXPECT_EQ(qp_mask_names(IBV_QP_RATE_LIMIT | IBV_QP_STATE),
		  "IBV_QP_STATE|IBV_QP_RATE_LIMIT");
	// Bits 21-24 and 26-31 have no libibverbs name.
	EXPECT_EQ(qp_mask_names(IBV_QP_STATE | (1 << 21)), "IBV_QP_STATE|0x200000");
	EXPECT_EQ(qp_mask_names((1 << 22) | (1 << 30)), "0x40400000");
	EXPECT_EQ(qp_mask_names(IBV_QP_DEST_QPN | static_cast<int>(0x80000000u)),
		  "IBV_QP_DEST_QPN|0x80000000");
	EXPECT_EQ(qp_mask_names(0x03ffffff),
		  "IBV_QP_STATE|IBV_QP_CUR_STATE|IBV_QP_EN_SQD_ASYNC_NOTIFY|"
		  "IBV_QP_ACCESS_FLAGS|IBV_QP_PKEY_INDEX|IBV_QP_PORT|IBV_QP_QKEY|IBV_QP_AV|"
		  "IBV_QP_PATH_MTU|IBV_QP_TIMEOUT|IBV_QP_RETRY_CNT|IBV_QP_RNR_RETRY|"
		  "IBV_QP_RQ_PSN|IBV_QP_MAX_QP_RD_ATOMIC|IBV_QP_ALT_PATH|"
		  "IBV_QP_MIN_RNR_TIMER|IBV_QP_SQ_PSN|IBV_QP_MAX_DEST_RD_ATOMIC|"
		  "IBV_QP_PATH_MIG_STATE|IBV_QP_CAP|IBV_QP_DEST_QPN|IBV_QP_RATE_LIMIT|0x1e00000");
}

TEST(QpStateNames, EveryNamedBitRoundTrips)
{
	struct {
		int bit;
		const char *name;
	} const bits[] = {
	    {IBV_QP_STATE, "IBV_QP_STATE"},
	    {IBV_QP_CUR_STATE, "IBV_QP_CUR_STATE"},
	    {IBV_QP_EN_SQD_ASYNC_NOTIFY, "IBV_QP_EN_SQD_ASYNC_NOTIFY"},
	    {IBV_QP_ACCESS_FLAGS, "IBV_QP_ACCESS_FLAGS"},
	    {IBV_QP_PKEY_INDEX, "IBV_QP_PKEY_INDEX"},
	    {IBV_QP_PORT, "IBV_QP_PORT"},
	    {IBV_QP_QKEY, "IBV_QP_QKEY"},
	    {IBV_QP_AV, "IBV_QP_AV"},
	    {IBV_QP_PATH_MTU, "IBV_QP_PATH_MTU"},
	    {IBV_QP_TIMEOUT, "IBV_QP_TIMEOUT"},
	    {IBV_QP_RETRY_CNT, "IBV_QP_RETRY_CNT"},
	    {IBV_QP_RNR_RETRY, "IBV_QP_RNR_RETRY"},
	    {IBV_QP_RQ_PSN, "IBV_QP_RQ_PSN"},
	    {IBV_QP_MAX_QP_RD_ATOMIC, "IBV_QP_MAX_QP_RD_ATOMIC"},
	    {IBV_QP_ALT_PATH, "IBV_QP_ALT_PATH"},
	    {IBV_QP_MIN_RNR_TIMER, "IBV_QP_MIN_RNR_TIMER"},
	    {IBV_QP_SQ_PSN, "IBV_QP_SQ_PSN"},
	    {IBV_QP_MAX_DEST_RD_ATOMIC, "IBV_QP_MAX_DEST_RD_ATOMIC"},
	    {IBV_QP_PATH_MIG_STATE, "IBV_QP_PATH_MIG_STATE"},
	    {IBV_QP_CAP, "IBV_QP_CAP"},
	    {IBV_QP_DEST_QPN, "IBV_QP_DEST_QPN"},
	    {IBV_QP_RATE_LIMIT, "IBV_QP_RATE_LIMIT"},
	};

	for (const auto &b : bits)
		EXPECT_EQ(qp_mask_names(b.bit), b.name);
}

} // namespace
