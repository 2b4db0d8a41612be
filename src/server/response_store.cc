#include "server/response_store.h"

#include <algorithm>

namespace strata {

ResponseStore::ResponseStore(size_t max_responses, size_t max_bytes)
    : max_responses_(max_responses), max_bytes_(max_bytes) {}

size_t ResponseStore::size_of(const StoredResponse& r) {
  using json = nlohmann::json;
  using ojson = nlohmann::ordered_json;
  size_t n = sizeof(StoredResponse) +
             r.response.dump(-1, ' ', false, json::error_handler_t::replace).size() +
             r.history.dump(-1, ' ', false, ojson::error_handler_t::replace).size();
  if (r.instructions) n += r.instructions->size();
  if (r.record) {
    n += r.record->tokens.size() * sizeof(int32_t) + r.record->completion_text.size() +
         r.record->stop_text.size() + r.record->cache_salt.size();
  }
  return n;
}

void ResponseStore::drop_one() {
  auto it = entries_.find(lru_.back());
  bytes_ -= it->second.bytes;
  entries_.erase(it);
  lru_.pop_back();
  ++dropped_;
}

std::shared_ptr<const StoredResponse> ResponseStore::find(const std::string& id) {
  std::lock_guard lock(mutex_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return nullptr;
  lru_.splice(lru_.begin(), lru_, it->second.lru);
  return it->second.response;
}

void ResponseStore::put(const std::string& id, std::shared_ptr<const StoredResponse> response) {
  const size_t bytes = size_of(*response) + id.size();
  if (max_responses_ == 0 || bytes > max_bytes_) return;
  std::lock_guard lock(mutex_);
  if (auto it = entries_.find(id); it != entries_.end()) {
    bytes_ -= it->second.bytes;
    lru_.erase(it->second.lru);
    entries_.erase(it);
  }
  while (!lru_.empty() && (entries_.size() >= max_responses_ || bytes_ + bytes > max_bytes_)) {
    drop_one();
  }
  lru_.push_front(id);
  entries_.emplace(id, Entry{std::move(response), bytes, lru_.begin()});
  bytes_ += bytes;
}

bool ResponseStore::erase(const std::string& id) {
  std::lock_guard lock(mutex_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return false;
  bytes_ -= it->second.bytes;
  lru_.erase(it->second.lru);
  entries_.erase(it);
  return true;
}

ResponseStore::Stats ResponseStore::stats() const {
  std::lock_guard lock(mutex_);
  return Stats{entries_.size(), bytes_, dropped_};
}

ResponseStore::GroupPins ResponseStore::group_pins(const std::string& key) {
  std::lock_guard lock(mutex_);
  auto it = groups_.find(key);
  return it == groups_.end() ? GroupPins{} : it->second;
}

void ResponseStore::set_group_pins(const std::string& key, GroupPins pins) {
  if (max_responses_ == 0) return;
  std::lock_guard lock(mutex_);
  auto [it, added] = groups_.insert_or_assign(key, std::move(pins));
  (void)it;
  if (!added) return;
  group_order_.push_back(key);
  while (groups_.size() > max_responses_) {
    groups_.erase(group_order_.front());
    group_order_.pop_front();
  }
}

}  // namespace strata
