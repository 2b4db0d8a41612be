// Server-sent-event streams: open_stream() reads the response header (and the whole body
// of a non-2xx answer), then EventStream::next() reads only when asked, one read at a time,
// and splits the bytes into events with SseParser. So a slow consumer holds the server back
// instead of growing a buffer: at most one read's events wait in StreamState::ready.
//
// Ownership: the StreamState owns the exchange (and so the connection) until the stream
// ends (the connection goes back to the pool), fails or is closed (it is closed).
// Threads: one coroutine at a time per stream.
#include <boost/beast/http/error.hpp>

#include <optional>
#include <string>
#include <string_view>

#include "common/check.h"
#include "http/client.h"
#include "http/client_internal.h"

namespace strata::http {

namespace detail {

asio::awaitable<Result<EventStream>> ClientCore::open_stream(std::shared_ptr<ClientCore> core,
                                                             ClientRequest request,
                                                             std::shared_ptr<CancelState> cancel) {
  auto x = co_await begin(core, std::move(request), cancel, false);
  if (!x) co_return std::unexpected(x.error());
  auto s = std::make_unique<StreamState>(static_cast<size_t>(core->options.max_event_bytes));
  Exchange& e = **x;
  s->what = e.what;
  s->status = e.parser->get().result_int();
  s->headers = headers_of(e.parser->get().base());
  if (s->status < 200 || s->status >= 300) {
    // Not an event stream: read the (bounded) body whole for the caller.
    const auto max_body = static_cast<size_t>(core->options.max_body_bytes);
    while (!e.parser->is_done()) {
      auto bytes = co_await e.read_some();
      if (!bytes) co_return std::unexpected(bytes.error());
      if (s->body.size() + bytes->size() > max_body) {
        co_return std::unexpected(e.error(Phase::kRead, bhttp::error::body_limit));
      }
      s->body.append(*bytes);
    }
  }
  if (e.parser->is_done()) {
    e.finish();
    s->ended = true;
  } else {
    s->exchange = std::move(*x);
  }
  co_return make_stream(std::move(s));
}

asio::awaitable<Result<std::optional<std::string>>> ClientCore::next_event(StreamState& s) {
  while (true) {
    if (!s.ready.empty()) {
      std::string data = std::move(s.ready.front());
      s.ready.pop_front();
      co_return std::optional<std::string>(std::move(data));
    }
    if (s.error) co_return std::unexpected(*s.error);
    if (s.ended || !s.exchange) co_return std::optional<std::string>();
    Exchange& e = *s.exchange;
    auto bytes = co_await e.read_some();
    if (!bytes) {
      s.error = bytes.error();
      s.exchange.reset();
      continue;
    }
    auto fed = s.sse.feed(*bytes, [&s](std::string_view data) { s.ready.emplace_back(data); });
    if (!fed) {
      s.error = Error{fed.error().code, s.what + ": " + fed.error().message};
      s.exchange.reset();
      continue;
    }
    if (e.parser->is_done()) {  // the end: give the connection back before the last events
      e.finish();
      s.exchange.reset();
      s.ended = true;
    }
  }
}

}  // namespace detail

EventStream::EventStream(std::unique_ptr<detail::StreamState> state) : state_(std::move(state)) {}
EventStream::EventStream(EventStream&&) noexcept = default;
EventStream& EventStream::operator=(EventStream&&) noexcept = default;
EventStream::~EventStream() = default;

int EventStream::status() const {
  return state_->status;
}

const Headers& EventStream::headers() const {
  return state_->headers;
}

const std::string& EventStream::body() const {
  return state_->body;
}

asio::awaitable<Result<std::optional<std::string>>> EventStream::next() {
  STRATA_CHECK_MSG(state_ != nullptr, "EventStream::next() on a moved-from stream");
  return detail::guarded(detail::ClientCore::next_event(*state_), state_->what);
}

void EventStream::close() {
  if (!state_ || !state_->exchange) return;
  state_->exchange.reset();
  state_->ready.clear();
  if (!state_->error) state_->error = detail::cancelled_error(state_->what + " (stream closed)");
}

}  // namespace strata::http
