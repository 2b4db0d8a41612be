// Renders and tokenizes prompts as a worker does, for the worker and for the router
// (request/chat_request.h says why there is one reading). Holds references to a tokenizer
// and a chat template that outlive it; both are immutable, so a PromptReader may be used
// from any number of threads.
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cache/block_hash.h"
#include "common/result.h"
#include "request/chat_request.h"
#include "text/jinja/chat_template.h"
#include "text/tokenizer/tokenizer.h"

namespace strata {

class PromptReader {
 public:
  // `chat` may be null: the model has no chat template (chat prompts are then refused).
  // `hasher` names blocks as the cache whose blocks this reading targets does (a worker's:
  // Engine::block_hasher(); the router's own index: Strata's).
  PromptReader(const Tokenizer& tokenizer, const ChatTemplate* chat, BlockHasher hasher = {})
      : tokenizer_(tokenizer), chat_(chat), hasher_(hasher) {}

  const Tokenizer& tokenizer() const { return tokenizer_; }
  const ChatTemplate* chat() const { return chat_; }
  const BlockHasher& block_hasher() const { return hasher_; }

  ChatRenderOptions render_options(const nlohmann::ordered_json* tools, bool add_generation_prompt,
                                   const nlohmann::ordered_json& template_kwargs) const;

  // Renders and tokenizes messages into ids; the template writes the special tokens
  // itself (as transformers' apply_chat_template). Messages with tool calls are
  // normalized first (normalize_tool_call_messages, on a copy). A template that refuses
  // the messages while a system message stands after the first one (many take a system
  // message only first) renders them again with those merged into the nearest user turn
  // (merge_late_system_messages). With `max_tokens` > 0,
  // kResourceExhausted as soon as the ids are known to exceed it (the encoding stops
  // there). `rendered`, when given, is called between rendering and tokenizing (timing).
  Result<std::vector<int32_t>> chat_tokens(const nlohmann::ordered_json& messages,
                                           const nlohmann::ordered_json* tools,
                                           bool add_generation_prompt,
                                           const nlohmann::ordered_json& template_kwargs,
                                           size_t max_tokens = 0,
                                           const std::function<void()>& rendered = {}) const;
  Result<std::vector<int32_t>> chat_tokens(const ChatRequest& request, size_t max_tokens = 0,
                                           const std::function<void()>& rendered = {}) const;

  // A text prompt's ids (/v1/completions: add_special_tokens true), within `max_tokens`
  // as above.
  Result<std::vector<int32_t>> text_tokens(std::string_view text, bool add_special_tokens,
                                           size_t max_tokens = 0) const;

 private:
  const Tokenizer& tokenizer_;
  const ChatTemplate* chat_;
  BlockHasher hasher_;
};

// `messages` with every system message after the first non-system message merged into the
// nearest user message without crossing another turn: appended to the user message just
// before it (a blank line between), else prepended to the next user message; with neither it
// becomes a user message where it stands. Leading system messages stay. For templates that take a
// system message only first (they raise otherwise); docs/chat-templates.md.
nlohmann::ordered_json merge_late_system_messages(const nlohmann::ordered_json& messages);

// What a /cache/pin, /cache/unpin or /cache/evict body names: exactly one of
// block_hashes, token_ids or messages (rendered with tools, chat_template_kwargs and
// add_generation_prompt, false by default), and an optional cache_salt.
struct CacheTarget {
  std::optional<std::vector<BlockHash>> block_hashes;  // the block_hashes form, as given
  std::vector<int32_t> tokens;                         // the token_ids or messages form
  std::string cache_salt;
  BlockHasher hasher;  // the reader's
  // The blocks' hashes at a page size: block_hashes as given, else the full blocks of
  // `tokens` hashed with the salt by the reader's hasher.
  std::vector<BlockHash> hashes(int page_size) const;
};
Result<CacheTarget> read_cache_target(nlohmann::ordered_json body, const PromptReader& reader);

}  // namespace strata
