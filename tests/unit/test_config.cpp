// SPDX-License-Identifier: MIT
// The configuration parser: device lists, config-file lines, and
// load_config() with the environment and a config file together.
#include "../../providers/loop/config.h"
#include "../../kernel-abi/softverbs-abi.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <unistd.h>

using loop::apply_config_line;
using loop::config;
using loop::load_config;
using loop::parse_device_list;

namespace
{

// Each load_config test starts from a known environment: a private HOME
// (so ~/.config/softverbs.conf of the machine never leaks in) and none of
// our variables set.  /etc/softverbs.conf is kept out by always pointing
// SOFTVERBS_CONFIG at a file of the test's own.
class LoadConfig : public ::testing::Test
{
      protected:
	void SetUp() override
	{
		char tmpl[] = "/tmp/softverbs-unit-XXXXXX";
		ASSERT_NE(mkdtemp(tmpl), nullptr);
		dir_ = tmpl;
		const char *home = getenv("HOME");
		if (home)
			old_home_ = home;
		had_home_ = home != nullptr;
		setenv("HOME", dir_.c_str(), 1);
		unsetenv("SOFTVERBS_DEVICES");
		unsetenv("SOFTVERBS_FABRIC");
		unsetenv("SOFTVERBS_CONFIG");
		unsetenv("SOFTVERBS_ENGINE");
	}
	void TearDown() override
	{
		unsetenv("SOFTVERBS_DEVICES");
		unsetenv("SOFTVERBS_FABRIC");
		unsetenv("SOFTVERBS_CONFIG");
		unsetenv("SOFTVERBS_ENGINE");
		if (had_home_)
			setenv("HOME", old_home_.c_str(), 1);
		else
			unsetenv("HOME");
		std::string cmd = "rm -rf '" + dir_ + "'";
		(void)!system(cmd.c_str());
	}
	std::string write_file(const std::string &name, const std::string &text)
	{
		std::string path = dir_ + "/" + name;
		std::ofstream(path) << text;
		return path;
	}
	void use_config(const std::string &text)
	{
		setenv("SOFTVERBS_CONFIG", write_file("softverbs.conf", text).c_str(), 1);
	}

	std::string dir_, old_home_;
	bool had_home_ = false;
};

const loop::device_config *find(const config &c, const std::string &name)
{
	for (auto &d : c.devices)
		if (d.name == name)
			return &d;
	return nullptr;
}

} // namespace

TEST(ParseDeviceList, GoodLists)
{
	std::vector<std::string> names;
	std::string err;
	ASSERT_TRUE(parse_device_list("loop0", names, err)) << err;
	EXPECT_EQ(names, (std::vector<std::string>{"loop0"}));
	ASSERT_TRUE(parse_device_list(" loop0 , loop1,my_dev-2.x ", names, err)) << err;
	EXPECT_EQ(names, (std::vector<std::string>{"loop0", "loop1", "my_dev-2.x"}));
	std::string sixteen;
	for (int i = 0; i < 16; i++)
		sixteen += (i ? ",d" : "d") + std::to_string(i);
	ASSERT_TRUE(parse_device_list(sixteen, names, err)) << err;
	EXPECT_EQ(names.size(), 16u);
	ASSERT_TRUE(parse_device_list(std::string(63, 'a'), names, err)) << err;
}

TEST(ParseDeviceList, BadListsSayWhy)
{
	struct {
		const char *value;
		const char *expect; // A piece of the message
	} cases[] = {
	    {"", "'' is not a device name"},	   {"loop0,,loop1", "'' is not a device name"},
	    {"loop0,", "'' is not a device name"}, {"lo op", "'lo op' is not a device name"},
	    {"a/b", "'a/b' is not a device name"}, {"loop0,loop1,loop0", "'loop0' is listed twice"},
	};
	for (auto &c : cases) {
		std::vector<std::string> names;
		std::string err;
		EXPECT_FALSE(parse_device_list(c.value, names, err)) << c.value;
		EXPECT_NE(err.find(c.expect), std::string::npos)
		    << "value '" << c.value << "' gave: " << err;
	}
	std::vector<std::string> names;
	std::string err;
	EXPECT_FALSE(parse_device_list(std::string(64, 'a'), names, err));
	EXPECT_NE(err.find("not a device name"), std::string::npos) << err;
	std::string seventeen;
	for (int i = 0; i < 17; i++)
		seventeen += (i ? ",d" : "d") + std::to_string(i);
	EXPECT_FALSE(parse_device_list(seventeen, names, err));
	EXPECT_NE(err.find("at most 16"), std::string::npos) << err;
}

TEST(ApplyConfigLine, GoodLines)
{
	config c;
	std::string err;
	ASSERT_TRUE(apply_config_line(c, "", err)) << err;
	ASSERT_TRUE(apply_config_line(c, "   # only a comment", err)) << err;
	ASSERT_TRUE(apply_config_line(c, "fabric = lab-1", err)) << err;
	EXPECT_EQ(c.fabric, "lab-1");
	ASSERT_TRUE(apply_config_line(c, "devices = mlx,eth0dev  # two", err)) << err;
	ASSERT_EQ(c.devices.size(), 2u);
	ASSERT_TRUE(apply_config_line(c, "mlx.ports = 2", err)) << err;
	ASSERT_TRUE(apply_config_line(c, "mlx.mtu = 1024", err)) << err;
	ASSERT_TRUE(apply_config_line(c, "eth0dev.link_layer = ethernet", err)) << err;
	ASSERT_TRUE(apply_config_line(c, "eth0dev.netdev = veth1", err)) << err;
	const loop::device_config *mlx = find(c, "mlx"), *eth = find(c, "eth0dev");
	ASSERT_TRUE(mlx && eth);
	EXPECT_EQ(mlx->num_ports, 2);
	EXPECT_EQ(mlx->mtu, IBV_MTU_1024);
	EXPECT_EQ(mlx->link_layer, IBV_LINK_LAYER_INFINIBAND);
	EXPECT_EQ(eth->num_ports, 1);
	EXPECT_EQ(eth->link_layer, IBV_LINK_LAYER_ETHERNET);
	EXPECT_EQ(eth->netdev, "veth1");
	EXPECT_FALSE(eth->rocev2);
	EXPECT_EQ(eth->udp_port, 4791);
	ASSERT_TRUE(apply_config_line(c, "eth0dev.rocev2 = on", err)) << err;
	ASSERT_TRUE(apply_config_line(c, "eth0dev.udp_port = 18515", err)) << err;
	EXPECT_TRUE(eth->rocev2);
	EXPECT_EQ(eth->udp_port, 18515);
	ASSERT_TRUE(apply_config_line(c, "eth0dev.rocev2 = off", err)) << err;
	EXPECT_FALSE(eth->rocev2);
	ASSERT_TRUE(apply_config_line(c, "eth0dev.link_layer = ib", err)) << err;
	EXPECT_EQ(eth->link_layer, IBV_LINK_LAYER_INFINIBAND);
	ASSERT_TRUE(apply_config_line(c, "eth0dev.link_layer = roce", err)) << err;
	EXPECT_EQ(eth->link_layer, IBV_LINK_LAYER_ETHERNET);
	ASSERT_TRUE(apply_config_line(c, "mlx.mtu=256", err)) << err;
	EXPECT_EQ(find(c, "mlx")->mtu, IBV_MTU_256);
	// Re-listing devices keeps the settings of devices that stay.
	ASSERT_TRUE(apply_config_line(c, "devices = mlx,other", err)) << err;
	ASSERT_NE(find(c, "mlx"), nullptr);
	EXPECT_EQ(find(c, "mlx")->num_ports, 2);
	EXPECT_EQ(find(c, "other")->num_ports, 1);
	EXPECT_EQ(find(c, "eth0dev"), nullptr);
}

TEST(ApplyConfigLine, EveryBadValueNamesItsKey)
{
	struct {
		const char *line;
		const char *expect;
	} cases[] = {
	    {"just words", "expected 'key = value'"},
	    {"fabric = ", "fabric:"},
	    {"fabric = has space", "fabric: 'has space'"},
	    {"fabric = a/b", "fabric: 'a/b'"},
	    {"fabric = aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "fabric:"}, // 33 characters
	    {"devices = ", "devices:"},
	    {"devices = a,,b", "devices:"},
	    {"devices = a,a", "devices:"},
	    {"colour = blue", "unknown key 'colour'"},
	    {"nodev.ports = 1", "'nodev.ports' names device 'nodev'"},
	    {"loop0.ports = 0", "loop0.ports: '0'"},
	    {"loop0.ports = 3", "loop0.ports: '3'"},
	    {"loop0.ports = two", "loop0.ports: 'two'"},
	    {"loop0.ports = 1x", "loop0.ports: '1x'"},
	    {"loop0.ports =", "loop0.ports: ''"},
	    {"loop0.link_layer = token-ring", "loop0.link_layer: 'token-ring'"},
	    {"loop0.mtu = 1500", "loop0.mtu: '1500'"},
	    {"loop0.mtu = 8192", "loop0.mtu: '8192'"},
	    {"loop0.netdev = a-very-long-ifname", "loop0.netdev: 'a-very-long-ifname'"},
	    {"loop0.netdev = eth/0", "loop0.netdev: 'eth/0'"},
	    {"loop0.rocev2 = maybe", "loop0.rocev2: 'maybe' is not on or off"},
	    {"loop0.udp_port = 0", "loop0.udp_port: '0' is not a UDP port"},
	    {"loop0.udp_port = 65536", "loop0.udp_port: '65536'"},
	    {"loop0.udp_port = 47x", "loop0.udp_port: '47x'"},
	    {"loop0.speed = 100", "unknown key 'loop0.speed'"},
	};
	for (auto &c : cases) {
		config cfg;
		cfg.devices.push_back(loop::device_config{"loop0"});
		const config before = cfg;
		std::string err;
		EXPECT_FALSE(apply_config_line(cfg, c.line, err)) << c.line;
		EXPECT_NE(err.find(c.expect), std::string::npos)
		    << "line '" << c.line << "' gave: " << err;
		// A refused line changes nothing.
		EXPECT_EQ(cfg.fabric, before.fabric) << c.line;
		ASSERT_EQ(cfg.devices.size(), 1u) << c.line;
		EXPECT_EQ(cfg.devices[0].num_ports, 1) << c.line;
		EXPECT_EQ(cfg.devices[0].mtu, IBV_MTU_4096) << c.line;
		EXPECT_EQ(cfg.devices[0].netdev, "lo") << c.line;
	}
}

TEST_F(LoadConfig, Defaults)
{
	use_config("");
	config c;
	std::string err;
	ASSERT_TRUE(load_config(c, err)) << err;
	EXPECT_EQ(c.fabric, "default");
	ASSERT_EQ(c.devices.size(), 1u);
	EXPECT_EQ(c.devices[0].name, "loop0");
	EXPECT_EQ(c.devices[0].num_ports, 1);
	EXPECT_EQ(c.devices[0].link_layer, IBV_LINK_LAYER_INFINIBAND);
	EXPECT_EQ(c.devices[0].mtu, IBV_MTU_4096);
}

TEST_F(LoadConfig, EnvironmentOnly)
{
	use_config("");
	setenv("SOFTVERBS_DEVICES", "loop0,loop1", 1);
	setenv("SOFTVERBS_FABRIC", "ci_42", 1);
	config c;
	std::string err;
	ASSERT_TRUE(load_config(c, err)) << err;
	EXPECT_EQ(c.fabric, "ci_42");
	ASSERT_EQ(c.devices.size(), 2u);
	EXPECT_EQ(c.devices[0].name, "loop0");
	EXPECT_EQ(c.devices[1].name, "loop1");
}

TEST_F(LoadConfig, FileThenEnvironmentOverrides)
{
	use_config("# test file\n"
		   "fabric = fromfile\n"
		   "\n"
		   "devices = a, b\n"
		   "a.ports = 2\n"
		   "b.link_layer = ethernet\n"
		   "b.netdev = veth0\n"
		   "b.mtu = 2048\n");
	config c;
	std::string err;
	ASSERT_TRUE(load_config(c, err)) << err;
	EXPECT_EQ(c.fabric, "fromfile");
	ASSERT_EQ(c.devices.size(), 2u);
	EXPECT_EQ(find(c, "a")->num_ports, 2);
	EXPECT_EQ(find(c, "b")->link_layer, IBV_LINK_LAYER_ETHERNET);
	EXPECT_EQ(find(c, "b")->netdev, "veth0");
	EXPECT_EQ(find(c, "b")->mtu, IBV_MTU_2048);

	// The environment wins over the file, and keeps the file's settings for
	// the devices it lists.
	setenv("SOFTVERBS_FABRIC", "fromenv", 1);
	setenv("SOFTVERBS_DEVICES", "b,a,c", 1);
	ASSERT_TRUE(load_config(c, err)) << err;
	EXPECT_EQ(c.fabric, "fromenv");
	ASSERT_EQ(c.devices.size(), 3u);
	EXPECT_EQ(c.devices[0].name, "b");
	EXPECT_EQ(find(c, "a")->num_ports, 2);
	EXPECT_EQ(find(c, "b")->link_layer, IBV_LINK_LAYER_ETHERNET);
	EXPECT_EQ(find(c, "c")->num_ports, 1);
}

// Disabled: load_config() today rejects a valid file when SOFTVERBS_DEVICES
// leaves out a device that the file configures ("'a.ports' names device 'a',
// which is not in the device list").  Reported to the provider's owner;
// enable once the environment can pick a subset of the file's devices.
TEST_F(LoadConfig, EnvironmentPicksSubsetOfFileDevices)
{
	use_config("devices = a, b\n"
		   "a.ports = 2\n"
		   "b.link_layer = ethernet\n");
	setenv("SOFTVERBS_DEVICES", "b,c", 1);
	config c;
	std::string err;
	ASSERT_TRUE(load_config(c, err)) << err;
	ASSERT_EQ(c.devices.size(), 2u);
	EXPECT_EQ(find(c, "a"), nullptr);
	EXPECT_EQ(find(c, "b")->link_layer, IBV_LINK_LAYER_ETHERNET);
}

TEST_F(LoadConfig, FileConfiguresDevicesOnlyTheEnvironmentNames)
{
	// Per-device keys for a device that the file does not list are fine
	// when SOFTVERBS_DEVICES names it.
	use_config("envdev.ports = 2\n");
	setenv("SOFTVERBS_DEVICES", "envdev", 1);
	config c;
	std::string err;
	ASSERT_TRUE(load_config(c, err)) << err;
	ASSERT_EQ(c.devices.size(), 1u);
	EXPECT_EQ(c.devices[0].name, "envdev");
	EXPECT_EQ(c.devices[0].num_ports, 2);
}

TEST_F(LoadConfig, HomeConfigIsRead)
{
	ASSERT_EQ(system(("mkdir -p '" + dir_ + "/.config'").c_str()), 0);
	write_file(".config/softverbs.conf", "fabric = from_home\n");
	config c;
	std::string err;
	ASSERT_TRUE(load_config(c, err)) << err;
	EXPECT_EQ(c.fabric, "from_home");
}

TEST_F(LoadConfig, BadEnvironmentNamesTheVariable)
{
	use_config("");
	struct {
		const char *var, *value, *expect;
	} cases[] = {
	    {"SOFTVERBS_DEVICES", "", "SOFTVERBS_DEVICES: '' is not a device name"},
	    {"SOFTVERBS_DEVICES", "loop0,,loop1", "SOFTVERBS_DEVICES:"},
	    {"SOFTVERBS_DEVICES", "loop0,loop0", "SOFTVERBS_DEVICES: device 'loop0'"},
	    {"SOFTVERBS_DEVICES", "bad name", "SOFTVERBS_DEVICES: 'bad name'"},
	    {"SOFTVERBS_FABRIC", "", "SOFTVERBS_FABRIC: ''"},
	    {"SOFTVERBS_FABRIC", "no/slash", "SOFTVERBS_FABRIC: 'no/slash'"},
	    {"SOFTVERBS_FABRIC", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "SOFTVERBS_FABRIC:"},
	};
	for (auto &c : cases) {
		setenv(c.var, c.value, 1);
		config cfg;
		std::string err;
		EXPECT_FALSE(load_config(cfg, err)) << c.var << "=" << c.value;
		EXPECT_NE(err.find(c.expect), std::string::npos)
		    << c.var << "='" << c.value << "' gave: " << err;
		unsetenv(c.var);
	}
}

TEST_F(LoadConfig, MissingConfigFileNamesTheVariable)
{
	setenv("SOFTVERBS_CONFIG", (dir_ + "/does-not-exist.conf").c_str(), 1);
	config c;
	std::string err;
	EXPECT_FALSE(load_config(c, err));
	EXPECT_NE(err.find("SOFTVERBS_CONFIG: cannot read"), std::string::npos) << err;
	EXPECT_NE(err.find("does-not-exist.conf"), std::string::npos) << err;
}

TEST_F(LoadConfig, BadFileLineNamesFileLineAndKey)
{
	use_config("fabric = ok\n"
		   "# fine\n"
		   "loop0.mtu = 9000\n");
	config c;
	std::string err;
	EXPECT_FALSE(load_config(c, err));
	std::string path = dir_ + "/softverbs.conf";
	EXPECT_NE(err.find(path + ":3: loop0.mtu: '9000'"), std::string::npos) << err;

	use_config("devices = x\nx.color = red\n");
	EXPECT_FALSE(load_config(c, err));
	EXPECT_NE(err.find(":2: unknown key 'x.color'"), std::string::npos) << err;

	use_config("fabric = bad fabric\n");
	EXPECT_FALSE(load_config(c, err));
	EXPECT_NE(err.find(":1: fabric: 'bad fabric'"), std::string::npos) << err;
}

TEST(ApplyConfigLine, Limits)
{
	config c;
	std::string err;
	EXPECT_EQ(c.limits.qp, static_cast<uint32_t>(loop::kMaxQp));
	EXPECT_EQ(c.limits.mw, static_cast<uint32_t>(loop::kMaxMw));
	EXPECT_TRUE(loop::check_limits(c.limits, err)) << err; // The defaults fit together
	EXPECT_TRUE(apply_config_line(c, "max_qp = 8", err)) << err;
	EXPECT_TRUE(apply_config_line(c, "max_mw=2", err)) << err;
	EXPECT_EQ(c.limits.qp, 8u);
	EXPECT_EQ(c.limits.mw, 2u);
	EXPECT_FALSE(apply_config_line(c, "max_pd = 0", err));
	EXPECT_NE(err.find("max_pd: '0' is not a count"), std::string::npos) << err;
	EXPECT_FALSE(apply_config_line(c, "max_ah = lots", err));
	EXPECT_NE(err.find("max_ah"), std::string::npos) << err;
	loop::fabric_limits l;
	l.qp = SV_MAX_QPS + 1;
	EXPECT_FALSE(loop::check_limits(l, err));
	EXPECT_NE(err.find("max_qp"), std::string::npos) << err;
	l = loop::fabric_limits{};
	l.mr = SV_MAX_MRS - l.mw; // One key more than the table holds
	EXPECT_FALSE(loop::check_limits(l, err));
	EXPECT_NE(err.find("max_mr + max_mw"), std::string::npos) << err;
	l.mr = SV_MAX_MRS - 1 - l.mw;
	EXPECT_TRUE(loop::check_limits(l, err)) << err;
	l = loop::fabric_limits{};
	l.cq = SV_MAX_OBJS;
	EXPECT_FALSE(loop::check_limits(l, err));
	EXPECT_NE(err.find("max_qp + max_cq + max_srq"), std::string::npos) << err;
}

TEST_F(LoadConfig, LimitsFromTheEnvironmentWin)
{
	use_config("max_cq = 7\nmax_srq = 9\n");
	setenv("SOFTVERBS_MAX_CQ", "5", 1);
	config c;
	std::string err;
	bool ok = load_config(c, err);
	unsetenv("SOFTVERBS_MAX_CQ");
	ASSERT_TRUE(ok) << err;
	EXPECT_EQ(c.limits.cq, 5u);
	EXPECT_EQ(c.limits.srq, 9u);
	setenv("SOFTVERBS_MAX_QP", "4097", 1);
	ok = load_config(c, err);
	unsetenv("SOFTVERBS_MAX_QP");
	EXPECT_FALSE(ok);
	EXPECT_NE(err.find("max_qp"), std::string::npos) << err;
}

// The engine mode (docs/agent.md): futex by default, poll on request, from
// the file or the environment (which wins); anything else is refused.
TEST_F(LoadConfig, EngineMode)
{
	use_config("");
	config c;
	std::string err;
	ASSERT_TRUE(load_config(c, err)) << err;
	EXPECT_EQ(c.engine, loop::engine_mode::futex);
	use_config("engine = poll\n");
	ASSERT_TRUE(load_config(c, err)) << err;
	EXPECT_EQ(c.engine, loop::engine_mode::poll);
	setenv("SOFTVERBS_ENGINE", "futex", 1);
	ASSERT_TRUE(load_config(c, err)) << err;
	EXPECT_EQ(c.engine, loop::engine_mode::futex);
	setenv("SOFTVERBS_ENGINE", "spin", 1);
	EXPECT_FALSE(load_config(c, err));
	EXPECT_NE(err.find("SOFTVERBS_ENGINE: 'spin' is not an engine mode (futex or poll)"),
		  std::string::npos)
		<< err;
	unsetenv("SOFTVERBS_ENGINE");
	use_config("engine = Poll\n");
	EXPECT_FALSE(load_config(c, err));
	EXPECT_NE(err.find(":1: engine: 'Poll' is not an engine mode"), std::string::npos) << err;
}
