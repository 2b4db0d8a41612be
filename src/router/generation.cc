#include "router/generation.h"

#include <algorithm>
#include <mutex>
#include <optional>
#include <string>

#include "common/log.h"
#include "http/message.h"
#include "request/responses_request.h"
#include "request/turn_record.h"
#include "router/api_answers.h"
#include "router/response_holders.h"

namespace strata::router {

using boost::asio::awaitable;

namespace {

// The prompt limit the router reads to: the largest --max-prompt-tokens of its workers
// (0: none known). A longer prompt is routed unscored and refused by its worker, so the
// router neither tokenizes nor indexes more of it than a worker would.
size_t prompt_limit(Router::Impl& r) {
  int64_t limit = 0;
  std::lock_guard lock(r.mutex);
  for (const auto& [id, w] : r.workers) {
    if (w->joined) limit = std::max(limit, w->max_prompt_tokens);
  }
  return static_cast<size_t>(limit);
}

std::string tenant_of(const http::Request& req) {
  std::string t(req.header("x-tenant"));
  if (!t.empty()) return t.substr(0, 256);
  std::string auth(req.header("authorization"));
  return auth.substr(0, 256);
}

http::Headers route_headers(const RouteChoice& c, int attempt) {
  http::Headers h{{"x-strata-worker", c.worker->url}, {"x-strata-route", c.reason}};
  if (c.prefill) h.emplace_back("x-strata-prefill-worker", c.prefill->url);
  if (attempt > 0) h.emplace_back("x-strata-attempts", std::to_string(attempt + 1));
  return h;
}

// A worker's x-strata-omitted-tools header (the Responses tools it left out of the prompt),
// passed on to the client.
void pass_worker_headers(std::string_view omitted_tools, http::Headers& headers) {
  if (!omitted_tools.empty()) {
    headers.emplace_back(std::string(kOmittedToolsHeader), std::string(omitted_tools));
  }
}

bool retryable_status(int status) {
  return status == 429 || status == 503;
}

// Waits in the router queue while every worker is saturated. False: the client was
// answered (429: the queue is full, or the wait is over) or went away.
awaitable<bool> wait_in_queue(Router::Impl& r, http::Exchange& ex, RoutedApi api,
                              const RoutedRequest& p, const std::string& tenant,
                              int64_t& queued_since) {
  const int64_t now = r.now_ms();
  if (queued_since < 0) queued_since = now;
  Ticket ticket{};
  int64_t retry_after = 1;
  {
    std::lock_guard lock(r.mutex);
    auto t = r.queue.push(tenant, p.session, now);
    if (!t) {
      retry_after = r.queue.retry_after_s(now);
    } else {
      ticket = *t;
      r.queue_wakers[static_cast<uint64_t>(ticket)] = ex.waker();
    }
  }
  auto refuse = [&](std::string why) -> awaitable<void> {
    r.metrics.rejected_429.Increment();
    r.metrics.requests.Add({{"status", "429"}}).Increment();
    http::Response resp = api_error(api, 429, why, "rate_limited");
    resp.headers.emplace_back("Retry-After", std::to_string(retry_after));
    co_await ex.respond(std::move(resp));
  };
  if (ticket == Ticket{}) {
    co_await refuse("every worker is saturated and the router queue is full; retry later");
    co_return false;
  }
  r.metrics.queued.Increment();
  const int64_t deadline = queued_since + r.options.queue.max_wait_ms;
  const bool alive =
      co_await ex.wait(std::chrono::milliseconds(std::max<int64_t>(1, deadline - now)));
  bool over = false;
  {
    std::lock_guard lock(r.mutex);
    r.queue.remove(ticket);
    r.queue_wakers.erase(static_cast<uint64_t>(ticket));
    over = r.now_ms() >= deadline;
    if (over) retry_after = r.queue.retry_after_s(r.now_ms());
  }
  if (!alive) co_return false;
  if (over) {
    co_await refuse("every worker stayed saturated for the router queue's whole wait; retry later");
    co_return false;
  }
  co_return true;
}

}  // namespace

awaitable<void> route_generation(Router::Impl& r, http::Exchange& ex, RoutedApi api) {
  const http::Request& req = ex.request();
  const size_t limit = prompt_limit(r);
  const TurnLookup records = [&r](TurnKey kind, const std::string& key) {
    std::lock_guard lock(r.mutex);
    return r.turn_records.find(kind, key);
  };
  auto p = co_await ex.offload([&] {
    auto read = read_routed_request(
        r.reader, req.body,
        session_header(req.header(kSessionHeader), req.header(kClaudeCodeSessionHeader)), api,
        limit, records,
        AnthropicReadOptions{.strip_billing_header = !r.options.keep_billing_header});
    release_memory_after(req.body.size());
    return read;
  });
  if (!p) {
    r.metrics.requests.Add({{"status", "400"}}).Increment();
    co_await ex.respond(api_error(api, p.error()));
    co_return;
  }
  const std::string& upstream_body = p->rewritten_body ? *p->rewritten_body : req.body;
  // The worker's record of the turn is asked for where a next turn continues it (a session's
  // conversation on any chat-like API, a stored response), and taken out of the answer
  // unless the client asked too.
  const bool wants_record = !p->record_key.empty() || (api == RoutedApi::kResponses && p->store);
  const bool client_wants_record = req.header(kTurnRecordHeader) == "1";
  bool counted = false;  // the prompt's tokens, counted once, as the chosen worker reads them
  RouteRequest rr;
  rr.tokens = std::move(p->tokens);
  rr.exact_worker = p->exact_worker;
  rr.exact_tokens = std::move(p->exact_tokens);
  rr.session = p->session;
  rr.tenant = tenant_of(req);
  rr.pd_local_only = p->pd_local_only;
  // --session-store: where the other router replicas bound the session, adopted first.
  const SharedBinding shared = co_await read_shared_binding(r, ex, rr.session);
  if (ex.abandoned()) co_return;
  // A Responses request that builds on a stored response goes to the worker that stored it
  // (bound, or found by asking the workers), or nowhere.
  const std::optional<StoredBase> base = stored_base(*p);
  const int64_t holder_deadline = r.now_ms() + r.options.response_holder_wait_ms;
  int64_t holder_backoff = 100;
  if (base) {
    auto holder = co_await find_response_holder(r, ex, base->response_id, holder_deadline);
    if (ex.abandoned()) co_return;
    if (!holder) {
      r.metrics.requests.Add({{"status", "400"}}).Increment();
      http::Response out = base->unknown("");
      co_await ex.respond(std::move(out));
      co_return;
    }
    rr.only_worker = holder->id;
  }
  int64_t queued_since = -1;
  std::optional<http::ClientResponse> last_refusal;  // a worker's 429/503, if all refuse
  std::string last_error;
  // A continuation's tries are bounded by its holder's wait, not by --max-attempts: it has
  // one worker to try, which may be back in a moment (wait_for_holder).
  for (int attempt = 0; attempt < r.options.max_attempts || base;) {
    auto c = r.choose(rr);
    if (!c) {
      if (base && !last_refusal &&
          co_await wait_for_holder(r, ex, base->response_id, *rr.only_worker, holder_deadline,
                                   holder_backoff)) {
        rr.exclude.clear();
        rr.refused.clear();
        continue;
      }
      if (ex.abandoned()) co_return;
      break;
    }
    if (c->all_saturated) {
      if (!co_await wait_in_queue(r, ex, api, *p, rr.tenant, queued_since)) co_return;
      continue;
    }
    if (queued_since >= 0) {
      r.metrics.queue_seconds.Observe(static_cast<double>(r.now_ms() - queued_since) / 1e3);
      queued_since = -1;
    }
    if (attempt > 0) r.metrics.retries.Increment();
    ++attempt;
    co_await publish_shared_binding(r, ex, rr.session, shared, *c);
    if (!counted) {
      counted = true;
      r.metrics.prompt_tokens.Increment(static_cast<double>(c->prompt_tokens));
    }
    http::ClientRequest up =
        r.upstream_request(*c->worker, "POST", req.target, upstream_body, false);
    if (wants_record) up.headers.emplace_back(std::string(kTurnRecordHeader), "1");
    if (auto a = req.header("authorization"); !a.empty()) {
      up.headers.emplace_back("Authorization", std::string(a));
    }
    // The session headers: a Messages or Responses request's session, read by the worker
    // from them.
    for (const char* h :
         {"x-api-key", "anthropic-version", "x-session-id", "x-claude-code-session-id"}) {
      if (auto v = req.header(h); !v.empty()) up.headers.emplace_back(h, std::string(v));
    }
    if (!c->prefill_peer.empty()) up.headers.emplace_back("x-strata-prefill-peer", c->prefill_peer);
    const std::string worker_url = c->worker->url;
    if (!p->stream) {
      auto resp = co_await r.client.request(std::move(up));
      if (!resp || retryable_status(resp->status)) {
        const UpstreamOutcome o =
            !resp ? (resp.error().code == ErrorCode::kTimeout ? UpstreamOutcome::kTimeout
                                                              : UpstreamOutcome::kConnectError)
                  : UpstreamOutcome::kBackpressure;
        r.outcome(*c, o, rr.session, c->probe);
        r.finished(*c, false);
        if (!resp) {
          last_error = worker_url + ": " + resp.error().message;
        } else {
          last_refusal = std::move(*resp);
          rr.refused.push_back(c->worker->id);
        }
        rr.exclude.push_back(c->worker->id);
        STRATA_LOG_DEBUG("route: worker {} failed before its answer ({}); retrying elsewhere",
                         worker_url, !resp ? last_error : std::to_string(last_refusal->status));
        continue;
      }
      r.outcome(*c, resp->status >= 500 ? UpstreamOutcome::kServerError : UpstreamOutcome::kOk,
                rr.session, c->probe);
      r.finished(*c, false);
      if (resp->status >= 400) r.refused(*c);
      if (api == RoutedApi::kResponses) note_responses_answer(r, *c, *p, resp->status, resp->body);
      if (wants_record && resp->status == 200) {
        AnsweredRecord answered = take_answered_record(resp->body, client_wants_record);
        const std::string response_id = answered.response_id;
        learn_turn(r, *c, api, *p, response_id, std::move(answered));
      }
      r.metrics.predicted_cached_tokens.Increment(static_cast<double>(c->predicted_cached_tokens));
      count_usage(r, *c, resp->body);
      r.metrics.requests.Add({{"status", std::to_string(resp->status)}}).Increment();
      http::Response out{.status = resp->status,
                         .content_type = std::string(resp->header("content-type")),
                         .body = std::move(resp->body),
                         .headers = route_headers(*c, attempt - 1)};
      pass_worker_headers(resp->header(kOmittedToolsHeader), out.headers);
      if (out.content_type.empty()) out.content_type = "application/json";
      co_await ex.respond(std::move(out));
      co_return;
    }
    http::CancelHandle cancel;
    auto es = co_await r.client.open_stream(std::move(up), cancel);
    if (!es || retryable_status(es->status())) {
      const UpstreamOutcome o =
          !es ? (es.error().code == ErrorCode::kTimeout ? UpstreamOutcome::kTimeout
                                                        : UpstreamOutcome::kConnectError)
              : UpstreamOutcome::kBackpressure;
      r.outcome(*c, o, rr.session, c->probe);
      r.finished(*c, false);
      if (!es) {
        last_error = worker_url + ": " + es.error().message;
      } else {
        last_refusal = http::ClientResponse{
            .status = es->status(), .headers = es->headers(), .body = es->body()};
        rr.refused.push_back(c->worker->id);
      }
      rr.exclude.push_back(c->worker->id);
      continue;
    }
    if (es->status() < 200 || es->status() >= 300) {
      // An answer that is not a stream (a 400 for a bad field): passed on as it is.
      r.outcome(*c, es->status() >= 500 ? UpstreamOutcome::kServerError : UpstreamOutcome::kOk,
                rr.session, c->probe);
      r.finished(*c, false);
      r.refused(*c);
      if (api == RoutedApi::kResponses) note_responses_answer(r, *c, *p, es->status(), es->body());
      r.metrics.requests.Add({{"status", std::to_string(es->status())}}).Increment();
      http::Response out{.status = es->status(),
                         .content_type = "application/json",
                         .body = es->body(),
                         .headers = route_headers(*c, attempt - 1)};
      co_await ex.respond(std::move(out));
      co_return;
    }
    r.outcome(*c, UpstreamOutcome::kOk, rr.session, c->probe);
    r.metrics.predicted_cached_tokens.Increment(static_cast<double>(c->predicted_cached_tokens));
    StreamFramer framer(api);
    AnsweredRecord answered;  // the worker's record event, once it came
    bool ended = false;       // the worker ended the stream (not broken, client still there)
    bool started = false;
    http::Headers stream_headers = route_headers(*c, attempt - 1);
    for (const auto& [name, value] : es->headers()) {
      if (http::iequals(name, kOmittedToolsHeader)) pass_worker_headers(value, stream_headers);
    }
    bool open = co_await ex.begin_stream(200, "text/event-stream", std::move(stream_headers));
    while (open) {
      auto ev = co_await es->next();
      if (!ev) {
        // The worker failed mid-stream: the client gets an error event, then the end.
        r.metrics.streams_broken.Increment();
        r.outcome(*c, UpstreamOutcome::kStreamBroken, rr.session, 0);
        ex.send(
            framer.error("the worker " + worker_url + " failed mid-stream: " + ev.error().message));
        break;
      }
      if (!ev->has_value()) {
        ended = true;
        break;
      }
      if (!started) {
        started = true;
        r.first_token(*c);
      }
      const std::string& data = **ev;
      if (wants_record) {
        if (auto rec = answered_record_event(data)) {
          answered = std::move(*rec);
          if (!client_wants_record) continue;
        }
      }
      count_usage(r, *c, data);
      const bool had_id = !framer.response_id().empty();
      std::string framed = framer.event(data);
      if (!had_id && !framer.response_id().empty() && p->store) {
        r.stored_response(*c->worker, framer.response_id());
      }
      if (!ex.send(std::move(framed))) {
        cancel.cancel();
        open = false;
      }
    }
    es->close();
    if (ended) learn_turn(r, *c, api, *p, framer.response_id(), std::move(answered));
    r.finished(*c, started);
    r.metrics.requests.Add({{"status", "200"}}).Increment();
    if (open) co_await ex.end_stream();
    co_return;
  }
  // Every try failed before an answer, or no worker can take the request.
  if (base && !last_refusal) {
    // The worker that stored the response is gone (or unreachable): so is the response, as
    // far as anyone can tell. No other worker has it.
    r.metrics.requests.Add({{"status", "400"}}).Increment();
    http::Response out =
        base->unknown(" (the worker that stored it is unavailable" +
                      (last_error.empty() ? std::string(")") : ": " + last_error + ")"));
    co_await ex.respond(std::move(out));
    co_return;
  }
  if (last_refusal) {
    r.metrics.requests.Add({{"status", std::to_string(last_refusal->status)}}).Increment();
    http::Response out{.status = last_refusal->status,
                       .content_type = "application/json",
                       .body = last_refusal->body};
    if (auto ra = last_refusal->header("retry-after"); !ra.empty()) {
      out.headers.emplace_back("Retry-After", std::string(ra));
    }
    co_await ex.respond(std::move(out));
    co_return;
  }
  r.metrics.requests.Add({{"status", "503"}}).Increment();
  http::Response out = api_error(
      api, 503,
      last_error.empty() ? "no worker can take the request (none joined, healthy and not draining)"
                         : "every worker tried failed: " + last_error,
      "unavailable");
  out.headers.emplace_back("Retry-After", "1");
  co_await ex.respond(std::move(out));
}

}  // namespace strata::router
