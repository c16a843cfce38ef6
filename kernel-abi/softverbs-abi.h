/* SPDX-License-Identifier: MIT */
/*
 * The binary interface of the emulated NIC: everything that lives in shared
 * memory between the processes of one fabric, and nothing else.
 *
 * Rules of this file
 *  - Fixed-width types, offsets (never pointers), explicit padding; each
 *    record's size and the offsets other code relies on are static_asserted.
 *  - Every segment starts with sv_seg_hdr: magic, ABI version, sizes.  A
 *    process refuses a segment whose version differs from its own.
 *  - Any index or length read from shared memory is bounds-checked by the
 *    reader: a peer may be buggy or dead.
 *  - Bump SV_ABI_VERSION on any change to a layout or a protocol below.
 *
 * Segments (all in /dev/shm, mode 0600, named from the user id and fabric):
 *   softverbs-<uid>-<fabric>              the registry: devices, leases,
 *                                         QP numbers, memory keys, locks
 *   softverbs-<uid>-<fabric>-q<idx>.<gen> one queue object (CQ ring, receive
 *                                         queue or SRQ), see sv_queue_hdr
 */
#ifndef SOFTVERBS_ABI_H
#define SOFTVERBS_ABI_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
#define SV_STATIC_ASSERT static_assert
#else
#define SV_STATIC_ASSERT _Static_assert
#endif

#define SV_ABI_VERSION 1
#define SV_SEG_MAGIC 0x53565242534f4654ULL /* "TFOSBRVS": softverbs, little endian */
#define SV_CACHELINE 64

enum sv_seg_kind {
	SV_SEG_REGISTRY = 1,
	SV_SEG_QUEUE = 2,
};

/* Segment life: created INIT by one process with O_EXCL, READY once filled. */
enum sv_seg_state {
	SV_SEG_INIT = 0,
	SV_SEG_READY = 0x52454459, /* Stored with release once the segment is usable */
};

struct sv_seg_hdr {
	uint64_t magic;
	uint32_t abi_version;
	uint32_t kind;	   /* enum sv_seg_kind */
	uint64_t seg_size; /* Bytes mapped; every offset inside is below it */
	uint32_t state;	   /* enum sv_seg_state; acquire before reading the rest */
	uint32_t creator_pid;
	uint8_t reserved[32];
};
SV_STATIC_ASSERT(sizeof(struct sv_seg_hdr) == 64, "the header fills one cache line");

/* ---- the registry ---- */

#define SV_MAX_DEVICES 16
#define SV_MAX_PORTS 2
#define SV_MAX_PROCS 256
#define SV_NAME_MAX 64

enum sv_link_layer {
	SV_LINK_IB = 1,
	SV_LINK_ETH = 2,
};

struct sv_port_rec {
	uint16_t lid;	     /* Unique on the fabric; 0 for Ethernet ports */
	uint8_t state;	     /* enum ibv_port_state */
	uint8_t link_layer;  /* enum sv_link_layer */
	uint8_t active_mtu;  /* enum ibv_mtu */
	uint8_t reserved[3];
	uint64_t port_guid;  /* GID 0 of an InfiniBand port is fe80::<port_guid> */
};
SV_STATIC_ASSERT(sizeof(struct sv_port_rec) == 16, "port record size");

struct sv_device_rec {
	char name[SV_NAME_MAX]; /* NUL-terminated; empty means a free slot */
	uint64_t node_guid;
	uint32_t num_ports;
	uint32_t index; /* ibv_get_device_index() */
	struct sv_port_rec ports[SV_MAX_PORTS];
	uint8_t reserved[16];
};
SV_STATIC_ASSERT(sizeof(struct sv_device_rec) == 128, "two cache lines per device");

/*
 * A lease: one per live process that opened a device.  pid plus the process
 * start time (field 22 of /proc/<pid>/stat) tell a live owner from a reused
 * pid.  Written under the registry lock.
 */
struct sv_lease {
	uint32_t pid;	/* 0: free */
	uint32_t generation;
	uint64_t start_time;
};
SV_STATIC_ASSERT(sizeof(struct sv_lease) == 16, "lease size");

/*
 * The registry lock is a process-shared robust mutex: a holder that dies
 * hands it to the next locker with EOWNERDEAD, which repairs and goes on.
 * Its bytes are opaque here; the size is that of glibc's pthread_mutex_t.
 */
#define SV_MUTEX_BYTES 40

struct sv_registry {
	struct sv_seg_hdr hdr;
	uint8_t lock[SV_MUTEX_BYTES] __attribute__((aligned(8)));
	uint32_t next_lid;	/* Next LID to hand out; LIDs start at 1 */
	uint32_t num_devices;	/* Slots in use in devices[] */
	uint32_t lease_generation;
	uint32_t reserved0;
	uint8_t pad0[SV_CACHELINE - SV_MUTEX_BYTES - 16];
	struct sv_device_rec devices[SV_MAX_DEVICES];
	struct sv_lease leases[SV_MAX_PROCS];
};
SV_STATIC_ASSERT(offsetof(struct sv_registry, lock) == 64, "lock on its own line");
SV_STATIC_ASSERT(offsetof(struct sv_registry, devices) == 128, "devices start on a line");
SV_STATIC_ASSERT(offsetof(struct sv_registry, devices) % SV_CACHELINE == 0, "aligned table");

#endif
