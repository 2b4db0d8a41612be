// The inputs and the per-phase timings of one batched forward pass (Model::forward).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "memory/layer_wait.h"
#include "memory/page_id.h"
#include "model/sampler.h"

namespace strata {

// One sequence of a batch. A prefill chunk has many tokens, a decode step one; both mix
// freely in one call.
struct ForwardSequence {
  // The new tokens, in order. At least one.
  std::span<const int32_t> token_ids;
  // Position of token_ids[0] = number of this sequence's tokens already in its pages
  // (a cached prefix, earlier chunks, earlier decode steps).
  int64_t start_position = 0;
  // Page of each page_size positions of the sequence: page_table[p / page_size] holds
  // position p. Must cover [0, start_position + token_ids.size()). The pages of the
  // new positions are written; a page may be shared with other sequences only where
  // all of them only read it (a common cached prefix).
  std::span<const PageId> page_table;
  // Whether to compute the logits of the last new token (the one sampled next).
  bool want_logits = true;
  // With want_logits: the rules and the uniform number by which this step's token is drawn
  // (model/sampler.h). A model that samples where its logits are (a GPU) may then give the
  // drawn token instead of the row (ForwardOutput::sampled); one that does not gives the
  // logits as for any row, and the engine draws by the same rules and number.
  std::optional<RowSampling> sampling;
  // Pages of [0, start_position) still landing (null: all readable): called before each
  // layer's attention reads them (memory/layer_wait.h). The pages of the new positions are
  // never among them.
  const LayerWait* layer_wait = nullptr;
};

// Wall time per phase of the forward passes since the last reset, in seconds, when
// profiling is on. Phases are fork-join, timed on the calling thread.
struct ForwardProfile {
  double embed_s = 0;
  double norm_s = 0;        // RMSNorms (attention, MLP; final is in logits_s)
  double qkv_s = 0;         // fused q/k/v projection
  double rope_store_s = 0;  // biases, q/k norms, RoPE, K/V written to pages
  double kv_wait_s = 0;     // waiting for a cached prefix's pages to land (LayerWait)
  double attention_s = 0;
  double o_proj_s = 0;
  double gate_up_s = 0;  // fused gate/up projection
  double silu_s = 0;
  double down_s = 0;
  double logits_s = 0;  // final norm and lm_head on the rows that want logits
  int64_t calls = 0;
  int64_t tokens = 0;

  double total_s() const {
    return embed_s + norm_s + qkv_s + rope_store_s + kv_wait_s + attention_s + o_proj_s +
           gate_up_s + silu_s + down_s + logits_s;
  }
  // One line per phase: name, seconds, share of the total.
  std::string to_string() const;
};

}  // namespace strata
