// Normalizer: the tokenizer.json "normalizer" section, applied to each text section
// between added tokens before pre-tokenization. Supported (with the reference's
// semantics): NFC, NFD, NFKC, NFKD, Prepend, Replace, Strip, StripAccents and Sequence.
// Lowercase, BertNormalizer and Precompiled are refused at load with kUnsupported.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "common/result.h"
#include "text/tokenizer/pattern.h"
#include "text/tokenizer/unicode_normalize.h"

namespace strata {

class Normalizer {
 public:
  // Builds from the "normalizer" value (null gives the identity).
  static Result<Normalizer> from_json(const nlohmann::json& config);

  bool is_identity() const { return steps_.empty(); }

  // Normalizes `text` (valid UTF-8) into `out`.
  Status normalize(std::string_view text, std::string& out) const;

 private:
  enum class Kind { kUnicode, kPrepend, kReplace, kStrip, kStripAccents };
  struct Step {
    Kind kind = Kind::kUnicode;
    unicode::NormalizationForm form = unicode::NormalizationForm::kNfc;
    std::string text;                // Prepend: prefix; Replace: content
    std::optional<Pattern> pattern;  // Replace, StripAccents
    bool strip_left = false;
    bool strip_right = false;
  };

  static Status add_steps(const nlohmann::json& config, std::vector<Step>& steps);

  std::vector<Step> steps_;
};

}  // namespace strata
