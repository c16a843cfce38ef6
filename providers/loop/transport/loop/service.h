// SPDX-License-Identifier: MIT
// The service copy path (see sv_svc_ring): used where the kernel refuses
// cross-memory attach, or everywhere with SOFTVERBS_CMA=0.
#pragma once

#include "fabric.h"
#include "xfer.h"

#include <sys/types.h>
#include <sys/uio.h>

namespace loop {

// Creates this process's service segment and thread (once; again after
// service_stop).  0 or an errno.
int service_start(fabric &fab, uint32_t lease);
// Stops the thread and destroys the segment (unlinked, unmapped, its object
// slot freed): when the process's last context closes.  A forked child never
// stops its parent's service.
void service_stop();
// Whether SOFTVERBS_CMA=0 asks for the service path everywhere.
bool service_forced();
// Moves bytes between local[] and the peer pid's memory at remote[] through
// the peer's service thread.  Same contract as xfer().
int service_xfer(pid_t pid, const iovec *local, int nlocal, const iovec *remote, int nremote,
		 xfer_dir dir);
// Records in this process's lease which copy path it used (for the tools).
void note_path(fabric &fab, uint32_t lease, uint32_t flag);
void service_note(uint32_t flag);

} // namespace loop
