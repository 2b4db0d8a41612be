// PreTokenizer: the tokenizer.json "pre_tokenizer" section, which cuts a normalized text
// section into the pieces ("words") that the BPE model encodes one by one. Semantics are
// those of the reference (@lenml/tokenizers): Split (regex or string; invert, "Removed",
// otherwise isolated), ByteLevel (optional GPT-2 regex and prefix space), Metaspace,
// Digits, Whitespace, WhitespaceSplit, Punctuation and Sequence.
//
// Pieces are streamed (depth first through the steps) rather than collected: a 10 MB
// section of digits is 10 million pieces, and lists of them cost hundreds of megabytes.
//
// A ByteLevel step does not rewrite pieces into GPT-2's byte alphabet: it marks the
// pre-tokenizer byte-level, and the BPE model then works on raw bytes with a vocabulary
// converted from the alphabet at load. That is why ByteLevel must be the last step.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "common/result.h"
#include "text/tokenizer/pattern.h"

namespace strata {

// U+2581, the character that stands for a space in SentencePiece vocabularies (the
// Metaspace pre-tokenizer's replacement).
inline constexpr std::string_view kMetaspaceChar = "\xE2\x96\x81";

class PreTokenizer {
 public:
  // Receives the pieces of a section in order; returns false to stop pre-tokenizing. A
  // piece's view is valid only during the call (Metaspace and a ByteLevel prefix make
  // pieces that live in a scratch string).
  using PieceSink = std::function<bool(std::string_view piece)>;

  // Builds from the "pre_tokenizer" value; null keeps each section as one piece.
  static Result<PreTokenizer> from_json(const nlohmann::json& config);

  // The Metaspace pre-tokenizer that the reference's LlamaTokenizer installs when
  // tokenizer_config.json sets "legacy": false (replacement "▁", prefix on the first
  // section only).
  static PreTokenizer llama_non_legacy();

  // True when the pieces are byte-level (GPT-2 alphabet) for the model.
  bool byte_level() const { return byte_level_; }

  // Hands the pieces of `text` (valid UTF-8, non-empty) to `sink`, one at a time: each
  // step's pieces go through the next step as they are found, so memory does not grow
  // with the number of pieces. `section_index` is the index of the section among the
  // added-token split (Metaspace's prepend_scheme "first"). Returns false when the sink
  // stopped.
  Result<bool> pre_tokenize(std::string_view text, int section_index, const PieceSink& sink) const;

 private:
  enum class Kind { kSplitMatch, kSplitRemoved, kSplitIsolated, kByteLevel, kMetaspace };
  struct Step {
    Kind kind = Kind::kSplitIsolated;
    std::optional<Pattern> pattern;   // Split kinds; ByteLevel with use_regex
    bool add_prefix_space = false;    // ByteLevel, Metaspace
    std::string replacement;          // Metaspace
    std::string str_rep;              // Metaspace
    bool prepend_first_only = false;  // Metaspace prepend_scheme "first"
    bool prepend_never = false;       // Metaspace prepend_scheme "never"
  };

  static Status add_steps(const nlohmann::json& config, std::vector<Step>& steps);
  // Applies steps_[step] and the steps after it to `piece`, handing the final pieces to
  // `sink`; false when the sink stopped.
  Result<bool> apply(size_t step, std::string_view piece, int section_index,
                     const PieceSink& sink) const;

  std::vector<Step> steps_;
  bool byte_level_ = false;
};

}  // namespace strata
