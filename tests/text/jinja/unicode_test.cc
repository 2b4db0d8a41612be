// UTF-8 helpers with JavaScript string semantics, and the generated case tables.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "jinja_test_util.h"
#include "text/jinja/js_number.h"
#include "text/jinja/unicode.h"

namespace strata::jinja {
namespace {

TEST(Unicode, TablesMatchTheGeneratorRunOnNode) {
  const test_support::CommandResult run = test_support::run_command(
      test_support::node_command(test_support::kDataDir + "/gen_unicode_tables.mjs", ""));
  ASSERT_EQ(run.exit_code, 0) << "node failed (Node 20 must be on PATH): " << run.err;
  const std::string checked_in =
      test_support::read_file(std::string(STRATA_SOURCE_DIR) + "/src/text/jinja/unicode_tables.cc");
  // The first line names the Node version that generated the file.
  auto body = [](const std::string& s) { return s.substr(s.find('\n')); };
  EXPECT_EQ(body(run.out), body(checked_in))
      << "src/text/jinja/unicode_tables.cc is stale: regenerate it with "
         "tests/text/jinja/gen_unicode_tables.mjs";
}

TEST(Unicode, DecodeIsLenient) {
  const std::string s = "a\xC3\xA9\xF0\x9F\x98\x80\xFF\xE2\x82";
  size_t pos = 0;
  EXPECT_EQ(unicode::decode(s, pos), U'a');
  EXPECT_EQ(unicode::decode(s, pos), U'\u00E9');
  EXPECT_EQ(unicode::decode(s, pos), U'\U0001F600');
  EXPECT_EQ(unicode::decode(s, pos), unicode::kReplacementChar);  // 0xFF
  EXPECT_EQ(unicode::decode(s, pos), unicode::kReplacementChar);  // truncated sequence
  EXPECT_TRUE(unicode::is_valid_utf8("plain é 😀"));
  EXPECT_FALSE(unicode::is_valid_utf8("\xED\xA0\x80"));  // a surrogate
  EXPECT_FALSE(unicode::is_valid_utf8("\xC0\xAF"));      // overlong
  EXPECT_TRUE(unicode::is_valid_utf8("\xEF\xBF\xBD"));   // a real U+FFFD
}

TEST(Unicode, TrimUsesJavaScriptWhitespace) {
  EXPECT_EQ(
      unicode::trim(" \t\n\v\f\r\u00A0\u1680\u2000\u200A\u2028\u2029\u202F\u205F\u3000\uFEFFx y "),
      "x y");
  // U+0085 and U+200B are not whitespace in JavaScript.
  EXPECT_EQ(unicode::trim("\u0085x\u200B"), "\u0085x\u200B");
  EXPECT_EQ(unicode::trim_start("  a  "), "a  ");
  EXPECT_EQ(unicode::trim_end("  a  "), "  a");
  EXPECT_EQ(unicode::trim_end("a\xFF "), "a\xFF");
}

TEST(Unicode, Utf16View) {
  EXPECT_EQ(unicode::utf16_length("a\u00E9\u4E2D\U0001F600"), 5u);
  std::string out;
  EXPECT_TRUE(unicode::utf16_at("a\U0001F600b", -1, out));
  EXPECT_EQ(out, "b");
  out.clear();
  EXPECT_TRUE(unicode::utf16_at("a\U0001F600b", 1, out));
  EXPECT_EQ(out, "\uFFFD");  // half of a surrogate pair
  out.clear();
  EXPECT_FALSE(unicode::utf16_at("ab", 2, out));
  EXPECT_FALSE(unicode::utf16_at("ab", -3, out));
  // UTF-16 order differs from UTF-8 byte order for U+E000..U+FFFF against astral characters.
  EXPECT_GT(unicode::compare_utf16("\uFF01", "\U0001F600"), 0);
  EXPECT_LT(std::string("\uFF01"), std::string("\U0001F600"));
  EXPECT_LT(unicode::compare_utf16("ab", "abc"), 0);
  EXPECT_EQ(unicode::compare_utf16("x", "x"), 0);
}

TEST(Unicode, CaseMappingMatchesJavaScript) {
  EXPECT_EQ(unicode::to_upper("straße ﬁ ŉ ǆ"), "STRASSE FI ʼN Ǆ");
  EXPECT_EQ(unicode::to_lower("İ ΣΑΣ ΌΣΟΣ Σ ΑΣ1 𐐀"), "i̇ σας όσος σ ας1 𐐨");
  EXPECT_EQ(unicode::to_lower("ΑΣ'Α"), "ασ'α");  // followed by a cased letter after an apostrophe
  EXPECT_EQ(unicode::to_upper("abc xyz"), "ABC XYZ");
}

TEST(JsNumber, ToStringMatchesNumberPrototypeToString) {
  EXPECT_EQ(js_number_to_string(0), "0");
  EXPECT_EQ(js_number_to_string(-0.0), "0");
  EXPECT_EQ(js_number_to_string(42), "42");
  EXPECT_EQ(js_number_to_string(-7.25), "-7.25");
  EXPECT_EQ(js_number_to_string(0.1 + 0.2), "0.30000000000000004");
  EXPECT_EQ(js_number_to_string(1e21), "1e+21");
  EXPECT_EQ(js_number_to_string(1e20), "100000000000000000000");
  EXPECT_EQ(js_number_to_string(1152921504606846976.0), "1152921504606847000");
  EXPECT_EQ(js_number_to_string(1e-7), "1e-7");
  EXPECT_EQ(js_number_to_string(1.5e-7), "1.5e-7");
  EXPECT_EQ(js_number_to_string(0.000001), "0.000001");
  EXPECT_EQ(js_number_to_string(123e-20), "1.23e-18");
  EXPECT_EQ(js_number_to_string(1.7976931348623157e308), "1.7976931348623157e+308");
  EXPECT_EQ(js_number_to_string(5e-324), "5e-324");
  EXPECT_EQ(js_number_to_string(std::numeric_limits<double>::infinity()), "Infinity");
  EXPECT_EQ(js_number_to_string(-std::numeric_limits<double>::infinity()), "-Infinity");
  EXPECT_EQ(js_number_to_string(std::nan("")), "NaN");
  EXPECT_EQ(js_to_fixed1(3), "3.0");
  EXPECT_EQ(js_to_fixed1(-2), "-2.0");
  EXPECT_EQ(js_to_fixed1(1152921504606846976.0), "1152921504606846976.0");
  EXPECT_EQ(js_to_fixed1(1e21), "1e+21");
}

TEST(JsNumber, ParsingMatchesNumberParseIntParseFloat) {
  EXPECT_EQ(js_string_to_number(" 12 "), 12);
  EXPECT_EQ(js_string_to_number(""), 0);
  EXPECT_EQ(js_string_to_number("0x1F"), 31);
  EXPECT_EQ(js_string_to_number("0b101"), 5);
  EXPECT_EQ(js_string_to_number("-1.5e3"), -1500);
  EXPECT_EQ(js_string_to_number(".5"), 0.5);
  EXPECT_EQ(js_string_to_number("5."), 5);
  EXPECT_EQ(js_string_to_number("-Infinity"), -std::numeric_limits<double>::infinity());
  EXPECT_TRUE(std::isnan(js_string_to_number("12px")));
  EXPECT_TRUE(std::isnan(js_string_to_number("-0x10")));
  EXPECT_EQ(js_parse_int("  -42abc"), -42);
  EXPECT_EQ(js_parse_int("3.9"), 3);
  EXPECT_TRUE(std::isnan(js_parse_int("abc")));
  EXPECT_EQ(js_parse_float("1e3x"), 1000);
  EXPECT_EQ(js_parse_float("1e"), 1);
  EXPECT_EQ(js_parse_float("-.25"), -0.25);
  EXPECT_TRUE(std::isnan(js_parse_float(".")));
  EXPECT_EQ(js_parse_float("1e400"), std::numeric_limits<double>::infinity());
  EXPECT_EQ(js_parse_float("1e-400"), 0);
}

}  // namespace
}  // namespace strata::jinja
