// SPDX-License-Identifier: MIT
#include "queue_seg.h"
#include "queue_geom.h"

#include <atomic>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <mutex>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <unordered_map>

namespace loop {

namespace {

struct cached_map {
	uint32_t gen;
	void *addr;
	size_t size;
};

std::mutex g_map_lock;
std::unordered_map<uint32_t, cached_map> g_maps; // slot -> mapping

} // namespace

size_t queue_bytes(uint32_t header_size, uint32_t entries, uint32_t entry_size)
{
	size_t b = header_size + static_cast<size_t>(entries) * entry_size;
	return (b + 4095) & ~size_t(4095);
}

std::string queue_name(const fabric &fab, const obj_ref &ref)
{
	return fab.segment_path() + "-q" + std::to_string(ref.slot) + "." + std::to_string(ref.gen);
}

void *queue_create(fabric &fab, int lease, sv_obj_kind kind, uint32_t entries,
		   uint32_t entry_size, uint32_t header_size, uint32_t max_sge, obj_ref &ref,
		   size_t extra_bytes)
{
	sv_registry *r = fab.reg();
	{
		registry_guard g(fab);
		uint32_t slot = SV_MAX_OBJS;
		for (uint32_t i = 0; i < SV_MAX_OBJS; i++)
			if (!r->objs[i].in_use) {
				slot = i;
				break;
			}
		if (slot == SV_MAX_OBJS) {
			errno = ENOMEM;
			return nullptr;
		}
		sv_obj_rec &o = r->objs[slot];
		o.generation++;
		o.in_use = 1;
		o.owner_lease = static_cast<uint32_t>(lease);
		o.owner_gen = r->leases[lease].generation;
		o.kind = kind;
		o.srq_num = 0;
		o.xrcd = 0;
		ref.slot = slot;
		ref.gen = o.generation;
	}
	std::string name = queue_name(fab, ref);
	size_t bytes = queue_bytes(header_size, entries, entry_size) +
		       ((extra_bytes + 4095) & ~size_t(4095));
	int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	void *p = MAP_FAILED;
	int err = 0;
	if (fd < 0 || ftruncate(fd, static_cast<off_t>(bytes)) < 0)
		err = errno;
	else
		p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (!err && p == MAP_FAILED)
		err = errno;
	if (fd >= 0)
		close(fd);
	if (err) {
		shm_unlink(name.c_str());
		registry_guard g(fab);
		r->objs[ref.slot].in_use = 0;
		errno = err;
		return nullptr;
	}
	auto *h = static_cast<sv_queue_hdr *>(p);
	h->seg.magic = SV_SEG_MAGIC;
	h->seg.abi_version = SV_ABI_VERSION;
	h->seg.kind = SV_SEG_QUEUE;
	h->seg.seg_size = bytes;
	h->seg.creator_pid = static_cast<uint32_t>(getpid());
	h->kind = kind;
	h->entries = entries;
	h->entry_size = entry_size;
	h->slots_offset = header_size;
	h->owner_pid = static_cast<uint32_t>(getpid());
	h->max_sge = max_sge;
	h->obj_slot = ref.slot;
	h->obj_gen = ref.gen;
	// The layout as we made it: what this process indexes the ring with,
	// whatever a peer later writes into the header.  A CQ's payload array
	// (extra_bytes) starts at the page after its slots.
	queue_geom geom;
	geom.kind = kind;
	geom.entries = entries;
	geom.entry_size = entry_size;
	geom.slots_offset = header_size;
	geom.max_sge = max_sge;
	geom.size = bytes;
	if (kind == SV_OBJ_CQ && extra_bytes)
		geom.payload_offset =
			static_cast<uint32_t>(queue_bytes(header_size, entries, entry_size));
	queue_geom_register(p, geom);
	std::atomic_ref<uint32_t>(h->seg.state).store(SV_SEG_READY, std::memory_order_release);
	return p;
}

void queue_destroy(fabric &fab, const obj_ref &ref, void *map)
{
	// The size we mapped, not the header's (a peer may have rewritten it).
	queue_geom geom;
	if (!queue_geometry(map, geom))
		geom.size = 0;
	size_t bytes = geom.size;
	queue_geom_forget(map);
	shm_unlink(queue_name(fab, ref).c_str());
	{
		std::lock_guard<std::mutex> g(g_map_lock);
		auto it = g_maps.find(ref.slot);
		if (it != g_maps.end() && it->second.addr == map)
			g_maps.erase(it);
	}
	if (bytes)
		munmap(map, bytes); // Else leaked rather than unmapping a guess
	registry_guard g(fab);
	sv_obj_rec &o = fab.reg()->objs[ref.slot];
	if (o.generation == ref.gen)
		o.in_use = 0;
}

void *queue_map(fabric &fab, const obj_ref &ref, sv_obj_kind kind)
{
	if (ref.slot >= SV_MAX_OBJS)
		return nullptr;
	sv_obj_rec &o = fab.reg()->objs[ref.slot];
	if (!std::atomic_ref<uint32_t>(o.in_use).load(std::memory_order_acquire) ||
	    o.generation != ref.gen || o.kind != static_cast<uint32_t>(kind))
		return nullptr;
	std::lock_guard<std::mutex> g(g_map_lock);
	auto it = g_maps.find(ref.slot);
	if (it != g_maps.end()) {
		if (it->second.gen == ref.gen)
			return it->second.addr;
		queue_geom_forget(it->second.addr);
		munmap(it->second.addr, it->second.size);
		g_maps.erase(it);
	}
	int fd = shm_open(queue_name(fab, ref).c_str(), O_RDWR | O_CLOEXEC, 0600);
	if (fd < 0)
		return nullptr;
	struct stat st;
	if (fstat(fd, &st) < 0 || static_cast<size_t>(st.st_size) < sizeof(sv_queue_hdr)) {
		close(fd);
		return nullptr;
	}
	size_t size = static_cast<size_t>(st.st_size);
	void *p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (p == MAP_FAILED)
		return nullptr;
	auto *h = static_cast<sv_queue_hdr *>(p);
	// Everything a peer wrote is checked before it is trusted, and the
	// layout is copied out once checked: the header may change under us
	// later, the copy (queue_geometry) does not.
	queue_geom geom;
	geom.kind = kind;
	geom.entries = h->entries;
	geom.entry_size = h->entry_size;
	geom.slots_offset = h->slots_offset;
	geom.max_sge = h->max_sge;
	geom.size = size;
	if (kind == SV_OBJ_CQ)
		geom.payload_offset = reinterpret_cast<const sv_cq_ring *>(h)->payload_offset;
	bool ok = std::atomic_ref<uint32_t>(h->seg.state).load(std::memory_order_acquire) ==
			  SV_SEG_READY &&
		  h->seg.magic == SV_SEG_MAGIC && h->seg.abi_version == SV_ABI_VERSION &&
		  h->seg.kind == SV_SEG_QUEUE && h->kind == static_cast<uint32_t>(kind) &&
		  h->seg.seg_size == size &&
		  (kind != SV_OBJ_CQ || size >= sizeof(sv_cq_ring)) &&
		  ((kind != SV_OBJ_RQ && kind != SV_OBJ_SRQ) ||
		   (size >= sizeof(sv_rq_ring) && geom.slots_offset >= sizeof(sv_rq_ring) &&
		    geom.max_sge <= (geom.entry_size - sizeof(sv_recv_wqe)) / sizeof(sv_sge))) &&
		  (kind != SV_OBJ_SVC || size >= sizeof(sv_svc_ring));
	if (ok && !queue_geom_valid(geom) && geom.payload_offset) {
		// A CQ whose payload array is out of place: usable without it
		// (a SEND that would travel in it fails visibly instead).
		geom.payload_offset = 0;
	}
	ok = ok && queue_geom_valid(geom);
	if (!ok) {
		munmap(p, size);
		return nullptr;
	}
	queue_geom_register(p, geom);
	g_maps[ref.slot] = cached_map{ref.gen, p, size};
	return p;
}

} // namespace loop
