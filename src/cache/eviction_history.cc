#include "cache/eviction_history.h"

#include <algorithm>

namespace strata {

EvictionHistory::EvictionHistory(int64_t capacity)
    : ring_(static_cast<size_t>(std::max<int64_t>(0, capacity))) {
  slot_of_.reserve(ring_.size());
}

void EvictionHistory::record(std::span<const BlockHash> hashes) {
  if (ring_.empty()) return;
  for (BlockHash h : hashes) {
    const auto slot = static_cast<uint32_t>(next_);
    // The oldest slot is reused: forget its hash unless it has moved to a later slot.
    if (auto old = slot_of_.find(ring_[next_]); old != slot_of_.end() && old->second == slot) {
      slot_of_.erase(old);
    }
    ring_[next_] = h;
    slot_of_.insert_or_assign(h, slot);
    next_ = next_ + 1 == ring_.size() ? 0 : next_ + 1;
  }
}

bool EvictionHistory::take(BlockHash hash) {
  if (slot_of_.empty()) return false;
  auto it = slot_of_.find(hash);
  if (it == slot_of_.end()) return false;
  slot_of_.erase(it);
  return true;
}

void EvictionHistory::clear() {
  slot_of_.clear();
  next_ = 0;
}

}  // namespace strata
