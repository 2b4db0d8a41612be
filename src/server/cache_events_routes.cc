// GET /cache/events, behind the admin key: the engine's KV event batches as server-sent
// events (docs/kv-events.md), for the dashboard and any tool.
//
//   event: hello            data: {"seq": N}   first: the next batch this client receives
//   data: {"seq", "ts", "events"}              one per batch (cache_events_stream.h)
//   : keepalive                                a comment after 15 s without an event
//   event: overflow         data: {"seq": M}   the client fell behind and lost batch M on:
//                                              the stream ends, resync from /cache/state
//
// The stream ends at the server's shutdown; 503 when max_subscribers already listen.
//
// Backpressure: events go to the connection only while little of the stream is still
// unwritten; the rest waits in the subscriber's bounded queue, which drops the subscriber
// (overflow) rather than grow. So a slow reader is told, and the engine never waits.
#include <algorithm>
#include <chrono>
#include <string>

#include "server/routes.h"

namespace strata {
namespace {

using boost::asio::awaitable;
using KeepaliveClock = std::chrono::steady_clock;

constexpr auto kKeepalive = std::chrono::seconds(15);
// Unwritten stream bytes past which the handler leaves events in the subscriber's queue.
constexpr size_t kSendWindowBytes = size_t{256} << 10;

awaitable<void> cache_events(RouteContext& ctx, http::Exchange& ex) {
  auto sub = ctx.cache_events.subscribe(ex.waker());
  if (!sub) {
    http::Response busy = error_response(503, sub.error().message, "unavailable");
    co_await ex.respond(std::move(busy));
    co_return;
  }
  http::Headers headers{{"Cache-Control", "no-cache"}, {"X-Accel-Buffering", "no"}};
  if (!co_await ex.begin_stream(200, "text/event-stream", std::move(headers))) co_return;
  std::string hello = "event: hello\ndata: {\"seq\": ";
  hello += std::to_string((*sub)->start_seq());
  hello += "}\n\n";
  if (!ex.send(std::move(hello))) co_return;
  // Half the HTTP layer's bound at most, so that an overflow notice always fits behind.
  const size_t window = std::min(
      kSendWindowBytes,
      static_cast<size_t>(std::max<int64_t>(ctx.options.http.max_stream_buffer_bytes / 2, 1)));
  auto last_sent = KeepaliveClock::now();
  for (;;) {
    const size_t queued = ex.stream_queued_bytes();
    if (queued < window) {
      CacheEventsStream::Subscription::Taken t = (*sub)->take(window - queued);
      if (t.overflow) {
        std::string notice = "event: overflow\ndata: {\"seq\": ";
        notice += std::to_string(t.lost_seq);
        notice += "}\n\n";
        if (ex.send(std::move(notice))) co_await ex.end_stream();
        co_return;
      }
      if (!t.frames.empty()) {
        if (!ex.send(std::move(t.frames))) co_return;  // the client is gone
        last_sent = KeepaliveClock::now();
        continue;  // more may be queued
      }
      if (t.closed) {
        co_await ex.end_stream();
        co_return;
      }
    }
    const auto idle = KeepaliveClock::now() - last_sent;
    if (idle >= kKeepalive) {
      if (!ex.send(": keepalive\n\n")) co_return;
      last_sent = KeepaliveClock::now();
      continue;
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(kKeepalive - idle);
    if (!co_await ex.wait(std::max(left, std::chrono::milliseconds(1)))) co_return;
  }
}

}  // namespace

void add_cache_events_routes(http::Server& server, RouteContext& ctx) {
  server.route("GET", "/cache/events",
               admin_only(ctx, [&ctx](http::Exchange& ex) { return cache_events(ctx, ex); }));
}

}  // namespace strata
