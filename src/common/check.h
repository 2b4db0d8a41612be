// Always-on invariant checks. A failed check is a bug in Strata, never bad input: it
// reports file:line and the condition, then aborts. Bad input is answered with a
// Result (see result.h) instead.
#pragma once

#include <string>

namespace strata {

[[noreturn]] void check_failed(const char* file, int line, const char* condition,
                               const std::string& message);

}  // namespace strata

#define STRATA_CHECK(cond)                                              \
  do {                                                                  \
    if (!(cond)) [[unlikely]] {                                         \
      ::strata::check_failed(__FILE__, __LINE__, #cond, std::string()); \
    }                                                                   \
  } while (0)

// STRATA_CHECK_MSG(cond, msg): msg is any expression convertible to std::string; it
// is evaluated only when the check fails.
#define STRATA_CHECK_MSG(cond, msg)                             \
  do {                                                          \
    if (!(cond)) [[unlikely]] {                                 \
      ::strata::check_failed(__FILE__, __LINE__, #cond, (msg)); \
    }                                                           \
  } while (0)
