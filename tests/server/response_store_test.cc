// The stored responses: bounded by count and by bytes (least recently used dropped first),
// erased on request, and the prompt_cache_key groups.
#include "server/response_store.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>

namespace strata {
namespace {

std::shared_ptr<const StoredResponse> stored(int n, size_t num_tokens = 1) {
  auto r = std::make_shared<StoredResponse>();
  r->response = nlohmann::json{{"n", n}};
  r->history.push_back(nlohmann::ordered_json{{"role", "user"}, {"content", "hi"}});
  ConversationRecord rec;
  rec.tokens.assign(num_tokens, n);
  r->record = std::move(rec);
  return r;
}

TEST(ResponseStoreTest, KeepsTheMostRecentlyUsedWithinTheCount) {
  ResponseStore store(3, size_t{1} << 20);
  store.put("a", stored(1));
  store.put("b", stored(2));
  store.put("c", stored(3));
  ASSERT_NE(store.find("a"), nullptr);  // a is now the most recent
  store.put("d", stored(4));            // drops b, the least recently used
  EXPECT_EQ(store.find("b"), nullptr);
  EXPECT_EQ(store.find("a")->response["n"], 1);
  EXPECT_NE(store.find("c"), nullptr);
  EXPECT_NE(store.find("d"), nullptr);
  const auto st = store.stats();
  EXPECT_EQ(st.responses, 3u);
  EXPECT_EQ(st.dropped, 1u);
}

TEST(ResponseStoreTest, KeepsWithinTheBytesAndRefusesOneThatCanNeverFit) {
  const size_t one = ResponseStore::size_of(*stored(1, 1000)) + 1;
  ResponseStore store(100, 2 * one + one / 2);
  store.put("a", stored(1, 1000));
  store.put("b", stored(2, 1000));
  store.put("c", stored(3, 1000));  // three do not fit: a goes
  EXPECT_EQ(store.find("a"), nullptr);
  EXPECT_NE(store.find("b"), nullptr);
  EXPECT_NE(store.find("c"), nullptr);
  EXPECT_LE(store.stats().bytes, 2 * one + one / 2);
  store.put("huge", stored(4, 100'000));  // larger than the whole bound: not stored
  EXPECT_EQ(store.find("huge"), nullptr);
  EXPECT_EQ(store.stats().responses, 2u) << "and nothing dropped for it";
}

TEST(ResponseStoreTest, EraseAndReplace) {
  ResponseStore store(10, size_t{1} << 20);
  store.put("a", stored(1));
  const size_t bytes = store.stats().bytes;
  store.put("a", stored(2));
  EXPECT_EQ(store.find("a")->response["n"], 2);
  EXPECT_EQ(store.stats().responses, 1u);
  EXPECT_EQ(store.stats().bytes, bytes);
  EXPECT_TRUE(store.erase("a"));
  EXPECT_FALSE(store.erase("a"));
  EXPECT_EQ(store.find("a"), nullptr);
  EXPECT_EQ(store.stats().bytes, 0u);
  ResponseStore none(0, size_t{1} << 20);
  none.put("a", stored(1));
  EXPECT_EQ(none.find("a"), nullptr) << "0: nothing stored";
}

TEST(ResponseStoreTest, GroupsKeepTheirLastPinsAndAreBounded) {
  ResponseStore store(2, size_t{1} << 20);
  EXPECT_TRUE(store.group_pins("k").hashes.empty());
  store.set_group_pins("k", {.hashes = {1, 2}, .expires_ms = 10});
  store.set_group_pins("k", {.hashes = {1, 2, 3}, .expires_ms = 20});
  EXPECT_EQ(store.group_pins("k").hashes.size(), 3u);
  EXPECT_EQ(store.group_pins("k").expires_ms, 20);
  store.set_group_pins("l", {.hashes = {4}, .expires_ms = 1});
  store.set_group_pins("m", {.hashes = {5}, .expires_ms = 1});  // drops k, the oldest key
  EXPECT_TRUE(store.group_pins("k").hashes.empty());
  EXPECT_EQ(store.group_pins("m").hashes.size(), 1u);
}

}  // namespace
}  // namespace strata
