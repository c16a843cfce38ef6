// SPDX-License-Identifier: MIT
// softverbs-view-render DIR: writes the view (docs/design.md, "The view") of
// the devices this process sees into DIR, an empty directory of the caller's:
//
//   DIR/sys/class/infiniband/<dev> -> ../../devices/virtual/infiniband/<dev>
//   DIR/sys/devices/virtual/infiniband/<dev>/{node_guid,sys_image_guid,...,
//       ports/<n>/{state,lid,...,gids/<i>,gid_attrs/{types,ndevs}/<i>,pkeys/<i>},
//       device -> ../../infiniband_hca/<dev>}
//   DIR/sys/devices/virtual/infiniband_hca/<dev>/{net/<netdev> -> /sys/class/net/<netdev>,
//       numa_node, local_cpus, infiniband/<dev>, infiniband_verbs/uverbsN}
//   DIR/sys/class/infiniband_verbs/{abi_version,uverbsN -> ...}
//   DIR/sys/devices/virtual/infiniband_verbs/uverbsN/{ibdev,abi_version,dev,device}
//   DIR/sys/class/infiniband_mad/abi_version   (and no umad device)
//   DIR/dev/infiniband/uverbsN                 (placeholders; the preload
//                                               library makes them devices)
//
// Every value is what the verbs API says (ibv_query_device, _port, _gid_ex,
// _pkey), through softverbs' libibverbs.so.1, so the view and ibv_devinfo
// agree by construction; formats are the kernel's (drivers/infiniband/core/
// sysfs.c).  The netdev of a port is the device's configured `netdev`
// (default lo): an Ethernet port's GIDs come from it, and an InfiniBand port
// shows it as its IPoIB interface.
#include "../providers/loop/config.h"

#include <infiniband/verbs.h>

#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <dlfcn.h>
#include <endian.h>
#include <fcntl.h>
#include <net/if.h>
#include <string>
#include <sys/stat.h>
#include <unistd.h>

namespace
{

std::string root;
bool failed = false;

void fail(const std::string &what)
{
	fprintf(stderr, "softverbs-view-render: %s: %s\n", what.c_str(), strerror(errno));
	failed = true;
}

void mkdirs(const std::string &rel)
{
	for (size_t pos = 1;; pos++) {
		pos = rel.find('/', pos);
		std::string path = root + rel.substr(0, pos);
		if (mkdir(path.c_str(), 0755) != 0 && errno != EEXIST)
			fail("mkdir " + path);
		if (pos == std::string::npos)
			break;
	}
}

void put(const std::string &rel, const char *fmt, ...)
{
	char buf[512];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	std::string path = root + rel;
	int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0444);
	if (fd < 0) {
		fail("create " + path);
		return;
	}
	if (write(fd, buf, static_cast<size_t>(n)) != n)
		fail("write " + path);
	close(fd);
}

void link_to(const std::string &rel, const std::string &target)
{
	std::string path = root + rel;
	if (symlink(target.c_str(), path.c_str()) != 0)
		fail("symlink " + path);
}

std::string guid_str(__be64 be)
{
	uint64_t g = be64toh(be);
	char b[32];
	snprintf(b, sizeof(b), "%04x:%04x:%04x:%04x", static_cast<unsigned>(g >> 48) & 0xffff,
		 static_cast<unsigned>(g >> 32) & 0xffff, static_cast<unsigned>(g >> 16) & 0xffff,
		 static_cast<unsigned>(g) & 0xffff);
	return b;
}

std::string gid_str(const ibv_gid &gid)
{
	char b[64];
	int n = 0;
	for (int i = 0; i < 16; i += 2)
		n += snprintf(b + n, sizeof(b) - n, "%s%02x%02x", i ? ":" : "", gid.raw[i],
			      gid.raw[i + 1]);
	return b;
}

const char *port_state_name(int s)
{
	static const char *names[] = {"NOP", "DOWN", "INIT", "ARMED", "ACTIVE", "ACTIVE_DEFER"};
	return s >= 0 && s < 6 ? names[s] : "NOP";
}

const char *phys_state_name(unsigned s)
{
	static const char *names[] = {"<unknown>", "Sleep", "Polling", "Disabled",
				      "PortConfigurationTraining", "LinkUp",
				      "LinkErrorRecovery", "Phy Test"};
	return s < 8 ? names[s] : "<unknown>";
}

int width_int(unsigned w)
{
	switch (w) {
	case 1: return 1;
	case 2: return 4;
	case 4: return 8;
	case 8: return 12;
	case 16: return 2;
	default: return 0;
	}
}

// The kernel's rate_show.
std::string rate_str(const ibv_port_attr &a)
{
	const char *speed;
	int rate; // deci-Gb/s
	switch (a.active_speed) {
	case 2: speed = " DDR"; rate = 50; break;
	case 4: speed = " QDR"; rate = 100; break;
	case 8: speed = " FDR10"; rate = 100; break;
	case 16: speed = " FDR"; rate = 140; break;
	case 32: speed = " EDR"; rate = 250; break;
	case 64: speed = " HDR"; rate = 500; break;
	case 128: speed = " NDR"; rate = 1000; break;
	default: speed = " SDR"; rate = 25; break;
	}
	int w = width_int(a.active_width);
	rate *= w;
	char b[64];
	snprintf(b, sizeof(b), "%d%s Gb/sec (%dX%s)", rate / 10, rate % 10 ? ".5" : "", w, speed);
	return b;
}

std::string local_cpus()
{
	long n = sysconf(_SC_NPROCESSORS_CONF);
	if (n < 1)
		n = 1;
	int groups = static_cast<int>((n + 31) / 32);
	std::string s;
	for (int g = groups - 1; g >= 0; g--) {
		long bits = n - 32L * g;
		uint32_t v = bits >= 32 ? 0xffffffffu : ((1u << bits) - 1);
		char b[16];
		snprintf(b, sizeof(b), "%08x", v);
		if (!s.empty())
			s += ",";
		s += b;
	}
	return s;
}

bool render_device(ibv_device *dev, const std::string &netdev, const std::string &host)
{
	const std::string name = ibv_get_device_name(dev);
	const std::string uv = dev->dev_name; // uverbsN
	unsigned uv_index = 0;
	if (sscanf(uv.c_str(), "uverbs%u", &uv_index) != 1) {
		fprintf(stderr, "softverbs-view-render: %s: unexpected dev_name '%s'\n",
			name.c_str(), uv.c_str());
		return false;
	}
	ibv_context *ctx = ibv_open_device(dev);
	if (!ctx) {
		fail("ibv_open_device " + name);
		return false;
	}
	ibv_device_attr da;
	if (ibv_query_device(ctx, &da) != 0) {
		fail("ibv_query_device " + name);
		ibv_close_device(ctx);
		return false;
	}

	const std::string ib = "/sys/devices/virtual/infiniband/" + name;
	const std::string hca = "/sys/devices/virtual/infiniband_hca/" + name;
	const std::string uvd = "/sys/devices/virtual/infiniband_verbs/" + uv;
	mkdirs(ib + "/ports");
	mkdirs(hca + "/net");
	mkdirs(hca + "/infiniband");
	mkdirs(hca + "/infiniband_verbs");
	mkdirs(uvd);

	put(ib + "/node_type", "1: CA\n");
	put(ib + "/node_guid", "%s\n", guid_str(ibv_get_device_guid(dev)).c_str());
	put(ib + "/sys_image_guid", "%s\n", guid_str(da.sys_image_guid).c_str());
	put(ib + "/fw_ver", "%s\n", da.fw_ver);
	put(ib + "/hw_rev", "%x\n", da.hw_ver);
	put(ib + "/hca_type", "loop\n");
	put(ib + "/board_id", "SOFTVERBS_LOOP\n");
	put(ib + "/node_desc", "%.64s\n", (host + " " + name).c_str());
	link_to(ib + "/device", "../../infiniband_hca/" + name);
	link_to("/sys/class/infiniband/" + name, "../../devices/virtual/infiniband/" + name);

	link_to(hca + "/net/" + netdev, "/sys/class/net/" + netdev);
	put(hca + "/numa_node", "-1\n");
	put(hca + "/local_cpus", "%s\n", local_cpus().c_str());
	link_to(hca + "/infiniband/" + name, "../../infiniband/" + name);
	link_to(hca + "/infiniband_verbs/" + uv, "../../infiniband_verbs/" + uv);

	put(uvd + "/ibdev", "%s\n", name.c_str());
	put(uvd + "/abi_version", "6\n");
	put(uvd + "/dev", "231:%u\n", 192 + uv_index);
	link_to(uvd + "/device", "../../infiniband_hca/" + name);
	link_to("/sys/class/infiniband_verbs/" + uv, "../../devices/virtual/infiniband_verbs/" + uv);
	put("/dev/infiniband/" + uv, "");
	chmod((root + "/dev/infiniband/" + uv).c_str(), 0666);

	bool ok = true;
	for (unsigned p = 1; p <= da.phys_port_cnt; p++) {
		ibv_port_attr pa;
		if (ibv_query_port(ctx, static_cast<uint8_t>(p), &pa) != 0) {
			fail("ibv_query_port " + name);
			ok = false;
			continue;
		}
		const std::string pd = ib + "/ports/" + std::to_string(p);
		mkdirs(pd + "/gids");
		mkdirs(pd + "/gid_attrs/types");
		mkdirs(pd + "/gid_attrs/ndevs");
		mkdirs(pd + "/pkeys");
		put(pd + "/state", "%d: %s\n", pa.state, port_state_name(pa.state));
		put(pd + "/phys_state", "%u: %s\n", pa.phys_state, phys_state_name(pa.phys_state));
		put(pd + "/rate", "%s\n", rate_str(pa).c_str());
		put(pd + "/lid", "0x%x\n", pa.lid);
		put(pd + "/lid_mask_count", "%d\n", pa.lmc);
		put(pd + "/sm_lid", "0x%x\n", pa.sm_lid);
		put(pd + "/sm_sl", "%d\n", pa.sm_sl);
		put(pd + "/cap_mask", "0x%08x\n", pa.port_cap_flags);
		put(pd + "/link_layer", "%s\n",
		    pa.link_layer == IBV_LINK_LAYER_ETHERNET ? "Ethernet" : "InfiniBand");
		for (int i = 0; i < pa.gid_tbl_len; i++) {
			ibv_gid_entry e;
			memset(&e, 0, sizeof(e));
			int rc = ibv_query_gid_ex(ctx, p, static_cast<uint32_t>(i), &e, 0);
			const std::string is = std::to_string(i);
			// An empty entry reads as zeros; the kernel's types/ndevs files
			// of an empty entry fail to read (EINVAL): here they are absent.
			put(pd + "/gids/" + is, "%s\n", gid_str(e.gid).c_str());
			if (rc != 0)
				continue;
			put(pd + "/gid_attrs/types/" + is, "%s\n",
			    e.gid_type == IBV_GID_TYPE_ROCE_V2 ? "RoCE v2" : "IB/RoCE v1");
			char ifname[IF_NAMESIZE];
			if (e.ndev_ifindex && if_indextoname(e.ndev_ifindex, ifname))
				put(pd + "/gid_attrs/ndevs/" + is, "%s\n", ifname);
		}
		for (int i = 0; i < pa.pkey_tbl_len; i++) {
			__be16 pkey = 0;
			if (ibv_query_pkey(ctx, static_cast<uint8_t>(p), i, &pkey) != 0)
				break;
			put(pd + "/pkeys/" + std::to_string(i), "0x%04x\n", be16toh(pkey));
		}
	}
	ibv_close_device(ctx);
	return ok;
}

} // namespace

int main(int argc, char **argv)
{
	if (argc != 2 || argv[1][0] != '/') {
		fprintf(stderr, "usage: softverbs-view-render ABSOLUTE_DIR\n"
				"Writes the /sys and /dev view of softverbs' devices into DIR "
				"(softverbs-run calls it).\n");
		return 2;
	}
	root = argv[1];
	// Only softverbs' libibverbs.so.1 may be described: the system's would
	// describe real hardware under our names.
	if (!dlsym(RTLD_DEFAULT, "softverbs_reg_mr_fd")) {
		fprintf(stderr, "softverbs-view-render: the libibverbs.so.1 loaded is not "
				"softverbs' (run me through softverbs-run)\n");
		return 1;
	}
	loop::config cfg;
	std::string err;
	if (!loop::load_config(cfg, err)) {
		fprintf(stderr, "softverbs: %s\n", err.c_str());
		return 1;
	}
	char host[256] = "localhost";
	gethostname(host, sizeof(host) - 1);

	mkdirs("/sys/class/infiniband");
	mkdirs("/sys/class/infiniband_verbs");
	mkdirs("/sys/class/infiniband_mad");
	mkdirs("/dev/infiniband");
	put("/sys/class/infiniband_verbs/abi_version", "6\n");
	put("/sys/class/infiniband_mad/abi_version", "5\n");

	int n = 0;
	ibv_device **list = ibv_get_device_list(&n);
	if (!list) {
		fail("ibv_get_device_list");
		return 1;
	}
	for (int i = 0; i < n; i++) {
		std::string netdev = "lo";
		for (const auto &d : cfg.devices)
			if (d.name == ibv_get_device_name(list[i]))
				netdev = d.netdev;
		render_device(list[i], netdev, host);
	}
	ibv_free_device_list(list);
	return failed ? 1 : 0;
}
