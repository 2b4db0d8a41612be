// The router's block index: unit tests, and a randomized test against a reference model
// (per worker, router hash -> copies per tier, with router hashes computed from whole token
// prefixes rather than chained from events) under random event streams from workers that
// hash like Strata and workers that hash otherwise (like vLLM).
#include "router/prefix_index.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "cache/block_hash.h"

namespace strata::router {
namespace {

constexpr int kBs = 4;

std::vector<int32_t> seq_tokens(int blocks, int32_t first) {
  std::vector<int32_t> t(static_cast<size_t>(blocks) * kBs);
  for (size_t i = 0; i < t.size(); ++i) t[i] = first + static_cast<int32_t>(i);
  return t;
}

uint64_t mix(uint64_t x) {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// A worker's own hash of a block: Strata's (kind 0) is the router's; others differ.
uint64_t worker_hash(int kind, uint64_t router_hash) {
  return kind == 0 ? router_hash : mix(router_hash ^ (0x1234567ULL * static_cast<uint64_t>(kind)));
}

// `hasher`: the index's router hash (Strata's own unless a test makes it another).
KvEventBatch stored(int kind, const std::vector<int32_t>& tokens, int first_block, int end_block,
                    Tier tier, bool with_tokens = true, const BlockHasher& hasher = BlockHasher{}) {
  const auto router = hasher.hash_blocks(tokens, kBs);
  BlockStoredEvent ev;
  for (int i = first_block; i < end_block; ++i)
    ev.block_hashes.push_back(worker_hash(kind, router[i]));
  if (first_block > 0) ev.parent_block_hash = worker_hash(kind, router[first_block - 1]);
  if (with_tokens) {
    ev.token_ids.assign(tokens.begin() + first_block * kBs, tokens.begin() + end_block * kBs);
  }
  ev.block_size = kBs;
  ev.tier = tier;
  KvEventBatch b;
  b.events.emplace_back(std::move(ev));
  return b;
}

KvEventBatch removed(int kind, std::vector<uint64_t> router_hashes, Tier tier) {
  BlockRemovedEvent ev;
  for (uint64_t h : router_hashes) ev.block_hashes.push_back(worker_hash(kind, h));
  ev.tier = tier;
  KvEventBatch b;
  b.events.emplace_back(std::move(ev));
  return b;
}

const WorkerMatch* find(const std::vector<WorkerMatch>& ms, WorkerId w) {
  for (const auto& m : ms) {
    if (m.worker == w) return &m;
  }
  return nullptr;
}

TEST(PrefixIndexTest, AddWorkerValidates) {
  PrefixIndex index;
  EXPECT_TRUE(index.add_worker(0, kBs));
  EXPECT_FALSE(index.add_worker(0, kBs));
  EXPECT_EQ(kMaxWorkers, 1024u);
  EXPECT_TRUE(index.add_worker(64, kBs));
  EXPECT_TRUE(index.add_worker(kMaxWorkers - 1, kBs));
  EXPECT_FALSE(index.add_worker(kMaxWorkers, kBs));
  EXPECT_FALSE(index.add_worker(1, 0));
  EXPECT_TRUE(index.has_worker(0));
  EXPECT_FALSE(index.has_worker(1));
}

TEST(PrefixIndexTest, HashTokensIsStrataHashBlocks) {
  const auto t = seq_tokens(3, 1);
  EXPECT_EQ(PrefixIndex::hash_tokens(t, kBs), hash_blocks(t, kBs));
  EXPECT_EQ(PrefixIndex::hash_tokens(std::span<const int32_t>(t).first(7), kBs).size(), 1u);
}

// Strata and a worker with another hash function index the same blocks under the same keys.
TEST(PrefixIndexTest, IndexesByRouterHashWhateverTheWorkerHash) {
  PrefixIndex index;
  ASSERT_TRUE(index.add_worker(0, kBs));  // Strata
  ASSERT_TRUE(index.add_worker(1, kBs));  // vLLM-like
  const auto t = seq_tokens(6, 100);
  const auto router = hash_blocks(t, kBs);
  // Worker 0 stores blocks 0..3 in one event; worker 1 stores 0..1, then 2..5 chained to
  // block 1 by its own hash.
  index.apply(0, stored(0, t, 0, 4, Tier::kDevice));
  index.apply(1, stored(1, t, 0, 2, Tier::kDevice));
  index.apply(1, stored(1, t, 2, 6, Tier::kDevice));
  auto ms = index.match(router);
  ASSERT_EQ(ms.size(), 2u);
  EXPECT_EQ(find(ms, 0)->matched_blocks, 4u);
  EXPECT_EQ(find(ms, 0)->device_blocks, 4u);
  EXPECT_EQ(find(ms, 1)->matched_blocks, 6u);
  // Each worker's own hashes come back for pin and evict calls.
  EXPECT_EQ(index.worker_hashes(0, router),
            std::vector<uint64_t>(router.begin(), router.begin() + 4));
  std::vector<uint64_t> w1;
  for (uint64_t h : router) w1.push_back(worker_hash(1, h));
  EXPECT_EQ(index.worker_hashes(1, router), w1);
  auto st = index.stats();
  EXPECT_EQ(st.distinct_blocks, 6u);
  EXPECT_EQ(st.workers[0].mapped_hashes, 0u);  // identity: no map
  EXPECT_EQ(st.workers[1].mapped_hashes, 6u);
  // Removal by the worker's own hash.
  index.apply(1, removed(1, {router[3]}, Tier::kDevice));
  ms = index.match(router);
  EXPECT_EQ(find(ms, 1)->matched_blocks, 3u);
  index.apply(0, removed(0, {router[0]}, Tier::kDevice));
  ms = index.match(router);
  EXPECT_EQ(find(ms, 0), nullptr);  // the run starts with a missing block
  EXPECT_EQ(index.stats().workers[0].blocks, 3u);
}

TEST(PrefixIndexTest, TiersCountTheBestAndLeaveOneByOne) {
  PrefixIndex index;
  ASSERT_TRUE(index.add_worker(3, kBs));
  const auto t = seq_tokens(4, 7);
  const auto router = hash_blocks(t, kBs);
  index.apply(3, stored(1, t, 0, 4, Tier::kDevice));
  // A copy to host without tokens (vLLM offload placeholder): found by the worker hash.
  index.apply(3, stored(1, t, 0, 4, Tier::kHost, /*with_tokens=*/false));
  index.apply(3, stored(1, t, 2, 4, Tier::kStorage));
  index.apply(3, removed(1, {router[0], router[1]}, Tier::kDevice));
  auto ms = index.match(router);
  ASSERT_EQ(ms.size(), 1u);
  EXPECT_EQ(ms[0].matched_blocks, 4u);
  EXPECT_EQ(ms[0].host_blocks, 2u);
  EXPECT_EQ(ms[0].device_blocks, 2u);
  index.apply(3, removed(1, {router[0], router[1], router[2], router[3]}, Tier::kHost));
  index.apply(3, removed(1, {router[2], router[3]}, Tier::kDevice));
  ms = index.match(router);
  ASSERT_EQ(ms.size(), 0u);  // block 0 left on its last tier
  const auto st = index.stats().workers[0];
  EXPECT_EQ(st.blocks, 2u);
  EXPECT_EQ(st.blocks_per_tier[2], 2u);
  EXPECT_EQ(index.match(std::span<const uint64_t>(router).subspan(2))[0].storage_blocks, 2u);
}

TEST(PrefixIndexTest, OrphansAndPlaceholdersAreCountedNotGuessed) {
  PrefixIndex index;
  ASSERT_TRUE(index.add_worker(0, kBs));
  const auto t = seq_tokens(4, 1);
  const auto router = hash_blocks(t, kBs);
  index.apply(0, stored(2, t, 2, 4, Tier::kDevice));                       // parent never seen
  index.apply(0, stored(2, t, 0, 1, Tier::kHost, /*with_tokens=*/false));  // unknown, no tokens
  auto st = index.stats();
  EXPECT_EQ(st.distinct_blocks, 0u);
  EXPECT_EQ(st.workers[0].orphan_blocks, 2u);
  EXPECT_EQ(st.workers[0].skipped_blocks, 1u);
  // A block size other than the worker's cannot be hashed either.
  auto other = stored(2, t, 0, 2, Tier::kDevice);
  std::get<BlockStoredEvent>(other.events[0]).block_size = 2;
  index.apply(0, other);
  EXPECT_EQ(index.stats().workers[0].skipped_blocks, 3u);
  // Other KV cache groups are skipped.
  auto group = stored(2, t, 0, 2, Tier::kDevice);
  std::get<BlockStoredEvent>(group.events[0]).group_idx = 1;
  index.apply(0, group);
  EXPECT_EQ(index.stats().workers[0].skipped_events, 1u);
  EXPECT_EQ(index.stats().distinct_blocks, 0u);
}

TEST(PrefixIndexTest, DuplicateCopiesNeedAsManyRemovals) {
  PrefixIndex index;
  ASSERT_TRUE(index.add_worker(0, kBs));
  const auto t = seq_tokens(1, 1);
  const auto router = hash_blocks(t, kBs);
  index.apply(0, stored(1, t, 0, 1, Tier::kDevice));
  index.apply(0, stored(1, t, 0, 1, Tier::kDevice));
  index.apply(0, removed(1, {router[0]}, Tier::kDevice));
  EXPECT_EQ(index.match(router).size(), 1u);
  index.apply(0, removed(1, {router[0]}, Tier::kDevice));
  EXPECT_EQ(index.match(router).size(), 0u);
  index.apply(0, removed(1, {router[0]}, Tier::kDevice));
  EXPECT_EQ(index.stats().workers[0].unknown_removals, 1u);
}

TEST(PrefixIndexTest, ClearAndRemoveWorker) {
  PrefixIndex index;
  ASSERT_TRUE(index.add_worker(0, kBs));
  ASSERT_TRUE(index.add_worker(1, kBs));
  const auto t = seq_tokens(3, 1);
  const auto router = hash_blocks(t, kBs);
  index.apply(0, stored(0, t, 0, 3, Tier::kDevice));
  index.apply(1, stored(1, t, 0, 3, Tier::kDevice));
  index.set_pinned(1, router, true);
  KvEventBatch clear;
  clear.events.emplace_back(AllBlocksClearedEvent{});
  index.apply(1, clear);
  auto ms = index.match(router);
  ASSERT_EQ(ms.size(), 1u);
  EXPECT_EQ(ms[0].worker, 0u);
  EXPECT_EQ(index.stats().workers[1].pinned_blocks, 3u);  // pins are the router's
  // After the clear, worker 1's old hashes are unknown: a chain to them is an orphan.
  index.apply(1, stored(1, t, 1, 3, Tier::kDevice));
  EXPECT_EQ(index.stats().workers[1].orphan_blocks, 2u);
  index.remove_worker(0);
  EXPECT_TRUE(index.match(router).empty());
  EXPECT_EQ(index.stats().distinct_blocks, 0u);
  EXPECT_TRUE(index.add_worker(0, kBs));  // the id can be reused
}

TEST(PrefixIndexTest, PredictedEntriesCountUntilEventsOrExpiry) {
  PrefixIndex index;
  ASSERT_TRUE(index.add_worker(0, kBs));
  ASSERT_TRUE(index.add_worker(1, kBs));
  const auto t = seq_tokens(4, 1);
  const auto router = hash_blocks(t, kBs);
  index.apply(0, stored(0, t, 0, 2, Tier::kHost));
  index.insert_predicted(0, router, /*now_ms=*/1000, /*ttl_ms=*/2000);  // 0..1 held: skipped
  index.insert_predicted(1, std::span<const uint64_t>(router).first(3), 1000, 120000);
  auto ms = index.match(router);
  ASSERT_EQ(ms.size(), 2u);
  EXPECT_EQ(find(ms, 0)->matched_blocks, 4u);
  EXPECT_EQ(find(ms, 0)->host_blocks, 2u);
  EXPECT_EQ(find(ms, 0)->device_blocks, 2u);
  EXPECT_EQ(find(ms, 0)->predicted_blocks, 2u);
  EXPECT_EQ(find(ms, 1)->matched_blocks, 3u);
  EXPECT_EQ(find(ms, 1)->predicted_blocks, 3u);
  EXPECT_EQ(index.stats().predicted_entries, 5u);
  // A real store replaces the prediction; the events' view is untouched by predictions.
  index.apply(0, stored(0, t, 2, 3, Tier::kDevice));
  ms = index.match(router);
  EXPECT_EQ(find(ms, 0)->predicted_blocks, 1u);
  EXPECT_EQ(index.stats().workers[0].blocks, 3u);
  // Extending worker 1's first block; then expiry drops the rest in TTL order.
  index.insert_predicted(1, std::span<const uint64_t>(router).first(1), 200000, 1000);
  EXPECT_EQ(index.expire(2999), 0u);
  EXPECT_EQ(index.expire(3000), 1u);  // worker 0's last prediction
  EXPECT_EQ(find(index.match(router), 0)->matched_blocks, 3u);
  EXPECT_EQ(index.expire(121000), 2u);  // worker 1's blocks 1 and 2
  EXPECT_EQ(find(index.match(router), 1)->matched_blocks, 1u);
  EXPECT_EQ(index.expire(201000), 1u);
  EXPECT_EQ(find(index.match(router), 1), nullptr);
  EXPECT_EQ(index.stats().predicted_entries, 0u);
}

TEST(PrefixIndexTest, PinnedBlocksAndStaleMarks) {
  PrefixIndex index;
  ASSERT_TRUE(index.add_worker(5, kBs));
  const auto t = seq_tokens(4, 1);
  const auto router = hash_blocks(t, kBs);
  index.apply(5, stored(0, t, 0, 4, Tier::kDevice));
  index.set_pinned(5, std::span<const uint64_t>(router).first(2), true);
  index.set_pinned(5, std::span<const uint64_t>(router).first(1), false);
  index.mark_stale(5, true);
  auto ms = index.match(router);
  ASSERT_EQ(ms.size(), 1u);
  EXPECT_EQ(ms[0].pinned_blocks, 1u);
  EXPECT_TRUE(ms[0].stale);
  EXPECT_TRUE(index.is_stale(5));
  index.mark_stale(5, false);
  EXPECT_FALSE(index.match(router)[0].stale);
}

TEST(PrefixIndexTest, RebuildReplacesTheWorkersBlocks) {
  PrefixIndex index;
  ASSERT_TRUE(index.add_worker(0, kBs));
  const auto a = hash_blocks(seq_tokens(3, 1), kBs);
  const auto b = hash_blocks(seq_tokens(2, 500), kBs);
  index.apply(0, stored(1, seq_tokens(3, 1), 0, 3, Tier::kDevice));
  std::vector<SnapshotBlock> snap;
  for (uint64_t h : b)
    snap.push_back({worker_hash(1, h), h, tier_bit(Tier::kHost) | tier_bit(Tier::kStorage)});
  index.rebuild_worker(0, snap);
  EXPECT_TRUE(index.match(a).empty());
  auto ms = index.match(b);
  ASSERT_EQ(ms.size(), 1u);
  EXPECT_EQ(ms[0].host_blocks, 2u);
  // Events continue from the snapshot: removal by worker hash, a child chained to it.
  index.apply(0, removed(1, {b[1]}, Tier::kHost));
  EXPECT_EQ(index.match(b)[0].storage_blocks, 1u);
  const auto st = index.stats().workers[0];
  EXPECT_EQ(st.blocks, 2u);
  EXPECT_EQ(st.blocks_per_tier[1], 1u);
  EXPECT_EQ(st.blocks_per_tier[2], 2u);
}

// The reference model and the randomized test.

struct Universe {
  std::vector<std::vector<int32_t>> tokens;   // sequences sharing prefixes
  std::vector<std::vector<uint64_t>> router;  // their hash_blocks, from whole prefixes
};

Universe make_universe(std::mt19937_64& rng, int count, int max_blocks, const BlockHasher& hasher) {
  Universe u;
  for (int s = 0; s < count; ++s) {
    std::vector<int32_t> t;
    if (s > 0 && rng() % 3 != 0) {  // share a prefix with an earlier sequence
      const auto& base = u.tokens[rng() % u.tokens.size()];
      t.assign(base.begin(),
               base.begin() + static_cast<long>(kBs * (rng() % (base.size() / kBs + 1))));
    }
    const size_t blocks = 1 + rng() % max_blocks;
    while (t.size() < blocks * kBs) t.push_back(static_cast<int32_t>(rng() % 50));
    t.resize(blocks * kBs);
    u.router.push_back(hasher.hash_blocks(t, kBs));
    u.tokens.push_back(std::move(t));
  }
  return u;
}

struct RefWorker {
  int kind = 0;
  std::map<uint64_t, std::array<int, kNumTiers>> copies;  // router hash -> copies per tier
  std::map<uint64_t, int64_t> predicted;                  // router hash -> expiry
  bool holds(uint64_t h) const { return copies.count(h) != 0; }
  void add(uint64_t h, Tier t) {
    ++copies[h][static_cast<size_t>(t)];
    predicted.erase(h);
  }
  void remove(uint64_t h, Tier t) {
    auto it = copies.find(h);
    if (it == copies.end() || it->second[static_cast<size_t>(t)] == 0) return;
    --it->second[static_cast<size_t>(t)];
    if (it->second == std::array<int, kNumTiers>{}) copies.erase(it);
  }
};

// `ids`: the index's id of each reference worker, increasing.
std::vector<WorkerMatch> reference_match(const std::vector<RefWorker>& ref,
                                         const std::vector<WorkerId>& ids,
                                         const std::vector<uint64_t>& q) {
  std::vector<WorkerMatch> out;
  for (size_t w = 0; w < ref.size(); ++w) {
    WorkerMatch m;
    m.worker = ids[w];
    for (uint64_t h : q) {
      auto it = ref[w].copies.find(h);
      if (it != ref[w].copies.end()) {
        if (it->second[0] > 0) {
          ++m.device_blocks;
        } else if (it->second[1] > 0) {
          ++m.host_blocks;
        } else {
          ++m.storage_blocks;
        }
      } else if (ref[w].predicted.count(h) != 0) {
        ++m.device_blocks;
        ++m.predicted_blocks;
      } else {
        break;
      }
      ++m.matched_blocks;
    }
    if (m.matched_blocks > 0) out.push_back(m);
  }
  return out;
}

// The block before each block of the universe (the root's hash before a first block).
std::map<uint64_t, uint64_t> parents_of(const Universe& u, uint64_t root) {
  std::map<uint64_t, uint64_t> parent;
  for (const auto& r : u.router) {
    for (size_t i = 0; i < r.size(); ++i) parent[r[i]] = i == 0 ? root : r[i - 1];
  }
  return parent;
}

// The chains' invariants (PrefixIndex::check_chains) and their links: each block of a chain
// is the child of the one before it, the head the child of the chain's parent.
void expect_chains_sound(const PrefixIndex& index, const std::map<uint64_t, uint64_t>& parent,
                         const std::string& where) {
  const Status st = index.check_chains();
  ASSERT_TRUE(st) << where << ": " << st.error().message;
  for (const ChainView& c : index.chains()) {
    ASSERT_FALSE(c.blocks.empty()) << where;
    if (c.parent) {
      ASSERT_EQ(parent.at(c.blocks[0]), *c.parent) << where;
    }
    for (size_t i = 1; i < c.blocks.size(); ++i) {
      ASSERT_EQ(parent.at(c.blocks[i]), c.blocks[i - 1]) << where;
    }
  }
}

// Seeds 1-6: many short sequences; seeds 7-10: fewer, longer ones (long chains that
// split, join and are removed tail first, as a worker's tree evicts leaves first). Seeds
// 11-14 again with vLLM's sha256_cbor as the router hash (its digests chained through
// the index's tails, dropped with their blocks); the snapshots there are of workers that
// hash alike only, as a router rebuilds only those.
TEST(PrefixIndexRandomTest, MatchesTheReferenceModelUnderRandomEventStreams) {
  for (uint64_t seed = 1; seed <= 14; ++seed) {
    std::mt19937_64 rng(seed);
    const bool vllm_hash = seed > 10;
    const BlockHasher hasher =
        vllm_hash ? *BlockHasher::make(BlockHashAlgo::kSha256Cbor, "0") : BlockHasher{};
    const bool long_seqs = seed > 6 && seed != 11 && seed != 12;
    const Universe u =
        long_seqs ? make_universe(rng, 16, 48, hasher) : make_universe(rng, 40, 10, hasher);
    const auto parent = parents_of(u, hasher.root().hash);
    PrefixIndex index(hasher);
    // Seven workers, so that blocks have more holders than the index keeps inline, with
    // ids up to the last one. Workers 0, 2 and 1023 hash like Strata; the others like
    // someone else.
    const std::vector<WorkerId> ids = {0, 1, 2, 3, 4, 70, kMaxWorkers - 1};
    std::vector<RefWorker> ref(ids.size());
    for (size_t w = 0; w < ref.size(); ++w) {
      ref[w].kind = (w % 2 == 0 && w != 4) ? 0 : static_cast<int>(w);
      ASSERT_TRUE(index.add_worker(ids[w], kBs));
    }
    int64_t now_ms = 0;
    const auto tier_of = [&] {
      const auto r = rng() % 20;
      return r < 12 ? Tier::kDevice : (r < 17 ? Tier::kHost : Tier::kStorage);
    };
    for (int step = 0; step < 400; ++step) {
      const auto w = static_cast<size_t>(rng() % ref.size());
      RefWorker& rw = ref[w];
      KvEventBatch batch;
      const int num_events = 1 + static_cast<int>(rng() % 5);
      for (int e = 0; e < num_events; ++e) {
        const auto op = rng() % 100;
        if (op < 55) {  // store a range of a sequence
          const size_t s = rng() % u.tokens.size();
          const int n = static_cast<int>(u.router[s].size());
          const int a = rng() % 2 == 0 ? 0 : static_cast<int>(rng() % n);
          const int b = a + 1 + static_cast<int>(rng() % (n - a));
          const Tier tier = tier_of();
          const bool with_tokens = tier == Tier::kDevice || rng() % 4 != 0;
          KvEventBatch one = stored(rw.kind, u.tokens[s], a, b, tier, with_tokens, hasher);
          batch.events.push_back(std::move(one.events[0]));
          bool chained = a == 0 || rw.holds(u.router[s][a - 1]);
          for (int i = a; i < b; ++i) {
            const uint64_t h = u.router[s][i];
            if ((with_tokens && chained) || rw.holds(h)) {
              rw.add(h, tier);
              chained = true;
            } else {
              chained = false;
            }
          }
        } else if (op < 70 && long_seqs) {  // a sequence's tail, leaf first, on one tier
          const size_t s = rng() % u.tokens.size();
          const int n = static_cast<int>(u.router[s].size());
          const int a = static_cast<int>(rng() % n);
          const Tier tier = tier_of();
          for (int i = n - 1; i >= a; --i) {
            const uint64_t h = u.router[s][i];
            if (!rw.holds(h)) continue;
            rw.remove(h, tier);
            KvEventBatch one = removed(rw.kind, {h}, tier);
            batch.events.push_back(std::move(one.events[0]));
          }
        } else if (op < 90) {  // remove held blocks (and sometimes one that is not held)
          std::vector<uint64_t> hs;
          const Tier tier = tier_of();
          for (const auto& [h, c] : rw.copies) {
            if (rng() % 4 == 0) hs.push_back(h);
          }
          if (rng() % 5 == 0) hs.push_back(u.router[rng() % u.router.size()][0]);
          for (uint64_t h : hs) rw.remove(h, tier);
          KvEventBatch one = removed(rw.kind, hs, tier);
          batch.events.push_back(std::move(one.events[0]));
        } else if (op < 93) {
          batch.events.emplace_back(AllBlocksClearedEvent{});
          rw.copies.clear();
        } else {  // another KV cache group: ignored
          KvEventBatch one = stored(rw.kind, u.tokens[0], 0, 1, Tier::kDevice, true, hasher);
          std::get<BlockStoredEvent>(one.events[0]).group_idx = 1;
          batch.events.push_back(std::move(one.events[0]));
        }
      }
      index.apply(ids[w], batch);

      // Now and then: predictions, expiry, a rebuild from the reference's snapshot.
      const auto side = rng() % 20;
      if (side < 3) {
        const auto pw = static_cast<size_t>(rng() % ref.size());
        const auto& q = u.router[rng() % u.router.size()];
        const int64_t ttl_ms = 1 + static_cast<int64_t>(rng() % 50);
        index.insert_predicted(ids[pw], q, now_ms, ttl_ms);
        for (uint64_t h : q) {
          if (ref[pw].holds(h)) continue;
          auto [it, inserted] = ref[pw].predicted.try_emplace(h, now_ms + ttl_ms);
          if (!inserted) it->second = std::max(it->second, now_ms + ttl_ms);
        }
      } else if (side < 6) {
        now_ms += static_cast<int64_t>(rng() % 20);
        index.expire(now_ms);
        for (auto& r : ref) {
          std::erase_if(r.predicted, [&](const auto& kv) { return kv.second <= now_ms; });
        }
      } else if (side == 6 && (!vllm_hash || ref[rng() % ref.size()].kind == 0)) {
        auto rwid = static_cast<size_t>(rng() % ref.size());
        while (vllm_hash && ref[rwid].kind != 0) rwid = (rwid + 1) % ref.size();
        RefWorker& r = ref[rwid];
        std::vector<SnapshotBlock> snap;
        for (auto& [h, c] : r.copies) {
          uint8_t mask = 0;
          for (int t = 0; t < kNumTiers; ++t) {
            if (c[t] > 0) {
              mask |= tier_bit(static_cast<Tier>(t));
              c[t] = 1;  // a snapshot knows no duplicate copies
            }
          }
          snap.push_back({worker_hash(r.kind, h), h, mask});
          r.predicted.erase(h);
        }
        index.rebuild_worker(ids[rwid], snap);
      }

      // Check: the chains, matches for queries, per-worker counts, worker hashes.
      expect_chains_sound(index, parent,
                          "seed " + std::to_string(seed) + " step " + std::to_string(step));
      for (int qn = 0; qn < 8; ++qn) {
        std::vector<uint64_t> q = u.router[rng() % u.router.size()];
        if (rng() % 3 == 0) q.push_back(rng());  // a tail nobody holds
        MatchCost cost;
        const auto got = index.match(q, &cost);
        ASSERT_LE(cost.probes + cost.chained_blocks, q.size());
        const auto want = reference_match(ref, ids, q);
        ASSERT_EQ(got.size(), want.size()) << "seed " << seed << " step " << step;
        for (size_t i = 0; i < got.size(); ++i) {
          ASSERT_EQ(got[i].worker, want[i].worker) << "seed " << seed << " step " << step;
          EXPECT_EQ(got[i].matched_blocks, want[i].matched_blocks) << seed << "/" << step;
          EXPECT_EQ(got[i].device_blocks, want[i].device_blocks) << seed << "/" << step;
          EXPECT_EQ(got[i].host_blocks, want[i].host_blocks) << seed << "/" << step;
          EXPECT_EQ(got[i].storage_blocks, want[i].storage_blocks) << seed << "/" << step;
          EXPECT_EQ(got[i].predicted_blocks, want[i].predicted_blocks) << seed << "/" << step;
        }
        const auto qw = static_cast<size_t>(rng() % ref.size());
        std::vector<uint64_t> want_hashes;
        for (uint64_t h : q) {
          if (ref[qw].holds(h)) want_hashes.push_back(worker_hash(ref[qw].kind, h));
        }
        ASSERT_EQ(index.worker_hashes(ids[qw], q), want_hashes) << seed << "/" << step;
      }
      const auto st = index.stats();
      std::set<uint64_t> distinct;
      uint64_t predicted = 0;
      for (size_t wi = 0; wi < ref.size(); ++wi) {
        std::array<uint64_t, kNumTiers> per_tier{};
        for (const auto& [h, c] : ref[wi].copies) {
          distinct.insert(h);
          for (int t = 0; t < kNumTiers; ++t) per_tier[t] += c[t] > 0 ? 1 : 0;
        }
        predicted += ref[wi].predicted.size();
        ASSERT_EQ(st.workers[wi].blocks, ref[wi].copies.size()) << seed << "/" << step;
        ASSERT_EQ(st.workers[wi].blocks_per_tier, per_tier) << seed << "/" << step;
        // A worker that hashes as the router needs no map, whichever the router hash.
        if (ref[wi].kind == 0) {
          ASSERT_EQ(st.workers[wi].mapped_hashes, 0u) << seed << "/" << step;
        }
      }
      ASSERT_EQ(st.distinct_blocks, distinct.size()) << seed << "/" << step;
      ASSERT_EQ(st.predicted_entries, predicted) << seed << "/" << step;
    }
  }
}

// Event threads apply while router threads match (run under TSan for the locking).
TEST(PrefixIndexTest, ConcurrentApplyAndMatch) {
  PrefixIndex index;
  constexpr int kWorkers = 4;
  for (int w = 0; w < kWorkers; ++w) ASSERT_TRUE(index.add_worker(static_cast<WorkerId>(w), kBs));
  const auto t = seq_tokens(16, 3);
  const auto router = hash_blocks(t, kBs);
  std::atomic<bool> done{false};
  std::vector<std::thread> readers;
  std::atomic<uint64_t> matches{0};
  for (int r = 0; r < 2; ++r) {
    readers.emplace_back([&] {
      while (!done.load()) {
        for (const auto& m : index.match(router)) {
          EXPECT_LE(m.matched_blocks, router.size());
        }
        ++matches;
      }
    });
  }
  std::vector<std::thread> writers;
  for (int w = 0; w < kWorkers; ++w) {
    writers.emplace_back([&, w] {
      for (int i = 0; i < 300; ++i) {
        index.apply(static_cast<WorkerId>(w), stored(w % 2, t, 0, 16, Tier::kDevice));
        index.apply(static_cast<WorkerId>(w), removed(w % 2, router, Tier::kDevice));
      }
      index.apply(static_cast<WorkerId>(w), stored(w % 2, t, 0, 16, Tier::kHost));
    });
  }
  for (auto& th : writers) th.join();
  done = true;
  for (auto& th : readers) th.join();
  const auto ms = index.match(router);
  ASSERT_EQ(ms.size(), static_cast<size_t>(kWorkers));
  for (const auto& m : ms) EXPECT_EQ(m.host_blocks, 16u);
  EXPECT_GT(matches.load(), 0u);
}

// A restarted worker (issue 28): its blocks, predictions and pin marks go at once; the
// other worker keeps its own.
TEST(PrefixIndexTest, ResetWorkerForgetsBlocksPredictionsAndPins) {
  PrefixIndex index;
  ASSERT_TRUE(index.add_worker(0, kBs));
  ASSERT_TRUE(index.add_worker(1, kBs));
  const auto tokens = seq_tokens(4, 100);
  const auto router = hash_blocks(tokens, kBs);
  index.apply(0, stored(0, tokens, 0, 4, Tier::kDevice));
  index.apply(1, stored(0, tokens, 0, 4, Tier::kDevice));
  index.set_pinned(0, router, true);
  index.set_pinned(1, router, true);
  index.insert_predicted(0, hash_blocks(seq_tokens(2, 900), kBs), 0, 10'000);
  index.reset_worker(0);
  const PrefixIndexStats s = index.stats();
  EXPECT_EQ(s.workers[0].blocks, 0u);
  EXPECT_EQ(s.workers[0].pinned_blocks, 0u);
  EXPECT_EQ(s.workers[0].predicted_blocks, 0u);
  EXPECT_EQ(s.workers[1].blocks, 4u);
  EXPECT_EQ(s.workers[1].pinned_blocks, 4u);
  EXPECT_TRUE(index.has_worker(0));
  const auto ms = index.match(router);
  EXPECT_EQ(find(ms, 0), nullptr);
  ASSERT_NE(find(ms, 1), nullptr);
  EXPECT_EQ(find(ms, 1)->pinned_blocks, 4u);
}

// Pin marks follow the worker's word: held() says which blocks it holds, replace_pins()
// takes its tree's pins, drop_predicted() takes back a refused request's predictions.
TEST(PrefixIndexTest, PinMarksAndPredictionsFollowTheWorker) {
  PrefixIndex index;
  ASSERT_TRUE(index.add_worker(0, kBs));
  const auto tokens = seq_tokens(4, 100);
  const auto router = hash_blocks(tokens, kBs);
  index.apply(0, stored(0, tokens, 0, 2, Tier::kDevice));
  const std::vector<uint64_t> unknown = {12345, 67890};
  std::vector<uint64_t> asked = router;
  asked.insert(asked.end(), unknown.begin(), unknown.end());
  EXPECT_EQ(index.held(0, asked), (std::vector<uint64_t>{router[0], router[1]}));
  index.set_pinned(0, router, true);
  EXPECT_EQ(index.stats().workers[0].pinned_blocks, 4u);
  index.replace_pins(0, std::span<const uint64_t>(router).first(1));
  EXPECT_EQ(index.stats().workers[0].pinned_blocks, 1u);
  const auto other = hash_blocks(seq_tokens(3, 500), kBs);
  index.insert_predicted(0, other, 0, 10'000);
  EXPECT_EQ(index.stats().workers[0].predicted_blocks, 3u);
  index.drop_predicted(0, other);
  EXPECT_EQ(index.stats().workers[0].predicted_blocks, 0u);
  EXPECT_TRUE(index.match(other).empty());
  EXPECT_EQ(index.expire(20'000), 0u);  // the dropped ones' heap nodes go quietly
}

// The router's worker cap (issue 33): 1,024 workers indexed at once, ids past 64 scored
// like the first ones; a block held by hundreds of workers, and its holders leaving.
// match() counts a streak of blocks whose holders equal the previous block's in one pass
// (prefix_index.h, "At scale"): the streak breaks where a holder's tiers change, a run
// ends, a pin or a prediction sits, and each part is counted right.
TEST(PrefixIndexTest, StreaksOfBlocksWithTheSameHoldersCountLikeBlockByBlock) {
  PrefixIndex index;
  for (WorkerId w = 0; w < 7; ++w) ASSERT_TRUE(index.add_worker(w, kBs));
  const auto stem = seq_tokens(8, 1);
  for (WorkerId w = 0; w < 4; ++w) index.apply(w, stored(0, stem, 0, 8, Tier::kDevice));
  index.apply(3, stored(0, stem, 0, 8, Tier::kHost));  // device and host: device counts
  // Worker 4: all eight on host, the first four also on device.
  index.apply(4, stored(0, stem, 0, 8, Tier::kHost));
  index.apply(4, stored(0, stem, 0, 4, Tier::kDevice));
  index.apply(5, stored(0, stem, 0, 6, Tier::kDevice));  // its run ends at block 6
  const auto q = hash_blocks(seq_tokens(10, 1), kBs);    // the stem and two blocks more
  index.set_pinned(1, std::span<const uint64_t>(q).subspan(2, 1), true);

  auto ms = index.match(q);
  ASSERT_EQ(ms.size(), 6u);
  for (WorkerId w = 0; w < 6; ++w) {
    SCOPED_TRACE(w);
    EXPECT_EQ(ms[w].worker, w);
    EXPECT_EQ(ms[w].matched_blocks, w == 5 ? 6u : 8u);
    EXPECT_EQ(ms[w].device_blocks, w == 5 ? 6u : w == 4 ? 4u : 8u);
    EXPECT_EQ(ms[w].host_blocks, w == 4 ? 4u : 0u);
    EXPECT_EQ(ms[w].storage_blocks, 0u);
    EXPECT_EQ(ms[w].predicted_blocks, 0u);
    EXPECT_EQ(ms[w].pinned_blocks, w == 1 ? 1u : 0u);
  }

  // A prediction on a seventh worker in every block: no streak, the same counts.
  index.insert_predicted(6, std::span<const uint64_t>(q).first(8), 0, 10'000);
  ms = index.match(q);
  ASSERT_EQ(ms.size(), 7u);
  EXPECT_EQ(ms[6].matched_blocks, 8u);
  EXPECT_EQ(ms[6].predicted_blocks, 8u);
  EXPECT_EQ(ms[4].device_blocks, 4u);
  EXPECT_EQ(ms[4].host_blocks, 4u);
  EXPECT_EQ(ms[5].matched_blocks, 6u);
  EXPECT_EQ(ms[1].pinned_blocks, 1u);
  EXPECT_EQ(ms[0].matched_blocks, 8u);
}

TEST(PrefixIndexTest, IndexesAThousandAndTwentyFourWorkers) {
  PrefixIndex index;
  for (WorkerId w = 0; w < kMaxWorkers; ++w) ASSERT_TRUE(index.add_worker(w, kBs));
  EXPECT_FALSE(index.add_worker(kMaxWorkers, kBs));
  // Every worker holds a shared two-block stem and a third block of its own.
  const auto stem = seq_tokens(2, 1);
  std::vector<std::vector<int32_t>> own(kMaxWorkers);
  for (WorkerId w = 0; w < kMaxWorkers; ++w) {
    own[w] = stem;
    for (int i = 0; i < kBs; ++i) own[w].push_back(100'000 + static_cast<int32_t>(w * kBs) + i);
    index.apply(w, stored(0, own[w], 0, 3, w % 2 == 0 ? Tier::kDevice : Tier::kHost));
  }
  EXPECT_EQ(index.stats().distinct_blocks, 2u + kMaxWorkers);
  EXPECT_EQ(index.stats().workers.size(), kMaxWorkers);
  const auto q = hash_blocks(own[777], kBs);
  auto ms = index.match(q);
  ASSERT_EQ(ms.size(), kMaxWorkers);
  for (WorkerId w = 0; w < kMaxWorkers; ++w) {
    ASSERT_EQ(ms[w].worker, w);
    EXPECT_EQ(ms[w].matched_blocks, w == 777 ? 3u : 2u) << w;
    EXPECT_EQ(ms[w].device_blocks, w % 2 == 0 ? ms[w].matched_blocks : 0u) << w;
    EXPECT_EQ(ms[w].host_blocks, w % 2 == 1 ? ms[w].matched_blocks : 0u) << w;
  }
  // Predictions and pins of high ids.
  const auto fresh = hash_blocks(seq_tokens(2, 50'000), kBs);
  index.insert_predicted(1000, fresh, 0, 10'000);
  index.insert_predicted(65, std::span<const uint64_t>(fresh).first(1), 0, 10'000);
  index.set_pinned(1023, std::span<const uint64_t>(q).first(2), true);
  ms = index.match(fresh);
  ASSERT_EQ(ms.size(), 2u);
  EXPECT_EQ(ms[0].worker, 65u);
  EXPECT_EQ(ms[0].predicted_blocks, 1u);
  EXPECT_EQ(ms[1].worker, 1000u);
  EXPECT_EQ(ms[1].predicted_blocks, 2u);
  ms = index.match(q);
  EXPECT_EQ(ms[1023].pinned_blocks, 2u);
  EXPECT_EQ(ms[1022].pinned_blocks, 0u);
  // Holders leave: all but two workers drop the stem's first block, then all of them.
  for (WorkerId w = 0; w < kMaxWorkers; ++w) {
    if (w == 3 || w == 900) continue;
    index.apply(w, removed(0, {q[0]}, w % 2 == 0 ? Tier::kDevice : Tier::kHost));
  }
  ms = index.match(q);
  ASSERT_EQ(ms.size(), 2u);
  EXPECT_EQ(ms[0].worker, 3u);
  EXPECT_EQ(ms[1].worker, 900u);
  index.remove_worker(3);
  index.clear_worker(900);
  EXPECT_TRUE(index.match(q).empty());
  EXPECT_EQ(index.stats().workers.size(), kMaxWorkers - 1);
  ASSERT_TRUE(index.add_worker(3, kBs));
}

// Chains (prefix_index.h): a conversation on one worker after a stem that several workers
// hold is matched with one probe per chain, not per block, and the chains split and join
// as holders change: a second worker storing the stem in order, a host copy of one block in
// the middle, a conversation demoted to the host leaf first, then evicted.
TEST(PrefixIndexTest, ChainsMatchWithOneProbePerChain) {
  PrefixIndex index;
  for (WorkerId w = 0; w < 3; ++w) ASSERT_TRUE(index.add_worker(w, kBs));
  const auto conv = seq_tokens(256, 1);  // a 64-block stem, then 192 blocks of worker 0
  const auto q = hash_blocks(conv, kBs);
  const auto parent = parents_of(Universe{{conv}, {q}}, kRootParentHash);
  index.apply(0, stored(0, conv, 0, 64, Tier::kDevice));
  index.apply(0, stored(0, conv, 64, 256, Tier::kDevice));
  EXPECT_EQ(index.stats().chains, 1u);  // one worker: one chain
  // Workers 1 and 2 store the stem, block by block in order: it leaves the chain's head.
  for (WorkerId w = 1; w < 3; ++w) {
    for (int i = 0; i < 64; ++i) index.apply(w, stored(0, conv, i, i + 1, Tier::kDevice));
  }
  expect_chains_sound(index, parent, "stem stored");
  EXPECT_EQ(index.stats().chains, 2u);
  MatchCost cost;
  auto ms = index.match(q, &cost);
  ASSERT_EQ(ms.size(), 3u);
  EXPECT_EQ(ms[0].matched_blocks, 256u);
  EXPECT_EQ(ms[0].device_blocks, 256u);
  EXPECT_EQ(ms[1].matched_blocks, 64u);
  EXPECT_EQ(ms[2].matched_blocks, 64u);
  EXPECT_EQ(cost.probes, 2u);
  EXPECT_EQ(cost.chained_blocks, 254u);

  // A host copy of block 100 alone splits the conversation's chain in three; a pin mark
  // on block 200 ends a walk there. The counts are the per-block ones.
  index.apply(0, stored(0, conv, 100, 101, Tier::kHost));
  index.set_pinned(0, std::span<const uint64_t>(q).subspan(200, 1), true);
  expect_chains_sound(index, parent, "host copy in the middle");
  EXPECT_EQ(index.stats().chains, 4u);
  ms = index.match(q, &cost);
  EXPECT_EQ(ms[0].matched_blocks, 256u);
  EXPECT_EQ(ms[0].device_blocks, 256u);
  EXPECT_EQ(ms[0].pinned_blocks, 1u);
  EXPECT_EQ(cost.probes, 5u);  // the stem, 64, 100, 101, 200

  // The rest of the conversation copied to the host (in order) and then demoted
  // from the device leaf first: each step keeps it one chain.
  index.set_pinned(0, std::span<const uint64_t>(q).subspan(200, 1), false);
  index.apply(0, stored(0, conv, 64, 100, Tier::kHost));  // block 100 has its copy
  index.apply(0, stored(0, conv, 101, 256, Tier::kHost));
  expect_chains_sound(index, parent, "copied to host");
  EXPECT_EQ(index.stats().chains, 2u);
  for (size_t i = 255; i >= 64; --i) {
    index.apply(0, removed(0, {q[i]}, Tier::kDevice));
    ASSERT_LE(index.stats().chains, 3u) << i;
  }
  expect_chains_sound(index, parent, "demoted");
  EXPECT_EQ(index.stats().chains, 2u);
  ms = index.match(q, &cost);
  EXPECT_EQ(ms[0].device_blocks, 64u);
  EXPECT_EQ(ms[0].host_blocks, 192u);
  EXPECT_EQ(cost.probes, 2u);

  // Evicted leaf first, then the stem from worker 0: the stem stays with workers 1 and 2.
  for (size_t i = 255; i >= 64; --i) index.apply(0, removed(0, {q[i]}, Tier::kHost));
  for (size_t i = 63;; --i) {
    index.apply(0, removed(0, {q[i]}, Tier::kDevice));
    if (i == 0) break;
  }
  expect_chains_sound(index, parent, "evicted");
  EXPECT_EQ(index.stats().chains, 1u);
  EXPECT_EQ(index.stats().distinct_blocks, 64u);
  ms = index.match(q, &cost);
  ASSERT_EQ(ms.size(), 2u);
  EXPECT_EQ(ms[0].worker, 1u);
  EXPECT_EQ(ms[0].matched_blocks, 64u);
  EXPECT_EQ(cost.probes, 2u);  // the stem's chain, and the first block past it
  index.clear_worker(1);
  index.remove_worker(2);
  expect_chains_sound(index, parent, "cleared");
  EXPECT_EQ(index.stats().chains, 0u);
  EXPECT_EQ(index.stats().distinct_blocks, 0u);
}

// An index whose router hash is vLLM's sha256_cbor (prefix_index.h, "The router hash"):
// workers that hash alike (Strata workers in that mode, vLLM with the same seed) are keyed
// by their own hashes, those with another seed are mapped, and a snapshot's blocks (no
// digest) take their children by the worker's names.
KvEventBatch stored_by(const BlockHasher& h, const std::vector<int32_t>& tokens, int first_block,
                       int end_block) {
  const auto hashes = h.hash_blocks(tokens, kBs);
  BlockStoredEvent ev;
  for (int i = first_block; i < end_block; ++i) ev.block_hashes.push_back(hashes[i]);
  if (first_block > 0) ev.parent_block_hash = hashes[first_block - 1];
  ev.token_ids.assign(tokens.begin() + first_block * kBs, tokens.begin() + end_block * kBs);
  ev.block_size = kBs;
  ev.tier = Tier::kDevice;
  KvEventBatch b;
  b.events.emplace_back(std::move(ev));
  return b;
}

TEST(PrefixIndexTest, AVllmHashingIndexKeysAlikeWorkersByTheirOwnHashes) {
  const BlockHasher same = *BlockHasher::make(BlockHashAlgo::kSha256Cbor, "0");
  const BlockHasher other = *BlockHasher::make(BlockHashAlgo::kSha256Cbor, "1");
  PrefixIndex index(same);
  ASSERT_TRUE(index.add_worker(0, kBs));
  ASSERT_TRUE(index.add_worker(1, kBs));
  ASSERT_TRUE(index.add_worker(2, kBs));
  const auto tokens = seq_tokens(4, 100);
  const auto keys = index.router_hashes(tokens, kBs);
  EXPECT_EQ(keys, same.hash_blocks(tokens, kBs));
  // Worker 0 hashes alike, in two events (the second chained from the first's digest).
  index.apply(0, stored_by(same, tokens, 0, 2));
  index.apply(0, stored_by(same, tokens, 2, 4));
  // Worker 1 with another seed: every block mapped.
  index.apply(1, stored_by(other, tokens, 0, 4));
  // Worker 2: a snapshot of two blocks (no digests), then a child event.
  index.rebuild_worker(2, std::vector<SnapshotBlock>{{keys[0], keys[0], tier_bit(Tier::kDevice)},
                                                     {keys[1], keys[1], tier_bit(Tier::kDevice)}});
  index.apply(2, stored_by(same, tokens, 2, 3));
  const auto ms = index.match(keys);
  ASSERT_NE(find(ms, 0), nullptr);
  EXPECT_EQ(find(ms, 0)->matched_blocks, 4u);
  ASSERT_NE(find(ms, 1), nullptr);
  EXPECT_EQ(find(ms, 1)->matched_blocks, 4u);
  ASSERT_NE(find(ms, 2), nullptr);
  EXPECT_EQ(find(ms, 2)->matched_blocks, 3u);
  const auto st = index.stats();
  for (const auto& w : st.workers) EXPECT_EQ(w.mapped_hashes, w.worker == 1 ? 4u : 0u) << w.worker;
  EXPECT_EQ(index.worker_hashes(1, keys), other.hash_blocks(tokens, kBs));
  // Removing worker 0's and 1's blocks drops their digests: the same blocks stored again
  // chain as before.
  for (WorkerId w : {0u, 1u}) {
    BlockRemovedEvent rm;
    rm.block_hashes = (w == 0 ? same : other).hash_blocks(tokens, kBs);
    rm.tier = Tier::kDevice;
    KvEventBatch b;
    b.events.emplace_back(std::move(rm));
    index.apply(w, b);
  }
  index.remove_worker(2);
  EXPECT_EQ(index.stats().distinct_blocks, 0u);
  index.apply(0, stored_by(same, tokens, 0, 1));
  index.apply(0, stored_by(same, tokens, 1, 4));
  EXPECT_EQ(find(index.match(keys), 0)->matched_blocks, 4u);
  EXPECT_TRUE(index.check_chains());
}

}  // namespace
}  // namespace strata::router
