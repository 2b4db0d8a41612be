// Models from GGUF files: a file made from a model's arrays gives that model's logits
// (llama's rotary permutation undone, qwen's left alone), quantized files give the
// logits of Strata's F32 forward on their dequantized weights within the activations'
// 8-bit rounding, and bad models are refused by name.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "memory/page_id.h"
#include "model/gguf_model.h"
#include "model/make_gguf.h"
#include "model/make_model.h"
#include "model/model.h"
#include "model_test_util.h"

namespace strata {
namespace {

// Teacher-forced logits: a prefill of `prompt` then one decode step per `follow` token;
// the logits of each step, concatenated.
std::vector<float> teacher_forced(Model& model, const std::vector<int32_t>& prompt,
                                  const std::vector<int32_t>& follow) {
  auto pool = model.make_kv_pool(16, 16, KvDtype::kF32);
  EXPECT_TRUE(pool.has_value());
  std::vector<PageId> table;
  for (int32_t i = 0; i < 16; ++i) table.push_back(make_page_id(i));
  std::vector<float> all, logits;
  ForwardSequence seq{prompt, 0, table, true};
  EXPECT_TRUE(model.forward(std::span(&seq, 1), **pool, logits).has_value());
  all.insert(all.end(), logits.begin(), logits.end());
  for (size_t i = 0; i < follow.size(); ++i) {
    ForwardSequence step{std::span(&follow[i], 1), static_cast<int64_t>(prompt.size() + i), table,
                         true};
    EXPECT_TRUE(model.forward(std::span(&step, 1), **pool, logits).has_value());
    all.insert(all.end(), logits.begin(), logits.end());
  }
  return all;
}

std::vector<int32_t> tokens(int n, int32_t vocab, int32_t seed) {
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) out.push_back((seed + 37 * i * i + 11 * i) % vocab);
  return out;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(double(a[i]) - b[i]));
  return worst;
}

TEST(GgufModelTest, PermutationIsTheConverters) {
  // One head of 8 rows: the file holds HF rows 0, 4, 1, 5, 2, 6, 3, 7.
  std::vector<int64_t> rows;
  for (int64_t r = 0; r < 8; ++r) rows.push_back(gguf_permuted_source_row(r, 8));
  EXPECT_EQ(rows, (std::vector<int64_t>{0, 4, 1, 5, 2, 6, 3, 7}));
  EXPECT_EQ(gguf_permuted_source_row(9, 8), 12);
}

struct GgufArchCase {
  Architecture arch;
  bool tie;
};

class GgufArchTest : public ::testing::TestWithParam<GgufArchCase> {};

// An F32 GGUF made from a model's arrays: the same config and the same logits.
TEST_P(GgufArchTest, SameLogitsAsTheSafetensorsModel) {
  ModelConfig config = preset_config(ModelPreset::kTiny, GetParam().arch);
  config.tie_word_embeddings = GetParam().tie;
  const TensorStore tensors = make_random_tensors(config, 5, TensorDtype::kF32);
  ModelOptions options;
  options.num_threads = 2;
  auto hf = Model::from_tensors(config, tensors, options);
  ASSERT_TRUE(hf) << hf.error().message;
  const auto dir = fresh_test_dir("gguf_arch");
  const auto path = dir / "model.gguf";
  ASSERT_TRUE(write_gguf_model(path, config, tensors, "f32", nullptr, "tiny"));
  ASSERT_TRUE(is_gguf_file(path));
  auto gguf = Model::load(path, options);
  ASSERT_TRUE(gguf) << gguf.error().message;
  const ModelConfig& g = (*gguf)->config();
  EXPECT_EQ(g.architecture, config.architecture == Architecture::kMistral ? Architecture::kLlama
                                                                          : config.architecture);
  EXPECT_EQ(g.hidden_size, config.hidden_size);
  EXPECT_EQ(g.head_dim, config.head_dim);
  EXPECT_EQ(g.num_kv_heads, config.num_kv_heads);
  EXPECT_EQ(g.vocab_size, config.vocab_size);
  EXPECT_EQ(g.tie_word_embeddings, config.tie_word_embeddings);
  EXPECT_EQ(g.qkv_bias, config.qkv_bias);
  EXPECT_EQ(g.qk_norm, config.qk_norm);
  const auto prompt = tokens(12, config.vocab_size, 3);
  const auto follow = tokens(3, config.vocab_size, 8);
  const std::vector<float> a = teacher_forced(**hf, prompt, follow);
  const std::vector<float> b = teacher_forced(**gguf, prompt, follow);
  ASSERT_EQ(a.size(), b.size());
  // eps is stored as F32 in the file: the only difference.
  EXPECT_LE(max_abs_diff(a, b), 1e-4) << architecture_model_type(config.architecture);
  // (The writer permutes llama's q and k rows as the converter does, the permutation test
  // above pins that order: a reader that did not undo it would fail here.)
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Archs, GgufArchTest,
                         ::testing::Values(GgufArchCase{Architecture::kLlama, false},
                                           GgufArchCase{Architecture::kQwen2, true},
                                           GgufArchCase{Architecture::kQwen3, false},
                                           GgufArchCase{Architecture::kMistral, true}),
                         [](const auto& info) {
                           return std::string(architecture_model_type(info.param.arch));
                         });

// Quantized files against Strata's F32 forward on the same file's dequantized weights.
TEST(GgufModelTest, QuantizedLogitsMatchTheDequantizedF32Forward) {
  ModelConfig config = preset_config(ModelPreset::kTiny, Architecture::kQwen3);
  config.hidden_size = 256;
  config.intermediate_size = 512;
  config.num_heads = 4;
  config.num_kv_heads = 2;
  config.head_dim = 64;
  const TensorStore tensors = make_random_tensors(config, 9, TensorDtype::kF32);
  const auto dir = fresh_test_dir("gguf_quant");
  ModelOptions options;
  options.num_threads = 2;
  ModelOptions f32_options = options;
  f32_options.weight_dtype = WeightDtype::kF32;
  const auto prompt = tokens(20, config.vocab_size, 1);  // 20 rows: the prefill GEMM
  const auto follow = tokens(4, config.vocab_size, 2);   // one row: the decode GEMV
  for (const char* type : {"q8_0", "q4_0", "q4_k_m"}) {
    const auto path = dir / (std::string(type) + ".gguf");
    ASSERT_TRUE(write_gguf_model(path, config, tensors, type, nullptr, "t"));
    auto quant = Model::load(path, options);
    ASSERT_TRUE(quant) << quant.error().message;
    auto f32 = Model::load(path, f32_options);
    ASSERT_TRUE(f32) << f32.error().message;
    EXPECT_EQ((*f32)->weights().embed.dtype(), WeightDtype::kF32);
    if (std::string(type) == "q4_k_m") {
      // Layer 1 (of 2) is a more-bits layer: v in Q6_K beside q, k in Q4_K.
      ASSERT_TRUE((*quant)->weights().layers[1].qkv.empty());
      EXPECT_EQ((*quant)->weights().layers[1].qkv_parts[2].dtype(), WeightDtype::kQ6_K);
    }
    const std::vector<float> a = teacher_forced(**quant, prompt, follow);
    const std::vector<float> b = teacher_forced(**f32, prompt, follow);
    double scale = 0;
    for (float v : b) scale = std::max(scale, std::fabs(double(v)));
    // The activations' rounding (8-bit blocks in decode, BF16 in prefill) through every
    // layer: about 1 % of the logits' range.
    EXPECT_LE(max_abs_diff(a, b), 0.03 * scale) << type;
    std::printf("%s: max |logit difference| %.4f of a range %.3f\n", type, max_abs_diff(a, b),
                scale);
    const auto v = static_cast<size_t>(config.vocab_size);
    for (size_t row = 0; row < a.size() / v; ++row) {
      std::vector<float> ra(a.begin() + row * v, a.begin() + (row + 1) * v);
      std::vector<float> rb(b.begin() + row * v, b.begin() + (row + 1) * v);
      const auto top = std::max_element(rb.begin(), rb.end()) - rb.begin();
      std::vector<float> sorted = rb;
      std::sort(sorted.rbegin(), sorted.rend());
      if (sorted[0] - sorted[1] > 0.05 * scale) {
        EXPECT_EQ(std::max_element(ra.begin(), ra.end()) - ra.begin(), top) << type << " " << row;
      }
    }
  }
  std::filesystem::remove_all(dir);
}

// --weight-dtype q8_0 | q4_0 | q4_k quantizes a checkpoint at load with the quantizers a
// GGUF file of that type is written with: the same weights, so the same logits.
TEST(GgufModelTest, QuantizingAtLoadEqualsTheFileOfThatType) {
  ModelConfig config = preset_config(ModelPreset::kTiny, Architecture::kQwen2);
  config.hidden_size = 256;
  config.intermediate_size = 512;
  config.num_heads = 4;
  config.num_kv_heads = 2;
  config.head_dim = 64;
  const TensorStore tensors = make_random_tensors(config, 4, TensorDtype::kF32);
  const auto dir = fresh_test_dir("gguf_at_load");
  const auto prompt = tokens(18, config.vocab_size, 5);
  const auto follow = tokens(2, config.vocab_size, 6);
  for (WeightDtype dtype : {WeightDtype::kQ8_0, WeightDtype::kQ4_0, WeightDtype::kQ4_K}) {
    ModelOptions options;
    options.num_threads = 2;
    options.weight_dtype = dtype;
    auto at_load = Model::from_tensors(config, tensors, options);
    ASSERT_TRUE(at_load) << at_load.error().message;
    EXPECT_EQ((*at_load)->weights().layers[0].down.dtype(), dtype);
    const std::string type(weight_dtype_name(dtype));
    const auto path = dir / (type + ".gguf");
    ASSERT_TRUE(write_gguf_model(path, config, tensors, type, nullptr, "t"));
    options.weight_dtype.reset();
    auto file = Model::load(path, options);
    ASSERT_TRUE(file) << file.error().message;
    EXPECT_EQ(max_abs_diff(teacher_forced(**at_load, prompt, follow),
                           teacher_forced(**file, prompt, follow)),
              0.0)
        << type;
  }
  std::filesystem::remove_all(dir);
}

TEST(GgufModelTest, RefusesWhatItCannotRun) {
  const auto dir = fresh_test_dir("gguf_refuse");
  {
    GgufWriter w;
    w.set_string("general.architecture", "gpt2");
    ASSERT_TRUE(w.write(dir / "a.gguf"));
    auto m = Model::load(dir / "a.gguf");
    ASSERT_FALSE(m);
    EXPECT_EQ(m.error().code, ErrorCode::kUnsupported);
    EXPECT_NE(m.error().message.find("architecture 'gpt2'"), std::string::npos);
  }
  ModelConfig config = preset_config(ModelPreset::kTiny, Architecture::kLlama);
  const TensorStore tensors = make_random_tensors(config, 1, TensorDtype::kF32);
  ASSERT_TRUE(write_gguf_model(dir / "b.gguf", config, tensors, "f32", nullptr, "t"));
  auto file = GgufFile::open(dir / "b.gguf");
  ASSERT_TRUE(file);
  auto parsed = gguf_model_config(**file);
  ASSERT_TRUE(parsed);
  {
    // A layer's tensor missing.
    ModelConfig more = *parsed;
    more.num_layers += 1;
    auto w = load_gguf_weights(**file, more);
    ASSERT_FALSE(w);
    EXPECT_EQ(w.error().code, ErrorCode::kNotFound);
    EXPECT_NE(w.error().message.find("blk.2.attn_norm.weight"), std::string::npos);
  }
  {
    // A Q4_1 matrix: listed by the reader, refused by the loader with its name and type.
    GgufWriter w;
    w.set_string("general.architecture", "llama");
    w.add_tensor("token_embd.weight", {64, 4}, GgmlType::kQ4_1, std::vector<std::byte>(4 * 40));
    ASSERT_TRUE(w.write(dir / "c.gguf"));
    auto f = GgufFile::open(dir / "c.gguf");
    ASSERT_TRUE(f) << f.error().message;
    ModelConfig small = *parsed;
    small.vocab_size = 4;
    auto weights = load_gguf_weights(**f, small);
    ASSERT_FALSE(weights);
    EXPECT_EQ(weights.error().code, ErrorCode::kUnsupported);
    EXPECT_NE(weights.error().message.find("'token_embd.weight' has type Q4_1"), std::string::npos);
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace strata
