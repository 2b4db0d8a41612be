// The PageTransport implementations end to end: a prefill pool's pages land in a decode
// pool exactly as per-page copies would put them, over UCX and over the storage tier (file
// and Redis), and bad descriptors and batches are refused.
#include "kvtransfer/page_transport.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <future>
#include <random>
#include <string>
#include <vector>

#include "kvtransfer/page_runs.h"
#include "kvtransfer/storage_page_transport.h"
#include "kvtransfer/ucx_page_transport.h"
#include "kvtransfer/ucx_transport.h"
#include "kvtransfer/wire_format.h"
#include "kvtransfer_test_util.h"
#include "memory/kv_pool.h"
#include "storage/storage_backend.h"
#include "testing/redis_test_server.h"

namespace strata {
namespace {

Status run(const std::function<Status(TransferDone)>& start) {
  auto promise = std::make_shared<std::promise<Status>>();
  auto future = promise->get_future();
  Status started = start([promise](Status s) { promise->set_value(std::move(s)); });
  if (!started) return started;
  if (future.wait_for(kWaitBound) != std::future_status::ready) {
    return make_error(ErrorCode::kInternal, "did not complete within the bound");
  }
  return future.get();
}

void fill_random_words(KvPool& pool, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::byte* base = kv_pool_base(pool);
  for (size_t i = 0; i + 8 <= pool.total_bytes(); i += 8) {
    const uint64_t v = gen();
    std::memcpy(base + i, &v, 8);
  }
}

// Pools of the same page shape and different sizes, and a reference copy of the decode
// pool that per-page copies keep up to date. Int8 pages (issue 54): blocks of codes and
// their scales, which P/D moves as they are.
struct Pools {
  KvPool prefill{KvPoolShape{4, 2, 32, 40, 16, KvDtype::kInt8}};
  KvPool decode{KvPoolShape{4, 2, 32, 56, 16, KvDtype::kInt8}};
  KvPool reference{KvPoolShape{4, 2, 32, 56, 16, KvDtype::kInt8}};

  Pools() {
    fill_random_words(prefill, 1);
    fill_random_words(decode, 2);
    std::memcpy(kv_pool_base(reference), kv_pool_base(decode), decode.total_bytes());
  }

  void apply(const PageBatch& batch) {
    std::vector<std::byte> page(prefill.page_bytes());
    for (size_t i = 0; i < batch.src_pages.size(); ++i) {
      prefill.copy_page_out(batch.src_pages[i], page);
      reference.copy_page_in(batch.dst_pages[i], page);
    }
  }
  bool decode_matches() const {
    return std::memcmp(kv_pool_base(decode), kv_pool_base(reference), decode.total_bytes()) == 0;
  }
};

PageBatch random_batch(std::mt19937& gen, uint64_t room, int32_t first_index, int32_t count,
                       int32_t src_n, int32_t dst_n) {
  std::vector<int32_t> s(src_n), d(dst_n);
  for (int32_t i = 0; i < src_n; ++i) s[i] = i;
  for (int32_t i = 0; i < dst_n; ++i) d[i] = i;
  if (gen() % 2) std::shuffle(s.begin(), s.end(), gen);
  if (gen() % 2) std::shuffle(d.begin(), d.end(), gen);
  PageBatch b;
  b.room_id = room;
  b.first_index = first_index;
  for (int32_t i = 0; i < count; ++i) {
    b.src_pages.push_back(make_page_id(s[i]));
    b.dst_pages.push_back(make_page_id(d[i]));
  }
  return b;
}

// The same checks for every transport: a prefill-side and a decode-side instance.
void round_trips(PageTransport& prefill, PageTransport& decode, Pools& pools) {
  auto dest = prefill.open_destination(decode.pool_descriptor());
  ASSERT_TRUE(dest) << dest.error().message;
  std::mt19937 gen(17);
  std::uniform_int_distribution<uint64_t> room_ids;
  for (int round = 0; round < 6; ++round) {
    // A room in two chunks, as prefill sends pages chunk by chunk.
    const uint64_t room = room_ids(gen);
    PageBatch all = random_batch(gen, room, 0, 1 + static_cast<int32_t>(gen() % 30),
                                 pools.prefill.num_pages(), pools.decode.num_pages());
    const size_t half = all.src_pages.size() / 2;
    PageBatch first{room,
                    0,
                    {all.src_pages.begin(), all.src_pages.begin() + half},
                    {all.dst_pages.begin(), all.dst_pages.begin() + half}};
    PageBatch second{room,
                     static_cast<int32_t>(half),
                     {all.src_pages.begin() + half, all.src_pages.end()},
                     {all.dst_pages.begin() + half, all.dst_pages.end()}};
    for (const PageBatch* b : {&first, &second}) {
      Status sent = run([&](TransferDone done) { return prefill.send(*dest, *b, 30'000, done); });
      ASSERT_TRUE(sent) << sent.error().message;
      Status received = run([&](TransferDone done) { return decode.receive(*b, 30'000, done); });
      ASSERT_TRUE(received) << received.error().message;
      pools.apply(*b);
    }
    ASSERT_TRUE(pools.decode_matches()) << prefill.name() << " round " << round;
    // The next round's bytes are written by the decode transport's thread, caused by this
    // thread's send through the other transport and the network, which TSan cannot see.
    // A call into the decode transport orders this thread's reads before them (a worker
    // hands its pages to the transport the same way: through its calls).
    ASSERT_TRUE(run([&](TransferDone done) { return decode.receive(PageBatch{}, 1000, done); }));
  }

  // Bad batches are refused at once.
  PageBatch bad{1, 0, {make_page_id(0), make_page_id(1)}, {make_page_id(0)}};
  EXPECT_EQ(prefill.send(*dest, bad, 1000, [](Status) { FAIL(); }).error().code,
            ErrorCode::kInvalidArgument);
  bad = PageBatch{1, 0, {make_page_id(0)}, {make_page_id(pools.decode.num_pages())}};
  EXPECT_EQ(prefill.send(*dest, bad, 1000, [](Status) { FAIL(); }).error().code,
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(decode.receive(bad, 1000, [](Status) { FAIL(); }).error().code,
            ErrorCode::kInvalidArgument);
  bad = PageBatch{1, 0, {make_page_id(0), make_page_id(1)}, {make_page_id(3), make_page_id(3)}};
  EXPECT_EQ(decode.receive(bad, 1000, [](Status) { FAIL(); }).error().code,
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(
      prefill.send(PageDestinationId{999}, PageBatch{}, 1000, [](Status) { FAIL(); }).error().code,
      ErrorCode::kNotFound);

  // Descriptors: garbage, damage and another shape are refused.
  std::vector<std::byte> junk(64, std::byte{0x5a});
  EXPECT_EQ(prefill.open_destination(junk).error().code, ErrorCode::kCorrupt);
  auto damaged = decode.pool_descriptor();
  damaged[damaged.size() / 2] ^= std::byte{1};
  EXPECT_EQ(prefill.open_destination(damaged).error().code, ErrorCode::kCorrupt);
  prefill.close_destination(*dest);
}

TEST(UcxPageTransportTest, RoundTripsOverTcpAndSharedMemory) {
  for (const char* tls : {"tcp", "sm"}) {
    SCOPED_TRACE(tls);
    Pools pools;
    UcxTransportOptions options;
    options.transports = tls;
    auto prefill_ucx = UcxTransport::create(options);
    auto decode_ucx = UcxTransport::create(options);
    ASSERT_TRUE(prefill_ucx && decode_ucx);
    auto prefill = UcxPageTransport::create(**prefill_ucx, pools.prefill);
    auto decode = UcxPageTransport::create(**decode_ucx, pools.decode);
    ASSERT_TRUE(prefill && decode);
    round_trips(**prefill, **decode, pools);
  }
}

TEST(UcxPageTransportTest, RefusesAnotherPageShape) {
  KvPool prefill_pool(KvPoolShape{4, 2, 32, 8, 16, KvDtype::kInt8});
  KvPool decode_pool(KvPoolShape{4, 2, 32, 8, 16, KvDtype::kBF16});
  UcxTransportOptions options;
  options.transports = "tcp";
  auto prefill_ucx = UcxTransport::create(options);
  auto decode_ucx = UcxTransport::create(options);
  ASSERT_TRUE(prefill_ucx && decode_ucx);
  auto prefill = UcxPageTransport::create(**prefill_ucx, prefill_pool);
  auto decode = UcxPageTransport::create(**decode_ucx, decode_pool);
  ASSERT_TRUE(prefill && decode);
  auto dest = (*prefill)->open_destination((*decode)->pool_descriptor());
  ASSERT_FALSE(dest);
  EXPECT_EQ(dest.error().code, ErrorCode::kInvalidArgument);
  EXPECT_NE(dest.error().message.find("dtype"), std::string::npos) << dest.error().message;
  // A storage descriptor is not a UCX one.
  KvPool other(KvPoolShape{4, 2, 32, 8, 16, KvDtype::kF16});
  WireWriter w;
  w.pool_shape(other.shape());
  EXPECT_EQ(
      (*prefill)->open_destination(frame_wire(WireKind::kStoragePool, w.bytes())).error().code,
      ErrorCode::kCorrupt);
}

class StoragePageTransportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/strata-kvtransfer-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  StorageConfig file_config() const {
    StorageConfig c;
    c.backend = "file";
    c.name_space = "kvxfer-test";
    c.dir = dir_;
    return c;
  }

  std::string dir_;
};

TEST_F(StoragePageTransportTest, FileRoundTrips) {
  Pools pools;
  // Two backends on one directory: two workers sharing the store.
  auto prefill_store = make_storage_backend(file_config());
  auto decode_store = make_storage_backend(file_config());
  ASSERT_TRUE(prefill_store && decode_store);
  StoragePageTransportOptions options;
  options.pages_per_call = 3;  // several backend calls per batch
  auto prefill = StoragePageTransport::create(**prefill_store, pools.prefill, options);
  auto decode = StoragePageTransport::create(**decode_store, pools.decode, options);
  ASSERT_TRUE(prefill && decode);
  round_trips(**prefill, **decode, pools);
  EXPECT_GT((*prefill)->stats().pages_sent, 0u);
  EXPECT_EQ((*prefill)->stats().pages_sent, (*decode)->stats().pages_received);
}

TEST_F(StoragePageTransportTest, MissingAndDamagedPagesFail) {
  Pools pools;
  auto store = make_storage_backend(file_config());
  ASSERT_TRUE(store);
  auto prefill = StoragePageTransport::create(**store, pools.prefill);
  auto decode = StoragePageTransport::create(**store, pools.decode);
  ASSERT_TRUE(prefill && decode);
  PageBatch batch{42, 0, {make_page_id(1), make_page_id(2)}, {make_page_id(5), make_page_id(6)}};
  // Nothing sent yet: the read fails and the pool keeps its bytes.
  Status r = run([&](TransferDone done) { return (*decode)->receive(batch, 10'000, done); });
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, ErrorCode::kNotFound) << r.error().message;
  EXPECT_TRUE(pools.decode_matches());

  auto dest = (*prefill)->open_destination((*decode)->pool_descriptor());
  ASSERT_TRUE(dest);
  ASSERT_TRUE(run([&](TransferDone done) { return (*prefill)->send(*dest, batch, 10'000, done); }));
  // Damage page 1 of the room in the store.
  const std::string path = dir_ + "/kvxfer-test/" +
                           storage_key_hex(room_page_key(42, 1)).substr(0, 2) + "/" +
                           storage_key_hex(room_page_key(42, 1));
  ASSERT_TRUE(std::filesystem::exists(path)) << path;
  {
    FILE* f = std::fopen(path.c_str(), "r+b");
    ASSERT_NE(f, nullptr);
    std::fseek(f, 100, SEEK_SET);
    std::fputc(0x77, f);
    std::fclose(f);
  }
  r = run([&](TransferDone done) { return (*decode)->receive(batch, 10'000, done); });
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, ErrorCode::kCorrupt) << r.error().message;
}

TEST_F(StoragePageTransportTest, RedisRoundTripsAndReportsADeadServer) {
  test_support::RedisTestServer server;
  ASSERT_EQ(server.start(), "");
  StorageConfig config;
  config.backend = "redis";
  config.name_space = "kvxfer-test";
  config.port = server.port();
  config.timeout_ms = 2000;
  Pools pools;
  auto prefill_store = make_storage_backend(config);
  auto decode_store = make_storage_backend(config);
  ASSERT_TRUE(prefill_store && decode_store);
  auto prefill = StoragePageTransport::create(**prefill_store, pools.prefill);
  auto decode = StoragePageTransport::create(**decode_store, pools.decode);
  ASSERT_TRUE(prefill && decode);
  round_trips(**prefill, **decode, pools);

  server.kill();
  auto dest = (*prefill)->open_destination((*decode)->pool_descriptor());
  ASSERT_TRUE(dest);
  PageBatch batch{7, 0, {make_page_id(0)}, {make_page_id(0)}};
  Status s = run([&](TransferDone done) { return (*prefill)->send(*dest, batch, 10'000, done); });
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error().code, ErrorCode::kIoError) << s.error().message;
}

TEST(RoomPageKeyTest, DiffersByRoomAndIndex) {
  EXPECT_NE(room_page_key(1, 0), room_page_key(1, 1));
  EXPECT_NE(room_page_key(1, 0), room_page_key(2, 0));
  EXPECT_EQ(room_page_key(9, 3), room_page_key(9, 3));
}

}  // namespace
}  // namespace strata
