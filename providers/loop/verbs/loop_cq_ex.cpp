// SPDX-License-Identifier: MIT
// Extended CQs: ibv_create_cq_ex and the start_poll / next_poll / end_poll
// iterator with its read_* getters.  The CQ is an ordinary loop_cq (same
// ring, same producers); the iterator copies each CQE into cq->cur and the
// getters read from that copy.
//
// Locking: start_poll takes cq->lock and end_poll drops it (a start_poll
// that finds nothing drops it itself, since the caller then must not call
// end_poll).  IBV_CREATE_CQ_ATTR_SINGLE_THREADED skips the lock.
//
// Timestamps: the device clock is CLOCK_MONOTONIC in nanoseconds, so
// hca_core_clock is 1 GHz (1000000 kHz) and read_completion_ts returns the
// CQE's own stamp; ibv_query_rt_values_ex reads the same clock.
//
// The iterator and the getters are entry points that C code calls through
// the ibv_cq_ex's pointers, not through the ops table's c_boundary
// wrappers: each is noexcept (none allocates, and cq_pop only copies out
// of the ring).
#include "loop.h"
#include "objects.h"
#include "loop_caps.h"

#include <cerrno>
#include <ctime>

namespace loop {

namespace {

constexpr uint64_t kSupportedWcFlags =
	IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_IMM | IBV_WC_EX_WITH_QP_NUM |
	IBV_WC_EX_WITH_SRC_QP | IBV_WC_EX_WITH_SLID | IBV_WC_EX_WITH_SL |
	IBV_WC_EX_WITH_DLID_PATH_BITS | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP |
	IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK;

loop_cq *cq_of(ibv_cq_ex *c)
{
	return to_loop_cq_ex(c);
}

bool single_threaded(loop_cq *cq)
{
	return cq->single_threaded;
}

void make_current(loop_cq *cq)
{
	ibv_cq_ex &x = cq->vcq.cq_ex;
	x.status = static_cast<ibv_wc_status>(cq->cur.status);
	x.wr_id = cq->cur.wr_id;
}

int start_poll(ibv_cq_ex *c, ibv_poll_cq_attr *attr) noexcept
{
	if (attr && attr->comp_mask)
		return EINVAL;
	loop_cq *cq = cq_of(c);
	if (!cq->life.is(kLifeCq)) [[unlikely]]
		return life_bad("ibv_start_poll", cq, cq->life, kLifeCq);
	bool lock = !single_threaded(cq);
	if (lock)
		cq->lock.lock();
	if (!cq->ring) [[unlikely]] { // Destroyed meanwhile by another thread
		if (lock)
			cq->lock.unlock();
		return EINVAL;
	}
	if (!cq_pop(cq, cq->cur)) {
		cq_poll_end(cq, false); // Empty, or at an entry the sender places
		if (lock)
			cq->lock.unlock();
		return ENOENT;
	}
	cq->locked = lock;
	cq->drained = false;
	make_current(cq);
	return 0;
}

int next_poll(ibv_cq_ex *c) noexcept
{
	loop_cq *cq = cq_of(c);
	if (!cq_pop(cq, cq->cur)) {
		cq->drained = true;
		return ENOENT;
	}
	make_current(cq);
	return 0;
}

void end_poll(ibv_cq_ex *c) noexcept
{
	loop_cq *cq = cq_of(c);
	// A batch that stopped before ENOENT is a poll_cq that filled its
	// array (loop_poll_cq).
	if (cq->ring)
		cq_poll_end(cq, !cq->drained);
	if (cq->locked) {
		cq->locked = false;
		cq->lock.unlock();
	}
}

ibv_wc_opcode read_opcode(ibv_cq_ex *c) noexcept
{
	return static_cast<ibv_wc_opcode>(cq_of(c)->cur.opcode);
}

uint32_t read_vendor_err(ibv_cq_ex *c) noexcept
{
	return cq_of(c)->cur.vendor_err;
}

uint32_t read_byte_len(ibv_cq_ex *c) noexcept
{
	return cq_of(c)->cur.byte_len;
}

__be32 read_imm_data(ibv_cq_ex *c) noexcept
{
	return cq_of(c)->cur.imm_data;
}

uint32_t read_qp_num(ibv_cq_ex *c) noexcept
{
	return cq_of(c)->cur.qp_num;
}

uint32_t read_src_qp(ibv_cq_ex *c) noexcept
{
	return cq_of(c)->cur.src_qp;
}

unsigned int read_wc_flags(ibv_cq_ex *c) noexcept
{
	return cq_of(c)->cur.wc_flags;
}

uint32_t read_slid(ibv_cq_ex *c) noexcept
{
	return cq_of(c)->cur.slid;
}

uint8_t read_sl(ibv_cq_ex *c) noexcept
{
	return cq_of(c)->cur.sl;
}

uint8_t read_dlid_path_bits(ibv_cq_ex *c) noexcept
{
	return cq_of(c)->cur.dlid_path_bits;
}

uint64_t read_completion_ts(ibv_cq_ex *c) noexcept
{
	return cq_of(c)->cur.timestamp;
}

uint64_t clock_ns(clockid_t id)
{
	timespec ts;
	clock_gettime(id, &ts);
	return static_cast<uint64_t>(ts.tv_sec) * 1000000000ULL + static_cast<uint64_t>(ts.tv_nsec);
}

// The stamp moved from the monotonic clock to the wall clock by their
// current offset (a step of the wall clock in between shows up as such).
uint64_t read_completion_wallclock_ns(ibv_cq_ex *c) noexcept
{
	uint64_t mono = clock_ns(CLOCK_MONOTONIC);
	uint64_t real = clock_ns(CLOCK_REALTIME);
	return cq_of(c)->cur.timestamp + (real - mono);
}

} // namespace

ibv_cq_ex *loop_create_cq_ex(ibv_context *ctx, ibv_cq_init_attr_ex *attr)
{
	if (ctx_closed(ctx, "ibv_create_cq_ex"))
		return nullptr;
	if (!attr) {
		errno = EINVAL;
		return nullptr;
	}
	uint32_t known = IBV_CQ_INIT_ATTR_MASK_FLAGS | IBV_CQ_INIT_ATTR_MASK_PD;
	if (attr->comp_mask & ~known) {
		errno = EOPNOTSUPP;
		return nullptr;
	}
	if (attr->wc_flags & ~kSupportedWcFlags) {
		errno = EOPNOTSUPP;
		return nullptr;
	}
	uint32_t flags = (attr->comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS) ? attr->flags : 0;
	if (flags & ~static_cast<uint32_t>(IBV_CREATE_CQ_ATTR_SINGLE_THREADED)) {
		errno = EOPNOTSUPP;
		return nullptr;
	}
	// A parent domain given here places the ring through its allocator
	// (SOFTVERBS_RES_TYPE_CQ, docs/agent.md); a CQ is not tied to a PD
	// otherwise.  It is held while the CQ lives (mlx5 counts it too).
	parent_guard parents;
	if (attr->comp_mask & IBV_CQ_INIT_ATTR_MASK_PD) {
		loop_pd *pd = attr->parent_domain ? to_loop_pd(attr->parent_domain) : nullptr;
		if (pd && !parents.add(pd->life, kLifePd)) {
			errno = life_bad("ibv_create_cq_ex", pd, pd->life, kLifePd);
			return nullptr;
		}
		if (!pd || !pd->parent_domain || attr->parent_domain->context != ctx) {
			errno = EINVAL;
			return nullptr;
		}
	}
	// ibv_create_cq checks its channel in the core; this verb comes here
	// straight from the application's inline ibv_create_cq_ex.
	if (attr->channel && verbs_comp_channel_check(attr->channel, ctx)) {
		errno = EINVAL;
		return nullptr;
	}
	if (attr->comp_vector >= static_cast<uint32_t>(ctx->num_comp_vectors) ||
	    attr->cqe > static_cast<uint32_t>(kMaxCqe)) {
		errno = EINVAL;
		return nullptr;
	}
	ibv_pd *placer = (attr->comp_mask & IBV_CQ_INIT_ATTR_MASK_PD) ? attr->parent_domain : nullptr;
	loop_cq *cq = cq_new(ctx, static_cast<int>(attr->cqe), attr->channel, placer);
	if (!cq)
		return nullptr;
	verbs_init_cq(&cq->vcq.cq, ctx, attr->channel, attr->cq_context);
	ibv_cq_ex &x = cq->vcq.cq_ex;
	x.comp_mask = 0;
	cq->single_threaded = flags & IBV_CREATE_CQ_ATTR_SINGLE_THREADED;
	cq->wc_flags_ex = attr->wc_flags;
	x.start_poll = start_poll;
	x.next_poll = next_poll;
	x.end_poll = end_poll;
	x.read_opcode = read_opcode;
	x.read_vendor_err = read_vendor_err;
	x.read_byte_len = read_byte_len;
	x.read_imm_data = read_imm_data;
	x.read_qp_num = read_qp_num;
	x.read_src_qp = read_src_qp;
	x.read_wc_flags = read_wc_flags;
	x.read_slid = read_slid;
	x.read_sl = read_sl;
	x.read_dlid_path_bits = read_dlid_path_bits;
	// Producers stamp entries only for a CQ that reads the stamps.  Set
	// before the CQ is returned: no QP can complete into it earlier.
	if (attr->wc_flags & (IBV_WC_EX_WITH_COMPLETION_TIMESTAMP |
			      IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK))
		std::atomic_ref<uint32_t>(cq->ring->flags).store(SV_CQ_STAMP, std::memory_order_release);
	if (attr->wc_flags & IBV_WC_EX_WITH_COMPLETION_TIMESTAMP)
		x.read_completion_ts = read_completion_ts;
	if (attr->wc_flags & IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK)
		x.read_completion_wallclock_ns = read_completion_wallclock_ns;
	cq->parents = parents.keep();
	return &x;
}

} // namespace loop
