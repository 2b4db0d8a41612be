// Deterministic English-like text of a requested length in tokens, for the benchmark's
// generated conversations (no external data). Words come from a built-in list of common
// English words arranged into sentences and paragraphs, so that prompts are varied and
// their tokens do not repeat trivially, yet every byte follows from the seed.
//
// Token counts. The generator counts each distinct piece (" word", "Word", ",", ".\n\n")
// once with the given TokenCounter and sums the pieces. Byte-level BPE tokenizers with a
// pre-tokenizer regex (Qwen, Llama 3, GPT-2) split text at exactly these boundaries, so
// the sum equals the count of the whole text (tested against the real Qwen3 tokenizer);
// for other tokenizers it is an estimate.
//
// Ownership and threads: a TextGenerator owns its random stream and piece cache; it is not
// thread-safe (ConversationSource serializes access). BenchRng is a plain value.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/result.h"

namespace strata::bench {

// Counts the tokens of a piece of text (no special tokens added).
using TokenCounter = std::function<Result<int64_t>(std::string_view text)>;

// SplitMix64: a small generator whose stream is the same on every platform and compiler
// (the standard distributions are not), so a seed names one benchmark exactly.
class BenchRng {
 public:
  explicit BenchRng(uint64_t seed) : state_(seed) {}
  uint64_t next();
  // Uniform integer in [lo, hi] (lo <= hi).
  int64_t uniform_int(int64_t lo, int64_t hi);
  // Uniform in [0, 1).
  double uniform01();
  // Uniform in [lo, hi).
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform01(); }

 private:
  uint64_t state_;
};

// A seed for the `index`-th item of the stream named `stream` under `seed`: conversations
// are generated independently of one another, so the k-th flood conversation is the same
// whichever worker asks for it first.
uint64_t derive_seed(uint64_t seed, std::string_view stream, uint64_t index);

// The built-in word list (a few hundred common English words).
const std::vector<std::string_view>& bench_words();

struct GeneratedText {
  std::string text;
  int64_t tokens = 0;  // the sum of the pieces' counts (see the header comment)
};

class TextGenerator {
 public:
  TextGenerator(uint64_t seed, TokenCounter counter);

  // Sentences and paragraphs of `tokens` tokens, give or take the last piece (a piece is
  // at most a few tokens). tokens >= 1.
  Result<GeneratedText> text(int64_t tokens);
  // A target drawn uniformly in [min_tokens, max_tokens], then text() of it, clamped so the
  // result is within the range.
  Result<GeneratedText> text_in_range(int64_t min_tokens, int64_t max_tokens);

  BenchRng& rng() { return rng_; }
  // Distinct pieces counted so far (each cost one TokenCounter call).
  size_t pieces_counted() const { return piece_tokens_.size(); }

 private:
  Result<int64_t> piece_tokens(const std::string& piece);
  std::string next_word(bool capitalize);

  BenchRng rng_;
  TokenCounter counter_;
  std::unordered_map<std::string, int64_t> piece_tokens_;
};

}  // namespace strata::bench
