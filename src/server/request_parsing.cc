#include "server/request_parsing.h"

#include "text/tokenizer/utf8.h"

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <string>

namespace strata {
namespace {

std::unexpected<Error> bad(std::string message) {
  return make_error(ErrorCode::kInvalidArgument, std::move(message));
}

}  // namespace

Result<nlohmann::json> parse_json_object(const std::string& body) {
  if (!utf8::is_valid(body)) return bad("the request body is not valid UTF-8");
  nlohmann::json j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return bad("the request body is not valid JSON");
  if (!j.is_object()) return bad("the request body must be a JSON object");
  return j;
}

Result<std::optional<bool>> get_bool(const nlohmann::json& obj, const char* key) {
  const auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return std::optional<bool>();
  if (!it->is_boolean()) return bad(std::string("'") + key + "' must be a boolean");
  return std::optional<bool>(it->get<bool>());
}

Result<std::optional<int64_t>> get_int(const nlohmann::json& obj, const char* key, int64_t lo,
                                       int64_t hi) {
  const auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return std::optional<int64_t>();
  int64_t v;
  if (it->is_number_integer()) {
    if (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
      return bad(std::string("'") + key + "' is out of range");
    }
    v = it->get<int64_t>();
  } else if (it->is_number_float() &&
             it->get<double>() == static_cast<double>(static_cast<int64_t>(it->get<double>()))) {
    v = static_cast<int64_t>(it->get<double>());
  } else {
    return bad(std::string("'") + key + "' must be an integer");
  }
  if (v < lo || v > hi) {
    return bad(std::string("'") + key + "' must be in [" + std::to_string(lo) + ", " +
               std::to_string(hi) + "], got " + std::to_string(v));
  }
  return std::optional<int64_t>(v);
}

Result<std::optional<double>> get_number(const nlohmann::json& obj, const char* key, double lo,
                                         double hi) {
  const auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return std::optional<double>();
  if (!it->is_number()) return bad(std::string("'") + key + "' must be a number");
  const double v = it->get<double>();
  if (!(v >= lo && v <= hi)) {
    return bad(std::string("'") + key + "' must be in [" + std::to_string(lo) + ", " +
               std::to_string(hi) + "]");
  }
  return std::optional<double>(v);
}

Result<std::optional<std::string>> get_string(const nlohmann::json& obj, const char* key) {
  const auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return std::optional<std::string>();
  if (!it->is_string()) return bad(std::string("'") + key + "' must be a string");
  return std::optional<std::string>(it->get<std::string>());
}

Result<std::vector<int32_t>> parse_token_ids(const nlohmann::json& value, const char* field) {
  if (!value.is_array()) return bad(std::string("'") + field + "' must be an array of token ids");
  std::vector<int32_t> out;
  out.reserve(value.size());
  for (const auto& v : value) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX) {
      return bad(std::string("'") + field + "' must hold non-negative integer token ids");
    }
    out.push_back(static_cast<int32_t>(v.get<int64_t>()));
  }
  return out;
}

Result<std::vector<BlockHash>> parse_block_hashes(const nlohmann::json& value) {
  if (!value.is_array()) return bad("'block_hashes' must be an array of 64-bit integers");
  std::vector<BlockHash> out;
  out.reserve(value.size());
  for (const auto& v : value) {
    if (v.is_number_unsigned()) {
      out.push_back(v.get<uint64_t>());
    } else if (v.is_number_integer()) {
      out.push_back(block_hash_from_wire(v.get<int64_t>()));
    } else if (v.is_string()) {
      // Decimal strings, for clients whose JSON numbers are doubles (JavaScript).
      const std::string& s = v.get_ref<const std::string&>();
      errno = 0;
      char* end = nullptr;
      if (!s.empty() && s[0] == '-') {
        const long long x = std::strtoll(s.c_str(), &end, 10);
        if (errno != 0 || end != s.c_str() + s.size() || s.size() < 2) {
          return bad("'block_hashes' holds a string that is not a 64-bit integer: '" + s + "'");
        }
        out.push_back(block_hash_from_wire(x));
      } else {
        const unsigned long long x = std::strtoull(s.c_str(), &end, 10);
        if (s.empty() || errno != 0 || end != s.c_str() + s.size() ||
            !std::isdigit(static_cast<unsigned char>(s[0]))) {
          return bad("'block_hashes' holds a string that is not a 64-bit integer: '" + s + "'");
        }
        out.push_back(x);
      }
    } else {
      return bad("'block_hashes' must hold 64-bit integers (or their decimal strings)");
    }
  }
  return out;
}

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
    if (*top_p <= 0.0) return bad("'top_p' must be in (0, 1]");
    p.sampling.top_p = static_cast<float>(*top_p);
  }
  STRATA_TRY_ASSIGN(top_k, get_int(body, "top_k", -1, 1 << 20));
  if (top_k && *top_k > 0) p.sampling.top_k = static_cast<int32_t>(*top_k);
  STRATA_TRY_ASSIGN(seed, get_int(body, "seed", INT64_MIN, INT64_MAX));
  if (seed) p.sampling.seed = static_cast<uint64_t>(*seed);
  STRATA_TRY_ASSIGN(stream, get_bool(body, "stream"));
  p.stream = stream.value_or(false);
  if (const auto it = body.find("stream_options"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) return bad("'stream_options' must be an object");
    STRATA_TRY_ASSIGN(include_usage, get_bool(*it, "include_usage"));
    p.include_usage = include_usage.value_or(false);
  }
  if (const auto it = body.find("stop"); it != body.end() && !it->is_null()) {
    if (it->is_string()) {
      p.stop.push_back(it->get<std::string>());
    } else if (it->is_array()) {
      for (const auto& s : *it) {
        if (!s.is_string()) return bad("'stop' must be a string or an array of strings");
        p.stop.push_back(s.get<std::string>());
      }
    } else {
      return bad("'stop' must be a string or an array of strings");
    }
    if (p.stop.size() > 16) return bad("'stop' holds at most 16 strings");
    for (const auto& s : p.stop) {
      if (s.empty()) return bad("'stop' strings must not be empty");
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
      if (!p.sampling.logprobs) return bad("'top_logprobs' requires 'logprobs': true");
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
    if (session->empty() || session->size() > 256) {
      return bad("'session_id' must be 1 to 256 characters");
    }
    p.session_id = *session;
  }
  return p;
}

Result<CompletionPrompt> parse_completion_prompt(const nlohmann::json& body) {
  const auto it = body.find("prompt");
  if (it == body.end() || it->is_null()) return bad("'prompt' is required");
  CompletionPrompt out;
  if (it->is_string()) {
    const auto& text = it->get_ref<const std::string&>();
    if (text.empty()) return bad("'prompt' must not be empty");
    out.text = text;
    return out;
  }
  if (it->is_array()) {
    if (it->empty()) return bad("'prompt' must not be empty");
    if (it->size() == 1 && (*it)[0].is_string()) {
      out.text = (*it)[0].get_ref<const std::string&>();
      if (out.text->empty()) return bad("'prompt' must not be empty");
      return out;
    }
    if ((*it)[0].is_array() || (*it)[0].is_string()) {
      return bad("'prompt' with several prompts is not supported: send one request per prompt");
    }
    STRATA_TRY_ASSIGN(ids, parse_token_ids(*it, "prompt"));
    out.token_ids = std::move(ids);
    return out;
  }
  return bad("'prompt' must be a string or an array of token ids");
}

Result<MessagesInfo> validate_messages(const nlohmann::json& messages) {
  if (!messages.is_array()) return bad("'messages' must be an array");
  if (messages.empty()) return bad("'messages' must not be empty");
  MessagesInfo info;
  for (size_t i = 0; i < messages.size(); ++i) {
    const auto& m = messages[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) return bad(where + " must be an object");
    const auto role = m.find("role");
    if (role == m.end() || !role->is_string()) return bad(where + ".role must be a string");
    const std::string r = role->get<std::string>();
    if (r != "system" && r != "user" && r != "assistant" && r != "tool" && r != "developer") {
      return bad(where + ".role '" + r +
                 "' is not one of system, developer, user, assistant, tool");
    }
    const auto content = m.find("content");
    if (content != m.end() && !content->is_null()) {
      if (content->is_array()) {
        for (const auto& part : *content) {
          if (!part.is_object() || !part.contains("type") || !part["type"].is_string()) {
            return bad(where + ".content parts must be objects with a 'type'");
          }
          if (part["type"] == "text" && (!part.contains("text") || !part["text"].is_string())) {
            return bad(where + ".content text parts need a string 'text'");
          }
          if (part["type"] != "text") {
            return bad(where + ".content part type '" + part["type"].get<std::string>() +
                       "' is not supported (text only)");
          }
        }
      } else if (!content->is_string()) {
        return bad(where + ".content must be a string, an array of parts, or null");
      }
    } else if (r != "assistant") {
      return bad(where + ".content is required for role '" + r + "'");
    }
    if (const auto tc = m.find("tool_calls"); tc != m.end() && !tc->is_null() && !tc->is_array()) {
      return bad(where + ".tool_calls must be an array");
    }
    if (const auto cc = m.find("cache_control"); cc != m.end() && !cc->is_null()) {
      if (!cc->is_object()) return bad(where + ".cache_control must be an object");
      STRATA_TRY_ASSIGN(type, get_string(*cc, "type"));
      if (!type || *type != "pin") return bad(where + ".cache_control.type must be \"pin\"");
      STRATA_TRY_ASSIGN(ttl, get_int(*cc, "ttl_s", 1, 365LL * 24 * 3600));
      info.pin_through = static_cast<int32_t>(i);
      info.pin_ttl_s = ttl.value_or(0);
    }
  }
  return info;
}

}  // namespace strata
