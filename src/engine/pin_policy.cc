#include "engine/pin_policy.h"

#include <algorithm>
#include <string>
#include <unordered_set>

namespace strata {

int64_t pin_pool_pages(const EngineState& s) {
  return s.host_pages != nullptr ? s.host_pages->num_pages() : s.device_pages.num_pages();
}

int64_t pin_budget_pages(const EngineState& s) {
  return static_cast<int64_t>(s.options.max_pinned_ratio * static_cast<double>(pin_pool_pages(s)));
}

Result<PinOutcome> apply_pin(EngineState& s, const PinCommand& command) {
  PinOptions options{.ttl_ms = std::max<int64_t>(command.ttl_ms, 0), .priority = command.priority};
  const bool client = command.authority == PinAuthority::kClient;
  if (client) {
    const int64_t cap = s.options.max_client_pin_ttl_ms;
    options.ttl_ms = options.ttl_ms == 0 ? cap : std::min(options.ttl_ms, cap);
    options.priority = PinPriority::lowest();
  }
  // The blocks this call would newly pin (pinning a pinned block again costs no page).
  std::unordered_set<BlockHash> fresh;
  for (BlockHash h : command.hashes) {
    if (s.tree.contains(h) && s.tree.pin_count(h) == 0) fresh.insert(h);
  }
  const int64_t added = static_cast<int64_t>(fresh.size());
  const bool host = s.host_pages != nullptr;
  const int64_t pool_pages = pin_pool_pages(s);
  const std::string pool = std::to_string(pool_pages) + (host ? " host pages" : " pages");
  const int64_t pinned = s.tree.stats().pinned_blocks;
  const int64_t budget_pages = pin_budget_pages(s);
  if (pinned + added > budget_pages) {
    return make_error(ErrorCode::kOverBudget, "pin refused: " + std::to_string(pinned) +
                                                  " blocks are pinned and this call adds " +
                                                  std::to_string(added) +
                                                  "; --max-pinned-ratio allows " +
                                                  std::to_string(budget_pages) + " of " + pool);
  }
  if (client) {
    const auto budget =
        static_cast<int64_t>(s.options.max_client_pinned_ratio * static_cast<double>(pool_pages));
    const int64_t by_clients = s.tree.soft_pinned_blocks_at_most(PinPriority::lowest());
    if (by_clients + added > budget) {
      return make_error(ErrorCode::kOverBudget,
                        "pin refused: clients hold " + std::to_string(by_clients) +
                            " pinned blocks and this call adds " + std::to_string(added) +
                            "; --max-client-pinned-ratio allows " + std::to_string(budget) +
                            " of " + pool);
    }
  }
  const PinOutcome outcome = s.tree.pin(command.hashes, options);
  s.tree.back_up(command.hashes);
  return outcome;
}

}  // namespace strata
