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

std::string_view tool_session_state_name(ToolSessionState state) {
  switch (state) {
    case ToolSessionState::kRunnable:
      return "RUNNABLE";
    case ToolSessionState::kOffloading:
      return "OFFLOADING";
    case ToolSessionState::kOffloaded:
      return "OFFLOADED";
    case ToolSessionState::kRestoring:
      return "RESTORING";
  }
  return "RUNNABLE";
}

ToolSessions::ToolSessions(RadixTree& tree, const Clock& clock, int64_t ttl_ms,
                           int64_t max_idle_records, int64_t idle_ttl_ms, int64_t resume_hold_ms)
    : tree_(tree),
      clock_(clock),
      ttl_ms_(ttl_ms),
      max_idle_records_(max_idle_records),
      idle_ttl_ms_(idle_ttl_ms),
      resume_hold_ms_(resume_hold_ms) {}

ToolSessions::Session& ToolSessions::touch(const std::string& id) {
  auto [it, fresh] = sessions_.try_emplace(id);
  Session& s = it->second;
  if (fresh) {
    s.id = id;
    lru_.push_front(id);
    s.lru = lru_.begin();
  } else {
    lru_.splice(lru_.begin(), lru_, s.lru);
  }
  s.used_ms = clock_.now_ms();
  return s;
}

bool ToolSessions::droppable(const Session& s) {
  return s.state == ToolSessionState::kRunnable && s.running == 0 && !s.protected_ &&
         !s.restore_lock.valid();
}

void ToolSessions::trim() {
  const int64_t now = clock_.now_ms();
  // Walk from the least recently used end; a record in use goes to the front. Each record
  // is looked at once at most.
  for (size_t looked = 0, n = lru_.size(); looked < n && !lru_.empty(); ++looked) {
    Session& s = sessions_.at(lru_.back());
    const bool over = static_cast<int64_t>(sessions_.size()) > max_idle_records_;
    if (!over && now - s.used_ms < idle_ttl_ms_) break;
    if (!droppable(s)) {
      lru_.splice(lru_.begin(), lru_, s.lru);
      continue;
    }
    lru_.pop_back();
    sessions_.erase(s.id);
    ++dropped_total_;
  }
}

std::array<int64_t, 4> ToolSessions::count_by_state() const {
  std::array<int64_t, 4> out{};
  for (const std::string& id : not_runnable_) {
    const auto it = sessions_.find(id);
    if (it != sessions_.end()) ++out[static_cast<size_t>(it->second.state)];
  }
  out[static_cast<size_t>(ToolSessionState::kRunnable)] =
      static_cast<int64_t>(sessions_.size()) - out[1] - out[2] - out[3];
  return out;
}

void ToolSessions::set_state(Session& s, ToolSessionState state) {
  if (state == ToolSessionState::kRunnable) {
    not_runnable_.erase(s.id);
  } else {
    not_runnable_.insert(s.id);
  }
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

void ToolSessions::drop_hold(Session& s) {
  if (s.state == ToolSessionState::kRunnable && s.restore_lock.valid()) {
    STRATA_CHECK(tree_.release(s.restore_lock).has_value());
    s.restore_lock = LockReceipt{};
  }
  held_.erase(s.id);
}

bool ToolSessions::holds_device() const {
  if (!held_.empty()) return true;
  for (const std::string& id : not_runnable_) {
    if (sessions_.at(id).restore_lock.valid()) return true;
  }
  return false;
}

void ToolSessions::settle_restore(Session& s) {
  if (s.state != ToolSessionState::kRestoring) return;
  if (!path_all(s, true)) {
    if (path_loading(s)) return;  // the restore's copies are still in flight
    // A copy of the restore failed (its device pages went back, the host copy stays): as for
    // a restore refused at tool_end (caveat 1), the host copy is no longer protected and the
    // session is OFFLOADED again, same epoch, so that a later tool_end or the next request
    // recovers it.
    STRATA_LOG_WARN("tool session '{}': its restore's copy failed; it is offloaded again", s.id);
    release(s);
    set_state(s, ToolSessionState::kOffloaded);
    return;
  }
  // Restored: the host copy is no longer protected, but the device copy stays locked
  // until the session's next request arrives (at most resume_hold_ms), so that other
  // traffic cannot evict what the agent is about to use.
  const LockReceipt hold = s.restore_lock;
  s.restore_lock = LockReceipt{};
  release(s);
  s.restore_lock = hold;
  s.hold_until_ms = clock_.now_ms() + resume_hold_ms_;
  held_.insert(s.id);
  set_state(s, ToolSessionState::kRunnable);
}

bool ToolSessions::on_request_arrived(const std::string& id) {
  Session& s = touch(id);
  ++s.running;
  bool resumes = s.resume_pending || s.state == ToolSessionState::kRestoring;
  s.resume_pending = false;
  // The restored KV was held on the device for this request: it locks its own prefix
  // when admitted (first, as a kResume request).
  drop_hold(s);
  if (s.state == ToolSessionState::kOffloading || s.state == ToolSessionState::kOffloaded) {
    // The agent came back without tool_end: its request loads the KV like any hit.
    release(s);
    set_state(s, ToolSessionState::kRunnable);
    resumes = true;
  }
  return resumes;
}

void ToolSessions::on_request_finished(const std::string& id, std::span<const int32_t> tokens,
                                       const std::string& cache_salt) {
  Session& s = touch(id);
  if (s.running > 0) --s.running;
  if (s.state != ToolSessionState::kRunnable) return;  // restoring: keep what is protected
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

bool ToolSessions::path_loading(const Session& s) const {
  const RadixNode* node = tree_.node_of(s.last_hash);
  for (const RadixNode* n = node; n != nullptr && n != tree_.root(); n = n->parent) {
    if (n->loading) return true;
  }
  return false;
}

std::string ToolSessions::tier_of(const Session& s) const {
  if (!s.has_kv || tree_.node_of(s.last_hash) == nullptr) return "none";
  if (path_all(s, true)) return "device";
  return "host";
}

ToolSessionView ToolSessions::view(const Session& s) const {
  return ToolSessionView{s.state, tier_of(s), s.epoch, s.tokens, s.since_ms, 0};
}

Result<ToolSessionView> ToolSessions::tool_start(const std::string& id) {
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return std::unexpected(not_found(id));
  Session& s = it->second;
  if (!tree_.hierarchical()) {
    return make_error(ErrorCode::kNoHostTier,
                      "tool sessions need the host tier: start the server with "
                      "--enable-hierarchical-cache");
  }
  if (s.state != ToolSessionState::kRunnable) {
    return make_error(ErrorCode::kFailedPrecondition,
                      "session '" + id + "' is already " +
                          std::string(tool_session_state_name(s.state)) + " (epoch " +
                          std::to_string(s.epoch) + "): tool_end first");
  }
  if (s.running > 0) {
    return make_error(ErrorCode::kBusy, "a request of session '" + id + "' is still running");
  }
  drop_hold(s);
  int64_t moved = 0;
  RadixNode* node = s.has_kv ? tree_.node_ending_at(s.last_hash) : nullptr;
  if (node != nullptr) {
    tree_.protect_host(node, +1);
    s.protected_ = true;
    tree_.offload_path(node);
    moved = s.tokens;
  }
  ++s.epoch;
  set_state(s, ToolSessionState::kOffloading);
  if (node == nullptr || path_all(s, false)) {
    // Nothing to copy (no KV left, or every block has its host copy already).
    set_state(s, ToolSessionState::kOffloaded);
  }
  ToolSessionView v = view(s);
  v.moved_tokens = moved;
  return v;
}

Result<ToolSessionView> ToolSessions::tool_end(const std::string& id, uint64_t epoch) {
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return std::unexpected(not_found(id));
  Session& s = it->second;
  if (s.state == ToolSessionState::kRunnable || s.state == ToolSessionState::kRestoring) {
    return make_error(ErrorCode::kFailedPrecondition,
                      "session '" + id + "' is " + std::string(tool_session_state_name(s.state)) +
                          ": tool_end needs a tool_start first");
  }
  if (epoch != s.epoch) {
    return make_error(ErrorCode::kStaleEpoch, "stale epoch " + std::to_string(epoch) +
                                                  " for session '" + id + "' (current " +
                                                  std::to_string(s.epoch) + ")");
  }
  if (!s.has_kv || tree_.node_of(s.last_hash) == nullptr) {
    release(s);
    set_state(s, ToolSessionState::kRunnable);
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
      set_state(s, ToolSessionState::kOffloaded);
      return make_error(ErrorCode::kOutOfPages,
                        "restore of session '" + id + "' failed: " + st.error().message +
                            "; its host copy is no longer protected (retry tool_end, or send "
                            "the next request)");
    }
    s.restore_lock = hold;
    set_state(s, ToolSessionState::kRestoring);
  } else {
    release(s);
    set_state(s, ToolSessionState::kRunnable);
  }
  s.resume_pending = true;
  ToolSessionView v = view(s);
  v.moved_tokens = restored;
  return v;
}

Result<ToolSessionView> ToolSessions::kv_meta(const std::string& id) const {
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return std::unexpected(not_found(id));
  return view(it->second);
}

int32_t ToolSessions::tick() {
  int32_t expired = 0;
  const int64_t now = clock_.now_ms();
  // Only sessions in a transitional or offloaded state have anything to advance.
  const std::vector<std::string> held(held_.begin(), held_.end());
  for (const std::string& id : held) {
    Session& s = sessions_.at(id);
    if (now >= s.hold_until_ms) drop_hold(s);
  }
  const std::vector<std::string> ids(not_runnable_.begin(), not_runnable_.end());
  for (const std::string& id : ids) {
    Session& s = sessions_.at(id);
    if (s.state == ToolSessionState::kOffloading && path_all(s, false)) {
      set_state(s, ToolSessionState::kOffloaded);
    } else {
      settle_restore(s);
    }
    if ((s.state == ToolSessionState::kOffloading || s.state == ToolSessionState::kOffloaded) &&
        now - s.changed_ms >= ttl_ms_) {
      if (s.protected_) {
        STRATA_LOG_WARN("tool session '{}' got no tool_end for {} s: its host copy is released", id,
                        ttl_ms_ / 1000);
        ++expired;
      }
      release(s);
      set_state(s, ToolSessionState::kRunnable);
    }
  }
  trim();
  return expired;
}

}  // namespace strata
