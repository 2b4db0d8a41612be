#include "engine/pin_policy.h"

#include <algorithm>
#include <limits>
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
  const bool host = s.host_pages != nullptr;
  const int64_t pool_pages = pin_pool_pages(s);
  const std::string pool = std::to_string(pool_pages) + (host ? " host pages" : " pages");
  const int64_t pinned = s.tree.stats().pinned_blocks;
  const int64_t budget_pages = pin_budget_pages(s);
  const auto client_budget =
      static_cast<int64_t>(s.options.max_client_pinned_ratio * static_cast<double>(pool_pages));
  const int64_t by_clients = client ? s.tree.soft_pinned_blocks_at_most(PinPriority::lowest()) : 0;
  // How many new blocks fit both budgets.
  const int64_t room = std::max<int64_t>(
      0, std::min(budget_pages - pinned,
                  client ? client_budget - by_clients : std::numeric_limits<int64_t>::max()));
  // The blocks this call would newly pin (pinning a pinned block again costs no page), and
  // the longest leading run of the hashes whose new blocks fit the room.
  std::unordered_set<BlockHash> fresh;
  size_t fits = command.hashes.size();
  for (size_t i = 0; i < command.hashes.size(); ++i) {
    const BlockHash h = command.hashes[i];
    if (!s.tree.contains(h) || s.tree.pin_count(h) != 0 || fresh.contains(h)) continue;
    if (static_cast<int64_t>(fresh.size()) == room && fits == command.hashes.size()) fits = i;
    fresh.insert(h);
  }
  const int64_t added = static_cast<int64_t>(fresh.size());
  if (added > room) {
    if (command.longest_prefix && fits > 0) {
      const std::vector<BlockHash> prefix(command.hashes.begin(),
                                          command.hashes.begin() + static_cast<ptrdiff_t>(fits));
      const int64_t left = added - room;
      ++s.counters.pins_cut;
      s.counters.pin_blocks_refused += static_cast<uint64_t>(left);
      PinOutcome outcome = s.tree.pin(prefix, options);
      s.tree.back_up(prefix);
      outcome.cut = static_cast<int32_t>(command.hashes.size() - fits);
      return outcome;
    }
    ++s.counters.pins_refused;
    s.counters.pin_blocks_refused += static_cast<uint64_t>(added);
    if (pinned + added > budget_pages) {
      return make_error(ErrorCode::kOverBudget, "pin refused: " + std::to_string(pinned) +
                                                    " blocks are pinned and this call adds " +
                                                    std::to_string(added) +
                                                    "; --max-pinned-ratio allows " +
                                                    std::to_string(budget_pages) + " of " + pool);
    }
    return make_error(ErrorCode::kOverBudget,
                      "pin refused: clients hold " + std::to_string(by_clients) +
                          " pinned blocks and this call adds " + std::to_string(added) +
                          "; --max-client-pinned-ratio allows " + std::to_string(client_budget) +
                          " of " + pool);
  }
  const PinOutcome outcome = s.tree.pin(command.hashes, options);
  s.tree.back_up(command.hashes);
  return outcome;
}

}  // namespace strata
