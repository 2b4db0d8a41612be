// One request and its answer, as a route handler drives it. A handler is a coroutine that
// runs on its connection's strand (one of the server's I/O threads): it must not block.
// Blocking work (parsing a large body, rendering and tokenizing, waiting on the engine's
// commands) goes through offload(), which runs it on the server's small worker pool and
// resumes the handler on its strand.
//
// Long waits (generation) use wait(): producers on other threads (the engine's scheduler)
// call the function waker() returns, which is thread-safe and cheap (a post). wait() also
// returns when the client goes away (its socket closed or reset, noticed while the request
// runs, streaming or not) or the server's shutdown deadline passes: then it returns false
// and the handler must give up (cancel its engine request) and return.
//
// Answers: respond() once; or begin_stream(), send() any number of times, end_stream().
// send() never waits for the client: it queues, and a reader slower than the producer that
// lets more than the server's max_stream_buffer_bytes pile up loses its stream (counted).
// A handler that returns without answering gets a 500.
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <chrono>
#include <cstddef>
#include <exception>
#include <functional>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include "http/message.h"

namespace strata::http {

class Exchange {
 public:
  virtual ~Exchange() = default;

  virtual const Request& request() const = 0;

  // Sends a whole response. Call once, and not after begin_stream().
  virtual boost::asio::awaitable<void> respond(Response response) = 0;

  // Starts a chunked response. False when the client is gone.
  virtual boost::asio::awaitable<bool> begin_stream(int status, std::string content_type,
                                                    Headers headers = {}) = 0;
  // Queues bytes of the stream. False when the stream is over (client gone, a failed or
  // timed-out write, or the write queue over its bound): stop producing.
  virtual bool send(std::string bytes) = 0;
  // Writes what is queued and ends the stream. False when the client went away first.
  virtual boost::asio::awaitable<bool> end_stream() = 0;
  // Stream bytes queued by send() and not yet written. A producer with a bounded backlog
  // of its own (GET /cache/events) sends only while this is small, so that a slow reader's
  // backlog stays where the producer can drop it with a notice; wait() wakes when a write
  // completes.
  virtual size_t stream_queued_bytes() const = 0;

  // A thread-safe callable that wakes wait(). Valid until the handler returns; a call
  // after that does nothing.
  virtual std::function<void()> waker() = 0;
  // Waits until woken, the timeout, or the request is abandoned (client gone, shutdown
  // deadline). Returns !abandoned(). A wake that came before the call is not lost.
  virtual boost::asio::awaitable<bool> wait(std::chrono::milliseconds timeout) = 0;
  virtual bool abandoned() const = 0;

  // Sleeps on the strand (no thread is held).
  virtual boost::asio::awaitable<void> sleep(std::chrono::milliseconds duration) = 0;

  // Runs fn() on the worker pool and returns its result here. fn must not throw past the
  // pool (an exception is rethrown here, where the server turns it into a 500).
  template <typename F>
  boost::asio::awaitable<std::invoke_result_t<F&>> offload(F fn) {
    using R = std::invoke_result_t<F&>;
    if constexpr (std::is_void_v<R>) {
      co_await boost::asio::co_spawn(
          worker_executor(),
          [&fn]() -> boost::asio::awaitable<void> {
            fn();
            co_return;
          },
          boost::asio::use_awaitable);
    } else {
      // co_spawn hands back a default-constructed value with an exception: wrap R.
      std::optional<R> out = co_await boost::asio::co_spawn(
          worker_executor(),
          [&fn]() -> boost::asio::awaitable<std::optional<R>> { co_return std::optional<R>(fn()); },
          boost::asio::use_awaitable);
      co_return std::move(*out);
    }
  }

 protected:
  virtual boost::asio::any_io_executor worker_executor() = 0;
};

}  // namespace strata::http
