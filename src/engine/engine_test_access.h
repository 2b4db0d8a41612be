// Tests only: a door into the scheduler thread. `engine_call(engine, fn)` runs fn with the
// scheduler's EngineState between two steps and returns its result, so that a test can
// audit pages or check the tree's invariants. Production code uses the cache-control
// commands (engine/cache_control.h); this header is internal to the engine and visible
// only to targets that link strata_engine_internals.
#pragma once

#include <utility>

#include "engine/engine.h"
#include "engine/scheduler.h"

namespace strata {

class EngineTestAccess {
 public:
  static Scheduler& scheduler(Engine& engine) { return *engine.scheduler_; }
};

template <typename F>
auto engine_call(Engine& engine, F&& fn) {
  return EngineTestAccess::scheduler(engine).call(std::forward<F>(fn));
}

}  // namespace strata
