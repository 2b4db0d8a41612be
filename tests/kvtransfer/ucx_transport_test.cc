#include "kvtransfer/ucx_transport.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kvtransfer/page_runs.h"
#include "kvtransfer/wire_format.h"
#include "kvtransfer_test_util.h"
#include "memory/kv_pool.h"

namespace strata {
namespace {

using namespace std::chrono_literals;

// A TransferDone that fulfils a future, and counts its calls (exactly once expected).
struct Completion {
  std::shared_ptr<std::promise<Status>> promise = std::make_shared<std::promise<Status>>();
  std::shared_ptr<std::atomic<int>> calls = std::make_shared<std::atomic<int>>(0);
  std::future<Status> future = promise->get_future();

  TransferDone callback() {
    return [p = promise, c = calls](Status s) {
      if (c->fetch_add(1) == 0) p->set_value(std::move(s));
    };
  }
  // The outcome, or kInternal "hung" when none came within the bound.
  Status wait() {
    if (future.wait_for(kWaitBound) != std::future_status::ready) {
      return make_error(ErrorCode::kInternal, "transfer did not complete within the bound");
    }
    return future.get();
  }
};

std::unique_ptr<UcxTransport> make_transport(const std::string& tls,
                                             UcxPeerErrorMode mode = UcxPeerErrorMode::kPeer,
                                             UcxDataPath path = UcxDataPath::kMessages) {
  UcxTransportOptions options;
  options.transports = tls;
  options.peer_error_mode = mode;
  options.data_path = path;
  // Small messages, so that the tests' runs are cut into several.
  options.message_chunk_bytes = 8192;
  auto t = UcxTransport::create(options);
  if (!t) ADD_FAILURE() << "UcxTransport::create(" << tls << "): " << t.error().message;
  return t ? std::move(*t) : nullptr;
}

void fill_random(std::byte* p, size_t n, uint64_t seed) {
  std::mt19937_64 gen(seed);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const uint64_t v = gen();
    std::memcpy(p + i, &v, 8);
  }
  for (; i < n; ++i) p[i] = static_cast<std::byte>(gen());
}

// Random pairs of distinct source and destination pages.
void random_pages(std::mt19937& gen, int32_t src_n, int32_t dst_n, int32_t count,
                  std::vector<PageId>& src, std::vector<PageId>& dst) {
  std::vector<int32_t> s(src_n), d(dst_n);
  for (int32_t i = 0; i < src_n; ++i) s[i] = i;
  for (int32_t i = 0; i < dst_n; ++i) d[i] = i;
  if (gen() % 2) std::shuffle(s.begin(), s.end(), gen);
  if (gen() % 2) std::shuffle(d.begin(), d.end(), gen);
  src.clear();
  dst.clear();
  for (int32_t i = 0; i < count; ++i) {
    src.push_back(make_page_id(s[i]));
    dst.push_back(make_page_id(d[i]));
  }
}

// ---- one-process pairs: the prefill side puts into the decode side's region ----

struct TransportCase {
  std::string tls;
  bool allocated;  // decode region from allocate_region (else a registered KvPool)
  UcxPeerErrorMode mode = UcxPeerErrorMode::kPeer;
  UcxDataPath path = UcxDataPath::kMessages;
};

std::string case_name(const testing::TestParamInfo<TransportCase>& info) {
  std::string name;
  for (char c : info.param.tls) name += (c == ',') ? '_' : c;
  name += info.param.allocated ? "_allocated" : "_registered";
  if (info.param.mode == UcxPeerErrorMode::kNone) name += "_none";
  if (info.param.path == UcxDataPath::kPut) name += "_put";
  return name;
}

class UcxPairTest : public testing::TestWithParam<TransportCase> {
 protected:
  void SetUp() override {
    src_shape_ = KvPoolShape{3, 2, 16, 48, 16, KvDtype::kBF16};
    dst_shape_ = KvPoolShape{3, 2, 16, 64, 16, KvDtype::kBF16};
    src_pool_ = std::make_unique<KvPool>(src_shape_);
    dst_bytes_ = kv_pool_geometry(dst_shape_).total_bytes();
    fill_random(kv_pool_base(*src_pool_), src_pool_->total_bytes(), 7);

    decode_ = make_transport(GetParam().tls, GetParam().mode, GetParam().path);
    prefill_ = make_transport(GetParam().tls, GetParam().mode, GetParam().path);
    ASSERT_TRUE(decode_ && prefill_);
    if (GetParam().allocated) {
      auto r = decode_->allocate_region(dst_bytes_);
      ASSERT_TRUE(r) << r.error().message;
      dst_region_ = *r;
      dst_base_ = *decode_->region_base(dst_region_);
    } else {
      dst_pool_ = std::make_unique<KvPool>(dst_shape_);
      dst_base_ = kv_pool_base(*dst_pool_);
      auto r = decode_->register_region(dst_base_, dst_bytes_);
      ASSERT_TRUE(r) << r.error().message;
      dst_region_ = *r;
    }
    fill_random(dst_base_, dst_bytes_, 11);
    expected_.assign(dst_base_, dst_base_ + dst_bytes_);

    auto src = prefill_->register_region(kv_pool_base(*src_pool_), src_pool_->total_bytes());
    ASSERT_TRUE(src) << src.error().message;
    src_region_ = *src;
    auto peer = prefill_->connect(decode_->address());
    ASSERT_TRUE(peer) << peer.error().message;
    peer_ = *peer;
    auto descriptor = decode_->region_descriptor(dst_region_);
    ASSERT_TRUE(descriptor);
    auto remote = prefill_->import_region(peer_, *descriptor);
    ASSERT_TRUE(remote) << remote.error().message;
    remote_ = *remote;
  }

  // Starts a transfer of the pairs and applies it to expected_.
  Completion start(const std::vector<PageId>& src, const std::vector<PageId>& dst,
                   int64_t timeout_ms = 60'000) {
    auto runs = plan_page_runs(src_shape_, dst_shape_, src, dst);
    EXPECT_TRUE(runs) << runs.error().message;
    copy_page_runs(kv_pool_base(*src_pool_), expected_.data(), *runs);
    Completion c;
    auto s = prefill_->put_runs(peer_, remote_, src_region_, *runs, timeout_ms, c.callback());
    EXPECT_TRUE(s) << s.error().message;
    return c;
  }

  // The decode side's bytes as its own thread sees them after a post() (the way a
  // receiver hands landed pages on).
  bool destination_matches() {
    std::promise<bool> same;
    decode_->post(
        [&] { same.set_value(std::memcmp(dst_base_, expected_.data(), dst_bytes_) == 0); });
    return same.get_future().get();
  }

  KvPoolShape src_shape_, dst_shape_;
  std::unique_ptr<KvPool> src_pool_, dst_pool_;
  std::byte* dst_base_ = nullptr;
  size_t dst_bytes_ = 0;
  std::vector<std::byte> expected_;
  std::unique_ptr<UcxTransport> decode_, prefill_;
  UcxRegionId dst_region_{}, src_region_{};
  UcxPeerId peer_{};
  UcxRemoteRegionId remote_{};
};

TEST_P(UcxPairTest, RandomPageSetsLandExactly) {
  std::mt19937 gen(99);
  std::vector<PageId> src, dst;
  for (int round = 0; round < 12; ++round) {
    random_pages(gen, src_shape_.num_pages, dst_shape_.num_pages,
                 1 + static_cast<int32_t>(gen() % src_shape_.num_pages), src, dst);
    Completion c = start(src, dst);
    Status s = c.wait();
    ASSERT_TRUE(s) << s.error().message;
    ASSERT_TRUE(destination_matches()) << "round " << round;
  }
  const UcxTransportStats stats = prefill_->stats();
  EXPECT_EQ(stats.transfers_started, 12u);
  EXPECT_EQ(stats.transfers_ok, 12u);
  EXPECT_EQ(stats.transfers_failed, 0u);
}

TEST_P(UcxPairTest, ManyTransfersInFlightFromSeveralThreads) {
  // Disjoint destination pages per transfer, so every order of landing gives one result.
  std::vector<Completion> completions(16);
  std::vector<std::thread> threads;
  std::mutex expected_mutex;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 4; ++i) {
        const int k = t * 4 + i;
        std::vector<PageId> src = {make_page_id(k), make_page_id(k + 20)};
        std::vector<PageId> dst = {make_page_id(k * 4), make_page_id(k * 4 + 1)};
        std::lock_guard lock(expected_mutex);  // start() updates expected_
        completions[k] = start(src, dst);
      }
    });
  }
  for (auto& th : threads) th.join();
  for (auto& c : completions) {
    Status s = c.wait();
    ASSERT_TRUE(s) << s.error().message;
    EXPECT_EQ(c.calls->load(), 1);
  }
  EXPECT_TRUE(destination_matches());
}

TEST_P(UcxPairTest, RunsOutsideARegionAreRefused) {
  Completion c;
  std::vector<PageRun> runs = {{0, dst_bytes_ - 10, 20}};
  auto s = prefill_->put_runs(peer_, remote_, src_region_, runs, 1000, c.callback());
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error().code, ErrorCode::kInvalidArgument);
  runs = {{src_pool_->total_bytes(), 0, 1}};
  EXPECT_EQ(prefill_->put_runs(peer_, remote_, src_region_, runs, 1000, c.callback()).error().code,
            ErrorCode::kInvalidArgument);
  runs = {{0, 0, 0}};
  EXPECT_EQ(prefill_->put_runs(peer_, remote_, src_region_, runs, 1000, c.callback()).error().code,
            ErrorCode::kInvalidArgument);
  runs = {{0, 0, 16}};
  EXPECT_EQ(prefill_->put_runs(peer_, remote_, src_region_, runs, 0, c.callback()).error().code,
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(prefill_->put_runs(peer_, UcxRemoteRegionId{999}, src_region_, runs, 100, c.callback())
                .error()
                .code,
            ErrorCode::kNotFound);
  EXPECT_EQ(c.calls->load(), 0);
  // An empty transfer completes.
  Completion empty;
  ASSERT_TRUE(prefill_->put_runs(peer_, remote_, src_region_, {}, 1000, empty.callback()));
  EXPECT_TRUE(empty.wait());
}

TEST_P(UcxPairTest, GarbageAddressesAndDescriptorsAreRefused) {
  std::mt19937_64 gen(5);
  std::vector<std::byte> junk(300);
  for (auto& b : junk) b = static_cast<std::byte>(gen());
  EXPECT_EQ(prefill_->connect(junk).error().code, ErrorCode::kCorrupt);
  EXPECT_EQ(prefill_->connect({}).error().code, ErrorCode::kCorrupt);
  EXPECT_EQ(prefill_->import_region(peer_, junk).error().code, ErrorCode::kCorrupt);

  const std::vector<std::byte> address = decode_->address();
  // Truncated, extended, one bit flipped anywhere: all refused before UCX sees them.
  for (size_t n :
       {size_t{0}, size_t{1}, kWireHeaderBytes - 1, kWireHeaderBytes, address.size() - 1}) {
    EXPECT_EQ(prefill_->connect(std::span(address).first(n)).error().code, ErrorCode::kCorrupt);
  }
  auto longer = address;
  longer.push_back(std::byte{0});
  EXPECT_EQ(prefill_->connect(longer).error().code, ErrorCode::kCorrupt);
  for (size_t i = 0; i < address.size(); i += 7) {
    auto flipped = address;
    flipped[i] ^= std::byte{0x10};
    EXPECT_EQ(prefill_->connect(flipped).error().code, ErrorCode::kCorrupt) << "byte " << i;
  }
  auto descriptor = *decode_->region_descriptor(dst_region_);
  for (size_t i = 0; i < descriptor.size(); i += 5) {
    auto flipped = descriptor;
    flipped[i] ^= std::byte{0x01};
    EXPECT_EQ(prefill_->import_region(peer_, flipped).error().code, ErrorCode::kCorrupt)
        << "byte " << i;
  }
  // The right frame in the wrong place.
  EXPECT_EQ(prefill_->connect(descriptor).error().code, ErrorCode::kCorrupt);
  EXPECT_EQ(prefill_->import_region(peer_, address).error().code, ErrorCode::kCorrupt);
  // A well-framed descriptor with nonsense fields.
  WireWriter w;
  w.u64(0);
  w.u64(0);
  w.blob({});
  EXPECT_EQ(
      prefill_->import_region(peer_, frame_wire(WireKind::kUcxRegion, w.bytes())).error().code,
      ErrorCode::kCorrupt);

  // The transport still works afterwards.
  Completion c = start({make_page_id(1)}, {make_page_id(2)});
  ASSERT_TRUE(c.wait());
  EXPECT_TRUE(destination_matches());
}

TEST_P(UcxPairTest, DisconnectFailsTheTransfersAndThePeer) {
  std::vector<PageId> src, dst;
  std::mt19937 gen(3);
  random_pages(gen, src_shape_.num_pages, dst_shape_.num_pages, 40, src, dst);
  Completion c = start(src, dst);
  ASSERT_TRUE(prefill_->disconnect(peer_));
  Status s = c.wait();  // ok if it landed before the close, else the disconnect's error
  if (!s) {
    EXPECT_EQ(s.error().code, ErrorCode::kFailedPrecondition) << s.error().message;
  }
  EXPECT_EQ(c.calls->load(), 1);
  Completion after;
  auto again = prefill_->put_runs(peer_, remote_, src_region_, {}, 1000, after.callback());
  ASSERT_FALSE(again);
  // Reconnecting gives a fresh, working endpoint.
  auto peer = prefill_->connect(decode_->address());
  ASSERT_TRUE(peer) << peer.error().message;
  peer_ = *peer;
  auto remote = prefill_->import_region(peer_, *decode_->region_descriptor(dst_region_));
  ASSERT_TRUE(remote);
  remote_ = *remote;
  Completion c2 = start({make_page_id(0)}, {make_page_id(63)});
  ASSERT_TRUE(c2.wait());
  // The first transfer may have landed partly: compare only the page just sent.
  std::promise<bool> same;
  const auto geometry = kv_pool_geometry(dst_shape_);
  decode_->post([&] {
    bool ok = true;
    for (int r = 0; r < geometry.num_regions; ++r) {
      const size_t off = r * geometry.region_bytes + 63 * geometry.block_bytes;
      ok = ok && std::memcmp(dst_base_ + off, expected_.data() + off, geometry.block_bytes) == 0;
    }
    same.set_value(ok);
  });
  EXPECT_TRUE(same.get_future().get());
}

TEST_P(UcxPairTest, RegionInUseCannotBeDeregistered) {
  std::vector<PageId> src, dst;
  std::mt19937 gen(4);
  random_pages(gen, src_shape_.num_pages, dst_shape_.num_pages, 48, src, dst);
  Completion c = start(src, dst);
  auto s = prefill_->deregister_region(src_region_);
  if (!s) {
    EXPECT_EQ(s.error().code, ErrorCode::kFailedPrecondition);
  }
  ASSERT_TRUE(c.wait());
  if (s) return;  // it had already landed
  EXPECT_TRUE(prefill_->deregister_region(src_region_));
  EXPECT_EQ(prefill_->deregister_region(src_region_).error().code, ErrorCode::kNotFound);
}

// The decode side vanishes mid-transfer: the transfer fails (a peer error, or its
// deadline where the transport cannot see a dead peer) and never hangs.
TEST_P(UcxPairTest, PeerDestroyedMidTransferFails) {
  // Many small runs keep the transfer in flight long enough to be cut.
  std::vector<PageRun> runs;
  const uint64_t piece = 64;
  for (uint64_t off = 0; off + piece <= dst_bytes_ && off + piece <= src_pool_->total_bytes();
       off += 2 * piece) {
    runs.push_back({off, off, piece});
  }
  const bool detects_failure = *prefill_->peer_failure_detection(peer_);
  std::vector<Completion> completions(8);
  for (auto& c : completions) {
    ASSERT_TRUE(prefill_->put_runs(peer_, remote_, src_region_, runs, 3000, c.callback()));
  }
  decode_.reset();

  for (auto& c : completions) {
    Status s = c.wait();
    if (!s) {
      EXPECT_TRUE(s.error().code == ErrorCode::kIoError || s.error().code == ErrorCode::kTimeout)
          << s.error().message;
    }
    EXPECT_EQ(c.calls->load(), 1);
  }
  // A new transfer completes too. Where the endpoint detects a dead peer it fails. Over
  // shared memory without detection, puts into a UCX-allocated segment are plain stores
  // into a mapping the sender still holds: they "succeed" into memory nobody reads, and
  // the control plane's heartbeats are what notice the dead worker.
  Completion late;
  auto s = prefill_->put_runs(peer_, remote_, src_region_, runs, 3000, late.callback());
  if (s) {
    Status r = late.wait();
    EXPECT_EQ(late.calls->load(), 1);
    if (detects_failure) {
      EXPECT_FALSE(r) << "a transfer to a destroyed peer succeeded";
    }
  }
}

// The prefill side is destroyed with transfers in flight: each gets its callback.
TEST_P(UcxPairTest, DestroyingTheSenderCompletesItsTransfers) {
  std::vector<Completion> completions(6);
  std::mt19937 gen(8);
  std::vector<PageId> src, dst;
  for (auto& c : completions) {
    random_pages(gen, src_shape_.num_pages, dst_shape_.num_pages, 30, src, dst);
    auto runs = plan_page_runs(src_shape_, dst_shape_, src, dst);
    ASSERT_TRUE(prefill_->put_runs(peer_, remote_, src_region_, *runs, 60'000, c.callback()));
  }
  prefill_.reset();
  for (auto& c : completions) {
    ASSERT_EQ(c.future.wait_for(0s), std::future_status::ready);
    Status s = c.future.get();
    if (!s) {
      EXPECT_EQ(s.error().code, ErrorCode::kFailedPrecondition) << s.error().message;
    }
    EXPECT_EQ(c.calls->load(), 1);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Transports, UcxPairTest,
    testing::Values(TransportCase{"tcp", false}, TransportCase{"tcp", true},
                    TransportCase{"sm", false}, TransportCase{"sm", true},
                    TransportCase{"tcp,sm", true},
                    TransportCase{"tcp,sm", true, UcxPeerErrorMode::kNone},
                    // One-sided puts where they are truly one-sided
                    // (docs/kv-transfer.md: UCX 1.13 emulates them
                    // elsewhere, and its emulation aborts the target
                    // when the initiator dies mid-transfer).
                    TransportCase{"sm", true, UcxPeerErrorMode::kPeer, UcxDataPath::kPut},
                    TransportCase{"sm", false, UcxPeerErrorMode::kPeer, UcxDataPath::kPut}),
    case_name);

// ---- single transports ----

TEST(UcxTransportTest, ConnectingToAGoneWorkerFailsInBoundedTime) {
  auto decode = make_transport("tcp");
  auto prefill = make_transport("tcp");
  ASSERT_TRUE(decode && prefill);
  std::vector<std::byte> buffer(4096);
  auto region = decode->register_region(buffer.data(), buffer.size());
  ASSERT_TRUE(region);
  const auto address = decode->address();
  const auto descriptor = *decode->region_descriptor(*region);
  std::vector<std::byte> src(4096, std::byte{1});
  auto local = prefill->register_region(src.data(), src.size());
  ASSERT_TRUE(local);
  decode.reset();

  auto peer = prefill->connect(address);
  if (!peer) return;  // refused at once: fine
  auto remote = prefill->import_region(*peer, descriptor);
  if (!remote) return;
  Completion c;
  std::vector<PageRun> runs = {{0, 0, 4096}};
  auto s = prefill->put_runs(*peer, *remote, *local, runs, 5000, c.callback());
  if (!s) return;
  Status r = c.wait();
  ASSERT_FALSE(r);
  EXPECT_TRUE(r.error().code == ErrorCode::kIoError || r.error().code == ErrorCode::kTimeout)
      << r.error().message;
  EXPECT_EQ(prefill->stats().transfers_failed, 1u);
}

TEST(UcxTransportTest, PeerRequiredRefusesSharedMemoryOnly) {
  auto decode = make_transport("sm", UcxPeerErrorMode::kPeerRequired);
  auto prefill = make_transport("sm", UcxPeerErrorMode::kPeerRequired);
  ASSERT_TRUE(decode && prefill);
  auto peer = prefill->connect(decode->address());
  if (peer) {
    // A UCX that detects dead peers over shared memory (newer than 1.13) may connect.
    EXPECT_TRUE(*prefill->peer_failure_detection(*peer));
  } else {
    EXPECT_EQ(peer.error().code, ErrorCode::kUnsupported) << peer.error().message;
  }
}

TEST(UcxTransportTest, TcpPeersDetectFailure) {
  auto decode = make_transport("tcp");
  auto prefill = make_transport("tcp");
  ASSERT_TRUE(decode && prefill);
  auto peer = prefill->connect(decode->address());
  ASSERT_TRUE(peer);
  EXPECT_TRUE(*prefill->peer_failure_detection(*peer));
}

TEST(UcxTransportTest, BadOptionsAndRegions) {
  UcxTransportOptions options;
  options.idle_spin_us = -1;
  EXPECT_EQ(UcxTransport::create(options).error().code, ErrorCode::kInvalidArgument);
  options = {};
  options.transports = "no-such-transport";
  auto t = UcxTransport::create(options);
  EXPECT_FALSE(t);
  auto ok = make_transport("tcp");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->register_region(nullptr, 10).error().code, ErrorCode::kInvalidArgument);
  EXPECT_EQ(ok->allocate_region(0).error().code, ErrorCode::kInvalidArgument);
  EXPECT_EQ(ok->region_descriptor(UcxRegionId{12345}).error().code, ErrorCode::kNotFound);
  EXPECT_EQ(ok->disconnect(UcxPeerId{12345}).error().code, ErrorCode::kNotFound);
}

TEST(UcxTransportTest, PostRunsOnTheProgressThread) {
  auto t = make_transport("tcp");
  ASSERT_TRUE(t);
  std::promise<std::thread::id> where;
  t->post([&] { where.set_value(std::this_thread::get_id()); });
  auto f = where.get_future();
  ASSERT_EQ(f.wait_for(kWaitBound), std::future_status::ready);
  EXPECT_NE(f.get(), std::this_thread::get_id());
}

}  // namespace
}  // namespace strata
