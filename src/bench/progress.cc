#include "bench/progress.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>

namespace strata::bench {

std::optional<double> eta_seconds(double fraction_done, double elapsed_s) {
  if (!(fraction_done > 0)) return std::nullopt;
  const double f = std::min(fraction_done, 1.0);
  return std::max(0.0, elapsed_s * (1 - f) / f);
}

std::string format_duration(double seconds) {
  const int64_t s = static_cast<int64_t>(std::llround(std::max(0.0, seconds)));
  char buf[32];
  if (s < 60) {
    std::snprintf(buf, sizeof(buf), "%llds", static_cast<long long>(s));
  } else if (s < 3600) {
    std::snprintf(buf, sizeof(buf), "%lldm%02llds", static_cast<long long>(s / 60),
                  static_cast<long long>(s % 60));
  } else {
    std::snprintf(buf, sizeof(buf), "%lldh%02lldm", static_cast<long long>(s / 3600),
                  static_cast<long long>((s % 3600) / 60));
  }
  return buf;
}

std::string progress_bar(double fraction, int width) {
  const double f = std::clamp(std::isnan(fraction) ? 0.0 : fraction, 0.0, 1.0);
  const int filled = static_cast<int>(std::floor(f * width + 1e-9));
  std::string bar(1, '[');
  bar.append(static_cast<size_t>(filled), '#');
  bar.append(static_cast<size_t>(std::max(0, width - filled)), '.');
  bar.push_back(']');
  return bar;
}

namespace {

double steady_now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

ProgressDisplay::ProgressDisplay(std::FILE* out, bool interactive, NowFn now,
                                 double plain_interval_s)
    : out_(out),
      interactive_(interactive),
      now_(now ? std::move(now) : NowFn(steady_now_s)),
      plain_interval_s_(plain_interval_s),
      start_s_(now_()) {}

ProgressDisplay::~ProgressDisplay() {
  finish();
}

std::string ProgressDisplay::render(double fraction, const std::string& status) const {
  const double elapsed = now_() - start_s_;
  const auto eta = eta_seconds(fraction, elapsed);
  char pct[16];
  std::snprintf(pct, sizeof(pct), "%3.0f%%", std::clamp(fraction, 0.0, 1.0) * 100);
  std::string line = progress_bar(fraction, 24);
  line.append(" ").append(pct).append("  ").append(status);
  line.append("  elapsed ").append(format_duration(elapsed));
  if (eta) line.append("  ETA ").append(format_duration(*eta));
  return line;
}

void ProgressDisplay::update(double fraction, const std::string& status) {
  std::lock_guard lock(mutex_);
  fraction_ = fraction;
  status_ = status;
  const double now = now_();
  if (interactive_) {
    if (now - last_draw_s_ < 0.1) return;
    std::fprintf(out_, "\r\033[K%s", render(fraction, status).c_str());
    bar_drawn_ = true;
  } else {
    // Plain lines are for logs: one per interval, whatever changed in between.
    if (now - last_draw_s_ < plain_interval_s_) return;
    std::fprintf(out_, "%s\n", render(fraction, status).c_str());
  }
  last_draw_s_ = now;
  std::fflush(out_);
}

void ProgressDisplay::message(const std::string& line) {
  std::lock_guard lock(mutex_);
  if (interactive_ && bar_drawn_) {
    std::fprintf(out_, "\r\033[K%s\n%s", line.c_str(), render(fraction_, status_).c_str());
  } else {
    std::fprintf(out_, "%s\n", line.c_str());
  }
  std::fflush(out_);
}

void ProgressDisplay::finish() {
  std::lock_guard lock(mutex_);
  if (interactive_ && bar_drawn_) {
    std::fprintf(out_, "\n");
    std::fflush(out_);
  }
  bar_drawn_ = false;
}

bool stderr_is_terminal() {
  return ::isatty(STDERR_FILENO) == 1;
}

}  // namespace strata::bench
