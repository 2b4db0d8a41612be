// The eviction policy on its own: hand-made nodes, accesses stamped from a manual clock,
// the tree's erase / re-key / insert protocol done by hand.
#include "cache/eviction_policy.h"

#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "cache/radix_tree.h"
#include "common/clock.h"

namespace strata {
namespace {

class LruPolicyTest : public ::testing::Test {
 protected:
  RadixNode& node(NodeId id) {
    nodes_.push_back(std::make_unique<RadixNode>());
    nodes_.back()->id = id;
    return *nodes_.back();
  }
  // What the tree's touch() does: out of the set, new recency, back in.
  void access(RadixNode& n, EvictionSet set) {
    policy_.erase(set, &n);
    stamp(n);
    policy_.insert(set, &n);
  }
  void stamp(RadixNode& n) {
    n.last_access_tick = ++tick_;
    n.last_access_ms = clock_.now_ms();
  }
  // Victims in order, removing each.
  std::vector<NodeId> drain(EvictionSet set) {
    std::vector<NodeId> out;
    while (RadixNode* v = policy_.victim(set)) {
      out.push_back(v->id);
      policy_.erase(set, v);
    }
    return out;
  }

  ManualClock clock_{0};
  uint64_t tick_ = 0;
  LruEvictionPolicy policy_;
  std::vector<std::unique_ptr<RadixNode>> nodes_;
};

TEST_F(LruPolicyTest, LeastRecentlyUsedFirst) {
  RadixNode& a = node(1);
  RadixNode& b = node(2);
  RadixNode& c = node(3);
  for (RadixNode* n : {&a, &b, &c}) {
    clock_.advance_ms(10);
    stamp(*n);
    policy_.insert(EvictionSet::kDevice, n);
  }
  EXPECT_EQ(policy_.victim(EvictionSet::kDevice), &a);
  clock_.advance_ms(10);
  access(a, EvictionSet::kDevice);  // a is now the most recent
  EXPECT_EQ(a.last_access_ms, 40);
  EXPECT_TRUE(policy_.contains(EvictionSet::kDevice, &a));
  EXPECT_EQ(drain(EvictionSet::kDevice), (std::vector<NodeId>{2, 3, 1}));
  EXPECT_EQ(policy_.size(EvictionSet::kDevice), 0u);
}

TEST_F(LruPolicyTest, TiesBrokenByNodeId) {
  // One operation touches several nodes with one tick (a split's halves).
  RadixNode& b = node(7);
  RadixNode& a = node(3);
  b.last_access_tick = a.last_access_tick = 5;
  policy_.insert(EvictionSet::kDevice, &b);
  policy_.insert(EvictionSet::kDevice, &a);
  EXPECT_EQ(drain(EvictionSet::kDevice), (std::vector<NodeId>{3, 7}));
}

TEST_F(LruPolicyTest, SetsAreIndependent) {
  RadixNode& dev = node(1);
  RadixNode& host = node(2);
  stamp(host);
  stamp(dev);
  policy_.insert(EvictionSet::kDevice, &dev);
  policy_.insert(EvictionSet::kHostOnly, &host);
  EXPECT_EQ(policy_.victim(EvictionSet::kDevice), &dev);
  EXPECT_EQ(policy_.victim(EvictionSet::kHostOnly), &host);
  EXPECT_FALSE(policy_.contains(EvictionSet::kDevice, &host));
  policy_.clear();
  EXPECT_EQ(policy_.victim(EvictionSet::kDevice), nullptr);
  EXPECT_EQ(policy_.victim(EvictionSet::kHostOnly), nullptr);
}

TEST_F(LruPolicyTest, VictimSkipsWhatTheCallerRejects) {
  RadixNode& a = node(1);
  RadixNode& b = node(2);
  stamp(a);
  stamp(b);
  policy_.insert(EvictionSet::kDevice, &a);
  policy_.insert(EvictionSet::kDevice, &b);
  EXPECT_EQ(policy_.victim(EvictionSet::kDevice, [&](const RadixNode* n) { return n == &a; }), &b);
  EXPECT_EQ(policy_.victim(EvictionSet::kDevice, [](const RadixNode*) { return true; }), nullptr);
  EXPECT_EQ(policy_.size(EvictionSet::kDevice), 2u);  // victim() removes nothing
}

TEST(EvictionPolicyTest, TreeUsesTheGivenPolicy) {
  // A policy that evicts the most recently used first: the tree asks it, not its own order.
  class Mru final : public EvictionPolicy {
   public:
    std::string_view name() const override { return "mru"; }
    void insert(EvictionSet set, RadixNode* n) override { of(set)[key(n)] = n; }
    void erase(EvictionSet set, RadixNode* n) override { of(set).erase(key(n)); }
    RadixNode* victim(EvictionSet set,
                      absl::FunctionRef<bool(const RadixNode*)> skip) const override {
      for (const auto& [k, n] : of(set)) {
        if (!skip(n)) return n;
      }
      return nullptr;
    }
    RadixNode* victim(EvictionSet set) const override {
      return of(set).empty() ? nullptr : of(set).begin()->second;
    }
    bool contains(EvictionSet set, const RadixNode* n) const override {
      return of(set).contains(key(n));
    }
    size_t size(EvictionSet set) const override { return of(set).size(); }
    void clear() override { sets_[0].clear(), sets_[1].clear(); }

   private:
    using Key = std::pair<uint64_t, NodeId>;
    using Set = std::map<Key, RadixNode*, std::greater<>>;  // most recent first
    static Key key(const RadixNode* n) { return {n->last_access_tick, n->id}; }
    Set& of(EvictionSet s) { return sets_[static_cast<size_t>(s)]; }
    const Set& of(EvictionSet s) const { return sets_[static_cast<size_t>(s)]; }
    Set sets_[2];
  };
  constexpr int32_t kPage = 2;
  PageAllocator alloc(8);
  ManualClock clock(0);
  RadixTree tree(RadixTreeOptions{kPage}, &alloc, nullptr, &clock, nullptr,
                 std::make_unique<Mru>());
  const std::vector<TokenId> old_seq{1, 1}, new_seq{2, 2};
  for (const auto* s : {&old_seq, &new_seq}) {
    std::vector<PageId> pages;
    ASSERT_TRUE(alloc.allocate(1, pages).has_value());
    tree.insert(*s, pages);
    clock.advance_ms(5);
  }
  EXPECT_EQ(tree.evict(1).evicted_pages, 1);
  EXPECT_TRUE(tree.contains(hash_blocks(old_seq, kPage)[0]));
  EXPECT_FALSE(tree.contains(hash_blocks(new_seq, kPage)[0]));
  ASSERT_TRUE(tree.check_invariants().has_value()) << tree.check_invariants().error().message;
}

}  // namespace
}  // namespace strata
