// SPDX-License-Identifier: MIT
/*
 * The libibverbs 1.0 ABI (symbols versioned @IBVERBS_1.0).
 *
 * Programs linked against libibverbs 1.0 (2006) hold objects of a different
 * shape: struct ibv_context had no abi_compat slot and a shorter ops table,
 * every object was smaller, and ibv_send_wr had no fields past wr. Each 1.0
 * object here is therefore a small wrapper that owns the real 1.1 object and
 * points back to it; every 1.0 entry point unwraps its arguments, calls the
 * default (1.1) verb and wraps the result. The 1.0 inline verbs in the old
 * application (ibv_poll_cq, ibv_post_send, ...) jump through the wrapper
 * context's ops table, so that table is filled with trampolines.
 *
 * To find wrappers again from real objects (completion and async events
 * carry real objects) the real object's user context pointer (cq_context,
 * qp_context, srq_context) is set to the wrapper, and the application's own
 * pointer lives in the wrapper.
 *
 * Each function here is bound to NAME@IBVERBS_1.0 by .symver; the plain
 * NAME it calls is the library's default NAME@@IBVERBS_1.1.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <infiniband/verbs.h>

#define SV_EXPORT __attribute__((visibility("default")))
#define COMPAT_1_0(impl, name) __asm__(".symver " #impl ", " #name "@IBVERBS_1.0")

struct ibv_context_1_0;

struct ibv_device_1_0 {
	void *obsolete_sysfs_dev;
	void *obsolete_sysfs_ibdev;
	/* Was the driver pointer in 1.0; no 1.0 program read it. */
	struct ibv_device *real_device;
	struct _ibv_device_ops _ops;
};

struct ibv_pd_1_0 {
	struct ibv_context_1_0 *context;
	uint32_t handle;

	struct ibv_pd *real_pd;
};

struct ibv_mr_1_0 {
	struct ibv_context_1_0 *context;
	struct ibv_pd_1_0 *pd;
	uint32_t handle;
	uint32_t lkey;
	uint32_t rkey;

	struct ibv_mr *real_mr;
};

struct ibv_cq_1_0 {
	struct ibv_context_1_0 *context;
	void *cq_context;
	uint32_t handle;
	int cqe;

	pthread_mutex_t mutex;
	pthread_cond_t cond;
	uint32_t comp_events_completed;
	uint32_t async_events_completed;

	struct ibv_cq *real_cq;
};

struct ibv_srq_1_0 {
	struct ibv_context_1_0 *context;
	void *srq_context;
	struct ibv_pd_1_0 *pd;
	uint32_t handle;

	pthread_mutex_t mutex;
	pthread_cond_t cond;
	uint32_t events_completed;

	struct ibv_srq *real_srq;
};

struct ibv_qp_1_0 {
	struct ibv_context_1_0 *context;
	void *qp_context;
	struct ibv_pd_1_0 *pd;
	struct ibv_cq_1_0 *send_cq;
	struct ibv_cq_1_0 *recv_cq;
	struct ibv_srq_1_0 *srq;
	uint32_t handle;
	uint32_t qp_num;
	enum ibv_qp_state state;
	enum ibv_qp_type qp_type;

	pthread_mutex_t mutex;
	pthread_cond_t cond;
	uint32_t events_completed;

	struct ibv_qp *real_qp;
};

struct ibv_ah_1_0 {
	struct ibv_context_1_0 *context;
	struct ibv_pd_1_0 *pd;
	uint32_t handle;

	struct ibv_ah *real_ah;
};

struct ibv_qp_init_attr_1_0 {
	void *qp_context;
	struct ibv_cq_1_0 *send_cq;
	struct ibv_cq_1_0 *recv_cq;
	struct ibv_srq_1_0 *srq;
	struct ibv_qp_cap cap;
	enum ibv_qp_type qp_type;
	int sq_sig_all;
};

struct ibv_send_wr_1_0 {
	struct ibv_send_wr_1_0 *next;
	uint64_t wr_id;
	struct ibv_sge *sg_list;
	int num_sge;
	enum ibv_wr_opcode opcode;
	int send_flags;
	__be32 imm_data;
	union {
		struct {
			uint64_t remote_addr;
			uint32_t rkey;
		} rdma;
		struct {
			uint64_t remote_addr;
			uint64_t compare_add;
			uint64_t swap;
			uint32_t rkey;
		} atomic;
		struct {
			struct ibv_ah_1_0 *ah;
			uint32_t remote_qpn;
			uint32_t remote_qkey;
		} ud;
	} wr;
};

struct ibv_recv_wr_1_0 {
	struct ibv_recv_wr_1_0 *next;
	uint64_t wr_id;
	struct ibv_sge *sg_list;
	int num_sge;
};

/*
 * The 1.0 ops table. 1.0 programs call the data-path entries from inline
 * verbs; the others were the driver interface, filled in so that no entry
 * is a NULL pointer. Arguments are the 1.0 objects the program holds.
 */
struct ibv_context_ops_1_0 {
	int (*query_device)(struct ibv_context_1_0 *context, struct ibv_device_attr *device_attr);
	int (*query_port)(struct ibv_context_1_0 *context, uint8_t port_num,
			  struct ibv_port_attr *port_attr);
	struct ibv_pd_1_0 *(*alloc_pd)(struct ibv_context_1_0 *context);
	int (*dealloc_pd)(struct ibv_pd_1_0 *pd);
	struct ibv_mr_1_0 *(*reg_mr)(struct ibv_pd_1_0 *pd, void *addr, size_t length, int access);
	int (*dereg_mr)(struct ibv_mr_1_0 *mr);
	struct ibv_cq_1_0 *(*create_cq)(struct ibv_context_1_0 *context, int cqe,
					struct ibv_comp_channel *channel, int comp_vector);
	int (*poll_cq)(struct ibv_cq_1_0 *cq, int num_entries, struct ibv_wc *wc);
	int (*req_notify_cq)(struct ibv_cq_1_0 *cq, int solicited_only);
	void (*cq_event)(struct ibv_cq_1_0 *cq);
	int (*resize_cq)(struct ibv_cq_1_0 *cq, int cqe);
	int (*destroy_cq)(struct ibv_cq_1_0 *cq);
	struct ibv_srq_1_0 *(*create_srq)(struct ibv_pd_1_0 *pd, struct ibv_srq_init_attr *attr);
	int (*modify_srq)(struct ibv_srq_1_0 *srq, struct ibv_srq_attr *srq_attr,
			  int srq_attr_mask);
	int (*query_srq)(struct ibv_srq_1_0 *srq, struct ibv_srq_attr *srq_attr);
	int (*destroy_srq)(struct ibv_srq_1_0 *srq);
	int (*post_srq_recv)(struct ibv_srq_1_0 *srq, struct ibv_recv_wr_1_0 *recv_wr,
			     struct ibv_recv_wr_1_0 **bad_recv_wr);
	struct ibv_qp_1_0 *(*create_qp)(struct ibv_pd_1_0 *pd, struct ibv_qp_init_attr_1_0 *attr);
	int (*query_qp)(struct ibv_qp_1_0 *qp, struct ibv_qp_attr *attr, int attr_mask,
			struct ibv_qp_init_attr_1_0 *init_attr);
	int (*modify_qp)(struct ibv_qp_1_0 *qp, struct ibv_qp_attr *attr, int attr_mask);
	int (*destroy_qp)(struct ibv_qp_1_0 *qp);
	int (*post_send)(struct ibv_qp_1_0 *qp, struct ibv_send_wr_1_0 *wr,
			 struct ibv_send_wr_1_0 **bad_wr);
	int (*post_recv)(struct ibv_qp_1_0 *qp, struct ibv_recv_wr_1_0 *wr,
			 struct ibv_recv_wr_1_0 **bad_wr);
	struct ibv_ah_1_0 *(*create_ah)(struct ibv_pd_1_0 *pd, struct ibv_ah_attr *attr);
	int (*destroy_ah)(struct ibv_ah_1_0 *ah);
	int (*attach_mcast)(struct ibv_qp_1_0 *qp, union ibv_gid *gid, uint16_t lid);
	int (*detach_mcast)(struct ibv_qp_1_0 *qp, union ibv_gid *gid, uint16_t lid);
};

struct ibv_context_1_0 {
	struct ibv_device_1_0 *device;
	struct ibv_context_ops_1_0 ops;
	int cmd_fd;
	int async_fd;
	int num_comp_vectors;

	/* Was abi_compat in 1.0. */
	struct ibv_context *real_context;
};

/* The send WR union is copied whole; only ud.ah needs translating. */
_Static_assert(sizeof(((struct ibv_send_wr_1_0 *)0)->wr) == sizeof(((struct ibv_send_wr *)0)->wr),
	       "send WR union size changed");
_Static_assert(offsetof(struct ibv_send_wr_1_0, wr.ud.remote_qpn) -
		       offsetof(struct ibv_send_wr_1_0, wr) ==
		   offsetof(struct ibv_send_wr, wr.ud.remote_qpn) -
		       offsetof(struct ibv_send_wr, wr),
	       "UD WR layout changed");

/* What the 1.0 structs held; later fields must not be written to them. */
#define PORT_ATTR_1_0_SIZE offsetof(struct ibv_port_attr, link_layer)
#define QP_ATTR_1_0_SIZE offsetof(struct ibv_qp_attr, rate_limit)

static void init_ops_1_0(struct ibv_context_ops_1_0 *ops);

/* ------------------------------------------------------------------------
 * Devices.
 *
 * 1.1 keeps a device valid after ibv_free_device_list() while a context on
 * it is open. 1.0 contexts point at the 1.0 device wrapper, so wrappers are
 * made once per real device and kept for the life of the process (there
 * are only ever a handful).
 */

struct device_wrapper {
	struct device_wrapper *next;
	struct ibv_device_1_0 dev;
};

static pthread_mutex_t device_wrappers_lock = PTHREAD_MUTEX_INITIALIZER;
static struct device_wrapper *device_wrappers;

static struct ibv_device_1_0 *wrap_device(struct ibv_device *real)
{
	struct device_wrapper *w;

	pthread_mutex_lock(&device_wrappers_lock);
	for (w = device_wrappers; w; w = w->next)
		if (w->dev.real_device == real)
			break;
	if (!w) {
		w = calloc(1, sizeof(*w));
		if (w) {
			w->dev.real_device = real;
			w->next = device_wrappers;
			device_wrappers = w;
		}
	}
	pthread_mutex_unlock(&device_wrappers_lock);
	return w ? &w->dev : NULL;
}

/*
 * The 1.0 list carries the real list in a slot before its first entry, so
 * that ibv_free_device_list() can release it.
 */
SV_EXPORT struct ibv_device_1_0 **ibv_get_device_list_1_0(int *num)
{
	struct ibv_device **real_list;
	struct ibv_device_1_0 **list;
	int i, n;

	real_list = ibv_get_device_list(&n);
	if (!real_list)
		return NULL;

	list = calloc(n + 2, sizeof(*list));
	if (!list)
		goto err;
	list[0] = (struct ibv_device_1_0 *)real_list;
	for (i = 0; i < n; i++) {
		list[i + 1] = wrap_device(real_list[i]);
		if (!list[i + 1])
			goto err;
	}
	if (num)
		*num = n;
	return list + 1;

err:
	free(list);
	ibv_free_device_list(real_list);
	errno = ENOMEM;
	return NULL;
}
COMPAT_1_0(ibv_get_device_list_1_0, ibv_get_device_list);

SV_EXPORT void ibv_free_device_list_1_0(struct ibv_device_1_0 **list)
{
	if (!list)
		return;
	ibv_free_device_list((struct ibv_device **)list[-1]);
	free(list - 1);
}
COMPAT_1_0(ibv_free_device_list_1_0, ibv_free_device_list);

SV_EXPORT const char *ibv_get_device_name_1_0(struct ibv_device_1_0 *device)
{
	return ibv_get_device_name(device->real_device);
}
COMPAT_1_0(ibv_get_device_name_1_0, ibv_get_device_name);

SV_EXPORT __be64 ibv_get_device_guid_1_0(struct ibv_device_1_0 *device)
{
	return ibv_get_device_guid(device->real_device);
}
COMPAT_1_0(ibv_get_device_guid_1_0, ibv_get_device_guid);

/* ------------------------------------------------------------------------
 * Contexts and events.
 */

SV_EXPORT struct ibv_context_1_0 *ibv_open_device_1_0(struct ibv_device_1_0 *device)
{
	struct ibv_context_1_0 *ctx;

	/* An empty 1.0 list ends at once; a NULL entry is easy to pass on. */
	if (!device) {
		errno = EINVAL;
		return NULL;
	}
	ctx = calloc(1, sizeof(*ctx));
	if (!ctx)
		return NULL;
	ctx->real_context = ibv_open_device(device->real_device);
	if (!ctx->real_context) {
		free(ctx);
		return NULL;
	}
	ctx->device = device;
	/* 1.0 programs poll async_fd themselves. */
	ctx->cmd_fd = ctx->real_context->cmd_fd;
	ctx->async_fd = ctx->real_context->async_fd;
	ctx->num_comp_vectors = ctx->real_context->num_comp_vectors;
	init_ops_1_0(&ctx->ops);
	return ctx;
}
COMPAT_1_0(ibv_open_device_1_0, ibv_open_device);

SV_EXPORT int ibv_close_device_1_0(struct ibv_context_1_0 *context)
{
	int ret = ibv_close_device(context->real_context);

	if (ret)
		return ret;
	free(context);
	return 0;
}
COMPAT_1_0(ibv_close_device_1_0, ibv_close_device);

static bool is_qp_event(enum ibv_event_type type)
{
	switch (type) {
	case IBV_EVENT_QP_FATAL:
	case IBV_EVENT_QP_REQ_ERR:
	case IBV_EVENT_QP_ACCESS_ERR:
	case IBV_EVENT_COMM_EST:
	case IBV_EVENT_SQ_DRAINED:
	case IBV_EVENT_PATH_MIG:
	case IBV_EVENT_PATH_MIG_ERR:
	case IBV_EVENT_QP_LAST_WQE_REACHED:
		return true;
	default:
		return false;
	}
}

static bool is_srq_event(enum ibv_event_type type)
{
	return type == IBV_EVENT_SRQ_ERR || type == IBV_EVENT_SRQ_LIMIT_REACHED;
}

/*
 * The element of the event is handed out as the 1.0 wrapper (found through
 * the real object's context pointer) and turned back into the real object
 * on acknowledgement.
 */
SV_EXPORT int ibv_get_async_event_1_0(struct ibv_context_1_0 *context,
				      struct ibv_async_event *event)
{
	int ret = ibv_get_async_event(context->real_context, event);

	if (ret)
		return ret;
	if (event->event_type == IBV_EVENT_CQ_ERR)
		event->element.cq = event->element.cq->cq_context;
	else if (is_qp_event(event->event_type))
		event->element.qp = event->element.qp->qp_context;
	else if (is_srq_event(event->event_type))
		event->element.srq = event->element.srq->srq_context;
	return 0;
}
COMPAT_1_0(ibv_get_async_event_1_0, ibv_get_async_event);

SV_EXPORT void ibv_ack_async_event_1_0(struct ibv_async_event *event)
{
	struct ibv_async_event real = *event;

	if (event->event_type == IBV_EVENT_CQ_ERR)
		real.element.cq = ((struct ibv_cq_1_0 *)(void *)event->element.cq)->real_cq;
	else if (is_qp_event(event->event_type))
		real.element.qp = ((struct ibv_qp_1_0 *)(void *)event->element.qp)->real_qp;
	else if (is_srq_event(event->event_type))
		real.element.srq = ((struct ibv_srq_1_0 *)(void *)event->element.srq)->real_srq;
	ibv_ack_async_event(&real);
}
COMPAT_1_0(ibv_ack_async_event_1_0, ibv_ack_async_event);

SV_EXPORT int ibv_query_device_1_0(struct ibv_context_1_0 *context,
				   struct ibv_device_attr *device_attr)
{
	return ibv_query_device(context->real_context, device_attr);
}
COMPAT_1_0(ibv_query_device_1_0, ibv_query_device);

SV_EXPORT int ibv_query_port_1_0(struct ibv_context_1_0 *context, uint8_t port_num,
				 struct ibv_port_attr *port_attr)
{
	struct ibv_port_attr attr;
	int ret;

	memset(&attr, 0, sizeof(attr));
	/* The exported function, not verbs.h's inline of the same name. */
	ret = (ibv_query_port)(context->real_context, port_num,
			       (struct _compat_ibv_port_attr *)&attr);
	if (ret)
		return ret;
	memcpy(port_attr, &attr, PORT_ATTR_1_0_SIZE);
	return 0;
}
COMPAT_1_0(ibv_query_port_1_0, ibv_query_port);

SV_EXPORT int ibv_query_gid_1_0(struct ibv_context_1_0 *context, uint8_t port_num, int index,
				union ibv_gid *gid)
{
	return ibv_query_gid(context->real_context, port_num, index, gid);
}
COMPAT_1_0(ibv_query_gid_1_0, ibv_query_gid);

SV_EXPORT int ibv_query_pkey_1_0(struct ibv_context_1_0 *context, uint8_t port_num, int index,
				 __be16 *pkey)
{
	return ibv_query_pkey(context->real_context, port_num, index, pkey);
}
COMPAT_1_0(ibv_query_pkey_1_0, ibv_query_pkey);

/* ------------------------------------------------------------------------
 * Protection domains and memory regions.
 */

SV_EXPORT struct ibv_pd_1_0 *ibv_alloc_pd_1_0(struct ibv_context_1_0 *context)
{
	struct ibv_pd_1_0 *pd;

	pd = calloc(1, sizeof(*pd));
	if (!pd)
		return NULL;
	pd->real_pd = ibv_alloc_pd(context->real_context);
	if (!pd->real_pd) {
		free(pd);
		return NULL;
	}
	pd->context = context;
	pd->handle = pd->real_pd->handle;
	return pd;
}
COMPAT_1_0(ibv_alloc_pd_1_0, ibv_alloc_pd);

SV_EXPORT int ibv_dealloc_pd_1_0(struct ibv_pd_1_0 *pd)
{
	int ret = ibv_dealloc_pd(pd->real_pd);

	if (ret)
		return ret;
	free(pd);
	return 0;
}
COMPAT_1_0(ibv_dealloc_pd_1_0, ibv_dealloc_pd);

SV_EXPORT struct ibv_mr_1_0 *ibv_reg_mr_1_0(struct ibv_pd_1_0 *pd, void *addr, size_t length,
					    int access)
{
	struct ibv_mr_1_0 *mr;

	mr = calloc(1, sizeof(*mr));
	if (!mr)
		return NULL;
	/* The exported function, not verbs.h's inline of the same name. */
	mr->real_mr = (ibv_reg_mr)(pd->real_pd, addr, length, access);
	if (!mr->real_mr) {
		free(mr);
		return NULL;
	}
	mr->context = pd->context;
	mr->pd = pd;
	mr->handle = mr->real_mr->handle;
	mr->lkey = mr->real_mr->lkey;
	mr->rkey = mr->real_mr->rkey;
	return mr;
}
COMPAT_1_0(ibv_reg_mr_1_0, ibv_reg_mr);

SV_EXPORT int ibv_dereg_mr_1_0(struct ibv_mr_1_0 *mr)
{
	int ret = ibv_dereg_mr(mr->real_mr);

	if (ret)
		return ret;
	free(mr);
	return 0;
}
COMPAT_1_0(ibv_dereg_mr_1_0, ibv_dereg_mr);

/* ------------------------------------------------------------------------
 * Completion queues.
 */

SV_EXPORT struct ibv_cq_1_0 *ibv_create_cq_1_0(struct ibv_context_1_0 *context, int cqe,
					       void *cq_context, struct ibv_comp_channel *channel,
					       int comp_vector)
{
	struct ibv_cq_1_0 *cq;

	cq = calloc(1, sizeof(*cq));
	if (!cq)
		return NULL;
	/* The wrapper is the real CQ's context from birth: events may race. */
	cq->real_cq = ibv_create_cq(context->real_context, cqe, cq, channel, comp_vector);
	if (!cq->real_cq) {
		free(cq);
		return NULL;
	}
	cq->context = context;
	cq->cq_context = cq_context;
	cq->handle = cq->real_cq->handle;
	cq->cqe = cq->real_cq->cqe;
	pthread_mutex_init(&cq->mutex, NULL);
	pthread_cond_init(&cq->cond, NULL);
	return cq;
}
COMPAT_1_0(ibv_create_cq_1_0, ibv_create_cq);

SV_EXPORT int ibv_resize_cq_1_0(struct ibv_cq_1_0 *cq, int cqe)
{
	int ret = ibv_resize_cq(cq->real_cq, cqe);

	if (!ret)
		cq->cqe = cq->real_cq->cqe;
	return ret;
}
COMPAT_1_0(ibv_resize_cq_1_0, ibv_resize_cq);

SV_EXPORT int ibv_destroy_cq_1_0(struct ibv_cq_1_0 *cq)
{
	int ret = ibv_destroy_cq(cq->real_cq);

	if (ret)
		return ret;
	pthread_cond_destroy(&cq->cond);
	pthread_mutex_destroy(&cq->mutex);
	free(cq);
	return 0;
}
COMPAT_1_0(ibv_destroy_cq_1_0, ibv_destroy_cq);

SV_EXPORT int ibv_get_cq_event_1_0(struct ibv_comp_channel *channel, struct ibv_cq_1_0 **cq,
				   void **cq_context)
{
	struct ibv_cq *real_cq;
	void *wrapper;
	int ret;

	/* 1.1 reports the real CQ's context, which is our wrapper. */
	ret = ibv_get_cq_event(channel, &real_cq, &wrapper);
	if (ret)
		return ret;
	*cq = wrapper;
	*cq_context = (*cq)->cq_context;
	return 0;
}
COMPAT_1_0(ibv_get_cq_event_1_0, ibv_get_cq_event);

SV_EXPORT void ibv_ack_cq_events_1_0(struct ibv_cq_1_0 *cq, unsigned int nevents)
{
	ibv_ack_cq_events(cq->real_cq, nevents);
}
COMPAT_1_0(ibv_ack_cq_events_1_0, ibv_ack_cq_events);

/* ------------------------------------------------------------------------
 * Shared receive queues.
 */

SV_EXPORT struct ibv_srq_1_0 *ibv_create_srq_1_0(struct ibv_pd_1_0 *pd,
						 struct ibv_srq_init_attr *srq_init_attr)
{
	struct ibv_srq_init_attr attr = *srq_init_attr;
	struct ibv_srq_1_0 *srq;

	srq = calloc(1, sizeof(*srq));
	if (!srq)
		return NULL;
	attr.srq_context = srq;
	srq->real_srq = ibv_create_srq(pd->real_pd, &attr);
	if (!srq->real_srq) {
		free(srq);
		return NULL;
	}
	/* The provider reports the sizes it granted. */
	srq_init_attr->attr = attr.attr;
	srq->context = pd->context;
	srq->srq_context = srq_init_attr->srq_context;
	srq->pd = pd;
	srq->handle = srq->real_srq->handle;
	pthread_mutex_init(&srq->mutex, NULL);
	pthread_cond_init(&srq->cond, NULL);
	return srq;
}
COMPAT_1_0(ibv_create_srq_1_0, ibv_create_srq);

SV_EXPORT int ibv_modify_srq_1_0(struct ibv_srq_1_0 *srq, struct ibv_srq_attr *srq_attr,
				 int srq_attr_mask)
{
	return ibv_modify_srq(srq->real_srq, srq_attr, srq_attr_mask);
}
COMPAT_1_0(ibv_modify_srq_1_0, ibv_modify_srq);

SV_EXPORT int ibv_query_srq_1_0(struct ibv_srq_1_0 *srq, struct ibv_srq_attr *srq_attr)
{
	return ibv_query_srq(srq->real_srq, srq_attr);
}
COMPAT_1_0(ibv_query_srq_1_0, ibv_query_srq);

SV_EXPORT int ibv_destroy_srq_1_0(struct ibv_srq_1_0 *srq)
{
	int ret = ibv_destroy_srq(srq->real_srq);

	if (ret)
		return ret;
	pthread_cond_destroy(&srq->cond);
	pthread_mutex_destroy(&srq->mutex);
	free(srq);
	return 0;
}
COMPAT_1_0(ibv_destroy_srq_1_0, ibv_destroy_srq);

/* ------------------------------------------------------------------------
 * Queue pairs.
 */

SV_EXPORT struct ibv_qp_1_0 *ibv_create_qp_1_0(struct ibv_pd_1_0 *pd,
					       struct ibv_qp_init_attr_1_0 *qp_init_attr)
{
	struct ibv_qp_init_attr attr;
	struct ibv_qp_1_0 *qp;

	if (!qp_init_attr->send_cq || !qp_init_attr->recv_cq) {
		errno = EINVAL;
		return NULL;
	}
	qp = calloc(1, sizeof(*qp));
	if (!qp)
		return NULL;

	memset(&attr, 0, sizeof(attr));
	attr.qp_context = qp;
	attr.send_cq = qp_init_attr->send_cq->real_cq;
	attr.recv_cq = qp_init_attr->recv_cq->real_cq;
	attr.srq = qp_init_attr->srq ? qp_init_attr->srq->real_srq : NULL;
	attr.cap = qp_init_attr->cap;
	attr.qp_type = qp_init_attr->qp_type;
	attr.sq_sig_all = qp_init_attr->sq_sig_all;

	qp->real_qp = ibv_create_qp(pd->real_pd, &attr);
	if (!qp->real_qp) {
		free(qp);
		return NULL;
	}
	/* The provider reports the capabilities it granted. */
	qp_init_attr->cap = attr.cap;

	qp->context = pd->context;
	qp->qp_context = qp_init_attr->qp_context;
	qp->pd = pd;
	qp->send_cq = qp_init_attr->send_cq;
	qp->recv_cq = qp_init_attr->recv_cq;
	qp->srq = qp_init_attr->srq;
	qp->handle = qp->real_qp->handle;
	qp->qp_num = qp->real_qp->qp_num;
	qp->state = qp->real_qp->state;
	qp->qp_type = qp_init_attr->qp_type;
	pthread_mutex_init(&qp->mutex, NULL);
	pthread_cond_init(&qp->cond, NULL);
	return qp;
}
COMPAT_1_0(ibv_create_qp_1_0, ibv_create_qp);

SV_EXPORT int ibv_query_qp_1_0(struct ibv_qp_1_0 *qp, struct ibv_qp_attr *attr, int attr_mask,
			       struct ibv_qp_init_attr_1_0 *init_attr)
{
	struct ibv_qp_init_attr real_init_attr;
	struct ibv_qp_attr real_attr;
	int ret;

	memset(&real_attr, 0, sizeof(real_attr));
	memset(&real_init_attr, 0, sizeof(real_init_attr));
	ret = ibv_query_qp(qp->real_qp, &real_attr, attr_mask, &real_init_attr);
	if (ret)
		return ret;

	memcpy(attr, &real_attr, QP_ATTR_1_0_SIZE);
	/* Our own record, rather than mapping the real objects back. */
	init_attr->qp_context = qp->qp_context;
	init_attr->send_cq = qp->send_cq;
	init_attr->recv_cq = qp->recv_cq;
	init_attr->srq = qp->srq;
	init_attr->cap = real_init_attr.cap;
	init_attr->qp_type = qp->qp_type;
	init_attr->sq_sig_all = real_init_attr.sq_sig_all;
	return 0;
}
COMPAT_1_0(ibv_query_qp_1_0, ibv_query_qp);

SV_EXPORT int ibv_modify_qp_1_0(struct ibv_qp_1_0 *qp, struct ibv_qp_attr *attr, int attr_mask)
{
	struct ibv_qp_attr real_attr;
	int ret;

	/* A 1.0 attr ends before rate_limit; don't read past it. */
	memset(&real_attr, 0, sizeof(real_attr));
	memcpy(&real_attr, attr, QP_ATTR_1_0_SIZE);
	ret = ibv_modify_qp(qp->real_qp, &real_attr, attr_mask);
	if (!ret)
		qp->state = qp->real_qp->state;
	return ret;
}
COMPAT_1_0(ibv_modify_qp_1_0, ibv_modify_qp);

SV_EXPORT int ibv_destroy_qp_1_0(struct ibv_qp_1_0 *qp)
{
	int ret = ibv_destroy_qp(qp->real_qp);

	if (ret)
		return ret;
	pthread_cond_destroy(&qp->cond);
	pthread_mutex_destroy(&qp->mutex);
	free(qp);
	return 0;
}
COMPAT_1_0(ibv_destroy_qp_1_0, ibv_destroy_qp);

SV_EXPORT int ibv_attach_mcast_1_0(struct ibv_qp_1_0 *qp, union ibv_gid *gid, uint16_t lid)
{
	return ibv_attach_mcast(qp->real_qp, gid, lid);
}
COMPAT_1_0(ibv_attach_mcast_1_0, ibv_attach_mcast);

SV_EXPORT int ibv_detach_mcast_1_0(struct ibv_qp_1_0 *qp, union ibv_gid *gid, uint16_t lid)
{
	return ibv_detach_mcast(qp->real_qp, gid, lid);
}
COMPAT_1_0(ibv_detach_mcast_1_0, ibv_detach_mcast);

/* ------------------------------------------------------------------------
 * Address handles.
 */

SV_EXPORT struct ibv_ah_1_0 *ibv_create_ah_1_0(struct ibv_pd_1_0 *pd, struct ibv_ah_attr *attr)
{
	struct ibv_ah_1_0 *ah;

	ah = calloc(1, sizeof(*ah));
	if (!ah)
		return NULL;
	ah->real_ah = ibv_create_ah(pd->real_pd, attr);
	if (!ah->real_ah) {
		free(ah);
		return NULL;
	}
	ah->context = pd->context;
	ah->pd = pd;
	ah->handle = ah->real_ah->handle;
	return ah;
}
COMPAT_1_0(ibv_create_ah_1_0, ibv_create_ah);

SV_EXPORT int ibv_destroy_ah_1_0(struct ibv_ah_1_0 *ah)
{
	int ret = ibv_destroy_ah(ah->real_ah);

	if (ret)
		return ret;
	free(ah);
	return 0;
}
COMPAT_1_0(ibv_destroy_ah_1_0, ibv_destroy_ah);

/* ------------------------------------------------------------------------
 * The data path of a 1.0 program: entered through its ops table.
 */

static int poll_cq_1_0(struct ibv_cq_1_0 *cq, int num_entries, struct ibv_wc *wc)
{
	return ibv_poll_cq(cq->real_cq, num_entries, wc);
}

static int req_notify_cq_1_0(struct ibv_cq_1_0 *cq, int solicited_only)
{
	return ibv_req_notify_cq(cq->real_cq, solicited_only);
}

/*
 * Work requests changed shape after 1.0 (wr_id moved before next, send WRs
 * grew), so they are translated a batch at a time into a stack array and
 * posted. A failure in a later batch still honours the post contract:
 * every WR before *bad_wr was posted.
 */
enum { WR_BATCH_1_0 = 16 };

typedef int (*post_recv_fn)(void *queue, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr);

static int post_recv_batches(void *queue, post_recv_fn post, struct ibv_recv_wr_1_0 *wr,
			     struct ibv_recv_wr_1_0 **bad_wr)
{
	struct ibv_recv_wr batch[WR_BATCH_1_0];
	struct ibv_recv_wr_1_0 *first;
	struct ibv_recv_wr *real_bad;
	int n, ret;

	while (wr) {
		first = wr;
		for (n = 0; wr && n < WR_BATCH_1_0; n++, wr = wr->next) {
			batch[n].wr_id = wr->wr_id;
			batch[n].next = NULL;
			batch[n].sg_list = wr->sg_list;
			batch[n].num_sge = wr->num_sge;
			if (n)
				batch[n - 1].next = &batch[n];
		}

		real_bad = NULL;
		ret = post(queue, batch, &real_bad);
		if (ret) {
			/* Translate the real bad WR back by position. */
			if (real_bad >= batch && real_bad < batch + n)
				for (n = real_bad - batch; n; n--)
					first = first->next;
			*bad_wr = first;
			return ret;
		}
	}
	return 0;
}

static int post_qp_recv(void *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr)
{
	return ibv_post_recv(qp, wr, bad_wr);
}

static int post_srq_recv(void *srq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr)
{
	return ibv_post_srq_recv(srq, wr, bad_wr);
}

static int post_recv_1_0(struct ibv_qp_1_0 *qp, struct ibv_recv_wr_1_0 *wr,
			 struct ibv_recv_wr_1_0 **bad_wr)
{
	return post_recv_batches(qp->real_qp, post_qp_recv, wr, bad_wr);
}

static int post_srq_recv_1_0(struct ibv_srq_1_0 *srq, struct ibv_recv_wr_1_0 *wr,
			     struct ibv_recv_wr_1_0 **bad_wr)
{
	return post_recv_batches(srq->real_srq, post_srq_recv, wr, bad_wr);
}

static int post_send_1_0(struct ibv_qp_1_0 *qp, struct ibv_send_wr_1_0 *wr,
			 struct ibv_send_wr_1_0 **bad_wr)
{
	struct ibv_send_wr batch[WR_BATCH_1_0];
	struct ibv_send_wr_1_0 *first;
	struct ibv_send_wr *real_bad;
	bool is_ud = qp->qp_type == IBV_QPT_UD;
	int n, ret;

	while (wr) {
		first = wr;
		memset(batch, 0, sizeof(batch));
		for (n = 0; wr && n < WR_BATCH_1_0; n++, wr = wr->next) {
			batch[n].wr_id = wr->wr_id;
			batch[n].sg_list = wr->sg_list;
			batch[n].num_sge = wr->num_sge;
			batch[n].opcode = wr->opcode;
			batch[n].send_flags = wr->send_flags;
			batch[n].imm_data = wr->imm_data;
			memcpy(&batch[n].wr, &wr->wr, sizeof(batch[n].wr));
			if (is_ud)
				batch[n].wr.ud.ah = wr->wr.ud.ah ? wr->wr.ud.ah->real_ah : NULL;
			if (n)
				batch[n - 1].next = &batch[n];
		}

		real_bad = NULL;
		ret = ibv_post_send(qp->real_qp, batch, &real_bad);
		if (ret) {
			if (real_bad >= batch && real_bad < batch + n)
				for (n = real_bad - batch; n; n--)
					first = first->next;
			*bad_wr = first;
			return ret;
		}
	}
	return 0;
}

/* ibv_get_cq_event() of 1.1 has already done the provider's part. */
static void cq_event_1_0(struct ibv_cq_1_0 *cq)
{
	(void)cq;
}

static struct ibv_cq_1_0 *create_cq_op_1_0(struct ibv_context_1_0 *context, int cqe,
					   struct ibv_comp_channel *channel, int comp_vector)
{
	return ibv_create_cq_1_0(context, cqe, NULL, channel, comp_vector);
}

static void init_ops_1_0(struct ibv_context_ops_1_0 *ops)
{
	*ops = (struct ibv_context_ops_1_0){
	    .query_device = ibv_query_device_1_0,
	    .query_port = ibv_query_port_1_0,
	    .alloc_pd = ibv_alloc_pd_1_0,
	    .dealloc_pd = ibv_dealloc_pd_1_0,
	    .reg_mr = ibv_reg_mr_1_0,
	    .dereg_mr = ibv_dereg_mr_1_0,
	    .create_cq = create_cq_op_1_0,
	    .poll_cq = poll_cq_1_0,
	    .req_notify_cq = req_notify_cq_1_0,
	    .cq_event = cq_event_1_0,
	    .resize_cq = ibv_resize_cq_1_0,
	    .destroy_cq = ibv_destroy_cq_1_0,
	    .create_srq = ibv_create_srq_1_0,
	    .modify_srq = ibv_modify_srq_1_0,
	    .query_srq = ibv_query_srq_1_0,
	    .destroy_srq = ibv_destroy_srq_1_0,
	    .post_srq_recv = post_srq_recv_1_0,
	    .create_qp = ibv_create_qp_1_0,
	    .query_qp = ibv_query_qp_1_0,
	    .modify_qp = ibv_modify_qp_1_0,
	    .destroy_qp = ibv_destroy_qp_1_0,
	    .post_send = post_send_1_0,
	    .post_recv = post_recv_1_0,
	    .create_ah = ibv_create_ah_1_0,
	    .destroy_ah = ibv_destroy_ah_1_0,
	    .attach_mcast = ibv_attach_mcast_1_0,
	    .detach_mcast = ibv_detach_mcast_1_0,
	};
}
