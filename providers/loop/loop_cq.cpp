// SPDX-License-Identifier: MIT
// Completion queues: a multi-producer ring in shared memory (the protocol is
// at sv_cq_ring in kernel-abi/softverbs-abi.h), polled by its owner.
#include "loop.h"
#include "objects.h"
#include "xfer.h"

#include <cerrno>
#include <cstring>
#include <ctime>
#include <climits>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

namespace loop {

namespace {

// Producers see bit 63 of prod set once the owner resized the ring away.
constexpr uint64_t kRingClosed = 1ULL << 63;

int notify_socket()
{
	static int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	return fd;
}

void send_dgram(const uint8_t *addr, uint32_t len, const void *msg, size_t msg_len)
{
	if (!len || len > sizeof(sockaddr_un::sun_path))
		return;
	sockaddr_un sa{};
	sa.sun_family = AF_UNIX;
	memcpy(sa.sun_path, addr, len);
	// Best effort: a full socket means the owner has events queued already.
	sendto(notify_socket(), msg, msg_len, MSG_DONTWAIT, reinterpret_cast<sockaddr *>(&sa),
	       static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + len));
}

void to_wc(const sv_cqe &e, ibv_wc &wc)
{
	wc.wr_id = e.wr_id;
	wc.status = static_cast<ibv_wc_status>(e.status);
	wc.opcode = static_cast<ibv_wc_opcode>(e.opcode);
	wc.vendor_err = e.vendor_err;
	wc.byte_len = e.byte_len;
	wc.imm_data = e.imm_data;
	wc.qp_num = e.qp_num;
	wc.src_qp = e.src_qp;
	wc.wc_flags = e.wc_flags;
	wc.pkey_index = e.pkey_index;
	wc.slid = e.slid;
	wc.sl = e.sl;
	wc.dlid_path_bits = e.dlid_path_bits;
}

sv_cqe_payload *payloads(sv_cq_ring *r)
{
	return reinterpret_cast<sv_cqe_payload *>(reinterpret_cast<char *>(r) + r->payload_offset);
}

int place_bytes(const mr_hit &hit, const uint8_t *data, uint32_t len)
{
	if (!hit.odp) {
		memcpy(reinterpret_cast<void *>(hit.addr), data, len);
		return 0;
	}
	iovec l{const_cast<uint8_t *>(data), len};
	iovec r{reinterpret_cast<void *>(hit.addr), len};
	return xfer(getpid(), false, &l, 1, &r, 1, xfer_dir::to_peer);
}

// Puts a message that travelled in the CQE's payload into the receive
// buffer.  The payload came through shared memory: its length and key are
// checked against this process's own key table before a byte is written.
void place(loop_cq *cq, sv_cqe &e, const sv_cqe_payload &pl)
{
	uint32_t len = std::min<uint32_t>(pl.len, SV_CQE_INLINE_MAX);
	mr_hit hit;
	if (mr_lookup(*cq->ctx->fab, pl.lkey, static_cast<uint32_t>(cq->ctx->lease), kAnyPdn,
		      pl.iova, len, IBV_ACCESS_LOCAL_WRITE, 0, hit) ||
	    hit.kind != SV_MR_KIND_MR) {
		e.status = IBV_WC_LOC_PROT_ERR;
		return;
	}
	// Ours, but on-demand memory may be unmapped: a checked copy then.
	if (place_bytes(hit, pl.data, len))
		e.status = IBV_WC_LOC_PROT_ERR;
}

thread_local uint32_t t_empty_polls;  // Consecutive empty polls by this thread
thread_local uint64_t t_empty_since; // and since when (0: not timed yet)

uint32_t *prod_word(sv_cq_ring *r)
{
	// The low half of prod (little endian): it changes with every reservation.
	return reinterpret_cast<uint32_t *>(&r->prod);
}

// Sleeps briefly until a producer reserves a slot: on a machine with more
// pollers than cores, a spinning poller would hold the core its peer needs
// to produce the completion (see sv_cq_ring's contract).
void cq_sleep(loop_cq *cq, const sv_cqe &slot, uint64_t c)
{
	sv_cq_ring *r = cq->ring;
	std::atomic_ref<uint32_t> waiters(r->waiters);
	auto seen = static_cast<uint32_t>(
		std::atomic_ref<uint64_t>(r->prod).load(std::memory_order_acquire));
	waiters.fetch_add(1, std::memory_order_seq_cst);
	if (std::atomic_ref<const uint32_t>(slot.seq).load(std::memory_order_seq_cst) !=
	    static_cast<uint32_t>(c + 1)) {
		timespec ts{0, kCqSleepNs};
		syscall(SYS_futex, prod_word(r), FUTEX_WAIT, seen, &ts, nullptr, 0);
	}
	waiters.fetch_sub(1, std::memory_order_relaxed);
}

// Takes the next completion, if any.  Caller holds cq->lock.
bool cq_take(loop_cq *cq, sv_cqe &out)
{
	sv_cq_ring *r = cq->ring;
	uint64_t c = r->cons;
	sv_cqe &slot = cq->slots[c & cq->mask];
	if (std::atomic_ref<uint32_t>(slot.seq).load(std::memory_order_acquire) !=
	    static_cast<uint32_t>(c + 1)) {
		// Timed per thread, over all its CQs: a thread that polls several
		// CQs and finds work on any of them never sleeps.  The clock is read
		// every 64 empty polls only.
		if ((++t_empty_polls & 63) == 0) {
			uint64_t now = now_ns();
			if (!t_empty_since)
				t_empty_since = now;
			else if (now - t_empty_since > kCqSpinNs)
				cq_sleep(cq, slot, c);
		}
		return false;
	}
	t_empty_polls = 0;
	t_empty_since = 0;
	out = slot;
	if ((out.flags & SV_CQE_PLACE) && r->payload_offset) {
		// Race the sender for the right to place (SV_CQE_PLACED).
		std::atomic_ref<uint8_t> f(slot.flags);
		uint8_t v = f.load(std::memory_order_acquire);
		while ((v & SV_CQE_PLACE) &&
		       !f.compare_exchange_weak(v, v & ~SV_CQE_PLACE, std::memory_order_acq_rel))
			;
		if (v & SV_CQE_PLACE)
			place(cq, out, payloads(r)[c & cq->mask]);
	}
	std::atomic_ref<uint64_t>(r->cons).store(c + 1, std::memory_order_release);
	return true;
}

loop_cq *new_cq(ibv_context *ctx, int cqe, ibv_comp_channel *channel)
{
	if (cqe < 1 || cqe > kMaxCqe) {
		errno = EINVAL;
		return nullptr;
	}
	loop_context *lctx = to_loop_context(ctx);
	auto *cq = new (std::nothrow) loop_cq{};
	if (!cq) {
		errno = ENOMEM;
		return nullptr;
	}
	uint32_t entries = round_pow2(static_cast<uint32_t>(cqe));
	void *map = queue_create(*lctx->fab, lctx->lease, SV_OBJ_CQ, entries, sizeof(sv_cqe),
				 sizeof(sv_cq_ring), 0, cq->ref,
				 static_cast<size_t>(entries) * sizeof(sv_cqe_payload));
	if (!map) {
		int e = errno;
		delete cq;
		errno = e;
		return nullptr;
	}
	cq->ctx = lctx;
	cq->ring = static_cast<sv_cq_ring *>(map);
	cq->slots = reinterpret_cast<sv_cqe *>(static_cast<char *>(map) + sizeof(sv_cq_ring));
	cq->mask = entries - 1;
	cq->capacity = entries;
	cq->ring->payload_offset =
		static_cast<uint32_t>(queue_bytes(sizeof(sv_cq_ring), entries, sizeof(sv_cqe)));
	memcpy(cq->ring->async_addr, lctx->async_addr, lctx->async_len);
	cq->ring->async_len = lctx->async_len;
	(void)channel; // Wired after verbs_init_cq, which sets cq->channel.
	return cq;
}

void wire_channel(loop_cq *cq)
{
	ibv_comp_channel *ch = cq->vcq.cq.channel;
	if (!ch)
		return;
	char addr[VERBS_CHANNEL_ADDR_MAX];
	size_t len = sizeof(addr);
	if (verbs_comp_channel_address(ch, addr, &len) == 0 &&
	    len <= sizeof(cq->ring->channel_addr)) {
		memcpy(cq->ring->channel_addr, addr, len);
		cq->ring->channel_len = static_cast<uint32_t>(len);
	}
	cq->ring->cookie = verbs_comp_channel_cookie(&cq->vcq.cq);
}

} // namespace

bool cq_has_payload(const sv_cq_ring *ring)
{
	// The array is in a peer's segment: it must lie inside it.
	uint64_t end = static_cast<uint64_t>(ring->payload_offset) +
		       static_cast<uint64_t>(ring->hdr.entries) * sizeof(sv_cqe_payload);
	return ring->payload_offset >= ring->hdr.slots_offset +
					       static_cast<uint64_t>(ring->hdr.entries) *
						       ring->hdr.entry_size &&
	       end <= ring->hdr.seg.seg_size;
}

uint64_t now_ns()
{
	timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return static_cast<uint64_t>(ts.tv_sec) * 1000000000ULL + static_cast<uint64_t>(ts.tv_nsec);
}

void send_async(const uint8_t *addr, uint32_t len, const sv_async_msg &msg)
{
	send_dgram(addr, len, &msg, sizeof(msg));
}

int cq_place_deferred(sv_cq_ring *ring, uint64_t index, void *dst, pid_t pid)
{
	uint32_t mask = ring->hdr.entries - 1;
	auto *slots = reinterpret_cast<sv_cqe *>(reinterpret_cast<char *>(ring) +
						 ring->hdr.slots_offset);
	sv_cqe &slot = slots[index & mask];
	// Consumed already, or the slot holds a later lap's entry: nothing to do.
	if (std::atomic_ref<uint64_t>(ring->cons).load(std::memory_order_acquire) > index ||
	    std::atomic_ref<uint32_t>(slot.seq).load(std::memory_order_acquire) !=
		    static_cast<uint32_t>(index + 1))
		return 0;
	sv_cqe_payload pl = payloads(ring)[index & mask];
	std::atomic_ref<uint8_t> f(slot.flags);
	uint8_t v = f.load(std::memory_order_acquire);
	while ((v & SV_CQE_PLACE) &&
	       !f.compare_exchange_weak(v, (v & ~SV_CQE_PLACE) | SV_CQE_PLACED,
					std::memory_order_acq_rel))
		;
	if (!(v & SV_CQE_PLACE))
		return 0; // The owner took it
	iovec l{pl.data, std::min<uint32_t>(pl.len, SV_CQE_INLINE_MAX)};
	iovec r{dst, l.iov_len};
	return xfer(pid, false, &l, 1, &r, 1, xfer_dir::to_peer);
}

int cq_push(sv_cq_ring *ring, sv_cqe &e, bool solicited, const sv_cqe_payload *payload,
	    uint64_t *index)
{
	uint32_t entries = ring->hdr.entries;
	uint32_t mask = entries - 1;
	auto *slots = reinterpret_cast<sv_cqe *>(reinterpret_cast<char *>(ring) +
						 ring->hdr.slots_offset);
	std::atomic_ref<uint64_t> prod(ring->prod);
	uint64_t p = prod.load(std::memory_order_relaxed);
	for (;;) {
		if (p & kRingClosed)
			return ESTALE;
		uint64_t c = std::atomic_ref<uint64_t>(ring->cons).load(std::memory_order_acquire);
		if (p - c >= entries) {
			if (!std::atomic_ref<uint32_t>(ring->overflow)
				     .exchange(1, std::memory_order_acq_rel)) {
				sv_async_msg m{IBV_EVENT_CQ_ERR, SV_OBJ_CQ, ring->hdr.obj_slot,
					       ring->hdr.obj_gen};
				send_async(ring->async_addr, ring->async_len, m);
			}
			return ENOSPC;
		}
		if (prod.compare_exchange_weak(p, p + 1, std::memory_order_acq_rel))
			break;
	}
	sv_cqe &slot = slots[p & mask];
	e.seq = 0;
	e.timestamp = now_ns();
	e.flags = solicited ? SV_CQE_SOLICITED : 0;
	if (payload) {
		// The caller checked the ring has a payload array (cq_has_payload).
		sv_cqe_payload &dst = payloads(ring)[p & mask];
		dst.iova = payload->iova;
		dst.lkey = payload->lkey;
		dst.len = payload->len;
		memcpy(dst.data, payload->data, std::min<uint32_t>(payload->len, SV_CQE_INLINE_MAX));
		e.flags |= SV_CQE_PLACE;
	}
	if (index)
		*index = p;
	memcpy(reinterpret_cast<char *>(&slot) + sizeof(uint32_t),
	       reinterpret_cast<char *>(&e) + sizeof(uint32_t), sizeof(e) - sizeof(uint32_t));
	std::atomic_ref<uint32_t>(slot.seq).store(static_cast<uint32_t>(p + 1),
						  std::memory_order_release);
	// Store-load against the owner arming then polling: both sides fence.
	std::atomic_thread_fence(std::memory_order_seq_cst);
	std::atomic_ref<uint32_t> armed(ring->armed);
	uint32_t a = armed.load(std::memory_order_relaxed);
	bool fire = a == SV_CQ_ARM_ALL ||
		    (a == SV_CQ_ARM_SOLICITED && (solicited || e.status != IBV_WC_SUCCESS));
	uint32_t mod = std::atomic_ref<uint32_t>(ring->mod_count).load(std::memory_order_relaxed);
	if (fire && a == SV_CQ_ARM_ALL && mod > 1 &&
	    std::atomic_ref<uint32_t>(ring->mod_pending).fetch_add(1, std::memory_order_acq_rel) + 1 <
		    mod)
		fire = false; // Moderated: not enough completions yet
	if (std::atomic_ref<uint32_t>(ring->waiters).load(std::memory_order_relaxed))
		syscall(SYS_futex, prod_word(ring), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
	if (fire && armed.compare_exchange_strong(a, SV_CQ_DISARMED, std::memory_order_acq_rel)) {
		std::atomic_ref<uint32_t>(ring->mod_pending).store(0, std::memory_order_relaxed);
		uint64_t cookie = ring->cookie;
		send_dgram(ring->channel_addr, ring->channel_len, &cookie, sizeof(cookie));
	}
	return 0;
}

void cq_clean(loop_cq *cq, uint32_t qpn)
{
	if (!cq)
		return;
	std::lock_guard<std::mutex> g(cq->lock);
	sv_cq_ring *r = cq->ring;
	uint64_t c = r->cons;
	// Only the published run from cons on is ours to rearrange: producers
	// write at reserved slots beyond it.
	uint64_t end = c;
	while (end - c < cq->capacity &&
	       std::atomic_ref<uint32_t>(cq->slots[end & cq->mask].seq)
			       .load(std::memory_order_acquire) == static_cast<uint32_t>(end + 1))
		end++;
	// Walk back from the newest entry, sliding kept entries towards it.
	uint64_t dst = end;
	for (uint64_t i = end; i-- > c;) {
		sv_cqe &s = cq->slots[i & cq->mask];
		if (s.qp_num == qpn)
			continue;
		dst--;
		if (dst != i) {
			cq->slots[dst & cq->mask] = s;
			cq->slots[dst & cq->mask].seq = static_cast<uint32_t>(dst + 1);
			if (r->payload_offset)
				payloads(r)[dst & cq->mask] = payloads(r)[i & cq->mask];
		}
	}
	std::atomic_ref<uint64_t>(r->cons).store(dst, std::memory_order_release);
}

loop_cq *cq_new(ibv_context *ctx, int cqe, ibv_comp_channel *channel)
{
	loop_cq *cq = new_cq(ctx, cqe, channel);
	if (!cq)
		return nullptr;
	ibv_cq &c = cq->vcq.cq;
	c.cqe = static_cast<int>(cq->capacity);
	c.handle = cq->ref.slot;
	// The core runs verbs_init_cq after we return; the channel is known now.
	c.channel = channel;
	c.context = ctx;
	wire_channel(cq);
	// Async events (IBV_EVENT_CQ_ERR) name the CQ by its registry slot.
	objects_add(SV_OBJ_CQ, cq->ref.slot, &c);
	return cq;
}

ibv_cq *loop_create_cq(ibv_context *ctx, int cqe, ibv_comp_channel *channel, int comp_vector)
{
	if (comp_vector < 0 || comp_vector >= ctx->num_comp_vectors) {
		errno = EINVAL;
		return nullptr;
	}
	loop_cq *cq = cq_new(ctx, cqe, channel);
	return cq ? &cq->vcq.cq : nullptr;
}

bool cq_pop(loop_cq *cq, sv_cqe &out)
{
	return cq_take(cq, out);
}

int loop_destroy_cq(ibv_cq *ibcq)
{
	loop_cq *cq = to_loop_cq(ibcq);
	objects_remove(SV_OBJ_CQ, cq->ref.slot);
	queue_destroy(*cq->ctx->fab, cq->ref, cq->ring);
	delete cq;
	return 0;
}

int loop_poll_cq(ibv_cq *ibcq, int n, ibv_wc *wc)
{
	loop_cq *cq = to_loop_cq(ibcq);
	if (n < 0)
		return -EINVAL;
	std::lock_guard<std::mutex> g(cq->lock);
	int i = 0;
	sv_cqe e;
	while (i < n && cq_take(cq, e)) {
		to_wc(e, wc[i]);
		i++;
	}
	return i;
}

int loop_req_notify_cq(ibv_cq *ibcq, int solicited_only)
{
	loop_cq *cq = to_loop_cq(ibcq);
	if (!ibcq->channel)
		return EINVAL;
	std::atomic_ref<uint32_t>(cq->ring->armed)
		.store(solicited_only ? SV_CQ_ARM_SOLICITED : SV_CQ_ARM_ALL,
		       std::memory_order_seq_cst);
	std::atomic_thread_fence(std::memory_order_seq_cst);
	return 0;
}

int loop_modify_cq(ibv_cq *ibcq, ibv_modify_cq_attr *attr)
{
	loop_cq *cq = to_loop_cq(ibcq);
	if (attr->attr_mask & ~static_cast<uint32_t>(IBV_CQ_ATTR_MODERATE))
		return EINVAL;
	if (!(attr->attr_mask & IBV_CQ_ATTR_MODERATE))
		return 0;
	// Count moderation only: a period would need a timer in the owner.
	if (attr->moderate.cq_period > kMaxCqModPeriod || attr->moderate.cq_count > kMaxCqModCount)
		return EINVAL;
	std::lock_guard<std::mutex> g(cq->lock);
	std::atomic_ref<uint32_t>(cq->ring->mod_count)
		.store(attr->moderate.cq_count, std::memory_order_release);
	return 0;
}

int loop_resize_cq(ibv_cq *ibcq, int cqe)
{
	loop_cq *cq = to_loop_cq(ibcq);
	if (cqe < 1 || cqe > kMaxCqe)
		return EINVAL;
	std::lock_guard<std::mutex> g(cq->lock);
	uint64_t pending = cq->ring->prod - cq->ring->cons;
	if (static_cast<uint64_t>(cqe) < pending)
		return EINVAL;
	uint32_t entries = round_pow2(static_cast<uint32_t>(cqe));
	if (entries == cq->capacity)
		return 0;
	fabric &fab = *cq->ctx->fab;
	obj_ref nref;
	void *map = queue_create(fab, cq->ctx->lease, SV_OBJ_CQ, entries, sizeof(sv_cqe),
				 sizeof(sv_cq_ring), 0, nref,
				 static_cast<size_t>(entries) * sizeof(sv_cqe_payload));
	if (!map)
		return errno;
	auto *nr = static_cast<sv_cq_ring *>(map);
	nr->payload_offset =
		static_cast<uint32_t>(queue_bytes(sizeof(sv_cq_ring), entries, sizeof(sv_cqe)));
	memcpy(nr->async_addr, cq->ring->async_addr, sizeof(nr->async_addr));
	nr->async_len = cq->ring->async_len;
	memcpy(nr->channel_addr, cq->ring->channel_addr, sizeof(nr->channel_addr));
	nr->channel_len = cq->ring->channel_len;
	nr->cookie = cq->ring->cookie;
	nr->armed = cq->ring->armed;
	nr->mod_count = cq->ring->mod_count;
	// Point every QP that completes into this CQ at the new ring first, so
	// new producers go there; then close the old ring to the rest.
	{
		registry_guard rg(fab);
		for (auto &q : fab.reg()->qps)
			if (q.in_use && q.rcq_obj == cq->ref.slot && q.rcq_gen == cq->ref.gen) {
				q.rcq_obj = nref.slot;
				q.rcq_gen = nref.gen;
			}
	}
	std::atomic_ref<uint64_t> prod(cq->ring->prod);
	uint64_t end = prod.fetch_or(kRingClosed, std::memory_order_acq_rel);
	// Producers that reserved before the close finish their entry quickly;
	// move everything up to `end` across in order.
	auto *ns = reinterpret_cast<sv_cqe *>(static_cast<char *>(map) + sizeof(sv_cq_ring));
	uint64_t moved = 0;
	uint64_t deadline = now_ns() + 1000000000ULL;
	for (uint64_t c = cq->ring->cons; c < end; c++) {
		sv_cqe &s = cq->slots[c & cq->mask];
		while (std::atomic_ref<uint32_t>(s.seq).load(std::memory_order_acquire) !=
		       static_cast<uint32_t>(c + 1)) {
			if (now_ns() > deadline)
				break; // A producer died mid-entry: its entry is lost.
			sched_yield();
		}
		ns[moved] = s;
		ns[moved].seq = static_cast<uint32_t>(moved + 1);
		payloads(nr)[moved] = payloads(cq->ring)[c & cq->mask];
		moved++;
	}
	nr->prod = moved;
	nr->cons = 0;
	objects_remove(SV_OBJ_CQ, cq->ref.slot);
	objects_add(SV_OBJ_CQ, nref.slot, ibcq);
	queue_destroy(fab, cq->ref, cq->ring);
	cq->ref = nref;
	cq->ring = nr;
	cq->slots = ns;
	cq->mask = entries - 1;
	cq->capacity = entries;
	ibcq->cqe = static_cast<int>(entries);
	return 0;
}

} // namespace loop
