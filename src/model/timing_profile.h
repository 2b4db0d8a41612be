// A forward-pass timing profile: how long a prefill pass and a decode step take, as tables
// measured on one model and machine (`strata bench forward --profile-out`) or derived from
// published figures. `SimulatedModel` (model/simulated_model.h) sleeps what it predicts.
// The JSON format, the interpolation and the batch model are in docs/simulation.md.
//
// Thread: immutable once loaded; any thread may call the predictions.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"

namespace strata {

// A function of two variables sampled on a grid: ms[i][j] at (x[i], y[j]). Bilinear between
// grid points; below an axis's first point the first point's value (clamped); beyond its
// last point extended along the last segment's slope (never decreasing: a slope below 0
// counts as 0), since times grow about linearly with tokens, batch and context there.
struct TimingTable {
  std::vector<double> x;                // strictly increasing, >= x_min of the table's kind
  std::vector<double> y;                // strictly increasing, >= 0
  std::vector<std::vector<double>> ms;  // x.size() rows of y.size() values, each finite, > 0

  double at(double xv, double yv) const;
};

struct TimingProfile {
  static constexpr int kFormatVersion = 1;

  std::string model;    // the model it was measured on (or derived for)
  std::string machine;  // the machine / accelerator
  std::string source;   // how it was obtained: "measured: ..." or "derived: ..."
  std::string notes;    // free text
  // Prefill pass: x new tokens (>= 1), y context tokens already cached before them.
  TimingTable prefill;
  // Decode step: x batch size (sequences, >= 1), y context tokens per sequence (mean).
  TimingTable decode;

  // Parses and validates; kInvalidArgument naming the field at fault.
  static Result<TimingProfile> parse(std::string_view json_text);
  // kNotFound / kIoError for the file, else parse()'s errors, prefixed by the path.
  static Result<TimingProfile> load(const std::filesystem::path& path);
  // The JSON form parse() reads (pretty-printed, stable key order).
  std::string to_json() const;

  // Milliseconds of a prefill pass of `new_tokens` (>= 1) whose sequences had
  // `context_tokens` cached before them (token-weighted mean over the pass's sequences).
  double prefill_ms(double new_tokens, double context_tokens) const {
    return prefill.at(new_tokens, context_tokens);
  }
  // Milliseconds of a decode step of `batch_size` sequences (>= 1) of `context_tokens` each
  // (the mean).
  double decode_ms(double batch_size, double context_tokens) const {
    return decode.at(batch_size, context_tokens);
  }
};

}  // namespace strata
