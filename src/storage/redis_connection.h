// One connection to a Redis server, shared by the Redis storage backend (redis_backend.h)
// and the router's shared session bindings (router/shared_sessions.h).
//
// Contract. connect() dials (connect timeout min(timeout_ms, 500 ms)), sends AUTH and
// SELECT when asked, and sets timeout_ms on every socket read and write. round_trip()
// pipelines n commands in one write and reads their n replies in order. Any I/O failure
// drops the connection and starts a back-off of kReconnectBackoffMs: ensure_connected()
// fails at once until it has passed, so a dead server is not hammered and callers fail
// fast meanwhile. Error messages start with `who` ("redis storage", "session store").
//
// Threading. Not thread-safe: the owner serialises calls (a mutex of its own). SIGPIPE is
// blocked in the calling thread while it talks to Redis, so a server that went away
// cannot kill the process (hiredis writes with write(2), not send(MSG_NOSIGNAL)).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>

#include "common/clock.h"
#include "common/result.h"

struct redisContext;
struct redisReply;

namespace strata {

struct RedisEndpoint {
  std::string host = "127.0.0.1";  // server address (name or IP)
  int port = 6379;                 // TCP port, 1..65535
  int db = 0;                      // database index for SELECT, >= 0
  std::string password;            // AUTH password; empty: no AUTH
  int64_t timeout_ms = 1000;       // per socket read/write, >= 1; connects use min(this, 500)
};

// kInvalidArgument naming what is wrong, prefixed with `who`.
Status validate(const RedisEndpoint& endpoint, std::string_view who);

// "redis://[[user]:password@]host[:port][/db]" (port 6379 and db 0 by default); the
// timeout is left as it is. kInvalidArgument naming what is wrong.
Result<RedisEndpoint> parse_redis_url(std::string_view url);

// A reply's text (status, string or error).
std::string_view redis_reply_text(const redisReply& reply);
// Appends one command, given as its words, to the connection's output buffer.
void redis_append_argv(redisContext* context, std::span<const std::string> words);

class RedisConnection {
 public:
  static constexpr int64_t kReconnectBackoffMs = 200;
  // Appends command i of a pipeline to the connection's output buffer.
  using AppendFn = std::function<void(redisContext*, size_t)>;
  // Takes reply i of a pipeline (never an I/O failure; error replies do come here).
  using ReplyFn = std::function<void(size_t, const redisReply&)>;

  // `clock` (the back-off) must outlive the connection. Does not dial.
  RedisConnection(RedisEndpoint endpoint, const Clock& clock, std::string who);
  ~RedisConnection();
  RedisConnection(const RedisConnection&) = delete;
  RedisConnection& operator=(const RedisConnection&) = delete;

  // Dials now (ignoring the back-off); kIoError naming the server and the cause.
  Status connect();
  // Connected, or dialled now unless the back-off since the last failure is running.
  Status ensure_connected();
  // Sends n commands in one write and reads their n replies in order (connected first, by
  // ensure_connected). On an I/O failure it drops the connection and returns kIoError;
  // replies read before it were handed over.
  Status round_trip(size_t n, const AppendFn& append, const ReplyFn& on_reply);
  // Frees the connection and starts the back-off.
  void drop();

  bool connected() const { return context_ != nullptr; }
  const RedisEndpoint& endpoint() const { return endpoint_; }
  std::string where() const;  // "host:port"

 private:
  Status io_error(const std::string& message) const;

  const RedisEndpoint endpoint_;
  const Clock& clock_;
  const std::string who_;
  redisContext* context_ = nullptr;  // owned; null while disconnected
  int64_t next_connect_ms_ = 0;      // no reconnect before this time
};

}  // namespace strata
