#include "http/server.h"

#include <sys/resource.h>
#include <sys/socket.h>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/log.h"

namespace strata::http {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = net::ip::tcp;
using SteadyClock = std::chrono::steady_clock;

constexpr auto kNoThrow = net::as_tuple(net::use_awaitable);

std::chrono::steady_clock::duration seconds(double s) {
  return std::chrono::duration_cast<SteadyClock::duration>(std::chrono::duration<double>(s));
}

std::string error_json(int status, std::string_view message, std::string_view code) {
  const char* type = status >= 500 ? "server_error" : "invalid_request_error";
  return nlohmann::json{{"error", {{"message", message}, {"type", type}, {"code", code}}}}.dump(
      -1, ' ', false, nlohmann::json::error_handler_t::replace);
}

Response error_response(int status, std::string_view message, std::string_view code) {
  return Response{.status = status, .body = error_json(status, message, code)};
}

// Transfer-Encoding: only "chunked" is understood (RFC 9112 §6.1: a server answers an
// unknown coding with 501).
bool only_chunked(std::string_view value) {
  bool any = false;
  while (!value.empty()) {
    const size_t comma = value.find(',');
    std::string_view token = value.substr(0, comma);
    value = comma == std::string_view::npos ? std::string_view() : value.substr(comma + 1);
    while (!token.empty() && (token.front() == ' ' || token.front() == '\t'))
      token.remove_prefix(1);
    while (!token.empty() && (token.back() == ' ' || token.back() == '\t')) token.remove_suffix(1);
    if (token.empty()) continue;
    if (!iequals(token, "chunked")) return false;
    any = true;
  }
  return any;
}

// What a refused connection gets before it is closed (best effort, never waited for).
const std::string& refused_response() {
  static const std::string text = [] {
    const std::string body =
        error_json(503, "too many open connections, or shutting down", "too_many_connections");
    return "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
           "Connection: close\r\nContent-Length: " +
           std::to_string(body.size()) + "\r\n\r\n" + body;
  }();
  return text;
}

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

}  // namespace

class Connection;

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
  Counters counters;
  struct RouteEntry {
    std::string method;
    Handler handler;
  };
  std::unordered_map<std::string, std::vector<RouteEntry>> routes;
  std::function<void(const Request&, int)> on_response;
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
  std::function<void()> waker() override;
  net::awaitable<bool> wait(std::chrono::milliseconds timeout) override;
  bool abandoned() const override { return gone_ || write_failed_ || abandoned_by_server_; }
  net::awaitable<void> sleep(std::chrono::milliseconds duration) override {
    net::steady_timer t(stream_.get_executor(), duration);
    co_await t.async_wait(kNoThrow);
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

net::awaitable<void> Connection::run() {
  const ServerOptions& o = s_.options;
  bool first = true;
  // The first request's header is due header_timeout_s after the accept; a later one's,
  // header_timeout_s after its first byte.
  auto header_deadline = SteadyClock::now() + seconds(o.header_timeout_s);
  for (;;) {
    if (s_.stopping.load() || abandoned_by_server_) break;
    bhttp::request_parser<bhttp::string_body> parser;
    parser.header_limit(
        static_cast<std::uint32_t>(std::min<int64_t>(o.max_header_bytes, UINT32_MAX)));
    parser.body_limit(static_cast<std::uint64_t>(o.max_body_bytes));

    // Between requests (or before the first): wait for a first byte.
    if (buffer_.size() == 0) {
      if (first) {
        stream_.expires_at(header_deadline);
      } else {
        stream_.expires_after(seconds(o.idle_timeout_s));
      }
      auto [ec, n] = co_await stream_.async_read_some(buffer_.prepare(8192), kNoThrow);
      if (ec) {
        STRATA_LOG_DEBUG("connection {}: {} waiting for a request", remote_, ec.message());
        if (ec == beast::error::timeout) {
          (first ? s_.counters.header_timeouts : s_.counters.idle_timeouts).fetch_add(1);
        }
        break;
      }
      buffer_.commit(n);
      if (!first) header_deadline = SteadyClock::now() + seconds(o.header_timeout_s);
    } else if (!first) {
      header_deadline = SteadyClock::now() + seconds(o.header_timeout_s);
    }
    stream_.expires_at(header_deadline);
    if (auto [ec, n] = co_await bhttp::async_read_header(stream_, buffer_, parser, kNoThrow); ec) {
      co_await answer_framing_error(ec, Phase::kHeader);
      break;
    }
    if (const auto te = parser.get()[bhttp::field::transfer_encoding];
        !te.empty() && !only_chunked(te)) {
      s_.counters.bad_requests.fetch_add(1);
      co_await write_response(error_response(501,
                                             "unsupported Transfer-Encoding '" + std::string(te) +
                                                 "' (only chunked is understood)",
                                             "not_implemented"),
                              true);
      co_await lingering_close();
      co_return;
    }
    if (!parser.is_done()) {
      if (iequals(parser.get()[bhttp::field::expect], "100-continue")) {
        static constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
        stream_.expires_after(seconds(o.write_timeout_s));
        auto [ec, n] = co_await net::async_write(stream_, net::buffer(kContinue), kNoThrow);
        if (ec) break;
      }
      stream_.expires_after(seconds(o.body_timeout_s));
      if (auto [ec, n] = co_await bhttp::async_read(stream_, buffer_, parser, kNoThrow); ec) {
        co_await answer_framing_error(ec, Phase::kBody);
        break;
      }
    }
    stream_.expires_never();

    keep_alive_ = parser.get().keep_alive();
    auto message = parser.release();
    request_ = Request{};
    request_.method = std::string(message.method_string());
    request_.target = std::string(message.target());
    const size_t q = request_.target.find('?');
    request_.path = request_.target.substr(0, q);
    if (q != std::string::npos) request_.query = request_.target.substr(q + 1);
    for (const auto& field : message) {
      request_.headers.emplace_back(std::string(field.name_string()), std::string(field.value()));
    }
    request_.body = std::move(message.body());
    request_.remote = remote_;

    co_await serve_request();
    if (gone_ || write_failed_ || close_after_ || !keep_alive_ || abandoned_by_server_) {
      STRATA_LOG_DEBUG(
          "connection {} closes after {} {}: gone {} write_failed {} close {} "
          "keep_alive {} abandoned {}",
          remote_, request_.method, request_.path, gone_, write_failed_, close_after_, keep_alive_,
          abandoned_by_server_);
      break;
    }
    first = false;
  }
  co_await lingering_close();
}

net::awaitable<void> Connection::serve_request() {
  ++serial_;
  in_request_ = true;
  woken_ = false;
  status_ = 0;
  streaming_ = stream_ended_ = false;
  s_.counters.requests.fetch_add(1);
  s_.active_requests.fetch_add(1);
  start_watch();

  const Handler* handler = nullptr;
  const auto route = s_.routes.find(request_.path);
  if (route != s_.routes.end()) {
    for (const auto& r : route->second) {
      if (r.method == request_.method) handler = &r.handler;
    }
    // HEAD runs the GET handler; write_response sends its header without the body.
    if (handler == nullptr && request_.method == "HEAD") {
      for (const auto& r : route->second) {
        if (r.method == "GET") handler = &r.handler;
      }
    }
  }
  if (handler == nullptr) {
    if (route != s_.routes.end()) {
      Response r =
          error_response(405, "method " + request_.method + " is not allowed on " + request_.path,
                         "method_not_allowed");
      std::string allow;
      for (const auto& e : route->second) allow += (allow.empty() ? "" : ", ") + e.method;
      r.headers.emplace_back("Allow", allow);
      co_await respond(std::move(r));
    } else {
      co_await respond(error_response(404, "no route for " + request_.method + " " + request_.path,
                                      "not_found"));
    }
  } else {
    std::string fault;
    try {
      co_await (*handler)(*this);
    } catch (const std::exception& e) {
      fault = e.what();
    } catch (...) {
      fault = "unknown exception";
    }
    if (!fault.empty()) {
      s_.counters.handler_faults.fetch_add(1);
      STRATA_LOG_ERROR("handler fault on {} {}: {}", request_.method, request_.path, fault);
    }
    if (status_ == 0 && !abandoned()) {
      if (fault.empty()) {
        s_.counters.handler_faults.fetch_add(1);
        fault = "the handler gave no answer";
      }
      co_await respond(error_response(500, "internal error: " + fault, "internal"));
    } else if (streaming_ && !stream_ended_) {
      close_after_ = true;  // a stream cut short: the connection cannot carry another request
    }
  }
  stop_watch();
  in_request_ = false;
  s_.active_requests.fetch_sub(1);
  if (s_.on_response) s_.on_response(request_, status_ == 0 ? 499 : status_);
}

net::awaitable<void> Connection::answer_framing_error(const beast::error_code& ec, Phase phase) {
  STRATA_LOG_DEBUG("connection {}: {} reading a request's {}", remote_, ec.message(),
                   phase == Phase::kHeader ? "header" : "body");
  if (ec == beast::error::timeout) {
    (phase == Phase::kHeader ? s_.counters.header_timeouts : s_.counters.body_timeouts)
        .fetch_add(1);
    co_return;
  }
  if (ec == bhttp::error::end_of_stream || ec == bhttp::error::partial_message ||
      ec == net::error::eof || ec == net::error::connection_reset ||
      ec == net::error::operation_aborted || ec == net::error::bad_descriptor) {
    co_return;  // the client went away (or shutdown closed the socket): nobody to answer
  }
  s_.counters.bad_requests.fetch_add(1);
  Response r;
  if (ec == bhttp::error::header_limit) {
    r = error_response(431,
                       "request header over " + std::to_string(s_.options.max_header_bytes) +
                           " bytes (--http-max-header-bytes)",
                       "header_too_large");
  } else if (ec == bhttp::error::body_limit) {
    r = error_response(413,
                       "request body over " + std::to_string(s_.options.max_body_bytes) +
                           " bytes (--http-max-body-bytes)",
                       "payload_too_large");
  } else {
    r = error_response(400, "malformed HTTP request: " + ec.message(), "bad_request");
  }
  co_await write_response(std::move(r), true);
}

net::awaitable<void> Connection::write_response(Response response, bool close) {
  status_ = response.status;
  bhttp::response<bhttp::string_body> res{static_cast<bhttp::status>(response.status), 11};
  res.set(bhttp::field::server, "strata");
  res.set(bhttp::field::content_type, response.content_type);
  for (auto& [k, v] : response.headers) res.insert(k, v);
  res.keep_alive(!close && keep_alive_ && !close_after_ && !s_.stopping.load());
  res.body() = std::move(response.body);
  res.prepare_payload();
  if (request_.method == "HEAD") {
    res.body().clear();  // the header says what a GET would get; no body follows (RFC 9110 §9.3.2)
  }
  stream_.expires_after(seconds(s_.options.write_timeout_s));
  auto [ec, n] = co_await bhttp::async_write(stream_, res, kNoThrow);
  stream_.expires_never();
  if (ec) {
    write_failed_ = true;
    if (ec == beast::error::timeout) s_.counters.write_timeouts.fetch_add(1);
  }
  if (close) close_after_ = true;
}

// Closes so that an answer already written is not lost to a reset: stop sending, read
// (and drop) what the client still sends for a moment, then close.
net::awaitable<void> Connection::lingering_close() {
  beast::error_code ec;
  stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
  if (!ec && stream_.socket().is_open()) {
    stream_.expires_after(std::chrono::milliseconds(500));
    std::array<char, 4096> sink{};
    size_t drained = 0;
    while (drained < (64U << 10)) {
      auto [rec, n] = co_await stream_.async_read_some(net::buffer(sink), kNoThrow);
      if (rec) break;
      drained += n;
    }
  }
  stream_.socket().close(ec);
}

net::awaitable<void> Connection::respond(Response response) {
  if (status_ != 0 || streaming_) {
    STRATA_LOG_ERROR("a handler answered {} {} twice", request_.method, request_.path);
    co_return;
  }
  if (gone_) {
    status_ = response.status;
    co_return;
  }
  co_await write_response(std::move(response), false);
}

net::awaitable<bool> Connection::begin_stream(int status, std::string content_type,
                                              Headers headers) {
  if (status_ != 0 || streaming_) co_return false;
  streaming_ = true;
  status_ = status;
  if (abandoned()) co_return false;
  bhttp::response<bhttp::empty_body> res{static_cast<bhttp::status>(status), 11};
  res.set(bhttp::field::server, "strata");
  res.set(bhttp::field::content_type, content_type);
  for (auto& [k, v] : headers) res.insert(k, v);
  res.keep_alive(keep_alive_ && !s_.stopping.load());
  res.chunked(true);
  bhttp::response_serializer<bhttp::empty_body> sr{res};
  stream_.expires_after(seconds(s_.options.write_timeout_s));
  auto [ec, n] = co_await bhttp::async_write_header(stream_, sr, kNoThrow);
  stream_.expires_never();
  if (ec) {
    write_failed_ = true;
    if (ec == beast::error::timeout) s_.counters.write_timeouts.fetch_add(1);
    client_gone();
    co_return false;
  }
  co_return true;
}

bool Connection::send(std::string bytes) {
  if (!streaming_ || stream_ended_ || abandoned()) return false;
  if (bytes.empty()) return true;
  pending_ += bytes;
  if (static_cast<int64_t>(pending_.size() + inflight_.size()) >
      s_.options.max_stream_buffer_bytes) {
    // The client reads slower than we produce: end its stream rather than buffer on.
    s_.counters.slow_streams_cancelled.fetch_add(1);
    STRATA_LOG_WARN("{} {} from {}: the client reads too slowly ({} bytes queued); stream cut",
                    request_.method, request_.path, remote_, pending_.size() + inflight_.size());
    write_failed_ = true;
    pending_.clear();
    beast::error_code ec;
    stream_.socket().close(ec);
    return false;
  }
  if (!writing_) start_write();
  return true;
}

void Connection::start_write() {
  writing_ = true;
  inflight_ = std::move(pending_);
  pending_.clear();
  stream_.expires_after(seconds(s_.options.write_timeout_s));
  net::async_write(stream_, bhttp::make_chunk(net::buffer(inflight_)),
                   [self = shared_from_this()](const beast::error_code& ec, size_t) {
                     self->writing_ = false;
                     self->inflight_.clear();
                     self->stream_.expires_never();
                     if (ec) {
                       self->write_failed_ = true;
                       if (ec == beast::error::timeout) {
                         self->s_.counters.write_timeouts.fetch_add(1);
                       }
                       self->client_gone();
                     } else if (!self->pending_.empty() && !self->abandoned()) {
                       self->start_write();
                     }
                     self->wake_local();
                   });
}

net::awaitable<bool> Connection::end_stream() {
  if (!streaming_ || stream_ended_) co_return false;
  while (!gone_ && !write_failed_ && (writing_ || !pending_.empty())) {
    if (!writing_) start_write();
    if (!woken_) {
      wake_timer_.expires_after(seconds(s_.options.write_timeout_s));
      co_await wake_timer_.async_wait(kNoThrow);
    }
    woken_ = false;
  }
  if (gone_ || write_failed_) co_return false;
  stream_.expires_after(seconds(s_.options.write_timeout_s));
  auto [ec, n] = co_await net::async_write(stream_, bhttp::make_chunk_last(), kNoThrow);
  stream_.expires_never();
  if (ec) {
    write_failed_ = true;
    client_gone();
    co_return false;
  }
  stream_ended_ = true;
  co_return true;
}

std::function<void()> Connection::waker() {
  return [weak = weak_from_this(), ex = stream_.get_executor(), serial = serial_] {
    net::post(ex, [weak, serial] {
      if (auto self = weak.lock(); self && self->in_request_ && self->serial_ == serial) {
        self->wake_local();
      }
    });
  };
}

net::awaitable<bool> Connection::wait(std::chrono::milliseconds timeout) {
  if (abandoned()) co_return false;
  if (!woken_) {
    wake_timer_.expires_after(timeout);
    co_await wake_timer_.async_wait(kNoThrow);
  }
  woken_ = false;
  co_return !abandoned();
}

void Connection::start_watch() {
  watching_ = true;
  const uint64_t generation = ++watch_generation_;
  stream_.socket().async_wait(
      tcp::socket::wait_read,
      net::bind_cancellation_slot(watch_cancel_.slot(), [self = shared_from_this(),
                                                         generation](const beast::error_code& ec) {
        self->on_watch(generation, ec);
      }));
}

void Connection::stop_watch() {
  if (!watching_) return;
  watching_ = false;
  ++watch_generation_;
  watch_cancel_.emit(net::cancellation_type::all);
}

void Connection::on_watch(uint64_t generation, const beast::error_code& ec) {
  if (generation != watch_generation_ || !watching_) return;
  if (ec == net::error::operation_aborted) return;
  if (ec) return client_gone();
  // A wake-up is not proof: the reactor may report readiness that a read then finds gone
  // (edge-triggered epoll after the body was read). Peek without blocking: 0 bytes is the
  // peer's FIN, EAGAIN a spurious wake-up, an error a reset.
  char probe = 0;
  const ssize_t peeked =
      ::recv(stream_.socket().native_handle(), &probe, 1, MSG_PEEK | MSG_DONTWAIT);
  if (peeked == 0) return client_gone();
  if (peeked < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return start_watch();
    return client_gone();
  }
  beast::error_code aec;
  const size_t available = std::max<size_t>(1, stream_.socket().available(aec));
  if (aec) return client_gone();
  // The client sent more (a pipelined request): keep it for after this one, up to a bound.
  if (static_cast<int64_t>(buffer_.size()) > s_.options.max_header_bytes + (64 << 10)) {
    watching_ = false;  // the next read will deal with it
    return;
  }
  const size_t n = std::min<size_t>(available, 64 << 10);
  const size_t got = stream_.socket().read_some(buffer_.prepare(n), aec);
  if (aec) return client_gone();
  buffer_.commit(got);
  start_watch();
}

void Connection::client_gone() {
  if (gone_) return;
  gone_ = true;
  if (in_request_) s_.counters.client_disconnects.fetch_add(1);
  wake_local();
}

template <typename F>
void Server::Impl::for_each_connection(F f) {
  std::vector<std::shared_ptr<Connection>> all;
  {
    std::lock_guard lock(connections_mutex);
    for (auto& [id, weak] : connections) {
      if (auto c = weak.lock()) all.push_back(std::move(c));
    }
  }
  for (auto& c : all) f(*c);
}

void Server::Impl::refuse(tcp::socket& socket) {
  counters.connections_refused.fetch_add(1);
  const int fd = socket.native_handle();
  const std::string& text = refused_response();
  [[maybe_unused]] const ssize_t n =
      ::send(fd, text.data(), text.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  beast::error_code ec;
  socket.shutdown(tcp::socket::shutdown_both, ec);
  socket.close(ec);
}

net::awaitable<void> Server::Impl::accept_loop() {
  auto last_warning = SteadyClock::now() - std::chrono::hours(1);
  for (;;) {
    auto [ec, accepted] = co_await acceptor.async_accept(net::make_strand(ioc), kNoThrow);
    tcp::socket socket(std::move(accepted));  // keeps the strand as its executor
    if (ec) {
      if (ec == net::error::operation_aborted || !acceptor.is_open()) co_return;
      // Out of descriptors (or another transient fault): say so now and then, back off.
      if (SteadyClock::now() - last_warning > std::chrono::seconds(5)) {
        STRATA_LOG_WARN("accept failed: {} ({} connections open)", ec.message(),
                        counters.open_connections.load());
        last_warning = SteadyClock::now();
      }
      net::steady_timer t(ioc, std::chrono::milliseconds(20));
      co_await t.async_wait(kNoThrow);
      continue;
    }
    if (stopping.load() || counters.open_connections.load() >= options.max_connections) {
      refuse(socket);
      continue;
    }
    counters.open_connections.fetch_add(1);
    counters.connections_accepted.fetch_add(1);
    beast::error_code nec;
    socket.set_option(tcp::no_delay(true), nec);
    const uint64_t id = next_connection_id++;
    auto conn = std::make_shared<Connection>(*this, std::move(socket), id);
    {
      std::lock_guard lock(connections_mutex);
      connections.emplace(id, conn);
    }
    net::co_spawn(conn->executor(), conn->run(), [conn](std::exception_ptr e) {
      if (!e) return;
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& ex) {
        STRATA_LOG_ERROR("connection fault: {}", ex.what());
      } catch (...) {
        STRATA_LOG_ERROR("connection fault");
      }
    });
  }
}

Status validate(const ServerOptions& o) {
  auto bad = [](const std::string& m) { return make_error(ErrorCode::kInvalidArgument, m); };
  if (o.port < 0 || o.port > 65535) return bad("port must be in [0, 65535]");
  if (o.io_threads < 0 || o.io_threads > 1024) return bad("--http-threads must be in [0, 1024]");
  if (o.worker_threads < 0 || o.worker_threads > 1024) return bad("worker threads in [0, 1024]");
  for (auto [name, v] : {std::pair{"--http-header-timeout-s", o.header_timeout_s},
                         std::pair{"--http-body-timeout-s", o.body_timeout_s},
                         std::pair{"--http-idle-timeout-s", o.idle_timeout_s},
                         std::pair{"--http-write-timeout-s", o.write_timeout_s}}) {
    if (!(v > 0) || v > 86400) return bad(std::string(name) + " must be in (0, 86400] seconds");
  }
  if (o.max_header_bytes < 1024 || o.max_header_bytes > (int64_t{1} << 30)) {
    return bad("--http-max-header-bytes must be in [1024, 2^30]");
  }
  if (o.max_body_bytes < 0) return bad("--http-max-body-bytes must be >= 0");
  if (o.max_connections < 1) return bad("--http-max-connections must be >= 1");
  if (o.max_stream_buffer_bytes < 4096)
    return bad("--http-max-stream-buffer-bytes must be >= 4096");
  return {};
}

Server::Server(ServerOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}

Server::~Server() {
  shutdown(0);
}

void Server::route(std::string method, std::string path, Handler handler) {
  impl_->routes[std::move(path)].push_back({std::move(method), std::move(handler)});
}

void Server::on_response(std::function<void(const Request&, int)> hook) {
  impl_->on_response = std::move(hook);
}

Status Server::bind() {
  Impl& s = *impl_;
  if (auto v = validate(s.options); !v) return v;
  // Every connection is a descriptor: use what the hard limit allows.
  if (rlimit rl{}; getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
  if (rlimit rl{}; getrlimit(RLIMIT_NOFILE, &rl) == 0 &&
                   static_cast<int64_t>(rl.rlim_cur) < s.options.max_connections + 64) {
    STRATA_LOG_WARN(
        "--http-max-connections {} is above the open-file limit {}: accept will fail "
        "before the cap",
        s.options.max_connections, rl.rlim_cur);
  }
  beast::error_code ec;
  const auto address = net::ip::make_address(s.options.host, ec);
  if (ec)
    return make_error(ErrorCode::kInvalidArgument, "'" + s.options.host + "' is not an IP address");
  const tcp::endpoint ep(address, static_cast<unsigned short>(s.options.port));
  s.acceptor.open(ep.protocol(), ec);
  if (!ec) s.acceptor.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) s.acceptor.bind(ep, ec);
  if (!ec) s.acceptor.listen(net::socket_base::max_listen_connections, ec);
  if (ec) {
    return make_error(ErrorCode::kIoError, "cannot listen on " + s.options.host + ":" +
                                               std::to_string(s.options.port) + ": " +
                                               ec.message());
  }
  s.port = s.acceptor.local_endpoint().port();
  return {};
}

int Server::port() const {
  return impl_->port;
}

void Server::start() {
  Impl& s = *impl_;
  if (s.started) return;
  s.started = true;
  const int workers = s.options.worker_threads > 0
                          ? s.options.worker_threads
                          : std::max(4, 2 * static_cast<int>(std::thread::hardware_concurrency()));
  s.workers = std::make_unique<net::thread_pool>(static_cast<size_t>(workers));
  s.work.emplace(s.ioc.get_executor());
  net::co_spawn(s.ioc, s.accept_loop(), [](std::exception_ptr e) {
    if (e) STRATA_LOG_ERROR("the accept loop ended with an exception");
  });
  for (int i = 0; i < s.io_threads; ++i) s.threads.emplace_back([&s] { s.ioc.run(); });
}

bool Server::stopping() const {
  return impl_->stopping.load();
}

void Server::shutdown(double timeout_s) {
  Impl& s = *impl_;
  std::lock_guard lock(s.shutdown_mutex);
  if (s.stopped) return;
  s.stopped = true;
  s.stopping.store(true);
  if (!s.started) return;
  net::post(s.ioc, [&s] {
    beast::error_code ec;
    s.acceptor.close(ec);
  });
  s.for_each_connection([](Connection& c) { c.close_if_idle(); });
  auto wait_until = [&](SteadyClock::time_point deadline, auto done) {
    while (!done() && SteadyClock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  };
  wait_until(SteadyClock::now() + seconds(std::max(0.0, timeout_s)),
             [&] { return s.active_requests.load() == 0; });
  if (s.active_requests.load() > 0) {
    STRATA_LOG_WARN("shutdown: abandoning {} running request(s)", s.active_requests.load());
  }
  s.for_each_connection([](Connection& c) { c.abandon(); });
  wait_until(SteadyClock::now() + std::chrono::seconds(5),
             [&] { return s.counters.open_connections.load() == 0; });
  s.work.reset();
  s.ioc.stop();
  for (auto& t : s.threads) t.join();
  s.threads.clear();
  s.workers->join();
}

ServerStats Server::stats() const {
  const Counters& c = impl_->counters;
  ServerStats out;
  out.open_connections = c.open_connections.load();
  out.connections_accepted = c.connections_accepted.load();
  out.connections_refused = c.connections_refused.load();
  out.requests = c.requests.load();
  out.header_timeouts = c.header_timeouts.load();
  out.body_timeouts = c.body_timeouts.load();
  out.idle_timeouts = c.idle_timeouts.load();
  out.write_timeouts = c.write_timeouts.load();
  out.client_disconnects = c.client_disconnects.load();
  out.slow_streams_cancelled = c.slow_streams_cancelled.load();
  out.bad_requests = c.bad_requests.load();
  out.handler_faults = c.handler_faults.load();
  return out;
}

}  // namespace strata::http
