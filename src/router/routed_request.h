// What the router reads of a /v1/chat/completions, /v1/completions, /v1/messages
// (Anthropic) or /v1/responses (OpenAI's Responses) request before it routes it: the
// prompt's tokens, read exactly as a worker reads them
// (the shared request/ module: the same validation, tool-call normalization, template and
// tokenizer), the session and whether it streams. Everything else in the body is the worker's to
// check. A pure function of its inputs: safe on any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"
#include "request/anthropic_request.h"
#include "request/prompt_reader.h"
#include "router/turn_records.h"

namespace strata::router {

// The API a generation request speaks. A Messages request (request/anthropic_request.h)
// and a Responses request (request/responses_request.h) are read as the chat request they
// mean, exactly as the worker reads them.
enum class RoutedApi : uint8_t { kChatCompletions, kCompletions, kAnthropicMessages, kResponses };

struct RoutedRequest {
  // The body to send upstream when it differs from the client's (the x-session-id header
  // added as session_id); nullopt: the client's body as it is.
  std::optional<std::string> rewritten_body;
  std::vector<int32_t> tokens;  // empty: not scored by cache (no template, or too long)
  bool too_long = false;        // the prompt is longer than max_prompt_tokens
  std::string session;          // "" when none
  // Where the worker keeps the session's record of this conversation (request/turn_record.h:
  // record_key, the session and the conversation's root): the key the router keeps it
  // under too. "" without a session, or where the router renders nothing.
  std::string record_key;
  bool stream = false;
  // A worker keeps these prompts' prefill local (docs/pd-disaggregation.md): a cache_salt
  // (tenant isolation) or log-probabilities travel in no prefill order.
  bool pd_local_only = false;
  // A Responses request that builds on stored responses: the one it continues
  // (previous_response_id; nullopt when none) and the output items it names (item_reference
  // ids, in order). Only the worker that stored them holds them: the router cannot render
  // such a request (it has no tokens) and sends it to that worker.
  std::optional<std::string> previous_response_id;
  std::vector<std::string> item_references;
  bool store = false;  // a Responses request's own answer is stored (`store`, default true)
  // The worker that continues exact recorded tokens for this request (turn_records.h) and
  // the prompt it computes there: a session's record continued as the worker continues it
  // (continue_turn), or a previous response's recorded tokens (the router does not hold
  // the stored conversation the worker renders the input after, so these are the prompt's
  // recorded prefix). nullopt: no record, or one the worker will not continue.
  std::optional<uint32_t> exact_worker;
  std::vector<int32_t> exact_tokens;
  // A stored Responses turn's instructions, kept with its record.
  std::optional<std::string> instructions;
};

// The router's record of a session or a stored response (TurnRecordTable::find); null: none.
using TurnLookup = std::function<std::shared_ptr<const TurnEntry>(TurnKey, const std::string&)>;

// Reads `body` (and the session header's value: session_header() of x-session-id and
// x-claude-code-session-id) as a worker would; kInvalidArgument
// with the worker's message for what a worker refuses while reading the prompt. With
// `max_prompt_tokens` > 0 the encoding stops once the prompt is known to be longer: such
// a request is routed unscored (too_long, no tokens) and the worker refuses it.
// A Messages request's session is the session header's, else its metadata.user_id
// (request/anthropic_request.h: anthropic_session), and its body goes upstream as it is, with
// the headers (the Messages API has no session_id field). A Responses request's session is
// its prompt_cache_key (else the header), and its body goes upstream as it is.
// `turn_lookup` (may be empty: no records) gives the records that a session's conversation
// (chat, Messages, Responses) and a Responses request's previous response continue.
// `anthropic` reads a Messages body as the workers do (--keep-billing-header).
Result<RoutedRequest> read_routed_request(const PromptReader& reader, const std::string& body,
                                          std::string_view header_session, RoutedApi api,
                                          size_t max_prompt_tokens,
                                          const TurnLookup& turn_lookup = {},
                                          const AnthropicReadOptions& anthropic = {});

}  // namespace strata::router
