// SPDX-License-Identifier: MIT
// A unit test's own fabric goes with the test process.  A fabric's registry
// segment outlives its last process on purpose (it carries the fabric's
// configuration to the next one), so a test that names a fabric after its
// pid would leave one registry behind in /dev/shm per run.  The object
// below, defined once per test program, unlinks every segment of the
// fabric at exit, in the process that made the fabric only (not in a peer
// it started that joined the fabric, nor in a forked child).
#pragma once

#include <dirent.h>
#include <stdlib.h>
#include <string>
#include <unistd.h>

namespace test_fabric {

struct own_fabric {
	pid_t creator = getpid();
	bool joined;
	explicit own_fabric(const char *joined_env) : joined(getenv(joined_env) != nullptr) {}
	~own_fabric()
	{
		const char *f = getenv("SOFTVERBS_FABRIC");
		if (joined || getpid() != creator || !f || !*f)
			return;
		std::string reg = "softverbs-" + std::to_string(getuid()) + "-" + f;
		DIR *d = opendir("/dev/shm");
		if (!d)
			return;
		while (dirent *e = readdir(d)) {
			std::string n = e->d_name;
			// The registry, and its queue segments (<registry>-q...).
			if (n == reg || n.rfind(reg + "-", 0) == 0)
				unlink(("/dev/shm/" + n).c_str());
		}
		closedir(d);
	}
};

} // namespace test_fabric
