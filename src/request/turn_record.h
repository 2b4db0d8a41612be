// A conversation's exact tokens, continued instead of re-rendered (docs/sessions.md), for
// the worker that keeps them and for the router that predicts its cache from them.
//
// A worker records the exact tokens of a turn — its prompt, what the model generated and
// the stop token — for a `session_id` (server/conversations.h) and for a stored Responses
// answer (server/response_store.h). The next turn continues those tokens: re-rendering
// would drop what the template strips from earlier turns (Qwen3's <think> blocks), and with
// it the cached prefix. continue_turn() is that continuation, the one reading that the
// worker runs and that the router runs on the record the worker gave it (below), so that
// the router predicts the prompt the worker will compute, token for token.
//
// The extension the router asks for. A request with the header `x-strata-turn-record: 1`
// gets the turn's record in its answer: a top-level `strata_turn_record` field of the JSON
// answer, or, in a stream, one event of its own (`data: {"strata_turn_record": ...}`)
// before the stream's end; `null` when the turn left no record (the worker forgot the
// session's). The router asks for it on every turn it routes with a session or a stored
// response, keeps what it gets (router/turn_records.h) and strips it from the answer,
// unless the client asked for it itself.
//
// Pure functions of their inputs (no engine, no I/O): safe on any thread.
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

struct ConversationRecord {
  size_t num_messages = 0;  // messages that produced `tokens`' prompt
  // conversation_digest of those messages (with the tools and template arguments): a next
  // turn continues the record only when its first num_messages messages are these.
  uint64_t digest = 0;
  std::vector<int32_t> tokens;  // prompt + generated + the stop token
  std::string stop_text;        // the stop token's text
  std::string completion_text;  // the generated text (no stop token)
  std::string cache_salt;
};

// The header that asks for a turn's record, and the answer's field (or stream event) that
// carries it.
inline constexpr std::string_view kTurnRecordHeader = "x-strata-turn-record";
inline constexpr std::string_view kTurnRecordField = "strata_turn_record";

// The headers that name a request's session: Strata's own, and Claude Code's (it sends one
// per conversation, its side requests included). session_header() picks the first given.
inline constexpr std::string_view kSessionHeader = "x-session-id";
inline constexpr std::string_view kClaudeCodeSessionHeader = "x-claude-code-session-id";
inline std::string_view session_header(std::string_view x_session_id,
                                       std::string_view claude_code_session_id) {
  return !x_session_id.empty() ? x_session_id : claude_code_session_id;
}

// The one rule for a session id, wherever it comes from (a body's session_id, the session
// headers, a Responses prompt_cache_key, the /session/* and /cache/* routes of workers and
// router): 1 to kMaxSessionIdBytes bytes of valid UTF-8. kInvalidArgument "'<what>' must be
// 1 to 256 bytes of valid UTF-8" otherwise.
inline constexpr size_t kMaxSessionIdBytes = 256;
Status check_session_id(std::string_view id, std::string_view what);

// A conversation's identity for its exact tokens. One session key (a session_id, a
// Responses prompt_cache_key, Claude Code's session) may carry several conversations at
// once: an agent's title or summary requests, a sub-agent's turns, another user sharing a
// key. A record is kept per key and conversation *root* (its tools, template arguments and
// leading system messages: record_key), so that a side request does not replace the main
// conversation's record, and is continued only by a request whose first num_messages
// messages are the recorded ones (the digest), so that no conversation continues another's
// tokens. XXH3-64 over the compact JSON text: the same in every process.
uint64_t conversation_digest(const nlohmann::ordered_json& messages, size_t num_messages,
                             const nlohmann::ordered_json* tools,
                             const nlohmann::ordered_json& template_kwargs);
uint64_t conversation_root(const nlohmann::ordered_json& messages,
                           const nlohmann::ordered_json* tools,
                           const nlohmann::ordered_json& template_kwargs);
// The key a session's record of one conversation root is kept under: "<session>#<root hex>".
std::string record_key(std::string_view session, uint64_t root);

// The tokens of `messages` (normalized, as ChatRequest::messages) continuing `record`:
// the record's tokens, then the template's rendering after the recorded assistant turn
// (ChatTemplate::render_continuation), encoded within `max_tokens` (0: no limit). A turn
// the model ended with another stop token than the template's end of turn (Qwen3's
// <|endoftext|> for its <|im_end|>) is closed with the tokenizer's eos_token instead. Nullopt
// where the worker renders the whole conversation instead: a different cache_salt, a
// conversation that does not extend the record (other first messages, tools or template
// arguments than the record's digest; no new message after the assistant turn,
// or an assistant turn that does not echo the tail of what was generated: an edited turn),
// a template that cannot continue, or a continuation longer than max_tokens alone.
std::optional<std::vector<int32_t>> continue_turn(
    const PromptReader& reader, const nlohmann::ordered_json& messages,
    const nlohmann::ordered_json* tools, const nlohmann::ordered_json& template_kwargs,
    std::string_view cache_salt, const ConversationRecord& record, size_t max_tokens);

// The record as the extension field carries it, and read back. read_turn_record refuses
// (kInvalidArgument) anything but an object with `num_messages` (>= 0), `tokens` (an array
// of int32), `stop_text`, `completion_text`, `cache_salt` (strings) and `digest` (16 hex
// digits).
nlohmann::json turn_record_json(const ConversationRecord& record);
Result<ConversationRecord> read_turn_record(const nlohmann::json& field);

}  // namespace strata
