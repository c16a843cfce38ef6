// SPDX-License-Identifier: MIT
// The capabilities the loop device advertises.  Each bit is set here only in
// the commit that makes it work end to end, with the test that proves it.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>

namespace loop {

inline constexpr unsigned int kDeviceCapFlags =
	IBV_DEVICE_PORT_ACTIVE_EVENT | IBV_DEVICE_SYS_IMAGE_GUID | IBV_DEVICE_RC_RNR_NAK_GEN |
	IBV_DEVICE_XRC | IBV_DEVICE_MEM_WINDOW | IBV_DEVICE_MEM_WINDOW_TYPE_2B |
	IBV_DEVICE_MEM_MGT_EXTENSIONS;
// IB_UVERBS_DEVICE_ATOMIC_WRITE (rdma-core's kernel-headers/rdma/
// ib_user_verbs.h; Debian 12's kernel headers predate it): IBTA 1.5's
// atomic write, through ibv_wr_atomic_write and IBV_WR_ATOMIC_WRITE
// (test_qpex.py, rdma-core's test_qp_ex_rc_atomic_write).
inline constexpr uint64_t kDeviceAtomicWrite = 1ULL << 40;
inline constexpr uint64_t kDeviceCapFlagsEx = kDeviceAtomicWrite;
// Atomics take a fabric-wide striped lock: atomic among all users of the fabric.
inline constexpr ibv_atomic_cap kAtomicCap = IBV_ATOMIC_HCA;
// On-demand paging: nothing is pinned, so every transport and operation the
// requester runs works on ODP memory, implicit ODP included.
inline constexpr uint64_t kOdpGeneralCaps = IBV_ODP_SUPPORT | IBV_ODP_SUPPORT_IMPLICIT;
inline constexpr uint32_t kOdpRcCaps = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV |
				       IBV_ODP_SUPPORT_WRITE | IBV_ODP_SUPPORT_READ |
				       IBV_ODP_SUPPORT_ATOMIC | IBV_ODP_SUPPORT_SRQ_RECV;
inline constexpr uint32_t kOdpUcCaps =
	IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_WRITE | IBV_ODP_SUPPORT_SRQ_RECV;
inline constexpr uint32_t kOdpUdCaps =
	IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_SRQ_RECV;
// The device clock is CLOCK_MONOTONIC in ns: a 1 GHz clock of 64 bits.
inline constexpr uint64_t kCompletionTimestampMask = UINT64_MAX;
inline constexpr uint64_t kHcaCoreClockKhz = 1000000;

} // namespace loop
