// Anthropic's Messages API: POST /v1/messages (a whole message or Anthropic's server-sent
// events) and POST /v1/messages/count_tokens (docs/anthropic-messages.md).
//
// A Messages request is read as the chat-completions request it means
// (request/anthropic_request.h) and then prepared, run and read for tool calls by the
// chat-completions path itself (server/completion_flow.h, the same tool-call parsers); only
// the answer's shape and the cache breakpoints are this file's. Each breakpoint becomes a
// soft pin of exactly the prompt's tokens through its block, made after the turn (as a
// chat message's cache_control pin is), with the request's authority: the admin's with the
// admin key (Authorization or x-api-key), else a client's, capped and budgeted
// (docs/authority.md). A refused request changes nothing: it is refused before the engine.
// The request's session (the x-session-id header, else Claude Code's x-claude-code-session-id,
// else metadata.user_id) is its engine session, as a chat request's session_id: its turns
// continue their exact tokens (and give the router their record when asked), and with
// --auto-tool-offload a tool_use reply parks the conversation's KV on the host and the turn
// with the tool_result restores it. Claude Code's billing line is taken out of the system
// prompt (request/anthropic_request.h); a reply cut by the context window stops with
// "model_context_window_exceeded".
#include <algorithm>
#include <atomic>
#include <optional>

#include "common/log.h"
#include "request/anthropic_request.h"
#include "server/completion_flow.h"
#include "server/routes.h"
#include "server/text_stream.h"

namespace strata {
namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;
using boost::asio::awaitable;

http::Response anthropic_error(int status, const std::string& message) {
  return json_response(status, anthropic_error_json(status, message));
}
http::Response anthropic_error(const Error& e) {
  return anthropic_error(http_status(e.code), e.message);
}

AnthropicReadOptions reading_options(const RouteContext& ctx) {
  return AnthropicReadOptions{.strip_billing_header = !ctx.options.keep_billing_header};
}

// The first billing line taken out of a system prompt is logged (once per process: every
// Claude Code request carries one).
void log_billing_header_once(const AnthropicRequest& read) {
  static std::atomic<bool> logged{false};
  if (read.stripped_billing_header.empty() || logged.exchange(true)) return;
  STRATA_LOG_INFO(
      "messages: took Claude Code's billing line out of the system prompt (\"{}\"; it differs "
      "per conversation and would defeat the prefix cache; --keep-billing-header keeps it); "
      "logged once",
      read.stripped_billing_header);
}

// A Messages request, prepared for the engine, its breakpoints placed as prefix pins.
struct PreparedMessages {
  Prepared prepared;
  bool stream = false;
};

// Reads, maps, renders and tokenizes a Messages body; places its breakpoints on the prompt.
// Blocking: runs on the worker pool.
Result<PreparedMessages> prepare_messages(RouteContext& ctx, const http::Request& req,
                                          RequestTiming& timing) {
  auto body = parse_json_object_as<ojson>(req.body);
  if (!body) return std::unexpected(body.error());
  auto read = read_anthropic_request(*body, AnthropicEndpoint::kMessages, reading_options(ctx));
  if (!read) return std::unexpected(read.error());
  log_billing_header_once(*read);
  // The conversation's engine session (x-session-id, else Claude Code's session header, else
  // metadata.user_id): its turns continue its record's exact tokens, and a tool_use turn
  // parks its KV under --auto-tool-offload until the tool_result comes (after_finish), as on
  // chat completions.
  auto session = anthropic_session(
      *read, session_header(req.header(kSessionHeader), req.header(kClaudeCodeSessionHeader)));
  if (!session) return std::unexpected(session.error());
  if (!session->empty()) read->chat_body["session_id"] = *session;
  const std::string chat_body =
      read->chat_body.dump(-1, ' ', false, ojson::error_handler_t::replace);
  auto p = prepare(ctx, req, chat_body, /*chat=*/true, timing);
  if (!p) return std::unexpected(p.error());
  PreparedMessages out{.prepared = std::move(*p), .stream = read->stream};
  Prepared& prep = out.prepared;
  prep.pin_authority =
      authorized_anthropic(ctx, req) ? PinAuthority::kAdmin : PinAuthority::kClient;
  for (const CacheBreakpoint& bp : read->breakpoints) {
    const size_t n = breakpoint_prefix_tokens(ctx.reader(), prep.tools ? &*prep.tools : nullptr,
                                              prep.template_kwargs, bp, prep.prompt_tokens);
    if (n > 0) prep.prefix_pins.push_back(PrefixPin{.num_tokens = n, .ttl_s = bp.ttl_s});
  }
  return out;
}

// The breakpoints whose pins were made (a refused pin's tokens were computed and cached,
// but nothing holds them: they count as input, not as cache creation).
std::vector<PlacedBreakpoint> made_breakpoints(RouteContext& ctx, const Prepared& p) {
  std::vector<PlacedBreakpoint> out;
  for (const PrefixPin& pin : apply_prefix_pins(ctx, p)) {
    out.push_back(PlacedBreakpoint{.num_tokens = pin.num_tokens, .ttl_s = pin.ttl_s});
  }
  return out;
}

// Anthropic's usage, with Strata's per-tier breakdown of the cached tokens (as chat
// completions reports it).
json messages_usage(const RequestUsage& u, const std::vector<PlacedBreakpoint>& breakpoints) {
  const CacheUsage c = cache_usage(u.prompt_tokens, u.cached_tokens, breakpoints);
  json j{{"input_tokens", c.input_tokens},
         {"cache_creation_input_tokens", c.cache_creation_input_tokens},
         {"cache_read_input_tokens", c.cache_read_input_tokens},
         {"cache_creation",
          {{"ephemeral_5m_input_tokens", c.ephemeral_5m_input_tokens},
           {"ephemeral_1h_input_tokens", c.ephemeral_1h_input_tokens}}},
         {"output_tokens", u.completion_tokens}};
  const json chat = usage_json(u);
  j["cached_tokens_details"] = chat["cached_tokens_details"];
  if (chat.contains("kv_transfer")) j["kv_transfer"] = chat["kv_transfer"];
  return j;
}

// A tool_use block's input: the call's arguments (a JSON object's text, as the parser
// checked it).
json tool_input(const std::string& arguments) {
  json input = json::parse(arguments, nullptr, /*allow_exceptions=*/false);
  return input.is_object() ? input : json::object();
}

// The stop_reason of a finished reply, and its stop_sequence.
struct StopReason {
  std::string reason;
  json sequence = nullptr;
};
// A reply cut by the context window (not by max_tokens) is "model_context_window_exceeded",
// as Anthropic reports it (docs/anthropic-messages.md).
StopReason stop_reason(const TextStream& text, const Prepared& p, const StreamItem& fin,
                       bool called_tools) {
  if (text.stopped()) return {"stop_sequence", text.stop_found()};
  if (stopped_by_context(p, fin)) return {"model_context_window_exceeded"};
  if (fin.finish == FinishReason::kLength) return {"max_tokens"};
  return {called_tools ? "tool_use" : "end_turn"};
}
bool cut_short(const StopReason& stop) {
  return stop.reason == "max_tokens" || stop.reason == "model_context_window_exceeded";
}
// The router's extension (request/turn_record.h): whether the answer carries the turn's
// record (a session's turn, asked for).
bool sends_turn_record(const http::Request& req, const Prepared& p) {
  return !p.params.session_id.empty() && turn_record_wanted(req);
}

json message_json(const Ids& ids, json content, const json& stop_reason, const json& stop_sequence,
                  json usage) {
  return json{{"id", ids.id},
              {"type", "message"},
              {"role", "assistant"},
              {"model", ids.model},
              {"content", std::move(content)},
              {"stop_reason", stop_reason},
              {"stop_sequence", stop_sequence},
              {"usage", std::move(usage)}};
}

awaitable<void> whole_message(RouteContext& ctx, http::Exchange& ex, const PreparedMessages& m,
                              RequestGuard& req, const Ids& ids, WallClock::time_point t_start,
                              RequestTiming& timing) {
  const Prepared& p = m.prepared;
  TextStream text(ctx.tokenizer, p.params.stop);
  TokenTimer timer(ctx.metrics, t_start);
  auto whole = co_await collect_whole(ctx, ex, p, req, text, timer, timing);
  if (!whole) co_return;  // client gone: cancelled
  std::string& out = whole->text;
  const std::vector<int32_t>& generated = whole->generated;
  const StreamItem* fin = &whole->fin;
  if (fin->finish == FinishReason::kError) {
    co_await ex.respond(anthropic_error(500, "generation failed: " + fin->error));
    co_return;
  }
  out += text.finish();
  timer.finish(fin->usage);
  ParsedToolCalls parsed{.content = out};
  if (parses_tool_calls(ctx, p)) {
    parsed = parse_tool_calls(out, parser_options(ctx, p));
    if (parsed.malformed) ctx.metrics.malformed_tool_calls().Increment();
    if (!parsed.calls.empty()) ctx.metrics.tool_call_replies().Increment();
  }
  const bool called_tools = !parsed.calls.empty();
  std::vector<PlacedBreakpoint> pinned;
  std::optional<ConversationRecord> recorded;
  if (has_after_finish(p) || !p.prefix_pins.empty()) {
    pinned = co_await ex.offload([&] {
      if (has_after_finish(p)) {
        recorded = after_finish(ctx, p, *fin, generated, out, text.stopped(), called_tools);
      }
      return made_breakpoints(ctx, p);
    });
  }
  const StopReason stop = stop_reason(text, p, *fin, called_tools);
  if (!cut_short(stop)) {
    if (auto st = check_tool_choice(p.tool_choice, parsed.calls); !st) {
      co_await ex.respond(anthropic_error(422, st.error().message));
      co_return;
    }
  }
  json content = json::array();
  if (!parsed.content.empty() || !called_tools) {
    content.push_back(json{{"type", "text"}, {"text", parsed.content}});
  }
  for (const ToolCall& c : parsed.calls) {
    content.push_back(json{
        {"type", "tool_use"}, {"id", c.id}, {"name", c.name}, {"input", tool_input(c.arguments)}});
  }
  json message = message_json(ids, std::move(content), stop.reason, stop.sequence,
                              messages_usage(fin->usage, pinned));
  if (sends_turn_record(ex.request(), p)) {
    message[std::string(kTurnRecordField)] = recorded ? turn_record_json(*recorded) : json(nullptr);
  }
  http::Response answer = json_response(200, message);
  timing.answered();
  answer.headers.emplace_back("Server-Timing", timing.server_timing());
  co_await ex.respond(std::move(answer));
  log_timing(timing, ids);
}

// One server-sent event in Anthropic's framing.
std::string event(const char* name, const json& data) {
  return std::string("event: ") + name +
         "\ndata: " + data.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

// Turns the tool-call parser's events (or plain text) into content blocks: a text block
// while text comes, a tool_use block per call, each opened and closed in order.
class BlockWriter {
 public:
  // The events of one parser event.
  void add(const ToolCallEvent& e, std::string& out) {
    if (!e.call) {
      if (e.content.empty()) return;
      if (open_ != Open::kText) {
        close(out);
        open(Open::kText, json{{"type", "text"}, {"text", ""}}, out);
      }
      out += event("content_block_delta",
                   json{{"type", "content_block_delta"},
                        {"index", index_},
                        {"delta", {{"type", "text_delta"}, {"text", e.content}}}});
      return;
    }
    const ToolCallDelta& d = *e.call;
    if (!d.id.empty()) {
      close(out);
      open(Open::kTool,
           json{{"type", "tool_use"}, {"id", d.id}, {"name", d.name}, {"input", json::object()}},
           out);
    }
    if (!d.arguments.empty()) {
      out += event("content_block_delta",
                   json{{"type", "content_block_delta"},
                        {"index", index_},
                        {"delta", {{"type", "input_json_delta"}, {"partial_json", d.arguments}}}});
    }
  }
  // Closes the last block; a reply without any gets an empty text block.
  void finish(std::string& out) {
    if (index_ < 0) open(Open::kText, json{{"type", "text"}, {"text", ""}}, out);
    close(out);
  }

 private:
  enum class Open { kNone, kText, kTool };
  void open(Open kind, json block, std::string& out) {
    ++index_;
    open_ = kind;
    out += event("content_block_start", json{{"type", "content_block_start"},
                                             {"index", index_},
                                             {"content_block", std::move(block)}});
  }
  void close(std::string& out) {
    if (open_ == Open::kNone) return;
    out += event("content_block_stop", json{{"type", "content_block_stop"}, {"index", index_}});
    open_ = Open::kNone;
  }

  int index_ = -1;
  Open open_ = Open::kNone;
};

awaitable<void> streamed_message(RouteContext& ctx, http::Exchange& ex, const PreparedMessages& m,
                                 RequestGuard& req, const Ids& ids, WallClock::time_point t_start,
                                 RequestTiming& timing) {
  const Prepared& p = m.prepared;
  http::Headers headers{{"Cache-Control", "no-cache"}};
  if (!co_await ex.begin_stream(200, "text/event-stream", std::move(headers))) co_return;
  TextStream text(ctx.tokenizer, p.params.stop);
  TokenTimer timer(ctx.metrics, t_start);
  std::optional<ToolCallStreamParser> tools;
  if (parses_tool_calls(ctx, p)) tools.emplace(parser_options(ctx, p));
  BlockWriter blocks;
  auto write = [&](const std::string& piece, std::string& out) {
    if (tools) {
      for (const ToolCallEvent& e : tools->push(piece)) blocks.add(e, out);
    } else {
      blocks.add(ToolCallEvent{.content = piece, .call = std::nullopt}, out);
    }
  };
  // The prompt's usage is known at the end (what the cache held); message_start carries
  // the prompt's size as input_tokens and message_delta the truth.
  const json start_usage{{"input_tokens", p.prompt_tokens.size()},
                         {"cache_creation_input_tokens", 0},
                         {"cache_read_input_tokens", 0},
                         {"output_tokens", 0}};
  std::string first =
      event("message_start",
            json{{"type", "message_start"},
                 {"message", message_json(ids, json::array(), nullptr, nullptr, start_usage)}});
  first += event("ping", json{{"type", "ping"}});
  if (!ex.send(std::move(first))) co_return;
  std::vector<int32_t> generated;
  std::string all_text;
  std::optional<StreamItem> fin;
  while (!fin) {
    std::string out;
    for (StreamItem& item : take_results(ctx, p, req)) {
      for (const GeneratedToken& t : item.tokens) {
        timer.token();
        if (text.stopped()) continue;
        generated.push_back(t.token);
        const std::string piece = text.push(t.token);
        all_text += piece;
        write(piece, out);
        if (text.stopped()) req.stream().cancel();
      }
      if (item.finish) fin = std::move(item);
    }
    if (fin) {
      req.finished();
      timing.woken();
      if (*fin->finish == FinishReason::kError) {
        out += event("error", anthropic_error_json(500, "generation failed: " + fin->error));
      } else {
        const std::string tail = text.finish();
        all_text += tail;
        write(tail, out);
        bool called_tools = false;
        Status complies;
        if (tools) {
          for (const ToolCallEvent& e : tools->finish()) blocks.add(e, out);
          called_tools = tools->num_committed() > 0;
          if (tools->malformed()) ctx.metrics.malformed_tool_calls().Increment();
          if (called_tools) ctx.metrics.tool_call_replies().Increment();
        }
        blocks.finish(out);
        const StopReason stop = stop_reason(text, p, *fin, called_tools);
        if (tools && !cut_short(stop)) {
          complies = check_tool_choice(p.tool_choice, tools->calls());
        }
        timer.finish(fin->usage);
        std::vector<PlacedBreakpoint> pinned;
        std::optional<ConversationRecord> recorded;
        if (has_after_finish(p) || !p.prefix_pins.empty()) {
          pinned = co_await ex.offload([&] {
            if (has_after_finish(p)) {
              recorded =
                  after_finish(ctx, p, *fin, generated, all_text, text.stopped(), called_tools);
            }
            return made_breakpoints(ctx, p);
          });
        }
        // The router's extension: an unnamed event of its own, before the stream's end.
        if (sends_turn_record(ex.request(), p)) {
          out += "data: " +
                 dump_json(json{{std::string(kTurnRecordField),
                                 recorded ? turn_record_json(*recorded) : json(nullptr)}}) +
                 "\n\n";
        }
        if (!complies) {
          // What was streamed stands; the stream ends with the error instead of a stop.
          out += event("error", anthropic_error_json(422, complies.error().message));
        } else {
          out += event(
              "message_delta",
              json{{"type", "message_delta"},
                   {"delta", {{"stop_reason", stop.reason}, {"stop_sequence", stop.sequence}}},
                   {"usage", messages_usage(fin->usage, pinned)}});
          out += event("message_stop", json{{"type", "message_stop"}});
        }
      }
      timing.answered();
    }
    if (!out.empty() && !ex.send(std::move(out))) co_return;  // gone, or reading too slowly
    if (fin) break;
    if (!co_await ex.wait(kPollInterval)) co_return;
  }
  co_await ex.end_stream();
  log_timing(timing, ids);
}

awaitable<void> messages(RouteContext& ctx, http::Exchange& ex) {
  const auto t_start = WallClock::now();
  RequestTiming timing(ex.request());
  auto prepared = co_await ex.offload([&] {
    timing.worker_started();
    auto m = prepare_messages(ctx, ex.request(), timing);
    release_memory_after(ex.request().body.size());
    return m;
  });
  if (!prepared) {
    co_await ex.respond(anthropic_error(prepared.error()));
    co_return;
  }
  timing.resumed();
  const PreparedMessages& m = *prepared;
  auto submitted = ctx.engine.submit(RequestSpec(m.prepared.spec));
  if (!submitted) {
    co_await ex.respond(anthropic_error(submitted.error()));
    co_return;
  }
  timing.submitted();
  RequestGuard req(*submitted, [&timing, wake = ex.waker()] {
    timing.item_pushed();
    wake();
  });
  const Ids ids{.id = "msg_" + std::to_string((*submitted)->id()),
                .created = unix_time_s(),
                .model = ctx.options.model_name,
                .chat = true};
  if (m.stream) {
    co_await streamed_message(ctx, ex, m, req, ids, t_start, timing);
  } else {
    co_await whole_message(ctx, ex, m, req, ids, t_start, timing);
  }
}

// count_tokens: the prompt's tokens, rendered as /v1/messages renders it (with the
// generation prompt), without the engine.
http::Response count_tokens(RouteContext& ctx, const http::Request& req) {
  auto body = parse_json_object_as<ojson>(req.body);
  if (!body) return anthropic_error(body.error());
  auto read = read_anthropic_request(*body, AnthropicEndpoint::kCountTokens, reading_options(ctx));
  if (!read) return anthropic_error(read.error());
  auto chat = read_chat_request(read->chat_body, GenerationPrompt::kAlways);
  if (!chat) return anthropic_error(chat.error());
  auto ids = ctx.reader().chat_tokens(*chat);
  if (!ids) return anthropic_error(ids.error());
  return json_response(200, json{{"input_tokens", ids->size()}});
}

}  // namespace

void add_anthropic_routes(http::Server& server, RouteContext& ctx) {
  server.route("POST", "/v1/messages", [&ctx](http::Exchange& ex) { return messages(ctx, ex); });
  server.route("POST", "/v1/messages/count_tokens",
               blocking([&ctx](const http::Request& req) { return count_tokens(ctx, req); }));
}

}  // namespace strata
