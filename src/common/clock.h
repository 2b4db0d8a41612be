// Injectable time source, so that TTLs and idle timeouts can be tested by moving time.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <limits>

namespace strata {

// A time on the clocks' scale that never comes: the deadline (or next check) when there is none.
inline constexpr int64_t kNeverMs = std::numeric_limits<int64_t>::max();

class Clock {
 public:
  virtual ~Clock() = default;
  // Monotonic time in milliseconds since an arbitrary origin.
  virtual int64_t now_ms() const = 0;
};

class SteadyClock final : public Clock {
 public:
  int64_t now_ms() const override {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  static SteadyClock& instance() {
    static SteadyClock clock;
    return clock;
  }
};

// A clock that moves only when told to. Thread-safe.
class ManualClock final : public Clock {
 public:
  explicit ManualClock(int64_t start_ms = 0) : now_ms_(start_ms) {}
  int64_t now_ms() const override { return now_ms_.load(std::memory_order_relaxed); }
  void advance_ms(int64_t delta_ms) { now_ms_.fetch_add(delta_ms, std::memory_order_relaxed); }
  void set_ms(int64_t t_ms) { now_ms_.store(t_ms, std::memory_order_relaxed); }

 private:
  std::atomic<int64_t> now_ms_;
};

}  // namespace strata
