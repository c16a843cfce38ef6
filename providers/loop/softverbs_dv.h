/* SPDX-License-Identifier: MIT */
/*
 * <infiniband/softverbs_dv.h>: what the softverbs loop device offers beyond
 * rdma-core's verbs, in the spirit of mlx5dv.h.  Every call goes through the
 * provider's ops; on a device that does not implement one it fails with
 * EOPNOTSUPP.  Link with our libibverbs.so.1 (symbols at versions
 * SOFTVERBS_1.0, 1.1 for agents, 1.2 for shared ring memory).  See
 * docs/memory.md and docs/agent.md.
 */
#ifndef SOFTVERBS_DV_H
#define SOFTVERBS_DV_H

#include <infiniband/verbs.h>
#include <linux/futex.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

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

/* ---- Agent-driven send queues (SOFTVERBS_1.1, docs/agent.md) ---- */

/*
 * An agent is anything other than the library that posts work to a QP: a
 * thread, another process, a GPU kernel.  It writes WQEs into the QP's
 * send-queue ring and rings the doorbell with the inline helpers below, and
 * polls completions from a CQ ring the same way: no call into the library
 * on the data path.  The engine thread of the QP's process serves the
 * doorbell: it copies each WQE out of the ring and checks it (opcode,
 * lengths, keys) as it checks any WR, so a bad WQE fails with an error
 * completion, never with harm to anything but its own QP.
 *
 * The layouts below are those of kernel-abi/softverbs-abi.h (sv_send_wqe,
 * sv_sge, sv_cqe), which the provider asserts they match.
 */
#define SOFTVERBS_SQ_FORMAT_VERSION 1
#define SOFTVERBS_WQE_HDR_SIZE 192
#define SOFTVERBS_WQE_INLINE 1	     /* softverbs_wqe_ctrl.flags: data is inline */
#define SOFTVERBS_CQE_SQ_INDEX 4     /* softverbs_cqe.flags: src_qp is an SQ index */
#define SOFTVERBS_WQE_OP_FAST_REG 11 /* softverbs_wqe_ctrl.opcode of a fast-register */

struct softverbs_wqe_ctrl {
	uint8_t opcode;	     /* enum ibv_wr_opcode */
	uint8_t num_sge;     /* SGEs after the header */
	uint16_t flags;	     /* SOFTVERBS_WQE_INLINE */
	uint32_t send_flags; /* IBV_SEND_* */
	uint64_t wr_id;
	uint32_t imm;	     /* imm_data (network order), or the rkey to invalidate */
	uint32_t inline_len; /* With SOFTVERBS_WQE_INLINE: bytes after the header */
	uint32_t xrc_srqn;
	uint32_t index; /* Low 32 bits of the WQE's number */
};

struct softverbs_wqe {
	struct softverbs_wqe_ctrl ctrl;
	struct {
		uint64_t remote_addr;
		uint32_t rkey;
		uint32_t reserved;
	} raddr;
	struct {
		uint64_t compare_add;
		uint64_t swap;
	} atomic;
	uint8_t ud[64];	 /* UD address: see sv_wqe_ud */
	uint8_t mem[48]; /* BIND_MW / fast-register: see sv_wqe_mem */
	uint8_t reserved[16];
	/* Then ctrl.num_sge struct softverbs_sge, or ctrl.inline_len bytes.
	 * Inline data (SOFTVERBS_WQE_INLINE) only with SEND, SEND_WITH_IMM,
	 * SEND_WITH_INV, RDMA_WRITE, RDMA_WRITE_WITH_IMM (else the WQE fails
	 * with IBV_WC_LOC_QP_OP_ERR), and IBV_WR_ATOMIC_WRITE, whose 8-byte
	 * value is always inline (inline_len 8; else IBV_WC_LOC_LEN_ERR). */
};

struct softverbs_sge {
	uint64_t addr;
	uint32_t length;
	uint32_t lkey;
};

struct softverbs_cqe {
	uint32_t seq; /* (uint32_t)(index + 1) once the entry is written */
	uint32_t status; /* enum ibv_wc_status */
	uint64_t wr_id;
	uint32_t opcode; /* enum ibv_wc_opcode */
	uint32_t vendor_err;
	uint32_t byte_len;
	uint32_t imm_data;
	uint32_t qp_num;
	uint32_t src_qp; /* With SOFTVERBS_CQE_SQ_INDEX: the WQE's number, low 32 bits */
	uint32_t wc_flags;
	uint16_t pkey_index;
	uint16_t slid;
	uint8_t sl;
	uint8_t dlid_path_bits;
	uint8_t flags;
	uint8_t reserved0;
	uint32_t place;
	/* CLOCK_MONOTONIC ns of the completion, for a CQ created with
	 * IBV_WC_EX_WITH_COMPLETION_TIMESTAMP(_WALLCLOCK); 0 otherwise. */
	uint64_t timestamp;
};

/*
 * Ring memory from a parent domain's allocator: a QP created under a parent
 * domain with alloc/free callbacks (ibv_alloc_parent_domain) takes its
 * send-queue ring from alloc, with this resource type, a size and an
 * alignment of 4096, and gives it back through free when it is destroyed.
 * alloc may answer IBV_ALLOCATOR_USE_DEFAULT (the library's own memory) or
 * NULL (the QP is not created: ENOMEM).  Memory that is not 64-byte aligned
 * is given back and the creation fails with EINVAL.
 */
#define SOFTVERBS_RES_TYPE_SQ 0x5356000000000001ULL

/* ---- Ring memory shared with other processes (SOFTVERBS_1.2) ---- */

/*
 * A CQ created under a parent domain with alloc/free callbacks
 * (ibv_create_cq_ex with IBV_CQ_INIT_ATTR_MASK_PD and the parent domain in
 * parent_domain) takes its ring from alloc with this resource type, an
 * alignment of 4096, and a size of a whole number of pages; free gives it
 * back when the CQ is destroyed.  Peers (other processes) write completions
 * into the ring, so they must be able to map it: the memory must lie in a
 * range published with softverbs_dv_alloc_fd.  alloc may answer
 * IBV_ALLOCATOR_USE_DEFAULT (the library's own memory) or NULL (ENOMEM);
 * memory not 64-byte aligned is given back and creation fails with EINVAL,
 * as does published memory that is not page-aligned.  Memory nobody
 * published is given back through free at once and the CQ uses the
 * library's own memory, as for USE_DEFAULT (with one line on stderr per
 * process): softverbs_dv_cq_agent's ring address then is not the
 * allocator's.  ibv_resize_cq of a placed CQ fails with EOPNOTSUPP.
 */
#define SOFTVERBS_RES_TYPE_CQ 0x5356000000000002ULL

/*
 * The receive queue of a QP created under such a parent domain (not with an
 * SRQ) is placed the same way, with this type: peers take its WQEs.  The
 * same answers and rules apply as for SOFTVERBS_RES_TYPE_CQ; the ring goes
 * back through free when the QP is destroyed.  softverbs_dv_qp_rq hands it
 * to an agent.
 */
#define SOFTVERBS_RES_TYPE_RQ 0x5356000000000003ULL
/* An SRQ created with a parent domain as its PD: its ring, the same way
 * (freed when the SRQ is destroyed). */
#define SOFTVERBS_RES_TYPE_SRQ 0x5356000000000004ULL

/*
 * Tells the library that [addr, addr + len) of this process is bytes
 * [offset, offset + len) of the file behind fd (a memfd on tmpfs, mapped
 * MAP_SHARED), so that rings an allocator places there can be mapped by
 * other processes of the fabric.  Peers map it, so it must not shrink: the
 * file must be sealed with F_SEAL_SHRINK, or made with MFD_ALLOW_SEALING,
 * and then this call seals it (growing stays allowed).  Call it from the alloc
 * callback for the piece it returns, or once for the whole arena before
 * creating anything.  The library keeps its own duplicate of fd (the caller
 * may close fd) until the range is forgotten and no ring placed in it
 * lives.  addr - offset must be a multiple of the page size (as mmap makes
 * it).  A range replaces the published ranges it overlaps; fd = -1 forgets
 * them.  Peers take the descriptor from this process as for fd-backed MRs
 * (pidfd_getfd, which needs ptrace permission).  pd is the parent domain
 * (or any PD) of the device.  Returns 0 or an errno: EINVAL (a wrapping
 * range, misaligned offset, an fd that is not a regular file, or a file
 * that is not a tmpfs file sealed or sealable against shrinking: a memfd
 * without MFD_ALLOW_SEALING, a /dev/shm file, a hugetlbfs memfd), EBADF.
 */
int softverbs_dv_alloc_fd(struct ibv_pd *pd, void *addr, size_t len, int fd, uint64_t offset);

/* A QP's send-queue ring, as softverbs_dv_qp_agent hands it out. */
struct softverbs_dv_sq {
	void *ring;	     /* The ring's header */
	char *slots;	     /* Slot 0; slot i of WQE number n is n & (count - 1) */
	uint64_t *prod;	     /* Producer index */
	uint64_t *db_record; /* Doorbell record */
	uint32_t *sleeping;  /* Nonzero while the engine sleeps on db_record */
	uint64_t *retired;   /* Slots the agent has freed (see softverbs_dv_sq_retire) */
	uint32_t format_version; /* SOFTVERBS_SQ_FORMAT_VERSION */
	uint32_t count;		 /* Slots, a power of two */
	uint32_t stride;	 /* Bytes per slot */
	uint32_t max_sge;
	uint32_t max_inline;
	uint32_t max_wr; /* WQEs outstanding at most (the QP's max_send_wr) */
	uint32_t qpn;
	uint32_t reserved;
	uint64_t next;	   /* The agent's next WQE number (the helpers' state) */
	uint64_t freed;	   /* The agent's copy of *retired */
};

/* A CQ's ring, as softverbs_dv_cq_agent hands it out. */
struct softverbs_dv_cq {
	void *ring;
	struct softverbs_cqe *slots;
	uint64_t *cons; /* Consumer index, stored by the poller */
	uint32_t count; /* Entries, a power of two */
	uint32_t reserved;
	uint64_t head; /* The agent's next entry (the helpers' state) */
};

/*
 * Hands qp's send queue to an agent (on != 0) and describes its ring in
 * *sq, or takes it back (on == 0; sq may be NULL).  While an agent has it,
 * ibv_post_send and ibv_wr_complete on qp fail with EINVAL: one producer
 * at a time.  It is taken back only once every WQE posted has completed
 * (else EBUSY).  The QP must be RC, UC or UD, and not an XRC QP.  Returns
 * 0 or an errno.
 */
int softverbs_dv_qp_agent(struct ibv_qp *qp, int on, struct softverbs_dv_sq *sq);

/*
 * Hands cq's ring to an agent to poll (on != 0), or takes it back.  While
 * an agent has it, ibv_poll_cq on cq finds nothing (returns 0).  An agent
 * polls send completions and receives of WRITE_WITH_IMM: a small SEND
 * whose payload waits in the CQE (placed by ibv_poll_cq) completes with
 * IBV_WC_LOC_QP_OP_ERR at an agent.  Returns 0 or an errno.
 */
int softverbs_dv_cq_agent(struct ibv_cq *cq, int on, struct softverbs_dv_cq *cq_out);

/*
 * Moves the ring's addresses in *sq to another mapping of the same ring
 * memory: ring_here is where this process maps the ring's first byte (the
 * address sq->ring has in the owner).  For an agent in another process that
 * maps only the ring: the application's parent-domain allocator placed the
 * ring in shareable memory (a memfd, say) and knows its fd and offset; the
 * owner sends *sq and the fd, the agent maps fd+offset and calls this.
 * Every address in *sq is in the ring, so nothing else changes; the
 * helpers below then work on the agent's mapping.  SGE addresses stay the
 * owner's.
 */
static inline void softverbs_dv_sq_rebase(struct softverbs_dv_sq *sq, void *ring_here)
{
	char *old = (char *)sq->ring, *now = (char *)ring_here;
	sq->slots = now + (sq->slots - old);
	sq->prod = (uint64_t *)(now + ((char *)sq->prod - old));
	sq->db_record = (uint64_t *)(now + ((char *)sq->db_record - old));
	sq->sleeping = (uint32_t *)(now + ((char *)sq->sleeping - old));
	sq->retired = (uint64_t *)(now + ((char *)sq->retired - old));
	sq->ring = ring_here;
}

/* The slot of the next WQE, or NULL while max_wr WQEs are outstanding. */
static inline struct softverbs_wqe *softverbs_dv_sq_next(struct softverbs_dv_sq *sq)
{
	if (sq->next - sq->freed >= sq->max_wr) {
		sq->freed = __atomic_load_n(sq->retired, __ATOMIC_ACQUIRE);
		if (sq->next - sq->freed >= sq->max_wr)
			return NULL;
	}
	return (struct softverbs_wqe *)(sq->slots +
					(size_t)(sq->next & (sq->count - 1)) * sq->stride);
}

/* Starts a WQE: clears its header, sets the control segment. */
static inline void softverbs_dv_wqe_ctrl(struct softverbs_dv_sq *sq, struct softverbs_wqe *w,
					 enum ibv_wr_opcode op, unsigned int send_flags,
					 uint64_t wr_id)
{
	memset(w, 0, sizeof(*w));
	w->ctrl.opcode = (uint8_t)op;
	w->ctrl.send_flags = send_flags;
	w->ctrl.wr_id = wr_id;
	w->ctrl.index = (uint32_t)sq->next;
}

static inline void softverbs_dv_wqe_rdma(struct softverbs_wqe *w, uint64_t remote_addr,
					 uint32_t rkey)
{
	w->raddr.remote_addr = remote_addr;
	w->raddr.rkey = rkey;
}

/* Appends an SGE (up to the QP's max_sge). */
static inline void softverbs_dv_wqe_sge(struct softverbs_wqe *w, uint64_t addr, uint32_t length,
					uint32_t lkey)
{
	struct softverbs_sge *s = (struct softverbs_sge *)(w + 1);
	s[w->ctrl.num_sge].addr = addr;
	s[w->ctrl.num_sge].length = length;
	s[w->ctrl.num_sge].lkey = lkey;
	w->ctrl.num_sge++;
}

/* Carries len bytes inline (SEND and RDMA WRITE); -1 if over max_inline. */
static inline int softverbs_dv_wqe_inline(const struct softverbs_dv_sq *sq,
					  struct softverbs_wqe *w, const void *data, uint32_t len)
{
	if (len > sq->max_inline)
		return -1;
	memcpy(w + 1, data, len);
	w->ctrl.flags |= SOFTVERBS_WQE_INLINE;
	w->ctrl.send_flags |= IBV_SEND_INLINE;
	w->ctrl.inline_len = len;
	w->ctrl.num_sge = 0;
	return 0;
}

/* Publishes the WQE softverbs_dv_sq_next gave (and any before it not yet
 * rung): the producer index, then the doorbell record; wakes the engine
 * only when it sleeps. */
static inline void softverbs_dv_sq_post(struct softverbs_dv_sq *sq, int ring_doorbell)
{
	sq->next++;
	__atomic_store_n(sq->prod, sq->next, __ATOMIC_RELEASE);
	if (!ring_doorbell)
		return;
	__atomic_store_n(sq->db_record, sq->next, __ATOMIC_SEQ_CST);
	if (__atomic_load_n(sq->sleeping, __ATOMIC_SEQ_CST))
		syscall(SYS_futex, (uint32_t *)sq->db_record, FUTEX_WAKE, 1, NULL, NULL, 0);
}

/* ---- Agent-posted receive queues (SOFTVERBS_1.2) ---- */

/*
 * Receive-queue ring (kernel-abi's sv_rq_ring, sv_recv_wqe): one producer,
 * many consumers (the peers that deliver SENDs take WQEs).  The producer
 * fills slot prod & (count - 1) and then stores prod + 1 with release,
 * provided prod - cons < count.  Consumers check every WQE they take
 * (num_sge against the QP's max_recv_sge, each lkey against the QP's PD,
 * each range and right), so an agent's bad WQE fails its own receive only.
 */
#define SOFTVERBS_RQ_FORMAT_VERSION 1

struct softverbs_recv_wqe {
	uint64_t wr_id;
	uint32_t num_sge;
	uint32_t reserved;
	/* Then num_sge struct softverbs_sge (at most max_sge). */
};

/* A QP's receive-queue ring, as softverbs_dv_qp_rq hands it out. */
struct softverbs_dv_rq {
	void *ring;	/* The ring's header */
	char *slots;	/* Slot 0 */
	uint64_t *prod; /* Producer index, stored by the agent */
	uint64_t *cons; /* Consumer index, advanced by the consumers */
	uint32_t format_version; /* SOFTVERBS_RQ_FORMAT_VERSION */
	uint32_t count;		 /* Slots, a power of two (the QP's max_recv_wr) */
	uint32_t stride;	 /* Bytes per slot */
	uint32_t max_sge;
	uint32_t qpn;
	uint32_t reserved;
	uint64_t next; /* The agent's next WQE number (the helpers' state) */
};

/*
 * Hands qp's receive queue to an agent (on != 0) and describes its ring in
 * *rq, or takes it back (on == 0; rq may be NULL).  While an agent has it,
 * ibv_post_recv on qp fails with EINVAL: one producer at a time.  Receives
 * are not flushed when the agent posts to a QP in ERR (ibv_post_recv's are).
 * The QP must have a receive queue of its own (no SRQ).  Returns 0 or an
 * errno.
 */
int softverbs_dv_qp_rq(struct ibv_qp *qp, int on, struct softverbs_dv_rq *rq);

/* As softverbs_dv_sq_rebase, for a receive queue's ring. */
static inline void softverbs_dv_rq_rebase(struct softverbs_dv_rq *rq, void *ring_here)
{
	char *old = (char *)rq->ring, *now = (char *)ring_here;
	rq->slots = now + (rq->slots - old);
	rq->prod = (uint64_t *)(now + ((char *)rq->prod - old));
	rq->cons = (uint64_t *)(now + ((char *)rq->cons - old));
	rq->ring = ring_here;
}

/*
 * Posts one receive of n SGEs (0 < n <= max_sge) and publishes it: 0, or -1
 * when the ring is full or n is out of range.
 */
static inline int softverbs_dv_rq_post(struct softverbs_dv_rq *rq, uint64_t wr_id,
				       const struct softverbs_sge *sge, uint32_t n)
{
	struct softverbs_recv_wqe *w;
	if (n > rq->max_sge ||
	    rq->next - __atomic_load_n(rq->cons, __ATOMIC_ACQUIRE) >= rq->count)
		return -1;
	w = (struct softverbs_recv_wqe *)(rq->slots +
					  (size_t)(rq->next & (rq->count - 1)) * rq->stride);
	w->wr_id = wr_id;
	w->num_sge = n;
	if (n)
		memcpy(w + 1, sge, (size_t)n * sizeof(*sge));
	/* Its index, stamped last, for consumers (kernel-abi's sv_recv_wqe.seq) */
	__atomic_store_n(&w->reserved, (uint32_t)(rq->next + 1), __ATOMIC_RELEASE);
	rq->next++;
	__atomic_store_n(rq->prod, rq->next, __ATOMIC_RELEASE);
	return 0;
}

/*
 * Moves *cq's addresses to another mapping of the ring: ring_here is where
 * this process maps the ring's first byte (cq->ring in the owner).  For an
 * agent in another process polling a CQ placed by an allocator whose
 * memory was published with softverbs_dv_alloc_fd.
 */
static inline void softverbs_dv_cq_rebase(struct softverbs_dv_cq *cq, void *ring_here)
{
	char *old = (char *)cq->ring, *now = (char *)ring_here;
	cq->slots = (struct softverbs_cqe *)(now + ((char *)cq->slots - old));
	cq->cons = (uint64_t *)(now + ((char *)cq->cons - old));
	cq->ring = ring_here;
}

/* Takes the next completion into *out: 1, or 0 when there is none. */
static inline int softverbs_dv_cq_poll(struct softverbs_dv_cq *cq, struct softverbs_cqe *out)
{
	struct softverbs_cqe *slot = &cq->slots[cq->head & (cq->count - 1)];
	if (__atomic_load_n(&slot->seq, __ATOMIC_ACQUIRE) != (uint32_t)(cq->head + 1))
		return 0;
	memcpy(out, slot, sizeof(*out));
	if (out->flags & 2) /* A payload only ibv_poll_cq places */
		out->status = IBV_WC_LOC_QP_OP_ERR;
	cq->head++;
	__atomic_store_n(cq->cons, cq->head, __ATOMIC_RELEASE);
	return 1;
}

/* Frees the slots of a send completion's WQE and of those before it. */
static inline void softverbs_dv_sq_retire(struct softverbs_dv_sq *sq,
					  const struct softverbs_cqe *e)
{
	uint64_t r;
	if (!(e->flags & SOFTVERBS_CQE_SQ_INDEX) || e->qp_num != sq->qpn)
		return;
	r = sq->freed + (uint32_t)(e->src_qp + 1 - (uint32_t)sq->freed);
	if (r - sq->freed > sq->next - sq->freed)
		return;
	sq->freed = r;
	__atomic_store_n(sq->retired, r, __ATOMIC_RELEASE);
}

#ifdef __cplusplus
}
#endif

#endif
