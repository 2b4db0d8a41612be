#include "server/request_timing.h"

#include <cstdio>

namespace strata {

namespace {

using TimingClock = RequestTiming::Clock;

// Milliseconds from a to b; 0 when either stamp is missing or the order is reversed (a
// phase that did not happen, e.g. rendering for /v1/completions).
double ms_between(TimingClock::time_point a, TimingClock::time_point b) {
  if (a == TimingClock::time_point{} || b == TimingClock::time_point{} || b < a) return 0.0;
  return std::chrono::duration<double, std::milli>(b - a).count();
}

TimingClock::time_point from_ns(int64_t ns) {
  return ns == 0 ? TimingClock::time_point{} : TimingClock::time_point(TimingClock::duration(ns));
}

void append(std::string& out, const char* name, double ms, const char* format) {
  char buf[64];
  const int n = std::snprintf(buf, sizeof buf, format, name, ms);
  if (n > 0) out.append(buf, static_cast<size_t>(n));
}

}  // namespace

std::string RequestTiming::server_timing() const {
  const TimingClock::time_point first = from_ns(first_item_ns_.load(std::memory_order_relaxed));
  const TimingClock::time_point last = from_ns(last_item_ns_.load(std::memory_order_relaxed));
  const std::pair<const char*, double> phases[] = {
      {"http_read", ms_between(first_byte_, read_)},
      {"to_worker", ms_between(read_, worker_start_)},
      {"parse", ms_between(worker_start_, parsed_)},
      {"render", ms_between(parsed_, rendered_)},
      {"tokenize", ms_between(rendered_, tokenized_)},
      {"to_strand", ms_between(tokenized_, resumed_)},
      {"submit", ms_between(resumed_, submitted_)},
      {"engine_first", ms_between(submitted_, first)},
      {"engine", ms_between(submitted_, last)},
      {"wake", ms_between(last, woken_)},
      {"finish", ms_between(woken_, answered_)},
      {"total", ms_between(first_byte_, answered_)},
  };
  std::string out;
  out.reserve(320);
  for (const auto& [name, ms] : phases) {
    if (!out.empty()) out += ", ";
    append(out, name, ms, "%s;dur=%.3f");
  }
  return out;
}

std::string RequestTiming::log_line() const {
  std::string out = server_timing();
  append(out, ", write", ms_between(answered_, written_), "%s;dur=%.3f");
  return out;
}

}  // namespace strata
