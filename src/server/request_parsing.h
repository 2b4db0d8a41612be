// Validation of HTTP request bodies. Every check fails with a message that names the
// field and what was wrong; nothing reaches the engine before the whole body passed.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

#include "cache/block_hash.h"
#include "common/result.h"
#include "engine/request.h"

namespace strata {

// Parses a body as a JSON object (kInvalidArgument for malformed JSON, invalid UTF-8
// or a non-object).
Result<nlohmann::json> parse_json_object(const std::string& body);

// What /v1/completions and /v1/chat/completions have in common.
struct GenerationParams {
  SamplingParams sampling;            // stop_token_ids, logprobs, top_logprobs included
  std::optional<int32_t> max_tokens;  // absent: up to the context
  std::vector<std::string> stop;      // stop strings (not returned)
  bool ignore_eos = false;            // extension: do not stop at the model's EOS tokens
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  std::string cache_salt;
  std::string session_id;
  std::string model;
  int32_t priority = 0;  // lower is served first, [-100, 100] (vLLM's field)
  // Test-only extension (`strata serve --allow-forced-output`): the reply's text, tokenized
  // and emitted as if sampled (docs/function-calling.md).
  std::optional<std::string> forced_output;
};

// `chat` selects the chat form of logprobs (bool + top_logprobs) over the completions
// form (an integer).
Result<GenerationParams> parse_generation_params(const nlohmann::json& body, bool chat);

// A prompt for /v1/completions: text, or token ids.
struct CompletionPrompt {
  std::optional<std::string> text;
  std::vector<int32_t> token_ids;
};
Result<CompletionPrompt> parse_completion_prompt(const nlohmann::json& body);

// Checks messages: a non-empty array of objects with a known role and content of the
// right type. Returns the index of the last message with cache_control {"type":"pin"}
// (-1 when none) and its ttl_s (0: hard pin).
struct MessagesInfo {
  int32_t pin_through = -1;
  int64_t pin_ttl_s = 0;
};
Result<MessagesInfo> validate_messages(const nlohmann::json& messages);

// Block hashes from JSON: signed or unsigned 64-bit integers.
Result<std::vector<BlockHash>> parse_block_hashes(const nlohmann::json& value);

// Token ids from JSON: non-negative 32-bit integers.
Result<std::vector<int32_t>> parse_token_ids(const nlohmann::json& value, const char* field);

// Typed optional getters: absent or null gives nullopt; a wrong type or range is an error.
Result<std::optional<bool>> get_bool(const nlohmann::json& obj, const char* key);
Result<std::optional<int64_t>> get_int(const nlohmann::json& obj, const char* key, int64_t lo,
                                       int64_t hi);
Result<std::optional<double>> get_number(const nlohmann::json& obj, const char* key, double lo,
                                         double hi);
Result<std::optional<std::string>> get_string(const nlohmann::json& obj, const char* key);

}  // namespace strata
