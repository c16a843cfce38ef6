// SPDX-License-Identifier: MIT
#include "fabric_inspect.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dirent.h>
#include <fcntl.h>
#include <fstream>
#include <map>
#include <sstream>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace svtool
{

namespace
{

enum class seg_kind { registry, object, unknown };

struct raw_segment {
	std::string name; // Without the "softverbs-<uid>-" prefix
	std::string path;
	seg_kind kind = seg_kind::unknown;
	seg_status status = seg_status::unreadable;
	std::string error;
	sv_seg_hdr hdr{};
	uint64_t file_size = 0;
	bool other_owner = false; // Another user's file
};

// The library's rule (check_segment in providers/loop/transport/loop/fabric.cpp): a
// segment is ours only if this user owns it and nobody else may touch it.
// Returns an empty string, or why the file is refused.
std::string refuse_reason(const struct stat &st)
{
	if (st.st_uid != geteuid())
		return "belongs to uid " + std::to_string(st.st_uid) + ", not to this user";
	if (!S_ISREG(st.st_mode))
		return "is not a regular file";
	if (st.st_mode & 077) {
		char mode[8];
		snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
		return std::string("has mode ") + mode + " (a segment must be 0600)";
	}
	return "";
}

// Reads the header only: the one part every ABI version agrees on.
raw_segment read_header(const std::string &dir, const std::string &prefix, const std::string &file)
{
	raw_segment s;
	s.name = file.substr(prefix.size());
	s.path = dir + "/" + file;
	int fd = open(s.path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK); // A FIFO: no wait for a writer
	if (fd < 0) {
		s.error = s.path + ": " + strerror(errno);
		return s;
	}
	struct stat st;
	if (fstat(fd, &st) < 0) {
		s.error = s.path + ": " + strerror(errno);
		close(fd);
		return s;
	}
	s.file_size = static_cast<uint64_t>(st.st_size);
	std::string why = refuse_reason(st);
	if (!why.empty()) {
		// Not read: what another user wrote there means nothing.
		s.status = seg_status::refused;
		s.other_owner = st.st_uid != geteuid();
		s.error = s.path + " " + why;
		close(fd);
		return s;
	}
	if (s.file_size < sizeof(sv_seg_hdr)) {
		// Its creator has not sized it yet, or died before it did.
		s.status = seg_status::initialising;
		close(fd);
		return s;
	}
	ssize_t n = pread(fd, &s.hdr, sizeof(s.hdr), 0);
	close(fd);
	if (n != static_cast<ssize_t>(sizeof(s.hdr))) {
		s.error = s.path + ": short read";
		return s;
	}
	if (s.hdr.magic != SV_SEG_MAGIC) {
		s.status = seg_status::foreign;
		s.error = s.path + " is not a softverbs segment (bad magic)";
		return s;
	}
	if (s.hdr.kind == SV_SEG_REGISTRY)
		s.kind = seg_kind::registry;
	else if (s.hdr.kind == SV_SEG_QUEUE)
		s.kind = seg_kind::object;
	if (s.hdr.abi_version != SV_ABI_VERSION) {
		s.status = seg_status::other_version;
		s.error = s.path + " has softverbs ABI version " +
			  std::to_string(s.hdr.abi_version) + ", this tool reads version " +
			  std::to_string(SV_ABI_VERSION);
		return s;
	}
	if (s.kind == seg_kind::unknown) {
		s.status = seg_status::foreign;
		s.error = s.path + ": unknown segment kind " + std::to_string(s.hdr.kind);
		return s;
	}
	if (__atomic_load_n(&s.hdr.state, __ATOMIC_ACQUIRE) != SV_SEG_READY)
		s.status = seg_status::initialising;
	else if (s.hdr.seg_size > s.file_size)
		s.status = seg_status::truncated;
	else
		s.status = seg_status::ok;
	return s;
}

// The body of a registry of this ABI version.  Every count and string read
// from it is bounded here: the writer may be buggy or have died mid-update.
void read_registry(fabric_info &f)
{
	int fd = open(f.path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
	if (fd < 0) {
		f.status = seg_status::unreadable;
		f.error = f.path + ": " + strerror(errno);
		return;
	}
	struct stat st;
	if (fstat(fd, &st) < 0 || !refuse_reason(st).empty()) {
		close(fd);
		f.status = seg_status::refused;
		f.error = f.path + " changed owner or mode since it was read";
		return;
	}
	if (static_cast<size_t>(st.st_size) < sizeof(sv_registry)) {
		close(fd);
		f.status = seg_status::truncated;
		f.error = f.path + " is smaller than a registry";
		return;
	}
	void *p = mmap(nullptr, sizeof(sv_registry), PROT_READ, MAP_SHARED, fd, 0);
	close(fd);
	if (p == MAP_FAILED) {
		f.status = seg_status::unreadable;
		f.error = f.path + ": " + strerror(errno);
		return;
	}
	// Read without the registry lock: taking it needs a writable mapping,
	// and a snapshot that may be one update stale is all a tool needs.
	const auto *r = static_cast<const sv_registry *>(p);
	for (const sv_device_rec &d : r->devices) {
		size_t len = strnlen(d.name, sizeof(d.name));
		if (len == 0)
			continue;
		device_info di;
		di.name.assign(d.name, len);
		di.index = d.index;
		di.node_guid = d.node_guid;
		uint32_t np = std::min<uint32_t>(d.num_ports, SV_MAX_PORTS);
		for (uint32_t i = 0; i < np; i++) {
			const sv_port_rec &pr = d.ports[i];
			sv_wire_counters wc;
			memcpy(&wc, &r->wire[&d - r->devices][i], sizeof(wc));
			di.ports.push_back(port_info{i + 1, pr.lid, pr.state, pr.link_layer,
						     pr.active_mtu, pr.port_guid, wc});
		}
		f.devices.push_back(di);
	}
	for (unsigned i = 0; i < SV_MAX_PROCS; i++) {
		const sv_lease &l = r->leases[i];
		if (l.pid == 0) {
			if (l.last_pid)
				f.leases.push_back(lease_info{i, l.last_pid, l.generation, 0, false,
							      l.flags, true});
			continue;
		}
		bool live = process_start_time(static_cast<pid_t>(l.pid)) == l.start_time;
		f.leases.push_back(lease_info{i, l.pid, l.generation, l.start_time, live, l.flags});
	}
	munmap(p, sizeof(sv_registry));
}

// path -> pids of processes that map it, for every segment of this user.
std::map<std::string, std::vector<pid_t>> scan_mappers(const std::string &path_prefix)
{
	std::map<std::string, std::vector<pid_t>> out;
	DIR *d = opendir("/proc");
	if (!d)
		return out;
	pid_t self = getpid();
	while (dirent *e = readdir(d)) {
		char *end;
		long pid = strtol(e->d_name, &end, 10);
		if (*end || pid <= 0 || pid == self)
			continue;
		std::ifstream maps(std::string("/proc/") + e->d_name + "/maps");
		std::string line;
		std::vector<std::string> seen;
		while (std::getline(maps, line)) {
			size_t at = line.find(path_prefix);
			if (at == std::string::npos)
				continue;
			std::string path = line.substr(at);
			if (std::find(seen.begin(), seen.end(), path) != seen.end())
				continue;
			seen.push_back(path);
			out[path].push_back(static_cast<pid_t>(pid));
		}
	}
	closedir(d);
	return out;
}

void add_mappers(fabric_info &f, const std::map<std::string, std::vector<pid_t>> &m)
{
	std::vector<std::string> paths = f.object_segments;
	paths.push_back(f.path);
	for (auto &p : paths) {
		auto it = m.find(p);
		if (it == m.end())
			continue;
		for (pid_t pid : it->second)
			if (std::find(f.mappers.begin(), f.mappers.end(), pid) == f.mappers.end())
				f.mappers.push_back(pid);
	}
	std::sort(f.mappers.begin(), f.mappers.end());
}

std::vector<fabric_info> scan(const std::string &dir, const std::string *only)
{
	const std::string prefix = segment_prefix();
	std::vector<raw_segment> segs;
	if (DIR *d = opendir(dir.c_str())) {
		while (dirent *e = readdir(d)) {
			std::string file = e->d_name;
			if (file.size() > prefix.size() &&
			    file.compare(0, prefix.size(), prefix) == 0)
				segs.push_back(read_header(dir, prefix, file));
		}
		closedir(d);
	}
	std::sort(segs.begin(), segs.end(),
		  [](const raw_segment &a, const raw_segment &b) { return a.name < b.name; });

	// Fabric names may contain '-', so "a-b" is either fabric "a-b" or an
	// object of fabric "a".  Segments that say they are registries decide
	// first; the rest belong to the longest registry name they extend.
	std::vector<std::string> registries;
	for (auto &s : segs)
		if (s.kind == seg_kind::registry)
			registries.push_back(s.name);
	// Another user's files are never read, so their kind is unknown; our
	// own fabric names decide where they go.  One named like a registry
	// stands for that fabric (the library refuses it too).
	auto owner = [&](const std::string &name) -> std::string {
		std::string best;
		for (auto &r : registries)
			if (name.size() > r.size() + 1 && name.compare(0, r.size(), r) == 0 &&
			    name[r.size()] == '-' && r.size() > best.size())
				best = r;
		return best;
	};
	// Unrecognisable segments that extend no registry are taken to be
	// registries themselves (half-created, or of an unknown layout), unless
	// they say they are objects.
	for (auto &s : segs)
		if (s.kind == seg_kind::unknown && owner(s.name).empty())
			registries.push_back(s.name);

	std::map<std::string, fabric_info> fabrics;
	for (auto &s : segs) {
		if (s.other_owner) {
			std::string fab = owner(s.name);
			if (fab.empty()) {
				size_t q = s.name.rfind("-q");
				fab = q != std::string::npos && q > 0 ? s.name.substr(0, q) : s.name;
			}
			fabric_info &f = fabrics[fab];
			if (f.name.empty()) {
				f.name = fab;
				f.path = dir + "/" + prefix + fab;
				f.status = seg_status::refused;
				f.error = "only segments of another user are left under this name";
			}
			if (s.name == fab) {
				f.status = seg_status::refused;
				f.error = s.error;
			}
			f.foreign_segments.push_back(s.path);
			continue;
		}
		bool is_reg =
		    std::find(registries.begin(), registries.end(), s.name) != registries.end() &&
		    s.kind != seg_kind::object;
		if (is_reg) {
			fabric_info &f = fabrics[s.name];
			f.name = s.name;
			f.path = s.path;
			f.status = s.status;
			f.error = s.error;
			f.abi_version = s.hdr.abi_version;
			f.creator_pid = s.hdr.creator_pid;
			f.seg_size = s.hdr.seg_size;
			if (s.status == seg_status::initialising)
				f.error = s.path + " is not initialised yet (or its creator died)";
			continue;
		}
		std::string fab = owner(s.name);
		if (fab.empty()) {
			// An object segment whose registry is gone: the fabric name
			// is everything before the object's own "-<suffix>".
			size_t dash = s.name.rfind('-');
			fab = dash == std::string::npos || dash == 0 ? s.name
								     : s.name.substr(0, dash);
			fabric_info &f = fabrics[fab];
			if (f.name.empty()) {
				f.name = fab;
				f.path = dir + "/" + prefix + fab;
				f.status = seg_status::unreadable;
				f.error = "registry segment " + f.path +
					  " is missing; only object segments are left";
			}
		}
		fabrics[fab].object_segments.push_back(s.path);
	}

	std::vector<fabric_info> out;
	for (auto &[name, f] : fabrics) {
		if (only && name != *only)
			continue;
		if (f.status == seg_status::ok)
			read_registry(f);
		out.push_back(std::move(f));
	}
	if (!out.empty()) {
		auto m = scan_mappers(dir + "/" + prefix);
		for (auto &f : out)
			add_mappers(f, m);
	}
	return out;
}

} // namespace

unsigned fabric_info::live_leases() const
{
	unsigned n = 0;
	for (auto &l : leases)
		n += l.live;
	return n;
}

unsigned fabric_info::exited_leases() const
{
	unsigned n = 0;
	for (auto &l : leases)
		n += !l.live && !l.closed;
	return n;
}

std::string segment_prefix()
{
	return "softverbs-" + std::to_string(getuid()) + "-";
}

std::vector<fabric_info> list_fabrics(const std::string &shm_dir)
{
	return scan(shm_dir, nullptr);
}

bool inspect_fabric(const std::string &name, fabric_info &out, const std::string &shm_dir)
{
	auto v = scan(shm_dir, &name);
	if (v.empty())
		return false;
	out = std::move(v.front());
	return true;
}

uint64_t process_start_time(pid_t pid)
{
	// Same reading as the provider's fabric::process_start_time(); kept
	// here so that the tool does not depend on the provider's objects.
	std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
	std::string s;
	if (pid <= 0 || !std::getline(in, s))
		return 0;
	// The command name may hold spaces and parentheses: skip past the last ')'.
	size_t p = s.rfind(')');
	if (p == std::string::npos || p + 2 > s.size())
		return 0;
	std::istringstream rest(s.substr(p + 2));
	std::string field;
	for (int i = 3; i <= 22; i++)
		if (!(rest >> field))
			return 0;
	return strtoull(field.c_str(), nullptr, 10);
}

std::string format_guid(uint64_t g)
{
	char buf[24];
	snprintf(buf, sizeof(buf), "%04x:%04x:%04x:%04x", static_cast<unsigned>(g >> 48) & 0xffff,
		 static_cast<unsigned>(g >> 32) & 0xffff, static_cast<unsigned>(g >> 16) & 0xffff,
		 static_cast<unsigned>(g) & 0xffff);
	return buf;
}

const char *status_name(seg_status s)
{
	switch (s) {
	case seg_status::ok:
		return "ok";
	case seg_status::initialising:
		return "initialising";
	case seg_status::other_version:
		return "other ABI version";
	case seg_status::foreign:
		return "not softverbs";
	case seg_status::truncated:
		return "truncated";
	case seg_status::unreadable:
		return "unreadable";
	case seg_status::refused:
		return "refused";
	}
	return "?";
}

const char *port_state_name(uint8_t state)
{
	// enum ibv_port_state
	static const char *const names[] = {"PORT_NOP",	  "PORT_DOWN",	 "PORT_INIT",
					    "PORT_ARMED", "PORT_ACTIVE", "PORT_ACTIVE_DEFER"};
	return state < sizeof(names) / sizeof(names[0]) ? names[state] : "invalid";
}

const char *link_layer_name(uint8_t ll)
{
	switch (ll) {
	case SV_LINK_IB:
		return "InfiniBand";
	case SV_LINK_ETH:
		return "Ethernet";
	}
	return "invalid";
}

int mtu_bytes(uint8_t mtu)
{
	// enum ibv_mtu: 1 = 256 ... 5 = 4096
	return mtu >= 1 && mtu <= 5 ? 128 << mtu : 0;
}

} // namespace svtool
