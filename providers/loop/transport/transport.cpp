// SPDX-License-Identifier: MIT
// The transports' registry.  Registration happens from constructors (the
// loop transport's) or a test's set-up, before any QP moves a byte; the
// table is then only read.  A missing call is refused at once, by name,
// rather than found as a null jump on first use.
#include "transport.h"

#include <cstdio>
#include <cstring>
#include <mutex>

namespace loop {

const transport_ops *g_transport = nullptr;

namespace {

constexpr size_t kMaxTransports = 4;
const transport_ops *g_registered[kMaxTransports];
size_t g_count;
std::mutex g_lock;

// The first missing call's name, or nullptr when t is complete.
const char *missing_call(const transport_ops &t)
{
	struct entry {
		bool present;
		const char *name;
	};
	const entry calls[] = {
		{t.resolve != nullptr, "resolve"},
		{t.mcast_members != nullptr, "mcast_members"},
		{t.resolve_key != nullptr, "resolve_key"},
		{t.invalidate != nullptr, "invalidate"},
		{t.move != nullptr, "move"},
		{t.atomic != nullptr, "atomic"},
		{t.deliver != nullptr, "deliver"},
		{t.take_recv != nullptr, "take_recv"},
		{t.post_cqe != nullptr, "post_cqe"},
		{t.responder_error != nullptr, "responder_error"},
		{t.alive != nullptr, "alive"},
	};
	for (const entry &e : calls)
		if (!e.present)
			return e.name;
	return nullptr;
}

} // namespace

int transport_register(const transport_ops *t)
{
	if (!t || !t->name || !*t->name) {
		fprintf(stderr, "softverbs: transport_register: a transport needs a name\n");
		return EINVAL;
	}
	if (const char *m = missing_call(*t)) {
		fprintf(stderr, "softverbs: transport '%s' refused: it has no '%s' call\n", t->name,
			m);
		return EINVAL;
	}
	std::lock_guard<std::mutex> g(g_lock);
	for (size_t i = 0; i < g_count; i++)
		if (g_registered[i] == t)
			return 0;
		else if (!strcmp(g_registered[i]->name, t->name))
			return EINVAL;
	if (g_count == kMaxTransports)
		return ENOSPC;
	g_registered[g_count++] = t;
	if (!g_transport)
		__atomic_store_n(&g_transport, t, __ATOMIC_RELEASE);
	return 0;
}

const transport_ops *transport_find(const char *name)
{
	std::lock_guard<std::mutex> g(g_lock);
	for (size_t i = 0; i < g_count; i++)
		if (!strcmp(g_registered[i]->name, name))
			return g_registered[i];
	return nullptr;
}

int transport_select(const char *name)
{
	const transport_ops *t = transport_find(name);
	if (!t)
		return ENOENT;
	__atomic_store_n(&g_transport, t, __ATOMIC_RELEASE);
	return 0;
}

} // namespace loop
