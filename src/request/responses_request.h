// OpenAI's Responses API (POST /v1/responses) read as the chat-completions request it
// means, so that a Responses request is rendered, tokenized, sampled and read for tool
// calls by exactly the code that serves /v1/chat/completions (docs/openai-responses.md):
//
//   Responses body -> read_responses_request -> ResponsesRequest (input as chat messages,
//   function tools in the chat shape, tool_choice, max_tokens, ...)
//   -> responses_chat_body(request, history of previous_response_id)
//   -> read_chat_request / parse_generation_params -> PromptReader::chat_tokens
//
// `instructions` become the first (system) message; the messages of a previous response
// (its history: what came after its instructions, its output included) come next, then
// this request's input. Instructions are not carried over from a previous response (as
// OpenAI documents).
//
// Everything here is a pure function of its inputs (no engine, no I/O): safe on any thread.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"

namespace strata {

// `prompt_cache_retention`: "in_memory" (also "in-memory") keeps a prefix about as long as
// a hosted in-memory cache does; "24h" asks for a day. Both are a client's soft pin, whose
// TTL the pin policy caps at --max-client-pin-ttl-s (docs/authority.md).
inline constexpr int64_t kRetentionInMemoryTtlS = 600;
inline constexpr int64_t kRetention24hTtlS = 86'400;

struct ResponsesRequest {
  // The chat-completions body without `messages`: model, tools, tool_choice, max_tokens,
  // temperature, top_p, stream, parallel_tool_calls, and Strata's own extensions when
  // given (forced_output, ignore_eos, cache_salt, seed, priority).
  nlohmann::ordered_json chat_body = nlohmann::ordered_json::object();
  // This request's input as chat messages (user/assistant/system/tool; developer is system).
  nlohmann::ordered_json input_messages = nlohmann::ordered_json::array();
  std::optional<std::string> instructions;
  std::optional<std::string> previous_response_id;
  bool store = true;
  bool stream = false;
  std::string prompt_cache_key;            // "" : none
  std::optional<int64_t> retention_ttl_s;  // prompt_cache_retention, when given
  std::string retention;                   // its name as given ("" : none)
  // What the response object echoes as given: tools (Responses' shape), tool_choice,
  // max_output_tokens, temperature, top_p, metadata, user, parallel_tool_calls.
  nlohmann::json echo = nlohmann::json::object();
  // The types of the tools left out of the prompt, in order, each once: hosted tools
  // Strata does not run (web_search, file_search, code_interpreter, ...), and any other
  // type but function and namespace (the answer's x-strata-omitted-tools header).
  std::vector<std::string> omitted_tools;
  // The functions of `namespace` tool groups, by the qualified name the model sees
  // (qualified_tool_name): their namespace and own name, which a function_call item carries.
  struct NamespacedName {
    std::string name_space;
    std::string name;
  };
  std::map<std::string, NamespacedName> namespaced;
  // The custom tools (free-form input, `{"type": "custom"}`), by the name the model sees:
  // their calls are answered as custom_tool_call items with the `input` text.
  std::set<std::string> custom_tools;
};

// A custom tool is offered to the model as a function of one string parameter, `input`:
// the arguments of a call of it, and its input read back from them (nullopt: not such
// arguments).
std::string custom_tool_arguments(std::string_view input);
std::optional<std::string> custom_tool_input(std::string_view arguments);

// The name the model sees for function `name` of namespace `name_space` (a `namespace` tool
// group, as Codex sends its multi-agent and MCP tools): "<namespace>__<name>", or
// "<namespace><name>" for a namespace that ends with "__" ("mcp__server__" + "tool"), the
// flat form of Codex's own MCP tool names. A call of it is answered as a function_call item
// with `namespace` and `name` apart, as the Responses API answers it; an input function_call
// item with a `namespace` is read back as the qualified name.
std::string qualified_tool_name(std::string_view name_space, std::string_view name);

// The answer header that lists the tools left out of the prompt (comma-separated types).
inline constexpr std::string_view kOmittedToolsHeader = "x-strata-omitted-tools";

// Reads and checks a Responses body (kInvalidArgument with a message naming the field):
// unknown or unsupported item types and content parts (input_image, input_file,
// item_reference, ...), a non-text output format, `background`, `conversation`, a
// tool_choice that names a tool Strata does not run, and wrong types are refused. Function
// tools, custom (free-form) tools and `namespace` groups of them are read; any other tool
// (the hosted web_search, file_search, code_interpreter, ...) is left out of the prompt and
// listed in `omitted_tools`. `reasoning` items and
// fields Strata has no use for (reasoning, include, service_tier, truncation "disabled",
// ...) are accepted and ignored.
Result<ResponsesRequest> read_responses_request(const nlohmann::ordered_json& body);

// The whole chat-completions body of `r`: [system: instructions] + `history` (the messages
// of the previous response, empty when none) + r.input_messages.
nlohmann::ordered_json responses_chat_body(const ResponsesRequest& r,
                                           const nlohmann::ordered_json& history);

// `prompt_cache_retention`'s TTL in seconds; nullopt for an unknown value.
std::optional<int64_t> retention_ttl_s(const std::string& retention);

// `item_reference` input items ({"type": "item_reference", "id": ITEM}) name an output item
// of a stored response instead of repeating it (the Vercel AI SDK sends one for each earlier
// assistant message while `store` is on). Only the worker that stored the response has the
// item: it replaces each reference with the item before reading the body
// (resolve_item_references), so read_responses_request never sees one; the router sends
// such a request to that worker. Strata names a response's output items after it:
// "msg_<R>_<i>" and "fc_<R>_<i>" are items of the response "resp_<R>".

// The ids of the item_reference items of body["input"], in order; empty when there are none
// (or `input` is not an array: the reading refuses it). kInvalidArgument for a reference
// without a string id.
Result<std::vector<std::string>> item_references(const nlohmann::ordered_json& body);
// The response whose output item `item_id` is ("resp_<R>" for "msg_<R>_<i>" or
// "fc_<R>_<i>"); nullopt for an id that names no item of a Strata response.
std::optional<std::string> response_of_item(std::string_view item_id);
// The answer for a reference to an item nobody stored: "Item with id 'ID' not found."
Error item_not_found(const std::string& item_id);
// Replaces each item_reference of body["input"] with the item `find` returns for its id;
// item_not_found() for one it does not find (nullopt). Nothing else is read or checked.
Status resolve_item_references(
    nlohmann::ordered_json& body,
    const std::function<std::optional<nlohmann::ordered_json>(const std::string& item_id)>& find);

}  // namespace strata
