#include "server/conversations.h"

#include <algorithm>

namespace strata {

ConversationRecords::ConversationRecords(size_t max_records, int64_t idle_ttl_ms,
                                         const Clock* clock)
    : max_records_(max_records),
      idle_ttl_ms_(idle_ttl_ms),
      clock_(clock != nullptr ? clock : &SteadyClock::instance()) {}

void ConversationRecords::drop_expired(int64_t now_ms) {
  while (!lru_.empty()) {
    auto it = records_.find(lru_.back());
    if (now_ms - it->second.used_ms < idle_ttl_ms_) break;
    records_.erase(it);
    lru_.pop_back();
    ++dropped_idle_;
  }
}

std::optional<ConversationRecord> ConversationRecords::find(const std::string& id) {
  const int64_t now = clock_->now_ms();
  std::lock_guard lock(mutex_);
  drop_expired(now);
  auto it = records_.find(id);
  if (it == records_.end()) return std::nullopt;
  it->second.used_ms = now;
  lru_.splice(lru_.begin(), lru_, it->second.lru);
  return it->second.record;
}

void ConversationRecords::put(const std::string& id, ConversationRecord record) {
  if (max_records_ == 0) return;
  const int64_t now = clock_->now_ms();
  std::lock_guard lock(mutex_);
  drop_expired(now);
  auto it = records_.find(id);
  if (it != records_.end()) {
    it->second.record = std::move(record);
    it->second.used_ms = now;
    lru_.splice(lru_.begin(), lru_, it->second.lru);
    return;
  }
  while (records_.size() >= max_records_) {
    records_.erase(lru_.back());
    lru_.pop_back();
    ++dropped_capacity_;
  }
  lru_.push_front(id);
  records_.emplace(id, Entry{std::move(record), now, lru_.begin()});
}

void ConversationRecords::erase(const std::string& id) {
  std::lock_guard lock(mutex_);
  auto it = records_.find(id);
  if (it == records_.end()) return;
  lru_.erase(it->second.lru);
  records_.erase(it);
}

ConversationRecords::Stats ConversationRecords::stats() const {
  std::lock_guard lock(mutex_);
  return Stats{records_.size(), dropped_capacity_, dropped_idle_};
}

}  // namespace strata
