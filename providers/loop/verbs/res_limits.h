// SPDX-License-Identifier: MIT
// Object counts against the fabric's limits (sv_limits in the registry):
// what ibv_query_device advertises as max_pd, max_qp, max_cq, max_mr,
// max_mw, max_ah and max_srq, enforced device-wide across processes.
#pragma once

#include "fabric.h"

namespace loop {

// The fabric's limit for kind, as ibv_query_device reports it.  Read from
// shared memory, so bounded by the table behind it.
uint32_t res_limit(const fabric &fab, sv_res kind);
// Counts one more object of kind against the limit, for the process of lease
// slot `lease`.  Returns 0, or ENOMEM when the fabric holds the limit
// already.  res_take takes the registry lock, and at the limit reaps dead
// processes once before it gives up; res_take_locked is for a caller that
// holds the lock (it reaps nothing).
int res_take(fabric &fab, int lease, sv_res kind);
int res_take_locked(fabric &fab, int lease, sv_res kind);
// Gives back what res_take counted.
void res_put(fabric &fab, int lease, sv_res kind);
void res_put_locked(fabric &fab, int lease, sv_res kind);

} // namespace loop
