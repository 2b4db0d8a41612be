// Unicode normalization against the Unicode Consortium's conformance test
// (NormalizationTest.txt from the Debian package unicode-data, the same Unicode version
// as the generated tables).
#include "text/tokenizer/unicode_normalize.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "text/tokenizer/reference_runner.h"
#include "text/tokenizer/utf8.h"

namespace strata {
namespace {

using unicode::NormalizationForm;

std::string utf8_of(const std::vector<char32_t>& cps) {
  std::string s;
  for (const char32_t cp : cps) utf8::append(s, cp);
  return s;
}

std::vector<char32_t> parse_column(const std::string& column) {
  std::vector<char32_t> cps;
  std::stringstream ss(column);
  std::string hex;
  while (ss >> hex) cps.push_back(static_cast<char32_t>(std::stoul(hex, nullptr, 16)));
  return cps;
}

TEST(UnicodeNormalizeTest, HandPickedExamples) {
  EXPECT_EQ(unicode::normalize("cafe\xCC\x81", NormalizationForm::kNfc), "caf\xC3\xA9");
  EXPECT_EQ(unicode::normalize("caf\xC3\xA9", NormalizationForm::kNfd), "cafe\xCC\x81");
  // Hangul: conjoining jamo compose, syllables decompose algorithmically.
  EXPECT_EQ(unicode::normalize("\xE1\x84\x92\xE1\x85\xA1\xE1\x86\xAB", NormalizationForm::kNfc),
            "\xED\x95\x9C");
  EXPECT_EQ(unicode::normalize("\xED\x95\x9C", NormalizationForm::kNfd),
            "\xE1\x84\x92\xE1\x85\xA1\xE1\x86\xAB");
  // Canonical reordering: dot above (230) after dot below (220).
  EXPECT_EQ(unicode::normalize("d\xCC\x87\xCC\xA3", NormalizationForm::kNfd), "d\xCC\xA3\xCC\x87");
  EXPECT_EQ(unicode::normalize("d\xCC\x87\xCC\xA3", NormalizationForm::kNfc),
            "\xE1\xB8\x8D\xCC\x87");
  // Compatibility forms: fullwidth digit, ligature.
  EXPECT_EQ(unicode::normalize("\xEF\xBC\x91\xEF\xAC\x81", NormalizationForm::kNfkc), "1fi");
  EXPECT_EQ(unicode::normalize("\xEF\xBC\x91", NormalizationForm::kNfc), "\xEF\xBC\x91");
  // Composition exclusion: U+0958 stays decomposed under NFC.
  EXPECT_EQ(unicode::normalize("\xE0\xA5\x98", NormalizationForm::kNfc),
            "\xE0\xA4\x95\xE0\xA4\xBC");
  EXPECT_EQ(unicode::combining_class(0x301), 230);
  EXPECT_EQ(unicode::combining_class('a'), 0);
  EXPECT_FALSE(unicode::unicode_version().empty());
}

TEST(UnicodeNormalizeTest, ConformsToNormalizationTest) {
  const std::filesystem::path file = "/usr/share/unicode/NormalizationTest.txt.bz2";
  ASSERT_TRUE(std::filesystem::exists(file))
      << file << " is missing: install the Debian package unicode-data (scripts/install-deps.sh)";
  const std::string command =
      "python3 -c 'import bz2,sys; sys.stdout.buffer.write(bz2.open(sys.argv[1]).read())' " +
      file.string();
  FILE* pipe = ::popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string text;
  char buf[65536];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) text.append(buf, n);
  ASSERT_EQ(::pclose(pipe), 0) << "python3 could not decompress " << file;

  std::stringstream lines(text);
  std::string line;
  bool in_part1 = false;
  std::set<char32_t> part1;
  int checked = 0;
  int failures = 0;
  while (std::getline(lines, line)) {
    if (line.starts_with("@Part")) {
      in_part1 = line.starts_with("@Part1");
      continue;
    }
    if (line.empty() || line[0] == '#') continue;
    std::vector<std::string> columns;
    std::stringstream ls(line);
    std::string column;
    while (std::getline(ls, column, ';') && columns.size() < 5) columns.push_back(column);
    ASSERT_EQ(columns.size(), 5u) << line;
    std::string c[5];
    for (int i = 0; i < 5; ++i) c[i] = utf8_of(parse_column(columns[i]));
    if (in_part1) part1.insert(parse_column(columns[0])[0]);
    auto check = [&](NormalizationForm form, int source, int expected) {
      if (unicode::normalize(c[source], form) != c[expected] && ++failures <= 20) {
        ADD_FAILURE() << "form " << static_cast<int>(form) << " of column " << source + 1
                      << " should be column " << expected + 1 << ": " << line;
      }
    };
    for (int s = 0; s < 3; ++s) {
      check(NormalizationForm::kNfc, s, 1);
      check(NormalizationForm::kNfd, s, 2);
    }
    for (int s = 3; s < 5; ++s) {
      check(NormalizationForm::kNfc, s, 3);
      check(NormalizationForm::kNfd, s, 4);
    }
    for (int s = 0; s < 5; ++s) {
      check(NormalizationForm::kNfkc, s, 3);
      check(NormalizationForm::kNfkd, s, 4);
    }
    ++checked;
  }
  EXPECT_GT(checked, 15000);
  EXPECT_GT(part1.size(), 10000u);
  // Every code point not listed in part 1 is its own normalization in every form.
  const char32_t stride = test_support::sanitizer_build() ? 13 : 1;
  for (char32_t cp = 0; cp <= 0x10FFFF; cp += stride) {
    if ((cp >= 0xD800 && cp <= 0xDFFF) || part1.contains(cp)) continue;
    const std::string s = utf8_of({cp});
    for (const auto form : {NormalizationForm::kNfc, NormalizationForm::kNfd,
                            NormalizationForm::kNfkc, NormalizationForm::kNfkd}) {
      if (unicode::normalize(s, form) != s && ++failures <= 20) {
        ADD_FAILURE() << "U+" << std::hex << static_cast<uint32_t>(cp) << " changed in form "
                      << static_cast<int>(form);
      }
    }
  }
  EXPECT_EQ(failures, 0);
}

}  // namespace
}  // namespace strata
