// BlockingClient: a Client on its own I/O thread (one io_context, one thread), for threads
// that want to wait. Each call co_spawns the async call there and blocks on a future; the
// contracts are in client.h.
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>

#include <exception>
#include <future>
#include <thread>
#include <utility>

#include "http/client.h"

namespace strata::http {

namespace asio = boost::asio;

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
