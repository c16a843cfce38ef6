// SPDX-License-Identifier: MIT
// The IB queue pair state machine: which ibv_modify_qp() transitions are
// legal for a QP type, and which attribute mask bits each one requires or
// tolerates.  The rules are the ones the Linux kernel enforces for every
// hardware provider (ib_modify_qp_is_ok() in drivers/infiniband/core/verbs.c),
// so an application that modifies QPs correctly on the loop provider does so
// on a real HCA as well, and one that does not fails here the same way.
//
// Deliberate consequences of following the kernel rather than a simplified
// "any state to ERR" reading of the spec:
//   - RESET->ERR is rejected (a QP in RESET has no resources to flush);
//   - IBV_QP_CUR_STATE may only be named from RTR, RTS, SQD or SQE, and only
//     on transitions that list it as optional;
//   - SQE exists for UC, UD (and RAW_PACKET, treated as a datagram type):
//     SQE->RTS is rejected for RC and XRC, which go to ERR on a send error.
#pragma once

#include <infiniband/verbs.h>

#include <string>

namespace loop {

// Returns 0 if moving a qp_type QP from cur to next with attr_mask is legal,
// else EINVAL.  attr_mask without IBV_QP_STATE means "modify attributes,
// keep the state": the caller passes next == cur, and it is legal only where
// the state machine has a cur->cur transition (INIT, RTS, SQD, and the
// trivial RESET and ERR ones).  If next != cur, IBV_QP_STATE is required.
//
// missing / extra (each may be nullptr) always receive a value: the required
// bits absent from attr_mask, and the bits present that the transition does
// not accept.  Both are 0 when the failure is not about mask bits (unknown QP
// type or state, or a transition the state machine does not have).
int qp_modify_check(ibv_qp_type qp_type, ibv_qp_state cur, ibv_qp_state next, int attr_mask,
		    int *missing, int *extra);

// As above, for a caller that has the consumer's ibv_qp_attr::cur_qp_state.
// When attr_mask has IBV_QP_CUR_STATE, attr_cur_state must equal cur and cur
// must be one of the states the spec lets a consumer name (RTR, RTS, SQD,
// SQE); otherwise EINVAL with IBV_QP_CUR_STATE reported in *extra.
// attr_cur_state is ignored when IBV_QP_CUR_STATE is not in attr_mask.
int qp_modify_check(ibv_qp_type qp_type, ibv_qp_state cur, ibv_qp_state next, int attr_mask,
		    ibv_qp_state attr_cur_state, int *missing, int *extra);

// "RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"; "UNKNOWN" for
// IBV_QPS_UNKNOWN and "INVALID" for anything else.
const char *qp_state_name(ibv_qp_state s);

// The set bits of an ibv_qp_attr_mask as "IBV_QP_PKEY_INDEX|IBV_QP_PORT", in
// bit order; bits libibverbs does not name are appended as one hex number
// ("IBV_QP_STATE|0x200000").  An empty mask gives "0".
std::string qp_mask_names(int mask);

} // namespace loop
