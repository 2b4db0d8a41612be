// The randomized test of the tiered radix tree against a block-level reference model,
// with a per-medium replay of the event stream (the unit tests are in
// radix_tree_tier_test.cc).
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

namespace strata::radix_tree_tier_random_test {

using tier_test::BlockView;
using tier_test::MediumReplay;
using tier_test::slice;

constexpr int32_t kPage = 2;

// ---- randomized test against a block-level reference model ----
//
// The reference knows, per cached block, its parent block, its pin count and its hit count
// (matches that reached it), plus everything the test holds: lock receipts with the chain
// of blocks each covers, tool sessions (protect_host) with their chains, copies taken from
// take_transfers() and not yet completed, storage writes begun and not yet finished, and
// requests that hold device pages between their match and their insert. It does not model
// node shapes or LRU order; each step is checked by legality and completeness instead:
//  - replaying the events per medium gives exactly the tree's per-tier residency
//    (snapshot(): on_device / on_host), and the blocks of the tree equal the reference's;
//  - a block leaves the device only if no lock covers it, no copy or write uses it and no
//    child is on the device; it leaves the tree only if, besides, no pin, session or child
//    keeps it;
//  - pinned blocks: every block with a pin is in the tree, and its node has device pages
//    (readable, or being loaded) or a valid host copy;
//  - every copy in flight names exactly the pages its nodes hold, and a node's io_ref is
//    the number of copies and writes in flight that cover it;
//  - match, insert, insert_host and offload_path return what the reference predicts;
//    backups are requested only when the write policy (or an eviction) calls for them;
//  - evict(n), evict_host(n) and flush() stop only when nothing more can go.
class TierHarness {
 public:
  explicit TierHarness(int seed) : seed_(seed), rng_(static_cast<uint64_t>(seed)) {
    page_ = 2 + seed % 3;
    policy_ = static_cast<WritePolicy>(seed % 3);
    device_ = std::make_unique<PageAllocator>(40);
    host_ = std::make_unique<PageAllocator>(12 + 8 * (seed % 2));
    tree_ = std::make_unique<RadixTree>(RadixTreeOptions{page_, policy_, kThreshold}, device_.get(),
                                        &sink_, &clock_, host_.get());
    for (int i = 0; i < 6; ++i) {
      std::vector<TokenId> s;
      const int len = uniform(0, 4 * page_);
      for (int k = 0; k < len; ++k) s.push_back(uniform(0, 3));
      stems_.push_back(s);
    }
  }

  void step() {
    const int op = uniform(0, 99);
    clock_.advance_ms(uniform(0, 20));
    if (op < 22) {
      ASSERT_NO_FATAL_FAILURE(op_request());
    } else if (op < 27) {
      ASSERT_NO_FATAL_FAILURE(op_finish_request());
    } else if (op < 42) {
      ASSERT_NO_FATAL_FAILURE(op_complete_transfer());
    } else if (op < 50) {
      ASSERT_NO_FATAL_FAILURE(op_release());
    } else if (op < 55) {
      ASSERT_NO_FATAL_FAILURE(op_pin());
    } else if (op < 61) {
      ASSERT_NO_FATAL_FAILURE(op_unpin());
    } else if (op < 69) {
      ASSERT_NO_FATAL_FAILURE(op_evict());
    } else if (op < 73) {
      ASSERT_NO_FATAL_FAILURE(op_evict_host());
    } else if (op < 76) {
      ASSERT_NO_FATAL_FAILURE(op_flush());
    } else if (op < 79) {
      ASSERT_NO_FATAL_FAILURE(op_start_session());
    } else if (op < 83) {
      ASSERT_NO_FATAL_FAILURE(op_end_session());
    } else if (op < 86) {
      ASSERT_NO_FATAL_FAILURE(op_begin_storage_write());
    } else if (op < 89) {
      ASSERT_NO_FATAL_FAILURE(op_finish_storage_write());
    } else if (op < 95) {
      ASSERT_NO_FATAL_FAILURE(op_insert_host());
    } else if (op < 98) {
      ASSERT_NO_FATAL_FAILURE(op_offload_unprotected());
    } else {
      ASSERT_NO_FATAL_FAILURE(op_reset());
    }
    ASSERT_NO_FATAL_FAILURE(check_all());
  }

  std::string where() const { return "seed " + std::to_string(seed_) + " op " + last_op_; }

 private:
  static constexpr int32_t kThreshold = 2;
  // Caps that keep protection from piling up until nothing can move.
  static constexpr size_t kMaxLocks = 6;
  static constexpr size_t kMaxSessions = 3;
  static constexpr int64_t kMaxPinnedBlocks = 10;

  struct RefBlock {
    BlockHash parent = 0;  // 0: the first block of a sequence
    int32_t pins = 0;
    uint64_t hits = 0;
  };
  enum class LockUse : uint8_t { kFree, kLoad, kRequest };
  struct RefLock {
    uint64_t id = 0;
    LockReceipt receipt;
    std::vector<BlockHash> chain;
    LockUse use = LockUse::kFree;
  };
  struct Copy {  // a transfer taken and not yet completed
    TransferRequest request;
    uint64_t lock_id = 0;  // loads: the lock that must outlive them
  };
  struct Session {
    RadixNode* node = nullptr;  // protected: never removed while the session lasts
    std::vector<BlockHash> chain;
  };
  struct Request {  // matched and holding device pages, not yet inserted
    std::vector<TokenId> tokens;
    std::string salt;
    std::vector<BlockHash> expect;
    std::vector<PageId> pages;  // the matched device prefix (the tree's), then its own
    size_t own_from = 0;        // pages[own_from..] are allocated by the request
    uint64_t lock_id = 0;
  };
  struct Sequence {
    std::vector<TokenId> tokens;
    std::string salt;
  };

  int uniform(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  bool coin(double p) { return std::uniform_real_distribution<double>(0, 1)(rng_) < p; }
  template <typename T>
  size_t pick(const std::vector<T>& v) {
    return static_cast<size_t>(uniform(0, static_cast<int>(v.size()) - 1));
  }

  Sequence random_sequence() {
    Sequence s{stems_[static_cast<size_t>(uniform(0, 5))], coin(0.15) ? "tenant-b" : ""};
    const int extra = uniform(0, 4 * page_);
    for (int k = 0; k < extra; ++k) s.tokens.push_back(uniform(0, 3));
    s.tokens.resize(s.tokens.size() / static_cast<size_t>(page_) * static_cast<size_t>(page_));
    return s;
  }
  BlockHash random_block() {
    auto it = blocks_.begin();
    std::advance(it, uniform(0, static_cast<int>(blocks_.size()) - 1));
    return it->first;
  }
  std::vector<BlockHash> chain_to(BlockHash h) const {
    std::vector<BlockHash> out;
    for (BlockHash x = h; x != 0; x = blocks_.at(x).parent) out.push_back(x);
    std::reverse(out.begin(), out.end());
    return out;
  }
  static std::vector<BlockHash> node_chain(const RadixNode* n) {
    std::vector<BlockHash> out;
    for (; n != nullptr && n->parent != nullptr; n = n->parent) {
      out.insert(out.begin(), n->hashes.begin(), n->hashes.end());
    }
    return out;
  }
  uint64_t add_lock(LockReceipt r, std::vector<BlockHash> chain, LockUse use) {
    locks_.push_back(RefLock{++next_lock_id_, r, std::move(chain), use});
    return next_lock_id_;
  }
  RefLock* lock_by_id(uint64_t id) {
    for (auto& l : locks_) {
      if (l.id == id) return &l;
    }
    return nullptr;
  }
  void release_lock(uint64_t id) {
    auto it =
        std::find_if(locks_.begin(), locks_.end(), [&](const RefLock& l) { return l.id == id; });
    ASSERT_TRUE(it != locks_.end());
    ASSERT_TRUE(tree_->release(it->receipt).has_value());
    locks_.erase(it);
  }

  bool locked(BlockHash h) const {
    for (const auto& l : locks_) {
      if (std::find(l.chain.begin(), l.chain.end(), h) != l.chain.end()) return true;
    }
    return false;
  }
  bool in_session(BlockHash h) const {
    for (const auto& s : sessions_) {
      if (std::find(s.chain.begin(), s.chain.end(), h) != s.chain.end()) return true;
    }
    return false;
  }
  int copies_covering(BlockHash h, std::optional<TransferDirection> kind = {}) const {
    int n = 0;
    for (const auto& c : copies_) {
      if (kind && c.request.direction != *kind) continue;
      n += std::find(c.request.hashes.begin(), c.request.hashes.end(), h) != c.request.hashes.end();
    }
    return n;
  }
  int writes_covering(BlockHash h) const {
    int n = 0;
    for (const auto& w : writes_) n += std::find(w.begin(), w.end(), h) != w.end();
    return n;
  }
  bool busy(BlockHash h) const { return copies_covering(h) + writes_covering(h) > 0; }
  bool loading(BlockHash h) const {
    return copies_covering(h, TransferDirection::kHostToDevice) > 0;
  }
  bool has_child(BlockHash h, const std::function<bool(BlockHash)>& where) const {
    for (const auto& [b, rb] : blocks_) {
      if (rb.parent == h && where(b)) return true;
    }
    return false;
  }

  // Applies new events to the replay, checking that each move was allowed.
  void consume() {
    for (; seen_ < sink_.events.size(); ++seen_) {
      const KvEvent& e = sink_.events[seen_];
      const auto* rm = std::get_if<BlockRemoved>(&e);
      if (const auto* st = std::get_if<BlockStored>(&e)) {
        for (BlockHash h : st->block_hashes) {
          ASSERT_TRUE(blocks_.contains(h)) << "stored a block the reference does not know";
        }
      }
      if (rm != nullptr) {
        for (BlockHash h : rm->block_hashes) ASSERT_NO_FATAL_FAILURE(check_leave(h, rm->medium));
      }
      ASSERT_EQ(replay_.apply(e), "");
      if (rm == nullptr) continue;
      for (BlockHash h : rm->block_hashes) ASSERT_NO_FATAL_FAILURE(check_left(h, rm->medium));
      for (BlockHash h : rm->block_hashes) {
        if (!replay_.has(Medium::kDevice, h) && !replay_.has(Medium::kHost, h)) blocks_.erase(h);
      }
    }
  }

  // Before a block leaves a medium.
  void check_leave(BlockHash h, Medium medium) {
    ASSERT_TRUE(blocks_.contains(h));
    ASSERT_FALSE(locked(h)) << "a locked block left " << medium_wire_name(medium);
    ASSERT_FALSE(busy(h)) << "a block with a copy in flight left " << medium_wire_name(medium);
    if (medium == Medium::kHost) {
      ASSERT_FALSE(replay_.has(Medium::kDevice, h)) << "host copy dropped, device copy kept";
    }
  }

  // After it left (with the other blocks of the same event).
  void check_left(BlockHash h, Medium medium) {
    const auto on_device = [&](BlockHash c) {
      return replay_.has(Medium::kDevice, c) || loading(c);
    };
    if (medium == Medium::kDevice) {
      ASSERT_FALSE(has_child(h, on_device)) << "left the device before its child";
    }
    if (replay_.has(Medium::kDevice, h) || replay_.has(Medium::kHost, h)) return;
    ASSERT_EQ(blocks_.at(h).pins, 0) << "a pinned block left the tree";
    ASSERT_FALSE(in_session(h)) << "a session's block left the tree";
    ASSERT_FALSE(has_child(h, [&](BlockHash c) {
      return on_device(c) || replay_.has(Medium::kHost, c);
    })) << "left the tree before its child";
  }

  // Takes new transfers, checking that the operation was allowed to ask for them.
  enum class Asks : uint8_t { kNothing, kInsert, kMatch, kEvict };
  std::vector<TransferRequest> take(Asks asks) {
    std::vector<TransferRequest> ts = tree_->take_transfers();
    for (const auto& t : ts) {
      if (t.direction == TransferDirection::kHostToDevice) {
        EXPECT_TRUE(asks == Asks::kEvict) << "a load nobody asked for";
        continue;  // load() tracks it with its lock
      }
      EXPECT_TRUE(asks != Asks::kNothing) << "a backup nobody asked for";
      if (asks == Asks::kInsert) {
        EXPECT_EQ(policy_, WritePolicy::kWriteThrough) << "insert backed up under another policy";
      }
      if (asks == Asks::kMatch) {
        EXPECT_EQ(policy_, WritePolicy::kWriteThroughSelective) << "match backed up";
      }
      copies_.push_back(Copy{t, 0});
    }
    return ts;
  }

  std::unordered_map<BlockHash, BlockView> views() const { return tier_test::view_blocks(*tree_); }

  // ---- operations ----

  void op_request() {
    last_op_ = "request";
    const Sequence s = random_sequence();
    const auto expect = hash_blocks(s.tokens, page_, s.salt);
    const uint64_t skipped = tree_->stats().backups_skipped_total;
    const MatchResult m = tree_->match_prefix(s.tokens, s.salt);
    ASSERT_NO_FATAL_FAILURE(consume());
    take(Asks::kMatch);
    auto v = views();
    size_t dev = 0;
    while (dev < expect.size() && replay_.has(Medium::kDevice, expect[dev])) ++dev;
    size_t host = dev;
    while (host < expect.size() && replay_.has(Medium::kHost, expect[host]) &&
           !replay_.has(Medium::kDevice, expect[host]) && !loading(expect[host])) {
      ++host;
    }
    host -= dev;
    ASSERT_EQ(static_cast<size_t>(m.num_pages), dev);
    ASSERT_EQ(m.block_hashes, slice(expect, 0, dev));
    for (size_t k = 0; k < dev; ++k) ASSERT_EQ(m.device_pages[k], v.at(expect[k]).device_page());
    ASSERT_EQ(static_cast<size_t>(m.host_num_pages), host);
    if (host > 0) {
      ASSERT_EQ(m.host_last_node->hashes.back(), expect[dev + host - 1]);
    } else {
      ASSERT_EQ(m.host_last_node, nullptr);
    }
    for (size_t k = 0; k < dev + host; ++k) blocks_.at(expect[k]).hits++;
    if (policy_ == WritePolicy::kWriteThroughSelective &&
        tree_->stats().backups_skipped_total == skipped) {
      for (size_t k = 0; k < dev; ++k) {
        if (blocks_.at(expect[k]).hits >= kThreshold) {
          ASSERT_TRUE(v.at(expect[k]).node->has_host_pages()) << "selective backup missing";
        }
      }
    }
    if (host > 0 && coin(0.6)) {
      ASSERT_NO_FATAL_FAILURE(load(m, slice(expect, 0, dev + host)));
      return;
    }
    const uint64_t id =
        add_lock(tree_->lock(m.last_node), slice(expect, 0, dev), LockUse::kRequest);
    const int32_t need = static_cast<int32_t>(expect.size() - dev);
    if (device_->num_free() < need) {
      tree_->evict(need - device_->num_free());
      ASSERT_NO_FATAL_FAILURE(consume());
      take(Asks::kEvict);
    }
    Request r{s.tokens, s.salt, expect, m.device_pages, dev, id};
    if (!device_->allocate(need, r.pages).has_value()) {
      ASSERT_NO_FATAL_FAILURE(release_lock(id));
      return;
    }
    history_.push_back(Sequence{s.tokens, s.salt});
    if (coin(0.3)) {
      requests_.push_back(std::move(r));
      return;
    }
    ASSERT_NO_FATAL_FAILURE(insert(r));
  }

  void load(const MatchResult& m, std::vector<BlockHash> chain) {
    const size_t dev = static_cast<size_t>(m.num_pages);
    const std::vector<BlockHash> part(chain.begin() + static_cast<std::ptrdiff_t>(dev),
                                      chain.end());
    const uint64_t id = add_lock(tree_->lock(m.host_last_node), chain, LockUse::kLoad);
    auto st = tree_->load_back(m);
    ASSERT_NO_FATAL_FAILURE(consume());
    auto ts = take(Asks::kEvict);
    const auto is_load = [](const TransferRequest& t) {
      return t.direction == TransferDirection::kHostToDevice;
    };
    if (!st.has_value()) {
      ASSERT_EQ(st.error().code, ErrorCode::kOutOfPages);
      ASSERT_EQ(std::count_if(ts.begin(), ts.end(), is_load), 0);
      ASSERT_LT(device_->num_free(), static_cast<int32_t>(part.size()));
      auto v = views();
      for (BlockHash h : part) ASSERT_TRUE(v.at(h).host_only() && !v.at(h).loading());
      lock_by_id(id)->use = LockUse::kFree;
      return;
    }
    ASSERT_EQ(std::count_if(ts.begin(), ts.end(), is_load), 1);
    ASSERT_TRUE(is_load(ts.back()));
    ASSERT_EQ(ts.back().hashes, part);
    copies_.push_back(Copy{ts.back(), id});
  }

  void insert(Request& r) {
    const size_t n = r.expect.size();
    auto v = views();
    size_t i = 0;
    std::vector<PageId> rejected;
    while (i < n && blocks_.contains(r.expect[i]) && !loading(r.expect[i])) {
      const BlockView& b = v.at(r.expect[i]);
      if (b.on_device() && b.device_page() != r.pages[i]) rejected.push_back(r.pages[i]);
      ++i;
    }
    const bool blocked = i < n && loading(r.expect[i]);
    if (blocked)
      rejected.insert(rejected.end(), r.pages.begin() + static_cast<std::ptrdiff_t>(i),
                      r.pages.end());
    const size_t fresh = blocked ? 0 : n - i;
    const uint64_t skipped = tree_->stats().backups_skipped_total;
    const InsertResult ins = tree_->insert(r.tokens, r.pages, r.salt);
    r.pages.clear();
    ASSERT_EQ(static_cast<size_t>(ins.num_existing_pages), i);
    ASSERT_EQ(static_cast<size_t>(ins.num_new_pages), fresh);
    ASSERT_EQ(ins.rejected_pages, rejected);
    device_->free(ins.rejected_pages);
    for (size_t k = i; k < i + fresh; ++k) {
      blocks_[r.expect[k]] = RefBlock{k == 0 ? 0 : r.expect[k - 1], 0, 0};
    }
    ASSERT_NO_FATAL_FAILURE(consume());
    auto ts = take(Asks::kInsert);
    if (policy_ == WritePolicy::kWriteThrough && fresh > 0 &&
        tree_->stats().backups_skipped_total == skipped) {
      ASSERT_EQ(ts.size(), 1u) << "write_through did not back up the new blocks";
      ASSERT_EQ(ts[0].hashes, slice(r.expect, i, i + fresh));
    }
    ASSERT_NO_FATAL_FAILURE(release_lock(r.lock_id));
    ASSERT_NO_FATAL_FAILURE(consume());  // a node marked for offload leaves when unlocked
    if (locks_.size() < kMaxLocks && coin(0.4)) {
      add_lock(tree_->lock(ins.last_node), ins.block_hashes, LockUse::kFree);
    }
  }

  void op_finish_request() {
    last_op_ = "finish request";
    if (requests_.empty()) return;
    const size_t i = pick(requests_);
    Request r = std::move(requests_[i]);
    requests_.erase(requests_.begin() + static_cast<std::ptrdiff_t>(i));
    ASSERT_NO_FATAL_FAILURE(insert(r));
  }

  void op_complete_transfer() {
    last_op_ = "complete transfer";
    if (copies_.empty()) return;
    const size_t i = pick(copies_);
    const Copy c = copies_[i];
    copies_.erase(copies_.begin() + static_cast<std::ptrdiff_t>(i));
    const bool ok = coin(0.9);
    last_op_ += ok ? " ok" : " failed";
    tree_->complete_transfer(c.request, ok);
    ASSERT_NO_FATAL_FAILURE(consume());
    ASSERT_TRUE(take(Asks::kNothing).empty());
    auto v = views();
    for (size_t k = 0; k < c.request.hashes.size(); ++k) {
      const BlockView& b = v.at(c.request.hashes[k]);
      if (c.request.direction == TransferDirection::kHostToDevice) {
        ASSERT_FALSE(b.loading());
        ASSERT_EQ(b.on_device(), ok);
        if (ok) {
          ASSERT_EQ(b.device_page(), c.request.device_pages[k]);
        }
      } else {
        ASSERT_EQ(b.on_host(), ok);
        if (!ok) {
          ASSERT_TRUE(b.on_device() && b.host_page() == kInvalidPage);
        }
      }
    }
    if (c.request.direction == TransferDirection::kHostToDevice)
      lock_by_id(c.lock_id)->use = LockUse::kFree;
  }

  void op_release() {
    last_op_ = "release";
    std::vector<uint64_t> free;
    for (const auto& l : locks_) {
      if (l.use == LockUse::kFree) free.push_back(l.id);
    }
    if (free.empty()) return;
    ASSERT_NO_FATAL_FAILURE(release_lock(free[pick(free)]));
    ASSERT_NO_FATAL_FAILURE(consume());
    ASSERT_TRUE(take(Asks::kNothing).empty());
  }

  std::vector<BlockHash> random_hashes() {
    std::vector<BlockHash> hs;
    const int n = uniform(1, 4);
    for (int k = 0; k < n; ++k) {
      hs.push_back(blocks_.empty() || coin(0.1) ? 0xDEADBEEF00ULL + k : random_block());
    }
    return hs;
  }

  void op_pin() {
    last_op_ = "pin";
    if (tree_->stats().pinned_blocks >= kMaxPinnedBlocks) return;
    auto hs = random_hashes();
    // Pins inside a path (a block with a child) are what splits nodes later on.
    std::vector<BlockHash> inner;
    for (const auto& [h, b] : blocks_) {
      if (b.parent != 0) inner.push_back(b.parent);
    }
    if (!inner.empty() && coin(0.5)) hs[0] = inner[pick(inner)];
    const PinResult r = tree_->pin(hs);
    int known = 0;
    for (BlockHash h : hs) {
      if (!blocks_.contains(h)) continue;
      ++known;
      blocks_[h].pins++;
    }
    ASSERT_EQ(r.pinned, known);
    ASSERT_NO_FATAL_FAILURE(consume());
    ASSERT_TRUE(take(Asks::kNothing).empty());
  }

  void op_unpin() {
    last_op_ = "unpin";
    std::vector<BlockHash> pinned;
    for (const auto& [h, b] : blocks_) {
      if (b.pins > 0) pinned.push_back(h);
    }
    auto hs = random_hashes();
    if (!pinned.empty() && coin(0.8)) hs[0] = pinned[pick(pinned)];
    const UnpinResult r = tree_->unpin(hs);
    int unpinned = 0;
    for (BlockHash h : hs) {
      auto it = blocks_.find(h);
      if (it != blocks_.end() && it->second.pins > 0) {
        ++unpinned;
        it->second.pins--;
      }
    }
    ASSERT_EQ(r.unpinned, unpinned);
    ASSERT_NO_FATAL_FAILURE(consume());
    ASSERT_TRUE(take(Asks::kNothing).empty());
  }

  void op_evict() {
    last_op_ = "evict";
    const int32_t want = uniform(-1, 12);
    const int32_t free_before = device_->num_free();
    const EvictResult r = tree_->evict(want);
    ASSERT_NO_FATAL_FAILURE(consume());
    int32_t backed = 0;
    for (const auto& t : take(Asks::kEvict)) backed += static_cast<int32_t>(t.hashes.size());
    ASSERT_GE(device_->num_free() - free_before, r.evicted_pages);
    ASSERT_EQ(r.pending_pages, backed) << "pending pages without a backup";
    if (r.evicted_pages >= want) return;
    // Short: whatever is still evictable must need a backup that found no host room.
    for (const RadixNode* n : tier_test::all_nodes(*tree_)) {
      if (!n->in_evictable_set) continue;
      ASSERT_FALSE(n->has_host_pages()) << "evict stopped with a demotable node left";
      ASSERT_TRUE(n->pin_ref > 0 || n->host_ref > 0 || !n->is_leaf())
          << "evict stopped with a droppable node left";
    }
  }

  void op_evict_host() {
    last_op_ = "evict_host";
    const int32_t want = uniform(-1, 8);
    const int32_t free_before = host_->num_free();
    const int32_t freed = tree_->evict_host(want);
    ASSERT_NO_FATAL_FAILURE(consume());
    ASSERT_TRUE(take(Asks::kNothing).empty());
    ASSERT_EQ(host_->num_free() - free_before, freed);
    ASSERT_TRUE(freed >= want || tree_->stats().host_evictable_pages == 0)
        << "evict_host stopped early";
  }

  void op_flush() {
    last_op_ = "flush";
    const uint64_t skipped = tree_->stats().backups_skipped_total;
    tree_->flush();
    ASSERT_NO_FATAL_FAILURE(consume());
    take(Asks::kEvict);
    const bool room = tree_->stats().backups_skipped_total == skipped;
    for (const RadixNode* n : tier_test::all_nodes(*tree_)) {
      ASSERT_TRUE(n->is_protected() || n->io_ref > 0 || !n->is_leaf())
          << "flush left an unprotected idle leaf";
      if (!n->has_device_pages() || n->lock_ref > 0 || n->loading) continue;
      ASSERT_TRUE(n->demote_pending) << "flush left a node on the device that nothing holds";
      ASSERT_TRUE(n->has_host_pages() || !room) << "flush did not back up a node it keeps";
    }
  }

  void op_start_session() {
    last_op_ = "start session";
    if (blocks_.empty() || sessions_.size() >= kMaxSessions) return;
    RadixNode* node = const_cast<RadixNode*>(views().at(random_block()).node);
    tree_->protect_host(node, +1);
    sessions_.push_back(Session{node, node_chain(node)});
    ASSERT_NO_FATAL_FAILURE(offload(node));
  }

  // offload_path on a node with device pages (an unprotected host-only node can be freed
  // under offload_path: see OffloadPathSurvivesHostEvictionOfItsOwnNode).
  void op_offload_unprotected() {
    last_op_ = "offload";
    if (blocks_.empty()) return;
    const BlockView b = views().at(random_block());
    if (!b.has_device_pages()) return;
    ASSERT_NO_FATAL_FAILURE(offload(const_cast<RadixNode*>(b.node)));
  }

  void offload(RadixNode* node) {
    int32_t expect = 0;
    for (const RadixNode* n = node; n->parent != nullptr; n = n->parent) {
      if (n->has_device_pages() && !n->loading) expect += n->num_pages();
    }
    EXPECT_EQ(tree_->offload_path(node), expect);
    ASSERT_NO_FATAL_FAILURE(consume());
    take(Asks::kEvict);
  }

  void op_end_session() {
    last_op_ = "end session";
    if (sessions_.empty()) return;
    const size_t i = pick(sessions_);
    tree_->protect_host(sessions_[i].node, -1);
    sessions_.erase(sessions_.begin() + static_cast<std::ptrdiff_t>(i));
    ASSERT_NO_FATAL_FAILURE(consume());
    ASSERT_TRUE(take(Asks::kNothing).empty());
  }

  void op_begin_storage_write() {
    last_op_ = "begin storage write";
    if (blocks_.empty()) return;
    const auto chain = chain_to(random_block());
    auto v = views();
    std::set<BlockHash> expect;
    for (BlockHash h : chain) {
      const RadixNode* n = v.at(h).node;
      const bool all_stored =
          !n->in_storage.empty() &&
          std::all_of(n->in_storage.begin(), n->in_storage.end(), [](uint8_t f) { return f != 0; });
      if (n->on_host() && !all_stored) expect.insert(n->hashes.begin(), n->hashes.end());
    }
    const auto got = tree_->begin_storage_write(chain);
    std::set<BlockHash> got_set;
    std::vector<BlockHash> write;
    for (const auto& [h, page] : got) {
      ASSERT_EQ(page, v.at(h).host_page());
      got_set.insert(h);
      write.push_back(h);
    }
    ASSERT_EQ(got_set, expect);
    if (!write.empty()) writes_.push_back(write);
    ASSERT_NO_FATAL_FAILURE(consume());
    ASSERT_TRUE(take(Asks::kNothing).empty());
  }

  void op_finish_storage_write() {
    last_op_ = "finish storage write";
    if (writes_.empty()) return;
    const size_t i = pick(writes_);
    const std::vector<BlockHash> w = writes_[i];
    writes_.erase(writes_.begin() + static_cast<std::ptrdiff_t>(i));
    const bool ok = coin(0.85);
    tree_->finish_storage_write(w, std::vector<uint8_t>(w.size(), ok ? 1 : 0));
    ASSERT_NO_FATAL_FAILURE(consume());
    ASSERT_TRUE(take(Asks::kNothing).empty());
    if (!ok) return;
    auto v = views();
    for (BlockHash h : w) ASSERT_TRUE(v.at(h).stored());
  }

  // Reads back from "storage" (the blocks this tree wrote there) like a prefetch does.
  void op_insert_host() {
    last_op_ = "insert_host";
    if (history_.empty()) return;
    const Sequence& s = history_[pick(history_)];
    const auto expect = hash_blocks(s.tokens, page_, s.salt);
    size_t k = 0;
    while (k < expect.size() && replay_.has(Medium::kStorage, expect[k])) ++k;
    size_t present = 0;
    while (present < k && blocks_.contains(expect[present]) && !loading(expect[present])) {
      ++present;
    }
    const size_t first = coin(0.7) ? present : static_cast<size_t>(uniform(0, static_cast<int>(k)));
    if (first >= k) return;
    std::vector<PageId> pages;
    if (!host_->allocate(static_cast<int32_t>(k - first), pages).has_value()) return;
    const std::vector<TokenId> tokens(s.tokens.begin(),
                                      s.tokens.begin() + static_cast<std::ptrdiff_t>(k) * page_);
    const InsertResult r = tree_->insert_host(tokens, static_cast<int32_t>(first), pages, s.salt);
    std::vector<PageId> rejected;
    size_t fresh = 0;
    // A block being loaded is in the tree but not walkable: nothing can hang below it.
    const bool blocked = present < k && blocks_.contains(expect[present]);
    if (present < first || present == k || blocked) {
      rejected = pages;
    } else {
      rejected.assign(pages.begin(), pages.begin() + static_cast<std::ptrdiff_t>(present - first));
      fresh = k - present;
    }
    ASSERT_EQ(static_cast<size_t>(r.num_existing_pages), present);
    ASSERT_EQ(static_cast<size_t>(r.num_new_pages), fresh);
    ASSERT_EQ(r.rejected_pages, rejected);
    host_->free(r.rejected_pages);
    for (size_t j = present; j < present + fresh; ++j) {
      blocks_[expect[j]] = RefBlock{j == 0 ? 0 : expect[j - 1], 0, 0};
    }
    ASSERT_NO_FATAL_FAILURE(consume());
    ASSERT_TRUE(take(Asks::kNothing).empty());
  }

  void op_reset() {
    last_op_ = "reset";
    const auto st = tree_->reset();
    const bool may = locks_.empty() && copies_.empty() && writes_.empty();
    ASSERT_EQ(st.has_value(), may);
    if (may) {
      blocks_.clear();
      sessions_.clear();
    }
    ASSERT_NO_FATAL_FAILURE(consume());
  }

  // ---- the per-step check ----

  void check_all() {
    ASSERT_NO_FATAL_FAILURE(consume());  // e.g. demotions when a lock was released
    ASSERT_TRUE(take(Asks::kNothing).empty());
    auto inv = tree_->check_invariants();
    ASSERT_TRUE(inv.has_value()) << inv.error().message;
    std::vector<PageId> owned;
    tree_->collect_device_pages(owned);
    for (const auto& r : requests_) {
      owned.insert(owned.end(), r.pages.begin() + static_cast<std::ptrdiff_t>(r.own_from),
                   r.pages.end());
    }
    auto audit = device_->audit(owned);
    ASSERT_TRUE(audit.has_value()) << "device: " << audit.error().message;
    owned.clear();
    tree_->collect_host_pages(owned);
    audit = host_->audit(owned);
    ASSERT_TRUE(audit.has_value()) << "host: " << audit.error().message;

    const auto res = tier_test::residency_of(*tree_);
    ASSERT_TRUE(replay_.blocks(Medium::kDevice) == res.device)
        << "device replay vs tree:"
        << tier_test::set_diff(replay_.blocks(Medium::kDevice), res.device);
    ASSERT_TRUE(replay_.blocks(Medium::kHost) == res.host)
        << "host replay vs tree:" << tier_test::set_diff(replay_.blocks(Medium::kHost), res.host);
    std::set<BlockHash> ref;
    for (const auto& [h, b] : blocks_) ref.insert(h);
    ASSERT_TRUE(res.all == ref) << "tree vs reference:" << tier_test::set_diff(res.all, ref);
    ASSERT_EQ(tree_->all_block_hashes().size(), ref.size());

    const auto v = views();
    for (const auto& [h, b] : blocks_) {
      const BlockView& x = v.at(h);
      ASSERT_EQ(tree_->pin_count(h), static_cast<uint32_t>(b.pins));
      ASSERT_EQ(x.node->hit_count, b.hits) << "hit count";
      if (b.pins > 0) {
        ASSERT_TRUE(x.has_device_pages() || x.on_host()) << "a pinned block has no copy";
      }
      if (x.stored()) {
        ASSERT_TRUE(replay_.has(Medium::kStorage, h)) << "stored, never announced";
      }
    }
    ASSERT_NO_FATAL_FAILURE(check_copies(v));
    for (const RadixNode* n : tier_test::all_nodes(*tree_)) {
      // Every hold on a node marked for demotion is released with a try_demote.
      const bool free_to_go = n->demote_pending && n->on_host() && n->on_device() &&
                              n->io_ref == 0 && n->lock_ref == 0 &&
                              std::none_of(n->children.begin(), n->children.end(),
                                           [](const auto& c) { return c->has_device_pages(); });
      ASSERT_FALSE(free_to_go) << "a node marked for demotion stayed on the device unheld";
    }
    ASSERT_EQ(tree_->stats().outstanding_locks, static_cast<int64_t>(locks_.size()));
  }

  void check_copies(const std::unordered_map<BlockHash, BlockView>& v) {
    for (const auto& c : copies_) {
      const TransferRequest& t = c.request;
      ASSERT_EQ(t.hashes.size(), t.device_pages.size());
      ASSERT_EQ(t.hashes.size(), t.host_pages.size());
      for (size_t k = 0; k < t.hashes.size(); ++k) {
        const BlockView& b = v.at(t.hashes[k]);
        ASSERT_EQ(b.device_page(), t.device_pages[k]);
        ASSERT_EQ(b.host_page(), t.host_pages[k]);
        if (t.direction == TransferDirection::kHostToDevice) {
          ASSERT_TRUE(b.loading() && b.on_host());
        } else {
          ASSERT_TRUE(b.on_device() && b.backup_in_flight());
        }
      }
    }
    for (const RadixNode* n : tier_test::all_nodes(*tree_)) {
      const int expect = copies_covering(n->hashes[0]) + writes_covering(n->hashes[0]);
      for (BlockHash h : n->hashes) {
        ASSERT_EQ(copies_covering(h) + writes_covering(h), expect)
            << "a copy covers part of a node";
      }
      ASSERT_EQ(n->io_ref, expect) << "io_ref";
    }
  }

  int seed_;
  std::mt19937_64 rng_;
  int32_t page_ = 2;
  WritePolicy policy_ = WritePolicy::kWriteThrough;
  std::unique_ptr<PageAllocator> device_;
  std::unique_ptr<PageAllocator> host_;
  VectorEventSink sink_;
  ManualClock clock_{0};
  std::unique_ptr<RadixTree> tree_;
  MediumReplay replay_;
  size_t seen_ = 0;
  std::vector<std::vector<TokenId>> stems_;
  std::vector<Sequence> history_;
  std::unordered_map<BlockHash, RefBlock> blocks_;
  std::vector<RefLock> locks_;
  uint64_t next_lock_id_ = 0;
  std::vector<Copy> copies_;
  std::vector<std::vector<BlockHash>> writes_;
  std::vector<Session> sessions_;
  std::vector<Request> requests_;
  std::string last_op_;
};

class TierRandomTest : public ::testing::TestWithParam<int> {};

TEST_P(TierRandomTest, AgreesWithReferenceModel) {
  const bool sanitizer = std::getenv("STRATA_SANITIZER_BUILD") != nullptr;
  const int steps = sanitizer ? 800 : 3000;
  TierHarness h(GetParam());
  for (int step = 0; step < steps; ++step) {
    h.step();
    if (HasFatalFailure() || HasNonfatalFailure()) {
      ADD_FAILURE() << h.where() << " at step " << step;
      return;
    }
  }
}

// Seeds cycle through the write policies (seed % 3) and page sizes 2..4.
INSTANTIATE_TEST_SUITE_P(Seeds, TierRandomTest, ::testing::Range(1, 61));
}  // namespace strata::radix_tree_tier_random_test
