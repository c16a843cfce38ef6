// SPDX-License-Identifier: MIT
// Mappings of peers' fd-backed MRs, owned by the loop transport
// (peer_maps.cpp).
#pragma once

#include "loop.h"

#include <memory>

namespace loop {

// Our mapping of a peer's fd-backed MR (registry slot, record snapshot c),
// made on first use and cached (at most 256; evicting drops only the
// cache's reference).  Returns the address of the record's iova, or
// nullptr (the fd cannot be had or mapped); sets pin, which keeps the
// mapping alive for as long as the caller (or a copy of pin) holds it.
// direct: whether a plain memcpy through it can never fault (a writable
// mapping of a memfd sealed against shrinking, peer_maps.cpp).
// dead: set (with nullptr returned) when the owner is found gone.  A
// mapping outlives its owner, so the owner's lease is looked at again once
// per tick of the coarse clock (1-4 ms): WRITEs into a process killed that
// long ago fail as they would by cross-memory attach, not land in memory
// nobody reads.
char *peer_map(fabric &fab, uint32_t slot, const sv_mr_rec &c, std::shared_ptr<void> &pin,
	       bool &direct, bool &dead);
// Whether a plain access through a shared mapping of fd's [0, end) can
// never fault: a tmpfs file sealed against shrinking, at least end long.
bool sealed_tmpfs(int fd, uint64_t end);
// The coarse monotonic clock, in its own ticks' worth of nanoseconds: read
// from the vDSO without the TSC, so cheaper than the fine clock.  A mapping
// is looked at for its owner's liveness once per tick.
int64_t coarse_now();

} // namespace loop
