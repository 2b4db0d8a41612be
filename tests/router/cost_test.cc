// The router's cost (router/cost.h): the seed's cold-worker case, stickiness, tiers and
// certainty, temperature, saturation, and the reason of each decision.
#include "router/cost.h"

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <random>
#include <vector>

namespace strata::router {
namespace {

constexpr int32_t kBlock = 16;

WorkerCandidate worker(uint32_t id) {
  WorkerCandidate w;
  w.id = id;
  w.block_size = kBlock;
  w.load_fraction = 0.3;
  return w;
}

RequestFeatures new_session(int64_t prompt_tokens) {
  return RequestFeatures{prompt_tokens, true, true};
}

Decision choose_or_die(const RequestFeatures& r, const std::vector<WorkerCandidate>& ws,
                       const CostWeights& weights = default_weights(), uint64_t seed = 1) {
  std::mt19937_64 rng(seed);
  std::optional<Decision> d = choose(r, ws, weights, rng);
  EXPECT_TRUE(d.has_value());
  return d.value_or(Decision{});
}

TEST(CostTest, DefaultsAreValidAndBadWeightsAreRefused) {
  EXPECT_TRUE(validate(default_weights()).has_value());
  CostWeights w = default_weights();
  w.host = 1.5;  // above device
  EXPECT_FALSE(validate(w).has_value());
  w = default_weights();
  w.busy_threshold = 0.0;
  EXPECT_FALSE(validate(w).has_value());
  w = default_weights();
  w.temperature = -1.0;
  EXPECT_FALSE(validate(w).has_value());
  w = default_weights();
  w.prefill_token = NAN;
  EXPECT_FALSE(validate(w).has_value());
}

// seeds/003 Q2: three workers hold the boilerplate system prompt every session shares, a
// fourth is new and cold. New sessions sharing only the boilerplate go to the cold worker
// until it has caught up; then they spread evenly.
TEST(CostTest, NewSessionsSharingOnlyBoilerplateFillTheColdWorkerUntilItCatchesUp) {
  constexpr int64_t kBoilerplateBlocks = 128;  // 2048 tokens of system prompt and tools
  std::vector<WorkerCandidate> ws;
  for (uint32_t id = 0; id < 4; ++id) {
    WorkerCandidate w = worker(id);
    if (id < 3) {
      w.cached_device_blocks = kBoilerplateBlocks;
      w.sessions_assigned = 4;
      w.decode_requests = 4;
    }
    ws.push_back(w);
  }
  const RequestFeatures request = new_session(kBoilerplateBlocks * kBlock + 300);

  // Without the bonus the boilerplate's credit keeps the new worker cold (the seed's bug).
  CostWeights off = default_weights();
  off.load_floor_bonus = 0.0;
  const Decision cold_stays_cold = choose_or_die(request, ws, off);
  EXPECT_NE(cold_stays_cold.worker, 3u);
  EXPECT_EQ(cold_stays_cold.reason, RouteReason::kCache);

  std::array<int, 4> sent{};
  for (int i = 0; i < 16; ++i) {
    const Decision d = choose_or_die(request, ws);
    if (i < 4) {
      EXPECT_EQ(d.worker, 3u) << "session " << i;
    }
    if (i == 0) {
      // Later ones may be decided by load alone: the worker holds the boilerplate by then.
      EXPECT_EQ(d.reason, RouteReason::kLoadFloor);
      // The bonus, and the boilerplate it lacks.
      EXPECT_DOUBLE_EQ(d.terms.floor,
                       default_weights().load_floor_bonus + kBoilerplateBlocks * kBlock);
    }
    ++sent[d.worker];
    WorkerCandidate& w = ws[d.worker];
    ++w.sessions_assigned;
    ++w.decode_requests;
    w.cached_device_blocks = kBoilerplateBlocks;  // it now holds the boilerplate too
  }
  EXPECT_EQ(sent[3], 7);  // 4 to catch up, then its share of the 12 others
  int64_t lo = ws[0].sessions_assigned;
  int64_t hi = lo;
  for (const WorkerCandidate& w : ws) {
    lo = std::min(lo, w.sessions_assigned);
    hi = std::max(hi, w.sessions_assigned);
  }
  EXPECT_LE(hi - lo, 1);
}

// ...while a request with a genuine long prefix on a warm worker still goes there.
TEST(CostTest, AGenuineLongPrefixBeatsTheLoadFloorBonus) {
  std::vector<WorkerCandidate> ws;
  for (uint32_t id = 0; id < 4; ++id) {
    WorkerCandidate w = worker(id);
    if (id < 3) {
      w.cached_device_blocks = 128;
      w.sessions_assigned = 4;
      w.decode_requests = 4;
    }
    ws.push_back(w);
  }
  ws[1].cached_device_blocks = 1500;                    // 24,000 tokens of this conversation
  const RequestFeatures request{24'500, false, false};  // no session: not sticky
  const Decision d = choose_or_die(request, ws);
  EXPECT_EQ(d.worker, 1u);
  EXPECT_EQ(d.reason, RouteReason::kCache);
  EXPECT_EQ(d.terms.cached_tokens, 24'000);
  EXPECT_EQ(d.runner_up, 3u);  // the cold worker, with its full floor bonus
  EXPECT_GT(d.runner_up_cost, d.terms.cost);
}

// Boilerplate longer than the bonus (an agent's 12K-token system prompt and tools, held by
// every warm worker) does not keep a cold worker cold: the bonus is at least the tokens
// cached on two or more workers...
TEST(CostTest, ALongSharedBoilerplateStillSendsANewSessionToTheColdWorker) {
  std::vector<WorkerCandidate> ws;
  for (uint32_t id = 0; id < 4; ++id) {
    WorkerCandidate w = worker(id);
    if (id < 3) {
      w.cached_device_blocks = 750;  // 12,000 tokens of boilerplate
      w.sessions_assigned = 4;
      w.decode_requests = 4;
    }
    ws.push_back(w);
  }
  const RequestFeatures request = new_session(12'300);
  EXPECT_EQ(shared_cached_tokens(request, ws), 12'000);
  const Decision d = choose_or_die(request, ws);
  EXPECT_EQ(d.worker, 3u);
  EXPECT_EQ(d.reason, RouteReason::kLoadFloor);
  EXPECT_DOUBLE_EQ(d.terms.floor, 12'000.0 + default_weights().load_floor_bonus);
  // With the bonus alone (8192 tokens), the boilerplate would have won.
  const CostTerms cold = cost_terms(request, ws[3], default_weights(), false, 3.0);
  const CostTerms warm = cost_terms(request, ws[0], default_weights(), false, 3.0);
  EXPECT_GT(cold.cost, warm.cost);
}

// ...and, for a request that may continue a conversation, only what two workers share
// counts: one worker's long run may be its conversation.
TEST(CostTest, OnlyARunCachedOnTwoWorkersIsShared) {
  std::vector<WorkerCandidate> ws = {worker(0), worker(1), worker(2), worker(3)};
  const RequestFeatures request{20'000, false, false};  // no session
  EXPECT_EQ(shared_cached_tokens(request, ws), 0);
  ws[0].cached_device_blocks = 1000;  // 16,000 tokens
  EXPECT_EQ(shared_cached_tokens(request, ws), 0);
  ws[2].cached_host_blocks = 300;  // 4,800 tokens, on the host
  ws[2].cached_device_blocks = 100;
  EXPECT_EQ(shared_cached_tokens(request, ws), 6'400);
  ws[1].cached_storage_blocks = 2000;  // beyond the prompt: counts as the prompt
  EXPECT_EQ(shared_cached_tokens(request, ws), 16'000);
  ws[0].eligible = false;  // an ineligible or prefill-only worker does not count
  ws[1].prefill_only = true;
  EXPECT_EQ(shared_cached_tokens(request, ws), 0);
}

// A new session has no conversation yet: all of its cached prompt is other sessions'
// boilerplate, even on one worker only. A rare agent's 12K-token system prompt, held by the
// one worker that served its first session, does not draw every later session using it
// there once that worker is past the mean: an under-assigned worker costs the same before
// load, and wins on it.
TEST(CostTest, ANewSessionCountsWhatOneWorkerHoldsAsShared) {
  std::vector<WorkerCandidate> ws = {worker(0), worker(1), worker(2), worker(3)};
  ws[0].cached_device_blocks = 750;  // 12,000 tokens of a rare system prompt
  ws[0].sessions_assigned = 6;
  ws[1].sessions_assigned = 1;  // at or below half the mean (2.25): the full floor
  ws[2].sessions_assigned = 1;
  ws[3].sessions_assigned = 1;
  ws[0].decode_requests = 1;
  RequestFeatures request = new_session(12'500);
  EXPECT_EQ(shared_cached_tokens(request, ws), 12'000);
  Decision d = choose_or_die(request, ws);
  EXPECT_NE(d.worker, 0u);
  EXPECT_EQ(d.reason, RouteReason::kLoadFloor);
  // The same prompt without a session (it may continue a conversation on worker 0) stays.
  request = RequestFeatures{12'500, false, false};
  EXPECT_EQ(shared_cached_tokens(request, ws), 0);
  d = choose_or_die(request, ws);
  EXPECT_EQ(d.worker, 0u);
  EXPECT_EQ(d.reason, RouteReason::kCache);
}

TEST(CostTest, TheFloorBonusIsGraduated) {
  const CostWeights weights = default_weights();
  const RequestFeatures request = new_session(1000);
  WorkerCandidate w = worker(0);
  w.sessions_assigned = 0;
  EXPECT_DOUBLE_EQ(cost_terms(request, w, weights, false, 16.0).floor, weights.load_floor_bonus);
  // Full at half the mean or below, then falling linearly to nothing at the mean.
  w.sessions_assigned = 8;
  EXPECT_DOUBLE_EQ(cost_terms(request, w, weights, false, 16.0).floor, weights.load_floor_bonus);
  w.sessions_assigned = 12;
  EXPECT_DOUBLE_EQ(cost_terms(request, w, weights, false, 16.0).floor,
                   weights.load_floor_bonus / 2.0);
  w.sessions_assigned = 15;
  EXPECT_DOUBLE_EQ(cost_terms(request, w, weights, false, 16.0).floor,
                   weights.load_floor_bonus / 8.0);
  w.sessions_assigned = 16;
  EXPECT_DOUBLE_EQ(cost_terms(request, w, weights, false, 16.0).floor, 0.0);
  w.sessions_assigned = 20;
  EXPECT_DOUBLE_EQ(cost_terms(request, w, weights, false, 16.0).floor, 0.0);
  // Below a mean of one session the same rule: a worker without a session while a few of
  // many workers have one is at or below half the mean, and gets the full bonus.
  w.sessions_assigned = 0;
  EXPECT_DOUBLE_EQ(cost_terms(request, w, weights, false, 0.06).floor, weights.load_floor_bonus);
  EXPECT_DOUBLE_EQ(cost_terms(request, w, weights, false, 0.5).floor, weights.load_floor_bonus);
  w.sessions_assigned = 1;
  EXPECT_DOUBLE_EQ(cost_terms(request, w, weights, false, 0.75).floor, 0.0);
  // No session anywhere: no floor.
  w.sessions_assigned = 0;
  EXPECT_DOUBLE_EQ(cost_terms(request, w, weights, false, 0.0).floor, 0.0);
  // Never for a sticky request.
  EXPECT_DOUBLE_EQ(cost_terms(request, w, weights, true, 16.0).floor, 0.0);
}

// The floor makes up for the shared prefix a worker lacks, then adds the bonus: a worker at
// half the mean is preferred by the whole bonus over a warm one at the mean, whatever each
// holds, and by its scaled share over a warm one a session below the mean. So a worker
// left behind wins a new session even while busier than a warm one (its one session
// prefilling): parity alone let the load decide, and it lost them all (session 24).
TEST(CostTest, TheFloorMakesUpForTheSharedPrefixLackedAndAddsTheBonus) {
  const CostWeights weights = default_weights();
  const RequestFeatures request = new_session(16'000);  // 12,000 tokens of it shared
  std::vector<WorkerCandidate> ws = {worker(0), worker(1), worker(2)};
  for (WorkerCandidate& w : ws) w.load_fraction = 0.0;  // cached blocks certain to stay
  ws[0].cached_device_blocks = 750;                     // 12,000 tokens: the system prompt
  ws[0].sessions_assigned = 3;                          // a session below the mean of 4
  ws[0].decode_requests = 3;
  ws[1].cached_device_blocks = 750;
  ws[1].sessions_assigned = 7;
  ws[1].decode_requests = 7;
  ws[2].sessions_assigned = 2;            // half the mean: the full floor, no system prompt
  ws[2].inflight_prefill_tokens = 6'000;  // busy: its one session prefilling (3,000 of load)
  const double mean = 4.0;
  const int64_t shared = shared_cached_tokens(request, ws);
  ASSERT_EQ(shared, 12'000);
  const CostTerms warm = cost_terms(request, ws[0], weights, false, mean, shared);
  const CostTerms at_mean = cost_terms(request, ws[1], weights, false, mean, shared);
  const CostTerms behind = cost_terms(request, ws[2], weights, false, mean, shared);
  EXPECT_DOUBLE_EQ(warm.floor, weights.load_floor_bonus / 2.0);  // it lacks nothing
  EXPECT_DOUBLE_EQ(at_mean.floor, 0.0);
  EXPECT_DOUBLE_EQ(behind.floor, 12'000.0 + weights.load_floor_bonus);
  // Before load: the one behind is ahead of the warm one by half the bonus.
  EXPECT_DOUBLE_EQ((warm.prefill - warm.floor) - (behind.prefill - behind.floor),
                   weights.load_floor_bonus / 2.0);
  const Decision d = choose_or_die(request, ws);
  EXPECT_EQ(d.worker, 2u);
  EXPECT_EQ(d.reason, RouteReason::kLoadFloor);
  // A worker holding part of the shared prefix gets the bonus and the rest of it.
  ws[2].cached_device_blocks = 250;  // 4,000 of the 12,000
  EXPECT_DOUBLE_EQ(cost_terms(request, ws[2], weights, false, mean, shared).floor,
                   8'000.0 + weights.load_floor_bonus);
}

TEST(CostTest, StickyWinsOverASmallCacheAdvantageElsewhere) {
  std::vector<WorkerCandidate> ws = {worker(0), worker(1), worker(2)};
  ws[0].cached_device_blocks = 64;  // the session's prefix, 1024 tokens
  ws[0].sticky = true;
  ws[0].sessions_assigned = 3;
  ws[1].cached_device_blocks = 80;  // a little more of it elsewhere (1280 tokens)
  ws[1].sessions_assigned = 3;
  ws[2].sessions_assigned = 0;  // cold: would get a floor bonus if the request were not sticky
  const RequestFeatures request{1500, true, false};
  const Decision d = choose_or_die(request, ws);
  EXPECT_EQ(d.worker, 0u);
  EXPECT_EQ(d.reason, RouteReason::kSticky);
  EXPECT_DOUBLE_EQ(d.terms.sticky, default_weights().sticky_bonus);
  EXPECT_DOUBLE_EQ(d.terms.floor, 0.0);
}

TEST(CostTest, AStickyWorkerThatIsSaturatedOrIneligibleLosesTheSession) {
  std::vector<WorkerCandidate> ws = {worker(0), worker(1), worker(2)};
  ws[0].cached_device_blocks = 64;
  ws[0].sticky = true;
  ws[0].sessions_assigned = 3;
  ws[1].cached_device_blocks = 80;
  ws[1].sessions_assigned = 3;
  ws[1].decode_requests = 1;  // so that without its cache worker 2 would win
  ws[2].sessions_assigned = 3;
  const RequestFeatures request{1500, true, false};

  ws[0].load_fraction = 0.95;  // above the busy threshold
  Decision d = choose_or_die(request, ws);
  EXPECT_EQ(d.worker, 1u);
  EXPECT_EQ(d.reason, RouteReason::kCache);
  EXPECT_DOUBLE_EQ(d.terms.sticky, 0.0);
  EXPECT_FALSE(d.all_saturated);

  ws[0].load_fraction = 0.3;
  ws[0].eligible = false;  // breaker open or draining
  d = choose_or_die(request, ws);
  EXPECT_EQ(d.worker, 1u);

  // With its worker gone the request is not sticky: the floor bonus is back on.
  ws[2].sessions_assigned = 0;
  d = choose_or_die(request, ws);
  EXPECT_EQ(d.worker, 2u);
  EXPECT_EQ(d.reason, RouteReason::kLoadFloor);
}

TEST(CostTest, TierCreditsOrderDeviceHostStorage) {
  const CostWeights weights = default_weights();
  const RequestFeatures request{2000, false, false};
  std::vector<WorkerCandidate> ws = {worker(0), worker(1), worker(2), worker(3)};
  ws[0].cached_storage_blocks = 100;
  ws[1].cached_host_blocks = 100;
  ws[2].cached_device_blocks = 100;
  // worker 3 holds nothing
  std::array<double, 4> credit{};
  for (size_t i = 0; i < ws.size(); ++i) {
    credit[i] = cost_terms(request, ws[i], weights, false, 0.0).credited_tokens;
  }
  EXPECT_GT(credit[2], credit[1]);
  EXPECT_GT(credit[1], credit[0]);
  EXPECT_GT(credit[0], credit[3]);
  EXPECT_DOUBLE_EQ(credit[1] / credit[2], weights.host / weights.device);
  EXPECT_DOUBLE_EQ(credit[0] / credit[2], weights.storage / weights.device);

  EXPECT_EQ(choose_or_die(request, ws).worker, 2u);
  ws[2].eligible = false;
  EXPECT_EQ(choose_or_die(request, ws).worker, 1u);
  ws[1].eligible = false;
  EXPECT_EQ(choose_or_die(request, ws).worker, 0u);
  EXPECT_EQ(choose_or_die(request, ws).reason, RouteReason::kCache);
}

TEST(CostTest, CreditMixesTiersAndIsCappedByThePrompt) {
  const CostWeights weights = default_weights();
  WorkerCandidate w = worker(0);
  w.load_fraction = 0.0;  // no eviction risk
  w.cached_device_blocks = 10;
  w.cached_host_blocks = 10;
  // 320 tokens cached, 20 blocks of mean credit (1 + 0.75) / 2.
  CostTerms t = cost_terms(RequestFeatures{1000, false, false}, w, weights, false, 0.0);
  EXPECT_EQ(t.cached_tokens, 320);
  EXPECT_DOUBLE_EQ(t.credited_tokens, 320 * 0.875);
  EXPECT_DOUBLE_EQ(t.prefill_tokens, 1000 - 320 * 0.875);
  // The whole prompt cached (its last block full): the credit never exceeds the prompt.
  t = cost_terms(RequestFeatures{100, false, false}, w, weights, false, 0.0);
  EXPECT_EQ(t.cached_tokens, 100);
  EXPECT_GE(t.prefill_tokens, 0.0);
}

// A worker that continues a session's exact recorded tokens reads a longer prompt than the
// rendered one (turn_records.h): its own length caps its cached run and sets its prefill.
TEST(CostTest, AWorkersOwnPromptLengthIsItsReadingOfTheRequest) {
  const CostWeights weights = default_weights();
  WorkerCandidate exact = worker(0);
  exact.load_fraction = 0.0;
  exact.cached_device_blocks = 15;  // 240 tokens of its 250-token continuation
  exact.prompt_tokens = 250;
  const RequestFeatures rendered{230, true, false};
  CostTerms t = cost_terms(rendered, exact, weights, false, 0.0);
  EXPECT_EQ(t.cached_tokens, 240);
  EXPECT_DOUBLE_EQ(t.prefill_tokens, 250 - 240);
  // Without its own length the run would be capped by the rendered prompt.
  exact.prompt_tokens = -1;
  t = cost_terms(rendered, exact, weights, false, 0.0);
  EXPECT_EQ(t.cached_tokens, 230);
}

TEST(CostTest, PinnedBlocksAreCertainAndPredictedOnesCountLess) {
  const CostWeights weights = default_weights();
  const RequestFeatures request{4000, false, false};
  WorkerCandidate w = worker(0);
  w.load_fraction = 1.0;  // a full worker: unpinned blocks may be evicted
  w.cached_device_blocks = 100;
  const double confirmed = cost_terms(request, w, weights, false, 0.0).credited_tokens;
  EXPECT_DOUBLE_EQ(confirmed, 1600 * (1.0 - weights.eviction_risk));
  w.pinned_blocks = 100;
  const double pinned = cost_terms(request, w, weights, false, 0.0).credited_tokens;
  EXPECT_DOUBLE_EQ(pinned, 1600.0);
  w.pinned_blocks = 0;
  w.predicted_blocks = 100;
  const double predicted = cost_terms(request, w, weights, false, 0.0).credited_tokens;
  EXPECT_DOUBLE_EQ(predicted, 1600 * weights.predicted);
  EXPECT_GT(pinned, confirmed);
  EXPECT_GT(confirmed, predicted);
  // An idle worker is not expected to evict: confirmed blocks get full credit there.
  w.predicted_blocks = 0;
  w.load_fraction = 0.0;
  EXPECT_DOUBLE_EQ(cost_terms(request, w, weights, false, 0.0).credited_tokens, 1600.0);
}

TEST(CostTest, LoadDecidesWithoutCacheAndTiesGoToTheLowestId) {
  std::vector<WorkerCandidate> ws = {worker(2), worker(0), worker(1)};  // any order
  Decision d = choose_or_die(RequestFeatures{500, false, false}, ws);
  EXPECT_EQ(d.worker, 0u);
  EXPECT_EQ(d.reason, RouteReason::kLoad);
  ws[1].inflight_prefill_tokens = 4000;  // worker 0 now has queued prefill
  d = choose_or_die(RequestFeatures{500, false, false}, ws);
  EXPECT_EQ(d.worker, 1u);
  EXPECT_EQ(d.reason, RouteReason::kLoad);
  ws[2].decode_requests = 1;  // worker 1 one decode stream
  d = choose_or_die(RequestFeatures{500, false, false}, ws);
  EXPECT_EQ(d.worker, 2u);
  EXPECT_DOUBLE_EQ(d.runner_up_cost - d.terms.cost, default_weights().decode_request);
}

TEST(CostTest, SaturatedWorkersAreLeftOutUnlessAllAre) {
  std::vector<WorkerCandidate> ws = {worker(0), worker(1), worker(2)};
  ws[0].cached_device_blocks = 100;  // the best cache, but saturated
  ws[0].load_fraction = 0.95;
  ws[1].load_fraction = 0.5;
  ws[2].load_fraction = 0.2;
  const RequestFeatures request{2000, false, false};
  Decision d = choose_or_die(request, ws);
  EXPECT_NE(d.worker, 0u);
  EXPECT_FALSE(d.all_saturated);
  EXPECT_EQ(d.pool_size, 2);

  ws[1].load_fraction = 1.2;
  ws[2].load_fraction = 0.91;
  d = choose_or_die(request, ws);
  EXPECT_TRUE(d.all_saturated);
  EXPECT_EQ(d.worker, 0u);  // the best of them: where the queued request will go
  EXPECT_EQ(d.pool_size, 3);

  ws[0].eligible = false;  // an ineligible worker is never chosen, saturated or not
  d = choose_or_die(request, ws);
  EXPECT_TRUE(d.all_saturated);
  EXPECT_NE(d.worker, 0u);
}

TEST(CostTest, OneWorkerOnlyAndNone) {
  std::vector<WorkerCandidate> ws = {worker(7), worker(8)};
  ws[1].eligible = false;
  Decision d = choose_or_die(RequestFeatures{100, false, false}, ws);
  EXPECT_EQ(d.worker, 7u);
  EXPECT_EQ(d.reason, RouteReason::kOnly);
  EXPECT_EQ(d.runner_up, 7u);
  EXPECT_EQ(route_reason_name(d.reason), "only");

  ws[0].eligible = false;
  std::mt19937_64 rng(1);
  EXPECT_FALSE(choose(RequestFeatures{100, false, false}, ws, default_weights(), rng));
  EXPECT_FALSE(choose(RequestFeatures{100, false, false}, {}, default_weights(), rng));
}

TEST(CostTest, TemperatureSamplesByExpOfMinusCostOverT) {
  CostWeights weights = default_weights();
  weights.temperature = 1000.0;
  std::vector<WorkerCandidate> ws = {worker(0), worker(1), worker(2)};
  ws[1].inflight_prefill_tokens = 2000;  // +1000 tokens of cost
  ws[2].inflight_prefill_tokens = 4000;  // +2000
  const RequestFeatures request{100, false, false};
  std::mt19937_64 rng(42);
  constexpr int kDraws = 20'000;
  std::array<int, 3> n{};
  int random_reasons = 0;
  for (int i = 0; i < kDraws; ++i) {
    const std::optional<Decision> d = choose(request, ws, weights, rng);
    ASSERT_TRUE(d.has_value());
    ++n[d->worker];
    if (d->reason == RouteReason::kRandom) ++random_reasons;
    EXPECT_EQ(d->reason == RouteReason::kRandom, d->worker != 0u);
  }
  const double z = 1.0 + std::exp(-1.0) + std::exp(-2.0);
  EXPECT_NEAR(n[0] / double(kDraws), 1.0 / z, 0.015);
  EXPECT_NEAR(n[1] / double(kDraws), std::exp(-1.0) / z, 0.015);
  EXPECT_NEAR(n[2] / double(kDraws), std::exp(-2.0) / z, 0.015);
  EXPECT_EQ(random_reasons, n[1] + n[2]);

  // Seeded: the same generator state gives the same draws.
  std::mt19937_64 a(7);
  std::mt19937_64 b(7);
  for (int i = 0; i < 100; ++i) {
    EXPECT_EQ(choose(request, ws, weights, a)->worker, choose(request, ws, weights, b)->worker);
  }
}

// The first sessions of a cluster spread instead of following a cached system prompt:
// while fewer sessions than workers have started, a worker without one has the full floor,
// which outweighs a prompt of 6,144 tokens cached on one worker only (not shared yet).
TEST(CostTest, TheFirstSessionsSpreadInsteadOfFollowingACachedSystemPrompt) {
  constexpr int kWorkers = 16;
  constexpr int64_t kTemplateBlocks = 384;  // 6,144 tokens
  std::vector<WorkerCandidate> ws;
  for (uint32_t id = 0; id < kWorkers; ++id) ws.push_back(worker(id));
  std::vector<int> sessions_on(kWorkers, 0);
  for (int i = 0; i < kWorkers; ++i) {
    RequestFeatures request = new_session(kTemplateBlocks * kBlock + 512);
    request.tie_break = static_cast<uint64_t>(i);
    const Decision d = choose_or_die(request, ws);
    ++sessions_on[d.worker];
    ++ws[d.worker].sessions_assigned;
    ws[d.worker].cached_device_blocks = kTemplateBlocks;  // it computed the system prompt
  }
  EXPECT_EQ(sessions_on, std::vector<int>(kWorkers, 1));
}

// Equal costs go to fewer live sessions, then to the first worker at or after tie_break in
// id order, whatever the order of the candidates: ties rotate over the workers instead of
// always going to the lowest id.
TEST(CostTest, TiesGoToFewerSessionsThenRotateOverTheWorkers) {
  CostWeights weights = default_weights();
  weights.load_floor_bonus = 0;  // sessions change no cost: every worker costs the same
  std::vector<WorkerCandidate> ws = {worker(12), worker(10), worker(13), worker(11)};
  RequestFeatures request{100, true, true};
  std::array<int, 4> chosen{};
  for (uint64_t t = 0; t < 8; ++t) {
    request.tie_break = t;
    const Decision d = choose_or_die(request, ws, weights);
    EXPECT_EQ(d.worker, 10 + t % 4) << "tie_break " << t;
    EXPECT_EQ(d.reason, RouteReason::kLoad);
    ++chosen[d.worker - 10];
  }
  EXPECT_EQ(chosen, (std::array<int, 4>{2, 2, 2, 2}));

  ws[0].sessions_assigned = 1;  // worker 12
  ws[1].sessions_assigned = 1;  // worker 10
  request.tie_break = 0;        // from worker 10 on: 10 has one, 11 none
  EXPECT_EQ(choose_or_die(request, ws, weights).worker, 11u);
  request.tie_break = 2;  // from worker 12 on: 12 has one, 13 none
  EXPECT_EQ(choose_or_die(request, ws, weights).worker, 13u);
  ws[3].sessions_assigned = 1;  // worker 11: only 13 has none
  request.tie_break = 1;
  EXPECT_EQ(choose_or_die(request, ws, weights).worker, 13u);

  // A cost lower by a token wins whatever the sessions and the position.
  ws[1].inflight_prefill_tokens = 0;
  ws[2].inflight_prefill_tokens = 2;  // worker 13: +1 token
  EXPECT_EQ(choose_or_die(request, ws, weights).worker, 11u);
}

// With the load floor on, a stream of new sessions over idle workers that hold the same
// boilerplate spreads evenly: every worker within one session of every other, whichever
// tie_break the stream starts at.
TEST(CostTest, NewSessionsOverIdleWarmWorkersSpreadWithinOneSession) {
  constexpr int kWorkers = 16;
  for (uint64_t start : {0u, 5u, 1000u}) {
    std::vector<WorkerCandidate> ws;
    for (uint32_t id = 0; id < kWorkers; ++id) {
      WorkerCandidate w = worker(id);
      w.cached_device_blocks = id % 3 == 0 ? 0 : 128;  // a third lack the boilerplate
      ws.push_back(w);
    }
    RequestFeatures request = new_session(2'048 + 512);
    for (int i = 0; i < 3 * kWorkers + 5; ++i) {
      request.tie_break = start + static_cast<uint64_t>(i);
      const Decision d = choose_or_die(request, ws);
      ++ws[d.worker].sessions_assigned;
      int64_t lo = ws[0].sessions_assigned;
      int64_t hi = lo;
      for (const WorkerCandidate& w : ws) {
        lo = std::min(lo, w.sessions_assigned);
        hi = std::max(hi, w.sessions_assigned);
      }
      EXPECT_LE(hi - lo, 1) << "start " << start << ", session " << i;
    }
  }
}

TEST(CostTest, ZeroTemperatureNeverTouchesTheGenerator) {
  std::vector<WorkerCandidate> ws = {worker(0), worker(1)};
  std::mt19937_64 rng(3);
  const std::mt19937_64 before = rng;
  (void)choose(RequestFeatures{100, false, false}, ws, default_weights(), rng);
  EXPECT_TRUE(rng == before);
}

}  // namespace
}  // namespace strata::router
