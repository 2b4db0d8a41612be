// Private to the client's .cc files: the pieces they share. Not part of the API (see
// client.h for the contracts a caller relies on).
//
// How a call flows through the files:
//   client_request.cc   options, URLs, and the request message a call sends
//   client_pool.cc      ClientCore's keep-alive pool and the connect of a new connection
//   client_exchange.cc  one request and its response on one connection (the stale-connection
//                       retry, the error values), and request()
//   client_stream.cc    server-sent events: open_stream() and EventStream
//   client.cc           CancelHandle and the Client facade (guarded(): nothing throws past it)
//   blocking_client.cc  BlockingClient, the Client on its own I/O thread
//
// Ownership: a Client owns a shared ClientCore; every exchange holds the core too, so the
// core outlives the Client while an exchange is in flight. A Connection is owned by the pool
// or by exactly one Exchange, never both. A CancelState is shared by a CancelHandle and the
// exchange it was given to.
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/error.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/buffer_body.hpp>
#include <boost/beast/http/fields.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/result.h"
#include "http/client.h"
#include "http/message.h"
#include "http/sse.h"

namespace strata::http {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;
using boost::system::error_code;

namespace detail {

// Every async operation completes with its error code as a value: failures are Results,
// never exceptions (only a cancelled coroutine's next co_await throws, see guarded()).
inline constexpr auto kAsTuple = asio::as_tuple(asio::use_awaitable);

inline constexpr size_t kReadChunkBytes = 16 * 1024;  // body bytes handed over per read

inline std::chrono::milliseconds ms(int64_t v) {
  return std::chrono::milliseconds(v);
}

// "host:port", with an IPv6 address in brackets: a pool's key and the text of messages.
std::string host_port(std::string_view host, uint16_t port);

// What an error a closed keep-alive connection gives looks like.
bool is_stale_kind(const error_code& ec);

enum class Phase { kConnect, kWrite, kRead };

Error cancelled_error(const std::string& what);

// One error value per failure, naming the call, the phase and the bound that bit.
Error exchange_error(const std::string& what, Phase phase, const error_code& ec, int64_t timeout_ms,
                     const ClientOptions& o);

Headers headers_of(const bhttp::fields& fields);

// The message `r` describes (its body moved into it), or kInvalidArgument.
Result<bhttp::request<bhttp::string_body>> build_message(ClientRequest& r, const ClientOptions& o);

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

  // ---- the pool (client_pool.cc); each takes the lock, and closes what it drops after it

  // A live pooled connection to `key`, or null. Drops expired and stale ones on the way.
  std::unique_ptr<Connection> take_idle(const std::string& key);
  // Gives a connection back (or closes it: the Client is gone, no keep-alive reuse); the
  // oldest of its host's goes when the host is at max_idle_per_host.
  void put_idle(std::unique_ptr<Connection> c);
  // Moves expired (or, with `all`, every) idle connection to `doomed`; returns how many.
  // Precondition: `mutex` is held (by the caller, who closes `doomed` after letting go).
  int64_t sweep_locked(Clock::time_point now, bool all,
                       std::vector<std::unique_ptr<Connection>>& doomed);
  int64_t sweep(bool all);
  // The Client is gone: closes every idle connection, and any given back later.
  void shut();

  static std::shared_ptr<CancelState> state_of(const CancelHandle& h) { return h.state_; }
  static EventStream make_stream(std::unique_ptr<StreamState> s) {
    return EventStream(std::move(s));
  }

  // A new connection (client_pool.cc), trying each address of the host in turn.
  static asio::awaitable<Result<std::unique_ptr<Connection>>> connect(
      std::shared_ptr<ClientCore> core, std::string host, uint16_t port,
      std::shared_ptr<CancelState> cancel, std::string what);
  // Sends the request and reads the response header (client_exchange.cc).
  static asio::awaitable<Result<std::unique_ptr<Exchange>>> begin(
      std::shared_ptr<ClientCore> core, ClientRequest request, std::shared_ptr<CancelState> cancel,
      bool whole_body);
  static asio::awaitable<Result<ClientResponse>> request(std::shared_ptr<ClientCore> core,
                                                         ClientRequest request,
                                                         std::shared_ptr<CancelState> cancel);
  // client_stream.cc
  static asio::awaitable<Result<EventStream>> open_stream(std::shared_ptr<ClientCore> core,
                                                          ClientRequest request,
                                                          std::shared_ptr<CancelState> cancel);
  static asio::awaitable<Result<std::optional<std::string>>> next_event(StreamState& s);
};

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

}  // namespace detail
}  // namespace strata::http
