// What a routed generation request is answered with, in its API's shape, and what the
// router reads from a worker's answer on its way to the client: the router's own errors
// (Anthropic's shape for /v1/messages, the workers' OpenAI shape otherwise), a stream's
// events framed as the client's API names them, the prompt's usage (cached and
// transferred tokens, counted in /metrics), and the turn's record (the x-strata-turn-record
// extension, request/turn_record.h) that the router keeps to predict the next turn.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "router/routed_request.h"
#include "router/router_impl.h"

namespace strata::router {

// The router's own error answer in the request's API's shape (the Responses API's is the
// workers' OpenAI shape, as chat completions').
http::Response api_error(RoutedApi api, int status, const std::string& message,
                         const std::string& code);
http::Response api_error(RoutedApi api, const Error& e);

// Counts what a worker's `usage` (in a body or a stream chunk) says about the prompt: its
// cached tokens, and a remote prefill's transferred ones (or that it had none).
void count_usage(Router::Impl& r, const RouteChoice& c, std::string_view data);

// The events of a stream as the client's API frames them: Anthropic's and the Responses
// API's name each event after its data's type (message_start, response.output_text.delta,
// ...; their SDKs read the name), chat completions' are unnamed. A Responses stream's
// response.created event names the response, whose id the router binds to its worker.
class StreamFramer {
 public:
  explicit StreamFramer(RoutedApi api) : api_(api) {}

  // One event, as the worker sent its data.
  std::string event(const std::string& data);

  // The event that ends a stream whose worker failed after its first byte, in the API's
  // shape: chat completions' error chunk, Anthropic's error event, or the Responses
  // API's `error` event (numbered after the worker's last one).
  std::string error(const std::string& message) const;

  // A Responses stream's response id, once its response.created event passed ("" before).
  const std::string& response_id() const { return response_id_; }

 private:
  RoutedApi api_;
  int64_t next_sequence_ = 0;
  std::string response_id_;
};

// The turn's record a worker answered with.
struct AnsweredRecord {
  bool present = false;                      // the answer carried the field (null or not)
  std::optional<ConversationRecord> record;  // a record, read
  std::string response_id;                   // a whole Responses answer's id ("" otherwise)
};

// Takes the record out of a whole JSON answer, unless the client asked for it itself
// (`keep`). The worker's body is a sorted JSON object dumped as dump_json does, so the
// body without the field is byte for byte what the worker sends a client that did not ask.
AnsweredRecord take_answered_record(std::string& body, bool keep);
// A stream's event that carries the record (the worker sends it as one event of its own).
std::optional<AnsweredRecord> answered_record_event(std::string_view data);

// What an answered turn teaches the router about the records its worker keeps: a session's
// conversation record (chat, Messages and Responses alike, under its record_key) is what the
// worker answered with (none: it keeps none now); a stored response's is kept under the
// response's id.
void learn_turn(Router::Impl& r, const RouteChoice& c, RoutedApi api, const RoutedRequest& p,
                const std::string& response_id, AnsweredRecord answered);

}  // namespace strata::router
