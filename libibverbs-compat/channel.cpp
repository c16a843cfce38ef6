// SPDX-License-Identifier: MIT
// Completion channels.  A channel is an AF_UNIX datagram socket bound to an
// autobound abstract address, so it is a real fd for poll/epoll and any
// process of the fabric can raise an event on it without sharing fds.  A
// datagram carries the 64-bit cookie of one CQ; cookies are random, so a
// stale or forged datagram names no CQ and is dropped.
#include "core.h"

#include <fcntl.h>
#include <mutex>
#include <random>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include <unordered_map>

namespace {

struct channel_state {
	std::mutex lock;
	std::unordered_map<uint64_t, ibv_cq *> cqs; // cookie -> CQ, for CQs on this channel
};

// ibv_comp_channel has no spare field; keep the state beside it, keyed by fd.
std::mutex g_lock;
std::unordered_map<const ibv_comp_channel *, channel_state *> g_channels;
std::unordered_map<const ibv_cq *, uint64_t> g_cookies;

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
	auto *st = new (std::nothrow) channel_state;
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
	g_channels[ch] = st;
	return ch;
}

EXPORT int ibv_destroy_comp_channel(struct ibv_comp_channel *channel)
{
	if (!channel)
		return EINVAL;
	pthread_mutex_lock(&channel->context->mutex);
	bool busy = channel->refcnt != 0;
	pthread_mutex_unlock(&channel->context->mutex);
	if (busy)
		return EBUSY;
	channel_state *st;
	{
		std::lock_guard<std::mutex> g(g_lock);
		auto it = g_channels.find(channel);
		st = it == g_channels.end() ? nullptr : it->second;
		g_channels.erase(channel);
	}
	delete st;
	close(channel->fd);
	delete channel;
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
	{
		std::lock_guard<std::mutex> g(st->lock);
		st->cqs[c] = cq;
	}
	std::lock_guard<std::mutex> g(g_lock);
	g_cookies[cq] = c;
	return c;
}

void core_channel_forget_cq(struct ibv_cq *cq)
{
	uint64_t c;
	{
		std::lock_guard<std::mutex> g(g_lock);
		auto it = g_cookies.find(cq);
		if (it == g_cookies.end())
			return;
		c = it->second;
		g_cookies.erase(it);
	}
	if (!cq->channel)
		return;
	channel_state *st = state_of(cq->channel);
	if (!st)
		return;
	std::lock_guard<std::mutex> g(st->lock);
	st->cqs.erase(c);
}

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
	for (;;) {
		uint64_t cookie;
		ssize_t n = recv(channel->fd, &cookie, sizeof(cookie), 0);
		if (n < 0)
			return -1; // EAGAIN for a non-blocking channel, as with a kernel fd.
		if (n != sizeof(cookie))
			continue;
		ibv_cq *found = nullptr;
		{
			std::lock_guard<std::mutex> g(st->lock);
			auto it = st->cqs.find(cookie);
			if (it != st->cqs.end())
				found = it->second;
		}
		if (!found)
			continue; // The CQ is gone, or the datagram was not ours.
		*cq = found;
		*cq_context = found->cq_context;
		const verbs_context_ops *ops = get_ops(found->context);
		if (ops->cq_event)
			ops->cq_event(found);
		return 0;
	}
}
