// Who may pin what: the one place that decides a pin, whichever way it comes (the
// cache-control API, a message's cache_control, the seed's /hicache paths).
//
//  - kAdmin (the admin key, or a server without one): hard or soft pins at any priority in
//    [kMinPinPriority, kMaxPinPriority], within --max-pinned-ratio of the pool.
//  - kClient (a request without the key): soft pins only, TTL capped at
//    --max-client-pin-ttl-s (a hard pin asked for becomes a soft pin of that TTL), at
//    kClientPinPriority so that the no-deadlock rule releases them first, within
//    --max-client-pinned-ratio of the pool and also within --max-pinned-ratio.
//
// The pool is the host pool with a hierarchical cache (pinned blocks live there), else the
// device pool. Runs on the scheduler thread (inside Engine::call).
#pragma once

#include <span>

#include "cache/block_hash.h"
#include "cache/radix_tree.h"
#include "common/result.h"
#include "engine/engine.h"

namespace strata {

inline constexpr int32_t kMinPinPriority = -100;
inline constexpr int32_t kMaxPinPriority = 100;
inline constexpr int32_t kClientPinPriority = kMinPinPriority;

enum class PinAuthority : uint8_t { kAdmin, kClient };

// Pins `hashes` as `authority` may. kInvalidArgument for a priority out of range;
// kResourceExhausted (nothing pinned) when the blocks this call would newly pin do not fit
// the budget. A pinned block gets its host (and storage) copy started at once.
Result<PinResult> apply_pin(EngineState& s, std::span<const BlockHash> hashes, PinOptions options,
                            PinAuthority authority);

}  // namespace strata
