// The router's side of prefill/decode disaggregation (router/pd_choice.h): short prompts
// and prompts mostly cached on the decode worker stay local; absent, unusable and
// overloaded prefill workers leave the prefill local; the best-cached prefill worker is
// chosen; and prefill-role workers are never chosen as decode workers (router/cost.h).
#include "router/pd_choice.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "router/cost.h"

namespace strata::router {
namespace {

PdOptions pd_options(int64_t min_prefill_tokens = 256, int64_t max_queue = 32'768) {
  PdOptions o;
  o.enabled = true;
  o.min_prefill_tokens = min_prefill_tokens;
  o.max_prefill_queue_tokens = max_queue;
  return o;
}

PrefillCandidate prefill(uint32_t id, int64_t cached_tokens = 0, int64_t queued = 0) {
  PrefillCandidate c;
  c.id = id;
  c.cached_tokens = cached_tokens;
  c.queued_prefill_tokens = queued;
  return c;
}

PdRequest request(int64_t prompt_tokens, int64_t decode_cached_tokens = 0) {
  return PdRequest{.prompt_tokens = prompt_tokens,
                   .decode_cached_tokens = decode_cached_tokens,
                   .decode_has_channel = true};
}

TEST(PdChoiceTest, DefaultsAreValidAndNegativeBoundsAreRefused) {
  PdOptions o;
  EXPECT_FALSE(o.enabled);
  EXPECT_EQ(o.min_prefill_tokens, 256);
  EXPECT_TRUE(validate(o).has_value());
  o.min_prefill_tokens = 0;
  o.max_prefill_queue_tokens = 0;
  EXPECT_TRUE(validate(o).has_value());
  o.min_prefill_tokens = -1;
  EXPECT_FALSE(validate(o).has_value());
  o = PdOptions{};
  o.max_prefill_queue_tokens = -1;
  EXPECT_FALSE(validate(o).has_value());
}

TEST(PdChoiceTest, DecisionNamesAreTheMetricLabels) {
  EXPECT_EQ(pd_decision_name(PdDecision::kRemote), "remote");
  EXPECT_EQ(pd_decision_name(PdDecision::kLocalShort), "local_short");
  EXPECT_EQ(pd_decision_name(PdDecision::kLocalNoPrefillWorker), "local_no_prefill_worker");
  EXPECT_EQ(pd_decision_name(PdDecision::kLocalOverloaded), "local_overloaded");
}

TEST(PdChoiceTest, ShortPromptsStayLocal) {
  const std::vector<PrefillCandidate> ps{prefill(1)};
  for (int64_t n : {0, 1, 100, 256}) {
    const PdChoice c = choose_prefill(request(n), ps, pd_options());
    EXPECT_EQ(c.decision, PdDecision::kLocalShort) << n;
    EXPECT_FALSE(c.prefill_worker.has_value());
    EXPECT_EQ(c.prefill_compute_tokens, 0);
    EXPECT_EQ(c.remote_tokens, n);
  }
  // "Longer than" the bound: one more token goes remote.
  const PdChoice c = choose_prefill(request(257), ps, pd_options());
  EXPECT_EQ(c.decision, PdDecision::kRemote);
  EXPECT_EQ(c.prefill_worker, 1u);
  EXPECT_EQ(c.remote_tokens, 257);
  // A bound of 0 sends every non-empty uncached part.
  EXPECT_EQ(choose_prefill(request(1), ps, pd_options(0)).decision, PdDecision::kRemote);
  EXPECT_EQ(choose_prefill(request(0), ps, pd_options(0)).decision, PdDecision::kLocalShort);
}

TEST(PdChoiceTest, TheDecodeWorkersCachedPrefixReducesTheRemotePart) {
  const std::vector<PrefillCandidate> ps{prefill(1)};
  // 4,000 tokens, 3,800 of them cached where it decodes: 200 to compute, local.
  PdChoice c = choose_prefill(request(4'000, 3'800), ps, pd_options());
  EXPECT_EQ(c.decision, PdDecision::kLocalShort);
  EXPECT_EQ(c.remote_tokens, 200);
  // 3,000 cached: 1,000 lack, remote.
  c = choose_prefill(request(4'000, 3'000), ps, pd_options());
  EXPECT_EQ(c.decision, PdDecision::kRemote);
  EXPECT_EQ(c.remote_tokens, 1'000);
  // Fully cached (or the index claims more than the prompt): nothing to move.
  c = choose_prefill(request(4'000, 4'000), ps, pd_options(0));
  EXPECT_EQ(c.decision, PdDecision::kLocalShort);
  EXPECT_EQ(c.remote_tokens, 0);
  c = choose_prefill(request(100, 160), ps, pd_options(0));
  EXPECT_EQ(c.decision, PdDecision::kLocalShort);
  EXPECT_EQ(c.remote_tokens, 0);
}

TEST(PdChoiceTest, AbsentOrUnusablePrefillWorkersLeaveThePrefillLocal) {
  EXPECT_EQ(choose_prefill(request(5'000), {}, pd_options()).decision,
            PdDecision::kLocalNoPrefillWorker);
  // Unhealthy (breaker open, not answering, draining, no PD id, another page size): the
  // router marks it unusable.
  std::vector<PrefillCandidate> ps{prefill(1, 4'096), prefill(2)};
  ps[0].usable = false;
  ps[1].usable = false;
  PdChoice c = choose_prefill(request(5'000), ps, pd_options());
  EXPECT_EQ(c.decision, PdDecision::kLocalNoPrefillWorker);
  EXPECT_FALSE(c.prefill_worker.has_value());
  // One usable worker is enough, even one with nothing cached.
  ps[1].usable = true;
  c = choose_prefill(request(5'000), ps, pd_options());
  EXPECT_EQ(c.decision, PdDecision::kRemote);
  EXPECT_EQ(c.prefill_worker, 2u);
  // A decode worker without a PD channel cannot order a prefill anywhere.
  PdRequest r = request(5'000);
  r.decode_has_channel = false;
  c = choose_prefill(r, ps, pd_options());
  EXPECT_EQ(c.decision, PdDecision::kLocalNoPrefillWorker);
  // A short prompt is short first, whatever the prefill workers.
  EXPECT_EQ(choose_prefill(request(10), {}, pd_options()).decision, PdDecision::kLocalShort);
}

TEST(PdChoiceTest, OverloadedPrefillWorkersLeaveThePrefillLocal) {
  std::vector<PrefillCandidate> ps{prefill(1, 0, 40'000), prefill(2)};
  ps[1].saturated = true;
  PdChoice c = choose_prefill(request(5'000), ps, pd_options());
  EXPECT_EQ(c.decision, PdDecision::kLocalOverloaded);
  EXPECT_FALSE(c.prefill_worker.has_value());
  EXPECT_EQ(c.prefill_compute_tokens, 0);
  // The bound is "more than": exactly at it still takes orders.
  ps[0].queued_prefill_tokens = 32'768;
  c = choose_prefill(request(5'000), ps, pd_options());
  EXPECT_EQ(c.decision, PdDecision::kRemote);
  EXPECT_EQ(c.prefill_worker, 1u);
  // An unusable worker does not turn "overloaded" into "none".
  ps[0].queued_prefill_tokens = 32'769;
  ps.push_back(prefill(3));
  ps.back().usable = false;
  EXPECT_EQ(choose_prefill(request(5'000), ps, pd_options()).decision,
            PdDecision::kLocalOverloaded);
  // A huge prompt still goes to an idle prefill worker (the bound is on what waits there).
  EXPECT_EQ(choose_prefill(request(100'000), std::vector{prefill(4)}, pd_options()).decision,
            PdDecision::kRemote);
}

TEST(PdChoiceTest, TheBestCachedPrefillWorkerIsChosen) {
  std::vector<PrefillCandidate> ps{prefill(1, 0), prefill(2, 2'048, 9'000), prefill(3, 1'024)};
  PdChoice c = choose_prefill(request(5'000, 512), ps, pd_options());
  EXPECT_EQ(c.decision, PdDecision::kRemote);
  EXPECT_EQ(c.prefill_worker, 2u);
  EXPECT_EQ(c.remote_tokens, 4'488);
  // What it computes: the prompt less its own cached run.
  EXPECT_EQ(c.prefill_compute_tokens, 2'952);
  // The best-cached worker overloaded: the next best.
  ps[1].queued_prefill_tokens = 50'000;
  c = choose_prefill(request(5'000, 512), ps, pd_options());
  EXPECT_EQ(c.prefill_worker, 3u);
  EXPECT_EQ(c.prefill_compute_tokens, 3'976);
  // ... or unusable.
  ps[1].queued_prefill_tokens = 0;
  ps[1].usable = false;
  EXPECT_EQ(choose_prefill(request(5'000, 512), ps, pd_options()).prefill_worker, 3u);
  // A prefill worker holding the whole prompt still samples the first token there.
  c = choose_prefill(request(5'000), std::vector{prefill(7, 5'000)}, pd_options());
  EXPECT_EQ(c.prefill_compute_tokens, 1);
}

TEST(PdChoiceTest, TiesGoToTheLeastQueuedThenTheLowestId) {
  std::vector<PrefillCandidate> ps{prefill(5, 1'024, 3'000), prefill(2, 1'024, 1'000),
                                   prefill(9, 1'024, 1'000), prefill(4, 512, 0)};
  EXPECT_EQ(choose_prefill(request(5'000), ps, pd_options()).prefill_worker, 2u);
  // Now 9 is the least queued of those with the longest run.
  ps[1].queued_prefill_tokens = 5'000;
  EXPECT_EQ(choose_prefill(request(5'000), ps, pd_options()).prefill_worker, 9u);
  // 5 and 9 tied on both: the lowest id, whatever the order of the candidates.
  ps[2].queued_prefill_tokens = 3'000;
  EXPECT_EQ(choose_prefill(request(5'000), ps, pd_options()).prefill_worker, 5u);
  std::vector<PrefillCandidate> rev(ps.rbegin(), ps.rend());
  EXPECT_EQ(choose_prefill(request(5'000), rev, pd_options()).prefill_worker, 5u);
}

// Ties rotate with the router's decision count (issue 56: always the lowest id was the bias
// the decode choice had): the tied workers take turns, in id order, whatever the order of
// the candidates; a worker that is better still wins whatever the rotation.
TEST(PdChoiceTest, TiesRotateOverThePrefillWorkersWithTheDecisionCount) {
  std::vector<PrefillCandidate> ps{prefill(7, 1'024, 0), prefill(3, 1'024, 0), prefill(5, 1'024, 0),
                                   prefill(1, 512, 0)};
  std::vector<PrefillCandidate> rev(ps.rbegin(), ps.rend());
  std::vector<uint32_t> got;
  for (uint64_t k = 0; k < 8; ++k) {
    PdRequest r = request(5'000);
    r.tie_break = k;
    const auto chosen = choose_prefill(r, ps, pd_options()).prefill_worker;
    ASSERT_TRUE(chosen.has_value());
    EXPECT_EQ(choose_prefill(r, rev, pd_options()).prefill_worker, chosen) << k;
    got.push_back(*chosen);
  }
  // Positions in id order: 1 (not tied), 3, 5, 7. From position k % 4: 0 and 1 -> 3, 2 -> 5,
  // 3 -> 7.
  EXPECT_EQ(got, (std::vector<uint32_t>{3, 3, 5, 7, 3, 3, 5, 7}));
  ps[2].cached_tokens = 2'048;  // 5 holds more: no rotation takes it away
  for (uint64_t k = 0; k < 4; ++k) {
    PdRequest r = request(5'000);
    r.tie_break = k;
    EXPECT_EQ(choose_prefill(r, ps, pd_options()).prefill_worker, 5u) << k;
  }
}

// Random pools against the rules written out directly.
TEST(PdChoiceTest, RandomPoolsFollowTheRules) {
  std::mt19937_64 rng(15);
  auto pick = [&](int64_t n) { return static_cast<int64_t>(rng() % static_cast<uint64_t>(n)); };
  for (int round = 0; round < 5'000; ++round) {
    const PdOptions o = pd_options(pick(600), pick(4) * 10'000);
    PdRequest r = request(pick(8'000), pick(8'000));
    r.decode_has_channel = pick(10) != 0;
    r.tie_break = static_cast<uint64_t>(pick(1'000));
    std::vector<PrefillCandidate> ps;
    const int n = static_cast<int>(pick(5));
    for (int i = 0; i < n; ++i) {
      PrefillCandidate c =
          prefill(static_cast<uint32_t>(pick(64)), pick(4) * 1'024, pick(6) * 10'000);
      c.usable = pick(4) != 0;
      c.saturated = pick(6) == 0;
      ps.push_back(c);
    }
    const PdChoice c = choose_prefill(r, ps, o);
    const int64_t remote = std::max<int64_t>(0, r.prompt_tokens - r.decode_cached_tokens);
    EXPECT_EQ(c.remote_tokens, remote);
    EXPECT_EQ(c.prefill_worker.has_value(), c.decision == PdDecision::kRemote);
    bool any_usable = false;
    const PrefillCandidate* best = nullptr;
    // The rotation written out: the ids in order, counted from position tie_break % n.
    std::vector<uint32_t> ids;
    for (const PrefillCandidate& p : ps) ids.push_back(p.id);
    std::sort(ids.begin(), ids.end());
    const auto rank = [&](uint32_t id) {
      const auto at = static_cast<uint64_t>(std::find(ids.begin(), ids.end(), id) - ids.begin());
      return (at + ids.size() - r.tie_break % ids.size()) % ids.size();
    };
    for (const PrefillCandidate& p : ps) {
      if (!p.usable) continue;
      any_usable = true;
      if (p.saturated || p.queued_prefill_tokens > o.max_prefill_queue_tokens) continue;
      if (best == nullptr || p.cached_tokens > best->cached_tokens ||
          (p.cached_tokens == best->cached_tokens &&
           (p.queued_prefill_tokens < best->queued_prefill_tokens ||
            (p.queued_prefill_tokens == best->queued_prefill_tokens &&
             rank(p.id) < rank(best->id))))) {
        best = &p;
      }
    }
    if (remote <= o.min_prefill_tokens) {
      EXPECT_EQ(c.decision, PdDecision::kLocalShort);
    } else if (!r.decode_has_channel || !any_usable) {
      EXPECT_EQ(c.decision, PdDecision::kLocalNoPrefillWorker);
    } else if (best == nullptr) {
      EXPECT_EQ(c.decision, PdDecision::kLocalOverloaded);
    } else {
      ASSERT_EQ(c.decision, PdDecision::kRemote);
      EXPECT_EQ(*c.prefill_worker, best->id);
      EXPECT_EQ(c.prefill_compute_tokens,
                std::max<int64_t>(1, r.prompt_tokens - best->cached_tokens));
    }
  }
}

// ---- the decode worker's choice (cost.h) ----

WorkerCandidate decode_worker(uint32_t id, int64_t cached_blocks = 0, int64_t queued = 0) {
  WorkerCandidate w;
  w.id = id;
  w.block_size = 16;
  w.cached_device_blocks = cached_blocks;
  w.inflight_prefill_tokens = queued;
  w.load_fraction = 0.2;
  return w;
}

TEST(PdChoiceTest, PrefillWorkersAreNeverChosenAsDecodeWorkers) {
  std::mt19937_64 rng(1);
  // The prefill worker holds the whole prompt and is idle; the decode workers are busy
  // and hold nothing. Still a decode worker.
  std::vector<WorkerCandidate> ws{decode_worker(0, 0, 20'000), decode_worker(1, 256, 0),
                                  decode_worker(2, 0, 30'000)};
  ws[1].prefill_only = true;
  std::optional<Decision> d = choose(RequestFeatures{4'096, false, false}, ws, CostWeights{}, rng);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->worker, 0u);
  EXPECT_EQ(d->pool_size, 2);
  EXPECT_NE(d->runner_up, 1u);
  // With temperature, never drawn either.
  CostWeights hot;
  hot.temperature = 1e9;
  for (int i = 0; i < 200; ++i) {
    d = choose(RequestFeatures{4'096, false, false}, ws, hot, rng);
    ASSERT_TRUE(d.has_value());
    EXPECT_NE(d->worker, 1u);
  }
  // Saturated decode workers: queued (all_saturated), not sent to the prefill worker.
  ws[0].load_fraction = ws[2].load_fraction = 1.5;
  d = choose(RequestFeatures{4'096, false, false}, ws, CostWeights{}, rng);
  ASSERT_TRUE(d.has_value());
  EXPECT_TRUE(d->all_saturated);
  EXPECT_NE(d->worker, 1u);
  // Only prefill workers (or only they eligible): no worker for the request.
  ws[0].eligible = ws[2].eligible = false;
  EXPECT_FALSE(choose(RequestFeatures{4'096, false, false}, ws, CostWeights{}, rng).has_value());
  std::vector<WorkerCandidate> only{decode_worker(3)};
  only[0].prefill_only = true;
  EXPECT_FALSE(choose(RequestFeatures{16, false, false}, only, CostWeights{}, rng).has_value());
}

TEST(PdChoiceTest, PrefillWorkersDoNotCountInTheLoadFloorMean) {
  std::mt19937_64 rng(1);
  // Two decode workers with 4 sessions each and a prefill worker with none: the mean is
  // 4, not 8/3, so neither decode worker gets a floor bonus.
  std::vector<WorkerCandidate> ws{decode_worker(0), decode_worker(1), decode_worker(2)};
  ws[0].sessions_assigned = 4;
  ws[1].sessions_assigned = 4;
  ws[2].prefill_only = true;
  std::optional<Decision> d = choose(RequestFeatures{64, true, true}, ws, CostWeights{}, rng);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->terms.floor, 0.0);
  EXPECT_EQ(d->pool_size, 2);
}

}  // namespace
}  // namespace strata::router
