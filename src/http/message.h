// HTTP messages as route handlers see them: a parsed request and a whole response. Plain
// values with no Beast types, so that route files need not include Beast.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace strata::http {

using Headers = std::vector<std::pair<std::string, std::string>>;

struct Request {
  std::string method;  // "GET", "POST", ...
  std::string target;  // as sent: path and query
  std::string path;    // the target before '?'
  std::string query;   // the target after '?' (raw, percent-encoded)
  Headers headers;     // in arrival order, names as sent
  std::string body;
  std::string remote;  // the peer's address, "ip:port"
  // When the request's first byte was read (or found already buffered), and when its last
  // byte was: a handler's latency accounting starts here (server-side timing).
  std::chrono::steady_clock::time_point first_byte_at;
  std::chrono::steady_clock::time_point read_at;

  // The first header of that name (names compare case-insensitively), or "" when absent.
  std::string_view header(std::string_view name) const;
  // A query parameter, percent-decoded ('+' is a space), or "" when absent.
  std::string query_param(std::string_view name) const;
};

struct Response {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  Headers headers;  // extra headers (Content-Type and Content-Length are set from the above)
};

// Case-insensitive ASCII comparison (header names, auth schemes).
bool iequals(std::string_view a, std::string_view b);

// Decodes %XX escapes and '+' (application/x-www-form-urlencoded); an invalid escape is kept
// as it is.
std::string percent_decode(std::string_view s);

}  // namespace strata::http
