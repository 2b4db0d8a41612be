// PreTokenizer: the tokenizer.json "pre_tokenizer" section, which cuts a normalized text
// section into the pieces ("words") that the BPE model encodes one by one. Semantics are
// those of the reference (@lenml/tokenizers): Split (regex or string; invert, "Removed",
// otherwise isolated), ByteLevel (optional GPT-2 regex and prefix space), Metaspace,
// Digits, Whitespace, WhitespaceSplit, Punctuation and Sequence.
//
// A ByteLevel step does not rewrite pieces into GPT-2's byte alphabet: it marks the
// pre-tokenizer byte-level, and the BPE model then works on raw bytes with a vocabulary
// converted from the alphabet at load. That is why ByteLevel must be the last step.
#pragma once

#include <deque>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "common/result.h"
#include "model/tokenizer/pattern.h"

namespace strata {

// Pieces of one text section. Views point into the section text or into `storage`.
struct PieceList {
  std::vector<std::string_view> pieces;
  std::deque<std::string> storage;

  void clear() {
    pieces.clear();
    storage.clear();
  }
  std::string_view own(std::string text) {
    storage.push_back(std::move(text));
    return storage.back();
  }
};

class PreTokenizer {
 public:
  // Builds from the "pre_tokenizer" value; null keeps each section as one piece.
  static Result<PreTokenizer> from_json(const nlohmann::json& config);

  // The Metaspace pre-tokenizer that the reference's LlamaTokenizer installs when
  // tokenizer_config.json sets "legacy": false (replacement "▁", prefix on the first
  // section only).
  static PreTokenizer llama_non_legacy();

  // True when the pieces are byte-level (GPT-2 alphabet) for the model.
  bool byte_level() const { return byte_level_; }

  // Appends the pieces of `text` (valid UTF-8, non-empty) to `out`. `section_index` is the
  // index of the section among the added-token split (Metaspace's prepend_scheme "first").
  Status pre_tokenize(std::string_view text, int section_index, PieceList& out) const;

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
  Status apply(const Step& step, std::string_view piece, int section_index,
               std::vector<std::string_view>& out, PieceList& storage) const;

  std::vector<Step> steps_;
  bool byte_level_ = false;
};

}  // namespace strata
