#include "engine/engine_options.h"

#include <cctype>
#include <cstdlib>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <string>
#include <utility>

#include "common/check.h"

namespace strata {

Result<PrefetchPolicy> parse_prefetch_policy(std::string_view name) {
  if (name == "best_effort") return PrefetchPolicy::kBestEffort;
  if (name == "wait_complete") return PrefetchPolicy::kWaitComplete;
  if (name == "timeout") return PrefetchPolicy::kTimeout;
  return make_error(ErrorCode::kInvalidArgument, "unknown prefetch policy '" + std::string(name) +
                                                     "' (best_effort, wait_complete or timeout)");
}

std::string_view prefetch_policy_name(PrefetchPolicy policy) {
  switch (policy) {
    case PrefetchPolicy::kBestEffort:
      return "best_effort";
    case PrefetchPolicy::kWaitComplete:
      return "wait_complete";
    case PrefetchPolicy::kTimeout:
      return "timeout";
  }
  return "best_effort";
}

Result<LoadOverlap> parse_load_overlap(std::string_view name) {
  if (name == "layer") return LoadOverlap::kLayer;
  if (name == "none") return LoadOverlap::kNone;
  return make_error(ErrorCode::kInvalidArgument,
                    "unknown load overlap '" + std::string(name) + "' (layer or none)");
}

std::string_view load_overlap_name(LoadOverlap overlap) {
  return overlap == LoadOverlap::kNone ? "none" : "layer";
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
    case PdFallback::kStageTooSmall:
      return "stage_too_small";
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
  if (o.shared_prefill_wait_tokens < 0) return bad("--shared-prefill-wait-tokens must be >= 0");
  if (!(o.max_pinned_ratio >= 0.0 && o.max_pinned_ratio <= 1.0)) {
    return bad("--max-pinned-ratio must be in [0, 1]");
  }
  if (!(o.max_client_pinned_ratio >= 0.0 && o.max_client_pinned_ratio <= 1.0)) {
    return bad("--max-client-pinned-ratio must be in [0, 1]");
  }
  if (o.max_client_pin_ttl_ms < 1000) return bad("--max-client-pin-ttl-s must be >= 1");
  if (o.max_sessions < 0) return bad("--max-conversations must be >= 0");
  if (o.session_idle_ttl_ms < 1000) return bad("--conversation-ttl-s must be >= 1");
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
  } else if (h.io_backend != CopyPath::kDirect) {
    return bad("--hicache-io-backend needs --enable-hierarchical-cache");
  } else if (h.load_overlap != LoadOverlap::kLayer) {
    return bad("--hicache-load-overlap needs --enable-hierarchical-cache");
  }
  if (auto hasher = block_hasher_for(o); !hasher) return std::unexpected(hasher.error());
  return validate_pd(o.pd);
}

Result<int64_t> parse_byte_size(std::string_view text) {
  auto bad = [&text]() {
    std::string m = "'";
    m.append(text).append("' is not a size in bytes (e.g. 512MiB, 2GB, 1073741824)");
    return make_error(ErrorCode::kInvalidArgument, std::move(m));
  };
  size_t digits = 0;
  while (digits < text.size() &&
         (std::isdigit(static_cast<unsigned char>(text[digits])) != 0 || text[digits] == '.')) {
    ++digits;
  }
  if (digits == 0) return bad();
  const std::string number(text.substr(0, digits));
  char* end = nullptr;
  const double value = std::strtod(number.c_str(), &end);
  if (end != number.c_str() + number.size()) return bad();
  std::string unit(text.substr(digits));
  std::transform(unit.begin(), unit.end(), unit.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  struct Unit {
    std::string_view name;
    double bytes;
  };
  constexpr Unit kUnits[] = {{"", 1.0},       {"b", 1.0},      {"kb", 1e3},     {"mb", 1e6},
                             {"gb", 1e9},     {"tb", 1e12},    {"kib", 0x1p10}, {"mib", 0x1p20},
                             {"gib", 0x1p30}, {"tib", 0x1p40}, {"k", 0x1p10},   {"m", 0x1p20},
                             {"g", 0x1p30},   {"t", 0x1p40}};
  for (const Unit& u : kUnits) {
    if (unit != u.name) continue;
    const double bytes = value * u.bytes;
    if (!(bytes >= 1.0 && bytes <= 0x1p62)) return bad();
    return static_cast<int64_t>(bytes);
  }
  return bad();
}

Status size_pool_by_memory(EngineOptions& o, size_t page_bytes) {
  if (o.kv_cache_memory_bytes <= 0) return {};
  STRATA_CHECK(page_bytes > 0);
  const int64_t pages = o.kv_cache_memory_bytes / static_cast<int64_t>(page_bytes);
  if (pages < 4) {
    return bad_argument("--kv-cache-memory " + std::to_string(o.kv_cache_memory_bytes) +
                        " bytes holds " + std::to_string(pages) + " pages of " +
                        std::to_string(page_bytes) + " bytes; the pool needs at least 4");
  }
  const int64_t max_pages = (int64_t{1} << 30) / o.page_size;
  o.kv_cache_tokens = static_cast<int32_t>(std::min(pages, max_pages) * o.page_size);
  return {};
}

Result<BlockHasher> block_hasher_for(const EngineOptions& o) {
  std::string seed = o.prefix_caching_hash_seed;
  if (seed.empty() && o.prefix_caching_hash_algo == BlockHashAlgo::kSha256Cbor) {
    if (const char* env = std::getenv("PYTHONHASHSEED")) seed = env;
  }
  auto hasher = BlockHasher::make(o.prefix_caching_hash_algo, seed);
  if (!hasher) return bad_argument("--prefix-caching-hash-algo: " + hasher.error().message);
  return hasher;
}

// ---- command-line flags ----

namespace {

// A flag whose text names an enum value: `parse` checks it (its error is the parser's
// message) and the field holds the parsed value. The help shows the default's name.
template <typename T, typename Parse>
CLI::Option* add_enum_flag(CLI::App& cmd, const std::string& name, T& field, Parse parse,
                           std::string_view default_name, const std::string& help) {
  CLI::Option* opt = cmd.add_option_function<std::string>(
      name, [&field, parse](const std::string& v) { field = *parse(v); }, help);
  opt->check(CLI::Validator(
      [parse](std::string& v) {
        auto parsed = parse(v);
        return parsed ? std::string() : parsed.error().message;
      },
      ""));
  return opt->default_str(std::string(default_name));
}

// A flag in whole seconds that fills a field in milliseconds.
CLI::Option* add_seconds_flag(CLI::App& cmd, const std::string& name, int64_t& field_ms,
                              const std::string& help) {
  return cmd
      .add_option_function<int64_t>(
          name, [&field_ms](int64_t s) { field_ms = s * 1000; }, help)
      ->default_str(std::to_string(field_ms / 1000));
}

constexpr int64_t kOneYearS = int64_t{365} * 24 * 3600;

}  // namespace

void add_engine_flags(CLI::App& cmd, EngineOptions& o) {
  const std::string group = "Engine";
  // --chunked-prefill-size is at least the page size, whichever of the two comes first.
  cmd.add_option_function<int32_t>(
         "--page-size",
         [&o](int32_t v) {
           o.page_size = v;
           o.chunked_prefill_size = std::max(o.chunked_prefill_size, v);
         },
         "Tokens per KV page")
      ->check(CLI::Range(1, 256))
      ->default_str(std::to_string(o.page_size))
      ->group(group);
  add_enum_flag(cmd, "--prefix-caching-hash-algo", o.prefix_caching_hash_algo,
                parse_block_hash_algo, block_hash_algo_name(o.prefix_caching_hash_algo),
                "How blocks are hashed in the cache, its events and its API: strata (its own "
                "XXH3 chain) | sha256_cbor (vLLM's, bit for bit, for indexers that hash "
                "requests as vLLM does; needs a seed)")
      ->group(group);
  cmd.add_option("--prefix-caching-hash-seed", o.prefix_caching_hash_seed,
                 "sha256_cbor's seed: the PYTHONHASHSEED of the vLLM workers and indexers to "
                 "match (default: this process's PYTHONHASHSEED)")
      ->group(group);
  cmd.add_option("--kv-cache-tokens", o.kv_cache_tokens, "Device KV pool size in tokens")
      ->check(CLI::Range(64, 1 << 30))
      ->capture_default_str()
      ->group(group);
  CLI::Option* memory =
      cmd.add_option_function<std::string>(
             "--kv-cache-memory",
             [&o](const std::string& v) { o.kv_cache_memory_bytes = *parse_byte_size(v); },
             "Device KV pool size in bytes, with a unit (512MiB, 2GB, ...), instead of "
             "--kv-cache-tokens: the pages of the model's shape and --kv-cache-dtype that fit "
             "(8-bit pages hold about twice the tokens of bf16 ones)")
          ->group(group);
  memory->check(CLI::Validator(
      [](std::string& v) {
        auto parsed = parse_byte_size(v);
        return parsed ? std::string() : parsed.error().message;
      },
      ""));
  memory->excludes("--kv-cache-tokens");
  add_enum_flag(cmd, "--kv-cache-dtype", o.kv_dtype, parse_kv_dtype, kv_dtype_name(o.kv_dtype),
                "KV pool dtype: f32 | f16 | bf16 | int8 | fp8_e4m3 (alias fp8); the 8-bit ones "
                "keep a scale per token and KV head in the page (docs/model.md)")
      ->group(group);
  cmd.add_option("--max-running-requests", o.max_running_requests, "Requests in the running batch")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str()
      ->group(group);
  cmd.add_option_function<int32_t>(
         "--chunked-prefill-size",
         [&o](int32_t v) { o.chunked_prefill_size = std::max(v, o.page_size); },
         "Prefill tokens per scheduler step, at most")
      ->check(CLI::Range(1, 1 << 20))
      ->default_str(std::to_string(o.chunked_prefill_size))
      ->group(group);
  cmd.add_option("--itl-target-ms", o.itl_target_ms,
                 "Inter-token latency target: a step that decodes carries only as much prefill "
                 "as fits it (0: auto, 4.5 times the measured decode forward pass)")
      ->check(CLI::Range(0.0, 60'000.0))
      ->capture_default_str()
      ->group(group);
  cmd.add_option("--min-prefill-tokens", o.min_prefill_tokens,
                 "Prefill tokens every step may carry whatever the latency target says, so "
                 "that prefill always progresses (at most --chunked-prefill-size)")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str()
      ->group(group);
  cmd.add_option("--priority-aging-ms", o.priority_aging_ms,
                 "Waiting time worth one point of request priority (no request starves)")
      ->check(CLI::Range(int64_t{1}, int64_t{3'600'000}))
      ->capture_default_str()
      ->group(group);
  cmd.add_option("--shared-prefill-wait-tokens", o.shared_prefill_wait_tokens,
                 "A request sharing at least this many uncached prompt tokens with one still "
                 "being prefilled waits for those pages instead of computing them too (0: never)")
      ->check(CLI::Range(0, 1 << 30))
      ->capture_default_str()
      ->group(group);
  cmd.add_flag(
         "--disable-overlap-schedule", [&o](int64_t) { o.overlap_schedule = false; },
         "Prepare each forward pass only after the last one's results are read (default: "
         "the next decode step is prepared while one runs)")
      ->group(group);
  cmd.add_option("--max-pinned-ratio", o.max_pinned_ratio, "Pinned pages / pool pages, in [0, 1]")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str()
      ->group(group);
  add_seconds_flag(cmd, "--max-client-pin-ttl-s", o.max_client_pin_ttl_ms,
                   "TTL cap of the soft pins a message's cache_control makes without the admin key")
      ->check(CLI::Range(int64_t{1}, kOneYearS))
      ->group(group);
  cmd.add_option("--max-client-pinned-ratio", o.max_client_pinned_ratio,
                 "Pinned pages that pins made without the admin key may hold / pool pages, in "
                 "[0, 1]")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str()
      ->group(group);
  // Conversation records: the server's exact tokens per session_id and the engine's record
  // of the same session share these bounds (serve gives the server the same values).
  cmd.add_option("--max-conversations,--max-sessions", o.max_sessions,
                 "Conversations (session_id) whose exact tokens and tool-session record are "
                 "kept; the least recently used beyond are dropped (their next turn renders in "
                 "full). --max-sessions is the old name")
      ->check(CLI::Range(int64_t{0}, int64_t{10'000'000}))
      ->capture_default_str()
      ->group(group);
  add_seconds_flag(cmd, "--conversation-ttl-s,--session-ttl-s", o.session_idle_ttl_ms,
                   "Drop a conversation's record after this many seconds without a turn. "
                   "--session-ttl-s is the old name")
      ->check(CLI::Range(int64_t{1}, kOneYearS))
      ->group(group);
  add_seconds_flag(cmd, "--tool-session-ttl-s", o.tool_session_ttl_ms,
                   "Release an offloaded tool session whose tool_end never came after this long")
      ->check(CLI::Range(int64_t{1}, int64_t{30} * 24 * 3600))
      ->group(group);
}

void add_hicache_flags(CLI::App& cmd, HierarchicalCacheOptions& o) {
  const std::string group = "Hierarchical cache";
  cmd.add_flag("--enable-hierarchical-cache", o.enabled,
               "Add a host KV pool (L2) behind the device pool, and storage (L3) when a backend "
               "is given")
      ->group(group);
  cmd.add_option("--hicache-ratio", o.ratio, "Host pool size / device pool size, > 1")
      ->capture_default_str()
      ->group(group);
  cmd.add_option("--hicache-size", o.size_gb,
                 "Host pool size in GB (1e9 bytes); overrides --hicache-ratio when > 0")
      ->capture_default_str()
      ->group(group);
  add_enum_flag(cmd, "--hicache-write-policy", o.write_policy, parse_write_policy,
                write_policy_name(o.write_policy),
                "write_through | write_through_selective | write_back")
      ->group(group);
  add_enum_flag(cmd, "--hicache-mem-layout", o.layout, parse_host_layout,
                host_layout_name(o.layout),
                "Host pool layout: layer_first | page_first | page_first_direct")
      ->group(group);
  add_enum_flag(cmd, "--hicache-io-backend", o.io_backend, parse_copy_path,
                copy_path_name(o.io_backend),
                "How --device cuda copies pages between the GPU and the host pool: direct (the "
                "copy engines, one batched call per transfer) | kernel (a copy kernel)")
      ->group(group);
  add_enum_flag(cmd, "--hicache-load-overlap", o.load_overlap, parse_load_overlap,
                load_overlap_name(o.load_overlap),
                "How a prefix on the host loads back: layer (the request runs at once, each "
                "layer's attention waiting for its pages) | none (the request waits for the "
                "whole load)")
      ->group(group);
  cmd.add_option("--hicache-storage-backend", o.storage_backend,
                 "Storage tier (L3): file | redis (none when empty)")
      ->group(group);
  cmd.add_option("--hicache-storage-backend-extra-config", o.storage_extra_config,
                 "JSON object (or @file) with backend options: dir, capacity_bytes, host, port, "
                 "db, password, timeout_ms, prefetch_threshold, prefetch_timeout_base, "
                 "prefetch_timeout_per_ki_token")
      ->group(group);
  add_enum_flag(cmd, "--hicache-storage-prefetch-policy", o.prefetch_policy, parse_prefetch_policy,
                prefetch_policy_name(o.prefetch_policy), "best_effort | wait_complete | timeout")
      ->group(group);
}

void add_pd_flags(CLI::App& cmd, PdOptions& o) {
  const std::string group = "Prefill/decode disaggregation";
  cmd.add_option_function<std::string>(
         "--role", [&o](const std::string& v) { o.role = *parse_worker_role(v); },
         "Prefill/decode disaggregation: mixed (prefill and decode here) | prefill "
         "(compute prompts that decode workers order) | decode (order prompts from "
         "--pd-prefill-peer workers, decode here)")
      ->check(CLI::IsMember({"mixed", "prefill", "decode"}))
      ->default_str(worker_role_name(o.role))
      ->group(group);
  cmd.add_option("--pd-worker-id", o.worker_id,
                 "This worker's id on the disaggregation control plane (default: host name "
                 "and a random suffix)")
      ->group(group);
  cmd.add_option("--pd-bind", o.bind,
                 "Prefill workers: the control plane's ZeroMQ endpoint (default "
                 "tcp://127.0.0.1:0, a free port; /server_info reports it)")
      ->group(group);
  cmd.add_option("--pd-prefill-peer", o.prefill_peers,
                 "Decode workers: a prefill worker's control-plane endpoint (repeatable); "
                 "requests name one by its worker id in x-strata-prefill-peer")
      ->group(group);
  cmd.add_option("--pd-transport", o.transport,
                 "How KV pages move between workers: ucx (UCX_TLS picks shared memory, TCP or "
                 "RDMA) | storage (through --pd-storage-backend)")
      ->check(CLI::IsMember({"ucx", "storage"}))
      ->capture_default_str()
      ->group(group);
  cmd.add_option("--pd-ucx-data-path", o.ucx_data_path,
                 "UCX: messages (checked against the pool, robust to a peer's death) | put "
                 "(one-sided puts of the page runs: zero-copy over RDMA)")
      ->check(CLI::IsMember({"messages", "put"}))
      ->capture_default_str()
      ->group(group);
  cmd.add_option("--pd-storage-backend", o.storage_backend,
                 "The store of --pd-transport storage: file | redis")
      ->group(group);
  cmd.add_option("--pd-storage-backend-extra-config", o.storage_extra_config,
                 "Its options, as --hicache-storage-backend-extra-config")
      ->group(group);
  cmd.add_option("--pd-heartbeat-ms", o.heartbeat_ms, "Control-plane heartbeat period")
      ->capture_default_str()
      ->group(group);
  cmd.add_option("--pd-peer-timeout-ms", o.peer_timeout_ms,
                 "Silence after which a peer is dead (its rooms fail over to local prefill)")
      ->capture_default_str()
      ->group(group);
  cmd.add_option("--pd-accept-timeout-ms", o.accept_timeout_ms,
                 "Decode workers: how long an order may wait for the prefill worker's accept")
      ->capture_default_str()
      ->group(group);
  cmd.add_option("--pd-stall-ms", o.stall_ms,
                 "Decode workers: the longest silence of an accepted room before it fails")
      ->capture_default_str()
      ->group(group);
  cmd.add_option("--pd-quarantine-ms", o.quarantine_ms,
                 "Decode workers: how long the pages of a failed room stay unused when the "
                 "prefill worker did not confirm it stopped writing")
      ->capture_default_str()
      ->group(group);
  cmd.add_option("--pd-order-deadline-ms", o.order_deadline_ms,
                 "Decode workers: a room's whole budget, order to the first token")
      ->capture_default_str()
      ->group(group);
  cmd.add_option("--pd-max-queued-prefill-tokens", o.max_queued_prefill_tokens,
                 "Prefill workers: reject orders while more prompt tokens than this wait here")
      ->capture_default_str()
      ->group(group);
  cmd.add_option("--pd-stage-tokens", o.stage_tokens,
                 "--device cuda: tokens of page-locked host memory the KV crosses on its way "
                 "between the GPU and the transport (at most the device pool's)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30))
      ->capture_default_str()
      ->group(group);
}

}  // namespace strata
