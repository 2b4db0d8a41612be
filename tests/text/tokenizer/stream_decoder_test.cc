// Streaming decode on the real tokenizers: incomplete characters are held back, the
// first-token space rule and the clean-up rule hold back exactly what may still change,
// and the concatenation of pieces equals decode() for random id sequences.
#include "text/tokenizer/decoder.h"

#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "text/tokenizer/byte_level.h"
#include "text/tokenizer/reference_runner.h"
#include "text/tokenizer/tokenizer.h"
#include "text/tokenizer/utf8.h"

namespace strata {
namespace {

std::vector<std::string> stream_pieces(const Tokenizer& t, const std::vector<TokenId>& ids,
                                       DecodeOptions options = {}) {
  StreamDecoder stream = t.stream_decoder(options);
  std::vector<std::string> pieces;
  for (const TokenId id : ids) {
    auto piece = stream.push(id);
    EXPECT_TRUE(piece.has_value());
    pieces.push_back(piece ? *piece : "");
  }
  pieces.push_back(stream.finish());
  return pieces;
}

TEST(StreamDecoderTest, ByteFallbackHoldsIncompleteCharacters) {
  const Tokenizer& t = test_support::real_tokenizer("llama2");
  // <0xF0><0x9F><0x91><0x8D> is U+1F44D; Llama 2's byte tokens are ids 3 + byte.
  const std::vector<TokenId> ids = {3 + 0xF0, 3 + 0x9F, 3 + 0x91, 3 + 0x8D};
  EXPECT_EQ(stream_pieces(t, ids), (std::vector<std::string>{"", "", "", "\xF0\x9F\x91\x8D", ""}));
  // A run that never completes becomes one U+FFFD when the run ends.
  const std::vector<TokenId> broken = {3 + 0xF0, 3 + 0x9F,
                                       *t.token_to_id("\xE2\x96\x81"
                                                      "a")};
  EXPECT_EQ(stream_pieces(t, broken), (std::vector<std::string>{"", "", "\xEF\xBF\xBD a", ""}));
}

TEST(StreamDecoderTest, ByteLevelHoldsIncompleteCharacters) {
  for (const char* name : {"qwen3", "llama3"}) {
    const Tokenizer& t = test_support::real_tokenizer(name);
    std::vector<TokenId> ids;
    for (const char byte : std::string("\xE4\xBD\xA0")) {
      const auto id = t.token_to_id(byte_level::from_bytes(std::string(1, byte)));
      ASSERT_TRUE(id.has_value());
      ids.push_back(*id);
    }
    EXPECT_EQ(stream_pieces(t, ids), (std::vector<std::string>{"", "", "\xE4\xBD\xA0", ""}))
        << name;
  }
}

TEST(StreamDecoderTest, FirstTokenLosesItsMetaspace) {
  const Tokenizer& t = test_support::real_tokenizer("llama2");
  const auto ids = *t.encode("Hello world");
  ASSERT_EQ(ids.size(), 3u);  // <s> Hello world
  EXPECT_EQ(stream_pieces(t, ids, DecodeOptions{.skip_special_tokens = true}),
            (std::vector<std::string>{"", "Hello", " world", ""}));
  EXPECT_EQ(stream_pieces(t, ids), (std::vector<std::string>{"<s>", " Hello", " world", ""}));
}

TEST(StreamDecoderTest, CleanUpHoldsBackSpacesBeforePunctuation) {
  const Tokenizer& t =
      test_support::real_tokenizer("llama3");  // clean_up_tokenization_spaces is true
  const std::vector<TokenId> ids = {*t.token_to_id("Hello"), *t.token_to_id("\xC4\xA0."),
                                    *t.token_to_id("\xC4\xA0World")};
  const auto pieces = stream_pieces(t, ids);
  EXPECT_EQ(pieces, (std::vector<std::string>{"Hello", "", ". World", ""}));
  EXPECT_EQ(*t.decode(ids), "Hello. World");
  DecodeOptions raw;
  raw.clean_up_tokenization_spaces = false;
  EXPECT_EQ(*t.decode(ids, raw), "Hello . World");
}

TEST(StreamDecoderTest, UnknownIdIsAnErrorAndStreamContinues) {
  const Tokenizer& t = test_support::real_tokenizer("qwen3");
  StreamDecoder stream = t.stream_decoder();
  EXPECT_EQ(*stream.push(*t.token_to_id("Hello")), "Hello");
  auto bad = stream.push(static_cast<TokenId>(t.vocab_size()));
  ASSERT_FALSE(bad.has_value());
  EXPECT_EQ(bad.error().code, ErrorCode::kInvalidArgument);
  EXPECT_FALSE(stream.push(-1).has_value());
  EXPECT_EQ(*stream.push(*t.token_to_id("\xC4\xA0world")), " world");
  EXPECT_EQ(stream.finish(), "");
  // finish() resets: the decoder starts a new sequence.
  EXPECT_EQ(*stream.push(*t.token_to_id("Hello")), "Hello");
}

// Random id sequences: pieces are valid UTF-8 and concatenate to decode().
TEST(StreamDecoderTest, RandomSequencesConcatenateToDecode) {
  const int rounds = test_support::sanitizer_build() ? 150 : 1500;
  for (const char* name : {"qwen3", "llama3", "llama2"}) {
    const Tokenizer& t = test_support::real_tokenizer(name);
    std::mt19937 rng(42);
    const auto vocab = static_cast<TokenId>(t.vocab_size());
    for (int r = 0; r < rounds; ++r) {
      std::vector<TokenId> ids;
      const int len = std::uniform_int_distribution<int>(1, 40)(rng);
      for (int k = 0; k < len; ++k) {
        // Bias towards low ids: byte tokens and short (often partial UTF-8) tokens.
        const bool low = std::uniform_int_distribution<int>(0, 2)(rng) == 0;
        ids.push_back(std::uniform_int_distribution<TokenId>(0, low ? 300 : vocab - 1)(rng));
      }
      for (const bool skip : {false, true}) {
        DecodeOptions options{.skip_special_tokens = skip};
        const auto whole = t.decode(ids, options);
        ASSERT_TRUE(whole.has_value());
        std::string joined;
        for (const auto& piece : stream_pieces(t, ids, options)) {
          ASSERT_TRUE(utf8::is_valid(piece)) << name;
          joined += piece;
        }
        ASSERT_EQ(joined, *whole) << name << " round " << r;
      }
    }
  }
}

}  // namespace
}  // namespace strata
