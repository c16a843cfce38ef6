// SPDX-License-Identifier: MIT
// Remapped registrations (docs/memory.md): the pages of a registered range
// of private anonymous memory are moved onto one memfd per process (the
// arena), keeping their addresses and contents, and the MR's record names
// the arena and the offset.  A peer then maps that piece of the arena once
// and copies with memcpy: no system call per one-sided operation.
//
// The move is a copy into a fresh shared mapping of the arena followed by
// mremap() of that mapping onto the range, which replaces the anonymous
// pages atomically; deregistration (the last hold) does the reverse into
// fresh anonymous memory, so that a peer that checked the key just before
// writes into arena pages nobody uses again (offsets are never handed out
// twice), not into memory the application reuses.  Both run on raw system
// calls: memory hooks of UCX or Open MPI (which interpose mmap, munmap and
// mremap to watch for unmapped registrations) never see them.
#include "loop_remap.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <map>
#include <mutex>
#include <pthread.h>
#include <csignal>
#include <string>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>
#include <vector>

namespace loop {

namespace {

// At most this much memory is held twice while a range moves (it moves
// in pieces of this size).
constexpr size_t kPiece = 16u << 20;
// The move leaves a range in at most three mappings (it splits the one it
// lies in); it is refused unless the process stays this far below
// vm.max_map_count.
constexpr size_t kMapHeadroomDiv = 8; // An eighth of the limit
// Each block owns a window of the arena this much longer than itself, all
// holes: an application that grows the range with mremap (realloc does)
// maps further offsets of the file, which must read as zeros, as grown
// anonymous memory does, and never be another block's.
constexpr uint64_t kWindowSlack = 1ULL << 36; // 64 GiB of offsets
constexpr uint64_t kArenaMax = 1ULL << 62;

struct block {
	size_t len;
	uint64_t off;  // In the arena
	uint64_t win;  // Its window of offsets: [off, off + win)
	uint32_t refs; // MRs on it (0: released, waiting for a plain MR to go)
	dev_t dev;     // The arena it is in (a closed arena's blocks stay)
	ino_t ino;
};

std::mutex g_lock; // Also held across fork (see on_fork_*)
// Set in the thread that forks, from on_fork_prepare to on_fork_parent or
// on_fork_child: it holds g_lock then, and the pre-fork handlers that run
// after ours in that thread may deregister (UCX purges its registration
// cache before a fork) or register memory.  They take g_lock as held.
thread_local bool t_forking = false;

void child_fixup();
extern bool g_child_done;
extern pid_t g_fork_pid;

// g_lock, or nothing in the forking thread, which holds it already; in the
// child, before our child handler ran, the child's side done first.
struct remap_guard {
	bool own = !t_forking;
	remap_guard()
	{
		if (own)
			g_lock.lock();
		else if (!g_child_done && getpid() != g_fork_pid)
			child_fixup();
	}
	~remap_guard()
	{
		if (own)
			g_lock.unlock();
	}
	remap_guard(const remap_guard &) = delete;
	remap_guard &operator=(const remap_guard &) = delete;
};
// First address -> block.  Never destroyed (see g_objects).
std::map<uintptr_t, block> &g_blocks = *new std::map<uintptr_t, block>;
int g_fd = -1;
pid_t g_arena_pid = 0; // The process that made the arena: the only one that frees its pages
dev_t g_dev;
ino_t g_ino;
uint64_t g_next; // The next offset handed out; offsets are never reused
// Plain MRs by address (remap_note_plain): first byte -> lengths.
std::multimap<uintptr_t, size_t> &g_plain = *new std::multimap<uintptr_t, size_t>;

bool g_plain_lost; // A plain MR could not be noted: nothing moves any more

bool overlaps_plain(uintptr_t a, size_t n)
{
	if (g_plain_lost)
		return true;
	for (const auto &[s, l] : g_plain)
		if (s < a + n && a < s + l)
			return true;
	return false;
}

void *sys_mmap(void *a, size_t n, int prot, int flags, int fd, uint64_t off)
{
	long r = syscall(SYS_mmap, a, n, prot, flags, fd, off);
	return r == -1 ? MAP_FAILED : reinterpret_cast<void *>(r);
}

void sys_munmap(void *a, size_t n)
{
	syscall(SYS_munmap, a, n);
}

bool sys_move(void *from, size_t n, uintptr_t to)
{
	return syscall(SYS_mremap, from, n, n, MREMAP_MAYMOVE | MREMAP_FIXED,
		       reinterpret_cast<void *>(to)) != -1;
}

// ---- Holding other threads' writes while a range moves ----
//
// A write into the range between its copy and the mremap would land in the
// pages being replaced and be lost.  userfaultfd's write protection makes
// such a write wait in the kernel, without a signal, until the move is
// done; woken, it faults again and lands in the new pages.  The descriptor
// is opened without UFFD_USER_MODE_ONLY, so the kernel's own writes (a
// read() into the range) wait too instead of failing with EFAULT; where
// that is not allowed (an unprivileged user under
// vm.unprivileged_userfaultfd=0, or a seccomp filter) nothing is moved.

#ifndef UFFD_FEATURE_WP_UNPOPULATED
#define UFFD_FEATURE_WP_UNPOPULATED (1 << 13) // Linux 6.4
#endif
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 // Linux 5.14
#endif

// What this kernel's userfaultfd offers us (0: none at all).
uint64_t uffd_features()
{
	static const uint64_t f = [] {
		int fd = static_cast<int>(syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK));
		if (fd < 0)
			return static_cast<uint64_t>(0);
		uffdio_api api{};
		api.api = UFFD_API;
		uint64_t r = ioctl(fd, UFFDIO_API, &api) ? 0 : static_cast<uint64_t>(api.features);
		close(fd);
		return r;
	}();
	return f;
}

// Anonymous memory moves in, the arena's shared mapping moves back out:
// write protection of both is needed before anything moves.
bool writes_can_wait()
{
	uint64_t need = UFFD_FEATURE_PAGEFAULT_FLAG_WP | UFFD_FEATURE_WP_HUGETLBFS_SHMEM;
	return (uffd_features() & need) == need;
}

class write_hold {
public:
	// Write-protects [a, a + n); false (nothing held) where it cannot.
	// The calling thread's signals are blocked meanwhile: a handler that
	// wrote into the range would wait for a wake only this thread can give.
	bool begin(uintptr_t a, size_t n)
	{
		uint64_t have = uffd_features();
		uint64_t want = UFFD_FEATURE_PAGEFAULT_FLAG_WP | UFFD_FEATURE_WP_HUGETLBFS_SHMEM |
				(have & UFFD_FEATURE_WP_UNPOPULATED);
		if ((have & want) != want)
			return false;
		// Without WP_UNPOPULATED a page never touched is not protected:
		// touch them all first (contents unchanged).
		if (!(want & UFFD_FEATURE_WP_UNPOPULATED) &&
		    madvise(reinterpret_cast<void *>(a), n, MADV_POPULATE_WRITE))
			return false;
		fd_ = static_cast<int>(syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK));
		if (fd_ < 0)
			return false;
		sigset_t all;
		sigfillset(&all);
		pthread_sigmask(SIG_BLOCK, &all, &old_);
		a_ = a;
		n_ = n;
		uffdio_api api{};
		api.api = UFFD_API;
		api.features = want;
		uffdio_register reg{};
		reg.range = {a, n};
		reg.mode = UFFDIO_REGISTER_MODE_WP;
		uffdio_writeprotect wp{};
		wp.range = {a, n};
		wp.mode = UFFDIO_WRITEPROTECT_MODE_WP;
		if (ioctl(fd_, UFFDIO_API, &api) || ioctl(fd_, UFFDIO_REGISTER, &reg) ||
		    ioctl(fd_, UFFDIO_WRITEPROTECT, &wp)) {
			close(fd_); // Unregisters whatever was registered
			fd_ = -1;
			pthread_sigmask(SIG_SETMASK, &old_, nullptr);
			return false;
		}
		return true;
	}

	// Lets the writers go: they fault again on whatever is mapped now.
	void end(bool moved)
	{
		if (fd_ < 0)
			return;
		if (!moved) {
			uffdio_writeprotect wp{};
			wp.range = {a_, n_};
			wp.mode = 0; // Unprotect (and wake)
			ioctl(fd_, UFFDIO_WRITEPROTECT, &wp);
		}
		uffdio_range r{a_, n_};
		ioctl(fd_, UFFDIO_WAKE, &r);
		close(fd_); // Wakes any left, unregisters what is still registered
		fd_ = -1;
		pthread_sigmask(SIG_SETMASK, &old_, nullptr);
	}

	~write_hold() { end(false); }

private:
	int fd_ = -1;
	uintptr_t a_ = 0;
	size_t n_ = 0;
	sigset_t old_;
};

// Copies whole pages of the application's memory.  A page-wide
// registration takes in bytes around its objects that a sanitizer keeps
// poisoned (heap redzones); an HCA reads them all the same, and so must
// the move, without the sanitizer's memcpy calling it an overflow.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
[[gnu::no_sanitize_address, gnu::no_sanitize_thread,
  gnu::optimize("no-tree-loop-distribute-patterns")]] void
copy_pages(void *dst, const void *src, size_t n)
{
	auto *d = static_cast<uint64_t *>(dst);
	auto *s = static_cast<const uint64_t *>(src);
	for (size_t i = 0; i < n / 8; i++)
		d[i] = s[i];
}
#else
void copy_pages(void *dst, const void *src, size_t n)
{
	memcpy(dst, src, n);
}
#endif

struct vma {
	uintptr_t start, end;
	int prot;
	bool shared;
	bool anon; // Private anonymous: heap, mmap'd or named anonymous memory
	uint64_t off;
	dev_t dev;
	ino_t ino;
};

// The mappings of this process that overlap [lo, hi), and how many it has.
bool read_maps_or_throw(uintptr_t lo, uintptr_t hi, std::vector<vma> &out, size_t &count);
bool read_maps(uintptr_t lo, uintptr_t hi, std::vector<vma> &out, size_t &count);

// The mappings that overlap [lo, hi), asked of the kernel one at a time
// (PROCMAP_QUERY): the cost of the range's mappings, where reading the
// text costs that of every mapping of the process (with a thousand MRs
// moved, milliseconds per registration).  On a kernel without the ioctl,
// the text.  False where neither can be read (out of descriptors).
bool range_maps(uintptr_t lo, uintptr_t hi, std::vector<vma> &out)
{
	int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return false;
	bool ok = true, text = false;
	try {
		out.clear();
		char name[256];
		for (uintptr_t at = lo; at < hi;) {
			procmap_query_arg q{};
			q.size = sizeof(q);
			q.query_flags = kVmaCoveringOrNext;
			q.query_addr = at;
			q.vma_name_addr = reinterpret_cast<uintptr_t>(name);
			q.vma_name_size = sizeof(name);
			int r = ioctl(fd, kProcmapQuery, &q);
			bool named = true;
			if (r < 0 && errno == ENAMETOOLONG) {
				// A long path: no special name, so not anonymous
				q = {};
				q.size = sizeof(q);
				q.query_flags = kVmaCoveringOrNext;
				q.query_addr = at;
				named = false;
				r = ioctl(fd, kProcmapQuery, &q);
			}
			if (r < 0) {
				text = errno != ENOENT; // ENOENT: no mapping from at on
				break;
			}
			if (q.vma_start >= hi)
				break;
			vma v{};
			v.start = q.vma_start;
			v.end = q.vma_end;
			v.prot = (q.vma_flags & kVmaReadable ? PROT_READ : 0) |
				 (q.vma_flags & kVmaWritable ? PROT_WRITE : 0) |
				 (q.vma_flags & kVmaExecutable ? PROT_EXEC : 0);
			v.shared = q.vma_flags & kVmaShared;
			const char *path = named && q.vma_name_size ? name : "";
			v.anon = named && !v.shared && !q.inode && !q.dev_major && !q.dev_minor &&
				 (!*path || !strcmp(path, "[heap]") || !strncmp(path, "[anon:", 6));
			v.off = q.vma_offset;
			v.dev = makedev(q.dev_major, q.dev_minor);
			v.ino = static_cast<ino_t>(q.inode);
			out.push_back(v);
			at = q.vma_end;
		}
	} catch (...) {
		ok = false;
	}
	close(fd);
	if (ok && text) {
		size_t count;
		return read_maps(lo, hi, out, count);
	}
	return ok;
}

// False where the maps cannot be read whole: out of descriptors or memory
// (never an exception: a deregistration must not fail halfway for it).
bool read_maps(uintptr_t lo, uintptr_t hi, std::vector<vma> &out, size_t &count)
{
	try {
		return read_maps_or_throw(lo, hi, out, count);
	} catch (...) {
		return false;
	}
}

bool read_maps_or_throw(uintptr_t lo, uintptr_t hi, std::vector<vma> &out, size_t &count)
{
	int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return false;
	std::string text;
	char buf[16384];
	ssize_t n;
	while ((n = read(fd, buf, sizeof(buf))) > 0)
		text.append(buf, static_cast<size_t>(n));
	close(fd);
	if (n < 0)
		return false;
	out.clear();
	count = 0;
	if (text.empty() || text.back() != '\n')
		text.push_back('\n');
	for (size_t pos = 0; pos < text.size();) {
		size_t nl = text.find('\n', pos);
		text[nl] = '\0';
		const char *line = text.c_str() + pos;
		pos = nl + 1;
		unsigned long s, e, off, ino;
		unsigned maj, min;
		char perms[5];
		int name = 0;
		if (sscanf(line, "%lx-%lx %4s %lx %x:%x %lu %n", &s, &e, perms, &off, &maj, &min,
			   &ino, &name) < 7)
			continue;
		count++;
		if (e <= lo || s >= hi)
			continue;
		const char *path = name ? line + name : "";
		vma v{};
		v.start = s;
		v.end = e;
		v.prot = (perms[0] == 'r' ? PROT_READ : 0) | (perms[1] == 'w' ? PROT_WRITE : 0) |
			 (perms[2] == 'x' ? PROT_EXEC : 0);
		v.shared = perms[3] == 's';
		v.anon = !v.shared && ino == 0 && maj == 0 && min == 0 &&
			 (!*path || !strcmp(path, "[heap]") || !strncmp(path, "[anon:", 6));
		v.off = off;
		v.dev = makedev(maj, min);
		v.ino = static_cast<ino_t>(ino);
		out.push_back(v);
	}
	return true;
}

// Whether every mapping overlapping [lo, hi) carries only attributes that
// a shared mapping of the arena keeps: nothing locked, no huge pages asked
// for or refused, no KSM, no userfaultfd, no fork or dump advice, no
// protection key.  smaps is read only as far as the range.
bool plain_flags(uintptr_t lo, uintptr_t hi)
{
	static const char *const allowed[] = {"rd", "wr", "mr", "mw", "me", "ac", "sd", "nr"};
	FILE *f = fopen("/proc/self/smaps", "re");
	if (!f)
		return false;
	char *line = nullptr;
	size_t cap = 0;
	bool in = false, ok = true;
	size_t flags_seen = 0, vmas = 0;
	while (ok && getline(&line, &cap, f) > 0) {
		unsigned long s, e;
		if (sscanf(line, "%lx-%lx ", &s, &e) == 2) {
			if (s >= hi)
				break;
			in = e > lo;
			vmas += in;
			continue;
		}
		if (!in)
			continue;
		if (!strncmp(line, "VmFlags:", 8)) {
			flags_seen++;
			char *save = nullptr;
			for (char *t = strtok_r(line + 8, " \n", &save); t;
			     t = strtok_r(nullptr, " \n", &save)) {
				bool good = false;
				for (const char *a : allowed)
					good = good || !strcmp(t, a);
				ok = ok && good;
			}
		} else if (!strncmp(line, "ProtectionKey:", 14) && atoi(line + 14) != 0) {
			ok = false;
		}
	}
	free(line);
	fclose(f);
	return ok && vmas && flags_seen == vmas;
}

// Whether a memory policy of its own (mbind) governs addr: the arena's
// pages would follow the process's policy instead.
bool own_policy(uintptr_t addr)
{
	constexpr unsigned long kFAddr = 1UL << 1; // MPOL_F_ADDR
	int task = 0, here = 0;
	if (syscall(SYS_get_mempolicy, &task, nullptr, 0UL, nullptr, 0UL))
		return false; // No NUMA: no policy to lose
	if (syscall(SYS_get_mempolicy, &here, nullptr, 0UL, reinterpret_cast<void *>(addr),
		    kFAddr))
		return true;
	return here != task;
}

size_t max_map_count()
{
	static const size_t v = [] {
		size_t r = 65530; // The kernel's default
		if (FILE *f = fopen("/proc/sys/vm/max_map_count", "re")) {
			unsigned long x;
			if (fscanf(f, "%lu", &x) == 1 && x)
				r = x;
			fclose(f);
		}
		return r;
	}();
	return v;
}

// An upper bound of the process's mappings, for the max_map_count check of
// a move: counted (the whole text of the maps read) at most every
// kMapCountEvery moves or kMapCountNs, and near the limit every time, and
// in between the last count plus what the moves since can have added (4
// each, with their pieces).  The application's own mappings since the last
// count are not in it: the headroom (kMapHeadroomDiv) is for them.  Under
// g_lock.
constexpr unsigned kMapCountEvery = 64;
constexpr uint64_t kMapCountNs = 100'000'000;
size_t g_map_count = 0, g_map_added = 0;
unsigned g_map_moves = kMapCountEvery;
uint64_t g_map_at = 0;

size_t map_count_bound(size_t adding)
{
	timespec ts{};
	clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
	uint64_t now = uint64_t(ts.tv_sec) * 1000000000 + uint64_t(ts.tv_nsec);
	size_t limit = max_map_count();
	if (g_map_moves >= kMapCountEvery || now - g_map_at > kMapCountNs ||
	    g_map_count + g_map_added + adding > limit / 2) {
		std::vector<vma> none;
		size_t count;
		if (!read_maps(1, 0, none, count))
			return SIZE_MAX; // Cannot tell: no move
		g_map_count = count;
		g_map_added = 0;
		g_map_moves = 0;
		g_map_at = now;
	}
	g_map_moves++;
	g_map_added += adding;
	return g_map_count + g_map_added;
}

// Whether g_fd is still the arena: an application may close descriptors
// it did not open (a daemon closing everything above 2) and get the number
// back for a file of its own, which must never be punched or mapped.
bool arena_fd_ours()
{
	struct stat st;
	return g_fd >= 0 && !fstat(g_fd, &st) && st.st_dev == g_dev && st.st_ino == g_ino;
}

bool arena_locked()
{
	if (arena_fd_ours())
		return true;
	g_fd = -1; // Closed under us: its blocks stay, read through their ranges
	int fd = static_cast<int>(
		syscall(SYS_memfd_create, "softverbs-mr", MFD_CLOEXEC | MFD_ALLOW_SEALING));
	if (fd < 0)
		return false;
	struct stat st;
	// Sealed against shrinking: a peer's memcpy into its mapping of the
	// arena can never meet SIGBUS (peer_maps.cpp, sealed_tmpfs).
	if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_SEAL) || fstat(fd, &st)) {
		close(fd);
		return false;
	}
	g_fd = fd;
	g_dev = st.st_dev;
	g_ino = st.st_ino;
	g_next = 0;
	g_arena_pid = getpid();
	return true;
}

// Copies arena [off, off + n) into fresh private anonymous memory with
// protection prot and moves that onto addr, piece by piece.  Reads the
// arena through a mapping of its own, so a range the application made
// unreadable copies all the same.
bool copy_back(uintptr_t addr, size_t n, uint64_t off, int prot, int fd, bool hold = true)
{
	// Our own writers wait (best effort: where the hold cannot be had the
	// range is copied back all the same, as it must be).
	write_hold h;
	bool held = hold && h.begin(addr, n);
	for (size_t done = 0; done < n;) {
		size_t k = std::min(kPiece, n - done);
		// Without the arena's descriptor, the range itself is the source
		// (it maps the arena, checked by the caller), if readable.
		void *src = fd >= 0 ? sys_mmap(nullptr, k, PROT_READ, MAP_SHARED, fd, off + done)
			  : (prot & PROT_READ) ? reinterpret_cast<void *>(addr + done)
					       : MAP_FAILED;
		if (src == MAP_FAILED)
			return false;
		void *dst = sys_mmap(nullptr, k, PROT_READ | PROT_WRITE,
				     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (dst == MAP_FAILED) {
			if (fd >= 0)
				sys_munmap(src, k);
			return false;
		}
		copy_pages(dst, src, k);
		if (fd >= 0)
			sys_munmap(src, k);
		if (prot != (PROT_READ | PROT_WRITE))
			syscall(SYS_mprotect, dst, k, prot);
		if (!sys_move(dst, k, addr + done)) {
			sys_munmap(dst, k);
			h.end(false);
			return false;
		}
		done += k;
	}
	h.end(held);
	return true;
}

// Puts every part of block [addr, addr + b.len) that still maps the arena
// at its own offset back into private anonymous memory.  Parts the
// application unmapped or mapped over are left alone: they are no longer
// the block's.
// The parts of the process's mappings that map the block's window of the
// arena, wherever they are now: at the range, or where the application
// moved or grew it with mremap.
struct part {
	uintptr_t at;
	size_t len;
	uint64_t off;
	int prot;
};

void parts_of(const block &b, const std::vector<vma> &all, std::vector<part> &out)
{
	for (const vma &v : all) {
		if (!v.shared || v.dev != b.dev || v.ino != b.ino)
			continue;
		uint64_t vo = v.off, ve = v.off + (v.end - v.start);
		uint64_t lo = std::max(vo, b.off), hi = std::min(ve, b.off + b.win);
		if (lo >= hi)
			continue;
		out.push_back({v.start + (lo - vo), hi - lo, lo, v.prot});
	}
}

// Puts every mapping of the block's window back into private anonymous
// memory at the address it has now.  Parts the application unmapped are
// gone already; a range it mapped anew over the block's is not the block's.
// False if some part could not be (out of memory or descriptors): it still
// maps the arena, whose pages must then stay (punch would zero them).
bool restore(uintptr_t addr, const block &b, bool hold = true)
{
	std::vector<vma> all;
	std::vector<part> ps;
	size_t count;
	try {
		// Where the application left it, whole (the usual case): the
		// mappings of its range say so, without reading every mapping of
		// the process.  Else, wherever it is now.
		bool here = range_maps(addr, addr + b.len, all) && !all.empty();
		uintptr_t at = addr;
		for (const vma &v : all) {
			if (!here)
				break;
			here = v.start <= at && v.shared && v.dev == b.dev && v.ino == b.ino &&
			       v.off + (at - v.start) == b.off + (at - addr);
			at = v.end;
		}
		// Ending exactly at its end: one that goes on maps more of the
		// window (grown in place by mremap), the full look finds it.
		if (here && at == addr + b.len) {
			for (const vma &v : all) {
				uintptr_t s = std::max(v.start, addr), e = std::min(v.end, addr + b.len);
				ps.push_back({s, e - s, b.off + (s - addr), v.prot});
			}
		} else {
			if (!read_maps(0, UINTPTR_MAX, all, count))
				return false;
			parts_of(b, all, ps);
		}
	} catch (...) {
		return false;
	}
	int fd = arena_fd_ours() && g_dev == b.dev && g_ino == b.ino ? g_fd : -1;
	bool whole = true;
	for (const part &p : ps)
		whole &= copy_back(p.at, p.len, p.off, p.prot, fd, hold);
	return whole;
}

void punch(const block &b)
{
	if (!arena_fd_ours() || g_dev != b.dev || g_ino != b.ino)
		return; // That arena is gone (its pages went with it)
	if (getpid() != g_arena_pid)
		return; // A child's (made by _Fork, or before its fork handler ran): the parent's pages
	fallocate(g_fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(b.off),
		  static_cast<off_t>(b.win));
}

// Blocks no MR holds: back into private memory, and their arena pages
// freed.  A block over which a plain MR stands waits for it; one that could
// not be copied back whole (out of memory or descriptors: a deregistration
// does not fail for it) stays, its pages kept, and is tried again at the
// next release.  Under g_lock.
void settle_released()
{
	for (auto i = g_blocks.begin(); i != g_blocks.end();) {
		if (i->second.refs || overlaps_plain(i->first, i->second.len) ||
		    !restore(i->first, i->second)) {
			++i;
			continue;
		}
		punch(i->second);
		i = g_blocks.erase(i);
	}
}

// Fork: rdma-core's copy-on-fork (IBV_FORK_UNNEEDED) gives the child a
// private copy of registered memory, as it was at fork (the kernel copies
// pinned pages in fork for a real HCA).  The parent snapshots every
// mapping of every block into private anonymous memory just before the
// fork; the child moves the snapshots into place (no copy: they are its
// own, copy-on-write) and forgets the arena, so its registrations start an
// arena of their own.  The parent drops its snapshots.  A part without a
// snapshot (no memory for it) is copied in the child from the shared
// pages, as they are by then.
struct snap {
	void *copy; // MAP_FAILED: none
	part where;
};
std::vector<snap> &g_snaps = *new std::vector<snap>;

void on_fork_prepare()
{
	g_lock.lock();
	t_forking = true;
	g_fork_pid = getpid();
	g_child_done = false;
	g_snaps.clear();
	if (g_blocks.empty())
		return;
	std::vector<vma> all;
	size_t count;
	std::vector<part> ps;
	try {
		if (!read_maps(0, UINTPTR_MAX, all, count))
			return;
		for (const auto &[addr, b] : g_blocks)
			parts_of(b, all, ps);
		g_snaps.reserve(ps.size());
	} catch (...) {
		return;
	}
	int fd = arena_fd_ours() ? g_fd : -1;
	for (const part &p : ps) {
		void *c = sys_mmap(nullptr, p.len, PROT_READ | PROT_WRITE,
				   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		void *src = MAP_FAILED;
		if (c != MAP_FAILED)
			src = fd >= 0 ? sys_mmap(nullptr, p.len, PROT_READ, MAP_SHARED, fd, p.off)
			      : (p.prot & PROT_READ) ? reinterpret_cast<void *>(p.at)
						     : MAP_FAILED;
		if (src == MAP_FAILED) {
			if (c != MAP_FAILED)
				sys_munmap(c, p.len);
			c = MAP_FAILED;
		} else {
			copy_pages(c, src, p.len);
			if (fd >= 0)
				sys_munmap(src, p.len);
		}
		g_snaps.push_back({c, p});
	}
}

void on_fork_parent()
{
	for (const snap &sn : g_snaps)
		if (sn.copy != MAP_FAILED)
			sys_munmap(sn.copy, sn.where.len);
	g_snaps.clear();
	t_forking = false;
	g_lock.unlock();
}

// The child's side of the fork (under g_lock, in the forking thread): the
// snapshots into place, the parent's arena, blocks and plain MRs
// forgotten.  Once: by our child handler, or earlier, by the first verb
// that a child handler registered before ours calls (remap_guard), so
// that it never acts on the parent's blocks (a deregistration would free
// the parent's pages).
bool g_child_done = false;
pid_t g_fork_pid = 0; // The process that forks, set by on_fork_prepare

void child_fixup()
{
	g_child_done = true;
	int fd = arena_fd_ours() ? g_fd : -1;
	for (const snap &sn : g_snaps) {
		const part &p = sn.where;
		if (sn.copy != MAP_FAILED && sys_move(sn.copy, p.len, p.at)) {
			if (p.prot != (PROT_READ | PROT_WRITE))
				syscall(SYS_mprotect, p.at, p.len, p.prot);
			continue;
		}
		if (sn.copy != MAP_FAILED)
			sys_munmap(sn.copy, p.len);
		copy_back(p.at, p.len, p.off, p.prot, fd, false); // Only this thread is left
	}
	g_snaps.clear();
	if (fd >= 0)
		close(fd);
	g_blocks.clear();
	g_plain.clear(); // The parent's MRs, not ours
	g_fd = -1;
}

void on_fork_child()
{
	if (!g_child_done)
		child_fixup();
	g_child_done = false;
	t_forking = false;
	g_lock.unlock();
}

// Whether [a, a + n) is one block's, at the block's offsets, right now:
// an application may have unmapped a registered range and mapped new
// memory there (UCX deregisters after the munmap it intercepts).
bool still_arena(uintptr_t a, size_t n, uint64_t off, const block &b)
{
	std::vector<vma> vs;
	if (!range_maps(a, a + n, vs))
		return false;
	uintptr_t at = a;
	for (const vma &v : vs) {
		if (v.start > at || !v.shared || v.dev != b.dev || v.ino != b.ino ||
		    v.off + (at - v.start) != off + (at - a) ||
		    (v.prot & (PROT_READ | PROT_WRITE)) != (PROT_READ | PROT_WRITE))
			return false;
		at = v.end;
		if (at >= a + n)
			return true;
	}
	return false;
}

// Moves [addr, addr + len) (anonymous, checked) onto arena [off, ...).
bool move_in(uintptr_t addr, size_t len, uint64_t off)
{
	write_hold h;
	if (!h.begin(addr, len))
		return false;
	size_t done = 0;
	while (done < len) {
		size_t k = std::min(kPiece, len - done);
		// Allocate the pages first: running out of memory is an error
		// here, not a SIGBUS in the copy.
		if (fallocate(g_fd, 0, static_cast<off_t>(off + done), static_cast<off_t>(k)))
			break;
		void *tmp = sys_mmap(nullptr, k, PROT_READ | PROT_WRITE, MAP_SHARED, g_fd, off + done);
		if (tmp == MAP_FAILED)
			break;
		copy_pages(tmp, reinterpret_cast<void *>(addr + done), k);
		if (!sys_move(tmp, k, addr + done)) {
			sys_munmap(tmp, k);
			break;
		}
		done += k;
	}
	if (done == len) {
		h.end(true);
		return true;
	}
	// Undo the pieces already moved (the rest is still held).
	if (done && !copy_back(addr, done, off, PROT_READ | PROT_WRITE, g_fd)) {
		h.end(false);
		return false; // Still the arena's: contents intact, left as they are
	}
	h.end(false);
	punch(block{len, off, len, 0, g_dev, g_ino});
	return false;
}

} // namespace

bool shared_file_range(uintptr_t addr, size_t len, uint64_t &ino, uint64_t &off)
{
	std::vector<vma> v;
	if (!len || addr + len < addr)
		return false;
	try {
		if (!range_maps(addr, addr + len, v))
			return false;
	} catch (...) {
		return false;
	}
	if (v.size() != 1 || !v[0].shared || !v[0].ino || v[0].start > addr || v[0].end < addr + len)
		return false;
	ino = static_cast<uint64_t>(v[0].ino);
	off = v[0].off + (addr - v[0].start);
	return true;
}

bool remap_enabled()
{
	static const bool on = [] {
		const char *s = getenv("SOFTVERBS_REMAP");
		return !s || strcmp(s, "0") != 0;
	}();
	return on;
}

// The fork handlers, registered when the library loads: pthread_atfork runs
// prepare handlers in the reverse order of registration, so ours runs after
// those that applications and other libraries register later (UCX's
// deregisters its cached MRs), and their verbs find g_lock free.  One
// registered before ours (a library loaded first, or ours dlopen'ed late)
// runs after it, in the forking thread: t_forking lets it in.
// Registered whatever SOFTVERBS_REMAP says: a program may set it after
// the library loaded (remap_enabled reads it at the first registration);
// with nothing moved, the handlers find no block.
[[gnu::constructor]] static void remap_fork_handlers()
{
	pthread_atfork(on_fork_prepare, on_fork_parent, on_fork_child);
}

bool remap_acquire(uintptr_t addr, size_t len, int &fd, uint64_t &off, uint64_t &ino)
{
	uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
	if (!remap_enabled() || !len || (addr & (page - 1)) || (len & (page - 1)) ||
	    addr + len < addr)
		return false;
	// Not between the fork's snapshot and the fork: a block made there
	// would have none, and the child would share its pages with us.  The
	// registration stays plain memory.
	if (t_forking)
		return false;
	std::lock_guard<std::mutex> g(g_lock);
	// A block already holding the whole range is shared; one that overlaps
	// part of it rules the move out.
	auto it = g_blocks.upper_bound(addr);
	if (it != g_blocks.begin()) {
		auto prev = std::prev(it);
		if (prev->first + prev->second.len > addr) {
			if (addr + len > prev->first + prev->second.len)
				return false;
			block &b = prev->second;
			if (!b.refs)
				return false; // Waiting to go (a plain MR overlaps it)
			uint64_t o = b.off + (addr - prev->first);
			// Only through the arena's own descriptor (peers take it).
			if (!arena_fd_ours() || b.dev != g_dev || b.ino != g_ino ||
			    !still_arena(addr, len, o, b))
				return false;
			b.refs++;
			fd = g_fd;
			off = o;
			ino = static_cast<uint64_t>(g_ino);
			return true;
		}
	}
	if (it != g_blocks.end() && it->first < addr + len)
		return false;
	if (overlaps_plain(addr, len))
		return false;
	std::vector<vma> vs;
	if (!range_maps(addr, addr + len, vs) || vs.empty())
		return false;
	uintptr_t at = addr;
	for (const vma &v : vs) {
		if (v.start > at || !v.anon || v.prot != (PROT_READ | PROT_WRITE) ||
		    own_policy(std::max(v.start, addr)))
			return false;
		at = v.end;
	}
	if (at < addr + len)
		return false;
	// Not this thread's own stack, nor the page of its errno: it writes
	// both while the range is held, and would wait for itself.
	uintptr_t sp = reinterpret_cast<uintptr_t>(__builtin_frame_address(0));
	uintptr_t err = reinterpret_cast<uintptr_t>(&errno);
	for (const vma &v : vs)
		if (sp >= v.start && sp < v.end)
			return false;
	if (err + sizeof(int) > addr && err < addr + len)
		return false;
	size_t limit = max_map_count();
	size_t adding = 4 + len / kPiece;
	size_t bound = map_count_bound(adding);
	if (bound == SIZE_MAX || bound > limit - limit / kMapHeadroomDiv)
		return false;
	if (!writes_can_wait() || !plain_flags(addr, addr + len) || !arena_locked())
		return false;
	uint64_t o = g_next;
	uint64_t win = (len + kWindowSlack + page - 1) & ~static_cast<uint64_t>(page - 1);
	// A file size limit would make ftruncate raise SIGXFSZ (death by default).
	rlimit fsz;
	if (o + win > kArenaMax || getrlimit(RLIMIT_FSIZE, &fsz) ||
	    (fsz.rlim_cur != RLIM_INFINITY && o + win > fsz.rlim_cur) ||
	    ftruncate(g_fd, static_cast<off_t>(o + win)))
		return false;
	g_next = o + win;
	if (!move_in(addr, len, o))
		return false;
	block nb{len, o, win, 1, g_dev, g_ino};
	try {
		g_blocks.emplace(addr, nb);
	} catch (...) {
		// Its pages stay in the arena if they could not be copied back.
		if (copy_back(addr, len, o, PROT_READ | PROT_WRITE, g_fd))
			punch(nb);
		return false;
	}
	fd = g_fd;
	off = o;
	ino = static_cast<uint64_t>(g_ino);
	return true;
}

void remap_release(uintptr_t addr, size_t len)
{
	remap_guard g;
	auto it = g_blocks.upper_bound(addr);
	if (it == g_blocks.begin())
		return; // A forked child's: the block went private at fork
	--it;
	block &b = it->second;
	if (addr < it->first || addr + len > it->first + b.len || !b.refs || --b.refs)
		return;
	settle_released();
}

void remap_note_plain(uintptr_t addr, size_t len, bool add)
{
	if (!remap_enabled())
		return;
	remap_guard g;
	if (add) {
		try {
			g_plain.emplace(addr, len);
		} catch (...) {
			// Unnoted, a move over it could race a peer's copy: no
			// move from now on rather than risk it.
			g_plain_lost = true;
		}
		return;
	}
	auto [lo, hi] = g_plain.equal_range(addr);
	for (auto i = lo; i != hi; ++i)
		if (i->second == len) {
			g_plain.erase(i);
			break;
		}
	// Blocks released while this one stood over them go now.
	settle_released();
}

} // namespace loop
