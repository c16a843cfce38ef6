// SPDX-License-Identifier: MIT
// This process's objects by registry slot, so that an async event naming a
// slot (from any process) can be turned back into the application's pointer.
#pragma once

#include <cstdint>

namespace loop {

inline constexpr uint32_t kObjQp = 0; // sv_async_msg.kind for QPs; others use sv_obj_kind
// Process-local kinds, for imports by handle.
inline constexpr uint32_t kObjDm = 100;
inline constexpr uint32_t kObjPd = 101;
inline constexpr uint32_t kObjMr = 102;
inline constexpr uint32_t kObjCtx = 103;

void objects_add(uint32_t kind, uint32_t slot, void *obj);
void objects_remove(uint32_t kind, uint32_t slot);
// The object, or nullptr if this process has none there.
void *objects_find(uint32_t kind, uint32_t slot);

} // namespace loop
