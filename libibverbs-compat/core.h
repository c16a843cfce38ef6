/* SPDX-License-Identifier: MIT */
/* Private to libibverbs-compat: state the core keeps beside each context. */
#ifndef SOFTVERBS_CORE_H
#define SOFTVERBS_CORE_H

#include "driver.h"

#include <algorithm>
#include <cerrno>
#include <new>

/* Lives in verbs_context::priv (an opaque pointer in the public header). */
struct verbs_ex_private {
	struct verbs_context_ops ops;
	uint32_t driver_id;
	bool imported;
};

static inline struct verbs_context *core_vctx(struct ibv_context *ctx)
{
	return verbs_get_ctx(ctx);
}

static inline const struct verbs_context_ops *get_ops(struct ibv_context *ctx)
{
	return &core_vctx(ctx)->priv->ops;
}

/* Sets errno and returns NULL: for verbs that return an object. */
template <typename T> static inline T *fail_ptr(int err)
{
	errno = err;
	return nullptr;
}

/* Core-owned wrappers installed in the public verbs_context slots. */
int core_query_port_ex(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr,
		       size_t attr_len);
/* Counts an async event handed to the application for a CQ, QP or SRQ:
 * destroying that object waits for its ack (verbs_*_wait_events). */
void core_async_reported(const void *obj);
void core_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#define EXPORT extern "C" __attribute__((visibility("default")))

#endif
