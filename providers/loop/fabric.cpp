// SPDX-License-Identifier: MIT
#include "fabric.h"

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <fstream>
#include <mutex>
#include <sstream>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace loop {

static_assert(sizeof(pthread_mutex_t) == SV_MUTEX_BYTES, "registry lock layout");

namespace {

constexpr size_t kRegistrySize = (sizeof(sv_registry) + 4095) & ~size_t(4095);
constexpr int kReadyWaitMs = 2000;

uint64_t fnv1a(const std::string &s, uint64_t h = 0xcbf29ce484222325ULL)
{
	for (unsigned char c : s) {
		h ^= c;
		h *= 0x100000001b3ULL;
	}
	return h;
}

std::atomic_ref<uint32_t> state_of(sv_registry *r)
{
	return std::atomic_ref<uint32_t>(r->hdr.state);
}

} // namespace

std::string fabric::registry_name(const std::string &fabric_name)
{
	return "/softverbs-" + std::to_string(getuid()) + "-" + fabric_name;
}

uint64_t fabric::process_start_time(pid_t pid)
{
	std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
	std::string s;
	if (!std::getline(in, s))
		return 0;
	// The command name may hold spaces and parentheses: skip past the last ')'.
	size_t p = s.rfind(')');
	if (p == std::string::npos)
		return 0;
	std::istringstream rest(s.substr(p + 2));
	std::string field;
	// Fields 3.. follow; start time is field 22.
	for (int i = 3; i <= 22; i++)
		if (!(rest >> field))
			return 0;
	return strtoull(field.c_str(), nullptr, 10);
}

int fabric::open(const config &cfg, fabric *&out, std::string &error)
{
	auto *f = new fabric;
	f->cfg_ = cfg;
	f->path_ = registry_name(cfg.fabric);
	int fd = shm_open(f->path_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	int ret;
	if (fd >= 0) {
		ret = f->init_new(fd, error);
	} else if (errno == EEXIST) {
		fd = shm_open(f->path_.c_str(), O_RDWR | O_CLOEXEC, 0600);
		if (fd < 0) {
			error = "cannot open fabric segment /dev/shm" + f->path_ + ": " +
				strerror(errno);
			delete f;
			return errno;
		}
		ret = f->attach(fd, error);
	} else {
		int err = errno;
		error = "cannot create fabric segment /dev/shm" + f->path_ + ": " + strerror(err);
		delete f;
		return err;
	}
	close(fd);
	if (ret) {
		delete f;
		return ret;
	}
	f->ensure_devices();
	out = f;
	return 0;
}

int fabric::init_new(int fd, std::string &error)
{
	if (ftruncate(fd, kRegistrySize) < 0) {
		error = "cannot size fabric segment: " + std::string(strerror(errno));
		shm_unlink(path_.c_str());
		return errno;
	}
	void *p = mmap(nullptr, kRegistrySize, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED) {
		error = "cannot map fabric segment: " + std::string(strerror(errno));
		shm_unlink(path_.c_str());
		return errno;
	}
	reg_ = static_cast<sv_registry *>(p);
	reg_->hdr.magic = SV_SEG_MAGIC;
	reg_->hdr.abi_version = SV_ABI_VERSION;
	reg_->hdr.kind = SV_SEG_REGISTRY;
	reg_->hdr.seg_size = kRegistrySize;
	reg_->hdr.creator_pid = static_cast<uint32_t>(getpid());
	reg_->next_lid = 1;
	pthread_mutexattr_t a;
	pthread_mutexattr_init(&a);
	pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
	pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
	pthread_mutex_init(reinterpret_cast<pthread_mutex_t *>(reg_->lock), &a);
	pthread_mutexattr_destroy(&a);
	state_of(reg_).store(SV_SEG_READY, std::memory_order_release);
	return 0;
}

int fabric::attach(int fd, std::string &error)
{
	struct stat st;
	// The creator may not have sized it yet.
	for (int waited = 0;; waited++) {
		if (fstat(fd, &st) < 0) {
			error = "cannot stat fabric segment: " + std::string(strerror(errno));
			return errno;
		}
		if (static_cast<size_t>(st.st_size) >= sizeof(sv_seg_hdr))
			break;
		if (waited >= kReadyWaitMs) {
			error = "fabric segment /dev/shm" + path_ +
				" was never initialised (its creator died?); remove it with "
				"'softverbs clean " + cfg_.fabric + "'";
			return EPROTO;
		}
		usleep(1000);
	}
	if (st.st_uid != getuid()) {
		error = "fabric segment /dev/shm" + path_ + " belongs to another user";
		return EPERM;
	}
	void *p = mmap(nullptr, st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED) {
		error = "cannot map fabric segment: " + std::string(strerror(errno));
		return errno;
	}
	auto *r = static_cast<sv_registry *>(p);
	for (int waited = 0; state_of(r).load(std::memory_order_acquire) != SV_SEG_READY;
	     waited++) {
		if (waited >= kReadyWaitMs) {
			munmap(p, st.st_size);
			error = "fabric segment /dev/shm" + path_ +
				" was never initialised (its creator died?); remove it with "
				"'softverbs clean " + cfg_.fabric + "'";
			return EPROTO;
		}
		usleep(1000);
	}
	if (r->hdr.magic != SV_SEG_MAGIC || r->hdr.kind != SV_SEG_REGISTRY) {
		munmap(p, st.st_size);
		error = "/dev/shm" + path_ + " is not a softverbs fabric segment";
		return EPROTO;
	}
	if (r->hdr.abi_version != SV_ABI_VERSION) {
		char buf[256];
		snprintf(buf, sizeof(buf),
			 "fabric '%s' was created by softverbs ABI version %u, this library speaks "
			 "version %u; stop its processes and remove it with 'softverbs clean %s', or "
			 "use another SOFTVERBS_FABRIC",
			 cfg_.fabric.c_str(), r->hdr.abi_version, SV_ABI_VERSION,
			 cfg_.fabric.c_str());
		munmap(p, st.st_size);
		error = buf;
		return EPROTO;
	}
	if (r->hdr.seg_size < sizeof(sv_registry) ||
	    r->hdr.seg_size > static_cast<uint64_t>(st.st_size)) {
		munmap(p, st.st_size);
		error = "fabric segment /dev/shm" + path_ + " is truncated";
		return EPROTO;
	}
	reg_ = r;
	return 0;
}

void fabric::lock()
{
	auto *m = reinterpret_cast<pthread_mutex_t *>(reg_->lock);
	int r = pthread_mutex_lock(m);
	if (r == EOWNERDEAD) {
		// The registry is only ever changed by short, self-contained
		// updates that leave it consistent at every store, so no repair
		// is needed beyond marking the mutex usable again.
		pthread_mutex_consistent(m);
	}
}

void fabric::unlock()
{
	pthread_mutex_unlock(reinterpret_cast<pthread_mutex_t *>(reg_->lock));
}

sv_device_rec *fabric::device(const std::string &name) const
{
	for (auto &d : reg_->devices)
		if (d.name[0] && name == d.name)
			return &d;
	return nullptr;
}

void fabric::ensure_devices()
{
	registry_guard g(*this);
	for (const device_config &dc : cfg_.devices) {
		if (device(dc.name))
			continue;
		sv_device_rec *slot = nullptr;
		uint32_t index = 0;
		for (auto &d : reg_->devices) {
			if (!d.name[0]) {
				slot = &d;
				break;
			}
			index++;
		}
		if (!slot)
			continue; // Reported by enumerate(): too many devices.
		memset(slot, 0, sizeof(*slot));
		// GUIDs: stable for a (user, fabric, device), unique in practice,
		// with the locally administered bit set as for a software GUID.
		uint64_t h = fnv1a(dc.name, fnv1a(cfg_.fabric, fnv1a(std::to_string(getuid()))));
		slot->node_guid = (h & ~0xffULL & ~(0xffULL << 56)) | (0x02ULL << 56);
		slot->num_ports = static_cast<uint32_t>(dc.num_ports);
		slot->index = index;
		for (int p = 0; p < dc.num_ports; p++) {
			sv_port_rec &pr = slot->ports[p];
			pr.state = IBV_PORT_ACTIVE;
			pr.active_mtu = dc.mtu;
			pr.port_guid = slot->node_guid + 1 + static_cast<uint64_t>(p);
			if (dc.link_layer == IBV_LINK_LAYER_ETHERNET) {
				pr.link_layer = SV_LINK_ETH;
				pr.lid = 0;
			} else {
				pr.link_layer = SV_LINK_IB;
				pr.lid = static_cast<uint16_t>(reg_->next_lid++);
			}
		}
		snprintf(slot->name, sizeof(slot->name), "%s", dc.name.c_str());
		reg_->num_devices++;
	}
}

bool fabric::slot_dead_locked(int slot)
{
	const sv_lease &l = reg_->leases[slot];
	if (!l.pid)
		return false;
	if (kill(static_cast<pid_t>(l.pid), 0) < 0 && errno == ESRCH)
		return true;
	return process_start_time(static_cast<pid_t>(l.pid)) != l.start_time;
}

void fabric::reap_locked(int slot)
{
	sv_lease &l = reg_->leases[slot];
	uint32_t gen = l.generation;
	auto owned = [&](uint32_t lease, uint32_t g) {
		return lease == static_cast<uint32_t>(slot) && g == gen;
	};
	for (auto &q : reg_->qps)
		if (q.in_use && owned(q.owner_lease, q.owner_gen)) {
			std::atomic_ref<uint32_t>(q.state).store(IBV_QPS_RESET,
								 std::memory_order_release);
			q.in_use = 0;
		}
	for (auto &m : reg_->mrs)
		if (m.state != SV_MR_FREE && owned(m.owner_lease, m.owner_gen))
			std::atomic_ref<uint32_t>(m.state).store(SV_MR_FREE,
								 std::memory_order_release);
	for (uint32_t i = 0; i < SV_MAX_OBJS; i++) {
		sv_obj_rec &o = reg_->objs[i];
		if (!o.in_use || !owned(o.owner_lease, o.owner_gen))
			continue;
		std::string name = path_ + "-q" + std::to_string(i) + "." + std::to_string(o.generation);
		shm_unlink(name.c_str());
		o.in_use = 0;
	}
	for (auto &m : reg_->mcast)
		for (uint32_t i = 0; i < m.num_qps && i < SV_MAX_MCAST_QPS;) {
			uint32_t qslot = m.qpns[i] & SV_QPN_SLOT_MASK;
			if (!reg_->qps[qslot].in_use)
				m.qpns[i] = m.qpns[--m.num_qps];
			else
				i++;
		}
	l.pid = 0;
	l.start_time = 0;
}

bool fabric::lease_alive(uint32_t slot, uint32_t gen)
{
	if (slot >= SV_MAX_PROCS)
		return false;
	registry_guard g(*this);
	return reg_->leases[slot].generation == gen && reg_->leases[slot].pid &&
	       !slot_dead_locked(static_cast<int>(slot));
}

int fabric::reap_dead()
{
	registry_guard g(*this);
	int n = 0;
	for (int i = 0; i < SV_MAX_PROCS; i++)
		if (slot_dead_locked(i)) {
			reap_locked(i);
			n++;
		}
	return n;
}

int fabric::lease()
{
	if (lease_slot_ >= 0)
		return lease_slot_;
	uint32_t pid = static_cast<uint32_t>(getpid());
	uint64_t start = process_start_time(getpid());
	registry_guard g(*this);
	int free_slot = -1;
	for (int i = 0; i < SV_MAX_PROCS; i++) {
		sv_lease &l = reg_->leases[i];
		if (l.pid == pid && l.start_time == start) {
			lease_slot_ = i;
			return i;
		}
		// Whatever a dead process left is freed as soon as it is seen.
		if (slot_dead_locked(i))
			reap_locked(i);
		if (free_slot < 0 && l.pid == 0)
			free_slot = i;
	}
	if (free_slot < 0)
		return -ENOSPC;
	sv_lease &l = reg_->leases[free_slot];
	l.pid = pid;
	l.start_time = start;
	l.generation = ++reg_->lease_generation;
	lease_slot_ = free_slot;
	return free_slot;
}

int process_fabric(fabric *&out, std::string &error)
{
	static std::mutex m;
	static fabric *f = nullptr;
	static pid_t owner = 0;
	std::lock_guard<std::mutex> g(m);
	// A forked child gets its own lease but shares the mapping.
	if (f && owner == getpid()) {
		out = f;
		return 0;
	}
	config cfg;
	if (!load_config(cfg, error))
		return EINVAL;
	fabric *nf = nullptr;
	int ret = fabric::open(cfg, nf, error);
	if (ret)
		return ret;
	f = nf;
	owner = getpid();
	out = f;
	return 0;
}

} // namespace loop
