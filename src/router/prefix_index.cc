#include "router/prefix_index.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <string>
#include <variant>

#include "cache/block_hash.h"
#include "common/check.h"

namespace strata::router {
namespace {

// The heap's order: the earliest expiry on top.
struct LaterExpiry {
  template <typename E>
  bool operator()(const E& a, const E& b) const {
    return a.at_ms > b.at_ms;
  }
};

uint64_t copy_key(uint64_t router_hash, Tier tier) {
  return (router_hash << 2) | static_cast<uint64_t>(tier);
}

// Sorted-set operations on a block's worker list (predictions, pins).
template <typename Set>
bool set_insert(Set& set, WorkerId worker) {
  auto it = std::lower_bound(set.begin(), set.end(), worker);
  if (it != set.end() && *it == worker) return false;
  set.insert(it, static_cast<uint16_t>(worker));
  return true;
}
template <typename Set>
bool set_erase(Set& set, WorkerId worker) {
  auto it = std::lower_bound(set.begin(), set.end(), worker);
  if (it == set.end() || *it != worker) return false;
  set.erase(it);
  return true;
}

}  // namespace

void PrefixIndex::count_block(WorkerMatch& m, uint8_t tiers, uint32_t blocks) {
  m.matched_blocks += blocks;
  if ((tiers & tier_bit(Tier::kDevice)) != 0) {
    m.device_blocks += blocks;
  } else if ((tiers & tier_bit(Tier::kHost)) != 0) {
    m.host_blocks += blocks;
  } else if ((tiers & tier_bit(Tier::kStorage)) != 0) {
    m.storage_blocks += blocks;
  } else {
    m.predicted_blocks += blocks;
    m.device_blocks += blocks;
  }
}

uint8_t PrefixIndex::tiers_of(const Holders& holders, WorkerId worker) {
  for (const Holder& h : holders) {
    if (h.worker >= worker) return h.worker == worker ? h.tiers : 0;
  }
  return 0;
}

PrefixIndex::Holder& PrefixIndex::holder_locked(Holders& holders, WorkerId worker) {
  auto it = std::lower_bound(holders.begin(), holders.end(), worker,
                             [](const Holder& h, WorkerId w) { return h.worker < w; });
  if (it != holders.end() && it->worker == worker) return *it;
  // Spilling moves the inline holders to the heap with the new one.
  if (holders.size() == kInlineHolders) spilled_holders_ += kInlineHolders;
  if (holders.size() >= kInlineHolders) ++spilled_holders_;
  return *holders.insert(it, Holder{static_cast<uint16_t>(worker), 0, 0});
}

void PrefixIndex::erase_holder_locked(Holders& holders, WorkerId worker) {
  auto it = std::lower_bound(holders.begin(), holders.end(), worker,
                             [](const Holder& h, WorkerId w) { return h.worker < w; });
  if (it == holders.end() || it->worker != worker) return;
  const bool spilled = holders.size() > kInlineHolders;
  holders.erase(it);
  if (!spilled) return;
  --spilled_holders_;
  if (holders.size() == kInlineHolders) {
    spilled_holders_ -= kInlineHolders;
    holders.shrink_to_fit();  // back inline
  }
}

bool PrefixIndex::is_tail(const BlockEntry& entry) const {
  const Chain& c = chains_[entry.chain];
  return c.index_of(entry.pos) + 1 == c.hashes.size();
}

uint32_t PrefixIndex::new_chain_locked() {
  uint32_t id;
  if (!free_chains_.empty()) {
    id = free_chains_.back();
    free_chains_.pop_back();
  } else {
    id = static_cast<uint32_t>(chains_.size());
    chains_.emplace_back();
  }
  chains_[id] = Chain{};
  chains_[id].alive = true;
  return id;
}

void PrefixIndex::free_chain_locked(uint32_t id) {
  chain_array_bytes_ -= chains_[id].hashes.capacity() * sizeof(uint64_t);
  chains_[id] = Chain{};  // gives its array back
  free_chains_.push_back(id);
}

void PrefixIndex::renumber_locked(uint32_t id, size_t first, size_t last) {
  Chain& c = chains_[id];
  for (size_t i = first; i < last; ++i) {
    BlockEntry& e = blocks_.find(c.hashes[i])->second;
    e.chain = id;
    e.pos = c.pos_of(i);
  }
}

void PrefixIndex::rebase_locked(uint32_t id) {
  Chain& c = chains_[id];
  c.hashes.erase(c.hashes.begin(), c.hashes.begin() + c.begin);
  c.begin = 0;
  c.origin = 0;
  renumber_locked(id, 0, c.hashes.size());
}

void PrefixIndex::append_locked(uint32_t id, uint64_t router_hash, BlockEntry& entry) {
  Chain& c = chains_[id];
  const size_t capacity = c.hashes.capacity();
  c.hashes.push_back(router_hash);
  chain_array_bytes_ += (c.hashes.capacity() - capacity) * sizeof(uint64_t);
  entry.chain = id;
  entry.pos = c.pos_of(c.hashes.size() - 1);
  if (c.origin + static_cast<int64_t>(c.hashes.size()) >= INT32_MAX) rebase_locked(id);
}

void PrefixIndex::prepend_locked(uint32_t id, uint64_t router_hash, BlockEntry& entry) {
  Chain& c = chains_[id];
  const size_t capacity = c.hashes.capacity();
  if (c.begin == 0) {  // room in front, doubling: O(1) a block, amortized
    const size_t room = std::max<size_t>(4, c.size());
    if (c.origin - static_cast<int64_t>(room) <= INT32_MIN / 2) rebase_locked(id);
    c.hashes.insert(c.hashes.begin(), room, 0);
    c.begin = static_cast<uint32_t>(room);
    c.origin -= static_cast<int64_t>(room);
  }
  chain_array_bytes_ += (c.hashes.capacity() - capacity) * sizeof(uint64_t);
  c.hashes[--c.begin] = router_hash;
  entry.chain = id;
  entry.pos = c.pos_of(c.begin);
}

void PrefixIndex::move_to_back_locked(uint32_t from, uint32_t to) {
  Chain& f = chains_[from];
  Chain& t = chains_[to];
  const size_t first = t.hashes.size();
  const size_t capacity = t.hashes.capacity();
  t.hashes.insert(t.hashes.end(), f.hashes.begin() + f.begin, f.hashes.end());
  chain_array_bytes_ += (t.hashes.capacity() - capacity) * sizeof(uint64_t);
  t.tail_child = f.tail_child;
  free_chain_locked(from);
  renumber_locked(to, first, t.hashes.size());
}

void PrefixIndex::move_to_front_locked(uint32_t from, uint32_t to) {
  Chain& f = chains_[from];
  Chain& t = chains_[to];
  const size_t n = f.size();
  if (t.begin < n) {
    const size_t room = std::max(n, t.size());
    const size_t capacity = t.hashes.capacity();
    t.hashes.insert(t.hashes.begin(), room, 0);
    chain_array_bytes_ += (t.hashes.capacity() - capacity) * sizeof(uint64_t);
    t.begin += static_cast<uint32_t>(room);
    t.origin -= static_cast<int64_t>(room);
  }
  std::copy(f.hashes.begin() + f.begin, f.hashes.end(), t.hashes.begin() + (t.begin - n));
  t.begin -= static_cast<uint32_t>(n);
  t.parent = f.parent;
  t.has_parent = f.has_parent;
  rehint_locked(f, from, to);
  free_chain_locked(from);
  if (t.origin + static_cast<int64_t>(t.begin) <= INT32_MIN / 2) {
    rebase_locked(to);
  } else {
    renumber_locked(to, t.begin, t.begin + n);
  }
}

void PrefixIndex::rehint_locked(const Chain& chain, uint32_t from, uint32_t to) {
  if (!chain.has_parent) return;
  auto it = blocks_.find(chain.parent);
  if (it == blocks_.end() || it->second.chain == kNoChain || !is_tail(it->second)) return;
  Chain& p = chains_[it->second.chain];
  if (p.tail_child == from) p.tail_child = to;
}

PrefixIndex::Links PrefixIndex::unchain_locked(uint64_t router_hash, BlockEntry& entry) {
  const uint32_t id = entry.chain;
  STRATA_CHECK(id < chains_.size() && chains_[id].alive);
  Chain& c = chains_[id];
  const size_t i = c.index_of(entry.pos);
  STRATA_CHECK(i >= c.begin && i < c.hashes.size() && c.hashes[i] == router_hash);
  entry.chain = kNoChain;
  Links l;
  if (i == c.begin) {
    l.pred = c.parent;
    l.has_pred = c.has_parent;
  } else {
    l.pred = c.hashes[i - 1];
    l.has_pred = true;
  }
  if (c.size() == 1) {
    l.succ = c.tail_child;
    free_chain_locked(id);
    return l;
  }
  if (i == c.begin) {  // the head: the rest starts after this block
    ++c.begin;
    c.parent = router_hash;
    c.has_parent = true;
    if (c.begin > 32 && c.begin > c.size()) {  // the room of dropped heads, to append into
      c.hashes.erase(c.hashes.begin(), c.hashes.begin() + c.begin);
      c.origin += c.begin;
      c.begin = 0;
    }
    l.succ = id;
    return l;
  }
  if (i + 1 == c.hashes.size()) {  // the tail
    c.hashes.pop_back();
    l.succ = c.tail_child;
    c.tail_child = kNoChain;
    return l;
  }
  // The middle: the shorter side moves to a new chain.
  const size_t left = i - c.begin;
  const size_t right = c.hashes.size() - i - 1;
  const uint32_t nid = new_chain_locked();
  Chain& n = chains_[nid];  // chains_ is a deque: `c` stays valid
  if (right <= left) {
    n.hashes.assign(c.hashes.begin() + static_cast<long>(i) + 1, c.hashes.end());
    chain_array_bytes_ += n.hashes.capacity() * sizeof(uint64_t);
    n.parent = router_hash;
    n.has_parent = true;
    n.tail_child = c.tail_child;
    c.hashes.resize(i);
    c.tail_child = kNoChain;
    renumber_locked(nid, 0, n.hashes.size());
    l.succ = nid;
  } else {
    n.hashes.assign(c.hashes.begin() + c.begin, c.hashes.begin() + static_cast<long>(i));
    chain_array_bytes_ += n.hashes.capacity() * sizeof(uint64_t);
    n.parent = c.parent;
    n.has_parent = c.has_parent;
    rehint_locked(c, id, nid);
    c.begin = static_cast<uint32_t>(i + 1);
    c.parent = router_hash;
    c.has_parent = true;
    renumber_locked(nid, 0, n.hashes.size());
    l.succ = id;
  }
  return l;
}

void PrefixIndex::chain_locked(uint64_t router_hash, BlockEntry& entry, const Links& links) {
  const auto same_holders = [&entry](const Holders& other) { return other == entry.holders; };
  // The chain that ends at the block before (prev), and whether this block may join it.
  uint32_t prev = kNoChain;
  bool join_prev = false;
  if (links.has_pred) {
    if (auto it = blocks_.find(links.pred);
        it != blocks_.end() && it->second.chain != kNoChain && is_tail(it->second)) {
      prev = it->second.chain;
      join_prev = same_holders(it->second.holders);
    }
  }
  // A chain that starts right after this block with the same holders (next).
  uint32_t next = kNoChain;
  if (links.succ != kNoChain && links.succ != prev) {
    const Chain& s = chains_[links.succ];
    if (s.alive && s.has_parent && s.parent == router_hash) {
      auto it = blocks_.find(s.head());
      if (it != blocks_.end() && same_holders(it->second.holders)) next = links.succ;
    }
  }
  if (join_prev) {
    append_locked(prev, router_hash, entry);
    if (next == kNoChain) {
      chains_[prev].tail_child = links.succ;
    } else if (chains_[prev].size() >= chains_[next].size()) {
      move_to_back_locked(next, prev);
    } else {
      move_to_front_locked(prev, next);
    }
    return;
  }
  uint32_t id = next;
  if (id != kNoChain) {
    prepend_locked(id, router_hash, entry);
  } else {
    id = new_chain_locked();
    append_locked(id, router_hash, entry);
    chains_[id].tail_child = links.succ;
  }
  chains_[id].parent = links.pred;
  chains_[id].has_parent = links.has_pred;
  if (prev != kNoChain) chains_[prev].tail_child = id;
}

Status PrefixIndex::add_worker(WorkerId worker, int block_size) {
  if (worker >= kMaxWorkers) {
    return make_error(
        ErrorCode::kInvalidArgument,
        "worker id " + std::to_string(worker) + " is not below " + std::to_string(kMaxWorkers));
  }
  if (block_size < 1) {
    return make_error(ErrorCode::kInvalidArgument, "block size must be at least 1");
  }
  std::unique_lock lock(mutex_);
  WorkerState& ws = workers_[worker];
  if (ws.present) {
    return make_error(ErrorCode::kInvalidArgument,
                      "worker id " + std::to_string(worker) + " is already indexed");
  }
  ws = WorkerState{};
  stale_[worker] = false;
  ws.present = true;
  ws.block_size = block_size;
  ws.stats.worker = worker;
  ws.stats.block_size = block_size;
  return {};
}

void PrefixIndex::remove_worker(WorkerId worker) {
  if (worker >= kMaxWorkers) return;
  std::unique_lock lock(mutex_);
  if (!workers_[worker].present) return;
  clear_blocks_locked(worker);
  drop_worker_marks_locked(worker);
  workers_[worker] = WorkerState{};
  stale_[worker] = false;
}

void PrefixIndex::clear_worker(WorkerId worker) {
  if (worker >= kMaxWorkers) return;
  std::unique_lock lock(mutex_);
  if (workers_[worker].present) clear_blocks_locked(worker);
}

void PrefixIndex::reset_worker(WorkerId worker) {
  if (worker >= kMaxWorkers) return;
  std::unique_lock lock(mutex_);
  if (!workers_[worker].present) return;
  clear_blocks_locked(worker);
  drop_worker_marks_locked(worker);
}

bool PrefixIndex::has_worker(WorkerId worker) const {
  if (worker >= kMaxWorkers) return false;
  std::shared_lock lock(mutex_);
  return workers_[worker].present;
}

void PrefixIndex::apply(WorkerId worker, const KvEventBatch& batch) {
  if (worker >= kMaxWorkers) return;
  std::unique_lock lock(mutex_);
  WorkerState& ws = workers_[worker];
  if (!ws.present) return;
  ws.stats.events_applied += batch.events.size() + batch.skipped_events;
  ws.stats.skipped_events += batch.skipped_events;
  for (const KvWireEvent& ev : batch.events) {
    if (const auto* st = std::get_if<BlockStoredEvent>(&ev)) {
      apply_stored_locked(worker, *st);
    } else if (const auto* rm = std::get_if<BlockRemovedEvent>(&ev)) {
      if (rm->group_idx != 0) {
        ++ws.stats.skipped_events;
        continue;
      }
      for (uint64_t h : rm->block_hashes) remove_locked(worker, h, rm->tier);
    } else {
      clear_blocks_locked(worker);
    }
  }
}

void PrefixIndex::apply_stored_locked(WorkerId worker, const BlockStoredEvent& ev) {
  WorkerState& ws = workers_[worker];
  if (ev.group_idx != 0) {
    ++ws.stats.skipped_events;
    return;
  }
  const size_t n = ev.block_hashes.size();
  const auto bs = static_cast<size_t>(ws.block_size);
  const bool has_tokens = ev.block_size == ws.block_size && ev.token_ids.size() == n * bs;
  const bool digests = hasher_.chains_digests();
  // A plain value and a flag rather than an optional: g++ 12 reports an optional here as
  // maybe-uninitialized (a false positive).
  uint64_t parent = hasher_.root().hash;
  bool chained = true;  // `parent` is the router hash of the block before
  // The worker names the block before as the index does (it hashes alike).
  bool parent_same_name = true;
  if (ev.parent_block_hash) {
    const auto p = resolve_locked(worker, *ev.parent_block_hash);
    chained = p.has_value();
    parent = p.value_or(0);
    parent_same_name = chained && parent == *ev.parent_block_hash;
  }
  // A digest chain: the parent's whole digest, when the index has its tail.
  const auto chain_of = [this](uint64_t router_hash) -> std::optional<ChainValue> {
    const auto t = tails_.find(router_hash);
    if (t == tails_.end()) return std::nullopt;
    return ChainValue{.hash = router_hash, .tail = t->second};
  };
  std::optional<ChainValue> parent_chain;
  if (digests) parent_chain = ev.parent_block_hash ? chain_of(parent) : hasher_.root();
  const std::span<const TokenId> tokens(ev.token_ids);
  for (size_t i = 0; i < n; ++i) {
    const uint64_t worker_hash = ev.block_hashes[i];
    uint64_t router_hash = 0;
    if (has_tokens && chained && !digests) {
      router_hash = hash_block(parent, tokens.subspan(i * bs, bs));
    } else if (has_tokens && chained && parent_chain) {
      parent_chain = hasher_.hash(*parent_chain, tokens.subspan(i * bs, bs));
      router_hash = parent_chain->hash;
      tails_.insert_or_assign(router_hash, parent_chain->tail);
    } else if (has_tokens && chained && parent_same_name) {
      // The parent came without its digest (a snapshot's block) from a worker that names
      // blocks as the index does: its children are named as the worker names them, as the
      // snapshot's blocks are. (A worker that names them otherwise: an orphan, below.)
      router_hash = worker_hash;
    } else if (const auto known = resolve_locked(worker, worker_hash)) {
      router_hash = *known;  // a block the worker holds already (a copy to another tier)
    } else {
      ++(has_tokens ? ws.stats.orphan_blocks : ws.stats.skipped_blocks);
      chained = false;  // its children cannot be chained either
      continue;
    }
    store_locked(worker, worker_hash, router_hash, ev.tier, chained ? &parent : nullptr);
    if (digests && (!parent_chain || parent_chain->hash != router_hash)) {
      parent_chain = chain_of(router_hash);
    }
    parent = router_hash;
    parent_same_name = router_hash == worker_hash;
    chained = true;
  }
}

std::optional<uint64_t> PrefixIndex::resolve_locked(WorkerId worker, uint64_t worker_hash) const {
  const WorkerState& ws = workers_[worker];
  if (!ws.to_router.empty()) {
    if (auto it = ws.to_router.find(worker_hash); it != ws.to_router.end()) return it->second;
  }
  // Not mapped: the worker hash is the router hash if the worker holds that block.
  if (auto it = blocks_.find(worker_hash);
      it != blocks_.end() && tiers_of(it->second.holders, worker) != 0) {
    return worker_hash;
  }
  return std::nullopt;
}

void PrefixIndex::store_locked(WorkerId worker, uint64_t worker_hash, uint64_t router_hash,
                               Tier tier, const uint64_t* parent) {
  WorkerState& ws = workers_[worker];
  const uint8_t bit = tier_bit(tier);
  const auto t = static_cast<size_t>(tier);
  auto [it, inserted] = blocks_.try_emplace(router_hash);
  BlockEntry& e = it->second;
  const uint8_t had = inserted ? 0 : tiers_of(e.holders, worker);
  if ((had & bit) != 0) {
    ++ws.extra_copies[copy_key(router_hash, tier)];
    ++ws.stats.duplicate_copies;
  } else {
    // The holders change: the block leaves its chain and finds its place again. A new
    // block's place is after its parent.
    Links links;
    if (!inserted) {
      links = unchain_locked(router_hash, e);
    } else if (parent != nullptr) {
      links.pred = *parent;
      links.has_pred = true;
    }
    holder_locked(e.holders, worker).tiers |= bit;
    ++ws.stats.blocks_per_tier[t];
    chain_locked(router_hash, e, links);
  }
  if (had == 0) ++ws.stats.blocks;
  if (worker_hash != router_hash) {
    ws.to_router[worker_hash] = router_hash;
    ws.to_worker[router_hash] = worker_hash;
  }
  if (!predicted_.empty()) drop_prediction_locked(worker, router_hash);
}

void PrefixIndex::remove_locked(WorkerId worker, uint64_t worker_hash, Tier tier) {
  WorkerState& ws = workers_[worker];
  const uint8_t bit = tier_bit(tier);
  const auto t = static_cast<size_t>(tier);
  const std::optional<uint64_t> router_hash = resolve_locked(worker, worker_hash);
  auto it = router_hash ? blocks_.find(*router_hash) : blocks_.end();
  if (it == blocks_.end() || (tiers_of(it->second.holders, worker) & bit) == 0) {
    ++ws.stats.unknown_removals;
    return;
  }
  if (!ws.extra_copies.empty()) {
    if (auto c = ws.extra_copies.find(copy_key(*router_hash, tier)); c != ws.extra_copies.end()) {
      if (--c->second == 0) ws.extra_copies.erase(c);
      --ws.stats.duplicate_copies;
      return;
    }
  }
  BlockEntry& e = it->second;
  const Links links = unchain_locked(*router_hash, e);
  Holder& h = holder_locked(e.holders, worker);
  h.tiers = static_cast<uint8_t>(h.tiers & ~bit);
  --ws.stats.blocks_per_tier[t];
  if (h.tiers == 0) {
    --ws.stats.blocks;
    erase_holder_locked(e.holders, worker);
    if (worker_hash != *router_hash) {
      ws.to_router.erase(worker_hash);
      if (auto w = ws.to_worker.find(*router_hash);
          w != ws.to_worker.end() && w->second == worker_hash) {
        ws.to_worker.erase(w);
      }
    }
  }
  if (e.holders.empty()) {
    blocks_.erase(it);
    if (!tails_.empty()) tails_.erase(*router_hash);
  } else {
    chain_locked(*router_hash, e, links);
  }
}

void PrefixIndex::clear_blocks_locked(WorkerId worker) {
  WorkerState& ws = workers_[worker];
  if (ws.stats.blocks != 0) {
    // Every block loses the worker, so a chain's blocks keep equal holders; a chain whose
    // blocks are left with none goes with them.
    std::vector<uint32_t> dead;
    absl::erase_if(blocks_, [this, worker, &dead](auto& kv) {
      erase_holder_locked(kv.second.holders, worker);
      if (!kv.second.holders.empty()) return false;
      if (!tails_.empty()) tails_.erase(kv.first);
      const Chain& c = chains_[kv.second.chain];
      if (c.index_of(kv.second.pos) == c.begin) dead.push_back(kv.second.chain);
      return true;
    });
    for (uint32_t id : dead) free_chain_locked(id);
  }
  ws.to_router = {};
  ws.to_worker = {};
  ws.extra_copies = {};
  ws.stats.blocks_per_tier = {};
  ws.stats.blocks = 0;
  ws.stats.duplicate_copies = 0;
}

void PrefixIndex::drop_prediction_locked(WorkerId worker, uint64_t router_hash) {
  auto it = expiry_ms_.find(PredictedKey{router_hash, worker});
  if (it == expiry_ms_.end()) return;
  expiry_ms_.erase(it);  // its heap node is dropped when it comes due
  auto p = predicted_.find(router_hash);
  set_erase(p->second, worker);
  if (p->second.empty()) predicted_.erase(p);
  --workers_[worker].stats.predicted_blocks;
}

void PrefixIndex::drop_worker_marks_locked(WorkerId worker) {
  absl::erase_if(expiry_ms_, [worker](const auto& kv) { return kv.first.second == worker; });
  const auto drop = [worker](auto& kv) {
    set_erase(kv.second, worker);
    return kv.second.empty();
  };
  absl::erase_if(predicted_, drop);
  absl::erase_if(pinned_, drop);
  workers_[worker].stats.predicted_blocks = 0;
  workers_[worker].stats.pinned_blocks = 0;
}

std::vector<WorkerMatch> PrefixIndex::match(std::span<const uint64_t> router_hashes,
                                            MatchCost* cost) const {
  // `run`: the workers whose run still goes on, by increasing id, with their counts so far:
  // the first block's holders (and predictions), then narrowed block by block in place; a
  // worker whose run ends moves to `out` with its counts.
  std::vector<WorkerMatch> run, out;
  MatchCost spent;
  std::shared_lock lock(mutex_);
  const bool any_predicted = !predicted_.empty();
  const bool any_pinned = !pinned_.empty();
  // At millions of blocks every probe of blocks_ misses the caches (bench_router_index_scale);
  // the request's hashes are all known, so the probes up to kPrefetchAhead blocks ahead are
  // started early and their misses overlap. Blocks walked along a chain need no probe; a
  // prefetch of one of them is wasted, which costs a little bandwidth and no wait.
  const size_t n = router_hashes.size();
  size_t fetched = 0;  // router_hashes[0, fetched) have been prefetched
  const auto prefetch_from = [&](size_t b) {
    fetched = std::max(fetched, b);
    for (; fetched < std::min(n, b + kPrefetchAhead); ++fetched) {
      blocks_.prefetch(router_hashes[fetched]);
    }
  };
  // `same`: the holders of the last block walked in full, when the run is exactly they
  // (that block had no predictions or pins). A next block with equal holders and no
  // predictions or pins advances every run by one block in the same tiers: it is only
  // counted in `repeats`, and added to the runs in one pass when the streak ends. So a
  // shared stem held by hundreds of workers costs a comparison of two holder lists per
  // block, not a merge of the run with them.
  std::span<const Holder> same;
  uint32_t repeats = 0;
  const auto add_repeats = [&] {
    if (repeats == 0) return;
    for (size_t k = 0; k < run.size(); ++k) count_block(run[k], same[k].tiers, repeats);
    repeats = 0;
  };
  // How many blocks after block b, along `entry`'s chain, the request goes on with no
  // predictions or pins: they have block b's holders.
  const auto chained_after = [&](size_t b, const BlockEntry& entry) -> uint32_t {
    const Chain& c = chains_[entry.chain];
    const size_t i = c.index_of(entry.pos) + 1;
    const size_t limit = std::min(n - b - 1, c.hashes.size() - i);
    const uint64_t* want = router_hashes.data() + b + 1;
    const uint64_t* have = c.hashes.data() + i;
    size_t k = 0;
    while (k < limit && want[k] == have[k]) {
      if (any_predicted && predicted_.contains(want[k])) break;
      if (any_pinned && pinned_.contains(want[k])) break;
      ++k;
    }
    return static_cast<uint32_t>(k);
  };
  bool first = true;
  prefetch_from(0);
  for (size_t b = 0; b < n; ++b) {
    const uint64_t h = router_hashes[b];
    prefetch_from(b + 1);
    std::span<const Holder> holders;
    const BlockEntry* entry = nullptr;
    ++spent.probes;
    if (auto it = blocks_.find(h); it != blocks_.end()) {
      entry = &it->second;
      holders = entry->holders;
    }
    std::span<const uint16_t> pred;
    if (any_predicted) {
      if (auto it = predicted_.find(h); it != predicted_.end()) pred = it->second;
    }
    std::span<const uint16_t> pins;
    if (any_pinned) {
      if (auto it = pinned_.find(h); it != pinned_.end()) pins = it->second;
    }
    if (!same.empty() && pred.empty() && pins.empty() && same.size() == holders.size() &&
        std::memcmp(same.data(), holders.data(), same.size_bytes()) == 0) {
      // The streak goes on, through the block's chain too.
      const uint32_t k = chained_after(b, *entry);
      repeats += 1 + k;
      spent.chained_blocks += k;
      b += k;
      continue;
    }
    add_repeats();
    if (first) {
      first = false;
      run.reserve(holders.size() + pred.size());
      size_t i = 0, j = 0;  // the union of holders and predictions, in order
      while (i < holders.size() || j < pred.size()) {
        const WorkerId a = i < holders.size() ? holders[i].worker : kMaxWorkers;
        const WorkerId w = j < pred.size() ? pred[j] : kMaxWorkers;
        run.push_back(WorkerMatch{.worker = std::min(a, w)});
        i += a <= w ? 1 : 0;
        j += w <= a ? 1 : 0;
      }
    }
    size_t hi = 0, pi = 0, ni = 0, kept = 0;
    for (size_t k = 0; k < run.size(); ++k) {
      WorkerMatch m = run[k];
      const WorkerId w = m.worker;
      while (hi < holders.size() && holders[hi].worker < w) ++hi;
      while (pi < pred.size() && pred[pi] < w) ++pi;
      const uint8_t tiers = hi < holders.size() && holders[hi].worker == w ? holders[hi].tiers : 0;
      const bool predicted = pi < pred.size() && pred[pi] == w;
      if (tiers == 0 && !predicted) {
        out.push_back(m);
        continue;
      }
      count_block(m, tiers, 1);
      while (ni < pins.size() && pins[ni] < w) ++ni;
      if (ni < pins.size() && pins[ni] == w) ++m.pinned_blocks;
      run[kept++] = m;  // kept <= k: compaction in place
    }
    run.resize(kept);
    if (run.empty()) break;
    // After this block the run is exactly its holders when none left and none was only
    // predicted (run is a subset of holders then, in the same order).
    same = pred.empty() && pins.empty() && run.size() == holders.size() ? holders
                                                                        : std::span<const Holder>();
    // Without predictions here every worker of the run holds this block, so the blocks
    // that follow along its chain take each run on in that worker's tiers.
    if (entry != nullptr && pred.empty()) {
      const uint32_t k = chained_after(b, *entry);
      if (k == 0) continue;
      spent.chained_blocks += k;
      b += k;
      if (!same.empty()) {
        repeats += k;
        continue;
      }
      hi = 0;
      for (WorkerMatch& m : run) {
        while (holders[hi].worker < m.worker) ++hi;
        count_block(m, holders[hi].tiers, k);
      }
    }
  }
  add_repeats();
  if (out.empty()) {
    out.swap(run);  // every run went to the end of the request: already in order
  } else {
    out.insert(out.end(), run.begin(), run.end());
    std::sort(out.begin(), out.end(),
              [](const WorkerMatch& a, const WorkerMatch& b) { return a.worker < b.worker; });
  }
  for (WorkerMatch& m : out) m.stale = stale_[m.worker];
  if (cost != nullptr) *cost = spent;
  return out;
}

std::vector<uint64_t> PrefixIndex::hash_tokens(std::span<const int32_t> tokens, int block_size) {
  if (block_size < 1) return {};
  return hash_blocks(tokens, block_size);
}

std::vector<uint64_t> PrefixIndex::router_hashes(std::span<const int32_t> tokens,
                                                 int block_size) const {
  if (block_size < 1) return {};
  return hasher_.hash_blocks(tokens, block_size);
}

void PrefixIndex::insert_predicted(WorkerId worker, std::span<const uint64_t> router_hashes,
                                   int64_t now_ms, int64_t ttl_ms) {
  if (worker >= kMaxWorkers) return;
  const int64_t at_ms = now_ms + std::max<int64_t>(ttl_ms, 0);
  std::unique_lock lock(mutex_);
  WorkerState& ws = workers_[worker];
  if (!ws.present) return;
  for (uint64_t h : router_hashes) {
    if (auto it = blocks_.find(h);
        it != blocks_.end() && tiers_of(it->second.holders, worker) != 0) {
      continue;
    }
    auto [it, inserted] = expiry_ms_.try_emplace(PredictedKey{h, worker}, at_ms);
    if (!inserted) {
      if (it->second >= at_ms) continue;
      it->second = at_ms;
    } else {
      set_insert(predicted_[h], worker);
      ++ws.stats.predicted_blocks;
    }
    expiry_heap_.push_back(Expiry{at_ms, h, worker});
    std::push_heap(expiry_heap_.begin(), expiry_heap_.end(), LaterExpiry{});
  }
}

size_t PrefixIndex::expire(int64_t now_ms) {
  std::unique_lock lock(mutex_);
  size_t dropped = 0;
  while (!expiry_heap_.empty() && expiry_heap_.front().at_ms <= now_ms) {
    std::pop_heap(expiry_heap_.begin(), expiry_heap_.end(), LaterExpiry{});
    const Expiry due = expiry_heap_.back();
    expiry_heap_.pop_back();
    auto it = expiry_ms_.find(PredictedKey{due.router_hash, due.worker});
    // Superseded nodes: the prediction was extended, dropped by a real store, or its
    // worker removed.
    if (it == expiry_ms_.end() || it->second != due.at_ms) continue;
    drop_prediction_locked(due.worker, due.router_hash);
    ++dropped;
  }
  return dropped;
}

void PrefixIndex::replace_pins(WorkerId worker, std::span<const uint64_t> router_hashes) {
  if (worker >= kMaxWorkers) return;
  {
    std::unique_lock lock(mutex_);
    if (!workers_[worker].present) return;
    absl::erase_if(pinned_, [worker](auto& kv) {
      set_erase(kv.second, worker);
      return kv.second.empty();
    });
    workers_[worker].stats.pinned_blocks = 0;
  }
  set_pinned(worker, router_hashes, true);
}

void PrefixIndex::drop_predicted(WorkerId worker, std::span<const uint64_t> router_hashes) {
  if (worker >= kMaxWorkers) return;
  std::unique_lock lock(mutex_);
  if (!workers_[worker].present) return;
  for (uint64_t h : router_hashes) drop_prediction_locked(worker, h);
}

std::vector<uint64_t> PrefixIndex::held(WorkerId worker,
                                        std::span<const uint64_t> router_hashes) const {
  std::vector<uint64_t> out;
  if (worker >= kMaxWorkers) return out;
  std::shared_lock lock(mutex_);
  for (uint64_t h : router_hashes) {
    if (auto it = blocks_.find(h);
        it != blocks_.end() && tiers_of(it->second.holders, worker) != 0) {
      out.push_back(h);
    }
  }
  return out;
}

void PrefixIndex::set_pinned(WorkerId worker, std::span<const uint64_t> router_hashes,
                             bool pinned) {
  if (worker >= kMaxWorkers) return;
  std::unique_lock lock(mutex_);
  WorkerState& ws = workers_[worker];
  if (!ws.present) return;
  for (uint64_t h : router_hashes) {
    if (pinned) {
      if (set_insert(pinned_[h], worker)) ++ws.stats.pinned_blocks;
    } else if (auto it = pinned_.find(h); it != pinned_.end() && set_erase(it->second, worker)) {
      --ws.stats.pinned_blocks;
      if (it->second.empty()) pinned_.erase(it);
    }
  }
}

void PrefixIndex::mark_stale(WorkerId worker, bool stale) {
  if (worker >= kMaxWorkers) return;
  std::unique_lock lock(mutex_);
  if (workers_[worker].present) stale_[worker] = stale;
}

bool PrefixIndex::is_stale(WorkerId worker) const {
  if (worker >= kMaxWorkers) return false;
  std::shared_lock lock(mutex_);
  return stale_[worker];
}

void PrefixIndex::rebuild_worker(WorkerId worker, std::span<const SnapshotBlock> blocks) {
  if (worker >= kMaxWorkers) return;
  std::unique_lock lock(mutex_);
  if (!workers_[worker].present) return;
  clear_blocks_locked(worker);
  for (const SnapshotBlock& b : blocks) {
    for (Tier tier : {Tier::kDevice, Tier::kHost, Tier::kStorage}) {
      if ((b.tier_mask & tier_bit(tier)) != 0)
        store_locked(worker, b.worker_hash, b.router_hash, tier, nullptr);
    }
  }
}

std::vector<uint64_t> PrefixIndex::worker_hashes(WorkerId worker,
                                                 std::span<const uint64_t> router_hashes) const {
  std::vector<uint64_t> out;
  if (worker >= kMaxWorkers) return out;
  std::shared_lock lock(mutex_);
  const WorkerState& ws = workers_[worker];
  if (!ws.present) return out;
  out.reserve(router_hashes.size());
  for (uint64_t h : router_hashes) {
    auto it = blocks_.find(h);
    if (it == blocks_.end() || tiers_of(it->second.holders, worker) == 0) continue;
    auto w = ws.to_worker.find(h);
    out.push_back(w != ws.to_worker.end() ? w->second : h);
  }
  return out;
}

PrefixIndexStats PrefixIndex::stats() const {
  // Per slot: the value plus one control byte (absl's swiss table).
  const auto table_bytes = [](const auto& table) {
    using Slot = typename std::decay_t<decltype(table)>::value_type;
    return static_cast<uint64_t>(table.capacity()) * (sizeof(Slot) + 1);
  };
  std::shared_lock lock(mutex_);
  PrefixIndexStats s;
  s.distinct_blocks = blocks_.size();
  s.chains = chains_.size() - free_chains_.size();
  s.predicted_entries = expiry_ms_.size();
  s.memory_bytes = table_bytes(blocks_) + spilled_holders_ * sizeof(Holder) +
                   table_bytes(predicted_) + table_bytes(expiry_ms_) + table_bytes(pinned_) +
                   expiry_heap_.capacity() * sizeof(Expiry) + chains_.size() * sizeof(Chain) +
                   free_chains_.capacity() * sizeof(uint32_t);
  s.memory_bytes += chain_array_bytes_ + table_bytes(tails_);
  for (const WorkerState& ws : workers_) {
    if (!ws.present) continue;
    s.memory_bytes +=
        table_bytes(ws.to_router) + table_bytes(ws.to_worker) + table_bytes(ws.extra_copies);
    WorkerIndexStats st = ws.stats;
    st.stale = stale_[ws.stats.worker];
    st.mapped_hashes = ws.to_router.size();
    s.workers.push_back(st);
  }
  return s;
}

std::vector<ChainView> PrefixIndex::chains() const {
  std::shared_lock lock(mutex_);
  std::vector<ChainView> out;
  for (const Chain& c : chains_) {
    if (!c.alive) continue;
    ChainView v;
    if (c.has_parent) v.parent = c.parent;
    v.blocks.assign(c.hashes.begin() + c.begin, c.hashes.end());
    out.push_back(std::move(v));
  }
  return out;
}

Status PrefixIndex::check_chains() const {
  std::shared_lock lock(mutex_);
  const auto broken = [](const std::string& what) {
    return make_error(ErrorCode::kInternal, "chains: " + what);
  };
  size_t chained = 0, live = 0;
  for (uint32_t id = 0; id < chains_.size(); ++id) {
    const Chain& c = chains_[id];
    if (!c.alive) continue;
    ++live;
    if (c.size() == 0) return broken("chain " + std::to_string(id) + " is empty");
    const Holders* first = nullptr;
    for (size_t i = c.begin; i < c.hashes.size(); ++i) {
      auto it = blocks_.find(c.hashes[i]);
      if (it == blocks_.end()) return broken("chain " + std::to_string(id) + " names a gone block");
      const BlockEntry& e = it->second;
      if (e.chain != id || c.index_of(e.pos) != i) {
        return broken("block at " + std::to_string(i) + " of chain " + std::to_string(id) +
                      " points elsewhere");
      }
      if (first == nullptr) {
        first = &e.holders;
      } else if (*first != e.holders) {
        return broken("chain " + std::to_string(id) + " has unequal holders");
      }
      ++chained;
    }
  }
  if (chained != blocks_.size()) {
    return broken(std::to_string(blocks_.size() - chained) + " blocks are in no chain");
  }
  if (live + free_chains_.size() != chains_.size()) return broken("free list miscounted");
  uint64_t array_bytes = 0;
  for (const Chain& c : chains_) array_bytes += c.hashes.capacity() * sizeof(uint64_t);
  if (array_bytes != chain_array_bytes_) return broken("array bytes miscounted");
  return {};
}

}  // namespace strata::router
