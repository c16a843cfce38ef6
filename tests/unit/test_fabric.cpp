// SPDX-License-Identifier: MIT
// The fabric registry: creating and re-attaching the segment, refusing one
// of another ABI version, device records, and lease slots.
#include "../../providers/loop/fabric.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <fcntl.h>
#include <fstream>
#include <glob.h>
#include <iterator>
#include <set>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

using loop::config;
using loop::device_config;
using loop::fabric;

namespace
{

// Every test gets a fabric of its own, and removes its segments (registry
// and any softverbs-<uid>-<fabric>-*) whatever the outcome.
class Fabric : public ::testing::Test
{
      protected:
	void SetUp() override
	{
		const auto *info = ::testing::UnitTest::GetInstance()->current_test_info();
		name_ = "ut" + std::to_string(getpid()) + "-" + std::to_string(counter_++) + "-" +
			std::string(info->name()).substr(0, 12);
		ASSERT_TRUE(loop::valid_fabric_name(name_)) << name_;
		path_ = "/dev/shm" + fabric::registry_name(name_);
		remove_segments();
	}
	void TearDown() override
	{
		for (fabric *f : opened_)
			delete f; // The mapping stays; the segment goes below.
		remove_segments();
		EXPECT_FALSE(exists(path_));
	}
	void remove_segments()
	{
		unlink(path_.c_str());
		glob_t g;
		if (glob((path_ + "-*").c_str(), 0, nullptr, &g) == 0) {
			for (size_t i = 0; i < g.gl_pathc; i++)
				unlink(g.gl_pathv[i]);
			globfree(&g);
		}
	}
	static bool exists(const std::string &p)
	{
		struct stat st;
		return stat(p.c_str(), &st) == 0;
	}
	config make_config(std::initializer_list<device_config> devs) const
	{
		config c;
		c.fabric = name_;
		c.devices = devs;
		return c;
	}
	// Opens and remembers, for TearDown.
	int open(const config &c, fabric *&f, std::string &err)
	{
		f = nullptr;
		int ret = fabric::open(c, f, err);
		if (ret == 0)
			opened_.push_back(f);
		return ret;
	}
	std::string contents() const
	{
		std::ifstream in(path_, std::ios::binary);
		return std::string(std::istreambuf_iterator<char>(in), {});
	}

	std::string name_, path_;
	std::vector<fabric *> opened_;
	static inline int counter_ = 0;
};

device_config dev(const char *name, int ports = 1, int link_layer = IBV_LINK_LAYER_INFINIBAND,
		  ibv_mtu mtu = IBV_MTU_4096)
{
	device_config d;
	d.name = name;
	d.num_ports = ports;
	d.link_layer = link_layer;
	d.mtu = mtu;
	return d;
}

// A child process that opens the fabric, takes a lease, reports its slot
// and exits when told to.  Plain exit codes, no gtest, in the child.
struct lease_child {
	pid_t pid = -1;
	int slot = -1;
	int go_fd = -1;

	bool start(const config &c)
	{
		int up[2], go[2];
		if (pipe(up) || pipe(go))
			return false;
		pid = fork();
		if (pid < 0)
			return false;
		if (pid == 0) {
			close(up[0]);
			close(go[1]);
			fabric *f = nullptr;
			std::string err;
			int s = fabric::open(c, f, err) == 0 ? f->lease() : -1000;
			if (write(up[1], &s, sizeof(s)) != sizeof(s))
				_exit(3);
			char b;
			(void)!read(go[0], &b, 1); // EOF when the parent says so
			_exit(s >= 0 ? 0 : 2);
		}
		close(up[1]);
		close(go[0]);
		go_fd = go[1];
		bool ok = read(up[0], &slot, sizeof(slot)) == sizeof(slot);
		close(up[0]);
		return ok;
	}
	// Returns the exit status.
	int finish()
	{
		if (go_fd >= 0)
			close(go_fd);
		go_fd = -1;
		int st = -1;
		if (pid > 0 && waitpid(pid, &st, 0) != pid)
			return -1;
		pid = -1;
		return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
	}
	~lease_child()
	{
		if (pid > 0) {
			kill(pid, SIGKILL);
			finish();
		}
	}
};

} // namespace

TEST_F(Fabric, CreatesRegistrySegment)
{
	ASSERT_FALSE(exists(path_));
	fabric *f;
	std::string err;
	ASSERT_EQ(open(make_config({dev("loop0")}), f, err), 0) << err;
	EXPECT_EQ(f->segment_path(), fabric::registry_name(name_));
	struct stat st;
	ASSERT_EQ(stat(path_.c_str(), &st), 0);
	EXPECT_EQ(st.st_mode & 0777, 0600u) << "the registry is private to its user";
	EXPECT_EQ(st.st_uid, getuid());
	EXPECT_GE(static_cast<size_t>(st.st_size), sizeof(sv_registry));
	const sv_registry *r = f->reg();
	EXPECT_EQ(r->hdr.magic, SV_SEG_MAGIC);
	EXPECT_EQ(r->hdr.abi_version, static_cast<uint32_t>(SV_ABI_VERSION));
	EXPECT_EQ(r->hdr.kind, static_cast<uint32_t>(SV_SEG_REGISTRY));
	EXPECT_EQ(r->hdr.state, static_cast<uint32_t>(SV_SEG_READY));
	EXPECT_EQ(r->hdr.creator_pid, static_cast<uint32_t>(getpid()));
	EXPECT_EQ(r->hdr.seg_size, static_cast<uint64_t>(st.st_size));
	EXPECT_EQ(r->num_devices, 1u);
}

TEST_F(Fabric, DeviceRecordsAreDistinct)
{
	fabric *f;
	std::string err;
	config c = make_config(
	    {dev("loop0"), dev("loop1", 2), dev("eth0", 1, IBV_LINK_LAYER_ETHERNET, IBV_MTU_1024)});
	ASSERT_EQ(open(c, f, err), 0) << err;
	ASSERT_EQ(f->reg()->num_devices, 3u);
	sv_device_rec *l0 = f->device("loop0"), *l1 = f->device("loop1"), *e0 = f->device("eth0");
	ASSERT_TRUE(l0 && l1 && e0);
	EXPECT_EQ(f->device("loop9"), nullptr);
	EXPECT_STREQ(l1->name, "loop1");
	EXPECT_EQ(l0->num_ports, 1u);
	EXPECT_EQ(l1->num_ports, 2u);
	EXPECT_EQ(e0->num_ports, 1u);
	EXPECT_EQ(std::set<uint32_t>({l0->index, l1->index, e0->index}).size(), 3u);

	std::set<uint16_t> lids;
	std::set<uint64_t> guids{l0->node_guid, l1->node_guid, e0->node_guid};
	EXPECT_EQ(guids.size(), 3u) << "node GUIDs must differ";
	for (sv_device_rec *d : {l0, l1}) {
		for (uint32_t p = 0; p < d->num_ports; p++) {
			const sv_port_rec &pr = d->ports[p];
			EXPECT_NE(pr.lid, 0) << d->name << " port " << p + 1;
			EXPECT_EQ(pr.link_layer, SV_LINK_IB);
			EXPECT_EQ(pr.state, IBV_PORT_ACTIVE);
			EXPECT_EQ(pr.active_mtu, IBV_MTU_4096);
			lids.insert(pr.lid);
			guids.insert(pr.port_guid);
		}
	}
	EXPECT_EQ(lids.size(), 3u) << "every InfiniBand port gets its own LID";
	EXPECT_EQ(e0->ports[0].lid, 0) << "Ethernet ports have no LID";
	EXPECT_EQ(e0->ports[0].link_layer, SV_LINK_ETH);
	EXPECT_EQ(e0->ports[0].active_mtu, IBV_MTU_1024);
	guids.insert(e0->ports[0].port_guid);
	EXPECT_EQ(guids.size(), 7u) << "node and port GUIDs all differ";

	// Another fabric with the same device names gets other GUIDs: the two
	// must look like different HCAs to a program that sees both.
	config other = c;
	other.fabric = name_ + "b";
	fabric *g;
	ASSERT_EQ(open(other, g, err), 0) << err;
	std::string other_path = "/dev/shm" + fabric::registry_name(other.fabric);
	EXPECT_NE(g->device("loop0")->node_guid, l0->node_guid);
	unlink(other_path.c_str());
}

TEST_F(Fabric, ReattachSeesTheSameRecords)
{
	fabric *f, *g, *h;
	std::string err;
	config c = make_config({dev("loop0"), dev("loop1")});
	ASSERT_EQ(open(c, f, err), 0) << err;
	const sv_device_rec before0 = *f->device("loop0"), before1 = *f->device("loop1");
	const uint32_t next_lid = f->reg()->next_lid;

	ASSERT_EQ(open(c, g, err), 0) << err;
	EXPECT_NE(static_cast<void *>(g->reg()), static_cast<void *>(f->reg()))
	    << "a second mapping of the same segment";
	EXPECT_EQ(g->reg()->num_devices, 2u);
	EXPECT_EQ(g->reg()->next_lid, next_lid) << "re-attaching hands out no LIDs";
	EXPECT_EQ(g->device("loop0")->node_guid, before0.node_guid);
	EXPECT_EQ(g->device("loop0")->ports[0].lid, before0.ports[0].lid);
	EXPECT_EQ(g->device("loop1")->ports[0].lid, before1.ports[0].lid);

	// A process configured with one more device adds it without
	// disturbing the others; writes through one mapping show in the other.
	config more = make_config({dev("loop0"), dev("loop1"), dev("loop2")});
	ASSERT_EQ(open(more, h, err), 0) << err;
	ASSERT_NE(f->device("loop2"), nullptr);
	EXPECT_EQ(f->reg()->num_devices, 3u);
	EXPECT_EQ(f->device("loop2")->index, 2u);
	EXPECT_EQ(f->device("loop2")->ports[0].lid, next_lid);
	EXPECT_EQ(f->device("loop0")->ports[0].lid, before0.ports[0].lid);
}

TEST_F(Fabric, OtherAbiVersionIsRefusedAndLeftAlone)
{
	fabric *f;
	std::string err;
	config c = make_config({dev("loop0")});
	ASSERT_EQ(open(c, f, err), 0) << err;
	const uint32_t theirs = SV_ABI_VERSION + 7;
	f->reg()->hdr.abi_version = theirs;
	const std::string before = contents();
	ASSERT_GE(before.size(), sizeof(sv_registry));

	fabric *g = nullptr;
	err.clear();
	int ret = fabric::open(c, g, err);
	EXPECT_NE(ret, 0);
	EXPECT_EQ(g, nullptr);
	EXPECT_NE(err.find("version " + std::to_string(theirs)), std::string::npos) << err;
	EXPECT_NE(err.find("version " + std::to_string(SV_ABI_VERSION)), std::string::npos) << err;
	EXPECT_NE(err.find(name_), std::string::npos) << "names the fabric: " << err;
	EXPECT_EQ(contents(), before) << "the other version's segment must not be touched";
	EXPECT_TRUE(exists(path_));
}

TEST_F(Fabric, ForeignSegmentIsRefused)
{
	int fd = ::open(path_.c_str(), O_CREAT | O_EXCL | O_WRONLY, 0600);
	ASSERT_GE(fd, 0);
	std::string junk(8192, 'x');
	ASSERT_EQ(write(fd, junk.data(), junk.size()), static_cast<ssize_t>(junk.size()));
	close(fd);
	// A non-READY state word makes open() wait for the creator first; make
	// it READY so that the magic check is what refuses it.
	{
		std::fstream io(path_, std::ios::in | std::ios::out | std::ios::binary);
		uint32_t ready = SV_SEG_READY;
		io.seekp(offsetof(sv_seg_hdr, state));
		io.write(reinterpret_cast<const char *>(&ready), sizeof(ready));
	}
	const std::string before = contents();
	fabric *f = nullptr;
	std::string err;
	EXPECT_EQ(fabric::open(make_config({dev("loop0")}), f, err), EPROTO);
	EXPECT_NE(err.find("not a softverbs fabric segment"), std::string::npos) << err;
	EXPECT_EQ(contents(), before);
}

TEST_F(Fabric, LeasesAreIdempotentAndRecordPidAndStartTime)
{
	fabric *f;
	std::string err;
	ASSERT_EQ(open(make_config({dev("loop0")}), f, err), 0) << err;
	int s = f->lease();
	ASSERT_GE(s, 0);
	EXPECT_EQ(f->lease(), s);
	const sv_lease &l = f->reg()->leases[s];
	EXPECT_EQ(l.pid, static_cast<uint32_t>(getpid()));
	EXPECT_NE(l.start_time, 0u);
	EXPECT_EQ(l.start_time, fabric::process_start_time(getpid()));
	EXPECT_EQ(fabric::process_start_time(0), 0u) << "no such process";
}

TEST_F(Fabric, LeaseSlotOfDeadProcessIsReused)
{
	fabric *f;
	std::string err;
	config c = make_config({dev("loop0")});
	ASSERT_EQ(open(c, f, err), 0) << err;

	lease_child first;
	ASSERT_TRUE(first.start(c));
	ASSERT_GE(first.slot, 0);
	const sv_lease held = f->reg()->leases[first.slot];
	EXPECT_EQ(held.pid, static_cast<uint32_t>(first.pid));
	EXPECT_EQ(held.start_time, fabric::process_start_time(first.pid));

	// While the child lives its slot is taken.
	int mine = f->lease();
	ASSERT_GE(mine, 0);
	EXPECT_NE(mine, first.slot);
	ASSERT_EQ(first.finish(), 0);

	// Dead now: its record stays until someone needs the slot, and the
	// next process to lease gets it.
	EXPECT_EQ(f->reg()->leases[first.slot].pid, held.pid);
	lease_child second;
	ASSERT_TRUE(second.start(c));
	EXPECT_EQ(second.slot, first.slot);
	const sv_lease &now = f->reg()->leases[second.slot];
	EXPECT_EQ(now.pid, static_cast<uint32_t>(second.pid));
	EXPECT_GT(now.generation, held.generation);
	EXPECT_EQ(second.finish(), 0);
	EXPECT_EQ(f->lease(), mine) << "our own lease is untouched";
}
