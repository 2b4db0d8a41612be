// The router's generation APIs: POST /v1/chat/completions, /v1/completions, Anthropic's
// /v1/messages and OpenAI's /v1/responses are rendered and tokenized as the workers will (so that
// the prompt's blocks can be looked up), routed (router.cc: choose) and proxied, streaming or not.
// A failure before the answer's first byte (connection refused, a 429 or 503, a timeout) is retried
// on the next-best worker, up to --max-attempts; a worker that breaks a stream after its first byte
// ends the client's stream with an error event. GET /v1/models, /tokenize and /detokenize go to a
// worker as they are (docs/router.md), and so does /v1/messages/count_tokens. A Messages
// request is answered in Anthropic's shapes: its errors, and its stream's named events.
// A Responses answer keeps its stream's named events too; the router binds each stored
// response's id to the worker that answered it (response_table.h), so that a request with
// that previous_response_id or an item_reference to one of its output items, and GET / DELETE
// /v1/responses/{id}, reach the worker that holds the response. An id without a binding (the
// router restarted, another replica bound it) is asked of the workers and bound to the one
// that has it; a holder that does not answer is waited for within --response-holder-wait-ms;
// an id no worker has, or whose worker stays unreachable, is answered as a worker answers an
// unknown one (docs/openai-responses.md). With --pd, a request
// whose prompt is prefilled remotely goes to its decode worker with x-strata-prefill-peer (the
// prefill worker's PD id) and is answered with x-strata-prefill-worker (its URL); a client's own
// x-strata-prefill-peer never reaches a worker. A turn with a session (chat, Messages,
// Responses) and a stored Responses turn ask their worker for the turn's exact tokens
// (x-strata-turn-record, request/turn_record.h), which the router keeps (turn_records.h) to predict
// the next turn as the worker computes it, and takes out of the answer unless the client asked for
// them.
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <algorithm>
#include <functional>
#include <mutex>

#include "common/log.h"
#include "http/message.h"
#include "request/error_shape.h"
#include "request/responses_request.h"
#include "request/turn_record.h"
#include "router/routed_request.h"
#include "router/router_impl.h"

namespace strata::router {

using boost::asio::awaitable;
using nlohmann::json;
using ojson = nlohmann::ordered_json;

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

// What a worker's `usage` (in a body or a stream chunk) says about the prompt.
struct UsageReport {
  bool present = false;                       // the data carries a usage object
  std::optional<int64_t> cached_tokens;       // usage.prompt_tokens_details.cached_tokens
  std::optional<int64_t> kv_transfer_tokens;  // usage.kv_transfer.tokens (a remote prefill)
};

UsageReport reported_usage(std::string_view data) {
  UsageReport out;
  // Every usage object names prompt_tokens (Anthropic's: cache_read_input_tokens; the
  // Responses API's: input_tokens_details); most stream chunks carry none (cheap skip).
  const bool anthropic = data.find("\"cache_read_input_tokens\"") != std::string_view::npos;
  const bool responses = data.find("\"input_tokens_details\"") != std::string_view::npos;
  if (!anthropic && !responses && data.find("\"prompt_tokens\"") == std::string_view::npos) {
    return out;
  }
  json j = json::parse(data, nullptr, false);
  if (!j.is_object()) return out;
  // A Messages stream reports its usage whole in message_delta (top-level usage);
  // message_start's message.usage is not read, so nothing is counted twice. A Responses
  // stream reports it in response.completed's (or .incomplete's) response.usage, and an
  // unstreamed response at the top level.
  const json* usage = j.contains("usage") ? &j["usage"] : nullptr;
  if (responses && !usage && j.contains("response") && j["response"].is_object()) {
    usage = j["response"].contains("usage") ? &j["response"]["usage"] : nullptr;
  }
  if (usage == nullptr || !usage->is_object()) return out;
  const json& u = *usage;
  out.present = true;
  if (anthropic) {
    if (u.contains("cache_read_input_tokens") && u["cache_read_input_tokens"].is_number_integer()) {
      out.cached_tokens = u["cache_read_input_tokens"].get<int64_t>();
    }
    return out;
  }
  const char* details = responses ? "input_tokens_details" : "prompt_tokens_details";
  if (u.contains(details) && u[details].is_object()) {
    const json& d = u[details];
    if (d.contains("cached_tokens") && d["cached_tokens"].is_number_integer()) {
      out.cached_tokens = d["cached_tokens"].get<int64_t>();
    }
  }
  if (u.contains("kv_transfer") && u["kv_transfer"].is_object()) {
    const json& k = u["kv_transfer"];
    if (k.contains("tokens") && k["tokens"].is_number_integer()) {
      out.kv_transfer_tokens = k["tokens"].get<int64_t>();
    }
  }
  return out;
}

void count_usage(Router::Impl& r, const RouteChoice& c, std::string_view data) {
  const UsageReport u = reported_usage(data);
  if (!u.present) return;
  if (u.cached_tokens) {
    r.metrics.reported_cached_tokens.Increment(static_cast<double>(*u.cached_tokens));
  }
  if (u.kv_transfer_tokens) {
    r.metrics.pd_kv_transfer_tokens.Increment(static_cast<double>(*u.kv_transfer_tokens));
  } else if (c.prefill) {
    r.metrics.pd_remote_without_transfer.Increment();
  }
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

// The router's own error answer in the request's API's shape (the Responses API's is the
// workers' OpenAI shape, as chat completions').
http::Response api_error(RoutedApi api, int status, const std::string& message,
                         const std::string& code) {
  if (api != RoutedApi::kAnthropicMessages) return router_error(status, message, code);
  return http::Response{.status = status,
                        .content_type = "application/json",
                        .body = dump_json(anthropic_error_json(status, message))};
}
http::Response api_error(RoutedApi api, const Error& e) {
  return api_error(api, http_status(e.code), e.message, std::string(error_code_name(e.code)));
}

// The events of a stream as the client's API frames them: Anthropic's and the Responses
// API's name each event after its data's type (message_start, response.output_text.delta,
// ...; their SDKs read the name), chat completions' are unnamed. A Responses stream's
// response.created event names the response, whose id the router binds to its worker.
class StreamFramer {
 public:
  explicit StreamFramer(RoutedApi api) : api_(api) {}

  // One event, as the worker sent its data.
  std::string event(const std::string& data) {
    if (api_ != RoutedApi::kAnthropicMessages && api_ != RoutedApi::kResponses) {
      return "data: " + data + "\n\n";
    }
    const json j = json::parse(data, nullptr, false);
    if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) {
      return "data: " + data + "\n\n";
    }
    const std::string& type = j["type"].get_ref<const std::string&>();
    if (api_ == RoutedApi::kResponses) {
      if (auto seq = j.find("sequence_number"); seq != j.end() && seq->is_number_integer()) {
        next_sequence_ = seq->get<int64_t>() + 1;
      }
      if (type == "response.created" && j.contains("response") && j["response"].is_object()) {
        const json& response = j["response"];
        if (response.contains("id") && response["id"].is_string()) {
          response_id_ = response["id"].get<std::string>();
        }
      }
    }
    return "event: " + type + "\ndata: " + data + "\n\n";
  }

  // The event that ends a stream whose worker failed after its first byte, in the API's
  // shape: chat completions' error chunk, Anthropic's error event, or the Responses
  // API's `error` event (numbered after the worker's last one).
  std::string error(const std::string& message) const {
    if (api_ == RoutedApi::kAnthropicMessages) {
      return "event: error\ndata: " + dump_json(anthropic_error_json(502, message)) + "\n\n";
    }
    if (api_ == RoutedApi::kResponses) {
      const json e{{"type", "error"},
                   {"code", "upstream_error"},
                   {"message", message},
                   {"param", nullptr},
                   {"sequence_number", next_sequence_}};
      return "event: error\ndata: " + dump_json(e) + "\n\n";
    }
    return "data: " + dump_json(error_json(502, message, "upstream_error")) + "\n\n";
  }

  // A Responses stream's response id, once its response.created event passed ("" before).
  const std::string& response_id() const { return response_id_; }

 private:
  RoutedApi api_;
  int64_t next_sequence_ = 0;
  std::string response_id_;
};

// The Responses API's answers for a response the router cannot reach (it never saw its id,
// forgot it, or the worker that stored it is gone): what a worker answers for an unknown
// id — 400 previous_response_not_found for a continuation, 404 for GET and DELETE.
http::Response unknown_previous_response(const std::string& id, const std::string& why) {
  return router_error(400, "Previous response with id '" + id + "' not found." + why,
                      "previous_response_not_found");
}
http::Response unknown_response(const std::string& id, const std::string& why) {
  return router_error(404, "No response found with id '" + id + "'." + why, "not_found");
}

// The stored response a Responses request builds on — the one it continues, else the one
// whose output item it references first — and a worker's answer when it does not have it.
struct StoredBase {
  std::string response_id;
  std::function<http::Response(const std::string& why)> unknown;
};
std::optional<StoredBase> stored_base(const RoutedRequest& p) {
  if (p.previous_response_id) {
    return StoredBase{.response_id = *p.previous_response_id,
                      .unknown = [id = *p.previous_response_id](const std::string& why) {
                        return unknown_previous_response(id, why);
                      }};
  }
  if (p.item_references.empty()) return std::nullopt;
  const std::string& item = p.item_references.front();
  return StoredBase{.response_id = response_of_item(item).value_or(""),
                    .unknown = [item](const std::string& why) {
                      const Error e = item_not_found(item);
                      return router_error(http_status(e.code), e.message + why,
                                          std::string(error_code_name(e.code)));
                    }};
}

// ---- finding the worker that holds a stored response ----
// A binding is the router's memory, not the response's: a restarted router, or another
// replica in front of the same workers, has none for a response a worker still stores. Such
// an id is asked of the live Strata workers, and the worker holding a bound response that
// does not answer is given a short while to come back (docs/openai-responses.md).

// An id a Strata worker may hold, asked for in a URL path: "resp_" then letters, digits,
// '_' or '-', within the table's bound. Any other id is unknown without asking.
bool askable_response_id(const Router::Impl& r, std::string_view id) {
  if (!id.starts_with("resp_") || id.size() == 5 ||
      id.size() > static_cast<size_t>(r.options.responses.max_id_bytes)) {
    return false;
  }
  return std::all_of(id.begin() + 5, id.end(), [](char ch) {
    return std::isalnum(static_cast<unsigned char>(ch)) != 0 || ch == '_' || ch == '-';
  });
}

// Sleeps on the router's I/O context.
awaitable<void> pause(Router::Impl& r, int64_t ms) {
  boost::asio::steady_timer t(r.io, std::chrono::milliseconds(ms));
  boost::system::error_code ignored;
  co_await t.async_wait(boost::asio::redirect_error(boost::asio::use_awaitable, ignored));
}

// A worker the router takes for gone: its load polls failed three times in a row.
bool taken_for_gone(Router::Impl& r, const Worker& w) {
  std::lock_guard lock(r.mutex);
  return !w.joined || (!w.reachable && w.poll_failures >= 3);
}

// Asks worker `w` for response `id` (GET /v1/responses/{id}, with the client's
// authorization): an answer (any status) ends the ask; a worker that does not answer is
// asked again after a pause, until `deadline` or until the router takes it for gone (an
// unknown id must not wait for a dead worker).
awaitable<void> ask_for_response(Router::Impl& r, std::shared_ptr<HolderSearch> search,
                                 std::shared_ptr<Worker> w, std::string id,
                                 std::string authorization, int64_t deadline) {
  bool has = false;
  for (int64_t backoff = 100;; backoff = std::min<int64_t>(backoff * 2, 1'000)) {
    http::ClientRequest up = r.upstream_request(*w, "GET", "/v1/responses/" + id, "", false);
    if (!authorization.empty()) up.headers.emplace_back("Authorization", authorization);
    up.read_timeout_ms = r.options.response_lookup_timeout_ms;
    auto resp = co_await r.client.request(std::move(up));
    if (resp) {
      if (resp->status == 200) {
        const json j = json::parse(resp->body, nullptr, false);
        has = j.is_object() && j.value("id", "") == id;
      }
      break;
    }
    {
      std::lock_guard lock(search->mutex);
      if (search->over || search->found) break;
    }
    if (r.now_ms() + backoff >= deadline || r.stopping.load()) break;
    co_await pause(r, backoff);
    if (taken_for_gone(r, *w)) break;
  }
  std::vector<std::function<void()>> wakes;
  {
    std::lock_guard lock(search->mutex);
    if (has && !search->found) search->found = w;
    --search->pending;
    wakes = search->wakes;
  }
  for (const auto& wake : wakes) wake();
}

// The worker that holds stored response `id`: its binding's; else, for an id a worker may
// hold (askable_response_id) and that no worker had when last asked within
// --response-miss-ttl-ms (ResponseTable::known_missing), the live Strata worker that answers
// for it, then bound. Every joined Strata worker the router does not take for gone (at most
// the registry's 1,024) is asked at once, each given --response-lookup-timeout-ms to answer;
// one that does not answer is asked again until `holder_deadline` (ask_for_response).
// Requests for the same id at the same time share one search, so the workers are asked once
// per id, not once per request. An id every worker answered for without having it is
// remembered as missing; one some worker could not answer for is not (it may be there).
// Null: no worker has it, or the client went away (ex.abandoned()).
awaitable<std::shared_ptr<Worker>> find_response_holder(Router::Impl& r, http::Exchange& ex,
                                                        const std::string& id,
                                                        int64_t holder_deadline) {
  std::shared_ptr<HolderSearch> search;
  {
    std::lock_guard lock(r.mutex);
    if (auto holder = r.responses.lookup(id)) {
      if (auto it = r.workers.find(*holder); it != r.workers.end()) co_return it->second;
    }
    if (r.options.response_lookup_timeout_ms == 0 || !askable_response_id(r, id)) {
      co_return nullptr;
    }
    if (r.responses.known_missing(id, r.now_ms())) {
      r.metrics.response_lookups.Add({{"result", "remembered_not_found"}}).Increment();
      co_return nullptr;
    }
    if (auto it = r.response_searches.find(id); it != r.response_searches.end()) {
      search = it->second;
      std::lock_guard slock(search->mutex);
      ++search->waiters;
      search->wakes.push_back(ex.waker());
    } else {
      std::vector<std::shared_ptr<Worker>> asked;
      for (const auto& [wid, w] : r.workers) {
        if (w->kind == WorkerKind::kStrata && w->joined && (w->reachable || w->poll_failures < 3)) {
          asked.push_back(w);
        }
      }
      if (asked.empty()) co_return nullptr;
      search = std::make_shared<HolderSearch>();
      search->pending = asked.size();
      search->waiters = 1;
      search->wakes.push_back(ex.waker());
      r.response_searches.emplace(id, search);
      const std::string authorization(ex.request().header("authorization"));
      for (const auto& w : asked) {
        boost::asio::co_spawn(r.io,
                              ask_for_response(r, search, w, id, authorization, holder_deadline),
                              boost::asio::detached);
      }
    }
  }
  const int64_t deadline =
      std::max(r.now_ms() + r.options.response_lookup_timeout_ms + r.options.connect_timeout_ms,
               holder_deadline);
  std::shared_ptr<Worker> found;
  bool complete = false;  // every worker asked answered
  for (;;) {
    {
      std::lock_guard lock(search->mutex);
      if (search->found || search->pending == 0) {
        found = search->found;
        complete = true;
        break;
      }
    }
    const int64_t left = deadline - r.now_ms();
    if (left <= 0 || !co_await ex.wait(std::chrono::milliseconds(left))) {
      std::lock_guard lock(search->mutex);
      found = search->found;
      complete = found != nullptr || search->pending == 0;
      break;
    }
  }
  bool settle = false;
  {
    std::lock_guard lock(r.mutex);
    std::lock_guard slock(search->mutex);
    if (--search->waiters == 0) search->over = true;
    if (complete && !search->settled) {
      search->settled = true;
      settle = true;
    }
    // The search ends for new requests once it has its answer, or nobody waits on it.
    if (complete || search->waiters == 0) {
      if (auto it = r.response_searches.find(id);
          it != r.response_searches.end() && it->second == search) {
        r.response_searches.erase(it);
      }
    }
    if (settle && !found) r.responses.remember_missing(id, r.now_ms());
  }
  r.metrics.response_lookups.Add({{"result", found ? "found" : "not_found"}}).Increment();
  if (settle && found) {
    STRATA_LOG_DEBUG("route: response {} found on {} (no binding here): bound", id, found->url);
    r.stored_response(*found, id);
  }
  co_return found;
}

// The worker that holds response `id` (bound to `holder`) did not answer, or may not be sent
// to now: whether to try it again, after a pause (true), or to answer the id as unknown.
// It is tried again while the binding stands (a worker that is removed, or seen to have
// restarted, loses its bindings: its stored responses went with it), until `deadline`. A
// draining worker takes no request (choose()): that is no brief absence, so no wait.
awaitable<bool> wait_for_holder(Router::Impl& r, http::Exchange& ex, const std::string& id,
                                WorkerId holder, int64_t deadline, int64_t& backoff) {
  {
    std::lock_guard lock(r.mutex);
    if (r.responses.peek(id) != holder) co_return false;
    const auto it = r.workers.find(holder);
    if (it == r.workers.end() || it->second->draining) co_return false;
  }
  const int64_t left = deadline - r.now_ms();
  if (left <= 0) co_return false;
  r.metrics.holder_waits.Increment();
  co_await ex.sleep(std::chrono::milliseconds(std::min(backoff, left)));
  backoff = std::min<int64_t>(backoff * 2, 1'000);
  co_return !ex.abandoned();
}

// What a worker's whole answer to a Responses request tells the response table: the id of
// a response it stored, or that it no longer holds the previous response (its store's own
// bound dropped it), which is then unknown here too.
void note_responses_answer(Router::Impl& r, const RouteChoice& c, const RoutedRequest& p,
                           int status, const std::string& body) {
  if (status == 200 && p.store) {
    const json j = json::parse(body, nullptr, false);
    if (j.is_object() && j.contains("id") && j["id"].is_string()) {
      r.stored_response(*c.worker, j["id"].get<std::string>());
    }
  } else if (status == 400 && p.previous_response_id &&
             body.find("\"previous_response_not_found\"") != std::string::npos) {
    std::lock_guard lock(r.mutex);
    r.responses.erase(*p.previous_response_id);
  }
}

// The turn's record a worker answered with (the x-strata-turn-record extension,
// request/turn_record.h).
struct AnsweredRecord {
  bool present = false;                      // the answer carried the field (null or not)
  std::optional<ConversationRecord> record;  // a record, read
  std::string response_id;                   // a whole Responses answer's id ("" otherwise)
};

AnsweredRecord read_answered_record(const json& field) {
  AnsweredRecord out{.present = true};
  if (field.is_null()) return out;
  auto rec = read_turn_record(field);
  if (rec) {
    out.record = std::move(*rec);
  } else {
    STRATA_LOG_DEBUG("route: a worker's {}: {}", kTurnRecordField, rec.error().message);
  }
  return out;
}

// Takes the record out of a whole JSON answer, unless the client asked for it itself
// (`keep`). The worker's body is a sorted JSON object dumped as dump_json does, so the
// body without the field is byte for byte what the worker sends a client that did not ask.
AnsweredRecord take_answered_record(std::string& body, bool keep) {
  const std::string field(kTurnRecordField);
  if (body.find("\"" + field + "\"") == std::string::npos) return {};
  json j = json::parse(body, nullptr, false);
  if (!j.is_object()) return {};
  auto it = j.find(field);
  if (it == j.end()) return {};
  AnsweredRecord out = read_answered_record(*it);
  if (auto id = j.find("id"); id != j.end() && id->is_string()) {
    out.response_id = id->get<std::string>();
  }
  if (!keep) {
    j.erase(it);
    body = dump_json(j);
  }
  return out;
}

// A stream's event that carries the record (the worker sends it as one event of its own).
std::optional<AnsweredRecord> answered_record_event(std::string_view data) {
  const std::string prefix = "{\"" + std::string(kTurnRecordField) + "\"";
  if (!data.starts_with(prefix)) return std::nullopt;
  const json j = json::parse(data, nullptr, false);
  if (!j.is_object() || !j.contains(std::string(kTurnRecordField))) return std::nullopt;
  return read_answered_record(j[std::string(kTurnRecordField)]);
}

// What an answered turn teaches the router about the records its worker keeps: a session's
// conversation record (chat, Messages and Responses alike, under its record_key) is what the
// worker answered with (none: it keeps none now); a stored response's is kept under the
// response's id.
void learn_turn(Router::Impl& r, const RouteChoice& c, RoutedApi api, const RoutedRequest& p,
                const std::string& response_id, AnsweredRecord answered) {
  if (!p.record_key.empty() && answered.present) {
    r.learned_turn(*c.worker, TurnKey::kSession, p.record_key, answered.record, {});
  }
  if (api == RoutedApi::kResponses && p.store && !response_id.empty() && answered.record) {
    r.learned_turn(*c.worker, TurnKey::kResponse, response_id, std::move(answered.record),
                   p.instructions);
  }
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

awaitable<void> generation(Router::Impl& r, http::Exchange& ex, RoutedApi api) {
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

}  // namespace

awaitable<SharedBinding> read_shared_binding(Router::Impl& r, http::Exchange& ex,
                                             const std::string& session) {
  SharedBinding out;
  if (!r.shared_sessions || session.empty()) co_return out;
  out.asked = true;
  auto found = co_await ex.offload([&] { return r.shared_sessions->lookup(session); });
  if (!found) co_return out;  // counted and logged by the store
  out.answered = true;
  out.url = std::move(*found);
  if (out.url) r.adopt_shared_binding(session, *out.url);
  co_return out;
}

awaitable<void> publish_shared_binding(Router::Impl& r, http::Exchange& ex,
                                       const std::string& session, const SharedBinding& before,
                                       const RouteChoice& c) {
  if (!before.asked || c.detour) co_return;
  const std::string& url = c.worker->url;
  if (!c.session_bound && !(before.answered && before.url != url)) co_return;
  const bool only_if_absent = !before.url;
  auto holds =
      co_await ex.offload([&] { return r.shared_sessions->bind(session, url, only_if_absent); });
  if (holds && *holds != url) r.adopt_shared_binding(session, *holds);
}

// Sends a request to any eligible worker as it is (round robin over them), answering with
// the worker's answer. Used for the endpoints whose answer does not depend on the worker.
awaitable<void> forward_any(Router::Impl& r, http::Exchange& ex) {
  const http::Request& req = ex.request();
  std::vector<std::shared_ptr<Worker>> ws;
  {
    std::lock_guard lock(r.mutex);
    const int64_t now = r.now_ms();
    for (const auto& [id, w] : r.workers) {
      if (r.eligible(*w, now)) ws.push_back(w);
    }
    if (!ws.empty())
      std::rotate(ws.begin(), ws.begin() + static_cast<std::ptrdiff_t>(r.round_robin++ % ws.size()),
                  ws.end());
  }
  std::string last_error = "no worker is joined and healthy";
  for (size_t i = 0; i < ws.size() && i < 3; ++i) {
    http::ClientRequest up = r.upstream_request(*ws[i], req.method, req.target, req.body, false);
    auto resp = co_await r.client.request(std::move(up));
    if (!resp) {
      last_error = ws[i]->url + ": " + resp.error().message;
      continue;
    }
    http::Response out{.status = resp->status,
                       .content_type = std::string(resp->header("content-type")),
                       .body = std::move(resp->body),
                       .headers = {{"x-strata-worker", ws[i]->url}}};
    if (out.content_type.empty()) out.content_type = "application/json";
    co_await ex.respond(std::move(out));
    co_return;
  }
  co_await ex.respond(router_error(503, last_error, "unavailable"));
}

namespace {

// GET and DELETE /v1/responses/{id}: to the worker that stored the response (bound, or found
// by asking the workers: find_response_holder). An id no worker has gets the worker's 404 for
// an unknown id; so does one whose worker does not answer within --response-holder-wait-ms
// (tried again meanwhile: wait_for_holder). A worker's 404, and a deletion, drop the binding.
awaitable<void> stored_response_route(Router::Impl& r, http::Exchange& ex) {
  const http::Request& req = ex.request();
  constexpr std::string_view kPrefix = "/v1/responses/";
  const std::string id = req.path.substr(kPrefix.size());
  const int64_t holder_deadline = r.now_ms() + r.options.response_holder_wait_ms;
  std::shared_ptr<Worker> w = co_await find_response_holder(r, ex, id, holder_deadline);
  if (ex.abandoned()) co_return;
  if (!w) {
    co_await ex.respond(unknown_response(id, ""));
    co_return;
  }
  int64_t backoff = 100;
  std::string failure;
  for (;;) {
    bool usable = false;
    {
      std::lock_guard lock(r.mutex);
      // A draining worker still answers for what it stored; one whose load polls keep
      // failing is not sent to until they answer again (or the wait is over).
      usable = w->joined && (w->reachable || w->poll_failures < 3);
    }
    if (usable) {
      http::ClientRequest up = r.upstream_request(*w, req.method, req.target, "", false);
      if (auto a = req.header("authorization"); !a.empty()) {
        up.headers.emplace_back("Authorization", std::string(a));
      }
      // A stored response is answered from the worker's memory: a worker that takes longer
      // than this is not answering.
      up.read_timeout_ms = std::min<int64_t>(r.options.first_byte_timeout_ms, 10'000);
      auto resp = co_await r.client.request(std::move(up));
      if (resp) {
        if (resp->status == 404 || (req.method == "DELETE" && resp->status == 200)) {
          std::lock_guard lock(r.mutex);
          r.responses.erase(id);
        }
        http::Response out{.status = resp->status,
                           .content_type = std::string(resp->header("content-type")),
                           .body = std::move(resp->body),
                           .headers = {{"x-strata-worker", w->url}}};
        if (out.content_type.empty()) out.content_type = "application/json";
        co_await ex.respond(std::move(out));
        co_return;
      }
      failure = ": " + resp.error().message;
    } else {
      failure = " (its load polls fail)";
    }
    if (!co_await wait_for_holder(r, ex, id, w->id, holder_deadline, backoff)) break;
  }
  if (ex.abandoned()) co_return;
  http::Response out = unknown_response(
      id, " (the worker that stored it, " + w->url + ", did not answer" + failure + ")");
  co_await ex.respond(std::move(out));
}

}  // namespace

void add_router_routes(http::Server& server, Router::Impl& r) {
  server.route("POST", "/v1/chat/completions",
               [&r](http::Exchange& ex) { return generation(r, ex, RoutedApi::kChatCompletions); });
  server.route("POST", "/v1/completions",
               [&r](http::Exchange& ex) { return generation(r, ex, RoutedApi::kCompletions); });
  server.route("POST", "/v1/messages", [&r](http::Exchange& ex) {
    return generation(r, ex, RoutedApi::kAnthropicMessages);
  });
  server.route("POST", "/v1/responses",
               [&r](http::Exchange& ex) { return generation(r, ex, RoutedApi::kResponses); });
  for (const char* method : {"GET", "DELETE"}) {
    server.route(method, "/v1/responses/*",
                 [&r](http::Exchange& ex) { return stored_response_route(r, ex); });
  }
  server.route("POST", "/v1/messages/count_tokens",
               [&r](http::Exchange& ex) { return forward_any(r, ex); });
  server.route("GET", "/v1/models", [&r](http::Exchange& ex) { return forward_any(r, ex); });
  server.route("POST", "/tokenize", [&r](http::Exchange& ex) { return forward_any(r, ex); });
  server.route("POST", "/detokenize", [&r](http::Exchange& ex) { return forward_any(r, ex); });
}

}  // namespace strata::router
