#include "router/turn_records.h"

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
  size_t n = sizeof(Table::Entry) + sizeof(TurnEntry) + key_bytes +
             r.tokens.size() * sizeof(int32_t) + r.stop_text.size() + r.completion_text.size() +
             r.cache_salt.size();
  if (e.instructions) n += e.instructions->size();
  return static_cast<int64_t>(n);
}

std::string TurnRecordTable::slot_key(TurnKey kind, std::string_view key) {
  std::string k(1, kind == TurnKey::kSession ? 's' : 'r');
  k.append(key);
  return k;
}

void TurnRecordTable::drop(Table::iterator it) {
  bytes_ -= it->value.bytes;
  STRATA_CHECK(bytes_ >= 0);
  table_.erase(it);
}

bool TurnRecordTable::put(TurnKey kind, std::string_view key, TurnEntry entry) {
  if (key.empty()) return false;
  const std::string k = slot_key(kind, key);
  if (auto it = table_.find(k); it != table_.end()) drop(it);
  const int64_t bytes = size_of(entry, k.size());
  if (bytes > options_.max_bytes) {
    ++stats_.too_large;
    return false;
  }
  while (!table_.empty() &&
         (table_.size() >= options_.max_records || bytes_ + bytes > options_.max_bytes)) {
    ++stats_.lru_drops;
    drop(table_.oldest());
  }
  ++stats_.puts;
  const uint32_t worker = entry.worker;
  table_.insert(k, worker,
                Slot{.entry = std::make_shared<const TurnEntry>(std::move(entry)), .bytes = bytes});
  bytes_ += bytes;
  return true;
}

std::shared_ptr<const TurnEntry> TurnRecordTable::find(TurnKey kind, std::string_view key) {
  auto it = table_.find(slot_key(kind, key));
  if (it == table_.end()) return nullptr;
  table_.touch(it);
  return it->value.entry;
}

bool TurnRecordTable::erase(TurnKey kind, std::string_view key) {
  auto it = table_.find(slot_key(kind, key));
  if (it == table_.end()) return false;
  ++stats_.erased;
  drop(it);
  return true;
}

int64_t TurnRecordTable::forget_worker(uint32_t worker) {
  const int64_t n = table_.erase_worker(worker, [this](const Table::Entry& e) {
    bytes_ -= e.value.bytes;
    STRATA_CHECK(bytes_ >= 0);
  });
  stats_.forgotten += static_cast<uint64_t>(n);
  return n;
}

int64_t TurnRecordTable::records_on(uint32_t worker) const {
  return table_.count_on(worker);
}

}  // namespace strata::router
