#include "server/request_parsing.h"
#include "request/turn_record.h"

#include <string>

namespace strata {

#define STRATA_TRY_ASSIGN(var, expr)                     \
  auto var##_r = (expr);                                 \
  if (!var##_r) return std::unexpected(var##_r.error()); \
  auto var = std::move(*var##_r)

Result<GenerationParams> parse_generation_params(const nlohmann::json& body, bool chat) {
  GenerationParams p;
  STRATA_TRY_ASSIGN(model, get_string(body, "model"));
  if (model) p.model = *model;
  STRATA_TRY_ASSIGN(n, get_int(body, "n", 1, 1));
  (void)n;
  STRATA_TRY_ASSIGN(max_tokens, get_int(body, "max_tokens", 1, 1 << 24));
  STRATA_TRY_ASSIGN(max_completion, get_int(body, "max_completion_tokens", 1, 1 << 24));
  if (max_completion)
    p.max_tokens = static_cast<int32_t>(*max_completion);
  else if (max_tokens)
    p.max_tokens = static_cast<int32_t>(*max_tokens);
  STRATA_TRY_ASSIGN(temperature, get_number(body, "temperature", 0.0, 2.0));
  if (temperature) p.sampling.temperature = static_cast<float>(*temperature);
  STRATA_TRY_ASSIGN(top_p, get_number(body, "top_p", 0.0, 1.0));
  if (top_p) {
    if (*top_p <= 0.0) return bad_argument("'top_p' must be in (0, 1]");
    p.sampling.top_p = static_cast<float>(*top_p);
  }
  STRATA_TRY_ASSIGN(top_k, get_int(body, "top_k", -1, 1 << 20));
  if (top_k && *top_k > 0) p.sampling.top_k = static_cast<int32_t>(*top_k);
  STRATA_TRY_ASSIGN(seed, get_int(body, "seed", INT64_MIN, INT64_MAX));
  if (seed) p.sampling.seed = static_cast<uint64_t>(*seed);
  STRATA_TRY_ASSIGN(stream, get_bool(body, "stream"));
  p.stream = stream.value_or(false);
  if (const auto it = body.find("stream_options"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) return bad_argument("'stream_options' must be an object");
    STRATA_TRY_ASSIGN(include_usage, get_bool(*it, "include_usage"));
    p.include_usage = include_usage.value_or(false);
  }
  if (const auto it = body.find("stop"); it != body.end() && !it->is_null()) {
    if (it->is_string()) {
      p.stop.push_back(it->get<std::string>());
    } else if (it->is_array()) {
      for (const auto& s : *it) {
        if (!s.is_string()) return bad_argument("'stop' must be a string or an array of strings");
        p.stop.push_back(s.get<std::string>());
      }
    } else {
      return bad_argument("'stop' must be a string or an array of strings");
    }
    if (p.stop.size() > 16) return bad_argument("'stop' holds at most 16 strings");
    for (const auto& s : p.stop) {
      if (s.empty()) return bad_argument("'stop' strings must not be empty");
    }
  }
  if (const auto it = body.find("stop_token_ids"); it != body.end() && !it->is_null()) {
    STRATA_TRY_ASSIGN(ids, parse_token_ids(*it, "stop_token_ids"));
    p.sampling.stop_token_ids = std::move(ids);
  }
  STRATA_TRY_ASSIGN(ignore_eos, get_bool(body, "ignore_eos"));
  p.ignore_eos = ignore_eos.value_or(false);
  if (chat) {
    STRATA_TRY_ASSIGN(logprobs, get_bool(body, "logprobs"));
    p.sampling.logprobs = logprobs.value_or(false);
    STRATA_TRY_ASSIGN(top_logprobs, get_int(body, "top_logprobs", 0, 20));
    if (top_logprobs) {
      if (!p.sampling.logprobs) return bad_argument("'top_logprobs' requires 'logprobs': true");
      p.sampling.top_logprobs = static_cast<int32_t>(*top_logprobs);
    }
  } else {
    STRATA_TRY_ASSIGN(logprobs, get_int(body, "logprobs", 0, 20));
    if (logprobs) {
      p.sampling.logprobs = true;
      p.sampling.top_logprobs = static_cast<int32_t>(*logprobs);
    }
  }
  STRATA_TRY_ASSIGN(salt, get_string(body, "cache_salt"));
  if (salt) p.cache_salt = *salt;
  STRATA_TRY_ASSIGN(priority, get_int(body, "priority", -100, 100));
  if (priority) p.priority = static_cast<int32_t>(*priority);
  STRATA_TRY_ASSIGN(forced, get_string(body, "forced_output"));
  p.forced_output = std::move(forced);
  STRATA_TRY_ASSIGN(session, get_string(body, "session_id"));
  if (session) {
    if (Status st = check_session_id(*session, "session_id"); !st) {
      return std::unexpected(st.error());
    }
    p.session_id = *session;
  }
  return p;
}

}  // namespace strata
