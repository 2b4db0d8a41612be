#include "text/tokenizer/js_regex.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "text/tokenizer/pattern.h"

namespace strata {
namespace {

// Expected values below were produced by Node (JavaScript RegExp with the "gu" flags).
std::vector<std::string> match_all(std::string_view pattern, std::string_view text) {
  auto re = JsRegex::compile(pattern);
  EXPECT_TRUE(re.has_value()) << (re ? "" : re.error().message);
  std::vector<TextSpan> spans;
  EXPECT_TRUE(re->find_all(text, spans).has_value());
  std::vector<std::string> out;
  for (const auto& s : spans) out.emplace_back(text.substr(s.begin, s.size()));
  return out;
}

TEST(JsRegexTest, TranslatesJavaScriptSyntax) {
  EXPECT_EQ(*translate_js_regex("\\u00e9\\u{1F600}\\uD83D\\uDE00"), "\\x{E9}\\x{1F600}\\x{1F600}");
  EXPECT_EQ(*translate_js_regex("\\p{Letter}\\P{Nd}\\p{Script=Greek}"),
            "\\p{L}\\P{Nd}\\p{sc:Greek}");
  EXPECT_EQ(*translate_js_regex("\\v\\0"), "\\x{0B}\\x{00}");
  EXPECT_EQ(*translate_js_regex("a\\#b\\&c\\~"), "a#b&c~");  // the reference's rewrite
  EXPECT_FALSE(translate_js_regex("[\\S]").has_value());
  EXPECT_FALSE(translate_js_regex("[abc").has_value());
  EXPECT_FALSE(translate_js_regex("\\u12").has_value());
}

TEST(JsRegexTest, QwenPatternSplitsLikeJavaScript) {
  const std::string qwen =
      "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
      "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
  const std::string text = "Hello  world\n\n 123 it's DON'T\xC2\xA0x\xEF\xBB\xBFy \t\n  z!!\n";
  const std::vector<std::string> expected = {
      "Hello", " ",  " world",    "\n\n",          " ",     "1", "2",  "3",   " it", "'s",
      " DON",  "'T", "\xC2\xA0x", "\xEF\xBB\xBFy", " \t\n", " ", " z", "!!\n"};
  EXPECT_EQ(match_all(qwen, text), expected);
}

TEST(JsRegexTest, KeepsJavaScriptSemantics) {
  // \s is JavaScript's set: U+2028 and U+FEFF yes, U+0085 no.
  EXPECT_EQ(match_all("\\s+",
                      "a\xC2\x85"
                      "b\xE2\x80\xA8"
                      "c\xEF\xBB\xBF"
                      "d"),
            (std::vector<std::string>{"\xE2\x80\xA8", "\xEF\xBB\xBF"}));
  // '.' stops at line terminators.
  EXPECT_EQ(match_all(".",
                      "a\nb\xE2\x80\xA8"
                      "c\r"),
            (std::vector<std::string>{"a", "b", "c"}));
  // \d and \w are ASCII-only.
  EXPECT_EQ(match_all("\\d+", "12\xD9\xA3\xEF\xBC\x93"), (std::vector<std::string>{"12"}));
  EXPECT_EQ(match_all("\\w+", "caf\xC3\xA9 na_me"), (std::vector<std::string>{"caf", "na_me"}));
  // Empty matches advance by one code point and are reported.
  EXPECT_EQ(match_all("x*", "abc"), (std::vector<std::string>{"", "", "", ""}));
  EXPECT_EQ(match_all("x*", "\xE4\xBD\xA0\xE5\xA5\xBD").size(), 3u);
  // '$' is the end of input only.
  EXPECT_EQ(match_all("a$", "a\n"), (std::vector<std::string>{}));
}

TEST(JsRegexTest, SplitAndReplaceLikeJavaScript) {
  auto re = JsRegex::compile("(,)");
  ASSERT_TRUE(re.has_value());
  std::vector<std::string_view> pieces;
  ASSERT_TRUE(re->split("a,b,,c", pieces).has_value());
  EXPECT_EQ(pieces, (std::vector<std::string_view>{"a", ",", "b", ",", ",", "c"}));

  auto digits = JsRegex::compile("(\\d)(x)?");
  ASSERT_TRUE(digits.has_value());
  pieces.clear();
  ASSERT_TRUE(digits->split("a1b22c333", pieces).has_value());
  // JS: ["a","1",null,"b","2",null,"","2",null,"c","3",null,"","3",null,"","3",null,""]
  EXPECT_EQ(pieces, (std::vector<std::string_view>{"a", "1", "b", "2", "2", "c", "3", "3", "3"}));

  auto space = JsRegex::compile("\\s");
  ASSERT_TRUE(space.has_value());
  std::string out;
  ASSERT_TRUE(space->replace_all("a  b\tc", "_", out).has_value());
  EXPECT_EQ(out, "a__b_c");
}

TEST(JsRegexTest, BadPatternsAreErrorsNamingThePattern) {
  auto re = JsRegex::compile("(unclosed");
  ASSERT_FALSE(re.has_value());
  EXPECT_EQ(re.error().code, ErrorCode::kUnsupported);
  EXPECT_NE(re.error().message.find("(unclosed"), std::string::npos);
}

TEST(PatternTest, StringPatternsAreLiteral) {
  auto p = Pattern::literal(".*", /*invert=*/false);
  ASSERT_TRUE(p.has_value());
  std::vector<std::string_view> pieces;
  ASSERT_TRUE(p->split("a.*b.*", pieces).has_value());
  EXPECT_EQ(pieces, (std::vector<std::string_view>{"a", ".*", "b", ".*"}));
  std::string out;
  ASSERT_TRUE(p->replace_all("x.*y", "-", out).has_value());
  EXPECT_EQ(out, "x-y");
  EXPECT_FALSE(Pattern::literal("").has_value());
}

}  // namespace
}  // namespace strata
