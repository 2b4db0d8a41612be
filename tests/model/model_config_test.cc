#include "model/model_config.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace strata {
namespace {

using nlohmann::json;

json llama_json() {
  return json{{"architectures", {"LlamaForCausalLM"}},
              {"vocab_size", 128256},
              {"hidden_size", 2048},
              {"intermediate_size", 8192},
              {"num_hidden_layers", 16},
              {"num_attention_heads", 32},
              {"num_key_value_heads", 8},
              {"rms_norm_eps", 1e-5},
              {"rope_theta", 500000.0},
              {"max_position_embeddings", 131072},
              {"tie_word_embeddings", true},
              {"hidden_act", "silu"},
              {"bos_token_id", 128000},
              {"eos_token_id", {128001, 128008, 128009}},
              {"rope_scaling",
               {{"factor", 32.0},
                {"high_freq_factor", 4.0},
                {"low_freq_factor", 1.0},
                {"original_max_position_embeddings", 8192},
                {"rope_type", "llama3"}}},
              {"torch_dtype", "bfloat16"}};
}

TEST(ModelConfigTest, ParsesLlama32) {
  auto c = model_config_from_json(llama_json());
  ASSERT_TRUE(c.has_value()) << c.error().message;
  EXPECT_EQ(c->architecture, Architecture::kLlama);
  EXPECT_EQ(c->head_dim, 64);
  EXPECT_EQ(c->num_kv_heads, 8);
  EXPECT_EQ(c->group_size(), 4);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_EQ(c->rope_scaling.type, RopeScalingType::kLlama3);
  EXPECT_DOUBLE_EQ(c->rope_scaling.factor, 32.0);
  EXPECT_EQ(c->rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_EQ(c->bos_token_id, 128000);
  EXPECT_EQ(c->eos_token_ids, (std::vector<int32_t>{128001, 128008, 128009}));
  EXPECT_FALSE(c->qkv_bias);
  EXPECT_FALSE(c->qk_norm);
}

TEST(ModelConfigTest, ParsesQwenFamilies) {
  json q3 = {{"architectures", {"Qwen3ForCausalLM"}},
             {"vocab_size", 151936},
             {"hidden_size", 1024},
             {"intermediate_size", 3072},
             {"num_hidden_layers", 28},
             {"num_attention_heads", 16},
             {"num_key_value_heads", 8},
             {"head_dim", 128},
             {"rope_theta", 1000000},
             {"rope_scaling", nullptr},
             {"use_sliding_window", false},
             {"sliding_window", nullptr},
             {"attention_bias", false},
             {"eos_token_id", 151645}};
  auto c = model_config_from_json(q3);
  ASSERT_TRUE(c.has_value()) << c.error().message;
  EXPECT_EQ(c->architecture, Architecture::kQwen3);
  EXPECT_EQ(c->head_dim, 128);  // not hidden / heads
  EXPECT_EQ(c->q_size(), 2048);
  EXPECT_TRUE(c->qk_norm);
  EXPECT_FALSE(c->qkv_bias);
  EXPECT_EQ(c->sliding_window, 0);
  EXPECT_FALSE(c->bos_token_id.has_value());

  json q2 = q3;
  q2["architectures"] = {"Qwen2ForCausalLM"};
  q2.erase("head_dim");
  auto c2 = model_config_from_json(q2);
  ASSERT_TRUE(c2.has_value()) << c2.error().message;
  EXPECT_TRUE(c2->qkv_bias);
  EXPECT_FALSE(c2->qk_norm);
  EXPECT_EQ(c2->head_dim, 64);
}

TEST(ModelConfigTest, MistralSlidingWindowAndDefaults) {
  json m = llama_json();
  m["architectures"] = {"MistralForCausalLM"};
  m["sliding_window"] = 4096;
  m.erase("num_key_value_heads");
  m.erase("rope_scaling");
  auto c = model_config_from_json(m);
  ASSERT_TRUE(c.has_value()) << c.error().message;
  EXPECT_EQ(c->architecture, Architecture::kMistral);
  EXPECT_EQ(c->sliding_window, 4096);
  EXPECT_EQ(c->num_kv_heads, c->num_heads);
  EXPECT_EQ(c->rope_scaling.type, RopeScalingType::kNone);
}

TEST(ModelConfigTest, RoundTripsThroughJson) {
  auto c = model_config_from_json(llama_json());
  ASSERT_TRUE(c.has_value());
  auto again = model_config_from_json(model_config_to_json(*c));
  ASSERT_TRUE(again.has_value()) << again.error().message;
  EXPECT_EQ(model_config_to_json(*again), model_config_to_json(*c));
}

struct BadCase {
  const char* name;
  std::function<void(json&)> mutate;
  ErrorCode code;
  const char* needle;
};

TEST(ModelConfigTest, RefusesBadConfigsWithClearMessages) {
  const std::vector<BadCase> cases = {
      {"unknown architecture", [](json& j) { j["architectures"] = {"GPT2LMHeadModel"}; },
       ErrorCode::kUnsupported, "GPT2LMHeadModel"},
      {"no architecture", [](json& j) { j.erase("architectures"); }, ErrorCode::kInvalidArgument,
       "architectures"},
      {"missing hidden", [](json& j) { j.erase("hidden_size"); }, ErrorCode::kInvalidArgument,
       "hidden_size"},
      {"string vocab", [](json& j) { j["vocab_size"] = "big"; }, ErrorCode::kInvalidArgument,
       "vocab_size"},
      {"heads not multiple", [](json& j) { j["num_key_value_heads"] = 5; },
       ErrorCode::kInvalidArgument, "multiple"},
      {"gelu", [](json& j) { j["hidden_act"] = "gelu"; }, ErrorCode::kUnsupported, "hidden_act"},
      {"yarn",
       [](json& j) {
         j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
       },
       ErrorCode::kUnsupported, "yarn"},
      {"negative eps", [](json& j) { j["rms_norm_eps"] = -1.0; }, ErrorCode::kInvalidArgument,
       "rms_norm_eps"},
      {"zero layers", [](json& j) { j["num_hidden_layers"] = 0; }, ErrorCode::kInvalidArgument,
       "num_hidden_layers"},
      {"odd head dim", [](json& j) { j["head_dim"] = 63; }, ErrorCode::kInvalidArgument, "even"},
      {"mlp bias", [](json& j) { j["mlp_bias"] = true; }, ErrorCode::kUnsupported, "mlp_bias"},
  };
  for (const BadCase& bc : cases) {
    json j = llama_json();
    bc.mutate(j);
    auto c = model_config_from_json(j);
    ASSERT_FALSE(c.has_value()) << bc.name;
    EXPECT_EQ(c.error().code, bc.code) << bc.name << ": " << c.error().message;
    EXPECT_NE(c.error().message.find(bc.needle), std::string::npos)
        << bc.name << ": " << c.error().message;
  }
  auto not_json = parse_model_config("{\"architectures\": [");
  ASSERT_FALSE(not_json.has_value());
  EXPECT_NE(not_json.error().message.find("not valid JSON"), std::string::npos);
  auto missing = load_model_config("/nonexistent/strata-model");
  ASSERT_FALSE(missing.has_value());
  EXPECT_EQ(missing.error().code, ErrorCode::kNotFound);
}

}  // namespace
}  // namespace strata
