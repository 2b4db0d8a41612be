#include "bench/progress.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

namespace strata::bench {
namespace {

TEST(EtaTest, ExtrapolatesTheRateSoFar) {
  EXPECT_DOUBLE_EQ(*eta_seconds(0.25, 10), 30);
  EXPECT_DOUBLE_EQ(*eta_seconds(0.5, 7), 7);
  EXPECT_DOUBLE_EQ(*eta_seconds(1.0, 42), 0);
  EXPECT_DOUBLE_EQ(*eta_seconds(1.5, 42), 0);  // clamped
  EXPECT_FALSE(eta_seconds(0, 10));
  EXPECT_FALSE(eta_seconds(-0.1, 10));
}

TEST(EtaTest, Durations) {
  EXPECT_EQ(format_duration(0), "0s");
  EXPECT_EQ(format_duration(59.4), "59s");
  EXPECT_EQ(format_duration(65), "1m05s");
  EXPECT_EQ(format_duration(3599), "59m59s");
  EXPECT_EQ(format_duration(3725), "1h02m");
  EXPECT_EQ(format_duration(-3), "0s");
}

TEST(EtaTest, Bar) {
  EXPECT_EQ(progress_bar(0.5, 10), "[#####.....]");
  EXPECT_EQ(progress_bar(0, 4), "[....]");
  EXPECT_EQ(progress_bar(1, 4), "[####]");
  EXPECT_EQ(progress_bar(2, 4), "[####]");
  EXPECT_EQ(progress_bar(-1, 4), "[....]");
}

// Captures what a display writes, with a clock the test moves.
struct Captured {
  char* buf = nullptr;
  size_t size = 0;
  FILE* f = open_memstream(&buf, &size);
  ~Captured() {
    std::fclose(f);
    std::free(buf);
  }
  std::string text() {
    std::fflush(f);
    return std::string(buf, size);
  }
};

TEST(ProgressDisplayTest, PlainLinesAtMostOncePerInterval) {
  Captured out;
  double now = 100;
  {
    ProgressDisplay p(
        out.f, false, [&] { return now; }, 10);
    p.update(0.1, "a");
    now += 1;
    p.update(0.2, "b");  // within the interval: silent
    now += 10;
    p.update(0.5, "c");
    p.message("done with c");
    p.finish();
  }
  const std::string text = out.text();
  EXPECT_NE(text.find("a  elapsed 0s  ETA 0s"), std::string::npos) << text;
  EXPECT_EQ(text.find("  b  "), std::string::npos) << text;
  // Half done after 11 s: 11 s to go.
  EXPECT_NE(text.find("[############............]  50%  c  elapsed 11s  ETA 11s\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("done with c\n"), std::string::npos);
  EXPECT_EQ(text.find('\r'), std::string::npos);  // no terminal control in plain mode
}

TEST(ProgressDisplayTest, InteractiveRedrawsInPlace) {
  Captured out;
  double now = 0;
  ProgressDisplay p(out.f, true, [&] { return now; });
  now = 4;
  p.update(0.8, "run");
  p.message("line");
  p.finish();
  const std::string text = out.text();
  EXPECT_NE(text.find("\r\033[K[###################.....]  80%  run  elapsed 4s  ETA 1s"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("line\n"), std::string::npos);
  EXPECT_EQ(text.back(), '\n');
}

}  // namespace
}  // namespace strata::bench
