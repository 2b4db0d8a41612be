// The pin table on its own (no tree), and the fuzzer's case end to end through the tree:
// a client's short, low soft pin on a block an operator also soft-pinned must lapse on its
// own TTL once the operator unpins, not live on with the operator's hour.
#include "cache/pin_table.h"

#include <gtest/gtest.h>

#include <vector>

#include "cache/radix_tree.h"
#include "common/clock.h"

namespace strata {
namespace {

constexpr BlockHash kBlock = 0xB10C;
constexpr int64_t kHourMs = 3'600'000;
constexpr int64_t kClientTtlMs = 300'000;

PinPriority prio(int32_t v) {
  return *PinPriority::make(v);
}

PinOptions admin_pin() {
  return PinOptions{.ttl_ms = kHourMs, .priority = PinPriority()};
}
PinOptions client_pin() {
  return PinOptions{.ttl_ms = kClientTtlMs, .priority = PinPriority::lowest()};
}

// Drops every soft pin due at now_ms; returns how many went.
int32_t expire_all(PinTable& t, int64_t now_ms) {
  int32_t n = 0;
  while (auto c = t.expire_one(now_ms)) n += static_cast<int32_t>(c->pins_removed);
  return n;
}

TEST(PinTableTest, AdminUnpinLeavesTheClientPinOnItsOwnTtl) {
  ManualClock clock(0);
  PinTable t;
  EXPECT_TRUE(t.pin(kBlock, admin_pin(), clock.now_ms()));  // the block's first soft pin
  EXPECT_FALSE(t.pin(kBlock, client_pin(), clock.now_ms()));
  EXPECT_EQ(t.count(kBlock), 2u);
  EXPECT_EQ(t.priority(kBlock), PinPriority());  // the max over both
  EXPECT_EQ(t.soft_pinned_blocks_at_most(PinPriority::lowest()), 0);

  // The operator unpins: the highest-priority soft pin goes, the client's stays.
  const PinChange c = t.unpin_one(kBlock);
  EXPECT_EQ(c.pins_removed, 1u);
  EXPECT_FALSE(c.soft_cleared);
  EXPECT_EQ(t.count(kBlock), 1u);
  EXPECT_EQ(t.priority(kBlock), PinPriority::lowest());
  EXPECT_EQ(t.soft_pinned_blocks_at_most(PinPriority::lowest()), 1);
  ASSERT_TRUE(t.check().has_value()) << t.check().error().message;

  // It lapses at its own 300 s, not at the operator's hour.
  clock.set_ms(kClientTtlMs - 1);
  EXPECT_EQ(expire_all(t, clock.now_ms()), 0);
  clock.set_ms(kClientTtlMs);
  EXPECT_EQ(expire_all(t, clock.now_ms()), 1);
  EXPECT_EQ(t.count(kBlock), 0u);
  EXPECT_EQ(t.pinned_blocks(), 0);
  EXPECT_EQ(t.soft_pinned_blocks(), 0);
  ASSERT_TRUE(t.check().has_value()) << t.check().error().message;
}

TEST(PinTableTest, RefreshResetsEachPinToItsOwnTtl) {
  ManualClock clock(0);
  PinTable t;
  t.pin(kBlock, admin_pin(), clock.now_ms());
  t.pin(kBlock, client_pin(), clock.now_ms());
  clock.set_ms(200'000);
  t.refresh(kBlock, clock.now_ms());  // client: 500 s; operator: 200 s + 1 h
  clock.set_ms(499'999);
  EXPECT_EQ(expire_all(t, clock.now_ms()), 0);
  clock.set_ms(500'000);
  EXPECT_EQ(expire_all(t, clock.now_ms()), 1);  // the client's pin only
  EXPECT_EQ(t.count(kBlock), 1u);
  EXPECT_EQ(t.priority(kBlock), PinPriority());
  clock.set_ms(200'000 + kHourMs);
  EXPECT_EQ(expire_all(t, clock.now_ms()), 1);
  EXPECT_EQ(t.pinned_blocks(), 0);
  ASSERT_TRUE(t.check().has_value()) << t.check().error().message;
}

TEST(PinTableTest, UnpinTakesHardFirstThenHighestPriorityThenLongestTtl) {
  PinTable t;
  t.pin(kBlock, PinOptions{.ttl_ms = 100, .priority = prio(5)}, 0);
  t.pin(kBlock, PinOptions{.ttl_ms = 900, .priority = prio(5)}, 0);
  t.pin(kBlock, PinOptions{.ttl_ms = 5'000, .priority = prio(-5)}, 0);
  t.pin(kBlock, PinOptions{}, 0);  // hard
  EXPECT_EQ(t.hard_count(kBlock), 1u);
  EXPECT_EQ(t.soft_count(kBlock), 3u);

  EXPECT_EQ(t.unpin_one(kBlock).pins_removed, 1u);  // the hard pin
  EXPECT_EQ(t.hard_count(kBlock), 0u);
  EXPECT_EQ(t.unpin_one(kBlock).pins_removed, 1u);  // priority 5, TTL 900
  // Left: priority 5 TTL 100, priority -5 TTL 5000. The 100 ms pin expires first...
  EXPECT_EQ(expire_all(t, 100), 1);
  EXPECT_EQ(t.priority(kBlock), prio(-5));
  // ...so the 900 ms one was the one removed (else it would still be here at 100 ms).
  EXPECT_EQ(t.count(kBlock), 1u);
  const PinChange last = t.unpin_one(kBlock);
  EXPECT_TRUE(last.soft_cleared);
  EXPECT_EQ(t.unpin_one(kBlock).pins_removed, 0u);  // nothing left
  ASSERT_TRUE(t.check().has_value()) << t.check().error().message;
}

TEST(PinTableTest, HardPinsNeverExpireAndReleaseAllTakesEverything) {
  PinTable t;
  t.pin(kBlock, PinOptions{}, 0);
  t.pin(kBlock, PinOptions{}, 0);
  t.pin(kBlock, PinOptions{.ttl_ms = 10}, 0);
  EXPECT_EQ(expire_all(t, 1'000'000), 1);
  EXPECT_EQ(t.count(kBlock), 2u);
  t.pin(kBlock, PinOptions{.ttl_ms = 10}, 0);
  const PinChange c = t.release_all(kBlock);
  EXPECT_EQ(c.pins_removed, 3u);
  EXPECT_TRUE(c.soft_cleared);
  EXPECT_EQ(t.pinned_blocks(), 0);
  ASSERT_TRUE(t.check().has_value()) << t.check().error().message;
}

TEST(PinTableTest, ReleaseOrderSoftOnlyFirstThenPriorityThenRecency) {
  PinTable t;
  const BlockHash hard_old = 1, soft_high = 2, soft_low_new = 3, soft_low_old = 4, mixed = 5;
  t.pin(hard_old, PinOptions{}, 0);
  t.pin(soft_high, PinOptions{.ttl_ms = 10, .priority = prio(50)}, 0);
  t.pin(soft_low_new, PinOptions{.ttl_ms = 10, .priority = prio(-50)}, 0);
  t.pin(soft_low_old, PinOptions{.ttl_ms = 10, .priority = prio(-50)}, 0);
  t.pin(mixed, PinOptions{}, 0);
  t.pin(mixed, PinOptions{.ttl_ms = 10, .priority = prio(-100)}, 0);
  const std::vector<PinTable::Candidate> candidates{
      {hard_old, 1}, {soft_high, 2}, {soft_low_new, 9}, {soft_low_old, 3}, {mixed, 4}};
  // mixed has a hard pin: it goes with the hard ones, ahead of hard_old by its priority.
  EXPECT_EQ(t.release_order(candidates),
            (std::vector<BlockHash>{soft_low_old, soft_low_new, soft_high, mixed, hard_old}));
}

TEST(PinTableTest, EffectivePriorityIsTheMaxOverRemainingPins) {
  PinTable t;
  t.pin(kBlock, client_pin(), 0);
  t.pin(kBlock, admin_pin(), 0);
  EXPECT_EQ(t.priority(kBlock), PinPriority());
  t.unpin_one(kBlock);  // the operator's
  EXPECT_EQ(t.priority(kBlock), PinPriority::lowest());
}

// The same scenario through the tree: the tree mirrors what the table decides.
TEST(PinTableTreeTest, AdminUnpinThenClientPinLapsesOnItsOwnTtl) {
  constexpr int32_t kPage = 4;
  PageAllocator alloc(16);
  ManualClock clock(1000);
  RadixTree tree(RadixTreeOptions{kPage}, &alloc, nullptr, &clock);
  std::vector<TokenId> tokens{1, 2, 3, 4, 5, 6, 7, 8};
  std::vector<PageId> pages;
  ASSERT_TRUE(alloc.allocate(2, pages).has_value());
  tree.insert(tokens, pages);
  const std::vector<BlockHash> hs = hash_blocks(tokens, kPage);

  EXPECT_EQ(tree.pin(hs, admin_pin()).pinned, 2);
  EXPECT_EQ(tree.pin(hs, client_pin()).pinned, 2);
  EXPECT_EQ(tree.pin_count(hs[1]), 2u);
  EXPECT_EQ(tree.soft_pinned_blocks_at_most(PinPriority::lowest()), 0);
  EXPECT_EQ(tree.unpin(hs).unpinned, 2);  // the operator's pins
  EXPECT_EQ(tree.pin_count(hs[1]), 1u);
  EXPECT_EQ(tree.soft_pinned_blocks_at_most(PinPriority::lowest()), 2);
  ASSERT_TRUE(tree.check_invariants().has_value()) << tree.check_invariants().error().message;

  clock.advance_ms(kClientTtlMs - 1);
  EXPECT_EQ(tree.expire_soft_pins(), 0);
  EXPECT_EQ(tree.evict(99).evicted_pages, 0);  // still pinned
  clock.advance_ms(1);
  EXPECT_EQ(tree.expire_soft_pins(), 2);  // at its own 300 s, not the operator's hour
  EXPECT_EQ(tree.stats().pinned_blocks, 0);
  EXPECT_EQ(tree.stats().soft_pinned_blocks, 0);
  EXPECT_EQ(tree.stats().expired_pins_total, 2u);
  ASSERT_TRUE(tree.check_invariants().has_value()) << tree.check_invariants().error().message;
  EXPECT_EQ(tree.evict(99).evicted_pages, 2);
}

TEST(PinTableTreeTest, HitRefreshesEachPinToItsOwnTtl) {
  constexpr int32_t kPage = 4;
  PageAllocator alloc(16);
  ManualClock clock(0);
  RadixTree tree(RadixTreeOptions{kPage}, &alloc, nullptr, &clock);
  std::vector<TokenId> tokens{1, 2, 3, 4};
  std::vector<PageId> pages;
  ASSERT_TRUE(alloc.allocate(1, pages).has_value());
  tree.insert(tokens, pages);
  const std::vector<BlockHash> hs = hash_blocks(tokens, kPage);
  tree.pin(hs, admin_pin());
  tree.pin(hs, client_pin());
  clock.set_ms(200'000);
  tree.match_prefix(tokens);  // client: 500 s; operator: 200 s + 1 h
  clock.set_ms(499'999);
  EXPECT_EQ(tree.expire_soft_pins(), 0);
  clock.set_ms(500'000);
  EXPECT_EQ(tree.expire_soft_pins(), 1);
  EXPECT_EQ(tree.pin_count(hs[0]), 1u);
  EXPECT_EQ(tree.soft_pinned_blocks_at_most(PinPriority::lowest()), 0);  // the operator's
  ASSERT_TRUE(tree.check_invariants().has_value()) << tree.check_invariants().error().message;
}

}  // namespace
}  // namespace strata

namespace strata {
namespace {

// What /cache/state?detail=tree shows of a pin's TTL: per page, the longest TTL of its soft
// pins (0 for none, a hard pin included).
TEST(PinTableTreeTest, TheSnapshotShowsEachPagesLongestSoftPinTtl) {
  PinTable t;
  EXPECT_EQ(t.max_soft_ttl_ms(kBlock), 0);
  t.pin(kBlock, PinOptions{}, 0);  // hard
  EXPECT_EQ(t.max_soft_ttl_ms(kBlock), 0);
  t.pin(kBlock, client_pin(), 0);
  EXPECT_EQ(t.max_soft_ttl_ms(kBlock), kClientTtlMs);
  t.pin(kBlock, admin_pin(), 0);
  EXPECT_EQ(t.max_soft_ttl_ms(kBlock), kHourMs);

  constexpr int32_t kPage = 4;
  PageAllocator alloc(16);
  ManualClock clock(0);
  RadixTree tree(RadixTreeOptions{kPage}, &alloc, nullptr, &clock);
  std::vector<TokenId> tokens{1, 2, 3, 4, 5, 6, 7, 8};
  std::vector<PageId> pages;
  ASSERT_TRUE(alloc.allocate(2, pages).has_value());
  tree.insert(tokens, pages);
  const std::vector<BlockHash> hs = hash_blocks(tokens, kPage);
  // Per page of `tokens`, in order (pins may split the node).
  auto ttls = [&] {
    std::vector<int64_t> out;
    for (BlockHash h : hs) {
      for (const NodeSnapshot& n : tree.snapshot()) {
        for (size_t k = 0; k < n.block_hashes.size(); ++k) {
          if (n.block_hashes[k] == h) out.push_back(n.soft_pin_ttl_ms[k]);
        }
      }
    }
    return out;
  };
  EXPECT_EQ(ttls(), (std::vector<int64_t>{0, 0}));
  EXPECT_EQ(tree.pin(std::vector<BlockHash>{hs[0]}, client_pin()).pinned, 1);
  EXPECT_EQ(tree.pin(std::vector<BlockHash>{hs[1]}, PinOptions{}).pinned, 1);
  EXPECT_EQ(ttls(), (std::vector<int64_t>{kClientTtlMs, 0}));
  EXPECT_EQ(tree.pin(hs, admin_pin()).pinned, 2);
  EXPECT_EQ(ttls(), (std::vector<int64_t>{kHourMs, kHourMs}));
}

}  // namespace
}  // namespace strata
