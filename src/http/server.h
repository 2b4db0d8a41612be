// An HTTP/1.1 server on Boost.Beast and Boost.Asio: a fixed pool of I/O threads running one
// coroutine per connection (no thread per connection), a small worker pool for blocking
// work (Exchange::offload), and limits that keep slow or hostile clients from costing
// anything: header, body, idle and write timeouts, header and body size limits, a cap on
// open connections, a bound on each stream's write queue.
//
// Framing errors are answered and the connection closed: a malformed request 400, a header
// over max_header_bytes 431, a body over max_body_bytes 413, an unknown transfer coding 501.
// Pipelined requests are answered in order. Every error body is the JSON
// {"error": {"message", "type", "code"}}.
//
// Threads: route() and the hooks are set before start(). Handlers run on I/O threads (see
// exchange.h). stats() and shutdown() may be called from any thread except an I/O or
// worker thread of this server.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "common/result.h"
#include "http/exchange.h"
#include "http/message.h"

namespace CLI {
class App;
}  // namespace CLI

namespace strata::http {

struct ServerOptions {
  std::string host = "127.0.0.1";        // bind address
  int port = 8000;                       // 0: any free port (see Server::port())
  int io_threads = 0;                    // I/O threads; 0: one per core
  int worker_threads = 0;                // blocking work (offload); 0: max(4, 2 x cores)
  double header_timeout_s = 10;          // a request's whole header, from its first byte (the first
                                         // request of a connection: from the accept), > 0
  double body_timeout_s = 60;            // the body, after the header, > 0
  double idle_timeout_s = 60;            // a keep-alive connection between requests, > 0
  double write_timeout_s = 60;           // one write making no progress, > 0
  int64_t max_header_bytes = 16 * 1024;  // request line + headers, >= 1024
  int64_t max_body_bytes = int64_t{32} << 20;          // >= 0
  int64_t max_connections = 4096;                      // open connections, >= 1
  int64_t max_stream_buffer_bytes = int64_t{4} << 20;  // queued, unwritten stream bytes, >= 4096
};

Status validate(const ServerOptions& options);

// Command-line flags of ServerOptions, bound to `options` (which must outlive the parse),
// each default the field's value when registered. add_listen_flags: --host, --port.
// add_limit_flags: --http-threads and the --http-* timeouts and size limits. validate()
// checks them again (with the flag's name) when the server binds.
void add_listen_flags(CLI::App& cmd, ServerOptions& options);
void add_limit_flags(CLI::App& cmd, ServerOptions& options);

// Monotonic counters and one gauge (open_connections), read with stats().
struct ServerStats {
  int64_t open_connections = 0;
  uint64_t connections_accepted = 0;
  uint64_t connections_refused = 0;  // over max_connections, or while shutting down
  uint64_t requests = 0;
  uint64_t header_timeouts = 0;
  uint64_t body_timeouts = 0;
  uint64_t idle_timeouts = 0;
  uint64_t write_timeouts = 0;
  uint64_t client_disconnects = 0;      // the client left while its request ran
  uint64_t slow_streams_cancelled = 0;  // a stream's write queue went over its bound
  uint64_t bad_requests = 0;            // framing errors answered 4xx/501 and closed
  uint64_t handler_faults = 0;          // handlers that threw or did not answer (500)
};

class Connection;

using Handler = std::function<boost::asio::awaitable<void>(Exchange&)>;

class Server {
 public:
  explicit Server(ServerOptions options);
  ~Server();  // shutdown(0) if still running
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Adds a route: exact path, or a path ending in "/*" for any one non-empty last segment
  // (the handler reads it from the request's path; an exact route wins). A path known for
  // other methods answers 405, an unknown one 404. Before start().
  void route(std::string method, std::string path, Handler handler);
  // Called on an I/O thread after each answered request (metrics, logs), with the route
  // that took it as registered ("/v1/responses/*"), or "" when none did (a 404). Before
  // start().
  using ResponseHook = std::function<void(const Request&, std::string_view route, int status)>;
  void on_response(ResponseHook hook);

  // Binds and listens; a clear error when the address is taken. Raises the soft limit on
  // open files to the hard limit (each connection is a descriptor).
  Status bind();
  int port() const;
  // Starts the I/O threads and the worker pool; returns at once.
  void start();
  // Stops accepting (new connections are refused), closes idle keep-alive connections,
  // lets running requests finish for up to timeout_s, then abandons the rest (their
  // handlers' wait() returns false), and stops the threads. Idempotent.
  void shutdown(double timeout_s);
  // True from shutdown() on.
  bool stopping() const;

  ServerStats stats() const;

 private:
  friend class Connection;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata::http
