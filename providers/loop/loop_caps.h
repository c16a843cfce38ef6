// SPDX-License-Identifier: MIT
// The capabilities the loop device advertises.  Each bit is set here only in
// the commit that makes it work end to end, with the test that proves it.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>

namespace loop {

inline constexpr unsigned int kDeviceCapFlags =
	IBV_DEVICE_PORT_ACTIVE_EVENT | IBV_DEVICE_SYS_IMAGE_GUID | IBV_DEVICE_RC_RNR_NAK_GEN |
	IBV_DEVICE_XRC;
inline constexpr uint64_t kDeviceCapFlagsEx = 0;
// Atomics take a fabric-wide striped lock: atomic among all users of the fabric.
inline constexpr ibv_atomic_cap kAtomicCap = IBV_ATOMIC_HCA;
inline constexpr int kMaxMw = 0;
// The device clock is CLOCK_MONOTONIC in ns: a 1 GHz clock of 64 bits.
inline constexpr uint64_t kCompletionTimestampMask = UINT64_MAX;
inline constexpr uint64_t kHcaCoreClockKhz = 1000000;

} // namespace loop
