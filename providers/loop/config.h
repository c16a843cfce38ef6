// SPDX-License-Identifier: MIT
// Configuration: environment variables first, then a config file.  See
// docs/configuration.md for every key.
#pragma once

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
};

struct config {
	std::string fabric = "default";
	std::vector<device_config> devices;
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

} // namespace loop
