// The hash index on its own (block_index.h), with hand-made nodes: only their hashes
// matter here, so collisions, which real block hashes never show, can be written down.
#include "cache/block_index.h"

#include <gtest/gtest.h>

#include <vector>

namespace strata {
namespace {

RadixNode node_with(std::vector<BlockHash> hashes) {
  RadixNode n;
  n.hashes = std::move(hashes);
  return n;
}

// Where the index puts `hash` (null node when unknown).
BlockLoc loc_of(const BlockIndex& index, BlockHash hash) {
  const auto it = index.find(hash);
  return it == index.end() ? BlockLoc{} : it->second;
}

void expect_at(const BlockIndex& index, BlockHash hash, const RadixNode* node, int32_t offset) {
  const BlockLoc loc = loc_of(index, hash);
  EXPECT_EQ(loc.node, node) << "hash " << hash;
  EXPECT_EQ(loc.offset, offset) << "hash " << hash;
}

// Erases what release() hands back at once, as remove_leaf does outside a batch.
void remove(BlockIndex& index, RadixNode* node) {
  std::vector<BlockIndex::Owned> entries;
  index.release(node, entries);
  index.erase(entries);
}

TEST(BlockIndexTest, FirstBlockAtOnceTheRestOnTheFirstLookup) {
  BlockIndex index;
  RadixNode a = node_with({1, 2, 3});
  ASSERT_TRUE(index.add(&a));
  // A node's first block is there without settling; the others wait.
  ASSERT_NE(index.find_first(1), index.end());
  EXPECT_EQ(index.find_first(2), index.end());
  expect_at(index, 3, &a, 2);  // a settling lookup
  EXPECT_NE(index.find_first(2), index.end());
  EXPECT_EQ(index.size(), 3u);
}

TEST(BlockIndexTest, ANodeRemovedUnaskedErasesOnlyItsFirstEntry) {
  BlockIndex index;
  RadixNode a = node_with({1, 2, 3});
  ASSERT_TRUE(index.add(&a));
  std::vector<BlockIndex::Owned> entries;
  index.release(&a, entries);
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_EQ(entries[0].hash, 1u);
  index.erase(entries);
  EXPECT_EQ(index.size(), 0u);  // and a settle finds nothing deferred
}

TEST(BlockIndexTest, AFirstBlockCollisionMakesNoEntry) {
  BlockIndex index;
  RadixNode a = node_with({1, 2});
  RadixNode b = node_with({1, 7});
  ASSERT_TRUE(index.add(&a));
  EXPECT_FALSE(index.add(&b));
  expect_at(index, 1, &a, 0);
  EXPECT_FALSE(index.contains(7));
}

TEST(BlockIndexTest, ALaterCollisionNeverTakesAnotherNodesEntry) {
  BlockIndex index;
  RadixNode a = node_with({1, 2, 3});
  RadixNode b = node_with({10, 2, 11});  // block 1 collides with a's block 1
  ASSERT_TRUE(index.add(&a));
  index.settle();
  ASSERT_TRUE(index.add(&b));
  index.settle();
  expect_at(index, 2, &a, 1);  // the block indexed first keeps the hash
  expect_at(index, 11, &b, 2);
  // b's removal leaves a's entry alone; a's removal leaves nothing behind.
  remove(index, &b);
  expect_at(index, 2, &a, 1);
  EXPECT_EQ(index.size(), 3u);
  remove(index, &a);
  EXPECT_EQ(index.size(), 0u);
}

TEST(BlockIndexTest, SplitOfAnIndexedNodeRepointsOnlyItsOwnEntries) {
  BlockIndex index;
  RadixNode other = node_with({20, 3});
  ASSERT_TRUE(index.add(&other));
  index.settle();
  RadixNode lower = node_with({1, 2, 3, 4});  // block 2 collides with other's block 1
  ASSERT_TRUE(index.add(&lower));
  index.settle();
  // What RadixTree::split does: the upper node takes the first two pages.
  RadixNode upper = node_with({1, 2});
  lower.hashes = {3, 4};
  index.split(&upper, &lower);
  expect_at(index, 1, &upper, 0);
  expect_at(index, 2, &upper, 1);
  expect_at(index, 3, &other, 1);  // not lower's to move
  expect_at(index, 4, &lower, 1);
}

TEST(BlockIndexTest, SplitOfADeferredNodeLeavesTwoDeferredHalves) {
  BlockIndex index;
  RadixNode lower = node_with({1, 2, 3, 4, 5});
  ASSERT_TRUE(index.add(&lower));
  RadixNode upper = node_with({1, 2});
  lower.hashes = {3, 4, 5};
  index.split(&upper, &lower);
  // Both first blocks at once (matching needs them), the rest still deferred.
  ASSERT_NE(index.find_first(1), index.end());
  EXPECT_EQ(index.find_first(1)->second.node, &upper);
  ASSERT_NE(index.find_first(3), index.end());
  EXPECT_EQ(index.find_first(3)->second.node, &lower);
  EXPECT_EQ(index.find_first(2), index.end());
  EXPECT_EQ(index.find_first(5), index.end());
  // Lower, removed unasked, erases its first entry only; a lookup then indexes the rest
  // of upper.
  remove(index, &lower);
  expect_at(index, 1, &upper, 0);
  expect_at(index, 2, &upper, 1);
  EXPECT_EQ(index.size(), 2u);
  remove(index, &upper);
  EXPECT_EQ(index.size(), 0u);
}

TEST(BlockIndexTest, OneSettleCoversEveryDeferredNode) {
  BlockIndex index;
  std::vector<RadixNode> nodes;
  nodes.reserve(50);
  for (BlockHash n = 0; n < 50; ++n) {
    nodes.push_back(node_with({1000 * n + 1, 1000 * n + 2, 1000 * n + 3}));
  }
  nodes.push_back(node_with({99999}));  // a one-page node is never deferred
  for (RadixNode& n : nodes) ASSERT_TRUE(index.add(&n));
  EXPECT_EQ(index.size(), 151u);
  for (size_t n = 0; n < 50; ++n) expect_at(index, 1000 * n + 3, &nodes[n], 2);
  index.clear();
  EXPECT_EQ(index.size(), 0u);
}

}  // namespace
}  // namespace strata
