// JsonScanner: a small strict JSON reader used to pull the large parts of tokenizer.json
// (the BPE vocabulary and merges, hundreds of thousands of strings) straight into vectors
// instead of building a nlohmann::json DOM for them; everything else still goes through
// nlohmann. Loading Qwen3's tokenizer is about twice as fast this way (and much faster in
// sanitizer builds).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/result.h"

namespace strata {

class JsonScanner {
 public:
  // `text` must outlive the scanner.
  explicit JsonScanner(std::string_view text) : text_(text) {}

  // Skips whitespace and returns the next character ('\0' at the end).
  char peek();
  // Skips whitespace; consumes `c` if it comes next.
  bool consume(char c);
  Status expect(char c);

  // Reads a string value, unescaped into `out` (UTF-8).
  Status read_string(std::string& out);
  // Reads an integer value (no fraction or exponent).
  Result<int64_t> read_integer();
  // Skips any value and returns its raw text (checked for balanced brackets and
  // well-formed strings; the caller parses it if it needs it).
  Result<std::string_view> skip_value();

  bool at_end();

  // A kCorrupt error naming the byte offset.
  std::unexpected<Error> error(std::string_view what) const;

 private:
  void skip_whitespace();
  Status skip_string();

  std::string_view text_;
  size_t pos_ = 0;
};

}  // namespace strata
