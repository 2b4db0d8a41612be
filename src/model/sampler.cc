#include "model/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "common/check.h"
#include "model/kernels.h"

namespace strata {

namespace {

// log(sum(exp(logits))), stable.
double log_sum_exp(std::span<const float> logits, std::vector<float>& scratch) {
  float max_logit = -std::numeric_limits<float>::infinity();
  for (float v : logits) max_logit = std::max(max_logit, v);
  scratch.resize(logits.size());
  const double sum =
      exp_shift_row(logits.data(), scratch.data(), static_cast<int64_t>(logits.size()), max_logit);
  return static_cast<double>(max_logit) + std::log(sum);
}

// Whether token a ranks before token b: larger logit first, then smaller id.
struct RankBefore {
  std::span<const float> logits;
  bool operator()(int32_t a, int32_t b) const {
    const float la = logits[static_cast<size_t>(a)];
    const float lb = logits[static_cast<size_t>(b)];
    return la > lb || (la == lb && a < b);
  }
};

int32_t argmax(std::span<const float> logits) {
  int32_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[static_cast<size_t>(best)]) best = static_cast<int32_t>(i);
  }
  return best;
}

}  // namespace

Status validate_sampling_params(const SamplingParams& p) {
  auto bad = [](const std::string& what) { return make_error(ErrorCode::kInvalidArgument, what); };
  if (!std::isfinite(p.temperature) || p.temperature < 0.0f) {
    return bad("temperature must be a finite number >= 0");
  }
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) return bad("top_p must be in (0, 1]");
  if (p.top_logprobs < 0 || p.top_logprobs > kMaxTopLogprobs) {
    return bad("top_logprobs must be between 0 and " + std::to_string(kMaxTopLogprobs));
  }
  for (int32_t id : p.stop_token_ids) {
    if (id < 0) return bad("stop token ids must be >= 0");
  }
  return {};
}

namespace {
constexpr float kChosenOtherLogprob = -9999.0f;
}  // namespace

SampledToken sample_chosen(const SamplingParams& params, int32_t token) {
  SampledToken out;
  out.token = token;
  out.is_stop = std::find(params.stop_token_ids.begin(), params.stop_token_ids.end(), token) !=
                params.stop_token_ids.end();
  // A one-hot row's alternatives are at log(0); like vLLM, report -9999 for it (JSON has no
  // -inf), ties by the smaller id as top_logprobs() breaks them.
  if (params.top_logprobs > 0) out.top_logprobs.push_back(TokenLogprob{token, 0.0f});
  for (int32_t id = 0; static_cast<int32_t>(out.top_logprobs.size()) < params.top_logprobs; ++id) {
    if (id != token) out.top_logprobs.push_back(TokenLogprob{id, kChosenOtherLogprob});
  }
  return out;
}

float token_logprob(std::span<const float> logits, int32_t token) {
  STRATA_CHECK(token >= 0 && static_cast<size_t>(token) < logits.size());
  std::vector<float> scratch;
  return static_cast<float>(static_cast<double>(logits[static_cast<size_t>(token)]) -
                            log_sum_exp(logits, scratch));
}

std::vector<TokenLogprob> top_logprobs(std::span<const float> logits, int32_t n) {
  std::vector<float> scratch;
  const double lse = log_sum_exp(logits, scratch);
  const size_t count = std::min(static_cast<size_t>(std::max(n, 0)), logits.size());
  std::vector<int32_t> ids(logits.size());
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i);
  std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(count), ids.end(),
                    RankBefore{logits});
  std::vector<TokenLogprob> out;
  out.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    out.push_back(TokenLogprob{
        ids[i],
        static_cast<float>(static_cast<double>(logits[static_cast<size_t>(ids[i])]) - lse)});
  }
  return out;
}

namespace {

// The token of one draw by the rules of sampler.h: argmax at temperature 0; else the kept
// tokens (top_k by rank, then the top_p prefix of the ranking) walked in id order.
int32_t draw_row(std::span<const float> logits, const RowSampling& row, Sampler::Scratch& sc) {
  const int32_t vocab = static_cast<int32_t>(logits.size());
  if (row.temperature == 0.0f) return argmax(logits);

  // Candidates: all tokens, or the top_k ranked ones.
  const bool use_top_k = row.top_k > 0 && row.top_k < vocab;
  const bool use_top_p = row.top_p < 1.0f;
  std::vector<int32_t>& candidates = sc.candidates;
  std::vector<float>& weights = sc.weights;
  candidates.resize(static_cast<size_t>(vocab));
  for (int32_t i = 0; i < vocab; ++i) candidates[static_cast<size_t>(i)] = i;
  size_t kept = candidates.size();
  const RankBefore rank{logits};
  if (use_top_k) {
    kept = static_cast<size_t>(row.top_k);
    std::nth_element(candidates.begin(), candidates.begin() + static_cast<std::ptrdiff_t>(kept - 1),
                     candidates.end(), rank);
  }

  // Weights exp((logit - max) / T) of the candidates.
  float max_logit = -std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < kept; ++i) {
    max_logit = std::max(max_logit, logits[static_cast<size_t>(candidates[i])]);
  }
  const float inv_t = 1.0f / row.temperature;
  weights.resize(kept);
  for (size_t i = 0; i < kept; ++i) {
    weights[i] = (logits[static_cast<size_t>(candidates[i])] - max_logit) * inv_t;
  }
  exp_row(weights.data(), weights.data(), static_cast<int64_t>(kept));

  if (use_top_p) {
    double total = 0.0;
    for (size_t i = 0; i < kept; ++i) total += weights[i];
    // Rank the candidates (most likely first) only as far as needed to reach top_p:
    // sort a growing prefix selected by nth_element.
    const double target = static_cast<double>(row.top_p) * total;
    size_t prefix = std::min<size_t>(kept, 256);
    std::vector<std::pair<int32_t, float>>& ranked = sc.ranked;
    for (;;) {
      ranked.resize(kept);
      for (size_t i = 0; i < kept; ++i) ranked[i] = {candidates[i], weights[i]};
      auto by_rank = [&](const std::pair<int32_t, float>& a, const std::pair<int32_t, float>& b) {
        return rank(a.first, b.first);
      };
      if (prefix < kept) {
        std::nth_element(ranked.begin(), ranked.begin() + static_cast<std::ptrdiff_t>(prefix),
                         ranked.end(), by_rank);
      }
      std::sort(ranked.begin(), ranked.begin() + static_cast<std::ptrdiff_t>(prefix), by_rank);
      double cumulative = 0.0;
      size_t cut = 0;
      while (cut < prefix) {
        cumulative += ranked[cut].second;
        ++cut;
        if (cumulative >= target) break;
      }
      if (cumulative >= target || prefix == kept) {
        kept = cut;
        for (size_t i = 0; i < kept; ++i) {
          candidates[i] = ranked[i].first;
          weights[i] = ranked[i].second;
        }
        break;
      }
      prefix = std::min(kept, prefix * 8);
    }
  }

  // The walk is in token-id order (the canonical order a device follows too).
  if (use_top_k || use_top_p) {
    std::vector<std::pair<int32_t, float>>& by_id = sc.ranked;
    by_id.resize(kept);
    for (size_t i = 0; i < kept; ++i) by_id[i] = {candidates[i], weights[i]};
    std::sort(by_id.begin(), by_id.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    for (size_t i = 0; i < kept; ++i) {
      candidates[i] = by_id[i].first;
      weights[i] = by_id[i].second;
    }
  }
  double total = 0.0;
  for (size_t i = 0; i < kept; ++i) total += weights[i];
  const double u = row.uniform * total;
  double cumulative = 0.0;
  for (size_t i = 0; i < kept; ++i) {
    cumulative += weights[i];
    if (u < cumulative) return candidates[i];
  }
  // Rounding left u at the very top: the last candidate with weight.
  for (size_t i = kept; i-- > 0;) {
    if (weights[i] > 0.0f) return candidates[i];
  }
  return candidates[0];
}

SampledToken sample_row_with(std::span<const float> logits, const RowSampling& row,
                             Sampler::Scratch& sc) {
  STRATA_CHECK(!logits.empty());
  SampledToken out;
  out.token = draw_row(logits, row, sc);
  if (row.logprobs || row.top_logprobs > 0) {
    const double lse = log_sum_exp(logits, sc.weights);
    out.logprob =
        static_cast<float>(static_cast<double>(logits[static_cast<size_t>(out.token)]) - lse);
    if (row.top_logprobs > 0) out.top_logprobs = top_logprobs(logits, row.top_logprobs);
  }
  return out;
}

}  // namespace

SampledToken sample_row(std::span<const float> logits, const RowSampling& row) {
  Sampler::Scratch scratch;
  return sample_row_with(logits, row, scratch);
}

Sampler::Sampler(SamplingParams params, uint64_t fallback_seed)
    : params_(std::move(params)), rng_(params_.seed.value_or(fallback_seed)) {
  const Status valid = validate_sampling_params(params_);
  STRATA_CHECK_MSG(valid.has_value(), valid.error().message);
}

RowSampling Sampler::next_row() {
  RowSampling row{.temperature = params_.temperature,
                  .top_k = params_.top_k,
                  .top_p = params_.top_p,
                  .logprobs = params_.logprobs,
                  .top_logprobs = params_.top_logprobs};
  if (row.temperature > 0.0f) row.uniform = rng_.uniform();
  return row;
}

SampledToken Sampler::sample(std::span<const float> logits) {
  return sample(logits, next_row());
}

SampledToken Sampler::sample(std::span<const float> logits, const RowSampling& row) {
  return accept(sample_row_with(logits, row, scratch_));
}

SampledToken Sampler::accept(SampledToken drawn) const {
  drawn.is_stop = std::find(params_.stop_token_ids.begin(), params_.stop_token_ids.end(),
                            drawn.token) != params_.stop_token_ids.end();
  return drawn;
}

}  // namespace strata
