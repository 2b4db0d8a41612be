#include "router/response_table.h"

#include <iterator>

#include "common/check.h"

namespace strata::router {

Status validate(const ResponseTableOptions& o) {
  if (o.max_responses < 1) {
    return make_error(ErrorCode::kInvalidArgument, "--max-response-bindings must be >= 1");
  }
  if (o.max_id_bytes < 1) {
    return make_error(ErrorCode::kInvalidArgument, "router responses: max_id_bytes must be >= 1");
  }
  return {};
}

ResponseTable::ResponseTable(ResponseTableOptions options) : options_(options) {
  const Status ok = validate(options_);
  STRATA_CHECK_MSG(ok.has_value(), ok ? std::string() : ok.error().message);
}

void ResponseTable::drop(List::iterator it) {
  auto count = per_worker_.find(it->worker);
  STRATA_CHECK(count != per_worker_.end() && count->second > 0);
  if (--count->second == 0) per_worker_.erase(count);
  index_.erase(std::string_view(it->id));
  lru_.erase(it);
}

Status ResponseTable::bind(std::string_view id, uint32_t worker) {
  if (id.empty() || id.size() > static_cast<size_t>(options_.max_id_bytes)) {
    return make_error(
        ErrorCode::kInvalidArgument,
        "a response id must be 1 to " + std::to_string(options_.max_id_bytes) + " bytes");
  }
  if (auto found = index_.find(id); found != index_.end()) {
    List::iterator it = found->second;
    if (it->worker != worker) {
      ++stats_.binds;
      auto count = per_worker_.find(it->worker);
      STRATA_CHECK(count != per_worker_.end() && count->second > 0);
      if (--count->second == 0) per_worker_.erase(count);
      ++per_worker_[worker];
      it->worker = worker;
    }
    lru_.splice(lru_.begin(), lru_, it);
    return {};
  }
  ++stats_.binds;
  while (static_cast<int64_t>(lru_.size()) >= options_.max_responses) {
    ++stats_.lru_drops;
    drop(std::prev(lru_.end()));
  }
  lru_.push_front(Entry{std::string(id), worker});
  index_.emplace(std::string_view(lru_.front().id), lru_.begin());
  ++per_worker_[worker];
  return {};
}

std::optional<uint32_t> ResponseTable::lookup(std::string_view id) {
  auto found = index_.find(id);
  if (found == index_.end()) return std::nullopt;
  lru_.splice(lru_.begin(), lru_, found->second);
  return found->second->worker;
}

std::optional<uint32_t> ResponseTable::peek(std::string_view id) const {
  auto found = index_.find(id);
  if (found == index_.end()) return std::nullopt;
  return found->second->worker;
}

bool ResponseTable::erase(std::string_view id) {
  auto found = index_.find(id);
  if (found == index_.end()) return false;
  ++stats_.erased;
  drop(found->second);
  return true;
}

int64_t ResponseTable::unbind_worker(uint32_t worker) {
  int64_t n = 0;
  for (auto it = lru_.begin(); it != lru_.end();) {
    auto next = std::next(it);
    if (it->worker == worker) {
      drop(it);
      ++n;
    }
    it = next;
  }
  stats_.unbound += static_cast<uint64_t>(n);
  return n;
}

int64_t ResponseTable::responses_on(uint32_t worker) const {
  auto it = per_worker_.find(worker);
  return it == per_worker_.end() ? 0 : it->second;
}

}  // namespace strata::router
