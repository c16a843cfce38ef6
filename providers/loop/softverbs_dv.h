/* SPDX-License-Identifier: MIT */
/*
 * <infiniband/softverbs_dv.h>: what the softverbs loop device offers beyond
 * rdma-core's verbs, in the spirit of mlx5dv.h.  Every call goes through the
 * provider's ops; on a device that does not implement one it fails with
 * EOPNOTSUPP.  Link with our libibverbs.so.1 (symbols at version
 * SOFTVERBS_1.0).  See docs/memory.md.
 */
#ifndef SOFTVERBS_DV_H
#define SOFTVERBS_DV_H

#include <infiniband/verbs.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- fd-backed memory regions ---- */

enum softverbs_fd_type {
	/* A dma-buf exporter's fd (udmabuf, a GPU driver): mapped with mmap. */
	SOFTVERBS_FD_DMABUF = 1,
	/* A memfd, a /dev/shm (POSIX shm) or other tmpfs / regular file. */
	SOFTVERBS_FD_MEMFD = 2,
};

/*
 * Registers [offset, offset + length) of the object behind fd, named iova on
 * the wire.  The library keeps its own duplicate of fd for the MR's life, so
 * the caller may close fd at once.  Peers of the fabric reach the memory by
 * mapping the same object: a plain memcpy per transfer, no system call.
 * Fails (NULL, errno set, nothing registered) with EBADF for a bad fd,
 * EINVAL for a range outside the object, bad flags or an unknown type,
 * ENODEV/EACCES when the object cannot be mapped.
 */
struct ibv_mr *softverbs_reg_mr_fd(struct ibv_pd *pd, int fd, enum softverbs_fd_type type,
				   uint64_t offset, size_t length, uint64_t iova,
				   unsigned int access);

/*
 * Changes an fd-backed MR in place, keeping its keys.  flags as for
 * ibv_rereg_mr: IBV_REREG_MR_CHANGE_TRANSLATION (fd, type, offset, length,
 * iova), IBV_REREG_MR_CHANGE_PD, IBV_REREG_MR_CHANGE_ACCESS.  Returns 0 or an
 * errno; on error the MR is unchanged.
 */
int softverbs_rereg_mr_fd(struct ibv_mr *mr, int flags, struct ibv_pd *pd, int fd,
			  enum softverbs_fd_type type, uint64_t offset, size_t length,
			  uint64_t iova, unsigned int access);

/* ---- BMME fast registration through the send queue ---- */

/*
 * Allocates a key with no memory behind it (invalid until a fast-register
 * WR registers it).  max_pages bounds the block list of a later
 * registration (1 to 65535).  Free it with ibv_dereg_mr.
 */
struct ibv_mr *softverbs_alloc_fast_reg_mr(struct ibv_pd *pd, uint32_t max_pages);

struct softverbs_fast_reg_wr {
	uint64_t wr_id;
	unsigned int send_flags; /* IBV_SEND_SIGNALED, IBV_SEND_FENCE */
	struct ibv_mr *mr;	 /* From softverbs_alloc_fast_reg_mr */
	uint8_t key;		 /* The new low 8 bits of lkey/rkey */
	unsigned int access;	 /* IBV_ACCESS_*; IBV_ACCESS_ZERO_BASED: iova 0 */
	uint64_t iova;		 /* First byte's address on the wire */
	uint64_t length;
	/*
	 * Without a block list (page_list NULL): addr is the first byte of a
	 * virtually contiguous range.  With one: num_pages blocks of
	 * 1 << page_shift bytes each (page_shift 12 to 30), the memory starting
	 * addr bytes into page_list[0].
	 */
	uint64_t addr;
	const uint64_t *page_list;
	uint32_t num_pages;
	uint32_t page_shift;
};

/* Completion opcode of a fast-register WR (8 is unused by enum ibv_wc_opcode). */
#define SOFTVERBS_WC_FAST_REG ((enum ibv_wc_opcode)8)

/*
 * Posts a fast-register WR on qp's send queue.  It runs in order with the
 * WRs around it (LOCAL_INV and SEND_WITH_INV invalidate the key again), and
 * completes with SOFTVERBS_WC_FAST_REG, or IBV_WC_MW_BIND_ERR when the key,
 * the PD, the rights or the block list are wrong.  On success mr->lkey and
 * mr->rkey carry the new key.  Returns 0 or an errno (EINVAL: a malformed
 * WR, nothing posted).
 */
int softverbs_post_fast_reg(struct ibv_qp *qp, const struct softverbs_fast_reg_wr *wr);

/* The key with its low 8 bits replaced, as a fast-register WR makes it. */
static inline uint32_t softverbs_key_with(uint32_t key, uint8_t k)
{
	return (key & ~(uint32_t)0xff) | k;
}

#ifdef __cplusplus
}
#endif

#endif
