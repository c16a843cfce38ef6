// SPDX-License-Identifier: MIT
// Every device limit the loop provider advertises, in one place (rxe_param.h
// style).  A limit here is a promise: the data path enforces and honours it.
// Timings and sizes that are not promises, the tunables, are in tunables.h.
#pragma once

#include "../../kernel-abi/softverbs-abi.h"

#include <cstdint>

namespace loop {

inline constexpr uint32_t kVendorId = 0xffffff; // As software devices (rxe) report
inline constexpr uint32_t kVendorPartId = 0x5356; // "SV"
inline constexpr uint32_t kHwVer = 1;
inline constexpr uint64_t kFwVersion = 1;

inline constexpr uint64_t kMaxMrSize = 1ULL << 40;
inline constexpr uint64_t kPageSizeCap = 0xfffff000ULL; // 4 KiB and up
// Object counts: the defaults of the fabric's limits (sv_limits), which a
// fabric's configuration may lower (docs/configuration.md, "Limits").  They
// are device-wide, across processes, as an HCA's are, and each fits the
// registry table behind it, together with the others that share it:
//  - QPs: qps[SV_MAX_QPS];
//  - CQs, SRQs and the receive queue of every QP that has one, plus one
//    service segment and one CQ being resized per process: objs[SV_MAX_OBJS];
//  - MRs (every key that is not a window) and MWs: mrs[SV_MAX_MRS], whose
//    slot 0 is never handed out.
inline constexpr int kMaxQp = 4096;
inline constexpr int kMaxCq = 2048;
inline constexpr int kMaxSrq = 1024;
inline constexpr int kMaxMr = 12288;
inline constexpr int kMaxMw = 4095;
inline constexpr int kMaxPd = 16384;
inline constexpr int kMaxAh = 16384;
// Reserved per process in objs[]: its service segment and a CQ resize.
inline constexpr int kObjsPerProcess = 2;
// The defaults fit the registry's tables (config.cpp's check_limits holds
// a configuration's values to the same sums).
static_assert(kMaxQp <= SV_MAX_QPS, "every QP needs a slot in qps[]");
static_assert(kMaxMr + kMaxMw <= SV_MAX_MRS - 1, "MRs and MWs share mrs[], less slot 0");
static_assert(kMaxQp + kMaxCq + kMaxSrq <= SV_MAX_OBJS - kObjsPerProcess * SV_MAX_PROCS,
	      "QP receive queues, CQs and SRQs share objs[] with each process's reserve");
// The most a configuration may set for a count with no table behind it.
inline constexpr int kMaxCountCap = 1 << 24;
// Sizes: a request above one of these fails with EINVAL.
inline constexpr int kMaxQpWr = 16384;
inline constexpr int kMaxSge = 32;
inline constexpr int kMaxSgeRd = 32;
// About mlx5's max_cqe (2^22 - 1): libfabric's ofi_rxm sizes its MSG CQ as
// (rx + tx) * universe size, 262144 by default, and fails below that.  A
// power of two, since a CQ's size is rounded up to one: with mlx5's value a
// CQ of max_cqe held 2^22 entries and reported them, a size that
// ibv_resize_cq then refused.  A CQ's memory is reserved when it is
// created (queue_create), so a big one costs its size.
inline constexpr int kMaxCqe = 1 << 22;
inline constexpr int kMaxQpRdAtom = 16;
inline constexpr int kMaxQpInitRdAtom = 16;
inline constexpr int kMaxSrqWr = 16384;
inline constexpr int kMaxSrqSge = 32;
inline constexpr int kMaxMcastGrp = 64;
inline constexpr int kMaxMcastQpAttach = 64;
inline constexpr int kMaxInlineData = 256;
inline constexpr uint16_t kMaxPkeys = 1;
inline constexpr uint16_t kDefaultPkey = 0xffff;
inline constexpr int kGidTableLen = 16; // Ethernet ports fill one slot per IP address
inline constexpr uint32_t kMaxMsgSize = 1U << 31;
inline constexpr int kLocalCaAckDelay = 15;
// CQ moderation (ibv_modify_cq): by count only, no period.
inline constexpr uint16_t kMaxCqModCount = 65535;
inline constexpr uint16_t kMaxCqModPeriod = 0;
inline constexpr uint64_t kMaxDmSize = 256 * 1024; // Like an HCA's on-chip memory

} // namespace loop
