#include "router/session_table.h"

#include <algorithm>
#include <utility>

#include "common/check.h"

namespace strata::router {

Status validate(const SessionTableOptions& o) {
  auto invalid = [](const char* what) {
    return make_error(ErrorCode::kInvalidArgument, std::string("router sessions: ") + what);
  };
  if (o.ttl_ms < 1) return invalid("ttl must be >= 1 ms");
  if (o.max_sessions < 1) return invalid("max_sessions must be >= 1");
  if (o.rejection_window_ms < 1) return invalid("rejection window must be >= 1 ms");
  if (o.migrate_after_rejections < 1 || o.migrate_after_rejections > 64) {
    return invalid("migrate_after_rejections not in [1, 64]");
  }
  if (o.max_session_id_bytes < 1) return invalid("max_session_id_bytes must be >= 1");
  return {};
}

SessionTable::SessionTable(SessionTableOptions options) : options_(options) {
  const Status ok = validate(options_);
  STRATA_CHECK_MSG(ok.has_value(), ok ? std::string() : ok.error().message);
}

int32_t SessionTable::rejections_in_window(const Entry& e, int64_t now_ms) const {
  return static_cast<int32_t>(std::ranges::count_if(
      e.rejections_ms, [&](int64_t t) { return now_ms - t < options_.rejection_window_ms; }));
}

SessionBinding SessionTable::binding_of(const Entry& e, int64_t now_ms) const {
  SessionBinding b;
  b.worker = e.worker;
  b.rejections = rejections_in_window(e, now_ms);
  b.migrate = b.rejections >= options_.migrate_after_rejections;
  b.bound_at_ms = e.bound_at_ms;
  b.last_used_ms = e.last_used_ms;
  return b;
}

void SessionTable::decrement(uint32_t worker) {
  auto it = per_worker_.find(worker);
  STRATA_CHECK(it != per_worker_.end() && it->second > 0);
  if (--it->second == 0) per_worker_.erase(it);
}

void SessionTable::erase(List::iterator it) {
  decrement(it->worker);
  index_.erase(std::string_view(it->id));
  lru_.erase(it);
}

Status SessionTable::bind(std::string_view session, uint32_t worker, int64_t now_ms) {
  if (session.empty()) return make_error(ErrorCode::kInvalidArgument, "empty session id");
  if (session.size() > static_cast<size_t>(options_.max_session_id_bytes)) {
    return make_error(
        ErrorCode::kInvalidArgument,
        "session id longer than " + std::to_string(options_.max_session_id_bytes) + " bytes");
  }
  ++stats_.binds;
  expire(now_ms);
  if (auto found = index_.find(session); found != index_.end()) {
    List::iterator it = found->second;
    if (it->worker != worker) {
      ++stats_.moves;
      decrement(it->worker);
      ++per_worker_[worker];
      it->worker = worker;
    }
    it->bound_at_ms = now_ms;
    it->last_used_ms = now_ms;
    it->rejections_ms.clear();
    lru_.splice(lru_.begin(), lru_, it);
    return {};
  }
  while (static_cast<int64_t>(lru_.size()) >= options_.max_sessions) {
    ++stats_.lru_drops;
    erase(std::prev(lru_.end()));
  }
  lru_.push_front(Entry{std::string(session), worker, now_ms, now_ms, {}});
  index_.emplace(std::string_view(lru_.front().id), lru_.begin());
  ++per_worker_[worker];
  return {};
}

std::optional<SessionBinding> SessionTable::lookup(std::string_view session, int64_t now_ms) {
  auto found = index_.find(session);
  if (found == index_.end()) return std::nullopt;
  List::iterator it = found->second;
  if (expired(*it, now_ms)) {
    ++stats_.expirations;
    erase(it);
    return std::nullopt;
  }
  it->last_used_ms = now_ms;
  lru_.splice(lru_.begin(), lru_, it);
  return binding_of(*it, now_ms);
}

std::optional<SessionBinding> SessionTable::peek(std::string_view session, int64_t now_ms) const {
  auto found = index_.find(session);
  if (found == index_.end() || expired(*found->second, now_ms)) return std::nullopt;
  return binding_of(*found->second, now_ms);
}

bool SessionTable::touch(std::string_view session, int64_t now_ms) {
  return lookup(session, now_ms).has_value();
}

bool SessionTable::record_rejection(std::string_view session, uint32_t worker, int64_t now_ms) {
  auto found = index_.find(session);
  if (found == index_.end()) return false;
  Entry& e = *found->second;
  if (expired(e, now_ms) || e.worker != worker) return false;
  ++stats_.rejections;
  const int32_t threshold = options_.migrate_after_rejections;
  const bool before = rejections_in_window(e, now_ms) >= threshold;
  // Only the latest `threshold` rejections can matter for a sliding window.
  if (static_cast<int32_t>(e.rejections_ms.size()) == threshold) {
    e.rejections_ms.erase(e.rejections_ms.begin());
  }
  e.rejections_ms.push_back(now_ms);
  const bool after = rejections_in_window(e, now_ms) >= threshold;
  if (after && !before) ++stats_.migrations;
  return after;
}

bool SessionTable::should_migrate(std::string_view session, int64_t now_ms) const {
  const std::optional<SessionBinding> b = peek(session, now_ms);
  return b.has_value() && b->migrate;
}

bool SessionTable::unbind(std::string_view session) {
  auto found = index_.find(session);
  if (found == index_.end()) return false;
  ++stats_.unbound;
  erase(found->second);
  return true;
}

int64_t SessionTable::unbind_worker(uint32_t worker) {
  int64_t n = 0;
  for (auto it = lru_.begin(); it != lru_.end();) {
    auto next = std::next(it);
    if (it->worker == worker) {
      erase(it);
      ++n;
    }
    it = next;
  }
  stats_.unbound += static_cast<uint64_t>(n);
  return n;
}

int64_t SessionTable::expire(int64_t now_ms) {
  // Every binding has the same TTL, so the least recently used expires first.
  int64_t n = 0;
  while (!lru_.empty() && expired(lru_.back(), now_ms)) {
    erase(std::prev(lru_.end()));
    ++n;
  }
  stats_.expirations += static_cast<uint64_t>(n);
  return n;
}

int64_t SessionTable::sessions_on(uint32_t worker, int64_t now_ms) {
  expire(now_ms);
  auto it = per_worker_.find(worker);
  return it == per_worker_.end() ? 0 : it->second;
}

std::vector<std::pair<uint32_t, int64_t>> SessionTable::sessions_per_worker(int64_t now_ms) {
  expire(now_ms);
  std::vector<std::pair<uint32_t, int64_t>> out(per_worker_.begin(), per_worker_.end());
  std::ranges::sort(out);
  return out;
}

}  // namespace strata::router
