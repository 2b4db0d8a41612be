// The router's KV block index: which blocks each worker holds, on which tiers, keyed by
// the router's own block hash, so that one lookup per request block scores every worker.
//
// Keys. A block is keyed by the ROUTER hash: strata::hash_block() chained over the
// block's token ids from kRootParentHash (docs/block-hashes.md, no salt), which the router
// recomputes for a request with hash_tokens(). A worker names blocks by its own hash
// (Strata: the same function, so equal for unsalted blocks; vLLM and SGLang: other
// functions and seeds). A BlockStored carries token ids, so apply() recomputes the router
// hash of each block from its parent's router hash; the parent's is found from the event's
// parent worker hash. Per worker the index keeps worker hash <-> router hash maps, but only
// for blocks where the two differ: a Strata worker's maps stay empty, and a worker hash
// that is not in the map and names a block the worker holds is its own router hash. (A
// worker hash that is in the map and also the router hash of another block of that same
// worker would need a 64-bit collision.)
//
// The router hash is Strata's own by default. An index made with another BlockHasher
// (vLLM's sha256_cbor: cache/block_hash.h) keys blocks by that hasher's hashes, so that
// workers hashing alike (Strata workers in that mode, vLLM workers with the same seed) keep
// empty maps; since that hash chains whole digests, the index keeps each block's digest
// tail beside it (32 bytes a block), and a block whose parent it holds without one (a
// snapshot's: rebuild_worker) is taken by the worker's own hash, as the snapshot's are.
//
// Events that cannot be indexed exactly are skipped and counted, never guessed:
// - a BlockStored whose parent worker hash is unknown (its parent was never seen, e.g. the
//   router joined late or missed a batch) cannot be chained: its blocks are "orphans",
//   except those whose own worker hash is already known (a copy to another tier);
// - a BlockStored without usable tokens (vLLM's offload placeholders send none; a block
//   size other than the worker's) indexes only blocks whose worker hash is known;
// - events of a KV cache group other than 0 (vLLM hybrid models: sliding-window layers).
// Router hashes cover token ids only: blocks that a worker keys by LoRA adapter, cache salt
// or multimodal inputs alias the plain blocks with the same tokens.
//
// Tiers. A block may be on several tiers of one worker at once; BlockRemoved removes one
// tier and the block leaves the worker when none is left. A second store of a block on a
// tier that already has it (vLLM can hold two physical copies of one hash) is counted, and
// the matching removal takes the copy back before the tier bit.
//
// Layout and size. One absl::flat_hash_map<router hash, BlockEntry> for all workers: a
// block's holders (the workers that hold it, by increasing id, each with a mask of its
// tiers: 4 bytes a worker; up to 4 inline) and its place in a chain (below). A block on at
// most 4 workers takes a 40-byte slot plus the table's slack and 8 bytes in its chain; a
// block on more workers adds 4 bytes per holder on the heap. Workers are ids in
// [0, kMaxWorkers = 1,024). Workers whose hashes differ add two worker-hash maps of 16
// bytes per entry.
//
// Chains. Blocks that follow one another (each the parent of the next, by router hash)
// and have equal holder lists (the same workers with the same tiers) form a chain: an
// array of their router hashes. Every block is in exactly one chain (often of one block).
// A conversation stored by one worker is one chain; a system prompt every worker stored
// whole is one chain; they split where a block's holders change (a second worker stores a
// prefix of it, a tier leaves one block) and join again when the holders agree (the
// second worker stores the rest: each block leaves the head of the old chain and joins
// the tail of the new one, O(1) per block). A change in the middle of a chain moves the
// shorter side to a new chain; two chains that meet with equal holders merge the smaller
// into the larger, so a block moves O(log n) times over a chain's life. A chain knows the
// block before its head and keeps a hint to one chain that starts after its tail, which is
// how blocks that change tail first (a conversation demoted from the device leaf by leaf)
// join again. Chains only make match() cheaper; what it returns is exactly the per-block
// answer (the randomized test checks it against a reference, and the chains' invariants
// after every step).
//
// match() probes the table for the first block, then compares the request's next hashes
// with the block's chain, in order, as far as they agree: those blocks have the first's
// holders, so every run goes on through them in the same tiers. One probe per chain, not
// per block: at 10M blocks each probe is a DRAM (and TLB) miss, while a chain is read
// sequentially. A block with predictions or pin marks ends the walk there (it is probed).
// match() stops when no worker is left in the run.
//
// At scale (bench_router_index_scale, 10M blocks: docs/benchmarks.md). The block table is
// then hundreds of MB and every probe misses the caches: match() prefetches its probes
// kPrefetchAhead blocks ahead, and the table is mapped on transparent huge pages where the
// kernel allows (huge_page_allocator.h), so a probe is not also a TLB miss. A block whose
// holders equal the previous block's, when the run is exactly those holders (a shared
// stem split into several chains), costs one memcmp of the two lists instead of a merge.
//
// Predicted entries ("approximate" and "predict-on-route"). insert_predicted() records
// that the router sent blocks to a worker, with a TTL: a long one for workers without
// events, a short one for workers with events, so that an agent's fan-out lands together
// before the worker's events arrive. They live in their own maps, never in the
// event-derived entries: events neither see nor corrupt them. A real store of the block on
// that worker drops the prediction; expire() drops the expired ones (call it
// periodically, e.g. every 100 ms: match() does not look at clocks). match() counts a
// predicted block as on device, and reports how many of the run are only predicted.
//
// Pins are marks the caller sets per worker (the router pins through the workers' APIs);
// match() reports how many blocks of the run are pinned there. clear_worker() and
// AllBlocksCleared keep predictions and pins (they belong to the router); remove_worker()
// drops everything of the worker.
//
// Threads. Every method is thread-safe. One std::shared_mutex guards all state: match(),
// worker_hashes(), stats() and is_stale() take it shared, so router coroutines match
// concurrently; apply(), rebuild_worker() and the other mutators take it exclusively,
// apply() once per batch, hashing and chains included (bench_router_index: 0.12 us per new
// block for a Strata worker, 0.28 us for a worker with other hashes, so a batch of 1,024
// new blocks holds it for 0.13 to 0.29 ms, which a concurrent match() may wait). The mutex is a
// leaf: nothing is called back under it. (glibc's rwlock prefers readers; writers are sporadic and
// short, so they get through between matches.)
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <shared_mutex>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include <absl/container/flat_hash_map.h>
#include <absl/container/inlined_vector.h>

#include "cache/block_hash.h"
#include "common/result.h"
#include "router/huge_page_allocator.h"
#include "router/kv_event_wire.h"

namespace strata::router {

using WorkerId = uint32_t;
inline constexpr WorkerId kMaxWorkers = 1024;  // ids fit the index's 16-bit holder ids

// A bit per tier: 1 << static_cast<int>(Tier).
inline constexpr uint8_t tier_bit(Tier tier) {
  return static_cast<uint8_t>(1u << static_cast<unsigned>(tier));
}

// What one worker holds of a request's blocks, from the first block on.
struct WorkerMatch {
  WorkerId worker = 0;
  uint32_t matched_blocks = 0;    // leading run of blocks held (any tier, or predicted)
  uint32_t device_blocks = 0;     // of the run: best tier device (predicted-only ones too)
  uint32_t host_blocks = 0;       // of the run: best tier host
  uint32_t storage_blocks = 0;    // of the run: only on storage
  uint32_t predicted_blocks = 0;  // of the run: held only by prediction (in device_blocks)
  uint32_t pinned_blocks = 0;     // of the run: marked pinned on this worker
  bool stale = false;             // the worker's index is marked stale (approximate)
};

// One block of a worker's snapshot (Strata: GET /cache/state?detail=tree).
struct SnapshotBlock {
  uint64_t worker_hash = 0;  // as the worker names it (pin and evict calls)
  uint64_t router_hash = 0;  // hash_tokens() of its prefix
  uint8_t tier_mask = 0;     // tier_bit()s of the tiers that hold it
};

struct WorkerIndexStats {
  WorkerId worker = 0;
  int block_size = 0;
  bool stale = false;
  std::array<uint64_t, kNumTiers> blocks_per_tier{};  // by Tier
  uint64_t blocks = 0;                                // distinct blocks on any tier
  uint64_t mapped_hashes = 0;     // blocks whose worker hash differs from the router hash
  uint64_t duplicate_copies = 0;  // extra copies of a block on a tier it already had
  uint64_t events_applied = 0;    // events of applied batches (skipped ones included)
  uint64_t skipped_events = 0;    // unknown tags or media, other KV cache groups
  uint64_t orphan_blocks = 0;     // stored blocks whose parent was unknown
  uint64_t skipped_blocks = 0;    // stored blocks without usable tokens and unknown hash
  uint64_t unknown_removals = 0;  // removals of blocks (or tiers) the worker did not hold
  uint64_t predicted_blocks = 0;  // live predicted entries
  uint64_t pinned_blocks = 0;     // blocks marked pinned
};

// What one match() cost (for tests and benchmarks): probes of the block table, and blocks
// walked along a chain instead.
struct MatchCost {
  uint32_t probes = 0;
  uint32_t chained_blocks = 0;
};

// A chain (see the top), for tests: the block before its head, if known, and its blocks'
// router hashes in order.
struct ChainView {
  std::optional<uint64_t> parent;
  std::vector<uint64_t> blocks;
};

struct PrefixIndexStats {
  uint64_t distinct_blocks = 0;    // event-derived blocks held by any worker
  uint64_t chains = 0;             // the chains of those blocks (one or more blocks each)
  uint64_t predicted_entries = 0;  // live (block, worker) predictions
  uint64_t memory_bytes = 0;       // estimate of the tables' heap use
  std::vector<WorkerIndexStats> workers;
};

class PrefixIndex {
 public:
  // `hasher` makes the router hashes (Strata's own by default).
  explicit PrefixIndex(BlockHasher hasher = {}) : hasher_(hasher) {}
  PrefixIndex(const PrefixIndex&) = delete;
  PrefixIndex& operator=(const PrefixIndex&) = delete;

  // Adds a worker with an empty index. kInvalidArgument for an id >= kMaxWorkers, a block
  // size < 1, or an id already present.
  Status add_worker(WorkerId worker, int block_size);
  // Drops everything of the worker, predictions and pins included. Unknown ids: no-op.
  void remove_worker(WorkerId worker);
  // Drops the worker's event-derived blocks (what AllBlocksCleared does); keeps its
  // predictions, pins and stale mark.
  void clear_worker(WorkerId worker);
  // The worker is another process now (its event sequence went back, or its instance id
  // changed): drops its blocks, predictions and pin marks at once, under one lock, so no
  // match sees the old process's pins on the new one. Keeps the stale mark.
  void reset_worker(WorkerId worker);
  bool has_worker(WorkerId worker) const;

  // Applies a decoded batch, in order, under one exclusive lock. A batch for a worker
  // that is not present is dropped (it raced with remove_worker()).
  void apply(WorkerId worker, const KvEventBatch& batch);

  // For each present worker whose run is not empty, what it holds of `router_hashes` (a
  // request's hash_tokens(), first block first); in increasing worker order.
  // `cost`, when given, receives what the call cost.
  std::vector<WorkerMatch> match(std::span<const uint64_t> router_hashes,
                                 MatchCost* cost = nullptr) const;

  // Router hashes of the full blocks of `tokens` (strata::hash_blocks, no salt): an index
  // made with Strata's own hasher.
  static std::vector<uint64_t> hash_tokens(std::span<const int32_t> tokens, int block_size);
  // The same by this index's hasher (no salt).
  std::vector<uint64_t> router_hashes(std::span<const int32_t> tokens, int block_size) const;
  const BlockHasher& hasher() const { return hasher_; }

  // Records that `router_hashes` were just sent to `worker`, until now_ms + ttl_ms (a
  // later insert extends, never shortens). Blocks the worker holds by events are skipped.
  void insert_predicted(WorkerId worker, std::span<const uint64_t> router_hashes, int64_t now_ms,
                        int64_t ttl_ms);
  // Drops predictions that expire at or before now_ms; returns how many.
  size_t expire(int64_t now_ms);

  // Marks (or unmarks) blocks as pinned on the worker. Mark only what the worker
  // confirmed it pinned.
  void set_pinned(WorkerId worker, std::span<const uint64_t> router_hashes, bool pinned);
  // Replaces the worker's pin marks by `router_hashes` (what its tree says is pinned).
  void replace_pins(WorkerId worker, std::span<const uint64_t> router_hashes);
  // Drops the worker's predictions of `router_hashes` (a request the worker refused).
  void drop_predicted(WorkerId worker, std::span<const uint64_t> router_hashes);
  // Those of `router_hashes` the worker holds by events (any tier), in order.
  std::vector<uint64_t> held(WorkerId worker, std::span<const uint64_t> router_hashes) const;

  // The stale mark: the worker's event stream lost events; match() still scores it, with
  // WorkerMatch::stale set, until the owner rebuilds it and clears the mark.
  void mark_stale(WorkerId worker, bool stale);
  bool is_stale(WorkerId worker) const;

  // Replaces the worker's event-derived blocks by a snapshot, atomically (one exclusive
  // lock: a match sees the old index or the new one). Keeps predictions, pins and the
  // stale mark. Blocks with an empty tier mask are ignored.
  void rebuild_worker(WorkerId worker, std::span<const SnapshotBlock> blocks);

  // The worker's own hashes of the blocks it holds among `router_hashes`, in order;
  // blocks it does not hold (by events) are skipped.
  std::vector<uint64_t> worker_hashes(WorkerId worker,
                                      std::span<const uint64_t> router_hashes) const;

  PrefixIndexStats stats() const;

  // Every chain, in no order (tests: the parent links).
  std::vector<ChainView> chains() const;
  // Checks the chains' invariants: every block in exactly one live chain, at the position
  // its entry says; a chain's blocks with equal holder lists; no live chain empty; their
  // arrays' bytes counted right (stats() reads the count, not the chains). OK, or
  // the first broken one named (tests, after every step).
  Status check_chains() const;

 private:
  // One worker's hold on a block: its id and the tier_bit()s of the tiers that hold it
  // (never 0 in a stored entry).
  struct Holder {
    uint16_t worker;
    uint8_t tiers;
    uint8_t zero = 0;  // no padding: match() compares holder lists with memcmp
    friend bool operator==(const Holder&, const Holder&) = default;
  };
  static_assert(std::has_unique_object_representations_v<Holder>);
  static constexpr size_t kInlineHolders = 4;
  // How many blocks ahead match() prefetches its probes of blocks_ (enough misses in flight
  // to cover a DRAM latency, few enough to waste little when a run ends early).
  static constexpr size_t kPrefetchAhead = 8;
  // A block's holders by increasing worker id; empty entries are erased.
  using Holders = absl::InlinedVector<Holder, kInlineHolders>;
  static constexpr uint32_t kNoChain = UINT32_MAX;
  // One block of the table.
  struct BlockEntry {
    Holders holders;            // never empty in the table
    uint32_t chain = kNoChain;  // the chain that holds it (kNoChain only while it moves)
    int32_t pos = 0;            // its logical position there (Chain::origin)
  };
  // A chain (see the top). Its blocks are hashes[begin..]; [0, begin) is room to prepend.
  // A block's logical position is origin + its index in `hashes`, so neither prepending
  // nor dropping the head moves the others' positions.
  struct Chain {
    std::vector<uint64_t> hashes;
    uint32_t begin = 0;
    int64_t origin = 0;
    uint64_t parent = 0;  // router hash of the block before the head, if has_parent
    bool has_parent = false;
    bool alive = false;              // in use (dead ones are on free_chains_)
    uint32_t tail_child = kNoChain;  // hint: a chain whose head's parent is the tail
    size_t size() const { return hashes.size() - begin; }
    uint64_t head() const { return hashes[begin]; }
    size_t index_of(int32_t pos) const { return static_cast<size_t>(pos - origin); }
    int32_t pos_of(size_t index) const {
      return static_cast<int32_t>(origin + static_cast<int64_t>(index));
    }
  };
  // Where a block sat before its holders changed, so that it can find its place again:
  // the block before it (router hash) and a chain that may start right after it.
  struct Links {
    uint64_t pred = 0;
    bool has_pred = false;
    uint32_t succ = kNoChain;
  };
  // Workers by increasing id: a block's predictions or pin marks.
  using WorkerSet = absl::InlinedVector<uint16_t, 8>;
  using PredictedKey = std::pair<uint64_t, WorkerId>;  // (router hash, worker)
  struct Expiry {
    int64_t at_ms;
    uint64_t router_hash;
    WorkerId worker;
  };
  struct WorkerState {
    bool present = false;
    int block_size = 0;
    // Only for blocks whose worker hash differs from their router hash (see the top).
    absl::flat_hash_map<uint64_t, uint64_t> to_router;  // worker hash -> router hash
    absl::flat_hash_map<uint64_t, uint64_t> to_worker;  // router hash -> worker hash
    // Copies beyond the first of a block on a tier: (router hash << 2 | tier) -> count.
    absl::flat_hash_map<uint64_t, uint32_t> extra_copies;
    WorkerIndexStats stats;
  };

  // Adds `blocks` blocks of the run, all in the best of `tiers` (none: predicted), to `m`.
  static void count_block(WorkerMatch& m, uint8_t tiers, uint32_t blocks);
  // The block's tiers on `worker`; 0 when it holds none.
  static uint8_t tiers_of(const Holders& holders, WorkerId worker);
  // The worker's holder in `holders`, inserted in order (tiers 0) when absent.
  Holder& holder_locked(Holders& holders, WorkerId worker);
  // Erases the worker's holder, if any; keeps spilled_holders_ right.
  void erase_holder_locked(Holders& holders, WorkerId worker);

  // All require mutex_ held exclusively (the const ones: at least shared).
  std::optional<uint64_t> resolve_locked(WorkerId worker, uint64_t worker_hash) const;
  // `parent`: the router hash of the block before, when the event names it (a new block
  // joins the chain there).
  void store_locked(WorkerId worker, uint64_t worker_hash, uint64_t router_hash, Tier tier,
                    const uint64_t* parent);
  void remove_locked(WorkerId worker, uint64_t worker_hash, Tier tier);
  void apply_stored_locked(WorkerId worker, const BlockStoredEvent& ev);
  void clear_blocks_locked(WorkerId worker);
  void drop_prediction_locked(WorkerId worker, uint64_t router_hash);
  void drop_worker_marks_locked(WorkerId worker);

  // Chains (mutex_ held exclusively). unchain_locked() takes a block out of its chain
  // before its holders change; chain_locked() puts it back where its holders fit: at the
  // tail of the chain before it, at the head of the chain after it, joining the two, or in
  // a chain of its own.
  Links unchain_locked(uint64_t router_hash, BlockEntry& entry);
  void chain_locked(uint64_t router_hash, BlockEntry& entry, const Links& links);
  uint32_t new_chain_locked();
  void free_chain_locked(uint32_t id);
  bool is_tail(const BlockEntry& entry) const;
  // Appends (prepends) the block to chain `id` and sets its entry.
  void append_locked(uint32_t id, uint64_t router_hash, BlockEntry& entry);
  void prepend_locked(uint32_t id, uint64_t router_hash, BlockEntry& entry);
  // Moves every block of chain `from` to the end (the front) of chain `to`; frees `from`.
  void move_to_back_locked(uint32_t from, uint32_t to);
  void move_to_front_locked(uint32_t from, uint32_t to);
  // Sets the entries of the chain's blocks at indices [first, last) to their positions.
  void renumber_locked(uint32_t id, size_t first, size_t last);
  // Drops the room in front and numbers the blocks from 0 again (positions are int32: a
  // chain that drifted near their end, after billions of prepends or appends and drops).
  void rebase_locked(uint32_t id);
  // If the chain ending at `chain`'s parent block hints `from`, it hints `to` now.
  void rehint_locked(const Chain& chain, uint32_t from, uint32_t to);

  // The block table, on huge pages once it is large (huge_page_allocator.h).
  using BlockTable =
      absl::flat_hash_map<uint64_t, BlockEntry, absl::Hash<uint64_t>, std::equal_to<uint64_t>,
                          HugePageAllocator<std::pair<const uint64_t, BlockEntry>>>;

  const BlockHasher hasher_;
  mutable std::shared_mutex mutex_;
  // With a hasher that chains digests: each indexed block's digest tail, by router hash.
  absl::flat_hash_map<uint64_t, ChainTail> tails_;                            // GUARDED_BY(mutex_)
  std::vector<WorkerState> workers_ = std::vector<WorkerState>(kMaxWorkers);  // GUARDED_BY(mutex_)
  // The stale marks, apart from workers_ (each WorkerState is hundreds of bytes): match()
  // reads one per matched worker.
  std::array<bool, kMaxWorkers> stale_{};  // GUARDED_BY(mutex_)
  BlockTable blocks_;                      // GUARDED_BY(mutex_)
  std::deque<Chain> chains_;               // GUARDED_BY(mutex_) by id (a deque keeps references)
  std::vector<uint32_t> free_chains_;      // GUARDED_BY(mutex_) ids of dead chains
  uint64_t chain_array_bytes_ = 0;         // GUARDED_BY(mutex_) the chains' arrays' capacity
  uint64_t spilled_holders_ = 0;  // GUARDED_BY(mutex_) holders of blocks beyond kInlineHolders
  absl::flat_hash_map<uint64_t, WorkerSet> predicted_;    // GUARDED_BY(mutex_)
  absl::flat_hash_map<PredictedKey, int64_t> expiry_ms_;  // GUARDED_BY(mutex_)
  std::vector<Expiry> expiry_heap_;                       // GUARDED_BY(mutex_) min-heap
  absl::flat_hash_map<uint64_t, WorkerSet> pinned_;       // GUARDED_BY(mutex_)
};

}  // namespace strata::router
