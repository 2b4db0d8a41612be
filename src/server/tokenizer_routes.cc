// POST /tokenize ({"prompt"} or {"messages"} through the chat template) and
// POST /detokenize ({"tokens"}). Both run on the HTTP worker pool: a large input is
// tokenized there, not on an I/O thread.
#include "server/request_parsing.h"
#include "server/routes.h"

namespace strata {
namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

http::Response tokenize(const RouteContext& ctx, const http::Request& req) {
  auto body = parse_json_object(req.body);
  if (!body) return error_response(body.error());
  auto add_special = get_bool(*body, "add_special_tokens");
  if (!add_special) return error_response(add_special.error());
  Result<std::vector<int32_t>> tokens;
  if (body->contains("messages")) {
    const ojson full = ojson::parse(req.body);
    if (auto v = validate_messages((*body)["messages"]); !v) return error_response(v.error());
    auto add_gen = get_bool(*body, "add_generation_prompt");
    if (!add_gen) return error_response(add_gen.error());
    const ojson* tools =
        full.contains("tools") && full["tools"].is_array() ? &full["tools"] : nullptr;
    if (full.contains("tools") && !full["tools"].is_null() && tools == nullptr) {
      return error_response(400, "'tools' must be an array", "invalid_argument");
    }
    tokens = ctx.chat_tokens(full["messages"], tools, add_gen->value_or(true),
                             full.value("chat_template_kwargs", ojson::object()));
    const auto bos = ctx.tokenizer.bos_id();
    if (tokens && add_special->value_or(false) && bos &&
        (tokens->empty() || tokens->front() != *bos)) {
      tokens->insert(tokens->begin(), *bos);
    }
  } else {
    auto prompt = get_string(*body, "prompt");
    if (!prompt) return error_response(prompt.error());
    if (!*prompt) {
      return error_response(400, "'prompt' (a string) or 'messages' is required",
                            "invalid_argument");
    }
    tokens = ctx.tokenizer.encode(
        **prompt, EncodeOptions{.add_special_tokens = add_special->value_or(true)});
  }
  if (!tokens) return error_response(tokens.error());
  return json_response(200, json{{"tokens", *tokens},
                                 {"count", tokens->size()},
                                 {"max_model_len",
                                  ctx.engine.model().config().max_position_embeddings}});
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
  server.route("POST", "/tokenize",
               blocking([&ctx](const http::Request& req) { return tokenize(ctx, req); }));
  server.route("POST", "/detokenize",
               blocking([&ctx](const http::Request& req) { return detokenize(ctx, req); }));
}

}  // namespace strata
