// Private to the server's .cc files: Server::Impl (what the acceptor, the connections and
// the public methods share) and the Connection class. Not part of the API (see server.h and
// exchange.h for the contracts a caller relies on).
//
// The files:
//   server.cc             the acceptor and the lifecycle: bind, start, accept, refuse, shutdown
//   server_connection.cc  one connection's coroutine: read a request (header, body, framing
//                         errors), route it, run its handler, write the answer, keep-alive
//   server_exchange.cc    the Exchange a handler drives: answers, streams and their write
//                         queue, waits and wakers, the watch for a client that goes away
//   server_limits.cc      the limits and metrics: options' validation, the error bodies a
//                         bound answers with, stats()
//
// Threads: a Connection's members are touched only on its strand, except what its public
// methods post there (close_if_idle, abandon) and the waker. Server::Impl's atomics and
// `connections` (under connections_mutex) are shared by all threads; the rest is set before
// start() and read only after.
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "http/exchange.h"
#include "http/message.h"
#include "http/server.h"

namespace strata::http {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = net::ip::tcp;
using SteadyClock = std::chrono::steady_clock;

namespace detail {

inline constexpr auto kNoThrow = net::as_tuple(net::use_awaitable);

inline std::chrono::steady_clock::duration seconds(double s) {
  return std::chrono::duration_cast<SteadyClock::duration>(std::chrono::duration<double>(s));
}

// The JSON error body {"error": {"message", "type", "code"}}; the type is "server_error" for
// a 5xx status, else "invalid_request_error". Defined in server_limits.cc, as is the next.
std::string error_json(int status, std::string_view message, std::string_view code);
Response error_response(int status, std::string_view message, std::string_view code);

// What a refused connection gets before it is closed (best effort, never waited for).
const std::string& refused_response();

// Read by stats(); every thread adds to them.
struct Counters {
  std::atomic<int64_t> open_connections{0};
  std::atomic<uint64_t> connections_accepted{0};
  std::atomic<uint64_t> connections_refused{0};
  std::atomic<uint64_t> requests{0};
  std::atomic<uint64_t> header_timeouts{0};
  std::atomic<uint64_t> body_timeouts{0};
  std::atomic<uint64_t> idle_timeouts{0};
  std::atomic<uint64_t> write_timeouts{0};
  std::atomic<uint64_t> client_disconnects{0};
  std::atomic<uint64_t> slow_streams_cancelled{0};
  std::atomic<uint64_t> bad_requests{0};
  std::atomic<uint64_t> handler_faults{0};
};

}  // namespace detail

struct Server::Impl {
  explicit Impl(ServerOptions o)
      : options(std::move(o)),
        io_threads(options.io_threads > 0
                       ? options.io_threads
                       : static_cast<int>(std::max(1U, std::thread::hardware_concurrency()))),
        ioc(io_threads),
        acceptor(ioc) {}

  net::awaitable<void> accept_loop();
  void refuse(tcp::socket& socket);
  template <typename F>
  void for_each_connection(F f);

  // Declared before the io_context: handlers it still holds when it is destroyed (a
  // connection's coroutine frame) reach these from their destructors.
  ServerOptions options;
  int io_threads;
  detail::Counters counters;
  struct RouteEntry {
    std::string method;
    Handler handler;
  };
  std::unordered_map<std::string, std::vector<RouteEntry>> routes;
  Server::ResponseHook on_response;
  int port = 0;
  std::atomic<bool> stopping{false};
  std::atomic<int64_t> active_requests{0};
  bool started = false;
  bool stopped = false;
  std::mutex shutdown_mutex;
  std::mutex connections_mutex;
  std::unordered_map<uint64_t, std::weak_ptr<Connection>> connections;  // GUARDED_BY(above)
  uint64_t next_connection_id = 1;                                      // accept loop only

  net::io_context ioc;
  std::optional<net::executor_work_guard<net::io_context::executor_type>> work;
  std::unique_ptr<net::thread_pool> workers;
  tcp::acceptor acceptor;
  std::vector<std::thread> threads;
};

// One client connection: reads requests in order, runs each one's handler, writes its
// answer. Everything runs on the connection's strand.
class Connection : public Exchange, public std::enable_shared_from_this<Connection> {
 public:
  Connection(Server::Impl& server, tcp::socket socket, uint64_t id)
      : s_(server), id_(id), stream_(std::move(socket)), wake_timer_(stream_.get_executor()) {
    beast::error_code ec;
    const auto ep = stream_.socket().remote_endpoint(ec);
    if (!ec) remote_ = ep.address().to_string() + ":" + std::to_string(ep.port());
  }

  ~Connection() override {
    s_.counters.open_connections.fetch_sub(1);
    std::lock_guard lock(s_.connections_mutex);
    s_.connections.erase(id_);
  }

  net::any_io_executor executor() { return stream_.get_executor(); }

  net::awaitable<void> run();

  // From any thread (posted): close when no request runs (shutdown), or abandon the
  // running one (shutdown deadline).
  void close_if_idle() {
    net::post(stream_.get_executor(), [self = shared_from_this()] {
      if (!self->in_request_) {
        beast::error_code ec;
        self->stream_.socket().close(ec);
      }
    });
  }
  void abandon() {
    net::post(stream_.get_executor(), [self = shared_from_this()] {
      self->abandoned_by_server_ = true;
      if (self->in_request_) {
        self->wake_local();
      } else {
        beast::error_code ec;
        self->stream_.socket().close(ec);
      }
    });
  }

  // Exchange.
  const Request& request() const override { return request_; }
  net::awaitable<void> respond(Response response) override;
  net::awaitable<bool> begin_stream(int status, std::string content_type, Headers headers) override;
  bool send(std::string bytes) override;
  net::awaitable<bool> end_stream() override;
  size_t stream_queued_bytes() const override { return pending_.size() + inflight_.size(); }
  std::function<void()> waker() override;
  net::awaitable<bool> wait(std::chrono::milliseconds timeout) override;
  bool abandoned() const override { return gone_ || write_failed_ || abandoned_by_server_; }
  net::awaitable<void> sleep(std::chrono::milliseconds duration) override {
    net::steady_timer t(stream_.get_executor(), duration);
    co_await t.async_wait(detail::kNoThrow);
  }

 protected:
  net::any_io_executor worker_executor() override { return s_.workers->get_executor(); }

 private:
  enum class Phase { kHeader, kBody };
  net::awaitable<void> serve_request();
  net::awaitable<void> answer_framing_error(const beast::error_code& ec, Phase phase);
  net::awaitable<void> write_response(Response response, bool close);
  net::awaitable<void> lingering_close();
  void start_watch();
  void stop_watch();
  void on_watch(uint64_t generation, const beast::error_code& ec);
  void client_gone();
  void start_write();
  void wake_local() {
    woken_ = true;
    wake_timer_.cancel();
  }

  Server::Impl& s_;
  const uint64_t id_;
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  net::steady_timer wake_timer_;
  std::string remote_;

  // The request being served.
  Request request_;
  uint64_t serial_ = 0;  // bumps per request; a waker of an earlier request does nothing
  bool in_request_ = false;
  bool keep_alive_ = true;
  bool woken_ = false;
  bool gone_ = false;  // the client went away
  bool abandoned_by_server_ = false;
  bool close_after_ = false;  // this connection is not reused after the answer
  int status_ = 0;            // the answer's status, 0 before one
  bool streaming_ = false;
  bool stream_ended_ = false;
  bool writing_ = false;
  bool write_failed_ = false;
  std::string pending_;   // stream bytes queued behind the write in flight
  std::string inflight_;  // stream bytes being written
  // Disconnect watch: a wait for readability while a request runs.
  bool watching_ = false;
  uint64_t watch_generation_ = 0;
  net::cancellation_signal watch_cancel_;
};

}  // namespace strata::http
