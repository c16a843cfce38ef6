// SPDX-License-Identifier: MIT
#include "config.h"

#include "../../kernel-abi/softverbs-abi.h"

#include <cctype>
#include <cstdlib>
#include <fstream>
#include <map>
#include <unistd.h>

namespace loop {

namespace {

std::string trim(const std::string &s)
{
	size_t b = s.find_first_not_of(" \t\r\n");
	if (b == std::string::npos)
		return "";
	size_t e = s.find_last_not_of(" \t\r\n");
	return s.substr(b, e - b + 1);
}

bool valid_name(const std::string &n, size_t max)
{
	if (n.empty() || n.size() > max)
		return false;
	for (char c : n)
		if (!isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-' && c != '.')
			return false;
	return true;
}

device_config *find_device(config &cfg, const std::string &name)
{
	for (auto &d : cfg.devices)
		if (d.name == name)
			return &d;
	return nullptr;
}

bool parse_int(const std::string &v, int lo, int hi, int &out)
{
	char *end = nullptr;
	long x = strtol(v.c_str(), &end, 10);
	if (v.empty() || *end || x < lo || x > hi)
		return false;
	out = static_cast<int>(x);
	return true;
}

bool parse_mtu(const std::string &v, ibv_mtu &out)
{
	static const std::map<std::string, ibv_mtu> m = {
		{"256", IBV_MTU_256},	{"512", IBV_MTU_512},	{"1024", IBV_MTU_1024},
		{"2048", IBV_MTU_2048}, {"4096", IBV_MTU_4096},
	};
	auto it = m.find(v);
	if (it == m.end())
		return false;
	out = it->second;
	return true;
}

bool set_devices(config &cfg, const std::string &value, std::string &error, const char *what)
{
	std::vector<std::string> names;
	if (!parse_device_list(value, names, error)) {
		error = std::string(what) + ": " + error;
		return false;
	}
	std::vector<device_config> devs;
	for (auto &n : names) {
		device_config *old = find_device(cfg, n);
		device_config d = old ? *old : device_config{};
		d.name = n;
		devs.push_back(d);
	}
	cfg.devices = devs;
	return true;
}

// The limits by name: the config file's key, and SOFTVERBS_ + its upper case.
struct limit_key {
	const char *key;
	const char *env;
	uint32_t fabric_limits::*field;
};
constexpr limit_key kLimitKeys[] = {
	{"max_pd", "SOFTVERBS_MAX_PD", &fabric_limits::pd},
	{"max_qp", "SOFTVERBS_MAX_QP", &fabric_limits::qp},
	{"max_cq", "SOFTVERBS_MAX_CQ", &fabric_limits::cq},
	{"max_mr", "SOFTVERBS_MAX_MR", &fabric_limits::mr},
	{"max_mw", "SOFTVERBS_MAX_MW", &fabric_limits::mw},
	{"max_ah", "SOFTVERBS_MAX_AH", &fabric_limits::ah},
	{"max_srq", "SOFTVERBS_MAX_SRQ", &fabric_limits::srq},
};

const limit_key *find_limit(const std::string &key)
{
	for (const limit_key &k : kLimitKeys)
		if (key == k.key)
			return &k;
	return nullptr;
}

bool set_limit(config &cfg, const limit_key &k, const std::string &val, const std::string &what,
	       std::string &error)
{
	int v;
	if (!parse_int(val, 1, kMaxCountCap, v)) {
		error = what + ": '" + val + "' is not a count (1 to " +
			std::to_string(kMaxCountCap) + ")";
		return false;
	}
	cfg.limits.*k.field = static_cast<uint32_t>(v);
	return true;
}

bool set_engine(config &cfg, const std::string &val, const std::string &what, std::string &error)
{
	if (!parse_engine_mode(val, cfg.engine)) {
		error = what + ": '" + val + "' is not an engine mode (futex or poll)";
		return false;
	}
	return true;
}

} // namespace

bool parse_engine_mode(const std::string &value, engine_mode &out)
{
	if (value == "futex")
		out = engine_mode::futex;
	else if (value == "poll")
		out = engine_mode::poll;
	else
		return false;
	return true;
}

bool check_limits(const fabric_limits &l, std::string &error)
{
	if (l.qp > SV_MAX_QPS) {
		error = "max_qp: " + std::to_string(l.qp) + " is more than the fabric's " +
			std::to_string(SV_MAX_QPS) + " QP numbers";
		return false;
	}
	// Every CQ, SRQ and QP receive queue is a queue object.
	uint64_t objs = uint64_t(l.qp) + l.cq + l.srq;
	uint64_t room = SV_MAX_OBJS - uint64_t(kObjsPerProcess) * SV_MAX_PROCS;
	if (objs > room) {
		error = "max_qp + max_cq + max_srq: " + std::to_string(objs) + " is more than the " +
			std::to_string(room) + " queue objects a fabric holds";
		return false;
	}
	uint64_t keys = uint64_t(l.mr) + l.mw;
	if (keys > SV_MAX_MRS - 1) {
		error = "max_mr + max_mw: " + std::to_string(keys) + " is more than the " +
			std::to_string(SV_MAX_MRS - 1) + " memory keys a fabric holds";
		return false;
	}
	return true;
}

bool valid_fabric_name(const std::string &name)
{
	return valid_name(name, 32);
}

bool parse_device_list(const std::string &value, std::vector<std::string> &names,
		       std::string &error)
{
	names.clear();
	size_t pos = 0;
	while (pos <= value.size()) {
		size_t comma = value.find(',', pos);
		std::string n = trim(value.substr(pos, comma == std::string::npos ? std::string::npos
										 : comma - pos));
		if (!valid_name(n, 63)) {
			error = "'" + n + "' is not a device name (letters, digits, '_', '-', '.'; 1 to 63 characters)";
			return false;
		}
		for (auto &o : names)
			if (o == n) {
				error = "device '" + n + "' is listed twice";
				return false;
			}
		names.push_back(n);
		if (comma == std::string::npos)
			break;
		pos = comma + 1;
	}
	if (names.size() > 16) {
		error = "at most 16 devices";
		return false;
	}
	return true;
}

// "key = value" with keys: fabric, devices, max_pd, max_qp, max_cq, max_mr,
// max_mw, max_ah, max_srq, engine, <device>.ports, <device>.link_layer,
// <device>.mtu, <device>.netdev, <device>.rocev2, <device>.udp_port.
bool apply_config_line(config &cfg, const std::string &raw, std::string &error)
{
	std::string line = trim(raw.substr(0, raw.find('#')));
	if (line.empty())
		return true;
	size_t eq = line.find('=');
	if (eq == std::string::npos) {
		error = "expected 'key = value'";
		return false;
	}
	std::string key = trim(line.substr(0, eq));
	std::string val = trim(line.substr(eq + 1));
	if (key == "fabric") {
		if (!valid_fabric_name(val)) {
			error = "fabric: '" + val + "' is not a fabric name";
			return false;
		}
		cfg.fabric = val;
		return true;
	}
	if (key == "devices")
		return set_devices(cfg, val, error, "devices");
	if (key == "engine")
		return set_engine(cfg, val, key, error);
	if (const limit_key *k = find_limit(key))
		return set_limit(cfg, *k, val, key, error);
	size_t dot = key.rfind('.');
	if (dot == std::string::npos) {
		error = "unknown key '" + key + "'";
		return false;
	}
	std::string dev = key.substr(0, dot), field = key.substr(dot + 1);
	device_config *d = find_device(cfg, dev);
	if (!d) {
		error = "'" + key + "' names device '" + dev + "', which is not in the device list";
		return false;
	}
	if (field == "ports") {
		if (!parse_int(val, 1, 2, d->num_ports)) {
			error = key + ": '" + val + "' is not a port count (1 or 2)";
			return false;
		}
	} else if (field == "link_layer") {
		if (val == "infiniband" || val == "ib")
			d->link_layer = IBV_LINK_LAYER_INFINIBAND;
		else if (val == "ethernet" || val == "roce")
			d->link_layer = IBV_LINK_LAYER_ETHERNET;
		else {
			error = key + ": '" + val + "' is not a link layer (infiniband or ethernet)";
			return false;
		}
	} else if (field == "mtu") {
		if (!parse_mtu(val, d->mtu)) {
			error = key + ": '" + val + "' is not an MTU (256, 512, 1024, 2048 or 4096)";
			return false;
		}
	} else if (field == "netdev") {
		if (!valid_name(val, 15)) {
			error = key + ": '" + val + "' is not an interface name";
			return false;
		}
		d->netdev = val;
	} else if (field == "rocev2") {
		if (val == "on" || val == "1" || val == "yes")
			d->rocev2 = true;
		else if (val == "off" || val == "0" || val == "no")
			d->rocev2 = false;
		else {
			error = key + ": '" + val + "' is not on or off";
			return false;
		}
	} else if (field == "udp_port") {
		int port = 0;
		if (!parse_int(val, 1, 65535, port)) {
			error = key + ": '" + val + "' is not a UDP port (1 to 65535)";
			return false;
		}
		d->udp_port = static_cast<uint16_t>(port);
	} else {
		error = "unknown key '" + key + "'";
		return false;
	}
	return true;
}

bool load_config(config &out, std::string &error)
{
	config cfg;
	cfg.devices.push_back(device_config{"loop0"});

	// The file first, so that the environment overrides it.
	std::string path;
	const char *env_path = getenv("SOFTVERBS_CONFIG");
	if (env_path && *env_path) {
		path = env_path;
		if (access(path.c_str(), R_OK) != 0) {
			error = "SOFTVERBS_CONFIG: cannot read '" + path + "'";
			return false;
		}
	} else {
		const char *home = getenv("HOME");
		std::string user = home ? std::string(home) + "/.config/softverbs.conf" : "";
		if (!user.empty() && access(user.c_str(), R_OK) == 0)
			path = user;
		else if (access("/etc/softverbs.conf", R_OK) == 0)
			path = "/etc/softverbs.conf";
	}

	// The environment's device list wins over the file's.  Per-device keys
	// in the file for devices it leaves out are then ignored, so one file
	// can describe more devices than a given run uses.
	const char *env_devs = getenv("SOFTVERBS_DEVICES");
	if (env_devs && !set_devices(cfg, env_devs, error, "SOFTVERBS_DEVICES"))
		return false;
	if (!path.empty()) {
		std::ifstream in(path);
		std::string line;
		int lineno = 0;
		while (std::getline(in, line)) {
			lineno++;
			std::string t = trim(line.substr(0, line.find('#')));
			std::string key = trim(t.substr(0, t.find('=')));
			if (env_devs && key == "devices")
				continue;
			size_t dot = key.rfind('.');
			if (env_devs && dot != std::string::npos && key != "fabric" &&
			    !find_device(cfg, key.substr(0, dot)))
				continue;
			std::string err;
			if (!apply_config_line(cfg, line, err)) {
				error = path + ":" + std::to_string(lineno) + ": " + err;
				return false;
			}
		}
	}
	const char *fabric = getenv("SOFTVERBS_FABRIC");
	if (fabric) {
		if (!valid_fabric_name(fabric)) {
			error = std::string("SOFTVERBS_FABRIC: '") + fabric +
				"' is not a fabric name (letters, digits, '_', '-', '.'; 1 to 32 characters)";
			return false;
		}
		cfg.fabric = fabric;
	}
	const char *engine = getenv("SOFTVERBS_ENGINE");
	if (engine && *engine && !set_engine(cfg, engine, "SOFTVERBS_ENGINE", error))
		return false;
	for (const limit_key &k : kLimitKeys) {
		const char *v = getenv(k.env);
		if (v && *v && !set_limit(cfg, k, v, k.env, error))
			return false;
	}
	if (!check_limits(cfg.limits, error))
		return false;
	out = cfg;
	return true;
}

} // namespace loop
