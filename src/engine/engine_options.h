// What an engine is built with (EngineOptions, validated by validate()) and what it counts
// (EngineCounters). Public: the server, the bench and `strata serve` set and read these.
// Each options struct registers its own command-line flags (add_*_flags, next to it):
// name, default (the field's value when registered), unit conversion and range; `strata
// serve` composes them.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "cache/block_hash.h"
#include "cache/write_policy.h"
#include "common/result.h"
#include "memory/copy_device.h"
#include "memory/host_kv_pool.h"  // HostLayout
#include "memory/kv_dtype.h"

namespace CLI {
class App;
}  // namespace CLI

namespace strata {

// When a request whose prefix is in storage stops waiting for the prefetch.
enum class PrefetchPolicy : uint8_t { kBestEffort, kWaitComplete, kTimeout };
Result<PrefetchPolicy> parse_prefetch_policy(std::string_view name);
std::string_view prefetch_policy_name(PrefetchPolicy policy);

// How a request whose cached prefix continues on the host waits for its load-back
// (docs/hierarchical-cache.md, Load-back):
//   layer  it joins the next forward pass at once, and each layer's attention waits for that
//          layer's pages (HiCache's layer-by-layer overlap: the copy of the later layers
//          hides behind the compute of the earlier ones);
//   none   it is parked until the whole load has landed; the other requests step meanwhile.
enum class LoadOverlap : uint8_t { kLayer, kNone };
Result<LoadOverlap> parse_load_overlap(std::string_view name);
std::string_view load_overlap_name(LoadOverlap overlap);

// The hierarchical cache (SGLang HiCache's options; docs/hierarchical-cache.md).
struct HierarchicalCacheOptions {
  bool enabled = false;
  double ratio = 2.0;    // host pages = ratio x device pages, > 1
  double size_gb = 0.0;  // host pool in GB (1e9 bytes); overrides ratio when > 0
  WritePolicy write_policy = WritePolicy::kWriteThrough;
  int32_t write_through_threshold = 2;
  HostLayout layout = HostLayout::kLayerFirst;
  // How a model with KV memory of its own (--device cuda) copies pages to and from the host
  // pool; the CPU engine's copy threads have no other path (kKernel is refused there).
  CopyPath io_backend = CopyPath::kDirect;
  LoadOverlap load_overlap = LoadOverlap::kLayer;
  int32_t transfer_threads = 1;
  std::string storage_backend;       // "" (none), "file" or "redis"
  std::string storage_extra_config;  // JSON object or @file
  std::string storage_namespace;     // isolates models sharing one store (set by serve)
  PrefetchPolicy prefetch_policy = PrefetchPolicy::kBestEffort;
};

// Registers --enable-hierarchical-cache and --hicache-* (the host pool and the storage tier
// behind it) on `cmd`, bound to `options`, which must outlive the parse.
void add_hicache_flags(CLI::App& cmd, HierarchicalCacheOptions& options);

// Prefill/decode disaggregation (docs/pd-disaggregation.md, "Engine integration"). A
// prefill worker binds the control plane and computes prefills that decode workers order;
// a decode worker (or a mixed one given prefill peers) orders the uncached part of a
// request's prompt from the prefill worker the request names (RequestSpec::prefill_peer)
// and decodes; anything that goes wrong there ends in a local prefill.
enum class WorkerRole : uint8_t { kMixed, kPrefill, kDecode };
Result<WorkerRole> parse_worker_role(std::string_view name);
const char* worker_role_name(WorkerRole role);

struct PdOptions {
  WorkerRole role = WorkerRole::kMixed;
  std::string worker_id;                   // "" : made from the host name and a random suffix
  std::string bind;                        // prefill: ZeroMQ endpoint, "tcp://127.0.0.1:0"
  std::vector<std::string> prefill_peers;  // decode: prefill workers' endpoints
  std::string transport = "ucx";           // "ucx" | "storage"
  // UCX: how the prefill worker's bytes travel: "messages" (active messages, checked
  // against the registered pool and robust to a peer's death on tcp) or "put" (one-sided
  // puts of the merged page runs: zero-copy over RDMA). docs/kv-transfer.md.
  std::string ucx_data_path = "messages";
  std::string storage_backend;       // storage transport: "file" | "redis"
  std::string storage_extra_config;  // its options (JSON object or @file)
  // What makes two workers' pages interchangeable (model, dtype, page shape); set by serve.
  std::string kv_layout;
  int64_t heartbeat_ms = 500;
  int64_t peer_timeout_ms = 3'000;
  int64_t accept_timeout_ms = 5'000;
  int64_t stall_ms = 10'000;
  int64_t quarantine_ms = 10'000;
  int64_t order_deadline_ms = 60'000;  // a room's whole budget, order to PrefillDone
  // Prefill side: an order is rejected (OrderRejected, the decode worker prefills locally)
  // while more prompt tokens than this wait to be prefilled here.
  int64_t max_queued_prefill_tokens = 65'536;
  // A model with KV memory of its own (--device cuda): the transports read and write a
  // staging pool in page-locked host memory of this many tokens (at most the device pool's),
  // and the pages cross between it and the GPU through the model's copy device
  // (engine/pd_stage.h). A room larger than it is prefilled locally.
  int64_t stage_tokens = 32'768;

  bool enabled() const { return role == WorkerRole::kPrefill || !prefill_peers.empty(); }
};

// Registers --role and --pd-* on `cmd`, bound to `options`, which must outlive the parse.
// kv_layout is not a flag: serve derives it from the model.
void add_pd_flags(CLI::App& cmd, PdOptions& options);

// What GET /server_info says of a worker's disaggregation (Engine::pd_info()).
struct PdInfo {
  WorkerRole role = WorkerRole::kMixed;
  bool enabled = false;  // a control plane runs
  std::string worker_id;
  std::string endpoint;  // prefill: the bound control-plane endpoint
  std::string transport;
  std::vector<std::string> peers_alive;
};

struct EngineOptions {
  int32_t page_size = 16;            // tokens per KV page, in [1, 256]
  int32_t kv_cache_tokens = 65'536;  // device pool size in tokens (rounded down to pages)
  // --kv-cache-memory: the device pool's size in bytes instead (> 0; 0: kv_cache_tokens).
  // Scheduler::create turns it into kv_cache_tokens with the bytes of one page of the
  // model's shape and kv_dtype (scales included), so 8-bit pages hold about twice the
  // tokens of BF16 ones in the same memory (size_pool_by_memory).
  int64_t kv_cache_memory_bytes = 0;
  KvDtype kv_dtype = KvDtype::kF32;      // device pool dtype (--kv-cache-dtype)
  int32_t max_running_requests = 32;     // requests in the running batch, >= 1
  int32_t chunked_prefill_size = 2'048;  // prefill tokens per step at most, >= page_size
  // Step budgeting (engine/step_budget.h, docs/scheduling.md): a step that decodes carries
  // as much prefill as keeps it within the inter-token latency target, and at least
  // min_prefill_tokens. 0: auto (4.5 times the measured decode forward pass).
  double itl_target_ms = 0.0;       // --itl-target-ms, >= 0
  int32_t min_prefill_tokens = 64;  // --min-prefill-tokens, >= 1 (at most the chunk)
  int64_t priority_aging_ms = 100;  // --priority-aging-ms: waiting worth one priority point
  // A request whose prompt shares at least this many tokens, beyond what the cache holds,
  // with a prompt that a running request is still prefilling waits for those pages instead
  // of computing them beside it (SGLang's in-batch prefix caching; docs/scheduling.md).
  // --shared-prefill-wait-tokens, >= 0 (0: never wait).
  int32_t shared_prefill_wait_tokens = 64;
  // Overlapped steps (docs/scheduling.md): while a forward pass runs, the scheduler prepares
  // the next one when it needs nothing of this one's results but its tokens (every running
  // request decoding on), and reads this one's results while the next runs; the next step's
  // input tokens are filled in from this one's on the forward thread. SGLang's overlap
  // scheduler. --disable-overlap-schedule turns it off (every step prepared after the last
  // one was read).
  bool overlap_schedule = true;
  double max_pinned_ratio = 0.8;  // pinned pages / pool pages, in [0, 1]
  // Pins a client makes without the admin key (a message's cache_control): always soft,
  // their TTL capped, inside a budget of their own (engine/pin_policy.h).
  int64_t max_client_pin_ttl_ms = 300'000;  // --max-client-pin-ttl-s, >= 1 s
  // Client-pinned pages / pool pages, in [0, 1]. 0.5: one coding agent's breakpoints (Claude
  // Code marks ~27K tokens) fit the default 65,536-token pool with room to spare.
  double max_client_pinned_ratio = 0.5;
  HierarchicalCacheOptions hicache;
  int64_t tool_session_ttl_ms = 3'600'000;  // --tool-session-ttl-s
  // Records of sessions that hold nothing (no request running, nothing offloaded): at
  // most max_sessions (least recently used dropped), none idle past session_idle_ttl_ms.
  // The same bounds as the server's conversation records (server/conversations.h).
  int64_t max_sessions = 10'000;            // --max-conversations (alias --max-sessions), >= 0
  int64_t session_idle_ttl_ms = 3'600'000;  // --conversation-ttl-s (alias --session-ttl-s)
  // How the cache hashes blocks (docs/block-hashes.md): Strata's own, or vLLM's sha256_cbor
  // with the seed of the vLLM workers whose indexers it should match (their PYTHONHASHSEED).
  BlockHashAlgo prefix_caching_hash_algo = BlockHashAlgo::kStrata;  // --prefix-caching-hash-algo
  std::string prefix_caching_hash_seed;  // --prefix-caching-hash-seed ("": $PYTHONHASHSEED)
  PdOptions pd;
};

Status validate(const EngineOptions& options);

// A size in bytes: a number (a fraction allowed) with an optional unit, case-insensitive:
// B; KB, MB, GB, TB (powers of 1000); KiB, MiB, GiB, TiB and K, M, G, T (powers of 1024).
// kInvalidArgument for anything else, a size below one byte or above 2^62 bytes.
Result<int64_t> parse_byte_size(std::string_view text);

// With kv_cache_memory_bytes set: kv_cache_tokens = the whole pages of `page_bytes` (one
// page, all layers, K and V, scales included) that fit, times the page size. A budget
// below 4 pages is kInvalidArgument naming --kv-cache-memory. Nothing changes otherwise.
Status size_pool_by_memory(EngineOptions& options, size_t page_bytes);

// The hasher `options` choose. sha256_cbor's seed is prefix_caching_hash_seed, else the
// PYTHONHASHSEED environment variable, as vLLM reads it; kInvalidArgument without either,
// or with a seed for Strata's own hash.
Result<BlockHasher> block_hasher_for(const EngineOptions& options);

// Registers the engine's own flags (the KV pool, scheduling, pins, conversation and tool
// session bounds) on `cmd`, bound to `options`, which must outlive the parse. Flags in
// seconds fill the _ms fields; --chunked-prefill-size is raised to --page-size when
// smaller. The sub-structs have their own: add_hicache_flags, add_pd_flags.
void add_engine_flags(CLI::App& cmd, EngineOptions& options);

// Counters the server exports (monotonic unless noted).
struct EngineCounters {
  uint64_t requests_finished = 0;
  uint64_t requests_cancelled = 0;
  uint64_t requests_retracted = 0;
  uint64_t prompt_tokens = 0;
  uint64_t generated_tokens = 0;
  uint64_t cached_prompt_tokens = 0;
  // Blocks unpinned by the no-deadlock rule; of which because the host tier could not hold
  // the pinned pages (the rest: no room on the device, without a host tier).
  uint64_t auto_unpinned_blocks = 0;
  // Pins refused for a pin budget (--max-pinned-ratio, --max-client-pinned-ratio): calls
  // refused whole, calls cut to the longest prefix that fits (PinCommand::longest_prefix),
  // and the blocks those left unpinned.
  uint64_t pins_refused = 0;
  uint64_t pins_cut = 0;
  uint64_t pin_blocks_refused = 0;
  uint64_t auto_unpinned_host_blocks = 0;
  // Times queued requests let go of the prefix they had loaded back, for a request ahead of
  // them that had no room otherwise.
  uint64_t queued_holds_released = 0;
  uint64_t forward_steps = 0;
  uint64_t overlapped_steps = 0;    // forward passes prepared while the one before ran
  uint64_t prompt_logits_hits = 0;  // full hits sampled from remembered logits (no forward)
  // Requests that waited for a running request to prefill the prompt they share (once each).
  uint64_t shared_prefill_waits = 0;
  uint64_t cached_host_tokens = 0;     // prompt tokens loaded back from the host
  uint64_t cached_storage_tokens = 0;  // prompt tokens prefetched from storage
  uint64_t loads_failed = 0;           // load-backs refused for want of device pages
  uint64_t loads_overlapped = 0;       // load-backs read layer by layer by the prefill
  // Of which the copy failed or stalled under the pass: the request stepped back and
  // computed its prefix instead.
  uint64_t loads_abandoned = 0;
  uint64_t prefetches_started = 0;
  uint64_t prefetch_pages_read = 0;
  uint64_t storage_pages_written = 0;
  uint64_t storage_faults = 0;           // items a backend failed (down, full, corrupt)
  uint64_t copy_faults = 0;              // device <-> host copy jobs that failed
  uint64_t copies_stalled = 0;           // copy jobs reported stalled (each once)
  uint64_t prefetch_timeouts = 0;        // requests that stopped waiting for a prefetch
  uint64_t tool_sessions_expired = 0;    // offloaded sessions released by the TTL
  uint64_t session_records_dropped = 0;  // idle tool-session records dropped (cap, TTL)
  uint64_t requests_preempted = 0;       // running requests retracted for a better class
  uint64_t restores_made_room = 0;       // tool_end restores that retracted requests for room
  int64_t prefill_budget_tokens = 0;     // gauge: the last step's prefill budget
  int64_t running = 0;                   // gauge
  int64_t waiting = 0;                   // gauge
  int64_t free_pages = 0;                // gauge: device pages on the free list
  int64_t evictable_pages = 0;           // gauge: device pages the tree could evict now
  // gauge: device pages computed again after eviction for room removed them, about those
  // of the last ten seconds (RadixTree::recomputed_pages_recent, rounded)
  int64_t recomputed_pages_recent = 0;
  int64_t queued_prefill_tokens = 0;  // gauge: prompt tokens waiting or still to prefill
  // gauge: tool sessions by state (RUNNABLE, OFFLOADING, OFFLOADED, RESTORING)
  std::array<int64_t, 4> tool_sessions_by_state{};
  // Prefill/decode disaggregation. Decode side: rooms ordered, completed, failed (the
  // request then prefilled locally) by reason, KV received. Prefill side: orders taken,
  // rejected, finished, failed or aborted, KV sent.
  uint64_t pd_rooms_ordered = 0;
  uint64_t pd_rooms_done = 0;
  std::array<uint64_t, 9> pd_fallbacks{};  // by PdFallback
  uint64_t pd_pages_received = 0;
  uint64_t pd_bytes_received = 0;
  uint64_t pd_orders_accepted = 0;
  uint64_t pd_orders_rejected = 0;
  uint64_t pd_orders_done = 0;
  uint64_t pd_orders_failed = 0;
  uint64_t pd_pages_sent = 0;
  uint64_t pd_bytes_sent = 0;
  // Through a stage (--device cuda): pages copied between the device and the stage, and
  // copies that failed (the room then failed: prefilled locally on the decode side).
  uint64_t pd_stage_pages_copied = 0;
  uint64_t pd_stage_copy_faults = 0;
  int64_t pd_rooms_active = 0;       // gauge
  int64_t pd_quarantined_pages = 0;  // gauge: pages of failed rooms not yet reusable
  int64_t pd_peers_alive = 0;        // gauge
};

// Why a decode worker prefilled a request locally after all (EngineCounters::pd_fallbacks).
enum class PdFallback : uint8_t {
  kPeerUnavailable,  // the named prefill worker is unknown or not alive
  kRejected,         // it rejected the order (overloaded)
  kTimeout,          // accept, stall or overall deadline
  kPeerDead,         // it died or restarted
  kPrefillFailed,    // it reported a failure
  kProtocolError,
  kTransfer,       // the pages could not be received (storage read)
  kSendFailed,     // the order could not be sent
  kStageTooSmall,  // the room is larger than the whole P/D stage (--pd-stage-tokens)
};
inline constexpr size_t kPdFallbacks = 9;
static_assert(kPdFallbacks == std::tuple_size_v<decltype(EngineCounters::pd_fallbacks)>);
const char* pd_fallback_name(PdFallback reason);

}  // namespace strata
