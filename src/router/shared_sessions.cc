#include "router/shared_sessions.h"

#include <hiredis/hiredis.h>

#include <vector>

namespace strata::router {

Status validate(const SharedSessionOptions& o) {
  if (o.url.empty()) return {};
  if (auto e = parse_redis_url(o.url); !e) {
    return make_error(ErrorCode::kInvalidArgument, "--session-store: " + e.error().message);
  }
  if (auto s = validate_storage_namespace(o.name_space); !s) {
    return make_error(ErrorCode::kInvalidArgument,
                      "--session-store-namespace: " + s.error().message);
  }
  if (o.timeout_ms < 1) {
    return make_error(ErrorCode::kInvalidArgument, "--session-store-timeout-ms must be >= 1");
  }
  return {};
}

Result<std::unique_ptr<SharedSessions>> SharedSessions::create(const SharedSessionOptions& options,
                                                               int64_t ttl_ms, const Clock& clock) {
  if (auto s = validate(options); !s) return std::unexpected(s.error());
  if (options.url.empty() || ttl_ms < 1) return bad_argument("session store: no URL or TTL");
  RedisEndpoint endpoint = *parse_redis_url(options.url);
  endpoint.timeout_ms = options.timeout_ms;
  std::unique_ptr<SharedSessions> store(new SharedSessions(options, endpoint, ttl_ms, clock));
  Status connected;
  {
    std::lock_guard lock(store->mutex_);
    connected = store->conn_.connect();
  }
  if (connected) {
    STRATA_LOG_INFO("session store: {}", store->describe());
  } else {
    STRATA_LOG_WARN("{}; sessions are bound by this router alone until it answers",
                    connected.error().message);
  }
  return store;
}

SharedSessions::SharedSessions(const SharedSessionOptions& options, RedisEndpoint endpoint,
                               int64_t ttl_ms, const Clock& clock)
    : prefix_("strata:router:" + options.name_space + ":session:"),
      ttl_ms_(std::to_string(ttl_ms)),
      log_throttle_(clock),
      conn_(std::move(endpoint), clock, "session store") {}

std::string SharedSessions::key(std::string_view session) const {
  return prefix_ + std::string(session);
}

std::string SharedSessions::describe() const {
  return "redis " + conn_.where() + " db " + std::to_string(conn_.endpoint().db) + ", keys " +
         prefix_ + "*";
}

SharedSessionStats SharedSessions::stats() const {
  return SharedSessionStats{.lookups = lookups_.load(),
                            .found = found_.load(),
                            .binds = binds_.load(),
                            .races_lost = races_lost_.load(),
                            .errors = errors_.load()};
}

Status SharedSessions::failed(Status s) {
  ++errors_;
  uint64_t suppressed = 0;
  if (log_throttle_.allow(suppressed)) {
    STRATA_LOG_WARN("{} ({} similar failures not logged); routing on this router's own bindings",
                    s.error().message, suppressed);
  }
  return s;
}

Status SharedSessions::pipeline(const std::vector<std::vector<std::string>>& commands,
                                const std::function<bool(size_t, const redisReply&)>& on_reply) {
  std::string bad;
  std::lock_guard lock(mutex_);
  Status s = conn_.ensure_connected();
  if (s) {
    s = conn_.round_trip(
        commands.size(), [&](redisContext* c, size_t i) { redis_append_argv(c, commands[i]); },
        [&](size_t i, const redisReply& r) {
          if (r.type == REDIS_REPLY_ERROR) {
            bad = std::string(redis_reply_text(r));
          } else if (!on_reply(i, r) && bad.empty()) {
            bad = "an unexpected reply to " + commands[i][0];
          }
        });
  }
  if (s && !bad.empty()) s = make_error(ErrorCode::kIoError, "session store: " + bad);
  return s ? s : failed(std::move(s));
}

Result<std::optional<std::string>> SharedSessions::lookup(std::string_view session) {
  std::optional<std::string> url;
  const Status s = pipeline({{"GET", key(session)}, {"PEXPIRE", key(session), ttl_ms_}},
                            [&](size_t i, const redisReply& r) {
                              if (i != 0 || r.type == REDIS_REPLY_NIL) return true;
                              if (r.type != REDIS_REPLY_STRING) return false;  // not a binding
                              url = std::string(redis_reply_text(r));
                              return true;
                            });
  if (!s) return std::unexpected(s.error());
  ++lookups_;
  if (url) ++found_;
  return url;
}

Result<std::string> SharedSessions::bind(std::string_view session, std::string_view worker_url,
                                         bool only_if_absent) {
  std::vector<std::vector<std::string>> commands{
      {"SET", key(session), std::string(worker_url), "PX", ttl_ms_}};
  if (only_if_absent) {
    commands[0].push_back("NX");
    commands.push_back({"GET", key(session)});  // what holds after the SET
  }
  std::optional<std::string> holds;
  const Status s = pipeline(commands, [&](size_t i, const redisReply& r) {
    if (i == 1 && r.type == REDIS_REPLY_STRING) holds = std::string(redis_reply_text(r));
    return true;
  });
  if (!s) return std::unexpected(s.error());
  ++binds_;
  // The binding expired between the two commands (a TTL far shorter than a round trip):
  // ours was written.
  if (!only_if_absent || !holds) return std::string(worker_url);
  if (*holds != worker_url) ++races_lost_;
  return *holds;
}

}  // namespace strata::router
