// The OpenAI-compatible routes: POST /v1/chat/completions, POST /v1/completions (whole
// answers or server-sent events) and GET /v1/models.
//
// A completion's life here: the body is parsed, rendered and tokenized on the HTTP worker
// pool; the request goes to the engine; the handler then waits on its I/O strand (no
// thread held) for the engine's results, woken by the request stream's listener. When the
// client goes away (streaming or not) or the server's shutdown deadline passes, the wait
// returns false and the request is cancelled: the scheduler drops it at its next step and
// its pages go back.
#include <algorithm>
#include <chrono>
#include <ctime>
#include <optional>

#include "common/log.h"
#include "server/request_parsing.h"
#include "server/request_timing.h"
#include "server/routes.h"
#include "server/text_stream.h"
#include "text/tool_calls/tool_call_parser.h"
#include "text/tool_calls/tool_request.h"

namespace strata {
namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;
using WallClock = std::chrono::steady_clock;
using boost::asio::awaitable;

// How long a handler sleeps between results when nothing wakes it (a safety net: every
// result the engine pushes wakes it at once).
constexpr std::chrono::milliseconds kPollInterval{1000};

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

json bytes_of(const std::string& s) {
  json out = json::array();
  for (unsigned char c : s) out.push_back(static_cast<int>(c));
  return out;
}

std::string finish_name(FinishReason r) {
  return r == FinishReason::kLength ? "length" : "stop";
}

// A request, parsed, rendered and tokenized, ready for the engine.
struct Prepared {
  GenerationParams params;
  RequestSpec spec;
  std::vector<int32_t> prompt_tokens;
  std::optional<MessagesInfo> msg_info;
  ojson messages;
  std::optional<ojson> tools;
  ojson template_kwargs = ojson::object();
  size_t session_prev = 0;
  PinAuthority pin_authority = PinAuthority::kClient;  // for a message's cache_control
  // Function calling: the request's function names and tool_choice (kNone: the reply is
  // not parsed for tool calls).
  std::vector<std::string> function_names;
  ToolChoice tool_choice{.mode = ToolChoiceMode::kNone};
  // Test-only forced_output: its tokens, emitted in place of the engine's (the engine
  // prefills them after the prompt and samples one token, which is dropped), and whether
  // max_tokens cut them.
  std::optional<std::vector<int32_t>> forced;
  bool forced_truncated = false;
};

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

// OpenAI's message.tool_calls.
json tool_calls_json(const std::vector<ToolCall>& calls) {
  json out = json::array();
  for (const ToolCall& c : calls) {
    out.push_back(json{{"id", c.id},
                       {"type", "function"},
                       {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
  }
  return out;
}

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
// (docs/sessions.md): returns them when the conversation extends the recorded one.
std::optional<std::vector<int32_t>> continue_session(RouteContext& ctx, const Prepared& p) {
  if (p.params.session_id.empty() || ctx.chat == nullptr) return std::nullopt;
  const std::optional<ConversationRecord> rec = ctx.conversations.find(p.params.session_id);
  const ojson& messages = p.messages;
  if (!rec || rec->cache_salt != p.params.cache_salt || messages.size() <= rec->num_messages + 1 ||
      messages[rec->num_messages].value("role", "") != "assistant") {
    return std::nullopt;
  }
  const ojson& echoed = messages[rec->num_messages];
  const std::string echoed_text = echoed.contains("content") && echoed["content"].is_string()
                                      ? echoed["content"].get<std::string>()
                                      : "";
  // The client must echo what was generated (the tail of it: clients often drop a
  // reasoning block); an edited turn is rendered afresh.
  // A turn with tool calls is echoed as its content without the markup: the generated
  // text must contain it.
  const bool with_calls = echoed.contains("tool_calls") && echoed["tool_calls"].is_array() &&
                          !echoed["tool_calls"].empty();
  const bool echoes = with_calls ? rec->completion_text.find(echoed_text) != std::string::npos
                                 : rec->completion_text.size() >= echoed_text.size() &&
                                       rec->completion_text.compare(
                                           rec->completion_text.size() - echoed_text.size(),
                                           echoed_text.size(), echoed_text) == 0;
  if (!echoes) return std::nullopt;
  const ojson* tools = p.tools ? &*p.tools : nullptr;
  auto cont =
      ctx.chat->render_continuation(messages, rec->num_messages, rec->stop_text,
                                    ctx.reader().render_options(tools, true, p.template_kwargs));
  if (!cont) return std::nullopt;
  // Too long alone means too long in all: prepare() then refuses the rendered prompt.
  auto more = ctx.tokenizer.encode(
      cont->continuation,
      EncodeOptions{.add_special_tokens = false, .max_tokens = prompt_limit(ctx)});
  if (!more) return std::nullopt;
  std::vector<int32_t> out = rec->tokens;
  out.insert(out.end(), more->begin(), more->end());
  return out;
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

Result<Prepared> prepare(RouteContext& ctx, const http::Request& req, bool chat,
                         RequestTiming& timing) {
  const std::string& raw = req.body;
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
    if (auto continued = continue_session(ctx, p)) {
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

// After a chat turn: remember the session's exact tokens, offload a session whose turn
// ended in a tool call (--auto-tool-offload), and apply a message's cache_control pin.
// Blocking (engine calls, rendering): runs on the worker pool.
void after_finish(RouteContext& ctx, const Prepared& p, const StreamItem& fin,
                  const std::vector<int32_t>& generated, const std::string& text, bool stop_string,
                  bool called_tools) {
  const std::string& session_id = p.params.session_id;
  if (!session_id.empty()) {
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
    if (!stop_string &&
        (fin.finish == FinishReason::kStop || fin.finish == FinishReason::kLength) && stop) {
      ConversationRecord rec;
      rec.num_messages = p.session_prev;
      rec.tokens = p.prompt_tokens;
      rec.tokens.insert(rec.tokens.end(), generated.begin(), generated.end());
      rec.tokens.push_back(*stop);
      rec.stop_text = std::string(ctx.tokenizer.id_to_token(*stop).value_or(""));
      rec.completion_text = text;
      rec.cache_salt = p.params.cache_salt;
      ctx.conversations.put(session_id, std::move(rec));
    } else {
      ctx.conversations.erase(session_id);
    }
  }
  // --auto-tool-offload: a turn that ends in tool calls parks the session on the host
  // until its next request (which restores it by itself). A reply that was not read for
  // calls (no tools in the request) is read here with the server's parser.
  if (ctx.options.auto_tool_offload && !session_id.empty() && !called_tools &&
      !parses_tool_calls(ctx, p) && ctx.options.tool_call_format != ToolCallFormat::kNone) {
    called_tools =
        !parse_tool_calls(text, ToolCallParserOptions{.format = ctx.options.tool_call_format})
             .calls.empty();
  }
  if (ctx.options.auto_tool_offload && !session_id.empty() && called_tools) {
    auto r = ctx.engine.cache().tool_start(session_id).get();
    if (!r) STRATA_LOG_DEBUG("auto tool offload of '{}': {}", session_id, r.error().message);
  }
  if (p.msg_info && p.msg_info->pin_through >= 0) {
    ojson upto = ojson::array();
    for (int32_t k = 0; k <= p.msg_info->pin_through; ++k) {
      upto.push_back(p.messages[static_cast<size_t>(k)]);
    }
    auto tokens =
        ctx.reader().chat_tokens(upto, p.tools ? &*p.tools : nullptr, false, p.template_kwargs);
    if (!tokens) return;
    const int32_t ps = ctx.engine.options().page_size;
    auto hashes = hash_blocks(*tokens, ps, p.params.cache_salt);
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
}

// Whether a finished turn leaves after_finish anything to do (a session to record or offload,
// a message's pin): most requests have none and skip the round trip to the worker pool.
bool has_after_finish(const Prepared& p) {
  return !p.params.session_id.empty() || (p.msg_info && p.msg_info->pin_through >= 0);
}

// Holds an engine request for its handler: routes its results to the handler's waker, and
// on every way out (answered, client gone, abandoned, exception) detaches and cancels
// what has not finished, so that its pages go back at the scheduler's next step.
class RequestGuard {
 public:
  RequestGuard(std::shared_ptr<RequestStream> stream, std::function<void()> waker)
      : stream_(std::move(stream)) {
    stream_->set_listener(std::move(waker));
  }
  ~RequestGuard() {
    stream_->set_listener(nullptr);
    if (!finished_) stream_->cancel();
  }
  RequestGuard(const RequestGuard&) = delete;
  RequestGuard& operator=(const RequestGuard&) = delete;
  RequestStream& stream() { return *stream_; }
  void finished() { finished_ = true; }

 private:
  std::shared_ptr<RequestStream> stream_;
  bool finished_ = false;
};

// Per-token timing for the latency histograms.
class TokenTimer {
 public:
  TokenTimer(Metrics& m, WallClock::time_point start) : m_(m), start_(start), last_(start) {}
  void token() {
    const auto now = WallClock::now();
    if (first_) {
      m_.ttft_s().Observe(std::chrono::duration<double>(now - start_).count());
      first_ = false;
    } else {
      m_.inter_token_s().Observe(std::chrono::duration<double>(now - last_).count());
    }
    last_ = now;
  }
  void finish(const RequestUsage& u) {
    m_.e2e_s().Observe(std::chrono::duration<double>(WallClock::now() - start_).count());
    m_.prompt_tokens().Increment(u.prompt_tokens);
    m_.generation_tokens().Increment(u.completion_tokens);
    m_.cache_hit_tokens().Increment(u.cached_tokens);
  }

 private:
  Metrics& m_;
  WallClock::time_point start_, last_;
  bool first_ = true;
};

struct Ids {
  std::string id;
  int64_t created;
  std::string model;
  bool chat;
};

// At debug level (`--log-level debug`): where the request's time went, the answer written
// (the level is checked first: marking the write time is skipped when the line is off).
void log_timing(RequestTiming& timing, const Ids& ids) {
  if (!spdlog::should_log(spdlog::level::debug)) return;
  timing.written();
  spdlog::debug("{} timing (ms): {}", ids.id, timing.log_line());
}

// A token's logprob entry: its text and the top alternatives (chat: a list of objects;
// completions: an object text -> logprob).
std::pair<std::string, json> logprob_entry(const RouteContext& ctx, const GeneratedToken& t,
                                           bool chat) {
  const std::string piece = ctx.tokenizer.decode(std::vector<int32_t>{t.token}).value_or("");
  json top = chat ? json::array() : json::object();
  for (const auto& alt : t.top_logprobs) {
    const std::string s = ctx.tokenizer.decode(std::vector<int32_t>{alt.token}).value_or("");
    if (chat) {
      top.push_back(json{{"token", s}, {"logprob", alt.logprob}, {"bytes", bytes_of(s)}});
    } else {
      top[s] = alt.logprob;
    }
  }
  return {piece, top};
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

// The finish_reason of a chat reply: "tool_calls" when it called tools and ended by
// itself.
std::string chat_finish_reason(const std::string& reason, bool called_tools) {
  return called_tools && reason == "stop" ? "tool_calls" : reason;
}

awaitable<void> whole_answer(RouteContext& ctx, http::Exchange& ex, const Prepared& p,
                             RequestGuard& req, const Ids& ids, WallClock::time_point t_start,
                             RequestTiming& timing) {
  const bool chat = ids.chat;
  const bool want_logprobs = p.params.sampling.logprobs;
  TextStream text(ctx.tokenizer, p.params.stop);
  TokenTimer timer(ctx.metrics, t_start);
  std::string out;
  std::vector<int32_t> generated;
  json content_logprobs = json::array();
  json c_tokens = json::array(), c_lps = json::array(), c_top = json::array(),
       c_off = json::array();
  std::optional<StreamItem> fin;
  while (!fin) {
    for (StreamItem& item : take_results(ctx, p, req)) {
      for (const GeneratedToken& t : item.tokens) {
        timer.token();
        if (text.stopped()) continue;
        generated.push_back(t.token);
        const size_t offset = out.size();
        out += text.push(t.token);
        if (want_logprobs && !text.stopped()) {
          auto [piece, top] = logprob_entry(ctx, t, chat);
          if (chat) {
            content_logprobs.push_back(json{{"token", piece},
                                            {"logprob", t.logprob},
                                            {"bytes", bytes_of(piece)},
                                            {"top_logprobs", top}});
          } else {
            c_tokens.push_back(piece);
            c_lps.push_back(t.logprob);
            c_top.push_back(top);
            c_off.push_back(offset);
          }
        }
        if (text.stopped()) req.stream().cancel();  // a stop string: no need to go on
      }
      if (item.finish) fin = std::move(item);
    }
    if (!fin && !co_await ex.wait(kPollInterval)) co_return;  // client gone: cancelled
  }
  req.finished();
  timing.woken();
  if (fin->finish == FinishReason::kError) {
    co_await ex.respond(error_response(500, "generation failed: " + fin->error, "internal"));
    co_return;
  }
  out += text.finish();
  std::string reason = text.stopped() ? "stop" : finish_name(*fin->finish);
  timer.finish(fin->usage);
  // Tool calls: malformed markup stays content (and is counted); a reply that does not do
  // what tool_choice asked for is refused.
  ParsedToolCalls parsed{.content = out};
  if (chat && parses_tool_calls(ctx, p)) {
    parsed = parse_tool_calls(out, parser_options(ctx, p));
    if (parsed.malformed) ctx.metrics.malformed_tool_calls().Increment();
    if (!parsed.calls.empty()) ctx.metrics.tool_call_replies().Increment();
  }
  const bool called_tools = !parsed.calls.empty();
  if (has_after_finish(p)) {
    co_await ex.offload(
        [&] { after_finish(ctx, p, *fin, generated, out, text.stopped(), called_tools); });
  }
  if (chat && reason != "length") {
    if (auto st = check_tool_choice(p.tool_choice, parsed.calls); !st) {
      http::Response refused = error_response(422, st.error().message, "tool_choice_not_satisfied");
      co_await ex.respond(std::move(refused));
      co_return;
    }
  }
  json choice;
  if (chat) {
    json message{{"role", "assistant"}, {"content", parsed.content}};
    if (called_tools) {
      if (parsed.content.empty()) message["content"] = nullptr;
      message["tool_calls"] = tool_calls_json(parsed.calls);
    }
    choice = json{{"index", 0},
                  {"message", std::move(message)},
                  {"logprobs", want_logprobs ? json{{"content", content_logprobs}} : json(nullptr)},
                  {"finish_reason", chat_finish_reason(reason, called_tools)}};
  } else {
    choice = json{{"index", 0},
                  {"text", out},
                  {"logprobs", want_logprobs ? json{{"tokens", c_tokens},
                                                    {"token_logprobs", c_lps},
                                                    {"top_logprobs", c_top},
                                                    {"text_offset", c_off}}
                                             : json(nullptr)},
                  {"finish_reason", reason}};
  }
  http::Response answer =
      json_response(200, json{{"id", ids.id},
                              {"object", chat ? "chat.completion" : "text_completion"},
                              {"created", ids.created},
                              {"model", ids.model},
                              {"choices", json::array({choice})},
                              {"usage", usage_json(fin->usage)}});
  timing.answered();
  answer.headers.emplace_back("Server-Timing", timing.server_timing());
  co_await ex.respond(std::move(answer));
  log_timing(timing, ids);
}

json chunk(const Ids& ids, json delta_or_text, const json& finish, const json& logprobs) {
  json choice = ids.chat ? json{{"index", 0},
                                {"delta", std::move(delta_or_text)},
                                {"logprobs", logprobs},
                                {"finish_reason", finish}}
                         : json{{"index", 0},
                                {"text", std::move(delta_or_text)},
                                {"logprobs", logprobs},
                                {"finish_reason", finish}};
  return json{{"id", ids.id},
              {"object", ids.chat ? "chat.completion.chunk" : "text_completion"},
              {"created", ids.created},
              {"model", ids.model},
              {"choices", json::array({choice})}};
}

std::string sse(const json& j) {
  return "data: " + j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

// A chat delta for one event of the tool-call parser: content, or a piece of a call (its
// first piece with id, type and name).
json delta_of(const ToolCallEvent& e) {
  if (!e.call) return json{{"content", e.content}};
  const ToolCallDelta& d = *e.call;
  json call{{"index", d.index}};
  json function{{"arguments", d.arguments}};
  if (!d.id.empty()) {
    call["id"] = d.id;
    call["type"] = "function";
    function["name"] = d.name;
  }
  call["function"] = std::move(function);
  return json{{"tool_calls", json::array({std::move(call)})}};
}

// Server-sent events, one chunk per piece of text (per parser event when tool calls are
// read: content, or a piece of a call).
awaitable<void> streamed_answer(RouteContext& ctx, http::Exchange& ex, const Prepared& p,
                                RequestGuard& req, const Ids& ids, WallClock::time_point t_start,
                                RequestTiming& timing) {
  const bool chat = ids.chat;
  const bool want_logprobs = p.params.sampling.logprobs;
  http::Headers headers{{"Cache-Control", "no-cache"}};
  if (!co_await ex.begin_stream(200, "text/event-stream", std::move(headers))) co_return;
  TextStream text(ctx.tokenizer, p.params.stop);
  TokenTimer timer(ctx.metrics, t_start);
  std::optional<ToolCallStreamParser> tools;
  if (chat && parses_tool_calls(ctx, p)) tools.emplace(parser_options(ctx, p));
  // The chunks for a piece of text: one per parser event; `lp` rides on the first (or on
  // an empty content delta when the parser holds the piece back).
  auto chunks_of = [&](std::vector<ToolCallEvent> events, json lp) {
    std::string s;
    for (const ToolCallEvent& e : events) {
      s += sse(chunk(ids, delta_of(e), nullptr, lp));
      lp = nullptr;
    }
    if (!lp.is_null()) s += sse(chunk(ids, json{{"content", ""}}, nullptr, lp));
    return s;
  };
  std::vector<int32_t> generated;
  std::string all_text;
  std::optional<StreamItem> fin;
  const json role{{"role", "assistant"}, {"content", ""}};
  if (chat && !ex.send(sse(chunk(ids, role, nullptr, nullptr)))) co_return;
  while (!fin) {
    std::string out;
    for (StreamItem& item : take_results(ctx, p, req)) {
      for (const GeneratedToken& t : item.tokens) {
        timer.token();
        if (text.stopped()) continue;
        generated.push_back(t.token);
        const std::string piece = text.push(t.token);
        all_text += piece;
        json lp = nullptr;
        if (want_logprobs && !text.stopped()) {
          auto [tok_text, top] = logprob_entry(ctx, t, chat);
          lp = chat ? json{{"content", json::array({json{{"token", tok_text},
                                                         {"logprob", t.logprob},
                                                         {"bytes", bytes_of(tok_text)},
                                                         {"top_logprobs", top}}})}}
                    : json{{"tokens", {tok_text}},
                           {"token_logprobs", {t.logprob}},
                           {"top_logprobs", {top}}};
        }
        if (tools) {
          out += chunks_of(tools->push(piece), std::move(lp));
        } else if (!piece.empty() || !lp.is_null()) {
          out += sse(chunk(ids, chat ? json{{"content", piece}} : json(piece), nullptr, lp));
        }
        if (text.stopped()) req.stream().cancel();
      }
      if (item.finish) fin = std::move(item);
    }
    if (fin) {
      req.finished();
      timing.woken();
      if (*fin->finish == FinishReason::kError) {
        out += sse(json{{"error",
                         {{"message", "generation failed: " + fin->error},
                          {"type", "server_error"},
                          {"code", "internal"}}}});
      } else {
        const std::string tail = text.finish();
        all_text += tail;
        const std::string reason = text.stopped() ? "stop" : finish_name(*fin->finish);
        bool called_tools = false;
        Status complies;
        if (tools) {
          std::vector<ToolCallEvent> events = tools->push(tail);
          for (ToolCallEvent& e : tools->finish()) events.push_back(std::move(e));
          out += chunks_of(std::move(events), nullptr);
          called_tools = tools->num_committed() > 0;
          if (tools->malformed()) ctx.metrics.malformed_tool_calls().Increment();
          if (called_tools) ctx.metrics.tool_call_replies().Increment();
          if (reason != "length") complies = check_tool_choice(p.tool_choice, tools->calls());
        }
        if (!complies) {
          // What was streamed stands; the stream ends with the error instead of a finish.
          out += sse(json{{"error",
                           {{"message", complies.error().message},
                            {"type", "invalid_request_error"},
                            {"code", "tool_choice_not_satisfied"}}}});
        } else if (tools) {
          out += sse(chunk(ids, json::object(), chat_finish_reason(reason, called_tools), nullptr));
        } else {
          out += sse(chunk(ids, chat ? json{{"content", tail}} : json(tail), reason, nullptr));
        }
        if (p.params.include_usage) {
          json u = chunk(ids, chat ? json::object() : json(""), nullptr, nullptr);
          u["choices"] = json::array();
          u["usage"] = usage_json(fin->usage);
          out += sse(u);
        }
        timer.finish(fin->usage);
        if (has_after_finish(p)) {
          co_await ex.offload([&] {
            after_finish(ctx, p, *fin, generated, all_text, text.stopped(), called_tools);
          });
        }
      }
      out += "data: [DONE]\n\n";
      timing.answered();
    }
    if (!out.empty() && !ex.send(std::move(out))) co_return;  // gone, or reading too slowly
    if (fin) break;
    if (!co_await ex.wait(kPollInterval)) co_return;
  }
  co_await ex.end_stream();
  log_timing(timing, ids);
}

awaitable<void> completions(RouteContext& ctx, http::Exchange& ex, bool chat) {
  const auto t_start = WallClock::now();
  RequestTiming timing(ex.request());
  auto prepared = co_await ex.offload([&] {
    timing.worker_started();
    auto p = prepare(ctx, ex.request(), chat, timing);
    // A refused prompt's parse, render and tokens are gone now; an accepted one's body and
    // DOMs too (what it keeps is its messages and tokens, freed when it finishes).
    release_memory_after(ex.request().body.size());
    return p;
  });
  if (!prepared) {
    co_await ex.respond(error_response(prepared.error()));
    co_return;
  }
  timing.resumed();
  const Prepared& p = *prepared;
  auto submitted = ctx.engine.submit(RequestSpec(p.spec));
  if (!submitted) {
    co_await ex.respond(error_response(submitted.error()));
    co_return;
  }
  timing.submitted();
  // The listener stamps the engine's results as they come (scheduler thread); `timing`
  // outlives it (the guard clears it first).
  RequestGuard req(*submitted, [&timing, wake = ex.waker()] {
    timing.item_pushed();
    wake();
  });
  const Ids ids{
      .id = std::string(chat ? "chatcmpl-" : "cmpl-") + std::to_string((*submitted)->id()),
      .created = unix_time_s(),
      .model = ctx.options.model_name,
      .chat = chat};
  if (p.params.stream) {
    co_await streamed_answer(ctx, ex, p, req, ids, t_start, timing);
  } else {
    co_await whole_answer(ctx, ex, p, req, ids, t_start, timing);
  }
}

}  // namespace

void add_openai_routes(http::Server& server, RouteContext& ctx) {
  server.route("POST", "/v1/chat/completions",
               [&ctx](http::Exchange& ex) { return completions(ctx, ex, true); });
  server.route("POST", "/v1/completions",
               [&ctx](http::Exchange& ex) { return completions(ctx, ex, false); });
  server.route(
      "GET", "/v1/models", blocking([&ctx](const http::Request&) {
        return json_response(
            200, json{{"object", "list"},
                      {"data",
                       json::array({json{{"id", ctx.options.model_name},
                                         {"object", "model"},
                                         {"created", unix_time_s()},
                                         {"owned_by", "strata"},
                                         {"max_model_len",
                                          ctx.engine.model_config().max_position_embeddings}}})}});
      }));
}

}  // namespace strata
