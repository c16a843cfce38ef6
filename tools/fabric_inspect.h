// SPDX-License-Identifier: MIT
// Read-only view of the fabrics in /dev/shm, shared by the softverbs command
// and the softverbs_fabric Python module.
//
// It reads segments through kernel-abi/softverbs-abi.h alone and never links
// the provider: a tool must be able to describe (and remove) a segment that
// the library would refuse, such as one of another ABI version.  Only the
// 64-byte sv_seg_hdr is trusted to mean the same in every version; nothing
// past it is read unless magic, kind and abi_version match this build.
#pragma once

#include "../kernel-abi/softverbs-abi.h"

#include <cstdint>
#include <string>
#include <sys/types.h>
#include <vector>

namespace svtool
{

enum class seg_status {
	ok,	       // Ours, this ABI version, READY
	initialising,  // Smaller than a header, or state still INIT
	other_version, // Ours, but another ABI version: only the header is read
	foreign,       // Bad magic or unknown kind
	truncated,     // Header claims more bytes than the file holds
	unreadable,    // open/read failed (error holds why)
	refused,       // Another user's file, or one with group/other permission
		       // bits: never read (the library refuses it as well)
};

struct port_info {
	unsigned port_num;
	uint16_t lid;
	uint8_t state;
	uint8_t link_layer; // enum sv_link_layer
	uint8_t active_mtu;
	uint64_t port_guid;
	sv_wire_counters wire; // RoCE v2 counters (zero unless the port spoke it)
};

struct device_info {
	std::string name;
	uint32_t index;
	uint64_t node_guid;
	std::vector<port_info> ports;
};

struct lease_info {
	unsigned slot;
	uint32_t pid;
	uint32_t generation;
	uint64_t start_time;
	bool live; // pid exists and started at start_time
	uint32_t flags; // sv_lease_flags: the copy paths this process used
	// Released cleanly (its last context closed, or it exited): the slot is
	// free, pid is the process that held it, flags what it used.
	bool closed = false;
};

struct fabric_info {
	std::string name;
	std::string path; // /dev/shm/softverbs-<uid>-<name>
	seg_status status = seg_status::unreadable;
	std::string error;
	uint32_t abi_version = 0;
	uint32_t creator_pid = 0;
	uint64_t seg_size = 0;
	std::vector<device_info> devices;
	std::vector<lease_info> leases;		  // Slots in use, live or not, and closed ones
	std::vector<std::string> object_segments; // Full paths of -* segments (ours)
	// Paths under this fabric's names that another user owns: not ours,
	// never read, never removed (someone put them there beforehand).
	std::vector<std::string> foreign_segments;
	// Processes that map any of the fabric's segments, found in
	// /proc/<pid>/maps; the layout-independent liveness check.
	std::vector<pid_t> mappers;

	unsigned live_leases() const;
	// Leases of processes that ended without giving them back.
	unsigned exited_leases() const;
};

// "softverbs-<uid>-" for this user.
std::string segment_prefix();

// Every fabric of this user that has a registry segment, plus fabrics whose
// object segments outlived their registry (status unreadable, error says so).
std::vector<fabric_info> list_fabrics(const std::string &shm_dir = "/dev/shm");

// One fabric.  Returns false when it has no segment at all.
bool inspect_fabric(const std::string &name, fabric_info &out,
		    const std::string &shm_dir = "/dev/shm");

// Field 22 of /proc/<pid>/stat, or 0 if the process does not exist.
uint64_t process_start_time(pid_t pid);

std::string format_guid(uint64_t guid);
const char *status_name(seg_status s);
const char *port_state_name(uint8_t state);
const char *link_layer_name(uint8_t ll);
int mtu_bytes(uint8_t mtu);

} // namespace svtool
