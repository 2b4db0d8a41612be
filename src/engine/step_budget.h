// How many prefill tokens one scheduler step may carry, so that the requests decoding in
// the same step keep a steady inter-token latency (docs/scheduling.md).
//
// A step's forward pass runs every decoding request's next token and a share of the
// waiting prefill. Its time is modelled as decode_ms (what the decoding requests cost
// together) plus prefill_ms_per_token x prefill tokens, both learned from measured steps
// (exponential moving averages: a decode-only step measures decode_ms, a prefill-only
// step the per-token cost, a mixed step whichever is known less well). The prefill share is then
// whatever fits in the step target: (target - decode_ms) / prefill_ms_per_token, bounded below by a
// guaranteed minimum (prefill always progresses) and above by --chunked-prefill-size. Without
// decoding requests there is no latency to protect and the share is the full chunk.
//
// The target is --itl-target-ms, or, at 0 (auto), 4.5 times the measured decode forward
// pass. (The inter-token latency a client sees also holds sampling, the scheduler's own
// work and HTTP: on the bench model a 20 ms decode forward is a 29 ms ITL.) Measured on
// the bench model at concurrency 8 (docs/benchmarks.md): 3x kept ITL p99 within 1.5x p50
// but cost 25 % of output tokens/s, as small chunks use the matrix kernels less well;
// about 4.5x keeps p99 within 3x p50 at 98 % of the old throughput.
//
// Pure arithmetic, no clock: the scheduler measures each step and calls observe(); tests
// drive it with a fake cost model.
#pragma once

#include <cstdint>

namespace strata {

struct StepBudgetOptions {
  double itl_target_ms = 0.0;         // 0: auto (auto_factor x the decode step)
  double auto_factor = 4.5;           // auto target = auto_factor x decode_ms
  double min_target_ms = 0.0;         // auto target never below this
  int64_t min_prefill_tokens = 64;    // the guaranteed prefill progress per step
  int64_t max_prefill_tokens = 2048;  // --chunked-prefill-size
  double smoothing = 0.2;             // EMA weight of the newest measurement
};

class StepBudget {
 public:
  explicit StepBudget(StepBudgetOptions options);

  // Prefill tokens the next step may carry when `decoding` requests decode in it.
  int64_t prefill_tokens(int64_t decoding) const;
  // A measured step: `prefill` prefill tokens and `decoding` decode tokens took `ms`.
  void observe(int64_t prefill, int64_t decoding, double ms);

  // The model as learned so far (0 before the first measurement of its kind).
  double decode_ms() const { return decode_ms_; }
  double prefill_ms_per_token() const { return prefill_ms_per_token_; }
  // The step target now (the option, or auto from the decode step).
  double target_ms() const;
  const StepBudgetOptions& options() const { return options_; }

 private:
  static double blend(double old_value, double sample, double weight);

  StepBudgetOptions options_;
  double decode_ms_ = 0.0;  // the decoding requests' share of a step
  double prefill_ms_per_token_ = 0.0;
};

}  // namespace strata
