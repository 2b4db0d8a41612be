// Expected failures as values: Result<T> is std::expected<T, Error>.
#pragma once

#include <expected>
#include <string>
#include <string_view>
#include <utility>

namespace strata {

enum class ErrorCode {
  kInvalidArgument,     // bad input from a caller (HTTP 400)
  kNotFound,            // unknown id, hash, session (HTTP 404)
  kOutOfPages,          // a pool has too few free pages
  kResourceExhausted,   // a budget (pins, context, queue) would be exceeded
  kFailedPrecondition,  // the object is in the wrong state for the call (HTTP 409)
  kOverBudget,          // a pin would exceed --max-pinned-ratio or the client budget
  kStaleEpoch,          // a tool session's epoch is not the current one
  kBusy,                // a request of the tool session is still running
  kNoHostTier,          // the call needs the hierarchical cache's host tier
  kUnauthenticated,     // missing or wrong admin key (HTTP 401)
  kIoError,             // a file or network call failed
  kCorrupt,             // data read back failed its checks
  kTimeout,             // a deadline passed
  kUnsupported,         // a format, dtype or architecture we do not handle
  kInternal,            // a fault of Strata itself (HTTP 500)
};

std::string_view error_code_name(ErrorCode code);

struct Error {
  ErrorCode code = ErrorCode::kInternal;
  std::string message;
};

template <typename T>
using Result = std::expected<T, Error>;

// Status is a Result without a value.
using Status = std::expected<void, Error>;

inline std::unexpected<Error> make_error(ErrorCode code, std::string message) {
  return std::unexpected<Error>(Error{code, std::move(message)});
}

// A refused input: make_error(ErrorCode::kInvalidArgument, message).
inline std::unexpected<Error> bad_argument(std::string message) {
  return make_error(ErrorCode::kInvalidArgument, std::move(message));
}

}  // namespace strata
