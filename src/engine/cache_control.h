// Cache control: the typed commands through which everything outside the engine (the
// HTTP server, the router and the dashboard over HTTP, the bench) reads and steers the KV
// cache. Each command runs on the scheduler thread between two steps, so it sees and
// changes a consistent tree; its future holds a Result whose error code says what went
// wrong (docs/architecture.md lists them with their HTTP statuses):
//
//   pin        kOverBudget (the blocks it would newly pin exceed --max-pinned-ratio, or
//              a client's --max-client-pinned-ratio; nothing pinned). Unknown hashes
//              are skipped and counted, not an error; PinPriority is valid by its type.
//   unpin, evict_blocks, flush, evict_lru, state   never fail on valid input.
//   node       kNotFound (no cached node has that id).
//   tool_start kNotFound (no such session), kNoHostTier, kFailedPrecondition (already
//              offloaded), kBusy (a request of the session runs).
//   tool_end   kNotFound, kFailedPrecondition (not offloaded), kStaleEpoch, kOutOfPages
//              (no device room now: retry).
//   kv_meta    kNotFound.
//
// Policy lives behind these commands, in the engine: who may pin what and the budgets
// (engine/pin_policy.cc), the eviction order (cache/eviction_policy.h), the tool-session
// state machine (engine/tool_sessions.h). Callers translate, nothing more.
#pragma once

#include <cstdint>
#include <functional>
#include <future>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cache/block_hash.h"
#include "cache/pin_priority.h"
#include "common/result.h"

namespace strata {

class Scheduler;

// Who asks for a pin (docs/authority.md):
//  - kAdmin (the admin key, or a server without one): hard or soft pins at any priority,
//    within --max-pinned-ratio of the pool.
//  - kClient (a request without the key): soft pins only, TTL capped at
//    --max-client-pin-ttl-s, at the lowest priority, within --max-client-pinned-ratio of
//    the pool and within --max-pinned-ratio.
enum class PinAuthority : uint8_t { kAdmin, kClient };

struct PinCommand {
  std::vector<BlockHash> hashes;  // a repeated hash pins twice
  int64_t ttl_ms = 0;             // 0: a hard pin; > 0: a soft pin that expires unless hit
  PinPriority priority;           // the no-deadlock rule releases lower priorities first
  PinAuthority authority = PinAuthority::kAdmin;
};

struct PinOutcome {
  int32_t pinned = 0;   // blocks pinned
  int32_t unknown = 0;  // hashes not in the cache (skipped)
};

struct UnpinOutcome {
  int32_t unpinned = 0;    // blocks whose pin count went down
  int32_t unknown = 0;     // hashes not in the cache
  int32_t not_pinned = 0;  // hashes cached without a pin (nothing done)
};

struct EvictBlocksCommand {
  std::vector<BlockHash> hashes;
  bool descendants = false;  // also everything below them
};

struct EvictBlocksOutcome {
  int32_t evicted_blocks = 0;
  int32_t skipped_locked = 0;        // kept: a request holds them
  int32_t skipped_pinned = 0;        // kept: they (or descendants) are pinned
  int32_t skipped_has_children = 0;  // without descendants: blocks that still have some
  int32_t unknown = 0;               // hashes not in the cache
};

struct EvictLruOutcome {
  int32_t evicted_pages = 0;  // device pages freed now (demoted where a host copy exists)
  int32_t pending_pages = 0;  // device pages that free when their backup lands
};

struct FlushOutcome {
  int32_t evicted_device_pages = 0;  // freed (or freeing once backed up)
  int32_t evicted_host_pages = 0;
  int32_t pinned_preserved = 0;  // pinned blocks kept
  int32_t locked_skipped = 0;    // pages kept because requests hold them
};

// The cache's state: use per tier, pins, locks, requests, counters, and the tree on request.
struct CacheState {
  struct Device {
    int64_t capacity_pages = 0, free_pages = 0, used_pages = 0, cached_pages = 0;
    int64_t request_pages = 0;  // held privately by running requests, not in the tree
    int64_t pinned_blocks = 0, soft_pinned_blocks = 0, protected_pages = 0;
    int64_t evictable_pages = 0, locked_nodes = 0;
  };
  struct Host {
    int64_t capacity_pages = 0, free_pages = 0, used_pages = 0, cached_pages = 0;
    int64_t host_only_pages = 0, protected_pages = 0, evictable_pages = 0;
    std::string write_policy, mem_layout;
    int64_t transfers_in_flight = 0;  // nodes with a copy in flight
  };
  struct Storage {
    std::string backend;
    int64_t stored_pages_known = 0;
    uint64_t pages_written_total = 0, prefetches_total = 0, prefetch_pages_read_total = 0;
    uint64_t prefetch_timeouts_total = 0, faults_total = 0;
    uint64_t get_hits = 0, get_misses = 0, get_errors = 0, corrupt_values = 0;
    uint64_t set_written = 0, set_skipped_existing = 0, set_errors = 0;
    uint64_t bytes_read = 0, bytes_written = 0;
  };
  struct Hits {
    uint64_t match_calls = 0, matched_tokens_total = 0, cached_prompt_tokens_total = 0;
    uint64_t cached_host_tokens_total = 0, cached_storage_tokens_total = 0;
    uint64_t prompt_tokens_total = 0;
  };
  struct Evictions {
    uint64_t evicted_pages_total = 0, demoted_pages_total = 0, host_evicted_pages_total = 0;
    uint64_t backed_up_pages_total = 0, loaded_pages_total = 0, backups_skipped_total = 0;
    uint64_t loads_failed_total = 0, auto_unpinned_blocks_total = 0, expired_pins_total = 0;
    uint64_t auto_unpinned_host_blocks_total = 0;  // of auto_unpinned: the host was full
  };
  struct Node {
    uint64_t id = 0, parent = 0;  // parent 0: a child of the root
    int32_t tokens = 0;
    std::vector<BlockHash> block_hashes;
    bool on_device = false, on_host = false, in_storage = false;
    int32_t lock_ref = 0, pin_ref = 0;
    int32_t soft_pinned_blocks = 0;  // pages with at least one soft (TTL) pin
    std::vector<uint32_t> pin_counts;
    std::vector<int64_t> soft_pin_ttl_ms;  // per page: its soft pins' longest TTL (0: none)
    int64_t last_access_ms = 0;
    uint64_t hit_count = 0;
    bool loading = false, session_protected = false, evictable = false;
  };

  int32_t page_size = 0;
  Device device;
  std::optional<Host> host;        // with the hierarchical cache
  std::optional<Storage> storage;  // with a storage backend
  int64_t nodes_count = 0;
  Hits hits;
  Evictions evictions;
  int64_t running_requests = 0, waiting_requests = 0;
  std::optional<std::vector<Node>> nodes;  // with StateQuery::with_tree
};

struct StateQuery {
  bool with_tree = false;
};

// One node of the tree with its content (CacheControl::node): what /cache/state's tree
// says of it, and the token ids of its pages.
struct CacheNodeContent {
  CacheState::Node node;
  std::vector<TokenId> token_ids;  // node.tokens ids, the node's own (not its ancestors')
};

// A tool session (engine/tool_sessions.h): RUNNABLE -> (tool_start) OFFLOADING ->
// OFFLOADED -> (tool_end) RESTORING -> RUNNABLE.
enum class ToolSessionState : uint8_t { kRunnable, kOffloading, kOffloaded, kRestoring };
std::string_view tool_session_state_name(ToolSessionState state);

struct ToolSessionView {
  ToolSessionState state = ToolSessionState::kRunnable;
  std::string tier;  // where the session's KV is now: device | host | none
  uint64_t epoch = 0;
  int64_t tokens = 0;        // tokens whose KV the session has (full pages)
  int64_t since_ms = 0;      // wall time (ms since the Unix epoch) of the last state change
  int64_t moved_tokens = 0;  // tool_start: tokens offloaded; tool_end: tokens restored
};

// The commands. Thread-safe; each returns at once and its future is ready after the
// scheduler's next step boundary. Obtained from Engine::cache().
class CacheControl {
 public:
  explicit CacheControl(Scheduler& scheduler) : scheduler_(scheduler) {}

  std::future<Result<PinOutcome>> pin(PinCommand command);
  std::future<Result<UnpinOutcome>> unpin(std::vector<BlockHash> hashes);
  std::future<Result<EvictBlocksOutcome>> evict_blocks(EvictBlocksCommand command);
  // Frees at least `pages` device pages from the least recently used unprotected leaves
  // (whole leaves, so possibly more; fewer when less is evictable), demoting those with a
  // host copy to the host.
  std::future<Result<EvictLruOutcome>> evict_lru(int64_t pages);
  // Evicts everything evictable from every tier; pinned blocks and what requests hold stay.
  std::future<Result<FlushOutcome>> flush();
  std::future<Result<CacheState>> state(StateQuery query = {});
  // One node by the id CacheState::Node gives it. kNotFound when no cached node has that
  // id (evicted since, or never; the root, id 0, is none). Ids are stable while a node
  // lives, but a split gives the upper part a new id: the node keeps its id and its tail.
  // Finding the node walks the tree at the step boundary (linear in the nodes, as a
  // tree snapshot is): meant for a person's clicks, not for every request.
  std::future<Result<CacheNodeContent>> node(uint64_t id);
  // tool_start answers once the offload landed (OFFLOADED); tool_end once the restore
  // landed (RUNNABLE), after making room by retracting running requests or waiting for
  // room for up to 10 s (then kOutOfPages). `on_ready` (may be empty) is called on the
  // scheduler thread when the future becomes ready: an HTTP handler's waker.
  std::future<Result<ToolSessionView>> tool_start(std::string session_id,
                                                  std::function<void()> on_ready = {});
  std::future<Result<ToolSessionView>> tool_end(std::string session_id, uint64_t epoch,
                                                std::function<void()> on_ready = {});
  std::future<Result<ToolSessionView>> kv_meta(std::string session_id);

 private:
  Scheduler& scheduler_;
};

}  // namespace strata
