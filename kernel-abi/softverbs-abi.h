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
 *   softverbs-<uid>-<fabric>-q<idx>.<gen>.<nonce>
 *                                         one queue object (CQ ring, receive
 *                                         queue, SRQ or service segment), see
 *                                         sv_queue_hdr; <nonce> is 16 hex
 *                                         digits from getrandom, kept in the
 *                                         object's sv_obj_rec, so that no other
 *                                         user can guess the name beforehand
 *   or, for a queue placed by the application's parent-domain allocator, a
 *   range of a file the owner holds open (sv_obj_rec.place_fd): peers take
 *   the descriptor from the owner (pidfd_getfd, else /proc/<pid>/fd) and
 *   map that range, checked as a segment's header is
 * Every segment is created with O_EXCL; every opener checks with fstat that
 * it belongs to this user, has no group or other permission bits and has
 * the size it should, before it maps it (docs/design.md, "Segments").
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

#define SV_ABI_VERSION 17
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

/* A port's RoCE v2 packet counters (sv_registry.wire). */
struct sv_wire_counters {
	uint64_t tx_packets;
	uint64_t rx_packets;
	uint64_t retransmits;	   /* Requests sent again: a sequence NAK or a READ gap */
	uint64_t naks_sent;
	uint64_t naks_received;
	uint64_t drop_bad_icrc;
	uint64_t drop_malformed;   /* Framing (wire.h parse) */
	uint64_t drop_unknown_qp;  /* No QP of this process by that number */
	uint64_t drop_other;	   /* Out of sequence, misdirected, another P_Key, no room */
	uint64_t drop_injected;	   /* By SOFTVERBS_ROCEV2_DROP */
	uint64_t reserved[6];
};
SV_STATIC_ASSERT(sizeof(struct sv_wire_counters) == 128, "two cache lines per port");

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
enum sv_lease_flags {
	SV_LEASE_CMA_USED = 1 << 0,	 /* This process moved bytes by cross-memory attach */
	SV_LEASE_CMA_REFUSED = 1 << 1,	 /* The kernel refused it cross-memory attach */
	SV_LEASE_SERVICE_USED = 1 << 2, /* It moved bytes through a peer's service segment */
	SV_LEASE_MAPPED_USED = 1 << 3,	/* ... through its mapping of a peer's fd-backed MR */
	SV_LEASE_DIRECT_USED = 1 << 4,	/* ... by memcpy into a peer's sealed memfd MR */
	SV_LEASE_EXPRESS_USED = 1 << 5, /* Its requester ran WRs the express way */
};

struct sv_lease {
	uint32_t pid;	/* 0: free */
	uint32_t generation;
	uint64_t start_time;
	uint32_t svc_obj;  /* Its service segment (sv_svc_ring), once it has one */
	uint32_t svc_gen;  /* 0: none */
	uint32_t flags;	   /* enum sv_lease_flags, set with atomic OR: which paths it used */
	uint32_t last_pid; /* With pid 0: the process that released this slot
			      cleanly (its last context closed, or it exited);
			      kept with flags so tools can show what it used */
};
SV_STATIC_ASSERT(sizeof(struct sv_lease) == 32, "lease size");

/*
 * The registry lock: our own, not a pthread mutex, so that a buggy peer's
 * write into it can only make it look held or free, never trip a libc
 * assertion (see fabric.cpp for the protocol).  word holds the holder
 * thread's id (0: free) with SV_REG_LOCK_WAITERS set while someone sleeps
 * on it (FUTEX_WAIT on word); holder_start is the holder's start time,
 * which tells a live holder from a reused thread id.  A value that names
 * no plausible holder (dead, reused, or an impossible bit pattern) is
 * taken over with a compare-and-swap.  40 bytes, the size the pthread
 * mutex had, so nothing after it moves.
 */
#define SV_MUTEX_BYTES 40
#define SV_REG_LOCK_WAITERS 0x80000000u
#define SV_REG_LOCK_TID_MASK 0x3fffffffu /* Thread ids are below 2^22 (PID_MAX_LIMIT) */

struct sv_reg_lock {
	uint32_t word;	       /* Holder's tid | SV_REG_LOCK_WAITERS; 0 when free */
	uint32_t reserved0;
	uint64_t holder_start; /* Holder thread's start time (/proc stat field 22) */
	uint8_t reserved[24];
};
SV_STATIC_ASSERT(sizeof(struct sv_reg_lock) == SV_MUTEX_BYTES, "registry lock size");

/*
 * Queue pairs.  A QP number is (generation << 12) | slot, so a QPN that
 * outlives its QP names nothing.  The owner writes every field under the
 * registry lock except state, which any process may move to ERR with a
 * compare-and-swap (a responder that detects a fatal error does so).
 */
#define SV_MAX_QPS 4096
#define SV_QPN_SLOT_BITS 12
#define SV_QPN_SLOT_MASK ((1u << SV_QPN_SLOT_BITS) - 1)

struct sv_qp_rec {
	uint32_t in_use;	/* 1 while the QP exists */
	uint32_t generation;	/* Bumped when the slot is reused; 12 bits go into the QPN */
	uint32_t owner_lease;	/* Lease slot of the owning process */
	uint32_t owner_gen;	/* That lease's generation: tells a reused slot apart */
	uint32_t state;		/* enum ibv_qp_state; any process may CAS it to ERR */
	uint8_t qp_type;	/* enum ibv_qp_type */
	uint8_t port;		/* Port number, 1-based, set at RESET->INIT */
	uint8_t path_mtu;	/* enum ibv_mtu, set at INIT->RTR */
	uint8_t sq_sig_all;
	uint32_t device;	/* Index into devices[] */
	uint32_t access;	/* qp_access_flags: remote rights granted to peers */
	uint32_t qkey;		/* UD and the Q_Key check */
	uint32_t pdn;		/* PD number within the owner */
	uint32_t rq_obj;	/* Queue object of the RQ, or of the SRQ when has_srq */
	uint32_t rq_gen;	/* Its generation */
	uint32_t rcq_obj;	/* Queue object of the receive CQ */
	uint32_t rcq_gen;
	uint32_t has_srq;
	uint32_t xrcd;		/* XRC domain id (XRC_RECV QPs) */
	uint32_t dest_qpn;	/* Connected peer (RC/UC/XRC), from INIT->RTR */
	uint8_t min_rnr_timer;	/* Encoded as in ibv_qp_attr; sent back in an RNR NAK */
	uint8_t comm_est;	/* Set (by exchange, any process) by the first request
				 * that finds the QP in RTR, which raises
				 * IBV_EVENT_COMM_EST; cleared at INIT->RTR */
	uint8_t reserved0[2];
	uint32_t reserved[2];
};
SV_STATIC_ASSERT(sizeof(struct sv_qp_rec) == 80, "QP record size");

/*
 * Memory keys.  lkey == rkey == (slot << 8) | key, the key byte random per
 * registration, so keys are neither reused at once nor guessable in sequence.
 * A record is valid when state is SV_MR_VALID and the key byte matches.
 */
#define SV_MAX_MRS 16384
#define SV_MR_KEY_BITS 8

enum sv_mr_state {
	SV_MR_FREE = 0,
	SV_MR_VALID = 1,
	SV_MR_INVALID = 2, /* Allocated (a BMME key or an unbound window), not usable */
};

enum sv_mr_kind {
	SV_MR_KIND_MR = 1,
	SV_MR_KIND_NULL = 2, /* Writes dropped, reads give zeros */
	SV_MR_KIND_MW1 = 3,
	SV_MR_KIND_MW2 = 4,
	SV_MR_KIND_FD = 5,   /* Backed by a file descriptor: peers map it */
	SV_MR_KIND_FRMR = 6, /* A BMME key: registered through the send queue */
};

enum sv_mr_flags {
	SV_MR_BLOCK_LIST = 1 << 0, /* addr holds npages page addresses (uint64_t) */
	SV_MR_ODP = 1 << 1,	   /* On demand: nothing was mapped at registration */
	SV_MR_MAPPED = 1 << 2,	   /* A plain MR whose pages the owner moved onto a
				    * memfd: fd/fd_offset name it, as for FD MRs;
				    * a peer that cannot take the fd uses addr */
	SV_MR_SHARED_FILE = 1 << 3, /* A plain MR over one shared mapping of a
				     * file (ABI 17): fd_ino and fd_offset name
				     * the file and addr's byte in it, for the
				     * atomic locks alone (the same word through
				     * any mapping takes the same lock); fd is
				     * -1 and peers reach it by addr */
};

/*
 * Windows (MW1/MW2): iova/length are the window as the wire names it, addr
 * is the parent MR's iova of the window's first byte, parent the parent's
 * slot; an access through a window is checked against the window, then
 * resolved through the parent.  A parent counts its bound windows in
 * bound_mws and cannot be deregistered while any is bound.
 * FD MRs: the owner keeps descriptor fd open for the MR's life; a peer takes
 * its own copy with pidfd_getfd() (or opens /proc/<pid>/fd/<fd>), maps it and
 * copies with memcpy.  fd_offset is the object offset of iova; cookie is new
 * on every (re)registration, so a peer's cached mapping is never stale.
 */
struct sv_mr_rec {
	uint32_t state;	     /* enum sv_mr_state; written last, with release */
	uint32_t key;	     /* The low 8 bits of the current lkey/rkey */
	uint32_t owner_lease;
	uint32_t owner_gen;
	uint32_t pdn;
	uint32_t access;     /* IBV_ACCESS_* */
	uint64_t iova;	     /* First byte's address as the wire names it */
	uint64_t length;
	uint64_t addr;	     /* First byte's address in the owner's address space */
	uint32_t kind;	     /* enum sv_mr_kind */
	uint32_t bound_qpn;  /* Type 2 windows: the QP allowed to use it */
	uint32_t parent;     /* Windows: slot of the MR they are bound to */
	uint32_t bound_mws;  /* MRs: windows bound to this MR */
	uint64_t fd_offset;  /* FD, mapped and shared-file MRs: offset of iova's byte in the object */
	int32_t fd;	     /* FD MRs: the owner's descriptor */
	uint32_t cookie;     /* Random per registration */
	uint32_t npages;     /* Block lists: entries at addr */
	uint8_t page_shift;  /* Block lists: log2 of the block size */
	uint8_t flags;	     /* enum sv_mr_flags */
	uint16_t max_pages;  /* FRMR keys: block-list capacity (0: 65536) */
	uint64_t fd_ino;     /* FD, mapped and shared-file MRs: inode of the file (0: not
			      * known); a peer checks the descriptor it took
			      * is that file, in case the owner's fd number was
			      * closed and reused for another */
	uint64_t copiers;    /* Copies by address in flight: the cookie of
			      * their registration << 32 | their count.  A
			      * copier adds itself, then checks the record is
			      * still VALID with that cookie; the owner's
			      * dereg/rereg puts it out of service, then waits
			      * for the count of its cookie to drain
			      * (providers/loop/mr_copiers.h) */
};
SV_STATIC_ASSERT(sizeof(struct sv_mr_rec) == 104, "MR record size");

/*
 * Queue objects: CQ rings, receive queues, SRQs.  Each lives in its own
 * segment softverbs-<uid>-<fabric>-q<slot>.<generation>.<nonce>, created by
 * its owner and mapped by peers on first contact (see sv_queue_hdr).
 */
#define SV_MAX_OBJS 8192

enum sv_obj_kind {
	SV_OBJ_CQ = 1,
	SV_OBJ_RQ = 2,
	SV_OBJ_SRQ = 3,
	SV_OBJ_SVC = 4,
	/* One open handle of an XRC domain tied to a file (xrcd names the
	 * domain); no segment.  The domain exists while one is in use, as
	 * the kernel's xrcd lives while a handle is open. */
	SV_OBJ_XRCD = 5,
	/* One handle on a shared XRC target QP: its creator's, or one that
	 * ibv_open_qp gave (ABI 16).  cq_obj and cq_gen name the QP's slot in
	 * qps[] and that record's generation, xrcd its domain; no segment.
	 * The QP lives while a handle does, as the kernel keeps an XRC
	 * target QP while a process has it open: the QP record's owner is
	 * always a holder of a handle, and when the owner's handle goes (its
	 * destroy, or its death reaped) the record passes to another
	 * holder. */
	SV_OBJ_XRC_QP = 6,
};

struct sv_obj_rec {
	uint32_t in_use;
	uint32_t generation;
	uint32_t owner_lease;
	uint32_t owner_gen;
	uint32_t kind; /* enum sv_obj_kind */
	uint32_t srq_num; /* SRQs: the number XRC senders name */
	uint32_t xrcd;	  /* XRC SRQs: their domain */
	uint32_t cq_obj;  /* XRC SRQs: the CQ their receives complete into */
	uint32_t cq_gen;
	uint32_t pdn;	  /* SRQs: the PD their receive lkeys belong to */
	uint32_t nonce[2]; /* Random part of the segment's name (low, high word);
			      set before the object is published, never 0 */
	/* A queue in memory the application placed (softverbs_dv_alloc_fd):
	 * place_fd is the owner's descriptor + 1 (0: a /dev/shm segment, as
	 * above), place_offset the page-aligned offset of the queue in that
	 * file, place_pages its length in pages of 4096 bytes.  Set before
	 * the object is published, never changed while it lives. */
	uint32_t place_fd;
	uint32_t place_pages;
	uint64_t place_offset;
};
SV_STATIC_ASSERT(sizeof(struct sv_obj_rec) == 64, "object record size");

/* Multicast groups: the QPs attached to each (GID, LID). */
#define SV_MAX_MCAST 64
#define SV_MAX_MCAST_QPS 64

struct sv_mcast_rec {
	uint8_t gid[16];
	uint16_t lid;
	uint16_t num_qps;
	uint32_t reserved;
	uint32_t qpns[SV_MAX_MCAST_QPS];
};
SV_STATIC_ASSERT(sizeof(struct sv_mcast_rec) == 280, "multicast record size");

/*
 * Atomic operations are atomic among all users of the fabric
 * (IBV_ATOMIC_HCA): each takes one of these striped locks, chosen by
 * (target process, address).  A lock word holds its holder's pid; a waiter
 * that finds the holder dead takes the lock over.
 */
#define SV_ATOMIC_LOCKS 1024

/*
 * Resource limits: ibv_query_device's max_pd, max_qp, ... of every device on
 * the fabric.  The process that creates the registry writes limits from its
 * configuration (docs/configuration.md) and nobody changes them after, so
 * every process of a fabric agrees.  They are device-wide, as an HCA's are:
 * usage[lease][kind] is what each process holds, changed under the registry
 * lock; a create that would take the sum over all leases past max[kind]
 * fails with ENOMEM.  A dead process's usage is dropped when it is reaped.
 */
enum sv_res {
	SV_RES_PD = 0,
	SV_RES_QP = 1,
	SV_RES_CQ = 2,
	SV_RES_MR = 3, /* Every key that is not a window: MRs, null MR, DM MRs, BMME keys */
	SV_RES_MW = 4,
	SV_RES_AH = 5,
	SV_RES_SRQ = 6,
	SV_RES_COUNT = 7,
};
#define SV_RES_SLOTS 8

struct sv_limits {
	uint32_t max[SV_RES_SLOTS]; /* Indexed by enum sv_res */
};
SV_STATIC_ASSERT(sizeof(struct sv_limits) == 32, "limits size");

struct sv_registry {
	struct sv_seg_hdr hdr;
	struct sv_reg_lock lock;
	uint32_t next_lid;	/* Next LID to hand out; LIDs start at 1 */
	uint32_t num_devices;	/* Slots in use in devices[] */
	uint32_t lease_generation;
	uint32_t next_xrcd;	/* XRC domain ids */
	uint8_t pad0[SV_CACHELINE - SV_MUTEX_BYTES - 16];
	struct sv_device_rec devices[SV_MAX_DEVICES];
	struct sv_lease leases[SV_MAX_PROCS];
	uint32_t atomic_locks[SV_ATOMIC_LOCKS];
	struct sv_mcast_rec mcast[SV_MAX_MCAST];
	struct sv_obj_rec objs[SV_MAX_OBJS];
	struct sv_qp_rec qps[SV_MAX_QPS];
	struct sv_mr_rec mrs[SV_MAX_MRS];
	struct sv_limits limits;
	uint32_t usage[SV_MAX_PROCS][SV_RES_SLOTS];
	/* RoCE v2 (the rocev2 transport): what the processes of this host sent
	 * and received on each port, added to atomically by each; `softverbs
	 * show` prints them. */
	struct sv_wire_counters wire[SV_MAX_DEVICES][SV_MAX_PORTS];
};
SV_STATIC_ASSERT(offsetof(struct sv_registry, lock) == 64, "lock on its own line");
SV_STATIC_ASSERT(offsetof(struct sv_registry, devices) == 128, "devices start on a line");
SV_STATIC_ASSERT(offsetof(struct sv_registry, devices) % SV_CACHELINE == 0, "aligned table");
SV_STATIC_ASSERT(offsetof(struct sv_registry, atomic_locks) % SV_CACHELINE == 0, "aligned");

/* ---- queue segments ---- */

/*
 * Every queue segment starts with this.  entries is a power of two; the
 * ring's slots follow at slots_offset, entry_size bytes each.
 */
struct sv_queue_hdr {
	struct sv_seg_hdr seg;
	uint32_t kind;	      /* enum sv_obj_kind */
	uint32_t entries;     /* Power of two */
	uint32_t entry_size;  /* Bytes per slot, a multiple of 64 */
	uint32_t slots_offset;
	uint32_t owner_pid;
	uint32_t max_sge;     /* RQ/SRQ: SGEs per WQE */
	uint32_t obj_slot;    /* This object's slot in the registry's objs[] */
	uint32_t obj_gen;     /* and its generation, for async events */
	uint8_t reserved[32];
};
SV_STATIC_ASSERT(sizeof(struct sv_queue_hdr) == 128, "queue header size");

/*
 * CQ ring: many producers (any process that completes a WR into this CQ),
 * one consumer (the owner, under its poll lock).
 *
 * Producer: load cons (acquire); reserve slot p with a CAS on prod from p to
 * p + 1, provided p - cons < entries (else the CQ overflowed: set overflow and
 * raise IBV_EVENT_CQ_ERR); fill the slot; store seq = (uint32_t)(p + 1) with
 * release.  Then, if armed is non-zero and the completion qualifies
 * (solicited-only arms fire on solicited and error completions), CAS armed
 * to 0 and, if that won, send cookie to the channel address; if the socket
 * refuses it, add 1 to lost_events and send a cookie of 0.
 * Consumer: slot c is ready when its seq (acquire) equals (uint32_t)(c + 1);
 * read it, then store cons = c + 1 with release.
 * cons_seen, on the producers' line: a value of cons that a producer read
 * (acquire) and stored back (release), a lower bound of cons.  Producers
 * judge room by it and read cons itself only when it shows the ring full
 * (or is beyond prod), so that the owner's line does not move to a
 * producer's cache on every completion.  The owner sets it back to its own
 * head when it finds it ahead (written over).
 * Sleeping: a poller that found the ring empty for a while increments
 * waiters (seq_cst), looks at slot c once more, and FUTEX_WAITs on the low
 * 32 bits of prod with the value it saw, for a bounded time.  A producer,
 * after its seq_cst fence, FUTEX_WAKEs that word when waiters is non-zero.
 * Either the producer sees the waiter, or the waiter sees the entry.
 * Closing (ibv_resize_cq): the owner sets SV_CQ_RING_CLOSED in prod with an
 * atomic OR; a producer that finds it set reserves nothing and looks for
 * the CQ's new ring.  A failed resize clears it again.
 * Moderation: with mod_count > 1, a producer whose completion qualifies for
 * an ARM_ALL event increments mod_pending and fires only when it reaches
 * mod_count; the producer that fires resets it.  (Count only: the device
 * advertises no moderation period.)
 */
enum sv_cq_arm {
	SV_CQ_DISARMED = 0,
	SV_CQ_ARM_ALL = 1,
	SV_CQ_ARM_SOLICITED = 2,
};

#define SV_CQ_RING_CLOSED (1ULL << 63) /* In sv_cq_ring.prod: the ring is closed */

struct sv_cq_ring {
	struct sv_queue_hdr hdr;
	uint64_t prod; /* Producers' reservation counter, and SV_CQ_RING_CLOSED */
	uint64_t cons_seen; /* A lower bound of cons, for producers (above) */
	uint8_t pad1[SV_CACHELINE - 16];
	uint64_t cons; /* Written by the owner only */
	uint8_t pad2[SV_CACHELINE - 8];
	uint32_t armed;	   /* enum sv_cq_arm */
	uint32_t overflow; /* Set by a producer that found the ring full */
	uint64_t cookie;   /* Channel cookie of this CQ; 0 without a channel */
	uint32_t channel_len;
	uint32_t async_len;
	uint8_t channel_addr[108]; /* Abstract AF_UNIX address of the channel */
	uint8_t async_addr[108];   /* Abstract AF_UNIX address of the owner's async fd */
	uint32_t payload_offset;   /* Where the sv_cqe_payload array starts; 0: none */
	uint32_t waiters;	   /* Pollers asleep on the low word of prod (futex) */
	uint32_t mod_count;	   /* Moderation (ibv_modify_cq): completions per event, 0/1: off */
	uint32_t mod_pending;	   /* Completions since the CQ was armed, while moderated */
	/* Completion events whose datagram the channel's socket refused (its
	 * queue was full): the producer that disarmed the CQ adds 1, then sends
	 * a cookie-0 datagram; the owner's ibv_get_cq_event takes the count
	 * with an exchange and hands out that many events (channel.cpp). */
	uint32_t lost_events;
	uint32_t flags; /* enum sv_cq_ring_flags, set by the owner */
	uint8_t pad3[SV_CACHELINE * 5 - 24 - 216 - 24];
};
SV_STATIC_ASSERT(offsetof(struct sv_cq_ring, prod) == 128, "producer line");
SV_STATIC_ASSERT(offsetof(struct sv_cq_ring, cons) == 192, "consumer line");
SV_STATIC_ASSERT(sizeof(struct sv_cq_ring) == 576, "CQ ring header size");

enum sv_cq_ring_flags {
	/* The owner reads completion timestamps (a CQ made with
	 * IBV_WC_EX_WITH_COMPLETION_TIMESTAMP or _WALLCLOCK): producers stamp
	 * each entry's timestamp.  Without it the stamp is 0: reading the clock
	 * was a tenth of a small SEND's requester time. */
	SV_CQ_STAMP = 1 << 0,
};

enum sv_cqe_flags {
	SV_CQE_SOLICITED = 1 << 0,
	/* The message is in this entry's payload and must be placed into the
	 * receive buffer before the completion is returned: see `place`. */
	SV_CQE_PLACE = 1 << 1,
	/* A send-queue completion: src_qp holds the low 32 bits of the WR's
	 * index in its send queue (the owner frees the WR's slot, and those of
	 * the unsignaled WRs before it, when it polls this entry). */
	SV_CQE_SQ_INDEX = 1 << 2,
};

/*
 * Placing a small SEND (SV_CQE_PLACE).  The entry's `place` word is
 * SV_PLACE_TAG(index, state): the low 30 bits of the entry's reservation
 * index, so that a word left from an earlier lap of the slot never matches,
 * and a state:
 *  - the producer stores TAG(p, PENDING) with the rest of the entry;
 *  - the sender, before it moves any later byte of the same QP, CASes
 *    TAG(i, PENDING) -> TAG(i, CLAIMED), copies the payload to the receive
 *    buffer, then stores TAG(i, DONE) with release (or TAG(i, PENDING)
 *    again if its copy failed, leaving the work to the owner);
 *  - the owner, polling entry c, CASes TAG(c, PENDING) -> TAG(c, DONE) and
 *    places the payload itself after checking the key.  While it sees
 *    TAG(c, CLAIMED) the entry is not ready: the poll returns without it
 *    (and without anything behind it) until the sender stores DONE, or the
 *    sender's lease is found dead, when the owner takes the entry over.
 * So a completion is never returned before its bytes are in place, and a
 * sender never writes into a buffer whose completion was returned.
 */
enum sv_place_state {
	SV_PLACE_NONE = 0,
	SV_PLACE_PENDING = 1,
	SV_PLACE_CLAIMED = 2,
	SV_PLACE_DONE = 3,
};
#define SV_PLACE_TAG(index, state) ((uint32_t)(((index) & 0x3fffffffu) << 2) | (uint32_t)(state))

#define SV_CQE_INLINE_MAX 176

/* One per CQE slot, at the same index, in the array at payload_offset. */
struct sv_cqe_payload {
	uint64_t iova;	/* Receive buffer as the receive WQE named it */
	uint32_t lkey;	/* and its key */
	uint32_t len;	/* Bytes in data[], at most SV_CQE_INLINE_MAX */
	uint8_t data[SV_CQE_INLINE_MAX];
};

struct sv_cqe {
	uint32_t seq; /* (uint32_t)(reservation + 1) once the entry is complete */
	uint32_t status; /* enum ibv_wc_status */
	uint64_t wr_id;
	uint32_t opcode; /* enum ibv_wc_opcode */
	uint32_t vendor_err;
	uint32_t byte_len;
	uint32_t imm_data; /* Immediate data (network order) or the invalidated rkey */
	uint32_t qp_num;
	uint32_t src_qp; /* Receives: the sender's QP; with SV_CQE_SQ_INDEX: a WR index */
	uint32_t wc_flags; /* IBV_WC_* flags */
	uint16_t pkey_index;
	uint16_t slid;
	uint8_t sl;
	uint8_t dlid_path_bits;
	uint8_t flags; /* enum sv_cqe_flags */
	uint8_t reserved0;
	uint32_t place; /* SV_PLACE_TAG(index, enum sv_place_state), with SV_CQE_PLACE */
	uint64_t timestamp; /* Completion time, CLOCK_MONOTONIC ns */
};
SV_STATIC_ASSERT(sizeof(struct sv_cqe) == 64, "one CQE per cache line");
SV_STATIC_ASSERT(sizeof(struct sv_cqe_payload) == 192, "three cache lines of payload");

/*
 * Receive queue or SRQ ring: one producer (the owner posting receives,
 * under its post lock), many consumers (the requesters that deliver
 * messages, and the owner when it flushes).
 *
 * Producer: fill slot prod; store prod + 1 with release.
 * Consumer: c = cons (acquire); empty if c == prod (acquire); copy the WQE
 * out of slot c; then CAS cons from c to c + 1.  Only a winning CAS owns the
 * copy: the producer cannot reuse slot c before cons passes it, so a copy
 * made before a winning CAS is intact.
 * Each side keeps a lower bound of the other's index on its own line, read
 * (acquire) from the index and stored back (release): the producer's
 * cons_seen, the consumers' prod_seen.  A side reads the other's index only
 * when its bound shows the ring full (producer) or empty (consumer), or is
 * beyond a lap, so that in steady state each index line stays with the side
 * that writes it.  A bound is never trusted beyond the index it stands for:
 * one that looks impossible sends the reader to the index itself.  A
 * consumer believes prod_seen only for a WQE whose seq shows the index it
 * is taken at (the library's producers stamp it; a WQE with another seq,
 * an agent's unstamped one or a stale slot under a bound written over, is
 * taken only as far as prod itself says).
 * limit: SRQ limit (0 = disarmed); the consumer that takes the count below
 * it CASes limit to 0 and raises IBV_EVENT_SRQ_LIMIT_REACHED.
 */
struct sv_rq_ring {
	struct sv_queue_hdr hdr;
	uint64_t prod;
	uint64_t cons_seen; /* The producer's lower bound of cons (above) */
	uint8_t pad1[SV_CACHELINE - 16];
	uint64_t cons;
	uint64_t prod_seen; /* The consumers' lower bound of prod (above) */
	uint8_t pad2[SV_CACHELINE - 16];
	uint32_t limit;
	uint32_t async_len;
	uint8_t async_addr[108];
	uint8_t pad3[SV_CACHELINE * 2 - 116];
};
SV_STATIC_ASSERT(offsetof(struct sv_rq_ring, prod) == 128, "producer line");
SV_STATIC_ASSERT(offsetof(struct sv_rq_ring, cons) == 192, "consumer line");
SV_STATIC_ASSERT(sizeof(struct sv_rq_ring) == 384, "RQ ring header size");

struct sv_sge {
	uint64_t addr;
	uint32_t length;
	uint32_t lkey;
};
SV_STATIC_ASSERT(sizeof(struct sv_sge) == 16, "SGE size");

struct sv_recv_wqe {
	uint64_t wr_id;
	uint32_t num_sge;
	uint32_t seq;	/* (uint32_t)(its index + 1), stamped by the producer (above) */
	struct sv_sge sge[]; /* hdr.max_sge of them; the slot is padded to 64 */
};
SV_STATIC_ASSERT(sizeof(struct sv_recv_wqe) == 16, "WQE header size");
/* num_sge of a consumer's copy of a WQE that claimed more SGEs than the
 * ring's max_sge: the WQE is invalid, and its receive completes in error.
 * Never written into a ring. */
#define SV_RECV_WQE_INVALID 0xffffffffu

/*
 * Send queue ring (format SV_SQ_FORMAT_VERSION).  One per QP that sends,
 * owned by the QP's process.  Unlike the rings above no peer maps it: the
 * owner's requester is its only consumer.  It is the QP's backlog: a WQE
 * stays in its slot from its post until its completion (or a later one's)
 * is polled, and the WQEs between cons and prod are the work the requester
 * has not finished (an RNR wait or a retry holds the head, and every WQE
 * behind it waits with it).
 *
 * Layout: the header (sv_sq_ring, SV_SQ_HDR_SIZE bytes), then `count` slots
 * (a power of two) of `stride` bytes (a multiple of 64, at least
 * SV_SQ_MIN_STRIDE).  Slot i mod count holds WQE number i.  A slot is an
 * sv_send_wqe (SV_WQE_HDR_SIZE bytes, every segment at a fixed offset)
 * followed by its data: ctrl.num_sge sv_sge, or with IBV_SEND_INLINE
 * ctrl.inline_len bytes of inline data.  The stride leaves room for the
 * QP's max_send_sge SGEs and for max(max_inline_data, SV_SQ_MIN_INLINE)
 * bytes of inline data, so a slot can always carry a small payload inline.
 *
 * Ordering contract (one producer at a time: the owner's posting path holds
 * the QP's send lock):
 *  - Producer: only when prod - retired < count, fill slot prod: the
 *    control and remote address segments, the segments its opcode and the
 *    QP's type use (atomic, UD, memory), and its data; a segment the WQE
 *    does not use means nothing and may hold an older WQE's bytes.  Store
 *    prod + 1 with release; then ring the doorbell:
 *    store the new prod into db_record with release.  If the engine's
 *    `sleeping` word is nonzero after the doorbell store (seq_cst, so the
 *    store and the load are not reordered), wake it (FUTEX_WAKE on
 *    db_record).
 *  - Requester: read db_record with acquire; copy WQE cons out of its slot
 *    into private memory and check it there (opcode, lengths, keys: the
 *    ring is writable by whoever maps it, so a WQE is validated like any
 *    other input); execute it; when its completion is written, store
 *    acked = cons + 1 and cons = cons + 1 (release).  A WQE it must retry
 *    stays at cons.
 *  - Completion: the send CQE carries the WQE's index (SV_CQE_SQ_INDEX);
 *    when the owner polls it, `retired` moves to index + 1 (release), which
 *    frees that slot and those of the unsignaled WQEs before it.
 * The header's counters are 64-bit and never wrap in practice; the owner
 * keeps its own copies of prod, cons and retired and of the geometry in
 * process memory, and publishes them here: what it reads back from this
 * memory is never trusted.
 */
#define SV_SQ_FORMAT_VERSION 1
#define SV_SQ_MAGIC 0x51535653u /* "SVSQ" */
#define SV_WQE_HDR_SIZE 192
#define SV_SQ_HDR_SIZE 320
#define SV_SQ_MIN_INLINE 64 /* Inline bytes every slot has room for */
#define SV_SQ_MIN_STRIDE (SV_WQE_HDR_SIZE + SV_SQ_MIN_INLINE)
/* ctrl.opcode of a BMME fast-register WQE (IBV_WR_DRIVER1's value); every
 * other opcode is an enum ibv_wr_opcode value. */
#define SV_WQE_OP_FAST_REG 11

struct sv_sq_ring {
	/* Line 0: geometry, written once by the owner before the ring is used. */
	uint32_t magic;		 /* SV_SQ_MAGIC */
	uint32_t format_version; /* SV_SQ_FORMAT_VERSION */
	uint32_t count;		 /* Slots, a power of two */
	uint32_t stride;	 /* Bytes per slot */
	uint32_t hdr_size;	 /* SV_SQ_HDR_SIZE: the first slot's offset */
	uint32_t max_sge;	 /* SGEs a WQE may carry */
	uint32_t max_inline;	 /* Inline bytes a WQE may carry */
	uint32_t qpn;
	uint8_t pad0[SV_CACHELINE - 32];
	/* Line 1: the producer index. */
	uint64_t prod;
	uint8_t pad1[SV_CACHELINE - 8];
	/* Line 2: the doorbell record, and the engine's sleeping flag. */
	uint64_t db_record;
	uint32_t sleeping;
	uint8_t pad2[SV_CACHELINE - 12];
	/* Line 3: the requester's consumer index. */
	uint64_t cons;
	uint8_t pad3[SV_CACHELINE - 8];
	/* Line 4: cumulative acknowledgements. */
	uint64_t acked;	  /* WQEs whose completion has been generated */
	uint64_t retired; /* WQEs whose slots are free (completion polled) */
	uint8_t pad4[SV_CACHELINE - 16];
};
SV_STATIC_ASSERT(offsetof(struct sv_sq_ring, prod) == 64, "producer line");
SV_STATIC_ASSERT(offsetof(struct sv_sq_ring, db_record) == 128, "doorbell line");
SV_STATIC_ASSERT(offsetof(struct sv_sq_ring, cons) == 192, "consumer line");
SV_STATIC_ASSERT(offsetof(struct sv_sq_ring, acked) == 256, "acknowledgement line");
SV_STATIC_ASSERT(sizeof(struct sv_sq_ring) == SV_SQ_HDR_SIZE, "SQ ring header size");

enum sv_wqe_flags {
	/* The data after the header is inline_len bytes of payload, not SGEs
	 * (a SEND or RDMA WRITE posted with IBV_SEND_INLINE). */
	SV_WQE_INLINE = 1 << 0,
};

/* Control segment. */
struct sv_wqe_ctrl {
	uint8_t opcode;	     /* enum ibv_wr_opcode, or SV_WQE_OP_FAST_REG */
	uint8_t num_sge;     /* SGEs after the header; 0 with SV_WQE_INLINE */
	uint16_t flags;	     /* enum sv_wqe_flags */
	uint32_t send_flags; /* IBV_SEND_* */
	uint64_t wr_id;
	uint32_t imm;	     /* imm_data (network order), or the rkey to invalidate */
	uint32_t inline_len; /* With SV_WQE_INLINE: bytes after the header */
	uint32_t xrc_srqn;   /* XRC: the remote SRQ */
	uint32_t index;	     /* Low 32 bits of the WQE's number (informational) */
};
SV_STATIC_ASSERT(sizeof(struct sv_wqe_ctrl) == 32, "control segment size");

/* Remote address segment: RDMA and atomics. */
struct sv_wqe_raddr {
	uint64_t remote_addr;
	uint32_t rkey;
	uint32_t reserved;
};
SV_STATIC_ASSERT(sizeof(struct sv_wqe_raddr) == 16, "remote address segment size");

/* Atomic operands. */
struct sv_wqe_atomic {
	uint64_t compare_add;
	uint64_t swap;
};
SV_STATIC_ASSERT(sizeof(struct sv_wqe_atomic) == 16, "atomic segment size");

/* UD address: the destination QP and its Q_Key, and the address vector
 * itself (as mlx5 carries its AV in the WQE).  ah_index is reserved for an
 * AH table agents may name later; 0: the vector here. */
struct sv_wqe_ud {
	uint32_t remote_qpn;
	uint32_t qkey;
	uint32_t ah_index;
	uint16_t dlid;
	uint8_t sl;
	uint8_t src_path_bits;
	uint8_t static_rate;
	uint8_t is_global;
	uint8_t port_num;
	uint8_t sgid_index;
	uint8_t hop_limit;
	uint8_t traffic_class;
	uint16_t reserved0;
	uint32_t flow_label;
	uint8_t dgid[16];
	uint8_t reserved1[20];
};
SV_STATIC_ASSERT(sizeof(struct sv_wqe_ud) == 64, "UD segment size");

/* Memory segment: BIND_MW and fast-register. */
struct sv_wqe_mem {
	uint32_t slot;	     /* The window's or key's slot in mrs[] */
	uint32_t type;	     /* BIND_MW: the window type */
	uint32_t lkey;	     /* BIND_MW: the MR bound to (0: unbind) */
	uint32_t access;     /* IBV_ACCESS_* */
	uint64_t addr;	     /* First byte, or the offset into the first block */
	uint64_t length;
	uint32_t npages;     /* Fast-register: blocks in the staged list */
	uint32_t page_shift;
	uint32_t new_key;    /* The key after the operation */
	uint32_t reserved;
};
SV_STATIC_ASSERT(sizeof(struct sv_wqe_mem) == 48, "memory segment size");

struct sv_send_wqe {
	struct sv_wqe_ctrl ctrl;
	struct sv_wqe_raddr raddr;
	struct sv_wqe_atomic atomic;
	struct sv_wqe_ud ud;
	struct sv_wqe_mem mem;
	uint8_t reserved[16];
	/* Then num_sge sv_sge, or inline_len bytes of inline data. */
};
SV_STATIC_ASSERT(offsetof(struct sv_send_wqe, raddr) == 32, "raddr offset");
SV_STATIC_ASSERT(offsetof(struct sv_send_wqe, atomic) == 48, "atomic offset");
SV_STATIC_ASSERT(offsetof(struct sv_send_wqe, ud) == 64, "UD offset");
SV_STATIC_ASSERT(offsetof(struct sv_send_wqe, mem) == 128, "memory offset");
SV_STATIC_ASSERT(sizeof(struct sv_send_wqe) == SV_WQE_HDR_SIZE, "WQE header size");
SV_STATIC_ASSERT(SV_SQ_MIN_STRIDE % SV_CACHELINE == 0, "slots are whole cache lines");

/*
 * A process's service segment: the copy path for when the kernel refuses
 * cross-memory attach (Yama ptrace_scope 2 or 3, seccomp).  A requester
 * that cannot write or read a peer's memory asks the peer's service thread
 * to do it, through a bounce buffer here.  One request at a time:
 *
 * Requester: take `lock` (CAS 0 -> own pid; a dead holder's lock is taken
 * over); wait while state == SERVING (a request an earlier requester gave
 * up on, which the service still holds); fill req (and bounce, for a
 * write); store state = POSTED with release; FUTEX_WAKE on state.  Wait
 * (spin, then FUTEX_WAIT with a timeout that checks the peer's lease) for
 * state == DONE (acquire); read status (and bounce, for a read); store
 * state = IDLE; release `lock`.  Giving up on a live peer that does not
 * answer: CAS state POSTED -> IDLE withdraws the request, which then never
 * runs; if the CAS finds SERVING, the request runs (or is running), and
 * the state stays SERVING, so no requester touches req or bounce until the
 * service stores DONE.
 * Service thread: wait for state == POSTED (acquire); claim the request
 * with CAS POSTED -> SERVING (a withdrawn one is not claimed); read req;
 * check that [addr, addr + len) lies inside one of its own registered MRs
 * with the rights the op needs; copy; store status, then state = DONE with
 * release; FUTEX_WAKE on state.
 */
#define SV_SVC_BOUNCE (256 * 1024)

enum sv_svc_state {
	SV_SVC_IDLE = 0,
	SV_SVC_POSTED = 1,
	SV_SVC_DONE = 2,
	SV_SVC_SERVING = 3, /* Claimed by the service: req and bounce are its */
	SV_SVC_ABANDONED = 4, /* SERVING, and its requester gave up: the service
			       * moves no byte it has not moved yet, then DONE */
};

enum sv_svc_op {
	SV_SVC_WRITE = 1, /* bounce -> [addr, addr + len) of the service's process */
	SV_SVC_READ = 2,  /* [addr, addr + len) -> bounce */
};

struct sv_svc_ring {
	struct sv_queue_hdr hdr;
	uint32_t lock;	 /* Requesters' lock: holder's pid, 0 when free */
	uint32_t state;	 /* enum sv_svc_state; a futex word */
	uint32_t op;	 /* enum sv_svc_op */
	uint32_t status; /* 0, or an errno: EFAULT for a range outside its MRs */
	uint64_t addr;	 /* In the service's address space */
	uint64_t len;	 /* At most SV_SVC_BOUNCE */
	uint8_t pad[SV_CACHELINE - 32];
	uint8_t bounce[SV_SVC_BOUNCE];
};
SV_STATIC_ASSERT(offsetof(struct sv_svc_ring, bounce) == 192, "bounce buffer on a line");

/* Async event datagram sent to an object's owner. */
struct sv_async_msg {
	uint32_t type;	/* enum ibv_event_type */
	uint32_t kind;	/* enum sv_obj_kind, or 0 for a QP (slot in qps[]) */
	uint32_t slot;	/* objs[] or qps[] slot */
	uint32_t generation;
};
SV_STATIC_ASSERT(sizeof(struct sv_async_msg) == 16, "async message size");

#endif
