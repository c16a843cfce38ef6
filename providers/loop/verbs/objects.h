// SPDX-License-Identifier: MIT
// This process's objects by registry slot, so that an async event naming a
// slot (from any process) can be turned back into the application's pointer;
// and the lifetime word every provider object carries (obj_life), checked as
// the kernel checks a handle.
#pragma once

#include <atomic>
#include <cstdint>

struct ibv_context;

namespace loop {

inline constexpr uint32_t kObjQp = 0; // sv_async_msg.kind for QPs; others use sv_obj_kind
// Process-local kinds, for imports by handle.
inline constexpr uint32_t kObjDm = 100;
inline constexpr uint32_t kObjPd = 101;
inline constexpr uint32_t kObjMr = 102;
inline constexpr uint32_t kObjCtx = 103;

void objects_add(uint32_t kind, uint32_t slot, void *obj);
void objects_remove(uint32_t kind, uint32_t slot);
// The object, or nullptr if this process has none there.
void *objects_find(uint32_t kind, uint32_t slot);
// A slot and generation that obj had before (a CQ's ring before a resize):
// events raised there still find it, until objects_forget_former(obj).
void objects_add_former(uint32_t kind, uint32_t slot, uint32_t gen, void *obj);
void *objects_find_former(uint32_t kind, uint32_t slot, uint32_t gen);
void objects_forget_former(void *obj);

// ---- Object lifetimes (docs/design.md, "Object lifetimes") ----
//
// Every provider object carries an obj_life: a state word, live from
// construction, and the number of objects that depend on it (an MR on its
// PD, a QP on its CQs...).  A verb checks the state word of each object it
// is given (one load and compare on the data path), so that a destroyed
// object is an errno rather than a use of freed memory.  Destroying an
// object with dependants is refused with EBUSY, as the kernel's usecnt does.
// A destroyed object's memory is kept for a while (quarantine()), so that a
// stale pointer reads the dead state rather than a reused allocation.
enum life_kind : uint32_t {
	kLifePd = 1,
	kLifeMr,
	kLifeMw,
	kLifeCq,
	kLifeQp,
	kLifeSrq,
	kLifeAh,
	kLifeXrcd,
	kLifeDm,
	kLifeTd,
};

inline constexpr uint32_t life_live(uint32_t kind)
{
	return 0x11fe0000u | kind;
}
inline constexpr uint32_t life_dying(uint32_t kind)
{
	return 0xd1e00000u | kind;
}
inline constexpr uint32_t life_dead(uint32_t kind)
{
	return 0xdead0000u | kind;
}

struct obj_life {
	std::atomic<uint32_t> state;
	std::atomic<uint32_t> refs{0};

	explicit obj_life(uint32_t kind) : state(life_live(kind)) {}
	// A copy is a new object: live, with no dependants.
	obj_life(const obj_life &o) : state(life_live(o.state.load() & 0xffff)) {}
	obj_life &operator=(const obj_life &) = delete;

	// Whether the object is a live one of this kind: the data-path check.
	bool is(uint32_t kind) const
	{
		return state.load(std::memory_order_relaxed) == life_live(kind);
	}
	// Claims the object for destruction: 0, ENOENT when it was destroyed
	// already (or is being destroyed), EINVAL when it is no object of this
	// kind, EBUSY (and still live) while objects depend on it.  Each error
	// is reported under SOFTVERBS_DEBUG, naming verb.
	int begin_destroy(uint32_t kind, const char *verb, const void *obj);
	// Gives it back (after begin_destroy), when the destroy fails later.
	void abort_destroy(uint32_t kind)
	{
		state.store(life_live(kind), std::memory_order_seq_cst);
	}
	// Marks it destroyed (after begin_destroy): every later use fails.
	void end_destroy(uint32_t kind)
	{
		state.store(life_dead(kind), std::memory_order_release);
	}
};

// The errno for a verb given an object that is not a live one of its kind
// (EINVAL, what the kernel answers for an unknown handle in a command);
// reported under SOFTVERBS_DEBUG.  Off the fast path: call only on failure.
int life_bad(const char *verb, const void *obj, const obj_life &l, uint32_t kind);

// The references an object holds on the objects it depends on (its PD, its
// CQs, its SRQ, its XRC domain...), dropped when it is destroyed.
struct parent_refs {
	static constexpr int kMax = 6;
	obj_life *held[kMax] = {};
	// Takes a reference on l: false (and none taken) when l is not a live
	// object of this kind, or is being destroyed.
	bool add(obj_life &l, uint32_t kind);
	// Moves the reference on from to to (rereg_mr changing the PD).
	bool swap(obj_life &from, obj_life &to, uint32_t kind);
	void release();
};

// For a create function: the references it took are dropped on every
// return unless it kept them for the object it made.
struct parent_guard {
	parent_refs refs;
	bool kept = false;
	parent_guard() = default;
	parent_guard(const parent_guard &) = delete;
	parent_guard &operator=(const parent_guard &) = delete;
	~parent_guard()
	{
		if (!kept)
			refs.release();
	}
	bool add(obj_life &l, uint32_t kind)
	{
		return refs.add(l, kind);
	}
	parent_refs keep()
	{
		kept = true;
		return refs;
	}
};

// Keeps a destroyed object's memory, and frees the oldest one (with
// release) once more than a bounded number are kept.
void quarantine(void *obj, void (*release)(void *));
template <typename T> void quarantine(T *obj)
{
	quarantine(obj, [](void *p) { delete static_cast<T *>(p); });
}

// ---- What a context owns (docs/design.md, "Object lifetimes") ----
//
// ibv_close_device with objects still live destroys them, as the kernel
// does when a uverbs file closes: a peer then sees the QPs and keys gone,
// rather than a closed context's QPs still answering and its memory still
// writable through its rkeys.  Each object is destroyed through the public
// verb (so the core's own accounting, a completion channel's count, stays
// right), users before what they use.  Their memory, and the context's, is
// kept for the life of the process: the application may still hold the
// pointers, and a later destroy then answers ENOENT instead of reading
// freed memory.
enum owned_order : int {
	kOwnQp,
	kOwnSrq,
	kOwnMw,
	kOwnMr,
	kOwnAh,
	kOwnCq,
	kOwnParentDomain,
	kOwnTd,
	kOwnXrcd,
	kOwnPd,
	kOwnDm,
	kOwnImportedMr,
	kOwnImportedPd,
	kOwnOrders
};
// Records obj (the verbs handle, the provider object's first member) as
// owned by ctx; quarantine() forgets it.
void owned_add(const void *ctx, void *obj, int order);
// Destroys what ctx still owns; returns how many it found.
size_t owned_close(const void *ctx);
// How many objects ctx still owns.
size_t owned_count(const void *ctx);
// Whether this thread is inside owned_close(): the destroys neither wait
// for event acks nor refuse because of multicast attachments, as the
// kernel's cleanup on close does not.
bool owned_closing();

// A message under SOFTVERBS_DEBUG (to stderr, prefixed "softverbs: ").
void debug_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

// Whether ctx was closed (ibv_close_device with objects live, whose memory
// stays): then errno is EINVAL and verb's refusal is logged.  The verbs
// that make objects on a context ask it first.
bool ctx_closed(struct ibv_context *ctx, const char *verb);

} // namespace loop
