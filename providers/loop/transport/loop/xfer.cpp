// SPDX-License-Identifier: MIT
#include "xfer.h"

#include "mr_copiers.h"
#include "service.h"
#include "small_vec.h"
#include "transport.h"
#include "tunables.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <sys/mman.h>
#include <unistd.h>
#include <vector>

namespace loop {

namespace {

int copy_local(const iovec *local, int nl, const iovec *remote, int nr, xfer_dir dir)
{
	int li = 0, ri = 0;
	size_t lo = 0, ro = 0;
	while (li < nl && ri < nr) {
		size_t n = std::min(local[li].iov_len - lo, remote[ri].iov_len - ro);
		char *l = static_cast<char *>(local[li].iov_base) + lo;
		char *r = static_cast<char *>(remote[ri].iov_base) + ro;
		if (n) {
			if (dir == xfer_dir::to_peer)
				memmove(r, l, n);
			else
				memmove(l, r, n);
		}
		lo += n;
		ro += n;
		if (lo == local[li].iov_len) {
			li++;
			lo = 0;
		}
		if (ro == remote[ri].iov_len) {
			ri++;
			ro = 0;
		}
	}
	return 0;
}

size_t total(const iovec *v, int n)
{
	size_t t = 0;
	for (int i = 0; i < n; i++)
		t += v[i].iov_len;
	return t;
}

// One cross-memory-attach call; where the kernel refuses it (or
// SOFTVERBS_CMA=0 says so), the same copy through the peer's service
// thread, unless may_serve is false (then EPERM).  Returns 0 or an errno.
// *moved receives the bytes moved: on a short count (EFAULT) those before
// the first fault, where the kernel stopped.  *whole is set when the errno
// is the call's as a whole (the call failed, or the service thread's copy
// did), so that where the fault lies in it is not known.
int move(pid_t pid, const iovec *local, size_t nl, const iovec *remote, size_t nr,
	 xfer_dir dir, size_t want, size_t *moved, bool *whole, bool may_serve = true)
{
	bool self = pid == self_pid();
	*moved = 0;
	*whole = true;
	if (!service_forced() || self) {
		ssize_t n = dir == xfer_dir::to_peer ? process_vm_writev(pid, local, nl, remote, nr, 0)
						     : process_vm_readv(pid, local, nl, remote, nr, 0);
		if (n >= 0) {
			if (!self)
				service_note(SV_LEASE_CMA_USED);
			*moved = static_cast<size_t>(n);
			*whole = false;
			return static_cast<size_t>(n) == want ? 0 : EFAULT;
		}
		if (errno != EPERM || self || !may_serve)
			return errno;
		service_note(SV_LEASE_CMA_REFUSED);
	} else if (!may_serve) {
		return EPERM;
	}
	int err = service_xfer(pid, local, static_cast<int>(nl), remote, static_cast<int>(nr), dir);
	*moved = err ? 0 : want;
	return err;
}

} // namespace

pid_t self_pid()
{
	static pid_t *const cell = [] {
		long page = sysconf(_SC_PAGESIZE);
		void *m = mmap(nullptr, static_cast<size_t>(page), PROT_READ | PROT_WRITE,
			       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (m == MAP_FAILED)
			return static_cast<pid_t *>(nullptr);
		if (madvise(m, static_cast<size_t>(page), MADV_WIPEONFORK)) {
			munmap(m, static_cast<size_t>(page)); // A kernel before 4.14
			return static_cast<pid_t *>(nullptr);
		}
		return static_cast<pid_t *>(m);
	}();
	if (!cell)
		return getpid();
	pid_t v = std::atomic_ref<pid_t>(*cell).load(std::memory_order_relaxed);
	if (!v) {
		v = getpid();
		std::atomic_ref<pid_t>(*cell).store(v, std::memory_order_relaxed);
	}
	return v;
}

int xfer(pid_t pid, bool same_process, const iovec *local, int nl, const iovec *remote, int nr,
	 xfer_dir dir)
{
	if (same_process)
		return copy_local(local, nl, remote, nr, dir);
	size_t want = total(local, nl);
	if (!want)
		return 0;
	// One call moves everything when both lists fit in IOV_MAX.
	if (nl <= IOV_MAX && nr <= IOV_MAX) {
		size_t moved;
		bool whole;
		return move(pid, local, static_cast<size_t>(nl), remote, static_cast<size_t>(nr), dir,
			    want, &moved, &whole);
	}
	return EINVAL;
}

namespace {

int checked_self_copy(void *local, void *remote, size_t len, xfer_dir dir)
{
	iovec l{local, len};
	iovec r{remote, len};
	ssize_t n = dir == xfer_dir::to_peer ? process_vm_writev(self_pid(), &l, 1, &r, 1, 0)
					     : process_vm_readv(self_pid(), &l, 1, &r, 1, 0);
	if (n < 0)
		return errno == ESRCH ? EFAULT : errno;
	return static_cast<size_t>(n) == len ? 0 : EFAULT;
}

// One contiguous piece of a transfer: local bytes and where they go.
// cma: by cross-memory attach (a peer in another process, or on-demand
// memory anywhere); else by the kind's own copy.
struct piece {
	char *local;
	char *remote;
	size_t len;
	seg_kind kind;
	xfer_dir dir;
	bool cma;
	sv_mr_rec *mr;	 // Reached by the owner's addresses: held while copied
	uint32_t cookie; // mr's registration
};

// The registrations the pieces copy into or out of by address, each held
// for the copies (mr_copiers.h): taken all before any byte moves, dropped
// when holds goes.  False (nothing held) when one of them went out of
// service.
template <typename Pieces> bool take_holds(mr_copy_holds &holds, const Pieces &ps)
{
	for (const piece &p : ps) {
		if (p.mr && !holds.add(p.mr, p.cookie)) {
			holds.drop();
			return false;
		}
	}
	return true;
}

// Runs pieces in the order given: consecutive cross-memory-attach pieces of
// one direction share one process_vm_writev/readv call, up to IOV_MAX
// iovecs (the kernel copies its iovecs in order).  *moved receives the
// bytes of the pieces that landed whole or, within a call the kernel cut
// short, before the fault; *whole and may_serve: as move().
using pieces = small_vec<piece, 16>;

int run_pieces(pid_t pid, const pieces &ps, size_t *moved, bool *whole, bool may_serve = true)
{
	small_vec<iovec, 16> lv, rv;
	size_t want = 0;
	xfer_dir dir = xfer_dir::to_peer;
	*moved = 0;
	*whole = false;
	// A registration out of service since its key was resolved (a
	// deregistration, a rereg): nothing moves, as for a key found bad.
	mr_copy_holds holds;
	if (!take_holds(holds, ps)) {
		*whole = true;
		return EACCES;
	}
	auto flush = [&]() -> int {
		if (lv.empty())
			return 0;
		size_t got;
		int err = move(pid, lv.data(), lv.size(), rv.data(), rv.size(), dir, want, &got,
			       whole, may_serve);
		*moved += got;
		lv.clear();
		rv.clear();
		want = 0;
		return err;
	};
	lv.clear();
	rv.clear();
	for (const piece &p : ps) {
		if (p.cma) {
			if (lv.size() == IOV_MAX || (!lv.empty() && p.dir != dir)) {
				if (int err = flush())
					return err;
			}
			dir = p.dir;
			lv.push_back({p.local, p.len});
			rv.push_back({p.remote, p.len});
			want += p.len;
			continue;
		}
		if (int err = flush())
			return err;
		switch (p.kind) {
		case seg_kind::null:
			if (p.dir == xfer_dir::from_peer)
				memset(p.local, 0, p.len);
			break;
		case seg_kind::mapped: {
			// A peer's fd-backed object, mapped here: its owner may
			// shrink the file under us, and a plain copy would then
			// die of SIGBUS in this process.  The kernel's copy
			// between two of our own addresses answers EFAULT.
			if (int err = checked_self_copy(p.local, p.remote, p.len, p.dir))
				return err;
			service_note(SV_LEASE_MAPPED_USED);
			break;
		}
		case seg_kind::mapped_direct:
			// A sealed memfd at least this long, mapped writable: no
			// fault is possible on the peer's side (peer_maps.cpp).
			// (add_pieces makes it plain mapped where local memory is
			// on demand and may fault.)
			if (p.dir == xfer_dir::to_peer)
				memcpy(p.remote, p.local, p.len);
			else
				memcpy(p.local, p.remote, p.len);
			service_note(SV_LEASE_DIRECT_USED);
			break;
		default: // peer within this process
			if (p.dir == xfer_dir::to_peer)
				memmove(p.remote, p.local, p.len);
			else
				memmove(p.local, p.remote, p.len);
			break;
		}
		*moved += p.len;
	}
	return flush();
}

// Appends the pieces of one transfer to ps; returns its bytes.
size_t add_pieces(pieces &ps, bool same_process, const iovec *local, int nl, const rseg *remote,
		  int nr, xfer_dir dir, bool relaxed, bool local_checked)
{
	size_t first = ps.size();
	int li = 0, ri = 0;
	size_t lo = 0, ro = 0, total = 0;
	while (li < nl && ri < nr) {
		size_t n = std::min(local[li].iov_len - lo, remote[ri].len - ro);
		if (n) {
			seg_kind k = remote[ri].kind;
			// A plain memcpy would touch local memory on demand, which
			// may be unmapped: the kernel's copy answers EFAULT instead.
			if (k == seg_kind::mapped_direct && local_checked)
				k = seg_kind::mapped;
			// Every piece into or out of a registration holds it: by
			// address (a dereg or rereg would leave the memory to the
			// application) or through a mapping (a rereg of the rights or
			// the PD keeps the mapping, mr_copiers.h).
			ps.push_back({static_cast<char *>(local[li].iov_base) + lo,
				      static_cast<char *>(remote[ri].base) + ro, n, k, dir,
				      (k == seg_kind::peer && !same_process) ||
					      k == seg_kind::peer_checked,
				      remote[ri].mr, remote[ri].mr_cookie});
			total += n;
		}
		lo += n;
		ro += n;
		if (lo == local[li].iov_len) {
			li++;
			lo = 0;
		}
		if (ro == remote[ri].len) {
			ri++;
			ro = 0;
		}
	}
	bool tail_first = relaxed && total >= kRelaxedMinBytes;
	// Source and target overlapping within this process (pieces copied by
	// memmove, not the kernel): the pieces keep their order and their
	// length, and each gives memmove's result; a split or a reorder would
	// copy bytes another piece of this WRITE wrote already.
	bool overlap = false;
	if (dir == xfer_dir::to_peer) {
		const char *llo = nullptr, *lhi = nullptr, *rlo = nullptr, *rhi = nullptr;
		for (size_t i = first; i < ps.size(); i++) {
			const piece &q = ps[i];
			if (q.cma)
				continue;
			if (!llo || q.local < llo)
				llo = q.local;
			if (!lhi || q.local + q.len > lhi)
				lhi = q.local + q.len;
			if (!rlo || q.remote < rlo)
				rlo = q.remote;
			if (!rhi || q.remote + q.len > rhi)
				rhi = q.remote + q.len;
		}
		overlap = llo && llo < rhi && rlo < lhi;
	}
	if (dir == xfer_dir::to_peer && !overlap &&
	    (tail_first || (!relaxed && total > kOrderedTail))) {
		// The order a poller of the last byte can see.  Relaxed ordering
		// (the target allowed any): its last kRelaxedChunk bytes first,
		// then the rest in order (relaxed_copy, xfer.h), with the same
		// system calls as in-order placement, so that code that wrongly
		// polls the last byte fails here, not on the first NIC that
		// reorders.  (It placed every 16 KiB chunk last first: a backward
		// walk that held 1 MiB WRITEs to about 0.7 of a memcpy.)  Without
		// it: the last kOrderedTail bytes in a piece of their own, after
		// the rest (ordered_copy): one more iovec of the same system call,
		// or one more memcpy.
		pieces fwd;
		for (size_t i = first; i < ps.size(); i++)
			fwd.push_back(ps[i]);
		ps.shrink(first);
		size_t want = tail_first ? kRelaxedChunk : kOrderedTail;
		size_t tail = want, k = fwd.size();
		while (tail && k) { // The pieces (or the piece's end) holding the tail
			const piece &q = fwd[k - 1];
			if (q.len > tail)
				break;
			tail -= q.len;
			k--;
		}
		auto push_tail = [&] {
			if (tail && k) {
				const piece &q = fwd[k - 1];
				ps.push_back({q.local + q.len - tail, q.remote + q.len - tail, tail, q.kind,
					      q.dir, q.cma, q.mr, q.cookie});
			}
			for (size_t i = k; i < fwd.size(); i++)
				ps.push_back(fwd[i]);
		};
		auto push_head = [&] {
			for (size_t i = 0; i < k; i++) {
				const piece &q = fwd[i];
				size_t n = i + 1 == k ? q.len - tail : q.len;
				if (n)
					ps.push_back({q.local, q.remote, n, q.kind, q.dir, q.cma, q.mr,
						      q.cookie});
			}
		};
		if (tail_first) {
			push_tail();
			push_head();
		} else {
			push_head();
			push_tail();
		}
	}
	return total;
}

} // namespace

[[gnu::hot]] int xfer_segs(pid_t pid, bool same_process, const iovec *local, int nl, const rseg *remote,
	      int nr, xfer_dir dir, bool relaxed, bool local_checked)
{
	// The common message: one local buffer, one segment of a sealed memfd
	// mapped here (relaxed ones in relaxed_copy's order).  What add_pieces
	// and run_pieces would make of it, without building the lists (about
	// a sixth of a 64-byte SEND's instructions).
	if (nl == 1 && nr == 1 && remote[0].kind == seg_kind::mapped_direct && !local_checked &&
	    local[0].iov_len == remote[0].len) {
		// Held as run_pieces holds its pieces (mr_copiers.h): a rereg of
		// the rights or PD keeps the mapping, and waits for this copy.
		mr_copy_guard hold;
		if (remote[0].mr && !hold.take(remote[0].mr, remote[0].mr_cookie))
			return EACCES; // Out of service since its key was resolved
		if (dir == xfer_dir::to_peer)
			relaxed_copy(static_cast<char *>(remote[0].base),
				     static_cast<const char *>(local[0].iov_base),
				     remote[0].len, relaxed);
		else
			memcpy(local[0].iov_base, remote[0].base, remote[0].len);
		service_note(SV_LEASE_DIRECT_USED);
		return 0;
	}
	pieces ps;
	add_pieces(ps, same_process, local, nl, remote, nr, dir, relaxed, local_checked);
	size_t moved;
	bool whole;
	return run_pieces(pid, ps, &moved, &whole);
}

[[gnu::hot]] int xfer_moves(pid_t pid, bool self, const tp_move *ops, size_t n, size_t *done)
{
	size_t i = 0;
	if (n > 1 && !service_forced()) {
		// The pieces of every transfer in one list: the cross-memory-attach
		// pieces of all of them share a system call (per IOV_MAX iovecs).
		pieces ps;
		small_vec<size_t, 16> ends; // ends[k]: the bytes of transfers 0 to k
		size_t total = 0;
		for (size_t k = 0; k < n; k++) {
			const tp_move &m = ops[k];
			total += add_pieces(ps, self && !m.local_checked, m.local, m.nlocal, m.remote,
					    m.nremote, m.dir, m.relaxed, m.local_checked);
			ends.push_back(total);
		}
		size_t moved;
		bool whole;
		int err = run_pieces(pid, ps, &moved, &whole, false);
		if (!err) {
			*done = n;
			return 0;
		}
		// The transfers before the first byte that did not land are done.
		while (i < n && ends[i] <= moved)
			i++;
		// A fault at a known byte (a short count: the kernel copies in
		// order and stops at the first fault) is the transfer's holding
		// it, as it would have been alone.
		if (!whole) {
			*done = i;
			return err;
		}
		// A call that failed as a whole (EPERM: the kernel refuses and the
		// service thread takes over; ESRCH; EFAULT from checking the
		// iovecs) moved nothing, and its errno may be any transfer's in
		// it: those from i run one by one, as they would have unbatched.
	}
	for (; i < n; i++) {
		const tp_move &m = ops[i];
		if (int err = xfer_segs(pid, self && !m.local_checked, m.local, m.nlocal, m.remote,
					m.nremote, m.dir, m.relaxed, m.local_checked)) {
			*done = i;
			return err;
		}
	}
	*done = n;
	return 0;
}

int xfer_mapped_word(uint64_t addr, uint64_t *value, xfer_dir dir)
{
	return checked_self_copy(value, reinterpret_cast<void *>(addr), sizeof(*value), dir);
}

int xfer_word(pid_t pid, bool same_process, uint64_t remote_addr, uint64_t *value, xfer_dir dir)
{
	iovec l{value, sizeof(*value)};
	iovec r{reinterpret_cast<void *>(remote_addr), sizeof(*value)};
	return xfer(pid, same_process, &l, 1, &r, 1, dir);
}

} // namespace loop
