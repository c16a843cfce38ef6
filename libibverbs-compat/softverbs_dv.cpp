// SPDX-License-Identifier: MIT
// The exported entry points of <infiniband/softverbs_dv.h>: argument checks
// the core can make, then a jump through the provider's ops, like every
// other verb.  Exported at SOFTVERBS_1.0 (docs/versioning.md).
#include "core.h"

#include "../providers/loop/softverbs_dv.h"

#include <cerrno>

EXPORT struct ibv_mr *softverbs_reg_mr_fd(struct ibv_pd *pd, int fd, enum softverbs_fd_type type,
					  uint64_t offset, size_t length, uint64_t iova,
					  unsigned int access)
{
	if (!pd) {
		errno = EINVAL;
		return nullptr;
	}
	const verbs_context_ops *ops = get_ops(pd->context);
	if (!ops->sv_reg_mr_fd) {
		errno = EOPNOTSUPP;
		return nullptr;
	}
	ibv_mr *mr = ops->sv_reg_mr_fd(pd, fd, type, offset, length, iova, access);
	if (mr) {
		mr->context = pd->context;
		mr->pd = pd;
		mr->addr = reinterpret_cast<void *>(static_cast<uintptr_t>(offset));
		mr->length = length;
	}
	return mr;
}

EXPORT int softverbs_rereg_mr_fd(struct ibv_mr *mr, int flags, struct ibv_pd *pd, int fd,
				 enum softverbs_fd_type type, uint64_t offset, size_t length,
				 uint64_t iova, unsigned int access)
{
	if (!mr || (flags & ~IBV_REREG_MR_FLAGS_SUPPORTED) || !flags ||
	    ((flags & IBV_REREG_MR_CHANGE_PD) && !pd))
		return EINVAL;
	const verbs_context_ops *ops = get_ops(mr->context);
	if (!ops->sv_rereg_mr_fd)
		return EOPNOTSUPP;
	int err = ops->sv_rereg_mr_fd(mr, flags, pd, fd, type, offset, length, iova, access);
	if (err)
		return err;
	if (flags & IBV_REREG_MR_CHANGE_PD)
		mr->pd = pd;
	if (flags & IBV_REREG_MR_CHANGE_ACCESS)
		reinterpret_cast<verbs_mr *>(mr)->access = static_cast<int>(access);
	if (flags & IBV_REREG_MR_CHANGE_TRANSLATION) {
		mr->addr = reinterpret_cast<void *>(static_cast<uintptr_t>(offset));
		mr->length = length;
	}
	return 0;
}

EXPORT struct ibv_mr *softverbs_alloc_fast_reg_mr(struct ibv_pd *pd, uint32_t max_pages)
{
	if (!pd) {
		errno = EINVAL;
		return nullptr;
	}
	const verbs_context_ops *ops = get_ops(pd->context);
	if (!ops->sv_alloc_fast_reg_mr) {
		errno = EOPNOTSUPP;
		return nullptr;
	}
	ibv_mr *mr = ops->sv_alloc_fast_reg_mr(pd, max_pages);
	if (mr) {
		mr->context = pd->context;
		mr->pd = pd;
		mr->addr = nullptr;
		mr->length = 0;
	}
	return mr;
}

EXPORT int softverbs_post_fast_reg(struct ibv_qp *qp, const struct softverbs_fast_reg_wr *wr)
{
	if (!qp || !wr || !wr->mr)
		return EINVAL;
	const verbs_context_ops *ops = get_ops(qp->context);
	if (!ops->sv_post_fast_reg)
		return EOPNOTSUPP;
	return ops->sv_post_fast_reg(qp, wr);
}

EXPORT int softverbs_dv_qp_agent(struct ibv_qp *qp, int on, struct softverbs_dv_sq *sq)
{
	if (!qp || (on && !sq))
		return EINVAL;
	const verbs_context_ops *ops = get_ops(qp->context);
	if (!ops->sv_dv_qp_agent)
		return EOPNOTSUPP;
	return ops->sv_dv_qp_agent(qp, on, sq);
}

EXPORT int softverbs_dv_cq_agent(struct ibv_cq *cq, int on, struct softverbs_dv_cq *cq_out)
{
	if (!cq || (on && !cq_out))
		return EINVAL;
	const verbs_context_ops *ops = get_ops(cq->context);
	if (!ops->sv_dv_cq_agent)
		return EOPNOTSUPP;
	return ops->sv_dv_cq_agent(cq, on, cq_out);
}

EXPORT int softverbs_dv_qp_rq(struct ibv_qp *qp, int on, struct softverbs_dv_rq *rq)
{
	if (!qp || (on && !rq))
		return EINVAL;
	const verbs_context_ops *ops = get_ops(qp->context);
	if (!ops->sv_dv_qp_rq)
		return EOPNOTSUPP;
	return ops->sv_dv_qp_rq(qp, on, rq);
}

EXPORT int softverbs_dv_alloc_fd(struct ibv_pd *pd, void *addr, size_t len, int fd,
				 uint64_t offset)
{
	if (!pd || !addr || !len)
		return EINVAL;
	const verbs_context_ops *ops = get_ops(pd->context);
	if (!ops->sv_dv_alloc_fd)
		return EOPNOTSUPP;
	return ops->sv_dv_alloc_fd(pd, addr, len, fd, offset);
}
