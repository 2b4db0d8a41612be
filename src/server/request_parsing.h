// Validation of HTTP request bodies. Every check fails with a message that names the
// field and what was wrong; nothing reaches the engine before the whole body passed. What
// the router reads too (fields, messages, prompts, hash and token lists) is in src/request/;
// the sampling parameters, which only the engine takes, are here.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

#include "common/result.h"
#include "engine/request.h"
#include "request/chat_request.h"
#include "request/json_fields.h"

namespace strata {

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

}  // namespace strata
