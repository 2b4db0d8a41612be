// `strata bench forward`: prefill tokens/s at the given prompt lengths (one forward pass
// per prompt, best of --repeats), single-sequence decode tokens/s, batched decode
// tokens/s, and where the time goes (per-phase wall time), on the `bench` preset made on
// the fly or on --model. In process: no server, no scheduler, only the model.
//
// --device cuda runs the same scenarios on the GPU's forward pass (cuda/gpu_model.h): the
// model is loaded on the host, uploaded in BF16, and the host copy freed; the logits come
// back each step as the engine's do. Each decode scenario is set beside its floor: the bytes
// a step must read (every matrix once, the LM head, the batch's KV) over the device's
// measured copy bandwidth (issue 30's target: batch-1 decode at >= 85 % of it).
//
// With --profile-out it measures a timing profile instead (model/timing_profile.h,
// docs/simulation.md): prefill passes on a grid of new tokens x cached context, decode steps
// on a grid of batch size x context, each the best of --repeats.
#include "bench/forward.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <limits>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/log.h"
#include "cuda/cuda_device.h"
#include "cuda/gpu_model.h"
#include "model/make_model.h"
#include "model/model.h"
#include "model/timing_profile.h"

namespace strata::bench {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

struct ForwardBenchOptions {
  std::string model_dir;
  std::string device = "cpu";       // cpu | cuda
  bool disable_cuda_graph = false;  // cuda: decode steps kernel by kernel
  std::string preset = "bench";
  std::string arch;  // "": the preset's (make_model.h)
  int threads = 2;
  std::vector<int64_t> prompt_tokens = {512, 2048};
  int64_t chunk_tokens = 0;  // 0: each prompt in one forward call
  int64_t decode_tokens = 128;
  int64_t decode_context = 0;
  std::vector<int64_t> decode_batches = {8, 32};
  int64_t batch_context = 512;
  std::string kv_dtype = "f32";
  std::string weight_dtype = "auto";
  int32_t page_size = 16;
  int repeats = 3;
  bool json = false;
  // --profile-out: the timing profile's file and grid (contexts are rounded up to pages).
  std::string profile_out;
  std::string profile_machine;  // "": the CPU's model name and the thread count
  std::vector<int64_t> profile_prefill_tokens = {16, 64, 256, 1024};
  std::vector<int64_t> profile_batches = {1, 4, 16, 32};
  std::vector<int64_t> profile_contexts = {0, 512, 2048};
  int64_t profile_decode_steps = 4;
};

struct Measurement {
  double seconds = 0;
  ForwardProfile profile;
};

nlohmann::json profile_json(const ForwardProfile& p) {
  return {{"embed_s", p.embed_s},     {"rmsnorm_s", p.norm_s},
          {"qkv_proj_s", p.qkv_s},    {"rope_kv_store_s", p.rope_store_s},
          {"kv_wait_s", p.kv_wait_s}, {"attention_s", p.attention_s},
          {"o_proj_s", p.o_proj_s},   {"gate_up_s", p.gate_up_s},
          {"silu_mul_s", p.silu_s},   {"down_proj_s", p.down_s},
          {"logits_s", p.logits_s},   {"total_s", p.total_s()}};
}

// Read bandwidth of the host's memory with `threads` threads, each summing its share of a
// 1 GiB buffer (far beyond the caches), best of 3 passes: bytes/s. The CPU decode floor is
// the weights a token reads over it.
double cpu_read_bandwidth(int threads) {
  const size_t words = (size_t{1} << 30) / sizeof(uint64_t);
  std::vector<uint64_t> buffer(words);
  for (size_t i = 0; i < words; ++i) buffer[i] = i;
  double best = 0;
  std::vector<uint64_t> sums(static_cast<size_t>(threads));
  for (int pass = 0; pass < 3; ++pass) {
    const auto start = Clock::now();
    std::vector<std::thread> workers;
    for (int t = 0; t < threads; ++t) {
      workers.emplace_back([&, t] {
        const size_t begin = words / static_cast<size_t>(threads) * static_cast<size_t>(t);
        const size_t end = t + 1 == threads ? words : begin + words / static_cast<size_t>(threads);
        uint64_t sum = 0;
        for (size_t i = begin; i < end; ++i) sum += buffer[i];
        sums[static_cast<size_t>(t)] = sum;
      });
    }
    for (std::thread& w : workers) w.join();
    best = std::max(best, static_cast<double>(words * sizeof(uint64_t)) / seconds_since(start));
  }
  return sums[0] == 1 ? 0 : best;  // reads the sums so the loops are kept
}

// Bytes of weights one decode token reads: every matrix but the embedding (one row is
// looked up), which counts when it is also the LM head.
double decode_weight_bytes(const ModelWeights& w) {
  double bytes = static_cast<double>(w.size_bytes());
  if (!w.lm_head.empty()) bytes -= static_cast<double>(w.embed.size_bytes());
  return bytes;
}

// The dtypes of the weight matrices, "q4_k+q6_k" for a mix.
std::string weights_description(const ModelWeights& w) {
  std::set<std::string> names;
  auto add = [&](const WeightMatrix& m) {
    if (!m.empty()) names.insert(std::string(weight_dtype_name(m.dtype())));
  };
  add(w.embed);
  add(w.lm_head);
  for (const LayerWeights& l : w.layers) {
    for (const WeightMatrix* m : {&l.qkv, &l.o, &l.gate_up, &l.down}) add(*m);
    for (const WeightMatrix& m : l.qkv_parts) add(m);
    for (const WeightMatrix& m : l.gate_up_parts) add(m);
  }
  std::string out;
  for (const std::string& n : names) out.append(out.empty() ? "" : "+").append(n);
  return out;
}

// Deterministic pseudo-random prompt ids.
std::vector<int32_t> prompt_ids(int64_t n, int32_t vocab, uint64_t salt) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  uint64_t x = 0x9e3779b97f4a7c15ull ^ salt;
  for (int32_t& id : ids) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    id = static_cast<int32_t>(x % static_cast<uint64_t>(vocab));
  }
  return ids;
}

// One forward pass of `batch` through whichever model, the logits in `out`.
class Runner {
 public:
  Runner(ForwardModel& model, Model* cpu, KvPool& pool) : model_(model), cpu_(cpu), pool_(pool) {}

  ForwardModel& model() const { return model_; }
  KvPool& pool() const { return pool_; }
  Status forward(std::span<const ForwardSequence> batch) {
    return model_.forward(batch, pool_, out_);
  }
  const std::vector<float>& logits() const { return out_.logits; }
  // Row r's greedy token: the model's own draw where it gave one (ForwardOutput::sampled, a
  // GPU for rows with sampling), else the argmax of the row's logits.
  int32_t greedy(size_t r) const {
    if (!out_.sampled.empty() && out_.sampled[r].token >= 0) return out_.sampled[r].token;
    const auto vocab = static_cast<size_t>(model_.config().vocab_size);
    const auto row = out_.logits.begin() + static_cast<std::ptrdiff_t>(r * vocab);
    return static_cast<int32_t>(std::max_element(row, row + static_cast<std::ptrdiff_t>(vocab)) -
                                row);
  }
  // Per-phase timing: the CPU engine's (the GPU pass has none: every phase is asynchronous).
  void reset_profile() {
    if (cpu_ != nullptr) cpu_->reset_profile();
  }
  ForwardProfile profile() const { return cpu_ != nullptr ? cpu_->profile() : ForwardProfile{}; }

 private:
  ForwardModel& model_;
  Model* cpu_;
  KvPool& pool_;
  ForwardOutput out_;
};

class ForwardBench {
 public:
  ForwardBench(Runner& runner, const ForwardBenchOptions& o) : run_(runner), o_(o) {}

  // Pages [first, first + count) as a page table.
  std::vector<PageId> table(int32_t first, int64_t positions) const {
    std::vector<PageId> t;
    for (int64_t p = 0; p * o_.page_size < positions; ++p) {
      t.push_back(make_page_id(first + static_cast<int32_t>(p)));
    }
    return t;
  }

  int32_t vocab() const { return run_.model().config().vocab_size; }

  Result<Measurement> prefill(int64_t tokens) {
    const std::vector<int32_t> ids = prompt_ids(tokens, vocab(), 1);
    const std::vector<PageId> pages = table(0, tokens);
    const int64_t chunk = o_.chunk_tokens > 0 ? o_.chunk_tokens : tokens;
    std::optional<Measurement> best;
    for (int r = 0; r < o_.repeats; ++r) {
      run_.reset_profile();
      const auto start = Clock::now();
      for (int64_t done = 0; done < tokens; done += chunk) {
        const int64_t n = std::min(chunk, tokens - done);
        ForwardSequence seq{
            std::span(ids).subspan(static_cast<size_t>(done), static_cast<size_t>(n)), done, pages,
            true};
        if (auto s = run_.forward(std::span(&seq, 1)); !s) return std::unexpected(s.error());
      }
      const double t = seconds_since(start);
      if (!best || t < best->seconds) best = Measurement{t, run_.profile()};
    }
    return *best;
  }

  // Greedy decode of decode_tokens tokens after a prompt of decode_context tokens.
  Result<Measurement> decode() {
    const int64_t context = std::max<int64_t>(o_.decode_context, 1);
    const std::vector<PageId> pages = table(0, context + o_.decode_tokens);
    const std::vector<int32_t> prompt = prompt_ids(context, vocab(), 2);
    std::optional<Measurement> best;
    for (int r = 0; r < o_.repeats; ++r) {
      ForwardSequence first{prompt, 0, pages, true};
      if (auto s = run_.forward(std::span(&first, 1)); !s) return std::unexpected(s.error());
      run_.reset_profile();
      const auto start = Clock::now();
      int32_t token = 0;
      for (int64_t i = 0; i < o_.decode_tokens; ++i) {
        token = run_.greedy(0);
        // Greedy decode rows as the engine sends them: drawn where the logits are.
        ForwardSequence seq{std::span(&token, 1), context + i, pages, true};
        seq.sampling = RowSampling{};
        if (auto s = run_.forward(std::span(&seq, 1)); !s) return std::unexpected(s.error());
      }
      const double t = seconds_since(start);
      if (!best || t < best->seconds) best = Measurement{t, run_.profile()};
    }
    return *best;
  }

  // `batch` sequences of batch_context tokens each decode one token per step.
  Result<Measurement> batched_decode(int64_t batch) {
    const int64_t steps = batch_steps(o_);
    const int64_t per_seq_pages = (o_.batch_context + steps + o_.page_size - 1) / o_.page_size;
    std::vector<std::vector<PageId>> tables;
    std::vector<std::vector<int32_t>> prompts;
    for (int64_t b = 0; b < batch; ++b) {
      tables.push_back(table(static_cast<int32_t>(b * per_seq_pages), o_.batch_context + steps));
      prompts.push_back(prompt_ids(o_.batch_context, vocab(), 100 + b));
    }
    std::optional<Measurement> best;
    std::vector<int32_t> next(static_cast<size_t>(batch), 1);
    std::vector<ForwardSequence> seqs(static_cast<size_t>(batch));
    for (int r = 0; r < o_.repeats; ++r) {
      for (int64_t b = 0; b < batch; ++b) {
        ForwardSequence seq{prompts[static_cast<size_t>(b)], 0, tables[static_cast<size_t>(b)],
                            false};
        if (auto s = run_.forward(std::span(&seq, 1)); !s) return std::unexpected(s.error());
      }
      run_.reset_profile();
      const auto start = Clock::now();
      for (int64_t step = 0; step < steps; ++step) {
        for (int64_t b = 0; b < batch; ++b) {
          seqs[static_cast<size_t>(b)] =
              ForwardSequence{std::span(&next[static_cast<size_t>(b)], 1), o_.batch_context + step,
                              tables[static_cast<size_t>(b)], true};
          seqs[static_cast<size_t>(b)].sampling = RowSampling{};
        }
        if (auto s = run_.forward(seqs); !s) return std::unexpected(s.error());
        for (int64_t b = 0; b < batch; ++b) {
          next[static_cast<size_t>(b)] = run_.greedy(static_cast<size_t>(b));
        }
      }
      const double t = seconds_since(start) / static_cast<double>(steps);
      if (!best || t < best->seconds) best = Measurement{t, run_.profile()};
    }
    return *best;
  }

  static int64_t batch_steps(const ForwardBenchOptions& o) {
    return std::max<int64_t>(8, o.decode_tokens / 4);
  }

 private:
  Runner& run_;
  const ForwardBenchOptions& o_;
};

// The CPU's model name from /proc/cpuinfo, or "unknown CPU".
std::string cpu_name() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(' ', colon + 1));
    }
  }
  return "unknown CPU";
}

// Measures the timing profile's grid. Contexts are prefilled once into shared pages (a page
// may be shared by sequences that only read it): every decoding sequence of a batch reads the
// same context and writes its own pages, so a batch of 32 at 2,048 tokens costs one 2,048-token
// prefill to set up, and attention reads as much as with 32 distinct contexts.
// Pages the profile's grid needs (the context, then each batch's or prefill's own pages).
int64_t profile_pages(const ForwardBenchOptions& o) {
  const int64_t ps = o.page_size;
  auto round_up = [&](int64_t n) { return (n + ps - 1) / ps * ps; };
  int64_t max_context = 0;
  for (int64_t c : o.profile_contexts) max_context = std::max(max_context, round_up(c));
  int64_t max_new = 0;
  for (int64_t n : o.profile_prefill_tokens) max_new = std::max(max_new, n);
  int64_t max_batch = 0;
  for (int64_t b : o.profile_batches) max_batch = std::max(max_batch, b);
  const int64_t tail_pages = (o.profile_decode_steps + ps - 1) / ps;
  return max_context / ps + std::max((max_new + ps - 1) / ps, max_batch * tail_pages) + 1;
}

// `engine` names the forward pass in the profile's source ("CPU engine, weights f32, KV f32").
Result<TimingProfile> measure_profile(Runner& run, const ForwardBenchOptions& o,
                                      const std::string& machine, const std::string& engine) {
  ForwardModel& m = run.model();
  const int64_t ps = o.page_size;
  auto round_up = [&](int64_t n) { return (n + ps - 1) / ps * ps; };
  int64_t max_context = 0;
  for (int64_t c : o.profile_contexts) max_context = std::max(max_context, round_up(c));
  const int64_t tail_pages = (o.profile_decode_steps + ps - 1) / ps;
  const int32_t vocab = m.config().vocab_size;
  auto page_range = [](int64_t first, int64_t count) {
    std::vector<PageId> t;
    for (int64_t p = 0; p < count; ++p) t.push_back(make_page_id(static_cast<int32_t>(first + p)));
    return t;
  };
  // The context: max_context tokens in pages [0, max_context / ps), computed once.
  const std::vector<int32_t> context_ids = prompt_ids(std::max<int64_t>(max_context, 1), vocab, 7);
  const std::vector<PageId> context_pages = page_range(0, max_context / ps);
  if (max_context > 0) {
    ForwardSequence s{context_ids, 0, context_pages, false};
    if (auto st = run.forward(std::span(&s, 1)); !st) return std::unexpected(st.error());
  }
  const int64_t free_page = max_context / ps;

  TimingProfile p;
  p.model = o.model_dir.empty() ? "preset " + o.preset + " (" + o.arch + ")" : o.model_dir;
  p.machine = !o.profile_machine.empty() ? o.profile_machine : machine;
  p.source = "measured: strata bench forward --profile-out (" + engine + ", page size " +
             std::to_string(ps) + ", best of " + std::to_string(o.repeats) + ")";
  std::vector<double> contexts;
  for (int64_t c : o.profile_contexts) {
    if (contexts.empty() || static_cast<double>(round_up(c)) > contexts.back()) {
      contexts.push_back(static_cast<double>(round_up(c)));
    }
  }
  auto table_for = [&](const std::vector<int64_t>& xs) {
    TimingTable t;
    std::vector<int64_t> sorted = xs;
    std::sort(sorted.begin(), sorted.end());
    sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
    for (int64_t x : sorted) t.x.push_back(static_cast<double>(x));
    t.y = contexts;
    return t;
  };
  p.prefill = table_for(o.profile_prefill_tokens);
  p.decode = table_for(o.profile_batches);
  auto best_ms = [&](auto&& run) -> Result<double> {
    double best = 0;
    for (int r = 0; r < o.repeats; ++r) {
      const auto start = Clock::now();
      if (auto st = run(); !st) return std::unexpected(st.error());
      const double ms = seconds_since(start) * 1e3;
      if (r == 0 || ms < best) best = ms;
    }
    return best;
  };
  for (double xd : p.prefill.x) {
    std::vector<double>& row = p.prefill.ms.emplace_back();
    const auto n = static_cast<int64_t>(xd);
    const std::vector<int32_t> ids = prompt_ids(n, vocab, 11);
    for (double cd : contexts) {
      const auto c = static_cast<int64_t>(cd);
      std::vector<PageId> table(context_pages.begin(), context_pages.begin() + c / ps);
      const std::vector<PageId> own = page_range(free_page, (n + ps - 1) / ps);
      table.insert(table.end(), own.begin(), own.end());
      ForwardSequence s{ids, c, table, true};
      auto ms = best_ms([&] { return run.forward(std::span(&s, 1)); });
      if (!ms) return std::unexpected(ms.error());
      row.push_back(*ms);
      if (!o.json)
        std::printf("prefill %6lld new, context %6lld: %9.3f ms\n", static_cast<long long>(n),
                    static_cast<long long>(c), *ms);
    }
  }
  for (double xd : p.decode.x) {
    std::vector<double>& row = p.decode.ms.emplace_back();
    const auto b = static_cast<size_t>(xd);
    for (double cd : contexts) {
      const auto c = static_cast<int64_t>(cd);
      std::vector<std::vector<PageId>> tables(b);
      for (size_t i = 0; i < b; ++i) {
        tables[i].assign(context_pages.begin(), context_pages.begin() + c / ps);
        const std::vector<PageId> own =
            page_range(free_page + static_cast<int64_t>(i) * tail_pages, tail_pages);
        tables[i].insert(tables[i].end(), own.begin(), own.end());
      }
      std::vector<int32_t> next(b, 1);
      std::vector<ForwardSequence> seqs(b);
      auto ms = best_ms([&]() -> Status {
        for (int64_t step = 0; step < o.profile_decode_steps; ++step) {
          for (size_t i = 0; i < b; ++i) {
            seqs[i] = ForwardSequence{std::span(&next[i], 1), c + step, tables[i], true};
          }
          if (auto st = run.forward(seqs); !st) return st;
        }
        return {};
      });
      if (!ms) return std::unexpected(ms.error());
      row.push_back(*ms / static_cast<double>(o.profile_decode_steps));
      if (!o.json)
        std::printf("decode  batch %4zu, context %6lld: %9.3f ms a step\n", b,
                    static_cast<long long>(c), row.back());
    }
  }
  // The shipped form must load back (a grid the flags made degenerate fails here, named).
  auto check = TimingProfile::parse(p.to_json());
  if (!check) return std::unexpected(check.error());
  return p;
}

// Bytes one decode step of `batch` sequences at `context` tokens reads on the GPU: every
// matrix once, the LM head, and each sequence's K and V (BF16).
double decode_step_bytes(const ModelConfig& c, int64_t batch, int64_t context) {
  const double kv_token = static_cast<double>(cuda::gpu_kv_page_bytes(c, 1));
  const double embedding =
      c.tie_word_embeddings ? 0.0 : 2.0 * c.vocab_size * static_cast<double>(c.hidden_size);
  return static_cast<double>(cuda::gpu_weight_bytes(c)) - embedding +
         kv_token * static_cast<double>(batch) * static_cast<double>(context);
}

int run_forward_bench(ForwardBenchOptions o) {
  auto fail = [](const std::string& message) {
    std::cerr << "strata bench forward: " << message << "\n";
    return 2;
  };
  if (o.device != "cpu" && o.device != "cuda") return fail("--device must be cpu or cuda");
  const bool gpu = o.device == "cuda";
  ModelOptions model_options;
  model_options.num_threads = o.threads;
  if (gpu && o.weight_dtype == "auto") {
    // The GPU keeps BF16 whatever the checkpoint: the host copy need not be larger.
    model_options.weight_dtype = WeightDtype::kBF16;
  } else if (o.weight_dtype != "auto") {
    model_options.weight_dtype = parse_weight_dtype(o.weight_dtype);
    if (!model_options.weight_dtype) {
      return fail("--weight-dtype must be auto, f32, bf16, q8_0, q4_0 or q4_k");
    }
  }
  auto kv_dtype = parse_kv_dtype(o.kv_dtype);
  if (!kv_dtype) return fail(kv_dtype.error().message);
  if (o.json) set_log_level("warn");  // keep stdout one JSON object

  std::optional<cuda::DeviceInfo> device;
  if (gpu) {
    auto probed = cuda::probe_device(0);
    if (!probed) return fail("--device cuda: " + probed.error().message);
    device = *probed;
  }
  const auto load_start = Clock::now();
  Result<std::unique_ptr<Model>> loaded = make_error(ErrorCode::kInternal, "no model");
  std::string source;
  if (!o.model_dir.empty()) {
    loaded = Model::load(o.model_dir, model_options);
    source = o.model_dir;
  } else {
    auto preset = parse_model_preset(o.preset);
    if (!preset) return fail(preset.error().message);
    auto arch = o.arch.empty() ? Result<Architecture>(preset_architecture(*preset))
                               : parse_architecture(o.arch);
    if (!arch) return fail(arch.error().message);
    if (o.arch.empty()) o.arch = std::string(architecture_model_type(*arch));
    loaded = make_preset_model(*preset, *arch, 0, model_options);
    source = "preset " + o.preset + " (" + o.arch + ", random weights, seed 0)";
  }
  if (!loaded) return fail(loaded.error().message);
  std::unique_ptr<Model> cpu = std::move(*loaded);
  cpu->set_profiling(true);
  const std::string weights_name = weights_description(cpu->weights());

  int64_t max_prompt = 0;
  for (int64_t p : o.prompt_tokens) max_prompt = std::max(max_prompt, p);
  const int64_t decode_positions = std::max<int64_t>(o.decode_context, 1) + o.decode_tokens;
  int64_t max_batch = 0;
  for (int64_t b : o.decode_batches) max_batch = std::max(max_batch, b);
  const int64_t batch_pages =
      max_batch *
      ((o.batch_context + ForwardBench::batch_steps(o) + o.page_size - 1) / o.page_size);
  const int64_t pages =
      o.profile_out.empty()
          ? std::max({(max_prompt + o.page_size - 1) / o.page_size,
                      (decode_positions + o.page_size - 1) / o.page_size, batch_pages}) +
                1
          : profile_pages(o);
  if (pages > std::numeric_limits<int32_t>::max() / 2) return fail("too many KV pages");

  // The model the scenarios run on: the CPU engine's, or its weights on the GPU.
  std::unique_ptr<ForwardModel> on_gpu;
  std::string machine = cpu_name() + ", " + std::to_string(cpu->num_threads()) + " threads";
  std::string engine =
      "CPU engine, weights " + weights_name + ", KV " + std::string(kv_dtype_name(*kv_dtype));
  double copy_bandwidth = 0;  // bytes/s, --device cuda
  if (gpu) {
    int64_t max_tokens = std::max({max_prompt, max_batch, int64_t{1}});
    int64_t max_seqs = std::max<int64_t>(max_batch, 1);
    for (int64_t n : o.profile_prefill_tokens) max_tokens = std::max(max_tokens, n);
    for (int64_t b : o.profile_batches) max_seqs = std::max(max_seqs, b);
    if (o.chunk_tokens > 0) max_tokens = std::min(max_tokens, std::max(o.chunk_tokens, max_seqs));
    max_tokens = std::max({max_tokens, max_seqs, int64_t{2048}});  // the profile's context pass
    cuda::GpuModelOptions g;
    g.num_pages = static_cast<int32_t>(pages);
    g.page_size = o.page_size;
    g.max_batch_tokens = static_cast<int32_t>(std::min<int64_t>(max_tokens, 1 << 20));
    g.max_batch_sequences = static_cast<int32_t>(max_seqs);
    g.cuda_graphs = !o.disable_cuda_graph;
    auto made = cuda::GpuModel::create(cpu->config(), cpu->weights(), g);
    if (!made) return fail("--device cuda: " + made.error().message);
    on_gpu = std::move(*made);
    cpu.reset();  // the weights are on the GPU now
    machine = cuda::describe(*device);
    engine = std::string("CUDA engine, weights bf16, KV bf16, ") +
             (o.disable_cuda_graph ? "decode eager" : "decode in CUDA graphs");
    auto bw = cuda::device_copy_bandwidth(size_t{1} << 30);
    if (!bw) return fail("measuring the device's copy bandwidth: " + bw.error().message);
    copy_bandwidth = *bw;
  }
  // The CPU's decode floor: the weights a token reads over the memory's read bandwidth.
  const double read_bandwidth = gpu ? 0.0 : cpu_read_bandwidth(cpu->num_threads());
  ForwardModel& fm = gpu ? *on_gpu : static_cast<ForwardModel&>(*cpu);
  const double load_s = seconds_since(load_start);
  auto pool = fm.make_kv_pool(static_cast<int32_t>(pages), o.page_size, *kv_dtype);
  if (!pool) return fail(pool.error().message);
  Runner runner(fm, cpu.get(), **pool);

  const ModelConfig& c = fm.config();
  const int threads = cpu ? cpu->num_threads() : 0;
  nlohmann::json report = {
      {"model", source},
      {"device", o.device},
      {"machine", machine},
      {"architecture", std::string(architecture_class_name(c.architecture))},
      {"hidden_size", c.hidden_size},
      {"num_layers", c.num_layers},
      {"num_heads", c.num_heads},
      {"num_kv_heads", c.num_kv_heads},
      {"head_dim", c.head_dim},
      {"intermediate_size", c.intermediate_size},
      {"vocab_size", c.vocab_size},
      {"tie_word_embeddings", c.tie_word_embeddings},
      {"weights", gpu ? std::string("bf16") : weights_name},
      {"kv_dtype", gpu ? std::string("bf16") : std::string(kv_dtype_name(*kv_dtype))},
      {"threads", threads},
      {"page_size", o.page_size},
      {"repeats", o.repeats},
      {"load_s", load_s}};
  if (gpu) report["copy_bandwidth_gbs"] = copy_bandwidth / 1e9;
  if (!gpu) {
    report["read_bandwidth_gbs"] = read_bandwidth / 1e9;
    report["decode_weight_bytes"] = decode_weight_bytes(cpu->weights());
  }
  if (!o.json) {
    std::printf(
        "model: %s\n  %s, hidden %d, %d layers, %d heads, %d KV heads, FFN %d, vocab %d\n"
        "  %s on %s, page size %d, best of %d runs\n",
        source.c_str(), std::string(architecture_class_name(c.architecture)).c_str(), c.hidden_size,
        c.num_layers, c.num_heads, c.num_kv_heads, c.intermediate_size, c.vocab_size,
        engine.c_str(), machine.c_str(), o.page_size, o.repeats);
    if (gpu)
      std::printf("  device copy bandwidth %.0f GB/s (read + write)\n", copy_bandwidth / 1e9);
    if (!gpu) {
      std::printf(
          "  memory read bandwidth %.1f GB/s (%d threads); a token reads %.1f MB of "
          "weights\n",
          read_bandwidth / 1e9, cpu->num_threads(), decode_weight_bytes(cpu->weights()) / 1e6);
    }
  }
  if (!o.profile_out.empty()) {
    auto profile = measure_profile(runner, o, machine, engine);
    if (!profile) return fail("--profile-out: " + profile.error().message);
    std::ofstream out(o.profile_out, std::ios::binary | std::ios::trunc);
    out << profile->to_json();
    out.close();
    if (!out) return fail("cannot write " + o.profile_out);
    if (o.json) {
      std::cout << nlohmann::json::parse(profile->to_json()).dump() << "\n";
    } else {
      std::printf("timing profile written to %s\n", o.profile_out.c_str());
    }
    return 0;
  }
  ForwardBench bench(runner, o);
  nlohmann::json results = nlohmann::json::array();
  // A decode step's floor: on the GPU its bytes over the copy bandwidth; on the CPU, for
  // one sequence, the weights' bytes over the read bandwidth (the KV read, small at these
  // contexts, left out), none for batches.
  auto floor_s = [&](int64_t batch, int64_t context) {
    if (gpu) return decode_step_bytes(c, batch, context) / copy_bandwidth;
    return batch == 1 && read_bandwidth > 0 ? decode_weight_bytes(cpu->weights()) / read_bandwidth
                                            : 0.0;
  };
  auto print = [&](const std::string& name, double tokens_per_s, double seconds,
                   const ForwardProfile& profile, double step_s = 0, double step_floor_s = 0) {
    nlohmann::json row = {{"scenario", name}, {"tokens_per_s", tokens_per_s}, {"seconds", seconds}};
    if (!gpu) row["phases"] = profile_json(profile);
    if (step_floor_s > 0) {
      row["step_ms"] = step_s * 1e3;
      row["floor_ms"] = step_floor_s * 1e3;
      row["of_floor"] = step_floor_s / step_s;
    }
    results.push_back(std::move(row));
    if (!o.json) {
      std::printf("\n%-28s %10.1f tokens/s  (%.3f s)\n", name.c_str(), tokens_per_s, seconds);
      if (step_floor_s > 0) {
        std::printf("  %.3f ms a step, floor %.3f ms: %.0f %% of the bandwidth floor\n",
                    step_s * 1e3, step_floor_s * 1e3, 100.0 * step_floor_s / step_s);
      }
      if (!gpu) std::printf("%s", profile.to_string().c_str());
    }
  };
  for (int64_t p : o.prompt_tokens) {
    auto r = bench.prefill(p);
    if (!r) return fail(r.error().message);
    print("prefill " + std::to_string(p), static_cast<double>(p) / r->seconds, r->seconds,
          r->profile);
  }
  if (o.decode_tokens > 0) {
    auto r = bench.decode();
    if (!r) return fail(r.error().message);
    const int64_t context = std::max<int64_t>(o.decode_context, 1);
    // The step's context: the middle of the run's.
    print(
        "decode " + std::to_string(o.decode_tokens) + " (context " + std::to_string(context) + ")",
        static_cast<double>(o.decode_tokens) / r->seconds, r->seconds, r->profile,
        r->seconds / static_cast<double>(o.decode_tokens),
        floor_s(1, context + o.decode_tokens / 2));
    for (int64_t b : o.decode_batches) {
      if (b <= 0) continue;  // "--decode-batches ''" parses as one 0
      auto br = bench.batched_decode(b);
      if (!br) return fail(br.error().message);
      print("batched decode x" + std::to_string(b) + " (context " +
                std::to_string(o.batch_context) + ")",
            static_cast<double>(b) / br->seconds, br->seconds, br->profile, br->seconds,
            floor_s(b, o.batch_context + ForwardBench::batch_steps(o) / 2));
    }
  }
  report["results"] = results;
  if (o.json) std::cout << report.dump() << "\n";
  return 0;
}

}  // namespace

void add_bench_forward(CLI::App& bench, int& exit_code) {
  auto o = std::make_shared<ForwardBenchOptions>();
  CLI::App* cmd = bench.add_subcommand(
      "forward", "Prefill and decode throughput of the forward pass, with a per-phase breakdown");
  cmd->add_option("--model", o->model_dir,
                  "Model folder or GGUF file (default: the preset, made in memory)");
  cmd->add_option("--device", o->device,
                  "Where the forward pass runs: cpu | cuda (the GPU's, cuda/gpu_model.h)")
      ->capture_default_str();
  cmd->add_flag("--disable-cuda-graph", o->disable_cuda_graph,
                "--device cuda: decode steps launched kernel by kernel, not replayed from the "
                "CUDA graph of their batch size");
  cmd->add_option(
         "--preset", o->preset,
         "Preset when no --model: tiny | demo | bench | qwen3-0.6b | qwen3-1.7b | qwen3-8b")
      ->capture_default_str();
  cmd->add_option("--arch", o->arch,
                  "Architecture of the preset: llama | qwen3 | qwen2 | mistral (default: the "
                  "preset's)");
  cmd->add_option("--threads", o->threads, "Compute threads")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  cmd->add_option("--prompt-tokens", o->prompt_tokens, "Prompt lengths to prefill")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--chunk-tokens", o->chunk_tokens,
                  "Prefill in chunks of this many tokens (0: one forward pass per prompt)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  cmd->add_option("--decode-tokens", o->decode_tokens, "Tokens to decode (0: skip decoding)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20))
      ->capture_default_str();
  cmd->add_option("--decode-context", o->decode_context,
                  "Tokens in the context before decoding starts")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20))
      ->capture_default_str();
  cmd->add_option("--decode-batches", o->decode_batches,
                  "Batched decode: sequences per step (comma-separated; empty: skip)")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--batch-context", o->batch_context, "Context of each batched sequence")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20))
      ->capture_default_str();
  cmd->add_option("--kv-dtype", o->kv_dtype, "KV cache dtype: f32 | f16 | bf16")
      ->capture_default_str();
  cmd->add_option(
         "--weight-dtype", o->weight_dtype,
         "In-memory weights: auto (the checkpoint's or GGUF file's; bf16 with --device cuda) | "
         "f32 | bf16 | q8_0 | q4_0 | q4_k (quantized at load)")
      ->capture_default_str();
  cmd->add_option("--page-size", o->page_size, "Tokens per KV page")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  cmd->add_option("--repeats", o->repeats, "Runs per scenario; the best is reported")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  cmd->add_flag("--json", o->json, "Print one JSON object instead of the table");
  cmd->add_option("--profile-out", o->profile_out,
                  "Measure a timing profile for `strata serve --simulate` and write it here "
                  "(instead of the throughput scenarios; docs/simulation.md)");
  cmd->add_option("--profile-machine", o->profile_machine,
                  "The profile's machine field (default: the CPU's name and the threads)");
  cmd->add_option("--profile-prefill-tokens", o->profile_prefill_tokens,
                  "Profile grid: new tokens of the prefill passes")
      ->delimiter(',')
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20))
      ->capture_default_str();
  cmd->add_option("--profile-batches", o->profile_batches,
                  "Profile grid: sequences per decode step")
      ->delimiter(',')
      ->check(CLI::Range(int64_t{1}, int64_t{4096}))
      ->capture_default_str();
  cmd->add_option("--profile-contexts", o->profile_contexts,
                  "Profile grid: context tokens (rounded up to pages)")
      ->delimiter(',')
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20))
      ->capture_default_str();
  cmd->add_option("--profile-decode-steps", o->profile_decode_steps,
                  "Decode steps timed per grid point")
      ->check(CLI::Range(int64_t{1}, int64_t{4096}))
      ->capture_default_str();
  cmd->callback([o, &exit_code] { exit_code = run_forward_bench(*o); });
}

}  // namespace strata::bench
