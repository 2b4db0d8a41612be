// The windowed circuit breaker (router/circuit_breaker.h), on plain-number time: the seed's
// one-failure blacklist must not happen, failures in a window open it, probes close it,
// cooldowns back off.
#include "router/circuit_breaker.h"

#include <gtest/gtest.h>

namespace strata::router {
namespace {

void fail(CircuitBreaker& b, int n, int64_t now_ms) {
  for (int i = 0; i < n; ++i) {
    ASSERT_TRUE(b.admit(now_ms).allowed);
    b.on_outcome(UpstreamOutcome::kConnectError, now_ms);
  }
}

TEST(CircuitBreakerTest, OutcomesAreClassified) {
  EXPECT_EQ(outcome_from_status(200), UpstreamOutcome::kOk);
  EXPECT_EQ(outcome_from_status(400), UpstreamOutcome::kOk);  // the worker is up
  EXPECT_EQ(outcome_from_status(429), UpstreamOutcome::kBackpressure);
  EXPECT_EQ(outcome_from_status(503), UpstreamOutcome::kBackpressure);
  EXPECT_EQ(outcome_from_status(500), UpstreamOutcome::kServerError);
  EXPECT_EQ(outcome_from_status(502), UpstreamOutcome::kServerError);
  EXPECT_FALSE(is_failure(UpstreamOutcome::kOk));
  EXPECT_FALSE(is_failure(UpstreamOutcome::kBackpressure));
  EXPECT_TRUE(is_failure(UpstreamOutcome::kConnectError));
  EXPECT_TRUE(is_failure(UpstreamOutcome::kTimeout));
  EXPECT_TRUE(is_failure(UpstreamOutcome::kServerError));
  EXPECT_TRUE(is_failure(UpstreamOutcome::kStreamBroken));
  EXPECT_EQ(upstream_outcome_name(UpstreamOutcome::kTimeout), "timeout");
}

TEST(CircuitBreakerTest, BadOptionsAreRefused) {
  EXPECT_TRUE(validate(CircuitBreakerOptions{}).has_value());
  EXPECT_FALSE(validate(CircuitBreakerOptions{.failure_threshold = 1}).has_value());
  EXPECT_FALSE(
      validate(CircuitBreakerOptions{.cooldown_ms = 5'000, .max_cooldown_ms = 1'000}).has_value());
  EXPECT_FALSE(validate(CircuitBreakerOptions{.min_failure_ratio = 0.0}).has_value());
}

// seeds/003 Q1: one transfer stalled ~30 s, timed out, and the worker was blacklisted for
// good. Here one transient stall changes nothing.
TEST(CircuitBreakerTest, OneTransientStallDoesNotBlacklist) {
  CircuitBreaker b;
  ASSERT_TRUE(b.admit(0).allowed);
  b.on_outcome(UpstreamOutcome::kTimeout, 30'000);
  EXPECT_EQ(b.state(30'000), BreakerState::kClosed);
  EXPECT_TRUE(b.can_send(30'000));
  EXPECT_EQ(b.failures_in_window(30'000), 1);
  // Nor do four in a row.
  fail(b, 3, 30'001);
  EXPECT_EQ(b.state(30'001), BreakerState::kClosed);
  EXPECT_EQ(b.stats().openings, 0u);
  // And they age out of the window: four more later do not add up to five.
  fail(b, 4, 45'000);
  EXPECT_EQ(b.state(45'000), BreakerState::kClosed);
}

TEST(CircuitBreakerTest, FiveFailuresInTheWindowOpenIt) {
  CircuitBreaker b;
  fail(b, 4, 1'000);
  EXPECT_EQ(b.state(1'000), BreakerState::kClosed);
  fail(b, 1, 3'000);
  EXPECT_EQ(b.state(3'000), BreakerState::kOpen);
  EXPECT_FALSE(b.can_send(3'000));
  EXPECT_FALSE(b.admit(3'500).allowed);
  EXPECT_EQ(b.open_until_ms(), 5'000);  // the 2 s cooldown
  EXPECT_EQ(b.stats().openings, 1u);
  EXPECT_EQ(b.stats().denied, 1u);
}

TEST(CircuitBreakerTest, RareFailuresOfABusyWorkerDoNotOpenIt) {
  CircuitBreaker b;
  for (int i = 0; i < 1'000; ++i) {
    ASSERT_TRUE(b.admit(i).allowed);
    b.on_outcome(i % 100 == 0 ? UpstreamOutcome::kServerError : UpstreamOutcome::kOk, i);
  }
  EXPECT_EQ(b.failures_in_window(999), 10);
  EXPECT_EQ(b.state(999), BreakerState::kClosed);
}

TEST(CircuitBreakerTest, BackpressureIsNotAFailure) {
  CircuitBreaker b;
  for (int i = 0; i < 50; ++i) {
    ASSERT_TRUE(b.admit(i).allowed);
    b.on_outcome(outcome_from_status(i % 2 ? 429 : 503), i);
  }
  EXPECT_EQ(b.state(50), BreakerState::kClosed);
  EXPECT_EQ(b.stats().backpressure, 50u);
  EXPECT_EQ(b.stats().failures, 0u);
}

TEST(CircuitBreakerTest, AProbeSuccessClosesIt) {
  CircuitBreaker b;
  fail(b, 5, 0);
  ASSERT_EQ(b.state(0), BreakerState::kOpen);
  EXPECT_EQ(b.state(1'999), BreakerState::kOpen);
  EXPECT_EQ(b.state(2'000), BreakerState::kHalfOpen);
  EXPECT_TRUE(b.can_send(2'000));
  const Admission probe = b.admit(2'000);
  ASSERT_TRUE(probe.allowed);
  EXPECT_NE(probe.probe, 0u);
  // One probe at a time.
  EXPECT_FALSE(b.can_send(2'001));
  EXPECT_FALSE(b.admit(2'001).allowed);
  b.on_success(2'100, probe.probe);
  EXPECT_EQ(b.state(2'100), BreakerState::kClosed);
  const Admission normal = b.admit(2'101);
  EXPECT_TRUE(normal.allowed);
  EXPECT_EQ(normal.probe, 0u);
  EXPECT_EQ(b.failures_in_window(2'101), 0);  // the window starts empty
}

TEST(CircuitBreakerTest, AProbeFailureReopensItWithBackoffUpToTheCap) {
  CircuitBreaker b(CircuitBreakerOptions{.cooldown_ms = 1'000, .max_cooldown_ms = 5'000});
  fail(b, 5, 0);
  int64_t now = 0;
  const int64_t expected_cooldowns[] = {1'000, 2'000, 4'000, 5'000, 5'000};
  for (int64_t cooldown : expected_cooldowns) {
    EXPECT_EQ(b.open_until_ms() - now, cooldown);
    now = b.open_until_ms();
    const Admission probe = b.admit(now);
    ASSERT_TRUE(probe.allowed);
    b.on_outcome(UpstreamOutcome::kConnectError, now, probe.probe);
    EXPECT_EQ(b.state(now), BreakerState::kOpen);
  }
  EXPECT_EQ(b.opening_streak(), 6);  // the first opening and five probe failures
  // It recovers: the probe succeeds.
  now = b.open_until_ms();
  const Admission probe = b.admit(now);
  b.on_success(now, probe.probe);
  EXPECT_EQ(b.state(now), BreakerState::kClosed);
  // Flapping soon after keeps the streak (a long cooldown)...
  fail(b, 5, now + 1'000);
  EXPECT_EQ(b.open_until_ms() - (now + 1'000), 5'000);
  // ...while an opening after a long healthy spell starts from the first cooldown.
  now = b.open_until_ms();
  b.on_success(now, b.admit(now).probe);
  fail(b, 5, now + 120'000);
  EXPECT_EQ(b.opening_streak(), 1);
  EXPECT_EQ(b.open_until_ms() - (now + 120'000), 1'000);
}

TEST(CircuitBreakerTest, ALostProbeCountsAsFailedAndALateReportIsIgnored) {
  CircuitBreaker b(CircuitBreakerOptions{.probe_timeout_ms = 5'000});
  fail(b, 5, 0);
  const Admission lost = b.admit(2'000);
  ASSERT_TRUE(lost.allowed);
  EXPECT_EQ(b.state(6'999), BreakerState::kHalfOpen);
  EXPECT_EQ(b.state(7'000), BreakerState::kOpen);  // the probe never reported
  EXPECT_FALSE(b.can_send(7'000));
  EXPECT_FALSE(b.admit(7'000).allowed);
  EXPECT_EQ(b.stats().probe_timeouts, 1u);
  // The next period (after a 4 s cooldown) has its own probe; the old one's late success
  // must not close the breaker.
  EXPECT_EQ(b.open_until_ms(), 11'000);
  const Admission next = b.admit(11'000);
  ASSERT_TRUE(next.allowed);
  EXPECT_NE(next.probe, lost.probe);
  b.on_success(11'100, lost.probe);
  EXPECT_EQ(b.state(11'100), BreakerState::kHalfOpen);
  b.on_success(11'200, next.probe);
  EXPECT_EQ(b.state(11'200), BreakerState::kClosed);
}

TEST(CircuitBreakerTest, OutcomesOfRequestsSentBeforeTheOpeningOnlyCount) {
  CircuitBreaker b;
  ASSERT_TRUE(b.admit(0).allowed);  // in flight while the breaker opens
  fail(b, 5, 100);
  ASSERT_EQ(b.state(100), BreakerState::kOpen);
  b.on_success(200);  // not a probe: does not close it
  EXPECT_EQ(b.state(200), BreakerState::kOpen);
  const Admission probe = b.admit(2'100);
  ASSERT_TRUE(probe.allowed);
  b.on_failure(2'200);  // another old request failing: not the probe
  EXPECT_EQ(b.state(2'200), BreakerState::kHalfOpen);
  b.on_outcome(UpstreamOutcome::kBackpressure, 2'300, probe.probe);  // up, but full
  EXPECT_EQ(b.state(2'300), BreakerState::kClosed);
}

}  // namespace
}  // namespace strata::router
