// SPDX-License-Identifier: MIT
#include "objects.h"

#include <map>
#include <mutex>

namespace loop {

namespace {

std::mutex g_lock;
std::map<uint64_t, void *> g_objects;

uint64_t key(uint32_t kind, uint32_t slot)
{
	return (static_cast<uint64_t>(kind) << 32) | slot;
}

} // namespace

void objects_add(uint32_t kind, uint32_t slot, void *obj)
{
	std::lock_guard<std::mutex> g(g_lock);
	g_objects[key(kind, slot)] = obj;
}

void objects_remove(uint32_t kind, uint32_t slot)
{
	std::lock_guard<std::mutex> g(g_lock);
	g_objects.erase(key(kind, slot));
}

void *objects_find(uint32_t kind, uint32_t slot)
{
	std::lock_guard<std::mutex> g(g_lock);
	auto it = g_objects.find(key(kind, slot));
	return it == g_objects.end() ? nullptr : it->second;
}

} // namespace loop
