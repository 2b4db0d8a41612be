#include "router/response_table.h"

#include "common/check.h"

namespace strata::router {

Status validate(const ResponseTableOptions& o) {
  if (o.max_responses < 1) {
    return make_error(ErrorCode::kInvalidArgument, "--max-response-bindings must be >= 1");
  }
  if (o.max_id_bytes < 1) {
    return make_error(ErrorCode::kInvalidArgument, "router responses: max_id_bytes must be >= 1");
  }
  if (o.miss_ttl_ms < 0) {
    return make_error(ErrorCode::kInvalidArgument, "--response-miss-ttl-ms must be >= 0");
  }
  return {};
}

ResponseTable::ResponseTable(ResponseTableOptions options) : options_(options) {
  const Status ok = validate(options_);
  STRATA_CHECK_MSG(ok.has_value(), ok ? std::string() : ok.error().message);
}

Status ResponseTable::bind(std::string_view id, uint32_t worker) {
  if (id.empty() || id.size() > static_cast<size_t>(options_.max_id_bytes)) {
    return make_error(
        ErrorCode::kInvalidArgument,
        "a response id must be 1 to " + std::to_string(options_.max_id_bytes) + " bytes");
  }
  if (!misses_.empty()) {  // the response exists: no longer missing
    if (auto miss = misses_.find(absl::string_view(id.data(), id.size())); miss != misses_.end()) {
      misses_.erase(miss);
    }
  }
  if (auto it = table_.find(id); it != table_.end()) {
    if (it->worker != worker) ++stats_.binds;
    table_.set_worker(it, worker);
    table_.touch(it);
    return {};
  }
  ++stats_.binds;
  while (table_.size() >= options_.max_responses) {
    ++stats_.lru_drops;
    table_.erase(table_.oldest());
  }
  table_.insert(id, worker, None{});
  return {};
}

std::optional<uint32_t> ResponseTable::lookup(std::string_view id) {
  auto it = table_.find(id);
  if (it == table_.end()) return std::nullopt;
  table_.touch(it);
  return it->worker;
}

std::optional<uint32_t> ResponseTable::peek(std::string_view id) const {
  auto it = table_.find(id);
  if (it == table_.end()) return std::nullopt;
  return it->worker;
}

bool ResponseTable::erase(std::string_view id) {
  if (!table_.erase(id)) return false;
  ++stats_.erased;
  return true;
}

int64_t ResponseTable::unbind_worker(uint32_t worker) {
  const int64_t n = table_.erase_worker(worker);
  stats_.unbound += static_cast<uint64_t>(n);
  return n;
}

void ResponseTable::remember_missing(std::string_view id, int64_t now_ms) {
  if (options_.miss_ttl_ms == 0 || id.empty() ||
      id.size() > static_cast<size_t>(options_.max_id_bytes)) {
    return;
  }
  // Drop what ran out (a prefix of the order) and, past the bound, the oldest.
  while (!miss_order_.empty() &&
         (miss_order_.front().first <= now_ms || miss_order_.size() >= kMaxMisses)) {
    auto& [until, old] = miss_order_.front();
    if (auto it = misses_.find(old); it != misses_.end() && it->second == until) misses_.erase(it);
    miss_order_.pop_front();
  }
  const int64_t until = now_ms + options_.miss_ttl_ms;
  misses_.insert_or_assign(std::string(id), until);
  miss_order_.emplace_back(until, std::string(id));
  ++stats_.misses_remembered;
}

bool ResponseTable::known_missing(std::string_view id, int64_t now_ms) {
  if (misses_.empty()) return false;
  auto it = misses_.find(absl::string_view(id.data(), id.size()));
  if (it == misses_.end()) return false;
  if (it->second <= now_ms) {
    misses_.erase(it);
    return false;
  }
  ++stats_.miss_hits;
  return true;
}

int64_t ResponseTable::responses_on(uint32_t worker) const {
  return table_.count_on(worker);
}

}  // namespace strata::router
