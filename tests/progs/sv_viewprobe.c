// SPDX-License-Identifier: MIT
// sv_viewprobe OP ARGS...: reaches paths through one libc entry point each,
// for pyverbs-tests/test_view.py.  Prints one line per result: the value,
// or "errno N" when the call failed.  No libibverbs: the view must work for
// any program.
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/time.h>
#include <unistd.h>

static int fail(void)
{
	printf("errno %d\n", errno);
	return 0;
}

static void print_fd(int fd)
{
	char buf[4096];
	ssize_t n = read(fd, buf, sizeof(buf) - 1);
	if (n < 0) {
		fail();
		return;
	}
	buf[n] = 0;
	fputs(buf, stdout);
	if (n == 0 || buf[n - 1] != '\n')
		putchar('\n');
}

static char kind(mode_t m)
{
	return S_ISCHR(m) ? 'c' : S_ISDIR(m) ? 'd' : S_ISLNK(m) ? 'l' : S_ISREG(m) ? 'f' : '?';
}

static int by_name(const struct dirent **a, const struct dirent **b)
{
	return strcmp((*a)->d_name, (*b)->d_name);
}

// One thread of "threads": reads the file again and again, checking it.
struct reader {
	const char *path;
	const char *expect;
	int bad;
};

static void *reader_main(void *arg)
{
	struct reader *r = arg;
	char buf[256];
	for (int i = 0; i < 2000; i++) {
		int fd = open(r->path, O_RDONLY);
		if (fd < 0) {
			r->bad++;
			continue;
		}
		ssize_t n = read(fd, buf, sizeof(buf) - 1);
		close(fd);
		buf[n > 0 ? n : 0] = 0;
		if (strcmp(buf, r->expect) != 0)
			r->bad++;
	}
	return NULL;
}

static const char *sig_path;
static volatile sig_atomic_t sig_ok = -1;

static void on_alarm(int sig)
{
	(void)sig;
	struct stat st;
	int fd = open(sig_path, O_RDONLY);
	sig_ok = fd >= 0 && fstat(fd, &st) == 0 && read(fd, (char[64]){0}, 63) > 0;
	if (fd >= 0)
		close(fd);
}

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: sv_viewprobe OP PATH [ARG]\n");
		return 2;
	}
	const char *op = argv[1], *path = argv[2];
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (!strcmp(op, "cat")) {
		int fd = open(path, O_RDONLY);
		if (fd < 0)
			return fail();
		print_fd(fd);
		close(fd);
	} else if (!strcmp(op, "fopen")) {
		FILE *f = fopen(path, argc > 3 ? argv[3] : "r");
		if (!f)
			return fail();
		char line[512];
		if (fgets(line, sizeof(line), f))
			fputs(line, stdout);
		else
			printf("(empty)\n");
		fclose(f);
	} else if (!strcmp(op, "openw")) {
		int fd = open(path, O_WRONLY | (argc > 3 ? O_CREAT : 0), 0644);
		if (fd < 0)
			return fail();
		printf("opened\n");
		close(fd);
	} else if (!strcmp(op, "openat-dir") || !strcmp(op, "openat-odir")) {
		// The directory fd from opendir()/dirfd(), or from open(O_DIRECTORY),
		// then openat() relative to it (hwloc's way).
		DIR *d = NULL;
		int dfd;
		if (!strcmp(op, "openat-dir")) {
			d = opendir(path);
			if (!d)
				return fail();
			dfd = dirfd(d);
		} else {
			dfd = open(path, O_RDONLY | O_DIRECTORY);
			if (dfd < 0)
				return fail();
		}
		int fd = openat(dfd, argv[3], O_RDONLY);
		if (fd < 0)
			fail();
		else {
			print_fd(fd);
			close(fd);
		}
		if (d)
			closedir(d);
		else
			close(dfd);
	} else if (!strcmp(op, "stat") || !strcmp(op, "lstat")) {
		struct stat st;
		if ((op[0] == 's' ? stat(path, &st) : lstat(path, &st)) != 0)
			return fail();
		printf("%c %u:%u %o\n", kind(st.st_mode), major(st.st_rdev), minor(st.st_rdev),
		       st.st_mode & 07777);
	} else if (!strcmp(op, "fstatat")) {
		struct stat st;
		int dfd = open(path, O_RDONLY | O_DIRECTORY);
		if (dfd < 0)
			return fail();
		if (fstatat(dfd, argv[3], &st, AT_SYMLINK_NOFOLLOW) != 0)
			return fail();
		printf("%c %u:%u %o\n", kind(st.st_mode), major(st.st_rdev), minor(st.st_rdev),
		       st.st_mode & 07777);
	} else if (!strcmp(op, "statx")) {
		struct statx sx;
		if (statx(AT_FDCWD, path, 0, STATX_BASIC_STATS, &sx) != 0)
			return fail();
		printf("%c %u:%u %o\n", kind(sx.stx_mode), sx.stx_rdev_major, sx.stx_rdev_minor,
		       sx.stx_mode & 07777);
	} else if (!strcmp(op, "access")) {
		int mode = 0;
		for (const char *c = argc > 3 ? argv[3] : "F"; *c; c++)
			mode |= *c == 'r' ? R_OK : *c == 'w' ? W_OK : *c == 'x' ? X_OK : 0;
		if (access(path, mode) != 0)
			return fail();
		printf("ok\n");
		if (faccessat(AT_FDCWD, path, mode, 0) != 0 || euidaccess(path, mode) != 0)
			printf("faccessat/euidaccess disagree\n");
	} else if (!strcmp(op, "readlink")) {
		char buf[PATH_MAX];
		ssize_t n = readlink(path, buf, sizeof(buf) - 1);
		if (n < 0)
			return fail();
		buf[n] = 0;
		printf("%s\n", buf);
	} else if (!strcmp(op, "realpath")) {
		char buf[PATH_MAX];
		if (!realpath(path, buf))
			return fail();
		printf("%s\n", buf);
		char *m = realpath(path, NULL);
		if (!m || strcmp(m, buf))
			printf("realpath(NULL) disagrees\n");
		free(m);
	} else if (!strcmp(op, "scandir")) {
		struct dirent **list;
		int n = scandir(path, &list, NULL, by_name);
		if (n < 0)
			return fail();
		for (int i = 0; i < n; i++) {
			if (strcmp(list[i]->d_name, ".") && strcmp(list[i]->d_name, ".."))
				printf("%s ", list[i]->d_name);
			free(list[i]);
		}
		free(list);
		printf("\n");
	} else if (!strcmp(op, "readdir")) {
		DIR *d = opendir(path);
		if (!d)
			return fail();
		struct dirent *e;
		int n = 0;
		while ((e = readdir(d)))
			n += e->d_name[0] != '.';
		printf("%d\n", n);
		closedir(d);
	} else if (!strcmp(op, "cwd")) {
		// chdir(PATH), then open a path relative to it; print getcwd.
		if (chdir(path) != 0)
			return fail();
		char buf[PATH_MAX];
		printf("%s\n", getcwd(buf, sizeof(buf)) ? buf : "getcwd failed");
		int fd = open(argv[3], O_RDONLY);
		if (fd < 0)
			return fail();
		print_fd(fd);
		close(fd);
	} else if (!strcmp(op, "uverbs")) {
		// What libibverbs would do with a device node: open it, send a
		// command; every step reported.
		int fd = open(path, O_RDWR | O_CLOEXEC);
		if (fd < 0)
			return fail();
		struct stat st;
		if (fstat(fd, &st) == 0)
			printf("fstat %c %u:%u\n", kind(st.st_mode), major(st.st_rdev), minor(st.st_rdev));
		char cmd[24] = {0};
		ssize_t r;
		int e;
		errno = 0;
		r = write(fd, cmd, sizeof(cmd));
		e = errno;
		printf("write %zd errno %d\n", r, e);
		errno = 0;
		r = ioctl(fd, _IOWR(0x1b, 1, char[24]), cmd);
		e = errno;
		printf("ioctl %zd errno %d\n", r, e);
		errno = 0;
		r = read(fd, cmd, sizeof(cmd));
		e = errno;
		printf("read %zd errno %d\n", r, e);
		int fd2 = dup(fd);
		errno = 0;
		r = write(fd2, cmd, sizeof(cmd));
		e = errno;
		printf("dup-write %zd errno %d\n", r, e);
		close(fd2);
		close(fd);
		// The number is reused by an ordinary file: nothing refused there.
		int p[2];
		if (pipe(p) == 0) {
			errno = 0;
			r = write(p[1], "x", 1);
			e = errno;
			printf("pipe-write %zd errno %d\n", r, e);
			close(p[0]);
			close(p[1]);
		}
	} else if (!strcmp(op, "threads")) {
		// Eight threads read PATH 2000 times each, expecting ARG.
		struct reader r[8];
		pthread_t t[8];
		for (int i = 0; i < 8; i++) {
			r[i] = (struct reader){path, argv[3], 0};
			pthread_create(&t[i], NULL, reader_main, &r[i]);
		}
		int bad = 0;
		for (int i = 0; i < 8; i++) {
			pthread_join(t[i], NULL);
			bad += r[i].bad;
		}
		printf("bad %d\n", bad);
	} else if (!strcmp(op, "signal")) {
		// open/read of a view path from a signal handler.
		sig_path = path;
		signal(SIGALRM, on_alarm);
		struct itimerval it = {{0, 0}, {0, 20000}};
		setitimer(ITIMER_REAL, &it, NULL);
		while (sig_ok < 0)
			usleep(1000);
		printf("handler %s\n", sig_ok ? "ok" : "failed");
	} else {
		fprintf(stderr, "sv_viewprobe: unknown op %s\n", op);
		return 2;
	}
	return 0;
}
