// One exchange: a request and its response on one connection, from taking (or opening) the
// connection to giving it back (Exchange::finish) or closing it. begin() sends the request
// and reads the response header, and retries once on a fresh connection when a pooled one
// turns out closed (the rule in client.h); request() reads the whole body. Every failure
// becomes one error value here (exchange_error), naming the call, the phase and the bound.
//
// Threads: an exchange is used by one coroutine at a time; only its CancelState is touched
// from other threads.
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/write.hpp>

#include <string>
#include <string_view>

#include "http/client_internal.h"

namespace strata::http::detail {

namespace {

bool is_idempotent(std::string_view method) {
  for (std::string_view m : {"GET", "HEAD", "PUT", "DELETE", "OPTIONS", "TRACE"}) {
    if (method == m) return true;
  }
  return false;
}

}  // namespace

bool is_stale_kind(const error_code& ec) {
  return ec == asio::error::eof || ec == bhttp::error::end_of_stream ||
         ec == asio::error::connection_reset || ec == asio::error::broken_pipe ||
         ec == asio::error::connection_aborted || ec == asio::error::not_connected;
}

Error cancelled_error(const std::string& what) {
  return Error{ErrorCode::kIoError, "cancelled: " + what};
}

Error exchange_error(const std::string& what, Phase phase, const error_code& ec, int64_t timeout_ms,
                     const ClientOptions& o) {
  if (ec == beast::error::timeout) {
    switch (phase) {
      case Phase::kConnect:
        return {ErrorCode::kTimeout,
                what + ": connect timed out after " + std::to_string(timeout_ms) + " ms"};
      case Phase::kWrite:
        return {ErrorCode::kTimeout, what + ": sending the request timed out after " +
                                         std::to_string(timeout_ms) + " ms"};
      case Phase::kRead:
        return {ErrorCode::kTimeout, what + ": no response byte for " + std::to_string(timeout_ms) +
                                         " ms (read timeout)"};
    }
  }
  if (ec == asio::error::operation_aborted) return cancelled_error(what);
  if (ec == bhttp::error::body_limit) {
    return {ErrorCode::kResourceExhausted, what + ": the response body is over max_body_bytes (" +
                                               std::to_string(o.max_body_bytes) + ")"};
  }
  if (ec == bhttp::error::header_limit || ec == bhttp::error::buffer_overflow) {
    return {ErrorCode::kResourceExhausted, what +
                                               ": the response header is over max_header_bytes (" +
                                               std::to_string(o.max_header_bytes) + ")"};
  }
  if (ec == bhttp::error::end_of_stream || ec == bhttp::error::partial_message ||
      is_stale_kind(ec)) {
    return {ErrorCode::kIoError,
            what + ": the server closed the connection before the whole response (" + ec.message() +
                ")"};
  }
  if (ec.category() == bhttp::make_error_code(bhttp::error::bad_version).category()) {
    return {ErrorCode::kCorrupt, what + ": malformed response: " + ec.message()};
  }
  const char* doing = phase == Phase::kConnect ? "cannot connect"
                      : phase == Phase::kWrite ? "sending the request failed"
                                               : "reading the response failed";
  return {ErrorCode::kIoError, what + ": " + doing + ": " + ec.message()};
}

Headers headers_of(const bhttp::fields& fields) {
  Headers out;
  for (const auto& f : fields) out.emplace_back(f.name_string(), f.value());
  return out;
}

void Exchange::finish() {
  cancel->detach();
  if (conn && parser && parser->is_done() && parser->keep_alive() && conn->buffer.size() == 0 &&
      !cancel->is_cancelled()) {
    core->put_idle(std::move(conn));
  } else {
    close();
  }
}

Error Exchange::error(Phase phase, const error_code& ec) {
  if (cancel->is_cancelled()) return cancelled_error(what);
  const int64_t timeout_ms = phase == Phase::kConnect ? core->options.connect_timeout_ms
                             : phase == Phase::kWrite ? core->options.write_timeout_ms
                                                      : read_timeout_ms;
  return exchange_error(what, phase, ec, timeout_ms, core->options);
}

asio::awaitable<Result<std::string_view>> Exchange::read_some() {
  auto& body = parser->get().body();
  body.data = chunk.data();
  body.size = chunk.size();
  body.more = true;
  conn->stream.expires_after(ms(read_timeout_ms));
  auto [ec, n] = co_await bhttp::async_read_some(conn->stream, conn->buffer, *parser, kAsTuple);
  (void)n;
  if (ec == bhttp::error::need_buffer) ec = {};
  if (ec || cancel->is_cancelled()) co_return std::unexpected(error(Phase::kRead, ec));
  co_return std::string_view(chunk.data(), chunk.size() - body.size);
}

asio::awaitable<Result<std::unique_ptr<Exchange>>> ClientCore::begin(
    std::shared_ptr<ClientCore> core, ClientRequest request, std::shared_ptr<CancelState> cancel,
    bool whole_body) {
  const ClientOptions& o = core->options;
  const std::string method = request.method;
  const std::string key = host_port(request.host, request.port);
  auto x = std::make_unique<Exchange>(core, cancel);
  x->what = method + " http://" + key + request.target;
  x->read_timeout_ms = request.read_timeout_ms > 0 ? request.read_timeout_ms : o.read_timeout_ms;
  auto message = build_message(request, o);
  if (!message) co_return std::unexpected(message.error());

  for (int attempt = 0;; ++attempt) {
    if (cancel->is_cancelled()) co_return std::unexpected(cancelled_error(x->what));
    // The retry (attempt 1) always takes a fresh connection.
    x->conn = attempt == 0 ? core->take_idle(key) : nullptr;
    const bool reused = x->conn != nullptr;
    if (reused) {
      core->connections_reused.fetch_add(1, std::memory_order_relaxed);
    } else {
      auto c = co_await connect(core, request.host, request.port, cancel, x->what);
      if (!c) co_return std::unexpected(c.error());
      x->conn = std::move(*c);
      x->conn->key = key;
    }
    if (!cancel->attach(x->conn->stream.socket().native_handle())) {
      co_return std::unexpected(cancelled_error(x->what));
    }
    x->parser.emplace();
    x->parser->header_limit(static_cast<uint32_t>(o.max_header_bytes));
    // A stream's body is unbounded (its events are bounded); a non-2xx body is bounded
    // by the stream's reader.
    if (whole_body) {
      x->parser->body_limit(static_cast<uint64_t>(o.max_body_bytes));
    } else {
      x->parser->body_limit(boost::none);
    }
    if (method == "HEAD") x->parser->skip(true);

    x->conn->stream.expires_after(ms(o.write_timeout_ms));
    auto [wec, written] = co_await bhttp::async_write(x->conn->stream, *message, kAsTuple);
    (void)written;
    if (wec || cancel->is_cancelled()) {
      // The request did not all leave: the server cannot have acted on it.
      if (reused && attempt == 0 && is_stale_kind(wec) && !cancel->is_cancelled()) {
        x->close();
        core->retries.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      co_return std::unexpected(x->error(Phase::kWrite, wec));
    }

    x->conn->stream.expires_after(ms(x->read_timeout_ms));
    auto [rec, parsed] =
        co_await bhttp::async_read_header(x->conn->stream, x->conn->buffer, *x->parser, kAsTuple);
    (void)parsed;
    if (rec || cancel->is_cancelled()) {
      const bool nothing_arrived = x->conn->buffer.size() == 0 && !x->parser->got_some();
      if (reused && attempt == 0 && nothing_arrived && is_stale_kind(rec) &&
          is_idempotent(method) && !cancel->is_cancelled()) {
        x->close();
        core->retries.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      co_return std::unexpected(x->error(Phase::kRead, rec));
    }
    co_return std::move(x);
  }
}

asio::awaitable<Result<ClientResponse>> ClientCore::request(std::shared_ptr<ClientCore> core,
                                                            ClientRequest request,
                                                            std::shared_ptr<CancelState> cancel) {
  auto x = co_await begin(core, std::move(request), cancel, true);
  if (!x) co_return std::unexpected(x.error());
  Exchange& e = **x;
  ClientResponse out;
  out.status = e.parser->get().result_int();
  out.headers = headers_of(e.parser->get().base());
  const auto max_body = static_cast<size_t>(core->options.max_body_bytes);
  while (!e.parser->is_done()) {
    auto bytes = co_await e.read_some();
    if (!bytes) co_return std::unexpected(bytes.error());
    if (out.body.size() + bytes->size() > max_body) {
      co_return std::unexpected(e.error(Phase::kRead, bhttp::error::body_limit));
    }
    out.body.append(*bytes);
  }
  e.finish();
  co_return std::move(out);
}

}  // namespace strata::http::detail
