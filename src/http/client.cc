// The Client facade: CancelHandle, and the public coroutines, each wrapped in guarded() so
// that nothing throws past them (see client.h for the contracts). The work is done by
// ClientCore: the pool (client_pool.cc), an exchange (client_exchange.cc), an event stream
// (client_stream.cc).
#include "http/client.h"

#include <memory>
#include <string>
#include <utility>

#include "common/check.h"
#include "http/client_internal.h"

namespace strata::http {

namespace {

using detail::guarded;
using detail::host_port;

std::string what_of(const ClientRequest& r) {
  return r.method + " http://" + host_port(r.host, r.port) + r.target;
}

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

// ---- CancelHandle ----

CancelHandle::CancelHandle() : state_(std::make_shared<detail::CancelState>()) {}

void CancelHandle::cancel() const {
  state_->cancel();
}

bool CancelHandle::cancelled() const {
  return state_->is_cancelled();
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

}  // namespace strata::http
