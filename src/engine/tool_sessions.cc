#include "engine/tool_sessions.h"

#include <chrono>

#include "common/check.h"
#include "common/log.h"

namespace strata {
namespace {

int64_t wall_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

Error not_found(const std::string& id) {
  return Error{ErrorCode::kNotFound, "unknown session '" + id + "'"};
}

}  // namespace

std::string_view session_state_name(SessionState state) {
  switch (state) {
    case SessionState::kRunnable:
      return "RUNNABLE";
    case SessionState::kOffloading:
      return "OFFLOADING";
    case SessionState::kOffloaded:
      return "OFFLOADED";
    case SessionState::kRestoring:
      return "RESTORING";
  }
  return "RUNNABLE";
}

ToolSessions::ToolSessions(RadixTree& tree, const Clock& clock, int64_t ttl_ms)
    : tree_(tree), clock_(clock), ttl_ms_(ttl_ms) {}

void ToolSessions::set_state(Session& s, SessionState state) {
  s.state = state;
  s.since_ms = wall_ms();
  s.changed_ms = clock_.now_ms();
}

void ToolSessions::release(Session& s) {
  if (s.restore_lock.valid()) {
    STRATA_CHECK(tree_.release(s.restore_lock).has_value());
    s.restore_lock = LockReceipt{};
  }
  if (s.protected_) {
    // The node ending at last_hash carries the protection (splits keep it the deepest).
    RadixNode* node = tree_.node_of(s.last_hash);
    STRATA_CHECK_MSG(node != nullptr && node->hashes.back() == s.last_hash,
                     "a protected session's block left the tree or moved");
    tree_.protect_host(node, -1);
    s.protected_ = false;
  }
}

void ToolSessions::on_request_arrived(const std::string& id) {
  Session& s = sessions_[id];
  ++s.running;
  if (s.state == SessionState::kOffloading || s.state == SessionState::kOffloaded) {
    // The agent came back without tool_end: its request loads the KV like any hit.
    release(s);
    set_state(s, SessionState::kRunnable);
  }
}

void ToolSessions::on_request_finished(const std::string& id, std::span<const int32_t> tokens,
                                       const std::string& cache_salt) {
  Session& s = sessions_[id];
  if (s.running > 0) --s.running;
  if (s.state != SessionState::kRunnable) return;  // restoring: keep what is protected
  const size_t ps = static_cast<size_t>(tree_.page_size());
  const size_t full = tokens.size() / ps * ps;
  if (full == 0) return;  // nothing cached (cancelled early): keep what the session had
  s.token_ids.assign(tokens.begin(), tokens.begin() + static_cast<std::ptrdiff_t>(full));
  s.tokens = static_cast<int64_t>(full);
  s.salt = cache_salt;
  s.has_kv = full > 0;
  if (s.has_kv) s.last_hash = tree_.block_hashes_of(s.token_ids, s.salt).back();
}

bool ToolSessions::path_all(const Session& s, bool on_device) const {
  const RadixNode* node = tree_.node_of(s.last_hash);
  if (node == nullptr) return false;
  for (const RadixNode* n = node; n != tree_.root(); n = n->parent) {
    if (on_device ? !n->on_device() : !n->on_host()) return false;
  }
  return true;
}

std::string ToolSessions::tier_of(const Session& s) const {
  if (!s.has_kv || tree_.node_of(s.last_hash) == nullptr) return "none";
  if (path_all(s, true)) return "device";
  return "host";
}

SessionView ToolSessions::view(const Session& s) const {
  return SessionView{s.state, tier_of(s), s.epoch, s.tokens, s.since_ms, 0};
}

Result<SessionView> ToolSessions::tool_start(const std::string& id) {
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return std::unexpected(not_found(id));
  Session& s = it->second;
  if (!tree_.hierarchical()) {
    return make_error(ErrorCode::kFailedPrecondition,
                      "tool sessions need the host tier: start the server with "
                      "--enable-hierarchical-cache");
  }
  if (s.state != SessionState::kRunnable) {
    return make_error(ErrorCode::kFailedPrecondition, "session '" + id + "' is already " +
                                                          std::string(session_state_name(s.state)) +
                                                          " (epoch " + std::to_string(s.epoch) +
                                                          "): tool_end first");
  }
  if (s.running > 0) {
    return make_error(ErrorCode::kFailedPrecondition,
                      "a request of session '" + id + "' is still running");
  }
  int64_t moved = 0;
  RadixNode* node = s.has_kv ? tree_.node_ending_at(s.last_hash) : nullptr;
  if (node != nullptr) {
    tree_.protect_host(node, +1);
    s.protected_ = true;
    tree_.offload_path(node);
    moved = s.tokens;
  }
  ++s.epoch;
  set_state(s, SessionState::kOffloading);
  if (node == nullptr || path_all(s, false)) {
    // Nothing to copy (no KV left, or every block has its host copy already).
    set_state(s, SessionState::kOffloaded);
  }
  SessionView v = view(s);
  v.moved_tokens = moved;
  return v;
}

Result<SessionView> ToolSessions::tool_end(const std::string& id, uint64_t epoch) {
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return std::unexpected(not_found(id));
  Session& s = it->second;
  if (s.state == SessionState::kRunnable || s.state == SessionState::kRestoring) {
    return make_error(ErrorCode::kFailedPrecondition, "session '" + id + "' is " +
                                                          std::string(session_state_name(s.state)) +
                                                          ": tool_end needs a tool_start first");
  }
  if (epoch != s.epoch) {
    return make_error(ErrorCode::kFailedPrecondition, "stale epoch " + std::to_string(epoch) +
                                                          " for session '" + id + "' (current " +
                                                          std::to_string(s.epoch) + ")");
  }
  if (!s.has_kv || tree_.node_of(s.last_hash) == nullptr) {
    release(s);
    set_state(s, SessionState::kRunnable);
    return view(s);
  }
  // Match the session's tokens: the device part stays, the host part loads back. The
  // match also cancels demotions still waiting for their backups.
  MatchResult m = tree_.match_prefix(s.token_ids, s.salt);
  int64_t restored = static_cast<int64_t>(m.num_pages + m.host_num_pages) * tree_.page_size();
  if (m.host_num_pages > 0) {
    const LockReceipt hold = tree_.lock(m.host_last_node);
    if (Status st = tree_.load_back(m); !st) {
      // Caveat 1: a failed restore never keeps the host copy protected; the session stays
      // OFFLOADED (same epoch) so that a later tool_end or the next request recovers it.
      STRATA_CHECK(tree_.release(hold).has_value());
      release(s);
      set_state(s, SessionState::kOffloaded);
      return make_error(ErrorCode::kOutOfPages,
                        "restore of session '" + id + "' failed: " + st.error().message +
                            "; its host copy is no longer protected (retry tool_end, or send "
                            "the next request)");
    }
    s.restore_lock = hold;
    set_state(s, SessionState::kRestoring);
  } else {
    release(s);
    set_state(s, SessionState::kRunnable);
  }
  SessionView v = view(s);
  v.moved_tokens = restored;
  return v;
}

Result<SessionView> ToolSessions::kv_meta(const std::string& id) const {
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return std::unexpected(not_found(id));
  return view(it->second);
}

int32_t ToolSessions::tick() {
  int32_t expired = 0;
  const int64_t now = clock_.now_ms();
  for (auto& [id, s] : sessions_) {
    if (s.state == SessionState::kOffloading && path_all(s, false)) {
      set_state(s, SessionState::kOffloaded);
    } else if (s.state == SessionState::kRestoring && path_all(s, true)) {
      release(s);
      set_state(s, SessionState::kRunnable);
    }
    if ((s.state == SessionState::kOffloading || s.state == SessionState::kOffloaded) &&
        now - s.changed_ms >= ttl_ms_) {
      if (s.protected_) {
        STRATA_LOG_WARN("tool session '{}' got no tool_end for {} s: its host copy is released", id,
                        ttl_ms_ / 1000);
        ++expired;
      }
      release(s);
      set_state(s, SessionState::kRunnable);
    }
  }
  expired_total_ += static_cast<uint64_t>(expired);
  return expired;
}

int64_t ToolSessions::protected_count() const {
  int64_t n = 0;
  for (const auto& [id, s] : sessions_) n += s.protected_ ? 1 : 0;
  return n;
}

}  // namespace strata
