#include "bench/svg_chart.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

namespace strata::bench {
namespace {

// A minimal XML reader: checks that tags nest and close, and counts elements by name and
// collects text content. Enough to show an SVG is well-formed and has what it should.
struct XmlSummary {
  bool well_formed = true;
  std::string error;
  std::map<std::string, int> elements;
  std::vector<std::string> texts;  // content of <text> elements
  std::string root;
};

XmlSummary read_xml(const std::string& s) {
  XmlSummary out;
  std::vector<std::string> stack;
  size_t i = 0;
  auto fail = [&](const std::string& why) {
    out.well_formed = false;
    out.error = why + " at " + std::to_string(i);
    return out;
  };
  while (i < s.size()) {
    if (s[i] != '<') {
      const size_t next = s.find('<', i);
      const std::string text =
          s.substr(i, next == std::string::npos ? std::string::npos : next - i);
      if (text.find('>') != std::string::npos) return fail("stray '>'");
      for (size_t a = text.find('&'); a != std::string::npos; a = text.find('&', a + 1)) {
        if (text.find(';', a) == std::string::npos) return fail("bare '&'");
      }
      if (!stack.empty() && stack.back() == "text") out.texts.push_back(text);
      i = next == std::string::npos ? s.size() : next;
      continue;
    }
    const size_t end = s.find('>', i);
    if (end == std::string::npos) return fail("unclosed tag");
    std::string tag = s.substr(i + 1, end - i - 1);
    i = end + 1;
    if (tag.starts_with("?")) continue;  // the XML declaration
    // Attribute values must not contain raw '<'.
    if (tag.find('<') != std::string::npos) return fail("'<' inside a tag");
    if (tag.starts_with("/")) {
      const std::string name = tag.substr(1);
      if (stack.empty() || stack.back() != name) return fail("mismatched </" + name + ">");
      stack.pop_back();
      continue;
    }
    const bool self_closing = tag.ends_with("/");
    const std::string name = tag.substr(0, tag.find_first_of(" /"));
    if (out.root.empty()) out.root = name;
    ++out.elements[name];
    // Quotes in attributes must balance.
    if (std::count(tag.begin(), tag.end(), '"') % 2 != 0) return fail("unbalanced quotes");
    if (!self_closing) stack.push_back(name);
  }
  if (!stack.empty()) {
    out.well_formed = false;
    out.error = "unclosed <" + stack.back() + ">";
  }
  return out;
}

bool has_text(const XmlSummary& x, const std::string& t) {
  return std::find(x.texts.begin(), x.texts.end(), t) != x.texts.end();
}

TEST(NiceTicksTest, CoversTheRangeAtRoundSteps) {
  EXPECT_EQ(nice_ticks(0, 146, 6), (std::vector<double>{0, 50, 100, 150}));
  const auto unit = nice_ticks(0, 1, 6);
  ASSERT_EQ(unit.size(), 6u);
  for (size_t i = 0; i < unit.size(); ++i) EXPECT_NEAR(unit[i], 0.2 * i, 1e-12);
  const auto t = nice_ticks(3, 97, 6);
  EXPECT_LE(t.front(), 3);
  EXPECT_GE(t.back(), 97);
  EXPECT_EQ(t, (std::vector<double>{0, 20, 40, 60, 80, 100}));
  EXPECT_EQ(nice_ticks(2745, 2745, 6), (std::vector<double>{2745}));
  EXPECT_EQ(nice_ticks(-7, 12, 5), (std::vector<double>{-10, -5, 0, 5, 10, 15}));
}

TEST(FormatTest, NumbersAndEscaping) {
  EXPECT_EQ(format_number(150), "150");
  EXPECT_EQ(format_number(0.25), "0.25");
  EXPECT_EQ(format_number(-0.0), "0");
  EXPECT_EQ(format_number(std::nan("")), "-");
  EXPECT_EQ(xml_escape("a<b & \"c\" > 'd'"), "a&lt;b &amp; &quot;c&quot; &gt; &apos;d&apos;");
}

TEST(LineChartTest, IsWellFormedWithAxesTicksLegendAndOneLinePerSeries) {
  LineChart c{.title = "TTFT <by> depth & phase",
              .x_label = "depth",
              .y_label = "TTFT (ms)",
              .series = {{"baseline", {0, 2, 6, 10, 16}, {421, 671, 1055, 1816, 2745}},
                         {"pinned", {0, 2, 6, 10, 16}, {53, 244, 231, 227, 248}}}};
  const XmlSummary x = read_xml(render_line_chart(c));
  ASSERT_TRUE(x.well_formed) << x.error;
  EXPECT_EQ(x.root, "svg");
  EXPECT_EQ(x.elements.at("polyline"), 2);
  EXPECT_EQ(x.elements.at("circle"), 10);
  EXPECT_TRUE(has_text(x, "TTFT &lt;by&gt; depth &amp; phase"));
  EXPECT_TRUE(has_text(x, "depth"));
  EXPECT_TRUE(has_text(x, "TTFT (ms)"));
  EXPECT_TRUE(has_text(x, "baseline"));
  EXPECT_TRUE(has_text(x, "pinned"));
  for (const char* tick : {"0", "2", "6", "10", "16", "1000", "2000", "3000"}) {
    EXPECT_TRUE(has_text(x, tick)) << tick;
  }
}

TEST(LineChartTest, AMissingPointBreaksTheLine) {
  LineChart c{.title = "t",
              .x_label = "x",
              .y_label = "y",
              .series = {{"s", {1, 2, 3, 4}, {1, 2, std::nan(""), 4}}}};
  const XmlSummary x = read_xml(render_line_chart(c));
  ASSERT_TRUE(x.well_formed) << x.error;
  EXPECT_EQ(x.elements.at("circle"), 3);
  EXPECT_EQ(x.elements.at("polyline"), 2);
}

TEST(LineChartTest, EmptyChartIsStillWellFormed) {
  const XmlSummary x = read_xml(render_line_chart(LineChart{.title = "nothing"}));
  ASSERT_TRUE(x.well_formed) << x.error;
  EXPECT_EQ(x.elements.count("polyline"), 0u);
}

TEST(BarChartTest, OneRectPerFiniteValuePlusLegendAndBackground) {
  BarChart c{.title = "Tool calls",
             .y_label = "ms",
             .categories = {"p50", "p90"},
             .series = {"without", "with"},
             .values = {{120, 300}, {40, std::nan("")}}};
  const XmlSummary x = read_xml(render_bar_chart(c));
  ASSERT_TRUE(x.well_formed) << x.error;
  EXPECT_EQ(x.elements.at("rect"), 1 + 3 + 2);  // background, 3 bars, 2 legend swatches
  EXPECT_TRUE(has_text(x, "p50"));
  EXPECT_TRUE(has_text(x, "with"));
  EXPECT_TRUE(has_text(x, "300"));  // the top tick
}

}  // namespace
}  // namespace strata::bench
