// Anthropic's Messages API (POST /v1/messages, /v1/messages/count_tokens) read as the
// chat-completions request it means, so that a Messages request is rendered, tokenized,
// sampled and read for tool calls by exactly the code that serves /v1/chat/completions
// (docs/anthropic-messages.md):
//
//   Messages body -> read_anthropic_request -> chat body (OpenAI's shape: messages with
//   tool_calls and tool messages, function tools, tool_choice, stop, max_tokens, ...)
//   -> read_chat_request / parse_generation_params -> PromptReader::chat_tokens
//
// Its `cache_control` breakpoints are kept as the request cut just after each marked
// block; breakpoint_prefix_tokens renders such a cut and finds how many of the prompt's
// tokens it determines (the prefix a soft pin then holds).
//
// Everything here is a pure function of its inputs (no engine, no I/O): safe on any thread.
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"
#include "request/prompt_reader.h"

namespace strata {

// `cache_control: {"type": "ephemeral", "ttl": "5m" | "1h"}` (absent ttl: "5m").
inline constexpr int64_t kEphemeral5mTtlS = 300;
inline constexpr int64_t kEphemeral1hTtlS = 3600;
inline constexpr size_t kMaxCacheBreakpoints = 4;

// One breakpoint: the request as it stands just after the marked block, in the chat form.
struct CacheBreakpoint {
  int64_t ttl_s = kEphemeral5mTtlS;  // kEphemeral5mTtlS or kEphemeral1hTtlS
  // The chat messages through the marked block (a block inside a message keeps that
  // message's blocks through it); empty for a breakpoint on a tool.
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  // How many of the request's tools come before the cut (all of them after the tools).
  size_t num_tools = 0;
};

enum class AnthropicEndpoint {
  kMessages,     // max_tokens required
  kCountTokens,  // the prompt only: max_tokens and sampling fields are not read
};

// How a Messages body is read, the same on a worker and on a router.
struct AnthropicReadOptions {
  // Claude Code's per-conversation billing line (is_billing_header) is taken out of the
  // system prompt: it is client metadata, and at token 0 it would make every conversation's
  // prompt unique. --keep-billing-header (serve and route) turns this off.
  bool strip_billing_header = true;
};

// Whether `text` is exactly Claude Code's billing line, one system text block (or the first
// line of a string system prompt): "x-anthropic-billing-header:" then one or more
// " key=value;" fields (key: lower-case letters, digits, '_' or '-'; value: 1 to 128
// characters without ';', spaces or control characters), optional trailing spaces.
// e.g. "x-anthropic-billing-header: cc_version=2.1.197.1c0; cc_entrypoint=sdk-cli;".
bool is_billing_header(std::string_view text);

struct AnthropicRequest {
  // The chat-completions body the request means: model, messages, tools, tool_choice,
  // max_tokens, temperature, top_p, top_k, stop, stream, and Strata's own extensions when
  // given (forced_output, ignore_eos, cache_salt, seed, priority). Read it with read_chat_request
  // (GenerationPrompt::kAlways) and parse_generation_params(chat = true).
  nlohmann::ordered_json chat_body = nlohmann::ordered_json::object();
  // In the order Anthropic caches them: tools, system, messages; the automatic mode's
  // (top-level cache_control) last. At most kMaxCacheBreakpoints.
  std::vector<CacheBreakpoint> breakpoints;
  bool stream = false;
  // metadata.user_id, Anthropic's per-user field ("" when absent or empty): the request's
  // session when no x-session-id header names one (anthropic_session).
  std::string user_id;
  // The billing line that was taken out of the system prompt ("" when none).
  std::string stripped_billing_header;
};

// Reads and checks a Messages body (kInvalidArgument with a message naming the field).
// A `system` message may stand anywhere in `messages` (Claude Code's mid-conversation system
// messages): it becomes a chat `system` message where it stands (PromptReader merges it into
// the nearest user turn for a template that takes a system message only first). Refused:
// unknown content block types (image, document, thinking, ...), server tools, a fifth
// breakpoint, a bad ttl, a 1h breakpoint after a 5m one, a missing max_tokens and wrong
// types are refused. metadata.user_id is kept (a string of at most 256 characters, as
// Anthropic checks it); fields Strata has no use for (service_tier, ...) are accepted and
// ignored.
Result<AnthropicRequest> read_anthropic_request(const nlohmann::ordered_json& body,
                                                AnthropicEndpoint endpoint,
                                                const AnthropicReadOptions& options = {});

// The session of a Messages request, the key of its engine session (conversation records and
// the --auto-tool-offload of a tool_use turn, docs/tool-sessions.md) and of the router's
// stickiness: `header_session` (session_header(): x-session-id, else Claude Code's
// x-claude-code-session-id; checked: 1 to 256 bytes of UTF-8; kInvalidArgument) when given,
// else metadata.user_id, else "" (none). The Messages API has no session field;
// metadata.user_id is the per-user id Anthropic documents (Claude Code sends one per
// session), and the header is the chat route's (through the router) for any client that sets
// headers.
Result<std::string> anthropic_session(const AnthropicRequest& request,
                                      std::string_view header_session);

// How many leading tokens of `prompt` (the whole request's tokens) a breakpoint determines:
// the cut request rendered without a generation prompt (with the request's `tools` as the
// template sees them, cut to the breakpoint's, and its template arguments), tokenized, and
// compared with `prompt`; the length of the common prefix. 0 when the cut does not render
// (a template that needs a message, for a breakpoint on a tool). Tokens the template adds
// only to close the cut (an end-of-turn marker where the prompt goes on) are not counted.
size_t breakpoint_prefix_tokens(const PromptReader& reader, const nlohmann::ordered_json* tools,
                                const nlohmann::ordered_json& template_kwargs,
                                const CacheBreakpoint& breakpoint,
                                const std::vector<int32_t>& prompt);

// A breakpoint placed: how many leading prompt tokens it covers, and its TTL.
struct PlacedBreakpoint {
  size_t num_tokens = 0;
  int64_t ttl_s = kEphemeral5mTtlS;
};

// Anthropic's usage of the prompt: every prompt token is exactly one of read (served from
// the cache), creation (computed now, under a breakpoint: cached for its TTL) or input
// (computed now, after the last breakpoint). Creation is split by the TTL of the shortest
// breakpoint that covers each token.
struct CacheUsage {
  int64_t input_tokens = 0;
  int64_t cache_read_input_tokens = 0;
  int64_t cache_creation_input_tokens = 0;
  int64_t ephemeral_5m_input_tokens = 0;
  int64_t ephemeral_1h_input_tokens = 0;
};
CacheUsage cache_usage(int64_t prompt_tokens, int64_t cached_tokens,
                       std::vector<PlacedBreakpoint> breakpoints);

}  // namespace strata
