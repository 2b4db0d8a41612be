#include "text/tokenizer/unicode_normalize.h"

#include <algorithm>
#include <array>
#include <cstddef>
#include <unordered_map>
#include <vector>

#include "text/tokenizer/unicode_tables.h"
#include "text/tokenizer/utf8.h"

namespace strata::unicode {
namespace {

using unicode_data::kCanonicalDecompCount;
using unicode_data::kCompatDecompCount;

constexpr char32_t kMaxCodePoint = 0x10FFFF;
constexpr int kBlockBits = 7;
constexpr size_t kBlockSize = size_t{1} << kBlockBits;

// Hangul syllable arithmetic (Unicode chapter 3.12).
constexpr char32_t kSBase = 0xAC00;
constexpr char32_t kLBase = 0x1100;
constexpr char32_t kVBase = 0x1161;
constexpr char32_t kTBase = 0x11A7;
constexpr char32_t kLCount = 19;
constexpr char32_t kVCount = 21;
constexpr char32_t kTCount = 28;
constexpr char32_t kNCount = kVCount * kTCount;
constexpr char32_t kSCount = kLCount * kNCount;

struct Props {
  uint8_t ccc = 0;
  uint8_t flags = 0;
};

// Two-level lookup table over all code points plus the composition map, built once from
// the compact run list in unicode_tables.cc.
struct Tables {
  std::vector<uint16_t> stage1;  // block index per 128 code points
  std::vector<Props> stage2;     // kBlockSize entries per distinct block
  std::unordered_map<uint64_t, char32_t> compositions;

  Props props(char32_t cp) const {
    if (cp > kMaxCodePoint) return {};
    return stage2[static_cast<size_t>(stage1[cp >> kBlockBits]) * kBlockSize +
                  (cp & (kBlockSize - 1))];
  }
};

Tables build_tables() {
  Tables t;
  const size_t num_blocks = (kMaxCodePoint + 1) / kBlockSize;
  t.stage1.assign(num_blocks, 0);
  t.stage2.assign(kBlockSize, Props{});  // block 0: all zero
  std::vector<Props> block(kBlockSize);
  size_t run = 0;
  for (size_t b = 0; b < num_blocks; ++b) {
    const char32_t first = static_cast<char32_t>(b * kBlockSize);
    const char32_t last = first + kBlockSize - 1;
    while (run < unicode_data::kPropertyRunCount && unicode_data::kPropertyRuns[run].last < first) {
      ++run;
    }
    if (run == unicode_data::kPropertyRunCount || unicode_data::kPropertyRuns[run].first > last) {
      continue;  // stays block 0
    }
    std::fill(block.begin(), block.end(), Props{});
    for (size_t r = run;
         r < unicode_data::kPropertyRunCount && unicode_data::kPropertyRuns[r].first <= last; ++r) {
      const auto& pr = unicode_data::kPropertyRuns[r];
      const char32_t lo = std::max<char32_t>(pr.first, first);
      const char32_t hi = std::min<char32_t>(pr.last, last);
      for (char32_t cp = lo; cp <= hi; ++cp) block[cp - first] = Props{pr.ccc, pr.flags};
    }
    t.stage1[b] = static_cast<uint16_t>(t.stage2.size() / kBlockSize);
    t.stage2.insert(t.stage2.end(), block.begin(), block.end());
  }
  t.compositions.reserve(unicode_data::kCompositionCount * 2);
  for (size_t i = 0; i < unicode_data::kCompositionCount; ++i) {
    const auto& c = unicode_data::kCompositions[i];
    t.compositions.emplace((uint64_t{c.first} << 32) | c.second, c.composite);
  }
  return t;
}

const Tables& tables() {
  static const Tables t = build_tables();
  return t;
}

uint8_t quick_check_bit(NormalizationForm form) {
  switch (form) {
    case NormalizationForm::kNfc:
      return unicode_data::kNfcQcNotYes;
    case NormalizationForm::kNfd:
      return unicode_data::kNfdQcNo;
    case NormalizationForm::kNfkc:
      return unicode_data::kNfkcQcNotYes;
    case NormalizationForm::kNfkd:
      return unicode_data::kNfkdQcNo;
  }
  return 0;
}

bool composes(NormalizationForm form) {
  return form == NormalizationForm::kNfc || form == NormalizationForm::kNfkc;
}

bool compatibility(NormalizationForm form) {
  return form == NormalizationForm::kNfkc || form == NormalizationForm::kNfkd;
}

// UAX #15 quick check: true when `text` is certainly in `form` already.
bool quick_check_yes(const Tables& t, std::string_view text, NormalizationForm form) {
  const uint8_t bit = quick_check_bit(form);
  uint8_t last_ccc = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    if (static_cast<uint8_t>(text[pos]) < 0x80) {
      ++pos;
      last_ccc = 0;
      continue;
    }
    const char32_t cp = utf8::decode_valid(text, pos);
    const Props p = t.props(cp);
    if (p.ccc != 0 && last_ccc > p.ccc) return false;
    if (p.flags & bit) return false;
    last_ccc = p.ccc;
  }
  return true;
}

void decompose(const Tables& t, char32_t cp, bool compat, std::vector<char32_t>& out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const char32_t s = cp - kSBase;
    out.push_back(kLBase + s / kNCount);
    out.push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount != 0) out.push_back(kTBase + s % kTCount);
    return;
  }
  const uint8_t bit = compat ? unicode_data::kNfkdQcNo : unicode_data::kNfdQcNo;
  if ((t.props(cp).flags & bit) == 0) {
    out.push_back(cp);
    return;
  }
  const uint32_t* keys =
      compat ? unicode_data::kCompatDecompKeys : unicode_data::kCanonicalDecompKeys;
  const size_t count = compat ? kCompatDecompCount : kCanonicalDecompCount;
  const uint32_t* it = std::lower_bound(keys, keys + count, static_cast<uint32_t>(cp));
  if (it == keys + count || *it != cp) {
    out.push_back(cp);
    return;
  }
  const size_t i = static_cast<size_t>(it - keys);
  const uint32_t* offsets =
      compat ? unicode_data::kCompatDecompOffsets : unicode_data::kCanonicalDecompOffsets;
  const uint32_t* data =
      compat ? unicode_data::kCompatDecompData : unicode_data::kCanonicalDecompData;
  for (uint32_t k = offsets[i]; k < offsets[i + 1]; ++k) out.push_back(data[k]);
}

// Canonical ordering: stable sort of every run of non-starters by combining class.
void canonical_order(const Tables& t, std::vector<char32_t>& cps) {
  const size_t n = cps.size();
  size_t i = 0;
  while (i < n) {
    if (t.props(cps[i]).ccc == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < n && t.props(cps[j]).ccc != 0) ++j;
    if (j - i > 1) {
      std::stable_sort(cps.begin() + static_cast<ptrdiff_t>(i),
                       cps.begin() + static_cast<ptrdiff_t>(j),
                       [&](char32_t a, char32_t b) { return t.props(a).ccc < t.props(b).ccc; });
    }
    i = j;
  }
}

// Primary composite of (first, second), or 0 when the pair does not compose.
char32_t compose_pair(const Tables& t, char32_t first, char32_t second) {
  if (first >= kLBase && first < kLBase + kLCount && second >= kVBase &&
      second < kVBase + kVCount) {
    return kSBase + ((first - kLBase) * kVCount + (second - kVBase)) * kTCount;
  }
  if (first >= kSBase && first < kSBase + kSCount && (first - kSBase) % kTCount == 0 &&
      second > kTBase && second < kTBase + kTCount) {
    return first + (second - kTBase);
  }
  const auto it = t.compositions.find((uint64_t{first} << 32) | second);
  return it == t.compositions.end() ? 0 : it->second;
}

// Canonical composition (UAX #15 section 3.11 "Canonical Composition Algorithm").
void compose(const Tables& t, std::vector<char32_t>& cps) {
  size_t out = 0;
  ptrdiff_t starter = -1;
  uint8_t last_ccc = 0;
  for (size_t i = 0; i < cps.size(); ++i) {
    const char32_t cp = cps[i];
    const uint8_t ccc = t.props(cp).ccc;
    if (starter >= 0) {
      const bool adjacent = static_cast<ptrdiff_t>(out) == starter + 1;
      const bool unblocked = adjacent || (last_ccc != 0 && last_ccc < ccc);
      if (unblocked) {
        const char32_t composite = compose_pair(t, cps[static_cast<size_t>(starter)], cp);
        if (composite != 0) {
          cps[static_cast<size_t>(starter)] = composite;
          continue;
        }
      }
    }
    if (ccc == 0) starter = static_cast<ptrdiff_t>(out);
    last_ccc = ccc;
    cps[out++] = cp;
  }
  cps.resize(out);
}

}  // namespace

std::string normalize(std::string_view text, NormalizationForm form) {
  const Tables& t = tables();
  if (quick_check_yes(t, text, form)) return std::string(text);
  std::vector<char32_t> cps;
  cps.reserve(text.size() + 8);
  const bool compat = compatibility(form);
  size_t pos = 0;
  while (pos < text.size()) decompose(t, utf8::decode_valid(text, pos), compat, cps);
  canonical_order(t, cps);
  if (composes(form)) compose(t, cps);
  std::string out;
  out.reserve(text.size() + 8);
  for (const char32_t cp : cps) utf8::append(out, cp);
  return out;
}

uint8_t combining_class(char32_t cp) {
  return tables().props(cp).ccc;
}

std::string_view unicode_version() {
  return unicode_data::kUnicodeVersion;
}

}  // namespace strata::unicode
