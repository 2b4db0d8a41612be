// Unicode normalization forms (UAX #15) over UTF-8, from the tables in unicode_tables.cc.
// Needed because tokenizer.json files ask for NFC (Qwen2/Qwen3) and PCRE2 does not
// normalize. Thread-safe; the lookup tables are built once on first use.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace strata::unicode {

enum class NormalizationForm { kNfc, kNfd, kNfkc, kNfkd };

// Returns `text` (valid UTF-8) in the given normalization form. Text that the quick check
// proves already normalized (e.g. all ASCII) is copied without further work.
std::string normalize(std::string_view text, NormalizationForm form);

// Canonical combining class of `cp` (0 for starters and unassigned code points).
uint8_t combining_class(char32_t cp);

// Version of the Unicode Character Database behind the tables, e.g. "15.0.0".
std::string_view unicode_version();

}  // namespace strata::unicode
