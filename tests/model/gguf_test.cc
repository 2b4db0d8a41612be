// The GGUF reader: every metadata type, tensor infos and alignment, and bad files refused
// with the byte offset and the reason (never a crash: every prefix of a good file).
#include "model/gguf.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

namespace strata {
namespace {

// A hand-built GGUF byte stream.
class Bytes {
 public:
  template <typename T>
  Bytes& put(T v) {
    const auto* p = reinterpret_cast<const std::byte*>(&v);
    data.insert(data.end(), p, p + sizeof v);
    return *this;
  }
  Bytes& str(std::string_view s) {
    put<uint64_t>(s.size());
    const auto* p = reinterpret_cast<const std::byte*>(s.data());
    data.insert(data.end(), p, p + s.size());
    return *this;
  }
  Bytes& key(std::string_view k, GgufValueType type) {
    str(k);
    return put<uint32_t>(static_cast<uint32_t>(type));
  }
  void pad(size_t alignment) { data.resize((data.size() + alignment - 1) / alignment * alignment); }
  std::vector<std::byte> data;
};

// Header: magic, version, tensor count, kv count.
Bytes header(uint32_t version, uint64_t tensors, uint64_t kvs) {
  Bytes b;
  b.put<uint32_t>(0x46554747).put<uint32_t>(version).put<uint64_t>(tensors).put<uint64_t>(kvs);
  return b;
}

TEST(GgufTest, ReadsEveryValueType) {
  Bytes b = header(3, 0, 14);
  b.key("u8", GgufValueType::kU8).put<uint8_t>(200);
  b.key("i8", GgufValueType::kI8).put<int8_t>(-100);
  b.key("u16", GgufValueType::kU16).put<uint16_t>(60000);
  b.key("i16", GgufValueType::kI16).put<int16_t>(-30000);
  b.key("u32", GgufValueType::kU32).put<uint32_t>(4000000000u);
  b.key("i32", GgufValueType::kI32).put<int32_t>(-2000000000);
  b.key("f32", GgufValueType::kF32).put<float>(1.5f);
  b.key("bool", GgufValueType::kBool).put<uint8_t>(1);
  b.key("string", GgufValueType::kString).str("héllo");
  b.key("u64", GgufValueType::kU64).put<uint64_t>(uint64_t{1} << 40);
  b.key("i64", GgufValueType::kI64).put<int64_t>(-(int64_t{1} << 40));
  b.key("f64", GgufValueType::kF64).put<double>(-2.25);
  b.key("strings", GgufValueType::kArray)
      .put<uint32_t>(static_cast<uint32_t>(GgufValueType::kString))
      .put<uint64_t>(2)
      .str("a")
      .str("bc");
  // An array of two arrays of i16.
  b.key("nested", GgufValueType::kArray)
      .put<uint32_t>(static_cast<uint32_t>(GgufValueType::kArray))
      .put<uint64_t>(2);
  for (int i = 0; i < 2; ++i) {
    b.put<uint32_t>(static_cast<uint32_t>(GgufValueType::kI16)).put<uint64_t>(2);
    b.put<int16_t>(static_cast<int16_t>(i)).put<int16_t>(-7);
  }
  auto file = GgufFile::parse(b.data, "test");
  ASSERT_TRUE(file) << file.error().message;
  const GgufFile& f = **file;
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(*f.get_int("u8"), 200);
  EXPECT_EQ(*f.get_int("i8"), -100);
  EXPECT_EQ(*f.get_int("u16"), 60000);
  EXPECT_EQ(*f.get_int("i16"), -30000);
  EXPECT_EQ(*f.get_int("u32"), 4000000000LL);
  EXPECT_EQ(*f.get_int("i32"), -2000000000);
  EXPECT_EQ(*f.get_real("f32"), 1.5);
  EXPECT_EQ(*f.get_int("bool"), 1);
  EXPECT_EQ(*f.get_string("string"), "héllo");
  EXPECT_EQ(*f.get_int("u64"), int64_t{1} << 40);
  EXPECT_EQ(*f.get_int("i64"), -(int64_t{1} << 40));
  EXPECT_EQ(*f.get_real("f64"), -2.25);
  EXPECT_EQ(*f.get_real("i32"), -2e9);
  EXPECT_EQ(f.find("strings")->strings, (std::vector<std::string>{"a", "bc"}));
  const GgufValue* nested = f.find("nested");
  ASSERT_EQ(nested->items.size(), 2u);
  EXPECT_EQ(nested->items[1].integers, (std::vector<int64_t>{1, -7}));
  EXPECT_EQ(f.get_string("absent").error().code, ErrorCode::kNotFound);
  EXPECT_EQ(f.get_string("u8").error().code, ErrorCode::kInvalidArgument);
}

// A writer-made file with two tensors and a custom alignment in version 2 form.
std::vector<std::byte> two_tensor_file() {
  GgufWriter w;
  w.set_string("general.architecture", "llama");
  w.set_u32("general.alignment", 32);
  std::vector<std::byte> a(64 * 4), q(2 * 34);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<std::byte>(i);
  w.add_tensor("a", {16, 4}, GgmlType::kF32, a);
  w.add_tensor("q", {64}, GgmlType::kQ8_0, q);
  return w.bytes();
}

TEST(GgufTest, TensorsAndAlignment) {
  const std::vector<std::byte> bytes = two_tensor_file();
  auto file = GgufFile::parse(bytes, "test");
  ASSERT_TRUE(file) << file.error().message;
  const GgufTensor* a = (*file)->tensor("a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->shape(), (std::vector<int64_t>{4, 16}));
  EXPECT_EQ(a->data.size(), 256u);
  EXPECT_EQ(a->data[5], std::byte{5});
  EXPECT_EQ((a->data.data() - bytes.data()) % 32, 0);
  const GgufTensor* q = (*file)->tensor("q");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->type, static_cast<uint32_t>(GgmlType::kQ8_0));
  EXPECT_EQ(q->data.size(), 68u);
  EXPECT_EQ((*file)->tensor("none"), nullptr);
}

TEST(GgufTest, OpensAMappedFile) {
  const auto path = std::filesystem::temp_directory_path() / "strata_gguf_test.gguf";
  GgufWriter w;
  w.set_string("k", "v");
  w.add_tensor("t", {32}, GgmlType::kF16, std::vector<std::byte>(64));
  ASSERT_TRUE(w.write(path));
  auto file = GgufFile::open(path);
  ASSERT_TRUE(file) << file.error().message;
  EXPECT_EQ((*file)->tensor("t")->data.size(), 64u);
  std::filesystem::remove(path);
  EXPECT_EQ(GgufFile::open(path).error().code, ErrorCode::kNotFound);
}

// Every prefix of a good file that ends before its last tensor's data does is refused
// (truncated), with an offset, and none crashes.
TEST(GgufTest, EveryTruncationIsRefused) {
  const std::vector<std::byte> bytes = two_tensor_file();
  auto whole = GgufFile::parse(bytes, "whole");
  ASSERT_TRUE(whole);
  const GgufTensor* last = (*whole)->tensor("q");
  const auto end = static_cast<size_t>(last->data.data() - bytes.data()) + last->data.size();
  for (size_t n = 0; n < end; ++n) {
    auto file = GgufFile::parse(std::span(bytes.data(), n), "cut");
    ASSERT_FALSE(file) << "prefix " << n;
    EXPECT_NE(file.error().message.find("at byte"), std::string::npos) << file.error().message;
  }
}

void expect_refused(const std::vector<std::byte>& bytes, const std::string& offset,
                    const std::string& reason) {
  auto file = GgufFile::parse(bytes, "bad");
  ASSERT_FALSE(file);
  EXPECT_NE(file.error().message.find("at byte " + offset + ":"), std::string::npos)
      << file.error().message;
  EXPECT_NE(file.error().message.find(reason), std::string::npos) << file.error().message;
}

TEST(GgufTest, BadFilesNameTheOffsetAndTheReason) {
  {
    Bytes b = header(3, 0, 0);
    b.data[0] = std::byte{'X'};
    expect_refused(b.data, "0", "wrong magic");
  }
  expect_refused(header(1, 0, 0).data, "4", "version 1 is not supported");
  expect_refused(header(3, 0, uint64_t{1} << 60).data, "16", "metadata count");
  expect_refused(header(3, uint64_t{1} << 60, 0).data, "8", "tensor count");
  {
    Bytes b = header(3, 0, 1);
    b.key("k", GgufValueType::kString).put<uint64_t>(uint64_t{1} << 50);
    expect_refused(b.data, "37", "length 1125899906842624 exceeds");
  }
  {
    Bytes b = header(3, 0, 1);
    b.key("k", static_cast<GgufValueType>(13)).put<uint32_t>(0);
    expect_refused(b.data, "37", "unknown value type 13");
  }
  {
    Bytes b = header(3, 0, 1);
    b.key("k", GgufValueType::kArray).put<uint32_t>(4).put<uint64_t>(uint64_t{1} << 40);
    expect_refused(b.data, "41", "array length");
  }
  {
    Bytes b = header(3, 0, 1);
    b.key("k", GgufValueType::kBool).put<uint8_t>(7);
    expect_refused(b.data, "37", "bool value 7");
  }
  auto one_tensor = [](uint32_t type, uint64_t ne0, uint64_t offset, size_t data_bytes) {
    Bytes b = header(3, 1, 0);
    b.str("w").put<uint32_t>(1).put<uint64_t>(ne0).put<uint32_t>(type).put<uint64_t>(offset);
    b.pad(32);
    b.data.resize(b.data.size() + data_bytes);
    return b.data;
  };
  // Tensor info at byte 24; its dims count at 33, type at 45, offset at 49.
  expect_refused(one_tensor(99, 32, 0, 128), "45", "unknown type 99");
  expect_refused(one_tensor(0, 32, 0, 64), "24", "runs past the end");
  expect_refused(one_tensor(0, 32, 64, 128), "24", "runs past the end");
  expect_refused(one_tensor(0, 32, 16, 256), "49", "not a multiple of the alignment");
  expect_refused(one_tensor(8, 48, 0, 256), "33", "not a multiple of its block");
  expect_refused(one_tensor(0, 0, 0, 256), "37", "out of range");
  EXPECT_TRUE(GgufFile::parse(one_tensor(0, 32, 0, 128), "good"));
  EXPECT_EQ(GgufFile::parse(one_tensor(99, 32, 0, 128), "bad").error().code,
            ErrorCode::kUnsupported);
  {
    Bytes b = header(3, 2, 0);
    for (int i = 0; i < 2; ++i) {
      b.str("w").put<uint32_t>(1).put<uint64_t>(8).put<uint32_t>(0).put<uint64_t>(0);
    }
    b.pad(32);
    b.data.resize(b.data.size() + 64);
    expect_refused(b.data, "57", "appears twice");
  }
  {
    Bytes b = header(3, 0, 1);
    b.key("general.alignment", GgufValueType::kU32).put<uint32_t>(48);
    auto file = GgufFile::parse(b.data, "bad");
    ASSERT_FALSE(file);
    EXPECT_NE(file.error().message.find("power of two"), std::string::npos);
  }
}

}  // namespace
}  // namespace strata
