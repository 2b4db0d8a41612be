#include "server/completion_flow.h"

#include <algorithm>

#include "common/log.h"

namespace strata {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

namespace {

// --max-prompt-tokens, the model's context length when unset.
size_t prompt_limit(const RouteContext& ctx) {
  const int64_t limit = ctx.options.max_prompt_tokens > 0
                            ? ctx.options.max_prompt_tokens
                            : ctx.engine.model_config().max_position_embeddings;
  return static_cast<size_t>(limit);
}

// The refusal of a prompt longer than the limit.
std::unexpected<Error> prompt_too_long(const RouteContext& ctx) {
  return make_error(
      ErrorCode::kInvalidArgument,
      "the prompt is longer than " + std::to_string(prompt_limit(ctx)) +
          " tokens, the server's limit (--max-prompt-tokens; the model's context is " +
          std::to_string(ctx.engine.model_config().max_position_embeddings) + " tokens)");
}

// The part of a chat request's rendering that may continue a session's exact tokens
// (docs/sessions.md): returns them when the conversation extends the recorded one. The
// router reads the same continuation (request/turn_record.h) to predict this prompt.
std::optional<std::vector<int32_t>> continue_record(RouteContext& ctx, const Prepared& p,
                                                    const ConversationRecord* rec) {
  if (rec == nullptr) return std::nullopt;
  return continue_turn(ctx.reader(), p.messages, p.tools ? &*p.tools : nullptr, p.template_kwargs,
                       p.params.cache_salt, *rec, prompt_limit(ctx));
}

// A session_id's continuation: its record's, when it has one.
std::optional<std::vector<int32_t>> continue_session(RouteContext& ctx, const Prepared& p) {
  if (p.record_key.empty()) return std::nullopt;
  const std::optional<ConversationRecord> rec = ctx.conversations.find(p.record_key);
  return continue_record(ctx, p, rec ? &*rec : nullptr);
}

// Token ids of a prompt's text, refused as soon as they are known to exceed
// --max-prompt-tokens: the tokenizer stops there (a piece's ids are bounded below by its
// bytes over the longest token's, Tokenizer::encode), so an oversized prompt costs about
// what the limit's worth of text costs, whatever its size. Stopping early is exact where
// a bound on bytes alone is not: normalizers, added tokens and unknown pieces make the
// bytes per token vary.
Result<std::vector<int32_t>> encode_prompt(const RouteContext& ctx, std::string_view text,
                                           bool add_special_tokens) {
  auto ids = ctx.tokenizer.encode(text, EncodeOptions{.add_special_tokens = add_special_tokens,
                                                      .max_tokens = prompt_limit(ctx)});
  if (!ids && ids.error().code == ErrorCode::kResourceExhausted) return prompt_too_long(ctx);
  return ids;
}

// A chat request's prompt: its messages rendered by the chat template, encoded within the
// prompt limit.
Result<std::vector<int32_t>> chat_prompt(const RouteContext& ctx, const Prepared& p,
                                         RequestTiming& timing) {
  auto ids =
      ctx.reader().chat_tokens(p.messages, p.tools ? &*p.tools : nullptr, true, p.template_kwargs,
                               prompt_limit(ctx), [&timing] { timing.rendered(); });
  if (!ids && ids.error().code == ErrorCode::kResourceExhausted) return prompt_too_long(ctx);
  return ids;
}

}  // namespace

int64_t unix_time_s() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

json usage_json(const RequestUsage& u) {
  json j{{"prompt_tokens", u.prompt_tokens},
         {"completion_tokens", u.completion_tokens},
         {"total_tokens", u.prompt_tokens + u.completion_tokens},
         {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}},
         {"cached_tokens_details",
          {{"device", u.cached_device}, {"host", u.cached_host}, {"storage", u.cached_storage}}}};
  // A disaggregated request: what the prefill worker computed and moved here.
  if (u.kv_transferred) {
    j["kv_transfer"] = {
        {"tokens", u.kv_transfer_tokens}, {"bytes", u.kv_transfer_bytes}, {"ms", u.kv_transfer_ms}};
  }
  return j;
}

bool stopped_by_context(const Prepared& p, const StreamItem& fin) {
  return fin.finish == FinishReason::kLength && !p.forced &&
         fin.usage.completion_tokens < p.spec.max_tokens;
}

// Whether the reply of `p` is read for tool calls (chat, tools, tool_choice not none, and
// a parser configured).
bool parses_tool_calls(const RouteContext& ctx, const Prepared& p) {
  return p.tool_choice.mode != ToolChoiceMode::kNone &&
         ctx.options.tool_call_format != ToolCallFormat::kNone;
}

ToolCallParserOptions parser_options(const RouteContext& ctx, const Prepared& p) {
  ToolCallParserOptions o;
  o.format = ctx.options.tool_call_format;
  if (p.tool_choice.mode == ToolChoiceMode::kFunction) {
    o.function_names = {p.tool_choice.function};
  } else {
    o.function_names = p.function_names;
  }
  return o;
}

Result<Prepared> prepare(RouteContext& ctx, const http::Request& req, const std::string& raw,
                         bool chat, RequestTiming& timing,
                         const ConversationRecord* continue_from) {
  auto body = parse_json_object(raw);
  if (!body) return std::unexpected(body.error());
  auto params = parse_generation_params(*body, chat);
  if (!params) return std::unexpected(params.error());
  Prepared p;
  p.params = std::move(*params);
  if (p.params.forced_output && !ctx.options.allow_forced_output) {
    return make_error(ErrorCode::kInvalidArgument,
                      "'forced_output' is a test-only field: the server must be started with "
                      "--allow-forced-output");
  }
  if (p.params.forced_output && p.params.sampling.logprobs) {
    return make_error(ErrorCode::kInvalidArgument,
                      "'forced_output' has no log-probabilities: drop 'logprobs'");
  }
  // Pins a message asks for are an admin's with the admin key (or on a server without
  // one), else a client's: soft, capped and budgeted (engine/pin_policy.h).
  p.pin_authority = authorized(ctx, req) ? PinAuthority::kAdmin : PinAuthority::kClient;
  if (chat) {
    ojson full = ojson::parse(raw);
    auto read = read_chat_request(full, GenerationPrompt::kAlways);
    if (!read) return std::unexpected(read.error());
    p.msg_info = read->info;
    p.messages = std::move(read->messages);
    p.tools = std::move(read->tools);
    p.template_kwargs = std::move(read->template_kwargs);
    p.function_names = std::move(read->function_names);
    p.tool_choice = std::move(read->tool_choice);
    if ((p.tool_choice.mode == ToolChoiceMode::kRequired ||
         p.tool_choice.mode == ToolChoiceMode::kFunction) &&
        ctx.options.tool_call_format == ToolCallFormat::kNone) {
      return make_error(ErrorCode::kInvalidArgument,
                        "'tool_choice' asks for a tool call, but the server reads none "
                        "(--tool-call-parser is none, or auto found no tool-call format in the "
                        "chat template)");
    }
    timing.parsed();
    if (!p.params.session_id.empty()) {
      p.record_key = record_key(
          p.params.session_id,
          conversation_root(p.messages, p.tools ? &*p.tools : nullptr, p.template_kwargs));
    }
    auto continued = continue_from != nullptr ? continue_record(ctx, p, continue_from)
                                              : continue_session(ctx, p);
    if (continued) {
      p.spec.prompt = std::move(*continued);
    } else {
      auto tokens = chat_prompt(ctx, p, timing);
      if (!tokens) return std::unexpected(tokens.error());
      p.spec.prompt = std::move(*tokens);
    }
    p.session_prev = p.messages.size();
  } else {
    auto prompt = parse_completion_prompt(*body);
    if (!prompt) return std::unexpected(prompt.error());
    timing.parsed();
    if (prompt->text) {
      auto tokens = encode_prompt(ctx, *prompt->text, /*add_special_tokens=*/true);
      if (!tokens) return std::unexpected(tokens.error());
      p.spec.prompt = std::move(*tokens);
    } else {
      p.spec.prompt = std::move(prompt->token_ids);
    }
  }
  timing.tokenized();
  // Token-id prompts and continued sessions were not encoded within the limit.
  if (p.spec.prompt.size() > prompt_limit(ctx)) return prompt_too_long(ctx);
  p.spec.sampling = p.params.sampling;
  if (!p.params.ignore_eos) {
    for (int32_t e : ctx.tokenizer.eos_ids()) p.spec.sampling.stop_token_ids.push_back(e);
  }
  const int64_t context = ctx.engine.model_config().max_position_embeddings;
  p.spec.max_tokens = static_cast<int32_t>(p.params.max_tokens.value_or(
      ctx.options.default_max_tokens > 0 ? ctx.options.default_max_tokens : context));
  p.spec.cache_salt = p.params.cache_salt;
  p.spec.session_id = p.params.session_id;
  p.spec.priority = p.params.priority;
  // Set by a router (strata route --pd): the prefill worker to compute the prompt. Only a
  // peer this worker is connected to by its own configuration is ever used.
  p.spec.prefill_peer = std::string(req.header("x-strata-prefill-peer").substr(0, 128));
  p.prompt_tokens = p.spec.prompt;
  if (p.params.forced_output) {
    // Test-only: the engine prefills the forced tokens after the prompt (so the cache and
    // the session hold them as if generated) and samples one token, which is dropped;
    // take_results() then emits the forced tokens (docs/function-calling.md).
    auto forced =
        ctx.tokenizer.encode(*p.params.forced_output, EncodeOptions{.add_special_tokens = false});
    if (!forced) return std::unexpected(forced.error());
    if (forced->size() > static_cast<size_t>(p.spec.max_tokens)) {
      forced->resize(static_cast<size_t>(p.spec.max_tokens));
      p.forced_truncated = true;
    }
    if (p.spec.prompt.size() + forced->size() + 1 > static_cast<size_t>(context)) {
      return make_error(ErrorCode::kInvalidArgument,
                        "the prompt and 'forced_output' do not fit the model's context");
    }
    p.spec.prompt.insert(p.spec.prompt.end(), forced->begin(), forced->end());
    p.spec.max_tokens = 1;
    p.forced = std::move(*forced);
  }
  return p;
}

std::optional<ConversationRecord> turn_record(const RouteContext& ctx, const Prepared& p,
                                              const StreamItem& fin,
                                              const std::vector<int32_t>& generated,
                                              const std::string& text, bool stop_string) {
  // The turn ends with the stop token the model sampled or, when it was cut off by
  // max_tokens, with the end-of-turn token the template closes every turn with.
  std::optional<int32_t> stop =
      fin.stop_token >= 0 ? std::optional<int32_t>(fin.stop_token) : std::nullopt;
  if (!stop && fin.finish == FinishReason::kLength) {
    if (const auto& eos = ctx.tokenizer.special_token_strings().eos_token; eos) {
      stop = ctx.tokenizer.token_to_id(*eos);
    }
  }
  // A stop string cut the text inside the generated tokens: no exact record then.
  if (stop_string || !(fin.finish == FinishReason::kStop || fin.finish == FinishReason::kLength) ||
      !stop) {
    return std::nullopt;
  }
  ConversationRecord rec;
  rec.num_messages = p.session_prev;
  rec.digest = conversation_digest(p.messages, p.session_prev, p.tools ? &*p.tools : nullptr,
                                   p.template_kwargs);
  rec.tokens = p.prompt_tokens;
  rec.tokens.insert(rec.tokens.end(), generated.begin(), generated.end());
  rec.tokens.push_back(*stop);
  rec.stop_text = std::string(ctx.tokenizer.id_to_token(*stop).value_or(""));
  rec.completion_text = text;
  rec.cache_salt = p.params.cache_salt;
  return rec;
}

void auto_tool_offload(RouteContext& ctx, const Prepared& p, const std::string& session_id,
                       const std::string& text, bool called_tools) {
  if (!ctx.options.auto_tool_offload || session_id.empty()) return;
  if (!called_tools && !parses_tool_calls(ctx, p) &&
      ctx.options.tool_call_format != ToolCallFormat::kNone) {
    called_tools =
        !parse_tool_calls(text, ToolCallParserOptions{.format = ctx.options.tool_call_format})
             .calls.empty();
  }
  if (!called_tools) return;
  auto r = ctx.engine.cache().tool_start(session_id).get();
  if (!r) STRATA_LOG_DEBUG("auto tool offload of '{}': {}", session_id, r.error().message);
}

// After a chat turn: remember the session's exact tokens, offload a session whose turn
// ended in a tool call (--auto-tool-offload), and apply a message's cache_control pin.
// Blocking (engine calls, rendering): runs on the worker pool.
std::optional<ConversationRecord> after_finish(RouteContext& ctx, const Prepared& p,
                                               const StreamItem& fin,
                                               const std::vector<int32_t>& generated,
                                               const std::string& text, bool stop_string,
                                               bool called_tools) {
  const std::string& session_id = p.params.session_id;
  std::optional<ConversationRecord> recorded;
  if (!session_id.empty()) {
    recorded = turn_record(ctx, p, fin, generated, text, stop_string);
    if (recorded) {
      ctx.conversations.put(p.record_key, *recorded);
    } else {
      ctx.conversations.erase(p.record_key);
    }
  }
  auto_tool_offload(ctx, p, session_id, text, called_tools);
  if (p.msg_info && p.msg_info->pin_through >= 0) {
    ojson upto = ojson::array();
    for (int32_t k = 0; k <= p.msg_info->pin_through; ++k) {
      upto.push_back(p.messages[static_cast<size_t>(k)]);
    }
    auto tokens =
        ctx.reader().chat_tokens(upto, p.tools ? &*p.tools : nullptr, false, p.template_kwargs);
    if (!tokens) return recorded;
    const int32_t ps = ctx.engine.options().page_size;
    auto hashes = ctx.engine.block_hasher().hash_blocks(*tokens, ps, p.params.cache_salt);
    const int64_t ttl_ms = p.msg_info->pin_ttl_s * 1000;
    auto pinned =
        ctx.engine.cache()
            .pin(PinCommand{
                .hashes = std::move(hashes), .ttl_ms = ttl_ms, .authority = p.pin_authority})
            .get();
    if (!pinned) {
      ctx.metrics.refused_pins().Increment();
      STRATA_LOG_DEBUG("cache_control pin refused: {}", pinned.error().message);
    }
  }
  return recorded;
}

bool turn_record_wanted(const http::Request& req) {
  return req.header(kTurnRecordHeader) == "1";
}

// Whether a finished turn leaves after_finish anything to do (a session to record or offload,
// a message's pin): most requests have none and skip the round trip to the worker pool.
bool has_after_finish(const Prepared& p) {
  return !p.params.session_id.empty() || (p.msg_info && p.msg_info->pin_through >= 0);
}

std::vector<PrefixPin> apply_prefix_pins(RouteContext& ctx, const Prepared& p) {
  std::vector<PrefixPin> made;
  // Each its own soft pin of the prompt's blocks through the breakpoint, so that each
  // expires on its own TTL.
  for (const PrefixPin& pin : p.prefix_pins) {
    const size_t n = std::min(pin.num_tokens, p.prompt_tokens.size());
    const std::vector<int32_t> prefix(p.prompt_tokens.begin(),
                                      p.prompt_tokens.begin() + static_cast<ptrdiff_t>(n));
    auto hashes = ctx.engine.block_hasher().hash_blocks(prefix, ctx.engine.options().page_size,
                                                        p.params.cache_salt);
    if (hashes.empty()) continue;  // shorter than a page: nothing to hold
    const size_t num_hashes = hashes.size();
    auto pinned = ctx.engine.cache()
                      .pin(PinCommand{.hashes = std::move(hashes),
                                      .ttl_ms = pin.ttl_s * 1000,
                                      .authority = p.pin_authority,
                                      .longest_prefix = true})
                      .get();
    if (pinned) {
      PrefixPin held = pin;
      if (pinned->cut > 0) {
        // Over the budget: the longest prefix that fits is held, the rest is not.
        ctx.metrics.refused_pins().Increment();
        held.num_tokens = (num_hashes - static_cast<size_t>(pinned->cut)) *
                          static_cast<size_t>(ctx.engine.options().page_size);
        STRATA_LOG_DEBUG("cache breakpoint pin cut to {} tokens (the pin budget)", held.num_tokens);
      }
      made.push_back(held);
    } else {
      ctx.metrics.refused_pins().Increment();
      STRATA_LOG_DEBUG("cache breakpoint pin refused: {}", pinned.error().message);
    }
  }
  return made;
}

// At debug level (`--log-level debug`): where the request's time went, the answer written
// (the level is checked first: marking the write time is skipped when the line is off).
void log_timing(RequestTiming& timing, const Ids& ids) {
  if (!spdlog::should_log(spdlog::level::debug)) return;
  timing.written();
  spdlog::debug("{} timing (ms): {}", ids.id, timing.log_line());
}

// The engine's results for the handler. With forced_output (test-only) the engine's own
// token is dropped and its finish carries the forced tokens instead, with the usage of a
// reply that generated them.
std::vector<StreamItem> take_results(const RouteContext& ctx, const Prepared& p,
                                     RequestGuard& req) {
  std::vector<StreamItem> items = req.stream().take();
  if (!p.forced) return items;
  for (StreamItem& item : items) {
    item.tokens.clear();
    if (!item.finish || *item.finish == FinishReason::kError ||
        *item.finish == FinishReason::kCancelled) {
      continue;
    }
    for (int32_t t : *p.forced) item.tokens.push_back(GeneratedToken{.token = t});
    item.finish = p.forced_truncated ? FinishReason::kLength : FinishReason::kStop;
    item.stop_token = -1;
    if (!p.forced_truncated) {
      if (const auto& eos = ctx.tokenizer.special_token_strings().eos_token; eos) {
        item.stop_token = ctx.tokenizer.token_to_id(*eos).value_or(-1);
      }
    }
    const int32_t prompt = static_cast<int32_t>(p.prompt_tokens.size());
    RequestUsage& u = item.usage;
    u.prompt_tokens = prompt;
    u.completion_tokens = static_cast<int32_t>(p.forced->size());
    u.cached_tokens = std::min(u.cached_tokens, prompt);
    u.cached_device = std::min(u.cached_device, prompt);
    u.cached_host = std::min(u.cached_host, prompt - u.cached_device);
    u.cached_storage = std::min(u.cached_storage, prompt - u.cached_device - u.cached_host);
  }
  return items;
}

boost::asio::awaitable<std::optional<WholeAnswer>> collect_whole(
    const RouteContext& ctx, http::Exchange& ex, const Prepared& p, RequestGuard& req,
    TextStream& text, TokenTimer& timer, RequestTiming& timing) {
  WholeAnswer a;
  std::optional<StreamItem> fin;
  while (!fin) {
    for (StreamItem& item : take_results(ctx, p, req)) {
      for (const GeneratedToken& t : item.tokens) {
        timer.token();
        if (text.stopped()) continue;
        a.generated.push_back(t.token);
        a.text += text.push(t.token);
        if (text.stopped()) req.stream().cancel();  // a stop string: no need to go on
      }
      if (item.finish) fin = std::move(item);
    }
    if (!fin && !co_await ex.wait(kPollInterval)) co_return std::nullopt;  // client gone
  }
  req.finished();
  timing.woken();
  a.fin = std::move(*fin);
  co_return a;
}

}  // namespace strata
