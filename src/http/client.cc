#include "http/client.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/error.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/buffer_body.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>

#include <array>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <deque>
#include <exception>
#include <future>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/check.h"
#include "http/sse.h"

namespace strata::http {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;
using boost::system::error_code;

namespace {

// Every async operation completes with its error code as a value: failures are Results,
// never exceptions (only a cancelled coroutine's next co_await throws, see guarded()).
constexpr auto kAsTuple = asio::as_tuple(asio::use_awaitable);

constexpr size_t kReadChunkBytes = 16 * 1024;  // body bytes handed over per read

std::chrono::milliseconds ms(int64_t v) {
  return std::chrono::milliseconds(v);
}

bool is_tchar(char c) {  // RFC 9110 token characters
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return true;
  return std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}

bool is_token(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!is_tchar(c)) return false;
  }
  return true;
}

bool has_ctl_or_space(std::string_view s) {
  for (char c : s) {
    if (static_cast<unsigned char>(c) <= ' ' || c == 0x7f) return true;
  }
  return false;
}

bool has_crlf_or_nul(std::string_view s) {
  return s.find_first_of(std::string_view("\r\n\0", 3)) != std::string_view::npos;
}

bool is_idempotent(std::string_view method) {
  for (std::string_view m : {"GET", "HEAD", "PUT", "DELETE", "OPTIONS", "TRACE"}) {
    if (method == m) return true;
  }
  return false;
}

std::string host_port(std::string_view host, uint16_t port) {
  const bool v6 = host.find(':') != std::string_view::npos;
  std::string out = v6 ? "[" + std::string(host) + "]" : std::string(host);
  return out + ":" + std::to_string(port);
}

// What an error a closed keep-alive connection gives looks like.
bool is_stale_kind(const error_code& ec) {
  return ec == asio::error::eof || ec == bhttp::error::end_of_stream ||
         ec == asio::error::connection_reset || ec == asio::error::broken_pipe ||
         ec == asio::error::connection_aborted || ec == asio::error::not_connected;
}

enum class Phase { kConnect, kWrite, kRead };

Error cancelled_error(const std::string& what) {
  return Error{ErrorCode::kIoError, "cancelled: " + what};
}

// One error value per failure, naming the call, the phase and the bound that bit.
Error exchange_error(const std::string& what, Phase phase, const error_code& ec, int64_t timeout_ms,
                     const ClientOptions& o) {
  if (ec == beast::error::timeout) {
    switch (phase) {
      case Phase::kConnect:
        return {ErrorCode::kTimeout,
                what + ": connect timed out after " + std::to_string(timeout_ms) + " ms"};
      case Phase::kWrite:
        return {ErrorCode::kTimeout, what + ": sending the request timed out after " +
                                         std::to_string(timeout_ms) + " ms"};
      case Phase::kRead:
        return {ErrorCode::kTimeout, what + ": no response byte for " + std::to_string(timeout_ms) +
                                         " ms (read timeout)"};
    }
  }
  if (ec == asio::error::operation_aborted) return cancelled_error(what);
  if (ec == bhttp::error::body_limit) {
    return {ErrorCode::kResourceExhausted, what + ": the response body is over max_body_bytes (" +
                                               std::to_string(o.max_body_bytes) + ")"};
  }
  if (ec == bhttp::error::header_limit || ec == bhttp::error::buffer_overflow) {
    return {ErrorCode::kResourceExhausted, what +
                                               ": the response header is over max_header_bytes (" +
                                               std::to_string(o.max_header_bytes) + ")"};
  }
  if (ec == bhttp::error::end_of_stream || ec == bhttp::error::partial_message ||
      is_stale_kind(ec)) {
    return {ErrorCode::kIoError,
            what + ": the server closed the connection before the whole response (" + ec.message() +
                ")"};
  }
  if (ec.category() == bhttp::make_error_code(bhttp::error::bad_version).category()) {
    return {ErrorCode::kCorrupt, what + ": malformed response: " + ec.message()};
  }
  const char* doing = phase == Phase::kConnect ? "cannot connect"
                      : phase == Phase::kWrite ? "sending the request failed"
                                               : "reading the response failed";
  return {ErrorCode::kIoError, what + ": " + doing + ": " + ec.message()};
}

Headers headers_of(const bhttp::fields& fields) {
  Headers out;
  for (const auto& f : fields) out.emplace_back(f.name_string(), f.value());
  return out;
}

std::string_view find_header(const Headers& headers, std::string_view name) {
  for (const auto& [k, v] : headers) {
    if (iequals(k, name)) return v;
  }
  return {};
}

}  // namespace

// ---- options, URLs, requests ----

Status validate(const ClientOptions& o) {
  auto bad = [](const std::string& what) {
    return make_error(ErrorCode::kInvalidArgument, "ClientOptions: " + what);
  };
  if (o.connect_timeout_ms <= 0) return bad("connect_timeout_ms must be > 0");
  if (o.write_timeout_ms <= 0) return bad("write_timeout_ms must be > 0");
  if (o.read_timeout_ms <= 0) return bad("read_timeout_ms must be > 0");
  if (o.max_header_bytes < 1024 || o.max_header_bytes > (int64_t{1} << 30)) {
    return bad("max_header_bytes must be in [1024, 2^30]");
  }
  if (o.max_body_bytes < 0) return bad("max_body_bytes must be >= 0");
  if (o.max_event_bytes < 1) return bad("max_event_bytes must be >= 1");
  if (o.max_idle_per_host < 0) return bad("max_idle_per_host must be >= 0");
  if (o.idle_timeout_ms <= 0) return bad("idle_timeout_ms must be > 0");
  if (has_crlf_or_nul(o.user_agent)) return bad("user_agent must not hold CR, LF or NUL");
  return {};
}

Result<Url> parse_url(std::string_view url) {
  auto bad = [&](const std::string& why) {
    return make_error(ErrorCode::kInvalidArgument,
                      "malformed URL \"" + std::string(url) + "\": " + why);
  };
  std::string_view rest = url;
  if (const size_t scheme_end = rest.find("://"); scheme_end != std::string_view::npos) {
    const std::string_view scheme = rest.substr(0, scheme_end);
    if (!iequals(scheme, "http")) {
      return make_error(ErrorCode::kUnsupported, "unsupported URL scheme \"" + std::string(scheme) +
                                                     "\" in \"" + std::string(url) +
                                                     "\" (plain http only)");
    }
    rest.remove_prefix(scheme_end + 3);
  }
  const size_t authority_end = rest.find_first_of("/?#");
  const std::string_view authority = rest.substr(0, authority_end);
  std::string_view target =
      authority_end == std::string_view::npos ? std::string_view() : rest.substr(authority_end);
  if (const size_t hash = target.find('#'); hash != std::string_view::npos) {
    target = target.substr(0, hash);
  }
  if (authority.find('@') != std::string_view::npos) return bad("user info is not supported");

  Url out;
  std::string_view host;
  std::string_view port;
  if (!authority.empty() && authority.front() == '[') {
    const size_t close = authority.find(']');
    if (close == std::string_view::npos) return bad("unclosed '['");
    host = authority.substr(1, close - 1);
    const std::string_view after = authority.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':') return bad("junk after ']'");
      port = after.substr(1);
      if (port.empty()) return bad("empty port");
    }
  } else {
    const size_t colon = authority.find(':');
    host = authority.substr(0, colon);
    if (colon != std::string_view::npos) {
      port = authority.substr(colon + 1);
      if (port.empty()) return bad("empty port");
    }
  }
  if (host.empty()) return bad("no host");
  if (has_ctl_or_space(host)) return bad("a space or control character in the host");
  if (!port.empty()) {
    unsigned value = 0;
    const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
    if (ec != std::errc() || end != port.data() + port.size() || value == 0 || value > 65535) {
      return bad("the port must be a number in [1, 65535]");
    }
    out.port = static_cast<uint16_t>(value);
  }
  out.host = std::string(host);
  if (target.empty()) {
    out.target = "/";
  } else if (target.front() == '?') {
    out.target = "/" + std::string(target);
  } else {
    out.target = std::string(target);
  }
  if (has_ctl_or_space(out.target)) return bad("a space or control character in the path");
  return out;
}

Result<ClientRequest> make_request(std::string method, std::string_view url, std::string body,
                                   Headers headers) {
  auto u = parse_url(url);
  if (!u) return std::unexpected(u.error());
  ClientRequest r;
  r.method = std::move(method);
  r.host = std::move(u->host);
  r.port = u->port;
  r.target = std::move(u->target);
  r.headers = std::move(headers);
  r.body = std::move(body);
  return r;
}

std::string_view ClientResponse::header(std::string_view name) const {
  return find_header(headers, name);
}

namespace {

Result<bhttp::request<bhttp::string_body>> build_message(ClientRequest& r, const ClientOptions& o) {
  auto bad = [&](const std::string& why) {
    return make_error(ErrorCode::kInvalidArgument, "bad request to " + r.host + ": " + why);
  };
  if (!is_token(r.method)) return bad("the method \"" + r.method + "\" is not a token");
  if (r.host.empty() || has_ctl_or_space(r.host)) return bad("empty host, or a space in it");
  if (r.port == 0) return bad("port 0");
  if (r.target.empty() || has_ctl_or_space(r.target)) {
    return bad("the target must be non-empty, without spaces or control characters");
  }
  if (r.method == "TRACE" && !r.body.empty()) return bad("a TRACE request has no body");
  bhttp::request<bhttp::string_body> m;
  m.method_string(r.method);
  m.target(r.target);
  m.version(11);
  for (const auto& [name, value] : r.headers) {
    if (!is_token(name)) return bad("the header name \"" + name + "\" is not a token");
    if (has_crlf_or_nul(value)) return bad("the header " + name + " holds CR, LF or NUL");
    m.insert(name, value);
  }
  if (m.find(bhttp::field::host) == m.end()) {
    m.set(bhttp::field::host,
          r.port == 80 ? (r.host.find(':') != std::string::npos ? "[" + r.host + "]" : r.host)
                       : host_port(r.host, r.port));
  }
  if (m.find(bhttp::field::user_agent) == m.end() && !o.user_agent.empty()) {
    m.set(bhttp::field::user_agent, o.user_agent);
  }
  if (o.max_idle_per_host == 0 && m.find(bhttp::field::connection) == m.end()) {
    m.set(bhttp::field::connection, "close");  // no reuse: let the server close at once
  }
  m.body() = std::move(r.body);
  m.prepare_payload();
  return m;
}

}  // namespace

// ---- internals ----

namespace detail {

// The cancel state a CancelHandle shares with the exchange it was given to. The exchange
// attaches its socket while it owns one; cancel() shuts that socket down (a thread-safe
// system call, unlike anything on the asio socket object), which ends whatever the exchange
// waits on with an EOF or an error; the exchange then sees `cancelled` and reports it. The
// attached descriptor is a dup() owned here, so that it cannot be closed and reused by
// another socket while cancel() may still use it (Beast closes the original on timeouts).
struct CancelState {
  std::mutex mutex;
  bool cancelled = false;  // GUARDED_BY(mutex)
  int fd = -1;             // GUARDED_BY(mutex): a dup of the attached socket, or -1

  ~CancelState() { detach(); }

  // False (and nothing attached) when already cancelled.
  bool attach(int socket_fd) {
    std::lock_guard lock(mutex);
    if (cancelled) return false;
    if (fd >= 0) ::close(fd);
    fd = ::fcntl(socket_fd, F_DUPFD_CLOEXEC, 0);
    return true;
  }
  void detach() {
    std::lock_guard lock(mutex);
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
  void cancel() {
    std::lock_guard lock(mutex);
    cancelled = true;
    if (fd >= 0) ::shutdown(fd, SHUT_RDWR);
  }
  bool is_cancelled() {
    std::lock_guard lock(mutex);
    return cancelled;
  }
};

// A keep-alive connection: in the pool, or owned by exactly one exchange.
struct Connection {
  Connection(const asio::any_io_executor& executor, size_t max_buffer_bytes)
      : stream(executor), buffer(max_buffer_bytes) {}

  beast::tcp_stream stream;
  beast::flat_buffer buffer;  // bytes read and not yet parsed
  std::string key;            // "host:port" of its pool
  Clock::time_point idle_since{};

  // True while the server has not closed it and sent nothing unasked: a non-blocking peek.
  bool looks_alive() {
    char byte = 0;
    const ssize_t n = ::recv(stream.socket().native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
  }
};

// One request and its response on one connection. Destroying it closes the connection
// unless finish() gave it back to the pool.
struct Exchange {
  std::shared_ptr<ClientCore> core;
  std::shared_ptr<CancelState> cancel;
  std::string what;  // "METHOD http://host:port/target", for messages
  int64_t read_timeout_ms = 0;
  std::unique_ptr<Connection> conn;
  std::optional<bhttp::response_parser<bhttp::buffer_body>> parser;  // one per attempt
  std::array<char, kReadChunkBytes> chunk;

  Exchange(std::shared_ptr<ClientCore> c, std::shared_ptr<CancelState> cs)
      : core(std::move(c)), cancel(std::move(cs)) {}
  ~Exchange() { close(); }

  void close() {
    cancel->detach();  // before the descriptor can be reused
    if (!conn) return;
    error_code ec;
    conn->stream.socket().shutdown(tcp::socket::shutdown_both, ec);
    conn->stream.socket().close(ec);
    conn.reset();
  }

  // The response is read to its end: the connection goes back to the pool when the
  // response allows keep-alive and nothing follows it.
  void finish();

  Error error(Phase phase, const error_code& ec);

  // The next body bytes (an empty view is possible: chunk framing only), after at most
  // read_timeout_ms without a byte. Precondition: the header is read, the body is not done.
  asio::awaitable<Result<std::string_view>> read_some();
};

struct StreamState {
  std::unique_ptr<Exchange> exchange;  // null once the stream ended, failed or was closed
  std::string what;
  int status = 0;
  Headers headers;
  std::string body;
  SseParser sse;
  std::deque<std::string> ready;  // events parsed and not yet taken (from one read at most)
  std::optional<Error> error;     // sticky
  bool ended = false;

  explicit StreamState(size_t max_event_bytes) : sse(max_event_bytes) {}
};

struct ClientCore {
  ClientCore(asio::any_io_executor ex, ClientOptions o)
      : executor(std::move(ex)), options(std::move(o)) {}

  const asio::any_io_executor executor;
  const ClientOptions options;

  mutable std::mutex mutex;
  // Idle connections per "host:port", oldest first.
  std::unordered_map<std::string, std::deque<std::unique_ptr<Connection>>>
      idle;                                     // GUARDED_BY(mutex)
  int64_t idle_count = 0;                       // GUARDED_BY(mutex)
  Clock::time_point last_sweep = Clock::now();  // GUARDED_BY(mutex)
  bool closed = false;                          // GUARDED_BY(mutex): the Client is gone

  std::atomic<uint64_t> connections_opened{0};
  std::atomic<uint64_t> connections_reused{0};
  std::atomic<uint64_t> stale_dropped{0};
  std::atomic<uint64_t> retries{0};
  std::atomic<uint64_t> expired_closed{0};

  // A live pooled connection to `key`, or null. Drops expired and stale ones on the way.
  std::unique_ptr<Connection> take_idle(const std::string& key) {
    std::vector<std::unique_ptr<Connection>> doomed;  // closed after the lock
    std::lock_guard lock(mutex);
    auto it = idle.find(key);
    if (it == idle.end()) return nullptr;
    const auto now = Clock::now();
    std::unique_ptr<Connection> found;
    while (!found && !it->second.empty()) {
      std::unique_ptr<Connection> c = std::move(it->second.back());
      it->second.pop_back();
      --idle_count;
      if (now - c->idle_since >= ms(options.idle_timeout_ms)) {
        expired_closed.fetch_add(1, std::memory_order_relaxed);
        doomed.push_back(std::move(c));
      } else if (!c->looks_alive()) {
        stale_dropped.fetch_add(1, std::memory_order_relaxed);
        doomed.push_back(std::move(c));
      } else {
        found = std::move(c);
      }
    }
    if (it->second.empty()) idle.erase(it);
    return found;
  }

  void put_idle(std::unique_ptr<Connection> c) {
    std::vector<std::unique_ptr<Connection>> doomed;
    std::lock_guard lock(mutex);
    const auto now = Clock::now();
    if (closed || options.max_idle_per_host == 0) {
      doomed.push_back(std::move(c));
      return;
    }
    c->stream.expires_never();
    c->idle_since = now;
    auto& q = idle[c->key];
    if (static_cast<int64_t>(q.size()) >= options.max_idle_per_host) {
      doomed.push_back(std::move(q.front()));  // keep the most recently used
      q.pop_front();
      --idle_count;
    }
    q.push_back(std::move(c));
    ++idle_count;
    if (now - last_sweep >= ms(options.idle_timeout_ms)) sweep_locked(now, false, doomed);
  }

  // Moves expired (or, with `all`, every) idle connection to `doomed`; returns how many.
  int64_t sweep_locked(Clock::time_point now, bool all,
                       std::vector<std::unique_ptr<Connection>>& doomed) {
    last_sweep = now;
    int64_t n = 0;
    for (auto it = idle.begin(); it != idle.end();) {
      auto& q = it->second;
      while (!q.empty() && (all || now - q.front()->idle_since >= ms(options.idle_timeout_ms))) {
        doomed.push_back(std::move(q.front()));
        q.pop_front();
        --idle_count;
        ++n;
      }
      it = q.empty() ? idle.erase(it) : std::next(it);
    }
    return n;
  }

  int64_t sweep(bool all) {
    std::vector<std::unique_ptr<Connection>> doomed;
    std::lock_guard lock(mutex);
    const int64_t n = sweep_locked(Clock::now(), all, doomed);
    if (!all) expired_closed.fetch_add(static_cast<uint64_t>(n), std::memory_order_relaxed);
    return n;
  }

  void shut() {
    std::vector<std::unique_ptr<Connection>> doomed;
    std::lock_guard lock(mutex);
    closed = true;
    sweep_locked(Clock::now(), true, doomed);
  }

  static std::shared_ptr<CancelState> state_of(const CancelHandle& h) { return h.state_; }
  static EventStream make_stream(std::unique_ptr<StreamState> s) {
    return EventStream(std::move(s));
  }

  static asio::awaitable<Result<std::unique_ptr<Connection>>> connect(
      std::shared_ptr<ClientCore> core, std::string host, uint16_t port,
      std::shared_ptr<CancelState> cancel, std::string what);
  static asio::awaitable<Result<std::unique_ptr<Exchange>>> begin(
      std::shared_ptr<ClientCore> core, ClientRequest request, std::shared_ptr<CancelState> cancel,
      bool whole_body);
  static asio::awaitable<Result<ClientResponse>> request(std::shared_ptr<ClientCore> core,
                                                         ClientRequest request,
                                                         std::shared_ptr<CancelState> cancel);
  static asio::awaitable<Result<EventStream>> open_stream(std::shared_ptr<ClientCore> core,
                                                          ClientRequest request,
                                                          std::shared_ptr<CancelState> cancel);
  static asio::awaitable<Result<std::optional<std::string>>> next_event(StreamState& s);
};

void Exchange::finish() {
  cancel->detach();
  if (conn && parser && parser->is_done() && parser->keep_alive() && conn->buffer.size() == 0 &&
      !cancel->is_cancelled()) {
    core->put_idle(std::move(conn));
  } else {
    close();
  }
}

Error Exchange::error(Phase phase, const error_code& ec) {
  if (cancel->is_cancelled()) return cancelled_error(what);
  const int64_t timeout_ms = phase == Phase::kConnect ? core->options.connect_timeout_ms
                             : phase == Phase::kWrite ? core->options.write_timeout_ms
                                                      : read_timeout_ms;
  return exchange_error(what, phase, ec, timeout_ms, core->options);
}

asio::awaitable<Result<std::string_view>> Exchange::read_some() {
  auto& body = parser->get().body();
  body.data = chunk.data();
  body.size = chunk.size();
  body.more = true;
  conn->stream.expires_after(ms(read_timeout_ms));
  auto [ec, n] = co_await bhttp::async_read_some(conn->stream, conn->buffer, *parser, kAsTuple);
  (void)n;
  if (ec == bhttp::error::need_buffer) ec = {};
  if (ec || cancel->is_cancelled()) co_return std::unexpected(error(Phase::kRead, ec));
  co_return std::string_view(chunk.data(), chunk.size() - body.size);
}

asio::awaitable<Result<std::unique_ptr<Connection>>> ClientCore::connect(
    std::shared_ptr<ClientCore> core, std::string host, uint16_t port,
    std::shared_ptr<CancelState> cancel, std::string what) {
  const ClientOptions& o = core->options;
  std::vector<tcp::endpoint> endpoints;
  error_code ec;
  const auto address = asio::ip::make_address(host, ec);
  if (!ec) {
    endpoints.emplace_back(address, port);
  } else {
    tcp::resolver resolver(core->executor);
    const std::string service = std::to_string(port);
    auto [rec, results] = co_await resolver.async_resolve(host, service, kAsTuple);
    if (cancel->is_cancelled()) co_return std::unexpected(cancelled_error(what));
    if (rec) {
      co_return make_error(ErrorCode::kIoError,
                           what + ": cannot resolve \"" + host + "\": " + rec.message());
    }
    for (const auto& r : results) endpoints.push_back(r.endpoint());
  }
  const auto deadline = Clock::now() + ms(o.connect_timeout_ms);
  error_code last = asio::error::host_not_found;
  const size_t max_buffer_bytes = static_cast<size_t>(o.max_header_bytes) + 2 * kReadChunkBytes;
  for (const tcp::endpoint& ep : endpoints) {
    auto conn = std::make_unique<Connection>(core->executor, max_buffer_bytes);
    // Opened here with SOCK_CLOEXEC: asio would not set it, and a process the caller forks
    // (the benchmark spawns servers) must not inherit the connection.
    const int fd = ::socket(ep.protocol().family(), SOCK_STREAM | SOCK_CLOEXEC, IPPROTO_TCP);
    if (fd < 0) {
      last = error_code(errno, boost::system::system_category());
      continue;
    }
    conn->stream.socket().assign(ep.protocol(), fd, ec);
    if (ec) {
      ::close(fd);
      last = ec;
      continue;
    }
    conn->stream.socket().set_option(tcp::no_delay(true), ec);
    if (!cancel->attach(fd)) co_return std::unexpected(cancelled_error(what));
    conn->stream.expires_at(deadline);
    auto [cec] = co_await conn->stream.async_connect(ep, kAsTuple);
    cancel->detach();
    if (cancel->is_cancelled()) co_return std::unexpected(cancelled_error(what));
    if (!cec) {
      conn->stream.expires_never();
      core->connections_opened.fetch_add(1, std::memory_order_relaxed);
      co_return std::move(conn);
    }
    last = cec;
    if (cec == beast::error::timeout || cec == asio::error::operation_aborted) break;
  }
  co_return std::unexpected(exchange_error(what, Phase::kConnect, last, o.connect_timeout_ms, o));
}

asio::awaitable<Result<std::unique_ptr<Exchange>>> ClientCore::begin(
    std::shared_ptr<ClientCore> core, ClientRequest request, std::shared_ptr<CancelState> cancel,
    bool whole_body) {
  const ClientOptions& o = core->options;
  const std::string method = request.method;
  const std::string key = host_port(request.host, request.port);
  auto x = std::make_unique<Exchange>(core, cancel);
  x->what = method + " http://" + key + request.target;
  x->read_timeout_ms = request.read_timeout_ms > 0 ? request.read_timeout_ms : o.read_timeout_ms;
  auto message = build_message(request, o);
  if (!message) co_return std::unexpected(message.error());

  for (int attempt = 0;; ++attempt) {
    if (cancel->is_cancelled()) co_return std::unexpected(cancelled_error(x->what));
    // The retry (attempt 1) always takes a fresh connection.
    x->conn = attempt == 0 ? core->take_idle(key) : nullptr;
    const bool reused = x->conn != nullptr;
    if (reused) {
      core->connections_reused.fetch_add(1, std::memory_order_relaxed);
    } else {
      auto c = co_await connect(core, request.host, request.port, cancel, x->what);
      if (!c) co_return std::unexpected(c.error());
      x->conn = std::move(*c);
      x->conn->key = key;
    }
    if (!cancel->attach(x->conn->stream.socket().native_handle())) {
      co_return std::unexpected(cancelled_error(x->what));
    }
    x->parser.emplace();
    x->parser->header_limit(static_cast<uint32_t>(o.max_header_bytes));
    // A stream's body is unbounded (its events are bounded); a non-2xx body is bounded
    // by the stream's reader.
    if (whole_body) {
      x->parser->body_limit(static_cast<uint64_t>(o.max_body_bytes));
    } else {
      x->parser->body_limit(boost::none);
    }
    if (method == "HEAD") x->parser->skip(true);

    x->conn->stream.expires_after(ms(o.write_timeout_ms));
    auto [wec, written] = co_await bhttp::async_write(x->conn->stream, *message, kAsTuple);
    (void)written;
    if (wec || cancel->is_cancelled()) {
      // The request did not all leave: the server cannot have acted on it.
      if (reused && attempt == 0 && is_stale_kind(wec) && !cancel->is_cancelled()) {
        x->close();
        core->retries.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      co_return std::unexpected(x->error(Phase::kWrite, wec));
    }

    x->conn->stream.expires_after(ms(x->read_timeout_ms));
    auto [rec, parsed] =
        co_await bhttp::async_read_header(x->conn->stream, x->conn->buffer, *x->parser, kAsTuple);
    (void)parsed;
    if (rec || cancel->is_cancelled()) {
      const bool nothing_arrived = x->conn->buffer.size() == 0 && !x->parser->got_some();
      if (reused && attempt == 0 && nothing_arrived && is_stale_kind(rec) &&
          is_idempotent(method) && !cancel->is_cancelled()) {
        x->close();
        core->retries.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      co_return std::unexpected(x->error(Phase::kRead, rec));
    }
    co_return std::move(x);
  }
}

asio::awaitable<Result<ClientResponse>> ClientCore::request(std::shared_ptr<ClientCore> core,
                                                            ClientRequest request,
                                                            std::shared_ptr<CancelState> cancel) {
  auto x = co_await begin(core, std::move(request), cancel, true);
  if (!x) co_return std::unexpected(x.error());
  Exchange& e = **x;
  ClientResponse out;
  out.status = e.parser->get().result_int();
  out.headers = headers_of(e.parser->get().base());
  const auto max_body = static_cast<size_t>(core->options.max_body_bytes);
  while (!e.parser->is_done()) {
    auto bytes = co_await e.read_some();
    if (!bytes) co_return std::unexpected(bytes.error());
    if (out.body.size() + bytes->size() > max_body) {
      co_return std::unexpected(e.error(Phase::kRead, bhttp::error::body_limit));
    }
    out.body.append(*bytes);
  }
  e.finish();
  co_return std::move(out);
}

asio::awaitable<Result<EventStream>> ClientCore::open_stream(std::shared_ptr<ClientCore> core,
                                                             ClientRequest request,
                                                             std::shared_ptr<CancelState> cancel) {
  auto x = co_await begin(core, std::move(request), cancel, false);
  if (!x) co_return std::unexpected(x.error());
  auto s = std::make_unique<StreamState>(static_cast<size_t>(core->options.max_event_bytes));
  Exchange& e = **x;
  s->what = e.what;
  s->status = e.parser->get().result_int();
  s->headers = headers_of(e.parser->get().base());
  if (s->status < 200 || s->status >= 300) {
    // Not an event stream: read the (bounded) body whole for the caller.
    const auto max_body = static_cast<size_t>(core->options.max_body_bytes);
    while (!e.parser->is_done()) {
      auto bytes = co_await e.read_some();
      if (!bytes) co_return std::unexpected(bytes.error());
      if (s->body.size() + bytes->size() > max_body) {
        co_return std::unexpected(e.error(Phase::kRead, bhttp::error::body_limit));
      }
      s->body.append(*bytes);
    }
  }
  if (e.parser->is_done()) {
    e.finish();
    s->ended = true;
  } else {
    s->exchange = std::move(*x);
  }
  co_return make_stream(std::move(s));
}

asio::awaitable<Result<std::optional<std::string>>> ClientCore::next_event(StreamState& s) {
  while (true) {
    if (!s.ready.empty()) {
      std::string data = std::move(s.ready.front());
      s.ready.pop_front();
      co_return std::optional<std::string>(std::move(data));
    }
    if (s.error) co_return std::unexpected(*s.error);
    if (s.ended || !s.exchange) co_return std::optional<std::string>();
    Exchange& e = *s.exchange;
    auto bytes = co_await e.read_some();
    if (!bytes) {
      s.error = bytes.error();
      s.exchange.reset();
      continue;
    }
    auto fed = s.sse.feed(*bytes, [&s](std::string_view data) { s.ready.emplace_back(data); });
    if (!fed) {
      s.error = Error{fed.error().code, s.what + ": " + fed.error().message};
      s.exchange.reset();
      continue;
    }
    if (e.parser->is_done()) {  // the end: give the connection back before the last events
      e.finish();
      s.exchange.reset();
      s.ended = true;
    }
  }
}

}  // namespace detail

namespace {

// The public coroutines' outer layer: nothing throws past it. An exception here is a
// cancelled coroutine (asio throws operation_aborted from the next co_await after a
// cancellation), a callback that threw, or out-of-memory; the inner coroutine's frame has
// unwound by then, closing its connection.
template <typename T>
asio::awaitable<Result<T>> guarded(asio::awaitable<Result<T>> inner, std::string what) {
  std::optional<Error> failure;
  try {
    co_return co_await std::move(inner);
  } catch (const boost::system::system_error& e) {
    failure = e.code() == asio::error::operation_aborted
                  ? cancelled_error(what)
                  : Error{ErrorCode::kIoError, what + ": " + e.what()};
  } catch (const std::exception& e) {
    failure = Error{ErrorCode::kInternal, what + ": " + e.what()};
  }
  co_return std::unexpected(std::move(*failure));
}

std::string what_of(const ClientRequest& r) {
  return r.method + " http://" + host_port(r.host, r.port) + r.target;
}

}  // namespace

// ---- CancelHandle, EventStream ----

CancelHandle::CancelHandle() : state_(std::make_shared<detail::CancelState>()) {}

void CancelHandle::cancel() const {
  state_->cancel();
}

bool CancelHandle::cancelled() const {
  return state_->is_cancelled();
}

EventStream::EventStream(std::unique_ptr<detail::StreamState> state) : state_(std::move(state)) {}
EventStream::EventStream(EventStream&&) noexcept = default;
EventStream& EventStream::operator=(EventStream&&) noexcept = default;
EventStream::~EventStream() = default;

int EventStream::status() const {
  return state_->status;
}

const Headers& EventStream::headers() const {
  return state_->headers;
}

const std::string& EventStream::body() const {
  return state_->body;
}

asio::awaitable<Result<std::optional<std::string>>> EventStream::next() {
  STRATA_CHECK_MSG(state_ != nullptr, "EventStream::next() on a moved-from stream");
  return guarded(detail::ClientCore::next_event(*state_), state_->what);
}

void EventStream::close() {
  if (!state_ || !state_->exchange) return;
  state_->exchange.reset();
  state_->ready.clear();
  if (!state_->error) state_->error = cancelled_error(state_->what + " (stream closed)");
}

// ---- Client ----

Client::Client(asio::any_io_executor executor, ClientOptions options) {
  const auto valid = validate(options);
  STRATA_CHECK_MSG(valid.has_value(), valid.error().message);
  core_ = std::make_shared<detail::ClientCore>(std::move(executor), std::move(options));
}

Client::~Client() {
  core_->shut();
}

asio::awaitable<Result<ClientResponse>> Client::request(ClientRequest request,
                                                        CancelHandle cancel) {
  std::string what = what_of(request);
  return guarded(
      detail::ClientCore::request(core_, std::move(request), detail::ClientCore::state_of(cancel)),
      std::move(what));
}

asio::awaitable<Result<EventStream>> Client::open_stream(ClientRequest request,
                                                         CancelHandle cancel) {
  std::string what = what_of(request);
  return guarded(detail::ClientCore::open_stream(core_, std::move(request),
                                                 detail::ClientCore::state_of(cancel)),
                 std::move(what));
}

namespace {

asio::awaitable<Result<StreamResult>> stream_all(asio::awaitable<Result<EventStream>> opening,
                                                 EventCallback on_event) {
  auto opened = co_await std::move(opening);
  if (!opened) co_return std::unexpected(opened.error());
  EventStream& s = *opened;
  StreamResult out;
  out.status = s.status();
  out.headers = s.headers();
  out.body = s.body();
  while (true) {
    auto event = co_await s.next();
    if (!event) co_return std::unexpected(event.error());
    if (!*event) break;
    ++out.num_events;
    on_event(**event);
  }
  co_return std::move(out);
}

}  // namespace

asio::awaitable<Result<StreamResult>> Client::stream(ClientRequest request, EventCallback on_event,
                                                     CancelHandle cancel) {
  std::string what = what_of(request);
  return guarded(
      stream_all(open_stream(std::move(request), std::move(cancel)), std::move(on_event)),
      std::move(what));
}

int64_t Client::close_expired() {
  return core_->sweep(false);
}

int64_t Client::close_idle() {
  return core_->sweep(true);
}

ClientStats Client::stats() const {
  ClientStats s;
  s.connections_opened = core_->connections_opened.load(std::memory_order_relaxed);
  s.connections_reused = core_->connections_reused.load(std::memory_order_relaxed);
  s.stale_dropped = core_->stale_dropped.load(std::memory_order_relaxed);
  s.retries = core_->retries.load(std::memory_order_relaxed);
  s.expired_closed = core_->expired_closed.load(std::memory_order_relaxed);
  std::lock_guard lock(core_->mutex);
  s.idle_connections = core_->idle_count;
  return s;
}

const ClientOptions& Client::options() const {
  return core_->options;
}

asio::any_io_executor Client::executor() const {
  return core_->executor;
}

// ---- BlockingClient ----

struct BlockingClient::Impl {
  explicit Impl(ClientOptions options)
      : work(asio::make_work_guard(io)),
        client(io.get_executor(), std::move(options)),
        thread([this] { io.run(); }) {}

  ~Impl() {
    work.reset();
    io.stop();
    thread.join();
  }

  // Runs `op` on the I/O thread and waits for its result.
  template <typename T>
  Result<T> wait_for(asio::awaitable<Result<T>> op) {
    std::promise<Result<T>> promise;
    auto future = promise.get_future();
    // The handler owns the promise: the waiting thread may return (and unwind) as soon as
    // the value is set.
    asio::co_spawn(io, std::move(op),
                   [p = std::move(promise)](std::exception_ptr e, Result<T> r) mutable {
                     if (e) {
                       p.set_value(make_error(ErrorCode::kInternal, "HTTP client call threw"));
                     } else {
                       p.set_value(std::move(r));
                     }
                   });
    return future.get();
  }

  asio::io_context io{1};
  asio::executor_work_guard<asio::io_context::executor_type> work;
  Client client;
  std::thread thread;
};

BlockingClient::BlockingClient(ClientOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))) {}

BlockingClient::~BlockingClient() = default;

Result<ClientResponse> BlockingClient::request(ClientRequest request, CancelHandle cancel) {
  return impl_->wait_for(impl_->client.request(std::move(request), std::move(cancel)));
}

Result<StreamResult> BlockingClient::stream(ClientRequest request, const EventCallback& on_event,
                                            CancelHandle cancel) {
  return impl_->wait_for(impl_->client.stream(std::move(request), on_event, std::move(cancel)));
}

ClientStats BlockingClient::stats() const {
  return impl_->client.stats();
}

Client& BlockingClient::async_client() {
  return impl_->client;
}

}  // namespace strata::http
