// POST /tokenize ({"prompt"} or {"messages"} through the chat template) and
// POST /detokenize ({"tokens"}). Both run on the HTTP worker pool: a large input is
// tokenized there, not on an I/O thread.
#include <charconv>
#include <string>
#include <vector>

#include "server/request_parsing.h"
#include "server/routes.h"

namespace strata {
namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

// {"tokens": [...], "count", "max_model_len"}, written directly: a JSON DOM of a long
// token list costs 16 bytes a token on top of the text.
std::string tokens_body(const std::vector<int32_t>& tokens, int64_t max_model_len) {
  std::string out;
  out.reserve(tokens.size() * 7 + 64);
  out.append("{\"tokens\":[");
  char buf[24];
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (i > 0) out.push_back(',');
    const auto r = std::to_chars(buf, buf + sizeof buf, tokens[i]);
    out.append(buf, r.ptr);
  }
  out.append("],\"count\":").append(std::to_string(tokens.size()));
  out.append(",\"max_model_len\":").append(std::to_string(max_model_len)).push_back('}');
  return out;
}

http::Response tokenize(const RouteContext& ctx, const http::Request& req) {
  auto body = parse_json_object(req.body);
  if (!body) return error_response(body.error());
  auto add_special = get_bool(*body, "add_special_tokens");
  if (!add_special) return error_response(add_special.error());
  Result<std::vector<int32_t>> tokens;
  if (body->contains("messages")) {
    ojson full = ojson::parse(req.body);
    auto chat = read_chat_request(full, GenerationPrompt::kFieldDefaultTrue);
    if (!chat) return error_response(chat.error());
    tokens = ctx.reader().chat_tokens(*chat);
    const auto bos = ctx.tokenizer.bos_id();
    if (tokens && add_special->value_or(false) && bos &&
        (tokens->empty() || tokens->front() != *bos)) {
      tokens->insert(tokens->begin(), *bos);
    }
  } else {
    // The prompt is read in place: a copy of a 10 MB prompt would be one more 10 MB block.
    const auto prompt = body->find("prompt");
    if (prompt == body->end() || prompt->is_null()) {
      return error_response(400, "'prompt' (a string) or 'messages' is required",
                            "invalid_argument");
    }
    if (!prompt->is_string())
      return error_response(400, "'prompt' must be a string", "invalid_argument");
    tokens = ctx.tokenizer.encode(prompt->get_ref<const std::string&>(),
                                  EncodeOptions{.add_special_tokens = add_special->value_or(true)});
  }
  if (!tokens) return error_response(tokens.error());
  return http::Response{
      .status = 200,
      .body = tokens_body(*tokens, ctx.engine.model_config().max_position_embeddings)};
}

http::Response detokenize(const RouteContext& ctx, const http::Request& req) {
  auto body = parse_json_object(req.body);
  if (!body) return error_response(body.error());
  if (!body->contains("tokens")) {
    return error_response(400, "'tokens' is required", "invalid_argument");
  }
  auto ids = parse_token_ids((*body)["tokens"], "tokens");
  if (!ids) return error_response(ids.error());
  const auto vocab = static_cast<int32_t>(ctx.tokenizer.vocab_size());
  for (int32_t id : *ids) {
    if (id >= vocab) {
      return error_response(400, "token id " + std::to_string(id) + " is outside the vocabulary",
                            "invalid_argument");
    }
  }
  auto text = ctx.tokenizer.decode(*ids);
  if (!text) return error_response(text.error());
  return json_response(200, json{{"prompt", *text}});
}

}  // namespace

void add_tokenizer_routes(http::Server& server, RouteContext& ctx) {
  server.route("POST", "/tokenize", blocking([&ctx](const http::Request& req) {
                 http::Response answer = tokenize(ctx, req);
                 release_memory_after(req.body.size());
                 return answer;
               }));
  server.route("POST", "/detokenize",
               blocking([&ctx](const http::Request& req) { return detokenize(ctx, req); }));
}

}  // namespace strata
