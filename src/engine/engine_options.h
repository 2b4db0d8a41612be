// What an engine is built with (EngineOptions, validated by validate()) and what it counts
// (EngineCounters). Public: the server, the bench and `strata serve` set and read these.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "cache/write_policy.h"
#include "common/result.h"
#include "memory/host_kv_pool.h"  // HostLayout
#include "memory/kv_dtype.h"

namespace strata {

// When a request whose prefix is in storage stops waiting for the prefetch.
enum class PrefetchPolicy : uint8_t { kBestEffort, kWaitComplete, kTimeout };
Result<PrefetchPolicy> parse_prefetch_policy(std::string_view name);

// The hierarchical cache (SGLang HiCache's options; docs/hierarchical-cache.md).
struct HierarchicalCacheOptions {
  bool enabled = false;
  double ratio = 2.0;    // host pages = ratio x device pages, > 1
  double size_gb = 0.0;  // host pool in GB (1e9 bytes); overrides ratio when > 0
  WritePolicy write_policy = WritePolicy::kWriteThrough;
  int32_t write_through_threshold = 2;
  HostLayout layout = HostLayout::kLayerFirst;
  int32_t transfer_threads = 1;
  std::string storage_backend;       // "" (none), "file" or "redis"
  std::string storage_extra_config;  // JSON object or @file
  std::string storage_namespace;     // isolates models sharing one store (set by serve)
  PrefetchPolicy prefetch_policy = PrefetchPolicy::kBestEffort;
};

struct EngineOptions {
  int32_t page_size = 16;                // tokens per KV page, in [1, 256]
  int32_t kv_cache_tokens = 65'536;      // device pool size in tokens (rounded down to pages)
  KvDtype kv_dtype = KvDtype::kF32;      // device pool dtype
  int32_t max_running_requests = 32;     // requests in the running batch, >= 1
  int32_t chunked_prefill_size = 2'048;  // prefill tokens per step at most, >= page_size
  // Step budgeting (engine/step_budget.h, docs/scheduling.md): a step that decodes carries
  // as much prefill as keeps it within the inter-token latency target, and at least
  // min_prefill_tokens. 0: auto (4.5 times the measured decode forward pass).
  double itl_target_ms = 0.0;       // --itl-target-ms, >= 0
  int32_t min_prefill_tokens = 64;  // --min-prefill-tokens, >= 1 (at most the chunk)
  int64_t priority_aging_ms = 100;  // --priority-aging-ms: waiting worth one priority point
  double max_pinned_ratio = 0.8;    // pinned pages / pool pages, in [0, 1]
  // Pins a client makes without the admin key (a message's cache_control): always soft,
  // their TTL capped, inside a budget of their own (engine/pin_policy.h).
  int64_t max_client_pin_ttl_ms = 300'000;  // --max-client-pin-ttl-s, >= 1 s
  double max_client_pinned_ratio = 0.2;     // client-pinned pages / pool pages, in [0, 1]
  HierarchicalCacheOptions hicache;
  int64_t tool_session_ttl_ms = 3'600'000;  // --tool-session-ttl-s
  // Records of sessions that hold nothing (no request running, nothing offloaded): at
  // most max_sessions (least recently used dropped), none idle past session_idle_ttl_ms.
  int64_t max_sessions = 10'000;            // --max-sessions, >= 0
  int64_t session_idle_ttl_ms = 3'600'000;  // --session-ttl-s
};

Status validate(const EngineOptions& options);

// Counters the server exports (monotonic unless noted).
struct EngineCounters {
  uint64_t requests_finished = 0;
  uint64_t requests_cancelled = 0;
  uint64_t requests_retracted = 0;
  uint64_t prompt_tokens = 0;
  uint64_t generated_tokens = 0;
  uint64_t cached_prompt_tokens = 0;
  uint64_t auto_unpinned_blocks = 0;
  uint64_t forward_steps = 0;
  uint64_t prompt_logits_hits = 0;     // full hits sampled from remembered logits (no forward)
  uint64_t cached_host_tokens = 0;     // prompt tokens loaded back from the host
  uint64_t cached_storage_tokens = 0;  // prompt tokens prefetched from storage
  uint64_t loads_failed = 0;           // load-backs refused for want of device pages
  uint64_t prefetches_started = 0;
  uint64_t prefetch_pages_read = 0;
  uint64_t storage_pages_written = 0;
  uint64_t storage_faults = 0;           // items a backend failed (down, full, corrupt)
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
  int64_t queued_prefill_tokens = 0;     // gauge: prompt tokens waiting or still to prefill
  // gauge: tool sessions by state (RUNNABLE, OFFLOADING, OFFLOADED, RESTORING)
  std::array<int64_t, 4> tool_sessions_by_state{};
};

}  // namespace strata
