// The server's limits and metrics: ServerOptions' validation (once, in bind(), with the
// command-line flag in each message), the error bodies a request that breaks a limit (or a
// route, or a handler) is answered with, the answer a refused connection gets, and stats(),
// a snapshot of the counters every I/O thread adds to.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <string>
#include <string_view>
#include <utility>

#include "http/server.h"
#include "http/server_internal.h"

namespace strata::http {

namespace detail {

std::string error_json(int status, std::string_view message, std::string_view code) {
  const char* type = status >= 500 ? "server_error" : "invalid_request_error";
  return nlohmann::json{{"error", {{"message", message}, {"type", type}, {"code", code}}}}.dump(
      -1, ' ', false, nlohmann::json::error_handler_t::replace);
}

Response error_response(int status, std::string_view message, std::string_view code) {
  return Response{.status = status, .body = error_json(status, message, code)};
}

// What a refused connection gets before it is closed (best effort, never waited for).
const std::string& refused_response() {
  static const std::string text = [] {
    const std::string body =
        error_json(503, "too many open connections, or shutting down", "too_many_connections");
    return "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
           "Connection: close\r\nContent-Length: " +
           std::to_string(body.size()) + "\r\n\r\n" + body;
  }();
  return text;
}

}  // namespace detail

Status validate(const ServerOptions& o) {
  auto bad = [](const std::string& m) { return make_error(ErrorCode::kInvalidArgument, m); };
  if (o.port < 0 || o.port > 65535) return bad("port must be in [0, 65535]");
  if (o.io_threads < 0 || o.io_threads > 1024) return bad("--http-threads must be in [0, 1024]");
  if (o.worker_threads < 0 || o.worker_threads > 1024) return bad("worker threads in [0, 1024]");
  for (auto [name, v] : {std::pair{"--http-header-timeout-s", o.header_timeout_s},
                         std::pair{"--http-body-timeout-s", o.body_timeout_s},
                         std::pair{"--http-idle-timeout-s", o.idle_timeout_s},
                         std::pair{"--http-write-timeout-s", o.write_timeout_s}}) {
    if (!(v > 0) || v > 86400) return bad(std::string(name) + " must be in (0, 86400] seconds");
  }
  if (o.max_header_bytes < 1024 || o.max_header_bytes > (int64_t{1} << 30)) {
    return bad("--http-max-header-bytes must be in [1024, 2^30]");
  }
  if (o.max_body_bytes < 0) return bad("--http-max-body-bytes must be >= 0");
  if (o.max_connections < 1) return bad("--http-max-connections must be >= 1");
  if (o.max_stream_buffer_bytes < 4096)
    return bad("--http-max-stream-buffer-bytes must be >= 4096");
  return {};
}

ServerStats Server::stats() const {
  const detail::Counters& c = impl_->counters;
  ServerStats out;
  out.open_connections = c.open_connections.load();
  out.connections_accepted = c.connections_accepted.load();
  out.connections_refused = c.connections_refused.load();
  out.requests = c.requests.load();
  out.header_timeouts = c.header_timeouts.load();
  out.body_timeouts = c.body_timeouts.load();
  out.idle_timeouts = c.idle_timeouts.load();
  out.write_timeouts = c.write_timeouts.load();
  out.client_disconnects = c.client_disconnects.load();
  out.slow_streams_cancelled = c.slow_streams_cancelled.load();
  out.bad_requests = c.bad_requests.load();
  out.handler_faults = c.handler_faults.load();
  return out;
}

void add_listen_flags(CLI::App& cmd, ServerOptions& o) {
  const std::string group = "HTTP server";
  cmd.add_option("--host", o.host, "Bind address")->capture_default_str()->group(group);
  cmd.add_option("--port", o.port, "Port (0: any free port, printed at start)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str()
      ->group(group);
}

void add_limit_flags(CLI::App& cmd, ServerOptions& o) {
  const std::string group = "HTTP server";
  cmd.add_option("--http-threads", o.io_threads, "HTTP I/O threads (0: one per core)")
      ->check(CLI::Range(0, 1024))
      ->capture_default_str()
      ->group(group);
  cmd.add_option("--http-header-timeout-s", o.header_timeout_s,
                 "Close a connection whose request header is not complete after this long")
      ->check(CLI::Range(0.001, 86400.0))
      ->capture_default_str()
      ->group(group);
  cmd.add_option("--http-body-timeout-s", o.body_timeout_s,
                 "Close a connection whose request body is not complete this long after its "
                 "header")
      ->check(CLI::Range(0.001, 86400.0))
      ->capture_default_str()
      ->group(group);
  cmd.add_option("--http-idle-timeout-s", o.idle_timeout_s,
                 "Close a keep-alive connection idle between requests for this long")
      ->check(CLI::Range(0.001, 86400.0))
      ->capture_default_str()
      ->group(group);
  cmd.add_option("--http-write-timeout-s", o.write_timeout_s,
                 "Close a connection whose client accepts no bytes for this long")
      ->check(CLI::Range(0.001, 86400.0))
      ->capture_default_str()
      ->group(group);
  cmd.add_option("--http-max-header-bytes", o.max_header_bytes,
                 "Largest request line + headers (431 beyond)")
      ->check(CLI::Range(int64_t{1024}, int64_t{1} << 30))
      ->capture_default_str()
      ->group(group);
  cmd.add_option("--http-max-body-bytes", o.max_body_bytes,
                 "Largest request body, whatever its content type (413 beyond)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40))
      ->capture_default_str()
      ->group(group);
  cmd.add_option("--http-max-connections", o.max_connections,
                 "Open connections; new ones beyond are refused at once")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24))
      ->capture_default_str()
      ->group(group);
  cmd.add_option("--http-max-stream-buffer-bytes", o.max_stream_buffer_bytes,
                 "Unwritten bytes a streaming response may queue for a slow reader before it "
                 "is cut")
      ->check(CLI::Range(int64_t{4096}, int64_t{1} << 40))
      ->capture_default_str()
      ->group(group);
}

}  // namespace strata::http
