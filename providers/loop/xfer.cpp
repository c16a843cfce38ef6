// SPDX-License-Identifier: MIT
#include "xfer.h"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>

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
		ssize_t n = dir == xfer_dir::to_peer
				    ? process_vm_writev(pid, local, nl, remote, nr, 0)
				    : process_vm_readv(pid, local, nl, remote, nr, 0);
		if (n < 0)
			return errno;
		return static_cast<size_t>(n) == want ? 0 : EFAULT;
	}
	return EINVAL;
}

int xfer_word(pid_t pid, bool same_process, uint64_t remote_addr, uint64_t *value, xfer_dir dir)
{
	iovec l{value, sizeof(*value)};
	iovec r{reinterpret_cast<void *>(remote_addr), sizeof(*value)};
	return xfer(pid, same_process, &l, 1, &r, 1, dir);
}

} // namespace loop
