// Choosing a worker for one request: the router's cost (docs/router.md, issue 13).
//
// Contract: choose() is a pure function of its arguments (the random generator is used only
// when temperature > 0). It reads no clock, takes no lock and owns nothing; the router
// builds one WorkerCandidate per known worker under its own lock and calls it once per
// request. Deterministic: the same inputs (and the same generator state) give the same
// Decision.
//
// The unit of every term is one token of prefill work: the cost of a worker is roughly
// how much prefill-equivalent work and waiting the request meets there. Lower wins.
//
//   cost(w) = prefill(w) + load(w) - sticky(w) - floor(w)
//
//   prefill(w) = (prompt_tokens - credited_tokens(w)) * prefill_token
//   load(w)    = inflight_prefill_tokens(w) * inflight_prefill_token
//              + decode_requests(w) * decode_request
//   sticky(w)  = sticky_bonus                      if the request's session is bound to w
//   floor(w)   = scale(w) * (load_floor_bonus
//                            + (shared - min(credited_tokens(w), shared)) * prefill_token)
//   scale(w)   = min(1, 2 * max(0, mean - assigned(w)) / mean)   (0 when mean is 0)
//                                                  if the request is not sticky (below)
//
// Cached credit. The worker's leading cached run of the prompt has n = D + H + S blocks,
// each counted in its best tier (device, host, storage). Its tokens are
// cached_tokens = min(prompt_tokens, n * block_size); each is credited with the run's
// mean tier credit t = (device*D + host*H + storage*S) / n (device 1: nothing to do;
// host 0.75: a copy to the device remains; storage 0.25: a read remains), times how
// certain the block is to still be there when the request runs:
//   pinned blocks              1                           (certain to stay)
//   blocks only predicted      predicted                   (the router sent a request
//     by the router                                         there, no event confirmed it)
//   other confirmed blocks     1 - eviction_risk * min(1, load_fraction)
//                                                          (a full worker may evict them)
// credited_tokens = cached_tokens * t * (certainty summed over the n blocks) / n.
// Pinned and predicted counts carry no tier; they take the run's mean tier credit.
//
// Load-floor bonus (the graduated bonus of seeds/003, option Q2.B). assigned(w) is the
// number of live session bindings on w (SessionTable::sessions_on: bindings within their
// TTL, so the count decays as sessions end), mean is its mean over the eligible workers.
// It applies only when the request is not sticky: no candidate in the pool is its
// session's worker (a new session, a request without a session, an expired binding, or a
// session whose worker is saturated, ineligible or being migrated away from). A worker at
// or below half the mean gets the full bonus (a cold one, and one left with a session or
// two while the others have many); above that it falls linearly to nothing at the mean:
// one a session below a mean of 16 gets 1/8 of it. The same below a mean of one session:
// while fewer sessions than workers have started, every worker without one gets the full
// bonus. Until session 24 the mean counted as one there, so a cold worker got only twice
// the mean of the bonus (an eighth at the 4th of 64 sessions): the first 14 of 200
// sessions of an agentic trace went by cache onto the 3 workers holding their system
// prompts while 60 stood idle, and those stayed the busiest all run. With the bonus scaled by (mean
// - assigned) / mean instead (session 17), a worker with one session of a mean of three kept only
// two thirds of it, less than the boilerplate a warm worker had cached, and 3-7 of 64 workers ended
// an agentic trace with one session; with the full bonus up to half the mean, 0-2
// (docs/benchmarks.md).
//
// What the floor makes up for. `shared` is the prompt's tokens cached on two or more
// eligible workers (the second-longest cached run: boilerplate, a system prompt and tool
// schemas); a worker that lacks some of it pays that prefill once to join the others, and
// the floor makes up for it, then adds the bonus: an under-assigned worker is preferred by
// scale * load_floor_bonus over an assigned-at-the-mean one, whatever boilerplate each
// holds. A prefix cached on one worker only (a conversation) is not shared and keeps its
// full weight: the default bonus (8192 tokens) does not outweigh a genuine long prefix (tens
// of thousands of tokens), so cache hits that matter are kept. Except for a new session
// (RequestFeatures::new_session): it has no conversation yet, so whatever of its prompt is
// cached is other sessions' boilerplate, and `shared` is the longest cached run. History:
// - session 17: the bonus became at least `shared`; a 12K-token system prompt on every warm
//   worker outweighed the 8192-token bonus and kept cold workers cold;
// - session 23: the floor no longer stacked on the credit of a warm worker for the
//   boilerplate it held (max(bonus, shared) * scale - held): a warm worker a session below
//   the mean beat a worker at half the mean that lacked it;
// - session 24: with that form, when the boilerplate is as long as the bonus or longer, a
//   worker at half the mean holding it got no floor at all, and one lacking it only made
//   up for it: either way nothing beyond parity with a warm worker at the mean, so the
//   load decided, and a worker busy with its one session's prefill lost every new session
//   (1-2 of 64 ended an agentic trace with one session of a mean of 3.1). Now the bonus
//   comes on top of what is lacked. Also in session 24: `shared` for new sessions, after a
//   rare agent's 12K-token system prompt held by one worker drew 7-13 sessions there. The
//   cost of it: a conversation coming back after its binding expired
//   (--session-binding-ttl-s, 10 minutes idle) is scored as a new session, and may move to
//   an under-assigned worker and be computed again there.
//
// The pool. Workers that are not eligible (unhealthy, breaker open, draining) and
// prefill-role workers (prefill_only: they serve only a decode worker's prefill orders,
// pd_choice.h) are never chosen, and do not count in the load-floor mean. A worker whose
// load_fraction is above busy_threshold is saturated and left out, unless every eligible
// worker is saturated: then the pool is all eligible workers, Decision::all_saturated is
// set and the router queues the request (AdmissionQueue) instead of sending it; the
// decision still names the best worker.
//
// Choice. temperature == 0: the minimum cost. Equal costs go to the worker with fewer live
// session bindings, and among those to the first at or after position
// RequestFeatures::tie_break (mod the pool's size) in id order: deterministic, whatever the
// order of the candidates. The router passes its count of decisions, so that ties rotate
// over the workers. Ties are common: idle workers at the same floor cost exactly the same,
// whatever shared prefix they hold (above). Always breaking them toward the lowest id gave
// the lower half of 64 workers 3.5-3.7 sessions each over an agentic trace and the upper
// half 2.6-2.8, and left one or two workers with a single session (session 24,
// docs/benchmarks.md). The router's own in-flight accounting makes the next request of a
// burst see the chosen worker as busier. temperature > 0:
// worker w is drawn with probability proportional to exp(-(cost(w) - min cost) / temperature)
// (temperature in tokens: 1024 makes a worker 1024 tokens worse e times less likely).
//
// Reason (the x-strata-route header), the first that holds. A term "decided" when,
// without it, a worker that costs more than the chosen one would cost as little or less
// (workers tied with the chosen one do not count: the tie-break separated them):
//   only       one worker in the pool
//   random     temperature drew another worker than the minimum
//   sticky     the sticky bonus decided (the chosen worker is the session's)
//   load_floor the load-floor bonus decided
//   cache      the cached credit decided
//   load       otherwise (the load terms decided)
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <string_view>

#include "common/result.h"

namespace strata::router {

// Every field is a `strata route` option (--cost-NAME), validated by validate().
struct CostWeights {
  double device = 1.0;         // credit per cached device token, in [0, 1]
  double host = 0.75;          // credit per cached host token, in [0, device]
  double storage = 0.25;       // credit per cached storage token, in [0, host]
  double predicted = 0.5;      // certainty of a block only predicted by the router, [0, 1]
  double eviction_risk = 0.2;  // loss of an unpinned block's certainty at full load, [0, 1]
  double prefill_token = 1.0;  // cost per uncached prompt token (the unit), > 0
  // Per token of prefill already queued on the worker, >= 0. Below 1: a cached token also
  // saves the cluster work, and queued prefill often overlaps with decode (chunked).
  double inflight_prefill_token = 0.5;
  double decode_request = 32.0;      // per running decode stream on the worker, >= 0
  double sticky_bonus = 1024.0;      // for the worker the session is bound to, >= 0
  double load_floor_bonus = 8192.0;  // graduated bonus for under-assigned workers, >= 0; 0 = off
  double temperature = 0.0;          // 0: take the minimum; > 0: sample ~ exp(-cost / T)
  double busy_threshold = 0.9;       // load_fraction above it = saturated, in (0, 1]
};

// The defaults above, for 2-16 workers serving agentic multi-turn chat: `--policy default`
// and `precise` (index from KV events); `approximate` uses them too, with the candidates'
// cached runs from the router's predicted index only. `round-robin` and `least-loaded`
// are the router's own and do not call choose().
CostWeights default_weights();

Status validate(const CostWeights& weights);

// One worker as the router sees it for this request.
struct WorkerCandidate {
  uint32_t id = 0;
  bool eligible = true;       // healthy, circuit breaker allows, not draining
  bool prefill_only = false;  // role "prefill": never chosen, with or without --pd
  // The prompt's leading cached run on this worker, each block counted in its best tier.
  int64_t cached_device_blocks = 0;
  int64_t cached_host_blocks = 0;
  int64_t cached_storage_blocks = 0;
  int64_t pinned_blocks = 0;            // of the run, pinned (certain to stay)
  int64_t predicted_blocks = 0;         // of the run, only predicted by the router (no event yet)
  int32_t block_size = 16;              // tokens per block on this worker, >= 1
  int64_t inflight_prefill_tokens = 0;  // queued prefill (router's accounting, corrected)
  int64_t decode_requests = 0;          // running decode streams
  double load_fraction = 0.0;           // from the worker's reported load, 0..1 (may exceed 1)
  int64_t sessions_assigned = 0;        // live session bindings (SessionTable::sessions_on)
  bool sticky = false;                  // this request's session is bound here
  // The prompt's length on this worker when it differs from RequestFeatures::prompt_tokens:
  // the worker continues the exact tokens it recorded for the request's session or previous
  // response (request/turn_record.h); -1: the request's.
  int64_t prompt_tokens = -1;
};

// has_session and new_session are for the log; the cost itself asks only whether a worker
// of the pool is the session's (WorkerCandidate::sticky): the seed gates the floor bonus on
// stickiness, which covers new sessions, requests without one, and sessions moving away.
struct RequestFeatures {
  int64_t prompt_tokens = 0;  // >= 0
  bool has_session = false;   // the request names a session
  bool new_session = false;   // ... that has no binding yet
  // Where ties start in the pool's id order (the choice above); the router's decision count.
  uint64_t tie_break = 0;
};

enum class RouteReason : uint8_t { kOnly, kRandom, kSticky, kLoadFloor, kCache, kLoad };
// "only", "random", "sticky", "load_floor", "cache", "load".
std::string_view route_reason_name(RouteReason reason);

// The terms of the chosen worker's cost, for the debug log and the metrics.
struct CostTerms {
  double cost = 0.0;
  int64_t cached_tokens = 0;     // the leading cached run in tokens (what the index predicts)
  double credited_tokens = 0.0;  // cached tokens after tier and certainty credits
  double prefill_tokens = 0.0;   // prompt_tokens - credited_tokens
  double prefill = 0.0;          // prefill_tokens * prefill_token
  double load = 0.0;
  double sticky = 0.0;  // subtracted
  double floor = 0.0;   // subtracted
};

// One worker's terms (the formula above). `request_is_sticky`: some worker of the pool is
// the session's (then no floor bonus anywhere); `mean_assigned`: the mean of
// sessions_assigned over the eligible workers; `shared_tokens`: the prompt tokens cached on
// two or more eligible workers (shared_cached_tokens). choose() calls it; exposed for tests
// and for `GET /workers` to show every worker's terms.
CostTerms cost_terms(const RequestFeatures& request, const WorkerCandidate& worker,
                     const CostWeights& weights, bool request_is_sticky, double mean_assigned,
                     int64_t shared_tokens = 0);

// The prompt tokens cached on at least two of the eligible, non-prefill candidates: the
// second-longest leading cached run (each run is a prefix of the prompt), 0 with fewer
// than two. For a new session, the longest run (on one candidate or more): none of it can
// be the session's own.
int64_t shared_cached_tokens(const RequestFeatures& request,
                             std::span<const WorkerCandidate> candidates);

struct Decision {
  uint32_t worker = 0;
  RouteReason reason = RouteReason::kLoad;
  CostTerms terms;             // of the chosen worker
  bool all_saturated = false;  // every eligible worker is saturated: queue the request
  int32_t pool_size = 0;       // candidates that competed
  // The best other worker of the pool and its cost (the margin of the choice); equal to
  // `worker` and its cost when the pool has one worker.
  uint32_t runner_up = 0;
  double runner_up_cost = 0.0;
};

// nullopt: no candidate is eligible and not prefill_only (the router answers 503). `rng` is
// used only when weights.temperature > 0. Preconditions: validate(weights) succeeded;
// counts >= 0, pinned + predicted <= the run (checked).
std::optional<Decision> choose(const RequestFeatures& request,
                               std::span<const WorkerCandidate> candidates,
                               const CostWeights& weights, std::mt19937_64& rng);

}  // namespace strata::router
