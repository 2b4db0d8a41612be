// Token sampling from one row of logits: greedy, temperature, top-k, top-p, a seed per
// request, log-probabilities as OpenAI defines them, stop token ids.
//
// Order of operations (as vLLM and Hugging Face): divide by temperature, keep the top_k
// largest, keep the smallest set of most likely tokens whose probability reaches
// top_p, renormalise, draw. Ties are broken by the smaller token id, so every step is
// deterministic given the logits and the generator's state.
//
// The draw is one uniform number u in [0, 1) a step, taken from the request's generator
// (none at temperature 0): the kept tokens are walked in token-id order, their weights
// summed, and the first whose running sum exceeds u x the total is the token. This canonical
// order is what lets a device sample the same way (sample_row(), RowSampling): the engine
// draws u on the host, a GPU filters and walks the row where it lies, and both pick the same
// token from the same row (docs/cuda.md, "Sampling on the GPU").
//
// Log-probabilities are those of the raw logits (log-softmax before temperature and
// filtering), which is what OpenAI's `logprobs` / `top_logprobs` report.
//
// Thread: a Sampler belongs to one request; distinct samplers are independent.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "common/result.h"
#include "model/rng.h"

namespace strata {

struct SamplingParams {
  float temperature = 1.0f;             // >= 0; 0 = greedy (argmax)
  int32_t top_k = 0;                    // <= 0: no limit
  float top_p = 1.0f;                   // in (0, 1]; 1: no limit
  std::optional<uint64_t> seed;         // reproducible draws; empty: the caller's fallback seed
  bool logprobs = false;                // report the sampled token's log-probability
  int32_t top_logprobs = 0;             // report this many most likely alternatives, 0..20
  std::vector<int32_t> stop_token_ids;  // sampling one of these ends the request
};

inline constexpr int32_t kMaxTopLogprobs = 20;

// kInvalidArgument naming the bad field.
Status validate_sampling_params(const SamplingParams& params);

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
};

struct SampledToken {
  int32_t token = 0;
  bool is_stop = false;                    // token is in stop_token_ids
  float logprob = 0.0f;                    // when params.logprobs or top_logprobs > 0
  std::vector<TokenLogprob> top_logprobs;  // most likely first, ties by token id
};

// One step's sampling of one row: the request's rules and, at a temperature, the uniform
// number its generator gave for the step. What a model that samples on its own device is
// handed (ForwardSequence::sampling).
struct RowSampling {
  float temperature = 0.0f;  // 0: argmax (ties: the smaller id)
  int32_t top_k = 0;         // <= 0 or >= the vocabulary: no limit
  float top_p = 1.0f;        // in (0, 1]
  double uniform = 0.0;      // in [0, 1); unused at temperature 0
  bool logprobs = false;
  int32_t top_logprobs = 0;  // 0..kMaxTopLogprobs
};

// The token the rules above give `logits` (at least one) with `row`'s uniform number, its
// log-probability and alternatives when asked (is_stop false: stop ids are the request's).
// The CPU reference of every device that samples (tests/cuda).
SampledToken sample_row(std::span<const float> logits, const RowSampling& row);

class Sampler {
 public:
  // Seeds the generator from params.seed, or from `fallback_seed` when it is empty.
  // The params must be valid (checked).
  Sampler(SamplingParams params, uint64_t fallback_seed);

  const SamplingParams& params() const { return params_; }

  // Draws the next token from `logits` (one per vocabulary entry, at least one):
  // sample(logits, next_row()).
  SampledToken sample(std::span<const float> logits);

  // This step's RowSampling: the params' rules and, at a temperature, the generator's next
  // uniform number (greedy takes none). Each emitted token takes exactly one, wherever it is
  // drawn, so a request's tokens do not depend on whether a device or the CPU sampled them.
  RowSampling next_row();
  // The token from `logits` by `row` (one next_row() gave), is_stop set.
  SampledToken sample(std::span<const float> logits, const RowSampling& row);
  // A token drawn elsewhere by the same rules (a device): is_stop set from the params.
  SampledToken accept(SampledToken drawn) const;

  // The reusable buffers of one draw (sample_row's scratch).
  struct Scratch {
    std::vector<float> weights;
    std::vector<int32_t> candidates;
    std::vector<std::pair<int32_t, float>> ranked;
  };

 private:
  SamplingParams params_;
  Rng rng_;
  Scratch scratch_;
};

// What sample() reports for a token the model chose itself (model/forward_model.h): as for
// a one-hot row, the token with log-probability 0 and, when asked for alternatives, the next
// ones at -9999 (log 0, as vLLM writes it), ids 0, 1, ... skipping the token; is_stop from
// params.stop_token_ids. No generator state is used. The vocabulary must hold more than
// kMaxTopLogprobs ids (SimulatedModel checks it).
SampledToken sample_chosen(const SamplingParams& params, int32_t token);

// Log-softmax of `logits` for `token`, and the `n` most likely tokens (ties by id).
// Exposed for tests and for scoring prompts.
float token_logprob(std::span<const float> logits, int32_t token);
std::vector<TokenLogprob> top_logprobs(std::span<const float> logits, int32_t n);

}  // namespace strata
