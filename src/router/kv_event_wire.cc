#include "router/kv_event_wire.h"

#include <msgpuck.h>

#include <limits>

namespace strata::router {

std::optional<Tier> tier_from_medium(std::string_view medium) {
  if (medium == "GPU") return Tier::kDevice;
  if (medium == "CPU_PINNED" || medium == "CPU") return Tier::kHost;
  if (medium == "DISK") return Tier::kStorage;
  return std::nullopt;
}

std::string_view tier_wire_name(Tier tier) {
  switch (tier) {
    case Tier::kDevice:
      return "GPU";
    case Tier::kHost:
      return "CPU_PINNED";
    case Tier::kStorage:
      return "DISK";
  }
  return "GPU";
}

std::string_view tier_name(Tier tier) {
  switch (tier) {
    case Tier::kDevice:
      return "device";
    case Tier::kHost:
      return "host";
    case Tier::kStorage:
      return "storage";
  }
  return "device";
}

namespace {

// msgpuck's mp_decode_* and mp_next read without bounds checks. decode_kv_event_batch()
// therefore first walks the whole payload with skip_checked(); everything after that
// reads inside a buffer known to hold well-formed msgpack, checking only types.

std::unexpected<Error> corrupt(std::string message) {
  return make_error(ErrorCode::kCorrupt, std::move(message));
}

// Moves *cur past one msgpack object, never reading at or past `end`; false when the
// bytes there are not one complete object. Like mp_check, but msgpuck 1.0.3's mp_check
// counts the items still to read in an int, so a forged array32/map32 header (e.g.
// dd ff ff ff ff) wraps the count and a truncated buffer passes. Here the count is 64-bit
// and may not exceed the bytes left (every item takes at least one), and the reserved
// byte 0xc1, which mp_check takes for a one-byte item, is refused.
bool skip_checked(const char** cur, const char* end) {
  uint64_t pending = 1;
  while (pending > 0) {
    if (*cur >= end || static_cast<uint64_t>(end - *cur) < pending) return false;
    --pending;
    const auto c = static_cast<uint8_t>(**cur);
    if (c == 0xc1) return false;
    // Fixed-size scalars (token ids, hashes: most of a payload) without mp_check's loop:
    // fixints, nil, bools, (u)int8..64, float32/64.
    size_t fixed = 0;
    if (c <= 0x7f || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3) {
      fixed = 1;
    } else if (c >= 0xcc && c <= 0xd3) {
      fixed = 1 + (size_t{1} << ((c - 0xcc) & 3));  // cc/d0: 1 byte .. cf/d3: 8 bytes
    } else if (c == 0xca || c == 0xcb) {
      fixed = c == 0xca ? 5 : 9;
    }
    if (fixed != 0) {
      if (static_cast<size_t>(end - *cur) < fixed) return false;
      *cur += fixed;
      continue;
    }
    switch (mp_typeof(**cur)) {
      case MP_ARRAY:
        if (mp_check_array(*cur, end) > 0) return false;
        pending += mp_decode_array(cur);
        break;
      case MP_MAP:
        if (mp_check_map(*cur, end) > 0) return false;
        pending += 2 * uint64_t{mp_decode_map(cur)};
        break;
      default:
        // A scalar: mp_check reads exactly this one item, so its counter cannot wrap.
        if (mp_check(cur, end) != 0) return false;
        break;
    }
  }
  return true;
}

// The readers below require *cur inside a payload that skip_checked() accepted. On
// success they move *cur past the object read; on failure they leave it.

// Any msgpack integer as int64: uints above INT64_MAX wrap, as block hashes do on the wire.
inline bool read_int(const char** cur, int64_t* out) {
  switch (mp_typeof(**cur)) {
    case MP_UINT:
      *out = static_cast<int64_t>(mp_decode_uint(cur));
      return true;
    case MP_INT:
      *out = mp_decode_int(cur);
      return true;
    default:
      return false;
  }
}

bool read_nil(const char** cur) {
  if (mp_typeof(**cur) != MP_NIL) return false;
  mp_decode_nil(cur);
  return true;
}

// A block hash: an integer, or bytes folded to their last 8 bytes big-endian (vLLM's
// `int.from_bytes(digest, "big") & (2**64 - 1)`).
bool read_hash(const char** cur, uint64_t* out) {
  if (mp_typeof(**cur) == MP_BIN) {
    uint32_t len = 0;
    const char* data = mp_decode_bin(cur, &len);
    uint64_t v = 0;
    for (uint32_t i = len > 8 ? len - 8 : 0; i < len; ++i) {
      v = (v << 8) | static_cast<uint8_t>(data[i]);
    }
    *out = v;
    return true;
  }
  int64_t v = 0;
  if (!read_int(cur, &v)) return false;
  *out = static_cast<uint64_t>(v);
  return true;
}

std::optional<std::string_view> read_str(const char** cur) {
  if (mp_typeof(**cur) != MP_STR) return std::nullopt;
  uint32_t len = 0;
  const char* data = mp_decode_str(cur, &len);
  return std::string_view(data, len);
}

Result<std::vector<uint64_t>> read_hashes(const char** cur) {
  if (mp_typeof(**cur) != MP_ARRAY) return corrupt("block_hashes is not an array");
  const char* p = *cur;
  const uint32_t n = mp_decode_array(&p);
  std::vector<uint64_t> out(n);  // n <= payload size: skip_checked() bounded it
  for (uint64_t& h : out) {
    if (!read_hash(&p, &h)) return corrupt("a block hash is not an integer");
  }
  *cur = p;
  return out;
}

Result<std::vector<int32_t>> read_tokens(const char** cur) {
  if (mp_typeof(**cur) != MP_ARRAY) return corrupt("token_ids is not an array");
  const char* p = *cur;
  const uint32_t n = mp_decode_array(&p);
  std::vector<int32_t> out(n);
  for (int32_t& t : out) {
    // The common forms first (token ids are below 2^32): positive fixint, uint8/16/32.
    const auto c = static_cast<uint8_t>(*p);
    if (c <= 0x7f) {
      t = c;
      ++p;
      continue;
    }
    if (c == 0xcc || c == 0xcd) {
      t = static_cast<int32_t>(mp_decode_uint(&p));
      continue;
    }
    if (c == 0xce && static_cast<uint8_t>(p[1]) < 0x80) {  // uint32 below 2^31
      t = static_cast<int32_t>(mp_decode_uint(&p));
      continue;
    }
    int64_t v = 0;
    if (mp_typeof(*p) == MP_ARRAY) {  // SGLang's bigram cell [t, t_next]: t is the token
      const char* cell = p;
      mp_next(&p);
      if (mp_decode_array(&cell) == 0 || !read_int(&cell, &v)) {
        return corrupt("a token id is not an integer");
      }
    } else if (!read_int(&p, &v)) {
      return corrupt("a token id is not an integer");
    }
    if (v < std::numeric_limits<int32_t>::min() || v > std::numeric_limits<int32_t>::max()) {
      return corrupt("a token id is out of the int32 range");
    }
    t = static_cast<int32_t>(v);
  }
  *cur = p;
  return out;
}

// The fields of BlockStored / BlockRemoved that the router reads.
enum class Field { kHashes, kParent, kTokens, kBlockSize, kMedium, kGroupIdx, kOther };

Field stored_field_at(uint32_t i) {  // i >= 1: the array position after the tag
  switch (i) {
    case 1:
      return Field::kHashes;
    case 2:
      return Field::kParent;
    case 3:
      return Field::kTokens;
    case 4:
      return Field::kBlockSize;
    case 6:
      return Field::kMedium;
    case 9:
      return Field::kGroupIdx;
    default:
      return Field::kOther;  // 5 lora_id, 7 lora_name / cache_salt, 8 extra_keys, ...
  }
}

Field removed_field_at(uint32_t i) {
  switch (i) {
    case 1:
      return Field::kHashes;
    case 2:
      return Field::kMedium;
    case 3:
      return Field::kGroupIdx;
    default:
      return Field::kOther;
  }
}

Field field_named(std::string_view key) {
  if (key == "block_hashes") return Field::kHashes;
  if (key == "parent_block_hash") return Field::kParent;
  if (key == "token_ids") return Field::kTokens;
  if (key == "block_size") return Field::kBlockSize;
  if (key == "medium") return Field::kMedium;
  if (key == "group_idx") return Field::kGroupIdx;
  return Field::kOther;
}

// What read_field() collects of one event.
struct Fields {
  bool has_hashes = false;
  std::vector<uint64_t> hashes;
  std::optional<uint64_t> parent;
  std::vector<int32_t> tokens;
  int64_t block_size = 0;
  std::optional<std::string_view> medium;  // nullopt: nil or absent
  int64_t group_idx = 0;
};

Status read_field(Field field, const char** cur, Fields* f) {
  switch (field) {
    case Field::kHashes: {
      auto hashes = read_hashes(cur);
      if (!hashes) return std::unexpected(hashes.error());
      f->hashes = std::move(*hashes);
      f->has_hashes = true;
      return {};
    }
    case Field::kParent: {
      if (read_nil(cur)) return {};
      uint64_t h = 0;
      if (!read_hash(cur, &h)) return corrupt("parent_block_hash is not an integer or nil");
      f->parent = h;
      return {};
    }
    case Field::kTokens: {
      auto tokens = read_tokens(cur);
      if (!tokens) return std::unexpected(tokens.error());
      f->tokens = std::move(*tokens);
      return {};
    }
    case Field::kBlockSize:
      if (!read_int(cur, &f->block_size) || f->block_size < 0 ||
          f->block_size > std::numeric_limits<int32_t>::max()) {
        return corrupt("block_size is not a non-negative integer");
      }
      return {};
    case Field::kMedium: {
      if (read_nil(cur)) return {};
      auto medium = read_str(cur);
      if (!medium) return corrupt("medium is not a string");
      f->medium = *medium;
      return {};
    }
    case Field::kGroupIdx:
      // Only a filter: a value of another type (an engine that put something else at this
      // position) reads as the main group rather than failing the event.
      if (!read_int(cur, &f->group_idx)) mp_next(cur);
      return {};
    case Field::kOther:
      mp_next(cur);
      return {};
  }
  return {};
}

enum class Kind { kStored, kRemoved, kCleared, kUnknown };

Kind kind_named(std::string_view tag) {
  if (tag == "BlockStored") return Kind::kStored;
  if (tag == "BlockRemoved") return Kind::kRemoved;
  if (tag == "AllBlocksCleared") return Kind::kCleared;
  return Kind::kUnknown;
}

class BatchDecoder {
 public:
  BatchDecoder(KvWireOptions options, KvEventBatch* batch) : options_(options), batch_(batch) {}

  // Reads one event at *cur and moves past it; an event the router cannot use is skipped.
  Status read_event(const char** cur) {
    const char* event_end = *cur;
    mp_next(&event_end);
    Status s;
    if (mp_typeof(**cur) == MP_ARRAY) {
      s = read_array_event(*cur);
    } else if (mp_typeof(**cur) == MP_MAP && !options_.strict) {
      s = read_map_event(*cur);
    } else {
      return corrupt("an event is not a tagged array");
    }
    if (s) *cur = event_end;
    return s;
  }

 private:
  Status read_array_event(const char* p) {
    const uint32_t n = mp_decode_array(&p);
    if (n == 0) return corrupt("an event is not a tagged array");
    auto tag = read_str(&p);
    if (!tag) return corrupt("the event tag is not a string");
    const Kind kind = kind_named(*tag);
    if (kind == Kind::kUnknown) return unknown_event(*tag);
    if (kind == Kind::kCleared) {
      batch_->events.emplace_back(AllBlocksClearedEvent{});
      return {};
    }
    const bool stored = kind == Kind::kStored;
    // Strict: every field up to medium. Lenient: up to block_size (stored), the hashes
    // (removed); vLLM before tiers sent no medium.
    const uint32_t min_n = options_.strict ? (stored ? 7 : 3) : (stored ? 5 : 2);
    if (n < min_n) return corrupt(std::string(*tag) + " has " + std::to_string(n) + " fields");
    Fields f;
    for (uint32_t i = 1; i < n; ++i) {
      const Field field = stored ? stored_field_at(i) : removed_field_at(i);
      if (auto s = read_field(field, &p, &f); !s) return s;
    }
    return finish(kind, *tag, std::move(f));
  }

  Status read_map_event(const char* p) {
    const uint32_t n = mp_decode_map(&p);
    Fields f;
    std::optional<std::string_view> tag;
    // The tag may come anywhere; fields are read by name whatever the kind, and the kind
    // decides at the end which ones it needed.
    for (uint32_t i = 0; i < n; ++i) {
      auto key = read_str(&p);
      if (!key) {
        mp_next(&p);  // a non-string key: not one of ours
        mp_next(&p);
        continue;
      }
      if (*key == "type") {
        tag = read_str(&p);
        if (!tag) return corrupt("the event tag is not a string");
        continue;
      }
      if (auto s = read_field(field_named(*key), &p, &f); !s) return s;
    }
    if (!tag) return corrupt("an event map has no \"type\"");
    const Kind kind = kind_named(*tag);
    if (kind == Kind::kUnknown) return unknown_event(*tag);
    if (kind == Kind::kCleared) {
      batch_->events.emplace_back(AllBlocksClearedEvent{});
      return {};
    }
    if (!f.has_hashes) return corrupt(std::string(*tag) + " has no block_hashes");
    return finish(kind, *tag, std::move(f));
  }

  Status finish(Kind kind, std::string_view tag, Fields f) {
    Tier tier = Tier::kDevice;
    if (f.medium) {
      auto t = tier_from_medium(*f.medium);
      if (!t) {
        const std::string why = "unknown medium '" + std::string(*f.medium) + "'";
        if (options_.strict) return corrupt(why);
        skip(std::string(tag) + " skipped: " + why);
        return {};
      }
      tier = *t;
    } else if (options_.strict) {
      return corrupt("medium is not a string");
    }
    if (kind == Kind::kStored) {
      BlockStoredEvent ev;
      ev.block_hashes = std::move(f.hashes);
      ev.parent_block_hash = f.parent;
      ev.token_ids = std::move(f.tokens);
      ev.block_size = static_cast<int32_t>(f.block_size);
      ev.tier = tier;
      ev.group_idx = f.group_idx;
      batch_->events.emplace_back(std::move(ev));
    } else {
      BlockRemovedEvent ev;
      ev.block_hashes = std::move(f.hashes);
      ev.tier = tier;
      ev.group_idx = f.group_idx;
      batch_->events.emplace_back(std::move(ev));
    }
    return {};
  }

  Status unknown_event(std::string_view tag) {
    std::string why = "unknown event '" + std::string(tag) + "'";
    if (options_.strict) return corrupt(std::move(why));
    skip(std::move(why));
    return {};
  }

  void skip(std::string why) {
    ++batch_->skipped_events;
    batch_->skip_reason = std::move(why);
  }

  KvWireOptions options_;
  KvEventBatch* batch_;
};

bool read_timestamp(const char** cur, bool strict, double* out) {
  switch (mp_typeof(**cur)) {
    case MP_DOUBLE:
      *out = mp_decode_double(cur);
      return true;
    case MP_FLOAT:
      *out = mp_decode_float(cur);
      return true;
    default:
      break;
  }
  int64_t v = 0;
  if (strict || !read_int(cur, &v)) return false;
  *out = static_cast<double>(v);
  return true;
}

Status read_events(const char** cur, BatchDecoder* decoder, KvEventBatch* batch) {
  if (mp_typeof(**cur) != MP_ARRAY) return corrupt("the events are not an array");
  const uint32_t num_events = mp_decode_array(cur);
  batch->events.reserve(num_events);  // num_events <= payload size: skip_checked() bounded it
  for (uint32_t i = 0; i < num_events; ++i) {
    if (auto s = decoder->read_event(cur); !s) return s;
  }
  return {};
}

}  // namespace

Result<KvEventBatch> decode_kv_event_batch(std::string_view payload, KvWireOptions options) {
  const char* cur = payload.data();
  const char* const end = cur + payload.size();
  const char* object_end = cur;
  if (!skip_checked(&object_end, end)) {
    return corrupt("undecodable msgpack: truncated or malformed");
  }
  if (object_end != end) {
    return corrupt("undecodable msgpack: " + std::to_string(end - object_end) +
                   " bytes after the payload");
  }
  KvEventBatch batch;
  BatchDecoder decoder(options, &batch);
  if (mp_typeof(*cur) == MP_MAP && !options.strict) {
    const uint32_t n = mp_decode_map(&cur);
    bool has_ts = false;
    bool has_events = false;
    for (uint32_t i = 0; i < n; ++i) {
      const auto key = read_str(&cur);
      if (key == "ts") {
        if (!read_timestamp(&cur, false, &batch.timestamp_s)) {
          return corrupt("the timestamp is not a float");
        }
        has_ts = true;
      } else if (key == "events") {
        if (auto s = read_events(&cur, &decoder, &batch); !s) return std::unexpected(s.error());
        has_events = true;
      } else if (key == "data_parallel_rank" || key == "attn_dp_rank") {
        int64_t rank = 0;
        if (read_int(&cur, &rank)) {
          batch.data_parallel_rank = rank;
        } else {
          mp_next(&cur);
        }
      } else {
        if (!key) mp_next(&cur);  // a non-string key
        mp_next(&cur);
      }
    }
    if (!has_ts || !has_events) return corrupt("the payload map has no \"ts\" or \"events\"");
    return batch;
  }
  if (mp_typeof(*cur) != MP_ARRAY) return corrupt("the payload is not [timestamp, events, rank]");
  const uint32_t n = mp_decode_array(&cur);
  if (options.strict ? n != 3 : n < 2) {
    return corrupt("the payload is not [timestamp, events, rank]");
  }
  if (!read_timestamp(&cur, options.strict, &batch.timestamp_s)) {
    return corrupt("the timestamp is not a float");
  }
  if (auto s = read_events(&cur, &decoder, &batch); !s) return std::unexpected(s.error());
  // vLLM sends nil when data parallelism is off; anything but an integer reads as rank 0.
  if (n >= 3) {
    int64_t rank = 0;
    if (read_int(&cur, &rank)) batch.data_parallel_rank = rank;
  }
  return batch;
}

}  // namespace strata::router
