// Tokenizer loading, configuration and BPE details on small synthetic tokenizer.json files
// whose expected output follows the reference's algorithm step by step.
#include "text/tokenizer/tokenizer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "text/tokenizer/reference_runner.h"

namespace strata {
namespace {

using nlohmann::json;

// A code-point BPE over a tiny vocabulary; tests edit the parts they need.
json tiny_tokenizer() {
  return json::parse(R"({
    "version": "1.0",
    "added_tokens": [
      {"id": 100, "content": "<s>", "single_word": false, "lstrip": false, "rstrip": false,
       "normalized": false, "special": true},
      {"id": 101, "content": "</s>", "single_word": false, "lstrip": false, "rstrip": false,
       "normalized": false, "special": true},
      {"id": 102, "content": "<m>", "single_word": false, "lstrip": true, "rstrip": true,
       "normalized": false, "special": false}
    ],
    "normalizer": null,
    "pre_tokenizer": null,
    "post_processor": null,
    "decoder": null,
    "model": {
      "type": "BPE", "unk_token": "<unk>", "fuse_unk": false, "byte_fallback": false,
      "vocab": {"<unk>": 0, "a": 1, "b": 2, "c": 3, "d": 4, " ": 5, "ab": 6, "bc": 7,
                "abc": 8, "aa": 9, "cd": 10, "<0x7A>": 11, "<0xC3>": 12},
      "merges": ["b c", "a b", "ab c", "a a", "c d"]
    }
  })");
}

Result<std::unique_ptr<Tokenizer>> make(const json& tokenizer, const json& config = json::object(),
                                        const json& generation = json()) {
  return Tokenizer::from_json_text(tokenizer.dump(), config.dump(),
                                   generation.is_null() ? "" : generation.dump());
}

std::vector<TokenId> encode(const Tokenizer& t, std::string_view text, bool special = true) {
  auto ids = t.encode(text, EncodeOptions{.add_special_tokens = special});
  EXPECT_TRUE(ids.has_value()) << (ids ? "" : ids.error().message);
  return ids ? *ids : std::vector<TokenId>{};
}

TEST(TokenizerBpeTest, MergesLowestRankFirstAndLeftmostOnTies) {
  auto t = make(tiny_tokenizer());
  ASSERT_TRUE(t.has_value()) << t.error().message;
  // (b,c) has rank 0 and beats (a,b): a + bc, and "a bc" is no merge.
  EXPECT_EQ(encode(**t, "abc"), (std::vector<TokenId>{1, 7}));
  // Equal ranks: the leftmost pair merges first.
  EXPECT_EQ(encode(**t, "aaa"), (std::vector<TokenId>{9, 1}));
  EXPECT_EQ(encode(**t, "aaaa"), (std::vector<TokenId>{9, 9}));
  EXPECT_EQ(encode(**t, "abcd"), (std::vector<TokenId>{1, 7, 4}));
  EXPECT_EQ(encode(**t, ""), (std::vector<TokenId>{}));
}

TEST(TokenizerBpeTest, IgnoreMergesLooksUpTheWholePieceFirst) {
  json tj = tiny_tokenizer();
  tj["model"]["ignore_merges"] = true;
  auto t = make(tj);
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(encode(**t, "abc"), (std::vector<TokenId>{8}));
  EXPECT_EQ(encode(**t, "abcd"), (std::vector<TokenId>{1, 7, 4}));
}

TEST(TokenizerBpeTest, UnknownsFallBackToBytesOrUnk) {
  json tj = tiny_tokenizer();
  auto plain = make(tj);
  ASSERT_TRUE(plain.has_value());
  EXPECT_EQ(encode(**plain, "azz"), (std::vector<TokenId>{1, 0, 0}));
  tj["model"]["fuse_unk"] = true;
  auto fused = make(tj);
  ASSERT_TRUE(fused.has_value());
  EXPECT_EQ(encode(**fused, "azzaz"), (std::vector<TokenId>{1, 0, 1, 0}));
  tj["model"]["byte_fallback"] = true;
  auto bytes = make(tj);
  ASSERT_TRUE(bytes.has_value());
  // 'z' is <0x7A>; 'é' is C3 A9 and <0xA9> is missing, so the whole character is unk.
  EXPECT_EQ(encode(**bytes, "z\xC3\xA9"), (std::vector<TokenId>{11, 0}));
}

TEST(TokenizerBpeTest, AddedTokensSplitFirstAndStripNeighbours) {
  auto t = make(tiny_tokenizer());
  ASSERT_TRUE(t.has_value());
  // <m> has lstrip and rstrip: the spaces around it go.
  EXPECT_EQ(encode(**t, "a  <m>  b"), (std::vector<TokenId>{1, 102, 2}));
  EXPECT_EQ(encode(**t, "ab<s>c </s>"), (std::vector<TokenId>{6, 100, 3, 5, 101}));
  // Longest match wins; a broken token is plain text.
  EXPECT_EQ(encode(**t, "<s"), (std::vector<TokenId>{0, 0}));
}

TEST(TokenizerPostProcessTest, TemplateProcessingDecidesSpecialTokens) {
  json tj = tiny_tokenizer();
  tj["post_processor"] = json::parse(R"({"type": "TemplateProcessing",
      "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                 {"SpecialToken": {"id": "</s>", "type_id": 0}}],
      "pair": [], "special_tokens": {}})");
  auto t = make(tj, json{{"add_bos_token", false}});  // the template wins over the flag
  ASSERT_TRUE(t.has_value()) << t.error().message;
  EXPECT_EQ(encode(**t, "ab"), (std::vector<TokenId>{100, 6, 101}));
  EXPECT_EQ(encode(**t, "ab", false), (std::vector<TokenId>{6}));
  EXPECT_EQ(encode(**t, ""), (std::vector<TokenId>{100, 101}));
}

TEST(TokenizerPostProcessTest, ConfigFlagsApplyWithoutTemplate) {
  const json config = {{"add_bos_token", true},
                       {"add_eos_token", true},
                       {"bos_token", "<s>"},
                       {"eos_token", "</s>"}};
  auto t = make(tiny_tokenizer(), config);
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(encode(**t, "ab"), (std::vector<TokenId>{100, 6, 101}));
  EXPECT_EQ(encode(**t, "ab", false), (std::vector<TokenId>{6}));
}

TEST(TokenizerConfigTest, SpecialIdsAndTemplates) {
  const json config = json::parse(R"({
      "bos_token": {"__type": "AddedToken", "content": "<s>"}, "eos_token": "</s>",
      "additional_special_tokens": ["<m>"],
      "chat_template": [{"name": "default", "template": "D"}, {"name": "tool_use", "template": "T"}]})");
  const json generation = json::parse(R"({"eos_token_id": [101, 7, 101]})");
  auto t = make(tiny_tokenizer(), config, generation);
  ASSERT_TRUE(t.has_value()) << t.error().message;
  EXPECT_EQ((*t)->bos_id(), 100);
  EXPECT_EQ((*t)->eos_ids(), (std::vector<TokenId>{101, 7}));
  EXPECT_EQ((*t)->pad_id(), 101);  // pad falls back to eos
  EXPECT_EQ((*t)->chat_template(false), "D");
  EXPECT_EQ((*t)->chat_template(true), "T");
  EXPECT_EQ((*t)->chat_templates().size(), 2u);
  EXPECT_TRUE((*t)->is_special(100));
  EXPECT_TRUE((*t)->is_special(102));  // via additional_special_tokens
  EXPECT_FALSE((*t)->is_special(6));
  EXPECT_EQ((*t)->vocab_size(), 103u);
  EXPECT_EQ((*t)->token_to_id("abc"), 8);
  EXPECT_EQ((*t)->token_to_id("<m>"), 102);
  EXPECT_FALSE((*t)->token_to_id("zzz").has_value());
  EXPECT_EQ((*t)->id_to_token(7), "bc");
  EXPECT_FALSE((*t)->id_to_token(50).has_value());  // a hole in the id space
  EXPECT_EQ((*t)->special_token_strings().bos_token, "<s>");

  auto plain = make(tiny_tokenizer(), json{{"chat_template", "{{ messages }}"}},
                    json{{"bos_token_id", 100}, {"eos_token_id", 101}});
  ASSERT_TRUE(plain.has_value());
  EXPECT_EQ((*plain)->chat_template(true), "{{ messages }}");
  EXPECT_EQ((*plain)->bos_id(), 100);
  EXPECT_EQ((*plain)->eos_ids(), (std::vector<TokenId>{101}));
}

TEST(TokenizerDecodeTest, DecodesAndRejectsUnknownIds) {
  auto t = make(tiny_tokenizer());
  ASSERT_TRUE(t.has_value());
  const std::vector<TokenId> ids = {100, 6, 7};
  // No decoder: the reference joins tokens with spaces.
  EXPECT_EQ(*(*t)->decode(ids), "<s> ab bc");
  EXPECT_EQ(*(*t)->decode(ids, DecodeOptions{.skip_special_tokens = true}), "ab bc");
  const std::vector<TokenId> bad = {6, 50};
  auto r = (*t)->decode(bad);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, ErrorCode::kInvalidArgument);
  EXPECT_NE(r.error().message.find("50"), std::string::npos);
}

TEST(TokenizerDecodeTest, FinalStripHoldsBackTrailingCharacters) {
  json tj = tiny_tokenizer();
  tj["model"]["vocab"]
    ["\xE2\x96\x81"
     "a"] = 20;
  tj["model"]["vocab"]["\xE2\x96\x81"] = 21;
  tj["decoder"] = json::parse(R"({"type": "Sequence", "decoders": [
      {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
      {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 1}]})");
  auto t = make(tj, json{{"clean_up_tokenization_spaces", false}});
  ASSERT_TRUE(t.has_value()) << t.error().message;
  StreamDecoder stream = (*t)->stream_decoder();
  EXPECT_EQ(*stream.push(20), "a");  // leading space stripped
  EXPECT_EQ(*stream.push(21), "");   // may be the final space: held back
  EXPECT_EQ(*stream.push(1), " a");  // it was not
  EXPECT_EQ(*stream.push(21), "");
  EXPECT_EQ(stream.finish(), "");  // it was
  EXPECT_EQ(*(*t)->decode(std::vector<TokenId>{20, 21, 1, 21}), "a a");
}

TEST(TokenizerLoadTest, ErrorsNameTheProblem) {
  auto missing = Tokenizer::load("/nonexistent/strata/model");
  ASSERT_FALSE(missing.has_value());
  EXPECT_EQ(missing.error().code, ErrorCode::kNotFound);
  EXPECT_NE(missing.error().message.find("/nonexistent/strata/model/tokenizer.json"),
            std::string::npos);

  auto not_json = Tokenizer::from_json_text("{not json", "", "");
  ASSERT_FALSE(not_json.has_value());
  EXPECT_EQ(not_json.error().code, ErrorCode::kCorrupt);
  EXPECT_NE(not_json.error().message.find("tokenizer.json"), std::string::npos);

  auto expect_error = [](json tj, ErrorCode code, std::string_view needle) {
    auto t = make(tj);
    ASSERT_FALSE(t.has_value()) << needle;
    EXPECT_EQ(t.error().code, code) << t.error().message;
    EXPECT_NE(t.error().message.find(needle), std::string::npos) << t.error().message;
  };
  json tj = tiny_tokenizer();
  tj["model"]["type"] = "WordPiece";
  expect_error(tj, ErrorCode::kUnsupported, "WordPiece");
  tj = tiny_tokenizer();
  tj["normalizer"] = json{{"type", "Lowercase"}};
  expect_error(tj, ErrorCode::kUnsupported, "Lowercase");
  tj = tiny_tokenizer();
  tj["pre_tokenizer"] = json{{"type", "BertPreTokenizer"}};
  expect_error(tj, ErrorCode::kUnsupported, "BertPreTokenizer");
  tj = tiny_tokenizer();
  tj["decoder"] = json::parse(R"({"type": "Sequence", "decoders": [{"type": "ByteFallback"},
                                  {"type": "Strip", "content": " ", "start": 1, "stop": 0}]})");
  expect_error(tj, ErrorCode::kUnsupported, "Strip");
  tj = tiny_tokenizer();
  tj["model"]["merges"] = json::array({"ab"});
  expect_error(tj, ErrorCode::kCorrupt, "merge");
  tj = tiny_tokenizer();
  tj["pre_tokenizer"] = json::parse(R"({"type": "Split", "pattern": {"Regex": "(a"},
                                       "behavior": "Isolated", "invert": false})");
  expect_error(tj, ErrorCode::kUnsupported, "(a");
  tj = tiny_tokenizer();
  tj["post_processor"] = json::parse(R"({"type": "TemplateProcessing",
      "single": [{"SpecialToken": {"id": "<bos>", "type_id": 0}}], "pair": []})");
  expect_error(tj, ErrorCode::kCorrupt, "<bos>");
  tj = tiny_tokenizer();
  tj["model"]["vocab"]["x"] = "not a number";
  expect_error(tj, ErrorCode::kCorrupt, "vocab");

  auto bad_generation = make(tiny_tokenizer(), json::object(), json{{"eos_token_id", 9999}});
  ASSERT_FALSE(bad_generation.has_value());
  EXPECT_NE(bad_generation.error().message.find("generation_config.json"), std::string::npos);
}

TEST(TokenizerLoadTest, LoadsFolderWithAllThreeFiles) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("strata_tok_load_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "tokenizer.json") << tiny_tokenizer().dump();
  std::ofstream(dir / "tokenizer_config.json") << R"({"eos_token": "</s>"})";
  std::ofstream(dir / "generation_config.json") << R"({"eos_token_id": 100})";
  auto t = Tokenizer::load(dir);
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(t.has_value()) << t.error().message;
  EXPECT_EQ((*t)->eos_ids(), (std::vector<TokenId>{101, 100}));
}

// encode() is const and shared by server threads: concurrent calls give the same ids.
TEST(TokenizerConcurrencyTest, ConcurrentEncodesAgree) {
  auto t = Tokenizer::load(test_support::real_tokenizer_dir("qwen3"));
  ASSERT_TRUE(t.has_value()) << t.error().message << " (scripts/install-deps.sh installs it)";
  std::vector<std::string> texts;
  for (int i = 0; i < 64; ++i) {
    texts.push_back("Request " + std::to_string(i) + ": caf\xC3\xA9 \xE4\xBD\xA0\xE5\xA5\xBD " +
                    std::string(static_cast<size_t>(i % 7) * 3, ' ') + "end<|im_end|>");
  }
  std::vector<std::vector<TokenId>> expected;
  for (const auto& text : texts) expected.push_back(*(*t)->encode(text));
  (*t)->clear_cache();
  const int rounds = test_support::sanitizer_build() ? 3 : 20;
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4, 0);
  for (int w = 0; w < 4; ++w) {
    threads.emplace_back([&, w] {
      for (int r = 0; r < rounds; ++r) {
        for (size_t i = 0; i < texts.size(); ++i) {
          const size_t k = (i * 7 + static_cast<size_t>(w)) % texts.size();
          auto ids = (*t)->encode(texts[k]);
          if (!ids || *ids != expected[k]) ++mismatches[static_cast<size_t>(w)];
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches, (std::vector<int>{0, 0, 0, 0}));
}

}  // namespace
}  // namespace strata
