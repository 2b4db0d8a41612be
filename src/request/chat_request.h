// One reading of a request's prompt, for the worker (`strata serve`) and the router
// (`strata route`) alike: the router predicts a worker's cache from the tokens it computes
// here, so the two must never read a request differently (docs/router.md).
//
//   JSON body -> ChatRequest (validated messages, tool calls normalized, tools as the
//   template sees them) -> PromptReader::chat_tokens (rendered, tokenized)
//   JSON body -> CompletionPrompt (text or token ids) -> PromptReader::text_tokens
//   JSON body -> CacheTarget (block hashes, token ids or messages) -> block hashes
//
// Everything here is a pure function of its inputs (no engine, no I/O): safe on any thread.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cache/block_hash.h"
#include "common/result.h"
#include "text/tool_calls/tool_request.h"

namespace strata {

// Checks messages: a non-empty array of objects with a known role and content of the
// right type. Returns the index of the last message with cache_control {"type":"pin"}
// (-1 when none) and its ttl_s (0: hard pin).
struct MessagesInfo {
  int32_t pin_through = -1;
  int64_t pin_ttl_s = 0;
};
Result<MessagesInfo> validate_messages(const nlohmann::ordered_json& messages);

// The chat part of a request, read and checked, in the form the chat template renders.
struct ChatRequest {
  // Validated; tool_calls[].function.arguments given as a JSON string are the object it
  // encodes, and an assistant message with tool_calls and null content has "" (as vLLM:
  // normalize_tool_call_messages).
  nlohmann::ordered_json messages;
  // What the template sees as `tools`: the request's tools, none for tool_choice "none".
  std::optional<nlohmann::ordered_json> tools;
  nlohmann::ordered_json template_kwargs = nlohmann::ordered_json::object();
  bool add_generation_prompt = true;
  MessagesInfo info;
  std::vector<std::string> function_names;  // the request's tools, in order
  ToolChoice tool_choice{.mode = ToolChoiceMode::kNone};
};

// How a route takes add_generation_prompt: /v1/chat/completions always adds it (the field
// is not read); /tokenize and /cache/* read the field, with their own default.
enum class GenerationPrompt { kAlways, kFieldDefaultTrue, kFieldDefaultFalse };

// Reads messages, tools, tool_choice, parallel_tool_calls, chat_template_kwargs and
// add_generation_prompt (per `generation_prompt`) from a body; the fields it reads are
// moved out of `body`.
Result<ChatRequest> read_chat_request(nlohmann::ordered_json& body,
                                      GenerationPrompt generation_prompt);

// A prompt for /v1/completions: text, or token ids.
struct CompletionPrompt {
  std::optional<std::string> text;
  std::vector<int32_t> token_ids;
};
Result<CompletionPrompt> parse_completion_prompt(const nlohmann::json& body);
Result<CompletionPrompt> parse_completion_prompt(const nlohmann::ordered_json& body);

}  // namespace strata
