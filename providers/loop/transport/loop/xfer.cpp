// SPDX-License-Identifier: MIT
#include "xfer.h"

#include "service.h"
#include "small_vec.h"
#include "tunables.h"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
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
// thread.  Returns 0 or an errno.
int move(pid_t pid, const iovec *local, size_t nl, const iovec *remote, size_t nr,
	 xfer_dir dir, size_t want)
{
	bool self = pid == getpid();
	if (!service_forced() || self) {
		ssize_t n = dir == xfer_dir::to_peer ? process_vm_writev(pid, local, nl, remote, nr, 0)
						     : process_vm_readv(pid, local, nl, remote, nr, 0);
		if (n >= 0) {
			if (!self)
				service_note(SV_LEASE_CMA_USED);
			return static_cast<size_t>(n) == want ? 0 : EFAULT;
		}
		if (errno != EPERM || self)
			return errno;
		service_note(SV_LEASE_CMA_REFUSED);
	}
	return service_xfer(pid, local, static_cast<int>(nl), remote, static_cast<int>(nr), dir);
}

} // namespace

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
		return move(pid, local, static_cast<size_t>(nl), remote, static_cast<size_t>(nr), dir,
			    want);
	}
	return EINVAL;
}

namespace {

int checked_self_copy(void *local, void *remote, size_t len, xfer_dir dir)
{
	iovec l{local, len};
	iovec r{remote, len};
	ssize_t n = dir == xfer_dir::to_peer ? process_vm_writev(getpid(), &l, 1, &r, 1, 0)
					     : process_vm_readv(getpid(), &l, 1, &r, 1, 0);
	if (n < 0)
		return errno == ESRCH ? EFAULT : errno;
	return static_cast<size_t>(n) == len ? 0 : EFAULT;
}

// One contiguous piece of a transfer: local bytes and where they go.
struct piece {
	char *local;
	char *remote;
	size_t len;
	seg_kind kind;
};

// Runs pieces in the order given: consecutive peer pieces share one
// process_vm_writev/readv call (the kernel copies its iovecs in order).
using pieces = small_vec<piece, 16>;

int run_pieces(pid_t pid, bool same_process, const pieces &ps, xfer_dir dir)
{
	small_vec<iovec, 16> lv, rv;
	size_t want = 0;
	auto flush = [&]() -> int {
		if (lv.empty())
			return 0;
		int err = move(pid, lv.data(), lv.size(), rv.data(), rv.size(), dir, want);
		lv.clear();
		rv.clear();
		want = 0;
		return err;
	};
	lv.clear();
	rv.clear();
	for (const piece &p : ps) {
		if ((p.kind == seg_kind::peer && !same_process) || p.kind == seg_kind::peer_checked) {
			if (lv.size() == IOV_MAX) {
				if (int err = flush())
					return err;
			}
			lv.push_back({p.local, p.len});
			rv.push_back({p.remote, p.len});
			want += p.len;
			continue;
		}
		if (int err = flush())
			return err;
		switch (p.kind) {
		case seg_kind::null:
			if (dir == xfer_dir::from_peer)
				memset(p.local, 0, p.len);
			break;
		case seg_kind::mapped: {
			// A peer's fd-backed object, mapped here: its owner may
			// shrink the file under us, and a plain copy would then
			// die of SIGBUS in this process.  The kernel's copy
			// between two of our own addresses answers EFAULT.
			if (int err = checked_self_copy(p.local, p.remote, p.len, dir))
				return err;
			break;
		}
		default: // peer within this process
			if (dir == xfer_dir::to_peer)
				memmove(p.remote, p.local, p.len);
			else
				memmove(p.local, p.remote, p.len);
			break;
		}
	}
	return flush();
}

} // namespace

int xfer_segs(pid_t pid, bool same_process, const iovec *local, int nl, const rseg *remote,
	      int nr, xfer_dir dir, bool relaxed)
{
	pieces ps;
	int li = 0, ri = 0;
	size_t lo = 0, ro = 0, total = 0;
	while (li < nl && ri < nr) {
		size_t n = std::min(local[li].iov_len - lo, remote[ri].len - ro);
		if (n) {
			ps.push_back({static_cast<char *>(local[li].iov_base) + lo,
				      static_cast<char *>(remote[ri].base) + ro, n, remote[ri].kind});
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
	if (relaxed && dir == xfer_dir::to_peer && total >= kRelaxedMinBytes) {
		// The target allowed any placement order: place the chunks last
		// first.  It costs the same system calls as in-order placement and
		// makes code that wrongly polls the last byte fail here, not on
		// the first NIC that reorders.
		pieces rev;
		for (size_t i = ps.size(); i-- > 0;) {
			const piece &q = ps[i];
			size_t end = q.len;
			while (end) {
				size_t n = end % kRelaxedChunk ? end % kRelaxedChunk : std::min(end, kRelaxedChunk);
				end -= n;
				rev.push_back({q.local + end, q.remote + end, n, q.kind});
			}
		}
		return run_pieces(pid, same_process, rev, dir);
	}
	return run_pieces(pid, same_process, ps, dir);
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
