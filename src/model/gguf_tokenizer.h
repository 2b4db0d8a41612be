// A GGUF file's tokenizer, as llama-server reads it, converted to the Hugging Face files
// Strata's tokenizer loads (text/tokenizer/tokenizer.h), and back (make-model --gguf).
//
// Supported: `tokenizer.ggml.model` = "gpt2" (byte-level BPE: tokens, merges "a b",
// token types) with `tokenizer.ggml.pre` naming a pre-tokenizer Strata knows:
//   gpt2, default      GPT-2's ByteLevel split;
//   qwen2              Qwen2/Qwen3's Split regex (digits one by one) after NFC;
//   llama3, llama-bpe  Llama 3's Split regex (digits in threes).
// Token types: 1 normal, 2 unknown, 5 unused, 6 byte go into the BPE vocabulary; 3
// control (special) and 4 user-defined (not special) become added tokens. BOS/EOS/padding
// ids, `tokenizer.ggml.add_bos_token` and `tokenizer.chat_template` go to
// tokenizer_config.json. Refused (kUnsupported, naming it): a SentencePiece ("llama")
// or any other vocabulary, an unknown pre-tokenizer; give a Hugging Face tokenizer
// folder instead (`strata serve --tokenizer DIR`).
#pragma once

#include <filesystem>
#include <string>

#include "common/result.h"
#include "model/gguf.h"
#include "model/make_gguf.h"

namespace strata {

struct HfTokenizerTexts {
  std::string tokenizer_json;
  std::string tokenizer_config_json;
};

Result<HfTokenizerTexts> gguf_tokenizer_json(const GgufFile& file);

// The tokenizer of a Hugging Face folder (tokenizer.json, tokenizer_config.json) as GGUF
// metadata: kUnsupported when its pre-tokenizer is none of the above. Tokens up to
// `vocab_size` (the model's, padded with "[PAD<id>]" unused tokens).
Result<GgufTokenizerData> gguf_tokenizer_from_hf(const std::filesystem::path& dir,
                                                 int32_t vocab_size);

}  // namespace strata
