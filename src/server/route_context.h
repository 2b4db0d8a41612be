// What every family of routes shares: the engine, the text front end, metrics, the
// conversation records, and the helpers that turn results into HTTP answers. Route files
// (openai_routes.cc, tokenizer_routes.cc, cache_routes.cc, session_routes.cc,
// health_routes.cc) add their handlers to the HTTP server through routes.h.
//
// Threads: handlers run on the HTTP server's I/O threads and, through Exchange::offload,
// on its worker pool. The engine is reached only through submit() and its cache-control
// commands; the conversation records lock themselves; everything else here is read-only
// after start-up.
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <functional>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/result.h"
#include "engine/engine.h"
#include "http/exchange.h"
#include "http/message.h"
#include "http/server.h"
#include "request/prompt_reader.h"
#include "request/release_memory.h"
#include "server/cache_events_stream.h"
#include "server/conversations.h"
#include "server/metrics.h"
#include "server/response_store.h"
#include "server/responses.h"
#include "text/jinja/chat_template.h"
#include "text/tokenizer/tokenizer.h"
#include "text/tool_calls/tool_call_format.h"

namespace strata {

struct ServerOptions {
  http::ServerOptions http;        // bind address, threads, timeouts, size limits
  std::string admin_api_key;       // guards /cache/*, /session/*, /flush_cache when set
  bool auto_tool_offload = false;  // offload a session whose turn ends in a tool call
  // --keep-billing-header: Claude Code's billing line stays in a Messages system prompt
  // (request/anthropic_request.h: AnthropicReadOptions).
  bool keep_billing_header = false;
  // How tool calls are read from replies (--tool-call-parser, `auto` resolved at start-up
  // from the chat template): docs/function-calling.md.
  ToolCallFormat tool_call_format = ToolCallFormat::kNone;
  // Test-only (--allow-forced-output): a request's `forced_output` text is emitted as the
  // reply, as if sampled; refused with 400 when off.
  bool allow_forced_output = false;
  std::string model_name = "strata";
  int64_t default_max_tokens = 0;  // 0: up to the context length
  // Longest prompt in tokens, in [0, the model's context length], 0: the context length.
  // A longer one is refused with 400 before the engine, its encoding stopped as soon as it
  // is known to be too long.
  int64_t max_prompt_tokens = 0;
  // Conversation records (server/conversations.h): --max-sessions, --session-ttl-s.
  int64_t max_sessions = 10'000;
  int64_t session_ttl_ms = 3'600'000;
  // Responses kept for GET /v1/responses/{id} and previous_response_id
  // (server/response_store.h): --max-stored-responses, --max-stored-responses-mb.
  int64_t max_stored_responses = 10'000;
  int64_t max_stored_response_bytes = int64_t{256} << 20;
  // What GET /server_info tells a router: the KV event sockets as bound ("" when off; a
  // wildcard host is answered as the host the router reached this server on). The role in
  // prefill/decode disaggregation comes from the engine (Engine::pd_info).
  std::string kv_events_endpoint;
  std::string kv_events_replay_endpoint;
};

struct RouteContext {
  ServerOptions options;
  Engine& engine;
  const Tokenizer& tokenizer;
  const ChatTemplate* chat;  // null: the model has no chat template
  Metrics& metrics;
  std::function<http::ServerStats()> http_stats;  // the HTTP layer's counters

  ConversationRecords& conversations;  // the exact tokens of each session_id's last turn
  ResponseStore& responses;            // stored /v1/responses answers and their turns
  CacheEventsStream& cache_events;     // GET /cache/events: the engine's KV event batches

  // How this worker reads prompts: the one reading the router shares (request/).
  PromptReader reader() const { return PromptReader(tokenizer, chat, engine.block_hasher()); }
};

// A blocking handler: runs on the HTTP worker pool (it may wait on the engine) and
// returns the whole answer.
using BlockingHandler = std::function<http::Response(const http::Request&)>;
http::Handler blocking(BlockingHandler handler);

// Guards a handler with the admin key when one is set: 401 without it.
http::Handler admin_only(const RouteContext& ctx, http::Handler handler);
bool authorized(const RouteContext& ctx, const http::Request& request);
// Anthropic's clients send the key as `x-api-key: KEY`: with it (or with Authorization),
// a /v1/messages request has the admin's rights.
bool authorized_anthropic(const RouteContext& ctx, const http::Request& request);

}  // namespace strata
