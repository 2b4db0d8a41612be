// One connection's coroutine (Connection::run): reads requests in order, each within its
// limits (a later request's first byte within idle_timeout_s; the header within
// header_timeout_s of its first byte, or of the accept for the first request; the body within
// body_timeout_s; header and body within their sizes), answers a framing error (400, 413,
// 431, 501) and closes, routes each request (404, 405; HEAD runs the GET handler), runs its
// handler (one that throws or gives no answer gets a 500), writes the answer, and keeps the
// connection for the next request while keep-alive allows. Everything runs on the
// connection's strand.
#include <boost/asio/write.hpp>

#include <array>
#include <exception>
#include <string>

#include "common/log.h"
#include "http/server_internal.h"

namespace strata::http {

using detail::error_response;
using detail::kNoThrow;
using detail::seconds;

namespace {

// Transfer-Encoding: only "chunked" is understood (RFC 9112 §6.1: a server answers an
// unknown coding with 501).
bool only_chunked(std::string_view value) {
  bool any = false;
  while (!value.empty()) {
    const size_t comma = value.find(',');
    std::string_view token = value.substr(0, comma);
    value = comma == std::string_view::npos ? std::string_view() : value.substr(comma + 1);
    while (!token.empty() && (token.front() == ' ' || token.front() == '\t'))
      token.remove_prefix(1);
    while (!token.empty() && (token.back() == ' ' || token.back() == '\t')) token.remove_suffix(1);
    if (token.empty()) continue;
    if (!iequals(token, "chunked")) return false;
    any = true;
  }
  return any;
}

}  // namespace

net::awaitable<void> Connection::run() {
  const ServerOptions& o = s_.options;
  bool first = true;
  // The first request's header is due header_timeout_s after the accept; a later one's,
  // header_timeout_s after its first byte.
  auto header_deadline = SteadyClock::now() + seconds(o.header_timeout_s);
  for (;;) {
    if (s_.stopping.load() || abandoned_by_server_) break;
    bhttp::request_parser<bhttp::string_body> parser;
    parser.header_limit(
        static_cast<std::uint32_t>(std::min<int64_t>(o.max_header_bytes, UINT32_MAX)));
    parser.body_limit(static_cast<std::uint64_t>(o.max_body_bytes));

    // Between requests (or before the first): wait for a first byte.
    auto first_byte_at = SteadyClock::now();
    if (buffer_.size() == 0) {
      if (first) {
        stream_.expires_at(header_deadline);
      } else {
        stream_.expires_after(seconds(o.idle_timeout_s));
      }
      auto [ec, n] = co_await stream_.async_read_some(buffer_.prepare(8192), kNoThrow);
      if (ec) {
        STRATA_LOG_DEBUG("connection {}: {} waiting for a request", remote_, ec.message());
        if (ec == beast::error::timeout) {
          (first ? s_.counters.header_timeouts : s_.counters.idle_timeouts).fetch_add(1);
        }
        break;
      }
      buffer_.commit(n);
      first_byte_at = SteadyClock::now();
      if (!first) header_deadline = first_byte_at + seconds(o.header_timeout_s);
    } else if (!first) {
      header_deadline = SteadyClock::now() + seconds(o.header_timeout_s);
    }
    stream_.expires_at(header_deadline);
    if (auto [ec, n] = co_await bhttp::async_read_header(stream_, buffer_, parser, kNoThrow); ec) {
      co_await answer_framing_error(ec, Phase::kHeader);
      break;
    }
    if (const auto te = parser.get()[bhttp::field::transfer_encoding];
        !te.empty() && !only_chunked(te)) {
      s_.counters.bad_requests.fetch_add(1);
      co_await write_response(error_response(501,
                                             "unsupported Transfer-Encoding '" + std::string(te) +
                                                 "' (only chunked is understood)",
                                             "not_implemented"),
                              true);
      co_await lingering_close();
      co_return;
    }
    if (!parser.is_done()) {
      if (iequals(parser.get()[bhttp::field::expect], "100-continue")) {
        static constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
        stream_.expires_after(seconds(o.write_timeout_s));
        auto [ec, n] = co_await net::async_write(stream_, net::buffer(kContinue), kNoThrow);
        if (ec) break;
      }
      stream_.expires_after(seconds(o.body_timeout_s));
      if (auto [ec, n] = co_await bhttp::async_read(stream_, buffer_, parser, kNoThrow); ec) {
        co_await answer_framing_error(ec, Phase::kBody);
        break;
      }
    }
    stream_.expires_never();

    keep_alive_ = parser.get().keep_alive();
    auto message = parser.release();
    request_ = Request{};
    request_.method = std::string(message.method_string());
    request_.target = std::string(message.target());
    const size_t q = request_.target.find('?');
    request_.path = request_.target.substr(0, q);
    if (q != std::string::npos) request_.query = request_.target.substr(q + 1);
    for (const auto& field : message) {
      request_.headers.emplace_back(std::string(field.name_string()), std::string(field.value()));
    }
    request_.body = std::move(message.body());
    request_.remote = remote_;
    request_.first_byte_at = first_byte_at;
    request_.read_at = SteadyClock::now();

    co_await serve_request();
    if (gone_ || write_failed_ || close_after_ || !keep_alive_ || abandoned_by_server_) {
      STRATA_LOG_DEBUG(
          "connection {} closes after {} {}: gone {} write_failed {} close {} "
          "keep_alive {} abandoned {}",
          remote_, request_.method, request_.path, gone_, write_failed_, close_after_, keep_alive_,
          abandoned_by_server_);
      break;
    }
    first = false;
  }
  co_await lingering_close();
}

net::awaitable<void> Connection::serve_request() {
  ++serial_;
  in_request_ = true;
  woken_ = false;
  status_ = 0;
  streaming_ = stream_ended_ = false;
  s_.counters.requests.fetch_add(1);
  s_.active_requests.fetch_add(1);
  start_watch();

  const Handler* handler = nullptr;
  auto route = s_.routes.find(request_.path);
  // A route ending in "/*" takes any one last segment: "/v1/responses/*" has "/v1/responses/ID".
  if (const size_t slash = request_.path.rfind('/');
      route == s_.routes.end() && slash != std::string::npos && slash + 1 < request_.path.size()) {
    route = s_.routes.find(request_.path.substr(0, slash + 1) + "*");
  }
  if (route != s_.routes.end()) {
    for (const auto& r : route->second) {
      if (r.method == request_.method) handler = &r.handler;
    }
    // HEAD runs the GET handler; write_response sends its header without the body.
    if (handler == nullptr && request_.method == "HEAD") {
      for (const auto& r : route->second) {
        if (r.method == "GET") handler = &r.handler;
      }
    }
  }
  if (handler == nullptr) {
    if (route != s_.routes.end()) {
      Response r =
          error_response(405, "method " + request_.method + " is not allowed on " + request_.path,
                         "method_not_allowed");
      std::string allow;
      for (const auto& e : route->second) allow += (allow.empty() ? "" : ", ") + e.method;
      r.headers.emplace_back("Allow", allow);
      co_await respond(std::move(r));
    } else {
      co_await respond(error_response(404, "no route for " + request_.method + " " + request_.path,
                                      "not_found"));
    }
  } else {
    std::string fault;
    try {
      co_await (*handler)(*this);
    } catch (const std::exception& e) {
      fault = e.what();
    } catch (...) {
      fault = "unknown exception";
    }
    if (!fault.empty()) {
      s_.counters.handler_faults.fetch_add(1);
      STRATA_LOG_ERROR("handler fault on {} {}: {}", request_.method, request_.path, fault);
    }
    if (status_ == 0 && !abandoned()) {
      if (fault.empty()) {
        s_.counters.handler_faults.fetch_add(1);
        fault = "the handler gave no answer";
      }
      co_await respond(error_response(500, "internal error: " + fault, "internal"));
    } else if (streaming_ && !stream_ended_) {
      close_after_ = true;  // a stream cut short: the connection cannot carry another request
    }
  }
  stop_watch();
  in_request_ = false;
  s_.active_requests.fetch_sub(1);
  if (s_.on_response) {
    s_.on_response(request_, route != s_.routes.end() ? std::string_view(route->first) : "",
                   status_ == 0 ? 499 : status_);
  }
}

net::awaitable<void> Connection::answer_framing_error(const beast::error_code& ec, Phase phase) {
  STRATA_LOG_DEBUG("connection {}: {} reading a request's {}", remote_, ec.message(),
                   phase == Phase::kHeader ? "header" : "body");
  if (ec == beast::error::timeout) {
    (phase == Phase::kHeader ? s_.counters.header_timeouts : s_.counters.body_timeouts)
        .fetch_add(1);
    co_return;
  }
  if (ec == bhttp::error::end_of_stream || ec == bhttp::error::partial_message ||
      ec == net::error::eof || ec == net::error::connection_reset ||
      ec == net::error::operation_aborted || ec == net::error::bad_descriptor) {
    co_return;  // the client went away (or shutdown closed the socket): nobody to answer
  }
  s_.counters.bad_requests.fetch_add(1);
  Response r;
  if (ec == bhttp::error::header_limit) {
    r = error_response(431,
                       "request header over " + std::to_string(s_.options.max_header_bytes) +
                           " bytes (--http-max-header-bytes)",
                       "header_too_large");
  } else if (ec == bhttp::error::body_limit) {
    r = error_response(413,
                       "request body over " + std::to_string(s_.options.max_body_bytes) +
                           " bytes (--http-max-body-bytes)",
                       "payload_too_large");
  } else {
    r = error_response(400, "malformed HTTP request: " + ec.message(), "bad_request");
  }
  co_await write_response(std::move(r), true);
}

net::awaitable<void> Connection::write_response(Response response, bool close) {
  status_ = response.status;
  bhttp::response<bhttp::string_body> res{static_cast<bhttp::status>(response.status), 11};
  res.set(bhttp::field::server, "strata");
  res.set(bhttp::field::content_type, response.content_type);
  for (auto& [k, v] : response.headers) res.insert(k, v);
  res.keep_alive(!close && keep_alive_ && !close_after_ && !s_.stopping.load());
  res.body() = std::move(response.body);
  res.prepare_payload();
  if (request_.method == "HEAD") {
    res.body().clear();  // the header says what a GET would get; no body follows (RFC 9110 §9.3.2)
  }
  stream_.expires_after(seconds(s_.options.write_timeout_s));
  auto [ec, n] = co_await bhttp::async_write(stream_, res, kNoThrow);
  stream_.expires_never();
  if (ec) {
    write_failed_ = true;
    if (ec == beast::error::timeout) s_.counters.write_timeouts.fetch_add(1);
  }
  if (close) close_after_ = true;
}

// Closes so that an answer already written is not lost to a reset: stop sending, read
// (and drop) what the client still sends for a moment, then close.
net::awaitable<void> Connection::lingering_close() {
  beast::error_code ec;
  stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
  if (!ec && stream_.socket().is_open()) {
    stream_.expires_after(std::chrono::milliseconds(500));
    std::array<char, 4096> sink{};
    size_t drained = 0;
    while (drained < (64U << 10)) {
      auto [rec, n] = co_await stream_.async_read_some(net::buffer(sink), kNoThrow);
      if (rec) break;
      drained += n;
    }
  }
  stream_.socket().close(ec);
}

}  // namespace strata::http
