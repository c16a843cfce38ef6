// SPDX-License-Identifier: MIT
// rsockets (<rdma/rsocket.h>) are not implemented yet: every call fails
// with ENOSYS, so that a program finds out at once instead of hanging.
// docs/rdmacm.md lists them.
#include <rdma/rsocket.h>

#include <cerrno>
#include <cstdarg>

#define SV_API __attribute__((visibility("default")))

namespace {
int nosys()
{
	errno = ENOSYS;
	return -1;
}
} // namespace

SV_API int rsocket(int, int, int) { return nosys(); }
SV_API int rbind(int, const struct sockaddr *, socklen_t) { return nosys(); }
SV_API int rlisten(int, int) { return nosys(); }
SV_API int raccept(int, struct sockaddr *, socklen_t *) { return nosys(); }
SV_API int rconnect(int, const struct sockaddr *, socklen_t) { return nosys(); }
SV_API int rshutdown(int, int) { return nosys(); }
SV_API int rclose(int) { return nosys(); }
SV_API ssize_t rrecv(int, void *, size_t, int) { return nosys(); }
SV_API ssize_t rrecvfrom(int, void *, size_t, int, struct sockaddr *, socklen_t *) { return nosys(); }
SV_API ssize_t rrecvmsg(int, struct msghdr *, int) { return nosys(); }
SV_API ssize_t rsend(int, const void *, size_t, int) { return nosys(); }
SV_API ssize_t rsendto(int, const void *, size_t, int, const struct sockaddr *, socklen_t) { return nosys(); }
SV_API ssize_t rsendmsg(int, const struct msghdr *, int) { return nosys(); }
SV_API ssize_t rread(int, void *, size_t) { return nosys(); }
SV_API ssize_t rreadv(int, const struct iovec *, int) { return nosys(); }
SV_API ssize_t rwrite(int, const void *, size_t) { return nosys(); }
SV_API ssize_t rwritev(int, const struct iovec *, int) { return nosys(); }
SV_API int rpoll(struct pollfd *, nfds_t, int) { return nosys(); }
SV_API int rselect(int, fd_set *, fd_set *, fd_set *, struct timeval *) { return nosys(); }
SV_API int rgetpeername(int, struct sockaddr *, socklen_t *) { return nosys(); }
SV_API int rgetsockname(int, struct sockaddr *, socklen_t *) { return nosys(); }
SV_API int rsetsockopt(int, int, int, const void *, socklen_t) { return nosys(); }
SV_API int rgetsockopt(int, int, int, void *, socklen_t *) { return nosys(); }
SV_API int rfcntl(int, int, ...) { return nosys(); }
SV_API off_t riomap(int, void *, size_t, int, int, off_t) { return nosys(); }
SV_API int riounmap(int, void *, size_t) { return nosys(); }
SV_API size_t riowrite(int, const void *, size_t, off_t, int)
{
	errno = ENOSYS;
	return 0;
}
