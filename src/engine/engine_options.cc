#include "engine/engine_options.h"

#include <string>

namespace strata {

Result<PrefetchPolicy> parse_prefetch_policy(std::string_view name) {
  if (name == "best_effort") return PrefetchPolicy::kBestEffort;
  if (name == "wait_complete") return PrefetchPolicy::kWaitComplete;
  if (name == "timeout") return PrefetchPolicy::kTimeout;
  return make_error(ErrorCode::kInvalidArgument, "unknown prefetch policy '" + std::string(name) +
                                                     "' (best_effort, wait_complete or timeout)");
}

Status validate(const EngineOptions& o) {
  auto bad = [](std::string m) { return make_error(ErrorCode::kInvalidArgument, std::move(m)); };
  if (o.page_size < 1 || o.page_size > 256) return bad("--page-size must be in [1, 256]");
  if (o.kv_cache_tokens < o.page_size * 4) {
    return bad("--kv-cache-tokens must hold at least 4 pages (" + std::to_string(o.page_size * 4) +
               " tokens)");
  }
  if (o.max_running_requests < 1) return bad("--max-running-requests must be >= 1");
  if (o.chunked_prefill_size < o.page_size) {
    return bad("--chunked-prefill-size must be at least the page size");
  }
  if (!(o.itl_target_ms >= 0.0 && o.itl_target_ms <= 60'000.0)) {
    return bad("--itl-target-ms must be in [0, 60000] (0: auto)");
  }
  if (o.min_prefill_tokens < 1) return bad("--min-prefill-tokens must be >= 1");
  if (o.priority_aging_ms < 1) return bad("--priority-aging-ms must be >= 1");
  if (!(o.max_pinned_ratio >= 0.0 && o.max_pinned_ratio <= 1.0)) {
    return bad("--max-pinned-ratio must be in [0, 1]");
  }
  if (!(o.max_client_pinned_ratio >= 0.0 && o.max_client_pinned_ratio <= 1.0)) {
    return bad("--max-client-pinned-ratio must be in [0, 1]");
  }
  if (o.max_client_pin_ttl_ms < 1000) return bad("--max-client-pin-ttl-s must be >= 1");
  if (o.max_sessions < 0) return bad("--max-sessions must be >= 0");
  if (o.session_idle_ttl_ms < 1000) return bad("--session-ttl-s must be >= 1");
  const HierarchicalCacheOptions& h = o.hicache;
  if (h.enabled) {
    if (h.size_gb <= 0 && !(h.ratio > 1.0 && h.ratio <= 1000.0)) {
      return bad("--hicache-ratio must be > 1 (the host pool is larger than the device pool)");
    }
    if (h.size_gb < 0 || h.size_gb > 1e5) return bad("--hicache-size must be in (0, 1e5] GB");
    if (h.write_through_threshold < 1) return bad("the write-through threshold must be >= 1");
    if (h.transfer_threads < 1 || h.transfer_threads > 16) {
      return bad("transfer threads must be in [1, 16]");
    }
  } else if (!h.storage_backend.empty()) {
    return bad("--hicache-storage-backend needs --enable-hierarchical-cache");
  }
  return {};
}

}  // namespace strata
