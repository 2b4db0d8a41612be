// Stored responses and the worker that holds each (the Responses API through the router):
// a request that builds on a stored response (previous_response_id, an item_reference)
// goes to the worker that stored it, and so do GET and DELETE /v1/responses/{id}. The
// router binds each stored response's id to the worker that answered it (response_table.h);
// an id without a binding (the router restarted, another replica bound it) is asked of the
// workers and bound to the one that has it; a holder that does not answer is waited for
// within --response-holder-wait-ms; an id no worker has, or whose worker stays
// unreachable, is answered as a worker answers an unknown one (docs/openai-responses.md).
#pragma once

#include <boost/asio/awaitable.hpp>

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "router/routed_request.h"
#include "router/router_impl.h"

namespace strata::router {

// The Responses API's answers for a response the router cannot reach (it never saw its id,
// forgot it, or the worker that stored it is gone): what a worker answers for an unknown
// id — 400 previous_response_not_found for a continuation, 404 for GET and DELETE.
http::Response unknown_previous_response(const std::string& id, const std::string& why);
http::Response unknown_response(const std::string& id, const std::string& why);

// The stored response a Responses request builds on — the one it continues, else the one
// whose output item it references first — and a worker's answer when it does not have it.
struct StoredBase {
  std::string response_id;
  std::function<http::Response(const std::string& why)> unknown;
};
std::optional<StoredBase> stored_base(const RoutedRequest& p);

// The worker that holds stored response `id` (bound, or found by asking the live Strata
// workers at once and then bound), or null: no worker has it, or the client went away
// (ex.abandoned()). Requests for the same id at the same time share one search.
boost::asio::awaitable<std::shared_ptr<Worker>> find_response_holder(Router::Impl& r,
                                                                     http::Exchange& ex,
                                                                     const std::string& id,
                                                                     int64_t holder_deadline);

// The worker that holds response `id` (bound to `holder`) did not answer, or may not be sent
// to now: whether to try it again, after a pause (true; `backoff` doubles up to 1 s), or to
// answer the id as unknown.
boost::asio::awaitable<bool> wait_for_holder(Router::Impl& r, http::Exchange& ex,
                                             const std::string& id, WorkerId holder,
                                             int64_t deadline, int64_t& backoff);

// What a worker's whole answer to a Responses request tells the response table: the id of
// a response it stored, or that it no longer holds the previous response.
void note_responses_answer(Router::Impl& r, const RouteChoice& c, const RoutedRequest& p,
                           int status, const std::string& body);

// GET and DELETE /v1/responses/{id}.
boost::asio::awaitable<void> stored_response_route(Router::Impl& r, http::Exchange& ex);

}  // namespace strata::router
