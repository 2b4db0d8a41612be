// JSON answers and the one table from an error code to its HTTP status: where a failed
// command's (or request's) status and JSON error body are chosen, for every route.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "common/result.h"
#include "http/message.h"
#include "request/error_shape.h"  // http_status, the error body shared with the router

namespace strata {

http::Response json_response(int status, const nlohmann::json& body);
http::Response error_response(int status, const std::string& message, const std::string& code);
http::Response error_response(const Error& e);

}  // namespace strata
