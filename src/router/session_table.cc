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
      e.value.rejections_ms, [&](int64_t t) { return now_ms - t < options_.rejection_window_ms; }));
}

SessionBinding SessionTable::binding_of(const Entry& e, int64_t now_ms) const {
  SessionBinding b;
  b.worker = e.worker;
  b.rejections = rejections_in_window(e, now_ms);
  b.migrate = b.rejections >= options_.migrate_after_rejections;
  b.bound_at_ms = e.value.bound_at_ms;
  b.last_used_ms = e.value.last_used_ms;
  return b;
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
  if (auto it = table_.find(session); it != table_.end()) {
    if (it->worker != worker) ++stats_.moves;
    table_.set_worker(it, worker);
    it->value = Binding{.bound_at_ms = now_ms, .last_used_ms = now_ms, .rejections_ms = {}};
    table_.touch(it);
    return {};
  }
  while (table_.size() >= options_.max_sessions) {
    ++stats_.lru_drops;
    table_.erase(table_.oldest());
  }
  table_.insert(session, worker, Binding{.bound_at_ms = now_ms, .last_used_ms = now_ms});
  return {};
}

std::optional<SessionBinding> SessionTable::lookup(std::string_view session, int64_t now_ms) {
  auto it = table_.find(session);
  if (it == table_.end()) return std::nullopt;
  if (expired(*it, now_ms)) {
    ++stats_.expirations;
    table_.erase(it);
    return std::nullopt;
  }
  it->value.last_used_ms = now_ms;
  table_.touch(it);
  return binding_of(*it, now_ms);
}

std::optional<SessionBinding> SessionTable::peek(std::string_view session, int64_t now_ms) const {
  auto it = table_.find(session);
  if (it == table_.end() || expired(*it, now_ms)) return std::nullopt;
  return binding_of(*it, now_ms);
}

bool SessionTable::touch(std::string_view session, int64_t now_ms) {
  return lookup(session, now_ms).has_value();
}

bool SessionTable::record_rejection(std::string_view session, uint32_t worker, int64_t now_ms) {
  auto it = table_.find(session);
  if (it == table_.end()) return false;
  Entry& e = *it;
  if (expired(e, now_ms) || e.worker != worker) return false;
  ++stats_.rejections;
  const int32_t threshold = options_.migrate_after_rejections;
  const bool before = rejections_in_window(e, now_ms) >= threshold;
  // Only the latest `threshold` rejections can matter for a sliding window.
  std::vector<int64_t>& times = e.value.rejections_ms;
  if (static_cast<int32_t>(times.size()) == threshold) times.erase(times.begin());
  times.push_back(now_ms);
  const bool after = rejections_in_window(e, now_ms) >= threshold;
  if (after && !before) ++stats_.migrations;
  return after;
}

bool SessionTable::should_migrate(std::string_view session, int64_t now_ms) const {
  const std::optional<SessionBinding> b = peek(session, now_ms);
  return b.has_value() && b->migrate;
}

bool SessionTable::unbind(std::string_view session) {
  if (!table_.erase(session)) return false;
  ++stats_.unbound;
  return true;
}

int64_t SessionTable::unbind_worker(uint32_t worker) {
  const int64_t n = table_.erase_worker(worker);
  stats_.unbound += static_cast<uint64_t>(n);
  return n;
}

int64_t SessionTable::expire(int64_t now_ms) {
  // Every binding has the same TTL, so the least recently used expires first.
  int64_t n = 0;
  while (!table_.empty() && expired(*table_.oldest(), now_ms)) {
    table_.erase(table_.oldest());
    ++n;
  }
  stats_.expirations += static_cast<uint64_t>(n);
  return n;
}

int64_t SessionTable::sessions_on(uint32_t worker, int64_t now_ms) {
  expire(now_ms);
  return table_.count_on(worker);
}

std::vector<std::pair<uint32_t, int64_t>> SessionTable::sessions_per_worker(int64_t now_ms) {
  expire(now_ms);
  std::vector<std::pair<uint32_t, int64_t>> out(table_.per_worker().begin(),
                                                table_.per_worker().end());
  std::ranges::sort(out);
  return out;
}

}  // namespace strata::router
