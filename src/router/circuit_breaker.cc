#include "router/circuit_breaker.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "common/check.h"

namespace strata::router {

std::string_view upstream_outcome_name(UpstreamOutcome outcome) {
  switch (outcome) {
    case UpstreamOutcome::kOk:
      return "ok";
    case UpstreamOutcome::kBackpressure:
      return "backpressure";
    case UpstreamOutcome::kConnectError:
      return "connect_error";
    case UpstreamOutcome::kTimeout:
      return "timeout";
    case UpstreamOutcome::kServerError:
      return "server_error";
    case UpstreamOutcome::kStreamBroken:
      return "stream_broken";
  }
  return "unknown";
}

bool is_failure(UpstreamOutcome outcome) {
  switch (outcome) {
    case UpstreamOutcome::kOk:
    case UpstreamOutcome::kBackpressure:
      return false;
    case UpstreamOutcome::kConnectError:
    case UpstreamOutcome::kTimeout:
    case UpstreamOutcome::kServerError:
    case UpstreamOutcome::kStreamBroken:
      return true;
  }
  return true;
}

UpstreamOutcome outcome_from_status(int http_status) {
  if (http_status == 429 || http_status == 503) return UpstreamOutcome::kBackpressure;
  if (http_status >= 500) return UpstreamOutcome::kServerError;
  return UpstreamOutcome::kOk;
}

std::string_view breaker_state_name(BreakerState state) {
  switch (state) {
    case BreakerState::kClosed:
      return "closed";
    case BreakerState::kOpen:
      return "open";
    case BreakerState::kHalfOpen:
      return "half_open";
  }
  return "unknown";
}

Status validate(const CircuitBreakerOptions& o) {
  auto invalid = [](const char* what) {
    return make_error(ErrorCode::kInvalidArgument, std::string("circuit breaker: ") + what);
  };
  if (o.failure_threshold < 2) return invalid("failure_threshold must be >= 2");
  if (!std::isfinite(o.min_failure_ratio) || o.min_failure_ratio <= 0.0 ||
      o.min_failure_ratio > 1.0) {
    return invalid("min_failure_ratio not in (0, 1]");
  }
  if (o.window_ms < 10) return invalid("window must be >= 10 ms");
  if (o.cooldown_ms < 1) return invalid("cooldown must be >= 1 ms");
  if (!std::isfinite(o.backoff_factor) || o.backoff_factor < 1.0) {
    return invalid("backoff_factor must be >= 1");
  }
  if (o.max_cooldown_ms < o.cooldown_ms) return invalid("max cooldown below the cooldown");
  if (o.backoff_reset_ms < 1) return invalid("backoff reset must be >= 1 ms");
  if (o.half_open_probes < 1) return invalid("half_open_probes must be >= 1");
  if (o.probe_timeout_ms < 1) return invalid("probe timeout must be >= 1 ms");
  return {};
}

CircuitBreaker::CircuitBreaker(CircuitBreakerOptions options)
    : options_(options), bucket_ms_(std::max<int64_t>(1, options.window_ms / kBuckets)) {
  const Status ok = validate(options_);
  STRATA_CHECK_MSG(ok.has_value(), ok ? std::string() : ok.error().message);
}

BreakerState CircuitBreaker::state(int64_t now_ms) const {
  switch (state_) {
    case BreakerState::kClosed:
      return BreakerState::kClosed;
    case BreakerState::kOpen:
      return now_ms >= open_until_ms_ ? BreakerState::kHalfOpen : BreakerState::kOpen;
    case BreakerState::kHalfOpen:
      if (probes_out_ > 0 && now_ms - last_probe_ms_ >= options_.probe_timeout_ms) {
        return BreakerState::kOpen;  // the lost probe reopens it
      }
      return BreakerState::kHalfOpen;
  }
  return state_;
}

bool CircuitBreaker::can_send(int64_t now_ms) const {
  switch (state_) {
    case BreakerState::kClosed:
      return true;
    case BreakerState::kOpen:
      return now_ms >= open_until_ms_;  // half-open then, with every probe slot free
    case BreakerState::kHalfOpen:
      return state(now_ms) == BreakerState::kHalfOpen && probes_out_ < options_.half_open_probes;
  }
  return false;
}

void CircuitBreaker::settle(int64_t now_ms) {
  if (state_ == BreakerState::kHalfOpen && probes_out_ > 0 &&
      now_ms - last_probe_ms_ >= options_.probe_timeout_ms) {
    ++stats_.probe_timeouts;
    open(now_ms);
  }
  if (state_ == BreakerState::kOpen && now_ms >= open_until_ms_) {
    state_ = BreakerState::kHalfOpen;
    ++period_;
    probes_out_ = 0;
  }
}

void CircuitBreaker::open(int64_t now_ms) {
  if (state_ == BreakerState::kClosed && now_ms - closed_since_ms_ >= options_.backoff_reset_ms) {
    streak_ = 0;
  }
  ++streak_;
  const double factor = std::pow(options_.backoff_factor, static_cast<double>(streak_ - 1));
  const double cooldown = std::min(static_cast<double>(options_.max_cooldown_ms),
                                   static_cast<double>(options_.cooldown_ms) * factor);
  open_until_ms_ = now_ms + static_cast<int64_t>(cooldown);
  state_ = BreakerState::kOpen;
  probes_out_ = 0;
  ++stats_.openings;
}

void CircuitBreaker::close(int64_t now_ms) {
  state_ = BreakerState::kClosed;
  closed_since_ms_ = now_ms;
  probes_out_ = 0;
  buckets_ = {};
}

Admission CircuitBreaker::admit(int64_t now_ms) {
  settle(now_ms);
  switch (state_) {
    case BreakerState::kClosed:
      return Admission{true, 0};
    case BreakerState::kOpen:
      break;
    case BreakerState::kHalfOpen:
      if (probes_out_ < options_.half_open_probes) {
        ++probes_out_;
        last_probe_ms_ = now_ms;
        ++stats_.probes;
        return Admission{true, period_};
      }
      break;
  }
  ++stats_.denied;
  return Admission{false, 0};
}

CircuitBreaker::Bucket& CircuitBreaker::bucket_at(int64_t now_ms) {
  const int64_t start = now_ms - now_ms % bucket_ms_;
  Bucket& b = buckets_[static_cast<size_t>((start / bucket_ms_) % kBuckets)];
  if (b.start_ms != start) b = Bucket{start, 0, 0};
  return b;
}

void CircuitBreaker::count_window(int64_t now_ms, int32_t* successes, int32_t* failures) const {
  *successes = 0;
  *failures = 0;
  for (const Bucket& b : buckets_) {
    if (b.start_ms < 0 || b.start_ms > now_ms || now_ms - b.start_ms >= options_.window_ms) {
      continue;
    }
    *successes += b.successes;
    *failures += b.failures;
  }
}

int32_t CircuitBreaker::failures_in_window(int64_t now_ms) const {
  int32_t successes = 0;
  int32_t failures = 0;
  count_window(now_ms, &successes, &failures);
  return failures;
}

void CircuitBreaker::on_outcome(UpstreamOutcome outcome, int64_t now_ms, uint64_t probe) {
  settle(now_ms);
  const bool failure = is_failure(outcome);
  if (failure) {
    ++stats_.failures;
  } else if (outcome == UpstreamOutcome::kBackpressure) {
    ++stats_.backpressure;
  } else {
    ++stats_.successes;
  }

  if (probe != 0) {
    if (state_ != BreakerState::kHalfOpen || probe != period_) return;  // a stale probe
    STRATA_CHECK(probes_out_ > 0);
    --probes_out_;
    if (failure) {
      open(now_ms);
    } else {
      close(now_ms);
    }
    return;
  }
  if (state_ != BreakerState::kClosed) return;  // sent before the breaker opened

  Bucket& b = bucket_at(now_ms);
  if (failure) {
    ++b.failures;
  } else {
    ++b.successes;
  }
  if (!failure) return;
  int32_t successes = 0;
  int32_t failures = 0;
  count_window(now_ms, &successes, &failures);
  const double ratio = static_cast<double>(failures) / static_cast<double>(failures + successes);
  if (failures >= options_.failure_threshold && ratio >= options_.min_failure_ratio) {
    open(now_ms);
  }
}

}  // namespace strata::router
