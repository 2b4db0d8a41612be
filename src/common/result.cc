#include "common/result.h"

namespace strata {

std::string_view error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument:
      return "invalid_argument";
    case ErrorCode::kNotFound:
      return "not_found";
    case ErrorCode::kOutOfPages:
      return "out_of_pages";
    case ErrorCode::kResourceExhausted:
      return "resource_exhausted";
    case ErrorCode::kFailedPrecondition:
      return "failed_precondition";
    case ErrorCode::kOverBudget:
      return "pin_budget_exceeded";
    case ErrorCode::kStaleEpoch:
      return "stale_epoch";
    case ErrorCode::kBusy:
      return "session_busy";
    case ErrorCode::kNoHostTier:
      return "no_host_tier";
    case ErrorCode::kUnauthenticated:
      return "unauthenticated";
    case ErrorCode::kIoError:
      return "io_error";
    case ErrorCode::kCorrupt:
      return "corrupt";
    case ErrorCode::kTimeout:
      return "timeout";
    case ErrorCode::kUnsupported:
      return "unsupported";
    case ErrorCode::kInternal:
      return "internal";
  }
  return "unknown";
}

}  // namespace strata
