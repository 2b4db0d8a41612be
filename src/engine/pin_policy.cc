#include "engine/pin_policy.h"

#include <algorithm>
#include <string>
#include <unordered_set>

namespace strata {

Result<PinResult> apply_pin(EngineState& s, std::span<const BlockHash> hashes, PinOptions options,
                            PinAuthority authority) {
  if (options.priority < kMinPinPriority || options.priority > kMaxPinPriority) {
    return make_error(ErrorCode::kInvalidArgument, "'priority' must be in [" +
                                                       std::to_string(kMinPinPriority) + ", " +
                                                       std::to_string(kMaxPinPriority) + "]");
  }
  const bool client = authority == PinAuthority::kClient;
  if (client) {
    const int64_t cap = s.options.max_client_pin_ttl_ms;
    options.ttl_ms = options.ttl_ms <= 0 ? cap : std::min(options.ttl_ms, cap);
    options.priority = kClientPinPriority;
  }
  // The blocks this call would newly pin (pinning a pinned block again costs no page).
  std::unordered_set<BlockHash> fresh;
  for (BlockHash h : hashes) {
    if (s.tree.contains(h) && s.tree.pin_count(h) == 0) fresh.insert(h);
  }
  const int64_t added = static_cast<int64_t>(fresh.size());
  const bool host = s.host_pages != nullptr;
  const int64_t pool_pages = host ? s.host_pages->num_pages() : s.device_pages.num_pages();
  const std::string pool = std::to_string(pool_pages) + (host ? " host pages" : " pages");
  const int64_t pinned = s.tree.stats().pinned_blocks;
  if (pinned + added > s.pin_budget_pages) {
    return make_error(ErrorCode::kResourceExhausted,
                      "pin refused: " + std::to_string(pinned) +
                          " blocks are pinned and this call adds " + std::to_string(added) +
                          "; --max-pinned-ratio allows " + std::to_string(s.pin_budget_pages) +
                          " of " + pool);
  }
  if (client) {
    const auto budget =
        static_cast<int64_t>(s.options.max_client_pinned_ratio * static_cast<double>(pool_pages));
    const int64_t by_clients = s.tree.soft_pinned_blocks_at_most(kClientPinPriority);
    if (by_clients + added > budget) {
      return make_error(ErrorCode::kResourceExhausted,
                        "pin refused: clients hold " + std::to_string(by_clients) +
                            " pinned blocks and this call adds " + std::to_string(added) +
                            "; --max-client-pinned-ratio allows " + std::to_string(budget) +
                            " of " + pool);
    }
  }
  PinResult r = s.tree.pin(hashes, options);
  s.tree.back_up(hashes);
  return r;
}

}  // namespace strata
