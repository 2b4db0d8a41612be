// The client's requests before anything is sent: ClientOptions' validation, URL parsing,
// make_request(), and the one place a ClientRequest becomes the message on the wire
// (build_message, which refuses anything that could split or smuggle a request: a method or
// header name that is not a token, CR/LF/NUL in a value, spaces in the host or target).
// Pure functions: no I/O, no state, callable from any thread.
#include <boost/beast/http/field.hpp>

#include <charconv>
#include <string>
#include <string_view>
#include <utility>

#include "http/client.h"
#include "http/client_internal.h"

namespace strata::http {

namespace {

bool is_tchar(char c) {  // RFC 9110 token characters
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return true;
  return std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}

bool is_token(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!is_tchar(c)) return false;
  }
  return true;
}

bool has_ctl_or_space(std::string_view s) {
  for (char c : s) {
    if (static_cast<unsigned char>(c) <= ' ' || c == 0x7f) return true;
  }
  return false;
}

bool has_crlf_or_nul(std::string_view s) {
  return s.find_first_of(std::string_view("\r\n\0", 3)) != std::string_view::npos;
}

std::string_view find_header(const Headers& headers, std::string_view name) {
  for (const auto& [k, v] : headers) {
    if (iequals(k, name)) return v;
  }
  return {};
}

}  // namespace

namespace detail {

std::string host_port(std::string_view host, uint16_t port) {
  // Appended piece by piece: g++ 12 at -O3 reports a false -Wrestrict on
  // `"[" + std::string(host) + "]"` once this function has external linkage.
  const bool v6 = host.find(':') != std::string_view::npos;
  std::string out;
  if (v6) out += '[';
  out += host;
  if (v6) out += ']';
  out += ':';
  out += std::to_string(port);
  return out;
}

Result<bhttp::request<bhttp::string_body>> build_message(ClientRequest& r, const ClientOptions& o) {
  auto bad = [&](const std::string& why) {
    return make_error(ErrorCode::kInvalidArgument, "bad request to " + r.host + ": " + why);
  };
  if (!is_token(r.method)) return bad("the method \"" + r.method + "\" is not a token");
  if (r.host.empty() || has_ctl_or_space(r.host)) return bad("empty host, or a space in it");
  if (r.port == 0) return bad("port 0");
  if (r.target.empty() || has_ctl_or_space(r.target)) {
    return bad("the target must be non-empty, without spaces or control characters");
  }
  if (r.method == "TRACE" && !r.body.empty()) return bad("a TRACE request has no body");
  bhttp::request<bhttp::string_body> m;
  m.method_string(r.method);
  m.target(r.target);
  m.version(11);
  for (const auto& [name, value] : r.headers) {
    if (!is_token(name)) return bad("the header name \"" + name + "\" is not a token");
    if (has_crlf_or_nul(value)) return bad("the header " + name + " holds CR, LF or NUL");
    m.insert(name, value);
  }
  if (m.find(bhttp::field::host) == m.end()) {
    m.set(bhttp::field::host,
          r.port == 80 ? (r.host.find(':') != std::string::npos ? "[" + r.host + "]" : r.host)
                       : host_port(r.host, r.port));
  }
  if (m.find(bhttp::field::user_agent) == m.end() && !o.user_agent.empty()) {
    m.set(bhttp::field::user_agent, o.user_agent);
  }
  if (o.max_idle_per_host == 0 && m.find(bhttp::field::connection) == m.end()) {
    m.set(bhttp::field::connection, "close");  // no reuse: let the server close at once
  }
  m.body() = std::move(r.body);
  m.prepare_payload();
  return m;
}

}  // namespace detail

Status validate(const ClientOptions& o) {
  auto bad = [](const std::string& what) {
    return make_error(ErrorCode::kInvalidArgument, "ClientOptions: " + what);
  };
  if (o.connect_timeout_ms <= 0) return bad("connect_timeout_ms must be > 0");
  if (o.write_timeout_ms <= 0) return bad("write_timeout_ms must be > 0");
  if (o.read_timeout_ms <= 0) return bad("read_timeout_ms must be > 0");
  if (o.max_header_bytes < 1024 || o.max_header_bytes > (int64_t{1} << 30)) {
    return bad("max_header_bytes must be in [1024, 2^30]");
  }
  if (o.max_body_bytes < 0) return bad("max_body_bytes must be >= 0");
  if (o.max_event_bytes < 1) return bad("max_event_bytes must be >= 1");
  if (o.max_idle_per_host < 0) return bad("max_idle_per_host must be >= 0");
  if (o.idle_timeout_ms <= 0) return bad("idle_timeout_ms must be > 0");
  if (has_crlf_or_nul(o.user_agent)) return bad("user_agent must not hold CR, LF or NUL");
  return {};
}

Result<Url> parse_url(std::string_view url) {
  auto bad = [&](const std::string& why) {
    return make_error(ErrorCode::kInvalidArgument,
                      "malformed URL \"" + std::string(url) + "\": " + why);
  };
  std::string_view rest = url;
  if (const size_t scheme_end = rest.find("://"); scheme_end != std::string_view::npos) {
    const std::string_view scheme = rest.substr(0, scheme_end);
    if (!iequals(scheme, "http")) {
      return make_error(ErrorCode::kUnsupported, "unsupported URL scheme \"" + std::string(scheme) +
                                                     "\" in \"" + std::string(url) +
                                                     "\" (plain http only)");
    }
    rest.remove_prefix(scheme_end + 3);
  }
  const size_t authority_end = rest.find_first_of("/?#");
  const std::string_view authority = rest.substr(0, authority_end);
  std::string_view target =
      authority_end == std::string_view::npos ? std::string_view() : rest.substr(authority_end);
  if (const size_t hash = target.find('#'); hash != std::string_view::npos) {
    target = target.substr(0, hash);
  }
  if (authority.find('@') != std::string_view::npos) return bad("user info is not supported");

  Url out;
  std::string_view host;
  std::string_view port;
  if (!authority.empty() && authority.front() == '[') {
    const size_t close = authority.find(']');
    if (close == std::string_view::npos) return bad("unclosed '['");
    host = authority.substr(1, close - 1);
    const std::string_view after = authority.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':') return bad("junk after ']'");
      port = after.substr(1);
      if (port.empty()) return bad("empty port");
    }
  } else {
    const size_t colon = authority.find(':');
    host = authority.substr(0, colon);
    if (colon != std::string_view::npos) {
      port = authority.substr(colon + 1);
      if (port.empty()) return bad("empty port");
    }
  }
  if (host.empty()) return bad("no host");
  if (has_ctl_or_space(host)) return bad("a space or control character in the host");
  if (!port.empty()) {
    unsigned value = 0;
    const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
    if (ec != std::errc() || end != port.data() + port.size() || value == 0 || value > 65535) {
      return bad("the port must be a number in [1, 65535]");
    }
    out.port = static_cast<uint16_t>(value);
  }
  out.host = std::string(host);
  if (target.empty()) {
    out.target = "/";
  } else if (target.front() == '?') {
    out.target = "/" + std::string(target);
  } else {
    out.target = std::string(target);
  }
  if (has_ctl_or_space(out.target)) return bad("a space or control character in the path");
  return out;
}

Result<ClientRequest> make_request(std::string method, std::string_view url, std::string body,
                                   Headers headers) {
  auto u = parse_url(url);
  if (!u) return std::unexpected(u.error());
  ClientRequest r;
  r.method = std::move(method);
  r.host = std::move(u->host);
  r.port = u->port;
  r.target = std::move(u->target);
  r.headers = std::move(headers);
  r.body = std::move(body);
  return r;
}

std::string_view ClientResponse::header(std::string_view name) const {
  return find_header(headers, name);
}

}  // namespace strata::http
