#include "text/tokenizer/bpe_model.h"

#include <algorithm>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "text/tokenizer/byte_level.h"
#include "text/tokenizer/utf8.h"

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

// A unit of a piece during BPE: units merge into symbols, which keep the index of their
// first unit. 16 bytes per unit.
struct Node {
  int32_t symbol;  // -1: no symbol (cannot merge); kDead: merged into its left neighbour
  int32_t prev;    // index of the previous live node, -1 at the start
  int32_t next;    // index of the next live node, -1 at the end
  uint32_t begin;  // byte offset in the piece; the symbol ends where `next` begins
};
constexpr int32_t kDead = -2;

// Min-priority queue of merge candidates, keyed (rank << 32 | index of the left node): the
// reference's order, lowest rank first and leftmost on ties.
//
// It is a radix heap: a key goes to the bucket of the highest bit where it differs from
// the last key taken, so a push is an append and a key moves down at most 64 buckets in
// all, in sequential passes. A binary heap of 10 million candidates spends its time in
// cache misses (9 s for a 10 MB word); this takes under 2 s. A radix heap needs each
// key pushed to be no smaller than the last one taken, which BPE gives for a well-formed
// merge list: a merge's result only takes part in merges ranked after it (a token is made
// before it is used). A key below the last one taken (a merge list where a token is used
// before one of the merges that make it) goes to a small binary heap, served first; so the
// order is that of one exact heap for any merge list.
class MergeQueue {
 public:
  bool empty() const { return size_ == 0; }

  // Precondition: empty().
  void reset() { last_ = 0; }

  void push(uint64_t key) {
    ++size_;
    if (key < last_) {
      early_.push_back(key);
      std::push_heap(early_.begin(), early_.end(), std::greater<>());
      return;
    }
    buckets_[bucket_of(key)].push_back(key);
  }

  // Precondition: !empty().
  uint64_t pop() {
    --size_;
    if (!early_.empty()) {
      std::pop_heap(early_.begin(), early_.end(), std::greater<>());
      const uint64_t key = early_.back();
      early_.pop_back();
      return key;
    }
    if (buckets_[0].empty()) {
      size_t i = 1;
      while (buckets_[i].empty()) ++i;
      std::vector<uint64_t>& from = buckets_[i];
      last_ = *std::min_element(from.begin(), from.end());
      for (const uint64_t key : from) buckets_[bucket_of(key)].push_back(key);
      from.clear();
    }
    const uint64_t key = buckets_[0].back();
    buckets_[0].pop_back();
    return key;
  }

  size_t capacity_bytes() const {
    size_t n = early_.capacity();
    for (const auto& b : buckets_) n += b.capacity();
    return n * sizeof(uint64_t);
  }

 private:
  size_t bucket_of(uint64_t key) const {
    return key == last_ ? 0 : static_cast<size_t>(64 - __builtin_clzll(key ^ last_));
  }

  uint64_t last_ = 0;
  size_t size_ = 0;
  std::array<std::vector<uint64_t>, 65> buckets_;
  std::vector<uint64_t> early_;  // min-heap of keys below last_
};

// encode_piece's per-thread scratch. Kept between calls while small, so that encoding
// short pieces allocates nothing; the scratch of a long piece is freed after it (a worker
// thread would otherwise hold hundreds of megabytes after one 10 MB word, for good).
struct BpeScratch {
  static constexpr size_t kKeepBytes = size_t{1} << 20;

  std::vector<Node> nodes;
  MergeQueue queue;

  static BpeScratch& local() {
    thread_local std::unique_ptr<BpeScratch> scratch;
    if (!scratch) scratch = std::make_unique<BpeScratch>();
    return *scratch;
  }
  // Frees this thread's scratch when it grew beyond kKeepBytes.
  static void trim() {
    BpeScratch& s = local();
    if (s.nodes.capacity() * sizeof(Node) + s.queue.capacity_bytes() > kKeepBytes) {
      s.nodes = std::vector<Node>();
      s.queue = MergeQueue();
    }
  }
};

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
  if (byte_level) m->joinable_bytes_.assign(256 * 256, false);
  // Whether every merge result is a token (min_ids() below), and the longest one.
  bool results_known = true;
  size_t longest_result = 0;
  bool unk_is_result = false;
  int32_t rank = 0;
  for (const auto& [left, right] : tables.merges) {
    auto left_key = to_key(left);
    auto right_key = to_key(right);
    if (left_key && right_key && !left_key->empty() && !right_key->empty()) {
      // Every merge joins the last unit of its left side and the first of its right
      // side; these junctions are the only places where symbols ever grow.
      const char32_t last = last_unit(*left_key);
      const char32_t first = first_unit(*right_key);
      m->joinable_.insert(unit_pair(last, first));
      if (byte_level) m->joinable_bytes_[last * 256 + first] = true;
      const int32_t a = intern(*left_key);
      const int32_t b = intern(*right_key);
      left_key->append(*right_key);
      longest_result = std::max(longest_result, left_key->size());
      results_known = results_known && m->key_to_id_.contains(*left_key);
      unk_is_result = unk_is_result || (m->unk_key_ && *left_key == *m->unk_key_);
      const int32_t r = intern(std::move(*left_key));
      m->merges_->insert(MergeTable::key(a, b), rank, r);
    }
    ++rank;
  }
  m->max_token_bytes_ = m->token_bound(results_known, longest_result, unk_is_result);
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

// min_ids() divides a piece's bytes by the most bytes one emitted id can cover. The bound
// holds when every symbol BPE leaves yields at least one id and ids do not fuse:
//   - a symbol is a unit (a byte, or a code point of at most 4 bytes) or a merge result;
//     with ignore_merges a whole piece found in the vocabulary is one id;
//   - a symbol without an id still yields ids through byte_fallback when all 256 <0xNN>
//     tokens exist, else through unk when the model has one; otherwise it is dropped;
//   - fuse_unk collapses consecutive unk ids, so it voids the bound when unk can appear.
// Without the bound (0) callers count exactly, piece by piece.
size_t BpeModel::token_bound(bool results_known, size_t longest_result, bool unk_is_result) const {
  bool units_known = byte_level_;
  for (int b = 0; b < 256 && units_known; ++b) {
    units_known = key_to_id_.contains(std::string_view(std::string(1, static_cast<char>(b))));
  }
  bool fallback_complete = byte_fallback_;
  for (int b = 0; b < 256 && fallback_complete; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", static_cast<unsigned>(b));
    fallback_complete = key_to_id_.contains(std::string_view(name));
  }
  const bool never_unknown = units_known && results_known;
  const bool unk_known = unk_key_ && key_to_id_.contains(*unk_key_);
  if (!never_unknown && !fallback_complete && !unk_known) return 0;
  if (fuse_unk_ && unk_id_) {
    // unk ids appear for symbols without an id, or when BPE leaves the unk token's own
    // string as a symbol (one unit, a merge result, or a whole piece with ignore_merges).
    bool unk_is_unit = false;
    if (unk_key_ && !unk_key_->empty()) {
      size_t unit_end = 1;
      if (!byte_level_) unit_end = utf8::sequence_length(static_cast<uint8_t>((*unk_key_)[0]));
      unk_is_unit = unit_end == unk_key_->size();
    }
    const bool unk_appears =
        (!never_unknown && !fallback_complete) || unk_is_unit || unk_is_result || ignore_merges_;
    if (unk_appears) return 0;
  }
  size_t longest = std::max<size_t>(4, longest_result);
  if (ignore_merges_) {
    for (const auto& [key, id] : key_to_id_) longest = std::max(longest, key.size());
  }
  return longest;
}

void BpeModel::add_token(std::string_view content, TokenId id) {
  std::optional<std::string> key =
      byte_level_ ? byte_level::to_bytes(content) : std::optional<std::string>(content);
  if (!key) return;
  // With ignore_merges a piece equal to an added token is that one id.
  if (ignore_merges_ && max_token_bytes_ != 0) {
    max_token_bytes_ = std::max(max_token_bytes_, key->size());
  }
  key_to_id_[std::move(*key)] = id;
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
  BpeScratch& scratch = BpeScratch::local();
  std::vector<Node>& nodes = scratch.nodes;
  MergeQueue& queue = scratch.queue;
  nodes.clear();
  queue.reset();
  // Exactly one node per unit: no growth by doubling for a long piece.
  size_t units = piece.size();
  if (!byte_level_) {
    units = 0;
    for (const char c : piece) units += (static_cast<uint8_t>(c) & 0xC0) != 0x80;
  }
  nodes.reserve(units);
  for (size_t pos = 0; pos < piece.size();) {
    size_t next = 0;
    const int32_t symbol = unit_symbol(piece, pos, next);
    const auto index = static_cast<int32_t>(nodes.size());
    nodes.push_back(Node{symbol, index - 1, index + 1, static_cast<uint32_t>(pos)});
    pos = next;
  }
  if (nodes.empty()) return;
  nodes.back().next = -1;

  auto push_pair = [&](int32_t left) {
    const int32_t right = nodes[static_cast<size_t>(left)].next;
    if (right < 0) return;
    const int32_t a = nodes[static_cast<size_t>(left)].symbol;
    const int32_t b = nodes[static_cast<size_t>(right)].symbol;
    if (a < 0 || b < 0) return;
    if (const auto* slot = merges_->find(MergeTable::key(a, b))) {
      queue.push((static_cast<uint64_t>(slot->rank) << 32) | static_cast<uint32_t>(left));
    }
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(nodes.size()); ++i) push_pair(i);

  while (!queue.empty()) {
    const uint64_t key = queue.pop();
    const auto rank = static_cast<int32_t>(key >> 32);
    const auto left_index = static_cast<int32_t>(key & 0xFFFFFFFFu);
    Node& left = nodes[static_cast<size_t>(left_index)];
    if (left.symbol < 0 || left.next < 0) continue;
    Node& right = nodes[static_cast<size_t>(left.next)];
    if (right.symbol < 0) continue;
    // Stale when either side changed since the candidate was pushed: a pair has one rank,
    // and a symbol only grows, so the same rank at the same left node is the same pair.
    const auto* slot = merges_->find(MergeTable::key(left.symbol, right.symbol));
    if (slot == nullptr || slot->rank != rank) continue;
    left.symbol = slot->result;
    left.next = right.next;
    if (right.next >= 0) nodes[static_cast<size_t>(right.next)].prev = left_index;
    right.symbol = kDead;
    if (left.prev >= 0) push_pair(left.prev);
    push_pair(left_index);
  }
  for (int32_t i = 0; i >= 0; i = nodes[static_cast<size_t>(i)].next) {
    const Node& node = nodes[static_cast<size_t>(i)];
    const size_t end = node.next >= 0 ? nodes[static_cast<size_t>(node.next)].begin : piece.size();
    emit_token(piece.substr(node.begin, end - node.begin), out);
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

void BpeModel::encode_word(std::string_view piece, std::vector<TokenId>& out) const {
  if (piece.empty()) return;
  if (ignore_merges_) {
    if (const auto it = key_to_id_.find(piece); it != key_to_id_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  if (piece.size() <= Cache::kMaxKeyBytes) {
    encode_cached(piece, out);
    return;
  }
  // A long piece (a Metaspace section is one piece) is cut where no merge can join
  // the units on either side: the merges inside each chunk are exactly those the
  // whole-piece process makes there, and chunks repeat, so the cache works again.
  auto encode_chunk = [this, &out](std::string_view chunk) {
    if (chunk.size() <= Cache::kMaxKeyBytes) {
      encode_cached(chunk, out);
    } else {
      encode_piece(chunk, out);
    }
  };
  size_t chunk_start = 0;
  if (byte_level_) {
    for (size_t pos = 1; pos < piece.size(); ++pos) {
      const size_t pair = static_cast<size_t>(static_cast<uint8_t>(piece[pos - 1])) * 256 +
                          static_cast<uint8_t>(piece[pos]);
      if (!joinable_bytes_[pair]) {
        encode_chunk(piece.substr(chunk_start, pos - chunk_start));
        chunk_start = pos;
      }
    }
  } else {
    size_t pos = 0;
    char32_t prev = 0;
    while (pos < piece.size()) {
      const size_t at = pos;
      const char32_t unit = utf8::decode_valid(piece, pos);
      if (at > chunk_start && !joinable_.contains(unit_pair(prev, unit))) {
        encode_chunk(piece.substr(chunk_start, at - chunk_start));
        chunk_start = at;
      }
      prev = unit;
    }
  }
  encode_chunk(piece.substr(chunk_start));
  BpeScratch::trim();
}

void BpeModel::fuse_unknowns(std::vector<TokenId>& out, size_t section_start) const {
  if (!fuse_unk_ || !unk_id_) return;
  // Consecutive unknown tokens collapse into one (fuse_unk in the reference).
  size_t write = section_start;
  for (size_t read = section_start; read < out.size(); ++read) {
    if (out[read] == *unk_id_ && write > section_start && out[write - 1] == *unk_id_) continue;
    out[write++] = out[read];
  }
  out.resize(write);
}

}  // namespace strata
