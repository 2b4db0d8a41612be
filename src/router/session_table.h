// Sticky session bindings: session id -> worker (docs/router.md, issue 13).
//
// Contract. A plain data structure: no clock (every call that looks at time takes now_ms,
// the router's monotonic milliseconds), no lock (the router calls it under its own lock,
// from one thread at a time), no I/O.
//
// Lifetime of a binding. bind() makes or moves one. Each request of the session (lookup())
// and each tool pause or resume call (touch()) refreshes it; a binding not refreshed for
// ttl_ms expires, so it survives tool pauses shorter than the TTL (default 10 min). At
// most max_sessions bindings are held: binding one more drops the least recently used
// (counted in stats().lru_drops: the metric when the bound bites). unbind_worker() drops
// every binding of a worker that is removed or drained.
//
// Sessions per worker. sessions_on(worker) is the number of live bindings on the worker:
// the `sessions_assigned` input of the cost's load-floor bonus. It decays by itself as
// sessions end (their bindings expire) rather than counting every session ever sent.
//
// Migration. record_rejection() counts a worker's 429/503 answers to a session in a
// sliding window (rejection_window_ms, default 30 s); only rejections by the session's
// own worker count. When migrate_after_rejections of them (default 2) fall within the
// window, the binding is marked to migrate: lookup() reports `migrate`, the router then
// scores the request as not sticky (no sticky bonus, load-floor bonus on) so a saturated
// worker loses the session, and bind()s the session to the worker chosen. One rejection
// alone moves only that request (the router retries it elsewhere), never the session.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"
#include "router/worker_lru.h"

namespace strata::router {

struct SessionTableOptions {
  int64_t ttl_ms = 600'000;              // --session-ttl-s: idle binding lifetime, >= 1 ms
  int64_t max_sessions = 100'000;        // --max-sessions: bindings held, >= 1
  int64_t rejection_window_ms = 30'000;  // sliding window of rejections, >= 1 ms
  int32_t migrate_after_rejections = 2;  // rejections in the window that move, in [1, 64]
  int32_t max_session_id_bytes = 256;    // longer ids are refused, >= 1
};

Status validate(const SessionTableOptions& options);

struct SessionBinding {
  uint32_t worker = 0;
  bool migrate = false;      // enough recent rejections: score the request as not sticky
  int32_t rejections = 0;    // by the bound worker within the window
  int64_t bound_at_ms = 0;   // when bind() last set the worker
  int64_t last_used_ms = 0;  // the last bind, lookup or touch
};

struct SessionTableStats {
  uint64_t binds = 0;        // bindings made or moved
  uint64_t moves = 0;        // of them, to another worker than the previous one
  uint64_t lru_drops = 0;    // bindings dropped for max_sessions
  uint64_t expirations = 0;  // bindings dropped for ttl_ms
  uint64_t unbound = 0;      // bindings dropped by unbind_worker / unbind
  uint64_t rejections = 0;   // counted rejections
  uint64_t migrations = 0;   // bindings that reached the threshold
};

class SessionTable {
 public:
  explicit SessionTable(SessionTableOptions options = {});

  // Binds `session` to `worker` (made, refreshed, or moved; a move or a rebind clears the
  // rejections). kInvalidArgument: an empty or too long id.
  Status bind(std::string_view session, uint32_t worker, int64_t now_ms);

  // The session's live binding, refreshed (a request of the session arrived). nullopt: no
  // binding, or it expired (then dropped).
  std::optional<SessionBinding> lookup(std::string_view session, int64_t now_ms);
  // The same without refreshing it (listings, the dashboard).
  std::optional<SessionBinding> peek(std::string_view session, int64_t now_ms) const;
  // Refreshes a live binding (a tool pause or resume call); false: none.
  bool touch(std::string_view session, int64_t now_ms);

  // A 429 or 503 from `worker` to a request of `session`. Counted only when the session is
  // bound to `worker`. Returns whether the binding should migrate now.
  bool record_rejection(std::string_view session, uint32_t worker, int64_t now_ms);
  bool should_migrate(std::string_view session, int64_t now_ms) const;

  bool unbind(std::string_view session);
  // Drops every binding to `worker`; returns how many.
  int64_t unbind_worker(uint32_t worker);

  // Drops expired bindings; returns how many. Cheap: O(expired).
  int64_t expire(int64_t now_ms);
  // Live bindings on `worker` (expire(now_ms) first).
  int64_t sessions_on(uint32_t worker, int64_t now_ms);
  // Live bindings per worker, every worker with at least one (expire(now_ms) first).
  std::vector<std::pair<uint32_t, int64_t>> sessions_per_worker(int64_t now_ms);

  int64_t size() const { return table_.size(); }
  const SessionTableStats& stats() const { return stats_; }
  const SessionTableOptions& options() const { return options_; }

 private:
  struct Binding {
    int64_t bound_at_ms = 0;
    int64_t last_used_ms = 0;
    // The latest rejections by the bound worker, oldest first, at most
    // migrate_after_rejections of them.
    std::vector<int64_t> rejections_ms;
  };
  using Table = WorkerLru<Binding>;
  using Entry = Table::Entry;

  bool expired(const Entry& e, int64_t now_ms) const {
    return now_ms - e.value.last_used_ms >= options_.ttl_ms;
  }
  int32_t rejections_in_window(const Entry& e, int64_t now_ms) const;
  SessionBinding binding_of(const Entry& e, int64_t now_ms) const;

  SessionTableOptions options_;
  Table table_;
  SessionTableStats stats_;
};

}  // namespace strata::router
