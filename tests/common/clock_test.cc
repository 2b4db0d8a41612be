#include "common/clock.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

namespace strata {
namespace {

TEST(ClockTest, TheManualClockMovesOnlyWhenTold) {
  ManualClock clock(1'000);
  EXPECT_EQ(clock.now_ms(), 1'000);
  EXPECT_EQ(clock.now_ms(), 1'000);
  clock.advance_ms(250);
  EXPECT_EQ(clock.now_ms(), 1'250);
  clock.set_ms(5);
  EXPECT_EQ(clock.now_ms(), 5);
  EXPECT_EQ(ManualClock().now_ms(), 0);
}

TEST(ClockTest, TheManualClockStandsInForTheInterface) {
  ManualClock manual;
  const Clock& clock = manual;
  manual.advance_ms(42);
  EXPECT_EQ(clock.now_ms(), 42);
}

TEST(ClockTest, TheManualClockIsThreadSafe) {
  ManualClock clock;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&clock] {
      for (int i = 0; i < 1'000; ++i) clock.advance_ms(1);
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(clock.now_ms(), 4'000);
}

TEST(ClockTest, TheSteadyClockNeverGoesBack) {
  const Clock& clock = SteadyClock::instance();
  EXPECT_EQ(&SteadyClock::instance(), &clock);
  int64_t last = clock.now_ms();
  for (int i = 0; i < 1'000; ++i) {
    const int64_t now = clock.now_ms();
    ASSERT_GE(now, last);
    last = now;
  }
}

}  // namespace
}  // namespace strata
