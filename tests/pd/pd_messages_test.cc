// The PD messages: a round trip for every kind, the limits on encode, and the decoder
// against hand-packed, truncated, mutated and random bytes (run under ASan+UBSan to see
// that nothing reads past the frame or allocates from an unchecked length).
#include "pd/pd_messages.h"

#include <gtest/gtest.h>
#include <msgpuck.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace strata::pd {
namespace {

// Appends msgpack, for frames the encoder would never write.
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
  Writer& uint(uint64_t v) {
    mp_encode_uint(grow(mp_sizeof_uint(v)), v);
    return *this;
  }
  Writer& sint(int64_t v) {  // negative only
    mp_encode_int(grow(mp_sizeof_int(v)), v);
    return *this;
  }
  Writer& dbl(double v) {
    mp_encode_double(grow(mp_sizeof_double(v)), v);
    return *this;
  }
  Writer& nil() {
    mp_encode_nil(grow(mp_sizeof_nil()));
    return *this;
  }
  Writer& raw(std::string_view bytes) {
    out_.append(bytes);
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

std::vector<std::byte> blob(std::string_view s) {
  const auto* p = reinterpret_cast<const std::byte*>(s.data());
  return {p, p + s.size()};
}

PrefillOrder sample_order() {
  PrefillOrder o;
  o.room = RoomId{0x1234'5678'9abc'def0};
  o.decode_worker_id = "decode-0";
  for (int32_t i = 0; i < 37; ++i) o.tokens.push_back(1000 + i);
  o.page_size = 8;
  o.cached_tokens = 16;  // pages 0 and 1 cached; pages 2..4 move (37 tokens: 5 pages)
  o.dst_pages = {17, 3, 99};
  o.transport.kind = TransportKind::kUcx;
  o.transport.ucx_worker_address = blob("SKVX-address-bytes\x00\x01\xff");
  o.transport.ucx_rkey = blob(std::string_view("rkey\x00\x80", 6));
  o.transport.remote_base = 0x7f00'0000'1000;
  o.transport.region_bytes = 1 << 30;
  o.sampling["temperature"] = 0.0;
  o.sampling["top_p"] = 0.95;
  o.sampling["top_k"] = int64_t{40};
  o.sampling["seed"] = uint64_t{0xffff'ffff'ffff'fff0};  // above INT64_MAX
  o.sampling["offset"] = int64_t{-3};
  o.deadline_ms = 30'000;
  return o;
}

std::vector<Message> one_of_each() {
  std::vector<Message> all;
  all.push_back(Hello{"decode-0", Role::kDecode, 77, 0, "qwen3-0.6b/bf16/page16"});
  all.push_back(Hello{"prefill-1", Role::kPrefill, ~uint64_t{0}, 77, ""});
  all.push_back(Heartbeat{"prefill-1", 123456789012ULL});
  all.push_back(sample_order());
  PrefillOrder storage = sample_order();
  storage.transport = TransportInfo{};
  storage.transport.kind = TransportKind::kStorage;
  storage.transport.storage_prefix = "pd/room/1234";
  storage.sampling.clear();
  all.push_back(storage);
  all.push_back(OrderAccepted{RoomId{1}});
  all.push_back(OrderRejected{RoomId{2}, "overloaded: 12 orders queued", 250});
  all.push_back(PagesWritten{RoomId{3}, 1, 2});
  all.push_back(PagesWritten{RoomId{3}, 0, 0});  // keep-alive
  all.push_back(PrefillDone{RoomId{4}, 151643, 21, 1 << 20, 17});
  all.push_back(PrefillFailed{RoomId{5}, "lease deadline passed"});
  all.push_back(Cancel{RoomId{~uint64_t{0}}});
  return all;
}

TEST(PdMessages, EveryKindRoundTrips) {
  std::vector<std::string> kinds_seen;
  for (const Message& m : one_of_each()) {
    auto bytes = encode_message(m);
    ASSERT_TRUE(bytes.has_value()) << message_kind(m) << ": " << bytes.error().message;
    auto back = decode_message(*bytes);
    ASSERT_TRUE(back.has_value()) << message_kind(m) << ": " << back.error().message;
    EXPECT_EQ(*back, m) << message_kind(m);
    kinds_seen.emplace_back(message_kind(m));
  }
  for (std::string_view k : {"Hello", "Heartbeat", "PrefillOrder", "OrderAccepted", "OrderRejected",
                             "PagesWritten", "PrefillDone", "PrefillFailed", "Cancel"}) {
    EXPECT_NE(std::find(kinds_seen.begin(), kinds_seen.end(), k), kinds_seen.end()) << k;
  }
}

TEST(PdMessages, WireHeaderIsVersionThenKind) {
  auto bytes = encode_message(Cancel{RoomId{9}});
  ASSERT_TRUE(bytes.has_value());
  const char* p = bytes->data();
  ASSERT_EQ(mp_typeof(*p), MP_ARRAY);
  EXPECT_EQ(mp_decode_array(&p), 3u);
  EXPECT_EQ(mp_decode_uint(&p), kProtocolVersion);
  uint32_t len = 0;
  const char* kind = mp_decode_str(&p, &len);
  EXPECT_EQ(std::string_view(kind, len), "Cancel");
  EXPECT_EQ(mp_decode_uint(&p), 9u);
  EXPECT_EQ(p, bytes->data() + bytes->size());
}

TEST(PdMessages, SamplingValuesKeepTheirKindAndRange) {
  const PrefillOrder o = sample_order();
  auto back = decode_message(*encode_message(o));
  ASSERT_TRUE(back.has_value());
  const auto& s = std::get<PrefillOrder>(*back).sampling;
  EXPECT_EQ(sampling_u64(s, "seed"), uint64_t{0xffff'ffff'ffff'fff0});
  EXPECT_EQ(sampling_i64(s, "seed"), std::nullopt);  // does not fit
  EXPECT_EQ(sampling_i64(s, "top_k"), 40);
  EXPECT_EQ(sampling_u64(s, "top_k"), 40u);
  EXPECT_EQ(sampling_i64(s, "offset"), -3);
  EXPECT_EQ(sampling_u64(s, "offset"), std::nullopt);
  EXPECT_DOUBLE_EQ(*sampling_double(s, "top_p"), 0.95);
  EXPECT_DOUBLE_EQ(*sampling_double(s, "top_k"), 40.0);
  EXPECT_EQ(sampling_i64(s, "top_p"), std::nullopt);
  EXPECT_EQ(sampling_double(s, "missing"), std::nullopt);
}

TEST(PdMessages, LargestOrderRoundTripsAndOneMoreTokenIsRefused) {
  PrefillOrder o = sample_order();
  o.tokens.assign(kMaxTokens, 7);
  o.page_size = 4096;
  o.cached_tokens = 4096;
  o.dst_pages.clear();
  for (uint32_t i = 0; i < kMaxTokens / 4096 - 1; ++i) o.dst_pages.push_back(i);
  auto bytes = encode_message(o);
  ASSERT_TRUE(bytes.has_value()) << bytes.error().message;
  EXPECT_LE(bytes->size(), kMaxMessageBytes);
  auto back = decode_message(*bytes);
  ASSERT_TRUE(back.has_value()) << back.error().message;
  EXPECT_EQ(std::get<PrefillOrder>(*back), o);

  o.tokens.push_back(7);
  o.dst_pages.push_back(100000);
  auto refused = encode_message(o);
  ASSERT_FALSE(refused.has_value());
  EXPECT_EQ(refused.error().code, ErrorCode::kInvalidArgument);
  EXPECT_NE(refused.error().message.find("tokens"), std::string::npos);
}

// Each case breaks one rule of validate_message; encode refuses it naming the field.
TEST(PdMessages, EncodeRefusesWhatIsOutOfBounds) {
  struct Case {
    const char* want;  // in the message
    Message message;
  };
  std::vector<Case> cases;
  const auto order_with = [](auto change) {
    PrefillOrder o = sample_order();
    change(o);
    return Message(o);
  };
  cases.push_back({"room", Message(Cancel{RoomId{0}})});
  cases.push_back({"room", order_with([](PrefillOrder& o) { o.room = RoomId{0}; })});
  cases.push_back({"worker_id", Message(Hello{"", Role::kDecode, 1, 0, ""})});
  cases.push_back({"worker_id", Message(Hello{"has space", Role::kDecode, 1, 0, ""})});
  cases.push_back({"worker_id", Message(Hello{std::string(kMaxWorkerIdBytes + 1, 'a'),
                                              Role::kDecode, 1, 0, ""})});
  cases.push_back({"incarnation", Message(Hello{"d", Role::kDecode, 0, 0, ""})});
  cases.push_back({"kv_layout", Message(Hello{"d", Role::kDecode, 1, 0,
                                              std::string(kMaxKvLayoutBytes + 1, 'x')})});
  cases.push_back({"worker_id", Message(Heartbeat{"tab\there", 1})});
  cases.push_back(
      {"decode_worker_id", order_with([](PrefillOrder& o) { o.decode_worker_id = ""; })});
  cases.push_back({"tokens", order_with([](PrefillOrder& o) { o.tokens.clear(); })});
  cases.push_back({"negative", order_with([](PrefillOrder& o) { o.tokens[3] = -1; })});
  cases.push_back({"page_size", order_with([](PrefillOrder& o) { o.page_size = 0; })});
  cases.push_back(
      {"page_size", order_with([](PrefillOrder& o) { o.page_size = kMaxPageSize + 1; })});
  cases.push_back({"cached_tokens", order_with([](PrefillOrder& o) { o.cached_tokens = 12; })});
  cases.push_back({"cached_tokens", order_with([](PrefillOrder& o) { o.cached_tokens = -8; })});
  cases.push_back({"cached_tokens", order_with([](PrefillOrder& o) {
                     o.tokens.resize(32);  // all 4 pages cached: nothing left to compute
                     o.cached_tokens = 32;
                     o.dst_pages.clear();
                   })});
  cases.push_back({"dst_pages", order_with([](PrefillOrder& o) { o.dst_pages.pop_back(); })});
  cases.push_back({"dst_pages", order_with([](PrefillOrder& o) { o.dst_pages.push_back(5); })});
  cases.push_back({"twice", order_with([](PrefillOrder& o) { o.dst_pages[2] = o.dst_pages[0]; })});
  cases.push_back({"ucx_worker_address",
                   order_with([](PrefillOrder& o) { o.transport.ucx_worker_address.clear(); })});
  cases.push_back({"ucx_worker_address", order_with([](PrefillOrder& o) {
                     o.transport.ucx_worker_address.resize(kMaxUcxBlobBytes + 1);
                   })});
  cases.push_back({"ucx_rkey", order_with([](PrefillOrder& o) { o.transport.ucx_rkey.clear(); })});
  cases.push_back(
      {"region_bytes", order_with([](PrefillOrder& o) { o.transport.region_bytes = 0; })});
  cases.push_back(
      {"storage_prefix", order_with([](PrefillOrder& o) { o.transport.storage_prefix = "x"; })});
  cases.push_back({"storage_prefix", order_with([](PrefillOrder& o) {
                     o.transport = TransportInfo{};
                     o.transport.kind = TransportKind::kStorage;
                   })});
  cases.push_back({"UCX fields", order_with([](PrefillOrder& o) {
                     o.transport.kind = TransportKind::kStorage;
                     o.transport.storage_prefix = "p";
                   })});
  cases.push_back({"not finite", order_with([](PrefillOrder& o) {
                     o.sampling["temperature"] = std::numeric_limits<double>::quiet_NaN();
                   })});
  cases.push_back({"sampling has", order_with([](PrefillOrder& o) {
                     for (int i = 0; i < 40; ++i)
                       o.sampling[std::string("k").append(std::to_string(i))] = 1.0;
                   })});
  cases.push_back({"sampling key", order_with([](PrefillOrder& o) {
                     o.sampling[std::string(kMaxSamplingKeyBytes + 1, 'k')] = 1.0;
                   })});
  cases.push_back({"deadline_ms", order_with([](PrefillOrder& o) { o.deadline_ms = 0; })});
  cases.push_back(
      {"deadline_ms", order_with([](PrefillOrder& o) { o.deadline_ms = kMaxDeadlineMs + 1; })});
  cases.push_back({"retry_after_ms", Message(OrderRejected{RoomId{1}, "", -1})});
  cases.push_back({"retry_after_ms", Message(OrderRejected{RoomId{1}, "", kMaxRetryAfterMs + 1})});
  cases.push_back({"page range", Message(PagesWritten{RoomId{1}, kMaxTokens, 1})});
  cases.push_back({"first_token", Message(PrefillDone{RoomId{1}, -5, 1, 1, 1})});
  for (const Case& c : cases) {
    auto r = encode_message(c.message);
    ASSERT_FALSE(r.has_value()) << "accepted a bad " << message_kind(c.message) << " (" << c.want
                                << ")";
    EXPECT_EQ(r.error().code, ErrorCode::kInvalidArgument);
    EXPECT_NE(r.error().message.find(c.want), std::string::npos)
        << "'" << r.error().message << "' does not name " << c.want;
  }
}

TEST(PdMessages, LongReasonsAreCutOnEncodeAtACharacterBoundary) {
  std::string reason;
  while (reason.size() < 3 * kMaxReasonBytes) reason += "é∑";  // 2- and 3-byte characters
  auto bytes = encode_message(PrefillFailed{RoomId{1}, reason});
  ASSERT_TRUE(bytes.has_value());
  auto back = decode_message(*bytes);
  ASSERT_TRUE(back.has_value()) << back.error().message;
  const std::string& cut = std::get<PrefillFailed>(*back).reason;
  EXPECT_LE(cut.size(), kMaxReasonBytes);
  EXPECT_GE(cut.size(), kMaxReasonBytes - 3);
  EXPECT_EQ(reason.compare(0, cut.size(), cut), 0);
  EXPECT_NE(static_cast<uint8_t>(reason[cut.size()]) & 0xc0, 0x80);  // not mid-character

  auto rejected = encode_message(OrderRejected{RoomId{1}, reason, 5});
  ASSERT_TRUE(rejected.has_value());
  EXPECT_LE(std::get<OrderRejected>(*decode_message(*rejected)).reason.size(), kMaxReasonBytes);
}

Error decode_error(std::string_view bytes) {
  auto r = decode_message(bytes);
  EXPECT_FALSE(r.has_value()) << "decoded " << (r ? message_kind(*r) : "");
  return r ? Error{} : r.error();
}

TEST(PdMessages, DecodeRefusesOtherVersionsAsUnsupported) {
  auto v2 = encode_message_with_version(Hello{"d", Role::kDecode, 1, 0, ""}, 2);
  ASSERT_TRUE(v2.has_value());
  const Error e = decode_error(*v2);
  EXPECT_EQ(e.code, ErrorCode::kUnsupported);
  EXPECT_NE(e.message.find("protocol version 2"), std::string::npos);
}

TEST(PdMessages, DecodeRefusesMalformedFramesByName) {
  struct Case {
    const char* want;
    std::string bytes;
  };
  const auto w = [] { return Writer(); };
  std::vector<Case> cases = {
      {"empty", ""},
      {"not an array", w().uint(1).bytes()},
      {"no header", w().array(1).uint(1).bytes()},
      {"protocol version", w().array(3).str("1").str("Cancel").uint(1).bytes()},
      {"kind", w().array(3).uint(1).uint(8).uint(1).bytes()},
      {"unknown message kind", w().array(3).uint(1).str("Teleport").uint(1).bytes()},
      {"fields", w().array(4).uint(1).str("Cancel").uint(1).uint(2).bytes()},
      {"fields", w().array(2).uint(1).str("Cancel").bytes()},
      {"bytes follow", w().array(3).uint(1).str("Cancel").uint(1).uint(2).bytes()},
      {"Cancel.room", w().array(3).uint(1).str("Cancel").sint(-1).bytes()},
      {"Cancel.room", w().array(3).uint(1).str("Cancel").nil().bytes()},
      {"room is 0", w().array(3).uint(1).str("Cancel").uint(0).bytes()},
      {"Heartbeat.worker_id", w().array(4).uint(1).str("Heartbeat").str("").uint(1).bytes()},
      {"Hello.role",
       w().array(7).uint(1).str("Hello").str("d").str("mixed").uint(1).uint(0).str("").bytes()},
      {"first_token",
       w().array(7).uint(1).str("PrefillDone").uint(1).sint(-2).uint(1).uint(1).uint(1).bytes()},
      {"first_token", w().array(7)
                          .uint(1)
                          .str("PrefillDone")
                          .uint(1)
                          .uint(uint64_t{1} << 31)
                          .uint(1)
                          .uint(1)
                          .uint(1)
                          .bytes()},
      {"n_pages",
       w().array(5).uint(1).str("PagesWritten").uint(1).uint(0).uint(uint64_t{1} << 32).bytes()},
      {"retry_after_ms", w().array(5)
                             .uint(1)
                             .str("OrderRejected")
                             .uint(1)
                             .str("x")
                             .uint(kMaxRetryAfterMs + 1)
                             .bytes()},
      // Reserved byte 0xc1 where a field should be.
      {"Cancel.room", w().array(3).uint(1).str("Cancel").raw("\xc1").bytes()},
  };
  for (const Case& c : cases) {
    const Error e = decode_error(c.bytes);
    EXPECT_EQ(e.code, ErrorCode::kCorrupt) << c.want;
    EXPECT_NE(e.message.find(c.want), std::string::npos)
        << "'" << e.message << "' does not name " << c.want;
  }
}

// Array and string headers that claim far more than the frame holds are refused before
// anything is sized from them (ASan would see a huge allocation or an overread).
TEST(PdMessages, DecodeRefusesLengthsBeyondTheFrame) {
  std::string order_head =
      Writer().array(11).uint(1).str("PrefillOrder").uint(5).str("decode-0").bytes();
  // array32 of 2^32 - 1 tokens, with nothing after it.
  const Error huge = decode_error(order_head + std::string("\xdd\xff\xff\xff\xff", 5));
  EXPECT_EQ(huge.code, ErrorCode::kCorrupt);
  EXPECT_NE(huge.message.find("tokens"), std::string::npos);
  // More tokens than any order may have, each present.
  Writer many;
  many.raw(order_head).array(static_cast<uint32_t>(kMaxTokens + 1));
  for (size_t i = 0; i < kMaxTokens + 1; ++i) many.uint(1);
  const Error too_many = decode_error(many.bytes());
  EXPECT_NE(too_many.message.find("more than"), std::string::npos);
  // str32 claiming 4 GiB.
  const Error long_str =
      decode_error(Writer().array(3).uint(1).raw("\xdb\xff\xff\xff\xf0").bytes());
  EXPECT_EQ(long_str.code, ErrorCode::kCorrupt);
  // map32 of sampling entries claiming 2^32 - 1.
  PrefillOrder o = sample_order();
  o.sampling.clear();
  std::string bytes = *encode_message(o);
  // The empty map (0x80) is followed by deadline_ms; swap the map header for a huge one.
  const size_t at = bytes.rfind('\x80');
  ASSERT_NE(at, std::string::npos);
  bytes.replace(at, 1, "\xdf\xff\xff\xff\xff");
  EXPECT_EQ(decode_error(bytes).code, ErrorCode::kCorrupt);
  // A frame larger than any message.
  EXPECT_NE(decode_error(std::string(kMaxMessageBytes + 1, '\x90')).message.find("frame"),
            std::string::npos);
}

TEST(PdMessages, DecodeRefusesDuplicateSamplingKeysAndNonFiniteValues) {
  constexpr std::string_view kEmptyBin("\xc4\x00", 2);  // bin8 of length 0
  Writer w;
  w.array(11).uint(1).str("PrefillOrder").uint(5).str("decode-0");
  w.array(1).uint(7);  // tokens
  w.uint(0).uint(16);  // cached_tokens, page_size
  w.array(1).uint(4);  // dst_pages
  w.array(6).str("storage").raw(kEmptyBin).raw(kEmptyBin).uint(0).uint(0).str("p");
  Writer dup = w;
  dup.map(2).str("top_k").uint(1).str("top_k").uint(2).uint(100);
  EXPECT_NE(decode_error(dup.bytes()).message.find("twice"), std::string::npos);
  Writer inf = w;
  inf.map(1).str("temperature").dbl(std::numeric_limits<double>::infinity()).uint(100);
  EXPECT_NE(decode_error(inf.bytes()).message.find("finite"), std::string::npos);
  Writer fine = w;
  fine.map(1).str("temperature").dbl(0.5).uint(100);
  auto ok = decode_message(fine.bytes());
  ASSERT_TRUE(ok.has_value()) << ok.error().message;
  EXPECT_EQ(std::get<PrefillOrder>(*ok).transport.kind, TransportKind::kStorage);
}

// Every proper prefix of every valid message is refused.
TEST(PdMessages, EveryTruncationIsRefused) {
  for (const Message& m : one_of_each()) {
    const std::string bytes = *encode_message(m);
    for (size_t n = 0; n < bytes.size(); ++n) {
      auto r = decode_message(std::string_view(bytes.data(), n));
      ASSERT_FALSE(r.has_value()) << message_kind(m) << " cut to " << n << " of " << bytes.size();
      ASSERT_EQ(r.error().code, ErrorCode::kCorrupt);
    }
  }
}

// Mutated and random bytes: the decoder either refuses them or returns a message that is
// valid (it encodes again and decodes to itself). Nothing may crash or overread.
TEST(PdMessages, MutatedAndRandomBytesNeverCrash) {
  std::mt19937_64 rng(20240515);
  const std::vector<Message> seeds = one_of_each();
  size_t decoded = 0;
  for (int iter = 0; iter < 60'000; ++iter) {
    std::string bytes;
    if (iter % 5 == 4) {
      bytes.resize(rng() % 64);
      for (char& c : bytes) c = static_cast<char>(rng());
    } else {
      bytes = *encode_message(seeds[rng() % seeds.size()]);
      const int edits = 1 + static_cast<int>(rng() % 4);
      for (int e = 0; e < edits; ++e) {
        const size_t at = rng() % bytes.size();
        switch (rng() % 4) {
          case 0:  // flip a byte
            bytes[at] = static_cast<char>(rng());
            break;
          case 1:  // cut
            bytes.resize(at);
            break;
          case 2:  // insert a byte
            bytes.insert(bytes.begin() + static_cast<std::ptrdiff_t>(at), static_cast<char>(rng()));
            break;
          default:  // a length-ish header byte
            bytes[at] = "\xdc\xdd\xde\xdf\xd9\xda\xdb\xc4\xc5\xc6\xcf\xd3\xc1"[rng() % 13];
            break;
        }
        if (bytes.empty()) break;
      }
    }
    auto r = decode_message(bytes);
    if (!r) {
      EXPECT_TRUE(r.error().code == ErrorCode::kCorrupt ||
                  r.error().code == ErrorCode::kUnsupported);
      continue;
    }
    ++decoded;
    auto again = encode_message(*r);
    ASSERT_TRUE(again.has_value())
        << "decoded an invalid " << message_kind(*r) << ": " << again.error().message;
    auto twice = decode_message(*again);
    ASSERT_TRUE(twice.has_value());
    EXPECT_EQ(*twice, *r);
  }
  // Some mutations leave a valid message (a changed number): the check above ran.
  EXPECT_GT(decoded, 0u);
}

TEST(PdMessages, MessageRoomAndKind) {
  EXPECT_EQ(message_room(Hello{"d", Role::kDecode, 1, 0, ""}), std::nullopt);
  EXPECT_EQ(message_room(Heartbeat{"d", 0}), std::nullopt);
  EXPECT_EQ(message_room(PagesWritten{RoomId{7}, 0, 1}), RoomId{7});
  EXPECT_EQ(message_kind(PrefillDone{}), "PrefillDone");
  EXPECT_TRUE(valid_worker_id("decode-0@host:1"));
  EXPECT_FALSE(valid_worker_id("decode 0"));
  EXPECT_FALSE(valid_worker_id(std::string("a\0b", 3)));
  EXPECT_FALSE(valid_worker_id("\x7f"));
}

}  // namespace
}  // namespace strata::pd
