// SPDX-License-Identifier: MIT
#include "fabric.h"
#include "tunables.h"

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fcntl.h>
#include <fstream>
#include <mutex>
#include <sstream>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace loop {

static_assert(sizeof(sv_reg_lock) == SV_MUTEX_BYTES, "registry lock layout");
static_assert(offsetof(sv_reg_lock, word) == 0, "the futex word leads");

namespace {

constexpr size_t kRegistrySize = (sizeof(sv_registry) + 4095) & ~size_t(4095);

uint64_t fnv1a(const std::string &s, uint64_t h = 0xcbf29ce484222325ULL)
{
	for (unsigned char c : s) {
		h ^= c;
		h *= 0x100000001b3ULL;
	}
	return h;
}

std::atomic_ref<uint32_t> state_of(sv_registry *r)
{
	return std::atomic_ref<uint32_t>(r->hdr.state);
}

// ---- the registry lock ----
//
// Protocol (the layout is sv_reg_lock in kernel-abi/softverbs-abi.h):
//  - Take: CAS word from 0 to our tid, then store holder_start (the start
//    time of our thread).  A thread that had to wait takes it with
//    SV_REG_LOCK_WAITERS set, since others may still sleep on it.
//  - Release: clear holder_start, exchange word with 0; FUTEX_WAKE one
//    sleeper if SV_REG_LOCK_WAITERS was set.
//  - Wait: set SV_REG_LOCK_WAITERS on the value seen and FUTEX_WAIT on it
//    for at most kLockSleepNs, then judge the holder again.
// A value is taken over (CAS from the value judged, so a real release or a
// new holder in between wins) when it names no plausible holder: bits no
// thread id has, a thread that no longer exists, our own thread when we do
// not hold it, or a thread whose start time is not the one the holder
// recorded (a reused id, or a word a peer overwrote).  The start time is
// checked only after the same value has stood for kLockCheckNs, so that a
// new holder has long stored its holder_start; a zero holder_start only
// after kLockZeroStartNs.  A stopped holder (a debugger, SIGSTOP) keeps the
// lock, as a pthread mutex would.  The registry is changed only by short
// updates that leave it consistent at every store, so a holder that died
// needs no repair beyond the takeover.
// The lock is recursive per thread (a depth kept in thread-local storage,
// keyed by the registry's name so that two mappings of one registry are
// one lock): a path that locks again while it holds the lock goes on
// instead of waiting for itself forever.


bool debug_on()
{
	static const bool on = [] {
		const char *s = getenv("SOFTVERBS_DEBUG");
		return s && *s && strcmp(s, "0") != 0;
	}();
	return on;
}

uint32_t my_tid()
{
	return static_cast<uint32_t>(syscall(SYS_gettid));
}

uint64_t mono_ns()
{
	timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return static_cast<uint64_t>(ts.tv_sec) * 1000000000ULL + static_cast<uint64_t>(ts.tv_nsec);
}

// Our thread's start time, read once per thread (and again in a forked
// child, whose thread has another id).
uint64_t my_start(uint32_t tid)
{
	thread_local uint32_t cached_tid = 0;
	thread_local uint64_t cached = 0;
	if (cached_tid != tid) {
		cached = fabric::process_start_time(static_cast<pid_t>(tid));
		cached_tid = tid;
	}
	return cached;
}

// The recursion depth of this thread on each registry it holds.
struct held_lock {
	uint64_t key = 0;
	uint32_t tid = 0;
	int depth = 0;
};
constexpr int kHeldMax = 8;
thread_local held_lock t_held[kHeldMax];

held_lock *held_find(uint64_t key, uint32_t tid)
{
	for (held_lock &h : t_held)
		if (h.depth > 0 && h.key == key && h.tid == tid)
			return &h;
	return nullptr;
}

void held_add(uint64_t key, uint32_t tid)
{
	for (held_lock &h : t_held)
		if (h.depth <= 0 || h.tid != tid) {
			h = held_lock{key, tid, 1};
			return;
		}
	// More registries held at once than anyone does: not counted, so a
	// nested lock of it would judge its own tid stale and go on.
}

long futex_op(uint32_t *word, int op, uint32_t val, const timespec *ts)
{
	return syscall(SYS_futex, word, op, val, ts, nullptr, 0);
}

enum class holder_verdict { valid, broken };

// Judges a lock value whose tid part is non-zero.  `since` is when this
// exact value was first seen by the caller.
holder_verdict judge(const sv_reg_lock &l, uint32_t v, uint32_t me, uint64_t since, uint64_t now,
		     const char *&why)
{
	uint32_t tid = v & SV_REG_LOCK_TID_MASK;
	if ((v & ~(SV_REG_LOCK_TID_MASK | SV_REG_LOCK_WAITERS)) || tid >= kPidMaxLimit) {
		why = "an impossible value";
		return holder_verdict::broken;
	}
	if (tid == me) {
		why = "our own thread id, which does not hold it";
		return holder_verdict::broken;
	}
	if (kill(static_cast<pid_t>(tid), 0) < 0 && errno == ESRCH) {
		why = "a thread that no longer exists";
		return holder_verdict::broken;
	}
	if (now - since < kLockCheckNs)
		return holder_verdict::valid;
	uint64_t recorded =
		std::atomic_ref<const uint64_t>(l.holder_start).load(std::memory_order_relaxed);
	if (!recorded && now - since < kLockZeroStartNs)
		return holder_verdict::valid;
	// Read /proc: the thread's state and start time.
	std::ifstream in("/proc/" + std::to_string(tid) + "/stat");
	std::string line;
	if (!std::getline(in, line)) {
		why = "a thread that no longer exists";
		return holder_verdict::broken;
	}
	size_t p = line.rfind(')');
	char state = p != std::string::npos && p + 2 < line.size() ? line[p + 2] : '?';
	if (state == 'Z' || state == 'X') {
		why = "a thread that has exited"; // A zombie not yet reaped
		return holder_verdict::broken;
	}
	if (state == 'T' || state == 't')
		return holder_verdict::valid; // Stopped in a debugger: it still holds
	uint64_t actual = fabric::process_start_time(static_cast<pid_t>(tid));
	if (actual && actual == recorded)
		return holder_verdict::valid;
	why = recorded ? "a thread id reused by another thread"
		       : "a thread that never recorded itself as holder";
	return holder_verdict::broken;
}

} // namespace

std::string fabric::registry_name(const std::string &fabric_name)
{
	return "/softverbs-" + std::to_string(getuid()) + "-" + fabric_name;
}

namespace {

// The fields of /proc/PID/stat after the command name, into buf (its end
// NUL-terminated), or null.  Plain system calls into the caller's buffer:
// process_start_time runs once a tick for every peer whose memory or queues
// a process uses (lease_alive), and through iostreams it cost about 18,000
// instructions a call.
const char *proc_stat_fields(pid_t pid, char (&buf)[2048])
{
	if (pid <= 0)
		return nullptr;
	char path[32];
	snprintf(path, sizeof(path), "/proc/%d/stat", static_cast<int>(pid));
	int fd = ::open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return nullptr;
	// The line is a few hundred bytes: 52 numeric fields after a command
	// name of at most 64 bytes (escaped) fit in 2 KiB.
	size_t n = 0;
	for (;;) {
		ssize_t r = ::read(fd, buf + n, sizeof(buf) - 1 - n);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		n += static_cast<size_t>(r);
		if (n == sizeof(buf) - 1)
			break;
	}
	::close(fd);
	buf[n] = '\0';
	// The command name may hold spaces and parentheses: skip past the
	// last ')'.  Then " STATE ...": field 3 onwards, one space apart.
	const char *p = static_cast<const char *>(memrchr(buf, ')', n));
	return p ? p + 1 : nullptr;
}

} // namespace

uint64_t fabric::process_start_time(pid_t pid, char *state)
{
	char buf[2048];
	const char *p = proc_stat_fields(pid, buf);
	if (!p)
		return 0;
	if (state)
		*state = p[0] == ' ' ? p[1] : '?'; // Field 3
	// Start time is field 22.
	for (int field = 2; field < 22; field++) {
		p = strchr(p, ' ');
		if (!p)
			return 0;
		p++;
	}
	if (*p < '0' || *p > '9')
		return 0;
	return strtoull(p, nullptr, 10);
}

bool fabric::process_exited(pid_t pid)
{
	char buf[2048];
	char path[40];
	snprintf(path, sizeof(path), "/proc/%d/status", static_cast<int>(pid));
	int fd = ::open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return false;
	ssize_t n = ::read(fd, buf, sizeof(buf) - 1);
	::close(fd);
	if (n <= 0)
		return false;
	buf[n] = '\0';
	const char *t = strstr(buf, "\nThreads:");
	return t && strtol(t + 9, nullptr, 10) <= 1;
}

bool fabric::process_stopped(pid_t pid)
{
	char buf[2048];
	const char *p = proc_stat_fields(pid, buf);
	// Field 3, the state: T stopped by a signal, t stopped by a tracer.
	return p && p[0] == ' ' && (p[1] == 'T' || p[1] == 't');
}

int fabric::open(const config &cfg, fabric *&out, std::string &error)
{
	// A segment its creator removed while we waited for it (EAGAIN): from
	// the start, where this process may become the creator.
	for (int tries = 0;; tries++) {
		int e = open_once(cfg, out, error);
		if (e != EAGAIN || tries >= 3)
			return e;
	}
}

int fabric::open_once(const config &cfg, fabric *&out, std::string &error)
{
	auto *f = new fabric;
	f->cfg_ = cfg;
	f->path_ = registry_name(cfg.fabric);
	f->lock_key_ = fnv1a(f->path_);
	int fd = shm_open(f->path_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	int ret;
	if (fd >= 0) {
		// 0600 whatever the umask: every opener insists on it.
		ret = fchmod(fd, 0600) < 0 ? errno : 0;
		if (ret) {
			error = "cannot set the mode of fabric segment: " + std::string(strerror(ret));
			shm_unlink(f->path_.c_str());
		} else {
			ret = f->init_new(fd, error);
		}
	} else if (errno == EEXIST) {
		fd = shm_open(f->path_.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW, 0600);
		if (fd < 0) {
			int err = errno;
			error = "cannot open fabric segment /dev/shm" + f->path_ + ": " +
				strerror(err) +
				(err == EACCES ? " (it belongs to another user?  Use another "
						 "SOFTVERBS_FABRIC)"
					       : "");
			delete f;
			return err;
		}
		ret = f->attach(fd, error);
	} else {
		int err = errno;
		error = "cannot create fabric segment /dev/shm" + f->path_ + ": " + strerror(err);
		delete f;
		return err;
	}
	close(fd);
	if (ret) {
		delete f;
		return ret;
	}
	f->ensure_devices();
	out = f;
	return 0;
}

int fabric::init_new(int fd, std::string &error)
{
	if (ftruncate(fd, kRegistrySize) < 0) {
		error = "cannot size fabric segment: " + std::string(strerror(errno));
		shm_unlink(path_.c_str());
		return errno;
	}
	// Every page now (reserve_segment): a registry page first touched when
	// /dev/shm is full is SIGBUS in every process of the fabric.
	if (int e = reserve_segment(fd, kRegistrySize)) {
		error = "cannot reserve the fabric segment's " + std::to_string(kRegistrySize) +
			" bytes in /dev/shm: " + strerror(e == ENOMEM ? ENOSPC : e) +
			(e == ENOMEM ? " (/dev/shm is full; free space there or make it larger)" : "");
		shm_unlink(path_.c_str());
		return e;
	}
	void *p = mmap(nullptr, kRegistrySize, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED) {
		error = "cannot map fabric segment: " + std::string(strerror(errno));
		shm_unlink(path_.c_str());
		return errno;
	}
	reg_ = static_cast<sv_registry *>(p);
	reg_->hdr.magic = SV_SEG_MAGIC;
	reg_->hdr.abi_version = SV_ABI_VERSION;
	reg_->hdr.kind = SV_SEG_REGISTRY;
	reg_->hdr.seg_size = kRegistrySize;
	reg_->hdr.creator_pid = static_cast<uint32_t>(getpid());
	reg_->next_lid = 1;
	// Fixed for the fabric's life: every process then enforces the same.
	const fabric_limits &lim = cfg_.limits;
	reg_->limits.max[SV_RES_PD] = lim.pd;
	reg_->limits.max[SV_RES_QP] = lim.qp;
	reg_->limits.max[SV_RES_CQ] = lim.cq;
	reg_->limits.max[SV_RES_MR] = lim.mr;
	reg_->limits.max[SV_RES_MW] = lim.mw;
	reg_->limits.max[SV_RES_AH] = lim.ah;
	reg_->limits.max[SV_RES_SRQ] = lim.srq;
	// The lock is all zeros (free) as ftruncate left it.
	state_of(reg_).store(SV_SEG_READY, std::memory_order_release);
	return 0;
}

// The creator removed the segment we opened before setting it up (it
// could not: a full /dev/shm): EAGAIN, and open tries again from the start.
int fabric::unlinked(std::string &error)
{
	error = "fabric segment /dev/shm" + path_ +
		" was removed by the process that was setting it up (it could not; /dev/shm full?)";
	return EAGAIN;
}

int fabric::attach(int fd, std::string &error)
{
	struct stat st;
	// The creator may not have sized it yet.
	for (int waited = 0;; waited++) {
		if (fstat(fd, &st) < 0) {
			error = "cannot stat fabric segment: " + std::string(strerror(errno));
			return errno;
		}
		if (static_cast<size_t>(st.st_size) >= sizeof(sv_seg_hdr))
			break;
		if (!st.st_nlink)
			return unlinked(error);
		if (waited >= kReadyWaitMs) {
			error = "fabric segment /dev/shm" + path_ +
				" was never initialised (its creator died?); remove it with "
				"'softverbs clean " + cfg_.fabric + "'";
			return EPROTO;
		}
		usleep(1000);
	}
	// Owner and mode before it is mapped: a registry another user created
	// (or could write) is refused, never used.
	std::string why;
	if (int e = check_segment(fd, sizeof(sv_seg_hdr), SIZE_MAX, why)) {
		error = "fabric segment /dev/shm" + path_ + " refused: " + why +
			"; use another SOFTVERBS_FABRIC, or remove it if it is yours";
		return e;
	}
	void *p = mmap(nullptr, st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED) {
		error = "cannot map fabric segment: " + std::string(strerror(errno));
		return errno;
	}
	auto *r = static_cast<sv_registry *>(p);
	for (int waited = 0; state_of(r).load(std::memory_order_acquire) != SV_SEG_READY;
	     waited++) {
		struct stat now;
		if (!fstat(fd, &now) && !now.st_nlink) {
			munmap(p, st.st_size);
			return unlinked(error);
		}
		if (waited >= kReadyWaitMs) {
			munmap(p, st.st_size);
			error = "fabric segment /dev/shm" + path_ +
				" was never initialised (its creator died?); remove it with "
				"'softverbs clean " + cfg_.fabric + "'";
			return EPROTO;
		}
		usleep(1000);
	}
	if (r->hdr.magic != SV_SEG_MAGIC || r->hdr.kind != SV_SEG_REGISTRY) {
		munmap(p, st.st_size);
		error = "/dev/shm" + path_ + " is not a softverbs fabric segment";
		return EPROTO;
	}
	if (r->hdr.abi_version != SV_ABI_VERSION) {
		char buf[256];
		snprintf(buf, sizeof(buf),
			 "fabric '%s' was created by softverbs ABI version %u, this library speaks "
			 "version %u; stop its processes and remove it with 'softverbs clean %s', or "
			 "use another SOFTVERBS_FABRIC",
			 cfg_.fabric.c_str(), r->hdr.abi_version, SV_ABI_VERSION,
			 cfg_.fabric.c_str());
		munmap(p, st.st_size);
		error = buf;
		return EPROTO;
	}
	if (r->hdr.seg_size < sizeof(sv_registry) ||
	    r->hdr.seg_size > static_cast<uint64_t>(st.st_size)) {
		munmap(p, st.st_size);
		error = "fabric segment /dev/shm" + path_ + " is truncated";
		return EPROTO;
	}
	reg_ = r;
	return 0;
}

void fabric::lock()
{
	sv_reg_lock &l = reg_->lock;
	std::atomic_ref<uint32_t> w(l.word);
	uint32_t me = my_tid();
	if (held_lock *h = held_find(lock_key_, me)) {
		if ((w.load(std::memory_order_relaxed) & SV_REG_LOCK_TID_MASK) == me) {
			h->depth++;
			return;
		}
		// Our hold was taken from us (a peer overwrote the word, and a
		// waiter took it over): forget it and take the lock afresh.
		h->depth = 0;
	}
	uint32_t v = 0;
	if (!w.compare_exchange_strong(v, me, std::memory_order_acquire))
		lock_slow(me);
	std::atomic_ref<uint64_t>(l.holder_start).store(my_start(me), std::memory_order_relaxed);
	held_add(lock_key_, me);
}

void fabric::lock_slow(uint32_t me)
{
	sv_reg_lock &l = reg_->lock;
	std::atomic_ref<uint32_t> w(l.word);
	uint32_t seen = 0;
	uint64_t since = 0;
	for (int round = 0;; round++) {
		uint32_t v = w.load(std::memory_order_relaxed);
		if (!(v & SV_REG_LOCK_TID_MASK)) {
			// Free (perhaps with sleepers still flagged): take it, keeping
			// the flag, since we cannot tell whether they all woke.
			if (w.compare_exchange_strong(v, me | (v & SV_REG_LOCK_WAITERS) |
							     (round ? SV_REG_LOCK_WAITERS : 0),
						      std::memory_order_acquire))
				return;
			continue;
		}
		uint64_t now = mono_ns();
		if (v != seen || !since) {
			seen = v;
			since = now;
		}
		const char *why = nullptr;
		if (judge(l, v, me, since, now, why) == holder_verdict::broken) {
			if (w.compare_exchange_strong(v, me | SV_REG_LOCK_WAITERS,
						      std::memory_order_acquire)) {
				if (debug_on())
					fprintf(stderr,
						"softverbs: registry lock of %s held as 0x%08x, %s: "
						"taken over\n",
						path_.c_str(), v, why);
				return;
			}
			continue;
		}
		if (round < kLockSpins) {
			if (round > 8)
				sched_yield();
			continue;
		}
		// Sleep on the value with the waiters flag set, for a while.
		uint32_t flagged = v | SV_REG_LOCK_WAITERS;
		if (v != flagged &&
		    !w.compare_exchange_strong(v, flagged, std::memory_order_relaxed))
			continue;
		if (seen == v)
			seen = flagged; // Our own flag does not make it a new holder
		timespec ts{0, static_cast<long>(kLockSleepNs)};
		futex_op(&l.word, FUTEX_WAIT, flagged, &ts);
	}
}

void fabric::unlock()
{
	sv_reg_lock &l = reg_->lock;
	std::atomic_ref<uint32_t> w(l.word);
	uint32_t me = my_tid();
	held_lock *h = held_find(lock_key_, me);
	if (h && --h->depth > 0)
		return;
	if (!h) {
		// Not ours (taken over after a peer overwrote it): leave it.
		if (debug_on())
			fprintf(stderr, "softverbs: registry lock of %s released by a thread "
					"that no longer held it\n",
				path_.c_str());
		return;
	}
	uint32_t cur = w.load(std::memory_order_relaxed);
	if ((cur & SV_REG_LOCK_TID_MASK) != me) {
		// Someone wrote over the word while we held it: a waiter may have
		// taken it over already; only a value naming us is ours to clear.
		if (debug_on())
			fprintf(stderr,
				"softverbs: registry lock of %s overwritten while held "
				"(0x%08x, holder %u)\n",
				path_.c_str(), cur, me);
		futex_op(&l.word, FUTEX_WAKE, INT_MAX, nullptr);
		return;
	}
	std::atomic_ref<uint64_t>(l.holder_start).store(0, std::memory_order_relaxed);
	uint32_t old = w.exchange(0, std::memory_order_release);
	if ((old & SV_REG_LOCK_TID_MASK) != me) {
		if (debug_on())
			fprintf(stderr,
				"softverbs: registry lock of %s overwritten while held "
				"(0x%08x, holder %u)\n",
				path_.c_str(), old, me);
		futex_op(&l.word, FUTEX_WAKE, INT_MAX, nullptr);
		return;
	}
	if (old & SV_REG_LOCK_WAITERS)
		futex_op(&l.word, FUTEX_WAKE, 1, nullptr);
}

sv_device_rec *fabric::device(const std::string &name) const
{
	for (auto &d : reg_->devices)
		if (d.name[0] && name == d.name)
			return &d;
	return nullptr;
}

void fabric::ensure_devices()
{
	registry_guard g(*this);
	for (const device_config &dc : cfg_.devices) {
		if (device(dc.name))
			continue;
		sv_device_rec *slot = nullptr;
		uint32_t index = 0;
		for (auto &d : reg_->devices) {
			if (!d.name[0]) {
				slot = &d;
				break;
			}
			index++;
		}
		if (!slot)
			continue; // Reported by enumerate(): too many devices.
		memset(slot, 0, sizeof(*slot));
		// GUIDs: stable for a (user, fabric, device), unique in practice,
		// with the locally administered bit set as for a software GUID.
		uint64_t h = fnv1a(dc.name, fnv1a(cfg_.fabric, fnv1a(std::to_string(getuid()))));
		slot->node_guid = (h & ~0xffULL & ~(0xffULL << 56)) | (0x02ULL << 56);
		slot->num_ports = static_cast<uint32_t>(dc.num_ports);
		slot->index = index;
		for (int p = 0; p < dc.num_ports; p++) {
			sv_port_rec &pr = slot->ports[p];
			pr.state = IBV_PORT_ACTIVE;
			pr.active_mtu = dc.mtu;
			pr.port_guid = slot->node_guid + 1 + static_cast<uint64_t>(p);
			if (dc.link_layer == IBV_LINK_LAYER_ETHERNET) {
				pr.link_layer = SV_LINK_ETH;
				pr.lid = 0;
			} else {
				pr.link_layer = SV_LINK_IB;
				pr.lid = static_cast<uint16_t>(reg_->next_lid++);
			}
		}
		snprintf(slot->name, sizeof(slot->name), "%s", dc.name.c_str());
		reg_->num_devices++;
	}
}

bool fabric::slot_dead_locked(int slot)
{
	const sv_lease &l = reg_->leases[slot];
	if (!l.pid)
		return false;
	// A peer may have written anything here: a value no pid can have is a
	// dead lease (and must not reach kill() as a process group).
	if (l.pid >= kPidMaxLimit)
		return true;
	if (kill(static_cast<pid_t>(l.pid), 0) < 0 && errno == ESRCH)
		return true;
	// A process with that pid exists.  Only a start time read and found
	// different says it is another one; a read that failed (out of file
	// descriptors, or the process exiting just now) says nothing, and
	// reaping a live process's QPs and keys would be far worse than
	// keeping a dead lease until the next look.
	char state = '?';
	uint64_t st = process_start_time(static_cast<pid_t>(l.pid), &state);
	if (st && st != l.start_time)
		return true;
	// The same process, exited but not yet reaped by its parent (state Z
	// a zombie, X dead): its queues will never be read again (an HCA's
	// QPs go at exit, before the zombie stage), so its SENDs must not
	// wait on it for ever.  A zombie thread group leader whose other
	// threads still run (the main thread called pthread_exit) shows Z
	// too: process_exited counts its threads.
	return st && (state == 'Z' || state == 'X') && process_exited(static_cast<pid_t>(l.pid));
}

bool xrc_qp_pass_on_locked(sv_registry *r, uint32_t qslot, uint32_t except, uint32_t lease,
			   uint32_t lease_gen)
{
	if (qslot >= SV_MAX_QPS)
		return false;
	sv_qp_rec &q = r->qps[qslot];
	if (!q.in_use || q.qp_type != IBV_QPT_XRC_RECV)
		return false;
	for (uint32_t i = 0; i < SV_MAX_OBJS; i++) {
		const sv_obj_rec &o = r->objs[i];
		if (i == except || !o.in_use || o.kind != SV_OBJ_XRC_QP || o.cq_obj != qslot ||
		    o.cq_gen != q.generation || o.owner_lease >= SV_MAX_PROCS ||
		    (o.owner_lease == lease && o.owner_gen == lease_gen))
			continue;
		const sv_lease &to = r->leases[o.owner_lease];
		if (!to.pid || to.generation != o.owner_gen)
			continue; // A handle its holder left behind: reaped with it
		if (q.owner_lease != o.owner_lease || q.owner_gen != o.owner_gen) {
			uint32_t from = q.owner_lease;
			if (from < SV_MAX_PROCS && r->leases[from].generation == q.owner_gen &&
			    r->usage[from][SV_RES_QP])
				r->usage[from][SV_RES_QP]--;
			r->usage[o.owner_lease][SV_RES_QP]++;
			// Readers take the owner as a pair with the generation
			// (find_qp, lt_alive): a reader that mixes the two
			// halves finds a lease that is not alive and looks
			// again, as after any change of owner.
			std::atomic_ref<uint32_t>(q.owner_gen).store(o.owner_gen, std::memory_order_relaxed);
			std::atomic_ref<uint32_t>(q.owner_lease).store(o.owner_lease, std::memory_order_release);
		}
		return true;
	}
	return false;
}

void fabric::reap_locked(int slot)
{
	sv_lease &l = reg_->leases[slot];
	uint32_t gen = l.generation;
	auto owned = [&](uint32_t lease, uint32_t g) {
		return lease == static_cast<uint32_t>(slot) && g == gen;
	};
	for (uint32_t i = 0; i < SV_MAX_QPS; i++) {
		sv_qp_rec &q = reg_->qps[i];
		if (!q.in_use || !owned(q.owner_lease, q.owner_gen))
			continue;
		// A shared XRC target QP lives on while another process holds
		// a handle on it (ibv_open_qp): it passes to that process.
		if (q.qp_type == IBV_QPT_XRC_RECV &&
		    xrc_qp_pass_on_locked(reg_, i, SV_MAX_OBJS, static_cast<uint32_t>(slot), gen))
			continue;
		std::atomic_ref<uint32_t>(q.state).store(IBV_QPS_RESET, std::memory_order_release);
		q.in_use = 0;
	}
	for (auto &m : reg_->mrs)
		if (m.state != SV_MR_FREE && owned(m.owner_lease, m.owner_gen))
			std::atomic_ref<uint32_t>(m.state).store(SV_MR_FREE,
								 std::memory_order_release);
	for (uint32_t i = 0; i < SV_MAX_OBJS; i++) {
		sv_obj_rec &o = reg_->objs[i];
		if (!o.in_use || !owned(o.owner_lease, o.owner_gen))
			continue;
		shm_unlink(object_segment_name(path_, i, o.generation, object_nonce(o)).c_str());
		o.in_use = 0;
	}
	for (auto &m : reg_->mcast) {
		if (m.num_qps > SV_MAX_MCAST_QPS)
			m.num_qps = SV_MAX_MCAST_QPS; // Damaged: the slots we have
		for (uint32_t i = 0; i < m.num_qps;) {
			uint32_t qslot = m.qpns[i] & SV_QPN_SLOT_MASK;
			if (!reg_->qps[qslot].in_use)
				m.qpns[i] = m.qpns[--m.num_qps];
			else
				i++;
		}
	}
	memset(reg_->usage[slot], 0, sizeof(reg_->usage[slot])); // Its objects are gone
	l.pid = 0;
	l.start_time = 0;
	alive_memo_[slot].store(0, std::memory_order_relaxed);
}

bool fabric::lease_alive(uint32_t slot, uint32_t gen)
{
	if (slot >= SV_MAX_PROCS)
		return false;
	// A lease found alive in this coarse tick is believed alive until the
	// tick ends, by every thread of this process: each of its mappings,
	// key caches and QPs asks once a tick, and without the memo each
	// asked through the registry lock, kill() and /proc.  (A mapping's
	// own look was already believed for a tick: peer_maps.cpp.)  The
	// lease's generation and pid are read first, without the lock: a
	// lease released or reaped (pid 0, or a new generation) is never
	// believed; only a death nobody has noticed yet goes unseen, for at
	// most the rest of the tick.
	const sv_lease &l = reg_->leases[slot];
	if (std::atomic_ref<const uint32_t>(l.generation).load(std::memory_order_acquire) != gen ||
	    !std::atomic_ref<const uint32_t>(l.pid).load(std::memory_order_acquire))
		return false;
	timespec ts;
	clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
	uint64_t tick = static_cast<uint64_t>(ts.tv_sec) * 1000000000ULL +
			static_cast<uint64_t>(ts.tv_nsec);
	// The low word: the tick (ns >> 20, about 1 ms) with its top bit set,
	// so that the zero of a memo never written matches no call.
	uint64_t memo = (static_cast<uint64_t>(gen) << 32) |
			(static_cast<uint32_t>(tick >> 20) | 0x80000000u);
	std::atomic<uint64_t> &m = alive_memo_[slot];
	if (m.load(std::memory_order_relaxed) == memo)
		return true;
	registry_guard g(*this);
	bool alive = reg_->leases[slot].generation == gen && reg_->leases[slot].pid &&
		     !slot_dead_locked(static_cast<int>(slot));
	// Under the lock: a dead answer clears what a live one stored before
	// it, so no later call of this tick is told alive again.
	m.store(alive ? memo : 0, std::memory_order_relaxed);
	return alive;
}

int fabric::reap_dead()
{
	registry_guard g(*this);
	int n = 0;
	for (int i = 0; i < SV_MAX_PROCS; i++)
		if (slot_dead_locked(i)) {
			reap_locked(i);
			n++;
		}
	return n;
}

int fabric::lease()
{
	if (int s = lease_slot_.load(std::memory_order_acquire); s >= 0)
		return s;
	uint32_t pid = static_cast<uint32_t>(getpid());
	uint64_t start = process_start_time(getpid());
	registry_guard g(*this);
	int free_slot = -1;
	for (int i = 0; i < SV_MAX_PROCS; i++) {
		sv_lease &l = reg_->leases[i];
		if (l.pid == pid && l.start_time == start) {
			lease_slot_.store(i, std::memory_order_release);
			return i;
		}
		// Whatever a dead process left is freed as soon as it is seen.
		if (slot_dead_locked(i))
			reap_locked(i);
		if (free_slot < 0 && l.pid == 0)
			free_slot = i;
	}
	if (free_slot < 0)
		return -ENOSPC;
	sv_lease &l = reg_->leases[free_slot];
	l.pid = pid;
	l.start_time = start;
	l.generation = ++reg_->lease_generation;
	l.flags = 0; // What a previous holder of the slot did is not ours
	l.last_pid = 0;
	l.svc_obj = 0;
	l.svc_gen = 0;
	memset(reg_->usage[free_slot], 0, sizeof(reg_->usage[free_slot]));
	lease_slot_.store(free_slot, std::memory_order_release);
	return free_slot;
}

std::string object_segment_name(const std::string &registry_path, uint32_t slot, uint32_t gen,
				uint64_t nonce)
{
	char tail[64];
	snprintf(tail, sizeof(tail), "-q%u.%u.%016llx", slot, gen,
		 static_cast<unsigned long long>(nonce));
	return registry_path + tail;
}

int open_peer_fd(pid_t pid, int fd)
{
#if defined(SYS_pidfd_open) && defined(SYS_pidfd_getfd)
	int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
	if (pidfd >= 0) {
		int ours = static_cast<int>(syscall(SYS_pidfd_getfd, pidfd, fd, 0));
		close(pidfd);
		if (ours >= 0)
			return ours;
	}
#endif
	// memfds and shm files can be opened again by path; dma-bufs cannot.
	char path[64];
	snprintf(path, sizeof(path), "/proc/%d/fd/%d", pid, fd);
	return open(path, O_RDWR | O_CLOEXEC);
}

int reserve_segment(int fd, size_t bytes)
{
	int e = posix_fallocate(fd, 0, static_cast<off_t>(bytes));
	if (e == ENOSPC || e == EFBIG)
		return ENOMEM;
	return e == EOPNOTSUPP || e == EINVAL ? 0 : e;
}

int check_segment(int fd, size_t min_size, size_t max_size, std::string &why)
{
	struct stat st;
	if (fstat(fd, &st) < 0) {
		why = std::string("fstat failed: ") + strerror(errno);
		return errno;
	}
	if (st.st_uid != geteuid()) {
		why = "it belongs to uid " + std::to_string(st.st_uid) + ", not to this user (uid " +
		      std::to_string(geteuid()) + "): another user created it";
		return EPERM;
	}
	if (!S_ISREG(st.st_mode) || (st.st_mode & 077)) {
		char mode[16];
		snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
		why = std::string("its mode is ") + mode +
		      ", a segment must be a regular file with mode 0600";
		return EPERM;
	}
	auto size = static_cast<uint64_t>(st.st_size);
	if (size < min_size || size > max_size) {
		why = "its size " + std::to_string(size) + " is not that of a segment (" +
		      std::to_string(min_size) + " to " + std::to_string(max_size) + " bytes)";
		return EPROTO;
	}
	return 0;
}

void fabric::release_lease()
{
	registry_guard g(*this);
	// Under the lock, so that two releases (exit racing the last close)
	// reap the slot once.
	int slot = lease_slot_.exchange(-1, std::memory_order_acq_rel);
	if (slot < 0 || slot >= SV_MAX_PROCS)
		return;
	sv_lease &l = reg_->leases[slot];
	auto pid = static_cast<uint32_t>(getpid());
	if (l.pid == pid) {
		// Everything the lease still owns goes as a dead process's
		// would; the slot keeps its pid and flags for the tools.
		reap_locked(slot);
		l.svc_obj = 0;
		l.svc_gen = 0;
		l.last_pid = pid;
	}
}

int process_fabric(fabric *&out, std::string &error)
{
	static std::mutex m;
	static fabric *f = nullptr;
	static pid_t owner = 0;
	std::lock_guard<std::mutex> g(m);
	// A forked child gets its own lease but shares the mapping.
	if (f && owner == getpid()) {
		out = f;
		return 0;
	}
	config cfg;
	if (!load_config(cfg, error))
		return EINVAL;
	fabric *nf = nullptr;
	int ret = fabric::open(cfg, nf, error);
	if (ret)
		return ret;
	f = nf;
	owner = getpid();
	out = f;
	return 0;
}

} // namespace loop
