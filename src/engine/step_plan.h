// The planning half of a scheduler step (docs/scheduling.md, "Plan and commit"): from a
// read-only view of the running requests, the step's prefill budget and the device pool's
// room, which requests run this step and with how many tokens, how many device pages each
// takes, and which requests are retracted to make room. A pure function: no tree, no pool,
// no model, so every rule can be tested by building views by hand
// (tests/engine/step_plan_test.cc). Scheduler::step commits the plan: it retracts, takes
// the pages and runs the forward pass.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace strata {

// One running request as the plan sees it.
struct PlanRequest {
  int64_t tokens = 0;    // prompt + generated
  int64_t computed = 0;  // tokens whose KV is in pages (tokens - computed >= 1)
  int64_t pages = 0;     // device pages it holds (all of them go back if it is retracted)
  // The commit already retracted others for it this step: it keeps retracting rather than
  // wait for backups (the backups rule is asked once per request and step, before the first
  // retraction).
  bool retracting = false;
};

struct StepView {
  // Best rank first (queue_order.h): the better requests get the prefill budget first, and
  // the last one is retracted first.
  std::span<const PlanRequest> running;
  int32_t page_size = 1;
  // Prefill tokens this step may carry (step_budget.h); a decoding request's one token is
  // not counted against it.
  int64_t prefill_budget = 0;
  // Device pages the step can take now: free pages, plus what eviction can free. An upper
  // bound: with a host tier an evicted page may have to be backed up first, and the commit
  // plans again with what the pool really gave.
  int64_t room = 0;
  // Backups in flight free device pages when they land: a request that does not fit waits
  // for them (skipped this step) rather than retract others.
  bool backups_in_flight = false;
};

struct PlannedRun {
  size_t index = 0;           // into StepView::running
  int64_t start = 0;          // first position computed (the request's `computed`)
  int64_t count = 0;          // tokens computed: 1 to decode, a chunk of the prompt to prefill
  int64_t new_pages = 0;      // device pages it takes this step
  int32_t retract_first = 0;  // requests retracted (from the back) before it takes them
};

struct StepPlan {
  std::vector<PlannedRun> runs;  // in rank order
  // A request that did not fit even when every worse one was retracted: those are retracted
  // (`retract_first` of them), then it is too, and the step ends there with `runs`.
  std::optional<PlannedRun> unfit;

  // Requests retracted in all, from the back of the view's running list.
  int32_t retracted() const {
    int32_t n = unfit ? unfit->retract_first + 1 : 0;
    for (const PlannedRun& r : runs) n += r.retract_first;
    return n;
  }
};

// The rules, in rank order: a decoding request (one token pending) always runs its token;
// a prefilling one takes min(pending, budget left) tokens, and is skipped once the budget
// is spent. A run that does not fit the room waits when backups are in flight; otherwise
// the worst-ranked requests are retracted, one at a time, until it fits (a retracted
// request gives back at most the pages it holds: its prefix may stay locked by others, and
// the commit plans again when the pool gives less); when it would be next, it is retracted
// itself and the step ends.
StepPlan plan_step(const StepView& view);

}  // namespace strata
