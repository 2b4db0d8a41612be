// An HTTP/1.1 client on Boost.Beast: the router's calls to its workers (thousands of
// upstream streams at once) and the benchmark's calls to a server. Plain http only.
//
// Async API: coroutines (boost::asio::awaitable) on the executor the Client is given. A
// whole request: request(). A server-sent-events response event by event: open_stream()
// then EventStream::next() per event (the next read starts only when asked, so a slow
// consumer holds the upstream back instead of growing a buffer), or stream() with a callback.
// Nothing throws: failures are Results, with these codes:
//   kInvalidArgument    a malformed URL or request, an https URL (kUnsupported)
//   kTimeout            connect_timeout_ms, write_timeout_ms or read_timeout_ms passed
//   kResourceExhausted  a response header, body or event over its max_* bound
//   kCorrupt            a malformed response (bad status line, framing)
//   kIoError            connection refused, reset or closed early; or cancelled (the
//                       message starts with "cancelled")
//
// Cancellation, at any point (connecting, sending, waiting, mid-stream), two ways:
//   - the asio way: the cancellation slot of the awaiting coroutine (co_spawn with
//     bind_cancellation_slot, `a || b` of awaitable_operators); terminal cancellation;
//   - a CancelHandle given to the call: cancel() from any thread; it shuts the socket down,
//     which wakes whatever the exchange waits on.
// A cancelled exchange closes its connection (it never goes back to the pool); the server
// sees the connection close.
//
// Connection pool: keep-alive connections per host:port, at most max_idle_per_host idle
// ones, the most recently used taken first; an idle connection older than idle_timeout_ms
// is closed (checked whenever the pool is used, and by close_expired()). A connection goes
// back to the pool only after a whole response that allows keep-alive with no stray bytes
// after it; anything else (error, timeout, cancel, an abandoned stream, "Connection: close",
// a body ended by closing) closes it.
//
// Stale pooled connections (the server closed one while it sat idle). Before reuse, a
// pooled connection is checked without blocking: if the server's close (or stray bytes)
// already arrived it is dropped and the next one tried, then a fresh one. When the close
// crosses the request on the wire, the exchange is retried once, on a fresh connection,
// only when all of these hold:
//   - the connection came from the pool (a fresh connection's failure is never retried);
//   - no byte of the response arrived;
//   - the failure is the kind a closed connection gives (EOF, reset, broken pipe);
//   - either sending the request failed (the server cannot have received all of it, so it
//     cannot have acted on it), or the method is idempotent (GET, HEAD, PUT, DELETE,
//     OPTIONS, TRACE): a POST whose bytes all left may have reached the server, so it is
//     not sent twice; the caller sees the error and decides.
// idle_timeout_ms defaults below the keep-alive timeouts of common servers (5 s in
// common HTTP servers and uvicorn) so that the client, not the server, ends idle connections.
//
// Threads and lifetime: a Client may be used from any number of coroutines, on any
// threads (its pool takes a short lock). Destroying the Client closes its idle
// connections; operations still in flight keep what they use alive and finish normally
// (their connections are then closed instead of pooled). An EventStream is used by one
// coroutine at a time. BlockingClient: see below.
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "common/result.h"
#include "http/message.h"

namespace strata::http {

struct ClientOptions {
  int64_t connect_timeout_ms = 10'000;   // TCP connect of a new connection (all addresses of
                                         // the host), > 0; name resolution is not bounded by
                                         // it (numeric addresses skip it)
  int64_t write_timeout_ms = 60'000;     // sending the whole request, > 0
  int64_t read_timeout_ms = 60'000;      // the response header, then each wait for more of the
                                         // body: no byte for this long fails the call, > 0
  int64_t max_header_bytes = 64 * 1024;  // status line + headers, >= 1024
  int64_t max_body_bytes = int64_t{64} << 20;   // a whole response body (request(), and a
                                                // non-2xx answer of a stream), >= 0
  int64_t max_event_bytes = int64_t{16} << 20;  // one server-sent event's data, >= 1
  int64_t max_idle_per_host = 32;               // idle keep-alive connections kept per
                                                // host:port, >= 0 (0: no keep-alive reuse)
  int64_t idle_timeout_ms = 4'000;              // an idle pooled connection is closed after
                                                // this, > 0
  std::string user_agent = "strata";            // sent unless the request has one
};

// A clear message naming the field when an option is out of its range.
Status validate(const ClientOptions& options);

struct Url {
  std::string host;  // a name, or an IPv4 or IPv6 address (without brackets)
  uint16_t port = 80;
  std::string target = "/";  // path and query
};

// "http://host[:port][/target]" or "host[:port][/target]"; IPv6 as "[::1]:8000".
// https is kUnsupported, anything else malformed kInvalidArgument.
Result<Url> parse_url(std::string_view url);

struct ClientRequest {
  std::string method = "GET";
  std::string host;  // as in Url
  uint16_t port = 80;
  std::string target = "/";
  Headers headers;  // sent as given; Host and User-Agent are added unless present;
                    // Content-Length is set from the body (left out for an empty body
                    // except with POST, PUT and OPTIONS)
  std::string body;
  int64_t read_timeout_ms = 0;  // > 0: overrides ClientOptions::read_timeout_ms for this call
};

// A request to `url` (see parse_url).
Result<ClientRequest> make_request(std::string method, std::string_view url, std::string body = {},
                                   Headers headers = {});

struct ClientResponse {
  int status = 0;
  Headers headers;  // in arrival order, names as sent
  std::string body;

  // The first header of that name (case-insensitive), or "" when absent.
  std::string_view header(std::string_view name) const;
};

namespace detail {
struct CancelState;
struct StreamState;
struct ClientCore;
}  // namespace detail

// Cancels the call it is given to, from anywhere. Copies share one state; cancel() is
// thread-safe, idempotent and sticky (a call given a handle already cancelled fails at once).
// A handle serves one call at a time (a second call in flight would take it over).
class CancelHandle {
 public:
  CancelHandle();
  void cancel() const;
  bool cancelled() const;

 private:
  friend struct detail::ClientCore;
  std::shared_ptr<detail::CancelState> state_;
};

// An open server-sent-events response. Owns its connection until the stream ends (the
// connection then goes back to the pool), fails, or the EventStream is closed or destroyed
// (the connection is then closed). Move-only; one coroutine at a time.
class EventStream {
 public:
  EventStream(EventStream&&) noexcept;
  EventStream& operator=(EventStream&&) noexcept;
  ~EventStream();

  int status() const;
  const Headers& headers() const;
  // The whole body of a non-2xx answer (read by open_stream, bounded by max_body_bytes),
  // which is not split into events; empty for a 2xx answer.
  const std::string& body() const;

  // The next event's data, as soon as the server's bytes complete it. std::nullopt when the
  // stream ended cleanly (and at once for a non-2xx answer). After an error, or after
  // the end, every call returns the same.
  boost::asio::awaitable<Result<std::optional<std::string>>> next();

  // Ends the stream now, closing its connection. Idempotent. Call it where next() would
  // be called; from another thread, cancel the CancelHandle instead.
  void close();

 private:
  friend struct detail::ClientCore;
  explicit EventStream(std::unique_ptr<detail::StreamState> state);
  std::unique_ptr<detail::StreamState> state_;
};

// What stream() read besides the events.
struct StreamResult {
  int status = 0;
  Headers headers;
  std::string body;  // a non-2xx answer's body (see EventStream::body)
  int64_t num_events = 0;
};

// Called with each event's data (valid during the call only), on the coroutine's executor.
using EventCallback = std::function<void(std::string_view data)>;

// Counters since the Client was made, and one gauge (idle_connections).
struct ClientStats {
  uint64_t connections_opened = 0;  // successful connects
  uint64_t connections_reused = 0;  // exchanges that took a pooled connection
  uint64_t stale_dropped = 0;       // pooled connections found closed before reuse
  uint64_t retries = 0;             // exchanges sent again under the stale-connection rule
  uint64_t expired_closed = 0;      // idle connections closed by idle_timeout_ms
  int64_t idle_connections = 0;
};

class Client {
 public:
  // Sockets and timers live on `executor`. Precondition: validate(options) passed.
  Client(boost::asio::any_io_executor executor, ClientOptions options);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Sends the request and reads the whole response (bounded by max_body_bytes). Any HTTP
  // status is a value; an error only when no whole answer came.
  boost::asio::awaitable<Result<ClientResponse>> request(ClientRequest request,
                                                         CancelHandle cancel = {});

  // Sends the request and reads the response header (and the whole body of a non-2xx
  // answer). The handle stays in force for the stream's whole life.
  boost::asio::awaitable<Result<EventStream>> open_stream(ClientRequest request,
                                                          CancelHandle cancel = {});

  // open_stream, then every event to on_event in order; returns when the stream ends.
  boost::asio::awaitable<Result<StreamResult>> stream(ClientRequest request, EventCallback on_event,
                                                      CancelHandle cancel = {});

  // Closes idle connections past idle_timeout_ms; returns how many. The pool also does this
  // as it is used; a router with quiet hosts may call it from a timer.
  int64_t close_expired();
  // Closes every idle connection; returns how many.
  int64_t close_idle();

  ClientStats stats() const;
  const ClientOptions& options() const;
  boost::asio::any_io_executor executor() const;

 private:
  std::shared_ptr<detail::ClientCore> core_;
};

// A Client on its own I/O thread, for threads that want to wait: each call runs the async
// call there and blocks until it ends. Thread-safe: any number of threads may call at once
// (their exchanges run concurrently on the one I/O thread). A call must not be made from
// that thread (an on_event callback): it would wait on itself. Destroy it only when no call
// is in flight.
class BlockingClient {
 public:
  explicit BlockingClient(ClientOptions options = {});
  ~BlockingClient();
  BlockingClient(const BlockingClient&) = delete;
  BlockingClient& operator=(const BlockingClient&) = delete;

  Result<ClientResponse> request(ClientRequest request, CancelHandle cancel = {});
  // on_event runs on the I/O thread (the caller is blocked meanwhile): keep it short.
  Result<StreamResult> stream(ClientRequest request, const EventCallback& on_event,
                              CancelHandle cancel = {});

  ClientStats stats() const;
  // The async client on the I/O thread (co_spawn onto its executor to use it).
  Client& async_client();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata::http
