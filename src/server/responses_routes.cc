// OpenAI's Responses API: POST /v1/responses (a whole response or its server-sent events),
// GET and DELETE /v1/responses/{id} (docs/openai-responses.md).
//
// A Responses request is read as the chat-completions request it means
// (request/responses_request.h) and then prepared, run and read for tool calls by the
// chat-completions path itself (server/completion_flow.h, the same tool-call parsers); only
// the answer's shape, the stored responses and the cache retention are this file's.
//
// A stored response (store, the default) keeps its messages and the exact tokens of its
// turn (server/response_store.h): a request with its id as previous_response_id continues
// those tokens, as a session_id continues its record's (docs/sessions.md), so a chain of
// turns hits the cache completely; an `item_reference` input item is replaced with the stored
// output item it names. `prompt_cache_retention` becomes a soft pin of the
// turn's tokens after it, with the request's authority (the admin's with the admin key,
// else a client's, capped and budgeted: docs/authority.md); turns that share a
// `prompt_cache_key` pin only the blocks their group has not pinned yet. The key also names
// the engine session of its turns (a chat request's session_id), so with --auto-tool-offload a
// reply that calls functions parks the key's KV on the host until its next turn
// (docs/function-calling.md). Response ids are unique across processes: a router binds each
// to the worker that stored it (docs/router.md). A refused request changes nothing: it is
// refused before the engine.
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <utility>

#include "common/log.h"
#include "request/responses_request.h"
#include "request/turn_record.h"
#include "server/completion_flow.h"
#include "server/routes.h"
#include "server/text_stream.h"
#include "text/tokenizer/utf8.h"

namespace strata {
namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;
using boost::asio::awaitable;

constexpr const char* kPath = "/v1/responses";

// A Responses request, prepared for the engine.
struct PreparedResponse {
  ResponsesRequest request;
  Prepared prepared;
};

// Reads, maps, renders and tokenizes a Responses body on top of its previous response;
// `previous_unknown` tells a refusal for an unknown previous_response_id from the others.
// Blocking: runs on the worker pool.
Result<PreparedResponse> prepare_response(RouteContext& ctx, const http::Request& req,
                                          RequestTiming& timing, bool& previous_unknown) {
  auto body = parse_json_object_as<ojson>(req.body);
  if (!body) return std::unexpected(body.error());
  // An item_reference stands for an output item of a response stored here.
  auto resolved = resolve_item_references(*body, [&ctx](const std::string& item_id) {
    std::optional<ojson> out;
    const std::optional<std::string> response_id = response_of_item(item_id);
    if (!response_id) return out;
    const std::shared_ptr<const StoredResponse> stored = ctx.responses.find(*response_id);
    if (!stored || !stored->response.contains("output")) return out;
    for (const json& item : stored->response["output"]) {
      if (item.value("id", "") == item_id) out = ojson::parse(item.dump());
    }
    return out;
  });
  if (!resolved) return std::unexpected(resolved.error());
  auto read = read_responses_request(*body);
  if (!read) return std::unexpected(read.error());
  std::shared_ptr<const StoredResponse> previous;
  if (read->previous_response_id) {
    previous = ctx.responses.find(*read->previous_response_id);
    if (!previous) {
      previous_unknown = true;
      return make_error(ErrorCode::kNotFound, "Previous response with id '" +
                                                  *read->previous_response_id + "' not found.");
    }
  }
  ojson chat = responses_chat_body(*read, previous ? previous->history : ojson::array());
  // The conversation's session: its prompt_cache_key, else the session headers. Its turns
  // continue its record's exact tokens as a chat session's do (a client that sends the whole
  // history with store off, as Codex does, keys them so), and a tool-call turn parks its KV
  // under --auto-tool-offload (after_response).
  const std::string session =
      !read->prompt_cache_key.empty()
          ? read->prompt_cache_key
          : std::string(
                session_header(req.header(kSessionHeader), req.header(kClaudeCodeSessionHeader)));
  if (!session.empty()) {
    if (Status st = check_session_id(session, "x-session-id"); !st) {
      return std::unexpected(st.error());
    }
    chat["session_id"] = session;
  }
  // The previous turn's exact tokens, when this request renders the same conversation
  // before its input (the same instructions: they are not carried over).
  const ConversationRecord* record =
      previous && previous->record && previous->instructions == read->instructions
          ? &*previous->record
          : nullptr;
  auto p = prepare(ctx, req, chat.dump(-1, ' ', false, ojson::error_handler_t::replace),
                   /*chat=*/true, timing, record);
  if (!p) return std::unexpected(p.error());
  return PreparedResponse{.request = std::move(*read), .prepared = std::move(*p)};
}

// The tools left out of the prompt, named in the answer's x-strata-omitted-tools header
// (and logged once per type at info level): a client that offers hosted tools (Codex's
// web_search) is served without them instead of refused.
void add_omitted_tools_header(const ResponsesRequest& r, http::Headers& headers) {
  if (r.omitted_tools.empty()) return;
  std::string list;
  for (const std::string& t : r.omitted_tools) {
    if (!list.empty()) list += ", ";
    list += t;
  }
  headers.emplace_back(std::string(kOmittedToolsHeader), list);
  static std::mutex mutex;
  static std::set<std::string> logged;
  std::lock_guard lock(mutex);
  for (const std::string& t : r.omitted_tools) {
    if (logged.size() < 64 && logged.insert(t).second) {
      STRATA_LOG_INFO(
          "responses: tools of type '{}' are left out of the prompt (Strata does not "
          "run them); answers name them in {}",
          t, kOmittedToolsHeader);
    }
  }
}

// A response's id: "resp_", a random 64-bit prefix drawn once per process, then the engine
// request's id (both in hex). Unique within the process by the request id, and across
// processes (the workers behind one router, a worker's restarts) by the prefix.
std::string response_id(uint64_t request_id) {
  static const std::string prefix = [] {
    std::random_device rd;
    char buf[17];
    std::snprintf(buf, sizeof buf, "%08x%08x", rd(), rd());
    return std::string(buf);
  }();
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016" PRIx64, request_id);
  return "resp_" + prefix + buf;
}

http::Response responses_error(const Error& e, bool previous_unknown = false) {
  // OpenAI answers an unknown previous_response_id with 400.
  if (previous_unknown) return error_response(400, e.message, "previous_response_not_found");
  return error_response(e);
}

// Responses' usage, with Strata's per-tier breakdown of the cached tokens (as chat
// completions reports it).
json responses_usage(const RequestUsage& u) {
  const json chat = usage_json(u);
  json j{{"input_tokens", u.prompt_tokens},
         {"input_tokens_details", {{"cached_tokens", u.cached_tokens}}},
         {"output_tokens", u.completion_tokens},
         {"output_tokens_details", {{"reasoning_tokens", 0}}},
         {"total_tokens", u.prompt_tokens + u.completion_tokens},
         {"cached_tokens_details", chat["cached_tokens_details"]}};
  if (chat.contains("kv_transfer")) j["kv_transfer"] = chat["kv_transfer"];
  return j;
}

// The output items of a response, built as the reply is read: message items with one
// output_text part, and function_call items. The item ids are the response's id with the
// item's index.
class OutputItems {
 public:
  // `request` (outlives this): its namespace functions and custom tools, by the name the
  // model calls them.
  OutputItems(std::string response_id, const ResponsesRequest& request)
      : response_id_(std::move(response_id)), request_(request) {}

  // Text of the reply (joins the open message item, or opens one).
  void text(const std::string& piece) {
    if (open_ != Open::kMessage) {
      close();
      open_ = Open::kMessage;
      items_.push_back(json{{"id", item_id("msg")},
                            {"type", "message"},
                            {"status", "in_progress"},
                            {"role", "assistant"},
                            {"content", json::array()}});
      text_.clear();
      on_open_message();
    }
    text_ += piece;
    message_text_ += piece;
    on_text(piece);
  }
  // A call's first piece opens its item; later pieces add to its arguments.
  void call(const ToolCallDelta& d) {
    if (!d.id.empty()) {
      close();
      open_ = Open::kCall;
      // A custom tool's call is a custom_tool_call item whose `input` is the text the
      // model gave as the offered function's one argument (known when the call closes).
      const bool custom = request_.custom_tools.contains(d.name);
      json item{{"id", item_id("fc")},
                {"type", custom ? "custom_tool_call" : "function_call"},
                {"status", "in_progress"},
                {"call_id", d.id},
                {"name", d.name}};
      item[custom ? "input" : "arguments"] = "";
      // A namespace's function: its own name and its namespace apart, as the Responses
      // API answers (Codex finds the tool by both).
      if (auto ns = request_.namespaced.find(d.name); ns != request_.namespaced.end()) {
        item["name"] = ns->second.name;
        item["namespace"] = ns->second.name_space;
      }
      items_.push_back(std::move(item));
      custom_arguments_.clear();
      on_open_call();
    }
    if (open_ != Open::kCall || d.arguments.empty()) return;
    if (items_.back()["type"] == "custom_tool_call") {
      custom_arguments_ += d.arguments;
      return;
    }
    items_.back()["arguments"] = items_.back()["arguments"].get<std::string>() + d.arguments;
    on_arguments(d.arguments);
  }
  // Closes the last item; a reply without any gets an empty message.
  void finish() {
    if (items_.empty()) text("");
    close();
  }

  const json& items() const { return items_; }
  // The reply as a chat message (the history a next turn continues).
  ojson assistant_message() const {
    ojson m{{"role", "assistant"}, {"content", message_text_}};
    for (const json& item : items_) {
      if (item["type"] != "function_call" && item["type"] != "custom_tool_call") continue;
      if (!m.contains("tool_calls")) m["tool_calls"] = ojson::array();
      const std::string name = item.contains("namespace")
                                   ? qualified_tool_name(item["namespace"].get<std::string>(),
                                                         item["name"].get<std::string>())
                                   : item["name"].get<std::string>();
      m["tool_calls"].push_back(
          ojson{{"id", item["call_id"].get<std::string>()},
                {"type", "function"},
                {"function",
                 {{"name", name},
                  {"arguments", item.contains("arguments")
                                    ? item["arguments"].get<std::string>()
                                    : custom_tool_arguments(item["input"].get<std::string>())}}}});
    }
    return m;
  }
  size_t num_calls() const {
    return static_cast<size_t>(std::count_if(items_.begin(), items_.end(), [](const json& i) {
      return i["type"] == "function_call" || i["type"] == "custom_tool_call";
    }));
  }
  virtual ~OutputItems() = default;

 protected:
  // What a stream adds (events); a whole response needs none.
  virtual void on_open_message() {}
  virtual void on_text(const std::string&) {}
  virtual void on_open_call() {}
  virtual void on_arguments(const std::string&) {}
  virtual void on_close() {}

  size_t index() const { return items_.size() - 1; }
  json& last() { return items_.back(); }
  const std::string& open_text() const { return text_; }

 private:
  enum class Open { kNone, kMessage, kCall };
  std::string item_id(const char* prefix) const {
    return std::string(prefix) + "_" + response_id_.substr(5) + "_" + std::to_string(items_.size());
  }
  void close() {
    if (open_ == Open::kNone) return;
    json& item = items_.back();
    item["status"] = "completed";
    if (item["type"] == "custom_tool_call") {
      item["input"] = custom_tool_input(custom_arguments_).value_or(custom_arguments_);
    }
    if (open_ == Open::kMessage) {
      item["content"] = json::array(
          {json{{"type", "output_text"}, {"text", text_}, {"annotations", json::array()}}});
    }
    on_close();
    open_ = Open::kNone;
  }

  std::string response_id_;
  const ResponsesRequest& request_;
  json items_ = json::array();
  std::string custom_arguments_;  // the open custom tool call's arguments so far
  Open open_ = Open::kNone;
  std::string text_;          // the open message's
  std::string message_text_;  // every message's
};

// The status of a finished reply, its incomplete_details and its error. Cut by
// max_output_tokens: "incomplete". Cut by the model's context window: "failed" with the
// error code the Responses API gives a conversation that outgrew the context,
// context_length_exceeded (Codex then stops and offers to compact instead of retrying);
// the output generated so far stays in `output` (docs/openai-responses.md).
struct ReplyStatus {
  std::string status;
  json incomplete_details = nullptr;
  json error = nullptr;
};
// The response object.
json response_json(const Ids& ids, const ResponsesRequest& r, const ReplyStatus& status,
                   json output, json usage) {
  json j{
      {"id", ids.id},
      {"object", "response"},
      {"created_at", ids.created},
      {"status", status.status},
      {"background", false},
      {"error", status.error},
      {"incomplete_details", status.incomplete_details},
      {"instructions", r.instructions ? json(*r.instructions) : json(nullptr)},
      {"max_output_tokens", r.echo["max_output_tokens"]},
      {"model", ids.model},
      {"output", std::move(output)},
      {"parallel_tool_calls", r.echo["parallel_tool_calls"]},
      {"previous_response_id",
       r.previous_response_id ? json(*r.previous_response_id) : json(nullptr)},
      {"prompt_cache_key", r.prompt_cache_key.empty() ? json(nullptr) : json(r.prompt_cache_key)},
      {"reasoning", {{"effort", nullptr}, {"summary", nullptr}}},
      {"service_tier", "default"},
      {"store", r.store},
      {"temperature", r.echo["temperature"]},
      {"text", {{"format", {{"type", "text"}}}}},
      {"tool_choice", r.echo["tool_choice"]},
      {"tools", r.echo["tools"]},
      {"top_p", r.echo["top_p"]},
      {"truncation", "disabled"},
      {"usage", std::move(usage)},
      {"metadata", r.echo["metadata"]}};
  if (!r.retention.empty()) j["prompt_cache_retention"] = r.retention;
  if (r.echo.contains("user")) j["user"] = r.echo["user"];
  return j;
}

// `prompt_cache_retention`: a soft pin of the turn's tokens (its exact record when there is
// one, else its prompt), for the retention's TTL; within a prompt_cache_key group only the
// blocks the group has not pinned yet. Blocking: runs on the worker pool.
void pin_retention(RouteContext& ctx, const PreparedResponse& pr,
                   const std::optional<ConversationRecord>& record) {
  const ResponsesRequest& r = pr.request;
  const Prepared& p = pr.prepared;
  if (!r.retention_ttl_s) return;
  const std::vector<int32_t>& tokens = record ? record->tokens : p.prompt_tokens;
  std::vector<BlockHash> hashes = ctx.engine.block_hasher().hash_blocks(
      tokens, ctx.engine.options().page_size, p.params.cache_salt);
  if (hashes.empty()) return;
  int64_t ttl_ms = *r.retention_ttl_s * 1000;
  if (p.pin_authority == PinAuthority::kClient) {
    ttl_ms = std::min(ttl_ms, ctx.engine.options().max_client_pin_ttl_ms);
  }
  size_t first = 0;  // the first block this turn pins
  const int64_t now_ms = SteadyClock::instance().now_ms();
  if (!r.prompt_cache_key.empty()) {
    const ResponseStore::GroupPins group = ctx.responses.group_pins(r.prompt_cache_key);
    if (now_ms < group.expires_ms && group.hashes.size() <= hashes.size() &&
        std::equal(group.hashes.begin(), group.hashes.end(), hashes.begin())) {
      first = group.hashes.size();
    }
  }
  if (first < hashes.size()) {
    auto pinned =
        ctx.engine.cache()
            .pin(PinCommand{.hashes = std::vector<BlockHash>(
                                hashes.begin() + static_cast<ptrdiff_t>(first), hashes.end()),
                            .ttl_ms = ttl_ms,
                            .authority = p.pin_authority})
            .get();
    if (!pinned) {
      ctx.metrics.refused_pins().Increment();
      STRATA_LOG_DEBUG("prompt_cache_retention pin refused: {}", pinned.error().message);
      return;
    }
  }
  if (!r.prompt_cache_key.empty()) {
    ctx.responses.set_group_pins(
        r.prompt_cache_key,
        ResponseStore::GroupPins{.hashes = std::move(hashes), .expires_ms = now_ms + ttl_ms});
  }
}

// After a turn: its exact record, the response stored (when asked), the retention pin.
// Returns the record stored with the response (nullopt: none, or not stored), for a
// router that asked for it. Blocking: runs on the worker pool.
std::optional<ConversationRecord> after_response(RouteContext& ctx, const PreparedResponse& pr,
                                                 const StreamItem& fin,
                                                 const std::vector<int32_t>& generated,
                                                 const std::string& text, const OutputItems& items,
                                                 const json& response) {
  const Prepared& p = pr.prepared;
  std::optional<ConversationRecord> record =
      turn_record(ctx, p, fin, generated, text, /*stop_string=*/false);
  pin_retention(ctx, pr, record);
  if (!p.record_key.empty()) {
    if (record) {
      ctx.conversations.put(p.record_key, *record);
    } else {
      ctx.conversations.erase(p.record_key);
    }
  }
  auto_tool_offload(ctx, p, p.params.session_id, text, items.num_calls() > 0);
  if (!pr.request.store) return record;
  std::optional<ConversationRecord> kept = record;
  auto stored = std::make_shared<StoredResponse>();
  stored->response = response;
  stored->instructions = pr.request.instructions;
  const size_t skip = pr.request.instructions ? 1 : 0;
  for (size_t i = skip; i < p.messages.size(); ++i) stored->history.push_back(p.messages[i]);
  stored->history.push_back(items.assistant_message());
  stored->record = std::move(record);
  ctx.responses.put(response["id"].get<std::string>(), std::move(stored));
  return kept;
}

// The router's extension (request/turn_record.h): whether this turn's answer carries its
// record (a stored turn's, or a session's), and the field's value.
bool sends_turn_record(const http::Request& req, const PreparedResponse& pr) {
  return (pr.request.store || !pr.prepared.params.session_id.empty()) && turn_record_wanted(req);
}
json turn_record_field(const std::optional<ConversationRecord>& record) {
  return record ? turn_record_json(*record) : json(nullptr);
}

ReplyStatus status_of(const Prepared& p, const StreamItem& fin) {
  if (stopped_by_context(p, fin)) {
    return {.status = "failed",
            .error = json{
                {"code", "context_length_exceeded"},
                {"message", "The reply reached the end of the model's context window (" +
                                std::to_string(fin.usage.prompt_tokens) + " prompt tokens + " +
                                std::to_string(fin.usage.completion_tokens) + " output tokens)."}}};
  }
  if (fin.finish == FinishReason::kLength) {
    return {.status = "incomplete", .incomplete_details = json{{"reason", "max_output_tokens"}}};
  }
  return {.status = "completed"};
}

awaitable<void> whole_response(RouteContext& ctx, http::Exchange& ex, const PreparedResponse& pr,
                               RequestGuard& req, const Ids& ids, WallClock::time_point t_start,
                               RequestTiming& timing) {
  const Prepared& p = pr.prepared;
  TextStream text(ctx.tokenizer, p.params.stop);
  TokenTimer timer(ctx.metrics, t_start);
  auto whole = co_await collect_whole(ctx, ex, p, req, text, timer, timing);
  if (!whole) co_return;  // client gone: cancelled
  std::string& out = whole->text;
  const std::vector<int32_t>& generated = whole->generated;
  const StreamItem* fin = &whole->fin;
  if (fin->finish == FinishReason::kError) {
    co_await ex.respond(error_response(500, "generation failed: " + fin->error, "server_error"));
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
  if (*fin->finish != FinishReason::kLength) {
    if (auto st = check_tool_choice(p.tool_choice, parsed.calls); !st) {
      co_await ex.respond(error_response(422, st.error().message, "tool_choice_not_followed"));
      co_return;
    }
  }
  OutputItems items(ids.id, pr.request);
  if (!parsed.content.empty() || parsed.calls.empty()) items.text(parsed.content);
  for (const ToolCall& c : parsed.calls) {
    items.call(ToolCallDelta{.id = c.id, .name = c.name, .arguments = c.arguments});
  }
  items.finish();
  const ReplyStatus status = status_of(p, *fin);
  const json response =
      response_json(ids, pr.request, status, items.items(), responses_usage(fin->usage));
  std::optional<ConversationRecord> recorded;
  co_await ex.offload(
      [&] { recorded = after_response(ctx, pr, *fin, generated, out, items, response); });
  http::Response answer = json_response(200, response);
  if (sends_turn_record(ex.request(), pr)) {
    json with_record = response;  // the stored response stays as clients see it
    with_record[std::string(kTurnRecordField)] = turn_record_field(recorded);
    answer = json_response(200, with_record);
  }
  timing.answered();
  answer.headers.emplace_back("Server-Timing", timing.server_timing());
  add_omitted_tools_header(pr.request, answer.headers);
  co_await ex.respond(std::move(answer));
  log_timing(timing, ids);
}

// The Responses events of a stream: each `event: NAME` with its data, numbered.
class EventWriter : public OutputItems {
 public:
  EventWriter(std::string response_id, const ResponsesRequest& request)
      : OutputItems(std::move(response_id), request) {}

  void event(const char* name, json data) {
    data["type"] = name;
    data["sequence_number"] = sequence_++;
    out_ += std::string("event: ") + name +
            "\ndata: " + data.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
  }
  std::string take() { return std::exchange(out_, std::string()); }

 private:
  void on_open_message() override {
    event("response.output_item.added", json{{"output_index", index()}, {"item", last()}});
    event("response.content_part.added", json{{"item_id", last()["id"]},
                                              {"output_index", index()},
                                              {"content_index", 0},
                                              {"part", part("")}});
  }
  void on_text(const std::string& piece) override {
    if (piece.empty()) return;
    event("response.output_text.delta", json{{"item_id", last()["id"]},
                                             {"output_index", index()},
                                             {"content_index", 0},
                                             {"delta", piece},
                                             {"logprobs", json::array()}});
  }
  void on_open_call() override {
    event("response.output_item.added", json{{"output_index", index()}, {"item", last()}});
  }
  void on_arguments(const std::string& piece) override {
    event("response.function_call_arguments.delta",
          json{{"item_id", last()["id"]}, {"output_index", index()}, {"delta", piece}});
  }
  void on_close() override {
    const json& item = last();
    if (item["type"] == "message") {
      event("response.output_text.done", json{{"item_id", item["id"]},
                                              {"output_index", index()},
                                              {"content_index", 0},
                                              {"text", open_text()},
                                              {"logprobs", json::array()}});
      event("response.content_part.done", json{{"item_id", item["id"]},
                                               {"output_index", index()},
                                               {"content_index", 0},
                                               {"part", part(open_text())}});
    } else if (item["type"] == "custom_tool_call") {
      event("response.custom_tool_call_input.delta",
            json{{"item_id", item["id"]}, {"output_index", index()}, {"delta", item["input"]}});
      event("response.custom_tool_call_input.done",
            json{{"item_id", item["id"]}, {"output_index", index()}, {"input", item["input"]}});
    } else {
      event("response.function_call_arguments.done", json{{"item_id", item["id"]},
                                                          {"output_index", index()},
                                                          {"name", item["name"]},
                                                          {"arguments", item["arguments"]}});
    }
    event("response.output_item.done", json{{"output_index", index()}, {"item", item}});
  }
  static json part(const std::string& text) {
    return json{{"type", "output_text"}, {"text", text}, {"annotations", json::array()}};
  }

  std::string out_;
  int64_t sequence_ = 0;
};

awaitable<void> streamed_response(RouteContext& ctx, http::Exchange& ex, const PreparedResponse& pr,
                                  RequestGuard& req, const Ids& ids, WallClock::time_point t_start,
                                  RequestTiming& timing) {
  const Prepared& p = pr.prepared;
  http::Headers headers{{"Cache-Control", "no-cache"}};
  add_omitted_tools_header(pr.request, headers);
  if (!co_await ex.begin_stream(200, "text/event-stream", std::move(headers))) co_return;
  TextStream text(ctx.tokenizer, p.params.stop);
  TokenTimer timer(ctx.metrics, t_start);
  std::optional<ToolCallStreamParser> tools;
  if (parses_tool_calls(ctx, p)) tools.emplace(parser_options(ctx, p));
  EventWriter events(ids.id, pr.request);
  auto write = [&](const std::string& piece) {
    if (!tools) {
      if (!piece.empty()) events.text(piece);
      return;
    }
    for (const ToolCallEvent& e : tools->push(piece)) {
      if (e.call) {
        events.call(*e.call);
      } else if (!e.content.empty()) {
        events.text(e.content);
      }
    }
  };
  const json started =
      response_json(ids, pr.request, ReplyStatus{.status = "in_progress"}, json::array(), nullptr);
  events.event("response.created", json{{"response", started}});
  events.event("response.in_progress", json{{"response", started}});
  if (!ex.send(events.take())) co_return;
  std::vector<int32_t> generated;
  std::string all_text;
  std::string record_event;  // the turn's record, for a router that asked (sent last)
  std::optional<StreamItem> fin;
  while (!fin) {
    for (StreamItem& item : take_results(ctx, p, req)) {
      for (const GeneratedToken& t : item.tokens) {
        timer.token();
        generated.push_back(t.token);
        const std::string piece = text.push(t.token);
        all_text += piece;
        write(piece);
      }
      if (item.finish) fin = std::move(item);
    }
    if (fin) {
      req.finished();
      timing.woken();
      if (*fin->finish == FinishReason::kError) {
        events.event("error", json{{"code", "server_error"},
                                   {"message", "generation failed: " + fin->error},
                                   {"param", nullptr}});
      } else {
        const std::string tail = text.finish();
        all_text += tail;
        write(tail);
        Status complies;
        if (tools) {
          for (const ToolCallEvent& e : tools->finish()) {
            if (e.call) {
              events.call(*e.call);
            } else if (!e.content.empty()) {
              events.text(e.content);
            }
          }
          if (tools->malformed()) ctx.metrics.malformed_tool_calls().Increment();
          if (tools->num_committed() > 0) ctx.metrics.tool_call_replies().Increment();
          if (*fin->finish != FinishReason::kLength) {
            complies = check_tool_choice(p.tool_choice, tools->calls());
          }
        }
        events.finish();
        timer.finish(fin->usage);
        const ReplyStatus status = status_of(p, *fin);
        const json response =
            response_json(ids, pr.request, status, events.items(), responses_usage(fin->usage));
        if (!complies) {
          // What was streamed stands; the stream ends with the error instead.
          events.event("error", json{{"code", "tool_choice_not_followed"},
                                     {"message", complies.error().message},
                                     {"param", "tool_choice"}});
        } else {
          std::optional<ConversationRecord> recorded;
          co_await ex.offload([&] {
            recorded = after_response(ctx, pr, *fin, generated, all_text, events, response);
          });
          events.event(status.status == "completed" ? "response.completed"
                       : status.status == "failed"  ? "response.failed"
                                                    : "response.incomplete",
                       json{{"response", response}});
          // The router's extension: an unnamed event of its own, after the last named one.
          if (sends_turn_record(ex.request(), pr)) {
            record_event =
                "data: " +
                dump_json(json{{std::string(kTurnRecordField), turn_record_field(recorded)}}) +
                "\n\n";
          }
        }
      }
      timing.answered();
    }
    std::string out = events.take() + std::exchange(record_event, std::string());
    if (!out.empty() && !ex.send(std::move(out))) co_return;  // gone, or reading too slowly
    if (fin) break;
    if (!co_await ex.wait(kPollInterval)) co_return;
  }
  co_await ex.end_stream();
  log_timing(timing, ids);
}

awaitable<void> create(RouteContext& ctx, http::Exchange& ex) {
  const auto t_start = WallClock::now();
  RequestTiming timing(ex.request());
  bool unknown_previous = false;
  auto prepared = co_await ex.offload([&] {
    timing.worker_started();
    auto m = prepare_response(ctx, ex.request(), timing, unknown_previous);
    release_memory_after(ex.request().body.size());
    return m;
  });
  if (!prepared) {
    co_await ex.respond(responses_error(prepared.error(), unknown_previous));
    co_return;
  }
  timing.resumed();
  const PreparedResponse& pr = *prepared;
  auto submitted = ctx.engine.submit(RequestSpec(pr.prepared.spec));
  if (!submitted) {
    co_await ex.respond(error_response(submitted.error()));
    co_return;
  }
  timing.submitted();
  RequestGuard req(*submitted, [&timing, wake = ex.waker()] {
    timing.item_pushed();
    wake();
  });
  const Ids ids{.id = response_id((*submitted)->id()),
                .created = unix_time_s(),
                .model = ctx.options.model_name,
                .chat = true};
  if (pr.request.stream) {
    co_await streamed_response(ctx, ex, pr, req, ids, t_start, timing);
  } else {
    co_await whole_response(ctx, ex, pr, req, ids, t_start, timing);
  }
}

// The id of /v1/responses/{id}.
std::string id_of(const http::Request& req) {
  return req.path.substr(std::string(kPath).size() + 1);
}

http::Response get_response(RouteContext& ctx, const http::Request& req) {
  const std::string id = id_of(req);
  auto stored = ctx.responses.find(id);
  if (!stored) return error_response(404, "No response found with id '" + id + "'.", "not_found");
  return json_response(200, stored->response);
}

http::Response delete_response(RouteContext& ctx, const http::Request& req) {
  const std::string id = id_of(req);
  if (!ctx.responses.erase(id)) {
    return error_response(404, "No response found with id '" + id + "'.", "not_found");
  }
  return json_response(200, json{{"id", id}, {"object", "response"}, {"deleted", true}});
}

}  // namespace

void add_responses_routes(http::Server& server, RouteContext& ctx) {
  server.route("POST", kPath, [&ctx](http::Exchange& ex) { return create(ctx, ex); });
  server.route("GET", std::string(kPath) + "/*",
               blocking([&ctx](const http::Request& req) { return get_response(ctx, req); }));
  server.route("DELETE", std::string(kPath) + "/*",
               blocking([&ctx](const http::Request& req) { return delete_response(ctx, req); }));
}

}  // namespace strata
