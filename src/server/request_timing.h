// Where a completion's time goes inside the server, phase by phase (docs/full-hit.md).
//
// A handful of clock reads per request, always on. The handler stamps its phases on its
// strand and on the worker pool (each offload orders the worker's stamps before the
// strand reads them); the engine's phases are stamped by the request stream's listener on
// the scheduler thread, hence atomics. The result goes out as a standard `Server-Timing`
// response header (whole answers; W3C Server Timing, durations in ms) and, at debug level,
// as one log line per completion that also has the time to write the answer.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>

#include "http/message.h"

namespace strata {

class RequestTiming {
 public:
  using Clock = std::chrono::steady_clock;

  explicit RequestTiming(const http::Request& request)
      : first_byte_(request.first_byte_at), read_(request.read_at) {}

  // The handler's phases, in order (each stamp is "this phase ended now").
  void worker_started() { worker_start_ = Clock::now(); }
  void parsed() { parsed_ = rendered_ = Clock::now(); }
  void rendered() { rendered_ = Clock::now(); }  // chat: the template's text is ready
  void tokenized() { tokenized_ = Clock::now(); }
  void resumed() { resumed_ = Clock::now(); }  // back on the strand with the prompt
  void submitted() { submitted_ = Clock::now(); }
  void woken() { woken_ = Clock::now(); }        // the handler holds the finished result
  void answered() { answered_ = Clock::now(); }  // the answer is built, about to be written
  void written() { written_ = Clock::now(); }

  // The engine's side: called by the stream's listener (scheduler thread) on every push.
  void item_pushed() {
    const int64_t now = Clock::now().time_since_epoch().count();
    int64_t none = 0;
    first_item_ns_.compare_exchange_strong(none, now, std::memory_order_relaxed);
    last_item_ns_.store(now, std::memory_order_relaxed);
  }

  // `Server-Timing` header value: http_read, to_worker, parse, render, tokenize, to_strand,
  // submit, engine (submit to the engine's last result, which includes the scheduler's
  // wake-up, the radix match, the forward pass and sampling), engine_first (to its first
  // result), wake (last result to the handler resumed), finish (after-turn bookkeeping and
  // the answer's JSON), total (first byte to the answer built).
  std::string server_timing() const;
  // One line for the debug log, with the write.
  std::string log_line() const;

 private:
  Clock::time_point first_byte_, read_;
  Clock::time_point worker_start_, parsed_, rendered_, tokenized_, resumed_, submitted_, woken_,
      answered_, written_;
  std::atomic<int64_t> first_item_ns_{0};
  std::atomic<int64_t> last_item_ns_{0};
};

}  // namespace strata
