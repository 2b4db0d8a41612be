// Decoding token ids back to text: the tokenizer.json "decoder" section with the
// reference's semantics, run as a streaming machine so that incremental decoding and
// whole-sequence decoding are the same code.
//
// Supported decoder chains (after flattening Sequence):
//   [per-token steps...] [ByteLevel | ByteFallback] [Fuse] [Strip...]
// where per-token steps are Replace, Strip and Metaspace. This covers Qwen2/Qwen3,
// Llama 3, GPT-2 (ByteLevel), Llama 2 / Mistral / TinyLlama / Gemma (Replace,
// ByteFallback, Fuse, Strip) and Metaspace decoders. Other shapes are refused at load
// with kUnsupported. Then, when tokenizer_config.json's clean_up_tokenization_spaces is on
// (the reference's default), the reference's clean-up of spaces before punctuation runs.
//
// Streaming never emits a broken UTF-8 sequence or text that a later token could change:
// bytes of an incomplete character, trailing characters a final Strip may remove, and the
// last few characters around a space (clean-up) are held back until they are final, so
// the concatenation of all pieces equals the decode of all ids.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "common/result.h"
#include "text/tokenizer/bpe_model.h"
#include "text/tokenizer/pattern.h"
#include "text/tokenizer/utf8.h"

namespace strata {

// Per-id data the decoder reads, built by the Tokenizer.
struct DecoderVocab {
  static constexpr uint8_t kAssigned = 1;   // the id has a token
  static constexpr uint8_t kSkippable = 2;  // dropped when skip_special_tokens is on
  std::vector<std::string> tokens;          // token string as in tokenizer.json
  std::vector<uint8_t> flags;
  std::unordered_set<std::string, StringHash, std::equal_to<>> added_contents;
};

class DecodePipeline {
 public:
  // Builds from the "decoder" value (null: tokens joined with a space, as the reference).
  static Result<DecodePipeline> from_json(const nlohmann::json& decoder);

 private:
  friend class StreamDecoder;
  enum class StepKind { kReplace, kStrip, kMetaspace };
  struct TokenStep {
    StepKind kind = StepKind::kReplace;
    std::optional<Pattern> pattern;  // Replace
    std::string content;             // Replace: replacement; Metaspace: replacement char
    char32_t strip_char = 0;         // Strip: the character (0: never matches)
    int strip_start = 0;
    int strip_stop = 0;
    bool add_prefix_space = false;  // Metaspace
  };
  struct StripStep {
    char32_t strip_char = 0;
    int start = 0;
    int stop = 0;
  };
  enum class Grouping { kNone, kByteFallback, kByteLevel };

  static Status add_step(const nlohmann::json& config, DecodePipeline& p, int& phase);

  std::vector<TokenStep> token_steps_;
  Grouping grouping_ = Grouping::kNone;
  std::vector<StripStep> final_strips_;
  bool join_with_space_ = false;
};

// Incremental decoder for one sequence. Holds pointers to the pipeline and vocabulary of
// its Tokenizer, which must outlive it. Not thread-safe (one per stream).
class StreamDecoder {
 public:
  StreamDecoder(const DecodePipeline& pipeline, const DecoderVocab& vocab, bool skip_special_tokens,
                bool clean_up_spaces);

  // Feeds one id and appends the text that became final to `out`. Fails (and changes
  // nothing) for an id without a token.
  Status push(TokenId id, std::string& out);
  Result<std::string> push(TokenId id) {
    std::string out;
    if (auto st = push(id, out); !st) return std::unexpected(st.error());
    return out;
  }

  // Ends the stream, appending whatever was held back. The decoder is then reset.
  void finish(std::string& out);
  std::string finish() {
    std::string out;
    finish(out);
    return out;
  }

 private:
  struct StripState {
    int leading_left = 0;  // leading strip characters that may still be removed
    int held = 0;          // trailing strip characters held back
  };

  void reset();
  void emit_text(std::string_view text, std::string& out);
  void emit_group_output(std::string_view text, std::string& out);
  void apply_strips(std::string_view text, size_t first_strip, std::string& out);
  void apply_cleanup(std::string_view text, bool final, std::string& out);

  const DecodePipeline* pipeline_;
  const DecoderVocab* vocab_;
  bool skip_special_tokens_;
  bool clean_up_spaces_;

  bool first_token_ = true;
  utf8::Decoder utf8_;
  bool group_open_ = false;        // ByteFallback: inside a run of byte tokens
  bool group_first_char_ = false;  // ByteFallback: no output yet in this run (BOM rule)
  std::vector<StripState> strips_;
  std::string cleanup_pending_;
  std::string scratch_;
};

// The reference's clean_up_tokenization: removes the space before . ? ! , and English
// contractions. Exposed for tests.
std::string clean_up_tokenization(std::string_view text);

}  // namespace strata
