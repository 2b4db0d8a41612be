// Session bindings shared by router replicas through Redis (docs/router.md, "Router
// replicas"; issue 33).
//
// Two or more `strata route` in front of the same workers each index every worker's
// events, so any of them can score a request; what one replica alone cannot know is where
// another sent a session's earlier turns. With --session-store redis://..., each binding
// is also written to Redis under "strata:router:<namespace>:session:<session id>" as the
// worker's URL (the identity every replica shares: worker ids are each replica's own),
// with the binding TTL (--session-binding-ttl-s) refreshed by every turn and tool call that
// reads it. Each replica keeps its own SessionTable as before (the load-floor counts, the
// rejection window); the store decides where a session is bound.
//
// Contract. lookup() reads a binding and refreshes its TTL (GET + PEXPIRE, one round trip).
// bind() writes one: `only_if_absent` (a session's first binding) is SET NX, so when two
// replicas bind a new session at once one wins and both then follow the winner (the
// answer is the binding that holds); otherwise SET (a move, a migration, or a binding that
// named a worker this replica does not know). A call that fails (no server, a timeout, an
// error reply) returns kIoError: the router then routes on its own table alone, as a
// single router does, and counts it (stats().errors, the router's metrics). Reconnects
// back off (RedisConnection). Redis holds no pins or tokens here, only session -> URL.
//
// Threading. Thread-safe (one connection, calls take turns); calls block for at most
// about the timeout, so the router makes them off its I/O threads (Exchange::offload).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/clock.h"
#include "common/log.h"
#include "common/result.h"
#include "storage/redis_connection.h"
#include "storage/storage_backend.h"

namespace strata::router {

struct SharedSessionOptions {
  std::string url;                     // --session-store: "redis://host:port[/db]"; "": none
  std::string name_space = "default";  // --session-store-namespace: [A-Za-z0-9._-], 1..128
  int64_t timeout_ms = 100;            // --session-store-timeout-ms: per round trip, >= 1
};

// kInvalidArgument naming the option (a bad URL, namespace or timeout).
Status validate(const SharedSessionOptions& options);

struct SharedSessionStats {
  uint64_t lookups = 0;     // lookup() answered
  uint64_t found = 0;       // ... with a binding
  uint64_t binds = 0;       // bind() answered
  uint64_t races_lost = 0;  // ... only_if_absent, and another replica had bound it first
  uint64_t errors = 0;      // calls that failed (the router went on without the store)
};

class SharedSessions {
 public:
  // Connects once; an unreachable server is logged, not an error (calls fail until it
  // answers). `ttl_ms` is the binding lifetime; `clock` must outlive the store.
  static Result<std::unique_ptr<SharedSessions>> create(const SharedSessionOptions& options,
                                                        int64_t ttl_ms, const Clock& clock);

  // The worker URL `session` is bound to, its TTL refreshed; nullopt: none.
  Result<std::optional<std::string>> lookup(std::string_view session);
  // Binds `session` to `worker_url` (see the contract); the URL bound after the call.
  Result<std::string> bind(std::string_view session, std::string_view worker_url,
                           bool only_if_absent);

  std::string key(std::string_view session) const;  // "strata:router:<ns>:session:<id>"
  SharedSessionStats stats() const;
  std::string describe() const;  // "redis host:port db N, keys strata:router:<ns>:session:*"

 private:
  SharedSessions(const SharedSessionOptions& options, RedisEndpoint endpoint, int64_t ttl_ms,
                 const Clock& clock);
  Status failed(Status s);  // counts and logs (throttled) a failed call
  // Sends `commands` in one round trip; `on_reply` sees each reply that is not an error and
  // returns false for one it cannot take. An error reply, such a reply or a failed round
  // trip is a kIoError, counted and logged (failed()).
  Status pipeline(const std::vector<std::vector<std::string>>& commands,
                  const std::function<bool(size_t, const redisReply&)>& on_reply);

  const std::string prefix_;  // "strata:router:<ns>:session:"
  const std::string ttl_ms_;  // PX argument
  LogThrottle log_throttle_;
  std::mutex mutex_;      // one call at a time on the connection
  RedisConnection conn_;  // GUARDED_BY(mutex_)
  std::atomic<uint64_t> lookups_{0}, found_{0}, binds_{0}, races_lost_{0}, errors_{0};
};

}  // namespace strata::router
