// What the scheduler thread hands a command (engine/cache_control.cc, and tests through
// engine/engine_test_access.h): references to everything the scheduler owns. Internal to
// the engine: valid only inside a command, on the scheduler thread.
#pragma once

#include <cstdint>
#include <functional>

#include "cache/radix_tree.h"
#include "common/result.h"
#include "engine/engine_options.h"
#include "engine/tool_sessions.h"
#include "memory/copy_device.h"
#include "memory/kv_pool.h"
#include "memory/page_allocator.h"
#include "storage/storage_backend.h"

namespace strata {

// What the scheduler thread exposes to commands (cache control, inspection).
struct EngineState {
  RadixTree& tree;
  PageAllocator& device_pages;
  KvPool& kv_pool;
  const EngineOptions& options;
  EngineCounters& counters;  // the pin policy counts its refusals here
  // Pages held privately by running requests (not in the tree).
  int64_t request_private_pages = 0;
  // Audits "every page is free, in the tree, or owned by exactly one request".
  std::function<Status()> audit_pages;
  // A restore found no device room: retract running requests (worst first, never one
  // resuming a session) until `pages` device pages are free or evictable. Returns the
  // requests retracted.
  std::function<int32_t(int64_t pages)> make_device_room;
  // Waits for the host -> device copies in flight to land and advances the tool sessions
  // (a restore started by this command is then RUNNABLE). Does nothing without a host tier.
  std::function<void()> land_loads;
  // Tests: `gate` (may be empty: none) is asked, on the scheduler thread, whether each
  // finished device <-> host copy lands at this poll; false delays it to a later poll (the
  // timing of a busy machine, reproduced by a seeded generator).
  std::function<void(std::function<bool()>)> set_copy_gate;
  // Tests: every copy in flight lands, then the host tier's copies go through a
  // StreamTransferEngine over `device` (a device whose copies land, fail or stall when the
  // test says), reporting copies in flight `stall_timeout_ms` as stalled. Errors without a
  // host tier, or with the page_first layout.
  std::function<Status(CopyDevice& device, int64_t stall_timeout_ms)> use_copy_device;
  // Hierarchical cache (null / 0 without it).
  PageAllocator* host_pages = nullptr;
  StorageBackend* storage = nullptr;
  ToolSessions* sessions = nullptr;
};

}  // namespace strata
