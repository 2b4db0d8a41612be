// Micro-benchmarks of the model engine on the `bench` preset (Llama, hidden 512, 8
// layers, 8 heads, 4 KV heads, FFN 1536, vocabulary 32,000, F32 weights):
//   BM_Prefill/<tokens>       one forward pass over a prompt (tokens/s counter)
//   BM_Decode/<context>       one decode step of one sequence after <context> tokens
//   BM_DecodeBatch/<batch>    one decode step of <batch> sequences of 512 tokens
//   BM_Matmul/<m>/<n>/<k>     C = A W^T through Matmul (GFLOP/s counter)
//   BM_Attention/<tokens>     prefill attention of one layer over <tokens> positions
// Threads: STRATA_BENCH_THREADS (default 2).
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <memory>
#include <vector>

#include "model/attention.h"
#include "model/make_model.h"
#include "model/matmul.h"
#include "model/model.h"
#include "model/rng.h"
#include "model/sampler.h"

namespace strata {
namespace {

int bench_threads() {
  const char* v = std::getenv("STRATA_BENCH_THREADS");
  return v != nullptr ? std::max(1, std::atoi(v)) : 2;
}

Model& bench_model() {
  static std::unique_ptr<Model> model = [] {
    auto m = make_preset_model(ModelPreset::kBench, Architecture::kLlama, 0,
                               ModelOptions{bench_threads(), std::nullopt});
    if (!m) std::abort();
    return std::move(*m);
  }();
  return *model;
}

std::vector<int32_t> ids(int64_t n, int32_t vocab) {
  std::vector<int32_t> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    out[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7919 + 13) % vocab);
  return out;
}

std::vector<PageId> pages(int32_t first, int64_t positions, int32_t page_size) {
  std::vector<PageId> out;
  for (int64_t p = 0; p * page_size < positions; ++p)
    out.push_back(make_page_id(first + static_cast<int32_t>(p)));
  return out;
}

void BM_Prefill(benchmark::State& state) {
  Model& model = bench_model();
  const int64_t n = state.range(0);
  auto pool = model.make_kv_pool(static_cast<int32_t>(n / 16 + 1), 16, KvDtype::kF32);
  const std::vector<int32_t> prompt = ids(n, model.config().vocab_size);
  const std::vector<PageId> table = pages(0, n, 16);
  std::vector<float> logits;
  for (auto _ : state) {
    ForwardSequence seq{prompt, 0, table, true};
    if (!model.forward(std::span(&seq, 1), **pool, logits)) state.SkipWithError("forward failed");
  }
  state.counters["tokens/s"] =
      benchmark::Counter(static_cast<double>(n), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_Prefill)->Arg(512)->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_Decode(benchmark::State& state) {
  Model& model = bench_model();
  const int64_t context = state.range(0);
  const int64_t steps = 4096;
  auto pool =
      model.make_kv_pool(static_cast<int32_t>((context + steps) / 16 + 2), 16, KvDtype::kF32);
  const std::vector<int32_t> prompt = ids(context, model.config().vocab_size);
  const std::vector<PageId> table = pages(0, context + steps, 16);
  std::vector<float> logits;
  ForwardSequence first{prompt, 0, table, true};
  if (!model.forward(std::span(&first, 1), **pool, logits)) state.SkipWithError("prefill failed");
  int64_t position = context;
  int32_t token = 1;
  for (auto _ : state) {
    if (position >= context + steps) position = context;  // rewrite the same tail
    ForwardSequence seq{std::span(&token, 1), position++, table, true};
    if (!model.forward(std::span(&seq, 1), **pool, logits)) state.SkipWithError("decode failed");
  }
  state.counters["tokens/s"] =
      benchmark::Counter(1.0, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_Decode)->Arg(16)->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_DecodeBatch(benchmark::State& state) {
  Model& model = bench_model();
  const int64_t batch = state.range(0);
  const int64_t context = 512;
  const int64_t per_seq = (context + 64) / 16 + 1;
  auto pool = model.make_kv_pool(static_cast<int32_t>(batch * per_seq), 16, KvDtype::kF32);
  std::vector<std::vector<PageId>> tables;
  std::vector<float> logits;
  for (int64_t b = 0; b < batch; ++b) {
    tables.push_back(pages(static_cast<int32_t>(b * per_seq), context + 64, 16));
    const std::vector<int32_t> prompt = ids(context, model.config().vocab_size);
    ForwardSequence seq{prompt, 0, tables.back(), false};
    if (!model.forward(std::span(&seq, 1), **pool, logits)) state.SkipWithError("prefill failed");
  }
  std::vector<int32_t> tokens(static_cast<size_t>(batch), 3);
  std::vector<ForwardSequence> seqs(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b) {
    seqs[static_cast<size_t>(b)] = ForwardSequence{std::span(&tokens[static_cast<size_t>(b)], 1),
                                                   context, tables[static_cast<size_t>(b)], true};
  }
  for (auto _ : state) {
    if (!model.forward(seqs, **pool, logits)) state.SkipWithError("decode failed");
  }
  state.counters["tokens/s"] =
      benchmark::Counter(static_cast<double>(batch), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_DecodeBatch)->Arg(8)->Arg(32)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_Matmul(benchmark::State& state) {
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  const WeightDtype dtype = state.range(3) == 0 ? WeightDtype::kF32 : WeightDtype::kBF16;
  ThreadPool pool(bench_threads());
  Matmul matmul(bench_threads());
  WeightMatrix w(n, k, dtype);
  Rng rng(1);
  std::vector<float> row(static_cast<size_t>(k));
  for (int64_t r = 0; r < n; ++r) {
    for (float& v : row) v = static_cast<float>(0.02 * rng.normal());
    w.set_row(r, row.data());
  }
  std::vector<float> a(static_cast<size_t>(m * k), 0.5f), c(static_cast<size_t>(m * n));
  for (auto _ : state) {
    matmul.run(pool, a.data(), m, k, w, c.data(), n, false);
    benchmark::DoNotOptimize(c.data());
  }
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * static_cast<double>(m * n * k) * 1e-9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
  state.counters["GB/s(W)"] = benchmark::Counter(static_cast<double>(w.size_bytes()) * 1e-9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_Matmul)
    ->Args({512, 3072, 512, 0})
    ->Args({2048, 3072, 512, 0})
    ->Args({2048, 512, 1536, 0})
    ->Args({1, 32000, 512, 0})
    ->Args({1, 3072, 512, 0})
    ->Args({1, 3072, 512, 1})
    ->Args({1, 32000, 512, 1})
    ->Args({512, 3072, 512, 1})
    ->Args({2048, 3072, 512, 1})
    ->Args({8, 3072, 512, 0})
    ->Args({32, 3072, 512, 0})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

void BM_Attention(benchmark::State& state) {
  const int64_t n = state.range(0);
  const AttentionShape shape{8, 4, 64, 0, 0.125f};
  KvPool kv(1, 4, 64, static_cast<int32_t>(n / 16 + 1), 16, KvDtype::kF32);
  Rng rng(2);
  for (int32_t p = 0; p < kv.num_pages(); ++p) {
    float* k = reinterpret_cast<float*>(kv.k_block(0, make_page_id(p)));
    float* v = reinterpret_cast<float*>(kv.v_block(0, make_page_id(p)));
    for (size_t i = 0; i < kv.block_elements(); ++i) {
      k[i] = static_cast<float>(rng.normal());
      v[i] = static_cast<float>(rng.normal());
    }
  }
  const std::vector<PageId> table = pages(0, n, 16);
  std::vector<float> q(static_cast<size_t>(n * 512)), out(q.size());
  for (float& x : q) x = static_cast<float>(rng.normal());
  ThreadPool pool(bench_threads());
  PagedAttention attention(shape, bench_threads());
  const AttentionSequence seq{0, static_cast<int32_t>(n), 0, table};
  for (auto _ : state) {
    attention.run(pool, std::span(&seq, 1), q.data(), 512, kv, 0, out.data(), 512);
    benchmark::DoNotOptimize(out.data());
  }
  // q.k and p.v over the causal triangle: 2 x 2 x heads x head_dim x n (n + 1) / 2.
  const double flops = 4.0 * 8 * 64 * static_cast<double>(n) * static_cast<double>(n + 1) / 2;
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_Attention)->Arg(512)->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime();

// One token sampled from a Qwen3-sized row (151,936 logits, normal with a few peaks) on the
// CPU: arg 0 greedy, 1 temperature 0.8, 2 with top_k 40, 3 with top_p 0.9, 4 with top_k 40
// and top_p 0.9 (the engine's path when a device leaves a row to the host).
void BM_Sample(benchmark::State& state) {
  const int kind = static_cast<int>(state.range(0));
  Rng rng(3);
  std::vector<float> logits(151936);
  for (float& v : logits) v = static_cast<float>(rng.normal());
  for (int i = 0; i < 12; ++i) logits[rng.next() % logits.size()] = 9.0f + static_cast<float>(i);
  SamplingParams p;
  p.temperature = kind == 0 ? 0.0f : 0.8f;
  p.top_k = kind == 2 || kind == 4 ? 40 : 0;
  p.top_p = kind == 3 || kind == 4 ? 0.9f : 1.0f;
  Sampler sampler(p, 1);
  for (auto _ : state) benchmark::DoNotOptimize(sampler.sample(logits).token);
}
BENCHMARK(BM_Sample)->DenseRange(0, 4)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace strata

BENCHMARK_MAIN();
