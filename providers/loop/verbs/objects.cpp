// SPDX-License-Identifier: MIT
#include "objects.h"
#include "loop.h"
#include "tunables.h"

#include <infiniband/verbs.h>

#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>
#include <tuple>
#include <unordered_map>
#include <vector>

namespace loop {

namespace {

std::mutex g_lock;
// Never destroyed: a thread of the application may call exit() while
// another is still in a verb (rping's CQ thread exits while main destroys
// its QP), and exit runs static destructors under it (ASan saw the erase in
// objects_remove read the freed tree).
std::map<uint64_t, void *> &g_objects = *new std::map<uint64_t, void *>;
// Former (kind, slot, generation) of live objects: a CQ's rings before
// ibv_resize_cq, which events raised on them still name.
std::map<std::tuple<uint32_t, uint32_t, uint32_t>, void *> &g_former =
	*new std::map<std::tuple<uint32_t, uint32_t, uint32_t>, void *>;

uint64_t key(uint32_t kind, uint32_t slot)
{
	return (static_cast<uint64_t>(kind) << 32) | slot;
}

bool verbose()
{
	static const bool v = [] {
		const char *s = getenv("SOFTVERBS_DEBUG");
		return s && *s && strcmp(s, "0") != 0;
	}();
	return v;
}

const char *kind_name(uint32_t kind)
{
	switch (kind) {
	case kLifePd: return "PD";
	case kLifeMr: return "MR";
	case kLifeMw: return "MW";
	case kLifeCq: return "CQ";
	case kLifeQp: return "QP";
	case kLifeSrq: return "SRQ";
	case kLifeAh: return "AH";
	case kLifeXrcd: return "XRCD";
	case kLifeDm: return "DM";
	case kLifeTd: return "TD";
	default: return "object";
	}
}

// Destroyed objects kept (kQuarantine, tunables.h), oldest first overwritten.
struct held {
	void *obj;
	void (*release)(void *);
};
std::mutex g_q_lock;
held g_q[kQuarantine];
size_t g_q_next;

} // namespace

void objects_add(uint32_t kind, uint32_t slot, void *obj)
{
	std::lock_guard<std::mutex> g(g_lock);
	g_objects[key(kind, slot)] = obj;
}

void objects_remove(uint32_t kind, uint32_t slot)
{
	std::lock_guard<std::mutex> g(g_lock);
	g_objects.erase(key(kind, slot));
}

void *objects_find(uint32_t kind, uint32_t slot)
{
	std::lock_guard<std::mutex> g(g_lock);
	auto it = g_objects.find(key(kind, slot));
	return it == g_objects.end() ? nullptr : it->second;
}

void objects_add_former(uint32_t kind, uint32_t slot, uint32_t gen, void *obj)
{
	std::lock_guard<std::mutex> g(g_lock);
	try {
		g_former[{kind, slot, gen}] = obj;
	} catch (...) {
		// Out of memory: an event raised on the old ring is dropped, as
		// one of a CQ gone
	}
}

void *objects_find_former(uint32_t kind, uint32_t slot, uint32_t gen)
{
	std::lock_guard<std::mutex> g(g_lock);
	auto it = g_former.find({kind, slot, gen});
	return it == g_former.end() ? nullptr : it->second;
}

void objects_forget_former(void *obj)
{
	std::lock_guard<std::mutex> g(g_lock);
	for (auto it = g_former.begin(); it != g_former.end();)
		it = it->second == obj ? g_former.erase(it) : std::next(it);
}

void debug_log(const char *fmt, ...)
{
	if (!verbose())
		return;
	char buf[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	fprintf(stderr, "softverbs: %s\n", buf);
}

int obj_life::begin_destroy(uint32_t kind, const char *verb, const void *obj)
{
	uint32_t s = life_live(kind);
	if (!state.compare_exchange_strong(s, life_dying(kind), std::memory_order_seq_cst)) {
		if (s == life_dead(kind) || s == life_dying(kind)) {
			debug_log("%s(%p): this %s was destroyed already (double destroy, or "
				  "its context was closed)",
				  verb, obj,
				  kind_name(kind));
			return ENOENT;
		}
		debug_log("%s(%p): not a %s (state %#x)", verb, obj, kind_name(kind), s);
		return EINVAL;
	}
	// Dekker against parent_refs::add: it raises refs then reads state;
	// we changed state, now read refs.  One of us sees the other.
	uint32_t n = refs.load(std::memory_order_seq_cst);
	if (n) {
		state.store(life_live(kind), std::memory_order_seq_cst);
		debug_log("%s(%p): %u object%s still use%s this %s", verb, obj, n, n == 1 ? "" : "s",
			  n == 1 ? "s" : "", kind_name(kind));
		return EBUSY;
	}
	return 0;
}

bool ctx_closed(ibv_context *ctx, const char *verb)
{
	if (!to_loop_context(ctx)->closed.load(std::memory_order_acquire))
		return false;
	debug_log("%s: the context %p was closed (ibv_close_device)", verb, static_cast<void *>(ctx));
	// A forked child's inherited copy: EBADF, as the other commands
	// through it (ctx_orphaned).
	errno = ctx_orphaned(ctx) ? EBADF : EINVAL;
	return true;
}

int life_bad(const char *verb, const void *obj, const obj_life &l, uint32_t kind)
{
	uint32_t s = l.state.load(std::memory_order_relaxed);
	if (s == life_dead(kind) || s == life_dying(kind))
		debug_log("%s: %s %p was destroyed", verb, kind_name(kind), obj);
	else
		debug_log("%s: %p is not a %s (state %#x)", verb, obj, kind_name(kind), s);
	return EINVAL;
}

bool parent_refs::add(obj_life &l, uint32_t kind)
{
	int i = 0;
	while (i < kMax && held[i])
		i++;
	if (i == kMax)
		abort(); // A programming error: kMax is the most any object needs
	l.refs.fetch_add(1, std::memory_order_seq_cst);
	if (l.state.load(std::memory_order_seq_cst) != life_live(kind)) {
		l.refs.fetch_sub(1, std::memory_order_seq_cst);
		return false;
	}
	held[i] = &l;
	return true;
}

bool parent_refs::swap(obj_life &from, obj_life &to, uint32_t kind)
{
	for (obj_life *&h : held)
		if (h == &from) {
			if (&from == &to)
				return true;
			to.refs.fetch_add(1, std::memory_order_seq_cst);
			if (to.state.load(std::memory_order_seq_cst) != life_live(kind)) {
				to.refs.fetch_sub(1, std::memory_order_seq_cst);
				return false;
			}
			from.refs.fetch_sub(1, std::memory_order_seq_cst);
			h = &to;
			return true;
		}
	return add(to, kind);
}

void parent_refs::release()
{
	for (obj_life *&h : held)
		if (h) {
			h->refs.fetch_sub(1, std::memory_order_seq_cst);
			h = nullptr;
		}
}

namespace {

struct owned_rec {
	const void *ctx;
	int order;
};
std::mutex g_own_lock;
// Never destroyed (nor g_kept): static destructors run before the leak
// check at exit, and before other threads stop.
std::unordered_map<void *, owned_rec> &g_owned = *new std::unordered_map<void *, owned_rec>;
// What owned_close destroyed: never freed (see objects.h), and reachable
// from here for as long as the process lives.
std::vector<void *> &g_kept = *new std::vector<void *>;
thread_local bool t_closing;

bool owned_forget(void *obj)
{
	std::lock_guard<std::mutex> g(g_own_lock);
	if (t_closing)
		g_kept.push_back(obj);
	g_owned.erase(obj);
	return t_closing;
}

int owned_destroy(void *obj, int order)
{
	switch (order) {
	case kOwnQp: return ibv_destroy_qp(static_cast<ibv_qp *>(obj));
	case kOwnSrq: return ibv_destroy_srq(static_cast<ibv_srq *>(obj));
	case kOwnMw: return ibv_dealloc_mw(static_cast<ibv_mw *>(obj));
	case kOwnMr: return ibv_dereg_mr(static_cast<ibv_mr *>(obj));
	case kOwnAh: return ibv_destroy_ah(static_cast<ibv_ah *>(obj));
	case kOwnCq: return ibv_destroy_cq(static_cast<ibv_cq *>(obj));
	case kOwnParentDomain:
	case kOwnPd: return ibv_dealloc_pd(static_cast<ibv_pd *>(obj));
	case kOwnTd: return ibv_dealloc_td(static_cast<ibv_td *>(obj));
	case kOwnXrcd: return ibv_close_xrcd(static_cast<ibv_xrcd *>(obj));
	case kOwnDm: return ibv_free_dm(static_cast<ibv_dm *>(obj));
	case kOwnImportedMr: ibv_unimport_mr(static_cast<ibv_mr *>(obj)); return 0;
	case kOwnImportedPd: ibv_unimport_pd(static_cast<ibv_pd *>(obj)); return 0;
	default: return EINVAL;
	}
}

} // namespace

void owned_add(const void *ctx, void *obj, int order)
{
	std::lock_guard<std::mutex> g(g_own_lock);
	try {
		g_owned[obj] = {ctx, order};
	} catch (...) {
		// Out of memory: the object works, but closing its context
		// will not destroy it.
	}
}

size_t owned_count(const void *ctx)
{
	std::lock_guard<std::mutex> g(g_own_lock);
	size_t n = 0;
	for (auto &[obj, r] : g_owned)
		n += r.ctx == ctx;
	return n;
}

bool owned_closing()
{
	return t_closing;
}

size_t owned_close(const void *ctx)
{
	std::vector<std::pair<int, void *>> mine;
	{
		std::lock_guard<std::mutex> g(g_own_lock);
		for (auto &[obj, r] : g_owned)
			if (r.ctx == ctx)
				mine.emplace_back(r.order, obj);
	}
	if (mine.empty())
		return 0;
	std::sort(mine.begin(), mine.end());
	const size_t found = mine.size();
	debug_log("ibv_close_device: context %p still has %zu objects: destroying them, "
		  "as closing the device file does", ctx, mine.size());
	t_closing = true;
	// Users before what they use; a second pass for what a dependency
	// the order does not know (a type-2 window's MR...) held back.
	for (int pass = 0; pass < 3 && !mine.empty(); pass++) {
		std::vector<std::pair<int, void *>> left;
		for (auto &[order, obj] : mine)
			if (owned_destroy(obj, order) == EBUSY)
				left.emplace_back(order, obj);
		mine.swap(left);
	}
	t_closing = false;
	for (auto &[order, obj] : mine)
		debug_log("ibv_close_device: object %p (order %d) could not be destroyed", obj,
			  order);
	return found;
}

void quarantine(void *obj, void (*release)(void *))
{
	if (owned_forget(obj))
		return; // Destroyed by closing its context: kept (objects.h)
	held old;
	{
		std::lock_guard<std::mutex> g(g_q_lock);
		old = g_q[g_q_next];
		g_q[g_q_next] = {obj, release};
		g_q_next = (g_q_next + 1) % kQuarantine;
	}
	if (old.obj)
		old.release(old.obj);
}

} // namespace loop
