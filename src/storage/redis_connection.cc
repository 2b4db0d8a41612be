#include "storage/redis_connection.h"

#include <hiredis/hiredis.h>
#include <signal.h>
#include <sys/time.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <memory>
#include <optional>
#include <vector>

#include "common/check.h"

namespace strata {

namespace {

timeval to_timeval(int64_t ms) {
  return timeval{static_cast<time_t>(ms / 1000), static_cast<suseconds_t>((ms % 1000) * 1000)};
}

struct ReplyDeleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using ReplyPtr = std::unique_ptr<redisReply, ReplyDeleter>;

// Blocks SIGPIPE in this thread for its scope and swallows one raised meanwhile, so that
// writing to a server that went away fails with EPIPE instead of killing the process.
class SigpipeGuard {
 public:
  SigpipeGuard() {
    sigemptyset(&pipe_set_);
    sigaddset(&pipe_set_, SIGPIPE);
    sigset_t pending;
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &pipe_set_, &old_mask_);
  }
  ~SigpipeGuard() {
    if (!was_pending_) {
      sigset_t pending;
      sigpending(&pending);
      if (sigismember(&pending, SIGPIPE) == 1) {
        const timespec no_wait{0, 0};
        while (sigtimedwait(&pipe_set_, nullptr, &no_wait) < 0 && errno == EINTR) {
        }
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_mask_, nullptr);
  }
  SigpipeGuard(const SigpipeGuard&) = delete;
  SigpipeGuard& operator=(const SigpipeGuard&) = delete;

 private:
  sigset_t pipe_set_;
  sigset_t old_mask_;
  bool was_pending_ = false;
};

std::optional<int> parse_int(std::string_view s) {
  int v = 0;
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || s.empty()) return std::nullopt;
  return v;
}

}  // namespace

Status validate(const RedisEndpoint& e, std::string_view who) {
  if (e.host.empty() || e.port < 1 || e.port > 65535 || e.db < 0 || e.timeout_ms < 1) {
    return make_error(
        ErrorCode::kInvalidArgument,
        std::string(who) + ": need a host, a port in [1, 65535], db >= 0 and timeout_ms >= 1");
  }
  return {};
}

Result<RedisEndpoint> parse_redis_url(std::string_view url) {
  constexpr std::string_view kScheme = "redis://";
  auto bad = [&](const std::string& why) -> Result<RedisEndpoint> {
    std::string message = "'";  // appended (g++ 12 warns falsely on a chain of +)
    message.append(url).append("' is not a Redis URL (").append(why);
    message.append("; expected redis://[:password@]host[:port][/db])");
    return make_error(ErrorCode::kInvalidArgument, message);
  };
  if (!url.starts_with(kScheme)) return bad("it must start with redis://");
  std::string_view rest = url.substr(kScheme.size());
  RedisEndpoint e;
  if (const size_t at = rest.rfind('@'); at != std::string_view::npos) {
    const std::string_view auth = rest.substr(0, at);
    const size_t colon = auth.find(':');
    e.password = std::string(colon == std::string_view::npos ? auth : auth.substr(colon + 1));
    rest = rest.substr(at + 1);
  }
  if (const size_t slash = rest.find('/'); slash != std::string_view::npos) {
    const std::string_view db = rest.substr(slash + 1);
    if (!db.empty()) {
      const auto n = parse_int(db);
      if (!n || *n < 0) return bad("the database must be a number >= 0");
      e.db = *n;
    }
    rest = rest.substr(0, slash);
  }
  if (const size_t colon = rest.rfind(':');
      colon != std::string_view::npos && rest.find(']') == std::string_view::npos) {
    const auto n = parse_int(rest.substr(colon + 1));
    if (!n || *n < 1 || *n > 65535) return bad("the port must be in [1, 65535]");
    e.port = *n;
    rest = rest.substr(0, colon);
  }
  if (rest.empty()) return bad("no host");
  e.host = std::string(rest);
  return e;
}

std::string_view redis_reply_text(const redisReply& r) {
  return r.str != nullptr ? std::string_view(r.str, r.len) : std::string_view();
}

void redis_append_argv(redisContext* context, std::span<const std::string> words) {
  std::vector<const char*> argv;
  std::vector<size_t> lens;
  argv.reserve(words.size());
  lens.reserve(words.size());
  for (const std::string& w : words) {
    argv.push_back(w.data());
    lens.push_back(w.size());
  }
  redisAppendCommandArgv(context, static_cast<int>(argv.size()), argv.data(), lens.data());
}

RedisConnection::RedisConnection(RedisEndpoint endpoint, const Clock& clock, std::string who)
    : endpoint_(std::move(endpoint)), clock_(clock), who_(std::move(who)) {}

RedisConnection::~RedisConnection() {
  if (context_ != nullptr) redisFree(context_);
}

std::string RedisConnection::where() const {
  return endpoint_.host + ":" + std::to_string(endpoint_.port);
}

Status RedisConnection::io_error(const std::string& message) const {
  return make_error(ErrorCode::kIoError, who_ + ": " + message);
}

Status RedisConnection::ensure_connected() {
  if (context_ != nullptr) return {};
  if (clock_.now_ms() < next_connect_ms_) {
    return io_error(where() + " unreachable; waiting before reconnecting");
  }
  return connect();
}

Status RedisConnection::connect() {
  drop();
  const int64_t connect_timeout_ms = std::min<int64_t>(endpoint_.timeout_ms, 500);
  redisContext* c = redisConnectWithTimeout(endpoint_.host.c_str(), endpoint_.port,
                                            to_timeval(connect_timeout_ms));
  if (c == nullptr || c->err != 0) {
    const std::string why = c != nullptr ? c->errstr : "out of memory";
    if (c != nullptr) redisFree(c);
    next_connect_ms_ = clock_.now_ms() + kReconnectBackoffMs;
    return io_error("cannot connect to " + where() + ": " + why);
  }
  redisSetTimeout(c, to_timeval(endpoint_.timeout_ms));
  context_ = c;

  std::vector<std::vector<std::string>> setup;
  if (!endpoint_.password.empty()) setup.push_back({"AUTH", endpoint_.password});
  if (endpoint_.db != 0) setup.push_back({"SELECT", std::to_string(endpoint_.db)});
  std::string refused;
  const Status sent = round_trip(
      setup.size(), [&](redisContext* ctx, size_t i) { redis_append_argv(ctx, setup[i]); },
      [&](size_t i, const redisReply& r) {
        if (r.type == REDIS_REPLY_ERROR && refused.empty()) {
          refused = setup[i][0] + ": " + std::string(redis_reply_text(r));
        }
      });
  if (!sent) return sent;
  if (!refused.empty()) {
    drop();
    return io_error(where() + " refused " + refused);
  }
  return {};
}

Status RedisConnection::round_trip(size_t n, const AppendFn& append, const ReplyFn& on_reply) {
  STRATA_CHECK(context_ != nullptr);
  SigpipeGuard guard;
  for (size_t i = 0; i < n; ++i) append(context_, i);
  for (size_t i = 0; i < n; ++i) {
    void* raw = nullptr;
    if (redisGetReply(context_, &raw) != REDIS_OK || raw == nullptr) {
      const std::string why = context_->err != 0 ? context_->errstr : "no reply";
      drop();
      return io_error(where() + ": " + why);
    }
    const ReplyPtr reply(static_cast<redisReply*>(raw));
    on_reply(i, *reply);
  }
  return {};
}

void RedisConnection::drop() {
  if (context_ != nullptr) {
    redisFree(context_);
    context_ = nullptr;
    next_connect_ms_ = clock_.now_ms() + kReconnectBackoffMs;
  }
}

}  // namespace strata
