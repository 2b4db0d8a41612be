// Tokenizer files for `strata make-model`: a small byte-level BPE tokenizer generated
// deterministically (Hugging Face tokenizer.json + tokenizer_config.json with a
// ChatML chat template), or the files of an existing tokenizer folder, whose
// vocabulary size and special ids the model must then follow.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/result.h"

namespace strata {

// Size and special ids of a tokenizer, as a model config needs them.
struct TokenizerInfo {
  int32_t vocab_size = 0;  // largest id (vocabulary or added token) + 1
  std::optional<int32_t> bos_id;
  std::vector<int32_t> eos_ids;  // the eos token first, then known end-of-turn tokens
  std::optional<int32_t> pad_id;
};

struct GeneratedTokenizer {
  nlohmann::json tokenizer;         // tokenizer.json
  nlohmann::json tokenizer_config;  // tokenizer_config.json
  TokenizerInfo info;
};

// The generated tokenizer: 256 byte symbols plus merges learned from a built-in English
// corpus (most frequent pair first, ties broken by the smaller pair of ids) up to
// kGeneratedRegularTokens, then the special tokens <|endoftext|>, <|im_start|>,
// <|im_end|>, <|begin_of_text|>. Same output on every call and machine.
inline constexpr int32_t kGeneratedRegularTokens = 1020;
inline constexpr int32_t kGeneratedVocabSize = kGeneratedRegularTokens + 4;
GeneratedTokenizer make_byte_level_bpe_tokenizer(int64_t model_max_length);

// Reads tokenizer.json (and tokenizer_config.json when present) in `dir`.
Result<TokenizerInfo> inspect_tokenizer_dir(const std::filesystem::path& dir);

// Copies the tokenizer files of `from` (every regular file whose name starts with
// "tokenizer", plus special_tokens_map.json, vocab.json, merges.txt, added_tokens.json
// when present) into `to`.
Status copy_tokenizer_files(const std::filesystem::path& from, const std::filesystem::path& to);

}  // namespace strata
