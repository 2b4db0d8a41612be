// The planning half of a scheduler step (engine/step_plan.h) on views built by hand: no
// model, no tree, no pool. And the table of a request's states (engine/seq_state.h).
#include "engine/step_plan.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "engine/page_math.h"
#include "engine/seq_state.h"

namespace strata {
namespace {

constexpr int32_t kPage = 16;

// A request decoding: everything computed but the token sampled last, whose slot may need
// a new page.
PlanRequest decoding_request(int64_t tokens) {
  return PlanRequest{tokens, tokens - 1, pages_for(tokens - 1, kPage), false};
}

// A request prefilling: `computed` of its `tokens` prompt tokens done.
PlanRequest prefilling_request(int64_t tokens, int64_t computed) {
  return PlanRequest{tokens, computed, pages_for(computed, kPage), false};
}

StepView view_of(const std::vector<PlanRequest>& running, int64_t budget, int64_t room,
                 bool backups = false) {
  return StepView{running, kPage, budget, room, backups};
}

std::vector<size_t> indices(const StepPlan& plan) {
  std::vector<size_t> out;
  for (const PlannedRun& r : plan.runs) out.push_back(r.index);
  return out;
}

TEST(StepPlan, DecodingRequestsRunTheirTokenWhateverTheBudget) {
  const std::vector<PlanRequest> running = {decoding_request(40), prefilling_request(300, 0),
                                            decoding_request(17)};
  const StepPlan plan = plan_step(view_of(running, /*budget=*/0, /*room=*/100));
  ASSERT_EQ(plan.runs.size(), 2u);
  EXPECT_EQ(indices(plan), (std::vector<size_t>{0, 2}));
  for (const PlannedRun& r : plan.runs) EXPECT_EQ(r.count, 1);
  EXPECT_EQ(plan.runs[0].start, 39);
  // 40 positions on 3 pages: none new. 17 positions need a second page.
  EXPECT_EQ(plan.runs[0].new_pages, 0);
  EXPECT_EQ(plan.runs[1].new_pages, 1);
  EXPECT_EQ(plan.retracted(), 0);
  EXPECT_FALSE(plan.unfit);
}

TEST(StepPlan, PrefillSharesTheBudgetInRankOrder) {
  const std::vector<PlanRequest> running = {prefilling_request(60, 0), decoding_request(100),
                                            prefilling_request(200, 32), prefilling_request(50, 0),
                                            decoding_request(33)};
  const StepPlan plan = plan_step(view_of(running, /*budget=*/100, /*room=*/1000));
  // 60 for the first, the 40 left for the third, nothing for the fourth; both decode.
  ASSERT_EQ(indices(plan), (std::vector<size_t>{0, 1, 2, 4}));
  EXPECT_EQ(plan.runs[0].count, 60);
  EXPECT_EQ(plan.runs[0].start, 0);
  EXPECT_EQ(plan.runs[1].count, 1);
  EXPECT_EQ(plan.runs[2].start, 32);
  EXPECT_EQ(plan.runs[2].count, 40);
  EXPECT_EQ(plan.runs[2].new_pages, pages_for(72, kPage) - 2);
  EXPECT_EQ(plan.runs[3].count, 1);
}

TEST(StepPlan, APromptsLastChunkIsWhatIsLeftOfIt) {
  const std::vector<PlanRequest> running = {prefilling_request(100, 96)};
  const StepPlan plan = plan_step(view_of(running, /*budget=*/2048, /*room=*/10));
  ASSERT_EQ(plan.runs.size(), 1u);
  EXPECT_EQ(plan.runs[0].start, 96);
  EXPECT_EQ(plan.runs[0].count, 4);
  EXPECT_EQ(plan.runs[0].new_pages, 1);  // positions 96..99 open the seventh page
}

TEST(StepPlan, ShortRoomRetractsTheWorstFirstAndNoMoreThanNeeded) {
  // Each decoder at a page boundary needs one new page; the prefill needs 4.
  std::vector<PlanRequest> running = {prefilling_request(64, 0), decoding_request(33),
                                      decoding_request(49), decoding_request(65)};
  // Room for the prefill only: the decoders at 1 and 2 need a page each; retracting the
  // worst (index 3, 4 pages) pays for both.
  const StepPlan plan = plan_step(view_of(running, /*budget=*/64, /*room=*/4));
  ASSERT_EQ(indices(plan), (std::vector<size_t>{0, 1, 2}));
  EXPECT_EQ(plan.runs[0].retract_first, 0);
  EXPECT_EQ(plan.runs[1].retract_first, 1);
  EXPECT_EQ(plan.runs[2].retract_first, 0);
  EXPECT_EQ(plan.retracted(), 1);
  EXPECT_FALSE(plan.unfit);
}

TEST(StepPlan, ARequestThatCannotFitRetractsItselfLastAndEndsTheStep) {
  // The second request needs 8 pages; the pool has none and the worse ones hold 4 in all.
  const std::vector<PlanRequest> running = {decoding_request(20), prefilling_request(128, 0),
                                            decoding_request(30), decoding_request(18)};
  const StepPlan plan = plan_step(view_of(running, /*budget=*/2048, /*room=*/0));
  // The first decoder needs no page (20 positions on 2 pages).
  ASSERT_EQ(indices(plan), (std::vector<size_t>{0}));
  ASSERT_TRUE(plan.unfit);
  EXPECT_EQ(plan.unfit->index, 1u);
  EXPECT_EQ(plan.unfit->count, 128);
  EXPECT_EQ(plan.unfit->retract_first, 2);  // both worse ones, then itself
  EXPECT_EQ(plan.retracted(), 3);
}

TEST(StepPlan, BackupsInFlightMakeARequestWaitInsteadOfRetracting) {
  const std::vector<PlanRequest> running = {prefilling_request(200, 0), prefilling_request(40, 0),
                                            decoding_request(10)};
  const StepPlan plan = plan_step(view_of(running, /*budget=*/220, /*room=*/3, /*backups=*/true));
  // The first does not fit and waits; its budget stays spent (200), so the second gets 20.
  ASSERT_EQ(indices(plan), (std::vector<size_t>{1, 2}));
  EXPECT_EQ(plan.runs[0].count, 20);
  EXPECT_EQ(plan.retracted(), 0);
  EXPECT_FALSE(plan.unfit);

  // Once the commit retracts for it, it no longer waits.
  std::vector<PlanRequest> retracting = running;
  retracting[0].retracting = true;
  const StepPlan after = plan_step(view_of(retracting, 220, 3, true));
  EXPECT_EQ(after.retracted(), 3);  // both others, then itself
  ASSERT_TRUE(after.unfit);
  EXPECT_EQ(after.unfit->index, 0u);
}

TEST(StepPlan, AnEmptyViewPlansNothing) {
  const StepPlan plan = plan_step(view_of({}, 2048, 100));
  EXPECT_TRUE(plan.runs.empty());
  EXPECT_FALSE(plan.unfit);
}

// Random views: whatever the rules decide, a plan is coherent. Runs are in rank order and
// never among the retracted; decoders run one token; prefill stays within the budget; the
// pages taken fit the room plus what the retracted give back.
TEST(StepPlan, RandomViewsGiveCoherentPlans) {
  std::mt19937 rng(29);
  for (int round = 0; round < 2000; ++round) {
    std::vector<PlanRequest> running;
    const int n = static_cast<int>(rng() % 12);
    for (int i = 0; i < n; ++i) {
      const int64_t tokens = 1 + static_cast<int64_t>(rng() % 400);
      if (rng() % 2 == 0) {
        running.push_back(decoding_request(tokens + 1));
      } else {
        const int64_t computed = static_cast<int64_t>(rng() % static_cast<uint32_t>(tokens));
        running.push_back(prefilling_request(tokens, computed / kPage * kPage));
      }
    }
    const int64_t budget = static_cast<int64_t>(rng() % 600);
    const int64_t room = static_cast<int64_t>(rng() % 40);
    const bool backups = rng() % 4 == 0;
    const StepPlan plan = plan_step(view_of(running, budget, room, backups));

    const size_t kept = running.size() - static_cast<size_t>(plan.retracted());
    int64_t prefill = 0;
    int64_t taken = 0;
    int64_t given_back = 0;
    for (size_t k = kept; k < running.size(); ++k) {
      if (!plan.unfit || k != plan.unfit->index) given_back += running[k].pages;
    }
    for (size_t r = 0; r < plan.runs.size(); ++r) {
      const PlannedRun& run = plan.runs[r];
      const PlanRequest& req = running[run.index];
      ASSERT_LT(run.index, kept);
      if (r > 0) {
        ASSERT_GT(run.index, plan.runs[r - 1].index);
      }
      ASSERT_EQ(run.start, req.computed);
      ASSERT_GE(run.count, 1);
      ASSERT_LE(run.count, req.tokens - req.computed);
      if (req.tokens - req.computed == 1) {
        ASSERT_EQ(run.count, 1);
      } else {
        prefill += run.count;
      }
      ASSERT_EQ(run.new_pages,
                std::max<int64_t>(0, pages_for(run.start + run.count, kPage) - req.pages));
      taken += run.new_pages;
      if (backups) {
        ASSERT_EQ(run.retract_first, 0);
      }
    }
    ASSERT_LE(prefill, std::max<int64_t>(budget, 0));
    ASSERT_LE(taken, room + given_back);
    if (plan.unfit) {
      ASSERT_EQ(plan.unfit->index, kept);
      ASSERT_FALSE(backups);
    }
    // Replays the room: each run fits once its retractions gave their pages back, and one
    // retraction fewer would not have been enough (the worst go first, no more than needed).
    int64_t left = room;
    size_t next_victim = running.size();
    auto replay = [&](const PlannedRun& run, bool fits) {
      int64_t last = 0;
      for (int32_t k = 0; k < run.retract_first; ++k) {
        last = running[--next_victim].pages;
        left += last;
      }
      if (fits) {
        ASSERT_GE(left, run.new_pages);
        if (run.retract_first > 0) {
          ASSERT_LT(left - last, run.new_pages);
        }
        left -= run.new_pages;
      } else {
        ASSERT_LT(left, run.new_pages);
      }
    };
    for (const PlannedRun& run : plan.runs) replay(run, true);
    if (plan.unfit) replay(*plan.unfit, false);
  }
}

TEST(SeqState, EveryStateMayEndAndAnEndedRequestStaysEnded) {
  const SeqState all[] = {SeqState::kWaiting,   SeqState::kParked,  SeqState::kOrdered,
                          SeqState::kReceiving, SeqState::kRunning, SeqState::kSending,
                          SeqState::kFinished};
  for (SeqState s : all) {
    EXPECT_EQ(seq_transition_allowed(s, SeqState::kFinished), s != SeqState::kFinished)
        << seq_state_name(s);
    if (s != SeqState::kFinished) continue;
    for (SeqState to : all) EXPECT_FALSE(seq_transition_allowed(s, to)) << seq_state_name(to);
  }
}

TEST(SeqState, OnlyTheDocumentedMovesAreAllowed) {
  using S = SeqState;
  // Admission, tiers and disaggregation.
  EXPECT_TRUE(seq_transition_allowed(S::kWaiting, S::kRunning));
  EXPECT_TRUE(seq_transition_allowed(S::kWaiting, S::kParked));
  EXPECT_TRUE(seq_transition_allowed(S::kWaiting, S::kOrdered));
  EXPECT_TRUE(seq_transition_allowed(S::kParked, S::kWaiting));
  EXPECT_TRUE(seq_transition_allowed(S::kOrdered, S::kReceiving));
  EXPECT_TRUE(seq_transition_allowed(S::kReceiving, S::kRunning));
  EXPECT_TRUE(seq_transition_allowed(S::kRunning, S::kWaiting));
  EXPECT_TRUE(seq_transition_allowed(S::kRunning, S::kSending));
  // A parked request goes back to the queue before it runs; only a running request can be
  // retracted; a request being sent only ends.
  EXPECT_FALSE(seq_transition_allowed(S::kParked, S::kRunning));
  EXPECT_FALSE(seq_transition_allowed(S::kRunning, S::kParked));
  EXPECT_FALSE(seq_transition_allowed(S::kWaiting, S::kSending));
  EXPECT_FALSE(seq_transition_allowed(S::kSending, S::kWaiting));
  EXPECT_FALSE(seq_transition_allowed(S::kOrdered, S::kRunning));
  EXPECT_FALSE(seq_transition_allowed(S::kWaiting, S::kWaiting));
  // What holds pages gives them back when it leaves.
  EXPECT_FALSE(seq_holds_pages(S::kWaiting));
  EXPECT_FALSE(seq_holds_pages(S::kParked));
  EXPECT_FALSE(seq_holds_pages(S::kFinished));
  EXPECT_TRUE(seq_holds_pages(S::kOrdered));
  EXPECT_TRUE(seq_holds_pages(S::kReceiving));
  EXPECT_TRUE(seq_holds_pages(S::kRunning));
  EXPECT_TRUE(seq_holds_pages(S::kSending));
}

}  // namespace
}  // namespace strata
