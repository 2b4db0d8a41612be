#include "router/turn_records.h"

#include <iterator>

#include "common/check.h"

namespace strata::router {

Status validate(const TurnRecordOptions& o) {
  if (o.max_records < 1) {
    return make_error(ErrorCode::kInvalidArgument, "--max-turn-records must be >= 1");
  }
  if (o.max_bytes < (int64_t{1} << 20)) {
    return make_error(ErrorCode::kInvalidArgument, "--max-turn-record-mb must be >= 1");
  }
  return {};
}

TurnRecordTable::TurnRecordTable(TurnRecordOptions options) : options_(options) {
  const Status ok = validate(options_);
  STRATA_CHECK_MSG(ok.has_value(), ok ? std::string() : ok.error().message);
}

int64_t TurnRecordTable::size_of(const TurnEntry& e, size_t key_bytes) {
  const ConversationRecord& r = e.record;
  size_t n = sizeof(Slot) + sizeof(TurnEntry) + key_bytes + r.tokens.size() * sizeof(int32_t) +
             r.stop_text.size() + r.completion_text.size() + r.cache_salt.size();
  if (e.instructions) n += e.instructions->size();
  return static_cast<int64_t>(n);
}

std::string TurnRecordTable::slot_key(TurnKey kind, std::string_view key) {
  std::string k(1, kind == TurnKey::kSession ? 's' : 'r');
  k.append(key);
  return k;
}

void TurnRecordTable::drop(List::iterator it) {
  auto count = per_worker_.find(it->entry->worker);
  STRATA_CHECK(count != per_worker_.end() && count->second > 0);
  if (--count->second == 0) per_worker_.erase(count);
  bytes_ -= it->bytes;
  STRATA_CHECK(bytes_ >= 0);
  index_.erase(it->key);
  lru_.erase(it);
}

bool TurnRecordTable::put(TurnKey kind, std::string_view key, TurnEntry entry) {
  if (key.empty()) return false;
  std::string k = slot_key(kind, key);
  if (auto found = index_.find(k); found != index_.end()) drop(found->second);
  const int64_t bytes = size_of(entry, k.size());
  if (bytes > options_.max_bytes) {
    ++stats_.too_large;
    return false;
  }
  while (!lru_.empty() && (static_cast<int64_t>(lru_.size()) >= options_.max_records ||
                           bytes_ + bytes > options_.max_bytes)) {
    ++stats_.lru_drops;
    drop(std::prev(lru_.end()));
  }
  ++stats_.puts;
  ++per_worker_[entry.worker];
  lru_.push_front(
      Slot{.key = k, .entry = std::make_shared<const TurnEntry>(std::move(entry)), .bytes = bytes});
  index_.emplace(std::move(k), lru_.begin());
  bytes_ += bytes;
  return true;
}

std::shared_ptr<const TurnEntry> TurnRecordTable::find(TurnKey kind, std::string_view key) {
  auto found = index_.find(slot_key(kind, key));
  if (found == index_.end()) return nullptr;
  lru_.splice(lru_.begin(), lru_, found->second);
  return found->second->entry;
}

bool TurnRecordTable::erase(TurnKey kind, std::string_view key) {
  auto found = index_.find(slot_key(kind, key));
  if (found == index_.end()) return false;
  ++stats_.erased;
  drop(found->second);
  return true;
}

int64_t TurnRecordTable::forget_worker(uint32_t worker) {
  int64_t n = 0;
  for (auto it = lru_.begin(); it != lru_.end();) {
    auto next = std::next(it);
    if (it->entry->worker == worker) {
      drop(it);
      ++n;
    }
    it = next;
  }
  stats_.forgotten += static_cast<uint64_t>(n);
  return n;
}

int64_t TurnRecordTable::records_on(uint32_t worker) const {
  auto it = per_worker_.find(worker);
  return it == per_worker_.end() ? 0 : it->second;
}

}  // namespace strata::router
