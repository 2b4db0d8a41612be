// The server's acceptor and lifecycle: bind() (with the open-file limit raised to what
// the hard limit allows), start() (the I/O threads and the worker pool), the accept loop
// (one coroutine per connection on its own strand; over max_connections or while shutting
// down a connection is refused with a 503), and shutdown() (stop accepting, close idle
// connections, let running requests finish until the deadline, abandon the rest, join).
#include "http/server.h"

#include <sys/resource.h>
#include <sys/socket.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/strand.hpp>

#include <algorithm>
#include <chrono>
#include <exception>
#include <thread>

#include "common/log.h"
#include "http/server_internal.h"

namespace strata::http {

using detail::kNoThrow;
using detail::seconds;

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
  const std::string& text = detail::refused_response();
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

Server::Server(ServerOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}

Server::~Server() {
  shutdown(0);
}

void Server::route(std::string method, std::string path, Handler handler) {
  impl_->routes[std::move(path)].push_back({std::move(method), std::move(handler)});
}

void Server::on_response(ResponseHook hook) {
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

}  // namespace strata::http
