// SPDX-License-Identifier: MIT
// Completion channels.  A channel is an AF_UNIX datagram socket bound to an
// autobound abstract address, so it is a real fd for poll/epoll and any
// process of the fabric can raise an event on it without sharing fds.  A
// datagram carries the 64-bit cookie of one CQ; cookies are random, so a
// stale or forged datagram names no CQ and is dropped.
//
// Lifetimes: a channel is looked up in g_channels before it is used, so a
// destroyed one is an errno; its memory is kept a while (quarantine) so a
// stale pointer is not a new channel at the same address.  Events handed
// out per CQ are counted, so that destroying a CQ waits for their acks.
#include "core.h"

#include <deque>
#include <fcntl.h>
#include <mutex>
#include <random>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include <unordered_map>

namespace {

struct cq_entry {
	ibv_cq *cq;
	uint32_t reported; // Events ibv_get_cq_event returned for it
	// The provider's count of this CQ's events whose datagram the socket
	// refused (verbs_comp_channel_lost_word); null if it keeps none.
	uint32_t *lost = nullptr;
};

struct channel_state {
	std::mutex lock;
	std::unordered_map<uint64_t, cq_entry> cqs; // cookie -> CQ, for CQs on this channel
	// Lost events taken from the providers' counts, not yet handed out (by
	// cookie: a CQ destroyed meanwhile is skipped), and whether a wake-up
	// datagram stands in the socket for them, so poll() sees them.
	std::deque<uint64_t> backlog;
	bool kicked = false;
};

// ibv_comp_channel has no spare field; keep the state beside it, keyed by fd.
std::mutex g_lock;
// Never destroyed: another thread may be in a verb while one calls exit().
std::unordered_map<const ibv_comp_channel *, channel_state *> &g_channels = *new std::unordered_map<const ibv_comp_channel *, channel_state *>;
std::unordered_map<const ibv_cq *, uint64_t> &g_cookies = *new std::unordered_map<const ibv_cq *, uint64_t>;
std::unordered_map<const void *, uint32_t> &g_async_reported = *new std::unordered_map<const void *, uint32_t>; // Async events handed out, by CQ/QP/SRQ

// Destroyed channels, freed oldest first beyond a bound.
constexpr size_t kChannelQuarantine = 64;
ibv_comp_channel *g_dead[kChannelQuarantine];
size_t g_dead_next;

channel_state *state_of(const ibv_comp_channel *ch)
{
	std::lock_guard<std::mutex> g(g_lock);
	auto it = g_channels.find(ch);
	return it == g_channels.end() ? nullptr : it->second;
}

uint64_t new_cookie()
{
	static thread_local std::mt19937_64 rng{std::random_device{}()};
	uint64_t c;
	do
		c = rng();
	while (c == 0);
	return c;
}

} // namespace

EXPORT struct ibv_comp_channel *ibv_create_comp_channel(struct ibv_context *context)
{
	if (!context)
		return fail_ptr<ibv_comp_channel>(EINVAL);
	int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return nullptr;
	sockaddr_un sa{};
	sa.sun_family = AF_UNIX;
	// Binding with only the family autobinds to a unique abstract name.
	if (bind(fd, reinterpret_cast<sockaddr *>(&sa), sizeof(sa_family_t)) < 0) {
		int err = errno;
		close(fd);
		return fail_ptr<ibv_comp_channel>(err);
	}
	auto *ch = new (std::nothrow) ibv_comp_channel{};
	channel_state *st = nullptr;
	try { // Its containers allocate in their constructors: no exception into C
		st = new channel_state;
	} catch (const std::bad_alloc &) {
	}
	if (!ch || !st) {
		delete ch;
		delete st;
		close(fd);
		return fail_ptr<ibv_comp_channel>(ENOMEM);
	}
	ch->context = context;
	ch->fd = fd;
	ch->refcnt = 0;
	std::lock_guard<std::mutex> g(g_lock);
	try {
		g_channels[ch] = st;
	} catch (const std::bad_alloc &) {
		delete ch;
		delete st;
		close(fd);
		return fail_ptr<ibv_comp_channel>(ENOMEM);
	}
	return ch;
}

EXPORT int ibv_destroy_comp_channel(struct ibv_comp_channel *channel)
{
	if (!channel)
		return EINVAL;
	channel_state *st;
	ibv_comp_channel *old;
	{
		std::lock_guard<std::mutex> g(g_lock);
		auto it = g_channels.find(channel);
		if (it == g_channels.end()) {
			core_log("ibv_destroy_comp_channel(%p): not a live channel (destroyed already?)",
				 static_cast<void *>(channel));
			return ENOENT;
		}
		// refcnt counts the CQs on it (verbs_init_cq, ibv_destroy_cq).
		pthread_mutex_lock(&channel->context->mutex);
		unsigned busy = static_cast<unsigned>(channel->refcnt);
		pthread_mutex_unlock(&channel->context->mutex);
		if (busy) {
			core_log("ibv_destroy_comp_channel(%p): %u CQ%s still use%s it",
				 static_cast<void *>(channel), busy, busy == 1 ? "" : "s",
				 busy == 1 ? "s" : "");
			return EBUSY;
		}
		st = it->second;
		g_channels.erase(it);
		old = g_dead[g_dead_next];
		g_dead[g_dead_next] = channel;
		g_dead_next = (g_dead_next + 1) % kChannelQuarantine;
	}
	delete st;
	close(channel->fd);
	channel->fd = -1;
	delete old;
	return 0;
}

EXPORT int verbs_comp_channel_check(struct ibv_comp_channel *channel, struct ibv_context *context)
{
	std::lock_guard<std::mutex> g(g_lock);
	if (!g_channels.count(channel)) {
		core_log("completion channel %p is not a live channel (destroyed?)",
			 static_cast<void *>(channel));
		return EINVAL;
	}
	if (channel->context != context) {
		core_log("completion channel %p belongs to another context",
			 static_cast<void *>(channel));
		return EINVAL;
	}
	return 0;
}

EXPORT int verbs_comp_channel_address(struct ibv_comp_channel *channel, char *addr,
				      size_t *addr_len)
{
	sockaddr_un sa{};
	socklen_t len = sizeof(sa);
	if (getsockname(channel->fd, reinterpret_cast<sockaddr *>(&sa), &len) < 0)
		return errno;
	size_t n = len - offsetof(sockaddr_un, sun_path);
	if (n > *addr_len)
		return ENOSPC;
	memcpy(addr, sa.sun_path, n);
	*addr_len = n;
	return 0;
}

EXPORT uint64_t verbs_comp_channel_cookie(struct ibv_cq *cq)
{
	ibv_comp_channel *ch = cq->channel;
	if (!ch)
		return 0;
	channel_state *st = state_of(ch);
	if (!st)
		return 0;
	{
		std::lock_guard<std::mutex> g(g_lock);
		auto it = g_cookies.find(cq);
		if (it != g_cookies.end())
			return it->second;
	}
	uint64_t c = new_cookie();
	try {
		{
			std::lock_guard<std::mutex> g(st->lock);
			st->cqs[c] = cq_entry{cq, 0};
		}
		std::lock_guard<std::mutex> g(g_lock);
		g_cookies[cq] = c;
	} catch (...) {
		return 0; // No memory: the CQ gets no events
	}
	return c;
}

void core_async_reported(const void *obj)
{
	std::lock_guard<std::mutex> g(g_lock);
	try {
		g_async_reported[obj]++;
	} catch (...) {
	}
}

namespace {

uint32_t take_async_reported(const void *obj)
{
	std::lock_guard<std::mutex> g(g_lock);
	auto a = g_async_reported.find(obj);
	if (a == g_async_reported.end())
		return 0;
	uint32_t n = a->second;
	g_async_reported.erase(a);
	return n;
}

// Blocks until *completed has reached reported (serial-number order, so an
// application that acks more than it got does not make us wait forever).
void wait_acks(const char *verb, const void *obj, pthread_mutex_t *mu, pthread_cond_t *cv,
	       const uint32_t *completed, uint32_t reported)
{
	pthread_mutex_lock(mu);
	if (static_cast<int32_t>(reported - *completed) > 0)
		core_log("%s(%p): %u async event%s not acknowledged; waiting for "
			 "ibv_ack_async_event",
			 verb, obj, reported - *completed, reported - *completed == 1 ? "" : "s");
	while (static_cast<int32_t>(reported - *completed) > 0)
		pthread_cond_wait(cv, mu);
	pthread_mutex_unlock(mu);
}

} // namespace

EXPORT void verbs_qp_wait_events(struct ibv_qp *qp)
{
	wait_acks("ibv_destroy_qp", qp, &qp->mutex, &qp->cond, &qp->events_completed,
		  take_async_reported(qp));
}

EXPORT void verbs_srq_wait_events(struct ibv_srq *srq)
{
	wait_acks("ibv_destroy_srq", srq, &srq->mutex, &srq->cond, &srq->events_completed,
		  take_async_reported(srq));
}

EXPORT void verbs_cq_wait_events(struct ibv_cq *cq)
{
	uint32_t comp = 0, async = 0;
	bool had_cookie = false;
	uint64_t c = 0;
	{
		std::lock_guard<std::mutex> g(g_lock);
		auto it = g_cookies.find(cq);
		if (it != g_cookies.end()) {
			c = it->second;
			had_cookie = true;
			g_cookies.erase(it);
		}
		auto a = g_async_reported.find(cq);
		if (a != g_async_reported.end()) {
			async = a->second;
			g_async_reported.erase(a);
		}
	}
	// From here ibv_get_cq_event drops the CQ's datagrams: what it handed
	// out before is all there is to acknowledge.
	channel_state *st = had_cookie && cq->channel ? state_of(cq->channel) : nullptr;
	if (st) {
		std::lock_guard<std::mutex> g(st->lock);
		auto it = st->cqs.find(c);
		if (it != st->cqs.end()) {
			comp = it->second.reported;
			st->cqs.erase(it);
		}
	}
	pthread_mutex_lock(&cq->mutex);
	auto unacked = [&] {
		// Serial-number differences: an application that acks more than
		// it got does not make us wait forever.
		return static_cast<int32_t>(comp - cq->comp_events_completed) > 0 ||
		       static_cast<int32_t>(async - cq->async_events_completed) > 0;
	};
	if (unacked())
		core_log("ibv_destroy_cq(%p): %u completion event%s and %u async event%s not "
			 "acknowledged; waiting for ibv_ack_cq_events / ibv_ack_async_event",
			 static_cast<void *>(cq), comp - cq->comp_events_completed,
			 comp - cq->comp_events_completed == 1 ? "" : "s",
			 async - cq->async_events_completed,
			 async - cq->async_events_completed == 1 ? "" : "s");
	while (unacked())
		pthread_cond_wait(&cq->cond, &cq->mutex);
	pthread_mutex_unlock(&cq->mutex);
}

EXPORT void verbs_comp_channel_lost_word(struct ibv_cq *cq, uint32_t *word)
{
	uint64_t c;
	{
		std::lock_guard<std::mutex> g(g_lock);
		auto it = g_cookies.find(cq);
		if (it == g_cookies.end())
			return;
		c = it->second;
	}
	channel_state *st = cq->channel ? state_of(cq->channel) : nullptr;
	if (!st)
		return;
	// Under st->lock: once this returns, no scan reads the previous word.
	std::lock_guard<std::mutex> g(st->lock);
	auto it = st->cqs.find(c);
	if (it != st->cqs.end())
		it->second.lost = word;
}

namespace {

// Moves the events the providers counted as lost into the backlog.  Caller
// holds st->lock.
void take_lost(channel_state *st)
{
	for (auto &[cookie, ent] : st->cqs) {
		if (!ent.lost || !__atomic_load_n(ent.lost, __ATOMIC_ACQUIRE))
			continue;
		uint32_t n = __atomic_exchange_n(ent.lost, 0, __ATOMIC_ACQ_REL);
		for (uint32_t i = 0; i < n; i++)
			st->backlog.push_back(cookie);
	}
}

// Sends a wake-up datagram (cookie 0, which names no CQ) to the channel's
// own address, so that poll() reports it readable while the backlog holds
// events.  Caller holds st->lock.
void kick(ibv_comp_channel *channel, channel_state *st)
{
	if (st->kicked || st->backlog.empty())
		return;
	sockaddr_un sa{};
	socklen_t len = sizeof(sa);
	if (getsockname(channel->fd, reinterpret_cast<sockaddr *>(&sa), &len) < 0)
		return;
	uint64_t zero = 0;
	// Refused only when the queue is full: then it is readable anyway.
	if (sendto(channel->fd, &zero, sizeof(zero), MSG_DONTWAIT,
		   reinterpret_cast<sockaddr *>(&sa), len) == sizeof(zero))
		st->kicked = true;
}

} // namespace

/*
 * An event reaches the channel as a datagram naming the CQ's cookie.  A
 * producer whose datagram the socket refuses (its queue is full: see
 * net.unix.max_dgram_qlen) counts the event in the CQ's lost word instead,
 * then sends a datagram of cookie 0 in case the queue drained meanwhile.
 * Every call looks at the lost words before it waits, and a full queue
 * guarantees a later call, so no event is lost: a refused producer's count
 * is seen either by a call that reads one of the datagrams that filled the
 * queue, or by the one its cookie-0 datagram wakes.
 */
EXPORT int ibv_get_cq_event(struct ibv_comp_channel *channel, struct ibv_cq **cq,
			    void **cq_context)
{
	if (!channel || !cq || !cq_context) {
		errno = EINVAL;
		return -1;
	}
	channel_state *st = state_of(channel);
	if (!st) {
		errno = EINVAL;
		return -1;
	}
	ibv_cq *found = nullptr;
	while (!found) {
		{
			std::lock_guard<std::mutex> g(st->lock);
			take_lost(st);
			while (!found && !st->backlog.empty()) {
				auto it = st->cqs.find(st->backlog.front());
				st->backlog.pop_front();
				if (it != st->cqs.end()) {
					found = it->second.cq;
					it->second.reported++;
				}
			}
			kick(channel, st);
		}
		if (found)
			break;
		uint64_t cookie;
		ssize_t n = recv(channel->fd, &cookie, sizeof(cookie), 0);
		if (n < 0)
			return -1; // EAGAIN for a non-blocking channel, as with a kernel fd.
		if (n != sizeof(cookie))
			continue;
		{
			// Counted under the lock verbs_cq_wait_events takes to
			// forget the CQ: an event is either counted or dropped.
			std::lock_guard<std::mutex> g(st->lock);
			if (!cookie) {
				st->kicked = false; // Ours, or a producer's: look again
				continue;
			}
			auto it = st->cqs.find(cookie);
			if (it != st->cqs.end()) {
				found = it->second.cq;
				it->second.reported++;
			}
		}
		// Not found: the CQ is gone, or the datagram was not ours.
	}
	*cq = found;
	*cq_context = found->cq_context;
	const verbs_context_ops *ops = get_ops(found->context);
	if (ops->cq_event)
		ops->cq_event(found);
	return 0;
}
