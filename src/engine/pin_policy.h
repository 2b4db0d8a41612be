// Who may pin what, and the pin budgets: the one place that decides a pin, whichever way
// it comes (the cache-control API, a message's cache_control, the seed's /hicache paths).
//
//  - kAdmin: hard or soft pins at any PinPriority, within --max-pinned-ratio of the pool.
//  - kClient: soft pins only, TTL capped at --max-client-pin-ttl-s (a hard pin asked for
//    becomes a soft pin of that TTL), at the lowest priority so that the no-deadlock rule
//    releases them first, within --max-client-pinned-ratio of the pool and also within
//    --max-pinned-ratio.
//
// The pool is the host pool with a hierarchical cache (pinned blocks live there), else the
// device pool. A pinned block gets its host (and storage) copy started at once. Internal to
// the engine; runs on the scheduler thread (engine/cache_control.cc).
#pragma once

#include "common/result.h"
#include "engine/cache_control.h"
#include "engine/engine_state.h"

namespace strata {

// The pool the budgets apply to: host pages with a hierarchical cache, else device pages.
int64_t pin_pool_pages(const EngineState& s);
// Blocks that may be pinned at once: --max-pinned-ratio of that pool.
int64_t pin_budget_pages(const EngineState& s);

// kOverBudget (nothing pinned) when the blocks this call would newly pin do not fit.
Result<PinOutcome> apply_pin(EngineState& s, const PinCommand& command);

}  // namespace strata
