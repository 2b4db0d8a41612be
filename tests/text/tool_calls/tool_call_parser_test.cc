#include "text/tool_calls/tool_call_parser.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace strata {
namespace {

ToolCallParserOptions opts(ToolCallFormat f, std::vector<std::string> names = {}) {
  ToolCallParserOptions o;
  o.format = f;
  o.function_names = std::move(names);
  o.make_id = [](size_t i) { return "id" + std::to_string(i); };
  return o;
}

struct Expected {
  std::string content;
  std::vector<std::pair<std::string, std::string>> calls;  // name, arguments
};

void expect_parsed(const ParsedToolCalls& got, const Expected& want) {
  EXPECT_FALSE(got.malformed);
  EXPECT_EQ(got.content, want.content);
  ASSERT_EQ(got.calls.size(), want.calls.size());
  for (size_t i = 0; i < want.calls.size(); ++i) {
    EXPECT_EQ(got.calls[i].id, "id" + std::to_string(i));
    EXPECT_EQ(got.calls[i].name, want.calls[i].first);
    EXPECT_EQ(got.calls[i].arguments, want.calls[i].second);
  }
}

// Streams `text` in the given pieces; checks what a client would see.
ParsedToolCalls stream(const std::string& text, const std::vector<size_t>& cuts,
                       const ToolCallParserOptions& o, bool* malformed = nullptr) {
  ToolCallStreamParser p(o);
  std::vector<ToolCallEvent> all;
  size_t at = 0;
  auto add = [&](std::vector<ToolCallEvent> ev) {
    for (auto& e : ev) all.push_back(std::move(e));
  };
  for (size_t cut : cuts) {
    add(p.push(std::string_view(text).substr(at, cut - at)));
    at = cut;
  }
  add(p.push(std::string_view(text).substr(at)));
  add(p.finish());
  if (malformed) *malformed = p.malformed();
  // Every call's first piece names it; later pieces never do.
  std::vector<bool> seen;
  for (const auto& e : all) {
    if (!e.call) continue;
    if (e.call->index >= seen.size()) seen.resize(e.call->index + 1, false);
    EXPECT_EQ(!e.call->name.empty(), !seen[e.call->index]) << "index " << e.call->index;
    seen[e.call->index] = true;
  }
  return merge_tool_call_events(all);
}

// The whole parse, then the stream split once at every byte and fed a byte at a time.
void check_everywhere(ToolCallFormat f, const std::string& text, const Expected& want,
                      std::vector<std::string> names = {}) {
  const auto o = opts(f, names);
  SCOPED_TRACE(text);
  expect_parsed(parse_tool_calls(text, o), want);
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    SCOPED_TRACE("cut at " + std::to_string(cut));
    expect_parsed(stream(text, {cut}, o), want);
  }
  std::vector<size_t> bytes;
  for (size_t i = 1; i < text.size(); ++i) bytes.push_back(i);
  expect_parsed(stream(text, bytes, o), want);
}

// ---- Hermes / Qwen ----

TEST(HermesParser, OneCall) {
  check_everywhere(
      ToolCallFormat::kHermes,
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
      "</tool_call>",
      {"", {{"get_weather", "{\"city\": \"Paris\"}"}}});
}

TEST(HermesParser, ContentThenSeveralCalls) {
  check_everywhere(
      ToolCallFormat::kHermes,
      "Let me check both.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": "
      "1}}\n</tool_call>\n"
      "<tool_call>\n{\"name\": \"b\", \"arguments\": {}}\n</tool_call>\n"
      "<tool_call>{\"arguments\": {\"y\": [1, {\"z\": null}]}, \"name\": \"c\"}</tool_call>\n",
      {"Let me check both.\n",
       {{"a", "{\"x\": 1}"}, {"b", "{}"}, {"c", "{\"y\": [1, {\"z\": null}]}"}}});
}

TEST(HermesParser, NestedJsonWithMarkupInsideStrings) {
  const std::string args =
      R"({"q": "a </tool_call> b <tool_call> {\"k\": [1,2]}", "deep": {"l": [[{"m": "}"}]]}, "n": -1.5e3, "t": true})";
  check_everywhere(ToolCallFormat::kHermes,
                   "<tool_call>{\"name\": \"search\", \"arguments\": " + args + "}</tool_call>",
                   {"", {{"search", args}}});
}

TEST(HermesParser, Unicode) {
  const std::string args = "{\"city\": \"東京 🌸\", \"esc\": \"\\u00e9\\n\\\"\"}";
  check_everywhere(ToolCallFormat::kHermes,
                   "天気を調べます。<tool_call>\n{\"name\": \"weather\", \"arguments\": " + args +
                       "}\n</tool_call>",
                   {"天気を調べます。", {{"weather", args}}});
}

TEST(HermesParser, NoArgumentsGivesEmptyObject) {
  check_everywhere(ToolCallFormat::kHermes, "<tool_call>{\"name\": \"now\"}</tool_call>",
                   {"", {{"now", "{}"}}});
}

TEST(HermesParser, PlainTextAndAlmostMarkers) {
  check_everywhere(ToolCallFormat::kHermes, "a <tool call> and <tool_ and </tool_call> <",
                   {"a <tool call> and <tool_ and </tool_call> <", {}});
  check_everywhere(ToolCallFormat::kHermes, "", {"", {}});
  check_everywhere(ToolCallFormat::kHermes, "  \n", {"  \n", {}});
}

TEST(HermesParser, UnclosedLastCallIsAccepted) {
  check_everywhere(ToolCallFormat::kHermes, "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}",
                   {"", {{"f", "{}"}}});
  check_everywhere(ToolCallFormat::kHermes,
                   "<tool_call>{\"name\": \"f\", \"arguments\": {}}\n</tool_", {"", {{"f", "{}"}}});
}

TEST(HermesParser, TextAfterCallsIsContent) {
  check_everywhere(ToolCallFormat::kHermes,
                   "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>\nDone.",
                   {"\nDone.", {{"f", "{}"}}});
}

TEST(HermesParser, KnownFunctionsOnly) {
  check_everywhere(ToolCallFormat::kHermes,
                   "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1}}</tool_call>",
                   {"", {{"f", "{\"a\": 1}"}}}, {"f", "g"});
  const std::string unknown = "<tool_call>{\"name\": \"rm_rf\", \"arguments\": {}}</tool_call>";
  const auto r = parse_tool_calls(unknown, opts(ToolCallFormat::kHermes, {"f"}));
  EXPECT_TRUE(r.malformed);
  EXPECT_EQ(r.content, unknown);
  EXPECT_TRUE(r.calls.empty());
  // A stream never shows the unknown call: it is content at every split.
  for (size_t cut = 0; cut <= unknown.size(); ++cut) {
    bool malformed = false;
    const auto s = stream(unknown, {cut}, opts(ToolCallFormat::kHermes, {"f"}), &malformed);
    EXPECT_TRUE(malformed);
    EXPECT_EQ(s.content, unknown);
    EXPECT_TRUE(s.calls.empty());
  }
}

TEST(HermesParser, BrokenJsonIsContent) {
  const std::vector<std::string> broken = {
      "<tool_call>{\"name\": get_weather}</tool_call>",
      "<tool_call>not json</tool_call>",
      "<tool_call>{\"arguments\": {\"a\": 1}}</tool_call>",
      "<tool_call>{\"name\": \"f\", \"arguments\": \"{}\"}</tool_call>",
      "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": ]}}</tool_call>",
      "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1}",
      "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1},}</tool_call>",
      "<tool_call>{\"name\": \"f\" \"arguments\": {}}</tool_call>",
      "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": tru}}</tool_call>",
      "<tool_call>{\"name\": \"f\", \"name\": \"g\"}</tool_call>",
      "<tool_call>",
      "<tool_call>{\"na",
      "ok <tool_call>{\"name\": \"\"}</tool_call>",
  };
  for (const std::string& text : broken) {
    SCOPED_TRACE(text);
    const auto r = parse_tool_calls(text, opts(ToolCallFormat::kHermes));
    EXPECT_TRUE(r.malformed);
    EXPECT_EQ(r.content, text);
    EXPECT_TRUE(r.calls.empty());
    // Streams never crash, and whatever they show adds up to the text when no call was
    // shown.
    for (size_t cut = 0; cut <= text.size(); ++cut) {
      bool malformed = false;
      const auto s = stream(text, {cut}, opts(ToolCallFormat::kHermes), &malformed);
      EXPECT_TRUE(malformed);
      if (s.calls.empty()) {
        EXPECT_EQ(s.content, text);
      }
    }
  }
}

TEST(HermesParser, BrokenCallAfterAGoodOneKeepsTheGoodOneInAStream) {
  const std::string text =
      "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>\n<tool_call>{oops}</tool_call>";
  const auto r = parse_tool_calls(text, opts(ToolCallFormat::kHermes));
  EXPECT_TRUE(r.malformed);
  EXPECT_EQ(r.content, text);
  bool malformed = false;
  const auto s = stream(text, {10, 40, 60}, opts(ToolCallFormat::kHermes), &malformed);
  EXPECT_TRUE(malformed);
  ASSERT_EQ(s.calls.size(), 1u);
  EXPECT_EQ(s.calls[0].name, "f");
  EXPECT_EQ(s.content, "\n<tool_call>{oops}</tool_call>");
}

TEST(HermesParser, CutOffInsideACallThatWasShown) {
  const std::string text = "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": \"lo";
  ToolCallStreamParser p(opts(ToolCallFormat::kHermes));
  auto ev = p.push(text);
  auto tail = p.finish();
  ev.insert(ev.end(), tail.begin(), tail.end());
  const auto merged = merge_tool_call_events(ev);
  EXPECT_TRUE(p.malformed());
  ASSERT_EQ(merged.calls.size(), 1u);
  EXPECT_EQ(merged.calls[0].arguments, "{\"a\": \"lo");
  EXPECT_EQ(p.num_committed(), 1u);
}

TEST(HermesParser, ArgumentsStreamAsTheyArrive) {
  ToolCallStreamParser p(opts(ToolCallFormat::kHermes));
  EXPECT_TRUE(p.push("<tool_").empty());
  EXPECT_TRUE(p.push("call>\n{\"name\": \"get_").empty());
  auto ev = p.push("weather\", \"arguments\": {\"ci");
  ASSERT_EQ(ev.size(), 1u);
  ASSERT_TRUE(ev[0].call);
  EXPECT_EQ(ev[0].call->name, "get_weather");
  EXPECT_EQ(ev[0].call->id, "id0");
  EXPECT_EQ(ev[0].call->arguments, "{\"ci");
  ev = p.push("ty\": \"Paris\"}}\n</tool_call>");
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].call->arguments, "ty\": \"Paris\"}");
  EXPECT_TRUE(ev[0].call->name.empty());
  EXPECT_TRUE(p.finish().empty());
  ASSERT_EQ(p.calls().size(), 1u);
  EXPECT_FALSE(p.malformed());
}

TEST(HermesParser, ContentBeforeAMarkerIsNeverHeldLongerThanNeeded) {
  ToolCallStreamParser p(opts(ToolCallFormat::kHermes));
  auto ev = p.push("Hello <tool");
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].content, "Hello ");
  ev = p.push("box> there");
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].content, "<toolbox> there");
}

// ---- Llama 3.x JSON ----

TEST(Llama3JsonParser, OneCallWithParameters) {
  check_everywhere(ToolCallFormat::kLlama3Json,
                   "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
                   {"", {{"get_weather", "{\"city\": \"Paris\"}"}}});
}

TEST(Llama3JsonParser, PythonTagAndSeveralCalls) {
  check_everywhere(ToolCallFormat::kLlama3Json,
                   "<|python_tag|>{\"name\": \"a\", \"parameters\": {\"x\": {\"y\": [1]}}}; "
                   "{\"name\": \"b\", \"arguments\": {}}",
                   {"", {{"a", "{\"x\": {\"y\": [1]}}"}, {"b", "{}"}}});
  check_everywhere(ToolCallFormat::kLlama3Json,
                   "\n {\"type\": \"function\", \"name\": \"a\", \"parameters\": {\"u\": \"ü\"}}",
                   {"", {{"a", "{\"u\": \"ü\"}"}}});
}

TEST(Llama3JsonParser, TextIsContent) {
  check_everywhere(ToolCallFormat::kLlama3Json, "The weather is {sunny}.",
                   {"The weather is {sunny}.", {}});
  check_everywhere(ToolCallFormat::kLlama3Json, "<|python", {"<|python", {}});
  check_everywhere(ToolCallFormat::kLlama3Json, "<|python_ta g|>", {"<|python_ta g|>", {}});
}

TEST(Llama3JsonParser, JsonThatIsNotACallIsContent) {
  const std::string text = "{\"answer\": 42}";
  const auto r = parse_tool_calls(text, opts(ToolCallFormat::kLlama3Json));
  EXPECT_TRUE(r.malformed);
  EXPECT_EQ(r.content, text);
  const std::string broken = "<|python_tag|>{\"name\": \"f\", \"parameters\": {\"a\": }}";
  const auto b = parse_tool_calls(broken, opts(ToolCallFormat::kLlama3Json));
  EXPECT_TRUE(b.malformed);
  EXPECT_EQ(b.content, broken);
}

// ---- Mistral ----

TEST(MistralParser, ArrayOfCalls) {
  check_everywhere(ToolCallFormat::kMistral,
                   "[TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {\"q\": \"x]\"}}, "
                   "{\"name\": \"b\", \"arguments\": {\"n\": [1, 2]}}]",
                   {"", {{"a", "{\"q\": \"x]\"}"}, {"b", "{\"n\": [1, 2]}"}}});
}

TEST(MistralParser, ContentBeforeAndSingleObject) {
  check_everywhere(ToolCallFormat::kMistral,
                   "Sure.[TOOL_CALLS]{\"name\": \"a\", \"arguments\": {\"k\": \"日本\"}}",
                   {"Sure.", {{"a", "{\"k\": \"日本\"}"}}});
}

TEST(MistralParser, NameArgsForm) {
  check_everywhere(ToolCallFormat::kMistral,
                   "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]now[ARGS]{}",
                   {"", {{"get_weather", "{\"city\": \"Paris\"}"}, {"now", "{}"}}});
}

TEST(MistralParser, BrokenIsContent) {
  for (const std::string text :
       {"[TOOL_CALLS] sorry, no", "[TOOL_CALLS][{\"name\": 1}]",
        "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {}}, 5]", "[TOOL_CALLS]bad name[ARGS]{}"}) {
    SCOPED_TRACE(text);
    const auto r = parse_tool_calls(text, opts(ToolCallFormat::kMistral));
    EXPECT_TRUE(r.malformed);
    EXPECT_EQ(r.content, text);
    for (size_t cut = 0; cut <= text.size(); ++cut)
      stream(text, {cut}, opts(ToolCallFormat::kMistral));
  }
}

TEST(MistralParser, RandomIdsAreNineCharacters) {
  const std::string id = random_tool_call_id(ToolCallFormat::kMistral);
  EXPECT_EQ(id.size(), 9u);
  EXPECT_EQ(random_tool_call_id(ToolCallFormat::kHermes).rfind("call_", 0), 0u);
  ToolCallParserOptions o;
  o.format = ToolCallFormat::kMistral;
  const auto r = parse_tool_calls("[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {}}]", o);
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].id.size(), 9u);
}

// ---- none ----

TEST(NoParser, EverythingIsContent) {
  check_everywhere(ToolCallFormat::kNone, "<tool_call>{\"name\": \"f\"}</tool_call>",
                   {"<tool_call>{\"name\": \"f\"}</tool_call>", {}});
}

// ---- every format: arguments are valid JSON and streams agree with the whole parse on
// generated replies ----

TEST(AllParsers, GeneratedRepliesAgreeAtEverySplit) {
  const std::vector<std::string> args = {
      "{}", "{\"a\": 1}", "{\"s\": \"<tool_call>[TOOL_CALLS];{\\\"\"}",
      "{\"u\": \"\xF0\x9F\x98\x80 \xE4\xB8\xAD\", \"n\": [1.5, -2, 1e21, null, false]}",
      "{\"o\": {\"p\": {\"q\": [[], {}]}}}"};
  for (size_t k = 0; k < args.size(); ++k) {
    const std::string& a = args[k];
    const std::string& b = args[(k + 1) % args.size()];
    check_everywhere(ToolCallFormat::kHermes,
                     "x<tool_call>{\"name\": \"f\", \"arguments\": " + a +
                         "}</tool_call><tool_call>{\"name\": \"g\", \"arguments\": " + b +
                         "}</tool_call>",
                     {"x", {{"f", a}, {"g", b}}});
    check_everywhere(
        ToolCallFormat::kLlama3Json,
        "{\"name\": \"f\", \"parameters\": " + a + "};{\"name\": \"g\", \"parameters\": " + b + "}",
        {"", {{"f", a}, {"g", b}}});
    check_everywhere(ToolCallFormat::kMistral,
                     "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": " + a +
                         "},{\"name\": \"g\", \"arguments\": " + b + "}]",
                     {"", {{"f", a}, {"g", b}}});
    EXPECT_FALSE(nlohmann::json::parse(a, nullptr, false).is_discarded());
  }
}

}  // namespace
}  // namespace strata
