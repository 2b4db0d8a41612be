// A plain reference forward pass: obvious loops in double precision over one sequence,
// no pages, no batching, no threads, and its own RoPE table. It reads the same weights
// as the fast path (so F32 vs BF16 storage is not a difference between them); the
// tests compare the two to bound the fast path's error.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "model/model_config.h"
#include "model/weights.h"

namespace strata {

// Logits of every position of `tokens`, row-major [tokens.size()][vocab_size].
// Token ids must be in the vocabulary (checked).
std::vector<double> reference_forward(const ModelConfig& config, const ModelWeights& weights,
                                      std::span<const int32_t> tokens);

}  // namespace strata
