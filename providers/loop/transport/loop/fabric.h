// SPDX-License-Identifier: MIT
// The registry segment of one fabric, as seen from this process.
#pragma once

#include "config.h"

#include "../../../../kernel-abi/softverbs-abi.h"

#include <pthread.h>
#include <sys/types.h>
#include <atomic>
#include <string>

namespace loop {

// PID_MAX_LIMIT on 64-bit Linux: no process id reaches it, so a word that
// names one is a stray write.
inline constexpr uint32_t kPidMaxLimit = 1u << 22;

class fabric {
public:
	// Opens (creating if needed) the registry of cfg.fabric and makes sure
	// every configured device has a record.  Returns 0 or an errno, with a
	// message in error.
	static int open(const config &cfg, fabric *&out, std::string &error);
	static int open_once(const config &cfg, fabric *&out, std::string &error);

	sv_registry *reg() const
	{
		return reg_;
	}
	const config &cfg() const
	{
		return cfg_;
	}
	const std::string &segment_path() const
	{
		return path_;
	}
	// Device record for a configured device, or nullptr.
	sv_device_rec *device(const std::string &name) const;

	// The registry lock (sv_reg_lock): process-shared, recursive per
	// thread; a dead holder's, or a value a peer scribbled over it, is
	// taken over.  Never aborts; waits only for a live holder.
	void lock();
	void unlock();

	// Takes a lease for this process (idempotent) and returns its slot.
	int lease();
	// Gives the lease back when the process's last context closes, or at
	// exit: frees what it still owns (QP numbers, keys, queue objects, with
	// their segments unlinked) and the slot.  A later lease() takes a new one.
	void release_lease();

	// Whether the process holding lease slot `slot` at generation `gen` still
	// runs (pid alive with the same start time).
	bool lease_alive(uint32_t slot, uint32_t gen);
	// Frees what dead processes left behind: their QP numbers, keys, queue
	// objects and segments, and their leases.  Returns how many were reaped.
	int reap_dead();

	static std::string registry_name(const std::string &fabric_name);
	// Its start time (0: unknown), and in *state its state letter.
	static uint64_t process_start_time(pid_t pid, char *state = nullptr);
	// Whether process pid is stopped (SIGSTOP, or a tracer's stop): it
	// will run again, so what it holds is still held.
	static bool process_stopped(pid_t pid);
	// Whether pid, a zombie by its state, has exited: one thread left.
	static bool process_exited(pid_t pid);

private:
	int attach(int fd, std::string &error);
	int unlinked(std::string &error);
	int init_new(int fd, std::string &error);
	void ensure_devices();
	bool slot_dead_locked(int slot);
	void reap_locked(int slot);
	void lock_slow(uint32_t me);

	config cfg_;
	std::string path_;
	sv_registry *reg_ = nullptr;
	// Read without the registry lock on every lease() (each verb that
	// names an owner): atomic, since release_lease() may run in another
	// thread (the last ibv_close_device, or exit).
	std::atomic<int> lease_slot_{-1};
	uint64_t lock_key_ = 0; // Names the registry for the lock's recursion count
	// Per lease slot: (generation << 32) | coarse tick (ns >> 20) of the
	// last lease_alive that found it alive; believed until the tick ends.
	std::atomic<uint64_t> alive_memo_[SV_MAX_PROCS] = {};
};

// A locked scope on the registry.
class registry_guard {
public:
	explicit registry_guard(fabric &f) : f_(f)
	{
		f_.lock();
	}
	~registry_guard()
	{
		f_.unlock();
	}
	registry_guard(const registry_guard &) = delete;
	registry_guard &operator=(const registry_guard &) = delete;

private:
	fabric &f_;
};

// The fabric of this process's configuration (opened once).
int process_fabric(fabric *&out, std::string &error);

// The checks every opener makes with fstat before it maps a segment: it
// belongs to this user, grants nothing to group or other (a segment anyone
// else could have created or could write is not ours), is a regular file,
// and holds between min_size and max_size bytes.  Returns 0, or EPERM (owner
// or mode) or EPROTO (size) with why set.
int check_segment(int fd, size_t min_size, size_t max_size, std::string &why);
// Takes a segment's memory now: tmpfs hands out pages as they are first
// touched, and a /dev/shm that is full then (a container's is 64 MiB) would
// raise SIGBUS in whichever process touches the page, perhaps a peer writing
// a completion.  Reserved, a full /dev/shm is ENOMEM at creation.  0 also
// where the file system has no fallocate (the lazy behaviour).
int reserve_segment(int fd, size_t bytes);
// A descriptor of our own for descriptor fd of process pid (pidfd_getfd, else
// /proc/<pid>/fd/<fd>, which needs ptrace permission as cross-memory attach
// does), or -1 with errno.
int open_peer_fd(pid_t pid, int fd);
// A queue object's segment: <registry>-q<slot>.<gen>.<nonce as 16 hex digits>.
std::string object_segment_name(const std::string &registry_path, uint32_t slot, uint32_t gen,
				uint64_t nonce);
inline uint64_t object_nonce(const sv_obj_rec &o)
{
	return static_cast<uint64_t>(o.nonce[1]) << 32 | o.nonce[0];
}

// Shared XRC target QPs (SV_OBJ_XRC_QP handles).  Under the registry lock.
// Passes the record of the XRC target QP in qps[qslot] to the holder of a
// handle on it other than the handle record `except` (SV_MAX_OBJS: none
// excepted) and other than those of lease (lease, lease_gen), moving its
// count against max_qp with it (nothing moves if that holder owns it
// already): true if one was found, false if nobody else holds it (or the
// record is not an XRC target QP in use).
bool xrc_qp_pass_on_locked(sv_registry *r, uint32_t qslot, uint32_t except, uint32_t lease,
			   uint32_t lease_gen);

} // namespace loop
