#include "model/tokenizer/bpe_model.h"

#include <algorithm>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "model/tokenizer/byte_level.h"
#include "model/tokenizer/utf8.h"

namespace strata {

// Open-addressing hash table from a symbol pair to (rank, merged symbol). Far fewer cache
// misses than std::unordered_map on the hot path of BPE.
struct BpeModel::MergeTable {
  struct Slot {
    uint64_t key = kEmpty;
    int32_t rank = 0;
    int32_t result = 0;
  };
  static constexpr uint64_t kEmpty = ~uint64_t{0};

  std::vector<Slot> slots;
  uint64_t mask = 0;

  explicit MergeTable(size_t expected) {
    size_t capacity = 16;
    while (capacity < expected * 2) capacity <<= 1;
    slots.assign(capacity, Slot{});
    mask = capacity - 1;
  }

  static uint64_t key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
           static_cast<uint32_t>(right);
  }
  static uint64_t hash(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return k;
  }

  // A later rank for the same pair replaces the earlier one, as Map.set does in the
  // reference's bpe_ranks.
  void insert(uint64_t k, int32_t rank, int32_t result) {
    for (uint64_t i = hash(k) & mask;; i = (i + 1) & mask) {
      if (slots[i].key == kEmpty || slots[i].key == k) {
        slots[i] = Slot{k, rank, result};
        return;
      }
    }
  }
  const Slot* find(uint64_t k) const {
    for (uint64_t i = hash(k) & mask;; i = (i + 1) & mask) {
      if (slots[i].key == k) return &slots[i];
      if (slots[i].key == kEmpty) return nullptr;
    }
  }
};

// Bounded cache of per-piece results, sharded to keep lock contention low. A full shard
// is cleared (simple and bounded; hot pieces come back at once).
struct BpeModel::Cache {
  static constexpr size_t kShards = 16;
  static constexpr size_t kMaxEntriesPerShard = 8192;
  static constexpr size_t kMaxKeyBytes = 128;

  struct Shard {
    std::mutex mutex;
    std::unordered_map<std::string, std::vector<TokenId>, StringHash, std::equal_to<>> map;
  };
  std::array<Shard, kShards> shards;

  Shard& shard_for(std::string_view key) { return shards[StringHash{}(key) % kShards]; }
};

namespace {

uint64_t unit_pair(char32_t a, char32_t b) {
  return (uint64_t{a} << 32) | b;
}

}  // namespace

BpeModel::BpeModel() : cache_(std::make_unique<Cache>()) {}
BpeModel::~BpeModel() = default;

Result<std::unique_ptr<BpeModel>> BpeModel::from_json(const nlohmann::json& model, BpeTables tables,
                                                      bool byte_level) {
  if (!model.is_object()) return make_error(ErrorCode::kCorrupt, "model must be an object");
  const std::string type = model.value("type", std::string());
  if (!type.empty() && type != "BPE") {
    return make_error(ErrorCode::kUnsupported,
                      "model type '" + type + "' is not supported (only BPE)");
  }
  if (!tables.has_vocab || !tables.has_merges) {
    return make_error(ErrorCode::kCorrupt, "BPE model needs a vocab object and a merges array");
  }
  if (const auto it = model.find("end_of_word_suffix");
      it != model.end() && it->is_string() && !it->get<std::string>().empty()) {
    return make_error(ErrorCode::kUnsupported, "BPE end_of_word_suffix is not supported");
  }

  auto m = std::unique_ptr<BpeModel>(new BpeModel());
  m->byte_level_ = byte_level;
  m->ignore_merges_ = model.value("ignore_merges", false);
  m->byte_fallback_ = model.value("byte_fallback", false);
  m->fuse_unk_ = model.value("fuse_unk", false);

  // Converts a token string from the file into the model's key space.
  auto to_key = [byte_level](const std::string& token) -> std::optional<std::string> {
    if (!byte_level) return token;
    return byte_level::to_bytes(token);
  };

  m->key_to_id_.reserve(tables.vocab.size() + 1024);
  for (const auto& [token, id] : tables.vocab) {
    // Tokens outside the byte alphabet can never be produced from bytes; they stay in the
    // vocabulary for id lookups and decoding only.
    if (auto key = to_key(token)) m->key_to_id_[std::move(*key)] = id;
  }
  m->vocab_ = std::move(tables.vocab);
  if (const auto it = model.find("unk_token"); it != model.end() && it->is_string()) {
    if (auto key = to_key(it->get<std::string>())) {
      if (const auto found = m->key_to_id_.find(*key); found != m->key_to_id_.end()) {
        m->unk_id_ = found->second;
      }
      m->unk_key_ = std::move(*key);
    }
  }

  // Symbols: every string that takes part in a merge, numbered densely.
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> symbols;
  symbols.reserve(tables.merges.size() * 2);
  auto intern = [&symbols](std::string s) {
    const auto [it, inserted] =
        symbols.try_emplace(std::move(s), static_cast<int32_t>(symbols.size()));
    return it->second;
  };
  m->merges_ = std::make_unique<MergeTable>(tables.merges.size());
  // The unit at the end / start of a key (a byte, or a code point for code-point units).
  auto last_unit = [byte_level](const std::string& key) -> char32_t {
    if (byte_level) return static_cast<uint8_t>(key.back());
    size_t start = key.size() - 1;
    while (start > 0 && (static_cast<uint8_t>(key[start]) & 0xC0) == 0x80) --start;
    return utf8::decode_valid(key, start);
  };
  auto first_unit = [byte_level](const std::string& key) -> char32_t {
    if (byte_level) return static_cast<uint8_t>(key.front());
    size_t pos = 0;
    return utf8::decode_valid(key, pos);
  };
  int32_t rank = 0;
  for (const auto& [left, right] : tables.merges) {
    auto left_key = to_key(left);
    auto right_key = to_key(right);
    if (left_key && right_key && !left_key->empty() && !right_key->empty()) {
      // Every merge joins the last unit of its left side and the first of its right
      // side; these junctions are the only places where symbols ever grow.
      m->joinable_.insert(unit_pair(last_unit(*left_key), first_unit(*right_key)));
      const int32_t a = intern(*left_key);
      const int32_t b = intern(*right_key);
      left_key->append(*right_key);
      const int32_t r = intern(std::move(*left_key));
      m->merges_->insert(MergeTable::key(a, b), rank, r);
    }
    ++rank;
  }
  m->byte_symbol_.fill(-1);
  if (!byte_level) m->bmp_symbol_.assign(0x10000, -1);
  for (const auto& [s, sym] : symbols) {
    if (s.empty()) continue;
    if (byte_level) {
      if (s.size() == 1) m->byte_symbol_[static_cast<uint8_t>(s[0])] = sym;
      continue;
    }
    size_t pos = 0;
    const char32_t cp = utf8::decode_valid(s, pos);
    if (pos != s.size()) continue;
    if (cp < 0x10000) {
      m->bmp_symbol_[cp] = sym;
    } else {
      m->cp_symbol_.emplace(cp, sym);
    }
  }
  return m;
}

void BpeModel::clear_cache() const {
  for (auto& shard : cache_->shards) {
    std::lock_guard lock(shard.mutex);
    shard.map.clear();
  }
}

void BpeModel::add_token(std::string_view content, TokenId id) {
  std::optional<std::string> key =
      byte_level_ ? byte_level::to_bytes(content) : std::optional<std::string>(content);
  if (key) key_to_id_[std::move(*key)] = id;
}

int32_t BpeModel::unit_symbol(std::string_view piece, size_t pos, size_t& next) const {
  if (byte_level_) {
    next = pos + 1;
    return byte_symbol_[static_cast<uint8_t>(piece[pos])];
  }
  next = pos;
  const char32_t cp = utf8::decode_valid(piece, next);
  if (cp < 0x10000) return bmp_symbol_[cp];
  const auto it = cp_symbol_.find(cp);
  return it == cp_symbol_.end() ? -1 : it->second;
}

void BpeModel::emit_token(std::string_view key, std::vector<TokenId>& out) const {
  if (const auto it = key_to_id_.find(key); it != key_to_id_.end()) {
    out.push_back(it->second);
    return;
  }
  if (byte_fallback_) {
    // The reference UTF-8-encodes the token string (byte-level strings are in the alphabet).
    const std::string text = byte_level_ ? byte_level::from_bytes(key) : std::string(key);
    const size_t start = out.size();
    bool all_found = true;
    for (const char c : text) {
      char name[8];
      std::snprintf(name, sizeof name, "<0x%02X>", static_cast<unsigned>(static_cast<uint8_t>(c)));
      const auto it = key_to_id_.find(std::string_view(name));
      if (it == key_to_id_.end()) {
        all_found = false;
        break;
      }
      out.push_back(it->second);
    }
    if (all_found) return;
    out.resize(start);
  }
  // Unknown: the unk token when the model has one; without one the reference yields no
  // valid id either, and the piece is dropped.
  if (unk_key_) {
    if (const auto it = key_to_id_.find(*unk_key_); it != key_to_id_.end()) {
      out.push_back(it->second);
    }
  }
}

void BpeModel::encode_piece(std::string_view piece, std::vector<TokenId>& out) const {
  struct Node {
    int32_t symbol;  // -1: no symbol (cannot merge); kDead: merged into its left neighbour
    int32_t prev;
    int32_t next;
    uint32_t begin;
    uint32_t end;
  };
  struct Candidate {
    int32_t rank;
    int32_t left;
    int32_t right;
  };
  constexpr int32_t kDead = -2;
  // Min-heap on (rank, left position): the reference's score rank + position / length.
  const auto later = [](const Candidate& a, const Candidate& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.left > b.left;
  };
  thread_local std::vector<Node> nodes;
  thread_local std::vector<Candidate> heap;
  nodes.clear();
  heap.clear();
  for (size_t pos = 0; pos < piece.size();) {
    size_t next = 0;
    const int32_t symbol = unit_symbol(piece, pos, next);
    const auto index = static_cast<int32_t>(nodes.size());
    nodes.push_back(Node{symbol, index - 1, index + 1, static_cast<uint32_t>(pos),
                         static_cast<uint32_t>(next)});
    pos = next;
  }
  if (nodes.empty()) return;
  nodes.back().next = -1;

  auto push_pair = [&](int32_t left) {
    const int32_t right = nodes[left].next;
    if (right < 0) return;
    const int32_t a = nodes[left].symbol;
    const int32_t b = nodes[right].symbol;
    if (a < 0 || b < 0) return;
    if (const auto* slot = merges_->find(MergeTable::key(a, b))) {
      heap.push_back(Candidate{slot->rank, left, right});
      std::push_heap(heap.begin(), heap.end(), later);
    }
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(nodes.size()); ++i) push_pair(i);

  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    const Candidate c = heap.back();
    heap.pop_back();
    Node& left = nodes[c.left];
    if (left.symbol < 0 || left.next != c.right) continue;
    Node& right = nodes[c.right];
    if (right.symbol < 0) continue;
    // Stale when either side changed since the candidate was pushed: a pair has one rank.
    const auto* slot = merges_->find(MergeTable::key(left.symbol, right.symbol));
    if (slot == nullptr || slot->rank != c.rank) continue;
    left.symbol = slot->result;
    left.end = right.end;
    left.next = right.next;
    if (right.next >= 0) nodes[right.next].prev = c.left;
    right.symbol = kDead;
    if (left.prev >= 0) push_pair(left.prev);
    push_pair(c.left);
  }
  for (int32_t i = 0; i >= 0; i = nodes[i].next) {
    emit_token(piece.substr(nodes[i].begin, nodes[i].end - nodes[i].begin), out);
  }
}

void BpeModel::encode_cached(std::string_view piece, std::vector<TokenId>& out) const {
  Cache::Shard& shard = cache_->shard_for(piece);
  {
    std::lock_guard lock(shard.mutex);
    if (const auto it = shard.map.find(piece); it != shard.map.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t start = out.size();
  encode_piece(piece, out);
  std::vector<TokenId> ids(out.begin() + static_cast<ptrdiff_t>(start), out.end());
  std::lock_guard lock(shard.mutex);
  if (shard.map.size() >= Cache::kMaxEntriesPerShard) shard.map.clear();
  shard.map.try_emplace(std::string(piece), std::move(ids));
}

void BpeModel::encode(std::span<const std::string_view> pieces, std::vector<TokenId>& out) const {
  const size_t section_start = out.size();
  for (const std::string_view piece : pieces) {
    if (piece.empty()) continue;
    if (ignore_merges_) {
      if (const auto it = key_to_id_.find(piece); it != key_to_id_.end()) {
        out.push_back(it->second);
        continue;
      }
    }
    if (piece.size() <= Cache::kMaxKeyBytes) {
      encode_cached(piece, out);
      continue;
    }
    // A long piece (a Metaspace section is one piece) is cut where no merge can join
    // the units on either side: the merges inside each chunk are exactly those the
    // whole-piece process makes there, and chunks repeat, so the cache works again.
    size_t chunk_start = 0;
    size_t pos = 0;
    char32_t prev = 0;
    while (pos < piece.size()) {
      const size_t at = pos;
      char32_t unit = 0;
      if (byte_level_) {
        unit = static_cast<uint8_t>(piece[pos++]);
      } else {
        unit = utf8::decode_valid(piece, pos);
      }
      if (at > chunk_start && !joinable_.contains(unit_pair(prev, unit))) {
        const std::string_view chunk = piece.substr(chunk_start, at - chunk_start);
        if (chunk.size() <= Cache::kMaxKeyBytes) {
          encode_cached(chunk, out);
        } else {
          encode_piece(chunk, out);
        }
        chunk_start = at;
      }
      prev = unit;
    }
    const std::string_view chunk = piece.substr(chunk_start);
    if (chunk.size() <= Cache::kMaxKeyBytes) {
      encode_cached(chunk, out);
    } else {
      encode_piece(chunk, out);
    }
  }
  if (fuse_unk_ && unk_id_) {
    // Consecutive unknown tokens collapse into one (fuse_unk in the reference).
    size_t write = section_start;
    for (size_t read = section_start; read < out.size(); ++read) {
      if (out[read] == *unk_id_ && write > section_start && out[write - 1] == *unk_id_) continue;
      out[write++] = out[read];
    }
    out.resize(write);
  }
}

}  // namespace strata
