// The client's connections: ClientCore's keep-alive pool (idle connections per host:port,
// the most recently used taken first, expired and stale ones dropped on the way; see
// client.h for the rules) and the connect of a new one.
//
// Threads: the pool's methods may be called from any thread; each holds ClientCore::mutex
// only to move connections in and out, and closes what it drops after letting go of it
// (`doomed` is declared before the lock, so it is destroyed after the unlock). connect()
// runs on the caller's coroutine.
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/ip/address.hpp>

#include <cerrno>
#include <string>
#include <vector>

#include "http/client_internal.h"

namespace strata::http::detail {

std::unique_ptr<Connection> ClientCore::take_idle(const std::string& key) {
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

void ClientCore::put_idle(std::unique_ptr<Connection> c) {
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

int64_t ClientCore::sweep_locked(Clock::time_point now, bool all,
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

int64_t ClientCore::sweep(bool all) {
  std::vector<std::unique_ptr<Connection>> doomed;
  std::lock_guard lock(mutex);
  const int64_t n = sweep_locked(Clock::now(), all, doomed);
  if (!all) expired_closed.fetch_add(static_cast<uint64_t>(n), std::memory_order_relaxed);
  return n;
}

void ClientCore::shut() {
  std::vector<std::unique_ptr<Connection>> doomed;
  std::lock_guard lock(mutex);
  closed = true;
  sweep_locked(Clock::now(), true, doomed);
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

}  // namespace strata::http::detail
