// SPDX-License-Identifier: MIT
// This process's objects by registry slot, so that an async event naming a
// slot (from any process) can be turned back into the application's pointer.
#pragma once

#include <cstdint>

namespace loop {

inline constexpr uint32_t kObjQp = 0; // sv_async_msg.kind for QPs; others use sv_obj_kind

void objects_add(uint32_t kind, uint32_t slot, void *obj);
void objects_remove(uint32_t kind, uint32_t slot);
// The object, or nullptr if this process has none there.
void *objects_find(uint32_t kind, uint32_t slot);

} // namespace loop
