// A worker's health as the router sees it: a windowed circuit breaker, one per worker
// (docs/router.md, issue 13). Never the one-failure blacklist of seeds/003 (Q1): a single
// transient stall changes nothing.
//
// Contract. A plain state machine: no clock (calls take now_ms, the router's monotonic
// milliseconds), no lock (the router calls it under its own lock), no I/O.
//
// What counts (UpstreamOutcome, reported once per request sent, at its first byte or
// when it failed before one):
//   failure   connect errors, a timeout before the first byte, a 5xx other than 503, a
//             stream that broke after it started;
//   success   any other answer: 2xx, and 4xx other than 429 (the worker is up and spoke);
//   backpressure  429 and 503: the worker is up but full. For health it is a success (the
//             worker answered); holding traffic back is the load report's and the
//             admission queue's business, and repeated rejections move sessions
//             (SessionTable), not the breaker.
//
// States (written as the state machine, transitions are lazy in now_ms):
//   kClosed   traffic flows. Outcomes are counted in a sliding window (window_ms, in ten
//             buckets). It opens when the window holds at least failure_threshold failures
//             AND failures are at least min_failure_ratio of the window's outcomes, so a
//             busy worker with a rare 5xx among thousands of answers stays closed.
//   kOpen     no traffic for the cooldown: cooldown_ms, times backoff_factor for each
//             opening in a row, at most max_cooldown_ms. The streak resets when the breaker
//             stays closed for backoff_reset_ms.
//   kHalfOpen after the cooldown: at most half_open_probes requests at a time are let
//             through as probes. A probe's success (or backpressure) closes the breaker
//             (the window starts empty); its failure opens it again with the next cooldown.
//             Probes outstanding for probe_timeout_ms (since the latest was admitted)
//             count as a failure.
// Outcomes of requests that were not probes and arrive while open or half-open (sent
// before the breaker opened) only count in the stats.
//
// Plan, then commit: can_send() is pure (the router uses it to mark a candidate eligible);
// admit() commits when the request is really sent to this worker, and says whether it is
// a probe.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

#include "common/result.h"

namespace strata::router {

enum class UpstreamOutcome : uint8_t {
  kOk,            // a 2xx, or a 4xx other than 429
  kBackpressure,  // 429 or 503
  kConnectError,  // refused, reset or unreachable before any byte
  kTimeout,       // no first byte within the deadline
  kServerError,   // a 5xx other than 503
  kStreamBroken,  // the connection broke after the first byte
};
std::string_view upstream_outcome_name(UpstreamOutcome outcome);
bool is_failure(UpstreamOutcome outcome);
// kOk, kBackpressure or kServerError from an HTTP status.
UpstreamOutcome outcome_from_status(int http_status);

struct CircuitBreakerOptions {
  int32_t failure_threshold = 5;      // failures in the window that open, >= 2
  double min_failure_ratio = 0.5;     // failures / outcomes in the window to open, in (0, 1]
  int64_t window_ms = 10'000;         // sliding window, >= 10 ms
  int64_t cooldown_ms = 2'000;        // first opening, >= 1 ms
  double backoff_factor = 2.0;        // per opening in a row, >= 1
  int64_t max_cooldown_ms = 30'000;   // cap, >= cooldown_ms
  int64_t backoff_reset_ms = 60'000;  // closed this long: the streak starts over, >= 1 ms
  int32_t half_open_probes = 1;       // probes at a time while half-open, >= 1
  int64_t probe_timeout_ms = 30'000;  // an unreported probe counts as failed after it, >= 1 ms
};

Status validate(const CircuitBreakerOptions& options);

enum class BreakerState : uint8_t { kClosed, kOpen, kHalfOpen };
std::string_view breaker_state_name(BreakerState state);

// What admit() decided. A probe carries the number of its half-open period: report it
// back to on_outcome(), so that a probe reported after its period ended (it timed out and
// the breaker reopened) cannot close the breaker for a later period's probe.
struct Admission {
  bool allowed = false;  // false: open, or half-open with every probe slot taken
  uint64_t probe = 0;    // nonzero: this request is a probe of half-open period `probe`
};

struct BreakerStats {
  uint64_t successes = 0;
  uint64_t failures = 0;
  uint64_t backpressure = 0;
  uint64_t openings = 0;
  uint64_t probes = 0;
  uint64_t probe_timeouts = 0;
  uint64_t denied = 0;  // admit() refusals
};

class CircuitBreaker {
 public:
  explicit CircuitBreaker(CircuitBreakerOptions options = {});

  // The state at now_ms (open turns half-open once its cooldown has passed).
  BreakerState state(int64_t now_ms) const;
  // Whether admit(now_ms) would let a request through. Pure.
  bool can_send(int64_t now_ms) const;
  // Commits a request sent to the worker.
  Admission admit(int64_t now_ms);

  // The outcome of a request that admit() let through; `probe`: its Admission::probe.
  void on_outcome(UpstreamOutcome outcome, int64_t now_ms, uint64_t probe = 0);
  void on_success(int64_t now_ms, uint64_t probe = 0) {
    on_outcome(UpstreamOutcome::kOk, now_ms, probe);
  }
  void on_failure(int64_t now_ms, uint64_t probe = 0) {
    on_outcome(UpstreamOutcome::kServerError, now_ms, probe);
  }

  // When an open breaker lets the next probe through (meaningful while open).
  int64_t open_until_ms() const { return open_until_ms_; }
  int32_t failures_in_window(int64_t now_ms) const;
  int32_t opening_streak() const { return streak_; }
  const BreakerStats& stats() const { return stats_; }

 private:
  static constexpr int kBuckets = 10;
  struct Bucket {
    int64_t start_ms = -1;  // -1: empty
    int32_t successes = 0;
    int32_t failures = 0;
  };

  void settle(int64_t now_ms);  // applies the lazy transitions
  void open(int64_t now_ms);
  void close(int64_t now_ms);
  Bucket& bucket_at(int64_t now_ms);
  void count_window(int64_t now_ms, int32_t* successes, int32_t* failures) const;

  CircuitBreakerOptions options_;
  int64_t bucket_ms_;
  BreakerState state_ = BreakerState::kClosed;
  std::array<Bucket, kBuckets> buckets_{};
  int64_t open_until_ms_ = 0;
  int64_t closed_since_ms_ = 0;
  int32_t streak_ = 0;         // openings in a row
  uint64_t period_ = 0;        // half-open periods entered (the current probe number)
  int32_t probes_out_ = 0;     // probes of the current period admitted and not reported
  int64_t last_probe_ms_ = 0;  // when the latest of them was admitted
  BreakerStats stats_;
};

}  // namespace strata::router
