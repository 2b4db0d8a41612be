// The one shape of an error answer, for the worker and the router alike (OpenAI's):
//   {"error": {"message": "...", "type": "invalid_request_error", "code": "invalid_argument"}}
// `type` is "invalid_request_error" for a 4xx status and "server_error" for a 5xx one;
// `code` names the error (error_code_name() for an ErrorCode).
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "common/result.h"

namespace strata {

// The HTTP status of an error code (4xx for the client's errors, 5xx for the server's).
int http_status(ErrorCode code);

nlohmann::json error_json(int status, const std::string& message, const std::string& code);

// Anthropic's error shape, for its Messages API (docs/anthropic-messages.md):
//   {"type": "error", "error": {"type": "invalid_request_error", "message": "..."}}
// with the error type Anthropic gives `status` (400 invalid_request_error, 401
// authentication_error, 404 not_found_error, 413 request_too_large, 5xx api_error, ...).
nlohmann::json anthropic_error_json(int status, const std::string& message);

// A JSON body as text; strings that are not valid UTF-8 (an echoed header, a path) are
// written with U+FFFD instead of throwing.
std::string dump_json(const nlohmann::json& body);

}  // namespace strata
