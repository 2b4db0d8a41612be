// Page arithmetic of the scheduler: how many KV pages token positions take. The one place
// that rounds (submit, admission, reserves, P/D rooms, restores).
#pragma once

#include <cstdint>

namespace strata {

// Pages holding `positions` token positions (rounded up). page_size >= 1.
constexpr int64_t pages_for(int64_t positions, int32_t page_size) {
  return (positions + page_size - 1) / page_size;
}

// Pages a sequence of `tokens` tokens needs for its next step: its tokens and the slot of
// the token that step produces.
constexpr int64_t pages_to_run(int64_t tokens, int32_t page_size) {
  return pages_for(tokens + 1, page_size);
}

}  // namespace strata
