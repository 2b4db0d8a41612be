// Unicode tables generated from V8 (see tests/text/jinja/gen_unicode_tables.mjs): the case
// mappings of String.prototype.toUpperCase/toLowerCase and the properties that the final-sigma
// rule of toLowerCase needs. Internal to the Jinja engine; use unicode.h.
#pragma once

#include <cstddef>
#include <cstdint>

namespace strata::jinja::unicode {

// Code points start + k * stride (k < count) map to themselves + delta.
struct CaseRun {
  uint32_t start;
  uint16_t count;
  uint8_t stride;
  int32_t delta;
};

// A code point whose mapping is several code points (e.g. U+00DF -> "SS"); unused slots are 0.
struct CaseSpecial {
  uint32_t code_point;
  uint32_t mapped[3];
};

// An inclusive range of code points.
struct CodePointRange {
  uint32_t first;
  uint32_t last;
};

// All tables are sorted by code point and their entries never overlap.
extern const CaseRun kUpperRuns[];
extern const size_t kNumUpperRuns;
extern const CaseSpecial kUpperSpecial[];
extern const size_t kNumUpperSpecial;
extern const CaseRun kLowerRuns[];
extern const size_t kNumLowerRuns;
extern const CaseSpecial kLowerSpecial[];
extern const size_t kNumLowerSpecial;
extern const CodePointRange kCasedRanges[];
extern const size_t kNumCasedRanges;
extern const CodePointRange kCaseIgnorableRanges[];
extern const size_t kNumCaseIgnorableRanges;

}  // namespace strata::jinja::unicode
