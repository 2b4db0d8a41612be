// Tokenizer: a Hugging Face tokenizer folder (tokenizer.json, tokenizer_config.json,
// generation_config.json) loaded into an encoder/decoder whose output equals that of the
// reference implementation, the npm package @lenml/tokenizers (a port of Hugging Face
// tokenizers; see docs/tokenizer.md for what is supported and how exactness is verified).
//
// Encoding pipeline (per call): invalid UTF-8 is replaced by U+FFFD (WHATWG rule, what
// the reference sees when the same bytes are decoded into a JS string); added tokens are
// split out of the raw text; each remaining section is normalized, pre-tokenized and BPE
// encoded; the post-processor adds BOS/EOS when add_special_tokens is on.
//
// Memory: a call holds at most a few copies of its text (sanitized, normalized) and its
// ids; pieces stream from the pre-tokenizer to BPE one at a time, and BPE's scratch for a
// long word is freed after it, so nothing grows with the input after the call returns
// (the bounded result cache aside). Time is linear in the text for the supported models.
//
// Thread-safe: after load every method is const and may be called concurrently.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/result.h"
#include "text/tokenizer/bpe_model.h"
#include "text/tokenizer/decoder.h"

namespace strata {

struct EncodeOptions {
  // Add the special tokens of the post-processor (e.g. Llama 2's BOS). When tokenizer.json
  // has no TemplateProcessing, tokenizer_config.json's add_bos_token / add_eos_token
  // decide instead (see docs/tokenizer.md).
  bool add_special_tokens = true;
  // When > 0: fail with kResourceExhausted as soon as the ids are known to number more than
  // this (special tokens included), without encoding the rest of the text. A piece's ids
  // are bounded below by its bytes / the longest token's, so even one long word is refused
  // before BPE runs on it (BpeModel::min_ids).
  size_t max_tokens = 0;
};

struct DecodeOptions {
  // Drop special tokens (added tokens marked special, additional_special_tokens).
  bool skip_special_tokens = false;
  // Override tokenizer_config.json's clean_up_tokenization_spaces (default there: true).
  std::optional<bool> clean_up_tokenization_spaces;
};

// Special token strings of tokenizer_config.json, as chat templates receive them.
struct SpecialTokenStrings {
  std::optional<std::string> bos_token;
  std::optional<std::string> eos_token;
  std::optional<std::string> unk_token;
  std::optional<std::string> sep_token;
  std::optional<std::string> pad_token;
  std::optional<std::string> cls_token;
  std::optional<std::string> mask_token;
  std::vector<std::string> additional_special_tokens;
};

class Tokenizer {
 public:
  // Loads `dir`/tokenizer.json (required), tokenizer_config.json and
  // generation_config.json (optional). Errors name the file and the offending field.
  static Result<std::unique_ptr<Tokenizer>> load(const std::filesystem::path& dir);

  // Same from file contents (empty config strings mean "file absent").
  static Result<std::unique_ptr<Tokenizer>> from_json_text(std::string_view tokenizer_json,
                                                           std::string_view tokenizer_config_json,
                                                           std::string_view generation_config_json);

  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Token ids of `text` (any bytes; invalid UTF-8 is replaced by U+FFFD first).
  Result<std::vector<TokenId>> encode(std::string_view text, EncodeOptions options = {}) const;

  // Text of `ids`; fails with kInvalidArgument for an id that has no token.
  Result<std::string> decode(std::span<const TokenId> ids, DecodeOptions options = {}) const;

  // An incremental decoder for one generated sequence; the Tokenizer must outlive it. The
  // concatenation of its pieces equals decode() of all ids with the same options.
  StreamDecoder stream_decoder(DecodeOptions options = {}) const;

  // Empties the BPE result cache (it only speeds up encoding; benchmarks use this to
  // measure encoding without it).
  void clear_cache() const;

  // Number of token ids: the largest id of the vocabulary or added tokens, plus one.
  size_t vocab_size() const { return decoder_vocab_.tokens.size(); }
  // Id of a token string as written in tokenizer.json (byte-level strings for GPT-2 style
  // vocabularies, e.g. "Ġhello"), or of an added token.
  std::optional<TokenId> token_to_id(std::string_view token) const;
  std::optional<std::string_view> id_to_token(TokenId id) const;

  std::optional<TokenId> bos_id() const { return bos_id_; }
  // Every end-of-sequence id: tokenizer_config.json's eos_token, then
  // generation_config.json's eos_token_id (one or a list), without duplicates.
  const std::vector<TokenId>& eos_ids() const { return eos_ids_; }
  std::optional<TokenId> pad_id() const { return pad_id_; }
  // True for added tokens marked special and additional_special_tokens.
  bool is_special(TokenId id) const;

  const SpecialTokenStrings& special_token_strings() const { return special_strings_; }
  // tokenizer_config.json's add_bos_token / add_eos_token when present.
  std::optional<bool> add_bos_token() const { return add_bos_token_; }
  std::optional<bool> add_eos_token() const { return add_eos_token_; }

  // The chat template: the string form, or for a list of named templates "tool_use" when
  // `with_tools` and present, else "default". nullopt when there is none.
  std::optional<std::string_view> chat_template(bool with_tools = false) const;
  // All named templates (a single string template is named "default").
  const std::vector<std::pair<std::string, std::string>>& chat_templates() const {
    return chat_templates_;
  }

 private:
  struct Impl;
  Tokenizer();

  // Appends the ids of `text` to `out`; with max_tokens > 0 it stops and fails with
  // kResourceExhausted once they are known to exceed it.
  Status encode_text(std::string_view text, size_t max_tokens, std::vector<TokenId>& out) const;
  void post_process(std::vector<TokenId>& ids, bool add_special_tokens) const;

  std::unique_ptr<Impl> impl_;
  DecoderVocab decoder_vocab_;
  std::optional<TokenId> bos_id_;
  std::vector<TokenId> eos_ids_;
  std::optional<TokenId> pad_id_;
  SpecialTokenStrings special_strings_;
  std::optional<bool> add_bos_token_;
  std::optional<bool> add_eos_token_;
  std::vector<std::pair<std::string, std::string>> chat_templates_;
  bool chat_template_is_list_ = false;
};

}  // namespace strata
