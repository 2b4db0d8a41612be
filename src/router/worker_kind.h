// The kinds of worker `strata route` sends requests to, their roles, and how each kind
// reports its load (docs/router.md, "Workers"). A worker's kind and role are parsed once,
// where it is added (a --workers-file entry, POST /workers) or where it describes itself
// (a Strata worker's /server_info); the router compares these enums after that.
//
// What each kind answers the router's load poll with (router.cc, poll_load):
//   strata    GET /load, Strata's own report (read in router.cc)
//   vllm      GET /metrics, Prometheus text: vllm:num_requests_running, ..._waiting,
//             vllm:kv_cache_usage_perc (vllm:gpu_cache_usage_perc before v0.7)
//   sglang    GET /metrics: sglang:num_running_reqs, sglang:num_queue_reqs, sglang:token_usage
//   llamacpp  GET /slots (a JSON array, one object per slot: `id`, `n_ctx`, `is_processing`)
//             and GET /metrics (with llama-server --metrics): llamacpp:requests_processing,
//             llamacpp:requests_deferred, llamacpp:prompt_tokens_total
//   openai    GET /v1/models only to see that it answers: any OpenAI-compatible server has
//             no load report, so its load is the router's own accounting (what it sent
//             there and is still running)
//
// Pure functions: no I/O, no locks, no clock.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "common/result.h"

namespace strata::router {

enum class WorkerKind : uint8_t {
  kStrata,    // `strata serve`: /server_info, /load, KV events, its tree
  kVllm,      // vLLM: /metrics; KV events where it publishes them
  kSglang,    // SGLang: /metrics; KV events where it publishes them
  kLlamaCpp,  // llama.cpp's llama-server: /slots and /metrics; no KV events
  kOpenAi,    // any OpenAI-compatible server: no load report, no KV events
};

// "strata", "vllm", "sglang", "llamacpp", "openai"; kInvalidArgument naming the kinds.
Result<WorkerKind> parse_worker_kind(std::string_view name);
std::string_view worker_kind_name(WorkerKind kind);
// Whether a worker of this kind can publish KV events (vLLM's wire format, kv-events.md).
bool publishes_kv_events(WorkerKind kind);
// The block size the router indexes a worker of this kind with when its entry names none:
// 0 when it must be given (vLLM, SGLang: their events' block size) or is read from the
// worker (Strata: /server_info page_size); kApproximateBlockSize for kinds without events,
// whose index is only what the router sent them (the block size is its granularity).
int default_block_size(WorkerKind kind);
inline constexpr int kApproximateBlockSize = 16;

enum class WorkerRole : uint8_t {
  kMixed,    // prefills and decodes its own requests
  kPrefill,  // computes prompts a decode worker orders (docs/pd-disaggregation.md); never chosen
  kDecode,   // chosen like a mixed worker; may have its prompts prefilled elsewhere (--pd)
};

// "mixed", "prefill", "decode"; kInvalidArgument otherwise.
Result<WorkerRole> parse_worker_role(std::string_view name);
std::string_view worker_role_name(WorkerRole role);

// How a Strata worker's prefilled pages travel to the decode worker (its /server_info
// `pd.transport`, docs/pd-disaggregation.md): UCX one-sided puts or the shared storage tier.
enum class PdTransport : uint8_t {
  kNone,     // no PD channel (`pd` null, or not a Strata worker)
  kUcx,      // "ucx"
  kStorage,  // "storage"
};
// "ucx", "storage"; kInvalidArgument naming the transports otherwise ("none" is not a wire
// value: a worker without a channel says `pd: null`).
Result<PdTransport> parse_pd_transport(std::string_view name);
std::string_view pd_transport_name(PdTransport transport);  // "none", "ucx", "storage"

// What the router's last load poll of a worker read (GET /workers shows it as load.source).
enum class LoadSource : uint8_t {
  kRouter,          // nothing: the load is the router's own accounting alone
  kStrataLoad,      // a Strata worker's GET /load
  kMetrics,         // GET /metrics (vLLM, SGLang, llama.cpp without /slots)
  kSlots,           // llama.cpp's GET /slots (llama-server without --metrics)
  kSlotsAndMetrics  // llama.cpp's GET /slots and GET /metrics
};
std::string_view load_source_name(LoadSource source);

// A Strata worker's GET /load (server/worker_info_routes.cc), the fields the router reads.
// Absent fields read as 0 (an older worker reports fewer).
struct StrataLoad {
  std::string instance_id;  // "" when absent
  double load_fraction = 0.0;
  int64_t running = 0;
  int64_t waiting = 0;
  int64_t queued_prefill_tokens = 0;
  int64_t max_running_requests = 0;
  bool has_device = false;  // `device` was there
  int64_t free_pages = 0, evictable_pages = 0, total_pages = 0;
  int64_t recommended_pause_ms = 0;
  // KV event batches the worker has published (its next sequence number); absent: unknown.
  std::optional<int64_t> kv_events_next_seq;
};
// kInvalidArgument, naming the field, when the body is not a JSON object or a field has
// the wrong type or a negative value: the router then counts a failed poll, never reads a
// half-typed report (and never throws on its I/O thread).
Result<StrataLoad> read_strata_load(std::string_view body);

// A load report of a worker that is not Strata, in the router's terms.
struct LoadReport {
  LoadSource source = LoadSource::kRouter;
  double load_fraction = 0.0;  // >= 0; above the router's --busy-threshold: saturated
  int64_t running = 0;         // requests the worker is computing
  int64_t waiting = 0;         // requests it holds back (waiting, queued, deferred)
  int64_t max_running = 0;     // how many it computes at once (llama.cpp: its slots); 0 unknown
  int64_t context_tokens = 0;  // its longest prompt (llama.cpp: a slot's n_ctx); 0 unknown
  // A counter of the prompt tokens it processed since it started (llama.cpp); a smaller
  // value than the last one means the worker restarted with an empty cache.
  std::optional<int64_t> prompt_tokens_total;
};

// The sum of a metric's samples in Prometheus text (every label set; `# ...` lines and
// other metrics whose names merely start with `name` are skipped); nullopt when absent.
std::optional<double> prometheus_value(std::string_view text, std::string_view name);

// A vLLM or SGLang /metrics page. nullopt when the page has none of the kind's metric names
// (another engine's page: the worker's `kind` is probably wrong). As before this module:
// load_fraction = KV usage, plus 1 when requests wait while the KV cache is 90 % used.
std::optional<LoadReport> read_engine_metrics(WorkerKind kind, std::string_view text);

// llama.cpp's GET /slots, summed: total slots, those processing a request (`is_processing`;
// builds before late 2024 have `state` != 0 instead), and the largest slot context.
struct LlamaCppSlots {
  int64_t total = 0;  // >= 1
  int64_t busy = 0;   // in [0, total]
  int64_t n_ctx = 0;  // 0 when no slot says
};
// kInvalidArgument when the body is not a non-empty JSON array of slot objects.
Result<LlamaCppSlots> read_llamacpp_slots(std::string_view body);

// llama.cpp's load from what was read: `slots` (null: /slots not read) and the /metrics
// text (null: not read). nullopt when neither was read, or the /metrics page has no
// llamacpp:* load metric and no /slots was read. running = busy slots (else
// llamacpp:requests_processing), waiting = llamacpp:requests_deferred, and
//   load_fraction = (running + waiting) / slots,
// as a Strata worker's running / max_running_requests + waiting / max_running_requests;
// without /slots, 1 while requests are deferred (else 0). llamacpp:kv_cache_usage_ratio
// (older builds) is not load: llama.cpp keeps an idle slot's prompt in its cache.
std::optional<LoadReport> read_llamacpp_load(const LlamaCppSlots* slots,
                                             const std::string_view* metrics);

}  // namespace strata::router
