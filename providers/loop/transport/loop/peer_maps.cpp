// SPDX-License-Identifier: MIT
// The loop transport's mappings of peers' fd-backed memory (memfd, shm
// files, dma-bufs registered with reg_mr_fd or reg_dmabuf_mr): made on first
// use, cached, and reference-counted, so that a copy through one never
// loses it under its feet.  Keys resolve into them (mr_resolve,
// verbs/loop_mr.cpp); nothing else maps a peer's memory.
#include "peer_maps.h"

#include <atomic>
#include <cerrno>
#include <fcntl.h>
#include <map>
#include <mutex>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <ctime>
#include <unistd.h>

namespace loop {

namespace {

// A cached mapping is reference-counted: the cache holds one reference and
// every rseg or mr_hit that points into it holds another (their pin), so
// evicting it only drops the cache's.  munmap runs when the last goes, never
// under a copy that another thread is making through it.  Memory stays
// bounded: at most kMaxMaps cached, plus those pinned by the few segments
// each thread holds for the operation it is running.
struct fd_map {
	std::shared_ptr<char> base; // Our mapping; its deleter unmaps it
	uint64_t off;		    // Object offset of base
	uint64_t len;		    // Bytes mapped at base
	bool direct;		    // Plain memcpy is safe (sealed_tmpfs)
	int64_t looked = 0;	    // Coarse clock's tick of the last liveness look
};

std::mutex g_map_lock;
// (slot << 32 | cookie) -> mapping.  Never destroyed (see g_objects).
std::map<uint64_t, fd_map> &g_maps = *new std::map<uint64_t, fd_map>; // At most kMaxMaps (tunables.h)

// Our mapping of a peer's fd-backed MR, made on first use and cached.
// Returns the address of the record's iova and sets pin, which keeps the
// mapping alive for as long as the caller (or a copy of pin) holds it.
} // namespace

// Whether a plain memcpy through a writable shared mapping of fd's
// [0, end) can never fault: a memfd on tmpfs (not hugetlbfs, whose holes
// can fail to fill with SIGBUS) sealed against shrinking (seals are never
// removed, so no one can truncate it under us later) and already at least
// end bytes long.  Everything else is copied by the kernel between our
// own addresses, which answers EFAULT where a plain copy would die of
// SIGBUS.
bool sealed_tmpfs(int fd, uint64_t end)
{
	int seals = fcntl(fd, F_GET_SEALS);
	if (seals < 0 || !(seals & F_SEAL_SHRINK))
		return false;
	struct statfs fs;
	struct stat st;
	if (fstatfs(fd, &fs) || fs.f_type != TMPFS_MAGIC || fstat(fd, &st))
		return false;
	return st.st_size >= 0 && static_cast<uint64_t>(st.st_size) >= end;
}

int64_t coarse_now()
{
	timespec ts;
	clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
	return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

char *peer_map(fabric &fab, uint32_t slot, const sv_mr_rec &c, std::shared_ptr<void> &pin,
	       bool &direct, bool &dead)
{
	dead = false;
	uint64_t id = (static_cast<uint64_t>(slot) << 32) | c.cookie;
	std::lock_guard<std::mutex> g(g_map_lock);
	auto it = g_maps.find(id);
	if (it == g_maps.end()) {
		if (c.owner_lease >= SV_MAX_PROCS)
			return nullptr;
		pid_t pid = static_cast<pid_t>(fab.reg()->leases[c.owner_lease].pid);
		int fd = open_peer_fd(pid, c.fd);
		struct stat st;
		if (fd >= 0 && c.fd_ino && (fstat(fd, &st) || static_cast<uint64_t>(st.st_ino) != c.fd_ino)) {
			// The owner's descriptor number now names another file (the
			// application closed ours and opened something else).
			close(fd);
			fd = -1;
		}
		if (fd < 0) {
			// A remapped plain MR is reachable by its addresses too:
			// remember the refusal rather than ask on every access.
			if (c.flags & SV_MR_MAPPED) {
				try {
					if (g_maps.size() >= kMaxMaps)
						g_maps.clear();
					g_maps.emplace(id, fd_map{nullptr, 0, 0, false});
				} catch (...) {
				}
			}
			return nullptr;
		}
		uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
		uint64_t off = c.fd_offset & ~(page - 1);
		size_t len = c.fd_offset - off + c.length;
		void *p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
			       static_cast<off_t>(off));
		bool writable = p != MAP_FAILED;
		if (p == MAP_FAILED)
			p = mmap(nullptr, len, PROT_READ, MAP_SHARED, fd, static_cast<off_t>(off));
		bool sealed = writable && p != MAP_FAILED && sealed_tmpfs(fd, off + len);
		close(fd);
		if (p == MAP_FAILED)
			return nullptr;
		std::shared_ptr<char> base;
		try {
			base = std::shared_ptr<char>(static_cast<char *>(p),
						     [len](char *a) { munmap(a, len); });
			if (g_maps.size() >= kMaxMaps) {
				// Mappings of MRs that are gone or re-registered go
				// first; if that frees nothing, all of them.  Either
				// way only the cache's reference is dropped.
				sv_registry *r = fab.reg();
				std::erase_if(g_maps, [r](const auto &e) {
					sv_mr_rec &m = r->mrs[(e.first >> 32) % SV_MAX_MRS];
					return std::atomic_ref<uint32_t>(m.state).load(
						       std::memory_order_relaxed) ==
						       SV_MR_FREE ||
					       m.cookie != static_cast<uint32_t>(e.first);
				});
				if (g_maps.size() >= kMaxMaps)
					g_maps.clear();
			}
			it = g_maps.emplace(id, fd_map{base, off, len, sealed}).first;
		} catch (...) {
			// No memory for the bookkeeping: fail this access (EFAULT),
			// never throw through the C caller.
			if (!base)
				munmap(p, len);
			return nullptr;
		}
	}
	if (!it->second.base)
		return nullptr; // Refused before (see above)
	// The record as read now must lie within what was mapped for it: its
	// offset and length are read from shared memory at every access, and
	// a stray write into them (the cookie and state intact) would send a
	// copy past the mapping's end (a fault-injection test's SIGSEGV).
	const fd_map &fm = it->second;
	if (c.fd_offset < fm.off || c.fd_offset - fm.off > fm.len ||
	    c.length > fm.len - (c.fd_offset - fm.off))
		return nullptr;
	if (int64_t now = coarse_now(); now != it->second.looked) {
		it->second.looked = now;
		if (!fab.lease_alive(c.owner_lease, c.owner_gen)) {
			// Our mapping would keep all of the dead owner's memory
			// alive: only copies in progress hold it now.
			g_maps.erase(it);
			dead = true;
			return nullptr;
		}
	}
	pin = it->second.base;
	direct = it->second.direct;
	return it->second.base.get() + (c.fd_offset - it->second.off);
}

} // namespace loop
