// SPDX-License-Identifier: MIT
#include "c_boundary.h"
#include "peer_maps.h"
#include "queue_seg.h"
#include "queue_geom.h"

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <climits>
#include <map>
#include <mutex>
#include <set>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>
#include <unordered_map>

namespace loop {

namespace {

// Fills in a new queue's header and records its geometry; returns p.
void *queue_init(void *p, size_t bytes, sv_obj_kind kind, uint32_t entries, uint32_t entry_size,
		 uint32_t header_size, uint32_t max_sge, const obj_ref &ref, size_t extra_bytes);

} // namespace

// One mapping of a peer's queue segment; unmapped with its last holder.
struct queue_mapping {
	uint32_t gen;
	void *addr;
	size_t size;
	queue_mapping(uint32_t g, void *a, size_t s) : gen(g), addr(a), size(s) {}
	queue_mapping(const queue_mapping &) = delete;
	queue_mapping &operator=(const queue_mapping &) = delete;
	~queue_mapping()
	{
		queue_geom_forget(addr);
		munmap(addr, size);
	}
};

namespace {

std::mutex g_map_lock;
// slot -> mapping.  Never destroyed: a progress thread may still map at exit.
std::unordered_map<uint32_t, std::shared_ptr<queue_mapping>> &g_maps =
	*new std::unordered_map<uint32_t, std::shared_ptr<queue_mapping>>;

// Names tried before queue_create gives up: each try has a fresh nonce, so
// only someone who fills /dev/shm with every name could exhaust them.
constexpr int kNameTries = 16;

// 64 random bits for a segment's name, never 0.  No fallback to anything
// guessable: without getrandom (or /dev/urandom) no segment is created.
int random_nonce(uint64_t &out)
{
	uint64_t v = 0;
	ssize_t n = getrandom(&v, sizeof(v), 0);
	if (n != static_cast<ssize_t>(sizeof(v))) {
		int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			return errno ? errno : EIO;
		n = read(fd, &v, sizeof(v));
		close(fd);
		if (n != static_cast<ssize_t>(sizeof(v)))
			return EIO;
	}
	out = v ? v : 1;
	return 0;
}

void set_nonce(sv_obj_rec &o, uint64_t n)
{
	o.nonce[0] = static_cast<uint32_t>(n);
	o.nonce[1] = static_cast<uint32_t>(n >> 32);
}

bool debug_on()
{
	static const bool on = [] {
		const char *s = getenv("SOFTVERBS_DEBUG");
		return s && *s && strcmp(s, "0") != 0;
	}();
	return on;
}

} // namespace

size_t queue_bytes(uint32_t header_size, uint32_t entries, uint32_t entry_size)
{
	size_t b = header_size + static_cast<size_t>(entries) * entry_size;
	return (b + 4095) & ~size_t(4095);
}

std::string queue_name(const fabric &fab, const obj_ref &ref)
{
	const sv_obj_rec &o = fab.reg()->objs[ref.slot % SV_MAX_OBJS];
	return object_segment_name(fab.segment_path(), ref.slot, ref.gen, object_nonce(o));
}

void report_refused(const std::string &path, const std::string &why)
{
	static std::mutex m;
	static std::set<std::string> said; // The reason's first words: one line per kind
	std::string kind = why.substr(0, 8);
	{
		std::lock_guard<std::mutex> g(m);
		if (!said.insert(kind).second && !debug_on())
			return;
	}
	// A segment's name, or " (placed: ...)" for a ring in an owner's file.
	fprintf(stderr, "softverbs: refusing %s%s: %s\n",
		path.compare(0, 1, "/") ? "a ring" : "segment /dev/shm", path.c_str(), why.c_str());
}

placed_file::~placed_file()
{
	close(fd);
}

namespace {

struct placed_range {
	uintptr_t addr;
	size_t len;
	uint64_t offset;
	std::shared_ptr<placed_file> file;
};
std::mutex g_place_lock;
// Published ranges by address.  Never destroyed (see g_maps).
std::map<uintptr_t, placed_range> &g_placed = *new std::map<uintptr_t, placed_range>;

constexpr uint64_t kPage = 4096;

} // namespace

int place_publish(void *addr, size_t len, int fd, uint64_t offset)
{
	auto a = reinterpret_cast<uintptr_t>(addr);
	if (!addr || !len || a + len < a || offset + len < offset ||
	    (fd >= 0 && (a - offset) % kPage))
		return EINVAL;
	std::shared_ptr<placed_file> file;
	if (fd >= 0) {
		int dup_fd = fcntl(fd, F_DUPFD_CLOEXEC, 3);
		if (dup_fd < 0)
			return errno;
		struct stat st;
		if (fstat(dup_fd, &st) < 0 || !S_ISREG(st.st_mode)) {
			close(dup_fd);
			return EINVAL; // Peers map it: a memfd, a /dev/shm or tmpfs file
		}
		// Peers load and store through their mappings of it: a page cut
		// off by ftruncate would be SIGBUS in them.  So the file must be
		// sealed against shrinking; a memfd made with MFD_ALLOW_SEALING
		// is sealed here.  (The file's size is checked where a ring is
		// placed and by each peer that maps one.)
		int seals = fcntl(dup_fd, F_GET_SEALS);
		if (seals >= 0 && !(seals & F_SEAL_SHRINK) &&
		    fcntl(dup_fd, F_ADD_SEALS, F_SEAL_SHRINK) == 0)
			seals |= F_SEAL_SHRINK;
		if (seals < 0 || !(seals & F_SEAL_SHRINK) || !sealed_tmpfs(dup_fd, 0)) {
			close(dup_fd);
			static std::once_flag said;
			std::call_once(said, [] {
				fprintf(stderr,
					"softverbs: softverbs_dv_alloc_fd: EINVAL: the file must be a "
					"memfd (not hugetlbfs) sealed against shrinking, or made with "
					"MFD_ALLOW_SEALING so that the library seals it: peers map "
					"rings placed in it, and a page cut off by ftruncate would "
					"kill them with SIGBUS\n");
			});
			return EINVAL;
		}
		try {
			file = std::make_shared<placed_file>(dup_fd);
		} catch (...) {
			close(dup_fd);
			return ENOMEM;
		}
	}
	std::shared_ptr<placed_file> dropped; // Closed after the lock, if last
	std::lock_guard<std::mutex> g(g_place_lock);
	// Ranges that overlap this one are forgotten (a queue placed in one
	// keeps its file open).
	for (auto it = g_placed.begin(); it != g_placed.end();) {
		if (it->first < a + len && a < it->first + it->second.len) {
			dropped = std::move(it->second.file);
			it = g_placed.erase(it);
		} else {
			++it;
		}
	}
	if (!file)
		return 0;
	try {
		g_placed.emplace(a, placed_range{a, len, offset, std::move(file)});
	} catch (...) {
		return ENOMEM;
	}
	return 0;
}

std::shared_ptr<placed_file> place_find(const void *mem, size_t len, uint64_t &offset)
{
	auto a = reinterpret_cast<uintptr_t>(mem);
	std::lock_guard<std::mutex> g(g_place_lock);
	auto it = g_placed.upper_bound(a);
	if (it == g_placed.begin())
		return nullptr;
	--it;
	const placed_range &r = it->second;
	if (a < r.addr || len > r.len || a - r.addr > r.len - len)
		return nullptr;
	offset = r.offset + (a - r.addr);
	return r.file;
}

void obj_rec_init(sv_registry *r, sv_obj_rec &o, int lease, sv_obj_kind kind)
{
	o.generation++;
	o.owner_lease = static_cast<uint32_t>(lease);
	o.owner_gen = r->leases[lease].generation;
	o.kind = kind;
	o.srq_num = o.xrcd = 0;
	o.cq_obj = o.cq_gen = o.pdn = 0;
	o.nonce[0] = o.nonce[1] = 0;
	o.place_fd = o.place_pages = 0;
	o.place_offset = 0;
}

size_t queue_total_bytes(uint32_t header_size, uint32_t entries, uint32_t entry_size,
			 size_t extra_bytes)
{
	return queue_bytes(header_size, entries, entry_size) + ((extra_bytes + 4095) & ~size_t(4095));
}

void *queue_create(fabric &fab, int lease, sv_obj_kind kind, uint32_t entries,
		   uint32_t entry_size, uint32_t header_size, uint32_t max_sge, obj_ref &ref,
		   size_t extra_bytes, const queue_place *place)
{
	size_t bytes = queue_total_bytes(header_size, entries, entry_size, extra_bytes);
	if (place && (reinterpret_cast<uintptr_t>(place->mem) % kPage || place->offset % kPage ||
		      !place->file || bytes / kPage > UINT32_MAX)) {
		errno = EINVAL;
		return nullptr;
	}
	sv_registry *r = fab.reg();
	uint64_t nonce = 0;
	if (int e = random_nonce(nonce)) {
		errno = e;
		return nullptr;
	}
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
		obj_rec_init(r, o, lease, kind);
		o.place_fd = place ? static_cast<uint32_t>(place->file->fd) + 1 : 0;
		o.place_pages = place ? static_cast<uint32_t>(bytes / kPage) : 0;
		o.place_offset = place ? place->offset : 0;
		set_nonce(o, nonce);
		std::atomic_ref<uint32_t>(o.in_use).store(1, std::memory_order_release);
		ref.slot = slot;
		ref.gen = o.generation;
	}
	void *p = MAP_FAILED;
	if (place) {
		// The application's memory: zeroed, as a new segment is.
		p = place->mem;
		memset(p, 0, bytes);
		return queue_init(p, bytes, kind, entries, entry_size, header_size, max_sge, ref,
				  extra_bytes);
	}
	// O_EXCL under a name nobody could guess: a file that is already there
	// was put there by someone else (another user, with protected_regular
	// giving EACCES, or without it EEXIST), and is never opened.  No peer
	// knows the object yet, so the nonce may still change.
	std::string name;
	int fd = -1;
	int err = 0;
	for (int tries = 0;; tries++) {
		name = object_segment_name(fab.segment_path(), ref.slot, ref.gen, nonce);
		fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
		if (fd >= 0)
			break;
		err = errno;
		if ((err != EEXIST && err != EACCES) || tries + 1 >= kNameTries)
			break;
		report_refused(name, "the name is taken already (" + std::string(strerror(err)) +
					     "); trying another");
		if ((err = random_nonce(nonce)))
			break;
		registry_guard g(fab);
		set_nonce(r->objs[ref.slot], nonce);
	}
	// The umask may have taken the owner's bits: peers open it read-write.
	if (fd >= 0 && (fchmod(fd, 0600) < 0 || ftruncate(fd, static_cast<off_t>(bytes)) < 0))
		err = errno;
	else if (fd >= 0 && (err = reserve_segment(fd, bytes)))
		;
	else if (fd >= 0)
		p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (fd >= 0 && !err && p == MAP_FAILED)
		err = errno;
	if (fd >= 0)
		close(fd);
	if (fd < 0 || err) {
		if (fd >= 0)
			shm_unlink(name.c_str()); // Ours: created above with O_EXCL
		registry_guard g(fab);
		r->objs[ref.slot].in_use = 0;
		errno = err ? err : EIO;
		return nullptr;
	}
	return queue_init(p, bytes, kind, entries, entry_size, header_size, max_sge, ref,
			  extra_bytes);
}

namespace {

void *queue_init(void *p, size_t bytes, sv_obj_kind kind, uint32_t entries, uint32_t entry_size,
		 uint32_t header_size, uint32_t max_sge, const obj_ref &ref, size_t extra_bytes)
{
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

} // namespace

void queue_destroy(fabric &fab, const obj_ref &ref, void *map, bool placed)
{
	// The size we mapped, not the header's (a peer may have rewritten it).
	queue_geom geom;
	if (!queue_geometry(map, geom))
		geom.size = 0;
	size_t bytes = geom.size;
	queue_geom_forget(map);
	if (!placed)
		shm_unlink(queue_name(fab, ref).c_str());
	std::shared_ptr<queue_mapping> cached;
	{
		// This process's peer-side mapping of the same queue (a QP of
		// ours talking to another of ours), if any: it goes with its
		// last holder.
		std::lock_guard<std::mutex> g(g_map_lock);
		auto it = g_maps.find(ref.slot);
		if (it != g_maps.end() && it->second->gen == ref.gen) {
			cached = std::move(it->second);
			g_maps.erase(it);
		}
	}
	cached.reset();
	if (bytes && !placed)
		munmap(map, bytes); // Else leaked rather than unmapping a guess
	registry_guard g(fab);
	sv_obj_rec &o = fab.reg()->objs[ref.slot];
	if (o.generation == ref.gen)
		o.in_use = 0;
}

namespace {

// The /dev/shm segment of a live object, mapped whole after fstat checks;
// nullptr if it is gone or refused.
void *map_segment(fabric &fab, const obj_ref &ref, std::string &name, size_t &size)
{
	name = queue_name(fab, ref);
	// A requester maps a peer's queue in the middle of a WR (after taking
	// its receive WQE): no cancellation in between (c_boundary.h).
	cancel_off hold;
	int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (fd < 0) {
		if (errno == EMFILE || errno == ENFILE || errno == ENOMEM)
			report_refused(name, std::string("cannot open it: ") + strerror(errno) +
						     " (requests through it are as if lost)");
		return nullptr;
	}
	// Owner, mode and size before anything is mapped.
	std::string why;
	if (check_segment(fd, sizeof(sv_queue_hdr), kMaxQueueBytes, why)) {
		close(fd);
		report_refused(name, why);
		return nullptr;
	}
	struct stat st;
	if (fstat(fd, &st) < 0) {
		close(fd);
		return nullptr;
	}
	size = static_cast<size_t>(st.st_size);
	void *p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	return p == MAP_FAILED ? nullptr : p;
}

// A queue its owner placed in its allocator's memory: the range of the
// owner's file that the record names, taken from the owner's descriptor
// table.  The record is read once; the header check that follows (object
// slot and generation, size) catches a record reused meanwhile.
void *map_placed(fabric &fab, const sv_obj_rec &o, std::string &name,
		 size_t &size)
{
	uint32_t fd_plus = o.place_fd, pages = o.place_pages, lease = o.owner_lease;
	uint64_t off = o.place_offset;
	if (lease >= SV_MAX_PROCS || !fd_plus || fd_plus > INT_MAX || !pages ||
	    uint64_t{pages} * kPage > kMaxQueueBytes || off % kPage)
		return nullptr;
	size = size_t{pages} * kPage;
	auto pid = static_cast<pid_t>(fab.reg()->leases[lease].pid);
	name = " (placed: descriptor " + std::to_string(fd_plus - 1) + " of process " +
	       std::to_string(pid) + ")";
	int fd = pid == getpid() ? fcntl(static_cast<int>(fd_plus - 1), F_DUPFD_CLOEXEC, 3)
				 : open_peer_fd(pid, static_cast<int>(fd_plus - 1));
	if (fd < 0) {
		report_refused(name, std::string("cannot take the owner's descriptor (") +
					     strerror(errno) + "): ptrace permission is needed, as "
							       "for cross-memory attach");
		return nullptr;
	}
	struct stat st;
	std::string why;
	if (fstat(fd, &st) < 0)
		why = std::string("fstat failed: ") + strerror(errno);
	else if (st.st_uid != geteuid())
		why = "it belongs to uid " + std::to_string(st.st_uid) + ", not to this user";
	else if (!S_ISREG(st.st_mode))
		why = "it is not a regular file (a memfd, /dev/shm or tmpfs file)";
	else if (static_cast<uint64_t>(st.st_size) < off ||
		 static_cast<uint64_t>(st.st_size) - off < size)
		why = "the file is shorter than the queue the record names";
	else if (!sealed_tmpfs(fd, off + size))
		why = "it is not a tmpfs file sealed against shrinking (F_SEAL_SHRINK): its "
		      "owner could cut pages off under our mapping";
	void *p = MAP_FAILED;
	if (why.empty())
		p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
			 static_cast<off_t>(off));
	close(fd);
	if (!why.empty()) {
		report_refused(name, why);
		return nullptr;
	}
	return p == MAP_FAILED ? nullptr : p;
}

} // namespace

queue_hold queue_map(fabric &fab, const obj_ref &ref, sv_obj_kind kind)
{
	if (ref.slot >= SV_MAX_OBJS)
		return {};
	sv_obj_rec &o = fab.reg()->objs[ref.slot];
	if (!std::atomic_ref<uint32_t>(o.in_use).load(std::memory_order_acquire) ||
	    o.generation != ref.gen || o.kind != static_cast<uint32_t>(kind))
		return {};
	std::shared_ptr<queue_mapping> old; // Released after the lock
	std::lock_guard<std::mutex> g(g_map_lock);
	auto it = g_maps.find(ref.slot);
	if (it != g_maps.end()) {
		if (it->second->gen == ref.gen)
			return {it->second, it->second->addr};
		// The slot holds a newer queue now: the cache lets the old
		// mapping go; it is unmapped when its last holder does.
		old = std::move(it->second);
		g_maps.erase(it);
	}
	std::string name;
	size_t size = 0;
	void *p = o.place_fd ? map_placed(fab, o, name, size) : map_segment(fab, ref, name, size);
	if (!p)
		return {};
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
		  h->seg.seg_size == size && h->obj_slot == ref.slot && h->obj_gen == ref.gen &&
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
		report_refused(name, "its header is not that of a valid queue (a damaged or "
				     "foreign segment)");
		return {};
	}
	queue_geom_register(p, geom);
	std::shared_ptr<queue_mapping> m;
	try {
		m = std::make_shared<queue_mapping>(ref.gen, p, size);
		g_maps[ref.slot] = m;
	} catch (...) {
		if (!m) {
			queue_geom_forget(p);
			munmap(p, size);
		}
		return {}; // Out of memory: as if the queue could not be mapped
	}
	return {m, p};
}

} // namespace loop
