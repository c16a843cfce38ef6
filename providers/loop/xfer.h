// SPDX-License-Identifier: MIT
// The copy engine: moves bytes between this process and a peer's registered
// memory.  Within one process it is memcpy; across processes it is one
// cross-memory-attach system call per message (process_vm_writev/readv),
// which copies straight into the target's buffer with no staging.
#pragma once

#include <sys/types.h>
#include <sys/uio.h>

#include <cstdint>

namespace loop {

enum class xfer_dir { to_peer, from_peer };

// Copies the bytes described by local[] into (or from) remote[]; both lists
// cover the same number of bytes.  Returns 0 or an errno: ESRCH (the peer
// is gone), EFAULT (an address is not mapped on one side), EPERM (the kernel
// refuses cross-memory attach).
int xfer(pid_t pid, bool same_process, const iovec *local, int nlocal, const iovec *remote,
	 int nremote, xfer_dir dir);

// Reads or writes 8 bytes at a peer address (for atomics).
int xfer_word(pid_t pid, bool same_process, uint64_t remote_addr, uint64_t *value, xfer_dir dir);

} // namespace loop
