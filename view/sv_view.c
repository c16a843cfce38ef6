// SPDX-License-Identifier: MIT
// libsoftverbs-view.so: the "view" that softverbs-run preloads.
//
// A program run through softverbs-run sees /sys/class/infiniband*,
// /sys/devices/virtual/infiniband* and /dev/infiniband as a host with an RDMA
// device would show them.  softverbs-run renders those trees from the fabric
// registry into a private directory (tools/view_render.cpp) and names it in
// SOFTVERBS_VIEW; this library redirects every libc entry point that takes a
// path under one of those prefixes to the same path under that directory.
// /dev/infiniband/uverbsN is special: stat says it is the character device
// 231:(192+N), and opening it gives an fd on which the kernel commands of
// libibverbs (write, ioctl, read) fail with ENODEV.  See docs/design.md,
// "The view".
//
// Rules this file keeps:
//  - nothing changes unless SOFTVERBS_VIEW names an absolute directory;
//  - a path is only looked at closely when it contains "infiniband" (every
//    emulated prefix does), or is relative and contains ".." or starts with
//    "uverbs"; every other call goes straight to libc;
//  - no allocation, no locks, no stdio in the wrappers: buffers live on the
//    stack, state is atomics, paths of fds come from raw system calls, so the
//    wrappers are safe early in startup, in threads and in signal handlers;
//  - the next definition of each function is looked up with dlsym(RTLD_NEXT)
//    on first use; a call that arrives while that lookup is under way on the
//    same thread (dlsym may call into libc) is served with a raw system call.
// Both open and open64 (and so on) are defined here: no header may rename
// one to the other.
#undef _FILE_OFFSET_BITS
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/uio.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

// uverbs character devices as the kernel numbers them.
#define UVERBS_MAJOR 231
#define UVERBS_MINOR_BASE 192

// ---------------------------------------------------------------------------
// State

static char g_root[PATH_MAX]; // The rendered tree, no trailing slash
static size_t g_rootlen;
static int g_state; // 0 unknown, 1 initialising, 2 on, 3 off

// fds handed out for /dev/infiniband/uverbsN: one bit each, plus the
// device/inode of /dev/null they must still be (a bit left by a close that
// bypassed us, close_range for one, is noticed and dropped).
#define MAX_TRACKED_FD 65536
static unsigned long g_uverbs_fds[MAX_TRACKED_FD / (8 * sizeof(unsigned long))];
static unsigned char g_uverbs_idx[MAX_TRACKED_FD];
static dev_t g_null_dev;
static ino_t g_null_ino;
static int g_null_known;

// Initial-exec: the library is preloaded, so its TLS is in the static block
// and reaching it never allocates.
static __thread int t_resolving __attribute__((tls_model("initial-exec")));

static int view_on(void)
{
	int s = __atomic_load_n(&g_state, __ATOMIC_ACQUIRE);
	if (s == 2)
		return 1;
	if (s == 3)
		return 0;
	int expect = 0;
	if (__atomic_compare_exchange_n(&g_state, &expect, 1, 0, __ATOMIC_ACQ_REL,
					__ATOMIC_ACQUIRE)) {
		const char *v = getenv("SOFTVERBS_VIEW");
		size_t n = v ? strlen(v) : 0;
		while (n > 1 && v[n - 1] == '/')
			n--;
		int on = v && v[0] == '/' && n > 1 && n < sizeof(g_root) - 256;
		if (on) {
			memcpy(g_root, v, n);
			g_root[n] = 0;
			g_rootlen = n;
		}
		__atomic_store_n(&g_state, on ? 2 : 3, __ATOMIC_RELEASE);
		return on;
	}
	// Another thread is reading the environment: a few loads at most.
	while ((s = __atomic_load_n(&g_state, __ATOMIC_ACQUIRE)) == 1)
		;
	return s == 2;
}

__attribute__((constructor)) static void view_init(void)
{
	view_on();
}

// ---------------------------------------------------------------------------
// The next definitions

static void *next_sym(void **slot, const char *name)
{
	void *p = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
	if (p)
		return p;
	if (t_resolving)
		return NULL;
	t_resolving = 1;
	p = dlsym(RTLD_NEXT, name);
	t_resolving = 0;
	if (p)
		__atomic_store_n(slot, p, __ATOMIC_RELEASE);
	return p;
}

#define NEXT(name, ...)                                                                     \
	typedef __typeof__(__VA_ARGS__) name##_fn;                                          \
	static void *next_##name##_slot;                                                    \
	static name##_fn next_##name(void)                                                  \
	{                                                                                   \
		return (name##_fn)next_sym(&next_##name##_slot, #name);                     \
	}

// ---------------------------------------------------------------------------
// Path mapping

static const char *const k_prefixes[] = {
	"/sys/class/infiniband",
	"/sys/class/infiniband_verbs",
	"/sys/class/infiniband_mad",
	"/sys/devices/virtual/infiniband",
	"/sys/devices/virtual/infiniband_verbs",
	"/sys/devices/virtual/infiniband_hca",
	"/dev/infiniband",
};

enum { M_PASS, M_MAPPED, M_UVERBS };

static int worth_a_look(const char *path)
{
	if (!path || !path[0] || !view_on())
		return 0;
	if (strstr(path, "infiniband"))
		return 1;
	if (path[0] == '/')
		return 0;
	return strstr(path, "..") != NULL || strncmp(path, "uverbs", 6) == 0;
}

static int in_prefix(const char *p, size_t len)
{
	for (size_t i = 0; i < sizeof(k_prefixes) / sizeof(k_prefixes[0]); i++) {
		size_t n = strlen(k_prefixes[i]);
		if (len >= n && strncmp(p, k_prefixes[i], n) == 0 && (len == n || p[n] == '/'))
			return 1;
	}
	return 0;
}

// Collapses "//", "." and ".." in an absolute path, in place (lexically: a
// ".." after a symbolic link is taken textually).  Returns whether the walk
// passed through an emulated directory (/sys/class/infiniband/.. must be
// /sys/class even where the host has no /sys/class/infiniband).
static int normalize(char *p)
{
	int passed = 0;
	char *out = p; // Next write position; p[0] == '/'
	const char *in = p;
	size_t len = 0;
	while (*in) {
		while (*in == '/')
			in++;
		if (!*in)
			break;
		const char *end = in;
		while (*end && *end != '/')
			end++;
		size_t n = (size_t)(end - in);
		if (n == 1 && in[0] == '.') {
			// nothing
		} else if (n == 2 && in[0] == '.' && in[1] == '.') {
			passed |= in_prefix(out, len);
			while (len > 0 && out[len - 1] != '/')
				len--;
			if (len > 0)
				len--; // The slash before the dropped component
		} else {
			out[len++] = '/';
			memmove(out + len, in, n);
			len += n;
		}
		in = end;
	}
	if (len == 0)
		out[len++] = '/';
	out[len] = 0;
	return passed;
}

static size_t put_uint(char *b, unsigned v)
{
	char t[16];
	size_t n = 0;
	do {
		t[n++] = (char)('0' + v % 10);
		v /= 10;
	} while (v);
	for (size_t i = 0; i < n; i++)
		b[i] = t[n - 1 - i];
	b[n] = 0;
	return n;
}

// The absolute path of fd, from /proc; -1 when there is none.
static long fd_path(int fd, char *buf, size_t size)
{
	char link[32] = "/proc/self/fd/";
	if (fd < 0)
		return -1;
	put_uint(link + 14, (unsigned)fd);
	long r = syscall(SYS_readlinkat, AT_FDCWD, link, buf, size - 1);
	if (r <= 0 || buf[0] != '/')
		return -1;
	buf[r] = 0;
	return r;
}

// Maps (dirfd, path) to what libc should be given.  M_PASS: the original
// arguments, untouched.  M_MAPPED: out holds an absolute path to use instead
// (under the view, or the real path a ".." out of the view led to).
// M_UVERBS: out is the placeholder of /dev/infiniband/uverbs<*idx>.
static int view_map(int dirfd, const char *path, char *out, unsigned *idx)
{
	char v[PATH_MAX];
	size_t plen = strlen(path);
	size_t blen = 0;
	if (path[0] != '/') {
		long r;
		if (dirfd == AT_FDCWD)
			r = syscall(SYS_getcwd, v, sizeof(v)) > 0 ? (long)strlen(v) : -1;
		else
			r = fd_path(dirfd, v, sizeof(v));
		if (r <= 0 || v[0] != '/')
			return M_PASS;
		blen = (size_t)r;
		v[blen++] = '/';
	}
	if (blen + plen + 1 > sizeof(v))
		return M_PASS;
	memcpy(v + blen, path, plen + 1);
	int trailing = path[plen - 1] == '/';

	// A path inside the rendered tree stands for the path it renders.
	int from_view = 0;
	if (strncmp(v, g_root, g_rootlen) == 0 && (v[g_rootlen] == '/' || !v[g_rootlen])) {
		memmove(v, v + g_rootlen, strlen(v + g_rootlen) + 1);
		if (!v[0])
			strcpy(v, "/");
		from_view = 1;
	}
	int passed = normalize(v);
	size_t vlen = strlen(v);

	int hit = in_prefix(v, vlen);
	if (!hit) {
		// A real path; given normalized when the kernel could not walk
		// the original (it went through the view, or came from it).
		if (!from_view && !passed)
			return M_PASS;
		if (vlen + 2 > PATH_MAX)
			return M_PASS;
		memcpy(out, v, vlen + 1);
		if (trailing && vlen > 1)
			strcpy(out + vlen, "/");
		return M_MAPPED;
	}
	if (g_rootlen + vlen + 2 > PATH_MAX)
		return M_PASS;
	memcpy(out, g_root, g_rootlen);
	memcpy(out + g_rootlen, v, vlen + 1);
	if (trailing)
		strcpy(out + g_rootlen + vlen, "/");
	static const char uv[] = "/dev/infiniband/uverbs";
	if (strncmp(v, uv, sizeof(uv) - 1) == 0) {
		const char *d = v + sizeof(uv) - 1;
		unsigned n = 0;
		int digits = 0;
		while (*d >= '0' && *d <= '9' && digits < 4) {
			n = n * 10 + (unsigned)(*d - '0');
			d++;
			digits++;
		}
		if (digits && !*d && n < 64) {
			*idx = n;
			return M_UVERBS;
		}
	}
	return M_MAPPED;
}

// A path inside the rendered tree, as the program should see it; in place.
static void unmap_result(char *p)
{
	if (__atomic_load_n(&g_state, __ATOMIC_ACQUIRE) != 2)
		return;
	if (strncmp(p, g_root, g_rootlen) == 0 && (p[g_rootlen] == '/' || !p[g_rootlen])) {
		memmove(p, p + g_rootlen, strlen(p + g_rootlen) + 1);
		if (!p[0])
			strcpy(p, "/");
	}
}

// ---------------------------------------------------------------------------
// uverbs fds

static int null_id(dev_t *dev, ino_t *ino)
{
	if (!__atomic_load_n(&g_null_known, __ATOMIC_ACQUIRE)) {
		struct stat st;
		if (syscall(SYS_newfstatat, AT_FDCWD, "/dev/null", &st, 0) != 0)
			return -1;
		g_null_dev = st.st_rdev;
		g_null_ino = st.st_ino;
		__atomic_store_n(&g_null_known, 1, __ATOMIC_RELEASE);
	}
	*dev = g_null_dev;
	*ino = g_null_ino;
	return 0;
}

static void mark_uverbs(int fd, unsigned idx)
{
	if (fd < 0 || fd >= MAX_TRACKED_FD)
		return;
	g_uverbs_idx[fd] = (unsigned char)idx;
	__atomic_fetch_or(&g_uverbs_fds[fd / (8 * sizeof(unsigned long))],
			  1UL << (fd % (8 * sizeof(unsigned long))), __ATOMIC_RELEASE);
}

static void unmark(int fd)
{
	if (fd < 0 || fd >= MAX_TRACKED_FD)
		return;
	unsigned long bit = 1UL << (fd % (8 * sizeof(unsigned long)));
	unsigned long *w = &g_uverbs_fds[fd / (8 * sizeof(unsigned long))];
	if (__atomic_load_n(w, __ATOMIC_RELAXED) & bit)
		__atomic_fetch_and(w, ~bit, __ATOMIC_RELEASE);
}

// Whether fd is one of our uverbs fds (and still the /dev/null we opened).
static int is_uverbs(int fd)
{
	if (fd < 0 || fd >= MAX_TRACKED_FD)
		return 0;
	unsigned long bit = 1UL << (fd % (8 * sizeof(unsigned long)));
	if (!(__atomic_load_n(&g_uverbs_fds[fd / (8 * sizeof(unsigned long))], __ATOMIC_ACQUIRE) &
	      bit))
		return 0;
	struct stat st;
	dev_t d;
	ino_t i;
	if (syscall(SYS_fstat, fd, &st) != 0 || null_id(&d, &i) != 0 || !S_ISCHR(st.st_mode) ||
	    st.st_rdev != d || st.st_ino != i) {
		unmark(fd);
		return 0;
	}
	return 1;
}

static void fake_uverbs_stat(struct stat *st, unsigned idx)
{
	st->st_mode = S_IFCHR | 0666;
	st->st_rdev = makedev(UVERBS_MAJOR, UVERBS_MINOR_BASE + idx);
	st->st_size = 0;
	st->st_blocks = 0;
	st->st_nlink = 1;
}

static void fake_uverbs_statx(struct statx *st, unsigned idx)
{
	st->stx_mode = S_IFCHR | 0666;
	st->stx_rdev_major = UVERBS_MAJOR;
	st->stx_rdev_minor = UVERBS_MINOR_BASE + idx;
	st->stx_size = 0;
	st->stx_blocks = 0;
	st->stx_nlink = 1;
}

// Opens the stand-in for /dev/infiniband/uverbsN whose placeholder is
// `placeholder`: an fd of /dev/null, marked.
static int open_uverbs(const char *placeholder, int flags, unsigned idx)
{
	struct stat st;
	if (syscall(SYS_newfstatat, AT_FDCWD, placeholder, &st, 0) != 0)
		return -1; // errno from the kernel: ENOENT for a device not rendered
	if ((flags & O_CREAT) && (flags & O_EXCL)) {
		errno = EEXIST;
		return -1;
	}
	if (flags & O_DIRECTORY) {
		errno = ENOTDIR;
		return -1;
	}
	int keep = flags & (O_ACCMODE | O_CLOEXEC | O_NONBLOCK);
	int fd = (int)syscall(SYS_openat, AT_FDCWD, "/dev/null", keep);
	if (fd < 0)
		return -1;
	if (fd >= MAX_TRACKED_FD) {
		syscall(SYS_close, fd);
		errno = EMFILE;
		return -1;
	}
	mark_uverbs(fd, idx);
	return fd;
}

static int wants_write(int flags)
{
	return (flags & O_ACCMODE) != O_RDONLY || (flags & (O_CREAT | O_TRUNC));
}

// Opening a view path for writing fails as sysfs would for a user: ENOENT
// for what does not exist (unless it would be created: EACCES), EISDIR for a
// directory, EACCES for an attribute (every one is read-only).
static int refuse_write(const char *out, int flags)
{
	struct stat st;
	if (syscall(SYS_newfstatat, AT_FDCWD, out, &st, 0) != 0) {
		if (errno == ENOENT && (flags & O_CREAT))
			errno = EACCES;
		return -1;
	}
	errno = S_ISDIR(st.st_mode) ? EISDIR : EACCES;
	return -1;
}

// ---------------------------------------------------------------------------
// open and friends

NEXT(open, int (*)(const char *, int, ...))
NEXT(open64, int (*)(const char *, int, ...))
NEXT(openat, int (*)(int, const char *, int, ...))
NEXT(openat64, int (*)(int, const char *, int, ...))
NEXT(__open_2, int (*)(const char *, int))
NEXT(__open64_2, int (*)(const char *, int))
NEXT(__openat_2, int (*)(int, const char *, int))
NEXT(__openat64_2, int (*)(int, const char *, int))

// One place for every open: returns -2 when the caller should call libc
// with its own arguments, else the result (and errno).
static int view_open(int dirfd, const char *path, int flags, mode_t mode, int *done)
{
	char out[PATH_MAX];
	unsigned idx = 0;
	*done = 0;
	if (!worth_a_look(path))
		return -1;
	int m = view_map(dirfd, path, out, &idx);
	if (m == M_PASS)
		return -1;
	*done = 1;
	if (m == M_UVERBS)
		return open_uverbs(out, flags, idx);
	if (strncmp(out, g_root, g_rootlen) == 0 && wants_write(flags))
		return refuse_write(out, flags);
	return (int)syscall(SYS_openat, AT_FDCWD, out, flags, mode);
}

static mode_t mode_arg(int flags, va_list ap)
{
	if (flags & (O_CREAT | __O_TMPFILE))
		return (mode_t)va_arg(ap, int);
	return 0;
}

#define OPEN_WRAPPER(name)                                                                  \
	EXPORT int name(const char *path, int flags, ...)                                   \
	{                                                                                   \
		va_list ap;                                                                 \
		va_start(ap, flags);                                                        \
		mode_t mode = mode_arg(flags, ap);                                          \
		va_end(ap);                                                                 \
		int done;                                                                   \
		int r = view_open(AT_FDCWD, path, flags, mode, &done);                      \
		if (done)                                                                   \
			return r;                                                           \
		int (*f)(const char *, int, ...) = next_##name();                           \
		if (!f)                                                                     \
			return (int)syscall(SYS_openat, AT_FDCWD, path, flags, mode);       \
		return f(path, flags, mode);                                                \
	}

#define OPENAT_WRAPPER(name)                                                                \
	EXPORT int name(int dirfd, const char *path, int flags, ...)                        \
	{                                                                                   \
		va_list ap;                                                                 \
		va_start(ap, flags);                                                        \
		mode_t mode = mode_arg(flags, ap);                                          \
		va_end(ap);                                                                 \
		int done;                                                                   \
		int r = view_open(dirfd, path, flags, mode, &done);                         \
		if (done)                                                                   \
			return r;                                                           \
		int (*f)(int, const char *, int, ...) = next_##name();                      \
		if (!f)                                                                     \
			return (int)syscall(SYS_openat, dirfd, path, flags, mode);          \
		return f(dirfd, path, flags, mode);                                         \
	}

OPEN_WRAPPER(open)
OPEN_WRAPPER(open64)
OPENAT_WRAPPER(openat)
OPENAT_WRAPPER(openat64)

#define OPEN2_WRAPPER(name)                                                                 \
	EXPORT int name(const char *path, int flags)                                        \
	{                                                                                   \
		int done;                                                                   \
		int r = view_open(AT_FDCWD, path, flags, 0, &done);                         \
		if (done)                                                                   \
			return r;                                                           \
		int (*f)(const char *, int) = next_##name();                                \
		if (!f)                                                                     \
			return (int)syscall(SYS_openat, AT_FDCWD, path, flags, 0);          \
		return f(path, flags);                                                      \
	}
#define OPENAT2_WRAPPER(name)                                                               \
	EXPORT int name(int dirfd, const char *path, int flags)                             \
	{                                                                                   \
		int done;                                                                   \
		int r = view_open(dirfd, path, flags, 0, &done);                            \
		if (done)                                                                   \
			return r;                                                           \
		int (*f)(int, const char *, int) = next_##name();                           \
		if (!f)                                                                     \
			return (int)syscall(SYS_openat, dirfd, path, flags, 0);             \
		return f(dirfd, path, flags);                                               \
	}
OPEN2_WRAPPER(__open_2)
OPEN2_WRAPPER(__open64_2)
OPENAT2_WRAPPER(__openat_2)
OPENAT2_WRAPPER(__openat64_2)

NEXT(creat, int (*)(const char *, mode_t))
NEXT(creat64, int (*)(const char *, mode_t))

EXPORT int creat(const char *path, mode_t mode)
{
	int done;
	int r = view_open(AT_FDCWD, path, O_CREAT | O_WRONLY | O_TRUNC, mode, &done);
	if (done)
		return r;
	int (*f)(const char *, mode_t) = next_creat();
	return f ? f(path, mode)
		 : (int)syscall(SYS_openat, AT_FDCWD, path, O_CREAT | O_WRONLY | O_TRUNC, mode);
}

EXPORT int creat64(const char *path, mode_t mode)
{
	int done;
	int r = view_open(AT_FDCWD, path, O_CREAT | O_WRONLY | O_TRUNC, mode, &done);
	if (done)
		return r;
	int (*f)(const char *, mode_t) = next_creat64();
	return f ? f(path, mode)
		 : (int)syscall(SYS_openat, AT_FDCWD, path, O_CREAT | O_WRONLY | O_TRUNC, mode);
}

// fopen's mode string as open flags (what glibc does with it).
static int fopen_flags(const char *mode)
{
	int flags;
	switch (mode[0]) {
	case 'r': flags = O_RDONLY; break;
	case 'w': flags = O_WRONLY | O_CREAT | O_TRUNC; break;
	case 'a': flags = O_WRONLY | O_CREAT | O_APPEND; break;
	default: return -1;
	}
	for (const char *c = mode + 1; *c && *c != ','; c++) {
		if (*c == '+')
			flags = (flags & ~O_ACCMODE) | O_RDWR;
		else if (*c == 'x')
			flags |= O_EXCL;
		else if (*c == 'e')
			flags |= O_CLOEXEC;
	}
	return flags;
}

NEXT(fopen, FILE *(*)(const char *, const char *))
NEXT(fopen64, FILE *(*)(const char *, const char *))
NEXT(freopen, FILE *(*)(const char *, const char *, FILE *))
NEXT(freopen64, FILE *(*)(const char *, const char *, FILE *))

// NULL with *done == 0: call libc with the caller's path; else the result.
static FILE *view_fopen(const char *path, const char *mode, FILE *(*next)(const char *, const char *),
			int *done)
{
	char out[PATH_MAX];
	unsigned idx = 0;
	*done = 0;
	if (!worth_a_look(path) || !mode)
		return NULL;
	int m = view_map(AT_FDCWD, path, out, &idx);
	if (m == M_PASS)
		return NULL;
	*done = 1;
	int flags = fopen_flags(mode);
	if (flags < 0) {
		errno = EINVAL;
		return NULL;
	}
	if (m == M_UVERBS) {
		int fd = open_uverbs(out, flags, idx);
		if (fd < 0)
			return NULL;
		FILE *f = fdopen(fd, mode);
		if (!f) {
			int e = errno;
			unmark(fd);
			syscall(SYS_close, fd);
			errno = e;
		}
		return f;
	}
	if (strncmp(out, g_root, g_rootlen) == 0 && wants_write(flags)) {
		refuse_write(out, flags);
		return NULL;
	}
	if (!next) {
		errno = ENOSYS;
		return NULL;
	}
	return next(out, mode);
}

EXPORT FILE *fopen(const char *path, const char *mode)
{
	int done;
	FILE *f = view_fopen(path, mode, next_fopen(), &done);
	if (done)
		return f;
	FILE *(*n)(const char *, const char *) = next_fopen();
	if (!n) {
		errno = ENOSYS;
		return NULL;
	}
	return n(path, mode);
}

EXPORT FILE *fopen64(const char *path, const char *mode)
{
	int done;
	FILE *f = view_fopen(path, mode, next_fopen64(), &done);
	if (done)
		return f;
	FILE *(*n)(const char *, const char *) = next_fopen64();
	if (!n) {
		errno = ENOSYS;
		return NULL;
	}
	return n(path, mode);
}

static FILE *view_freopen(const char *path, const char *mode, FILE *stream,
			  FILE *(*next)(const char *, const char *, FILE *))
{
	char out[PATH_MAX];
	unsigned idx = 0;
	if (!next) {
		errno = ENOSYS;
		return NULL;
	}
	if (worth_a_look(path) && mode) {
		int m = view_map(AT_FDCWD, path, out, &idx);
		if (m == M_UVERBS) {
			errno = ENODEV; // A stream on a verbs device: nothing to read
			return NULL;
		}
		if (m == M_MAPPED) {
			int flags = fopen_flags(mode);
			if (flags >= 0 && strncmp(out, g_root, g_rootlen) == 0 &&
			    wants_write(flags)) {
				refuse_write(out, flags);
				return NULL;
			}
			return next(out, mode, stream);
		}
	}
	return next(path, mode, stream);
}

EXPORT FILE *freopen(const char *path, const char *mode, FILE *stream)
{
	return view_freopen(path, mode, stream, next_freopen());
}

EXPORT FILE *freopen64(const char *path, const char *mode, FILE *stream)
{
	return view_freopen(path, mode, stream, next_freopen64());
}

// ---------------------------------------------------------------------------
// Directories

NEXT(opendir, DIR *(*)(const char *))

EXPORT DIR *opendir(const char *path)
{
	char out[PATH_MAX];
	unsigned idx = 0;
	DIR *(*n)(const char *) = next_opendir();
	if (!n) {
		errno = ENOSYS;
		return NULL;
	}
	if (worth_a_look(path)) {
		int m = view_map(AT_FDCWD, path, out, &idx);
		if (m == M_UVERBS) {
			errno = ENOTDIR;
			return NULL;
		}
		if (m == M_MAPPED)
			return n(out);
	}
	return n(path);
}

typedef int (*scan_filter)(const struct dirent *);
typedef int (*scan_cmp)(const struct dirent **, const struct dirent **);
typedef int (*scan_filter64)(const struct dirent64 *);
typedef int (*scan_cmp64)(const struct dirent64 **, const struct dirent64 **);

NEXT(scandir, int (*)(const char *, struct dirent ***, scan_filter, scan_cmp))
NEXT(scandir64, int (*)(const char *, struct dirent64 ***, scan_filter64, scan_cmp64))
NEXT(scandirat, int (*)(int, const char *, struct dirent ***, scan_filter, scan_cmp))
NEXT(scandirat64, int (*)(int, const char *, struct dirent64 ***, scan_filter64, scan_cmp64))

// The path a directory call should use: path itself (M_PASS), out, or an
// error (returns -1 with errno).
static int dir_path(int dirfd, const char *path, char *out, const char **use)
{
	unsigned idx = 0;
	*use = path;
	if (!worth_a_look(path))
		return 0;
	int m = view_map(dirfd, path, out, &idx);
	if (m == M_UVERBS) {
		errno = ENOTDIR;
		return -1;
	}
	if (m == M_MAPPED)
		*use = out;
	return m == M_MAPPED;
}

EXPORT int scandir(const char *path, struct dirent ***list, scan_filter sel, scan_cmp cmp)
{
	char out[PATH_MAX];
	const char *use;
	if (dir_path(AT_FDCWD, path, out, &use) < 0)
		return -1;
	int (*n)(const char *, struct dirent ***, scan_filter, scan_cmp) = next_scandir();
	if (!n) {
		errno = ENOSYS;
		return -1;
	}
	return n(use, list, sel, cmp);
}

EXPORT int scandir64(const char *path, struct dirent64 ***list, scan_filter64 sel, scan_cmp64 cmp)
{
	char out[PATH_MAX];
	const char *use;
	if (dir_path(AT_FDCWD, path, out, &use) < 0)
		return -1;
	int (*n)(const char *, struct dirent64 ***, scan_filter64, scan_cmp64) = next_scandir64();
	if (!n) {
		errno = ENOSYS;
		return -1;
	}
	return n(use, list, sel, cmp);
}

EXPORT int scandirat(int dirfd, const char *path, struct dirent ***list, scan_filter sel,
		     scan_cmp cmp)
{
	char out[PATH_MAX];
	const char *use;
	int m = dir_path(dirfd, path, out, &use);
	if (m < 0)
		return -1;
	int (*n)(int, const char *, struct dirent ***, scan_filter, scan_cmp) = next_scandirat();
	if (!n) {
		errno = ENOSYS;
		return -1;
	}
	return n(m ? AT_FDCWD : dirfd, use, list, sel, cmp);
}

EXPORT int scandirat64(int dirfd, const char *path, struct dirent64 ***list, scan_filter64 sel,
		       scan_cmp64 cmp)
{
	char out[PATH_MAX];
	const char *use;
	int m = dir_path(dirfd, path, out, &use);
	if (m < 0)
		return -1;
	int (*n)(int, const char *, struct dirent64 ***, scan_filter64, scan_cmp64) =
		next_scandirat64();
	if (!n) {
		errno = ENOSYS;
		return -1;
	}
	return n(m ? AT_FDCWD : dirfd, use, list, sel, cmp);
}

NEXT(chdir, int (*)(const char *))

EXPORT int chdir(const char *path)
{
	char out[PATH_MAX];
	const char *use;
	if (dir_path(AT_FDCWD, path, out, &use) < 0)
		return -1;
	int (*n)(const char *) = next_chdir();
	if (!n)
		return (int)syscall(SYS_chdir, use);
	return n(use);
}

NEXT(getcwd, char *(*)(char *, size_t))

EXPORT char *getcwd(char *buf, size_t size)
{
	char *(*n)(char *, size_t) = next_getcwd();
	if (!n) {
		errno = ENOSYS;
		return NULL;
	}
	char *r = n(buf, size);
	if (r && view_on())
		unmap_result(r);
	return r;
}

NEXT(__getcwd_chk, char *(*)(char *, size_t, size_t))

EXPORT char *__getcwd_chk(char *buf, size_t size, size_t buflen)
{
	char *(*n)(char *, size_t, size_t) = next___getcwd_chk();
	if (!n) {
		errno = ENOSYS;
		return NULL;
	}
	char *r = n(buf, size, buflen);
	if (r && view_on())
		unmap_result(r);
	return r;
}

// ---------------------------------------------------------------------------
// stat family

// Stats (dirfd, path) the view's way when it is a view path: returns 1 with
// the result in *ret (and errno), 0 when libc should be called as is.
static int view_stat(int dirfd, const char *path, struct stat *st, int flags, int *ret)
{
	char out[PATH_MAX];
	unsigned idx = 0;
	if (!worth_a_look(path))
		return 0;
	int m = view_map(dirfd, path, out, &idx);
	if (m == M_PASS)
		return 0;
	*ret = (int)syscall(SYS_newfstatat, AT_FDCWD, out, st, flags & AT_SYMLINK_NOFOLLOW);
	if (*ret == 0 && m == M_UVERBS)
		fake_uverbs_stat(st, idx);
	return 1;
}

// fstatat(fd, "", AT_EMPTY_PATH) and fstat on a uverbs fd.
static int uverbs_fd_stat(int fd, struct stat *st)
{
	if (!is_uverbs(fd))
		return 0;
	if (syscall(SYS_fstat, fd, st) != 0)
		return -1;
	fake_uverbs_stat(st, g_uverbs_idx[fd]);
	return 1;
}

NEXT(stat, int (*)(const char *, struct stat *))
NEXT(stat64, int (*)(const char *, struct stat *))
NEXT(lstat, int (*)(const char *, struct stat *))
NEXT(lstat64, int (*)(const char *, struct stat *))
NEXT(fstatat, int (*)(int, const char *, struct stat *, int))
NEXT(fstatat64, int (*)(int, const char *, struct stat *, int))
NEXT(__xstat, int (*)(int, const char *, struct stat *))
NEXT(__xstat64, int (*)(int, const char *, struct stat *))
NEXT(__lxstat, int (*)(int, const char *, struct stat *))
NEXT(__lxstat64, int (*)(int, const char *, struct stat *))
NEXT(__fxstatat, int (*)(int, int, const char *, struct stat *, int))
NEXT(__fxstatat64, int (*)(int, int, const char *, struct stat *, int))
NEXT(fstat, int (*)(int, struct stat *))
NEXT(fstat64, int (*)(int, struct stat *))
NEXT(__fxstat, int (*)(int, int, struct stat *))
NEXT(__fxstat64, int (*)(int, int, struct stat *))

#define STAT_WRAPPER(name, nofollow, ST)                                                        \
	EXPORT int name(const char *path, ST *st0)                                  \
	{                                                                                   \
		struct stat *st = (struct stat *)st0; \
		int r;                                                                      \
		if (view_stat(AT_FDCWD, path, st, nofollow, &r))                            \
			return r;                                                           \
		int (*n)(const char *, struct stat *) = next_##name();                      \
		if (!n)                                                                     \
			return (int)syscall(SYS_newfstatat, AT_FDCWD, path, st, nofollow);  \
		return n(path, st);                                                         \
	}
STAT_WRAPPER(stat, 0, struct stat)
STAT_WRAPPER(stat64, 0, struct stat64)
STAT_WRAPPER(lstat, AT_SYMLINK_NOFOLLOW, struct stat)
STAT_WRAPPER(lstat64, AT_SYMLINK_NOFOLLOW, struct stat64)

#define XSTAT_WRAPPER(name, nofollow, ST)                                                       \
	EXPORT int name(int ver, const char *path, ST *st0)                                  \
	{                                                                                   \
		struct stat *st = (struct stat *)st0; \
		int r;                                                                      \
		if (view_stat(AT_FDCWD, path, st, nofollow, &r))                            \
			return r;                                                           \
		int (*n)(int, const char *, struct stat *) = next_##name();                 \
		if (!n)                                                                     \
			return (int)syscall(SYS_newfstatat, AT_FDCWD, path, st, nofollow);  \
		return n(ver, path, st);                                                    \
	}
XSTAT_WRAPPER(__xstat, 0, struct stat)
XSTAT_WRAPPER(__xstat64, 0, struct stat64)
XSTAT_WRAPPER(__lxstat, AT_SYMLINK_NOFOLLOW, struct stat)
XSTAT_WRAPPER(__lxstat64, AT_SYMLINK_NOFOLLOW, struct stat64)

#define FSTATAT_WRAPPER(name, ST)                                                               \
	EXPORT int name(int dirfd, const char *path, ST *st0, int flags)                                  \
	{                                                                                   \
		struct stat *st = (struct stat *)st0; \
		int r;                                                                      \
		if (path && !path[0] && (flags & AT_EMPTY_PATH) &&                          \
		    (r = uverbs_fd_stat(dirfd, st)) != 0)                                   \
			return r < 0 ? -1 : 0;                                              \
		if (view_stat(dirfd, path, st, flags, &r))                                  \
			return r;                                                           \
		int (*n)(int, const char *, struct stat *, int) = next_##name();            \
		if (!n)                                                                     \
			return (int)syscall(SYS_newfstatat, dirfd, path, st, flags);        \
		return n(dirfd, path, st, flags);                                           \
	}
FSTATAT_WRAPPER(fstatat, struct stat)
FSTATAT_WRAPPER(fstatat64, struct stat64)

#define FXSTATAT_WRAPPER(name, ST)                                                              \
	EXPORT int name(int ver, int dirfd, const char *path, ST *st0, int flags)                                  \
	{                                                                                   \
		struct stat *st = (struct stat *)st0; \
		int r;                                                                      \
		if (path && !path[0] && (flags & AT_EMPTY_PATH) &&                          \
		    (r = uverbs_fd_stat(dirfd, st)) != 0)                                   \
			return r < 0 ? -1 : 0;                                              \
		if (view_stat(dirfd, path, st, flags, &r))                                  \
			return r;                                                           \
		int (*n)(int, int, const char *, struct stat *, int) = next_##name();       \
		if (!n)                                                                     \
			return (int)syscall(SYS_newfstatat, dirfd, path, st, flags);        \
		return n(ver, dirfd, path, st, flags);                                      \
	}
FXSTATAT_WRAPPER(__fxstatat, struct stat)
FXSTATAT_WRAPPER(__fxstatat64, struct stat64)

#define FSTAT_WRAPPER(name, ST)                                                                 \
	EXPORT int name(int fd, ST *st0)                                  \
	{                                                                                   \
		struct stat *st = (struct stat *)st0; \
		int r = uverbs_fd_stat(fd, st);                                             \
		if (r)                                                                      \
			return r < 0 ? -1 : 0;                                              \
		int (*n)(int, struct stat *) = next_##name();                               \
		if (!n)                                                                     \
			return (int)syscall(SYS_fstat, fd, st);                             \
		return n(fd, st);                                                           \
	}
FSTAT_WRAPPER(fstat, struct stat)
FSTAT_WRAPPER(fstat64, struct stat64)

#define FXSTAT_WRAPPER(name, ST)                                                                \
	EXPORT int name(int ver, int fd, ST *st0)                                  \
	{                                                                                   \
		struct stat *st = (struct stat *)st0; \
		int r = uverbs_fd_stat(fd, st);                                             \
		if (r)                                                                      \
			return r < 0 ? -1 : 0;                                              \
		int (*n)(int, int, struct stat *) = next_##name();                          \
		if (!n)                                                                     \
			return (int)syscall(SYS_fstat, fd, st);                             \
		return n(ver, fd, st);                                                      \
	}
FXSTAT_WRAPPER(__fxstat, struct stat)
FXSTAT_WRAPPER(__fxstat64, struct stat64)

NEXT(statx, int (*)(int, const char *, int, unsigned, struct statx *))

EXPORT int statx(int dirfd, const char *path, int flags, unsigned mask, struct statx *st)
{
	char out[PATH_MAX];
	unsigned idx = 0;
	int r;
	if (path && !path[0] && (flags & AT_EMPTY_PATH) && is_uverbs(dirfd)) {
		r = (int)syscall(SYS_statx, dirfd, path, flags, mask, st);
		if (r == 0)
			fake_uverbs_statx(st, g_uverbs_idx[dirfd]);
		return r;
	}
	if (worth_a_look(path)) {
		int m = view_map(dirfd, path, out, &idx);
		if (m != M_PASS) {
			r = (int)syscall(SYS_statx, AT_FDCWD, out, flags & ~AT_EMPTY_PATH, mask, st);
			if (r == 0 && m == M_UVERBS)
				fake_uverbs_statx(st, idx);
			return r;
		}
	}
	int (*n)(int, const char *, int, unsigned, struct statx *) = next_statx();
	if (!n)
		return (int)syscall(SYS_statx, dirfd, path, flags, mask, st);
	return n(dirfd, path, flags, mask, st);
}

// ---------------------------------------------------------------------------
// access

static int view_access(int dirfd, const char *path, int mode, int flags, int *ret)
{
	char out[PATH_MAX];
	unsigned idx = 0;
	if (!worth_a_look(path))
		return 0;
	int m = view_map(dirfd, path, out, &idx);
	if (m == M_PASS)
		return 0;
	if (m == M_MAPPED && strncmp(out, g_root, g_rootlen) == 0 && (mode & W_OK)) {
		// Read-only attributes, as sysfs's are (uverbs placeholders are 0666).
		struct stat st;
		*ret = (int)syscall(SYS_newfstatat, AT_FDCWD, out, &st, 0);
		if (*ret == 0) {
			errno = EACCES;
			*ret = -1;
		}
		return 1;
	}
	*ret = (int)syscall(SYS_faccessat, AT_FDCWD, out, mode, flags);
	return 1;
}

NEXT(access, int (*)(const char *, int))
NEXT(faccessat, int (*)(int, const char *, int, int))
NEXT(euidaccess, int (*)(const char *, int))
NEXT(eaccess, int (*)(const char *, int))

EXPORT int access(const char *path, int mode)
{
	int r;
	if (view_access(AT_FDCWD, path, mode, 0, &r))
		return r;
	int (*n)(const char *, int) = next_access();
	return n ? n(path, mode) : (int)syscall(SYS_faccessat, AT_FDCWD, path, mode, 0);
}

EXPORT int faccessat(int dirfd, const char *path, int mode, int flags)
{
	int r;
	// The kernel's faccessat has no flags; AT_EACCESS only matters for
	// set-id programs, which never run with LD_PRELOAD.
	if (view_access(dirfd, path, mode, 0, &r))
		return r;
	int (*n)(int, const char *, int, int) = next_faccessat();
	return n ? n(dirfd, path, mode, flags) : (int)syscall(SYS_faccessat, dirfd, path, mode, 0);
}

EXPORT int euidaccess(const char *path, int mode)
{
	int r;
	if (view_access(AT_FDCWD, path, mode, 0, &r))
		return r;
	int (*n)(const char *, int) = next_euidaccess();
	return n ? n(path, mode) : (int)syscall(SYS_faccessat, AT_FDCWD, path, mode, 0);
}

EXPORT int eaccess(const char *path, int mode)
{
	int r;
	if (view_access(AT_FDCWD, path, mode, 0, &r))
		return r;
	int (*n)(const char *, int) = next_eaccess();
	return n ? n(path, mode) : (int)syscall(SYS_faccessat, AT_FDCWD, path, mode, 0);
}

// ---------------------------------------------------------------------------
// readlink, realpath

// A link's target that names the rendered tree (readlink of /proc/self/fd/N,
// /proc/self/cwd) is given as the path it stands for.  buf is not
// NUL-terminated; returns the new length.
static ssize_t unmap_link(char *buf, ssize_t n)
{
	if (n <= 0 || __atomic_load_n(&g_state, __ATOMIC_ACQUIRE) != 2 || (size_t)n < g_rootlen)
		return n;
	if (memcmp(buf, g_root, g_rootlen) != 0 || ((size_t)n > g_rootlen && buf[g_rootlen] != '/'))
		return n;
	if ((size_t)n == g_rootlen) {
		buf[0] = '/';
		return 1;
	}
	memmove(buf, buf + g_rootlen, (size_t)n - g_rootlen);
	return n - (ssize_t)g_rootlen;
}

static ssize_t view_readlinkat(int dirfd, const char *path, char *buf, size_t size)
{
	char out[PATH_MAX];
	unsigned idx = 0;
	ssize_t r;
	if (worth_a_look(path)) {
		int m = view_map(dirfd, path, out, &idx);
		if (m == M_UVERBS) {
			errno = EINVAL; // A device node is no link
			return -1;
		}
		if (m == M_MAPPED)
			return syscall(SYS_readlinkat, AT_FDCWD, out, buf, size);
	}
	r = syscall(SYS_readlinkat, dirfd, path, buf, size);
	if (r > 0 && view_on())
		r = unmap_link(buf, r);
	return r;
}

EXPORT ssize_t readlink(const char *path, char *buf, size_t size)
{
	return view_readlinkat(AT_FDCWD, path, buf, size);
}

EXPORT ssize_t readlinkat(int dirfd, const char *path, char *buf, size_t size)
{
	return view_readlinkat(dirfd, path, buf, size);
}

EXPORT ssize_t __readlink_chk(const char *path, char *buf, size_t size, size_t buflen)
{
	if (size > buflen)
		abort(); // What glibc's _FORTIFY_SOURCE check does (__chk_fail)
	return view_readlinkat(AT_FDCWD, path, buf, size);
}

EXPORT ssize_t __readlinkat_chk(int dirfd, const char *path, char *buf, size_t size,
				size_t buflen)
{
	if (size > buflen)
		abort();
	return view_readlinkat(dirfd, path, buf, size);
}

NEXT(realpath, char *(*)(const char *, char *))

EXPORT char *realpath(const char *path, char *resolved)
{
	char out[PATH_MAX];
	char res[PATH_MAX];
	unsigned idx = 0;
	char *(*n)(const char *, char *) = next_realpath();
	if (!n) {
		errno = ENOSYS;
		return NULL;
	}
	const char *use = path;
	if (worth_a_look(path) && view_map(AT_FDCWD, path, out, &idx) != M_PASS)
		use = out;
	if (!view_on())
		return n(path, resolved);
	// Resolved into our buffer, then shown as the program should see it.
	if (!n(use, res))
		return NULL;
	unmap_result(res);
	if (resolved) {
		strcpy(resolved, res);
		return resolved;
	}
	return strdup(res);
}

EXPORT char *__realpath_chk(const char *path, char *resolved, size_t resolvedlen)
{
	if (resolvedlen < PATH_MAX)
		abort();
	return realpath(path, resolved);
}

EXPORT char *canonicalize_file_name(const char *path)
{
	return realpath(path, NULL);
}

// ---------------------------------------------------------------------------
// What a uverbs fd refuses: every kernel command

NEXT(read, ssize_t (*)(int, void *, size_t))
NEXT(write, ssize_t (*)(int, const void *, size_t))
NEXT(readv, ssize_t (*)(int, const struct iovec *, int))
NEXT(writev, ssize_t (*)(int, const struct iovec *, int))
NEXT(pread, ssize_t (*)(int, void *, size_t, off_t))
NEXT(pwrite, ssize_t (*)(int, const void *, size_t, off_t))
NEXT(pread64, ssize_t (*)(int, void *, size_t, off_t))
NEXT(pwrite64, ssize_t (*)(int, const void *, size_t, off_t))
NEXT(ioctl, int (*)(int, unsigned long, ...))
NEXT(close, int (*)(int))
NEXT(dup, int (*)(int))
NEXT(dup2, int (*)(int, int))
NEXT(dup3, int (*)(int, int, int))

#define REFUSE_IF_UVERBS(fd)                                                                \
	do {                                                                                \
		if (is_uverbs(fd)) {                                                        \
			errno = ENODEV;                                                     \
			return -1;                                                          \
		}                                                                           \
	} while (0)

EXPORT ssize_t read(int fd, void *buf, size_t n)
{
	REFUSE_IF_UVERBS(fd);
	ssize_t (*f)(int, void *, size_t) = next_read();
	return f ? f(fd, buf, n) : syscall(SYS_read, fd, buf, n);
}

EXPORT ssize_t write(int fd, const void *buf, size_t n)
{
	REFUSE_IF_UVERBS(fd);
	ssize_t (*f)(int, const void *, size_t) = next_write();
	return f ? f(fd, buf, n) : syscall(SYS_write, fd, buf, n);
}

EXPORT ssize_t readv(int fd, const struct iovec *iov, int cnt)
{
	REFUSE_IF_UVERBS(fd);
	ssize_t (*f)(int, const struct iovec *, int) = next_readv();
	return f ? f(fd, iov, cnt) : syscall(SYS_readv, fd, iov, cnt);
}

EXPORT ssize_t writev(int fd, const struct iovec *iov, int cnt)
{
	REFUSE_IF_UVERBS(fd);
	ssize_t (*f)(int, const struct iovec *, int) = next_writev();
	return f ? f(fd, iov, cnt) : syscall(SYS_writev, fd, iov, cnt);
}

EXPORT ssize_t pread(int fd, void *buf, size_t n, off_t off)
{
	REFUSE_IF_UVERBS(fd);
	ssize_t (*f)(int, void *, size_t, off_t) = next_pread();
	return f ? f(fd, buf, n, off) : syscall(SYS_pread64, fd, buf, n, off);
}

EXPORT ssize_t pwrite(int fd, const void *buf, size_t n, off_t off)
{
	REFUSE_IF_UVERBS(fd);
	ssize_t (*f)(int, const void *, size_t, off_t) = next_pwrite();
	return f ? f(fd, buf, n, off) : syscall(SYS_pwrite64, fd, buf, n, off);
}

EXPORT ssize_t pread64(int fd, void *buf, size_t n, off_t off)
{
	REFUSE_IF_UVERBS(fd);
	ssize_t (*f)(int, void *, size_t, off_t) = next_pread64();
	return f ? f(fd, buf, n, off) : syscall(SYS_pread64, fd, buf, n, off);
}

EXPORT ssize_t pwrite64(int fd, const void *buf, size_t n, off_t off)
{
	REFUSE_IF_UVERBS(fd);
	ssize_t (*f)(int, const void *, size_t, off_t) = next_pwrite64();
	return f ? f(fd, buf, n, off) : syscall(SYS_pwrite64, fd, buf, n, off);
}

EXPORT int ioctl(int fd, unsigned long req, ...)
{
	va_list ap;
	va_start(ap, req);
	void *arg = va_arg(ap, void *);
	va_end(ap);
	REFUSE_IF_UVERBS(fd);
	int (*f)(int, unsigned long, ...) = next_ioctl();
	return f ? f(fd, req, arg) : (int)syscall(SYS_ioctl, fd, req, arg);
}

EXPORT int close(int fd)
{
	unmark(fd);
	int (*f)(int) = next_close();
	return f ? f(fd) : (int)syscall(SYS_close, fd);
}

static int copy_mark(int from, int to)
{
	if (to >= 0 && is_uverbs(from)) {
		if (to < MAX_TRACKED_FD)
			mark_uverbs(to, g_uverbs_idx[from]);
	} else if (to >= 0) {
		unmark(to);
	}
	return to;
}

EXPORT int dup(int fd)
{
	int (*f)(int) = next_dup();
	return copy_mark(fd, f ? f(fd) : (int)syscall(SYS_dup, fd));
}

EXPORT int dup2(int fd, int to)
{
	int (*f)(int, int) = next_dup2();
	return copy_mark(fd, f ? f(fd, to) : (int)syscall(SYS_dup2, fd, to));
}

EXPORT int dup3(int fd, int to, int flags)
{
	int (*f)(int, int, int) = next_dup3();
	return copy_mark(fd, f ? f(fd, to, flags) : (int)syscall(SYS_dup3, fd, to, flags));
}

// ---------------------------------------------------------------------------
// Extended attributes (ls -l asks for ACLs and security labels of each entry)

static int xattr_path(const char *path, char *out, const char **use)
{
	unsigned idx = 0;
	*use = path;
	if (!worth_a_look(path))
		return 0;
	int m = view_map(AT_FDCWD, path, out, &idx);
	if (m != M_PASS)
		*use = out;
	return m;
}

NEXT(getxattr, ssize_t (*)(const char *, const char *, void *, size_t))
NEXT(lgetxattr, ssize_t (*)(const char *, const char *, void *, size_t))
NEXT(listxattr, ssize_t (*)(const char *, char *, size_t))
NEXT(llistxattr, ssize_t (*)(const char *, char *, size_t))

#define GETXATTR_WRAPPER(name)                                                              \
	EXPORT ssize_t name(const char *path, const char *attr, void *val, size_t size)     \
	{                                                                                   \
		char out[PATH_MAX];                                                         \
		const char *use;                                                            \
		if (xattr_path(path, out, &use) == M_UVERBS) {                              \
			errno = ENODATA;                                                    \
			return -1;                                                          \
		}                                                                           \
		ssize_t (*n)(const char *, const char *, void *, size_t) = next_##name();   \
		if (!n) {                                                                   \
			errno = ENOTSUP;                                                    \
			return -1;                                                          \
		}                                                                           \
		return n(use, attr, val, size);                                             \
	}
GETXATTR_WRAPPER(getxattr)
GETXATTR_WRAPPER(lgetxattr)

#define LISTXATTR_WRAPPER(name)                                                             \
	EXPORT ssize_t name(const char *path, char *list, size_t size)                      \
	{                                                                                   \
		char out[PATH_MAX];                                                         \
		const char *use;                                                            \
		if (xattr_path(path, out, &use) == M_UVERBS)                                \
			return 0;                                                           \
		ssize_t (*n)(const char *, char *, size_t) = next_##name();                 \
		if (!n) {                                                                   \
			errno = ENOTSUP;                                                    \
			return -1;                                                          \
		}                                                                           \
		return n(use, list, size);                                                  \
	}
LISTXATTR_WRAPPER(listxattr)
LISTXATTR_WRAPPER(llistxattr)
