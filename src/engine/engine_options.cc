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

Result<WorkerRole> parse_worker_role(std::string_view name) {
  if (name == "mixed") return WorkerRole::kMixed;
  if (name == "prefill") return WorkerRole::kPrefill;
  if (name == "decode") return WorkerRole::kDecode;
  return make_error(ErrorCode::kInvalidArgument,
                    "unknown role '" + std::string(name) + "' (mixed, prefill or decode)");
}

const char* worker_role_name(WorkerRole role) {
  switch (role) {
    case WorkerRole::kMixed:
      return "mixed";
    case WorkerRole::kPrefill:
      return "prefill";
    case WorkerRole::kDecode:
      return "decode";
  }
  return "mixed";
}

const char* pd_fallback_name(PdFallback reason) {
  switch (reason) {
    case PdFallback::kPeerUnavailable:
      return "peer_unavailable";
    case PdFallback::kRejected:
      return "rejected";
    case PdFallback::kTimeout:
      return "timeout";
    case PdFallback::kPeerDead:
      return "peer_dead";
    case PdFallback::kPrefillFailed:
      return "prefill_failed";
    case PdFallback::kProtocolError:
      return "protocol_error";
    case PdFallback::kTransfer:
      return "transfer";
    case PdFallback::kSendFailed:
      return "send_failed";
  }
  return "protocol_error";
}

namespace {

Status validate_pd(const PdOptions& p) {
  auto bad = [](std::string m) { return make_error(ErrorCode::kInvalidArgument, std::move(m)); };
  if (p.role == WorkerRole::kPrefill && !p.prefill_peers.empty()) {
    return bad("--pd-prefill-peer is for decode workers, not --role prefill");
  }
  if (p.role == WorkerRole::kDecode && p.prefill_peers.empty()) {
    return bad("--role decode needs at least one --pd-prefill-peer ENDPOINT");
  }
  if (p.role != WorkerRole::kPrefill && !p.bind.empty()) {
    return bad("--pd-bind is for --role prefill");
  }
  if (p.transport != "ucx" && p.transport != "storage") {
    return bad("--pd-transport must be ucx or storage");
  }
  if (p.ucx_data_path != "messages" && p.ucx_data_path != "put") {
    return bad("--pd-ucx-data-path must be messages or put");
  }
  if (p.transport == "storage" && p.enabled() && p.storage_backend.empty()) {
    return bad("--pd-transport storage needs --pd-storage-backend file|redis");
  }
  if (p.heartbeat_ms < 5 || p.heartbeat_ms > 60'000) return bad("--pd-heartbeat-ms: [5, 60000]");
  if (p.peer_timeout_ms < 2 * p.heartbeat_ms || p.peer_timeout_ms > 600'000) {
    return bad("--pd-peer-timeout-ms must be in [2 x heartbeat, 600000]");
  }
  for (int64_t v : {p.accept_timeout_ms, p.stall_ms}) {
    if (v < 1 || v > 600'000) return bad("PD timeouts must be in [1, 600000] ms");
  }
  if (p.quarantine_ms < 0 || p.quarantine_ms > 600'000) {
    return bad("--pd-quarantine-ms must be in [0, 600000]");
  }
  if (p.order_deadline_ms < 1 || p.order_deadline_ms > 3'600'000) {
    return bad("--pd-order-deadline-ms must be in [1, 3600000]");
  }
  if (p.max_queued_prefill_tokens < 1) return bad("--pd-max-queued-prefill-tokens must be >= 1");
  return {};
}

}  // namespace

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
  return validate_pd(o.pd);
}

}  // namespace strata
