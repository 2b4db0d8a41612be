// Progress of a benchmark run on stderr: a bar with the fraction done and the estimated
// time left when stderr is a terminal, plain lines otherwise (logs, CI).
//
// Threads: ProgressDisplay is thread-safe (workers and the controller both report). The
// clock is injectable so that tests can drive it.
#pragma once

#include <cstdio>
#include <functional>
#include <mutex>
#include <optional>
#include <string>

namespace strata::bench {

// Seconds left when `fraction_done` (in [0, 1]) took `elapsed_s`, assuming a steady rate.
// nullopt before any progress.
std::optional<double> eta_seconds(double fraction_done, double elapsed_s);
// "42s", "3m05s", "1h02m".
std::string format_duration(double seconds);
// "[#####.....]" of `width` cells, fraction clamped to [0, 1].
std::string progress_bar(double fraction, int width);

class ProgressDisplay {
 public:
  using NowFn = std::function<double()>;  // monotonic seconds
  // interactive: redraw one line in place (at most every 0.1 s); otherwise print a line
  // at most every `plain_interval_s` (the first update prints at once).
  ProgressDisplay(std::FILE* out, bool interactive, NowFn now = {}, double plain_interval_s = 10);
  ~ProgressDisplay();

  void update(double fraction, const std::string& status);
  // A line of its own (the bar is redrawn below it).
  void message(const std::string& line);
  // Ends the bar's line.
  void finish();

  // The line update() shows for these values (exposed for tests).
  std::string render(double fraction, const std::string& status) const;

 private:
  std::FILE* out_;
  const bool interactive_;
  const NowFn now_;
  const double plain_interval_s_;
  const double start_s_;
  std::mutex mutex_;
  double last_draw_s_ = -1e9;  // GUARDED_BY(mutex_)
  bool bar_drawn_ = false;     // GUARDED_BY(mutex_)
  double fraction_ = 0;        // GUARDED_BY(mutex_)
  std::string status_;         // GUARDED_BY(mutex_)
};

bool stderr_is_terminal();

}  // namespace strata::bench
