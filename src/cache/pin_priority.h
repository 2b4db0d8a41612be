// A pin's priority: which pins the no-deadlock rule releases first (lower first). A value
// type that only holds a number within its named bounds, so that no code path can carry
// an unchecked priority into the pin table.
#pragma once

#include <compare>
#include <cstdint>
#include <string>

#include "common/result.h"

namespace strata {

class PinPriority {
 public:
  static constexpr int32_t kMin = -100;
  static constexpr int32_t kMax = 100;

  constexpr PinPriority() = default;  // 0, the default of an operator's pin

  // kInvalidArgument outside [kMin, kMax].
  static Result<PinPriority> make(int64_t value) {
    if (value < kMin || value > kMax) {
      return make_error(
          ErrorCode::kInvalidArgument,
          "'priority' must be in [" + std::to_string(kMin) + ", " + std::to_string(kMax) + "]");
    }
    return PinPriority(static_cast<int32_t>(value));
  }
  static constexpr PinPriority lowest() { return PinPriority(kMin); }
  static constexpr PinPriority highest() { return PinPriority(kMax); }

  constexpr int32_t value() const { return value_; }
  constexpr auto operator<=>(const PinPriority&) const = default;

 private:
  constexpr explicit PinPriority(int32_t v) : value_(v) {}
  int32_t value_ = 0;
};

}  // namespace strata
