#include "cache/radix_tree.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

namespace strata {
namespace {

constexpr int32_t kPage = 4;

std::vector<TokenId> seq(std::initializer_list<TokenId> pages_first_tokens) {
  // Each value v becomes one page [v, v+1, v+2, v+3].
  std::vector<TokenId> out;
  for (TokenId v : pages_first_tokens) {
    for (int k = 0; k < kPage; ++k) out.push_back(v * 10 + k);
  }
  return out;
}

class RadixTreeTest : public ::testing::Test {
 protected:
  RadixTreeTest() : alloc_(64), tree_(RadixTreeOptions{kPage}, &alloc_, &sink_, &clock_) {}

  // Inserts like a request would: match, take fresh pages for the rest, insert.
  InsertResult put(const std::vector<TokenId>& tokens, std::string_view salt = {}) {
    MatchResult m = tree_.match_prefix(tokens, salt);
    std::vector<PageId> pages = m.device_pages;
    const int32_t need = static_cast<int32_t>(tokens.size()) / kPage - m.num_pages;
    EXPECT_TRUE(alloc_.allocate(need, pages).has_value());
    InsertResult r = tree_.insert(tokens, pages, salt);
    EXPECT_TRUE(r.rejected_pages.empty());
    check();
    return r;
  }

  void check() {
    ASSERT_TRUE(tree_.check_invariants().has_value()) << tree_.check_invariants().error().message;
    std::vector<PageId> owned;
    tree_.collect_device_pages(owned);
    ASSERT_TRUE(alloc_.audit(owned).has_value()) << alloc_.audit(owned).error().message;
  }

  std::vector<BlockHash> hashes(const std::vector<TokenId>& tokens, std::string_view salt = {}) {
    return hash_blocks(tokens, kPage, salt);
  }

  PageAllocator alloc_;
  VectorEventSink sink_;
  ManualClock clock_{1000};
  RadixTree tree_;
};

// ---- the seed's eleven cases, adapted ----

TEST_F(RadixTreeTest, BlockHashIndexPopulatedOnInsert) {
  put(seq({1}));
  EXPECT_TRUE(tree_.contains(hashes(seq({1}))[0]));
}

TEST_F(RadixTreeTest, BlockHashIndexMultiplePages) {
  auto s = seq({1, 2, 3});
  put(s);
  for (BlockHash h : hashes(s)) EXPECT_TRUE(tree_.contains(h));
  EXPECT_EQ(tree_.stats().cached_pages, 3);
}

TEST_F(RadixTreeTest, IndexAndPinsClearedOnReset) {
  auto s = seq({1, 2});
  put(s);
  EXPECT_EQ(tree_.pin(hashes(s)).pinned, 2);
  ASSERT_TRUE(tree_.reset().has_value());
  for (BlockHash h : hashes(s)) EXPECT_FALSE(tree_.contains(h));
  EXPECT_EQ(tree_.stats().pinned_blocks, 0);
  EXPECT_EQ(alloc_.num_free(), 64);
  ASSERT_FALSE(sink_.events.empty());
  EXPECT_TRUE(std::holds_alternative<AllBlocksCleared>(sink_.events.back()));
  check();
}

TEST_F(RadixTreeTest, IndexClearedOnEvict) {
  auto s = seq({1, 2});
  put(s);
  EXPECT_EQ(tree_.evict(100).evicted_pages, 2);
  for (BlockHash h : hashes(s)) EXPECT_FALSE(tree_.contains(h));
  check();
}

TEST_F(RadixTreeTest, PinUnknownHashIsSkippedAndCounted) {
  put(seq({1}));
  const std::vector<BlockHash> unknown{12345, 67890};
  PinResult r = tree_.pin(unknown);
  EXPECT_EQ(r.pinned, 0);
  EXPECT_EQ(r.unknown, 2);
  check();
}

TEST_F(RadixTreeTest, UnpinUnknownHashIsSkippedAndCounted) {
  put(seq({1}));
  const std::vector<BlockHash> unknown{12345};
  UnpinResult r = tree_.unpin(unknown);
  EXPECT_EQ(r.unpinned, 0);
  EXPECT_EQ(r.unknown, 1);
  // A known block without a pin: counted as not pinned, nothing changes.
  r = tree_.unpin(hashes(seq({1})));
  EXPECT_EQ(r.unpinned, 0);
  EXPECT_EQ(r.not_pinned, 1);
  check();
}

TEST_F(RadixTreeTest, PinProtectsAndRemovesFromEvictable) {
  auto s = seq({1, 2});
  put(s);
  EXPECT_EQ(tree_.stats().evictable_pages, 2);
  EXPECT_EQ(tree_.pin(hashes(s)).pinned, 2);
  EXPECT_EQ(tree_.stats().evictable_pages, 0);
  EXPECT_EQ(tree_.stats().protected_pages, 2);
  EXPECT_EQ(tree_.pin_count(hashes(s)[1]), 1u);
  check();
}

TEST_F(RadixTreeTest, UnpinRestoresEvictable) {
  auto s = seq({1, 2});
  put(s);
  tree_.pin(hashes(s));
  EXPECT_EQ(tree_.unpin(hashes(s)).unpinned, 2);
  EXPECT_EQ(tree_.stats().evictable_pages, 2);
  EXPECT_EQ(tree_.stats().protected_pages, 0);
  check();
}

TEST_F(RadixTreeTest, PinSurvivesEvictionUnpinDoesNot) {
  auto a = seq({1, 2});
  auto b = seq({5, 6});
  put(a);
  put(b);
  tree_.pin(hashes(a));
  tree_.evict(999);
  for (BlockHash h : hashes(a)) EXPECT_TRUE(tree_.contains(h));
  for (BlockHash h : hashes(b)) EXPECT_FALSE(tree_.contains(h));
  tree_.unpin(hashes(a));
  tree_.evict(999);
  for (BlockHash h : hashes(a)) EXPECT_FALSE(tree_.contains(h));
  EXPECT_EQ(alloc_.num_free(), 64);
  check();
}

TEST_F(RadixTreeTest, DoublePinRequiresDoubleUnpin) {
  auto a = seq({1});
  put(a);
  tree_.pin(hashes(a));
  tree_.pin(hashes(a));
  EXPECT_EQ(tree_.pin_count(hashes(a)[0]), 2u);
  tree_.unpin(hashes(a));
  EXPECT_EQ(tree_.evict(999).evicted_pages, 0);
  tree_.unpin(hashes(a));
  EXPECT_EQ(tree_.evict(999).evicted_pages, 1);
  check();
}

TEST_F(RadixTreeTest, PinProtectsAncestors) {
  auto parent = seq({1, 2});
  auto child = seq({1, 2, 3});
  auto other = seq({1, 2, 7});
  put(parent);
  put(child);
  put(other);
  const BlockHash leaf = hashes(child)[2];
  tree_.pin(std::vector<BlockHash>{leaf});
  tree_.evict(999);
  // The pinned leaf and its ancestors stay; the sibling branch goes.
  for (BlockHash h : hashes(child)) EXPECT_TRUE(tree_.contains(h));
  EXPECT_FALSE(tree_.contains(hashes(other)[2]));
  check();
}

// ---- matching, splitting, inserting ----

TEST_F(RadixTreeTest, MatchReturnsLongestFullPagePrefixAndSplits) {
  auto s = seq({1, 2, 3, 4});
  put(s);
  EXPECT_EQ(tree_.stats().num_nodes, 1);
  auto q = seq({1, 2, 9});
  q.push_back(77);  // a partial page is ignored
  MatchResult m = tree_.match_prefix(q);
  EXPECT_EQ(m.num_pages, 2);
  const auto all = hashes(s);
  EXPECT_EQ(m.block_hashes, std::vector<BlockHash>(all.begin(), all.begin() + 2));
  EXPECT_EQ(m.last_node->num_pages(), 2);  // split at the match end
  EXPECT_EQ(tree_.stats().num_nodes, 2);
  check();
  // Splits emit no events: blocks did not change.
  size_t stored = 0;
  for (const auto& e : sink_.events) stored += std::holds_alternative<BlockStored>(e);
  EXPECT_EQ(stored, 1u);
}

TEST_F(RadixTreeTest, MatchOfUnknownSequenceIsEmpty) {
  put(seq({1, 2}));
  MatchResult m = tree_.match_prefix(seq({3}));
  EXPECT_EQ(m.num_pages, 0);
  EXPECT_EQ(m.last_node, tree_.root());
  m = tree_.match_prefix(std::vector<TokenId>{10, 11});  // shorter than a page
  EXPECT_EQ(m.num_pages, 0);
}

TEST_F(RadixTreeTest, InsertReturnsPagesTheTreeAlreadyHad) {
  auto s = seq({1, 2});
  put(s);
  std::vector<PageId> fresh;
  ASSERT_TRUE(alloc_.allocate(3, fresh).has_value());
  InsertResult r = tree_.insert(seq({1, 2, 3}), fresh);
  EXPECT_EQ(r.num_existing_pages, 2);
  EXPECT_EQ(r.num_new_pages, 1);
  EXPECT_EQ(r.rejected_pages, std::vector<PageId>(fresh.begin(), fresh.begin() + 2));
  alloc_.free(r.rejected_pages);
  check();
}

TEST_F(RadixTreeTest, InsertEmitsStoredWithParentHash) {
  put(seq({1, 2}));
  put(seq({1, 2, 3, 4}));
  ASSERT_EQ(sink_.events.size(), 2u);
  const auto& second = std::get<BlockStored>(sink_.events[1]);
  EXPECT_EQ(second.block_hashes.size(), 2u);
  ASSERT_TRUE(second.parent_block_hash.has_value());
  EXPECT_EQ(*second.parent_block_hash, hashes(seq({1, 2}))[1]);
  EXPECT_EQ(second.token_ids, std::vector<TokenId>(seq({3, 4})));
  EXPECT_EQ(second.block_size, kPage);
  EXPECT_FALSE(std::get<BlockStored>(sink_.events[0]).parent_block_hash.has_value());
}

TEST_F(RadixTreeTest, SaltsIsolateTenants) {
  auto s = seq({1, 2});
  put(s, "tenant-a");
  EXPECT_EQ(tree_.match_prefix(s, "tenant-b").num_pages, 0);
  EXPECT_EQ(tree_.match_prefix(s).num_pages, 0);
  EXPECT_EQ(tree_.match_prefix(s, "tenant-a").num_pages, 2);
  put(s, "tenant-b");
  EXPECT_EQ(tree_.stats().cached_pages, 4);  // no page shared
  EXPECT_NE(hashes(s, "tenant-a")[1], hashes(s, "tenant-b")[1]);
  check();
}

// ---- locks ----

TEST_F(RadixTreeTest, LockProtectsPathAndReleaseUndoesIt) {
  auto s = seq({1, 2, 3});
  put(s);
  MatchResult m = tree_.match_prefix(s);
  LockReceipt r = tree_.lock(m.last_node);
  EXPECT_EQ(tree_.evict(999).evicted_pages, 0);
  ASSERT_TRUE(tree_.release(r).has_value());
  EXPECT_EQ(tree_.evict(999).evicted_pages, 3);
  check();
}

TEST_F(RadixTreeTest, ReleaseTwiceIsAnErrorAndChangesNothing) {
  auto s = seq({1});
  put(s);
  LockReceipt r = tree_.lock(tree_.match_prefix(s).last_node);
  ASSERT_TRUE(tree_.release(r).has_value());
  auto again = tree_.release(r);
  ASSERT_FALSE(again.has_value());
  EXPECT_EQ(again.error().code, ErrorCode::kFailedPrecondition);
  EXPECT_EQ(tree_.stats().outstanding_locks, 0);
  // A receipt never issued.
  EXPECT_FALSE(tree_.release(LockReceipt{}).has_value());
  check();
}

TEST_F(RadixTreeTest, ReceiptSurvivesSplitOfItsNode) {
  auto s = seq({1, 2, 3, 4});
  put(s);
  LockReceipt r = tree_.lock(tree_.match_prefix(s).last_node);
  // Another request matches half of the locked node: split.
  tree_.match_prefix(seq({1, 2, 8}));
  EXPECT_EQ(tree_.stats().num_nodes, 2);
  check();
  EXPECT_EQ(tree_.evict(999).evicted_pages, 0);
  ASSERT_TRUE(tree_.release(r).has_value());
  check();
  EXPECT_EQ(tree_.evict(999).evicted_pages, 4);
  check();
}

TEST_F(RadixTreeTest, ResetIsRefusedWhileLocksAreOutstanding) {
  auto s = seq({1});
  put(s);
  LockReceipt r = tree_.lock(tree_.match_prefix(s).last_node);
  auto st = tree_.reset();
  ASSERT_FALSE(st.has_value());
  EXPECT_EQ(st.error().code, ErrorCode::kFailedPrecondition);
  EXPECT_TRUE(tree_.contains(hashes(s)[0]));
  ASSERT_TRUE(tree_.release(r).has_value());
  ASSERT_TRUE(tree_.reset().has_value());
  check();
}

// ---- eviction ----

TEST_F(RadixTreeTest, EvictsLeastRecentlyUsedFirst) {
  auto a = seq({1});
  auto b = seq({2});
  auto c = seq({3});
  put(a);
  put(b);
  put(c);
  tree_.match_prefix(a);  // a is now the most recent
  EvictResult r = tree_.evict(1);
  EXPECT_EQ(r.evicted_pages, 1);
  EXPECT_FALSE(tree_.contains(hashes(b)[0]));
  EXPECT_TRUE(tree_.contains(hashes(a)[0]));
  EXPECT_TRUE(tree_.contains(hashes(c)[0]));
  check();
}

// A block evicted for want of room and computed again counts as recomputed, once; an
// operator's evict or flush does not count, nor does a block never evicted. The recent
// count decays with its time constant.
TEST_F(RadixTreeTest, BlocksComputedAgainAfterEvictionForRoomAreCounted) {
  const auto a = seq({1, 2, 3});
  const auto b = seq({7, 8});
  put(a);
  put(b);
  EXPECT_EQ(tree_.evict(1'000).evicted_pages, 5);
  put(a);  // all three computed again
  EXPECT_EQ(tree_.stats().recomputed_pages_total, 3u);
  EXPECT_DOUBLE_EQ(tree_.recomputed_pages_recent(), 3.0);
  EXPECT_EQ(tree_.evict(1'000).evicted_pages, 3);
  put(seq({1, 2}));  // two of them again: the eviction before was a new one
  EXPECT_EQ(tree_.stats().recomputed_pages_total, 5u);
  put(seq({9}));  // never evicted
  EXPECT_EQ(tree_.stats().recomputed_pages_total, 5u);

  clock_.advance_ms(RadixTree::kRecomputedWindowMs);
  EXPECT_NEAR(tree_.recomputed_pages_recent(), 5.0 * std::exp(-1.0), 1e-9);
  put(b);  // evicted once, computed again once
  EXPECT_EQ(tree_.stats().recomputed_pages_total, 7u);
  EXPECT_NEAR(tree_.recomputed_pages_recent(), 5.0 * std::exp(-1.0) + 2.0, 1e-9);

  // What an operator evicted is not the pool's want of room.
  const auto c = seq({20, 21});
  put(c);
  EXPECT_EQ(tree_.evict_blocks(hashes(c), true).evicted_blocks, 2);
  put(c);
  tree_.flush();
  put(c);
  EXPECT_EQ(tree_.evict(100, EvictReason::kOperator).evicted_pages, 2);
  put(c);
  EXPECT_EQ(tree_.stats().recomputed_pages_total, 7u);
  ASSERT_TRUE(tree_.reset().has_value());
  EXPECT_EQ(tree_.recomputed_pages_recent(), 0.0);
  check();
}

TEST_F(RadixTreeTest, EvictMoreThanExistsEvictsEverythingEvictable) {
  put(seq({1, 2}));
  put(seq({3}));
  EvictResult r = tree_.evict(1'000'000);
  EXPECT_EQ(r.evicted_pages, 3);
  EXPECT_EQ(tree_.evict(5).evicted_pages, 0);
  EXPECT_EQ(tree_.evict(0).evicted_pages, 0);
  EXPECT_EQ(tree_.evict(-3).evicted_pages, 0);
  check();
}

TEST_F(RadixTreeTest, EvictionEmitsRemovedEvents) {
  auto s = seq({1, 2});
  put(s);
  sink_.events.clear();
  tree_.evict(10);
  ASSERT_EQ(sink_.events.size(), 1u);
  const auto& removed = std::get<BlockRemoved>(sink_.events[0]);
  EXPECT_EQ(removed.block_hashes, hashes(s));
  EXPECT_EQ(removed.medium, Medium::kDevice);
}

TEST_F(RadixTreeTest, PinInsideANodeKeepsTheUnpinnedTailEvictable) {
  auto s = seq({1, 2, 3, 4});
  put(s);
  tree_.pin(std::vector<BlockHash>{hashes(s)[1]});
  check();
  EXPECT_EQ(tree_.evict(999).evicted_pages, 2);  // blocks 3 and 4
  EXPECT_TRUE(tree_.contains(hashes(s)[0]));
  EXPECT_TRUE(tree_.contains(hashes(s)[1]));
  EXPECT_FALSE(tree_.contains(hashes(s)[2]));
  check();
}

TEST_F(RadixTreeTest, UnpinningTheLastPinnedBlockFreesTheTail) {
  auto s = seq({1, 2, 3});
  put(s);
  const auto h = hashes(s);
  tree_.pin(std::vector<BlockHash>{h[0], h[2]});
  tree_.unpin(std::vector<BlockHash>{h[2]});
  check();
  EXPECT_EQ(tree_.evict(999).evicted_pages, 2);
  EXPECT_TRUE(tree_.contains(h[0]));
  check();
}

TEST_F(RadixTreeTest, EvictBlocksWithDescendants) {
  auto trunk = seq({1, 2});
  auto b1 = seq({1, 2, 3, 4});
  auto b2 = seq({1, 2, 5});
  put(trunk);
  put(b1);
  put(b2);
  // Pin one branch; evicting the trunk's second block with descendants skips it.
  tree_.pin(std::vector<BlockHash>{hashes(b2)[2]});
  EvictBlocksResult r = tree_.evict_blocks(std::vector<BlockHash>{hashes(trunk)[1]}, true);
  EXPECT_EQ(r.evicted_blocks, 2);  // b1's blocks 3 and 4
  EXPECT_EQ(r.skipped_pinned, 1);  // the trunk block itself is an ancestor of a pin
  EXPECT_TRUE(tree_.contains(hashes(b2)[2]));
  EXPECT_FALSE(tree_.contains(hashes(b1)[2]));
  check();
  tree_.unpin(std::vector<BlockHash>{hashes(b2)[2]});
  r = tree_.evict_blocks(std::vector<BlockHash>{hashes(trunk)[1]}, true);
  EXPECT_EQ(r.evicted_blocks, 2);  // trunk block 2 and b2's block
  EXPECT_TRUE(tree_.contains(hashes(trunk)[0]));
  check();
}

TEST_F(RadixTreeTest, EvictBlocksWithoutDescendantsOnlyTakesLeaves) {
  auto s = seq({1, 2, 3});
  put(s);
  const auto h = hashes(s);
  EvictBlocksResult r = tree_.evict_blocks(std::vector<BlockHash>{h[1]}, false);
  EXPECT_EQ(r.evicted_blocks, 0);
  EXPECT_EQ(r.skipped_has_children, 1);
  // The whole chain in any order: deepest first.
  r = tree_.evict_blocks(std::vector<BlockHash>{h[0], h[2], h[1], 4242}, false);
  EXPECT_EQ(r.evicted_blocks, 3);
  EXPECT_EQ(r.unknown, 1);
  check();
}

TEST_F(RadixTreeTest, EvictBlocksSkipsLockedAndReportsIt) {
  auto s = seq({1, 2});
  put(s);
  LockReceipt lock = tree_.lock(tree_.match_prefix(s).last_node);
  EvictBlocksResult r = tree_.evict_blocks(hashes(s), true);
  EXPECT_EQ(r.evicted_blocks, 0);
  EXPECT_EQ(r.skipped_locked, 2);
  ASSERT_TRUE(tree_.release(lock).has_value());
  check();
}

TEST_F(RadixTreeTest, FlushKeepsPinsAndLockedPaths) {
  auto pinned = seq({1, 2});
  auto locked = seq({3});
  auto other = seq({4, 5});
  put(pinned);
  put(locked);
  put(other);
  tree_.pin(hashes(pinned));
  LockReceipt lock = tree_.lock(tree_.match_prefix(locked).last_node);
  FlushResult r = tree_.flush();
  EXPECT_EQ(r.evicted_pages, 2);
  EXPECT_EQ(r.pinned_preserved, 2);
  EXPECT_EQ(r.locked_skipped, 1);
  EXPECT_EQ(tree_.pin_count(hashes(pinned)[0]), 1u);
  ASSERT_TRUE(tree_.release(lock).has_value());
  check();
}

// ---- soft pins ----

TEST_F(RadixTreeTest, SoftPinExpiresAndHitRefreshesIt) {
  auto s = seq({1, 2});
  put(s);
  tree_.pin(hashes(s), PinOptions{.ttl_ms = 1000, .priority = *PinPriority::make(1)});
  EXPECT_EQ(tree_.stats().soft_pinned_blocks, 2);
  clock_.advance_ms(800);
  tree_.match_prefix(s);  // refresh: expiry now at +1800
  clock_.advance_ms(800);
  EXPECT_EQ(tree_.expire_soft_pins(), 0);
  EXPECT_EQ(tree_.evict(999).evicted_pages, 0);
  clock_.advance_ms(500);
  EXPECT_EQ(tree_.expire_soft_pins(), 2);
  EXPECT_EQ(tree_.stats().pinned_blocks, 0);
  check();
  EXPECT_EQ(tree_.evict(999).evicted_pages, 2);
  check();
}

TEST_F(RadixTreeTest, HardPinOutlivesSoftPinOnTheSameBlock) {
  auto s = seq({1});
  put(s);
  tree_.pin(hashes(s));
  tree_.pin(hashes(s), PinOptions{.ttl_ms = 10});
  clock_.advance_ms(20);
  EXPECT_EQ(tree_.expire_soft_pins(), 1);
  EXPECT_EQ(tree_.pin_count(hashes(s)[0]), 1u);
  EXPECT_EQ(tree_.evict(999).evicted_pages, 0);
  check();
}

TEST_F(RadixTreeTest, ReleasePinsForSpaceTakesSoftPinsFirst) {
  auto hard = seq({1, 2});
  auto soft = seq({3, 4});
  put(hard);
  put(soft);
  tree_.pin(hashes(hard));
  tree_.pin(hashes(soft), PinOptions{.ttl_ms = 60'000});
  EXPECT_EQ(tree_.stats().protected_pages, 4);
  // Two pages needed: the soft pins go, the hard ones stay.
  auto released = tree_.release_pins_for(2);
  EXPECT_EQ(released.size(), 2u);
  EXPECT_EQ(tree_.stats().protected_pages, 2);
  EXPECT_EQ(tree_.pin_count(hashes(hard)[1]), 1u);
  EXPECT_EQ(tree_.pin_count(hashes(soft)[1]), 0u);
  check();
  // More than is pinned: everything goes, and it stops.
  released = tree_.release_pins_for(100);
  EXPECT_EQ(released.size(), 2u);
  EXPECT_EQ(tree_.stats().pinned_blocks, 0);
  check();
}

TEST_F(RadixTreeTest, SnapshotDescribesNodes) {
  auto s = seq({1, 2});
  put(s);
  tree_.pin(std::vector<BlockHash>{hashes(s)[1]});
  auto snap = tree_.snapshot();
  ASSERT_EQ(snap.size(), 1u);
  EXPECT_EQ(snap[0].num_tokens, 2 * kPage);
  EXPECT_EQ(snap[0].block_hashes, hashes(s));
  EXPECT_EQ(snap[0].pin_counts, (std::vector<uint32_t>{0, 1}));
  EXPECT_TRUE(snap[0].on_device);
  EXPECT_FALSE(snap[0].evictable);
  EXPECT_EQ(snap[0].parent_id, 0u);
}

}  // namespace
}  // namespace strata

namespace strata {
namespace {

// The hash index is lazy past a node's first block (block_index.h): these paths
// never settle it by an audit in between, so the deferred state itself is exercised.
class LazyIndexTest : public ::testing::Test {
 protected:
  LazyIndexTest() : alloc_(64), tree_(RadixTreeOptions{kPage}, &alloc_, &sink_, &clock_) {}
  InsertResult put_raw(const std::vector<TokenId>& tokens) {
    MatchResult m = tree_.match_prefix(tokens);
    std::vector<PageId> pages = m.device_pages;
    const int32_t need = static_cast<int32_t>(tokens.size()) / kPage - m.num_pages;
    EXPECT_TRUE(alloc_.allocate(need, pages).has_value());
    return tree_.insert(tokens, pages);
  }
  PageAllocator alloc_;
  VectorEventSink sink_;
  ManualClock clock_{1000};
  RadixTree tree_;
};

TEST_F(LazyIndexTest, DeepBlocksAreFoundByHashAfterInsert) {
  const auto tokens = seq({1, 2, 3, 4, 5});
  put_raw(tokens);
  const auto hs = hash_blocks(tokens, kPage);
  for (BlockHash h : hs) EXPECT_TRUE(tree_.contains(h));
  EXPECT_EQ(tree_.pin(std::span<const BlockHash>(hs).subspan(3)).pinned, 2);
  ASSERT_TRUE(tree_.check_invariants().has_value()) << tree_.check_invariants().error().message;
}

TEST_F(LazyIndexTest, EvictedBeforeAnyLookupLeavesNoStaleEntry) {
  for (int round = 0; round < 20; ++round) {
    put_raw(seq({round + 1, 90, 91, 92}));  // never looked up by hash
    EXPECT_GT(tree_.evict(4).evicted_pages, 0);
  }
  ASSERT_TRUE(tree_.check_invariants().has_value()) << tree_.check_invariants().error().message;
  std::vector<PageId> owned;
  tree_.collect_device_pages(owned);
  EXPECT_TRUE(alloc_.audit(owned).has_value());
}

TEST_F(LazyIndexTest, SplitOfADeferredNodeIndexesBothHalves) {
  const auto a = seq({1, 2, 3, 4});
  put_raw(a);
  // A sibling branch after two pages splits the deferred node.
  put_raw(seq({1, 2, 7, 8}));
  for (BlockHash h : hash_blocks(a, kPage)) EXPECT_TRUE(tree_.contains(h));
  for (BlockHash h : hash_blocks(seq({1, 2, 7, 8}), kPage)) EXPECT_TRUE(tree_.contains(h));
  ASSERT_TRUE(tree_.check_invariants().has_value()) << tree_.check_invariants().error().message;
  EXPECT_EQ(tree_.evict(100).evicted_pages, 6);
  EXPECT_FALSE(tree_.contains(hash_blocks(a, kPage)[3]));
  ASSERT_TRUE(tree_.check_invariants().has_value()) << tree_.check_invariants().error().message;
}

// A split of a deferred node leaves two deferred halves (block_index.h): split again, then
// pinned deep inside, then evicted, all without a lookup by hash in between.
TEST_F(LazyIndexTest, SplitsOfDeferredNodesStayExact) {
  const auto a = seq({1, 2, 3, 4, 5, 6, 7, 8});
  put_raw(a);
  put_raw(seq({1, 2, 3, 20}));        // splits a after 3 pages
  put_raw(seq({1, 21}));              // splits the upper half after 1
  put_raw(seq({1, 2, 3, 4, 5, 22}));  // splits the lower half after 2
  EXPECT_EQ(tree_.stats().num_nodes, 7);
  // Deferred blocks are found, and the audit (which settles) agrees.
  const auto hs = hash_blocks(a, kPage);
  EXPECT_EQ(tree_.pin(std::span<const BlockHash>(hs).subspan(6, 1)).pinned, 1);
  ASSERT_TRUE(tree_.check_invariants().has_value()) << tree_.check_invariants().error().message;
  EXPECT_EQ(tree_.unpin(std::span<const BlockHash>(hs).subspan(6, 1)).unpinned, 1);

  put_raw(seq({40, 41, 42, 43, 44}));
  put_raw(seq({40, 41, 50}));  // a fresh split, then everything goes unasked
  tree_.evict(1000);
  EXPECT_EQ(tree_.stats().cached_pages, 0);
  ASSERT_TRUE(tree_.check_invariants().has_value()) << tree_.check_invariants().error().message;
  for (BlockHash h : hs) EXPECT_FALSE(tree_.contains(h));
  std::vector<PageId> owned;
  tree_.collect_device_pages(owned);
  EXPECT_TRUE(alloc_.audit(owned).has_value());
  EXPECT_EQ(alloc_.num_free(), 64);
}

// vLLM's hashing in the tree (block_hash.h, BlockHasher): every hash it makes, emits and is
// asked for is the hasher's, through splits and inserts below a split; a salted sequence's
// first BlockStored names its salt (the wire's extra_keys), and only that one.
TEST(RadixTreeVllmHashTest, HashesEventsAndSaltsFollowTheHasher) {
  const BlockHasher hasher = *BlockHasher::make(BlockHashAlgo::kSha256Cbor, "0");
  PageAllocator alloc(64);
  VectorEventSink sink;
  ManualClock clock(1000);
  RadixTree tree(RadixTreeOptions{.page_size = kPage, .hasher = hasher}, &alloc, &sink, &clock);
  auto put = [&](const std::vector<TokenId>& tokens, std::string_view salt) {
    MatchResult m = tree.match_prefix(tokens, salt);
    std::vector<PageId> pages = m.device_pages;
    const int32_t need = static_cast<int32_t>(tokens.size()) / kPage - m.num_pages;
    ASSERT_TRUE(alloc.allocate(need, pages).has_value());
    EXPECT_TRUE(tree.insert(tokens, pages, salt).rejected_pages.empty());
    ASSERT_TRUE(tree.check_invariants().has_value()) << tree.check_invariants().error().message;
  };
  const std::vector<TokenId> a = seq({1, 2, 3, 4});
  put(a, "tenant-a");
  const std::vector<TokenId> b = seq({1, 2, 7});  // splits a's node after two pages
  put(b, "tenant-a");
  put(a, "");  // the same tokens unsalted: other blocks
  for (const auto& [tokens, salt] :
       {std::pair{a, "tenant-a"}, std::pair{b, "tenant-a"}, std::pair{a, ""}}) {
    const std::vector<BlockHash> want = hasher.hash_blocks(tokens, kPage, salt);
    EXPECT_EQ(tree.block_hashes_of(tokens, salt), want);
    EXPECT_EQ(tree.match_prefix(tokens, salt).num_pages, static_cast<int32_t>(want.size()));
    for (BlockHash h : want) EXPECT_TRUE(tree.contains(h));
  }
  EXPECT_NE(hasher.hash_blocks(a, kPage, "tenant-a")[0], hash_blocks(a, kPage, "tenant-a")[0]);
  std::vector<std::string> salts;
  for (const KvEvent& ev : sink.events) {
    if (const auto* st = std::get_if<BlockStored>(&ev)) {
      if (!st->first_block_salt.empty()) {
        EXPECT_FALSE(st->parent_block_hash.has_value());
        salts.push_back(st->first_block_salt);
      }
    }
  }
  EXPECT_EQ(salts, std::vector<std::string>{"tenant-a"});  // a's first store; b's is below it
}

}  // namespace
}  // namespace strata
