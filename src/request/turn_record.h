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
  size_t num_messages = 0;      // messages that produced `tokens`' prompt
  std::vector<int32_t> tokens;  // prompt + generated + the stop token
  std::string stop_text;        // the stop token's text
  std::string completion_text;  // the generated text (no stop token)
  std::string cache_salt;
};

// The header that asks for a turn's record, and the answer's field (or stream event) that
// carries it.
inline constexpr std::string_view kTurnRecordHeader = "x-strata-turn-record";
inline constexpr std::string_view kTurnRecordField = "strata_turn_record";

// The tokens of `messages` (normalized, as ChatRequest::messages) continuing `record`:
// the record's tokens, then the template's rendering after the recorded assistant turn
// (ChatTemplate::render_continuation), encoded within `max_tokens` (0: no limit). Nullopt
// where the worker renders the whole conversation instead: a different cache_salt, a
// conversation that does not extend the record (no new message after the assistant turn,
// or an assistant turn that does not echo the tail of what was generated: an edited turn),
// a template that cannot continue, or a continuation longer than max_tokens alone.
std::optional<std::vector<int32_t>> continue_turn(
    const PromptReader& reader, const nlohmann::ordered_json& messages,
    const nlohmann::ordered_json* tools, const nlohmann::ordered_json& template_kwargs,
    std::string_view cache_salt, const ConversationRecord& record, size_t max_tokens);

// The record as the extension field carries it, and read back. read_turn_record refuses
// (kInvalidArgument) anything but an object with `num_messages` (>= 0), `tokens` (an array
// of int32), `stop_text`, `completion_text` and `cache_salt` (strings).
nlohmann::json turn_record_json(const ConversationRecord& record);
Result<ConversationRecord> read_turn_record(const nlohmann::json& field);

}  // namespace strata
