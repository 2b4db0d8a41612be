// A routed generation request (POST /v1/chat/completions, /v1/completions, Anthropic's
// /v1/messages, OpenAI's /v1/responses), in stages:
//
//   read     the body rendered and tokenized as the workers will (request/, in the HTTP
//            pool), so that the prompt's blocks can be looked up; a bad body is a 400
//   locate   where the request must or would rather go: the session's binding in the
//            replicas' shared store (--session-store), and a stored response's holder
//            (response_holders.h) for a Responses continuation, or a 400 as a worker says
//   choose   the router's choice (router.cc: choose); every worker saturated: the
//            request waits in the router queue (429 when it is full or the wait is over)
//   forward  one try, proxied whole or streamed: a failure before the answer's first byte
//            (connection refused, a 429 or 503, a timeout) excludes the worker and the next
//            try goes to the next-best one, up to --max-attempts; a worker that breaks a
//            stream after its first byte ends the client's stream with an error event
//   account  what each ending counts (status, usage, prompt and predicted tokens, the
//            turn's record learned) and, when no try was answered, the answer: the
//            workers' last refusal, a stored response now unknown, or a 503
//
// The stages are still one coroutine (generation.cc): split into coroutines of their own
// (a type holding the request's state, a function per stage), g++ 12 miscompiled them —
// a stage's reference to the state read back as garbage, and a 503's answer freed memory
// it did not own (issue 52's notes). The answers' shapes are api_answers.h's.
//
// With --pd, a request whose prompt is prefilled remotely goes to its decode worker with
// x-strata-prefill-peer (the prefill worker's PD id) and is answered with
// x-strata-prefill-worker (its URL); a client's own x-strata-prefill-peer never reaches a
// worker. A turn with a session (chat, Messages, Responses) and a stored Responses turn ask
// their worker for the turn's exact tokens (x-strata-turn-record, request/turn_record.h),
// which the router keeps (turn_records.h) to predict the next turn as the worker computes
// it, and takes out of the answer unless the client asked for them.
#pragma once

#include <boost/asio/awaitable.hpp>

#include "router/routed_request.h"
#include "router/router_impl.h"

namespace strata::router {

boost::asio::awaitable<void> route_generation(Router::Impl& r, http::Exchange& ex, RoutedApi api);

}  // namespace strata::router
