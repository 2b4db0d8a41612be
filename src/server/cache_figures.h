// Every figure of the cache's state, described once: the struct member that counts it
// (engine/cache_control.h: CacheState, which passes the tree's TreeStats and the engine's
// EngineCounters whole), where GET /cache/state puts it, and which /metrics sample shows
// it. The JSON of /cache/state (cache_state_json) and the cache's gauges
// (Metrics::set_cache) are both written by one loop over kCacheFigures, so a counter is
// added in one row here. Every member of TreeStats has a row, shown or said to be internal
// (tests/server/cache_figures_test.cc fails for one without).
//
// Thread: constants and pure functions.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>
#include <variant>

#include <nlohmann/json.hpp>

#include "engine/cache_control.h"

namespace strata {

// Where /cache/state puts a figure: an object of the answer. kHost and kStorage are null
// without a host tier or a storage backend (and their figures are then not written).
enum class CacheSection : uint8_t {
  kNone,                  // not in the JSON (a metric only, or internal)
  kTop,                   // the answer itself
  kDevice,                // "device"
  kHost,                  // "host"
  kStorage,               // "storage"
  kHits,                  // "hits"
  kEvictions,             // "evictions"
  kAutoUnpinnedByReason,  // "evictions"."auto_unpinned_blocks_by_reason"
  kRequests,              // "requests"
};

enum class MetricKind : uint8_t { kCounter, kGauge };

// The /metrics families the cache's figures fill, in the order they are registered.
enum class CacheMetric : uint8_t {
  kKvPages,
  kRequestsRunning,
  kRequestsWaiting,
  kEvictedPages,
  kAutoUnpinnedBlocks,
  kExpiredPins,
  kHostKvPages,
  kTierEvents,
  kRecomputedPages,
  kKvPageBytes,
  kKvTokensPerGb,
  kNone,  // no metric
};

struct CacheMetricFamily {
  std::string_view name;
  std::string_view help;
  std::string_view label;  // the label that tells its samples apart ("": one sample)
  MetricKind kind = MetricKind::kGauge;
};

// Indexed by CacheMetric (kNone excluded). Every one is a gauge: the engine's counts are
// read whole at each scrape.
inline constexpr std::array<CacheMetricFamily, 11> kCacheMetricFamilies = {{
    {"strata_kv_pages",
     "Device KV pages by state (total, free, used, cached, pinned, protected, evictable)", "state",
     MetricKind::kGauge},
    {"strata_requests_running", "Requests in the running batch", "", MetricKind::kGauge},
    {"strata_requests_waiting", "Requests waiting for admission", "", MetricKind::kGauge},
    {"strata_kv_evicted_pages_total", "Pages evicted from the device pool since start", "",
     MetricKind::kGauge},
    {"strata_auto_unpinned_blocks_total",
     "Blocks unpinned by the scheduler's no-deadlock rule, by the tier that had no room "
     "(device_room: without a host tier; host_room: the host could not hold pinned pages)",
     "reason", MetricKind::kGauge},
    {"strata_expired_pins_total", "Soft pins dropped when their TTL ran out", "",
     MetricKind::kGauge},
    {"strata_host_kv_pages", "Host KV pages by state (hierarchical cache)", "state",
     MetricKind::kGauge},
    {"strata_tier_events_total",
     "Hierarchical cache and tool-session events since start (pages moved, storage faults, "
     "sessions expired, ...)",
     "event", MetricKind::kGauge},
    {"strata_kv_recomputed_pages_total",
     "Device pages computed again after eviction for want of room had removed them (the pool "
     "too small for its working set)",
     "", MetricKind::kGauge},
    {"strata_kv_page_bytes",
     "Bytes of one KV page (all layers, K and V, the 8-bit dtypes' scales included), by tier",
     "tier", MetricKind::kGauge},
    {"strata_kv_tokens_per_gb", "Tokens whose KV one GB (1e9 bytes) of pages holds, by tier",
     "tier", MetricKind::kGauge},
}};

// The member a figure reads. A Pool member reads the pool of the figure's section (the
// host pool in kHost, else the device pool).
using CacheFigureSource =
    std::variant<int32_t TreeStats::*, bool TreeStats::*, int64_t TreeStats::*,
                 uint64_t TreeStats::*, int64_t CacheState::Pool::*,
                 uint64_t CacheState::Storage::*, int64_t EngineCounters::*,
                 uint64_t EngineCounters::*, int64_t CacheState::*>;

// How a figure's value follows from its member.
enum class CacheDerivation : uint8_t {
  kAsIs,
  kTokens,         // pages times the page size
  kLessProtected,  // TreeStats::cached_pages less TreeStats::protected_pages
  kLessHostRoom,   // EngineCounters::auto_unpinned_blocks less auto_unpinned_host_blocks
  kTokensPerGb,    // the page size times 1e9 / Pool::page_bytes (0 for an empty pool)
};

struct CacheFigure {
  CacheFigureSource source;
  CacheSection section = CacheSection::kNone;
  std::string_view key;  // its key in its section
  CacheMetric metric = CacheMetric::kNone;
  std::string_view label;  // its value of the family's label
  CacheDerivation derivation = CacheDerivation::kAsIs;
  // The sample is written even when the section is null: the engine counts it (zero)
  // without a storage backend, and /metrics has always shown it.
  bool metric_without_section = false;
  // Why a figure is neither in the JSON nor in /metrics (empty for a shown one).
  std::string_view internal;
};

// The figures, in the order their samples are first added to each family (a family lists
// its samples in that order). The JSON's key order is its own (sorted).
inline constexpr auto kCacheFigures = std::to_array<CacheFigure>({
    {.source = &TreeStats::page_size, .section = CacheSection::kTop, .key = "page_size"},
    {.source = &TreeStats::num_nodes, .section = CacheSection::kTop, .key = "nodes_count"},
    // The device pool and the tree on it.
    {.source = &CacheState::Pool::capacity_pages,
     .section = CacheSection::kDevice,
     .key = "capacity_pages",
     .metric = CacheMetric::kKvPages,
     .label = "total"},
    {.source = &CacheState::Pool::capacity_pages,
     .section = CacheSection::kDevice,
     .key = "capacity_tokens",
     .derivation = CacheDerivation::kTokens},
    {.source = &CacheState::Pool::free_pages,
     .section = CacheSection::kDevice,
     .key = "free_pages",
     .metric = CacheMetric::kKvPages,
     .label = "free"},
    {.source = &CacheState::Pool::used_pages,
     .section = CacheSection::kDevice,
     .key = "used_pages",
     .metric = CacheMetric::kKvPages,
     .label = "used"},
    {.source = &TreeStats::cached_pages,
     .section = CacheSection::kDevice,
     .key = "cached_pages",
     .metric = CacheMetric::kKvPages,
     .label = "cached"},
    {.source = &CacheState::request_pages,
     .section = CacheSection::kDevice,
     .key = "request_pages"},
    {.source = &TreeStats::pinned_blocks,
     .section = CacheSection::kDevice,
     .key = "pinned_blocks",
     .metric = CacheMetric::kKvPages,
     .label = "pinned"},
    {.source = &TreeStats::soft_pinned_blocks,
     .section = CacheSection::kDevice,
     .key = "soft_pinned_blocks"},
    // What the pin budgets refused (engine/pin_policy.h): pin calls refused whole, calls cut
    // to the longest prefix that fits, and the blocks both left unpinned.
    {.source = &EngineCounters::pins_refused,
     .section = CacheSection::kDevice,
     .key = "pins_refused_total"},
    {.source = &EngineCounters::pins_cut,
     .section = CacheSection::kDevice,
     .key = "pins_cut_total"},
    {.source = &EngineCounters::pin_blocks_refused,
     .section = CacheSection::kDevice,
     .key = "pin_blocks_refused_total"},
    {.source = &TreeStats::protected_pages,
     .section = CacheSection::kDevice,
     .key = "protected_pages",
     .metric = CacheMetric::kKvPages,
     .label = "protected"},
    {.source = &TreeStats::cached_pages,
     .section = CacheSection::kDevice,
     .key = "evictable_pages",
     .metric = CacheMetric::kKvPages,
     .label = "evictable",
     .derivation = CacheDerivation::kLessProtected},
    {.source = &TreeStats::locked_nodes, .section = CacheSection::kDevice, .key = "locked_nodes"},
    {.source = &CacheState::Pool::page_bytes,
     .section = CacheSection::kDevice,
     .key = "page_bytes",
     .metric = CacheMetric::kKvPageBytes,
     .label = "device"},
    {.source = &CacheState::Pool::page_bytes,
     .section = CacheSection::kDevice,
     .key = "tokens_per_gb",
     .metric = CacheMetric::kKvTokensPerGb,
     .label = "device",
     .derivation = CacheDerivation::kTokensPerGb},
    // The host pool (hierarchical cache).
    {.source = &CacheState::Pool::capacity_pages,
     .section = CacheSection::kHost,
     .key = "capacity_pages",
     .metric = CacheMetric::kHostKvPages,
     .label = "total"},
    {.source = &CacheState::Pool::capacity_pages,
     .section = CacheSection::kHost,
     .key = "capacity_tokens",
     .derivation = CacheDerivation::kTokens},
    {.source = &CacheState::Pool::free_pages,
     .section = CacheSection::kHost,
     .key = "free_pages",
     .metric = CacheMetric::kHostKvPages,
     .label = "free"},
    {.source = &CacheState::Pool::used_pages, .section = CacheSection::kHost, .key = "used_pages"},
    {.source = &CacheState::Pool::page_bytes,
     .section = CacheSection::kHost,
     .key = "page_bytes",
     .metric = CacheMetric::kKvPageBytes,
     .label = "host"},
    {.source = &CacheState::Pool::page_bytes,
     .section = CacheSection::kHost,
     .key = "tokens_per_gb",
     .metric = CacheMetric::kKvTokensPerGb,
     .label = "host",
     .derivation = CacheDerivation::kTokensPerGb},
    {.source = &TreeStats::host_cached_pages,
     .section = CacheSection::kHost,
     .key = "cached_pages",
     .metric = CacheMetric::kHostKvPages,
     .label = "cached"},
    {.source = &TreeStats::host_only_pages,
     .section = CacheSection::kHost,
     .key = "host_only_pages",
     .metric = CacheMetric::kHostKvPages,
     .label = "host_only"},
    {.source = &TreeStats::host_protected_pages,
     .section = CacheSection::kHost,
     .key = "protected_pages",
     .metric = CacheMetric::kHostKvPages,
     .label = "protected"},
    {.source = &TreeStats::host_evictable_pages,
     .section = CacheSection::kHost,
     .key = "evictable_pages",
     .metric = CacheMetric::kHostKvPages,
     .label = "evictable"},
    {.source = &TreeStats::io_pending_nodes,
     .section = CacheSection::kHost,
     .key = "transfers_in_flight"},
    // Pages that left a tier, and pins that went.
    {.source = &TreeStats::evicted_pages_total,
     .section = CacheSection::kEvictions,
     .key = "evicted_pages_total",
     .metric = CacheMetric::kEvictedPages},
    {.source = &TreeStats::recomputed_pages_total,
     .section = CacheSection::kEvictions,
     .key = "recomputed_pages_total",
     .metric = CacheMetric::kRecomputedPages},
    {.source = &EngineCounters::recomputed_pages_recent,
     .section = CacheSection::kEvictions,
     .key = "recomputed_pages_recent"},
    {.source = &TreeStats::demoted_pages_total,
     .section = CacheSection::kEvictions,
     .key = "demoted_pages_total",
     .metric = CacheMetric::kTierEvents,
     .label = "demoted_pages"},
    {.source = &TreeStats::backed_up_pages_total,
     .section = CacheSection::kEvictions,
     .key = "backed_up_pages_total",
     .metric = CacheMetric::kTierEvents,
     .label = "backed_up_pages"},
    {.source = &TreeStats::loaded_pages_total,
     .section = CacheSection::kEvictions,
     .key = "loaded_pages_total",
     .metric = CacheMetric::kTierEvents,
     .label = "loaded_pages"},
    {.source = &TreeStats::host_evicted_pages_total,
     .section = CacheSection::kEvictions,
     .key = "host_evicted_pages_total",
     .metric = CacheMetric::kTierEvents,
     .label = "host_evicted_pages"},
    {.source = &TreeStats::backups_skipped_total,
     .section = CacheSection::kEvictions,
     .key = "backups_skipped_total"},
    {.source = &EngineCounters::loads_failed,
     .section = CacheSection::kEvictions,
     .key = "loads_failed_total"},
    {.source = &EngineCounters::loads_overlapped,
     .section = CacheSection::kEvictions,
     .key = "loads_overlapped_total"},
    {.source = &EngineCounters::loads_abandoned,
     .section = CacheSection::kEvictions,
     .key = "loads_abandoned_total"},
    {.source = &EngineCounters::auto_unpinned_blocks,
     .section = CacheSection::kEvictions,
     .key = "auto_unpinned_blocks_total"},
    {.source = &TreeStats::expired_pins_total,
     .section = CacheSection::kEvictions,
     .key = "expired_pins_total",
     .metric = CacheMetric::kExpiredPins},
    {.source = &EngineCounters::auto_unpinned_blocks,
     .section = CacheSection::kAutoUnpinnedByReason,
     .key = "device_room",
     .metric = CacheMetric::kAutoUnpinnedBlocks,
     .label = "device_room",
     .derivation = CacheDerivation::kLessHostRoom},
    {.source = &EngineCounters::auto_unpinned_host_blocks,
     .section = CacheSection::kAutoUnpinnedByReason,
     .key = "host_room",
     .metric = CacheMetric::kAutoUnpinnedBlocks,
     .label = "host_room"},
    // Prompt tokens served from each tier.
    {.source = &TreeStats::match_calls, .section = CacheSection::kHits, .key = "match_calls"},
    {.source = &TreeStats::matched_pages_total,
     .section = CacheSection::kHits,
     .key = "matched_tokens_total",
     .derivation = CacheDerivation::kTokens},
    {.source = &EngineCounters::cached_prompt_tokens,
     .section = CacheSection::kHits,
     .key = "cached_prompt_tokens_total"},
    {.source = &EngineCounters::cached_host_tokens,
     .section = CacheSection::kHits,
     .key = "cached_host_tokens_total",
     .metric = CacheMetric::kTierEvents,
     .label = "cached_host_tokens"},
    {.source = &EngineCounters::cached_storage_tokens,
     .section = CacheSection::kHits,
     .key = "cached_storage_tokens_total",
     .metric = CacheMetric::kTierEvents,
     .label = "cached_storage_tokens"},
    {.source = &EngineCounters::prompt_tokens,
     .section = CacheSection::kHits,
     .key = "prompt_tokens_total"},
    // Storage (L3): the engine's traffic, then the backend's own counters.
    {.source = &TreeStats::stored_pages,
     .section = CacheSection::kStorage,
     .key = "stored_pages_known"},
    {.source = &EngineCounters::storage_pages_written,
     .section = CacheSection::kStorage,
     .key = "pages_written_total",
     .metric = CacheMetric::kTierEvents,
     .label = "storage_pages_written",
     .metric_without_section = true},
    {.source = &EngineCounters::storage_faults,
     .section = CacheSection::kStorage,
     .key = "faults_total",
     .metric = CacheMetric::kTierEvents,
     .label = "storage_faults",
     .metric_without_section = true},
    {.source = &EngineCounters::copy_faults,
     .section = CacheSection::kHost,
     .key = "copy_faults_total",
     .metric = CacheMetric::kTierEvents,
     .label = "copy_faults",
     .metric_without_section = true},
    {.source = &EngineCounters::copies_stalled,
     .section = CacheSection::kHost,
     .key = "copies_stalled_total",
     .metric = CacheMetric::kTierEvents,
     .label = "copies_stalled",
     .metric_without_section = true},
    {.source = &EngineCounters::prefetch_pages_read,
     .section = CacheSection::kStorage,
     .key = "prefetch_pages_read_total",
     .metric = CacheMetric::kTierEvents,
     .label = "prefetch_pages_read",
     .metric_without_section = true},
    {.source = &EngineCounters::prefetch_timeouts,
     .section = CacheSection::kStorage,
     .key = "prefetch_timeouts_total",
     .metric = CacheMetric::kTierEvents,
     .label = "prefetch_timeouts",
     .metric_without_section = true},
    {.source = &EngineCounters::prefetches_started,
     .section = CacheSection::kStorage,
     .key = "prefetches_total"},
    {.source = &CacheState::Storage::get_hits,
     .section = CacheSection::kStorage,
     .key = "get_hits"},
    {.source = &CacheState::Storage::get_misses,
     .section = CacheSection::kStorage,
     .key = "get_misses"},
    {.source = &CacheState::Storage::get_errors,
     .section = CacheSection::kStorage,
     .key = "get_errors"},
    {.source = &CacheState::Storage::corrupt_values,
     .section = CacheSection::kStorage,
     .key = "corrupt_values"},
    // Values stored by a server whose pages are of another KV dtype or block order (a fleet
    // mid-upgrade sharing a store): kept, never read as this server's (issue 54).
    {.source = &CacheState::Storage::foreign_format_values,
     .section = CacheSection::kStorage,
     .key = "foreign_format_values",
     .metric = CacheMetric::kTierEvents,
     .label = "storage_foreign_format_values"},
    {.source = &CacheState::Storage::set_written,
     .section = CacheSection::kStorage,
     .key = "set_written"},
    {.source = &CacheState::Storage::set_skipped_existing,
     .section = CacheSection::kStorage,
     .key = "set_skipped_existing"},
    {.source = &CacheState::Storage::set_errors,
     .section = CacheSection::kStorage,
     .key = "set_errors"},
    {.source = &CacheState::Storage::bytes_read,
     .section = CacheSection::kStorage,
     .key = "bytes_read"},
    {.source = &CacheState::Storage::bytes_written,
     .section = CacheSection::kStorage,
     .key = "bytes_written"},
    // Requests now.
    {.source = &EngineCounters::running,
     .section = CacheSection::kRequests,
     .key = "running",
     .metric = CacheMetric::kRequestsRunning},
    {.source = &EngineCounters::waiting,
     .section = CacheSection::kRequests,
     .key = "waiting",
     .metric = CacheMetric::kRequestsWaiting},
    // Tool sessions: metrics only.
    {.source = &EngineCounters::tool_sessions_expired,
     .section = CacheSection::kNone,
     .metric = CacheMetric::kTierEvents,
     .label = "tool_sessions_expired"},
    {.source = &EngineCounters::session_records_dropped,
     .section = CacheSection::kNone,
     .metric = CacheMetric::kTierEvents,
     .label = "session_records_dropped"},
    // The tree's counters that neither says.
    {.source = &TreeStats::hierarchical,
     .section = CacheSection::kNone,
     .internal = "a non-null host section says it"},
    {.source = &TreeStats::host_capacity_pages,
     .section = CacheSection::kNone,
     .internal = "the host pool's capacity_pages says it"},
    {.source = &TreeStats::unevictable_pages,
     .section = CacheSection::kNone,
     .internal = "admission's arithmetic (engine/scheduler.cc)"},
    {.source = &TreeStats::evictable_pages,
     .section = CacheSection::kNone,
     .internal = "the scheduler's load gauge: GET /load device.evictable_pages"},
    {.source = &TreeStats::outstanding_locks,
     .section = CacheSection::kNone,
     .internal = "lock receipts held: checked by the audits, not shown"},
    {.source = &TreeStats::inserted_pages_total,
     .section = CacheSection::kNone,
     .internal = "counted by the tree, shown nowhere yet"},
});

// A figure's value; unsigned counters stay unsigned.
using CacheFigureValue = std::variant<int64_t, uint64_t>;

// Whether `state` has the figure's section (host and storage are optional).
bool has_section(const CacheState& state, CacheSection section);
// Precondition: has_section(state, figure.section).
CacheFigureValue cache_figure_value(const CacheState& state, const CacheFigure& figure);
// The JSON path of a section: {} for kTop, {"evictions", "auto_unpinned_blocks_by_reason"}
// for kAutoUnpinnedByReason.
std::array<std::string_view, 2> section_path(CacheSection section);

// GET /cache/state without the tree: every figure in its section, the host's write policy
// and layout, the storage backend's name; "host" and "storage" null when absent.
nlohmann::json cache_state_json(const CacheState& state);

}  // namespace strata
