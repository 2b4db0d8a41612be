#include "cache/eviction_history.h"

#include <algorithm>

namespace strata {

EvictionHistory::EvictionHistory(int64_t capacity) : capacity_(std::max<int64_t>(0, capacity)) {
  while ((capacity_ >> sample_shift_) > kExactBlocks) ++sample_shift_;
  // The ring holds the sample's share of the window (rounded up).
  ring_.resize(static_cast<size_t>((capacity_ + pages_per_block() - 1) >> sample_shift_));
  slot_of_.reserve(ring_.size());
}

void EvictionHistory::record(std::span<const BlockHash> hashes) {
  if (ring_.empty()) return;
  for (BlockHash h : hashes) {
    if (!sampled(h)) continue;
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

int64_t EvictionHistory::take(BlockHash hash) {
  if (slot_of_.empty() || !sampled(hash)) return 0;
  auto it = slot_of_.find(hash);
  if (it == slot_of_.end()) return 0;
  slot_of_.erase(it);
  return pages_per_block();
}

void EvictionHistory::clear() {
  slot_of_.clear();
  next_ = 0;
}

}  // namespace strata
