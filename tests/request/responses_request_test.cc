// The Responses API read as a chat-completions request (request/responses_request.h): the
// mapping of input items, instructions, tools and tool_choice onto chat messages, the
// previous response's history, the caching fields, and the refusals.
#include <gtest/gtest.h>

#include <optional>
#include <set>
#include <string>
#include <vector>

#include "request/chat_request.h"
#include "request/responses_request.h"

namespace strata {
namespace {

using ojson = nlohmann::ordered_json;

Result<ResponsesRequest> read_responses(const std::string& body) {
  return read_responses_request(ojson::parse(body));
}

// The refusal message of `body` ("" when it is accepted).
std::string responses_refusal(const std::string& body) {
  auto r = read_responses(body);
  if (r) return "";
  EXPECT_EQ(r.error().code, ErrorCode::kInvalidArgument);
  return r.error().message;
}

TEST(ResponsesRequest, AStringInputIsOneUserMessageAfterTheInstructions) {
  auto r = read_responses(R"({"model": "m", "instructions": "Be brief.", "input": "hi",
      "max_output_tokens": 16, "temperature": 0.5, "top_p": 0.9})");
  ASSERT_TRUE(r.has_value()) << r.error().message;
  const ojson chat = responses_chat_body(*r, ojson::array());
  EXPECT_EQ(chat["model"], "m");
  EXPECT_EQ(chat["max_tokens"], 16);
  EXPECT_EQ(chat["temperature"], 0.5);
  EXPECT_EQ(chat["top_p"], 0.9);
  EXPECT_EQ(chat["stream"], false);
  EXPECT_EQ(chat["messages"], ojson::parse(R"([{"role": "system", "content": "Be brief."},
      {"role": "user", "content": "hi"}])"));
  EXPECT_TRUE(r->store) << "store defaults to true";
  EXPECT_FALSE(r->previous_response_id);
  EXPECT_EQ(r->echo["max_output_tokens"], 16);
}

TEST(ResponsesRequest, MapsMessageItemsAndTheirParts) {
  auto r = read_responses(R"({"input": [
      {"role": "developer", "content": "rules"},
      {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"},
                                                      {"type": "input_text", "text": "b"}]},
      {"type": "message", "role": "assistant",
       "content": [{"type": "output_text", "text": "c", "annotations": []}]},
      {"role": "system", "content": "more"}]})");
  ASSERT_TRUE(r.has_value()) << r.error().message;
  EXPECT_EQ(r->input_messages, ojson::parse(R"([{"role": "system", "content": "rules"},
      {"role": "user", "content": "a\nb"}, {"role": "assistant", "content": "c"},
      {"role": "system", "content": "more"}])"));
}

TEST(ResponsesRequest, FunctionCallsJoinTheAssistantTurnAndOutputsAreToolMessages) {
  auto r = read_responses(R"({"input": [
      {"role": "user", "content": "weather?"},
      {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
      {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_weather",
       "arguments": "{\"city\": \"Paris\"}", "status": "completed"},
      {"type": "function_call", "call_id": "call_2", "name": "get_time", "arguments": "{}"},
      {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
      {"type": "function_call_output", "call_id": "call_2",
       "output": [{"type": "input_text", "text": "noon"}]},
      {"type": "reasoning", "id": "rs_1", "summary": []},
      {"type": "function_call", "call_id": "call_3", "name": "get_time", "arguments": "{}"}],
      "tools": [{"type": "function", "name": "get_weather", "description": "d",
                 "parameters": {"type": "object"}, "strict": true},
                {"type": "function", "name": "get_time", "parameters": {"type": "object"}}],
      "tool_choice": {"type": "function", "name": "get_time"}})");
  ASSERT_TRUE(r.has_value()) << r.error().message;
  const ojson& m = r->input_messages;
  ASSERT_EQ(m.size(), 5u) << m.dump();
  EXPECT_EQ(m[1]["role"], "assistant");
  EXPECT_EQ(m[1]["content"], "Checking.");
  ASSERT_EQ(m[1]["tool_calls"].size(), 2u);
  EXPECT_EQ(m[1]["tool_calls"][0]["id"], "call_1");
  EXPECT_EQ(m[1]["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(m[1]["tool_calls"][0]["function"]["arguments"], "{\"city\": \"Paris\"}");
  EXPECT_EQ(m[2],
            ojson::parse(R"({"role": "tool", "tool_call_id": "call_1", "content": "sunny"})"));
  EXPECT_EQ(m[3]["content"], "noon");
  // A call after a tool message starts a new assistant turn, with empty content.
  EXPECT_EQ(m[4]["role"], "assistant");
  EXPECT_EQ(m[4]["content"], "");
  EXPECT_EQ(m[4]["tool_calls"][0]["id"], "call_3");
  const ojson chat = responses_chat_body(*r, ojson::array());
  EXPECT_EQ(chat["tools"][0], ojson::parse(R"({"type": "function", "function": {"name":
      "get_weather", "description": "d", "parameters": {"type": "object"}}})"));
  EXPECT_EQ(chat["tool_choice"],
            ojson::parse(R"({"type": "function", "function": {"name": "get_time"}})"));
  // The chat path reads what the mapping wrote.
  ojson body = chat;
  auto read_chat = read_chat_request(body, GenerationPrompt::kAlways);
  ASSERT_TRUE(read_chat.has_value()) << read_chat.error().message;
  EXPECT_EQ(read_chat->function_names, (std::vector<std::string>{"get_weather", "get_time"}));
  EXPECT_EQ(read_chat->tool_choice.mode, ToolChoiceMode::kFunction);
}

TEST(ResponsesRequest, APreviousResponsesHistoryGoesBetweenInstructionsAndInput) {
  auto r = read_responses(
      R"({"instructions": "sys", "previous_response_id": "resp_1", "input": "again"})");
  ASSERT_TRUE(r.has_value()) << r.error().message;
  EXPECT_EQ(r->previous_response_id, "resp_1");
  const ojson history = ojson::parse(
      R"([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}])");
  const ojson chat = responses_chat_body(*r, history);
  EXPECT_EQ(chat["messages"], ojson::parse(R"([{"role": "system", "content": "sys"},
      {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
      {"role": "user", "content": "again"}])"));
}

TEST(ResponsesRequest, ReadsTheCachingAndStorageFields) {
  auto r = read_responses(
      R"({"input": "x", "store": false, "stream": true, "prompt_cache_key": "agent-7",
      "prompt_cache_retention": "24h"})");
  ASSERT_TRUE(r.has_value()) << r.error().message;
  EXPECT_FALSE(r->store);
  EXPECT_TRUE(r->stream);
  EXPECT_EQ(r->prompt_cache_key, "agent-7");
  EXPECT_EQ(r->retention_ttl_s, kRetention24hTtlS);
  EXPECT_EQ(r->retention, "24h");
  EXPECT_EQ(retention_ttl_s("in_memory"), kRetentionInMemoryTtlS);
  EXPECT_EQ(retention_ttl_s("in-memory"), kRetentionInMemoryTtlS);
  EXPECT_FALSE(retention_ttl_s("1h"));
}

TEST(ResponsesRequest, AcceptsFieldsItHasNoUseFor) {
  EXPECT_EQ(responses_refusal(R"({"input": "x", "reasoning": {"effort": "low"}, "include": [],
      "service_tier": "auto", "truncation": "disabled", "metadata": {"k": "v"}, "user": "u",
      "text": {"format": {"type": "text"}}, "parallel_tool_calls": false, "background": false})"),
            "");
}

TEST(ResponsesRequest, RefusesWhatItCannotServe) {
  EXPECT_NE(responses_refusal(R"({"model": "m"})").find("'input' is required"), std::string::npos);
  EXPECT_NE(responses_refusal(R"({"input": 5})").find("'input' must be"), std::string::npos);
  EXPECT_NE(responses_refusal(R"({"input": [{"type": "item_reference", "id": "x"}]})")
                .find("input item type 'item_reference' is not supported"),
            std::string::npos);
  EXPECT_NE(responses_refusal(R"({"input": [{"role": "user", "content": [{"type": "input_image",
      "image_url": "http://x"}]}]})")
                .find("content part type 'input_image'"),
            std::string::npos);
  EXPECT_NE(responses_refusal(R"({"input": [{"role": "tool", "content": "x"}]})").find("role"),
            std::string::npos);
  EXPECT_NE(responses_refusal(R"({"input": [{"role": "user"}]})").find("content is required"),
            std::string::npos);
  EXPECT_NE(responses_refusal(R"({"input": [{"type": "function_call", "call_id": "c", "name": "f",
      "arguments": "not json"}]})")
                .find("arguments must be a JSON object"),
            std::string::npos);
  EXPECT_NE(responses_refusal(R"({"input": [{"type": "function_call_output", "output": "x"}]})")
                .find("call_id must be a string"),
            std::string::npos);
  EXPECT_NE(responses_refusal(R"({"input": "x", "tool_choice": "any"})").find("tool_choice"),
            std::string::npos);
  EXPECT_NE(responses_refusal(R"({"input": "x", "tool_choice": {"type": "file_search"}})")
                .find("file_search"),
            std::string::npos);
  EXPECT_NE(responses_refusal(R"({"input": "x", "tools": [{"type": "web_search"}],
                                  "tool_choice": {"type": "web_search"}})")
                .find("tool type 'web_search', which Strata does not run"),
            std::string::npos);
  EXPECT_NE(responses_refusal(R"({"input": "x", "tools": [{"type": "namespace", "name": "n"}]})")
                .find("tools[0].tools must be an array"),
            std::string::npos);
  EXPECT_NE(
      responses_refusal(R"({"input": "x", "max_output_tokens": 0})").find("max_output_tokens"),
      std::string::npos);
  EXPECT_NE(responses_refusal(R"({"input": "x", "temperature": "hot"})").find("temperature"),
            std::string::npos);
  EXPECT_NE(responses_refusal(R"({"input": "x", "store": "yes"})").find("store"),
            std::string::npos);
  EXPECT_NE(responses_refusal(R"({"input": "x", "previous_response_id": 7})")
                .find("previous_response_id"),
            std::string::npos);
  EXPECT_NE(responses_refusal(R"({"input": "x", "prompt_cache_retention": "1w"})")
                .find("prompt_cache_retention"),
            std::string::npos);
  EXPECT_NE(responses_refusal(R"({"input": "x", "prompt_cache_key": ""})").find("prompt_cache_key"),
            std::string::npos);
  EXPECT_NE(responses_refusal(R"({"input": "x", "text": {"format": {"type": "json_schema"}}})")
                .find("json_schema"),
            std::string::npos);
  EXPECT_NE(responses_refusal(R"({"input": "x", "background": true})").find("background"),
            std::string::npos);
  EXPECT_NE(responses_refusal(R"({"input": "x", "conversation": "conv_1"})").find("conversation"),
            std::string::npos);
  EXPECT_NE(responses_refusal(R"([1])").find("JSON object"), std::string::npos);
}

// Codex's default tools (captured from codex-cli 0.171.0): function tools, a `namespace`
// group of function tools (its multi-agent tools), and the hosted web_search. The functions
// are offered flat under qualified names; the hosted tools (and any other type) are left out
// and listed; a call item with a namespace reads back as the qualified name.
TEST(ResponsesRequest, FlattensNamespacesAndLeavesHostedToolsOut) {
  auto r = read_responses_request(ojson::parse(R"({"input": [
      {"type": "function_call", "call_id": "c1", "namespace": "multi_agent_v1",
       "name": "spawn_agent", "arguments": "{\"task\":\"t\"}"},
      {"type": "function_call_output", "call_id": "c1", "output": "ok"}],
    "tools": [
      {"type": "function", "name": "exec_command", "parameters": {"type": "object"}},
      {"type": "namespace", "name": "multi_agent_v1", "description": "Sub-agents.",
       "tools": [{"type": "function", "name": "spawn_agent", "strict": false,
                  "parameters": {"type": "object", "properties": {"task": {"type": "string"}}}},
                 {"type": "function", "name": "close_agent"},
                 {"type": "custom", "name": "freeform"}]},
      {"type": "namespace", "name": "mcp__files__",
       "tools": [{"type": "function", "name": "read"}]},
      {"type": "web_search", "external_web_access": false},
      {"type": "file_search", "vector_store_ids": ["v"]},
      {"type": "web_search"}],
    "tool_choice": {"type": "function", "namespace": "multi_agent_v1", "name": "close_agent"}})"));
  ASSERT_TRUE(r.has_value()) << r.error().message;
  std::vector<std::string> names;
  for (const ojson& t : r->chat_body["tools"]) names.push_back(t["function"]["name"]);
  EXPECT_EQ(names, (std::vector<std::string>{"exec_command", "multi_agent_v1__spawn_agent",
                                             "multi_agent_v1__close_agent",
                                             "multi_agent_v1__freeform", "mcp__files__read"}));
  EXPECT_EQ(r->omitted_tools, (std::vector<std::string>{"web_search", "file_search"}));
  EXPECT_EQ(r->custom_tools, (std::set<std::string>{"multi_agent_v1__freeform"}));
  ASSERT_EQ(r->namespaced.count("multi_agent_v1__spawn_agent"), 1u);
  EXPECT_EQ(r->namespaced.at("multi_agent_v1__spawn_agent").name_space, "multi_agent_v1");
  EXPECT_EQ(r->namespaced.at("multi_agent_v1__spawn_agent").name, "spawn_agent");
  EXPECT_EQ(r->namespaced.at("mcp__files__read").name, "read");
  EXPECT_EQ(r->chat_body["tool_choice"]["function"]["name"], "multi_agent_v1__close_agent");
  EXPECT_EQ(r->input_messages[0]["tool_calls"][0]["function"]["name"],
            "multi_agent_v1__spawn_agent");
  // The echo keeps the tools as given.
  EXPECT_EQ(r->echo["tools"].size(), 6u);
  EXPECT_EQ(qualified_tool_name("a", "b"), "a__b");
  EXPECT_EQ(qualified_tool_name("mcp__s__", "t"), "mcp__s__t");
  // Hosted tools alone: nothing offered, nothing refused.
  auto hosted = read_responses_request(
      ojson::parse(R"({"input": "x", "tools": [{"type": "web_search_preview"},
                      {"type": "code_interpreter", "container": {"type": "auto"}},
                      {"type": "image_generation"}, {"type": "mcp", "server_label": "s"},
                      {"type": "computer_use_preview"}, {"type": "local_shell"}]})"));
  ASSERT_TRUE(hosted.has_value()) << hosted.error().message;
  EXPECT_FALSE(hosted->chat_body.contains("tools"));
  EXPECT_EQ(hosted->omitted_tools.size(), 6u);
}

// Custom tools (free-form input: Codex's apply_patch for its own models) are offered as a
// function of one string parameter, `input`, with a grammar's definition in the
// description; their calls come back as custom_tool_call items and read as such calls.
TEST(ResponsesRequest, CustomToolsAreOfferedAsOneStringArgument) {
  auto r = read_responses_request(ojson::parse(R"({"input": [
      {"type": "message", "role": "user", "content": "patch it"},
      {"type": "custom_tool_call", "call_id": "c1", "name": "apply_patch",
       "input": "*** Begin Patch\n*** End Patch"},
      {"type": "custom_tool_call_output", "call_id": "c1", "output": "Done!"}],
    "tools": [{"type": "custom", "name": "apply_patch", "description": "Edit files.",
               "format": {"type": "grammar", "syntax": "lark", "definition": "start: begin_patch"}}],
    "tool_choice": {"type": "custom", "name": "apply_patch"}})"));
  ASSERT_TRUE(r.has_value()) << r.error().message;
  const ojson& fn = r->chat_body["tools"][0]["function"];
  EXPECT_EQ(fn["name"], "apply_patch");
  EXPECT_EQ(fn["description"],
            "Edit files.\n\nThe input follows this lark grammar:\nstart: begin_patch");
  EXPECT_EQ(fn["parameters"]["required"], ojson::parse(R"(["input"])"));
  EXPECT_EQ(r->custom_tools, (std::set<std::string>{"apply_patch"}));
  EXPECT_TRUE(r->omitted_tools.empty());
  EXPECT_EQ(r->chat_body["tool_choice"]["function"]["name"], "apply_patch");
  const ojson& call = r->input_messages[1]["tool_calls"][0]["function"];
  EXPECT_EQ(call["name"], "apply_patch");
  EXPECT_EQ(custom_tool_input(call["arguments"].get<std::string>()),
            "*** Begin Patch\n*** End Patch");
  EXPECT_EQ(r->input_messages[2], ojson::parse(R"({"role": "tool", "tool_call_id": "c1",
                                                   "content": "Done!"})"));
  EXPECT_EQ(custom_tool_input(custom_tool_arguments("a \"b\"\n")), "a \"b\"\n");
  EXPECT_FALSE(custom_tool_input("{\"other\": 1}").has_value());
  EXPECT_FALSE(custom_tool_input("not json").has_value());
}

}  // namespace
}  // namespace strata

namespace strata {
namespace {

// item_reference items: listed in order, named after their response, and replaced with the
// item found (every other item untouched); one nobody stored is "not found".
TEST(ResponsesRequest, ItemReferencesAreListedAndResolved) {
  ojson body = ojson::parse(R"({"input": [
      {"role": "user", "content": "Weather?"},
      {"type": "item_reference", "id": "msg_00ab_0"},
      {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
      {"type": "item_reference", "id": "fc_00ab_1"},
      {"type": "function_call_output", "call_id": "c1", "output": "sunny"}]})");
  auto refs = item_references(body);
  ASSERT_TRUE(refs.has_value());
  EXPECT_EQ(*refs, (std::vector<std::string>{"msg_00ab_0", "fc_00ab_1"}));
  EXPECT_EQ(response_of_item("msg_00ab_0"), "resp_00ab");
  EXPECT_EQ(response_of_item("fc_7f_12"), "resp_7f");
  for (const char* bad : {"x", "msg_", "msg_ab", "msg__0", "msg_ab_", "rs_ab_0", "resp_ab"}) {
    EXPECT_FALSE(response_of_item(bad).has_value()) << bad;
  }
  std::vector<std::string> asked;
  auto st = resolve_item_references(body, [&](const std::string& id) -> std::optional<ojson> {
    asked.push_back(id);
    return ojson{{"type", "message"}, {"role", "assistant"}, {"content", "from " + id}};
  });
  ASSERT_TRUE(st.has_value()) << st.error().message;
  EXPECT_EQ(asked, *refs);
  EXPECT_EQ(body["input"][1]["content"], "from msg_00ab_0");
  EXPECT_EQ(body["input"][2]["type"], "function_call");
  EXPECT_EQ(body["input"][3]["content"], "from fc_00ab_1");
  EXPECT_TRUE(item_references(body)->empty());
  EXPECT_TRUE(read_responses_request(body).has_value());

  ojson missing = ojson::parse(R"({"input": [{"type": "item_reference", "id": "msg_1_0"}]})");
  auto refused = resolve_item_references(missing, [](const std::string&) { return std::nullopt; });
  ASSERT_FALSE(refused.has_value());
  EXPECT_EQ(refused.error().code, ErrorCode::kInvalidArgument);
  EXPECT_EQ(refused.error().message, "Item with id 'msg_1_0' not found.");
  // Unresolved, the reading refuses a reference.
  EXPECT_FALSE(read_responses_request(missing).has_value());
  EXPECT_FALSE(
      item_references(ojson::parse(R"({"input": [{"type": "item_reference"}]})")).has_value());
  EXPECT_TRUE(item_references(ojson::parse(R"({"input": "text"})"))->empty());
}

}  // namespace
}  // namespace strata
