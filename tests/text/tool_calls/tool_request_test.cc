#include "text/tool_calls/tool_request.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "text/tool_calls/tool_call_format.h"

namespace strata {
namespace {

using ojson = nlohmann::ordered_json;

ojson tool(const std::string& name) {
  return ojson{{"type", "function"},
               {"function",
                {{"name", name},
                 {"description", "d"},
                 {"parameters",
                  {{"type", "object"},
                   {"properties", {{"city", {{"type", "string"}}}}},
                   {"required", {"city"}}}}}}};
}

TEST(ValidateTools, AcceptsOpenAiTools) {
  auto names = validate_tools(ojson::array({tool("get_weather"), tool("search-web_2")}));
  ASSERT_TRUE(names) << names.error().message;
  EXPECT_EQ(*names, (std::vector<std::string>{"get_weather", "search-web_2"}));
  ojson minimal = ojson::array({ojson{{"type", "function"}, {"function", {{"name", "f"}}}}});
  EXPECT_TRUE(validate_tools(minimal));
}

TEST(ValidateTools, RefusesWithTheFieldNamed) {
  struct Case {
    ojson tools;
    std::string message_part;
  };
  ojson dup = ojson::array({tool("f"), tool("f")});
  ojson bad_type = ojson::array({tool("f")});
  bad_type[0]["type"] = "retrieval";
  ojson no_fn = ojson::array({ojson{{"type", "function"}}});
  ojson bad_name = ojson::array({tool("has space")});
  ojson long_name = ojson::array({tool(std::string(65, 'a'))});
  ojson bad_params = ojson::array({tool("f")});
  bad_params[0]["function"]["parameters"] = "object";
  ojson bad_required = ojson::array({tool("f")});
  bad_required[0]["function"]["parameters"]["required"] = ojson::array({1});
  ojson bad_desc = ojson::array({tool("f")});
  bad_desc[0]["function"]["description"] = 5;
  const std::vector<Case> cases = {
      {ojson::object(), "'tools' must be an array"},
      {ojson::array({5}), "tools[0] must be an object"},
      {bad_type, "tools[0].type"},
      {no_fn, "tools[0].function must be an object"},
      {bad_name, "tools[0].function.name 'has space'"},
      {long_name, "1 to 64"},
      {dup, "tools[1].function.name 'f' is given twice"},
      {bad_params, "tools[0].function.parameters"},
      {bad_required, "required"},
      {bad_desc, "description"},
  };
  for (const Case& c : cases) {
    auto r = validate_tools(c.tools);
    ASSERT_FALSE(r) << c.tools.dump();
    EXPECT_EQ(r.error().code, ErrorCode::kInvalidArgument);
    EXPECT_NE(r.error().message.find(c.message_part), std::string::npos) << r.error().message;
  }
}

TEST(ToolChoice, Modes) {
  const std::vector<std::string> names = {"f", "g"};
  EXPECT_EQ(parse_tool_choice(nullptr, names)->mode, ToolChoiceMode::kAuto);
  EXPECT_EQ(parse_tool_choice(nullptr, {})->mode, ToolChoiceMode::kNone);
  ojson none = "none", aut = "auto", req = "required";
  EXPECT_EQ(parse_tool_choice(&none, names)->mode, ToolChoiceMode::kNone);
  EXPECT_EQ(parse_tool_choice(&aut, names)->mode, ToolChoiceMode::kAuto);
  EXPECT_EQ(parse_tool_choice(&aut, {})->mode, ToolChoiceMode::kNone);
  EXPECT_EQ(parse_tool_choice(&req, names)->mode, ToolChoiceMode::kRequired);
  ojson named = {{"type", "function"}, {"function", {{"name", "g"}}}};
  auto n = parse_tool_choice(&named, names);
  ASSERT_TRUE(n);
  EXPECT_EQ(n->mode, ToolChoiceMode::kFunction);
  EXPECT_EQ(n->function, "g");
}

TEST(ToolChoice, Refusals) {
  const std::vector<std::string> names = {"f"};
  ojson req = "required", odd = "sometimes", num = 3;
  ojson unknown = {{"type", "function"}, {"function", {{"name", "zzz"}}}};
  ojson no_name = {{"type", "function"}, {"function", ojson::object()}};
  ojson wrong_type = {{"type", "tool"}, {"function", {{"name", "f"}}}};
  EXPECT_NE(parse_tool_choice(&req, {}).error().message.find("needs 'tools'"), std::string::npos);
  EXPECT_FALSE(parse_tool_choice(&odd, names));
  EXPECT_FALSE(parse_tool_choice(&num, names));
  EXPECT_NE(parse_tool_choice(&unknown, names).error().message.find("not in 'tools'"),
            std::string::npos);
  EXPECT_FALSE(parse_tool_choice(&no_name, names));
  EXPECT_FALSE(parse_tool_choice(&wrong_type, names));
}

TEST(ToolChoice, CheckReply) {
  const std::vector<ToolCall> none;
  const std::vector<ToolCall> f = {ToolCall{.id = "1", .name = "f", .arguments = "{}"}};
  const std::vector<ToolCall> fg = {f[0], ToolCall{.id = "2", .name = "g", .arguments = "{}"}};
  EXPECT_TRUE(check_tool_choice(ToolChoice{ToolChoiceMode::kAuto, ""}, none));
  EXPECT_TRUE(check_tool_choice(ToolChoice{ToolChoiceMode::kNone, ""}, none));
  EXPECT_FALSE(check_tool_choice(ToolChoice{ToolChoiceMode::kRequired, ""}, none));
  EXPECT_TRUE(check_tool_choice(ToolChoice{ToolChoiceMode::kRequired, ""}, fg));
  EXPECT_TRUE(check_tool_choice(ToolChoice{ToolChoiceMode::kFunction, "f"}, f));
  auto wrong = check_tool_choice(ToolChoice{ToolChoiceMode::kFunction, "f"}, fg);
  ASSERT_FALSE(wrong);
  EXPECT_EQ(wrong.error().code, ErrorCode::kFailedPrecondition);
  EXPECT_NE(wrong.error().message.find("'g'"), std::string::npos);
}

TEST(MessageToolCalls, ValidatesShape) {
  ojson ok = ojson::parse(R"([{"role": "user", "content": "hi"},
    {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
      "function": {"name": "f", "arguments": "{\"a\": 1}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "42"}])");
  EXPECT_TRUE(validate_message_tool_calls(ok));
  ojson bad = ok;
  bad[1]["tool_calls"][0]["function"]["arguments"] = 5;
  auto r = validate_message_tool_calls(bad);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("messages[1].tool_calls[0].function.arguments"),
            std::string::npos);
  bad = ok;
  bad[1]["tool_calls"][0].erase("function");
  EXPECT_FALSE(validate_message_tool_calls(bad));
  bad = ok;
  bad[1]["tool_calls"][0]["id"] = 7;
  EXPECT_FALSE(validate_message_tool_calls(bad));
}

TEST(MessageToolCalls, StringArgumentsBecomeObjectsInOrder) {
  ojson m = ojson::parse(R"([{"role": "assistant", "content": "", "tool_calls": [
      {"type": "function", "function": {"name": "f", "arguments": "{\"z\": 1, \"a\": [2]}"}},
      {"type": "function", "function": {"name": "g", "arguments": "not json"}},
      {"type": "function", "function": {"name": "h", "arguments": {"k": "v"}}}]}])");
  EXPECT_TRUE(normalize_tool_call_messages(m));
  EXPECT_EQ(m[0]["tool_calls"][0]["function"]["arguments"].dump(), R"({"z":1,"a":[2]})");
  EXPECT_EQ(m[0]["tool_calls"][1]["function"]["arguments"], "not json");
  EXPECT_EQ(m[0]["tool_calls"][2]["function"]["arguments"].dump(), R"({"k":"v"})");
  EXPECT_FALSE(normalize_tool_call_messages(m));
  ojson null_content = ojson::parse(R"([{"role": "assistant", "content": null, "tool_calls": []},
      {"role": "assistant", "tool_calls": []}, {"role": "assistant", "content": null}])");
  EXPECT_TRUE(normalize_tool_call_messages(null_content));
  EXPECT_EQ(null_content[0]["content"], "");
  EXPECT_EQ(null_content[1]["content"], "");
  EXPECT_TRUE(null_content[2]["content"].is_null());  // no tool calls: left to the template
}

std::string read_template(const std::string& name) {
  std::ifstream in(std::string(STRATA_SOURCE_DIR) + "/tests/text/jinja/templates/" + name);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(ToolCallFormat, AutoReadsTheChatTemplate) {
  EXPECT_EQ(detect_tool_call_format(read_template("qwen2.5.jinja")), ToolCallFormat::kHermes);
  EXPECT_EQ(detect_tool_call_format(read_template("llama3.1.jinja")), ToolCallFormat::kLlama3Json);
  EXPECT_EQ(detect_tool_call_format(read_template("llama3.2.jinja")), ToolCallFormat::kLlama3Json);
  EXPECT_EQ(detect_tool_call_format(read_template("mistral-v0.3.jinja")), ToolCallFormat::kMistral);
  EXPECT_EQ(detect_tool_call_format(read_template("mistral-v7.jinja")), ToolCallFormat::kMistral);
  EXPECT_EQ(detect_tool_call_format(read_template("chatml.jinja")), ToolCallFormat::kNone);
  EXPECT_EQ(detect_tool_call_format(read_template("llama2.jinja")), ToolCallFormat::kNone);
  EXPECT_EQ(detect_tool_call_format(""), ToolCallFormat::kNone);
}

TEST(ToolCallFormat, Names) {
  EXPECT_EQ(*resolve_tool_call_format("hermes", ""), ToolCallFormat::kHermes);
  EXPECT_EQ(*resolve_tool_call_format("qwen", ""), ToolCallFormat::kHermes);
  EXPECT_EQ(*resolve_tool_call_format("llama3_json", ""), ToolCallFormat::kLlama3Json);
  EXPECT_EQ(*resolve_tool_call_format("mistral", ""), ToolCallFormat::kMistral);
  EXPECT_EQ(*resolve_tool_call_format("none", "<tool_call>"), ToolCallFormat::kNone);
  EXPECT_EQ(*resolve_tool_call_format("auto", "{{ '<tool_call>' }}"), ToolCallFormat::kHermes);
  auto bad = resolve_tool_call_format("gpt", "");
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("hermes"), std::string::npos);
  for (auto f : {ToolCallFormat::kNone, ToolCallFormat::kHermes, ToolCallFormat::kLlama3Json,
                 ToolCallFormat::kMistral}) {
    EXPECT_EQ(*resolve_tool_call_format(tool_call_format_name(f), ""), f);
  }
}

}  // namespace
}  // namespace strata
