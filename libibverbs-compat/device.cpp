// SPDX-License-Identifier: MIT
// Device discovery, provider registry and the context life cycle.
#include "core.h"

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>
#include <unordered_set>
#include <vector>

namespace {

constexpr int kMaxProviderDevices = 64;

struct registry {
	std::mutex lock; // Guards everything below.
	std::vector<const verbs_device_ops *> foreign;	 // rdma-core providers: never driven.
	std::vector<const verbs_provider_sv *> providers; // softverbs providers.
	std::vector<verbs_device *> devices;		 // Every device ever listed.
	// Contexts open now (ibv_open_device, ibv_import_device), so that
	// closing one twice, or a pointer that is not one, is EINVAL rather
	// than a provider freeing it again.
	std::unordered_set<const ibv_context *> open;
};

registry &reg()
{
	static registry *r = new registry; // Never freed: used from destructors of other libs.
	return *r;
}

bool verbose()
{
	static const bool v = [] {
		const char *s = getenv("SOFTVERBS_DEBUG");
		return s && *s && strcmp(s, "0") != 0;
	}();
	return v;
}

} // namespace

void core_log(const char *fmt, ...)
{
	if (!verbose())
		return;
	va_list ap;
	va_start(ap, fmt);
	fputs("softverbs: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
}

EXPORT void verbs_register_driver_34(const struct verbs_device_ops *ops)
{
	if (!ops)
		return;
	std::lock_guard<std::mutex> g(reg().lock);
	reg().foreign.push_back(ops);
	core_log("provider '%s' registered; it matches sysfs devices, of which there are none here",
		 ops->name ? ops->name : "?");
}

EXPORT void verbs_register_provider_sv(const struct verbs_provider_sv *provider)
{
	if (!provider || !provider->ops || !provider->enumerate || !provider->ops->alloc_device ||
	    !provider->ops->alloc_context) {
		fprintf(stderr, "softverbs: refusing an incomplete provider registration\n");
		return;
	}
	std::lock_guard<std::mutex> g(reg().lock);
	reg().providers.push_back(provider);
}

static verbs_device *find_device(const verbs_provider_sv *p, const verbs_sysfs_dev &sd)
{
	for (verbs_device *d : reg().devices)
		if (d->ops == p->ops && strcmp(d->sysfs->ibdev_name, sd.ibdev_name) == 0)
			return d;
	return nullptr;
}

static verbs_device *make_device(const verbs_provider_sv *p, const verbs_sysfs_dev &sd)
{
	auto *sysfs = static_cast<verbs_sysfs_dev *>(calloc(1, sizeof(verbs_sysfs_dev)));
	if (!sysfs)
		return nullptr;
	*sysfs = sd;
	verbs_device *vdev = p->ops->alloc_device(sysfs);
	if (!vdev) {
		free(sysfs);
		return nullptr;
	}
	vdev->ops = p->ops;
	vdev->sysfs = sysfs;
	vdev->refcount = 1; // The registry's own reference.
	ibv_device *dev = &vdev->device;
	dev->node_type = sd.node_type;
	dev->transport_type = ibv_transport_type(IBV_TRANSPORT_IB);
	snprintf(dev->name, sizeof(dev->name), "%s", sd.ibdev_name);
	snprintf(dev->dev_name, sizeof(dev->dev_name), "%s", sd.sysfs_name);
	snprintf(dev->dev_path, sizeof(dev->dev_path), "%s", sd.ibdev_path);
	snprintf(dev->ibdev_path, sizeof(dev->ibdev_path), "%s", sd.ibdev_path);
	return vdev;
}

static struct ibv_device **get_device_list(int *num_devices);

EXPORT struct ibv_device **ibv_get_device_list(int *num_devices)
{
	// No exception into C: the device vectors allocate.
	try {
		return get_device_list(num_devices);
	} catch (const std::bad_alloc &) {
		if (num_devices)
			*num_devices = 0;
		errno = ENOMEM;
		return nullptr;
	}
}

static struct ibv_device **get_device_list(int *num_devices)
{
	std::lock_guard<std::mutex> g(reg().lock);
	std::vector<verbs_device *> found;
	for (const verbs_provider_sv *p : reg().providers) {
		std::vector<verbs_sysfs_dev> devs(kMaxProviderDevices);
		int n = p->enumerate(devs.data(), kMaxProviderDevices);
		if (n < 0) {
			fprintf(stderr, "softverbs: provider '%s' could not list its devices: %s\n",
				p->ops->name, strerror(-n));
			errno = -n;
			if (num_devices)
				*num_devices = 0;
			return nullptr;
		}
		n = std::min(n, kMaxProviderDevices);
		for (int i = 0; i < n; i++) {
			verbs_device *d = find_device(p, devs[i]);
			if (!d) {
				d = make_device(p, devs[i]);
				if (!d)
					continue;
				reg().devices.push_back(d);
			}
			found.push_back(d);
		}
	}
	auto **list = static_cast<ibv_device **>(calloc(found.size() + 1, sizeof(ibv_device *)));
	if (!list) {
		errno = ENOMEM;
		if (num_devices)
			*num_devices = 0;
		return nullptr;
	}
	for (size_t i = 0; i < found.size(); i++) {
		found[i]->refcount++;
		list[i] = &found[i]->device;
	}
	if (num_devices)
		*num_devices = static_cast<int>(found.size());
	return list;
}

static void put_device(verbs_device *d)
{
	// Devices stay in the registry for the life of the process, like
	// rdma-core keeps a device whose sysfs entry has not disappeared.
	if (--d->refcount == 0 && d->ops->uninit_device)
		d->ops->uninit_device(d);
}

EXPORT void ibv_free_device_list(struct ibv_device **list)
{
	if (!list)
		return;
	std::lock_guard<std::mutex> g(reg().lock);
	for (ibv_device **p = list; *p; p++)
		put_device(verbs_get_device(*p));
	free(list);
}

EXPORT const char *ibv_get_device_name(struct ibv_device *device)
{
	if (!device) {
		errno = EINVAL;
		return nullptr;
	}
	return device->name;
}

EXPORT __be64 ibv_get_device_guid(struct ibv_device *device)
{
	if (!device) {
		errno = EINVAL;
		return 0;
	}
	return htobe64(verbs_get_device(device)->sysfs->node_guid);
}

EXPORT int ibv_get_device_index(struct ibv_device *device)
{
	if (!device)
		return -1;
	return verbs_get_device(device)->sysfs->ibdev_idx;
}

EXPORT struct ibv_context *ibv_open_device(struct ibv_device *device)
{
	if (!device) {
		errno = EINVAL;
		return nullptr;
	}
	verbs_device *vdev = verbs_get_device(device);
	verbs_context *vctx = vdev->ops->alloc_context(device, -1, nullptr);
	if (!vctx)
		return nullptr;
	{
		std::lock_guard<std::mutex> g(reg().lock);
		vdev->refcount++;
		reg().open.insert(&vctx->context);
	}
	return &vctx->context;
}

EXPORT struct ibv_context *ibv_import_device(int cmd_fd)
{
	// rdma-core asks the kernel which device a command fd belongs to; here
	// each device's provider is asked whether the fd is one of its contexts.
	int n = 0;
	ibv_device **list = ibv_get_device_list(&n);
	if (!list)
		return nullptr;
	ibv_context *ctx = nullptr;
	int err = EOPNOTSUPP;
	for (int i = 0; i < n && !ctx; i++) {
		verbs_device *vdev = verbs_get_device(list[i]);
		if (!vdev->ops->import_context)
			continue;
		verbs_context *vctx = vdev->ops->import_context(list[i], cmd_fd);
		if (vctx) {
			ctx = &vctx->context;
			std::lock_guard<std::mutex> g(reg().lock);
			vdev->refcount++;
			reg().open.insert(ctx);
		} else {
			err = errno;
		}
	}
	ibv_free_device_list(list);
	if (!ctx)
		errno = err;
	return ctx;
}

EXPORT int ibv_close_device(struct ibv_context *context)
{
	if (!context)
		return EINVAL;
	{
		std::lock_guard<std::mutex> g(reg().lock);
		if (!reg().open.count(context)) {
			core_log("ibv_close_device: %p is not an open context (closed already?)",
				 static_cast<void *>(context));
			return EINVAL;
		}
	}
	verbs_device *vdev = verbs_get_device(context->device);
	const verbs_context_ops *ops = get_ops(context);
	if (!ops->free_context)
		return EOPNOTSUPP;
	{
		// Out of the set before the provider frees it: a second close
		// racing this one finds it gone.
		std::lock_guard<std::mutex> g(reg().lock);
		if (!reg().open.erase(context))
			return EINVAL;
	}
	ops->free_context(context);
	std::lock_guard<std::mutex> g(reg().lock);
	put_device(vdev);
	return 0;
}

// ---- context life cycle (called by providers) ----

template <typename Fn> struct dummy;
template <typename R, typename... A> struct dummy<R (*)(A...)> {
	static R fn(A...)
	{
		if constexpr (std::is_pointer_v<R>) {
			errno = EOPNOTSUPP;
			return nullptr;
		} else if constexpr (!std::is_void_v<R>) {
			return EOPNOTSUPP;
		}
	}
};
#define DUMMY(ops_member) dummy<decltype(verbs_context_ops::ops_member)>::fn

EXPORT void *_verbs_init_and_alloc_context(struct ibv_device *device, int cmd_fd,
					   size_t alloc_size,
					   struct verbs_context *context_offset,
					   uint32_t driver_id)
{
	char *drv = static_cast<char *>(calloc(1, alloc_size));
	if (!drv) {
		errno = ENOMEM;
		return nullptr;
	}
	auto *vctx = reinterpret_cast<verbs_context *>(drv + reinterpret_cast<uintptr_t>(context_offset));
	auto *priv = new (std::nothrow) verbs_ex_private{};
	if (!priv) {
		free(drv);
		errno = ENOMEM;
		return nullptr;
	}
	priv->driver_id = driver_id;
	ibv_context *ctx = &vctx->context;
	ctx->device = device;
	ctx->cmd_fd = cmd_fd;
	ctx->async_fd = -1;
	ctx->num_comp_vectors = 1;
	pthread_mutex_init(&ctx->mutex, nullptr);
	ctx->abi_compat = __VERBS_ABI_IS_EXTENDED;
	vctx->sz = sizeof(*vctx);
	vctx->priv = priv;
	vctx->query_port = core_query_port_ex;
	// The inline data-path verbs jump through these without a check.
	ctx->ops.poll_cq = DUMMY(poll_cq);
	ctx->ops.req_notify_cq = DUMMY(req_notify_cq);
	ctx->ops.post_send = DUMMY(post_send);
	ctx->ops.post_recv = DUMMY(post_recv);
	ctx->ops.post_srq_recv = DUMMY(post_srq_recv);
	ctx->ops.alloc_mw = DUMMY(alloc_mw);
	ctx->ops.bind_mw = DUMMY(bind_mw);
	ctx->ops.dealloc_mw = DUMMY(dealloc_mw);
	return drv;
}

EXPORT void verbs_uninit_context(struct verbs_context *vctx)
{
	delete vctx->priv;
	vctx->priv = nullptr;
	pthread_mutex_destroy(&vctx->context.mutex);
	if (vctx->context.cmd_fd >= 0)
		close(vctx->context.cmd_fd);
}

EXPORT void verbs_set_ops(struct verbs_context *vctx, const struct verbs_context_ops *ops)
{
	verbs_context_ops &p = vctx->priv->ops;
	ibv_context_ops &c = vctx->context.ops;
	// Merge: a later call (a provider layering ops) only overrides what it sets.
#define PRIV(name)                                                                                 \
	if (ops->name)                                                                             \
	p.name = ops->name
#define CTX(name)                                                                                  \
	if (ops->name)                                                                             \
	p.name = c.name = ops->name
#define VCTX(name)                                                                                 \
	if (ops->name)                                                                             \
	p.name = vctx->name = ops->name
	VCTX(advise_mr);
	VCTX(alloc_dm);
	CTX(alloc_mw);
	VCTX(alloc_null_mr);
	VCTX(alloc_parent_domain);
	PRIV(alloc_pd);
	VCTX(alloc_td);
	PRIV(async_event);
	VCTX(attach_counters_point_flow);
	PRIV(attach_mcast);
	CTX(bind_mw);
	VCTX(close_xrcd);
	PRIV(cq_event);
	PRIV(create_ah);
	VCTX(create_counters);
	PRIV(create_cq);
	VCTX(create_cq_ex);
	if (ops->create_flow)
		p.create_flow = vctx->ibv_create_flow = ops->create_flow;
	VCTX(create_flow_action_esp);
	PRIV(create_qp);
	VCTX(create_qp_ex);
	VCTX(create_rwq_ind_table);
	PRIV(create_srq);
	VCTX(create_srq_ex);
	VCTX(create_wq);
	CTX(dealloc_mw);
	PRIV(dealloc_pd);
	VCTX(dealloc_td);
	PRIV(dereg_mr);
	PRIV(destroy_ah);
	VCTX(destroy_counters);
	PRIV(destroy_cq);
	if (ops->destroy_flow)
		p.destroy_flow = vctx->ibv_destroy_flow = ops->destroy_flow;
	VCTX(destroy_flow_action);
	PRIV(destroy_qp);
	VCTX(destroy_rwq_ind_table);
	PRIV(destroy_srq);
	VCTX(destroy_wq);
	PRIV(detach_mcast);
	PRIV(free_context);
	VCTX(free_dm);
	PRIV(get_async_event);
	VCTX(get_srq_num);
	PRIV(import_dm);
	PRIV(import_mr);
	PRIV(import_pd);
	VCTX(modify_cq);
	VCTX(modify_flow_action_esp);
	PRIV(modify_qp);
	VCTX(modify_qp_rate_limit);
	PRIV(modify_srq);
	VCTX(modify_wq);
	VCTX(open_qp);
	VCTX(open_xrcd);
	CTX(poll_cq);
	CTX(post_recv);
	CTX(post_send);
	VCTX(post_srq_ops);
	CTX(post_srq_recv);
	VCTX(query_device_ex);
	PRIV(query_ece);
	PRIV(sv_alloc_fast_reg_mr);
	PRIV(sv_post_fast_reg);
	PRIV(sv_dv_qp_agent);
	PRIV(sv_dv_cq_agent);
	PRIV(sv_dv_alloc_fd);
	PRIV(sv_dv_qp_rq);
	PRIV(sv_reg_mr_fd);
	PRIV(sv_rereg_mr_fd);
	PRIV(query_gid_ex);
	PRIV(query_pkey);
	PRIV(query_port);
	PRIV(query_qp);
	PRIV(query_qp_data_in_order);
	VCTX(query_rt_values);
	PRIV(query_srq);
	VCTX(read_counters);
	VCTX(reg_dm_mr);
	PRIV(reg_dmabuf_mr);
	PRIV(reg_mr);
	CTX(req_notify_cq);
	PRIV(rereg_mr);
	PRIV(resize_cq);
	PRIV(set_ece);
	PRIV(unimport_dm);
	PRIV(unimport_mr);
	PRIV(unimport_pd);
#undef PRIV
#undef CTX
#undef VCTX
}
