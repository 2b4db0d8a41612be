// 8-bit KV pages (issue 54), measured. A program that prints numbers, three tables:
//
//   capacity  bytes per page and tokens per GiB of pages for each KV dtype, for the bench
//             model's shape and Qwen3-0.6B's (page size 16), against BF16;
//   k_scales  K's quantization error with a scale per (token, KV head) against a scale per
//             (channel, KV head) over each 16-token page, for int8 and fp8: the relative
//             error of K and of q . k over every page of every layer. K comes from a
//             forward pass of the bench-size models (Llama and Qwen3 shapes, random
//             weights: make-model's) over 512 tokens, and from a synthetic K whose 4 channels
//             of 64 are 10x the rest (the outlier channels reported for trained models'
//             keys, KIVI), the case that favours per-channel scales;
//   decode    one decode step's attention (one layer, Qwen3-0.6B's 16 heads, 8 KV heads,
//             head_dim 128) over 16K and 32K tokens of context, batch 1 and 4, per dtype,
//             the dtypes taking turns call by call (a shared machine's noise falls on all):
//             the fastest and the median of 21 calls, in ms.
//
//   logits    teacher-forced logits with 8-bit (and F32) pages against BF16 pages: mean and
//             max KL and top-1 agreement, on the bench-size models and Qwen3-0.6B's shape
//             (random weights, LM head scale 8), prompt then BF16's greedy tokens.
//
// Run: build-kv8/src/bench/micro/bench_kv_quant [capacity|k_scales|logits|decode ...]
// Threads: STRATA_BENCH_THREADS (default 2).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "memory/kv_dtype.h"
#include "memory/kv_pool.h"
#include "memory/kv_quant.h"
#include "model/attention.h"
#include "model/make_model.h"
#include "model/model.h"
#include "model/rng.h"
#include "model/thread_pool.h"

namespace strata {
namespace {

int bench_threads() {
  const char* v = std::getenv("STRATA_BENCH_THREADS");
  return v != nullptr ? std::max(1, std::atoi(v)) : 2;
}

constexpr KvDtype kAll[] = {KvDtype::kF32, KvDtype::kF16, KvDtype::kBF16, KvDtype::kInt8,
                            KvDtype::kFp8E4M3};

void capacity() {
  struct Shape {
    const char* name;
    int32_t layers, kv_heads, head_dim;
  };
  const Shape shapes[] = {{"bench (Llama, 8 layers, 4 KV heads, head_dim 64)", 8, 4, 64},
                          {"qwen3-0.6b (28 layers, 8 KV heads, head_dim 128)", 28, 8, 128}};
  std::printf("== capacity: page size 16, 1 GiB of pages ==\n");
  for (const Shape& s : shapes) {
    std::printf("%s\n  %-9s %12s %14s %9s\n", s.name, "dtype", "page bytes", "tokens/GiB",
                "vs bf16");
    const KvPoolShape bf16{s.layers, s.kv_heads, s.head_dim, 1, 16, KvDtype::kBF16};
    const double bf16_tokens = std::floor(0x1p30 / static_cast<double>(kv_page_bytes(bf16))) * 16;
    for (KvDtype d : kAll) {
      const KvPoolShape shape{s.layers, s.kv_heads, s.head_dim, 1, 16, d};
      const double tokens = std::floor(0x1p30 / static_cast<double>(kv_page_bytes(shape))) * 16;
      std::printf("  %-9s %12zu %14.0f %8.3fx\n", std::string(kv_dtype_name(d)).c_str(),
                  kv_page_bytes(shape), tokens, tokens / bf16_tokens);
    }
  }
}

// ---- K's scale granularity ----

struct ErrorSums {
  double k_err = 0, k_norm = 0, s_err = 0, s_norm = 0;
  void add(const std::vector<float>& k, const std::vector<float>& kq, const std::vector<float>& q,
           int32_t rows, int32_t hd) {
    for (size_t i = 0; i < k.size(); ++i) {
      k_err += (k[i] - kq[i]) * static_cast<double>(k[i] - kq[i]);
      k_norm += k[i] * static_cast<double>(k[i]);
    }
    for (int32_t r = 0; r < rows; ++r) {
      double s = 0, sq = 0;
      for (int32_t d = 0; d < hd; ++d) {
        s += static_cast<double>(q[static_cast<size_t>(d)]) * k[static_cast<size_t>(r * hd + d)];
        sq += static_cast<double>(q[static_cast<size_t>(d)]) * kq[static_cast<size_t>(r * hd + d)];
      }
      s_err += (s - sq) * (s - sq);
      s_norm += s * s;
    }
  }
};

// One page's K of one head ([rows][hd]), quantized per token or per channel.
std::vector<float> quantize_page(KvDtype dtype, const std::vector<float>& k, int32_t rows,
                                 int32_t hd, bool per_channel) {
  std::vector<float> out(k.size());
  std::vector<uint8_t> codes(k.size());
  const size_t n = static_cast<size_t>(per_channel ? rows : hd);
  const size_t stride = per_channel ? static_cast<size_t>(hd) : 1;
  const int32_t lines = per_channel ? hd : rows;
  for (int32_t i = 0; i < lines; ++i) {
    const size_t first = per_channel ? static_cast<size_t>(i) : static_cast<size_t>(i * hd);
    std::vector<float> line(n);
    for (size_t j = 0; j < n; ++j) line[j] = k[first + j * stride];
    const float scale = quantize_kv_row(dtype, line.data(), n, codes.data());
    dequantize_kv_row(dtype, codes.data(), scale, line.data(), n);
    for (size_t j = 0; j < n; ++j) out[first + j * stride] = line[j];
  }
  return out;
}

// Pages of K: [pages][rows][hd], each run through both granularities and both dtypes.
void report_k(const char* source, const std::vector<std::vector<float>>& pages, int32_t hd,
              Rng& rng) {
  const int32_t rows = 16;
  for (KvDtype dtype : {KvDtype::kInt8, KvDtype::kFp8E4M3}) {
    ErrorSums token, channel;
    for (const std::vector<float>& k : pages) {
      std::vector<float> q(static_cast<size_t>(hd));
      for (float& x : q) x = static_cast<float>(rng.normal());
      token.add(k, quantize_page(dtype, k, rows, hd, false), q, rows, hd);
      channel.add(k, quantize_page(dtype, k, rows, hd, true), q, rows, hd);
    }
    std::printf("  %-44s %-9s %11.5f %11.5f %12.5f %12.5f\n", source,
                std::string(kv_dtype_name(dtype)).c_str(), std::sqrt(token.k_err / token.k_norm),
                std::sqrt(channel.k_err / channel.k_norm), std::sqrt(token.s_err / token.s_norm),
                std::sqrt(channel.s_err / channel.s_norm));
  }
}

void k_scales() {
  std::printf(
      "== k_scales: relative RMS error, per-token scale against per-channel (16-token page) ==\n"
      "  %-44s %-9s %11s %11s %12s %12s\n",
      "K from", "dtype", "K token", "K channel", "q.k token", "q.k channel");
  Rng rng(7);
  for (Architecture arch : {Architecture::kLlama, Architecture::kQwen3}) {
    auto model = make_preset_model(ModelPreset::kBench, arch, 0,
                                   ModelOptions{.num_threads = bench_threads()});
    if (!model) {
      std::fprintf(stderr, "cannot make the bench model: %s\n", model.error().message.c_str());
      std::exit(1);
    }
    const ModelConfig& c = (*model)->config();
    const int32_t n = 512;
    auto pool = (*model)->make_kv_pool(n / 16, 16, KvDtype::kF32);
    std::vector<int32_t> prompt(static_cast<size_t>(n));
    for (int32_t i = 0; i < n; ++i) prompt[static_cast<size_t>(i)] = (i * 7919 + 13) % c.vocab_size;
    std::vector<PageId> table;
    for (int32_t p = 0; p < n / 16; ++p) table.push_back(make_page_id(p));
    ForwardSequence seq{prompt, 0, table, true};
    std::vector<float> logits;
    if (!(*model)->forward(std::span(&seq, 1), **pool, logits)) std::exit(1);
    const int32_t hd = c.head_dim;
    std::vector<std::vector<float>> pages;
    std::vector<float> k(static_cast<size_t>(c.num_kv_heads * hd)), v(k.size());
    for (int32_t layer = 0; layer < c.num_layers; ++layer) {
      for (int32_t p = 0; p < n / 16; ++p) {
        std::vector<std::vector<float>> heads(static_cast<size_t>(c.num_kv_heads));
        for (int32_t slot = 0; slot < 16; ++slot) {
          (*pool)->read_token(layer, make_page_id(p), slot, k.data(), v.data());
          for (int32_t h = 0; h < c.num_kv_heads; ++h) {
            heads[static_cast<size_t>(h)].insert(heads[static_cast<size_t>(h)].end(),
                                                 k.begin() + h * hd, k.begin() + (h + 1) * hd);
          }
        }
        for (auto& h : heads) pages.push_back(std::move(h));
      }
    }
    report_k(arch == Architecture::kLlama ? "bench model, Llama (RoPE'd K)"
                                          : "bench model, Qwen3 (k_norm, RoPE'd K)",
             pages, hd, rng);
  }
  std::vector<std::vector<float>> synthetic;
  for (int i = 0; i < 2048; ++i) {
    std::vector<float> k(16 * 64);
    for (size_t j = 0; j < k.size(); ++j) {
      const bool outlier = j % 64 < 4;
      k[j] = static_cast<float>(rng.normal()) * (outlier ? 10.0f : 1.0f);
    }
    synthetic.push_back(std::move(k));
  }
  report_k("synthetic, 4 of 64 channels 10x", synthetic, 64, rng);
}

// ---- teacher-forced logits ----

// Logits after the prompt and after each forced token, with pages of `dtype`.
std::vector<std::vector<float>> forced_logits(Model& model, KvDtype dtype,
                                              const std::vector<int32_t>& prompt,
                                              const std::vector<int32_t>& forced) {
  const int64_t total = static_cast<int64_t>(prompt.size() + forced.size());
  auto pool = model.make_kv_pool(static_cast<int32_t>(total / 16 + 1), 16, dtype);
  if (!pool) std::exit(1);
  std::vector<PageId> table;
  for (int64_t p = 0; p * 16 < total; ++p) table.push_back(make_page_id(static_cast<int32_t>(p)));
  std::vector<std::vector<float>> out(1);
  ForwardSequence first{prompt, 0, table, true};
  if (!model.forward(std::span(&first, 1), **pool, out.back())) std::exit(1);
  for (size_t i = 0; i < forced.size(); ++i) {
    out.emplace_back();
    ForwardSequence seq{std::span(&forced[i], 1), static_cast<int64_t>(prompt.size() + i), table,
                        true};
    if (!model.forward(std::span(&seq, 1), **pool, out.back())) std::exit(1);
  }
  return out;
}

std::vector<double> log_softmax(const std::vector<float>& logits) {
  const double mx = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float x : logits) sum += std::exp(x - mx);
  std::vector<double> out(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) out[i] = logits[i] - mx - std::log(sum);
  return out;
}

// KL(BF16 pages || 8-bit pages) and top-1 agreement over a prompt and the tokens BF16 pages
// choose greedily after it, fed to every run (teacher forcing); a peaky LM head
// (make-model's --lm-head-scale 8: logits of standard deviation about 16).
void logits() {
  struct Case {
    const char* name;
    ModelPreset preset;
    Architecture arch;
    int32_t prompt, steps;
  };
  const Case cases[] = {
      {"bench, Llama", ModelPreset::kBench, Architecture::kLlama, 512, 64},
      {"bench, Qwen3", ModelPreset::kBench, Architecture::kQwen3, 512, 64},
      {"qwen3-0.6b shape", ModelPreset::kQwen3_0_6B, Architecture::kQwen3, 256, 32}};
  std::printf(
      "== logits: teacher-forced against BF16 pages, LM head scale 8 ==\n"
      "  %-18s %-9s %6s %12s %12s %10s\n",
      "model", "dtype", "steps", "mean KL", "max KL", "top-1");
  for (const Case& c : cases) {
    const ModelConfig config = preset_config(c.preset, c.arch);
    const TensorStore tensors = make_random_tensors(config, 5, TensorDtype::kF32, 8.0);
    auto model = Model::from_tensors(config, tensors, ModelOptions{.num_threads = bench_threads()});
    if (!model) {
      std::fprintf(stderr, "%s: %s\n", c.name, model.error().message.c_str());
      std::exit(1);
    }
    std::vector<int32_t> prompt(static_cast<size_t>(c.prompt));
    for (int32_t i = 0; i < c.prompt; ++i) {
      prompt[static_cast<size_t>(i)] = (i * 7919 + 13) % config.vocab_size;
    }
    // BF16's greedy continuation.
    std::vector<int32_t> forced;
    {
      const int64_t total = c.prompt + c.steps;
      auto pool = (*model)->make_kv_pool(static_cast<int32_t>(total / 16 + 1), 16, KvDtype::kBF16);
      if (!pool) std::exit(1);
      std::vector<PageId> table;
      for (int64_t p = 0; p * 16 < total; ++p) {
        table.push_back(make_page_id(static_cast<int32_t>(p)));
      }
      std::vector<float> l;
      ForwardSequence first{prompt, 0, table, true};
      if (!(*model)->forward(std::span(&first, 1), **pool, l)) std::exit(1);
      for (int32_t s = 0; s + 1 < c.steps; ++s) {
        forced.push_back(static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin()));
        ForwardSequence seq{std::span(&forced.back(), 1), c.prompt + s, table, true};
        if (!(*model)->forward(std::span(&seq, 1), **pool, l)) std::exit(1);
      }
    }
    const auto want = forced_logits(**model, KvDtype::kBF16, prompt, forced);
    for (KvDtype dtype : {KvDtype::kInt8, KvDtype::kFp8E4M3, KvDtype::kF32}) {
      const auto got = forced_logits(**model, dtype, prompt, forced);
      double kl_sum = 0, kl_max = 0;
      int agree = 0;
      for (size_t step = 0; step < want.size(); ++step) {
        const std::vector<double> p = log_softmax(want[step]), q = log_softmax(got[step]);
        double kl = 0;
        for (size_t i = 0; i < p.size(); ++i) kl += std::exp(p[i]) * (p[i] - q[i]);
        kl_sum += kl;
        kl_max = std::max(kl_max, kl);
        const auto top = [](const std::vector<float>& l) {
          return std::max_element(l.begin(), l.end()) - l.begin();
        };
        agree += top(want[step]) == top(got[step]) ? 1 : 0;
      }
      std::printf("  %-18s %-9s %6zu %12.3e %12.3e %9.1f%%\n", c.name,
                  std::string(kv_dtype_name(dtype)).c_str(), want.size(),
                  kl_sum / static_cast<double>(want.size()), kl_max,
                  100.0 * agree / static_cast<double>(want.size()));
    }
  }
}

// ---- decode attention ----

void decode() {
  const AttentionShape shape{16, 8, 128, 0, 1.0f / std::sqrt(128.0f)};
  const int threads = bench_threads();
  ThreadPool pool(threads);
  PagedAttention attention(shape, threads);
  constexpr KvDtype kDtypes[] = {KvDtype::kBF16, KvDtype::kInt8, KvDtype::kFp8E4M3, KvDtype::kF32};
  constexpr int kReps = 21;
  std::printf(
      "== decode: one layer's attention for one new token per sequence (16 heads, 8 KV "
      "heads, head_dim 128, page 16), %d threads; the dtypes take turns, %d calls each "
      "==\n  %-8s %-6s %-9s %9s %9s %12s %12s\n",
      threads, kReps, "context", "batch", "dtype", "min ms", "median ms", "min vs bf16",
      "med vs bf16");
  for (int64_t context : {int64_t{16384}, int64_t{32768}}) {
    for (int32_t batch : {1, 4}) {
      const int32_t per_seq = static_cast<int32_t>(context / 16);
      std::vector<std::unique_ptr<KvPool>> pools;
      for (KvDtype dtype : kDtypes) {
        pools.push_back(std::make_unique<KvPool>(1, 8, 128, per_seq * batch, 16, dtype));
      }
      Rng rng(3);
      std::vector<float> k(8 * 128), v(8 * 128);
      for (int32_t p = 0; p < per_seq * batch; ++p) {
        for (int32_t slot = 0; slot < 16; ++slot) {
          for (float& x : k) x = static_cast<float>(rng.normal());
          for (float& x : v) x = static_cast<float>(rng.normal());
          for (auto& kv : pools) kv->write_token(0, make_page_id(p), slot, k.data(), v.data());
        }
      }
      std::vector<std::vector<PageId>> tables(static_cast<size_t>(batch));
      std::vector<AttentionSequence> seqs;
      for (int32_t b = 0; b < batch; ++b) {
        for (int32_t p = 0; p < per_seq; ++p) {
          tables[static_cast<size_t>(b)].push_back(make_page_id(b * per_seq + p));
        }
        seqs.push_back(AttentionSequence{b, 1, context - 1, tables[static_cast<size_t>(b)]});
      }
      std::vector<float> q(static_cast<size_t>(batch) * 16 * 128), out(q.size());
      for (float& x : q) x = static_cast<float>(rng.normal());
      std::vector<std::vector<double>> ms(pools.size());
      for (int rep = 0; rep <= kReps; ++rep) {
        for (size_t i = 0; i < pools.size(); ++i) {
          const auto t0 = std::chrono::steady_clock::now();
          attention.run(pool, seqs, q.data(), 16 * 128, *pools[i], 0, out.data(), 16 * 128);
          const auto t1 = std::chrono::steady_clock::now();
          if (rep > 0) ms[i].push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
        }
      }
      for (auto& m : ms) std::sort(m.begin(), m.end());
      for (size_t i = 0; i < pools.size(); ++i) {
        std::printf("  %-8lld %-6d %-9s %9.3f %9.3f %11.2fx %11.2fx\n",
                    static_cast<long long>(context), batch,
                    std::string(kv_dtype_name(kDtypes[i])).c_str(), ms[i].front(),
                    ms[i][ms[i].size() / 2], ms[i].front() / ms[0].front(),
                    ms[i][ms[i].size() / 2] / ms[0][ms[0].size() / 2]);
      }
    }
  }
}

}  // namespace
}  // namespace strata

int main(int argc, char** argv) {
  std::vector<std::string> what(argv + 1, argv + argc);
  if (what.empty()) what = {"capacity", "k_scales", "logits", "decode"};
  for (const std::string& w : what) {
    if (w == "capacity") {
      strata::capacity();
    } else if (w == "k_scales") {
      strata::k_scales();
    } else if (w == "decode") {
      strata::decode();
    } else if (w == "logits") {
      strata::logits();
    } else {
      std::fprintf(stderr, "unknown table '%s' (capacity, k_scales, logits, decode)\n", w.c_str());
      return 2;
    }
  }
  return 0;
}
