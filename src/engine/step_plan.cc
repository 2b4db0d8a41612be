#include "engine/step_plan.h"

#include <algorithm>

#include "common/check.h"
#include "engine/page_math.h"

namespace strata {

StepPlan plan_step(const StepView& view) {
  StepPlan plan;
  int64_t budget = view.prefill_budget;
  int64_t room = view.room;
  // running[kept, end) are retracted.
  size_t kept = view.running.size();
  for (size_t i = 0; i < kept; ++i) {
    const PlanRequest& r = view.running[i];
    const int64_t pending = r.tokens - r.computed;
    STRATA_CHECK(pending >= 1);
    int64_t count = pending;
    if (pending > 1) {
      if (budget <= 0) continue;
      count = std::min(pending, budget);
      budget -= count;
    }
    const int64_t need =
        std::max<int64_t>(0, pages_for(r.computed + count, view.page_size) - r.pages);
    int32_t retracted = 0;
    if (need > room) {
      // (Its budget stays spent: the budget bounds what the step asks for, not what it got.)
      if (view.backups_in_flight && !r.retracting) continue;
      // Retracting only one and giving up on the step let admission take it back at once:
      // a livelock (the fuzz suite's tests/fuzz/repro_scheduler_livelock.mjs).
      while (need > room && kept > i) {
        --kept;
        ++retracted;
        if (kept > i) room += view.running[kept].pages;
      }
      if (kept == i) {
        plan.unfit = PlannedRun{i, r.computed, count, need, retracted - 1};
        break;
      }
    }
    room -= need;
    plan.runs.push_back(PlannedRun{i, r.computed, count, need, retracted});
  }
  return plan;
}

}  // namespace strata
