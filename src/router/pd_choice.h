// Prefill/decode disaggregation, the router's side (docs/router.md, "Prefill/decode
// disaggregation"; docs/pd-disaggregation.md, "Router"): once the decode worker is chosen
// (cost.h, with prefill-role workers left out), whether the prompt's part that worker lacks
// is prefilled by a prefill worker, and by which one.
//
// Contract: choose_prefill() is a pure function of its arguments: no clock, no lock, no
// allocation that outlives the call. The router builds one PrefillCandidate per
// prefill-role worker under its own lock and calls it once per routed attempt.
//
// The decision, the first that holds:
//   local_short              remote_tokens = prompt_tokens - decode_cached_tokens is not
//                            longer than min_prefill_tokens (moving it would cost more than
//                            computing it where it decodes);
//   local_no_prefill_worker  the decode worker has no PD channel (its /server_info `pd` is
//                            null), or no prefill worker is usable (joined, not draining,
//                            its last load poll answered, breaker closed, a PD worker id
//                            known, the decode worker's page size);
//   local_overloaded         every usable prefill worker is overloaded: saturated (its load
//                            report, or a recommended pause), or more than
//                            max_prefill_queue_tokens prompt tokens wait there;
//   remote                   otherwise: the usable prefill worker that is not overloaded
//                            with the longest cached run of the prompt (the router's index),
//                            ties by the fewest queued prefill tokens, then the first at
//                            or after position PdRequest::tie_break (mod the candidates)
//                            in id order, as the decode choice breaks its ties (cost.h,
//                            Choice): the router passes its count of decisions, so ties
//                            rotate over the prefill workers instead of always going to
//                            the lowest id.
// So local_no_prefill_worker and local_overloaded count only prompts that would otherwise
// have gone remote.
// "Local" is always safe: the decode worker computes the prompt itself, as a mixed worker.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

#include "common/result.h"

namespace strata::router {

// `strata route --pd ...`, validated by validate().
struct PdOptions {
  bool enabled = false;  // --pd: off, every decode worker prefills its own prompts
  // --pd-min-prefill-tokens: a remote prefill only for more uncached tokens than this, >= 0.
  int64_t min_prefill_tokens = 256;
  // --pd-max-prefill-queue-tokens: a prefill worker with more prompt tokens waiting than
  // this (the larger of its report and the router's own in-flight charge) is overloaded,
  // >= 0. Below the worker's own --pd-max-queued-prefill-tokens (65536), so the router
  // turns away first and the worker's rejection stays a rare race.
  int64_t max_prefill_queue_tokens = 32'768;
};

Status validate(const PdOptions& options);

enum class PdDecision : uint8_t { kRemote, kLocalShort, kLocalNoPrefillWorker, kLocalOverloaded };
// "remote", "local_short", "local_no_prefill_worker", "local_overloaded" (the label of
// strata_router_pd_decisions_total).
std::string_view pd_decision_name(PdDecision decision);

// One prefill-role worker as the router sees it for this request.
struct PrefillCandidate {
  uint32_t id = 0;
  // Joined, not draining, last load poll answered, breaker closed, `pd.worker_id` known,
  // and the decode worker's page size (pages of another size cannot be moved).
  bool usable = true;
  int64_t cached_tokens = 0;          // the prompt's leading cached run here (index), tokens
  int64_t queued_prefill_tokens = 0;  // max(reported queued_prefill_tokens, router's charge)
  bool saturated = false;             // its load report: load_fraction above the threshold
};

// The request after the decode worker was chosen.
struct PdRequest {
  int64_t prompt_tokens = 0;         // >= 0
  int64_t decode_cached_tokens = 0;  // the decode worker's leading cached run, tokens, >= 0
  bool decode_has_channel = true;    // the decode worker reports a PD channel (`pd` not null)
  uint64_t tie_break = 0;            // where ties start, rotating (the router's decisions)
};

struct PdChoice {
  PdDecision decision = PdDecision::kLocalShort;
  std::optional<uint32_t> prefill_worker;  // set exactly when decision == kRemote
  // prompt_tokens - decode_cached_tokens (>= 0): what the decode worker lacks.
  int64_t remote_tokens = 0;
  // kRemote: what the prefill worker computes, prompt_tokens minus its own cached run (at
  // least 1: the first token is always sampled there); the router's in-flight charge on it
  // until the first byte. 0 otherwise.
  int64_t prefill_compute_tokens = 0;
};

// Preconditions: validate(options) succeeded; counts >= 0 (checked). `options.enabled` is
// the caller's business (the router does not call this without --pd).
PdChoice choose_prefill(const PdRequest& request, std::span<const PrefillCandidate> candidates,
                        const PdOptions& options);

}  // namespace strata::router
