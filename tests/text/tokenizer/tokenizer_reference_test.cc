// Exactness against the reference: Strata's ids and decoded text equal those of
// @lenml/tokenizers (run under Node by reference_tokenize.mjs) for the real Qwen3, Llama 3
// and Llama 2 tokenizer files and variants of them, on a fixed corpus (corpus.json), on
// seeded random text and on random id sequences. Streaming decode is checked against the
// whole-sequence decode on the way.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "text/tokenizer/json_scanner.h"
#include "text/tokenizer/random_text.h"
#include "text/tokenizer/reference_runner.h"
#include "text/tokenizer/tokenizer.h"
#include "text/tokenizer/utf8.h"

namespace strata {
namespace {

using nlohmann::json;
using test_support::escaped;
using test_support::from_hex;
using test_support::to_hex;

struct TextCase {
  std::string name;
  std::string bytes;
};

// A tokenizer folder: one of the real ones, or a variant of one with edited
// tokenizer.json / tokenizer_config.json that exercises other supported components
// (TemplateProcessing in a Sequence, LlamaTokenizer with legacy false, the Metaspace
// pre-tokenizer and decoder, GPT-2's ByteLevel regex with clean-up, Digits, NFKC, NFD,
// Strip, StripAccents and a regex Replace normalizer, WhitespaceSplit, Whitespace,
// Punctuation, Split with "Removed" and invert, remove_space). Variants are written once
// per process to a temp folder.
struct Variant {
  std::string base;
  std::map<std::string, std::string> tokenizer_members;  // top-level key -> new JSON value
  json config_members;                                   // merged into tokenizer_config
};

const std::map<std::string, Variant>& variants() {
  static const std::string kQwenSplit = R"({"type": "Split", "pattern": {"Regex":
      "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
      "behavior": "Isolated", "invert": false})";
  static const std::map<std::string, Variant> all = {
      {"llama3_template",
       {"llama3",
        {{"post_processor", R"({"type": "Sequence", "processors": [
            {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
            {"type": "TemplateProcessing",
             "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                        {"Sequence": {"id": "A", "type_id": 0}}],
             "pair": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                      {"Sequence": {"id": "A", "type_id": 0}},
                      {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 1}},
                      {"Sequence": {"id": "B", "type_id": 1}}],
             "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>",
                                "ids": [128000], "tokens": ["<|begin_of_text|>"]}}}]})"}},
        json::object()}},
      {"llama2_nonlegacy", {"llama2", {}, json{{"legacy", false}}}},
      {"llama2_metaspace",
       {"llama2",
        {{"normalizer", "null"},
         {"pre_tokenizer", R"({"type": "Metaspace", "replacement": "\u2581",
              "add_prefix_space": true, "prepend_scheme": "first"})"},
         {"decoder", R"({"type": "Sequence", "decoders": [
              {"type": "Metaspace", "replacement": "\u2581", "add_prefix_space": true,
               "prepend_scheme": "first"},
              {"type": "ByteFallback"}, {"type": "Fuse"}]})"}},
        json::object()}},
      {"gpt2_style",
       {"qwen3",
        {{"normalizer", "null"},
         {"pre_tokenizer", R"({"type": "ByteLevel", "add_prefix_space": false,
              "trim_offsets": true, "use_regex": true})"}},
        json{{"clean_up_tokenization_spaces", true}, {"tokenizer_class", "GPT2Tokenizer"}}}},
      {"qwen3_digits_nfkc",
       {"qwen3",
        {{"normalizer", R"({"type": "Sequence", "normalizers": [{"type": "NFKC"},
              {"type": "Replace", "pattern": {"Regex": " {3,}"}, "content": "   "}]})"},
         {"pre_tokenizer", R"({"type": "Sequence", "pretokenizers": [
              {"type": "Digits", "individual_digits": false}, )" +
                               kQwenSplit + R"(,
              {"type": "ByteLevel", "add_prefix_space": true, "use_regex": false}]})"}},
        json::object()}},
      {"llama2_whitespace_punct",
       {"llama2",
        {{"normalizer", R"({"type": "Sequence", "normalizers": [
              {"type": "Strip", "strip_left": true, "strip_right": true},
              {"type": "NFD"}, {"type": "StripAccents"}]})"},
         {"pre_tokenizer", R"({"type": "Sequence", "pretokenizers": [
              {"type": "WhitespaceSplit"}, {"type": "Punctuation", "behavior": "Isolated"},
              {"type": "Digits", "individual_digits": true}]})"}},
        json::object()}},
      {"llama2_split_removed",
       {"llama2",
        {{"normalizer", "null"}, {"pre_tokenizer", R"({"type": "Sequence", "pretokenizers": [
              {"type": "Split", "pattern": {"String": " "}, "behavior": "Removed", "invert": false},
              {"type": "Split", "pattern": {"Regex": "(\\d)(x)?"}, "behavior": "Removed",
               "invert": false},
              {"type": "Split", "pattern": {"Regex": "\\p{L}+|\\p{N}+|[^\\s\\p{L}\\p{N}]"},
               "behavior": "Isolated", "invert": true},
              {"type": "Whitespace"}]})"}},
        json{{"remove_space", true}}}},
  };
  return all;
}

std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot open " << path << " (scripts/install-deps.sh installs it)";
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// `text` (a JSON object) with some top-level members replaced, without a JSON DOM of the
// (large) rest.
std::string replace_members(std::string_view text,
                            const std::map<std::string, std::string>& replacements) {
  JsonScanner scanner(text);
  EXPECT_TRUE(scanner.expect('{').has_value());
  std::string out = "{";
  std::string key;
  bool first = true;
  while (!scanner.consume('}')) {
    if (!first) {
      EXPECT_TRUE(scanner.expect(',').has_value());
    }
    EXPECT_TRUE(scanner.read_string(key).has_value());
    EXPECT_TRUE(scanner.expect(':').has_value());
    auto raw = scanner.skip_value();
    EXPECT_TRUE(raw.has_value());
    const auto it = replacements.find(key);
    if (!first) out.push_back(',');
    out.append(json(key).dump()).push_back(':');
    out.append(it != replacements.end() ? std::string_view(it->second) : *raw);
    first = false;
  }
  return out + "}";
}

// Removes the variant folders this process wrote.
struct TempDirs {
  std::vector<std::filesystem::path> dirs;
  ~TempDirs() {
    std::error_code ec;
    for (const auto& d : dirs) std::filesystem::remove_all(d, ec);
  }
};

std::filesystem::path tokenizer_dir(const std::string& name) {
  static std::mutex mutex;
  static std::map<std::string, std::filesystem::path> prepared;
  static TempDirs temp_dirs;
  std::lock_guard lock(mutex);
  const auto it = variants().find(name);
  if (it == variants().end()) return test_support::real_tokenizer_dir(name);
  auto& dir = prepared[name];
  if (dir.empty()) {
    const auto base = test_support::real_tokenizer_dir(it->second.base);
    json config = json::parse(read_text(base / "tokenizer_config.json"));
    config.update(it->second.config_members);
    dir = std::filesystem::temp_directory_path() /
          ("strata_tok_" + name + "_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    temp_dirs.dirs.push_back(dir);
    const std::string edited =
        replace_members(read_text(base / "tokenizer.json"), it->second.tokenizer_members);
    for (const auto& [key, value] : it->second.tokenizer_members) {
      EXPECT_NE(edited.find(json(key).dump() + ":" + value), std::string::npos)
          << name << ": member " << key << " was not replaced";
    }
    std::ofstream(dir / "tokenizer.json", std::ios::binary) << edited;
    std::ofstream(dir / "tokenizer_config.json") << config.dump();
  }
  return dir;
}

// The real tokenizer `name`, or the variant of one that variants() defines.
const Tokenizer& real_or_variant_tokenizer(const std::string& name) {
  return test_support::cached_tokenizer(tokenizer_dir(name));
}

std::vector<TextCase> load_corpus() {
  const auto path = test_support::source_dir() / "tests/text/tokenizer/corpus.json";
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  const json corpus = json::parse(in);
  std::vector<TextCase> cases;
  for (const auto& entry : corpus) {
    TextCase c;
    c.name = entry.at("name").get<std::string>();
    c.bytes = entry.contains("hex") ? from_hex(entry.at("hex").get<std::string>())
                                    : entry.at("text").get<std::string>();
    cases.push_back(std::move(c));
  }
  return cases;
}

std::string ids_string(const std::vector<TokenId>& ids) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) s.push_back(',');
    s.append(std::to_string(ids[i]));
  }
  s.push_back(']');
  return s;
}

// Decodes `ids` piece by piece and checks the pieces against the whole-sequence decode.
void expect_stream_matches(const Tokenizer& tok, const std::vector<TokenId>& ids, bool skip_special,
                           const std::string& label) {
  DecodeOptions options;
  options.skip_special_tokens = skip_special;
  auto whole = tok.decode(ids, options);
  ASSERT_TRUE(whole.has_value()) << whole.error().message;
  StreamDecoder stream = tok.stream_decoder(options);
  std::string joined;
  for (const TokenId id : ids) {
    auto piece = stream.push(id);
    ASSERT_TRUE(piece.has_value()) << piece.error().message;
    EXPECT_TRUE(utf8::is_valid(*piece)) << label << ": stream piece is not valid UTF-8";
    joined += *piece;
  }
  const std::string tail = stream.finish();
  EXPECT_TRUE(utf8::is_valid(tail)) << label;
  joined += tail;
  EXPECT_EQ(joined, *whole) << label
                            << ": streamed pieces differ from decode (skip=" << skip_special << ")";
}

// Compares Strata's encode and decode of `c` with the reference's `ref`; returns false on
// a mismatch (reported as test failures).
bool check_encode(const Tokenizer& tok, const std::string& tokenizer_name, const TextCase& c,
                  const json& ref) {
  const std::string label =
      tokenizer_name + " case '" + c.name + "' text \"" + escaped(c.bytes) + "\"";
  const auto ref_ids = ref.at("ids").get<std::vector<TokenId>>();
  const auto ref_plain = ref.at("ids_plain").get<std::vector<TokenId>>();
  auto ids = tok.encode(c.bytes);
  auto plain = tok.encode(c.bytes, EncodeOptions{.add_special_tokens = false});
  if (!ids || !plain) {
    ADD_FAILURE() << label << ": encode failed";
    return false;
  }
  bool ok = true;
  if (*ids != ref_ids) {
    ADD_FAILURE() << label << "\n  strata:    " << ids_string(*ids)
                  << "\n  reference: " << ids_string(ref_ids);
    ok = false;
  }
  if (*plain != ref_plain) {
    ADD_FAILURE() << label << " (no special tokens)\n  strata:    " << ids_string(*plain)
                  << "\n  reference: " << ids_string(ref_plain);
    ok = false;
  }
  if (!ref.at("decoded").is_null()) {
    for (const bool skip : {false, true}) {
      auto text = tok.decode(ref_ids, DecodeOptions{.skip_special_tokens = skip});
      const std::string expected =
          from_hex(ref.at(skip ? "decoded_skip" : "decoded").get<std::string>());
      if (!text || *text != expected) {
        ADD_FAILURE() << label << ": decode(skip_special_tokens=" << skip << ")\n  strata:    \""
                      << (text ? escaped(*text) : text.error().message) << "\"\n  reference: \""
                      << escaped(expected) << "\"";
        ok = false;
      }
      expect_stream_matches(tok, ref_ids, skip, label);
    }
  }
  return ok;
}

bool check_decode(const Tokenizer& tok, const std::string& tokenizer_name,
                  const std::vector<TokenId>& ids, const json& ref) {
  const std::string label = tokenizer_name + " ids " + ids_string(ids);
  bool ok = true;
  for (const bool skip : {false, true}) {
    auto text = tok.decode(ids, DecodeOptions{.skip_special_tokens = skip});
    const std::string expected =
        from_hex(ref.at(skip ? "decoded_skip" : "decoded").get<std::string>());
    if (!text || *text != expected) {
      ADD_FAILURE() << label << " skip=" << skip << "\n  strata:    \""
                    << (text ? escaped(*text) : text.error().message) << "\"\n  reference: \""
                    << escaped(expected) << "\"";
      ok = false;
    }
    expect_stream_matches(tok, ids, skip, label);
  }
  return ok;
}

// Random id sequences exercise decoding beyond what encoding produces: byte tokens that
// never complete a character, special tokens between partial characters, and so on.
std::vector<std::vector<TokenId>> random_id_sequences(const Tokenizer& tok, int count) {
  std::mt19937 rng(1234);
  const auto vocab = static_cast<int>(tok.vocab_size());
  std::vector<TokenId> specials;
  for (int id = 0; id < vocab; ++id) {
    if (tok.is_special(id)) specials.push_back(id);
  }
  // Pieces of encoded multi-byte text, cut anywhere, so partial characters are common.
  test_support::RandomText random(99);
  std::vector<TokenId> pool;
  for (int i = 0; i < 50; ++i) {
    auto ids = tok.encode(random.next(12, false), EncodeOptions{.add_special_tokens = false});
    if (ids) pool.insert(pool.end(), ids->begin(), ids->end());
  }
  if (pool.empty()) pool.push_back(0);
  std::vector<std::vector<TokenId>> sequences;
  for (int i = 0; i < count; ++i) {
    std::vector<TokenId> seq;
    const int len = std::uniform_int_distribution<int>(1, 24)(rng);
    for (int k = 0; k < len; ++k) {
      const int kind = std::uniform_int_distribution<int>(0, 9)(rng);
      if (kind <= 4) {
        seq.push_back(pool[std::uniform_int_distribution<size_t>(0, pool.size() - 1)(rng)]);
      } else if (kind <= 6) {
        seq.push_back(std::uniform_int_distribution<TokenId>(0, vocab - 1)(rng));
      } else if (kind == 7 && !specials.empty()) {
        seq.push_back(specials[std::uniform_int_distribution<size_t>(0, specials.size() - 1)(rng)]);
      } else {
        // Llama 2's <0x00>..<0xFF> are ids 3..258; for byte-level vocabularies these are
        // ordinary (often single-byte) tokens.
        seq.push_back(std::uniform_int_distribution<TokenId>(3, 258)(rng));
      }
    }
    sequences.push_back(std::move(seq));
  }
  return sequences;
}

// One test per tokenizer (one load and one reference run, which keeps sanitizer builds
// fast): the corpus, seeded random text (a quarter with invalid UTF-8) and random id
// sequences, compared with the reference.
class ReferenceTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ReferenceTest, MatchesReference) {
  const std::string& name = GetParam();
  const Tokenizer& tok = real_or_variant_tokenizer(name);
  std::vector<TextCase> cases = load_corpus();
  ASSERT_GT(cases.size(), 50u);
  const int random_texts = test_support::sanitizer_build() ? 150 : 400;
  test_support::RandomText random(0x5eed0000 + name.size());
  for (int i = 0; i < random_texts; ++i) {
    cases.push_back(TextCase{"random#" + std::to_string(i), random.next(24, i % 4 == 3)});
  }
  const auto sequences = random_id_sequences(tok, test_support::sanitizer_build() ? 100 : 300);

  std::vector<std::string> lines;
  for (const auto& c : cases) lines.push_back("e " + to_hex(c.bytes));
  for (const auto& seq : sequences) {
    const std::string list = ids_string(seq);  // "[1,2,3]"
    lines.push_back("d " + list.substr(1, list.size() - 2));
  }
  auto reference = test_support::run_reference(tokenizer_dir(name), lines);
  ASSERT_TRUE(reference.has_value()) << reference.error().message;
  ASSERT_EQ(reference->size(), lines.size());

  int mismatches = 0;
  for (size_t i = 0; i < cases.size() && mismatches < 20; ++i) {
    if (!check_encode(tok, name, cases[i], (*reference)[i])) ++mismatches;
  }
  for (size_t i = 0; i < sequences.size() && mismatches < 20; ++i) {
    if (!check_decode(tok, name, sequences[i], (*reference)[cases.size() + i])) ++mismatches;
  }
  EXPECT_EQ(mismatches, 0);
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, ReferenceTest,
                         ::testing::Values("qwen3", "llama3", "llama2", "llama3_template",
                                           "llama2_nonlegacy", "llama2_metaspace", "gpt2_style",
                                           "qwen3_digits_nfkc", "llama2_whitespace_punct",
                                           "llama2_split_removed"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace strata
