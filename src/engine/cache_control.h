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
#include "cache/tree_stats.h"
#include "common/result.h"
#include "engine/engine_options.h"

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
  // Over a pin budget: pin the longest leading run of `hashes` that fits (PinResult::cut
  // counts the hashes left after it) instead of refusing the call. For prefixes (a
  // breakpoint's blocks, in prompt order), whose first blocks every later request needs.
  bool longest_prefix = false;
};

// The tree's answers, passed through as they are (cache/tree_stats.h).
using PinOutcome = PinResult;
using UnpinOutcome = UnpinResult;
using EvictBlocksOutcome = EvictBlocksResult;
using FlushOutcome = FlushResult;

struct EvictBlocksCommand {
  std::vector<BlockHash> hashes;
  bool descendants = false;  // also everything below them
};

struct EvictLruOutcome {
  int32_t evicted_pages = 0;  // device pages freed now (demoted where a host copy exists)
  int32_t pending_pages = 0;  // device pages that free when their backup lands
};

// The cache's state at one step boundary. Each figure is defined once, in the struct that
// counts it, and passed here whole: the tree's counters as the tree keeps them
// (cache/tree_stats.h), the engine's counters (engine_options.h: requests, hits by tier,
// storage traffic, auto-unpins), the pools' use. How GET /cache/state and /metrics show
// each figure is one description in the server (server/cache_figures.h).
struct CacheState {
  struct Pool {  // a page pool (device or host)
    int64_t capacity_pages = 0, free_pages = 0, used_pages = 0;
    int64_t page_bytes = 0;  // one page, all layers, K and V, scales included
  };
  struct Host {
    Pool pool;
    std::string write_policy, mem_layout;
  };
  // The storage backend's own counters (a subset of storage/storage_backend.h's
  // StorageStats, which is internal to the engine).
  struct Storage {
    std::string backend;
    uint64_t get_hits = 0, get_misses = 0, get_errors = 0, corrupt_values = 0;
    uint64_t set_written = 0, set_skipped_existing = 0, set_errors = 0;
    uint64_t bytes_read = 0, bytes_written = 0;
    uint64_t foreign_format_values = 0;  // values of another KV dtype or block order, kept
  };
  using Node = NodeSnapshot;

  TreeStats tree;
  EngineCounters engine;
  std::string kv_dtype;  // the pages' element type (kv_dtype_name)
  Pool device;
  int64_t request_pages = 0;               // device pages held privately by running requests
  std::optional<Host> host;                // with the hierarchical cache
  std::optional<Storage> storage;          // with a storage backend
  std::optional<std::vector<Node>> nodes;  // with StateQuery::with_tree
};

struct StateQuery {
  bool with_tree = false;
};

// One node of the tree with its content (CacheControl::node): what /cache/state's tree
// says of it, and the token ids of its pages.
struct CacheNodeContent {
  CacheState::Node node;
  std::vector<TokenId> token_ids;  // node.num_tokens ids, the node's own (not its ancestors')
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
  // room for up to 10 s (then kOutOfPages); a restore whose copy stalls (a GPU's copy not
  // done by its stall deadline) is answered then, RESTORING: the next request computes
  // what has not landed. `on_ready` (may be empty) is called on the
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
