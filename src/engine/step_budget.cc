#include "engine/step_budget.h"

#include <algorithm>
#include <cmath>

namespace strata {

namespace {
// Fewer prefill tokens than this say more about a step's fixed cost (the weights are read
// once per step) than about the cost of a token: they do not update the per-token cost.
constexpr int64_t kMinTokensToLearn = 16;
}  // namespace

StepBudget::StepBudget(StepBudgetOptions options) : options_(options) {
  options_.min_prefill_tokens = std::max<int64_t>(1, options_.min_prefill_tokens);
  options_.max_prefill_tokens = std::max<int64_t>(1, options_.max_prefill_tokens);
  options_.min_prefill_tokens = std::min(options_.min_prefill_tokens, options_.max_prefill_tokens);
}

double StepBudget::blend(double old_value, double sample, double weight) {
  return old_value <= 0.0 ? sample : old_value + weight * (sample - old_value);
}

double StepBudget::target_ms() const {
  if (options_.itl_target_ms > 0.0) return options_.itl_target_ms;
  return std::max(options_.min_target_ms, options_.auto_factor * decode_ms_);
}

int64_t StepBudget::prefill_tokens(int64_t decoding) const {
  const int64_t lo = options_.min_prefill_tokens;
  const int64_t hi = options_.max_prefill_tokens;
  if (decoding <= 0) return hi;  // nobody waits for a token: prefill at full speed
  // Until a step has measured both costs, stay at the guaranteed minimum: a full chunk
  // before the first measurement would be exactly the stall this class exists to avoid.
  if (prefill_ms_per_token_ <= 0.0 || (decode_ms_ <= 0.0 && options_.itl_target_ms <= 0.0)) {
    return lo;
  }
  const double room_ms = target_ms() - decode_ms_;
  if (room_ms <= 0.0) return lo;
  const double tokens = std::floor(room_ms / prefill_ms_per_token_);
  if (tokens >= static_cast<double>(hi)) return hi;
  return std::clamp(static_cast<int64_t>(tokens), lo, hi);
}

void StepBudget::observe(int64_t prefill, int64_t decoding, double ms) {
  if (!(ms > 0.0) || !std::isfinite(ms) || (prefill <= 0 && decoding <= 0)) return;
  const double w = options_.smoothing;
  if (prefill <= 0) {
    decode_ms_ = blend(decode_ms_, ms, w);
    return;
  }
  if (decoding <= 0) {
    if (prefill >= kMinTokensToLearn) {
      prefill_ms_per_token_ = blend(prefill_ms_per_token_, ms / static_cast<double>(prefill), w);
    }
    return;
  }
  // A mixed step: attribute what is known, learn the other part.
  if (decode_ms_ > 0.0 && prefill >= kMinTokensToLearn) {
    // Never credit prefill with less than a tenth of the step (decode_ms may be stale).
    const double prefill_ms = std::max(ms - decode_ms_, 0.1 * ms);
    prefill_ms_per_token_ =
        blend(prefill_ms_per_token_, prefill_ms / static_cast<double>(prefill), w);
  } else if (prefill_ms_per_token_ > 0.0) {
    const double decode_part =
        std::max(ms - prefill_ms_per_token_ * static_cast<double>(prefill), 0.1 * ms);
    decode_ms_ = blend(decode_ms_, decode_part, w);
  }
}

}  // namespace strata
