// SPDX-License-Identifier: MIT
// softverbs: look at and clean up the fabrics of this user in /dev/shm.
#include "fabric_inspect.h"

#include "../providers/loop/config.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <unistd.h>
#include <vector>

using namespace svtool;

namespace
{

const char kUsage[] =
    "usage: softverbs [--help] COMMAND [ARGS]\n"
    "\n"
    "Inspect and clean the shared-memory fabrics that softverbs' libibverbs.so.1\n"
    "creates in /dev/shm (one registry segment softverbs-<uid>-<fabric> per fabric,\n"
    "plus per-object segments softverbs-<uid>-<fabric>-*).  A file under these\n"
    "names that another user owns, or that grants group or other access, is\n"
    "refused: never read, and never removed by clean.\n"
    "\n"
    "commands:\n"
    "  list                    fabrics of this user: ABI version, devices, processes\n"
    "  show [FABRIC]           devices of a fabric with GUIDs, ports, LIDs, link layer,\n"
    "                          state, and the processes holding leases; FABRIC defaults\n"
    "                          to the one programs would use (SOFTVERBS_FABRIC, the\n"
    "                          config file, or \"default\")\n"
    "  clean [--force] FABRIC  remove the fabric's segments; refused while a live\n"
    "                          process holds a lease or maps a segment, unless --force\n"
    "\n"
    "exit status: 0 success, 1 error or refusal, 2 usage error\n";

int usage_error(const std::string &msg)
{
	fprintf(stderr, "softverbs: %s\n", msg.c_str());
	fprintf(stderr, "Try 'softverbs --help'.\n");
	return 2;
}

std::string join(const std::vector<std::string> &v, const char *sep)
{
	std::string s;
	for (auto &x : v)
		s += (s.empty() ? "" : sep) + x;
	return s;
}

std::string pid_list(const std::vector<pid_t> &v)
{
	std::vector<std::string> s;
	for (pid_t p : v)
		s.push_back(std::to_string(p));
	return join(s, ",");
}

std::vector<pid_t> live_lease_pids(const fabric_info &f)
{
	std::vector<pid_t> v;
	for (auto &l : f.leases)
		if (l.live)
			v.push_back(static_cast<pid_t>(l.pid));
	return v;
}

// One line on the segment's state; for another ABI version both versions,
// since neither side can read the other's records.
std::string state_text(const fabric_info &f)
{
	if (f.status == seg_status::other_version)
		return "ABI version " + std::to_string(f.abi_version) +
		       ", this tool reads version " + std::to_string(SV_ABI_VERSION) +
		       "; its records are not read";
	if (f.status == seg_status::ok)
		return "ok";
	return std::string(status_name(f.status)) + (f.error.empty() ? "" : ": " + f.error);
}

int cmd_list(int argc, char **argv)
{
	if (argc > 0)
		return usage_error("list takes no arguments");
	(void)argv;
	auto fabrics = list_fabrics();
	if (fabrics.empty()) {
		printf("no softverbs fabrics for uid %u in /dev/shm\n", getuid());
		return 0;
	}
	printf("%-20s %-4s %-24s %-28s %s\n", "FABRIC", "ABI", "DEVICES", "PROCESSES", "STATE");
	for (auto &f : fabrics) {
		std::vector<std::string> devs;
		for (auto &d : f.devices)
			devs.push_back(d.name);
		std::string abi = f.abi_version ? std::to_string(f.abi_version) : "-";
		std::string procs;
		if (f.status == seg_status::ok) {
			auto live = live_lease_pids(f);
			procs = std::to_string(live.size()) + " live";
			if (!live.empty())
				procs += " (" + pid_list(live) + ")";
			// Closed leases were given back cleanly: nothing to report.
			if (unsigned stale = f.exited_leases())
				procs += ", " + std::to_string(stale) + " exited";
		} else {
			procs = std::to_string(f.mappers.size()) + " mapping";
			if (!f.mappers.empty())
				procs += " (" + pid_list(f.mappers) + ")";
		}
		std::string state = state_text(f);
		if (!f.object_segments.empty())
			state +=
			    "; " + std::to_string(f.object_segments.size()) + " object segments";
		if (!f.foreign_segments.empty())
			state += "; " + std::to_string(f.foreign_segments.size()) +
				 " segments of another user (refused)";
		printf("%-20s %-4s %-24s %-28s %s\n", f.name.c_str(), abi.c_str(),
		       devs.empty() ? "-" : join(devs, ",").c_str(), procs.c_str(), state.c_str());
	}
	return 0;
}

int cmd_show(int argc, char **argv)
{
	std::string name;
	if (argc > 1)
		return usage_error("show takes at most one FABRIC");
	if (argc == 1) {
		name = argv[0];
	} else {
		loop::config cfg;
		std::string err;
		if (!loop::load_config(cfg, err)) {
			fprintf(stderr, "softverbs: %s\n", err.c_str());
			return 1;
		}
		name = cfg.fabric;
	}
	if (!loop::valid_fabric_name(name))
		return usage_error("'" + name + "' is not a fabric name");
	fabric_info f;
	if (!inspect_fabric(name, f)) {
		fprintf(stderr, "softverbs: no fabric '%s' for uid %u in /dev/shm\n", name.c_str(),
			getuid());
		return 1;
	}
	printf("fabric %s\n", f.name.c_str());
	printf("  segment:     %s\n", f.path.c_str());
	printf("  state:       %s\n", state_text(f).c_str());
	if (f.abi_version)
		printf("  ABI version: %u\n", f.abi_version);
	if (f.creator_pid)
		printf("  created by:  pid %u\n", f.creator_pid);
	for (auto &s : f.object_segments)
		printf("  object:      %s\n", s.c_str());
	for (auto &s : f.foreign_segments)
		printf("  not ours:    %s (another user's: refused)\n", s.c_str());
	if (f.status != seg_status::ok) {
		if (!f.mappers.empty())
			printf("  mapped by:   pid %s\n", pid_list(f.mappers).c_str());
		// Nothing past the header can be trusted: report and stop.
		return f.status == seg_status::other_version ? 0 : 1;
	}
	printf("  leases:      %u live, %u exited, %zu closed\n", f.live_leases(),
	       f.exited_leases(), f.leases.size() - f.live_leases() - f.exited_leases());
	for (auto &l : f.leases) {
		// Which copy path the process used to reach its peers' memory.
		std::string path;
		if (l.flags & SV_LEASE_CMA_USED)
			path += " cross-memory-attach";
		if (l.flags & SV_LEASE_CMA_REFUSED)
			path += " cross-memory-attach-refused";
		if (l.flags & SV_LEASE_SERVICE_USED)
			path += " service-copy";
		if (l.flags & SV_LEASE_MAPPED_USED)
			path += " mapped-file";
		if (l.flags & SV_LEASE_DIRECT_USED)
			path += " mapped-direct";
		if (l.flags & SV_LEASE_EXPRESS_USED)
			path += " express";
		printf("    slot %-3u pid %-8u %s%s%s\n", l.slot, l.pid,
		       l.live ? "live" : l.closed ? "closed" : "exited",
		       path.empty() ? "" : "  data path:", path.c_str());
	}
	for (auto &d : f.devices) {
		printf("device %s\n", d.name.c_str());
		printf("  index:       %u\n", d.index);
		printf("  node GUID:   %s\n", format_guid(d.node_guid).c_str());
		printf("  ports:       %zu\n", d.ports.size());
		for (auto &p : d.ports) {
			printf("  port %u\n", p.port_num);
			printf("    state:       %s (%u)\n", port_state_name(p.state), p.state);
			printf("    link layer:  %s\n", link_layer_name(p.link_layer));
			printf("    LID:         %u (0x%04x)\n", p.lid, p.lid);
			printf("    port GUID:   %s\n", format_guid(p.port_guid).c_str());
			printf("    active MTU:  %d\n", mtu_bytes(p.active_mtu));
			const sv_wire_counters &w = p.wire;
			if (w.tx_packets || w.rx_packets || w.drop_bad_icrc || w.drop_malformed ||
			    w.drop_unknown_qp || w.drop_other || w.drop_injected) {
				printf("    RoCE v2:     %llu packets sent, %llu received, %llu "
				       "retransmitted\n",
				       (unsigned long long)w.tx_packets,
				       (unsigned long long)w.rx_packets,
				       (unsigned long long)w.retransmits);
				printf("    NAKs:        %llu sent, %llu received\n",
				       (unsigned long long)w.naks_sent,
				       (unsigned long long)w.naks_received);
				printf("    drops:       %llu bad ICRC, %llu malformed, %llu unknown QP, "
				       "%llu other, %llu injected\n",
				       (unsigned long long)w.drop_bad_icrc,
				       (unsigned long long)w.drop_malformed,
				       (unsigned long long)w.drop_unknown_qp,
				       (unsigned long long)w.drop_other,
				       (unsigned long long)w.drop_injected);
			}
		}
	}
	return 0;
}

int cmd_clean(int argc, char **argv)
{
	bool force = false;
	std::string name;
	for (int i = 0; i < argc; i++) {
		std::string a = argv[i];
		if (a == "--force" || a == "-f")
			force = true;
		else if (a.size() > 1 && a[0] == '-')
			return usage_error("clean: unknown option '" + a + "'");
		else if (name.empty())
			name = a;
		else
			return usage_error("clean takes one FABRIC");
	}
	if (name.empty())
		return usage_error("clean needs a FABRIC (see 'softverbs list')");
	if (!loop::valid_fabric_name(name))
		return usage_error("'" + name + "' is not a fabric name");
	fabric_info f;
	if (!inspect_fabric(name, f)) {
		fprintf(stderr, "softverbs: no fabric '%s' for uid %u in /dev/shm\n", name.c_str(),
			getuid());
		return 1;
	}
	// Two checks, because either may be blind: leases need a registry we
	// can read, while the maps scan works for any version but misses a
	// process that has not mapped anything yet.
	auto live = live_lease_pids(f);
	std::vector<pid_t> busy = live;
	for (pid_t p : f.mappers)
		if (std::find(busy.begin(), busy.end(), p) == busy.end())
			busy.push_back(p);
	if (!busy.empty() && !force) {
		fprintf(stderr,
			"softverbs: fabric '%s' is in use by live processes (pid %s); stop them "
			"first, or use 'softverbs clean --force %s'\n",
			name.c_str(), pid_list(busy).c_str(), name.c_str());
		return 1;
	}
	if (f.status == seg_status::other_version)
		printf("fabric %s has ABI version %u (this tool reads version %u); removing it "
		       "anyway\n",
		       name.c_str(), f.abi_version, SV_ABI_VERSION);
	int ret = 0;
	std::vector<std::string> paths = f.object_segments;
	if (std::find(f.foreign_segments.begin(), f.foreign_segments.end(), f.path) ==
	    f.foreign_segments.end())
		paths.push_back(f.path);
	for (auto &p : f.foreign_segments) {
		fprintf(stderr, "softverbs: leaving %s alone: it belongs to another user\n",
			p.c_str());
		ret = 1;
	}
	unsigned removed = 0;
	for (auto &p : paths) {
		if (unlink(p.c_str()) == 0) {
			removed++;
		} else if (errno != ENOENT) {
			fprintf(stderr, "softverbs: cannot remove %s: %s\n", p.c_str(),
				strerror(errno));
			ret = 1;
		}
	}
	printf("removed %u segment%s of fabric %s%s\n", removed, removed == 1 ? "" : "s",
	       name.c_str(), busy.empty() ? "" : " (processes still running were forced)");
	return ret;
}

} // namespace

int main(int argc, char **argv)
{
	if (argc < 2)
		return usage_error("missing COMMAND");
	std::string cmd = argv[1];
	if (cmd == "--help" || cmd == "-h" || cmd == "help") {
		fputs(kUsage, stdout);
		return 0;
	}
	for (int i = 2; i < argc; i++)
		if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
			fputs(kUsage, stdout);
			return 0;
		}
	if (cmd == "list")
		return cmd_list(argc - 2, argv + 2);
	if (cmd == "show")
		return cmd_show(argc - 2, argv + 2);
	if (cmd == "clean")
		return cmd_clean(argc - 2, argv + 2);
	return usage_error("unknown command '" + cmd + "'");
}
