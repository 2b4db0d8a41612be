// BpeModel: the "model" section of a tokenizer.json with "type": "BPE", encoding the
// pieces of a pre-tokenized section into token ids exactly as the reference does:
// merges applied lowest rank first (leftmost on ties), ignore_merges (whole piece looked
// up first, Llama 3), byte_fallback to <0xNN> tokens (Llama 2, Mistral), unk and fuse_unk.
//
// In byte-level mode (the pre-tokenizer ends with ByteLevel) the vocabulary and merges are
// converted from GPT-2's byte alphabet to raw bytes at load, so pieces are encoded as raw
// bytes without building the alphabet string. Otherwise units are code points.
//
// Cost: linear in a piece's length. Each merge candidate moves through at most 64 buckets
// of the queue (MergeQueue in bpe_model.cc); only a merge list that uses a token before a
// merge that makes it sends a few candidates through a log-time heap. Scratch: 16 bytes
// a unit and 8 a pending candidate (about 40 bytes a unit at the peak), kept by a thread
// for short pieces only: a long piece's scratch is freed after it.
//
// Thread-safe: encode() is const; its per-piece result cache is internally synchronized.
#pragma once

#include <array>
#include <climits>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "common/result.h"

namespace strata {

using TokenId = int32_t;

// Transparent string hash so that maps keyed by std::string accept string_view lookups.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using StringIdMap = std::unordered_map<std::string, TokenId, StringHash, std::equal_to<>>;

// The large parts of a BPE "model" object, read without a JSON DOM (json_scanner.h).
struct BpeTables {
  bool has_vocab = false;
  bool has_merges = false;
  std::vector<std::pair<std::string, TokenId>> vocab;       // in file order
  std::vector<std::pair<std::string, std::string>> merges;  // in rank order
};

class BpeModel {
 public:
  // Builds from the "model" object's other fields (`model`) and its vocabulary and merges
  // (`tables`). `byte_level` selects raw-byte units (see above).
  static Result<std::unique_ptr<BpeModel>> from_json(const nlohmann::json& model, BpeTables tables,
                                                     bool byte_level);

  ~BpeModel();
  BpeModel(const BpeModel&) = delete;
  BpeModel& operator=(const BpeModel&) = delete;

  // Registers an added token the way the reference's tokens_to_ids.set(content, id) does:
  // it may shadow a vocabulary entry with the same string. Call before encoding.
  void add_token(std::string_view content, TokenId id);

  // The longest piece encode_word takes: BPE indexes units and bytes with 32-bit integers.
  static constexpr size_t kMaxPieceBytes = INT32_MAX;

  // Encodes one piece of a section, appending its ids to `out`. Precondition:
  // piece.size() <= kMaxPieceBytes.
  void encode_word(std::string_view piece, std::vector<TokenId>& out) const;
  // fuse_unk across a section, as in the reference: call once the section's pieces are
  // encoded, with `section_start` the size of `out` before its first piece.
  void fuse_unknowns(std::vector<TokenId>& out, size_t section_start) const;

  // A lower bound of the number of ids encode_word appends for `piece`: no id covers more
  // than max_token_bytes_ of its bytes. 0 when no such bound holds (a model whose unknown
  // pieces may vanish or fuse).
  size_t min_ids(std::string_view piece) const {
    return max_token_bytes_ == 0 ? 0 : (piece.size() + max_token_bytes_ - 1) / max_token_bytes_;
  }

  // Empties the per-piece result cache (benchmarks measure cold encoding with it).
  void clear_cache() const;

  // The vocabulary entries of the "vocab" object: (token string as in the file, id).
  const std::vector<std::pair<std::string, TokenId>>& vocab_entries() const { return vocab_; }
  std::optional<TokenId> unk_id() const { return unk_id_; }
  bool byte_level() const { return byte_level_; }

 private:
  struct MergeTable;
  struct Cache;

  BpeModel();
  // BPE of one piece or chunk (no cache, no ignore_merges, no fuse_unk), appending ids.
  void encode_piece(std::string_view piece, std::vector<TokenId>& out) const;
  // encode_piece through the result cache.
  void encode_cached(std::string_view piece, std::vector<TokenId>& out) const;
  // Appends the id of token `key` (model key space), or its byte fallback / unk.
  void emit_token(std::string_view key, std::vector<TokenId>& out) const;
  int32_t unit_symbol(std::string_view piece, size_t pos, size_t& next) const;
  // max_token_bytes_ for a model whose merge results are all tokens (`results_known`),
  // whose longest merge result has `longest_result` bytes and one of whose merge results
  // is the unk token (`unk_is_result`); 0 when no bound holds.
  size_t token_bound(bool results_known, size_t longest_result, bool unk_is_result) const;

  bool byte_level_ = false;
  bool ignore_merges_ = false;
  bool byte_fallback_ = false;
  bool fuse_unk_ = false;
  std::optional<TokenId> unk_id_;       // unk in the vocabulary (fuse_unk compares with it)
  std::optional<std::string> unk_key_;  // unk token string, model key space
  std::vector<std::pair<std::string, TokenId>> vocab_;
  StringIdMap key_to_id_;  // vocabulary + added tokens, in model key space
  std::unique_ptr<MergeTable> merges_;
  std::array<int32_t, 256> byte_symbol_{};           // byte-level units
  std::vector<int32_t> bmp_symbol_;                  // code point units below U+10000
  std::unordered_map<char32_t, int32_t> cp_symbol_;  // code point units above
  // Junctions of all merges: (last unit of the left side, first unit of the right side),
  // units being bytes or code points. Symbols only grow at such junctions, so no merge
  // ever joins units that are not such a pair: long pieces are cut there and encoded chunk
  // by chunk with the same result (see encode_word). Byte-level units use the bitmap.
  std::unordered_set<uint64_t> joinable_;
  std::vector<bool> joinable_bytes_;  // [left byte * 256 + right byte], byte-level only
  // Most bytes of a piece that one id covers (see token_bound); 0: min_ids() has no bound.
  size_t max_token_bytes_ = 0;
  std::unique_ptr<Cache> cache_;
};

}  // namespace strata
