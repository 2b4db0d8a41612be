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
#include "server/completion_flow.h"
#include "server/routes.h"
#include "server/text_stream.h"

namespace strata {
namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;
using boost::asio::awaitable;

json bytes_of(const std::string& s) {
  json out = json::array();
  for (unsigned char c : s) out.push_back(static_cast<int>(c));
  return out;
}

std::string finish_name(FinishReason r) {
  return r == FinishReason::kLength ? "length" : "stop";
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
  std::optional<ConversationRecord> recorded;
  if (has_after_finish(p)) {
    co_await ex.offload([&] {
      recorded = after_finish(ctx, p, *fin, generated, out, text.stopped(), called_tools);
    });
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
  json body{{"id", ids.id},
            {"object", chat ? "chat.completion" : "text_completion"},
            {"created", ids.created},
            {"model", ids.model},
            {"choices", json::array({choice})},
            {"usage", usage_json(fin->usage)}};
  if (chat && !p.params.session_id.empty() && turn_record_wanted(ex.request())) {
    body[std::string(kTurnRecordField)] = recorded ? turn_record_json(*recorded) : json(nullptr);
  }
  http::Response answer = json_response(200, body);
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
        std::optional<ConversationRecord> recorded;
        if (has_after_finish(p)) {
          co_await ex.offload([&] {
            recorded =
                after_finish(ctx, p, *fin, generated, all_text, text.stopped(), called_tools);
          });
        }
        // The router's extension (request/turn_record.h): an event of its own.
        if (chat && !p.params.session_id.empty() && turn_record_wanted(ex.request())) {
          out += sse(json{{std::string(kTurnRecordField),
                           recorded ? turn_record_json(*recorded) : json(nullptr)}});
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
    auto p = prepare(ctx, ex.request(), ex.request().body, chat, timing);
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
