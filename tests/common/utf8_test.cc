#include "common/utf8.h"

#include <gtest/gtest.h>

#include <string>

namespace strata {
namespace {

std::string encode(char32_t cp) {
  std::string s;
  utf8::append(s, cp);
  return s;
}

TEST(Utf8AppendTest, EncodesEachLengthAtItsBoundaries) {
  EXPECT_EQ(encode(0x00), std::string(1, '\0'));
  EXPECT_EQ(encode(0x41), "A");
  EXPECT_EQ(encode(0x7F), "\x7F");
  EXPECT_EQ(encode(0x80), "\xC2\x80");
  EXPECT_EQ(encode(0x7FF), "\xDF\xBF");
  EXPECT_EQ(encode(0x800), "\xE0\xA0\x80");
  EXPECT_EQ(encode(0xE9), "\xC3\xA9");
  EXPECT_EQ(encode(0xD7FF), "\xED\x9F\xBF");
  EXPECT_EQ(encode(0xE000), "\xEE\x80\x80");
  EXPECT_EQ(encode(0xFFFF), "\xEF\xBF\xBF");
  EXPECT_EQ(encode(0x10000), "\xF0\x90\x80\x80");
  EXPECT_EQ(encode(0x1F600), "\xF0\x9F\x98\x80");
  EXPECT_EQ(encode(0x10FFFF), "\xF4\x8F\xBF\xBF");
}

TEST(Utf8AppendTest, ANonScalarValueBecomesTheReplacementCharacter) {
  const std::string fffd = "\xEF\xBF\xBD";
  EXPECT_EQ(encode(utf8::kReplacementChar), fffd);
  EXPECT_EQ(encode(0xD800), fffd);  // a lead surrogate
  EXPECT_EQ(encode(0xDFFF), fffd);  // a trail surrogate
  EXPECT_EQ(encode(0x110000), fffd);
  EXPECT_EQ(encode(0xFFFFFFFF), fffd);
}

TEST(Utf8AppendTest, Appends) {
  std::string s = "a";
  utf8::append(s, 0xE9);
  utf8::append(s, 0x4E2D);
  EXPECT_EQ(s, "a\xC3\xA9\xE4\xB8\xAD");
}

}  // namespace
}  // namespace strata
