#include "router/response_holders.h"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <algorithm>
#include <mutex>

#include "common/log.h"
#include "request/error_shape.h"
#include "request/responses_request.h"

namespace strata::router {

using boost::asio::awaitable;
using nlohmann::json;

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

namespace {

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

}  // namespace

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

}  // namespace strata::router
