#include "request/error_shape.h"

namespace strata {

using json = nlohmann::json;

// The one table from an engine or request error to its HTTP status; the JSON error's
// "code" is error_code_name(). Anything not listed is a fault of ours: 500.
int http_status(ErrorCode code) {
  struct Row {
    ErrorCode code;
    int status;
  };
  static constexpr Row kTable[] = {
      {ErrorCode::kInvalidArgument, 400},     // bad input
      {ErrorCode::kResourceExhausted, 400},   // a prompt or body beyond a limit
      {ErrorCode::kUnsupported, 400},         // a format or feature we do not handle
      {ErrorCode::kOverBudget, 400},          // pin_budget_exceeded
      {ErrorCode::kUnauthenticated, 401},     // missing or wrong admin key
      {ErrorCode::kNotFound, 404},            // unknown session
      {ErrorCode::kFailedPrecondition, 409},  // wrong state for the call
      {ErrorCode::kStaleEpoch, 409},          // a tool_end for an older tool_start
      {ErrorCode::kBusy, 409},                // a request of the session still runs
      {ErrorCode::kNoHostTier, 409},          // needs --enable-hierarchical-cache
      {ErrorCode::kOutOfPages, 503},          // no room now (a restore): retry later
      {ErrorCode::kTimeout, 504},
  };
  for (const Row& row : kTable) {
    if (row.code == code) return row.status;
  }
  return 500;
}

json error_json(int status, const std::string& message, const std::string& code) {
  const std::string type = status >= 500 ? "server_error" : "invalid_request_error";
  return json{{"error", {{"message", message}, {"type", type}, {"code", code}}}};
}

json anthropic_error_json(int status, const std::string& message) {
  std::string type = "invalid_request_error";
  switch (status) {
    case 401:
      type = "authentication_error";
      break;
    case 403:
      type = "permission_error";
      break;
    case 404:
      type = "not_found_error";
      break;
    case 413:
      type = "request_too_large";
      break;
    case 429:
      type = "rate_limit_error";
      break;
    case 503:
      type = "overloaded_error";
      break;
    default:
      if (status >= 500) type = "api_error";
  }
  return json{{"type", "error"}, {"error", {{"type", type}, {"message", message}}}};
}

std::string dump_json(const json& body) {
  return body.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace strata
