// SPDX-License-Identifier: MIT
// Registration, discovery and the context: the loop provider's entry points.
#include "c_boundary.h"
#include "loop.h"
#include "objects.h"
#include "rocev2/rocev2.h"
#include "service.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <vector>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
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
	// An abstract address takes no permission check, and its name is in
	// the world-readable /proc/net/unix: each datagram carries its
	// sender's credentials, and loop_get_async_event takes only its own
	// user's (a helper's probe: another user raised DEVICE_FATAL and
	// QP_FATAL in root's contexts).
	int on = 1;
	if (setsockopt(fd, SOL_SOCKET, SO_PASSCRED, &on, sizeof(on)) < 0) {
		close(fd);
		return -1;
	}
	sockaddr_un sa{};
	sa.sun_family = AF_UNIX;
	if (bind(fd, reinterpret_cast<sockaddr *>(&sa), sizeof(sa_family_t)) < 0) {
		close(fd);
		return -1;
	}
	return fd;
}

// This process's open contexts.  When the last one closes, the service
// segment and the lease are given back, so a process that closed its device
// leaves nothing in /dev/shm; at exit, whatever it still holds is.  pid tells
// a forked child (which inherits the count, the atexit handler and the
// parent's fabric object) from the process that opened them: a child never
// releases its parent's lease or segments.
struct process_contexts {
	std::mutex m;
	pid_t pid = 0;
	int open = 0;
	fabric *fab = nullptr;
};

process_contexts &contexts()
{
	// Never destroyed: the exit handler may run after static destructors.
	static auto *p = new process_contexts;
	return *p;
}

void release_at_exit()
{
	process_contexts &p = contexts();
	std::lock_guard<std::mutex> g(p.m);
	if (p.pid != getpid() || !p.fab)
		return;
	// No join and no unmap here: other threads may still run.  Releasing
	// the lease unlinks every segment it owns, the service segment too.
	p.fab->release_lease();
}

// Counts a new context; called with contexts().m held.
void context_opened(fabric *fab)
{
	process_contexts &p = contexts();
	if (p.pid != getpid()) {
		static std::once_flag once;
		std::call_once(once, [] { atexit(release_at_exit); });
		p.pid = getpid();
		p.open = 0;
	}
	p.fab = fab;
	p.open++;
}

// Contexts closed with objects still live: kept, with the core's part, for
// the life of the process (objects.h, "What a context owns").
std::mutex g_kept_lock;
std::vector<loop_context *> *g_kept_contexts;

void loop_free_context(ibv_context *ctx)
{
	loop_context *lctx = to_loop_context(ctx);
	// Nothing new is made on it from now (ctx_closed), also not while
	// what the application left is destroyed.
	lctx->closed.store(true, std::memory_order_release);
	// What the application left: destroyed, as the kernel does when the
	// device file closes (before contexts().m: the destroys may need it).
	// Not for a context of an ibv_import_device family: there the kernel
	// keeps the objects until the last of the family's files closes, which
	// we do not track; they stay, and so does this context's memory.  Nor
	// for the copy a forked child inherited: its close drops the child's
	// reference to a device file the parent still has open, and the
	// parent's objects go on (they are the parent's, in the registry).
	const bool inherited = lctx->opener != getpid();
	const bool family = lctx->imported_from || lctx->imports.load() > 0;
	const bool had_objects =
		family || inherited ? owned_count(ctx) != 0 : owned_close(ctx) != 0;
	process_contexts &p = contexts();
	std::lock_guard<std::mutex> g(p.m);
	if (!lctx->imported_from)
		objects_remove(kObjCtx, lctx->identity);
	if (lctx->async_fd >= 0)
		close(lctx->async_fd);
	lctx->async_fd = -1;
	fabric *fab = lctx->fab;
	if (had_objects) {
		// The application may still hold its objects' pointers, and they
		// point here: a later ibv_destroy_qp reaches the provider through
		// this context and answers ENOENT.  Only the command fd goes (and
		// nothing new is made on it: ctx_closed).
		if (ctx->cmd_fd >= 0)
			close(ctx->cmd_fd);
		ctx->cmd_fd = -1;
		std::lock_guard<std::mutex> k(g_kept_lock);
		if (!g_kept_contexts)
			g_kept_contexts = new std::vector<loop_context *>;
		g_kept_contexts->push_back(lctx);
	} else {
		verbs_uninit_context(&lctx->vctx);
		lctx->~loop_context();
		free(lctx);
	}
	if (!inherited && p.pid == getpid() && p.open > 0 && --p.open == 0 && fab) {
		service_stop();
		fab->release_lease();
	}
}

int loop_get_async_event(ibv_context *ctx, ibv_async_event *event)
{
	// Async events arrive as datagrams on async_fd, sent by whichever
	// process saw the event; each names an object of ours by registry slot.
	loop_context *lctx = to_loop_context(ctx);
	sv_async_msg msg;
	for (;;) {
		iovec v{&msg, sizeof(msg)};
		alignas(cmsghdr) char cbuf[CMSG_SPACE(sizeof(ucred))];
		msghdr mh{};
		mh.msg_iov = &v;
		mh.msg_iovlen = 1;
		mh.msg_control = cbuf;
		mh.msg_controllen = sizeof(cbuf);
		ssize_t n = recvmsg(lctx->async_fd, &mh, MSG_CMSG_CLOEXEC);
		if (n < 0)
			return errno;
		if (n != sizeof(msg))
			continue;
		// Only a process of our own user raises our events (the
		// fabric is per user): anything else is dropped.
		const cmsghdr *c = CMSG_FIRSTHDR(&mh);
		ucred who{};
		if (!c || c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_CREDENTIALS ||
		    c->cmsg_len != CMSG_LEN(sizeof(ucred)))
			continue;
		memcpy(&who, CMSG_DATA(c), sizeof(who));
		if (who.uid != geteuid())
			continue;
		event->event_type = static_cast<ibv_event_type>(msg.type);
		// The object's generation must be the message's: an event for an
		// object destroyed since, whose slot a new one took, is the old
		// one's and goes with it (as uverbs drops a destroyed object's).
		switch (msg.type) {
		case IBV_EVENT_CQ_ERR: {
			auto *cq = static_cast<ibv_cq *>(objects_find(SV_OBJ_CQ, msg.slot));
			if (cq && to_loop_cq(cq)->ref.gen == msg.generation) {
				event->element.cq = cq;
				return 0;
			}
			// Raised on a ring the CQ has since left (ibv_resize_cq).
			cq = static_cast<ibv_cq *>(objects_find_former(SV_OBJ_CQ, msg.slot, msg.generation));
			if (cq) {
				event->element.cq = cq;
				return 0;
			}
			break;
		}
		case IBV_EVENT_SRQ_LIMIT_REACHED:
		case IBV_EVENT_SRQ_ERR: {
			auto *srq = static_cast<ibv_srq *>(objects_find(SV_OBJ_SRQ, msg.slot));
			if (srq && to_loop_srq(srq)->ref.gen == msg.generation) {
				event->element.srq = srq;
				return 0;
			}
			break;
		}
		case IBV_EVENT_QP_FATAL:
		case IBV_EVENT_QP_REQ_ERR:
		case IBV_EVENT_QP_ACCESS_ERR:
		case IBV_EVENT_COMM_EST:
		case IBV_EVENT_SQ_DRAINED:
		case IBV_EVENT_QP_LAST_WQE_REACHED: {
			// A QP number carries the low bits of its slot's generation.
			auto *qp = static_cast<ibv_qp *>(objects_find(kObjQp, msg.slot));
			if (qp && (qp->qp_num >> SV_QPN_SLOT_BITS) == (msg.generation & SV_QPN_SLOT_MASK)) {
				event->element.qp = qp;
				return 0;
			}
			break;
		}
		case IBV_EVENT_PORT_ACTIVE:
		case IBV_EVENT_PORT_ERR:
		case IBV_EVENT_LID_CHANGE:
			event->element.port_num = static_cast<int>(msg.slot);
			return 0;
		case IBV_EVENT_DEVICE_FATAL:
			return 0;
		default:
			break;
		}
		// An event for an object we no longer have: drop it.
	}
}

const verbs_context_ops loop_ctx_ops = {
	.advise_mr = SV_C(loop_advise_mr),
	.alloc_dm = SV_C(loop_alloc_dm),
	.alloc_mw = SV_C(loop_alloc_mw),
	.alloc_null_mr = SV_C(loop_alloc_null_mr),
	.alloc_parent_domain = SV_C(loop_alloc_parent_domain),
	.alloc_pd = SV_C(loop_alloc_pd),
	.alloc_td = SV_C(loop_alloc_td),
	.attach_mcast = SV_C(loop_attach_mcast),
	.bind_mw = SV_C(loop_bind_mw),
	.close_xrcd = SV_C(loop_close_xrcd),
	.cq_event = SV_C(loop_cq_event),
	.create_ah = SV_C(loop_create_ah),
	.create_cq = SV_C(loop_create_cq),
	.create_cq_ex = SV_C(loop_create_cq_ex),
	.create_qp = SV_C(loop_create_qp),
	.create_qp_ex = SV_C(loop_create_qp_ex),
	.create_srq = SV_C(loop_create_srq),
	.create_srq_ex = SV_C(loop_create_srq_ex),
	.dealloc_mw = SV_C(loop_dealloc_mw),
	.dealloc_pd = SV_C(loop_dealloc_pd),
	.dealloc_td = SV_C(loop_dealloc_td),
	.dereg_mr = SV_C(loop_dereg_mr),
	.destroy_ah = SV_C(loop_destroy_ah),
	.destroy_cq = SV_C(loop_destroy_cq),
	.destroy_qp = SV_C(loop_destroy_qp),
	.destroy_srq = SV_C(loop_destroy_srq),
	.detach_mcast = SV_C(loop_detach_mcast),
	.free_context = SV_C(loop_free_context),
	.free_dm = SV_C(loop_free_dm),
	.get_async_event = SV_C(loop_get_async_event),
	.get_srq_num = SV_C(loop_get_srq_num),
	.import_dm = SV_C(loop_import_dm),
	.import_mr = SV_C(loop_import_mr),
	.import_pd = SV_C(loop_import_pd),
	.modify_cq = SV_C(loop_modify_cq),
	.modify_qp = SV_C(loop_modify_qp),
	.modify_srq = SV_C(loop_modify_srq),
	.open_qp = SV_C(loop_open_qp),
	.open_xrcd = SV_C(loop_open_xrcd),
	.poll_cq = SV_C(loop_poll_cq),
	.post_recv = SV_C(loop_post_recv),
	.post_send = SV_C(loop_post_send),
	.post_srq_recv = SV_C(loop_post_srq_recv),
	.query_device_ex = SV_C(loop_query_device_ex),
	.query_ece = SV_C(loop_query_ece),
	.query_gid_ex = SV_C(loop_query_gid_ex),
	.query_pkey = SV_C(loop_query_pkey),
	.query_port = SV_C(loop_query_port),
	.query_qp = SV_C(loop_query_qp),
	.query_rt_values = SV_C(loop_query_rt_values),
	.query_srq = SV_C(loop_query_srq),
	.reg_dm_mr = SV_C(loop_reg_dm_mr),
	.reg_dmabuf_mr = SV_C(loop_reg_dmabuf_mr),
	.reg_mr = SV_C(loop_reg_mr),
	.req_notify_cq = SV_C(loop_req_notify_cq),
	.rereg_mr = SV_C(loop_rereg_mr),
	.resize_cq = SV_C(loop_resize_cq),
	.set_ece = SV_C(loop_set_ece),
	.unimport_dm = SV_C(loop_unimport_dm),
	.unimport_mr = SV_C(loop_unimport_mr),
	.unimport_pd = SV_C(loop_unimport_pd),
	.sv_reg_mr_fd = SV_C(loop_reg_mr_fd),
	.sv_rereg_mr_fd = SV_C(loop_rereg_mr_fd),
	.sv_alloc_fast_reg_mr = SV_C(loop_alloc_fast_reg_mr),
	.sv_post_fast_reg = SV_C(loop_post_fast_reg),
	.sv_dv_qp_agent = SV_C(loop_dv_qp_agent),
	.sv_dv_cq_agent = SV_C(loop_dv_cq_agent),
	.sv_dv_alloc_fd = SV_C(loop_dv_alloc_fd),
	.sv_dv_qp_rq = SV_C(loop_dv_qp_rq),
};

// Peers copy into this process's registered memory with process_vm_writev,
// which needs ptrace access.  Where Yama restricts ptrace to descendants,
// name any process as an allowed tracer: the fabric is private to the user
// (0600 segments), and the kernel still requires the same credentials.
void allow_cross_memory_attach()
{
	static std::once_flag once;
	std::call_once(once, [] {
		const char *off = getenv("SOFTVERBS_NO_PTRACER");
		if (off && *off && strcmp(off, "0") != 0)
			return;
		prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
	});
}

// Creates a context on ibdev.  cmd_fd < 0 makes a new command fd: a memfd
// whose identity lets ibv_import_device() find this context again.
loop_context *new_context(ibv_device *ibdev, int cmd_fd)
{
	allow_cross_memory_attach();
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
	// Held to the end: a last context closing in another thread must not
	// release the lease this one is about to use.
	std::lock_guard<std::mutex> opening(contexts().m);
	int lease = fab->lease();
	if (lease < 0) {
		report_once("fabric '" + fab->cfg().fabric + "' has no free process slot (at most " +
			    std::to_string(SV_MAX_PROCS) + " processes)");
		errno = -lease;
		return nullptr;
	}
	bool own_fd = cmd_fd < 0;
	if (own_fd) {
		cmd_fd = memfd_create("softverbs-context", MFD_CLOEXEC);
		if (cmd_fd < 0)
			return nullptr;
	}
	auto *lctx = verbs_init_and_alloc_context(ibdev, cmd_fd, static_cast<loop_context *>(nullptr),
						  vctx, 0);
	if (!lctx) {
		if (own_fd)
			close(cmd_fd);
		return nullptr;
	}
	lctx->fab = fab;
	lctx->dev = rec;
	lctx->ldev = ldev;
	lctx->lease = lease;
	lctx->opener = getpid();
	lctx->async_fd = open_async_socket();
	if (lctx->async_fd < 0) {
		int e = errno;
		verbs_uninit_context(&lctx->vctx);
		free(lctx);
		errno = e;
		return nullptr;
	}
	lctx->vctx.context.async_fd = lctx->async_fd;
	lctx->lease_gen = fab->reg()->leases[lease].generation;
	// Peers that may not attach to our memory copy through our service.
	if (int e = service_start(*fab, static_cast<uint32_t>(lease)))
		report_once("no service segment (" + std::string(strerror(e)) +
			    "): peers refused cross-memory attach cannot reach this process");
	{
		sockaddr_un sa{};
		socklen_t len = sizeof(sa);
		getsockname(lctx->async_fd, reinterpret_cast<sockaddr *>(&sa), &len);
		lctx->async_len = static_cast<uint32_t>(len - offsetof(sockaddr_un, sun_path));
		memcpy(lctx->async_addr, sa.sun_path, lctx->async_len);
	}
	verbs_set_ops(&lctx->vctx, &loop_ctx_ops);
	context_opened(fab);
	return lctx;
}

uint32_t fd_identity(int fd)
{
	struct stat st;
	if (fstat(fd, &st) < 0)
		return 0;
	return static_cast<uint32_t>(st.st_ino);
}

verbs_context *loop_alloc_context(ibv_device *ibdev, int cmd_fd, void *private_data)
{
	(void)private_data;
	(void)cmd_fd; // No kernel: the provider makes its own command fd.
	loop_context *lctx = new_context(ibdev, -1);
	if (!lctx)
		return nullptr;
	lctx->identity = fd_identity(lctx->vctx.context.cmd_fd);
	objects_add(kObjCtx, lctx->identity, lctx);
	rocev2_device_open(lctx);
	return &lctx->vctx;
}

verbs_context *loop_import_context_impl(ibv_device *ibdev, int cmd_fd)
{
	auto *orig = static_cast<loop_context *>(objects_find(kObjCtx, fd_identity(cmd_fd)));
	if (!orig || &orig->ldev->vdev.device != ibdev) {
		// A context's command fd that is no open context of this
		// process: another process's (passed over a socket; a forked
		// child finds its inherited copies above), or one of ours
		// already closed.  Its objects live where this process cannot
		// act through them: not supported, rather than "not a command fd".
		char path[64], target[64] = "";
		snprintf(path, sizeof(path), "/proc/self/fd/%d", cmd_fd);
		ssize_t n = readlink(path, target, sizeof(target) - 1);
		bool ours = !orig && n > 0 &&
			    !strncmp(target, "/memfd:softverbs-context", strlen("/memfd:softverbs-context"));
		if (ours)
			debug_log("ibv_import_device: fd %d is no open context of this process "
				  "(another process's, or one closed); imports work within the "
				  "process that opened the device",
				  cmd_fd);
		errno = ours ? EOPNOTSUPP : EINVAL;
		return nullptr;
	}
	loop_context *lctx = new_context(ibdev, cmd_fd);
	if (!lctx)
		return nullptr;
	lctx->imported_from = orig;
	orig->imports.fetch_add(1, std::memory_order_relaxed);
	return &lctx->vctx;
}

const verbs_device_ops loop_dev_ops = {
	.name = "loop",
	.match_min_abi_version = SV_ABI_VERSION,
	.match_max_abi_version = SV_ABI_VERSION,
	.match_table = nullptr,
	.static_providers = nullptr,
	.match_device = nullptr,
	.alloc_context = SV_C(loop_alloc_context),
	.import_context = SV_C(loop_import_context_impl),
	.alloc_device = SV_C(loop_alloc_device),
	.uninit_device = SV_C(loop_uninit_device),
};

const verbs_provider_sv loop_provider = {
	.ops = &loop_dev_ops,
	.enumerate = SV_C(loop_enumerate),
};

__attribute__((constructor)) void register_loop()
{
	verbs_register_provider_sv(&loop_provider);
}

} // namespace

} // namespace loop
