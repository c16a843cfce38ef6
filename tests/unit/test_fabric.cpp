// SPDX-License-Identifier: MIT
// The fabric registry: creating and re-attaching the segment, refusing one
// of another ABI version, device records, and lease slots.
#include "../../providers/loop/transport/loop/fabric.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <fstream>
#include <functional>
#include <glob.h>
#include <iterator>
#include <set>
#include <sstream>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <thread>
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

// Field 22 of a /proc stat file, parsed apart from the library's reader:
// everything after the last ')' split on whitespace.
static uint64_t start_field(const std::string &path)
{
	std::ifstream in(path);
	std::string line((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
	size_t p = line.rfind(')');
	if (p == std::string::npos)
		return 0;
	std::istringstream rest(line.substr(p + 1));
	std::string f;
	for (int i = 3; i <= 22; i++)
		if (!(rest >> f))
			return 0;
	return std::stoull(f);
}

TEST_F(Fabric, ProcessStartTimeReadsFieldTwentyTwoWhateverTheName)
{
	// A thread whose name holds the characters a naive parse trips on:
	// parentheses, spaces and digits.
	std::atomic<pid_t> t{0};
	std::atomic<bool> done{false};
	std::thread th([&] {
		pthread_setname_np(pthread_self(), ") ( 1 2 3 4 5");
		t = static_cast<pid_t>(syscall(SYS_gettid));
		while (!done)
			usleep(1000);
	});
	while (!t)
		usleep(1000);
	uint64_t want = start_field("/proc/self/task/" + std::to_string(t.load()) + "/stat");
	uint64_t got = fabric::process_start_time(t);
	done = true;
	th.join();
	ASSERT_NE(want, 0u);
	EXPECT_EQ(got, want);
	EXPECT_EQ(fabric::process_start_time(getpid()), start_field("/proc/self/stat"));
	EXPECT_EQ(fabric::process_start_time(-1), 0u);
	// A pid that is gone: a child reaped.
	pid_t c = fork();
	if (c == 0)
		_exit(0);
	ASSERT_GT(c, 0);
	ASSERT_EQ(waitpid(c, nullptr, 0), c);
	EXPECT_EQ(fabric::process_start_time(c), 0u);
}

// lease_alive believes a live answer for the rest of its coarse tick, no
// longer: a peer that died is reported dead within a few ticks, and a dead
// answer is never memoised.
TEST_F(Fabric, LeaseAliveMemoLastsATickAndNeverHidesADeath)
{
	fabric *f;
	std::string err;
	config c = make_config({dev("loop0")});
	ASSERT_EQ(open(c, f, err), 0) << err;
	lease_child peer;
	ASSERT_TRUE(peer.start(c));
	ASSERT_GE(peer.slot, 0);
	uint32_t slot = static_cast<uint32_t>(peer.slot);
	uint32_t gen = f->reg()->leases[slot].generation;
	EXPECT_TRUE(f->lease_alive(slot, gen));
	EXPECT_TRUE(f->lease_alive(slot, gen)) << "the memo's answer";
	EXPECT_FALSE(f->lease_alive(slot, gen + 1)) << "another generation is not memoised";
	ASSERT_EQ(kill(peer.pid, SIGKILL), 0);
	ASSERT_EQ(waitpid(peer.pid, nullptr, 0), peer.pid);
	peer.pid = -1;
	peer.finish(); // Closes its pipe
	// Dead within 100 ms (the coarse tick is 1 to 10 ms), and dead from then on.
	bool dead = false;
	for (int i = 0; i < 100 && !dead; i++) {
		dead = !f->lease_alive(slot, gen);
		if (!dead)
			usleep(1000);
	}
	EXPECT_TRUE(dead);
	EXPECT_FALSE(f->lease_alive(slot, gen));

	// A lease reaped is not believed even within the tick its memo was
	// stored in: the memo is read only after the lease's pid and
	// generation.
	lease_child other;
	ASSERT_TRUE(other.start(c));
	ASSERT_GE(other.slot, 0);
	uint32_t oslot = static_cast<uint32_t>(other.slot);
	uint32_t ogen = f->reg()->leases[oslot].generation;
	ASSERT_EQ(kill(other.pid, SIGKILL), 0);
	ASSERT_EQ(waitpid(other.pid, nullptr, 0), other.pid);
	other.pid = -1;
	other.finish();
	EXPECT_GE(f->reap_dead(), 1);
	EXPECT_FALSE(f->lease_alive(oslot, ogen));
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

// ---- the registry lock (sv_reg_lock) ----

namespace
{

uint32_t tid()
{
	return static_cast<uint32_t>(syscall(SYS_gettid));
}

std::atomic_ref<uint32_t> lock_word(fabric *f)
{
	return std::atomic_ref<uint32_t>(f->reg()->lock.word);
}

// A pid that surely names no process: a child that has exited and been reaped.
pid_t dead_pid()
{
	pid_t p = fork();
	if (p == 0)
		_exit(0);
	waitpid(p, nullptr, 0);
	return p;
}

// Runs fn in a forked child; returns its exit status, or -1 if it did not
// exit within limit_s seconds (then it is killed).
int in_child(const std::function<int()> &fn, int limit_s = 30)
{
	pid_t p = fork();
	if (p == 0) {
		alarm(static_cast<unsigned>(limit_s));
		_exit(fn());
	}
	int st = 0;
	if (waitpid(p, &st, 0) != p)
		return -1;
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

} // namespace

TEST_F(Fabric, RegistryLockIsRecursiveAndReleases)
{
	fabric *f;
	std::string err;
	ASSERT_EQ(open(make_config({dev("loop0")}), f, err), 0) << err;
	f->lock();
	EXPECT_EQ(lock_word(f).load() & SV_REG_LOCK_TID_MASK, tid());
	EXPECT_EQ(f->reg()->lock.holder_start, fabric::process_start_time(tid()));
	f->lock(); // A path that locks again while it holds it goes on
	f->unlock();
	EXPECT_EQ(lock_word(f).load() & SV_REG_LOCK_TID_MASK, tid()) << "still held once";
	f->unlock();
	EXPECT_EQ(lock_word(f).load(), 0u);
	EXPECT_EQ(f->reg()->lock.holder_start, 0u);

	// A second mapping of the same registry is the same lock.
	fabric *g;
	ASSERT_EQ(open(make_config({dev("loop0")}), g, err), 0) << err;
	f->lock();
	g->lock();
	g->unlock();
	EXPECT_EQ(lock_word(f).load() & SV_REG_LOCK_TID_MASK, tid());
	f->unlock();
	EXPECT_EQ(lock_word(g).load(), 0u);
}

TEST_F(Fabric, RegistryLockTakesOverValuesThatNameNoHolder)
{
	fabric *f;
	std::string err;
	ASSERT_EQ(open(make_config({dev("loop0")}), f, err), 0) << err;
	struct garbage {
		const char *what;
		uint32_t word;
		uint64_t start;
	};
	const uint32_t dead = static_cast<uint32_t>(dead_pid());
	const uint32_t live = static_cast<uint32_t>(getppid()); // Alive, not a holder
	const garbage cases[] = {
		{"all ones", 0xffffffffu, 0},
		{"bit 30 set", 0x40000000u | 5, 0},
		{"tid above PID_MAX_LIMIT", (1u << 22) + 5, 0},
		{"waiters flag with tid bits beyond pid_max", SV_REG_LOCK_WAITERS | 0x3ffffffu, 7},
		{"a dead thread", dead, fabric::process_start_time(getpid())},
		{"a dead thread, waiters flagged", dead | SV_REG_LOCK_WAITERS, 0},
		{"our own tid, not holding", tid(), 0},
		{"a live thread with another start time", live, 12345},
		{"a live thread that never recorded itself", live, 0},
		{"free but waiters flagged", SV_REG_LOCK_WAITERS, 0},
	};
	for (const garbage &g : cases) {
		SCOPED_TRACE(g.what);
		lock_word(f).store(g.word);
		f->reg()->lock.holder_start = g.start;
		// Taken over in a child too (another process, as a peer would).
		EXPECT_EQ(in_child([&] {
				  f->lock();
				  bool mine = (lock_word(f).load() & SV_REG_LOCK_TID_MASK) == tid();
				  f->unlock();
				  return mine && lock_word(f).load() == 0 ? 0 : 1;
			  }),
			  0);
		EXPECT_EQ(lock_word(f).load(), 0u);
		// And here.
		lock_word(f).store(g.word);
		f->reg()->lock.holder_start = g.start;
		f->lock();
		EXPECT_EQ(lock_word(f).load() & SV_REG_LOCK_TID_MASK, tid());
		EXPECT_EQ(f->reg()->lock.holder_start, fabric::process_start_time(tid()));
		f->unlock();
		EXPECT_EQ(lock_word(f).load(), 0u);
	}
}

TEST_F(Fabric, RegistryLockWaitsForALiveHolderAndTakesOverADeadOne)
{
	fabric *f;
	std::string err;
	ASSERT_EQ(open(make_config({dev("loop0")}), f, err), 0) << err;
	// A child takes the lock and holds it until told (a byte on a pipe),
	// then either releases it or dies holding it.
	for (bool dies : {false, true}) {
		SCOPED_TRACE(dies ? "holder dies" : "holder releases");
		int up[2], go[2];
		ASSERT_EQ(pipe(up), 0);
		ASSERT_EQ(pipe(go), 0);
		pid_t holder = fork();
		ASSERT_GE(holder, 0);
		if (holder == 0) {
			alarm(30);
			f->lock();
			char b = 1;
			(void)!write(up[1], &b, 1);
			(void)!read(go[0], &b, 1);
			if (b == 'k')
				_exit(0); // Dies holding it
			f->unlock();
			_exit(0);
		}
		char b;
		ASSERT_EQ(read(up[0], &b, 1), 1);
		EXPECT_EQ(lock_word(f).load() & SV_REG_LOCK_TID_MASK, static_cast<uint32_t>(holder));
		std::atomic<bool> got{false};
		std::thread waiter([&] {
			f->lock();
			got = true;
			f->unlock();
		});
		// Longer than the checks of the holder's start time (0.2 s, and 2 s
		// for an unrecorded start): a live holder keeps the lock through them.
		for (int i = 0; i < 25 && !got; i++)
			usleep(100000);
		EXPECT_FALSE(got) << "the lock was taken from a live holder";
		b = dies ? 'k' : 'r';
		ASSERT_EQ(write(go[1], &b, 1), 1);
		waiter.join();
		EXPECT_TRUE(got);
		int st = 0;
		ASSERT_EQ(waitpid(holder, &st, 0), holder);
		EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
		EXPECT_EQ(lock_word(f).load() & SV_REG_LOCK_TID_MASK, 0u);
		for (int fd : {up[0], up[1], go[0], go[1]})
			close(fd);
	}
	// A holder killed with SIGKILL inside its critical section.
	pid_t holder = fork();
	ASSERT_GE(holder, 0);
	if (holder == 0) {
		f->lock();
		pause();
		_exit(0);
	}
	while ((lock_word(f).load() & SV_REG_LOCK_TID_MASK) != static_cast<uint32_t>(holder))
		usleep(1000);
	kill(holder, SIGKILL);
	waitpid(holder, nullptr, 0);
	f->lock();
	EXPECT_EQ(lock_word(f).load() & SV_REG_LOCK_TID_MASK, tid());
	f->unlock();
}

TEST_F(Fabric, RegistryLockExcludesThreadsAndProcesses)
{
	fabric *f;
	std::string err;
	ASSERT_EQ(open(make_config({dev("loop0")}), f, err), 0) << err;
	// A counter in memory shared with forked children, changed only under
	// the lock with a plain read-modify-write, and a flag that shows two
	// holders at once.
	struct shared {
		uint64_t count;
		uint32_t inside;
		uint32_t overlaps;
	};
	auto *sh = static_cast<shared *>(
		mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
	ASSERT_NE(sh, MAP_FAILED);
	memset(sh, 0, sizeof(*sh));
	constexpr int kIters = 3000, kThreads = 3, kProcs = 3;
	auto work = [&] {
		for (int i = 0; i < kIters; i++) {
			f->lock();
			if (sh->inside++)
				sh->overlaps++;
			uint64_t c = sh->count;
			if ((i & 63) == 0)
				sched_yield(); // Let the others pile up on the lock
			sh->count = c + 1;
			sh->inside--;
			f->unlock();
		}
	};
	std::vector<pid_t> kids;
	for (int p = 0; p < kProcs; p++) {
		pid_t k = fork();
		ASSERT_GE(k, 0);
		if (k == 0) {
			alarm(50);
			std::vector<std::thread> ts;
			for (int t = 0; t < 2; t++)
				ts.emplace_back(work);
			for (auto &t : ts)
				t.join();
			_exit(0);
		}
		kids.push_back(k);
	}
	std::vector<std::thread> ts;
	for (int t = 0; t < kThreads; t++)
		ts.emplace_back(work);
	for (auto &t : ts)
		t.join();
	for (pid_t k : kids) {
		int st = 0;
		ASSERT_EQ(waitpid(k, &st, 0), k);
		EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "child " << k << " status " << st;
	}
	EXPECT_EQ(sh->overlaps, 0u) << "two holders at once";
	EXPECT_EQ(sh->count, uint64_t(kIters) * (kThreads + kProcs * 2));
	EXPECT_EQ(lock_word(f).load(), 0u);
	munmap(sh, 4096);
}

TEST_F(Fabric, RegistryLockSurvivesAWordOverwrittenWhileHeld)
{
	fabric *f;
	std::string err;
	ASSERT_EQ(open(make_config({dev("loop0")}), f, err), 0) << err;
	f->lock();
	lock_word(f).store(0xdeadbeef); // A peer's stray write
	f->unlock();			// Must neither crash nor free someone else's hold
	f->lock();			// The garbage is taken over
	EXPECT_EQ(lock_word(f).load() & SV_REG_LOCK_TID_MASK, tid());
	f->unlock();
	EXPECT_EQ(lock_word(f).load(), 0u);
}

TEST_F(Fabric, DamagedLeasesAndMulticastRecordsAreReaped)
{
	fabric *f;
	std::string err;
	ASSERT_EQ(open(make_config({dev("loop0")}), f, err), 0) << err;
	int mine = f->lease();
	ASSERT_GE(mine, 0);
	sv_registry *r = f->reg();
	int bad = mine == 5 ? 6 : 5;
	r->leases[bad].pid = 0xfffffff0u; // No process has it (and it is no process group)
	r->leases[bad].generation = 77;
	r->mcast[3].num_qps = 60000; // Beyond the array
	for (uint32_t i = 0; i < SV_MAX_MCAST_QPS; i++)
		r->mcast[3].qpns[i] = 0xffffffffu;
	EXPECT_FALSE(f->lease_alive(static_cast<uint32_t>(bad), 77));
	EXPECT_GE(f->reap_dead(), 1);
	EXPECT_EQ(r->leases[bad].pid, 0u);
	EXPECT_LE(r->mcast[3].num_qps, static_cast<uint16_t>(SV_MAX_MCAST_QPS));
	EXPECT_TRUE(f->lease_alive(static_cast<uint32_t>(mine), r->leases[mine].generation));
}
