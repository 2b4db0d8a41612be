// Loading model folders: safetensors parsing, F32/F16/BF16 files, shards, and every
// kind of bad model refused with a clear message (never a crash).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "memory/kv_dtype.h"
#include "model/make_model.h"
#include "model/model.h"
#include "model/reference_forward.h"
#include "model/safetensors.h"
#include "model_test_util.h"

namespace strata {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

void write_file(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

fs::path make_tiny(const std::string& name, TensorDtype dtype = TensorDtype::kF32, int shards = 1) {
  const fs::path dir = fresh_test_dir("model_load_" + name);
  MakeModelOptions options;
  options.out_dir = dir;
  options.preset = ModelPreset::kTiny;
  options.seed = 42;
  options.dtype = dtype;
  options.num_shards = shards;
  auto made = make_model(options);
  EXPECT_TRUE(made.has_value()) << (made ? "" : made.error().message);
  return dir;
}

// Last-token logits of a fixed prompt.
std::vector<float> run_prompt(Model& model) {
  std::vector<int32_t> tokens;
  for (int i = 0; i < 20; ++i) tokens.push_back((i * 37 + 5) % model.config().vocab_size);
  auto pool = model.make_kv_pool(4, 16, KvDtype::kF32);
  EXPECT_TRUE(pool.has_value());
  const std::vector<PageId> table = {make_page_id(2), make_page_id(0)};
  ForwardSequence seq{tokens, 0, table, true};
  std::vector<float> logits;
  EXPECT_TRUE(model.forward(std::span(&seq, 1), **pool, logits).has_value());
  return logits;
}

void expect_error(const fs::path& dir, ErrorCode code, const std::string& needle) {
  auto model = Model::load(dir, ModelOptions{1, std::nullopt});
  ASSERT_FALSE(model.has_value()) << "expected an error containing '" << needle << "'";
  EXPECT_EQ(model.error().code, code) << model.error().message;
  EXPECT_NE(model.error().message.find(needle), std::string::npos) << model.error().message;
}

TEST(SafetensorsTest, WriterAndReaderRoundTrip) {
  const fs::path dir = fresh_test_dir("model_load_roundtrip");
  TensorStore store;
  const std::vector<float> a = {1.0f, -2.5f, 3.25f, 0.0f, 65504.0f, 1e-8f};
  store.add_f32("b.f32", TensorDtype::kF32, {2, 3}, a);
  store.add_f32("a.f16", TensorDtype::kF16, {6}, a);
  store.add_f32("c.bf16", TensorDtype::kBF16, {3, 2}, a);
  ASSERT_TRUE(write_safetensors(dir / "t.safetensors", store).has_value());
  const std::string bytes = read_file(dir / "t.safetensors");
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes.data(), 8);
  EXPECT_EQ(header_len % 8, 0u);
  const json header = json::parse(bytes.substr(8, header_len));
  EXPECT_EQ(header["__metadata__"]["format"], "pt");
  EXPECT_EQ(header["a.f16"]["dtype"], "F16");

  auto file = SafetensorsFile::open(dir / "t.safetensors");
  ASSERT_TRUE(file.has_value()) << file.error().message;
  EXPECT_EQ((*file)->names(), (std::vector<std::string>{"a.f16", "b.f32", "c.bf16"}));
  const TensorView* f32 = (*file)->find("b.f32");
  ASSERT_NE(f32, nullptr);
  EXPECT_EQ(f32->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(std::memcmp(f32->data.data(), a.data(), 24), 0);
  const TensorView* f16 = (*file)->find("a.f16");
  ASSERT_NE(f16, nullptr);
  ASSERT_EQ(f16->data.size(), 12u);
  uint16_t h[6];
  std::memcpy(h, f16->data.data(), 12);
  EXPECT_EQ(f16_to_f32(h[1]), -2.5f);
  EXPECT_EQ(f16_to_f32(h[4]), 65504.0f);
  EXPECT_EQ((*file)->find("missing"), nullptr);
  // Deterministic bytes.
  ASSERT_TRUE(write_safetensors(dir / "u.safetensors", store).has_value());
  EXPECT_EQ(read_file(dir / "u.safetensors"), bytes);
}

TEST(SafetensorsTest, RefusesCorruptFiles) {
  const fs::path dir = fresh_test_dir("model_load_corrupt");
  TensorStore store;
  const std::vector<float> v(64, 1.0f);
  store.add_f32("w", TensorDtype::kF32, {8, 8}, v);
  ASSERT_TRUE(write_safetensors(dir / "ok.safetensors", store).has_value());
  const std::string good = read_file(dir / "ok.safetensors");
  auto open_error = [&](const std::string& bytes, const std::string& needle) {
    write_file(dir / "bad.safetensors", bytes);
    auto f = SafetensorsFile::open(dir / "bad.safetensors");
    ASSERT_FALSE(f.has_value()) << needle;
    EXPECT_EQ(f.error().code, ErrorCode::kCorrupt) << f.error().message;
    EXPECT_NE(f.error().message.find(needle), std::string::npos) << f.error().message;
  };
  open_error(good.substr(0, 5), "shorter than the 8-byte header");
  open_error(good.substr(0, 40), "header length");
  open_error(good.substr(0, good.size() - 4), "truncated");
  std::string bad_json = good;
  bad_json[8] = 'x';
  open_error(bad_json, "not a JSON object");
  // A header whose sizes disagree with the dtype and shape.
  json header = {{"w", {{"dtype", "F32"}, {"shape", {8, 8}}, {"data_offsets", {0, 100}}}}};
  std::string text = header.dump();
  while (text.size() % 8) text += ' ';
  std::string bytes(8, '\0');
  const uint64_t len = text.size();
  std::memcpy(bytes.data(), &len, 8);
  open_error(bytes + text + std::string(100, '\0'), "needs 256");
}

TEST(ModelLoadTest, LoadsEveryDtypeAndShards) {
  const fs::path f32_dir = make_tiny("f32");
  auto f32 = Model::load(f32_dir, ModelOptions{1, std::nullopt});
  ASSERT_TRUE(f32.has_value()) << f32.error().message;
  EXPECT_EQ((*f32)->weights().layers[0].qkv.dtype(), WeightDtype::kF32);
  const std::vector<float> base = run_prompt(**f32);

  // Shards hold the same tensors: identical logits.
  const fs::path sharded_dir = make_tiny("sharded", TensorDtype::kF32, 3);
  EXPECT_TRUE(fs::exists(sharded_dir / "model.safetensors.index.json"));
  EXPECT_TRUE(fs::exists(sharded_dir / "model-00003-of-00003.safetensors"));
  EXPECT_FALSE(fs::exists(sharded_dir / "model.safetensors"));
  auto sharded = Model::load(sharded_dir, ModelOptions{1, std::nullopt});
  ASSERT_TRUE(sharded.has_value()) << sharded.error().message;
  EXPECT_EQ(run_prompt(**sharded), base);

  // F16 and BF16 files: rounded weights, so close to (not equal to) the F32 model;
  // BF16 stays BF16 in memory, F16 is widened to F32.
  for (TensorDtype dtype : {TensorDtype::kF16, TensorDtype::kBF16}) {
    const fs::path dir = make_tiny(std::string(tensor_dtype_name(dtype)), dtype);
    auto model = Model::load(dir, ModelOptions{1, std::nullopt});
    ASSERT_TRUE(model.has_value()) << model.error().message;
    EXPECT_EQ((*model)->weights().layers[0].qkv.dtype(),
              dtype == TensorDtype::kBF16 ? WeightDtype::kBF16 : WeightDtype::kF32);
    const std::vector<float> logits = run_prompt(**model);
    double worst = 0, scale = 1;
    for (size_t i = 0; i < base.size(); ++i) {
      worst = std::max(worst, static_cast<double>(std::fabs(logits[i] - base[i])));
      scale = std::max(scale, static_cast<double>(std::fabs(base[i])));
    }
    EXPECT_LE(worst, (dtype == TensorDtype::kF16 ? 5e-3 : 5e-2) * scale)
        << tensor_dtype_name(dtype);
    EXPECT_GT(worst, 0.0) << "rounded weights should change the logits a little";
  }

  // Forcing BF16 weights on an F32 checkpoint works too.
  auto forced = Model::load(f32_dir, ModelOptions{1, WeightDtype::kBF16});
  ASSERT_TRUE(forced.has_value());
  EXPECT_EQ((*forced)->weights().layers[0].qkv.dtype(), WeightDtype::kBF16);
}

TEST(ModelLoadTest, RefusesMissingTensor) {
  const fs::path dir = fresh_test_dir("model_load_missing_tensor");
  const ModelConfig config = preset_config(ModelPreset::kTiny, Architecture::kLlama);
  TensorStore tensors = make_random_tensors(config, 1, TensorDtype::kF32);
  ASSERT_TRUE(tensors.remove("model.layers.1.mlp.down_proj.weight"));
  ASSERT_TRUE(write_safetensors(dir / "model.safetensors", tensors).has_value());
  write_file(dir / "config.json", model_config_to_json(config).dump());
  expect_error(dir, ErrorCode::kNotFound, "model.layers.1.mlp.down_proj.weight");
}

TEST(ModelLoadTest, RefusesWrongShape) {
  const fs::path dir = make_tiny("wrong_shape");
  json config = json::parse(read_file(dir / "config.json"));
  config["intermediate_size"] = 96;
  write_file(dir / "config.json", config.dump());
  expect_error(dir, ErrorCode::kInvalidArgument,
               "has shape [128, 64] but the config needs [96, 64]");
}

TEST(ModelLoadTest, RefusesUnsupportedArchitecture) {
  const fs::path dir = make_tiny("arch");
  json config = json::parse(read_file(dir / "config.json"));
  config["architectures"] = {"GPT2LMHeadModel"};
  write_file(dir / "config.json", config.dump());
  expect_error(dir, ErrorCode::kUnsupported, "architecture 'GPT2LMHeadModel' is not supported");
}

TEST(ModelLoadTest, RefusesUnsupportedDtype) {
  const fs::path dir = make_tiny("dtype");
  // Rewrite one tensor as F64 (8 bytes per element).
  auto file = SafetensorsFile::open(dir / "model.safetensors");
  ASSERT_TRUE(file.has_value());
  json header = json::object();
  std::string data;
  for (const std::string& name : (*file)->names()) {
    const TensorView* v = (*file)->find(name);
    std::string bytes(reinterpret_cast<const char*>(v->data.data()), v->data.size());
    std::string dtype = "F32";
    if (name == "model.norm.weight") {
      dtype = "F64";
      bytes += bytes;  // twice the bytes for the same shape
    }
    header[name] = {{"dtype", dtype},
                    {"shape", v->shape},
                    {"data_offsets", {data.size(), data.size() + bytes.size()}}};
    data += bytes;
  }
  file->reset();
  std::string text = header.dump();
  while (text.size() % 8) text += ' ';
  std::string out(8, '\0');
  const uint64_t len = text.size();
  std::memcpy(out.data(), &len, 8);
  write_file(dir / "model.safetensors", out + text + data);
  expect_error(dir, ErrorCode::kUnsupported, "'model.norm.weight' has dtype F64");
}

TEST(ModelLoadTest, RefusesTruncatedFile) {
  const fs::path dir = make_tiny("truncated");
  const std::string bytes = read_file(dir / "model.safetensors");
  write_file(dir / "model.safetensors", bytes.substr(0, bytes.size() / 2));
  expect_error(dir, ErrorCode::kCorrupt, "truncated");
  write_file(dir / "model.safetensors", bytes.substr(0, 6));
  expect_error(dir, ErrorCode::kCorrupt, "truncated");
}

TEST(ModelLoadTest, RefusesBadJsonAndMissingFiles) {
  const fs::path dir = make_tiny("bad_json");
  write_file(dir / "config.json", "{ \"architectures\": [\"LlamaForCausalLM\"], ");
  expect_error(dir, ErrorCode::kInvalidArgument, "config.json is not valid JSON");
  fs::remove(dir / "config.json");
  expect_error(dir, ErrorCode::kNotFound, "no config.json");

  const fs::path no_weights = make_tiny("no_weights");
  fs::remove(no_weights / "model.safetensors");
  expect_error(no_weights, ErrorCode::kNotFound, "no model.safetensors");

  const fs::path bad_index = make_tiny("bad_index", TensorDtype::kF32, 2);
  fs::remove(bad_index / "model-00002-of-00002.safetensors");
  expect_error(bad_index, ErrorCode::kNotFound, "model-00002-of-00002.safetensors");
}

}  // namespace
}  // namespace strata
