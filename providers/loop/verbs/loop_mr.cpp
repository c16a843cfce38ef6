// SPDX-License-Identifier: MIT
// Memory regions, windows and the key table.  Every access to memory, local
// or remote, goes through mr_resolve() (or mr_lookup()) before a byte moves.
// Kinds of key (see sv_mr_rec): plain MRs (also on-demand and implicit),
// the null MR, fd-backed MRs (peers map the object), BMME keys registered
// through the send queue (a virtual range or a block list), and type 1 and
// 2 memory windows, which resolve through the MR they are bound to.
#include "loop.h"
#include "loop_remap.h"
#include "peer_maps.h"
#include "service.h"
#include "res_limits.h"

#include <atomic>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <map>
#include <mutex>
#include <random>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace loop {

namespace {

constexpr uint32_t kRemoteRights =
	IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
constexpr uint32_t kSupportedAccess = IBV_ACCESS_LOCAL_WRITE | kRemoteRights |
				      IBV_ACCESS_MW_BIND | IBV_ACCESS_ZERO_BASED |
				      IBV_ACCESS_ON_DEMAND | IBV_ACCESS_HUGETLB |
				      IBV_ACCESS_RELAXED_ORDERING;
constexpr uint32_t kMaxFastRegPages = 65535;

uint8_t random_key()
{
	static thread_local std::mt19937 rng{[] {
		uint32_t seed;
		if (getrandom(&seed, sizeof(seed), 0) != sizeof(seed))
			seed = static_cast<uint32_t>(now_ns());
		return seed;
	}()};
	return static_cast<uint8_t>(rng());
}

uint32_t random_cookie()
{
	uint32_t c = 0;
	if (getrandom(&c, sizeof(c), 0) != sizeof(c))
		c = static_cast<uint32_t>(now_ns());
	return c | 1;
}

// A registration's new cookie, and the count of its copies started at 0
// under it (mr_copiers.h): before the state is published, so that a
// copier that sees the record VALID sees this count.  A count another
// registration left (a copier killed inside its copy) goes with it.
void mr_new_cookie(sv_mr_rec &m)
{
	m.cookie = random_cookie();
	std::atomic_ref<uint64_t>(m.copiers).store(static_cast<uint64_t>(m.cookie) << 32,
						   std::memory_order_relaxed);
}

std::atomic_ref<uint32_t> mr_state(sv_mr_rec &m)
{
	return std::atomic_ref<uint32_t>(m.state);
}

// Optional access flags (IBV_ACCESS_OPTIONAL_RANGE) a device does not know
// are dropped, as rdma-core does; relaxed ordering is one we honour.
int clean_access(int access)
{
	return access & (~IBV_ACCESS_OPTIONAL_RANGE | IBV_ACCESS_RELAXED_ORDERING);
}

// Checks the access flags as the spec and rdma-core do.
int check_access(int access)
{
	if (access & ~static_cast<int>(kSupportedAccess))
		return EINVAL;
	// Remote write or atomic needs local write (IB spec o10-8.2).
	if ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) &&
	    !(access & IBV_ACCESS_LOCAL_WRITE))
		return EINVAL;
	return 0;
}

struct mr_init {
	uint32_t pdn = 0;
	uint64_t iova = 0;
	uint64_t length = 0;
	uint64_t addr = 0;
	uint32_t access = 0;
	uint32_t kind = SV_MR_KIND_MR;
	uint32_t state = SV_MR_VALID;
	uint8_t flags = 0;
	int32_t fd = -1;
	uint64_t fd_offset = 0;
	uint64_t fd_ino = 0;
	uint16_t max_pages = 0;
};

// Allocates a key slot and publishes the record.  Returns the slot or -errno.
int publish_mr(loop_context *lctx, const mr_init &in, uint32_t &key_out)
{
	fabric &fab = *lctx->fab;
	sv_registry *r = fab.reg();
	// max_mr and max_mw are device-wide, across processes (res_limits.h);
	// windows have their own budget in the key table.
	sv_res res = in.kind == SV_MR_KIND_MW1 || in.kind == SV_MR_KIND_MW2 ? SV_RES_MW : SV_RES_MR;
	if (int e = res_take(fab, lctx->lease, res))
		return -e;
	registry_guard g(fab);
	// Start the search at a random point: keys do not come in sequence.
	uint32_t start = (static_cast<uint32_t>(random_key()) << 6) % SV_MAX_MRS;
	for (uint32_t n = 0; n < SV_MAX_MRS; n++) {
		uint32_t i = (start + n) % SV_MAX_MRS;
		if (i == 0)
			continue; // Key 0 stays invalid: a zeroed WR never names memory.
		sv_mr_rec &m = r->mrs[i];
		if (mr_state(m).load(std::memory_order_acquire) != SV_MR_FREE)
			continue;
		uint8_t k = random_key();
		if (k == (m.key & 0xff))
			k++; // Never hand the previous key of this slot out again at once.
		m.key = k;
		m.owner_lease = static_cast<uint32_t>(lctx->lease);
		m.owner_gen = lctx->lease_gen;
		m.pdn = in.pdn;
		m.access = in.access;
		m.iova = in.iova;
		m.length = in.length;
		m.addr = in.addr;
		m.kind = in.kind;
		m.bound_qpn = 0;
		m.parent = 0;
		m.bound_mws = 0;
		m.fd_offset = in.fd_offset;
		m.fd = in.fd;
		m.fd_ino = in.fd_ino;
		mr_new_cookie(m);
		m.npages = 0;
		m.page_shift = 0;
		m.flags = in.flags;
		m.max_pages = in.max_pages;
		mr_state(m).store(in.state, std::memory_order_release);
		key_out = (i << SV_MR_KEY_BITS) | k;
		return static_cast<int>(i);
	}
	res_put_locked(fab, lctx->lease, res); // Only if the table was damaged
	return -ENOMEM;
}

} // namespace

void mr_begin_change(sv_mr_rec &m)
{
	mr_state(m).store(SV_MR_INVALID, std::memory_order_relaxed);
	// No store to a field may be made (by the compiler or the CPU) before
	// readers can see the record out of service.
	std::atomic_thread_fence(std::memory_order_seq_cst);
}

bool mr_copy_busy(sv_mr_rec &m, uint32_t cookie)
{
	uint64_t v = std::atomic_ref<uint64_t>(m.copiers).load(std::memory_order_seq_cst);
	return static_cast<uint32_t>(v >> 32) == cookie && static_cast<uint32_t>(v) != 0;
}

void mr_copy_wait(sv_mr_rec &m, uint32_t cookie)
{
	auto busy = [&] { return mr_copy_busy(m, cookie); };
	if (!busy())
		return;
	uint64_t start = now_ns();
	for (int i = 0; busy(); i++) {
		if (now_ns() - start > uint64_t(kCopyWaitMs) * 1000000) {
			debug_log("MR record %p: copies still in flight after %d ms (a peer frozen or "
				  "killed inside one?); going on without them",
				  static_cast<void *>(&m), kCopyWaitMs);
			return;
		}
		if (i < 64) {
			sched_yield();
		} else {
			timespec ts{0, 50000};
			nanosleep(&ts, nullptr);
		}
	}
}

void mr_publish_change(sv_mr_rec &m)
{
	mr_new_cookie(m);
	mr_state(m).store(SV_MR_VALID, std::memory_order_release);
}

namespace {

// Copies a record that is in use, confirming it did not change meanwhile:
// a sequence lock over state and cookie.  A writer takes the record out of
// service first (mr_begin_change: INVALID, then its fields), draws a new
// cookie and stores the state last, with release; so a copy whose state and
// cookie read the same before and after it (and inside it) saw no change.
// (The cookie is read before the copy too: read only after it, a copy cut
// by a whole change would pair the old fields with the new cookie.)
[[gnu::hot]] bool snapshot(sv_mr_rec &m, sv_mr_rec &c)
{
	uint32_t st = mr_state(m).load(std::memory_order_acquire);
	if (st == SV_MR_FREE)
		return false;
	uint32_t ck = std::atomic_ref<uint32_t>(m.cookie).load(std::memory_order_acquire);
	memcpy(&c, &m, sizeof(c));
	std::atomic_thread_fence(std::memory_order_acquire);
	return mr_state(m).load(std::memory_order_relaxed) == st && c.state == st && c.cookie == ck &&
	       std::atomic_ref<uint32_t>(m.cookie).load(std::memory_order_relaxed) == ck &&
	       c.key == m.key;
}

// ---- fd-backed memory: peers map the owner's object ----
// The mappings are the loop transport's (transport/loop/peer_maps.cpp).

// ---- resolution ----

// Appends the segments of [off, off + len) of a non-window record (off
// relative to its iova).
[[gnu::hot]] int resolve_body(fabric &fab, uint32_t slot, const sv_mr_rec &c, uint64_t off, uint64_t len,
		 std::vector<rseg> &out)
{
	bool self = c.owner_lease == static_cast<uint32_t>(fab.lease());
	if (c.kind == SV_MR_KIND_NULL) {
		out.push_back({nullptr, len, seg_kind::null});
		return 0;
	}
	// SOFTVERBS_CMA=0 sends every copy to a remapped MR through its
	// owner's service thread too, as it says (docs/configuration.md).
	if ((c.kind == SV_MR_KIND_FD || ((c.flags & SV_MR_MAPPED) && !service_forced())) &&
	    !self) {
		std::shared_ptr<void> pin;
		bool direct = false, dead = false;
		char *base = peer_map(fab, slot, c, pin, direct, dead);
		if (base) {
			// Held for the copy as well: an ibv_rereg_mr that keeps the
			// mapping (new rights, a new PD) waits for it (mr_copiers.h).
			out.push_back({base + off, len,
				       direct ? seg_kind::mapped_direct : seg_kind::mapped,
				       std::move(pin), 0, c.addr + off, &fab.reg()->mrs[slot],
				       c.cookie, mr_file_word(c, off)});
			return 0;
		}
		if (dead)
			return ESRCH; // No answer: the requester retries, then gives up
		// A remapped MR whose arena we may not take (ptrace rules): its
		// addresses, as for any plain MR.
		if (c.kind == SV_MR_KIND_FD)
			return EFAULT;
	}
	seg_kind k = (c.flags & SV_MR_ODP) ? seg_kind::peer_checked : seg_kind::peer;
	// Our own fd-backed MR, copied by its addresses: if its file can
	// shrink under the copy (anything but a tmpfs memfd sealed against
	// shrinking), through the kernel, as a peer copies through its
	// mapping: a page the application cut off with ftruncate is then an
	// error completion, not SIGBUS in the library (an HCA keeps writing to
	// the pages it pinned).  Decided once per key cache entry.
	if (self && c.kind == SV_MR_KIND_FD && k == seg_kind::peer) {
		struct stat st;
		if (fstat(static_cast<int>(c.fd), &st) || static_cast<uint64_t>(st.st_ino) != c.fd_ino ||
		    !sealed_tmpfs(static_cast<int>(c.fd), c.fd_offset + c.length))
			k = seg_kind::peer_checked;
	}
	sv_mr_rec *rec = &fab.reg()->mrs[slot];
	if (!(c.flags & SV_MR_BLOCK_LIST)) {
		out.push_back({reinterpret_cast<void *>(c.addr + off), len, k, {}, 0, 0, rec,
			       c.cookie, mr_file_word(c, off)});
		return 0;
	}
	// A block list: byte off is fd_offset + off into the list's blocks.
	// The record is in shared memory: a block size or a list length that
	// no fast-register WR can produce is a damaged record.
	if (c.page_shift < 12 || c.page_shift > 40 || c.npages > kMaxFastRegPages + 1 ||
	    c.fd_offset > (1ULL << 56))
		return ERANGE;
	uint64_t bsz = 1ULL << c.page_shift;
	uint64_t pos = c.fd_offset + off;
	uint64_t first = pos >> c.page_shift;
	uint64_t last = len ? (pos + len - 1) >> c.page_shift : first;
	if (last >= c.npages)
		return ERANGE;
	thread_local std::vector<uint64_t> pages;
	pages.resize(last - first + 1);
	iovec l{pages.data(), pages.size() * sizeof(uint64_t)};
	iovec r{reinterpret_cast<void *>(c.addr + first * sizeof(uint64_t)), l.iov_len};
	pid_t pid = self ? self_pid()
		    : c.owner_lease < SV_MAX_PROCS
			    ? static_cast<pid_t>(fab.reg()->leases[c.owner_lease].pid)
			    : 0;
	// Through the kernel even for our own list: its address came from
	// shared memory, and a bad one must give EFAULT, not a fault.
	if (pid <= 0 || xfer(pid, false, &l, 1, &r, 1, xfer_dir::from_peer))
		return EFAULT;
	uint64_t in = pos & (bsz - 1);
	for (uint64_t i = 0; len; i++) {
		uint64_t n = std::min(len, bsz - in);
		out.push_back({reinterpret_cast<void *>(pages[i] + in), n, k, {}, 0, 0, rec, c.cookie});
		len -= n;
		in = 0;
	}
	return 0;
}

bool in_bounds(const sv_mr_rec &c, uint64_t iova, uint64_t len)
{
	if (len)
		return iova >= c.iova && len <= c.length && iova - c.iova <= c.length - len;
	return !c.length || (iova >= c.iova && iova - c.iova <= c.length);
}

// The checks of a key named by an access; c receives its record.
[[gnu::hot]] int check_key(fabric &fab, uint32_t key, uint32_t owner_lease, uint32_t pdn, uint64_t iova,
	      uint64_t len, uint32_t need, uint32_t qpn, sv_mr_rec &c)
{
	uint32_t slot = key >> SV_MR_KEY_BITS;
	if (slot == 0 || slot >= SV_MAX_MRS)
		return ENOENT;
	sv_mr_rec &m = fab.reg()->mrs[slot];
	if (!snapshot(m, c) || c.state != SV_MR_VALID)
		return ENOENT;
	if ((c.key & 0xff) != (key & 0xff) || c.owner_lease != owner_lease)
		return ENOENT;
	if (pdn != kAnyPdn && c.pdn != pdn)
		return EACCES;
	if ((c.access & need) != need)
		return EACCES;
	if (c.kind == SV_MR_KIND_MW2 && c.bound_qpn != qpn)
		return EACCES;
	if (!in_bounds(c, iova, len))
		return ERANGE;
	return 0;
}

} // namespace

namespace {

// mr_resolve; *plain (if given) receives the record when the key is not a
// window (whose answer depends on a second record too).
[[gnu::hot]] int resolve_key(fabric &fab, uint32_t key, uint32_t owner_lease, uint32_t pdn,
			     uint64_t iova, uint64_t len, uint32_t need, uint32_t qpn,
			     std::vector<rseg> &out, uint32_t *access, sv_mr_rec *plain)
{
	sv_mr_rec local;
	sv_mr_rec &c = plain ? *plain : local;
	int err = check_key(fab, key, owner_lease, pdn, iova, len, need, qpn, c);
	if (err)
		return err;
	if (access)
		*access = c.access;
	uint32_t slot = key >> SV_MR_KEY_BITS;
	if (c.kind == SV_MR_KIND_MW1 || c.kind == SV_MR_KIND_MW2) {
		// Through the window to the MR it is bound to, in that MR's iova.
		uint64_t piova = c.addr + (iova - c.iova);
		slot = c.parent;
		if (slot == 0 || slot >= SV_MAX_MRS)
			return ENOENT;
		sv_mr_rec p;
		if (!snapshot(fab.reg()->mrs[slot], p) || p.state != SV_MR_VALID ||
		    p.owner_lease != owner_lease || !in_bounds(p, piova, len))
			return ENOENT;
		if (access)
			*access |= p.access & IBV_ACCESS_RELAXED_ORDERING;
		if (plain)
			plain->state = SV_MR_FREE; // A window: not for the cache
		size_t before = out.size();
		err = resolve_body(fab, slot, p, piova - p.iova, len, out);
		// A copy through a window holds the window's record, not its
		// parent's: an invalidation, unbind or dealloc of the window
		// waits for it (the parent cannot be deregistered while the
		// window is bound).
		for (size_t i = before; i < out.size(); i++)
			if (out[i].mr) {
				out[i].mr = &fab.reg()->mrs[key >> SV_MR_KEY_BITS];
				out[i].mr_cookie = c.cookie;
			}
		return err;
	}
	return resolve_body(fab, slot, c, iova - c.iova, len, out);
}

} // namespace

[[gnu::hot]] int mr_resolve(fabric &fab, uint32_t key, uint32_t owner_lease, uint32_t pdn, uint64_t iova,
	       uint64_t len, uint32_t need, uint32_t qpn, std::vector<rseg> &out,
	       uint32_t *access)
{
	return resolve_key(fab, key, owner_lease, pdn, iova, len, need, qpn, out, access, nullptr);
}

namespace {

// The full way, remembered in e when it gave one segment of a kind the
// cache can give again.  Out of line: the hit path stays small.
[[gnu::noinline]] int resolve_and_keep(fabric &fab, key_cache &kc, key_cache::entry &e, bool was_hit,
				       uint32_t key, uint32_t owner_lease, uint32_t pdn,
				       uint64_t iova, uint64_t len, uint32_t need, uint32_t qpn,
				       std::vector<rseg> &out, uint32_t *access)
{
	size_t before = out.size();
	int64_t tick = coarse_now();
	// Into a record of our own: e keeps what it had until this one is
	// known to be worth keeping (an answer the cache cannot give again
	// evicts nothing; a throw leaves no half-filled entry).
	sv_mr_rec rec;
	int err = resolve_key(fab, key, owner_lease, pdn, iova, len, need, qpn, out, access, &rec);
	if (was_hit)
		e.valid = false;
	if (err || out.size() != before + 1 || rec.state != SV_MR_VALID ||
	    (rec.flags & SV_MR_BLOCK_LIST))
		return err;
	const rseg &s = out.back();
	if (s.kind != seg_kind::peer && s.kind != seg_kind::peer_checked &&
	    s.kind != seg_kind::mapped && s.kind != seg_kind::mapped_direct)
		return 0;
	bool mapped = s.kind == seg_kind::mapped || s.kind == seg_kind::mapped_direct;
	if (mapped && !s.pin)
		return 0;
	uint64_t off = iova - rec.iova;
	e.valid = false;
	e.rec = rec;
	e.key = key;
	e.owner_lease = owner_lease;
	e.kind = s.kind;
	e.base = mapped ? static_cast<char *>(s.base) - off : nullptr;
	e.map = mapped ? s.pin : std::weak_ptr<void>();
	e.tick = tick;
	e.valid = true;
	if (!was_hit)
		kc.next ^= 1;
	return 0;
}

} // namespace

namespace {

// The entry of kc that still stands for key: its record unchanged since it
// was resolved (VALID, with the key and cookie it had: a change of any field
// draws a new cookie), read between two looks at its state as snapshot()
// reads it, and the access asked for within what it checked (PD, rights,
// range).  Null otherwise; *found then receives an entry kept for key that
// no longer stands, or one whose check failed (the full path refills it,
// and gives the errno).
[[gnu::hot]] key_cache::entry *cache_lookup(fabric &fab, key_cache &kc, uint32_t key,
					    uint32_t owner_lease, uint32_t pdn, uint64_t iova,
					    uint64_t len, uint32_t need, key_cache::entry *&found)
{
	uint32_t slot = key >> SV_MR_KEY_BITS;
	found = nullptr;
	for (key_cache::entry &e : kc.e)
		if (e.valid && e.key == key && e.owner_lease == owner_lease)
			found = &e;
	if (!found || !slot || slot >= SV_MAX_MRS)
		return nullptr;
	const sv_mr_rec &c = found->rec;
	bool same = (c.key & 0xff) == (key & 0xff) && c.owner_lease == owner_lease &&
		    mr_still(fab.reg(), slot, c.key, c.cookie);
	// The checks of check_key that depend on the access, not the record;
	// a failing one goes the full way for its errno.
	if (same && (pdn == kAnyPdn || c.pdn == pdn) && (c.access & need) == need &&
	    in_bounds(c, iova, len))
		return found;
	found->valid = false;
	return nullptr;
}

} // namespace

const key_cache::entry *cached_entry(const key_cache &kc, uint32_t key, uint32_t owner_lease)
{
	for (const key_cache::entry &e : kc.e)
		if (e.valid && e.key == key && e.owner_lease == owner_lease)
			return &e;
	return nullptr;
}

void memo_key_keep(key_memo &k, const key_cache::entry *e, uint32_t key, bool mapped)
{
	uint32_t slot = key >> SV_MR_KEY_BITS;
	k = {};
	if (!e || !slot || slot >= SV_MAX_MRS ||
	    (mapped ? !e->base || e->kind != seg_kind::mapped_direct
		    : e->base || e->kind != seg_kind::peer))
		return;
	k.kbyte = e->rec.key;
	k.cookie = e->rec.cookie;
	k.iova = e->rec.iova;
	k.len = e->rec.length;
	k.addr = e->rec.addr;
	k.base = e->base;
	k.map = e->map;
	k.tick = e->tick;
	k.access = e->rec.access;
	k.key = key;
}

[[gnu::hot]] int mr_resolve_cached(fabric &fab, key_cache &kc, uint32_t key, uint32_t owner_lease,
				   uint32_t pdn, uint64_t iova, uint64_t len, uint32_t need,
				   uint32_t qpn, std::vector<rseg> &out, uint32_t *access)
{
	key_cache::entry *found;
	if (key_cache::entry *hit = cache_lookup(fab, kc, key, owner_lease, pdn, iova, len, need, found)) {
		const sv_mr_rec &c = hit->rec;
		uint64_t off = iova - c.iova;
		if (!hit->base) {
			out.push_back({reinterpret_cast<void *>(c.addr + off), len, hit->kind, {}, 0, 0,
				       &fab.reg()->mrs[key >> SV_MR_KEY_BITS], c.cookie,
				       mr_file_word(c, off)});
			if (access)
				*access = c.access;
			return 0;
		}
		if (coarse_now() == hit->tick) {
			if (std::shared_ptr<void> pin = hit->map.lock()) {
				out.push_back({hit->base + off, len, hit->kind, std::move(pin), 0,
					       c.addr + off, &fab.reg()->mrs[key >> SV_MR_KEY_BITS],
					       c.cookie, mr_file_word(c, off)});
				if (access)
					*access = c.access;
				return 0;
			}
		}
		hit->valid = false;
	}
	return resolve_and_keep(fab, kc, found ? *found : kc.e[kc.next], found != nullptr, key,
				owner_lease, pdn, iova, len, need, qpn, out, access);
}

[[gnu::hot]] bool mr_cached_own(fabric &fab, key_cache &kc, uint32_t key, uint32_t owner_lease,
				uint32_t pdn, uint64_t iova, uint64_t len, uint32_t need, iovec &out,
				seg_kind &kind)
{
	key_cache::entry *found;
	key_cache::entry *hit = cache_lookup(fab, kc, key, owner_lease, pdn, iova, len, need, found);
	if (!hit || hit->base)
		return false;
	out = {reinterpret_cast<void *>(hit->rec.addr + (iova - hit->rec.iova)), len};
	kind = hit->kind;
	return true;
}

[[gnu::hot]] bool mr_cached_target(fabric &fab, key_cache &kc, uint32_t key, uint32_t owner_lease,
				    uint32_t pdn, uint64_t iova, uint64_t len, uint32_t need,
				    char *&dst, seg_kind &kind, uint32_t &access,
				    std::shared_ptr<void> &pin)
{
	key_cache::entry *found;
	key_cache::entry *hit = cache_lookup(fab, kc, key, owner_lease, pdn, iova, len, need, found);
	if (!hit)
		return false;
	const sv_mr_rec &c = hit->rec;
	uint64_t off = iova - c.iova;
	kind = hit->kind;
	access = c.access;
	if (!hit->base) {
		dst = reinterpret_cast<char *>(c.addr + off);
		return true;
	}
	// As mr_resolve_cached: a mapping is trusted for the tick it was
	// resolved in, and only while this process still holds it.
	if (coarse_now() != hit->tick)
		return false;
	pin = hit->map.lock();
	if (!pin)
		return false;
	dst = hit->base + off;
	return true;
}

int mr_lookup(fabric &fab, uint32_t key, uint32_t owner_lease, uint32_t pdn, uint64_t iova,
	      uint64_t len, uint32_t need, uint32_t qpn, mr_hit &hit)
{
	thread_local std::vector<rseg> segs;
	segs.clear();
	uint32_t access = 0;
	int err = mr_resolve(fab, key, owner_lease, pdn, iova, len, need, qpn, segs, &access);
	if (err)
		return err;
	hit.slot = key >> SV_MR_KEY_BITS;
	hit.access = access;
	hit.kind = SV_MR_KIND_MR;
	hit.mapped = false;
	hit.odp = false;
	hit.addr = 0;
	hit.owner_addr = 0;
	hit.file_word = 0;
	if (segs.empty())
		return 0;
	if (segs.size() > 1)
		return ERANGE; // Callers of mr_lookup need one contiguous piece
	const rseg &s = segs[0];
	hit.addr = reinterpret_cast<uintptr_t>(s.base);
	hit.owner_addr = s.owner_addr ? s.owner_addr : hit.addr;
	hit.file_word = s.file_word;
	hit.kind = s.kind == seg_kind::null ? SV_MR_KIND_NULL : SV_MR_KIND_MR;
	hit.mapped = s.kind == seg_kind::mapped || s.kind == seg_kind::mapped_direct;
	hit.odp = s.kind == seg_kind::peer_checked;
	hit.pin = s.pin; // The mapping outlives the next lookup's segs.clear()
	hit.mr = s.mr;
	hit.mr_cookie = s.mr_cookie;
	return 0;
}

// ---- registration ----

namespace {

// ib_access_writable(): the accesses for which the kernel pins writable.
bool writable_access(int access)
{
	return access & (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
			 IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_MW_BIND);
}

// Whether every page of [addr, addr + len) is mapped, as a kernel that pins
// the pages would find out.
bool range_mapped(uintptr_t addr, size_t len)
{
	uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
	uintptr_t a = addr & ~(page - 1);
	uintptr_t end = addr + len;
	if (end < addr)
		return false;
	thread_local std::vector<unsigned char> vec;
	constexpr size_t kStep = 1ULL << 30;
	while (a < end) {
		size_t n = std::min<uintptr_t>(end - a, kStep);
		vec.resize((n + page - 1) / page);
		if (mincore(reinterpret_cast<void *>(a), n, vec.data()) && errno == ENOMEM)
			return false;
		a += n;
	}
	return true;
}


// Whether the mappings over [addr, addr + len) allow what pinning them for
// access would: the kernel's ib_umem_get pins for writing when the access
// writes (ib_access_writable()), which needs VM_WRITE, else for reading,
// which needs VM_READ; a page it cannot pin is EFAULT.  Asked of
// /proc/self/maps one VMA at a time with PROCMAP_QUERY, or, on a kernel
// without it, read from its text up to the range's end.  A file that cannot
// be read says yes (mincore already said mapped).
bool range_allows(uintptr_t addr, size_t len, bool write)
{
	int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return true;
	uint64_t need = write ? kVmaWritable : kVmaReadable;
	uintptr_t end = addr + len, covered = addr;
	bool ok = true, text = false;
	while (covered < end) {
		procmap_query_arg q{};
		q.size = sizeof(q);
		q.query_addr = covered;
		if (ioctl(fd, kProcmapQuery, &q) < 0) {
			if (errno == ENOENT) {
				ok = false; // Unmapped since mincore looked
				break;
			}
			text = true; // An older kernel: the text below
			break;
		}
		if (!(q.vma_flags & need) || q.vma_end <= covered) {
			ok = false;
			break;
		}
		covered = q.vma_end;
	}
	if (!text) {
		close(fd);
		return ok;
	}
	// The text, a line at a time, up to the first VMA past the range.
	char buf[8192];
	size_t have = 0;
	bool done = false;
	while (!done && covered < end) {
		ssize_t n = read(fd, buf + have, sizeof(buf) - have);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		have += static_cast<size_t>(n);
		char *p = buf, *stop = buf + have;
		for (;;) {
			char *eol = static_cast<char *>(memchr(p, '\n', static_cast<size_t>(stop - p)));
			if (!eol)
				break;
			char *q;
			uintptr_t lo = strtoull(p, &q, 16);
			uintptr_t hi = (q < eol && *q == '-') ? strtoull(q + 1, &q, 16) : 0;
			bool r = q + 3 < eol && q[1] == 'r', w = q + 3 < eol && q[2] == 'w';
			if (lo >= end) {
				done = true;
				break;
			}
			if (hi > covered && lo <= covered) {
				if (write ? !w : !r) {
					close(fd);
					return false;
				}
				covered = hi;
			}
			p = eol + 1;
		}
		have = static_cast<size_t>(stop - p);
		memmove(buf, p, have);
		if (have == sizeof(buf))
			break; // A line longer than the buffer: give up, say yes
	}
	close(fd);
	return true;
}

// The MR's range leaves the arena (the last MR on a block copies it back)
// or stops being noted as one reached by address.
void leave_range(loop_mr *mr)
{
	if (mr->remap_len)
		remap_release(mr->remap_addr, mr->remap_len);
	if (mr->plain_len)
		remap_note_plain(mr->plain_addr, mr->plain_len, false);
	mr->remap_addr = 0;
	mr->remap_len = 0;
	mr->plain_addr = 0;
	mr->plain_len = 0;
}

loop_mr *new_mr()
{
	auto *mr = new (std::nothrow) loop_mr{};
	if (!mr)
		errno = ENOMEM;
	return mr;
}

void release_fd(loop_mr *mr);

// Publishes the key of a new MR and fills its ibv_mr; on failure frees mr
// (and whatever fd it holds) and returns nullptr with errno set.
ibv_mr *publish_new_mr(ibv_pd *pd, loop_mr *mr, const mr_init &in, ibv_mr_type type, int access)
{
	// The MR holds its PD until it is deregistered (EBUSY for dealloc_pd).
	loop_pd *lpd = to_loop_pd(pd);
	if (!mr->parents.add(lpd->life, kLifePd)) {
		release_fd(mr);
		delete mr;
		errno = life_bad("ibv_reg_mr", lpd, lpd->life, kLifePd);
		return nullptr;
	}
	uint32_t key;
	int slot = publish_mr(to_loop_context(pd->context), in, key);
	if (slot < 0) {
		mr->parents.release();
		release_fd(mr);
		delete mr;
		errno = -slot;
		return nullptr;
	}
	mr->slot = static_cast<uint32_t>(slot);
	mr->vmr.mr_type = type;
	mr->vmr.access = access;
	ibv_mr &m = mr->vmr.ibv_mr;
	m.lkey = m.rkey = key;
	m.handle = key;
	owned_add(pd->context, mr, kOwnMr);
	return &m;
}

// An IOVA for [start, start + length): the same offset in its page as
// start (the kernel's ib_uverbs_reg_mr: "(start & ~PAGE_MASK) != (hca_va &
// ~PAGE_MASK)" is EINVAL; ibv_reg_dmabuf_mr(3) asks it of the offset), and
// a range that does not wrap past 2^64.  A zero-based MR's IOVA is 0.
bool iova_ok(uint64_t start, uint64_t length, uint64_t iova, int access)
{
	if (access & IBV_ACCESS_ZERO_BASED)
		return true;
	uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
	return (start & (page - 1)) == (iova & (page - 1)) && (!length || iova + (length - 1) >= iova);
}

} // namespace

ibv_mr *loop_reg_mr(ibv_pd *pd, void *addr, size_t length, uint64_t hca_va, int access)
{
	if (ctx_orphaned(pd->context))
		return fail_orphaned<ibv_mr>();
	access = clean_access(access);
	int err = check_access(access);
	if (err) {
		errno = err;
		return nullptr;
	}
	bool odp = access & IBV_ACCESS_ON_DEMAND;
	// Implicit ODP: the whole address space, as rdma-core spells it.
	bool implicit = odp && !addr && length == SIZE_MAX;
	if (!implicit && (!length || length > kMaxMrSize || !addr ||
			  !iova_ok(reinterpret_cast<uintptr_t>(addr), length, hca_va, access))) {
		errno = EINVAL;
		return nullptr;
	}
	if (!odp && (!range_mapped(reinterpret_cast<uintptr_t>(addr), length) ||
		     !range_allows(reinterpret_cast<uintptr_t>(addr), length, writable_access(access)))) {
		errno = EFAULT; // What ib_umem_get() answers for memory it cannot pin
		return nullptr;
	}
	loop_mr *mr = new_mr();
	if (!mr)
		return nullptr;
	mr_init in;
	in.pdn = to_loop_pd(pd)->pdn;
	in.iova = (access & IBV_ACCESS_ZERO_BASED) ? 0 : hca_va;
	in.length = implicit ? UINT64_MAX : length;
	in.addr = implicit ? 0 : reinterpret_cast<uintptr_t>(addr);
	in.access = static_cast<uint32_t>(access);
	in.flags = odp ? SV_MR_ODP : 0;
	if (implicit)
		in.iova = 0;
	int fd;
	uint64_t off, ino;
	if (!odp && remap_acquire(in.addr, length, fd, off, ino)) {
		mr->remap_addr = in.addr;
		mr->remap_len = length;
		in.flags |= SV_MR_MAPPED;
		in.fd = fd;
		in.fd_offset = off;
		in.fd_ino = ino;
	} else if (!implicit) {
		remap_note_plain(in.addr, length, true);
		mr->plain_addr = in.addr;
		mr->plain_len = length;
		// Over a shared file mapping, the file's bytes name the words
		// for the atomic locks: another mapping of them, here or in
		// another process, locks alike.
		if (!odp && shared_file_range(in.addr, length, ino, off)) {
			in.flags |= SV_MR_SHARED_FILE;
			in.fd_offset = off;
			in.fd_ino = ino;
		}
	}
	return publish_new_mr(pd, mr, in, IBV_MR_TYPE_MR, access);
}

ibv_mr *loop_alloc_null_mr(ibv_pd *pd)
{
	if (ctx_orphaned(pd->context))
		return fail_orphaned<ibv_mr>();
	loop_mr *mr = new_mr();
	if (!mr)
		return nullptr;
	mr_init in;
	in.pdn = to_loop_pd(pd)->pdn;
	in.length = UINT64_MAX;
	in.access = IBV_ACCESS_LOCAL_WRITE;
	in.kind = SV_MR_KIND_NULL;
	ibv_mr *m = publish_new_mr(pd, mr, in, IBV_MR_TYPE_NULL_MR, IBV_ACCESS_LOCAL_WRITE);
	if (!m)
		return nullptr;
	m->context = pd->context;
	m->pd = pd;
	return m;
}

namespace {

void release_fd(loop_mr *mr)
{
	if (mr->map)
		munmap(mr->map, mr->map_len);
	if (mr->fd >= 0)
		close(mr->fd);
	leave_range(mr);
	mr->map = nullptr;
	mr->map_len = 0;
	mr->fd = -1;
}

} // namespace

int loop_dereg_mr(verbs_mr *vmr)
{
	if (ctx_orphaned(vmr->ibv_mr.context))
		return EBADF;
	loop_mr *mr = to_loop_mr(&vmr->ibv_mr);
	if (int e = mr->life.begin_destroy(kLifeMr, "ibv_dereg_mr", mr))
		return e;
	loop_context *lctx = to_loop_context(vmr->ibv_mr.context);
	fabric &fab = *lctx->fab;
	uint32_t cookie;
	{
		registry_guard g(fab);
		sv_mr_rec &m = fab.reg()->mrs[mr->slot];
		// Windows bound to it keep it alive (IB spec o10-32).
		if (m.bound_mws) {
			mr->life.abort_destroy(kLifeMr);
			debug_log("ibv_dereg_mr(%p): %u memory windows are bound to it",
				  static_cast<void *>(mr), m.bound_mws);
			return EBUSY;
		}
		// Out of service first; the slot is freed only once no copy
		// by address into the memory is left (mr_copiers.h): after this
		// returns, the memory is the application's again.
		mr_begin_change(m);
		cookie = m.cookie;
	}
	mr_copy_wait(fab.reg()->mrs[mr->slot], cookie);
	{
		registry_guard g(fab);
		mr_state(fab.reg()->mrs[mr->slot]).store(SV_MR_FREE, std::memory_order_release);
		res_put_locked(fab, lctx->lease, SV_RES_MR);
	}
	release_fd(mr);
	mr->pages = {};
	mr->staged = {};
	mr->parents.release();
	mr->life.end_destroy(kLifeMr);
	quarantine(mr);
	return 0;
}

namespace {
// A new translation's file (shared_file_range), ino 0 when none.
struct file_at {
	uint64_t ino = 0, off = 0;
};
int rereg_locked(fabric &fab, loop_mr *mr, verbs_mr *vmr, int flags, ibv_pd *pd, void *addr,
		 size_t length, int access, bool odp, const file_at &file);
} // namespace

int loop_rereg_mr(verbs_mr *vmr, int flags, ibv_pd *pd, void *addr, size_t length, int access)
{
	if (ctx_orphaned(vmr->ibv_mr.context))
		return EBADF;
	loop_mr *mr = to_loop_mr(&vmr->ibv_mr);
	if (!mr->life.is(kLifeMr))
		return life_bad("ibv_rereg_mr", mr, mr->life, kLifeMr);
	if (!flags)
		return EINVAL; // Nothing to change: the kernel's ib_uverbs_rereg_mr refuses it
	if ((flags & IBV_REREG_MR_CHANGE_PD) && pd->context != vmr->ibv_mr.context)
		return EINVAL;
	loop_context *lctx = to_loop_context(vmr->ibv_mr.context);
	fabric &fab = *lctx->fab;
	if (flags & IBV_REREG_MR_CHANGE_ACCESS) {
		access = clean_access(access);
		int err = check_access(access);
		if (err)
			return err;
	} else {
		access = vmr->access;
	}
	bool odp = access & IBV_ACCESS_ON_DEMAND;
	if (flags & IBV_REREG_MR_CHANGE_TRANSLATION) {
		if (!length || length > kMaxMrSize)
			return EINVAL;
		if (!odp && (!range_mapped(reinterpret_cast<uintptr_t>(addr), length) ||
			     !range_allows(reinterpret_cast<uintptr_t>(addr), length,
					   writable_access(access))))
			return EFAULT;
	} else if ((flags & IBV_REREG_MR_CHANGE_ACCESS) && !odp &&
		   (vmr->access & IBV_ACCESS_ON_DEMAND) && vmr->mr_type == IBV_MR_TYPE_MR) {
		// On-demand no more: pinned now, as a registration without
		// IBV_ACCESS_ON_DEMAND would be (an implicit MR has no range to
		// pin).  It was taken as it stood, and a copy into a hole of it
		// then faulted in its own process.
		uintptr_t a = reinterpret_cast<uintptr_t>(vmr->ibv_mr.addr);
		size_t n = vmr->ibv_mr.length;
		if (!a && n == SIZE_MAX)
			return EINVAL;
		if (!range_mapped(a, n) || !range_allows(a, n, writable_access(access)))
			return EFAULT;
	} else if ((flags & IBV_REREG_MR_CHANGE_ACCESS) && !odp && mr->fd < 0 &&
		   writable_access(access) && !writable_access(vmr->access) &&
		   vmr->mr_type == IBV_MR_TYPE_MR &&
		   !range_allows(reinterpret_cast<uintptr_t>(vmr->ibv_mr.addr), vmr->ibv_mr.length,
				 true)) {
		// Made writable where it stays: pinned for writing now.
		return EFAULT;
	}
	// The new range is reached by address: noted before the record
	// changes, so that no move starts over it meanwhile.
	bool moving = (flags & IBV_REREG_MR_CHANGE_TRANSLATION) != 0;
	file_at file;
	if (moving && !odp &&
	    !shared_file_range(reinterpret_cast<uintptr_t>(addr), length, file.ino, file.off))
		file = {};
	if (moving)
		remap_note_plain(reinterpret_cast<uintptr_t>(addr), length, true);
	int err = rereg_locked(fab, mr, vmr, flags, pd, addr, length, access, odp, file);
	if (moving && err) {
		remap_note_plain(reinterpret_cast<uintptr_t>(addr), length, false);
		return err;
	}
	if (moving) {
		// The old range goes after the registry's lock is let go: the
		// copy takes time, and the lock is every process's.
		leave_range(mr);
		mr->plain_addr = reinterpret_cast<uintptr_t>(addr);
		mr->plain_len = length;
	}
	return err;
}

namespace {

int rereg_locked(fabric &fab, loop_mr *mr, verbs_mr *vmr, int flags, ibv_pd *pd, void *addr,
		 size_t length, int access, bool odp, const file_at &file)
{
	sv_mr_rec &m = fab.reg()->mrs[mr->slot];
	uint32_t cookie;
	{
		registry_guard g(fab);
		if (m.bound_mws &&
		    (flags & (IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_PD)))
			return EBUSY;
		// The MR moves its hold from the old PD to the new one.
		if ((flags & IBV_REREG_MR_CHANGE_PD) &&
		    !mr->parents.swap(to_loop_pd(vmr->ibv_mr.pd)->life, to_loop_pd(pd)->life,
				      kLifePd))
			return life_bad("ibv_rereg_mr", pd, to_loop_pd(pd)->life, kLifePd);
		// Take the key out of service while the record changes.
		mr_begin_change(m);
		cookie = m.cookie;
	}
	// Copies by address under the old registration finish first: after
	// rereg returns none lands in the old range (mr_copiers.h).
	mr_copy_wait(m, cookie);
	registry_guard g(fab);
	if (flags & IBV_REREG_MR_CHANGE_PD)
		m.pdn = to_loop_pd(pd)->pdn;
	if (flags & IBV_REREG_MR_CHANGE_ACCESS) {
		m.access = static_cast<uint32_t>(access);
		m.flags = static_cast<uint8_t>((m.flags & ~SV_MR_ODP) | (odp ? SV_MR_ODP : 0));
	}
	if (flags & IBV_REREG_MR_CHANGE_TRANSLATION) {
		m.addr = reinterpret_cast<uintptr_t>(addr);
		m.iova = (access & IBV_ACCESS_ZERO_BASED) ? 0 : reinterpret_cast<uintptr_t>(addr);
		m.length = length;
		// The new range is used by its addresses; the old one leaves
		// the arena below (a new translation is not moved).
		m.flags = static_cast<uint8_t>(m.flags & ~(SV_MR_MAPPED | SV_MR_SHARED_FILE));
		m.fd = -1;
		m.fd_ino = 0;
		m.fd_offset = 0;
		if (file.ino) {
			m.flags = static_cast<uint8_t>(m.flags | SV_MR_SHARED_FILE);
			m.fd_ino = file.ino;
			m.fd_offset = file.off;
		}
	}
	mr_new_cookie(m);
	// The keys stay as they were, as on mlx5: peers that hold the rkey keep
	// using it against the new translation and rights.
	mr_state(m).store(SV_MR_VALID, std::memory_order_release);
	return 0;
}

} // namespace

// ---- fd-backed MRs ----

namespace {

uint64_t fd_inode(int fd)
{
	struct stat st;
	return fstat(fd, &st) ? 0 : static_cast<uint64_t>(st.st_ino);
}

// Checks and maps [offset, offset + length) of fd; fills mr's fd and map.
int map_fd(loop_mr *mr, int fd, int fd_type, uint64_t offset, size_t length, int access)
{
	if (fd_type != SOFTVERBS_FD_DMABUF && fd_type != SOFTVERBS_FD_MEMFD)
		return EINVAL;
	if (!length || length > kMaxMrSize)
		return EINVAL;
	struct stat st;
	if (fd < 0 || fstat(fd, &st) < 0)
		return EBADF;
	off_t end = lseek(fd, 0, SEEK_END); // dma-bufs report their size here
	uint64_t size = end > 0 ? static_cast<uint64_t>(end) : static_cast<uint64_t>(st.st_size);
	if (offset > size || length > size - offset)
		return EINVAL;
	int dup_fd = fcntl(fd, F_DUPFD_CLOEXEC, 3);
	if (dup_fd < 0)
		return errno;
	uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
	uint64_t off = offset & ~(page - 1);
	size_t len = offset - off + length;
	int prot = PROT_READ | ((access & IBV_ACCESS_LOCAL_WRITE) ? PROT_WRITE : 0);
	void *p = mmap(nullptr, len, prot, MAP_SHARED, dup_fd, static_cast<off_t>(off));
	if (p == MAP_FAILED) {
		int e = errno == EINVAL ? ENODEV : errno;
		close(dup_fd);
		return e;
	}
	mr->fd = dup_fd;
	mr->map = p;
	mr->map_len = len;
	return 0;
}

} // namespace

ibv_mr *loop_reg_mr_fd(ibv_pd *pd, int fd, int fd_type, uint64_t offset, size_t length,
		       uint64_t iova, unsigned int uaccess)
{
	if (ctx_orphaned(pd->context))
		return fail_orphaned<ibv_mr>();
	int access = clean_access(static_cast<int>(uaccess));
	int err = check_access(access);
	if (err || (access & IBV_ACCESS_ON_DEMAND) || !iova_ok(offset, length, iova, access)) {
		errno = EINVAL;
		return nullptr;
	}
	loop_mr *mr = new_mr();
	if (!mr)
		return nullptr;
	err = map_fd(mr, fd, fd_type, offset, length, access);
	if (err) {
		delete mr;
		errno = err;
		return nullptr;
	}
	uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
	mr_init in;
	in.pdn = to_loop_pd(pd)->pdn;
	in.iova = (access & IBV_ACCESS_ZERO_BASED) ? 0 : iova;
	in.length = length;
	in.addr = reinterpret_cast<uintptr_t>(mr->map) + (offset & (page - 1));
	in.access = static_cast<uint32_t>(access);
	in.kind = SV_MR_KIND_FD;
	in.fd = mr->fd;
	in.fd_offset = offset;
	in.fd_ino = fd_inode(mr->fd);
	return publish_new_mr(pd, mr, in, IBV_MR_TYPE_DMABUF_MR, access);
}

ibv_mr *loop_reg_dmabuf_mr(ibv_pd *pd, uint64_t offset, size_t length, uint64_t iova, int fd,
			   int access)
{
	return loop_reg_mr_fd(pd, fd, SOFTVERBS_FD_DMABUF, offset, length, iova,
			      static_cast<unsigned int>(access));
}

int loop_rereg_mr_fd(ibv_mr *ibmr, int flags, ibv_pd *pd, int fd, int fd_type, uint64_t offset,
		     size_t length, uint64_t iova, unsigned int uaccess)
{
	if (ctx_orphaned(ibmr->context))
		return EBADF;
	loop_mr *mr = to_loop_mr(ibmr);
	if (!mr->life.is(kLifeMr))
		return life_bad("softverbs_rereg_mr_fd", mr, mr->life, kLifeMr);
	if ((flags & IBV_REREG_MR_CHANGE_PD) && (!pd || pd->context != ibmr->context))
		return EINVAL;
	loop_context *lctx = to_loop_context(ibmr->context);
	fabric &fab = *lctx->fab;
	if (mr->vmr.mr_type != IBV_MR_TYPE_DMABUF_MR)
		return EINVAL;
	int access = (flags & IBV_REREG_MR_CHANGE_ACCESS) ? clean_access(static_cast<int>(uaccess))
							 : mr->vmr.access;
	if (check_access(access) || (access & IBV_ACCESS_ON_DEMAND))
		return EINVAL;
	if ((flags & IBV_REREG_MR_CHANGE_TRANSLATION) && !iova_ok(offset, length, iova, access))
		return EINVAL;
	loop_mr fresh{};
	if (flags & IBV_REREG_MR_CHANGE_TRANSLATION) {
		int err = map_fd(&fresh, fd, fd_type, offset, length, access);
		if (err)
			return err;
	} else if ((flags & IBV_REREG_MR_CHANGE_ACCESS) && (access & IBV_ACCESS_LOCAL_WRITE) &&
		   !(mr->vmr.access & IBV_ACCESS_LOCAL_WRITE)) {
		// Our mapping is read-only: map the same range again, writable.
		sv_mr_rec &m = fab.reg()->mrs[mr->slot];
		int err = map_fd(&fresh, mr->fd, SOFTVERBS_FD_MEMFD, m.fd_offset, m.length, access);
		if (err)
			return err;
		offset = m.fd_offset;
		length = m.length;
		iova = m.iova;
		flags |= IBV_REREG_MR_CHANGE_TRANSLATION;
	}
	uint32_t cookie;
	{
		registry_guard g(fab);
		sv_mr_rec &m = fab.reg()->mrs[mr->slot];
		if (m.bound_mws &&
		    (flags & (IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_PD))) {
			release_fd(&fresh);
			return EBUSY;
		}
		if ((flags & IBV_REREG_MR_CHANGE_PD) &&
		    !mr->parents.swap(to_loop_pd(ibmr->pd)->life, to_loop_pd(pd)->life, kLifePd)) {
			release_fd(&fresh);
			return life_bad("softverbs_rereg_mr_fd", pd, to_loop_pd(pd)->life, kLifePd);
		}
		mr_begin_change(m);
		cookie = m.cookie;
	}
	// This process's copies by address into the old mapping finish before
	// it goes (mr_copiers.h; release_fd below unmaps it).
	mr_copy_wait(fab.reg()->mrs[mr->slot], cookie);
	{
		registry_guard g(fab);
		sv_mr_rec &m = fab.reg()->mrs[mr->slot];
		if (flags & IBV_REREG_MR_CHANGE_PD)
			m.pdn = to_loop_pd(pd)->pdn;
		m.access = static_cast<uint32_t>(access);
		if (flags & IBV_REREG_MR_CHANGE_TRANSLATION) {
			uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
			m.iova = (access & IBV_ACCESS_ZERO_BASED) ? 0 : iova;
			m.length = length;
			m.addr = reinterpret_cast<uintptr_t>(fresh.map) + (offset & (page - 1));
			m.fd = fresh.fd;
			m.fd_offset = offset;
			m.fd_ino = fd_inode(fresh.fd);
		}
		mr_new_cookie(m);
		mr_state(m).store(SV_MR_VALID, std::memory_order_release);
	}
	if (flags & IBV_REREG_MR_CHANGE_TRANSLATION) {
		release_fd(mr);
		mr->fd = fresh.fd;
		mr->map = fresh.map;
		mr->map_len = fresh.map_len;
		fresh.fd = -1;
		fresh.map = nullptr;
	}
	return 0;
}

// ---- on-demand paging ----

int loop_advise_mr(ibv_pd *pd, ibv_advise_mr_advice advice, uint32_t flags, ibv_sge *sg,
		   uint32_t num_sge)
{
	if (advice != IBV_ADVISE_MR_ADVICE_PREFETCH &&
	    advice != IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE &&
	    advice != IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT)
		return EOPNOTSUPP;
	if ((flags & ~IBV_ADVISE_MR_FLAG_FLUSH) || !num_sge || !sg)
		return EINVAL;
	loop_context *lctx = to_loop_context(pd->context);
	fabric &fab = *lctx->fab;
	uint32_t need = advice == IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE ? IBV_ACCESS_LOCAL_WRITE : 0;
	for (uint32_t i = 0; i < num_sge; i++) {
		sv_mr_rec c;
		if (check_key(fab, sg[i].lkey, static_cast<uint32_t>(lctx->lease),
			      to_loop_pd(pd)->pdn, sg[i].addr, sg[i].length, need, 0, c))
			return EINVAL;
		if (!(c.flags & SV_MR_ODP))
			return EINVAL; // Only on-demand MRs take advice (as the kernel says)
	}
	// Fault the pages in now, as an ODP HCA's prefetch does; a hole in the
	// range is no error (the access that needs it will fail then).
	if (advice == IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT)
		return 0;
#ifdef MADV_POPULATE_READ
	uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
	for (uint32_t i = 0; i < num_sge; i++) {
		uintptr_t a = sg[i].addr & ~(page - 1);
		uintptr_t e = sg[i].addr + sg[i].length;
		madvise(reinterpret_cast<void *>(a), e - a,
			need ? MADV_POPULATE_WRITE : MADV_POPULATE_READ);
	}
#endif
	return 0;
}

// ---- memory windows ----

ibv_mw *loop_alloc_mw(ibv_pd *pd, ibv_mw_type type)
{
	if (ctx_orphaned(pd->context))
		return fail_orphaned<ibv_mw>();
	if (type != IBV_MW_TYPE_1 && type != IBV_MW_TYPE_2) {
		errno = EINVAL;
		return nullptr;
	}
	auto *mw = new (std::nothrow) loop_mw{};
	if (!mw) {
		errno = ENOMEM;
		return nullptr;
	}
	if (!mw->parents.add(to_loop_pd(pd)->life, kLifePd)) {
		delete mw;
		errno = life_bad("ibv_alloc_mw", pd, to_loop_pd(pd)->life, kLifePd);
		return nullptr;
	}
	mr_init in;
	in.pdn = to_loop_pd(pd)->pdn;
	in.kind = type == IBV_MW_TYPE_1 ? SV_MR_KIND_MW1 : SV_MR_KIND_MW2;
	in.state = SV_MR_INVALID; // Unbound
	uint32_t key;
	int slot = publish_mr(to_loop_context(pd->context), in, key);
	if (slot < 0) {
		mw->parents.release();
		delete mw;
		errno = -slot;
		return nullptr;
	}
	mw->slot = static_cast<uint32_t>(slot);
	mw->base.context = pd->context;
	mw->base.pd = pd;
	mw->base.rkey = key;
	mw->base.handle = key;
	mw->base.type = type;
	owned_add(pd->context, mw, kOwnMw);
	return &mw->base;
}

namespace {

// Unbinds a window record.  Caller holds the registry lock.
void unbind_locked(sv_registry *r, sv_mr_rec &w)
{
	if (w.parent && w.parent < SV_MAX_MRS && r->mrs[w.parent].bound_mws)
		r->mrs[w.parent].bound_mws--;
	w.parent = 0;
	w.bound_qpn = 0;
	w.length = 0;
	w.access = 0;
}

} // namespace

int loop_dealloc_mw(ibv_mw *ibmw)
{
	if (ctx_orphaned(ibmw->context))
		return EBADF;
	auto *mw = reinterpret_cast<loop_mw *>(ibmw);
	if (int e = mw->life.begin_destroy(kLifeMw, "ibv_dealloc_mw", mw))
		return e;
	loop_context *lctx = to_loop_context(ibmw->context);
	fabric &fab = *lctx->fab;
	sv_mr_rec &w = fab.reg()->mrs[mw->slot];
	uint32_t cookie;
	{
		registry_guard g(fab);
		cookie = w.cookie;
		mr_begin_change(w);
	}
	// Out of service; then no copy through it is left when this returns,
	// as after an invalidation (mr_copiers.h).
	mr_copy_wait(w, cookie);
	{
		registry_guard g(fab);
		unbind_locked(fab.reg(), w);
		mr_state(w).store(SV_MR_FREE, std::memory_order_release);
		res_put_locked(fab, lctx->lease, SV_RES_MW);
	}
	mw->parents.release();
	mw->life.end_destroy(kLifeMw);
	quarantine(mw);
	return 0;
}

int loop_bind_mw(ibv_qp *qp, ibv_mw *mw, ibv_mw_bind *bind)
{
	if (!mw || !bind || mw->type != IBV_MW_TYPE_1 || mw->pd != qp->pd ||
	    mw->context != qp->context)
		return EINVAL;
	if (!to_loop_qp(qp)->life.is(kLifeQp))
		return life_bad("ibv_bind_mw", qp, to_loop_qp(qp)->life, kLifeQp);
	auto *lmw = reinterpret_cast<loop_mw *>(mw);
	if (!lmw->life.is(kLifeMw))
		return life_bad("ibv_bind_mw", mw, lmw->life, kLifeMw);
	const ibv_mw_bind_info &bi = bind->bind_info;
	if (!bi.mr && (bi.addr || bi.length))
		return EINVAL;
	// A type 1 window is not zero-based (IBTA o10-36.2.2; mlx5_bind_mw's
	// EINVAL, rxe's bind error).
	if (bi.mw_access_flags & IBV_ACCESS_ZERO_BASED)
		return EINVAL;
	if (bi.mr && bi.length && !(reinterpret_cast<verbs_mr *>(bi.mr)->access & IBV_ACCESS_MW_BIND))
		return EINVAL;
	ibv_send_wr wr{};
	wr.wr_id = bind->wr_id;
	wr.opcode = IBV_WR_BIND_MW;
	wr.send_flags = bind->send_flags;
	wr.bind_mw.mw = mw;
	wr.bind_mw.rkey = ibv_inc_rkey(mw->rkey);
	wr.bind_mw.bind_info = bi;
	ibv_send_wr *bad = nullptr;
	const mem_wr_extra x{true, nullptr}; // Only ibv_bind_mw binds a type 1 window
	int ret = post_send_mem(qp, &wr, &bad, &x);
	if (!ret)
		mw->rkey = wr.bind_mw.rkey;
	return ret;
}

int mr_copy_wr(loop_qp *qp, const ibv_send_wr *in, send_wr &w, const mem_wr_extra *x)
{
	if (in->opcode == IBV_WR_BIND_MW) {
		ibv_mw *mw = in->bind_mw.mw;
		if (!mw)
			return EINVAL;
		if (mw->type == IBV_MW_TYPE_1 && !(x && x->bind_type1))
			return EINVAL; // Type 1 windows are bound with ibv_bind_mw
		auto *lmw = reinterpret_cast<loop_mw *>(mw);
		if (!lmw->life.is(kLifeMw))
			return life_bad("ibv_post_send(BIND_MW)", mw, lmw->life, kLifeMw);
		if (mw->context != qp->vqp.qp.context)
			return EINVAL;
		const ibv_mw_bind_info &bi = in->bind_mw.bind_info;
		w.mw_slot = reinterpret_cast<loop_mw *>(mw)->slot;
		w.mw_type = mw->type;
		w.rkey = in->bind_mw.rkey;
		w.bind_lkey = bi.mr ? bi.mr->lkey : 0;
		w.bind_addr = bi.addr;
		w.bind_len = bi.length;
		w.bind_access = bi.mw_access_flags;
		(void)qp;
		return 0;
	}
	if (in->opcode == kWrFastReg && x && x->fast_reg) {
		const softverbs_fast_reg_wr *fr = x->fast_reg;
		w.frmr = to_loop_mr(fr->mr);
		w.mw_slot = w.frmr->slot;
		w.rkey = in->wr.rdma.rkey;
		w.remote_addr = fr->iova;
		w.bind_addr = fr->addr;
		w.bind_len = fr->length;
		w.bind_access = fr->access;
		w.npages = fr->page_list ? fr->num_pages : 0;
		w.page_shift = fr->page_shift;
		return 0;
	}
	return EINVAL;
}

namespace {

bool bind_run(loop_qp *qp, send_wr &w, ibv_wc_status &st)
{
	st = IBV_WC_MW_BIND_ERR;
	fabric &fab = *qp->ctx->fab;
	sv_registry *r = fab.reg();
	uint32_t me = static_cast<uint32_t>(qp->ctx->lease);
	// Only the low 8 bits of the WR's rkey are the new key, as on rxe and
	// mlx5: the rest of a window's rkey is its index, which no bind changes.
	if (w.mw_slot == 0 || w.mw_slot >= SV_MAX_MRS)
		return true;
	uint32_t rights = w.bind_access & (kRemoteRights | IBV_ACCESS_ZERO_BASED);
	registry_guard g(fab);
	sv_mr_rec &win = r->mrs[w.mw_slot];
	uint32_t want_kind = w.mw_type == IBV_MW_TYPE_1 ? SV_MR_KIND_MW1 : SV_MR_KIND_MW2;
	if (win.state == SV_MR_FREE || win.kind != want_kind || win.owner_lease != me ||
	    win.pdn != qp->pdn)
		return true;
	// A type 2 window is bound once; invalidate it before binding again.
	if (want_kind == SV_MR_KIND_MW2 && win.state == SV_MR_VALID)
		return true;
	// A type 2 window is not bound with length 0 (IBTA o10-37.2.40: that
	// would be an invalidation by bind; rxe's bind error).
	if (w.mw_type == IBV_MW_TYPE_2 && !w.bind_len)
		return true;
	bool unbind = w.mw_type == IBV_MW_TYPE_1 && !w.bind_len;
	uint32_t pslot = 0;
	uint64_t piova = 0;
	if (!unbind) {
		uint32_t l = w.bind_lkey;
		pslot = l >> SV_MR_KEY_BITS;
		if (!l || pslot == 0 || pslot >= SV_MAX_MRS || pslot == w.mw_slot)
			return true;
		sv_mr_rec &p = r->mrs[pslot];
		if (p.state != SV_MR_VALID || (p.key & 0xff) != (l & 0xff) || p.owner_lease != me ||
		    p.pdn != qp->pdn)
			return true;
		if (p.kind != SV_MR_KIND_MR && p.kind != SV_MR_KIND_FD && p.kind != SV_MR_KIND_FRMR)
			return true;
		if (!(p.access & IBV_ACCESS_MW_BIND))
			return true;
		if ((rights & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) &&
		    !(p.access & IBV_ACCESS_LOCAL_WRITE))
			return true;
		if (!in_bounds(p, w.bind_addr, w.bind_len))
			return true;
		piova = w.bind_addr;
	}
	// A bound type 1 window bound again, or unbound: its old binding goes
	// now, and the bind completes once no copy through the old binding is
	// left, as an invalidation does (mr_local_inv): the WR stays at the
	// head of the send queue meanwhile, looked at every kInvPollNs, at
	// most kCopyWaitMs.
	uint64_t now = now_ns();
	if (!w.inv_waiting && win.state == SV_MR_VALID) {
		w.inv_waiting = true;
		w.inv_cookie = win.cookie;
		w.inv_until_ns = now + uint64_t(kCopyWaitMs) * 1000000;
		mr_begin_change(win);
		unbind_locked(r, win);
	}
	if (w.inv_waiting) {
		if (mr_copy_busy(win, w.inv_cookie) && now < w.inv_until_ns) {
			w.next_try_ns = now + kInvPollNs;
			return false;
		}
		w.inv_waiting = false;
	}
	mr_begin_change(win);
	unbind_locked(r, win);
	win.key = w.rkey & 0xff;
	mr_new_cookie(win);
	st = IBV_WC_SUCCESS;
	if (unbind)
		return true; // Unbound, with a new key
	win.parent = pslot;
	r->mrs[pslot].bound_mws++;
	win.addr = piova;
	win.iova = (rights & IBV_ACCESS_ZERO_BASED) ? 0 : w.bind_addr;
	win.length = w.bind_len;
	win.access = rights & kRemoteRights;
	win.bound_qpn = w.mw_type == IBV_MW_TYPE_2 ? qp->qpn : 0;
	mr_state(win).store(SV_MR_VALID, std::memory_order_release);
	return true;
}

// Invalidates rkey: a type 2 window or a BMME key.  Caller holds the lock.
// A BMME key's or a window's copies by address hold its own record
// (mr_copiers.h): *wait receives the record and *cookie the registration to
// wait out once the lock is dropped.
int invalidate_locked(sv_registry *r, uint32_t owner, uint32_t pdn, uint32_t qpn, uint32_t rkey,
		      bool remote, sv_mr_rec **wait, uint32_t *cookie)
{
	*wait = nullptr;
	uint32_t slot = rkey >> SV_MR_KEY_BITS;
	if (slot == 0 || slot >= SV_MAX_MRS)
		return ENOENT;
	sv_mr_rec &m = r->mrs[slot];
	if (m.state != SV_MR_VALID || (m.key & 0xff) != (rkey & 0xff) || m.owner_lease != owner)
		return ENOENT;
	if (m.pdn != pdn)
		return EACCES;
	if (m.kind == SV_MR_KIND_MW2) {
		// A remote invalidation must come on the QP the window is bound to.
		if (remote && m.bound_qpn != qpn)
			return EACCES;
		*cookie = m.cookie;
		*wait = &m;
		mr_begin_change(m);
		unbind_locked(r, m);
		return 0;
	}
	if (m.kind == SV_MR_KIND_FRMR) {
		if (m.bound_mws)
			return EBUSY;
		*cookie = m.cookie;
		*wait = &m;
		mr_begin_change(m);
		return 0;
	}
	return EINVAL; // MRs from reg_mr and type 1 windows cannot be invalidated
}

ibv_wc_status fast_reg_run(loop_qp *qp, send_wr &w)
{
	fabric &fab = *qp->ctx->fab;
	sv_registry *r = fab.reg();
	uint32_t me = static_cast<uint32_t>(qp->ctx->lease);
	uint32_t slot = w.mw_slot;
	if (slot == 0 || slot >= SV_MAX_MRS)
		return IBV_WC_MW_BIND_ERR;
	registry_guard g(fab);
	sv_mr_rec &m = r->mrs[slot];
	if (m.kind != SV_MR_KIND_FRMR || m.owner_lease != me || m.pdn != qp->pdn)
		return IBV_WC_MW_BIND_ERR;
	// A key is registered once; invalidate it before registering again.
	if (m.state != SV_MR_INVALID || m.bound_mws)
		return IBV_WC_MW_BIND_ERR;
	uint32_t access = w.bind_access;
	if (check_access(static_cast<int>(clean_access(static_cast<int>(access)))) ||
	    (access & IBV_ACCESS_ON_DEMAND))
		return IBV_WC_MW_BIND_ERR;
	loop_mr *lmr = w.frmr;
	uint8_t flags = 0;
	uint64_t addr = w.bind_addr;
	uint64_t fbo = 0;
	if (w.npages) {
		uint64_t bsz = 1ULL << w.page_shift;
		if (!lmr || w.npages > lmr->pages.size() || w.npages > lmr->staged.size() ||
		    w.bind_addr >= bsz || w.bind_len > w.npages * bsz - w.bind_addr)
			return IBV_WC_MW_BIND_ERR;
		std::copy(lmr->staged.begin(), lmr->staged.begin() + w.npages, lmr->pages.begin());
		addr = reinterpret_cast<uintptr_t>(lmr->pages.data());
		fbo = w.bind_addr;
		flags = SV_MR_BLOCK_LIST;
	}
	m.key = w.rkey & 0xff;
	m.access = clean_access(static_cast<int>(access));
	m.iova = (access & IBV_ACCESS_ZERO_BASED) ? 0 : w.remote_addr;
	m.length = w.bind_len;
	m.addr = addr;
	m.fd_offset = fbo;
	m.npages = w.npages;
	m.page_shift = static_cast<uint8_t>(w.page_shift);
	m.flags = flags;
	mr_new_cookie(m);
	mr_state(m).store(SV_MR_VALID, std::memory_order_release);
	if (lmr) {
		lmr->vmr.ibv_mr.lkey = lmr->vmr.ibv_mr.rkey = (slot << SV_MR_KEY_BITS) | (w.rkey & 0xff);
		lmr->vmr.ibv_mr.addr = reinterpret_cast<void *>(w.npages ? 0 : w.bind_addr);
		lmr->vmr.ibv_mr.length = w.bind_len;
		lmr->vmr.access = static_cast<int>(m.access);
	}
	return IBV_WC_SUCCESS;
}

} // namespace

ibv_wc_status mr_local_op(loop_qp *qp, send_wr &w)
{
	if (w.opcode == kWrFastReg)
		return fast_reg_run(qp, w);
	return IBV_WC_LOC_QP_OP_ERR;
}

bool mr_bind(loop_qp *qp, send_wr &w, ibv_wc_status &st)
{
	return bind_run(qp, w, st);
}

bool mr_local_inv(loop_qp *qp, send_wr &w, ibv_wc_status &st)
{
	fabric &fab = *qp->ctx->fab;
	uint64_t now = now_ns();
	if (!w.inv_waiting) {
		sv_mr_rec *wait;
		uint32_t cookie = 0;
		int err;
		{
			registry_guard g(fab);
			err = invalidate_locked(fab.reg(), static_cast<uint32_t>(qp->ctx->lease),
						qp->pdn, qp->qpn, w.invalidate_rkey, false, &wait,
						&cookie);
		}
		if (err || !wait) {
			st = err ? IBV_WC_LOC_QP_OP_ERR : IBV_WC_SUCCESS;
			return true;
		}
		w.inv_waiting = true;
		w.mw_slot = static_cast<uint32_t>(wait - fab.reg()->mrs);
		w.inv_cookie = cookie;
		w.inv_until_ns = now + uint64_t(kCopyWaitMs) * 1000000;
	}
	// Complete once no copy through the key is left, as an HCA's
	// invalidation does: its memory is the application's to reuse then.
	// Not waited for in the posting call (nor in the progress thread):
	// the WR stays at the head and is looked at again, at most
	// kCopyWaitMs (a copier frozen or killed inside its copy).
	if (mr_copy_busy(fab.reg()->mrs[w.mw_slot], w.inv_cookie) && now < w.inv_until_ns) {
		w.next_try_ns = now + kInvPollNs;
		return false;
	}
	w.inv_waiting = false;
	st = IBV_WC_SUCCESS;
	return true;
}

int mr_remote_invalidate(fabric &fab, uint32_t owner_lease, uint32_t pdn, uint32_t qpn,
			 uint32_t rkey)
{
	sv_mr_rec *wait;
	uint32_t cookie = 0;
	int err;
	{
		registry_guard g(fab);
		err = invalidate_locked(fab.reg(), owner_lease, pdn, qpn, rkey, true, &wait, &cookie);
	}
	if (wait)
		mr_copy_wait(*wait, cookie);
	return err;
}

// ---- BMME keys ----

ibv_mr *loop_alloc_fast_reg_mr(ibv_pd *pd, uint32_t max_pages)
{
	if (!max_pages || max_pages > kMaxFastRegPages) {
		errno = EINVAL;
		return nullptr;
	}
	loop_mr *mr = new_mr();
	if (!mr)
		return nullptr;
	try {
		mr->pages.assign(max_pages, 0);
		mr->staged.assign(max_pages, 0);
	} catch (...) {
		delete mr;
		errno = ENOMEM;
		return nullptr;
	}
	mr_init in;
	in.pdn = to_loop_pd(pd)->pdn;
	in.kind = SV_MR_KIND_FRMR;
	in.state = SV_MR_INVALID;
	in.max_pages = static_cast<uint16_t>(max_pages);
	// Not IBV_MR_TYPE_MR: ibv_rereg_mr refuses it, as it should.
	return publish_new_mr(pd, mr, in, IBV_MR_TYPE_IMPORTED_MR, 0);
}

int loop_post_fast_reg(ibv_qp *ibqp, const softverbs_fast_reg_wr *fr)
{
	loop_mr *mr = to_loop_mr(fr->mr);
	if (mr->pages.empty() || fr->mr->context != ibqp->context)
		return EINVAL;
	if (fr->page_list) {
		if (!fr->num_pages || fr->num_pages > mr->pages.size() || fr->page_shift < 12 ||
		    fr->page_shift > 30)
			return EINVAL;
	} else if (fr->num_pages) {
		return EINVAL;
	}
	if (!fr->length || fr->length > kMaxMrSize)
		return EINVAL;
	if (fr->page_list)
		std::copy(fr->page_list, fr->page_list + fr->num_pages, mr->staged.begin());
	// Through the send queue, as a kWrFastReg WR (see send_wr in loop.h).
	ibv_send_wr wr{};
	wr.wr_id = fr->wr_id;
	wr.opcode = kWrFastReg;
	wr.send_flags = fr->send_flags & (IBV_SEND_SIGNALED | IBV_SEND_FENCE);
	wr.wr.rdma.remote_addr = fr->iova;
	wr.wr.rdma.rkey = softverbs_key_with(fr->mr->lkey, fr->key);
	const mem_wr_extra x{false, fr};
	ibv_send_wr *bad = nullptr;
	return post_send_mem(ibqp, &wr, &bad, &x);
}

} // namespace loop
