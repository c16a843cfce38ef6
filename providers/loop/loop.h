// SPDX-License-Identifier: MIT
// The loop provider's objects.  Each embeds the libibverbs object it
// extends as its first member (standard layout, no virtual functions) and is
// recovered with a to_loop_*() helper, as rdma-core providers do.
#pragma once

#include "../../libibverbs-compat/driver.h"
#include "fabric.h"
#include "loop_param.h"

#include <cstddef>
#include <mutex>
#include <string>
#include <vector>

namespace loop {

struct loop_device {
	verbs_device vdev; // Must be first
	std::string name;
	device_config cfg;
};

struct gid_slot {
	ibv_gid gid;
	ibv_gid_type type;
	bool valid;
};

struct loop_context {
	verbs_context vctx; // Must be first
	fabric *fab;
	sv_device_rec *dev; // This device's record in the registry
	loop_device *ldev;
	int lease;
	int async_fd; // Datagram socket: async events from any process
};

struct loop_pd {
	ibv_pd base; // Must be first
	uint32_t pdn;
};

template <typename T, typename M> inline T *container_of_first(M *m)
{
	static_assert(std::is_standard_layout_v<T>);
	return reinterpret_cast<T *>(m);
}

inline loop_device *to_loop_device(ibv_device *d)
{
	return container_of_first<loop_device>(d);
}
inline loop_context *to_loop_context(ibv_context *c)
{
	return reinterpret_cast<loop_context *>(reinterpret_cast<char *>(c) -
						offsetof(loop_context, vctx.context));
}
inline loop_pd *to_loop_pd(ibv_pd *p)
{
	return container_of_first<loop_pd>(p);
}

// loop_query.cpp
int loop_query_device_ex(ibv_context *ctx, const ibv_query_device_ex_input *input,
			 ibv_device_attr_ex *attr, size_t attr_size);
int loop_query_port(ibv_context *ctx, uint8_t port, ibv_port_attr *attr);
int loop_query_gid_ex(ibv_context *ctx, uint32_t port, uint32_t index, ibv_gid_entry *entry,
		      uint32_t flags);
int loop_query_pkey(ibv_context *ctx, uint8_t port, int index, __be16 *pkey);
int loop_query_rt_values(ibv_context *ctx, ibv_values_ex *values);
// Fills the GID table of a port; returns the number of valid slots.
int loop_gid_table(loop_context *lctx, uint32_t port, gid_slot *table, int max);

// loop_pd.cpp
ibv_pd *loop_alloc_pd(ibv_context *ctx);
int loop_dealloc_pd(ibv_pd *pd);

} // namespace loop
