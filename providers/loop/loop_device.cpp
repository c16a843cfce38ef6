// SPDX-License-Identifier: MIT
// Registration, discovery and the context: the loop provider's entry points.
#include "loop.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

namespace loop {

namespace {

void report_once(const std::string &msg)
{
	static std::string last;
	if (msg == last)
		return;
	last = msg;
	fprintf(stderr, "softverbs: %s\n", msg.c_str());
}

int loop_enumerate(verbs_sysfs_dev *devs, int max)
{
	fabric *fab = nullptr;
	std::string err;
	int ret = process_fabric(fab, err);
	if (ret) {
		report_once(err);
		return -ret;
	}
	int n = 0;
	for (const device_config &dc : fab->cfg().devices) {
		sv_device_rec *rec = fab->device(dc.name);
		if (!rec) {
			report_once("fabric '" + fab->cfg().fabric + "' has no room for device '" +
				    dc.name + "' (at most " + std::to_string(SV_MAX_DEVICES) +
				    " devices per fabric)");
			continue;
		}
		if (n < max) {
			verbs_sysfs_dev &s = devs[n];
			memset(&s, 0, sizeof(s));
			snprintf(s.ibdev_name, sizeof(s.ibdev_name), "%s", rec->name);
			snprintf(s.sysfs_name, sizeof(s.sysfs_name), "uverbs%u", rec->index);
			// No sysfs here: the path names the fabric segment instead.
			snprintf(s.ibdev_path, sizeof(s.ibdev_path), "/dev/shm%s/%s",
				 fab->segment_path().c_str(), rec->name);
			s.node_guid = rec->node_guid;
			s.node_type = IBV_NODE_CA;
			s.ibdev_idx = static_cast<int>(rec->index);
			s.num_ports = rec->num_ports;
			s.abi_ver = SV_ABI_VERSION;
		}
		n++;
	}
	return n;
}

verbs_device *loop_alloc_device(verbs_sysfs_dev *sysfs)
{
	auto *d = new (std::nothrow) loop_device{};
	if (!d)
		return nullptr;
	d->name = sysfs->ibdev_name;
	fabric *fab = nullptr;
	std::string err;
	if (process_fabric(fab, err) == 0) {
		for (const device_config &dc : fab->cfg().devices)
			if (dc.name == d->name)
				d->cfg = dc;
	}
	return &d->vdev;
}

void loop_uninit_device(verbs_device *vdev)
{
	delete to_loop_device(&vdev->device);
}

int open_async_socket()
{
	int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	sockaddr_un sa{};
	sa.sun_family = AF_UNIX;
	if (bind(fd, reinterpret_cast<sockaddr *>(&sa), sizeof(sa_family_t)) < 0) {
		close(fd);
		return -1;
	}
	return fd;
}

void loop_free_context(ibv_context *ctx)
{
	loop_context *lctx = to_loop_context(ctx);
	if (lctx->async_fd >= 0)
		close(lctx->async_fd);
	verbs_uninit_context(&lctx->vctx);
	lctx->~loop_context();
	free(lctx);
}

int loop_get_async_event(ibv_context *ctx, ibv_async_event *event)
{
	// Async events arrive as datagrams on async_fd; until an object raises
	// one, a blocking read waits like on a kernel device's async fd.
	loop_context *lctx = to_loop_context(ctx);
	struct {
		uint32_t type;
		uint32_t reserved;
		uint64_t element;
	} msg;
	for (;;) {
		ssize_t n = recv(lctx->async_fd, &msg, sizeof(msg), 0);
		if (n < 0)
			return errno;
		if (n != sizeof(msg))
			continue;
		if (msg.type == IBV_EVENT_PORT_ACTIVE || msg.type == IBV_EVENT_PORT_ERR ||
		    msg.type == IBV_EVENT_LID_CHANGE || msg.type == IBV_EVENT_DEVICE_FATAL) {
			event->event_type = static_cast<ibv_event_type>(msg.type);
			event->element.port_num = static_cast<int>(msg.element);
			return 0;
		}
	}
}

const verbs_context_ops loop_ctx_ops = {
	.alloc_pd = loop_alloc_pd,
	.dealloc_pd = loop_dealloc_pd,
	.free_context = loop_free_context,
	.get_async_event = loop_get_async_event,
	.query_device_ex = loop_query_device_ex,
	.query_gid_ex = loop_query_gid_ex,
	.query_pkey = loop_query_pkey,
	.query_port = loop_query_port,
	.query_rt_values = loop_query_rt_values,
};

verbs_context *loop_alloc_context(ibv_device *ibdev, int cmd_fd, void *private_data)
{
	(void)private_data;
	loop_device *ldev = to_loop_device(ibdev);
	fabric *fab = nullptr;
	std::string err;
	int ret = process_fabric(fab, err);
	if (ret) {
		report_once(err);
		errno = ret;
		return nullptr;
	}
	sv_device_rec *rec = fab->device(ldev->name);
	if (!rec) {
		errno = ENODEV;
		return nullptr;
	}
	int lease = fab->lease();
	if (lease < 0) {
		report_once("fabric '" + fab->cfg().fabric + "' has no free process slot (at most " +
			    std::to_string(SV_MAX_PROCS) + " processes)");
		errno = -lease;
		return nullptr;
	}
	auto *lctx = verbs_init_and_alloc_context(ibdev, cmd_fd, static_cast<loop_context *>(nullptr), vctx, 0);
	if (!lctx)
		return nullptr;
	// The memory is calloc'd: construct the C++ members in place.
	lctx->fab = fab;
	lctx->dev = rec;
	lctx->ldev = ldev;
	lctx->lease = lease;
	lctx->async_fd = open_async_socket();
	if (lctx->async_fd < 0) {
		int e = errno;
		verbs_uninit_context(&lctx->vctx);
		free(lctx);
		errno = e;
		return nullptr;
	}
	lctx->vctx.context.async_fd = lctx->async_fd;
	verbs_set_ops(&lctx->vctx, &loop_ctx_ops);
	return &lctx->vctx;
}

const verbs_device_ops loop_dev_ops = {
	.name = "loop",
	.match_min_abi_version = SV_ABI_VERSION,
	.match_max_abi_version = SV_ABI_VERSION,
	.match_table = nullptr,
	.static_providers = nullptr,
	.match_device = nullptr,
	.alloc_context = loop_alloc_context,
	.import_context = nullptr,
	.alloc_device = loop_alloc_device,
	.uninit_device = loop_uninit_device,
};

const verbs_provider_sv loop_provider = {
	.ops = &loop_dev_ops,
	.enumerate = loop_enumerate,
};

__attribute__((constructor)) void register_loop()
{
	verbs_register_provider_sv(&loop_provider);
}

} // namespace

} // namespace loop
