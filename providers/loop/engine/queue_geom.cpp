// SPDX-License-Identifier: MIT
#include "queue_geom.h"

#include <atomic>
#include <mutex>

namespace loop {

namespace {

// Open addressing keyed by the mapping's address: lookups take no lock (a
// ring is looked up on every receive delivery), inserts and removals do.
// A removed entry becomes a tombstone, so probe chains stay intact.  A
// reader checks the key before and after copying the value: an entry
// rewritten meanwhile reads as absent.
constexpr size_t kSlots = 4 * SV_MAX_OBJS; // Owner and peer maps of every object, half full
const void *const kTombstone = reinterpret_cast<const void *>(uintptr_t(1));

struct entry {
	std::atomic<const void *> key{nullptr};
	std::atomic<uint32_t> f[6]{};
	std::atomic<uint64_t> size{0};
};

entry g_table[kSlots];
std::mutex g_write_lock;

size_t hash(const void *p)
{
	uint64_t h = reinterpret_cast<uintptr_t>(p) >> 6;
	h *= 0x9e3779b97f4a7c15ULL;
	return static_cast<size_t>(h >> 40) % kSlots;
}

void store(entry &e, const queue_geom &g)
{
	const uint32_t v[6] = {g.kind, g.entries, g.entry_size, g.slots_offset, g.max_sge,
			       g.payload_offset};
	for (int i = 0; i < 6; i++)
		e.f[i].store(v[i], std::memory_order_relaxed);
	e.size.store(g.size, std::memory_order_relaxed);
}

} // namespace

bool queue_geom_valid(const queue_geom &g)
{
	if (!g.entries || (g.entries & (g.entries - 1)) || g.entries > (1u << 24))
		return false;
	if (g.entry_size < 64 || g.entry_size > (1u << 20) ||
	    g.slots_offset < sizeof(sv_queue_hdr) || g.slots_offset > (1u << 20))
		return false;
	uint64_t slots_end =
		uint64_t(g.slots_offset) + uint64_t(g.entries) * uint64_t(g.entry_size);
	if (slots_end > g.size)
		return false;
	if (g.payload_offset) {
		uint64_t end = uint64_t(g.payload_offset) +
			       uint64_t(g.entries) * sizeof(sv_cqe_payload);
		if (g.payload_offset < slots_end || end > g.size)
			return false;
	}
	return true;
}

void queue_geom_register(const void *map, const queue_geom &g)
{
	if (!map)
		return;
	std::lock_guard<std::mutex> l(g_write_lock);
	size_t i = hash(map);
	entry *reuse = nullptr;
	for (size_t n = 0; n < kSlots; n++, i = (i + 1) % kSlots) {
		const void *k = g_table[i].key.load(std::memory_order_relaxed);
		if (k == map) {
			reuse = &g_table[i];
			break;
		}
		if (k == kTombstone && !reuse)
			reuse = &g_table[i];
		if (!k) {
			if (!reuse)
				reuse = &g_table[i];
			break;
		}
	}
	if (!reuse)
		return; // Full: the ring is then judged by its header alone
	// Readers that find the old key while the value changes see the key
	// change after their copy, and treat the entry as absent.
	reuse->key.store(kTombstone, std::memory_order_release);
	std::atomic_thread_fence(std::memory_order_release);
	store(*reuse, g);
	reuse->key.store(map, std::memory_order_release);
}

void queue_geom_forget(const void *map)
{
	if (!map)
		return;
	std::lock_guard<std::mutex> l(g_write_lock);
	size_t i = hash(map);
	for (size_t n = 0; n < kSlots; n++, i = (i + 1) % kSlots) {
		const void *k = g_table[i].key.load(std::memory_order_relaxed);
		if (!k)
			return;
		if (k == map) {
			g_table[i].key.store(kTombstone, std::memory_order_release);
			return;
		}
	}
}

[[gnu::hot]] bool queue_geometry(const void *map, queue_geom &out)
{
	if (!map)
		return false;
	size_t i = hash(map);
	for (size_t n = 0; n < kSlots; n++, i = (i + 1) % kSlots) {
		entry &e = g_table[i];
		const void *k = e.key.load(std::memory_order_acquire);
		if (!k)
			break;
		if (k != map)
			continue;
		out.kind = e.f[0].load(std::memory_order_relaxed);
		out.entries = e.f[1].load(std::memory_order_relaxed);
		out.entry_size = e.f[2].load(std::memory_order_relaxed);
		out.slots_offset = e.f[3].load(std::memory_order_relaxed);
		out.max_sge = e.f[4].load(std::memory_order_relaxed);
		out.payload_offset = e.f[5].load(std::memory_order_relaxed);
		out.size = e.size.load(std::memory_order_relaxed);
		std::atomic_thread_fence(std::memory_order_acquire);
		if (e.key.load(std::memory_order_relaxed) == map)
			return true;
		break;
	}
	// Never registered: the header's word, as far as it is consistent.
	const auto *h = static_cast<const sv_queue_hdr *>(map);
	queue_geom g;
	g.kind = std::atomic_ref<const uint32_t>(h->kind).load(std::memory_order_relaxed);
	g.entries = std::atomic_ref<const uint32_t>(h->entries).load(std::memory_order_relaxed);
	g.entry_size =
		std::atomic_ref<const uint32_t>(h->entry_size).load(std::memory_order_relaxed);
	g.slots_offset =
		std::atomic_ref<const uint32_t>(h->slots_offset).load(std::memory_order_relaxed);
	g.max_sge = std::atomic_ref<const uint32_t>(h->max_sge).load(std::memory_order_relaxed);
	g.size = std::atomic_ref<const uint64_t>(h->seg.seg_size).load(std::memory_order_relaxed);
	g.payload_offset = 0;
	if (!queue_geom_valid(g))
		return false;
	out = g;
	return true;
}

} // namespace loop
