// A model that does no arithmetic: a ForwardModel whose forward pass waits the time a
// TimingProfile predicts for the batch and emits deterministic tokens, so that a worker with
// the real scheduler, cache, tiers and API runs at a real model's pace on almost no CPU
// (`strata serve --simulate PROFILE`, docs/simulation.md).
//
// The KV pool is real in its pages and tiny in its bytes: one layer, one KV head, head_dim 2
// (8 bytes a token in F16/BF16). Each position's slot holds a 32-bit running hash of the
// sequence's tokens up to it, as four values 0..255 (exact in every KV dtype); the token
// emitted after a sequence is a function of the hash at its last position. So the output is
// a function of the sequence's tokens alone, whatever the batch, the chunking, the cache
// hits or the tier a prefix came back from, and a page that a tier move corrupted or lost
// shows in the output as it would with real KV.
//
// Thread: one thread at a time calls forward() (the engine's forward thread); stats() may be
// called from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "model/forward_model.h"
#include "model/timing_profile.h"

namespace strata {

struct SimulatedModelOptions {
  // The token ids the model may emit (ordinary text tokens: `strata serve` takes those that
  // decode to ASCII letters, with or without a leading space). Empty: every id of the
  // vocabulary but the config's bos and eos. Each in [0, vocab_size), at most 2^24 of them.
  std::vector<int32_t> output_token_ids;
  // Every predicted time is multiplied by this (0.5: twice as fast), in (0, 1000].
  double time_scale = 1.0;
  // Spin instead of sleep for the last microseconds of a pass (sub-millisecond precision
  // for one worker, at the cost of a busy core); 0: sleep only. In [0, 1,000,000].
  int64_t spin_tail_us = 0;
};

// What the forward passes did since creation (for tests and logs).
struct SimulatedModelStats {
  int64_t passes = 0;
  double predicted_ms = 0;      // sum of the passes' predicted times
  double elapsed_ms = 0;        // sum of the passes' wall times
  double max_overshoot_ms = 0;  // the largest wall time beyond the prediction
};

class SimulatedModel final : public ForwardModel {
 public:
  // kInvalidArgument for bad options (named) or a vocabulary beyond 2^24 tokens.
  static Result<std::unique_ptr<SimulatedModel>> create(ModelConfig config, TimingProfile profile,
                                                        SimulatedModelOptions options = {});

  const ModelConfig& config() const override { return config_; }
  // One layer, one KV head, head_dim 2, whatever the config says.
  KvPoolShape kv_pool_shape(int32_t num_pages, int32_t page_size, KvDtype dtype) const override;
  // Validates as Model::forward does, writes each new position's hash, fills out.tokens
  // (out.logits left empty) and returns once predict_ms(batch) has passed since the call.
  Status forward(std::span<const ForwardSequence> batch, KvPool& pool, ForwardOutput& out) override;
  bool chooses_tokens() const override { return true; }

  // The time forward() takes for `batch` (docs/simulation.md, "The batch model"): the decode
  // step of the one-token sequences (batch size, mean context) plus the prefill pass of the
  // others (their new tokens together, token-weighted mean context), times time_scale.
  double predict_ms(std::span<const ForwardSequence> batch) const;

  // The token emitted after `tokens` (at least one): what forward() gives for a sequence of
  // exactly these tokens.
  int32_t next_token(std::span<const int32_t> tokens) const;

  const TimingProfile& profile() const { return profile_; }
  SimulatedModelStats stats() const;

 private:
  SimulatedModel(ModelConfig config, TimingProfile profile, SimulatedModelOptions options);

  Status validate(std::span<const ForwardSequence> batch, const KvPool& pool) const;
  int32_t token_of(uint32_t hash) const;

  const ModelConfig config_;
  const TimingProfile profile_;
  const SimulatedModelOptions options_;
  mutable std::mutex stats_mutex_;
  SimulatedModelStats stats_;  // guarded by stats_mutex_
};

}  // namespace strata
