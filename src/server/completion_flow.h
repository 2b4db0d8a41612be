// What every generating route shares (openai_routes.cc for /v1/chat/completions and
// /v1/completions, anthropic_routes.cc for /v1/messages): a request's preparation (parse,
// render, tokenize, within the prompt limit), its engine request held for the handler, the
// results taken (forced_output applied), the per-token metrics, and what is done after a
// finished turn (session records, tool offload, pins). The routes differ only in how they
// read a body into a chat request and in the shape of their answers.
//
// Threads: prepare() and after_finish() block (rendering, engine commands): call them on
// the HTTP worker pool (Exchange::offload). The rest runs on the handler's strand.
#pragma once

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/result.h"
#include "engine/engine.h"
#include "http/server.h"
#include "server/request_parsing.h"
#include "server/request_timing.h"
#include "server/route_context.h"
#include "server/text_stream.h"
#include "text/tool_calls/tool_call_parser.h"
#include "text/tool_calls/tool_request.h"

namespace strata {

using WallClock = std::chrono::steady_clock;

// How long a handler sleeps between results when nothing wakes it (a safety net: every
// result the engine pushes wakes it at once).
inline constexpr std::chrono::milliseconds kPollInterval{1000};

int64_t unix_time_s();

// OpenAI's usage object, with Strata's per-tier breakdown (cached_tokens_details) and a
// disaggregated request's transfer.
nlohmann::json usage_json(const RequestUsage& u);

// A soft pin of the prompt's first `num_tokens` tokens, made after the turn
// (an Anthropic cache_control breakpoint).
struct PrefixPin {
  size_t num_tokens = 0;
  int64_t ttl_s = 0;
};

// A request, parsed, rendered and tokenized, ready for the engine.
struct Prepared {
  GenerationParams params;
  RequestSpec spec;
  std::vector<int32_t> prompt_tokens;
  std::optional<MessagesInfo> msg_info;
  nlohmann::ordered_json messages;
  std::optional<nlohmann::ordered_json> tools;
  nlohmann::ordered_json template_kwargs = nlohmann::ordered_json::object();
  size_t session_prev = 0;
  // Where the session's record of this conversation is kept (request/turn_record.h:
  // record_key of the session and the conversation's root); "" without a session.
  std::string record_key;
  PinAuthority pin_authority = PinAuthority::kClient;  // for a message's cache_control
  // Pins of prompt prefixes to make after the turn (set by the route after prepare()).
  std::vector<PrefixPin> prefix_pins;
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

// Reads `body` (the JSON text of a chat-completions body when `chat`, else of a completions
// body), renders and tokenizes it. `req` gives the headers (the admin key, a router's
// prefill peer). A chat request continues the exact tokens of `continue_from` when given
// (a previous response's turn), else of its session_id's record, when its messages extend
// that turn's (docs/sessions.md). Blocking.
Result<Prepared> prepare(RouteContext& ctx, const http::Request& req, const std::string& body,
                         bool chat, RequestTiming& timing,
                         const ConversationRecord* continue_from = nullptr);

// Whether a finished reply was cut by the model's context window (or the device pool,
// whichever is smaller), not by the client's max_tokens: it ended by length with fewer tokens
// than the request allowed (the engine lowers max_tokens to what fits).
bool stopped_by_context(const Prepared& p, const StreamItem& fin);

// Whether the reply of `p` is read for tool calls (chat, tools, tool_choice not none, and
// a parser configured).
bool parses_tool_calls(const RouteContext& ctx, const Prepared& p);
ToolCallParserOptions parser_options(const RouteContext& ctx, const Prepared& p);

// The exact tokens of a finished chat turn (prompt + generated + the end-of-turn token), for
// the next turn to continue; none when the turn did not end by a stop token or max_tokens,
// or a stop string cut it (`stop_string`).
std::optional<ConversationRecord> turn_record(const RouteContext& ctx, const Prepared& p,
                                              const StreamItem& fin,
                                              const std::vector<int32_t>& generated,
                                              const std::string& text, bool stop_string);

// After a chat turn: remember the session's exact tokens, offload a session whose turn
// ended in a tool call (--auto-tool-offload), and apply a message's cache_control pin.
// Returns the session's record as kept now (nullopt: none, or no session), for a router
// that asked for it (turns_record_wanted). Blocking (engine calls, rendering): runs on the
// worker pool.
std::optional<ConversationRecord> after_finish(RouteContext& ctx, const Prepared& p,
                                               const StreamItem& fin,
                                               const std::vector<int32_t>& generated,
                                               const std::string& text, bool stop_string,
                                               bool called_tools);
// Whether the request asks for its turn's record in the answer (the router's extension,
// request/turn_record.h: the x-strata-turn-record header).
bool turn_record_wanted(const http::Request& req);
// --auto-tool-offload: a turn of `session_id` that ended in tool calls (`called_tools`, as
// the route's parser read them) parks the session's KV on the host until its next request,
// which restores it by itself. A reply that was not read for calls (no tools in the
// request) is read here with the server's parser. Nothing without the flag or a session.
// Blocking (an engine command): runs on the worker pool.
void auto_tool_offload(RouteContext& ctx, const Prepared& p, const std::string& session_id,
                       const std::string& text, bool called_tools);
// Whether a finished turn leaves after_finish anything to do (a session to record or offload,
// a pin): most requests have none and skip the round trip to the worker pool.
bool has_after_finish(const Prepared& p);
// After a turn, when `p.prefix_pins` is not empty: makes each prefix pin (the prompt's full
// pages through it, with the request's salt, TTL and authority; over a pin budget the longest
// prefix that fits); returns those the pin policy accepted, as held (a refusal or a cut is
// counted in strata_cache_control_pins_refused_total, and in /cache/state's device section).
// Blocking: runs on the worker pool.
std::vector<PrefixPin> apply_prefix_pins(RouteContext& ctx, const Prepared& p);

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
void log_timing(RequestTiming& timing, const Ids& ids);

// The engine's results for the handler. With forced_output (test-only) the engine's own
// token is dropped and its finish carries the forced tokens instead, with the usage of a
// reply that generated them.
std::vector<StreamItem> take_results(const RouteContext& ctx, const Prepared& p, RequestGuard& req);

// A whole (not streamed) answer, read until the engine's finish: every token timed, the
// text through `text` (tokens after a stop string dropped, the request cancelled there),
// then req.finished() and timing.woken(). `text` is the answer before text.finish().
struct WholeAnswer {
  std::string text;
  std::vector<int32_t> generated;
  StreamItem fin;
};
// std::nullopt when the client went away (its request is cancelled with it).
boost::asio::awaitable<std::optional<WholeAnswer>> collect_whole(
    const RouteContext& ctx, http::Exchange& ex, const Prepared& p, RequestGuard& req,
    TextStream& text, TokenTimer& timer, RequestTiming& timing);

}  // namespace strata
