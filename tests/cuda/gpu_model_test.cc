// The model's forward pass on the GPU (cuda/gpu_model.h) against the CPU engine's: the same
// random-weight model (the demo preset with head_dim 64: gpu_test_config) in three
// architectures (Qwen3's q/k norms, Llama, Qwen2's QKV biases), the same batches — whole
// prompts, a continuation over a cached prefix, a sequence sharing another's first page,
// then decode steps — and the logits compared row by row within BF16's rounding of weights
// and activations; decode steps replayed from CUDA graphs against the same steps launched
// kernel by kernel, bit for bit.
//
// Without a GPU (or CUDA) the comparisons skip (fail under STRATA_REQUIRE_GPU=1); the
// refusals that come before any device work, the shape checks of every model the GPU tests
// make and the decode steps' shapes run everywhere.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "cuda/gpu_model.h"
#include "cuda/kernels.h"
#include "gpu_test_util.h"
#include "model/make_model.h"
#include "model/model.h"
#include "model/sampler.h"

namespace strata::cuda {
namespace {

TEST(GpuModelTest, ShapesTheKernelsCannotRunAreRefusedByName) {
  auto tiny = make_preset_model(ModelPreset::kTiny, Architecture::kQwen3, 1);
  ASSERT_TRUE(tiny.has_value()) << tiny.error().message;
  GpuModelOptions o{.num_pages = 8};
  auto refused = GpuModel::create((*tiny)->config(), (*tiny)->weights(), o);
  ASSERT_FALSE(refused.has_value());
  EXPECT_EQ(refused.error().code, ErrorCode::kUnsupported);
  EXPECT_NE(refused.error().message.find("head_dim 32"), std::string::npos)
      << refused.error().message;

  auto demo = make_preset_model(ModelPreset::kDemo, Architecture::kQwen3, 1);
  ASSERT_TRUE(demo.has_value()) << demo.error().message;
  ModelConfig windowed = (*demo)->config();
  windowed.sliding_window = 128;
  auto sliding = GpuModel::create(windowed, (*demo)->weights(), o);
  ASSERT_FALSE(sliding.has_value());
  EXPECT_NE(sliding.error().message.find("sliding-window"), std::string::npos);
  o.num_pages = 0;
  auto no_pages = GpuModel::create((*demo)->config(), (*demo)->weights(), o);
  ASSERT_FALSE(no_pages.has_value());
  EXPECT_EQ(no_pages.error().code, ErrorCode::kInvalidArgument);
  // Where there is no GPU (or no CUDA), creation says so instead.
  o.num_pages = 8;
  auto made = GpuModel::create((*demo)->config(), (*demo)->weights(), o);
  if (!probe_device(0)) {
    ASSERT_FALSE(made.has_value());
    EXPECT_EQ(made.error().code, ErrorCode::kUnsupported);
  }
}

// A batch's sequences: tokens, where they start, their pages.
struct Seq {
  std::vector<int32_t> tokens;
  int64_t start = 0;
  std::vector<PageId> pages;
};

std::vector<ForwardSequence> as_batch(const std::vector<Seq>& seqs) {
  std::vector<ForwardSequence> batch;
  for (const Seq& s : seqs) {
    batch.push_back(ForwardSequence{.token_ids = s.tokens,
                                    .start_position = s.start,
                                    .page_table = s.pages,
                                    .want_logits = true});
  }
  return batch;
}

// Each row of `got` against `want`: within kBf16LogitError (4 %) of the row's largest |logit|
// (BF16 weights and activations against the CPU's F32); a failing row names its first few
// tokens out of bounds and its largest difference.
void expect_logits_close(const std::vector<float>& got, const std::vector<float>& want,
                         int32_t vocab, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t r = 0; r * vocab < want.size(); ++r) {
    const float* g = got.data() + r * vocab;
    const float* w = want.data() + r * vocab;
    float scale = 1e-3f;
    for (int32_t v = 0; v < vocab; ++v) scale = std::max(scale, std::fabs(w[v]));
    int bad = 0;
    float worst = 0.0f;
    int32_t worst_at = 0;
    for (int32_t v = 0; v < vocab; ++v) {
      const float diff = std::fabs(g[v] - w[v]);
      if (!(diff <= worst)) {  // NaN counts as the worst
        worst = diff;
        worst_at = v;
      }
      if (!(diff <= kBf16LogitError * scale) && bad++ < 5) {
        ADD_FAILURE() << what << " row " << r << " token " << v << ": " << g[v] << " vs " << w[v]
                      << " (bound " << kBf16LogitError * scale << ")";
      }
    }
    if (bad > 0) {
      ADD_FAILURE() << what << " row " << r << ": " << bad << " of " << vocab
                    << " logits out of bounds; the largest difference " << worst << " at token "
                    << worst_at << " (" << g[worst_at] << " vs " << w[worst_at]
                    << "), the row's largest |logit| " << scale;
    }
  }
}

// Every model the GPU tests make (kGpuTestShapes, through gpu_test_config) passes the checks
// GpuModel::create makes before any device work, with the options the tests give it: on
// every machine, so that a model the kernels cannot run fails here rather than on the
// first GPU run. The presets as make_model gives them would not (their head size).
TEST(GpuModelTest, EveryGpuTestModelPassesTheShapeChecks) {
  const GpuModelOptions options[] = {
      {.num_pages = 32, .page_size = 16, .max_batch_tokens = 256, .max_batch_sequences = 8},
      {.num_pages = 64, .page_size = 16, .max_batch_tokens = 256 + 8, .max_batch_sequences = 8},
      gpu_options_for_engine(16, 1024, 4, 256),  // test_device_test's small engine
  };
  for (const GpuTestShape& shape : kGpuTestShapes) {
    const std::string name = gpu_test_shape_name(shape.preset, shape.arch);
    auto config = gpu_test_config(shape.preset, shape.arch);
    ASSERT_TRUE(config.has_value()) << name << ": " << config.error().message;
    EXPECT_EQ(config->head_dim, 64) << name;
    for (const GpuModelOptions& o : options) {
      const Status st = GpuModel::check(*config, o);
      EXPECT_TRUE(st.has_value()) << name << ": " << st.error().message;
    }
  }
  for (Architecture arch : {Architecture::kLlama, Architecture::kQwen2}) {
    const Status st = GpuModel::check(preset_config(ModelPreset::kDemo, arch), options[0]);
    ASSERT_FALSE(st.has_value()) << architecture_model_type(arch);
    EXPECT_NE(st.error().message.find("head_dim 32"), std::string::npos) << st.error().message;
  }
  // A model made outside the list is refused by the helper, naming the list.
  auto unlisted = gpu_test_config(ModelPreset::kBench, Architecture::kLlama);
  ASSERT_FALSE(unlisted.has_value());
  EXPECT_NE(unlisted.error().message.find("kGpuTestShapes"), std::string::npos);
}

// A decode step's shape follows its batch-size bucket and its longest context only (on every
// machine: no device work): a short context gets a short table and no more key ranges than
// its length calls for; every step of one bucket gets the same shape.
TEST(GpuModelTest, DecodeStepsTakeTheShapeOfTheirBucketAndContext) {
  const ModelConfig c = preset_config(ModelPreset::kQwen3_8B, Architecture::kQwen3);
  GpuModelOptions o{.num_pages = 4096,
                    .page_size = 16,
                    .max_batch_tokens = 8192 + 512,
                    .max_batch_sequences = 256};
  const int32_t sms = 132;
  using Contexts = std::vector<int64_t>;
  const DecodeShape short_one = gpu_decode_shape(c, o, sms, Contexts{100});  // 7 pages
  EXPECT_EQ(short_one, (DecodeShape{.seqs = 1, .table_pages = 8, .num_splits = 1}));
  const DecodeShape three = gpu_decode_shape(c, o, sms, Contexts{5, 1000, 17});  // 63 pages
  EXPECT_EQ(three.seqs, 4);
  EXPECT_EQ(three.table_pages, 64);
  EXPECT_EQ(three.num_splits, decode_attention_splits(4, c.num_kv_heads, 64 * 16, sms));
  EXPECT_EQ(gpu_decode_shape(c, o, sms, Contexts{1, 1024, 2, 3}), three);
  const auto longest = static_cast<int64_t>(c.max_position_embeddings);
  const int32_t all_pages = static_cast<int32_t>((longest + 15) / 16);
  const DecodeShape full = gpu_decode_shape(c, o, sms, Contexts{longest});
  EXPECT_EQ(full.table_pages, all_pages);  // a power of two would be wider: capped
  EXPECT_EQ(full.num_splits, decode_attention_splits(1, c.num_kv_heads, all_pages * 16, sms));
  EXPECT_GT(full.num_splits, short_one.num_splits);
  // Not bucketed: no sequence, more than the largest bucket, more than the options allow.
  EXPECT_EQ(gpu_decode_shape(c, o, sms, Contexts{}).seqs, 0);
  EXPECT_EQ(gpu_decode_shape(c, o, sms, Contexts(257, 10)).seqs, 0);
  EXPECT_EQ(gpu_decode_shape(c, o, sms, Contexts(200, 10)).seqs, 256);
  o.max_batch_sequences = 10;
  EXPECT_EQ(gpu_decode_shape(c, o, sms, Contexts(9, 10)).seqs, 0);  // bucket 12 > 10
  EXPECT_EQ(gpu_decode_shape(c, o, sms, Contexts(8, 10)).seqs, 8);
}

// --mem-fraction-static subtracts the forward's activation peak: the scratch create()
// allocates, which grows with the batch the options allow (on every machine: no device work).
TEST(GpuModelTest, TheScratchGrowsWithTheBatchAndHoldsTheLogitRows) {
  const ModelConfig c = preset_config(ModelPreset::kQwen3_8B, Architecture::kQwen3);
  const GpuModelOptions small{.num_pages = 1, .max_batch_tokens = 1, .max_batch_sequences = 1};
  GpuModelOptions big{.num_pages = 1, .max_batch_tokens = 8192 + 512, .max_batch_sequences = 512};
  const int64_t one = gpu_scratch_bytes(c, small, 132);
  const int64_t many = gpu_scratch_bytes(c, big, 132);
  EXPECT_GE(one, int64_t{c.vocab_size} * 4);  // one row of F32 logits
  EXPECT_GE(many,
            int64_t{512} * c.vocab_size * 4 + int64_t{8704} * (c.q_size() + 2 * c.kv_size()) * 2);
  EXPECT_LT(many, int64_t{8} << 30);  // an 8B model's batch of 8,704 tokens: a few GB
  big.max_batch_tokens *= 2;
  EXPECT_GT(gpu_scratch_bytes(c, big, 132), many);
}

TEST(GpuModelTest, LogitsMatchTheCpuEngineStepByStep) {
  STRATA_NEED_GPU();
  for (bool tensor_cores : {true, false}) {
    for (Architecture arch : {Architecture::kQwen3, Architecture::kLlama, Architecture::kQwen2}) {
      const std::string what =
          std::string(architecture_model_type(arch)) +
          (tensor_cores ? ", prefill on tensor cores" : ", prefill on CUDA cores");
      auto cpu = make_gpu_test_model(ModelPreset::kDemo, arch, 7);
      ASSERT_TRUE(cpu.has_value()) << cpu.error().message;
      const ModelConfig& config = (*cpu)->config();
      const int32_t pages = 32, page_size = 16;
      GpuModelOptions o{.num_pages = pages,
                        .page_size = page_size,
                        .max_batch_tokens = 256,
                        .max_batch_sequences = 8,
                        .tensor_core_prefill = tensor_cores};
      auto gpu = GpuModel::create(config, (*cpu)->weights(), o);
      ASSERT_TRUE(gpu.has_value()) << what << ": " << gpu.error().message;
      auto cpu_pool = (*cpu)->make_kv_pool(pages, page_size, KvDtype::kF32);
      auto gpu_pool = (*gpu)->make_kv_pool(pages, page_size, KvDtype::kF32);
      ASSERT_TRUE(cpu_pool.has_value() && gpu_pool.has_value());
      std::mt19937 rng(11);
      const auto tokens = [&](int n) {
        std::vector<int32_t> t(static_cast<size_t>(n));
        for (auto& x : t)
          x = static_cast<int32_t>(rng() % static_cast<uint32_t>(config.vocab_size));
        return t;
      };
      const auto step = [&](const std::vector<Seq>& seqs, const std::string& name) {
        const auto batch = as_batch(seqs);
        ForwardOutput want, got;
        ASSERT_TRUE((*cpu)->forward(batch, **cpu_pool, want).has_value()) << what << " " << name;
        const Status st = (*gpu)->forward(batch, **gpu_pool, got);
        ASSERT_TRUE(st.has_value()) << what << " " << name << ": " << st.error().message;
        expect_logits_close(got.logits, want.logits, config.vocab_size, what + " " + name);
      };
      // Whole prompts of 17 and 40 tokens.
      Seq a{tokens(17), 0, {make_page_id(3), make_page_id(9)}};
      Seq b{tokens(40), 0, {make_page_id(5), make_page_id(6), make_page_id(7)}};
      step({a, b}, "prompts");
      // a goes on over its cached 17 tokens; c shares a's first page (16 tokens) and brings
      // its own; b decodes one token in the same batch.
      Seq a2{tokens(5), 17, a.pages};
      Seq c{tokens(9), 16, {make_page_id(3), make_page_id(12)}};
      Seq b2{tokens(1), 40, b.pages};
      step({a2, c, b2}, "continuations");
      // Decode steps: one token each, every sequence (the decode kernel's path).
      for (int k = 0; k < 3; ++k) {
        Seq a3{tokens(1), 22 + k, a.pages};
        Seq c3{tokens(1), 25 + k, c.pages};
        Seq b3{tokens(1),
               41 + k,
               {make_page_id(5), make_page_id(6), make_page_id(7), make_page_id(8)}};
        step({a3, c3, b3}, "decode " + std::to_string(k));
      }
    }
  }
}

// Decode rows with sampling are drawn on the device: their tokens come back (not their
// logits), the same as the Sampler draws from the logits the same step gives without it, for
// greedy and sampled rows, with log-probabilities; a row without sampling beside them still
// gets its logits.
TEST(GpuModelTest, RowsWithSamplingBringBackTheirTokens) {
  STRATA_NEED_GPU();
  auto cpu = make_gpu_test_model(ModelPreset::kDemo, Architecture::kQwen3, 7);
  ASSERT_TRUE(cpu.has_value()) << cpu.error().message;
  const int32_t pages = 16, page_size = 16;
  GpuModelOptions o{
      .num_pages = pages, .page_size = page_size, .max_batch_tokens = 64, .max_batch_sequences = 4};
  auto gpu = GpuModel::create((*cpu)->config(), (*cpu)->weights(), o);
  ASSERT_TRUE(gpu.has_value()) << gpu.error().message;
  auto pool = (*gpu)->make_kv_pool(pages, page_size, KvDtype::kF32);
  ASSERT_TRUE(pool.has_value());
  std::vector<int32_t> a(20, 5), b(33, 9);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<int32_t>(i * 7 + 3);
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<int32_t>(i * 11 + 1);
  const std::vector<PageId> pa{make_page_id(0), make_page_id(1)};
  const std::vector<PageId> pb{make_page_id(2), make_page_id(3), make_page_id(4)};
  ForwardOutput out;
  ForwardSequence prompts[] = {{a, 0, pa, true}, {b, 0, pb, true}};
  ASSERT_TRUE((*gpu)->forward(prompts, **pool, out).has_value());
  EXPECT_TRUE(out.sampled.empty());  // prompt rows without sampling want their logits
  const int32_t ta = 17, tb = 23;
  ForwardSequence step[] = {{std::span(&ta, 1), 20, pa, true}, {std::span(&tb, 1), 33, pb, true}};
  ASSERT_TRUE((*gpu)->forward(step, **pool, out).has_value());
  const auto vocab = static_cast<size_t>((*cpu)->config().vocab_size);
  const std::vector<float> logits = out.logits;
  auto row = [&](size_t r) { return std::span<const float>(logits.data() + r * vocab, vocab); };
  const RowSampling greedy{.logprobs = true, .top_logprobs = 2};
  const RowSampling warm{.temperature = 0.8f, .top_k = 20, .top_p = 0.9f, .uniform = 0.37};
  // The same step again (its K and V rewritten in place), drawn on the device.
  step[0].sampling = greedy;
  step[1].sampling = warm;
  ASSERT_TRUE((*gpu)->forward(step, **pool, out).has_value());
  ASSERT_EQ(out.sampled.size(), 2u);
  const SampledToken g = sample_row(row(0), greedy);
  EXPECT_EQ(out.sampled[0].token, g.token);
  EXPECT_NEAR(out.sampled[0].logprob, g.logprob, 1e-4);
  ASSERT_EQ(out.sampled[0].top_logprobs.size(), 2u);
  EXPECT_EQ(out.sampled[0].top_logprobs[1].token, g.top_logprobs[1].token);
  EXPECT_EQ(out.sampled[1].token, sample_row(row(1), warm).token);
  // A row without sampling beside one with: its logits come back, the other's token.
  step[1].sampling.reset();
  ASSERT_TRUE((*gpu)->forward(step, **pool, out).has_value());
  ASSERT_EQ(out.sampled.size(), 2u);
  EXPECT_EQ(out.sampled[0].token, g.token);
  EXPECT_EQ(out.sampled[1].token, -1);
  float worst = 0.0f;
  for (size_t i = 0; i < vocab; ++i)
    worst = std::max(worst, std::abs(out.logits[vocab + i] - logits[vocab + i]));
  EXPECT_LT(worst, 1e-3f);
  // Bad rules are refused before anything runs.
  step[1].sampling = RowSampling{.temperature = 1.0f, .uniform = 1.5};
  EXPECT_EQ((*gpu)->forward(step, **pool, out).error().code, ErrorCode::kInvalidArgument);
}

TEST(GpuModelTest, BatchesBeyondTheScratchOrThePoolAreRefused) {
  STRATA_NEED_GPU();
  auto cpu = make_gpu_test_model(ModelPreset::kDemo, Architecture::kQwen3, 7);
  ASSERT_TRUE(cpu.has_value());
  GpuModelOptions o{
      .num_pages = 8, .page_size = 16, .max_batch_tokens = 32, .max_batch_sequences = 2};
  auto gpu = GpuModel::create((*cpu)->config(), (*cpu)->weights(), o);
  ASSERT_TRUE(gpu.has_value()) << gpu.error().message;
  auto pool = (*gpu)->make_kv_pool(8, 16, KvDtype::kF32);
  auto other = (*gpu)->make_kv_pool(9, 16, KvDtype::kF32);
  ASSERT_TRUE(pool.has_value() && other.has_value());
  std::vector<int32_t> many(33, 1);
  const std::vector<PageId> pages = {make_page_id(0), make_page_id(1), make_page_id(2)};
  ForwardOutput out;
  const std::vector<ForwardSequence> too_long = {
      ForwardSequence{.token_ids = many, .start_position = 0, .page_table = pages}};
  EXPECT_EQ((*gpu)->forward(too_long, **pool, out).error().code, ErrorCode::kInvalidArgument);
  std::vector<int32_t> one(1, 1);
  const std::vector<ForwardSequence> fine = {
      ForwardSequence{.token_ids = one, .start_position = 0, .page_table = pages}};
  EXPECT_EQ((*gpu)->forward(fine, **other, out).error().code, ErrorCode::kInvalidArgument);
  EXPECT_TRUE((*gpu)->forward(fine, **pool, out).has_value());
  EXPECT_EQ(out.logits.size(), static_cast<size_t>((*cpu)->config().vocab_size));
}

// Two outputs of the same step: the same bits in every logit, or a failure naming how many
// differ and the largest difference (where, and the two values).
void expect_same_logits(std::span<const float> got, std::span<const float> want,
                        const std::string& where) {
  ASSERT_EQ(got.size(), want.size()) << where;
  size_t differ = 0, worst_at = 0;
  float worst = -1.0f;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::bit_cast<uint32_t>(got[i]) == std::bit_cast<uint32_t>(want[i])) continue;
    ++differ;
    const float diff = std::fabs(got[i] - want[i]);
    if (!(diff <= worst)) {
      worst = diff;
      worst_at = i;
    }
  }
  EXPECT_EQ(differ, 0u) << where << ": " << differ << " of " << got.size()
                        << " logits differ; the largest difference " << worst << " at token "
                        << worst_at << " (" << got[worst_at] << " vs " << want[worst_at] << ")";
}

// Decode steps replayed from a CUDA graph give the same bits as the same steps launched
// kernel by kernel: both run the step in its DecodeShape (the batch padded to its bucket,
// the page table and key ranges of the context's bucket), so the same kernels and products
// run at the same sizes. One graph is captured per shape (3 sequences pad to 4, 5 to 8; one
// sequence whose context grows from 4 pages to 5 moves from the 4-page table to the 8-page
// one) and replayed on every later step of it, the padding never written into a page nor
// sampled; logits, drawn tokens, log-probabilities and alternatives bit for bit; prefill
// steps stay eager.
TEST(GpuModelTest, DecodeGraphReplaysEqualEagerSteps) {
  STRATA_NEED_GPU();
  auto cpu = make_gpu_test_model(ModelPreset::kDemo, Architecture::kQwen3, 9);
  ASSERT_TRUE(cpu.has_value()) << cpu.error().message;
  const int32_t pages = 64, page_size = 16;
  GpuModelOptions o{.num_pages = pages,
                    .page_size = page_size,
                    .max_batch_tokens = 256,
                    .max_batch_sequences = 8};
  GpuModelOptions eager_options = o;
  eager_options.cuda_graphs = false;
  auto graphed = GpuModel::create((*cpu)->config(), (*cpu)->weights(), o);
  ASSERT_TRUE(graphed.has_value()) << graphed.error().message;
  auto eager = GpuModel::create((*cpu)->config(), (*cpu)->weights(), eager_options);
  ASSERT_TRUE(eager.has_value()) << eager.error().message;
  auto pool_g = (*graphed)->make_kv_pool(pages, page_size, KvDtype::kF32);
  auto pool_e = (*eager)->make_kv_pool(pages, page_size, KvDtype::kF32);
  ASSERT_TRUE(pool_g.has_value() && pool_e.has_value());
  const auto vocab = static_cast<size_t>((*cpu)->config().vocab_size);
  struct Case {
    int32_t seqs, prompt, steps, graphs;  // prompt: the first sequence's tokens (+9 a next)
  };
  int32_t first_page = 0;
  for (const Case& k : {Case{3, 17, 4, 1}, Case{5, 17, 4, 1}, Case{1, 60, 8, 2}}) {
    const auto n = static_cast<size_t>(k.seqs);
    std::vector<std::vector<int32_t>> prompts(n);
    std::vector<std::vector<PageId>> tables(n);
    for (size_t s = 0; s < n; ++s) {
      const auto len = k.prompt + 9 * static_cast<int32_t>(s);
      for (int32_t i = 0; i < len; ++i) {
        prompts[s].push_back((i * 13 + static_cast<int32_t>(s) * 7 + 1) %
                             static_cast<int32_t>(vocab));
      }
      for (int32_t p = 0; p < (len + k.steps + page_size - 1) / page_size; ++p) {
        tables[s].push_back(make_page_id(first_page++));
      }
    }
    ASSERT_LE(first_page, pages);
    std::vector<ForwardSequence> prefill;
    for (size_t s = 0; s < n; ++s) prefill.push_back({prompts[s], 0, tables[s], true});
    ForwardOutput og, oe;
    ASSERT_TRUE((*graphed)->forward(prefill, **pool_g, og).has_value());
    ASSERT_TRUE((*eager)->forward(prefill, **pool_e, oe).has_value());
    expect_same_logits(og.logits, oe.logits, "prefill of " + std::to_string(k.seqs));
    const auto captured = (*graphed)->counters().graphs_captured;
    const auto replays = (*graphed)->counters().graph_replays;
    const auto eager_steps = (*eager)->counters().eager_steps;
    std::vector<int32_t> next(n, 1);
    for (int32_t step = 0; step < k.steps; ++step) {
      std::vector<ForwardSequence> decode;
      for (size_t s = 0; s < n; ++s) {
        ForwardSequence f{std::span(&next[s], 1), static_cast<int64_t>(prompts[s].size()) + step,
                          tables[s], true};
        // Even rows drawn on the device (greedy with alternatives), odd rows' logits read.
        if (s % 2 == 0) f.sampling = RowSampling{.logprobs = true, .top_logprobs = 3};
        decode.push_back(f);
      }
      ASSERT_TRUE((*graphed)->forward(decode, **pool_g, og).has_value());
      ASSERT_TRUE((*eager)->forward(decode, **pool_e, oe).has_value());
      ASSERT_EQ(og.sampled.size(), n);
      ASSERT_EQ(oe.sampled.size(), n);
      for (size_t s = 0; s < n; ++s) {
        const std::string where = std::to_string(k.seqs) + " seqs, step " + std::to_string(step) +
                                  ", row " + std::to_string(s);
        const SampledToken& g = og.sampled[s];
        const SampledToken& e = oe.sampled[s];
        if (s % 2 == 0) {
          EXPECT_EQ(g.token, e.token) << where;
          EXPECT_EQ(std::bit_cast<uint32_t>(g.logprob), std::bit_cast<uint32_t>(e.logprob))
              << where << ": logprob " << g.logprob << " vs " << e.logprob;
          ASSERT_EQ(g.top_logprobs.size(), e.top_logprobs.size()) << where;
          for (size_t j = 0; j < g.top_logprobs.size(); ++j) {
            EXPECT_EQ(g.top_logprobs[j].token, e.top_logprobs[j].token) << where << " alt " << j;
            EXPECT_EQ(std::bit_cast<uint32_t>(g.top_logprobs[j].logprob),
                      std::bit_cast<uint32_t>(e.top_logprobs[j].logprob))
                << where << " alt " << j << ": " << g.top_logprobs[j].logprob << " vs "
                << e.top_logprobs[j].logprob;
          }
          next[s] = std::max(g.token, 0);
        } else {
          ASSERT_EQ(g.token, -1) << where;
          ASSERT_EQ(e.token, -1) << where;
          const std::span<const float> row_g(og.logits.data() + s * vocab, vocab);
          const std::span<const float> row_e(oe.logits.data() + s * vocab, vocab);
          expect_same_logits(row_g, row_e, where);
          next[s] =
              static_cast<int32_t>(std::max_element(row_e.begin(), row_e.end()) - row_e.begin());
        }
      }
    }
    EXPECT_EQ((*graphed)->counters().graphs_captured, captured + k.graphs) << k.seqs << " seqs";
    EXPECT_EQ((*graphed)->counters().graph_replays, replays + k.steps) << k.seqs << " seqs";
    EXPECT_EQ((*eager)->counters().eager_steps, eager_steps + k.steps) << k.seqs << " seqs";
  }
  EXPECT_EQ((*eager)->counters().graph_replays, 0);
  EXPECT_EQ((*eager)->counters().graphs_captured, 0);
}

}  // namespace
}  // namespace strata::cuda
