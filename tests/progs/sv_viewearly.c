// SPDX-License-Identifier: MIT
// A library whose constructor reads the view before main() (and maybe before
// the view library's own constructor): preloaded ahead of it by
// pyverbs-tests/test_view.py.  Reports on stderr with write(2) only.
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

__attribute__((constructor)) static void early(void)
{
	char buf[128] = "early guid ";
	size_t n = strlen(buf);
	int fd = open("/sys/class/infiniband/loop0/node_guid", O_RDONLY);
	if (fd >= 0) {
		ssize_t r = read(fd, buf + n, sizeof(buf) - n - 1);
		n += r > 0 ? (size_t)r : 0;
		close(fd);
	} else {
		memcpy(buf + n, "none\n", 5);
		n += 5;
	}
	struct stat st;
	const char *dev = stat("/dev/infiniband/uverbs0", &st) == 0 && S_ISCHR(st.st_mode)
				  ? "early uverbs0 chr\n"
				  : "early uverbs0 missing\n";
	if (write(2, buf, n) < 0 || write(2, dev, strlen(dev)) < 0)
		_exit(3);
}
