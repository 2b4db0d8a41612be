// The KV event decoder against payloads packed here with msgpuck, in every layout that
// vLLM, SGLang and Strata send, and against truncated and forged payloads (run under ASan
// to see that nothing reads past the buffer).
#include "router/kv_event_wire.h"

#include <gtest/gtest.h>
#include <msgpuck.h>

#include <cstdint>
#include <random>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace strata::router {
namespace {

// Appends msgpack in the shortest forms, as msgspec writes them.
class Writer {
 public:
  Writer& array(uint32_t n) {
    mp_encode_array(grow(mp_sizeof_array(n)), n);
    return *this;
  }
  Writer& map(uint32_t n) {
    mp_encode_map(grow(mp_sizeof_map(n)), n);
    return *this;
  }
  Writer& str(std::string_view s) {
    const auto len = static_cast<uint32_t>(s.size());
    mp_encode_str(grow(mp_sizeof_str(len)), s.data(), len);
    return *this;
  }
  Writer& bin(std::string_view s) {
    const auto len = static_cast<uint32_t>(s.size());
    mp_encode_bin(grow(mp_sizeof_bin(len)), s.data(), len);
    return *this;
  }
  Writer& integer(int64_t v) {  // mp_encode_int takes negative values only
    if (v >= 0) {
      mp_encode_uint(grow(mp_sizeof_uint(static_cast<uint64_t>(v))), static_cast<uint64_t>(v));
    } else {
      mp_encode_int(grow(mp_sizeof_int(v)), v);
    }
    return *this;
  }
  Writer& integers(const std::vector<int64_t>& vs) {
    array(static_cast<uint32_t>(vs.size()));
    for (int64_t v : vs) integer(v);
    return *this;
  }
  Writer& float64(double v) {
    mp_encode_double(grow(mp_sizeof_double(v)), v);
    return *this;
  }
  Writer& nil() {
    mp_encode_nil(grow(mp_sizeof_nil()));
    return *this;
  }
  const std::string& bytes() const { return out_; }

 private:
  char* grow(uint32_t n) {
    const size_t at = out_.size();
    out_.resize(at + n);
    return out_.data() + at;
  }
  std::string out_;
};

std::vector<int64_t> tokens(int n, int64_t first) {
  std::vector<int64_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = first + i;
  return t;
}

// Strata's layout: every field, array events.
std::string strata_payload() {
  Writer w;
  w.array(3).float64(1700000000.25).array(4);
  w.array(7).str("BlockStored").integers({-5, 7}).nil().integers(tokens(8, 100)).integer(4);
  w.nil().str("GPU");
  w.array(7).str("BlockStored").integers({9}).integer(7).integers(tokens(4, 200)).integer(4);
  w.nil().str("CPU_PINNED");
  w.array(3).str("BlockRemoved").integers({-5}).str("DISK");
  w.array(1).str("AllBlocksCleared");
  w.integer(3);
  return w.bytes();
}

TEST(KvEventWireTest, DecodesStrataLayout) {
  auto b = decode_kv_event_batch(strata_payload());
  ASSERT_TRUE(b) << b.error().message;
  EXPECT_DOUBLE_EQ(b->timestamp_s, 1700000000.25);
  EXPECT_EQ(b->data_parallel_rank, 3);
  EXPECT_EQ(b->skipped_events, 0u);
  ASSERT_EQ(b->events.size(), 4u);
  const auto& s0 = std::get<BlockStoredEvent>(b->events[0]);
  EXPECT_EQ(s0.block_hashes, (std::vector<uint64_t>{static_cast<uint64_t>(-5), 7}));
  EXPECT_FALSE(s0.parent_block_hash);
  EXPECT_EQ(s0.token_ids.size(), 8u);
  EXPECT_EQ(s0.token_ids[7], 107);
  EXPECT_EQ(s0.block_size, 4);
  EXPECT_EQ(s0.tier, Tier::kDevice);
  const auto& s1 = std::get<BlockStoredEvent>(b->events[1]);
  EXPECT_EQ(s1.parent_block_hash, std::optional<uint64_t>(7));
  EXPECT_EQ(s1.tier, Tier::kHost);
  const auto& r = std::get<BlockRemovedEvent>(b->events[2]);
  EXPECT_EQ(r.block_hashes, (std::vector<uint64_t>{static_cast<uint64_t>(-5)}));
  EXPECT_EQ(r.tier, Tier::kStorage);
  EXPECT_TRUE(std::holds_alternative<AllBlocksClearedEvent>(b->events[3]));
  // Strict mode takes Strata's own layout as it is.
  EXPECT_TRUE(decode_kv_event_batch(strata_payload(), KvWireOptions{.strict = true}));
}

TEST(KvEventWireTest, OldVllmWithoutMediumOrRankIsDevice) {
  Writer w;
  w.array(2).float64(1.0).array(2);  // no rank (omit_defaults)
  w.array(6).str("BlockStored").integers({1, 2}).nil().integers(tokens(32, 0)).integer(16).nil();
  w.array(2).str("BlockRemoved").integers({1});
  auto b = decode_kv_event_batch(w.bytes());
  ASSERT_TRUE(b) << b.error().message;
  EXPECT_EQ(b->data_parallel_rank, 0);
  EXPECT_EQ(std::get<BlockStoredEvent>(b->events[0]).tier, Tier::kDevice);
  EXPECT_EQ(std::get<BlockRemovedEvent>(b->events[1]).tier, Tier::kDevice);
  // Nil medium too.
  Writer n;
  n.array(3).float64(1.0).array(1).array(3).str("BlockRemoved").integers({1}).nil().nil();
  auto nb = decode_kv_event_batch(n.bytes());
  ASSERT_TRUE(nb) << nb.error().message;
  EXPECT_EQ(std::get<BlockRemovedEvent>(nb->events[0]).tier, Tier::kDevice);
  // Strict mode refuses both.
  auto strict = decode_kv_event_batch(w.bytes(), KvWireOptions{.strict = true});
  ASSERT_FALSE(strict);
  EXPECT_EQ(strict.error().code, ErrorCode::kCorrupt);
}

TEST(KvEventWireTest, NewerVllmTrailingFieldsAndGroups) {
  Writer w;
  w.array(3).float64(2.0).array(2);
  // tag, hashes, parent, tokens, block_size, lora_id, medium, lora_name, extra_keys,
  // group_idx, kv_cache_spec_kind, kv_cache_spec_sliding_window
  w.array(12).str("BlockStored").integers({11}).integer(10).integers(tokens(4, 0)).integer(4);
  w.integer(3).str("CPU").str("adapter").array(1).nil().integer(1).str("sliding_window");
  w.integer(128);
  w.array(4).str("BlockRemoved").integers({11}).str("GPU").integer(1);
  w.nil();
  auto b = decode_kv_event_batch(w.bytes());
  ASSERT_TRUE(b) << b.error().message;
  const auto& s = std::get<BlockStoredEvent>(b->events[0]);
  EXPECT_EQ(s.tier, Tier::kHost);  // "CPU": vLLM's offloading connector
  EXPECT_EQ(s.group_idx, 1);
  EXPECT_EQ(s.parent_block_hash, std::optional<uint64_t>(10));
  EXPECT_EQ(std::get<BlockRemovedEvent>(b->events[1]).group_idx, 1);
}

TEST(KvEventWireTest, MapLayoutsOfEventsAndBatch) {
  Writer w;
  w.map(3).str("ts").float64(3.5).str("events").array(3);
  w.map(7).str("type").str("BlockStored").str("block_hashes").integers({21, 22});
  w.str("parent_block_hash").nil().str("token_ids").integers(tokens(4, 0));
  w.str("block_size").integer(2).str("session_id").str("s-1").str("medium").str("DISK");
  w.map(3).str("block_hashes").integers({21}).str("medium").nil().str("type").str("BlockRemoved");
  w.map(1).str("type").str("AllBlocksCleared");
  w.str("attn_dp_rank").integer(2);
  auto b = decode_kv_event_batch(w.bytes());
  ASSERT_TRUE(b) << b.error().message;
  EXPECT_DOUBLE_EQ(b->timestamp_s, 3.5);
  EXPECT_EQ(b->data_parallel_rank, 2);
  ASSERT_EQ(b->events.size(), 3u);
  const auto& s = std::get<BlockStoredEvent>(b->events[0]);
  EXPECT_EQ(s.block_hashes, (std::vector<uint64_t>{21, 22}));
  EXPECT_EQ(s.block_size, 2);
  EXPECT_EQ(s.tier, Tier::kStorage);
  EXPECT_EQ(std::get<BlockRemovedEvent>(b->events[1]).tier, Tier::kDevice);
  EXPECT_TRUE(std::holds_alternative<AllBlocksClearedEvent>(b->events[2]));
  // A map event without its hashes is corrupt.
  Writer bad;
  bad.array(3).float64(1).array(1).map(1).str("type").str("BlockRemoved").integer(0);
  EXPECT_FALSE(decode_kv_event_batch(bad.bytes()));
}

TEST(KvEventWireTest, ByteHashesFoldLikeVllm) {
  std::string digest(32, '\0');
  for (int i = 0; i < 32; ++i) digest[i] = static_cast<char>(0xa0 + i);
  Writer w;
  w.array(3).float64(1).array(1).array(7).str("BlockStored").array(1).bin(digest);
  w.bin(std::string("\x01\x02", 2)).integers(tokens(4, 0)).integer(4).nil().str("GPU").integer(0);
  auto b = decode_kv_event_batch(w.bytes());
  ASSERT_TRUE(b) << b.error().message;
  const auto& s = std::get<BlockStoredEvent>(b->events[0]);
  // int.from_bytes(digest, "big") & (2**64 - 1): the last 8 bytes, big-endian.
  EXPECT_EQ(s.block_hashes[0], 0xb8b9babbbcbdbebfULL);
  EXPECT_EQ(s.parent_block_hash, std::optional<uint64_t>(0x0102));
}

TEST(KvEventWireTest, UnknownMediaAndEventsAreSkippedUnlessStrict) {
  Writer w;
  w.array(3).float64(1).array(3);
  w.array(3).str("BlockRemoved").integers({1}).str("MARS");
  w.array(3).str("BlockMigrated").integers({1}).str("peer");
  w.array(3).str("BlockRemoved").integers({2}).str("CPU_PINNED");
  w.integer(0);
  auto b = decode_kv_event_batch(w.bytes());
  ASSERT_TRUE(b) << b.error().message;
  EXPECT_EQ(b->skipped_events, 2u);
  EXPECT_EQ(b->skip_reason, "unknown event 'BlockMigrated'");
  ASSERT_EQ(b->events.size(), 1u);
  EXPECT_EQ(std::get<BlockRemovedEvent>(b->events[0]).block_hashes[0], 2u);
  auto strict = decode_kv_event_batch(w.bytes(), KvWireOptions{.strict = true});
  ASSERT_FALSE(strict);
  EXPECT_EQ(strict.error().message, "unknown medium 'MARS'");
}

TEST(KvEventWireTest, BigramTokenCellsReadTheirFirstToken) {
  Writer w;
  w.array(3).float64(1).array(1).array(7).str("BlockStored").integers({5}).nil().array(2);
  w.integers({7, 8}).integers({8, 9}).integer(2).nil().str("GPU").nil();
  auto b = decode_kv_event_batch(w.bytes());
  ASSERT_TRUE(b) << b.error().message;
  EXPECT_EQ(std::get<BlockStoredEvent>(b->events[0]).token_ids, (std::vector<int32_t>{7, 8}));
}

TEST(KvEventWireTest, NamesTheWrongField) {
  const auto error_of = [](const Writer& w) {
    auto r = decode_kv_event_batch(w.bytes());
    EXPECT_FALSE(r);
    return r ? std::string() : r.error().message;
  };
  Writer token;
  token.array(3).float64(1).array(1).array(7).str("BlockStored").integers({1}).nil();
  token.array(1).str("x").integer(1).nil().str("GPU").integer(0);
  EXPECT_EQ(error_of(token), "a token id is not an integer");
  Writer range;
  range.array(3).float64(1).array(1).array(7).str("BlockStored").integers({1}).nil();
  range.integers({int64_t{1} << 40}).integer(1).nil().str("GPU").integer(0);
  EXPECT_EQ(error_of(range), "a token id is out of the int32 range");
  Writer parent;
  parent.array(3).float64(1).array(1).array(7).str("BlockStored").integers({1}).str("p");
  parent.integers({1}).integer(1).nil().str("GPU").integer(0);
  EXPECT_EQ(error_of(parent), "parent_block_hash is not an integer or nil");
  Writer medium;
  medium.array(3).float64(1).array(1).array(3).str("BlockRemoved").integers({1}).integer(3);
  medium.integer(0);
  EXPECT_EQ(error_of(medium), "medium is not a string");
  Writer few;
  few.array(3).float64(1).array(1).array(4).str("BlockStored").integers({1}).nil().integers({});
  few.integer(0);
  EXPECT_EQ(error_of(few), "BlockStored has 4 fields");
  Writer events;
  events.array(3).float64(1).integer(4).integer(0);
  EXPECT_EQ(error_of(events), "the events are not an array");
  Writer shape;
  shape.array(1).float64(1);
  EXPECT_EQ(error_of(shape), "the payload is not [timestamp, events, rank]");
}

// Every prefix of a valid payload, and random byte flips of it, are errors or valid
// batches: never a read past the buffer (each copy is exactly its size, for ASan).
TEST(KvEventWireTest, TruncatedAndMutatedPayloadsNeverCrash) {
  const std::string good = strata_payload();
  for (size_t n = 0; n < good.size(); ++n) {
    const std::string prefix = good.substr(0, n);
    auto r = decode_kv_event_batch(prefix);
    ASSERT_FALSE(r) << n;
    EXPECT_EQ(r.error().code, ErrorCode::kCorrupt);
  }
  EXPECT_FALSE(decode_kv_event_batch(good + '\x00'));
  for (const std::string_view forged :
       {std::string_view("\xdd\xff\xff\xff\xff", 5), std::string_view("\xdf\xff\xff\xff\xff", 5),
        std::string_view("\x93\xcb\0\0\0\0\0\0\0\0\x91\xdb\xff\xff\xff\xff", 16),
        std::string_view("\xc1", 1)}) {
    const std::string copy(forged);
    EXPECT_FALSE(decode_kv_event_batch(copy));
  }
  std::mt19937_64 rng(7);
  for (int i = 0; i < 20000; ++i) {
    std::string m = good;
    const int flips = 1 + static_cast<int>(rng() % 3);
    for (int f = 0; f < flips; ++f) m[rng() % m.size()] = static_cast<char>(rng());
    m.resize(m.size() - rng() % 4);
    const std::string copy = m;
    (void)decode_kv_event_batch(copy);
  }
}

TEST(KvEventWireTest, TierNames) {
  EXPECT_EQ(tier_from_medium("GPU"), Tier::kDevice);
  EXPECT_EQ(tier_from_medium("CPU_PINNED"), Tier::kHost);
  EXPECT_EQ(tier_from_medium("CPU"), Tier::kHost);
  EXPECT_EQ(tier_from_medium("DISK"), Tier::kStorage);
  EXPECT_FALSE(tier_from_medium("gpu"));
  EXPECT_EQ(tier_wire_name(Tier::kHost), "CPU_PINNED");
  EXPECT_EQ(tier_name(Tier::kStorage), "storage");
}

}  // namespace
}  // namespace strata::router
