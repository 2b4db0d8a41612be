// Long inputs (issue 20): one-word texts of many kilobytes tokenize exactly like the
// reference, BPE's merge order is that of a naive implementation for random merge lists
// (well-formed or not), megabyte words finish in linear time without keeping their scratch,
// and EncodeOptions::max_tokens refuses a long text before encoding all of it.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "text/tokenizer/reference_runner.h"
#include "text/tokenizer/tokenizer.h"

namespace strata {
namespace {

using nlohmann::json;

std::string repeat(std::string_view unit, size_t times) {
  std::string out;
  out.reserve(unit.size() * times);
  for (size_t i = 0; i < times; ++i) out.append(unit);
  return out;
}

// Long words: runs of one letter, of punctuation, of spaces, of digits, of a CJK
// character, and seeded random letters, each far beyond the result cache's 128 bytes.
std::vector<std::pair<std::string, std::string>> long_words() {
  std::vector<std::pair<std::string, std::string>> words = {
      {"a x 5000", std::string(5000, 'a')},
      {"a x 5001 then b", std::string(5001, 'a') + "b"},
      {"! x 3000", std::string(3000, '!')},
      {"spaces x 3000 then x", std::string(3000, ' ') + "x"},
      {"digits x 2000", repeat("0123456789", 200)},
      {"ab x 2000", repeat("ab", 2000)},
      {"CJK x 1500", repeat("\xE4\xB8\xAD", 1500)},
      {"newlines and tabs", repeat("\n\t", 1500)},
  };
  std::mt19937 rng(20);
  std::string letters;
  for (int i = 0; i < 6000; ++i) letters.push_back(static_cast<char>('a' + rng() % 26));
  words.emplace_back("random letters x 6000", letters);
  return words;
}

class LongWordReferenceTest : public ::testing::TestWithParam<std::string> {};

TEST_P(LongWordReferenceTest, MatchesReference) {
  const std::string& name = GetParam();
  const Tokenizer& tok = test_support::real_tokenizer(name);
  const auto words = long_words();
  std::vector<std::string> lines;
  for (const auto& [label, text] : words) lines.push_back("e " + test_support::to_hex(text));
  auto reference = test_support::run_reference(test_support::real_tokenizer_dir(name), lines);
  ASSERT_TRUE(reference.has_value()) << reference.error().message;
  ASSERT_EQ(reference->size(), words.size());
  for (size_t i = 0; i < words.size(); ++i) {
    auto ids = tok.encode(words[i].second);
    ASSERT_TRUE(ids.has_value()) << words[i].first << ": " << ids.error().message;
    EXPECT_EQ(*ids, (*reference)[i]["ids"].get<std::vector<TokenId>>())
        << name << ", " << words[i].first;
  }
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, LongWordReferenceTest,
                         ::testing::Values("qwen3", "llama3", "llama2"),
                         [](const auto& info) { return info.param; });

// BPE as the reference defines it, in the most direct way: merge the pair of lowest rank,
// leftmost on ties, until no pair has a rank. Quadratic, for short words only.
std::vector<std::string> naive_bpe(
    const std::string& word, const std::map<std::pair<std::string, std::string>, int>& ranks) {
  std::vector<std::string> symbols;
  for (const char c : word) symbols.emplace_back(1, c);
  while (true) {
    int best_rank = -1;
    size_t best = 0;
    for (size_t i = 0; i + 1 < symbols.size(); ++i) {
      const auto it = ranks.find({symbols[i], symbols[i + 1]});
      if (it != ranks.end() && (best_rank < 0 || it->second < best_rank)) {
        best_rank = it->second;
        best = i;
      }
    }
    if (best_rank < 0) return symbols;
    symbols[best] += symbols[best + 1];
    symbols.erase(symbols.begin() + static_cast<std::ptrdiff_t>(best) + 1);
  }
}

// Random merge lists over a 3-letter alphabet, shuffled or not: a shuffled list uses
// tokens before the merge that makes them, so later merges can outrank the current one
// (the queue's fallback heap); repeated pairs take their last rank. Words of up to 700
// units go through both the result cache (up to 128 bytes) and long pieces' scratch.
TEST(LongInputTest, RandomMergeListsMatchNaiveBpe) {
  std::mt19937 rng(7);
  const int rounds = test_support::sanitizer_build() ? 9 : 24;
  const size_t long_word = test_support::sanitizer_build() ? 300 : 700;
  int compared = 0;
  for (int round = 0; round < rounds; ++round) {
    const bool well_formed = round % 3 == 0;
    std::vector<std::string> tokens = {"a", "b", "c"};
    std::vector<std::pair<std::string, std::string>> merges;
    for (int m = 0; m < 40; ++m) {
      const std::string& left = tokens[rng() % tokens.size()];
      const std::string& right = tokens[rng() % tokens.size()];
      if (left.size() + right.size() > 12) continue;
      merges.emplace_back(left, right);
      tokens.push_back(left + right);
    }
    if (!well_formed) std::shuffle(merges.begin(), merges.end(), rng);
    std::map<std::pair<std::string, std::string>, int> ranks;
    json vocab = json::object();
    json merge_list = json::array();
    for (const std::string& t : tokens) {
      if (!vocab.contains(t)) vocab[t] = static_cast<int>(vocab.size());
    }
    for (size_t r = 0; r < merges.size(); ++r) {
      ranks[merges[r]] = static_cast<int>(r);
      merge_list.push_back(merges[r].first + " " + merges[r].second);
    }
    const json tokenizer = {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merge_list}}},
                            {"added_tokens", json::array()},
                            {"normalizer", nullptr},
                            {"pre_tokenizer", nullptr},
                            {"post_processor", nullptr},
                            {"decoder", nullptr}};
    auto tok = Tokenizer::from_json_text(tokenizer.dump(), "", "");
    ASSERT_TRUE(tok.has_value()) << tok.error().message;
    for (int w = 0; w < 12; ++w) {
      std::string word;
      const size_t length = 1 + rng() % (w % 2 == 0 ? 100 : long_word);
      const uint32_t alphabet = 1 + rng() % 3;
      for (size_t i = 0; i < length; ++i) word.push_back(static_cast<char>('a' + rng() % alphabet));
      std::vector<TokenId> expected;
      for (const std::string& s : naive_bpe(word, ranks))
        expected.push_back(vocab.at(s).get<TokenId>());
      auto ids = (*tok)->encode(word);
      ASSERT_TRUE(ids.has_value()) << ids.error().message;
      ASSERT_EQ(*ids, expected) << "round " << round << ", word " << word;
      ++compared;
    }
  }
  EXPECT_EQ(compared, rounds * 12);
}

int64_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t pages = 0;
  int64_t resident = 0;
  statm >> pages >> resident;
  return resident * 4096;
}

// Megabyte words: each finishes (linear time and memory: no timing is asserted, a
// quadratic pass would not finish in the test's time limit), decodes back to its text,
// and leaves no scratch behind: a thread used to keep ~32 bytes per unit of its longest
// word (hundreds of megabytes after a 10 MB word).
TEST(LongInputTest, MegabyteWordsFinishAndReleaseTheirScratch) {
  const Tokenizer& tok = test_support::real_tokenizer("qwen3");
  const size_t size = test_support::sanitizer_build() ? (size_t{1} << 17) : (size_t{4} << 20);
  const std::vector<std::pair<std::string, std::string>> words = {
      {"one letter", std::string(size, 'a')},
      {"spaces", std::string(size, ' ')},           // PCRE2's fixed match limit used to refuse it
      {"digits", repeat("0123456789", size / 10)},  // one piece per digit
  };
  (void)tok.encode("warm up the allocator and the result cache");
  const int64_t before = resident_bytes();
  for (const auto& [label, text] : words) {
    auto ids = tok.encode(text, EncodeOptions{.add_special_tokens = false});
    ASSERT_TRUE(ids.has_value()) << label << ": " << ids.error().message;
    EXPECT_GT(ids->size(), text.size() / 256) << label;
    EXPECT_LE(ids->size(), text.size()) << label;
    auto decoded = tok.decode(*ids);
    ASSERT_TRUE(decoded.has_value()) << label;
    EXPECT_TRUE(*decoded == text) << label << " does not decode back to its text";
  }
  if (!test_support::sanitizer_build()) {
    // BPE's scratch for a 4 MB word is ~100 MB; what the allocator keeps of freed blocks
    // stays far below that.
    const int64_t grown = resident_bytes() - before;
    EXPECT_LT(grown, int64_t{48} << 20) << "resident memory grew by " << (grown >> 20) << " MiB";
  }
}

// max_tokens: the ids of a text within the limit are those without it; one over it fails
// with kResourceExhausted, at the exact boundary, and a huge word is refused at once
// from its byte length (its ids would number at least bytes / longest token).
TEST(LongInputTest, MaxTokensRefusesLongTextsEarly) {
  for (const std::string name : {"qwen3", "llama3", "llama2"}) {
    const Tokenizer& tok = test_support::real_tokenizer(name);
    const std::string text = repeat("The river stone holds a quiet signal. ", 200);
    auto all = tok.encode(text);
    ASSERT_TRUE(all.has_value());
    const size_t n = all->size();
    auto at_limit = tok.encode(text, EncodeOptions{.max_tokens = n});
    ASSERT_TRUE(at_limit.has_value()) << name << ": " << at_limit.error().message;
    EXPECT_EQ(*at_limit, *all) << name;
    auto over = tok.encode(text, EncodeOptions{.max_tokens = n - 1});
    ASSERT_FALSE(over.has_value()) << name;
    EXPECT_EQ(over.error().code, ErrorCode::kResourceExhausted) << name;
    auto plain = tok.encode(text, EncodeOptions{.add_special_tokens = false, .max_tokens = n});
    ASSERT_TRUE(plain.has_value()) << name;

    // Megabytes of one letter: BPE would take seconds and hundreds of megabytes.
    const size_t huge_bytes =
        test_support::sanitizer_build() ? (size_t{1} << 20) : (size_t{16} << 20);
    auto huge = tok.encode(std::string(huge_bytes, 'a'), EncodeOptions{.max_tokens = 1024});
    ASSERT_FALSE(huge.has_value()) << name;
    EXPECT_EQ(huge.error().code, ErrorCode::kResourceExhausted) << name;
  }
}

}  // namespace
}  // namespace strata
