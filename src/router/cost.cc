#include "router/cost.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "common/check.h"

namespace strata::router {

CostWeights default_weights() {
  return CostWeights{};
}

namespace {

bool finite_at_least(double v, double lo) {
  return std::isfinite(v) && v >= lo;
}

Status invalid(const std::string& what) {
  return make_error(ErrorCode::kInvalidArgument, "router cost: " + what);
}

}  // namespace

Status validate(const CostWeights& w) {
  if (!finite_at_least(w.device, 0.0) || w.device > 1.0) return invalid("device not in [0, 1]");
  if (!finite_at_least(w.host, 0.0) || w.host > w.device) {
    return invalid("host not in [0, device]");
  }
  if (!finite_at_least(w.storage, 0.0) || w.storage > w.host) {
    return invalid("storage not in [0, host]");
  }
  if (!finite_at_least(w.predicted, 0.0) || w.predicted > 1.0) {
    return invalid("predicted not in [0, 1]");
  }
  if (!finite_at_least(w.eviction_risk, 0.0) || w.eviction_risk > 1.0) {
    return invalid("eviction_risk not in [0, 1]");
  }
  if (!std::isfinite(w.prefill_token) || w.prefill_token <= 0.0) {
    return invalid("prefill_token must be > 0");
  }
  if (!finite_at_least(w.inflight_prefill_token, 0.0)) {
    return invalid("inflight_prefill_token must be >= 0");
  }
  if (!finite_at_least(w.decode_request, 0.0)) return invalid("decode_request must be >= 0");
  if (!finite_at_least(w.sticky_bonus, 0.0)) return invalid("sticky_bonus must be >= 0");
  if (!finite_at_least(w.load_floor_bonus, 0.0)) {
    return invalid("load_floor_bonus must be >= 0");
  }
  if (!finite_at_least(w.temperature, 0.0)) return invalid("temperature must be >= 0");
  if (!std::isfinite(w.busy_threshold) || w.busy_threshold <= 0.0 || w.busy_threshold > 1.0) {
    return invalid("busy_threshold not in (0, 1]");
  }
  return {};
}

std::string_view route_reason_name(RouteReason reason) {
  switch (reason) {
    case RouteReason::kOnly:
      return "only";
    case RouteReason::kRandom:
      return "random";
    case RouteReason::kSticky:
      return "sticky";
    case RouteReason::kLoadFloor:
      return "load_floor";
    case RouteReason::kCache:
      return "cache";
    case RouteReason::kLoad:
      return "load";
  }
  return "unknown";
}

namespace {

// cost_terms() itself, inlined into choose()'s loop over the pool: returned through memory
// from an out-of-line call, the terms' stores and reloads were most of that loop's time at
// 1,024 workers.
[[gnu::always_inline]] inline CostTerms terms_of(const RequestFeatures& request,
                                                 const WorkerCandidate& w,
                                                 const CostWeights& weights, bool request_is_sticky,
                                                 double mean_assigned, int64_t shared_tokens) {
  STRATA_CHECK(request.prompt_tokens >= 0);
  STRATA_CHECK(w.cached_device_blocks >= 0 && w.cached_host_blocks >= 0 &&
               w.cached_storage_blocks >= 0);
  STRATA_CHECK(w.pinned_blocks >= 0 && w.predicted_blocks >= 0);
  STRATA_CHECK(w.block_size >= 1);
  STRATA_CHECK(w.inflight_prefill_tokens >= 0 && w.decode_requests >= 0);
  const int64_t run = w.cached_device_blocks + w.cached_host_blocks + w.cached_storage_blocks;
  STRATA_CHECK_MSG(w.pinned_blocks + w.predicted_blocks <= run,
                   "worker " + std::to_string(w.id) + ": pinned + predicted exceed the run");

  // A worker that continues the request's exact recorded tokens reads a prompt of its own.
  const int64_t prompt_tokens = w.prompt_tokens >= 0 ? w.prompt_tokens : request.prompt_tokens;
  CostTerms t;
  if (run > 0) {
    t.cached_tokens = std::min(prompt_tokens, run * w.block_size);
    const double n = static_cast<double>(run);
    const double tier = (weights.device * static_cast<double>(w.cached_device_blocks) +
                         weights.host * static_cast<double>(w.cached_host_blocks) +
                         weights.storage * static_cast<double>(w.cached_storage_blocks)) /
                        n;
    const double pressure = std::clamp(w.load_fraction, 0.0, 1.0);
    const int64_t confirmed = run - w.pinned_blocks - w.predicted_blocks;
    const double certain =
        static_cast<double>(w.pinned_blocks) +
        weights.predicted * static_cast<double>(w.predicted_blocks) +
        (1.0 - weights.eviction_risk * pressure) * static_cast<double>(confirmed);
    t.credited_tokens = static_cast<double>(t.cached_tokens) * tier * certain / n;
  }
  t.prefill_tokens = static_cast<double>(prompt_tokens) - t.credited_tokens;
  t.prefill = t.prefill_tokens * weights.prefill_token;
  t.load = static_cast<double>(w.inflight_prefill_tokens) * weights.inflight_prefill_token +
           static_cast<double>(w.decode_requests) * weights.decode_request;
  if (w.sticky && request_is_sticky) t.sticky = weights.sticky_bonus;
  if (!request_is_sticky && weights.load_floor_bonus > 0.0) {
    const double deficit = std::max(0.0, mean_assigned - static_cast<double>(w.sessions_assigned));
    // Full at half the mean or below, nothing at the mean: the bonus, and the shared prefix
    // the worker lacks (cost.h).
    const double held = std::min(t.credited_tokens, static_cast<double>(shared_tokens));
    const double lacked = (static_cast<double>(shared_tokens) - held) * weights.prefill_token;
    const double scale = mean_assigned > 0.0 ? std::min(1.0, 2.0 * deficit / mean_assigned) : 0.0;
    t.floor = scale * (weights.load_floor_bonus + lacked);
  }
  t.cost = t.prefill + t.load - t.sticky - t.floor;
  return t;
}

}  // namespace

CostTerms cost_terms(const RequestFeatures& request, const WorkerCandidate& w,
                     const CostWeights& weights, bool request_is_sticky, double mean_assigned,
                     int64_t shared_tokens) {
  return terms_of(request, w, weights, request_is_sticky, mean_assigned, shared_tokens);
}

int64_t shared_cached_tokens(const RequestFeatures& request,
                             std::span<const WorkerCandidate> candidates) {
  int64_t longest = 0, second = 0;
  for (const WorkerCandidate& c : candidates) {
    if (!c.eligible || c.prefill_only) continue;
    const int64_t prompt = c.prompt_tokens >= 0 ? c.prompt_tokens : request.prompt_tokens;
    const int64_t run = c.cached_device_blocks + c.cached_host_blocks + c.cached_storage_blocks;
    const int64_t tokens = std::min(prompt, run * c.block_size);
    if (tokens > longest) {
      second = longest;
      longest = tokens;
    } else if (tokens > second) {
      second = tokens;
    }
  }
  return request.new_session ? longest : second;
}

namespace {

// The pool as choose() scores it: one entry per member, in id order, in arrays of what the
// choice and its reason read (a whole CostTerms per worker, stored and copied, was most of
// choose()'s time at 1,024 workers). The chosen worker's terms are computed once more whole.
struct Pool {
  std::vector<const WorkerCandidate*> worker;
  std::vector<double> cost;
  std::vector<double> floor;   // the floor term (subtracted)
  std::vector<double> credit;  // the cached credit: credited_tokens * prefill_token
  std::vector<double> sticky;  // the sticky term (subtracted)
  size_t size() const { return worker.size(); }
};

// The index of the lowest cost in `pool` (sorted by id). Equal costs go to fewer live
// sessions, then to the first at or after position `start` in id order (cost.h, Choice).
size_t argmin(const Pool& pool, uint64_t start) {
  const size_t n = pool.size();
  const auto first = static_cast<size_t>(start % n);
  size_t best = first;
  double best_cost = pool.cost[best];
  for (size_t k = 1; k < n; ++k) {
    const size_t i = first + k < n ? first + k : first + k - n;
    const double c = pool.cost[i];
    if (c < best_cost || (c == best_cost && pool.worker[i]->sessions_assigned <
                                                pool.worker[best]->sessions_assigned)) {
      best = i;
      best_cost = c;
    }
  }
  return best;
}

// A uniform double in [0, 1) from 53 random bits: exact across standard libraries (the
// distributions of <random> are not specified bit for bit).
double uniform01(std::mt19937_64& rng) {
  return static_cast<double>(rng() >> 11) * 0x1.0p-53;
}

size_t sample(const Pool& pool, size_t best, double temperature, std::mt19937_64& rng) {
  const double min_cost = pool.cost[best];
  std::vector<double> weight(pool.size());
  double total = 0.0;
  for (size_t i = 0; i < pool.size(); ++i) {
    weight[i] = std::exp(-(pool.cost[i] - min_cost) / temperature);
    total += weight[i];
  }
  double u = uniform01(rng) * total;
  for (size_t i = 0; i < pool.size(); ++i) {
    if (u < weight[i]) return i;
    u -= weight[i];
  }
  return pool.size() - 1;  // rounding left u at the very end
}

}  // namespace

std::optional<Decision> choose(const RequestFeatures& request,
                               std::span<const WorkerCandidate> candidates,
                               const CostWeights& weights, std::mt19937_64& rng) {
  std::vector<const WorkerCandidate*> eligible;
  eligible.reserve(candidates.size());
  int64_t assigned_sum = 0;  // exact, then divided once: the same mean as a double sum
  for (const WorkerCandidate& c : candidates) {
    if (!c.eligible || c.prefill_only) continue;
    eligible.push_back(&c);
    assigned_sum += c.sessions_assigned;
  }
  if (eligible.empty()) return std::nullopt;
  // The router builds its candidates in id order: a sort is then only a check (1,024
  // candidates: ~10,000 comparisons through two pointers each).
  if (!std::ranges::is_sorted(eligible, {}, &WorkerCandidate::id)) {
    std::ranges::sort(eligible, {}, &WorkerCandidate::id);
  }
  const double mean_assigned =
      static_cast<double>(assigned_sum) / static_cast<double>(eligible.size());

  Decision d;
  Pool pool;
  pool.worker.reserve(eligible.size());
  for (const WorkerCandidate* c : eligible) {
    if (c->load_fraction <= weights.busy_threshold) pool.worker.push_back(c);
  }
  if (pool.worker.empty()) {
    pool.worker = std::move(eligible);
    d.all_saturated = true;
  }
  const bool request_is_sticky =
      std::ranges::any_of(pool.worker, [](const WorkerCandidate* c) { return c->sticky; });
  // Only the floor reads it: not computed when no floor applies.
  const int64_t shared = request_is_sticky || weights.load_floor_bonus <= 0.0
                             ? 0
                             : shared_cached_tokens(request, candidates);

  const size_t n = pool.size();
  pool.cost.resize(n);
  pool.floor.resize(n);
  pool.credit.resize(n);
  pool.sticky.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const CostTerms t =
        terms_of(request, *pool.worker[i], weights, request_is_sticky, mean_assigned, shared);
    pool.cost[i] = t.cost;
    pool.floor[i] = t.floor;
    pool.credit[i] = t.credited_tokens * weights.prefill_token;
    pool.sticky[i] = t.sticky;
  }

  const size_t best = argmin(pool, request.tie_break);
  size_t chosen = best;
  if (weights.temperature > 0.0 && n > 1) chosen = sample(pool, best, weights.temperature, rng);

  // A term decided the choice when, without it, a worker that costs more than the chosen
  // one now would cost as little or less (workers tied with the chosen one, the tie broken
  // by sessions and position, do not count: the term did not separate them).
  const double chosen_cost = pool.cost[chosen];
  auto decided_by = [&](const std::vector<double>& term) {
    const double without = chosen_cost + term[chosen];
    for (size_t i = 0; i < n; ++i) {
      if (pool.cost[i] > chosen_cost && pool.cost[i] + term[i] <= without) return true;
    }
    return false;
  };
  if (n == 1) {
    d.reason = RouteReason::kOnly;
  } else if (chosen != best) {
    d.reason = RouteReason::kRandom;
  } else if (pool.sticky[chosen] > 0.0 && decided_by(pool.sticky)) {
    d.reason = RouteReason::kSticky;
  } else if (decided_by(pool.floor)) {
    d.reason = RouteReason::kLoadFloor;
  } else if (decided_by(pool.credit)) {
    d.reason = RouteReason::kCache;
  } else {
    d.reason = RouteReason::kLoad;
  }

  const WorkerCandidate& w = *pool.worker[chosen];
  d.worker = w.id;
  d.terms = cost_terms(request, w, weights, request_is_sticky, mean_assigned, shared);
  d.pool_size = static_cast<int32_t>(n);
  d.runner_up = d.worker;
  d.runner_up_cost = d.terms.cost;
  bool have_other = false;
  for (size_t i = 0; i < n; ++i) {
    if (i == chosen) continue;
    if (!have_other || pool.cost[i] < d.runner_up_cost) {
      d.runner_up = pool.worker[i]->id;
      d.runner_up_cost = pool.cost[i];
      have_other = true;
    }
  }
  return d;
}

}  // namespace strata::router
