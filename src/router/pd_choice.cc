#include "router/pd_choice.h"

#include <algorithm>
#include <string>
#include <vector>

#include "common/check.h"

namespace strata::router {

Status validate(const PdOptions& o) {
  if (o.min_prefill_tokens < 0) {
    return make_error(ErrorCode::kInvalidArgument, "--pd-min-prefill-tokens must be >= 0");
  }
  if (o.max_prefill_queue_tokens < 0) {
    return make_error(ErrorCode::kInvalidArgument, "--pd-max-prefill-queue-tokens must be >= 0");
  }
  return {};
}

std::string_view pd_decision_name(PdDecision decision) {
  switch (decision) {
    case PdDecision::kRemote:
      return "remote";
    case PdDecision::kLocalShort:
      return "local_short";
    case PdDecision::kLocalNoPrefillWorker:
      return "local_no_prefill_worker";
    case PdDecision::kLocalOverloaded:
      return "local_overloaded";
  }
  return "unknown";
}

PdChoice choose_prefill(const PdRequest& request, std::span<const PrefillCandidate> candidates,
                        const PdOptions& options) {
  STRATA_CHECK(request.prompt_tokens >= 0 && request.decode_cached_tokens >= 0);
  PdChoice out;
  out.remote_tokens = std::max<int64_t>(0, request.prompt_tokens - request.decode_cached_tokens);
  if (out.remote_tokens <= options.min_prefill_tokens) {
    out.decision = PdDecision::kLocalShort;
    return out;
  }
  const PrefillCandidate* best = nullptr;
  size_t best_rank = 0;
  bool any_usable = false;
  // A candidate's place in the rotation: its position in id order (whatever the order of
  // the candidates), counted from position tie_break % n, wrapping.
  const size_t n = candidates.size();
  std::vector<uint32_t> ids;
  ids.reserve(n);
  for (const PrefillCandidate& c : candidates) ids.push_back(c.id);
  std::sort(ids.begin(), ids.end());
  const size_t start = n == 0 ? 0 : static_cast<size_t>(request.tie_break % n);
  for (const PrefillCandidate& c : candidates) {
    const auto at =
        static_cast<size_t>(std::lower_bound(ids.begin(), ids.end(), c.id) - ids.begin());
    const size_t rank = (at + n - start) % n;
    STRATA_CHECK_MSG(c.cached_tokens >= 0 && c.queued_prefill_tokens >= 0,
                     "prefill candidate " + std::to_string(c.id) + ": negative count");
    if (!c.usable) continue;
    any_usable = true;
    if (c.saturated || c.queued_prefill_tokens > options.max_prefill_queue_tokens) continue;
    const bool better =
        best == nullptr || c.cached_tokens > best->cached_tokens ||
        (c.cached_tokens == best->cached_tokens &&
         (c.queued_prefill_tokens < best->queued_prefill_tokens ||
          (c.queued_prefill_tokens == best->queued_prefill_tokens && rank < best_rank)));
    if (better) {
      best = &c;
      best_rank = rank;
    }
  }
  if (!request.decode_has_channel || !any_usable) {
    out.decision = PdDecision::kLocalNoPrefillWorker;
    return out;
  }
  if (best == nullptr) {
    out.decision = PdDecision::kLocalOverloaded;
    return out;
  }
  out.decision = PdDecision::kRemote;
  out.prefill_worker = best->id;
  out.prefill_compute_tokens = std::max<int64_t>(1, request.prompt_tokens - best->cached_tokens);
  return out;
}

}  // namespace strata::router
