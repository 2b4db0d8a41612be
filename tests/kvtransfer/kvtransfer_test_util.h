// Helpers shared by the KV transfer tests.
#pragma once

#include <chrono>

namespace strata {

// Waiting is bounded so that a hang fails the test instead of stalling the suite; the
// bound is far above any expected time and nothing asserts on how long it took.
inline constexpr std::chrono::seconds kWaitBound{120};

}  // namespace strata
