// SPDX-License-Identifier: MIT
// Configuration: environment variables first, then a config file.  See
// docs/configuration.md for every key.
#pragma once

#include "loop_param.h"

#include <infiniband/verbs.h>

#include <string>
#include <vector>

namespace loop {

struct device_config {
	std::string name;
	int num_ports = 1;
	int link_layer = IBV_LINK_LAYER_INFINIBAND;
	ibv_mtu mtu = IBV_MTU_4096;
	std::string netdev = "lo"; // Ethernet ports take their GIDs from it
	// RoCE v2 over UDP to other hosts (Ethernet ports): the UDP port every
	// packet goes to (4791; another for tests only).
	bool rocev2 = false;
	uint16_t udp_port = 4791;
};

// Object limits of a fabric (ibv_query_device's max_pd, max_qp, ...).  The
// process that creates a fabric writes them into its registry; every process
// of the fabric then uses those (sv_limits), whatever its own settings.
struct fabric_limits {
	uint32_t pd = kMaxPd;
	uint32_t qp = kMaxQp;
	uint32_t cq = kMaxCq;
	uint32_t mr = kMaxMr;
	uint32_t mw = kMaxMw;
	uint32_t ah = kMaxAh;
	uint32_t srq = kMaxSrq;
};

// How the engine thread waits for agents' doorbells (docs/agent.md).
enum class engine_mode {
	futex, // Spins briefly, then sleeps on a futex that the doorbell wakes
	poll,  // Never sleeps while agent rings exist: agents never make a system call
};

struct config {
	std::string fabric = "default";
	std::vector<device_config> devices;
	fabric_limits limits;
	engine_mode engine = engine_mode::futex; // Per process, not per fabric
};

// Parses the environment (and the file named by SOFTVERBS_CONFIG, or the
// default locations).  Returns false with a message naming the variable or
// the file line when a value is bad.
bool load_config(config &out, std::string &error);

// Exposed for unit tests.
bool parse_device_list(const std::string &value, std::vector<std::string> &names,
		       std::string &error);
bool valid_fabric_name(const std::string &name);
bool apply_config_line(config &cfg, const std::string &line, std::string &error);
bool parse_engine_mode(const std::string &value, engine_mode &out);
// Checks that the limits fit the registry's tables together; false with a
// message otherwise.
bool check_limits(const fabric_limits &l, std::string &error);

} // namespace loop
