// SPDX-License-Identifier: MIT
// XRC domains and shared XRC target QPs.
#include "loop.h"

#include <cerrno>
#include <fcntl.h>
#include <sys/stat.h>

namespace loop {

ibv_xrcd *loop_open_xrcd(ibv_context *ctx, ibv_xrcd_init_attr *attr)
{
	loop_context *lctx = to_loop_context(ctx);
	uint32_t known = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
	if (attr->comp_mask & ~known || !(attr->comp_mask & IBV_XRCD_INIT_ATTR_FD)) {
		errno = EINVAL;
		return nullptr;
	}
	int oflags = (attr->comp_mask & IBV_XRCD_INIT_ATTR_OFLAGS) ? attr->oflags : 0;
	if (oflags & ~(O_CREAT | O_EXCL)) {
		errno = EINVAL;
		return nullptr;
	}
	uint32_t id;
	if (attr->fd < 0) {
		// A private domain: only this process's objects can name it.
		fabric &fab = *lctx->fab;
		registry_guard g(fab);
		id = ++fab.reg()->next_xrcd & 0x7fffffff;
	} else {
		// Processes share a domain by opening the same file: the domain is
		// named by the file's identity, as the kernel keys it by inode.
		struct stat st;
		if (fstat(attr->fd, &st) < 0)
			return nullptr;
		uint64_t h = (static_cast<uint64_t>(st.st_dev) * 0x9e3779b97f4a7c15ULL) ^ st.st_ino;
		id = static_cast<uint32_t>(h ^ (h >> 32)) | 0x80000000u;
	}
	auto *x = new (std::nothrow) loop_xrcd{};
	if (!x) {
		errno = ENOMEM;
		return nullptr;
	}
	x->vxrcd.handle = id;
	x->vxrcd.comp_mask = 0;
	x->vxrcd.xrcd.context = ctx;
	return &x->vxrcd.xrcd;
}

int loop_close_xrcd(ibv_xrcd *xrcd)
{
	delete reinterpret_cast<loop_xrcd *>(xrcd);
	return 0;
}

ibv_qp *loop_open_qp(ibv_context *ctx, ibv_qp_open_attr *attr)
{
	(void)ctx;
	(void)attr;
	// Sharing an XRC target QP across processes needs the owner's QP object
	// in the opener; not implemented yet.
	errno = EOPNOTSUPP;
	return nullptr;
}

} // namespace loop
