// SPDX-License-Identifier: MIT
// The trusted geometry of queue segments.  A queue's header lives in shared
// memory, where a buggy peer can rewrite it at any time; so its layout
// (entries, entry_size, slots_offset, payload array) is checked once, when
// the owner creates the segment or a peer maps it, and kept here in process
// memory.  Every slot index into a ring is computed from this copy, never
// from the header (see docs/design.md, "What a peer's stray write can do").
#pragma once

#include "../../../kernel-abi/softverbs-abi.h"

#include <cstddef>
#include <cstdint>

namespace loop {

struct queue_geom {
	uint32_t kind = 0;	     // enum sv_obj_kind
	uint32_t entries = 0;	     // A power of two
	uint32_t entry_size = 0;     // Bytes per slot, at least 64
	uint32_t slots_offset = 0;   // First slot, at least sizeof(sv_queue_hdr)
	uint32_t max_sge = 0;	     // RQ/SRQ: SGEs per WQE
	uint32_t payload_offset = 0; // CQ: the sv_cqe_payload array, 0 if none (or unchecked)
	uint64_t size = 0;	     // Bytes mapped: every slot lies below it
};

// Whether a layout fits inside `size` bytes: a power-of-two entry count,
// slots of at least 64 bytes after the header, the payload array (if any)
// after the slots.  The bounds keep every product below 2^63.
bool queue_geom_valid(const queue_geom &g);

// Records the geometry of a mapping this process made (the owner's at
// creation, a peer's at first mapping), and forgets it when unmapped.
void queue_geom_register(const void *map, const queue_geom &g);
void queue_geom_forget(const void *map);

// The geometry of a ring this process mapped.  Rings that were never
// registered (rings in process memory, as the unit tests build them) get
// their header's values if those pass queue_geom_valid against the header's
// seg_size.  Returns false for a ring whose geometry cannot be trusted.
bool queue_geometry(const void *map, queue_geom &out);

} // namespace loop
