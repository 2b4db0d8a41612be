#include "text/tokenizer/utf8.h"

#include <gtest/gtest.h>

#include <random>
#include <string>

#include "text/tokenizer/reference_runner.h"

namespace strata {
namespace {

const std::string kFffd = "\xEF\xBF\xBD";

TEST(Utf8Test, ValidatesWellFormedInput) {
  EXPECT_TRUE(utf8::is_valid(""));
  EXPECT_TRUE(utf8::is_valid("plain ascii"));
  EXPECT_TRUE(utf8::is_valid("caf\xC3\xA9 \xE4\xBD\xA0\xE5\xA5\xBD \xF0\x9F\x91\x8D"));
  EXPECT_TRUE(utf8::is_valid("\xF4\x8F\xBF\xBF"));  // U+10FFFF
  EXPECT_FALSE(utf8::is_valid("\xFF"));
  EXPECT_FALSE(utf8::is_valid("\xC3"));              // truncated
  EXPECT_FALSE(utf8::is_valid("\xC0\xAF"));          // overlong
  EXPECT_FALSE(utf8::is_valid("\xE0\x80\xAF"));      // overlong
  EXPECT_FALSE(utf8::is_valid("\xED\xA0\x80"));      // surrogate
  EXPECT_FALSE(utf8::is_valid("\xF4\x90\x80\x80"));  // above U+10FFFF
  EXPECT_FALSE(utf8::is_valid("\x80"));              // lone continuation
  EXPECT_FALSE(utf8::is_valid(std::string("a\xE2\x82", 3)));
}

// Expected outputs follow the WHATWG Encoding Standard (one U+FFFD per maximal subpart),
// which is what TextDecoder gives the reference.
TEST(Utf8Test, SanitizeReplacesMaximalSubparts) {
  EXPECT_EQ(utf8::sanitize("ok"), "ok");
  EXPECT_EQ(utf8::sanitize("a\xFF"
                           "b"),
            "a" + kFffd + "b");
  EXPECT_EQ(utf8::sanitize("\xE2\x82"), kFffd);  // one subpart
  EXPECT_EQ(utf8::sanitize("\xE2\x82"
                           "A"),
            kFffd + "A");
  EXPECT_EQ(utf8::sanitize("\xF0\x9F\x98"), kFffd);
  EXPECT_EQ(utf8::sanitize("\xF0\x80\x80"), kFffd + kFffd + kFffd);  // F0 needs 90..BF
  EXPECT_EQ(utf8::sanitize("\xED\xA0\x80"), kFffd + kFffd + kFffd);  // ED needs 80..9F
  EXPECT_EQ(utf8::sanitize("\xC0\xAF"), kFffd + kFffd);
  EXPECT_EQ(utf8::sanitize("\xF4\x90\x80\x80"), kFffd + kFffd + kFffd + kFffd);
  EXPECT_EQ(utf8::sanitize("\xE4\xBD"
                           "\xE5\xA5\xBD"),
            kFffd + "\xE5\xA5\xBD");
  EXPECT_EQ(utf8::sanitize("\x80\x80"), kFffd + kFffd);
}

TEST(Utf8Test, AppendAndDecodeRoundTrip) {
  for (const char32_t cp :
       {0x0u, 0x41u, 0x7Fu, 0x80u, 0x7FFu, 0x800u, 0xFFFFu, 0x10000u, 0x10FFFFu}) {
    std::string s;
    utf8::append(s, cp);
    EXPECT_TRUE(utf8::is_valid(s));
    size_t pos = 0;
    EXPECT_EQ(utf8::decode_valid(s, pos), cp);
    EXPECT_EQ(pos, s.size());
    EXPECT_EQ(utf8::sequence_length(static_cast<uint8_t>(s[0])), s.size());
  }
}

// Streaming one byte at a time gives the same text as decoding at once, and every piece
// it releases is valid UTF-8 on its own.
TEST(Utf8Test, StreamingDecoderMatchesSanitize) {
  std::mt19937 rng(7);
  const int rounds = test_support::sanitizer_build() ? 2000 : 20000;
  const std::string alphabet[] = {"a",    "\xC3\xA9", "\xE4\xBD\xA0", "\xF0\x9F\x91\x8D", "\xFF",
                                  "\x80", "\xE2\x82", "\xF0\x9F",     "\xED\xA0\x80",     "\xC0"};
  for (int r = 0; r < rounds; ++r) {
    std::string input;
    const int parts = std::uniform_int_distribution<int>(0, 8)(rng);
    for (int i = 0; i < parts; ++i)
      input += alphabet[std::uniform_int_distribution<int>(0, 9)(rng)];
    utf8::Decoder decoder;
    std::string streamed;
    for (const char c : input) {
      std::string piece;
      decoder.push(static_cast<uint8_t>(c), piece);
      ASSERT_TRUE(utf8::is_valid(piece));
      streamed += piece;
    }
    decoder.flush(streamed);
    EXPECT_FALSE(decoder.has_pending());
    ASSERT_EQ(streamed, utf8::sanitize(input)) << test_support::escaped(input);
  }
}

}  // namespace
}  // namespace strata
