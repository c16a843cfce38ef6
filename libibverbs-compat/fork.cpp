// SPDX-License-Identifier: MIT
// Fork support.  rdma-core marks registered ranges MADV_DONTFORK because a
// kernel HCA keeps DMA mappings of the parent's pages.  The loop device pins
// nothing: it reaches a process's memory through its pid (cross-memory
// attach) or through the file behind the memory, both of which follow the
// process across fork with copy-on-write intact.  So fork needs no help, which
// is exactly what IBV_FORK_UNNEEDED tells an application.
#include "core.h"

EXPORT int ibv_fork_init(void)
{
	return 0;
}

EXPORT enum ibv_fork_status ibv_is_fork_initialized(void)
{
	return IBV_FORK_UNNEEDED;
}

EXPORT int ibv_dontfork_range(void *base, size_t size)
{
	(void)base;
	(void)size;
	return 0;
}

EXPORT int ibv_dofork_range(void *base, size_t size)
{
	(void)base;
	(void)size;
	return 0;
}
