// Tests of the tiered (hierarchical) radix tree: write policies, demotion, backups,
// load_back, host eviction, flush, transfers that fail or run across a split, storage
// writes, insert_host, tool-session offload; then a randomized test against a block-level
// reference model with a per-medium replay of the event stream.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <random>
#include <set>
#include <string>
#include <unordered_map>

#include <unistd.h>

#include "cache/radix_tree.h"
#include "cache/tier_reference.h"

namespace strata::radix_tree_tier_test {

using tier_test::BlockView;
using tier_test::MediumReplay;
using tier_test::slice;

constexpr int32_t kPage = 2;

// Each value v becomes one page [10 v, 10 v + 1].
std::vector<TokenId> seq(std::initializer_list<TokenId> pages_first_tokens) {
  std::vector<TokenId> out;
  for (TokenId v : pages_first_tokens) {
    for (int k = 0; k < kPage; ++k) out.push_back(v * 10 + k);
  }
  return out;
}

std::vector<BlockHash> hashes(const std::vector<TokenId>& tokens) {
  return hash_blocks(tokens, kPage);
}

// An event reduced to what these tests compare.
struct Ev {
  bool stored = true;
  Medium medium = Medium::kDevice;
  std::vector<BlockHash> hashes;
  bool operator==(const Ev&) const = default;
};

void PrintTo(const Ev& e, std::ostream* os) {
  *os << (e.stored ? "stored " : "removed ") << medium_wire_name(e.medium) << " [";
  for (BlockHash h : e.hashes) *os << std::hex << h << std::dec << " ";
  *os << "]";
}

Ev stored(Medium m, std::vector<BlockHash> h) {
  return Ev{true, m, std::move(h)};
}
Ev removed(Medium m, std::vector<BlockHash> h) {
  return Ev{false, m, std::move(h)};
}

class TierTest : public ::testing::Test {
 protected:
  void make(WritePolicy policy, int32_t device_pages = 32, int32_t host_pages = 32,
            int32_t threshold = 2) {
    device_ = std::make_unique<PageAllocator>(device_pages);
    host_ = std::make_unique<PageAllocator>(host_pages);
    tree_ = std::make_unique<RadixTree>(RadixTreeOptions{kPage, policy, threshold}, device_.get(),
                                        &sink_, &clock_, host_.get());
  }

  // Inserts like a request that does not load: its device prefix plus fresh pages for the
  // rest (blocks found only on the host are computed again and re-adopted).
  InsertResult put(const std::vector<TokenId>& tokens) {
    MatchResult m = tree_->match_prefix(tokens);
    std::vector<PageId> pages = m.device_pages;
    const int32_t need = static_cast<int32_t>(tokens.size()) / kPage - m.num_pages;
    EXPECT_TRUE(device_->allocate(need, pages).has_value()) << "device pool too small";
    InsertResult r = tree_->insert(tokens, pages);
    EXPECT_TRUE(r.rejected_pages.empty());
    check();
    return r;
  }

  std::vector<TransferRequest> take() { return tree_->take_transfers(); }
  // Completes every requested copy, and those that completing requests.
  void complete_all() {
    while (tree_->io_pending()) {
      auto ts = take();
      if (ts.empty()) break;  // only storage writes left
      for (const auto& t : ts) tree_->complete_transfer(t);
    }
    check();
  }

  // Events since the last call (the test body's cursor; check() keeps its own).
  std::vector<Ev> events() {
    std::vector<Ev> out;
    for (; seen_ < sink_.events.size(); ++seen_) {
      const KvEvent& e = sink_.events[seen_];
      if (const auto* st = std::get_if<BlockStored>(&e)) {
        out.push_back(stored(st->medium, st->block_hashes));
      } else if (const auto* rm = std::get_if<BlockRemoved>(&e)) {
        out.push_back(removed(rm->medium, rm->block_hashes));
      }
    }
    return out;
  }
  void skip_events() { seen_ = sink_.events.size(); }

  // Invariants, page audits of both pools (the unit tests hold no pages between calls), and
  // the per-medium event replay against the tree's residency.
  void check() {
    auto inv = tree_->check_invariants();
    ASSERT_TRUE(inv.has_value()) << inv.error().message;
    std::vector<PageId> owned;
    tree_->collect_device_pages(owned);
    auto audit = device_->audit(owned);
    ASSERT_TRUE(audit.has_value()) << "device: " << audit.error().message;
    owned.clear();
    tree_->collect_host_pages(owned);
    audit = host_->audit(owned);
    ASSERT_TRUE(audit.has_value()) << "host: " << audit.error().message;
    for (; replayed_ < sink_.events.size(); ++replayed_) {
      ASSERT_EQ(replay_.apply(sink_.events[replayed_]), "") << "event " << replayed_;
    }
    const auto res = tier_test::residency_of(*tree_);
    ASSERT_EQ(replay_.blocks(Medium::kDevice), res.device) << "device replay";
    ASSERT_EQ(replay_.blocks(Medium::kHost), res.host) << "host replay";
  }

  // The block's view; a block missing from the tree fails the test and reads as a node in
  // no tier, so that the expectations after it fail instead of crashing.
  BlockView view(BlockHash h) {
    auto all = tier_test::view_blocks(*tree_);
    auto it = all.find(h);
    if (it != all.end()) return it->second;
    ADD_FAILURE() << "block " << h << " is not in the tree";
    static const RadixNode absent = [] {
      RadixNode n;
      n.hashes = {0};
      n.device_pages = {kInvalidPage};
      return n;
    }();
    return BlockView{&absent, 0};
  }
  RadixNode* node_of(BlockHash h) { return const_cast<RadixNode*>(view(h).node); }

  std::unique_ptr<PageAllocator> device_;
  std::unique_ptr<PageAllocator> host_;
  VectorEventSink sink_;
  ManualClock clock_{1000};
  std::unique_ptr<RadixTree> tree_;
  MediumReplay replay_;
  size_t replayed_ = 0;  // events applied to replay_
  size_t seen_ = 0;      // events returned by events()
};

// ---- write policies ----

TEST_F(TierTest, WriteThroughBacksUpEachInsertedBlock) {
  make(WritePolicy::kWriteThrough);
  const auto h = hashes(seq({1, 2, 3}));
  InsertResult ins = put(seq({1, 2}));
  EXPECT_EQ(events(), std::vector<Ev>{stored(Medium::kDevice, slice(h, 0, 2))});
  auto ts = take();
  ASSERT_EQ(ts.size(), 1u);
  EXPECT_EQ(ts[0].direction, TransferDirection::kDeviceToHost);
  EXPECT_EQ(ts[0].hashes, slice(h, 0, 2));
  EXPECT_EQ(ts[0].device_pages, ins.last_node->device_pages);
  ASSERT_EQ(ts[0].host_pages.size(), 2u);
  for (PageId p : ts[0].host_pages) EXPECT_TRUE(host_->is_allocated(p));
  // Until the copy lands the host pages are allocated but not a valid copy.
  EXPECT_TRUE(view(h[0]).backup_in_flight());
  EXPECT_FALSE(view(h[0]).on_host());
  check();
  tree_->complete_transfer(ts[0]);
  EXPECT_EQ(events(), std::vector<Ev>{stored(Medium::kHost, slice(h, 0, 2))});
  EXPECT_TRUE(view(h[1]).on_host());
  EXPECT_TRUE(view(h[1]).on_device());
  EXPECT_EQ(tree_->stats().backed_up_pages_total, 2u);
  // Extending the sequence backs up only the new block.
  put(seq({1, 2, 3}));
  ts = take();
  ASSERT_EQ(ts.size(), 1u);
  EXPECT_EQ(ts[0].hashes, slice(h, 2, 3));
  complete_all();
}

TEST_F(TierTest, WriteThroughSelectiveBacksUpWhenHitsReachThreshold) {
  make(WritePolicy::kWriteThroughSelective, 32, 32, /*threshold=*/2);
  const auto h = hashes(seq({1, 2}));
  put(seq({1, 2}));  // its match found nothing: no hit
  EXPECT_TRUE(take().empty());
  EXPECT_EQ(tree_->match_prefix(seq({1, 2})).num_pages, 2);  // hit 1
  EXPECT_TRUE(take().empty());
  EXPECT_EQ(tree_->match_prefix(seq({1, 2, 9})).num_pages, 2);  // hit 2
  auto ts = take();
  ASSERT_EQ(ts.size(), 1u);
  EXPECT_EQ(ts[0].direction, TransferDirection::kDeviceToHost);
  EXPECT_EQ(ts[0].hashes, h);
  tree_->match_prefix(seq({1, 2}));  // a copy exists (in flight): none again
  EXPECT_TRUE(take().empty());
  tree_->complete_transfer(ts[0]);
  EXPECT_TRUE(view(h[0]).on_host());
  check();
}

TEST_F(TierTest, WriteBackBacksUpOnlyWhenEvicted) {
  make(WritePolicy::kWriteBack);
  const auto h = hashes(seq({1, 2}));
  put(seq({1, 2}));
  tree_->match_prefix(seq({1, 2}));
  tree_->match_prefix(seq({1, 2}));
  EXPECT_TRUE(take().empty());
  skip_events();
  const EvictResult r = tree_->evict(2);
  EXPECT_EQ(r.evicted_pages, 0);
  EXPECT_EQ(r.pending_pages, 2);
  EXPECT_EQ(r.evicted_nodes, 1);
  EXPECT_EQ(device_->num_allocated(), 2);  // freed only once the copy lands
  auto ts = take();
  ASSERT_EQ(ts.size(), 1u);
  EXPECT_EQ(ts[0].direction, TransferDirection::kDeviceToHost);
  EXPECT_TRUE(view(h[0]).on_device());
  check();
  tree_->complete_transfer(ts[0]);
  EXPECT_EQ(events(), (std::vector<Ev>{stored(Medium::kHost, h), removed(Medium::kDevice, h)}));
  EXPECT_EQ(device_->num_allocated(), 0);
  EXPECT_TRUE(view(h[0]).host_only());
  const MatchResult m = tree_->match_prefix(seq({1, 2}));
  EXPECT_EQ(m.num_pages, 0);
  EXPECT_EQ(m.host_num_pages, 2);
  check();
}

// ---- device eviction ----

TEST_F(TierTest, EvictDemotesNodesWithHostCopyLeafFirst) {
  make(WritePolicy::kWriteThrough);
  const auto h = hashes(seq({1, 2, 3}));
  put(seq({1, 2}));
  put(seq({1, 2, 3}));
  complete_all();
  skip_events();
  EvictResult r = tree_->evict(1);
  EXPECT_EQ(r.evicted_pages, 1);  // the device leaf [3] only: its parent stays on device
  EXPECT_EQ(r.pending_pages, 0);
  EXPECT_EQ(events(), std::vector<Ev>{removed(Medium::kDevice, slice(h, 2, 3))});
  EXPECT_TRUE(view(h[1]).on_device());
  EXPECT_TRUE(view(h[2]).host_only());
  check();
  r = tree_->evict(1);
  EXPECT_EQ(r.evicted_pages, 2);
  EXPECT_EQ(events(), std::vector<Ev>{removed(Medium::kDevice, slice(h, 0, 2))});
  for (BlockHash b : h) EXPECT_TRUE(view(b).host_only());
  EXPECT_EQ(device_->num_allocated(), 0);
  EXPECT_EQ(tree_->stats().demoted_pages_total, 3u);
  const MatchResult m = tree_->match_prefix(seq({1, 2, 3, 4}));
  EXPECT_EQ(m.num_pages, 0);
  EXPECT_EQ(m.last_node, tree_->root());
  EXPECT_EQ(m.host_num_pages, 3);
  EXPECT_EQ(m.host_last_node, view(h[2]).node);
  check();
}

// A demoted block (its host copy kept) is not lost; one that the host pool then evicted for
// room is, and computing it again counts as recomputed.
TEST_F(TierTest, ABlockEvictedFromEveryTierForRoomCountsAsRecomputedWhenComputedAgain) {
  make(WritePolicy::kWriteThrough, 32, 4);
  const auto a = seq({1, 2, 3, 4});
  const auto ha = hashes(a);
  put(a);
  complete_all();
  EXPECT_EQ(tree_->evict(100).evicted_pages, 4);
  for (BlockHash b : ha) EXPECT_TRUE(view(b).host_only());
  put(seq({5, 6, 7, 8}));  // its backup takes the host pool: a's host copies go
  complete_all();
  EXPECT_FALSE(tree_->contains(ha[0]));
  EXPECT_EQ(tree_->stats().recomputed_pages_total, 0u);
  put(a);
  EXPECT_EQ(tree_->stats().recomputed_pages_total, 4u);
  EXPECT_DOUBLE_EQ(tree_->recomputed_pages_recent(), 4.0);
  complete_all();
}

TEST_F(TierTest, PinnedBlockWithoutHostCopyIsBackedUpThenDemoted) {
  make(WritePolicy::kWriteThroughSelective, 32, 32, /*threshold=*/100);
  const auto a = hashes(seq({5}));
  const auto b = hashes(seq({1, 2}));
  put(seq({5}));  // least recently used, unpinned, no host copy: dropped
  put(seq({1, 2}));
  tree_->pin(b);
  skip_events();
  const EvictResult r = tree_->evict(3);
  EXPECT_EQ(r.evicted_pages, 1);
  EXPECT_EQ(r.pending_pages, 2);
  EXPECT_EQ(r.evicted_nodes, 2);
  EXPECT_EQ(events(), std::vector<Ev>{removed(Medium::kDevice, a)});
  EXPECT_FALSE(tree_->contains(a[0]));
  auto ts = take();
  ASSERT_EQ(ts.size(), 1u);
  EXPECT_EQ(ts[0].hashes, b);
  EXPECT_TRUE(view(b[0]).on_device());
  check();
  tree_->complete_transfer(ts[0]);
  EXPECT_EQ(events(), (std::vector<Ev>{stored(Medium::kHost, b), removed(Medium::kDevice, b)}));
  EXPECT_TRUE(view(b[1]).host_only());
  EXPECT_EQ(tree_->pin_count(b[1]), 1u);
  check();
}

TEST_F(TierTest, ProtectedBlockWithoutHostRoomStaysOnDevice) {
  make(WritePolicy::kWriteThroughSelective, 32, /*host_pages=*/1, /*threshold=*/100);
  const auto a = hashes(seq({1, 2}));
  const auto b = hashes(seq({3, 4}));
  const auto c = hashes(seq({5}));
  put(seq({1, 2}));
  InsertResult ib = put(seq({3, 4}));
  put(seq({5}));
  tree_->pin(a);
  tree_->protect_host(ib.last_node, +1);
  skip_events();
  const EvictResult r = tree_->evict(5);
  EXPECT_EQ(r.evicted_pages, 1);  // only the unprotected [5]
  EXPECT_EQ(r.pending_pages, 0);
  EXPECT_EQ(events(), std::vector<Ev>{removed(Medium::kDevice, c)});
  EXPECT_TRUE(view(a[0]).on_device());
  EXPECT_TRUE(view(b[0]).on_device());
  EXPECT_TRUE(take().empty());
  EXPECT_EQ(tree_->stats().backups_skipped_total, 2u);
  tree_->protect_host(ib.last_node, -1);
  check();
}

TEST_F(TierTest, WriteBackWithFullHostPoolDropsUnpinnedLeafKeepsPinned) {
  make(WritePolicy::kWriteBack, 32, /*host_pages=*/1);
  const auto a = hashes(seq({1}));
  const auto b = hashes(seq({2}));
  const auto c = hashes(seq({3}));
  put(seq({1}));
  tree_->pin(a);
  EXPECT_EQ(tree_->evict(1).pending_pages, 1);  // [1] takes the only host page
  complete_all();
  EXPECT_TRUE(view(a[0]).host_only());
  put(seq({2}));
  put(seq({3}));
  tree_->pin(c);
  skip_events();
  const EvictResult r = tree_->evict(2);
  EXPECT_EQ(r.evicted_pages, 1);
  EXPECT_EQ(r.pending_pages, 0);
  EXPECT_EQ(events(), std::vector<Ev>{removed(Medium::kDevice, b)});  // dropped, not copied
  EXPECT_FALSE(tree_->contains(b[0]));
  EXPECT_TRUE(view(c[0]).on_device());  // pinned: kept on the device
  EXPECT_TRUE(view(a[0]).host_only());  // a pinned host copy is never a host victim
  EXPECT_EQ(tree_->stats().backups_skipped_total, 2u);
  EXPECT_TRUE(take().empty());
  check();
}

TEST_F(TierTest, BackupMakesHostRoomByEvictingLeastRecentHostLeaf) {
  make(WritePolicy::kWriteBack, 32, /*host_pages=*/2);
  const auto a = hashes(seq({1}));
  const auto b = hashes(seq({2}));
  const auto c = hashes(seq({3}));
  for (TokenId v : {1, 2}) {
    put(seq({v}));
    EXPECT_EQ(tree_->evict(1).pending_pages, 1);
    complete_all();
  }
  EXPECT_TRUE(view(a[0]).host_only());
  EXPECT_TRUE(view(b[0]).host_only());
  put(seq({3}));
  skip_events();
  EXPECT_EQ(tree_->evict(1).pending_pages, 1);  // [3] needs a host page: [1] leaves the host
  EXPECT_EQ(events(), std::vector<Ev>{removed(Medium::kHost, a)});
  complete_all();
  EXPECT_FALSE(tree_->contains(a[0]));
  EXPECT_TRUE(view(b[0]).host_only());
  EXPECT_TRUE(view(c[0]).host_only());
  EXPECT_EQ(tree_->stats().host_evicted_pages_total, 1u);
}

TEST_F(TierTest, FailedBackupReleasesHostPages) {
  make(WritePolicy::kWriteThrough);
  const auto h = hashes(seq({1, 2}));
  put(seq({1, 2}));
  auto ts = take();
  ASSERT_EQ(ts.size(), 1u);
  EXPECT_EQ(host_->num_allocated(), 2);
  skip_events();
  tree_->complete_transfer(ts[0], /*ok=*/false);
  EXPECT_TRUE(events().empty());  // the host copy was never announced
  EXPECT_EQ(host_->num_allocated(), 0);
  EXPECT_EQ(view(h[0]).host_page(), kInvalidPage);
  EXPECT_EQ(tree_->stats().io_pending_nodes, 0);
  check();
  // No host copy and nothing protects it: eviction drops it.
  EXPECT_EQ(tree_->evict(2).evicted_pages, 2);
  EXPECT_FALSE(tree_->contains(h[0]));
  check();
}

TEST_F(TierTest, FailedBackupOfPendingDemotionKeepsBlockOnDevice) {
  make(WritePolicy::kWriteBack);
  const auto h = hashes(seq({1, 2}));
  put(seq({1, 2}));
  tree_->pin(h);
  EXPECT_EQ(tree_->evict(2).pending_pages, 2);
  auto ts = take();
  ASSERT_EQ(ts.size(), 1u);
  tree_->complete_transfer(ts[0], /*ok=*/false);
  EXPECT_TRUE(view(h[0]).on_device());
  EXPECT_FALSE(view(h[0]).node->demote_pending);
  EXPECT_EQ(host_->num_allocated(), 0);
  check();
  // The next eviction tries again.
  EXPECT_EQ(tree_->evict(2).pending_pages, 2);
  complete_all();
  EXPECT_TRUE(view(h[0]).host_only());
}

// ---- loading back ----

TEST_F(TierTest, LoadBackLoadsHostPartInvisibleUntilComplete) {
  make(WritePolicy::kWriteThrough);
  const auto h = hashes(seq({1, 2, 3}));
  put(seq({1}));
  put(seq({1, 2, 3}));
  complete_all();
  EXPECT_EQ(tree_->evict(2).evicted_pages, 2);  // [2 3] leaves, [1] stays
  const MatchResult m = tree_->match_prefix(seq({1, 2, 3, 4}));
  ASSERT_EQ(m.num_pages, 1);
  ASSERT_EQ(m.host_num_pages, 2);
  ASSERT_EQ(m.host_last_node, view(h[2]).node);
  const LockReceipt lock = tree_->lock(m.host_last_node);
  const int32_t free_before = device_->num_free();
  skip_events();
  ASSERT_TRUE(tree_->load_back(m).has_value());
  auto ts = take();
  ASSERT_EQ(ts.size(), 1u);
  const TransferRequest load = ts[0];
  EXPECT_EQ(load.direction, TransferDirection::kHostToDevice);
  EXPECT_EQ(load.hashes, slice(h, 1, 3));
  EXPECT_EQ(load.host_pages, m.host_last_node->host_pages);
  EXPECT_EQ(load.device_pages.size(), 2u);
  EXPECT_EQ(device_->num_free(), free_before - 2);
  EXPECT_TRUE(view(h[1]).loading());
  EXPECT_TRUE(events().empty());  // nothing readable yet
  check();

  // Loading blocks are neither a device hit nor a host continuation.
  MatchResult during = tree_->match_prefix(seq({1, 2, 3}));
  EXPECT_EQ(during.num_pages, 1);
  EXPECT_EQ(during.host_num_pages, 0);
  // A request that computed them again gets its pages back: no second copy.
  std::vector<PageId> pages = during.device_pages;
  ASSERT_TRUE(device_->allocate(2, pages).has_value());
  InsertResult ins = tree_->insert(seq({1, 2, 3}), pages);
  EXPECT_EQ(ins.rejected_pages, std::vector<PageId>(pages.begin() + 1, pages.end()));
  device_->free(ins.rejected_pages);
  EXPECT_TRUE(events().empty());
  check();

  tree_->complete_transfer(load);
  EXPECT_EQ(events(), std::vector<Ev>{stored(Medium::kDevice, slice(h, 1, 3))});
  const MatchResult after = tree_->match_prefix(seq({1, 2, 3}));
  EXPECT_EQ(after.num_pages, 3);
  EXPECT_EQ(std::vector<PageId>(after.device_pages.begin() + 1, after.device_pages.end()),
            load.device_pages);
  EXPECT_EQ(tree_->stats().loaded_pages_total, 2u);
  ASSERT_TRUE(tree_->release(lock).has_value());
  check();
}

TEST_F(TierTest, LoadBackIsAllOrNothing) {
  make(WritePolicy::kWriteThrough, /*device_pages=*/4);
  const auto h = hashes(seq({1, 2}));
  put(seq({1, 2}));
  complete_all();
  EXPECT_EQ(tree_->evict(2).evicted_pages, 2);
  InsertResult busy = put(seq({5, 6, 7}));
  complete_all();
  const LockReceipt busy_lock = tree_->lock(busy.last_node);  // 3 of 4 pages held
  MatchResult m = tree_->match_prefix(seq({1, 2}));
  ASSERT_EQ(m.host_num_pages, 2);
  LockReceipt lock = tree_->lock(m.host_last_node);
  skip_events();
  auto st = tree_->load_back(m);
  ASSERT_FALSE(st.has_value());
  EXPECT_EQ(st.error().code, ErrorCode::kOutOfPages);
  EXPECT_TRUE(take().empty());
  EXPECT_TRUE(events().empty());
  EXPECT_EQ(device_->num_free(), 1);
  for (BlockHash b : h) {
    EXPECT_TRUE(view(b).host_only());
    EXPECT_FALSE(view(b).loading());
  }
  ASSERT_TRUE(tree_->release(lock).has_value());
  check();

  // With the other request gone, its pages are demoted to make room.
  ASSERT_TRUE(tree_->release(busy_lock).has_value());
  m = tree_->match_prefix(seq({1, 2}));
  lock = tree_->lock(m.host_last_node);
  ASSERT_TRUE(tree_->load_back(m).has_value());
  auto ts = take();
  ASSERT_EQ(ts.size(), 1u);
  EXPECT_EQ(ts[0].direction, TransferDirection::kHostToDevice);
  tree_->complete_transfer(ts[0]);
  EXPECT_EQ(tree_->match_prefix(seq({1, 2})).num_pages, 2);
  ASSERT_TRUE(tree_->release(lock).has_value());
  check();
}

TEST_F(TierTest, FailedLoadReleasesDevicePages) {
  make(WritePolicy::kWriteThrough);
  const auto h = hashes(seq({1, 2}));
  put(seq({1, 2}));
  complete_all();
  tree_->evict(2);
  const MatchResult m = tree_->match_prefix(seq({1, 2}));
  const LockReceipt lock = tree_->lock(m.host_last_node);
  const int32_t free_before = device_->num_free();
  ASSERT_TRUE(tree_->load_back(m).has_value());
  auto ts = take();
  ASSERT_EQ(ts.size(), 1u);
  skip_events();
  tree_->complete_transfer(ts[0], /*ok=*/false);
  EXPECT_TRUE(events().empty());
  EXPECT_EQ(device_->num_free(), free_before);
  for (PageId p : ts[0].device_pages) EXPECT_FALSE(device_->is_allocated(p));
  EXPECT_TRUE(view(h[0]).host_only());
  EXPECT_FALSE(view(h[0]).loading());
  const MatchResult again = tree_->match_prefix(seq({1, 2}));
  EXPECT_EQ(again.num_pages, 0);
  EXPECT_EQ(again.host_num_pages, 2);
  ASSERT_TRUE(tree_->release(lock).has_value());
  check();
}

// ---- host eviction ----

TEST_F(TierTest, HostEvictionTakesLeastRecentlyUsedLeafFirst) {
  make(WritePolicy::kWriteThrough);
  const auto a = hashes(seq({1}));
  const auto b = hashes(seq({2}));
  const auto c = hashes(seq({3}));
  put(seq({1}));
  put(seq({2}));
  put(seq({3}));
  complete_all();
  EXPECT_EQ(tree_->evict(3).evicted_pages, 3);
  EXPECT_EQ(tree_->match_prefix(seq({1})).host_num_pages, 1);  // [1] becomes the newest
  skip_events();
  EXPECT_EQ(tree_->evict_host(1), 1);
  EXPECT_EQ(events(), std::vector<Ev>{removed(Medium::kHost, b)});
  EXPECT_EQ(tree_->evict_host(1), 1);
  EXPECT_EQ(events(), std::vector<Ev>{removed(Medium::kHost, c)});
  EXPECT_EQ(tree_->evict_host(1), 1);
  EXPECT_EQ(events(), std::vector<Ev>{removed(Medium::kHost, a)});
  EXPECT_EQ(tree_->evict_host(1), 0);
  EXPECT_EQ(host_->num_allocated(), 0);
  check();
}

TEST_F(TierTest, ProtectedOrBusyHostNodesAreNeverHostVictims) {
  make(WritePolicy::kWriteThrough);
  std::vector<std::vector<BlockHash>> h;
  for (TokenId v : {1, 2, 3, 4, 5, 6}) {
    put(seq({v}));
    h.push_back(hashes(seq({v})));
  }
  complete_all();
  EXPECT_EQ(tree_->evict(6).evicted_pages, 6);
  tree_->pin(h[0]);  // pinned
  const LockReceipt locked = tree_->lock(tree_->match_prefix(seq({2})).host_last_node);
  tree_->protect_host(node_of(h[2][0]), +1);               // session
  EXPECT_EQ(tree_->begin_storage_write(h[3]).size(), 1u);  // storage write
  const MatchResult m = tree_->match_prefix(seq({6}));     // loading
  const LockReceipt loading = tree_->lock(m.host_last_node);
  ASSERT_TRUE(tree_->load_back(m).has_value());
  auto load = take();
  skip_events();
  EXPECT_EQ(tree_->evict_host(100), 1);
  EXPECT_EQ(events(), std::vector<Ev>{removed(Medium::kHost, h[4])});
  for (size_t i : {0, 1, 2, 3, 5}) EXPECT_TRUE(tree_->contains(h[i][0])) << i;
  check();

  tree_->unpin(h[0]);
  ASSERT_TRUE(tree_->release(locked).has_value());
  tree_->protect_host(node_of(h[2][0]), -1);
  tree_->finish_storage_write(h[3], std::vector<uint8_t>{1});
  for (const auto& t : load) tree_->complete_transfer(t);
  ASSERT_TRUE(tree_->release(loading).has_value());
  EXPECT_EQ(tree_->evict_host(100), 4);
  EXPECT_TRUE(view(h[5][0]).on_device());  // loaded: not host-only
  check();
}

// ---- flush ----

TEST_F(TierTest, FlushDropsUnprotectedAndKeepsPinnedOnHost) {
  make(WritePolicy::kWriteThrough);
  const auto a = hashes(seq({1, 2}));
  const auto b = hashes(seq({3}));
  const auto c = hashes(seq({4}));
  put(seq({1, 2}));
  put(seq({3}));
  InsertResult ic = put(seq({4}));
  complete_all();
  tree_->pin(a);
  const LockReceipt lock = tree_->lock(ic.last_node);
  const FlushResult r = tree_->flush();
  EXPECT_EQ(r.evicted_pages, 3);
  EXPECT_EQ(r.evicted_host_pages, 1);
  EXPECT_EQ(r.pinned_preserved, 2);
  EXPECT_EQ(r.locked_skipped, 1);
  complete_all();
  for (BlockHash x : a) EXPECT_TRUE(view(x).host_only());
  EXPECT_FALSE(tree_->contains(b[0]));
  EXPECT_TRUE(view(c[0]).on_device());
  ASSERT_TRUE(tree_->release(lock).has_value());
  check();
}

TEST_F(TierTest, FlushBacksUpPinnedBlocksFirstUnderWriteBack) {
  make(WritePolicy::kWriteBack);
  const auto a = hashes(seq({1, 2}));
  put(seq({1, 2}));
  put(seq({3}));
  tree_->pin(a);
  const FlushResult r = tree_->flush();
  EXPECT_EQ(r.evicted_pages, 3);  // one freed now, two once backed up
  EXPECT_EQ(r.pinned_preserved, 2);
  auto ts = take();
  ASSERT_EQ(ts.size(), 1u);
  EXPECT_EQ(ts[0].hashes, a);
  EXPECT_TRUE(view(a[0]).on_device());
  tree_->complete_transfer(ts[0]);
  for (BlockHash x : a) EXPECT_TRUE(view(x).host_only());
  EXPECT_EQ(device_->num_allocated(), 0);
  check();
}

// A pinned block at the head of a node whose unpinned tail and children flush removes is
// split off during the flush; it must still leave the device like every pinned block.
TEST_F(TierTest, FlushDemotesPinnedBlockSplitOffDuringFlush) {
  make(WritePolicy::kWriteThrough);
  const auto h = hashes(seq({1, 2, 3}));
  put(seq({1, 2}));
  put(seq({1, 2, 3}));
  tree_->pin(slice(h, 0, 1));  // [1 2] has a child: no split yet
  complete_all();
  tree_->flush();
  complete_all();
  EXPECT_FALSE(tree_->contains(h[1]));
  EXPECT_FALSE(tree_->contains(h[2]));
  ASSERT_TRUE(tree_->contains(h[0]));
  EXPECT_TRUE(view(h[0]).host_only()) << "a pinned block stayed on the device after flush";
  EXPECT_EQ(device_->num_allocated(), 0);
  check();
}

// flush() marks every kept device node for demotion; demoting a child demotes its parent
// (marked earlier, e.g. by offload_path) before flush reaches it. The parent must not stay
// marked once it is host-only: re-adopted later by insert(), it would leave the device at
// the next unlock although nothing asked for that any more.
TEST_F(TierTest, FlushLeavesNoStaleDemotionMark) {
  make(WritePolicy::kWriteThrough);
  const auto h = hashes(seq({1, 2}));
  put(seq({1}));
  InsertResult child = put(seq({1, 2}));
  complete_all();
  tree_->pin(slice(h, 1, 2));  // both nodes are kept by flush
  RadixNode* parent = child.last_node->parent;
  EXPECT_EQ(tree_->offload_path(parent), 1);  // marked; waits for the child to leave
  EXPECT_TRUE(view(h[0]).on_device());
  tree_->flush();
  complete_all();
  for (BlockHash x : h) ASSERT_TRUE(view(x).host_only());
  EXPECT_FALSE(parent->demote_pending) << "a host-only node is still marked for demotion";
  put(seq({1}));  // computed again: the device copy is re-adopted
  ASSERT_TRUE(view(h[0]).on_device());
  const LockReceipt lock = tree_->lock(parent);
  ASSERT_TRUE(tree_->release(lock).has_value());
  EXPECT_TRUE(view(h[0]).on_device()) << "a re-adopted node left the device on unlock";
  check();
}

// ---- transfers across a split ----

TEST_F(TierTest, SplitWhileBackupInFlightFinishesBothHalves) {
  make(WritePolicy::kWriteThrough);
  const auto h = hashes(seq({1, 2, 3, 4}));
  put(seq({1, 2, 3, 4}));
  auto ts = take();
  ASSERT_EQ(ts.size(), 1u);
  EXPECT_EQ(tree_->match_prefix(seq({1, 2})).num_pages, 2);  // splits the node
  EXPECT_EQ(tree_->stats().num_nodes, 2);
  check();
  skip_events();
  tree_->complete_transfer(ts[0]);
  EXPECT_EQ(events(), (std::vector<Ev>{stored(Medium::kHost, slice(h, 0, 2)),
                                       stored(Medium::kHost, slice(h, 2, 4))}));
  EXPECT_EQ(tree_->stats().io_pending_nodes, 0);
  for (BlockHash x : h) EXPECT_TRUE(view(x).on_host());
  EXPECT_EQ(tree_->evict(4).evicted_pages, 4);
  for (BlockHash x : h) EXPECT_TRUE(view(x).host_only());
  check();
}

TEST_F(TierTest, SplitDuringPendingDemotionKeepsTheMatchedHalfOnDevice) {
  make(WritePolicy::kWriteBack);
  const auto h = hashes(seq({1, 2, 3, 4}));
  put(seq({1, 2, 3, 4}));
  EXPECT_EQ(tree_->evict(4).pending_pages, 4);
  auto ts = take();
  ASSERT_EQ(ts.size(), 1u);
  EXPECT_EQ(tree_->match_prefix(seq({1, 2})).num_pages, 2);  // wanted again: stays
  check();
  skip_events();
  tree_->complete_transfer(ts[0]);
  EXPECT_EQ(events(), (std::vector<Ev>{stored(Medium::kHost, slice(h, 0, 2)),
                                       stored(Medium::kHost, slice(h, 2, 4)),
                                       removed(Medium::kDevice, slice(h, 2, 4))}));
  EXPECT_TRUE(view(h[0]).on_device());
  EXPECT_TRUE(view(h[0]).on_host());
  EXPECT_TRUE(view(h[3]).host_only());
  check();
}

TEST_F(TierTest, SplitWhileLoadInFlightFinishesBothHalves) {
  make(WritePolicy::kWriteThrough);
  const auto h = hashes(seq({1, 2, 3, 4}));
  put(seq({1, 2, 3, 4}));
  complete_all();
  tree_->evict(4);
  const MatchResult m = tree_->match_prefix(seq({1, 2, 3, 4}));
  ASSERT_EQ(m.host_num_pages, 4);
  const LockReceipt lock = tree_->lock(m.host_last_node);
  ASSERT_TRUE(tree_->load_back(m).has_value());
  auto ts = take();
  ASSERT_EQ(ts.size(), 1u);
  tree_->pin(slice(h, 1, 2));  // a pinned block mid-node splits off the unpinned tail
  EXPECT_EQ(tree_->stats().num_nodes, 2);
  check();
  skip_events();
  tree_->complete_transfer(ts[0]);
  EXPECT_EQ(events(), (std::vector<Ev>{stored(Medium::kDevice, slice(h, 0, 2)),
                                       stored(Medium::kDevice, slice(h, 2, 4))}));
  const MatchResult after = tree_->match_prefix(seq({1, 2, 3, 4}));
  EXPECT_EQ(after.num_pages, 4);
  EXPECT_EQ(after.device_pages, ts[0].device_pages);
  ASSERT_TRUE(tree_->release(lock).has_value());
  check();
}

TEST_F(TierTest, SplitWhileStorageWriteInFlightFinishesBothHalves) {
  make(WritePolicy::kWriteThrough);
  const auto h = hashes(seq({1, 2, 3, 4}));
  put(seq({1, 2, 3, 4}));
  complete_all();
  tree_->evict(4);
  const auto w = tree_->begin_storage_write(h);
  ASSERT_EQ(w.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(w[i].first, h[i]);
    EXPECT_EQ(w[i].second, view(h[i]).host_page());
  }
  EXPECT_EQ(tree_->match_prefix(seq({1, 2})).host_num_pages, 2);  // splits the host node
  check();
  EXPECT_EQ(tree_->evict_host(4), 0);  // both halves are being written
  skip_events();
  tree_->finish_storage_write(h, std::vector<uint8_t>{1, 1, 1, 1});
  EXPECT_EQ(events(), (std::vector<Ev>{stored(Medium::kStorage, slice(h, 0, 2)),
                                       stored(Medium::kStorage, slice(h, 2, 4))}));
  for (BlockHash x : h) EXPECT_TRUE(view(x).stored());
  EXPECT_EQ(tree_->stats().stored_pages, 4);
  EXPECT_EQ(tree_->stats().io_pending_nodes, 0);
  EXPECT_TRUE(tree_->begin_storage_write(h).empty());  // nothing left to write
  EXPECT_EQ(tree_->evict_host(4), 4);
  check();
}

// ---- insert over host-only blocks, insert_host ----

TEST_F(TierTest, InsertReAdoptsDevicePagesOfHostOnlyBlocks) {
  make(WritePolicy::kWriteThrough);
  const auto h = hashes(seq({1, 2, 3}));
  put(seq({1, 2}));
  complete_all();
  tree_->evict(2);
  const MatchResult m = tree_->match_prefix(seq({1, 2, 3}));
  ASSERT_EQ(m.host_num_pages, 2);
  std::vector<PageId> pages;
  ASSERT_TRUE(device_->allocate(3, pages).has_value());
  skip_events();
  const InsertResult r = tree_->insert(seq({1, 2, 3}), pages);
  EXPECT_TRUE(r.rejected_pages.empty());
  EXPECT_EQ(r.num_existing_pages, 2);
  EXPECT_EQ(r.num_new_pages, 1);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(view(h[i]).device_page(), pages[i]);
  EXPECT_TRUE(view(h[0]).on_host());  // the host copy stays valid
  EXPECT_EQ(events(), (std::vector<Ev>{stored(Medium::kDevice, slice(h, 0, 2)),
                                       stored(Medium::kDevice, slice(h, 2, 3))}));
  auto ts = take();
  ASSERT_EQ(ts.size(), 1u);
  EXPECT_EQ(ts[0].hashes, slice(h, 2, 3));
  complete_all();
}

TEST_F(TierTest, InsertHostAddsStorageBlocksThatLoadBack) {
  make(WritePolicy::kWriteThrough);
  const auto h = hashes(seq({1, 2, 3}));
  put(seq({1}));
  complete_all();
  std::vector<PageId> hp;
  ASSERT_TRUE(host_->allocate(2, hp).has_value());
  skip_events();
  InsertResult r = tree_->insert_host(seq({1, 2, 3}), 1, hp, "");
  EXPECT_EQ(r.num_existing_pages, 1);
  EXPECT_EQ(r.num_new_pages, 2);
  EXPECT_TRUE(r.rejected_pages.empty());
  EXPECT_EQ(r.block_hashes, slice(h, 1, 3));
  EXPECT_EQ(events(), std::vector<Ev>{stored(Medium::kHost, slice(h, 1, 3))});
  EXPECT_TRUE(view(h[1]).host_only());
  EXPECT_TRUE(view(h[2]).stored());
  EXPECT_EQ(view(h[2]).host_page(), hp[1]);
  check();

  const MatchResult m = tree_->match_prefix(seq({1, 2, 3}));
  EXPECT_EQ(m.num_pages, 1);
  EXPECT_EQ(m.host_num_pages, 2);
  const LockReceipt lock = tree_->lock(m.host_last_node);
  ASSERT_TRUE(tree_->load_back(m).has_value());
  complete_all();
  EXPECT_EQ(tree_->match_prefix(seq({1, 2, 3})).num_pages, 3);
  ASSERT_TRUE(tree_->release(lock).has_value());

  // A run that cannot hang below what the tree has comes back whole.
  std::vector<PageId> gap;
  ASSERT_TRUE(host_->allocate(2, gap).has_value());
  r = tree_->insert_host(seq({7, 8, 9}), 1, gap, "");
  EXPECT_EQ(r.num_new_pages, 0);
  EXPECT_EQ(r.rejected_pages, gap);
  host_->free(r.rejected_pages);
  // Pages of blocks the tree has come back; the rest hangs below them.
  std::vector<PageId> overlap;
  ASSERT_TRUE(host_->allocate(3, overlap).has_value());
  r = tree_->insert_host(seq({1, 2, 5}), 0, overlap, "");
  EXPECT_EQ(r.num_existing_pages, 2);
  EXPECT_EQ(r.num_new_pages, 1);
  EXPECT_EQ(r.rejected_pages, std::vector<PageId>(overlap.begin(), overlap.begin() + 2));
  host_->free(r.rejected_pages);
  EXPECT_TRUE(view(hashes(seq({1, 2, 5}))[2]).host_only());
  check();
}

// ---- tool sessions: offload_path and protect_host ----

TEST_F(TierTest, OffloadPathMovesProtectedSessionToHost) {
  make(WritePolicy::kWriteThroughSelective, 32, 32, /*threshold=*/100);
  const auto h = hashes(seq({1, 2, 3}));
  put(seq({1, 2}));
  InsertResult session = put(seq({1, 2, 3}));
  tree_->protect_host(session.last_node, +1);
  EXPECT_EQ(tree_->offload_path(session.last_node), 3);
  auto ts = take();
  ASSERT_EQ(ts.size(), 2u);  // neither node had a host copy
  EXPECT_EQ(ts[0].hashes, slice(h, 2, 3));
  EXPECT_EQ(ts[1].hashes, slice(h, 0, 2));
  for (BlockHash x : h) EXPECT_TRUE(view(x).on_device());
  for (const auto& t : ts) tree_->complete_transfer(t);
  for (BlockHash x : h) EXPECT_TRUE(view(x).host_only());
  EXPECT_EQ(device_->num_allocated(), 0);
  EXPECT_EQ(tree_->evict_host(100), 0);  // the session protects its host copy
  tree_->flush();
  for (BlockHash x : h) EXPECT_TRUE(view(x).host_only());
  check();
  tree_->protect_host(session.last_node, -1);
  EXPECT_EQ(tree_->evict_host(100), 3);
  EXPECT_EQ(tree_->stats().num_nodes, 0);
  check();
}

TEST_F(TierTest, OffloadPathWaitsForLocks) {
  make(WritePolicy::kWriteThrough);
  const auto h = hashes(seq({5, 6}));
  InsertResult ins = put(seq({5, 6}));
  const LockReceipt lock = tree_->lock(ins.last_node);
  EXPECT_EQ(tree_->offload_path(ins.last_node), 2);
  complete_all();  // the write-through copy lands; the lock still holds the device copy
  EXPECT_TRUE(view(h[0]).on_device());
  ASSERT_TRUE(tree_->release(lock).has_value());
  EXPECT_TRUE(view(h[0]).host_only());
  check();
}

// offload_path marks a node for demotion while a storage write reads its host copy; when
// the write finishes nothing holds the node any more and it must leave the device.
TEST_F(TierTest, OffloadPathFinishesAfterStorageWrite) {
  make(WritePolicy::kWriteThrough);
  const auto h = hashes(seq({1}));
  InsertResult ins = put(seq({1}));
  complete_all();
  ASSERT_EQ(tree_->begin_storage_write(h).size(), 1u);
  EXPECT_EQ(tree_->offload_path(ins.last_node), 1);
  EXPECT_TRUE(view(h[0]).on_device());  // the write holds it
  tree_->finish_storage_write(h, std::vector<uint8_t>{1});
  EXPECT_TRUE(view(h[0]).host_only()) << "offloaded node stayed on the device";
  check();
}

// ---- storage events ----

TEST_F(TierTest, StorageEventNamesOnlyWrittenBlocks) {
  make(WritePolicy::kWriteThrough);
  const auto h = hashes(seq({1, 2}));
  put(seq({1, 2}));
  complete_all();
  ASSERT_EQ(tree_->begin_storage_write(h).size(), 2u);
  skip_events();
  tree_->finish_storage_write(h, std::vector<uint8_t>{1, 0});
  EXPECT_EQ(events(), std::vector<Ev>{stored(Medium::kStorage, slice(h, 0, 1))});
  EXPECT_EQ(tree_->stats().stored_pages, 1);
  ASSERT_EQ(tree_->begin_storage_write(h).size(), 2u);  // the node is not fully stored
  tree_->finish_storage_write(h, std::vector<uint8_t>{0, 1});
  EXPECT_EQ(events(), std::vector<Ev>{stored(Medium::kStorage, slice(h, 1, 2))});
  EXPECT_EQ(tree_->stats().stored_pages, 2);
  check();
}

// ---- host eviction nested in other operations ----
//
// Making host room (evict_host inside start_backup or load_back) removes a host-only leaf;
// its parent, now childless, may be split by restore_pin_tail. These cases check that the
// node the outer operation is working on stays consistent.

// evict() backs up a pinned device leaf whose only child is a host-only leaf; the host
// room comes from that child, and the node, now childless, splits off its unpinned tail.
// What evict reports as pending must be what its backups free when they land.
TEST_F(TierTest, BackupWhoseHostRoomComesFromItsOwnChild) {
  make(WritePolicy::kWriteBack, 8, /*host_pages=*/2);
  const auto h = hashes(seq({1, 2, 3, 4}));
  put(seq({1, 2, 3, 4}));
  EXPECT_EQ(tree_->match_prefix(seq({1, 2})).num_pages, 2);  // [1 2] -> [3 4]
  EXPECT_EQ(tree_->evict(2).pending_pages, 2);               // [3 4] fills the host
  complete_all();
  ASSERT_TRUE(view(h[2]).host_only());
  tree_->pin(slice(h, 0, 1));  // [1 2] has a child: no split yet
  const int32_t allocated = device_->num_allocated();
  const EvictResult r = tree_->evict(1);
  check();
  int32_t queued = 0;
  for (const auto& t : take()) {
    EXPECT_EQ(t.hashes.size(), t.device_pages.size());
    EXPECT_EQ(t.hashes.size(), t.host_pages.size());
    queued += static_cast<int32_t>(t.hashes.size());
    tree_->complete_transfer(t);
  }
  check();
  EXPECT_EQ(r.pending_pages, queued) << "pending pages without a backup";
  EXPECT_EQ(allocated - device_->num_allocated(), r.evicted_pages + r.pending_pages)
      << "pending pages that never left the device";
  ASSERT_TRUE(tree_->contains(h[0]));
  EXPECT_TRUE(view(h[0]).on_host() || view(h[0]).on_device());
}

// The same split during a selective backup: the matched node reached the threshold, so
// both of its blocks are due a host copy, not only the unpinned tail.
TEST_F(TierTest, SelectiveBackupCoversTheWholeMatchedNode) {
  make(WritePolicy::kWriteThroughSelective, 8, /*host_pages=*/2, /*threshold=*/2);
  const auto h = hashes(seq({1, 2, 3, 4}));
  put(seq({1, 2}));
  std::vector<PageId> hp;
  ASSERT_TRUE(host_->allocate(2, hp).has_value());
  ASSERT_EQ(tree_->insert_host(seq({1, 2, 3, 4}), 2, hp, "").num_new_pages, 2);  // host full
  tree_->pin(slice(h, 0, 1));  // [1 2] has a child: no split yet
  tree_->match_prefix(seq({1, 2}));
  tree_->match_prefix(seq({1, 2}));  // threshold: back up [1 2]; room comes from [3 4]
  check();
  EXPECT_TRUE(view(h[1]).node->has_host_pages());
  EXPECT_TRUE(view(h[0]).node->has_host_pages()) << "the split-off head got no backup";
  complete_all();
}

// load_back() must evict device pages; the backup that eviction starts takes host room
// from a host-only child of the node being loaded, which splits the load path.
TEST_F(TierTest, LoadBackWhosePathIsSplitWhileMakingRoom) {
  make(WritePolicy::kWriteThroughSelective, /*device_pages=*/4, /*host_pages=*/3,
       /*threshold=*/100);
  const auto h = hashes(seq({1, 2, 3}));
  std::vector<PageId> hp;
  ASSERT_TRUE(host_->allocate(3, hp).has_value());
  ASSERT_EQ(tree_->insert_host(seq({1, 2, 3}), 0, hp, "").num_new_pages, 3);  // host full
  put(seq({7}));
  tree_->pin(hashes(seq({7})));  // device-only and pinned: evicting it needs a backup
  put(seq({8, 9, 6}));           // device full
  const MatchResult m = tree_->match_prefix(seq({1, 2}));  // splits [1 2] -> [3]
  ASSERT_EQ(m.host_num_pages, 2);
  tree_->pin(slice(h, 0, 1));
  const LockReceipt lock = tree_->lock(m.host_last_node);
  ASSERT_TRUE(tree_->load_back(m).has_value());
  check();
  auto ts = take();
  ASSERT_FALSE(ts.empty());
  EXPECT_EQ(ts.back().direction, TransferDirection::kHostToDevice);
  EXPECT_EQ(ts.back().hashes, slice(h, 0, 2));
  for (const auto& t : ts) tree_->complete_transfer(t);
  EXPECT_EQ(tree_->match_prefix(seq({1, 2})).num_pages, 2);
  ASSERT_TRUE(tree_->release(lock).has_value());
  check();
}

// Scenarios that touch a node after host eviction freed it run in a child process, so that
// a crash fails this test only. Each returns 0 when the tree stayed consistent.
int exit_code(bool ok) {
  return ok ? 0 : 1;
}

bool consistent(const RadixTree& tree, const PageAllocator& device, const PageAllocator& host) {
  std::vector<PageId> d, hp;
  tree.collect_device_pages(d);
  tree.collect_host_pages(hp);
  return tree.check_invariants().has_value() && device.audit(d).has_value() &&
         host.audit(hp).has_value();
}

void complete_everything(RadixTree& tree) {
  for (int round = 0; round < 8; ++round) {
    for (const auto& t : tree.take_transfers()) tree.complete_transfer(t);
  }
}

// flush() walks a list of nodes made before it starts; a backup during the walk evicts a
// host-only leaf that is still on that list.
int flush_with_host_eviction_scenario() {
  PageAllocator device(16), host(2);
  ManualClock clock(0);
  RadixTree tree(RadixTreeOptions{kPage, WritePolicy::kWriteBack, 2}, &device, nullptr, &clock,
                 &host);
  auto put_one = [&](const std::vector<TokenId>& t) {
    std::vector<PageId> pages;
    (void)device.allocate(static_cast<int32_t>(t.size()) / kPage, pages);
    tree.insert(t, pages);
  };
  put_one(seq({1}));     // the root's first child: flushed first
  put_one(seq({2, 3}));  // its sibling: flushed second
  tree.pin(hashes(seq({1})));
  tree.match_prefix(seq({1}));
  tree.evict(2);  // [2 3] is backed up (fills the host); [1] is pinned, no room: stays
  complete_everything(tree);
  if (tree.match_prefix(seq({2, 3})).host_num_pages != 2) return 2;
  tree.flush();  // [1] needs a backup: [2 3] leaves the host while flush still lists it
  complete_everything(tree);
  return exit_code(consistent(tree, device, host));
}

TEST(TierDeathTest, FlushSurvivesHostEvictionOfNodesItStillLists) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        alarm(20);
        std::exit(flush_with_host_eviction_scenario());
      },
      ::testing::ExitedWithCode(0), "");
}

// offload_path() on a session whose deepest node is already host-only: backing up its
// parent evicts that node from the host, then the second walk starts from it.
int offload_with_host_eviction_scenario() {
  PageAllocator device(16), host(1);
  ManualClock clock(0);
  RadixTree tree(RadixTreeOptions{kPage, WritePolicy::kWriteBack, 2}, &device, nullptr, &clock,
                 &host);
  auto put_one = [&](const std::vector<TokenId>& t) {
    MatchResult m = tree.match_prefix(t);
    std::vector<PageId> pages = m.device_pages;
    (void)device.allocate(static_cast<int32_t>(t.size()) / kPage - m.num_pages, pages);
    return tree.insert(t, pages);
  };
  put_one(seq({1}));
  RadixNode* leaf = put_one(seq({1, 2})).last_node;
  tree.evict(1);  // [2] is backed up (fills the host) and demoted
  complete_everything(tree);
  if (tree.match_prefix(seq({1, 2})).host_num_pages != 1) return 2;
  tree.offload_path(leaf);
  complete_everything(tree);
  return exit_code(consistent(tree, device, host));
}

TEST(TierDeathTest, OffloadPathSurvivesHostEvictionOfItsOwnNode) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        alarm(20);
        std::exit(offload_with_host_eviction_scenario());
      },
      ::testing::ExitedWithCode(0), "");
}

}  // namespace strata::radix_tree_tier_test
