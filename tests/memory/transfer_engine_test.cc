#include "memory/transfer_engine.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "memory/host_kv_pool.h"
#include "memory/kv_pool.h"
#include "memory_test_util.h"

namespace strata {
namespace {

constexpr int32_t kPages = 64;

KvPoolShape test_shape() {
  return KvPoolShape{4, 2, 8, kPages, 16, KvDtype::kBF16};
}

// Device page i goes to host page kPages - 1 - i, two pages a job.
TransferJob to_host_job(int32_t first) {
  return TransferJob{TransferDirection::kDeviceToHost, pages({first, first + 1}),
                     pages({kPages - 1 - first, kPages - 2 - first})};
}

TransferJob to_device_job(int32_t first, bool layer_by_layer = false) {
  return TransferJob{TransferDirection::kHostToDevice, pages({first, first + 1}),
                     pages({kPages - 1 - first, kPages - 2 - first}), layer_by_layer};
}

class TransferEngineTest : public testing::TestWithParam<HostLayout> {
 protected:
  TransferEngineTest()
      : source_(test_shape()),
        restored_(test_shape()),
        host_(std::move(*HostKvPool::create(test_shape(), GetParam()))) {
    fill_random(source_, 17);
  }

  // Every device page of `restored_` equals the same page of `source_`.
  void expect_restored() const {
    for (int32_t p = 0; p < kPages; ++p) {
      ASSERT_EQ(device_page(restored_, make_page_id(p)), device_page(source_, make_page_id(p)))
          << "page " << p;
    }
  }

  KvPool source_;
  KvPool restored_;
  std::unique_ptr<HostKvPool> host_;
};

TEST_P(TransferEngineTest, ManyJobsFromOneThreadLandByteIdentical) {
  std::vector<TransferTicket> tickets;
  {
    TransferEngine out(source_, *host_);
    for (int32_t first = 0; first < kPages; first += 2)
      tickets.push_back(out.submit(to_host_job(first)));
    for (TransferTicket t : tickets) out.wait(t);
    for (int32_t p = 0; p < kPages; ++p) {
      ASSERT_EQ(host_page(*host_, make_page_id(kPages - 1 - p)),
                device_page(source_, make_page_id(p)));
    }
    const std::vector<TransferTicket> completed = out.take_completed();
    EXPECT_EQ(std::set(completed.begin(), completed.end()),
              std::set(tickets.begin(), tickets.end()));
    EXPECT_EQ(completed.size(), tickets.size());
    const TransferEngine::Stats stats = out.stats();
    EXPECT_EQ(stats.jobs, tickets.size());
    EXPECT_EQ(stats.pages_to_host, static_cast<uint64_t>(kPages));
    EXPECT_EQ(stats.bytes_to_host, kPages * host_->page_bytes());
    EXPECT_EQ(stats.pages_to_device, 0u);
    EXPECT_GE(stats.busy_seconds, 0.0);
  }
  TransferEngine in(restored_, *host_);
  tickets.clear();
  for (int32_t first = 0; first < kPages; first += 2) {
    tickets.push_back(in.submit(to_device_job(first, first % 4 == 0)));
  }
  for (TransferTicket t : tickets) in.wait(t);
  expect_restored();
  EXPECT_EQ(in.stats().pages_to_device, static_cast<uint64_t>(kPages));
  EXPECT_EQ(in.stats().bytes_to_device, kPages * host_->page_bytes());
}

TEST_P(TransferEngineTest, DoneWaitAndTakeCompletedSemantics) {
  TransferEngine engine(source_, *host_);
  const TransferTicket a = engine.submit(to_host_job(0));
  const TransferTicket b = engine.submit(to_host_job(2));
  EXPECT_NE(a, b);
  engine.wait(b);
  // One copy thread runs jobs in submission order: a landed before b.
  EXPECT_TRUE(engine.done(a));
  EXPECT_TRUE(engine.done(b));
  std::vector<TransferTicket> completed = engine.take_completed();
  EXPECT_EQ(completed, (std::vector<TransferTicket>{a, b}));
  EXPECT_TRUE(engine.take_completed().empty());
  // Taken tickets stay done, and waiting for them returns at once.
  EXPECT_TRUE(engine.done(a));
  engine.wait(a);
  engine.wait_layer(b, 0);

  // Collect by polling alone, as the scheduler does.
  const TransferTicket c = engine.submit(to_host_job(4));
  std::vector<TransferTicket> polled;
  while (polled.empty()) {
    polled = engine.take_completed();
    if (polled.empty()) std::this_thread::yield();
  }
  EXPECT_EQ(polled, std::vector<TransferTicket>{c});
  EXPECT_TRUE(engine.done(c));
  EXPECT_EQ(host_page(*host_, make_page_id(kPages - 5)), device_page(source_, make_page_id(4)));
}

TEST_P(TransferEngineTest, WaitLayerSeesEachLayerLand) {
  TransferEngine out(source_, *host_);
  std::vector<TransferTicket> tickets;
  for (int32_t first = 0; first < kPages; first += 2)
    tickets.push_back(out.submit(to_host_job(first)));
  for (TransferTicket t : tickets) out.wait(t);

  TransferEngine in(restored_, *host_);
  const std::vector<PageId> dev = pages({0, 1, 2, 3, 4, 5, 6, 7});
  const std::vector<PageId> hst = pages({kPages - 1, kPages - 2, kPages - 3, kPages - 4, kPages - 5,
                                         kPages - 6, kPages - 7, kPages - 8});
  const TransferTicket t = in.submit(TransferJob{TransferDirection::kHostToDevice, dev, hst, true});
  Bytes got(restored_.layer_page_bytes()), want(restored_.layer_page_bytes());
  for (int32_t layer = 0; layer < restored_.num_layers(); ++layer) {
    in.wait_layer(t, layer);
    // Layers [0, layer] are final; later layers may still be in flight, so not read.
    for (PageId page : dev) {
      for (int32_t l = 0; l <= layer; ++l) {
        restored_.copy_layer_page_out(l, page, got);
        source_.copy_layer_page_out(l, page, want);
        ASSERT_EQ(got, want) << "after wait_layer(" << layer << "), layer " << l;
      }
    }
  }
  in.wait(t);
  EXPECT_TRUE(in.done(t));

  // For a whole-page job, wait_layer waits for the whole job.
  const TransferTicket whole = in.submit(to_device_job(8));
  in.wait_layer(whole, 0);
  EXPECT_TRUE(in.done(whole));
  EXPECT_EQ(device_page(restored_, make_page_id(9)), device_page(source_, make_page_id(9)));
}

TEST_P(TransferEngineTest, DestructorFinishesQueuedJobs) {
  {
    TransferEngine out(source_, *host_);
    for (int32_t first = 0; first < kPages; first += 2) out.submit(to_host_job(first));
  }
  {
    TransferEngine in(restored_, *host_);
    for (int32_t first = 0; first < kPages; first += 2) in.submit(to_device_job(first, true));
  }
  expect_restored();
}

TEST_P(TransferEngineTest, TwoCopyThreadsMoveDistinctPagesByteIdentical) {
  std::vector<TransferTicket> tickets;
  TransferEngine out(source_, *host_, 2);
  for (int32_t first = 0; first < kPages; first += 2)
    tickets.push_back(out.submit(to_host_job(first)));
  for (TransferTicket t : tickets) out.wait(t);
  EXPECT_EQ(out.take_completed().size(), tickets.size());

  TransferEngine in(restored_, *host_, 2);
  std::set<TransferTicket> left;
  for (int32_t first = 0; first < kPages; first += 2) {
    left.insert(in.submit(to_device_job(first, first % 4 == 2)));
  }
  // Drain by polling and waiting alternately.
  while (!left.empty()) {
    for (TransferTicket t : in.take_completed()) ASSERT_EQ(left.erase(t), 1u);
    if (!left.empty()) in.wait(*left.begin());
  }
  expect_restored();
  EXPECT_EQ(in.stats().jobs, static_cast<uint64_t>(kPages / 2));
  EXPECT_EQ(in.stats().pages_to_device, static_cast<uint64_t>(kPages));
}

TEST_P(TransferEngineTest, OneCopyThreadRunsJobsInSubmissionOrder) {
  // host page 63 <- device 0; device 5 <- host 63; host 10 <- device 5: each job reads
  // what the previous one wrote.
  TransferEngine engine(source_, *host_);
  engine.submit(TransferJob{TransferDirection::kDeviceToHost, pages({0}), pages({63})});
  engine.submit(TransferJob{TransferDirection::kHostToDevice, pages({5}), pages({63}), true});
  const TransferTicket last =
      engine.submit(TransferJob{TransferDirection::kDeviceToHost, pages({5}), pages({10})});
  const Bytes expected = device_page(source_, make_page_id(0));
  engine.wait(last);
  EXPECT_EQ(host_page(*host_, make_page_id(10)), expected);
}

INSTANTIATE_TEST_SUITE_P(AllLayouts, TransferEngineTest,
                         testing::Values(HostLayout::kLayerFirst, HostLayout::kPageFirst,
                                         HostLayout::kPageFirstDirect),
                         [](const testing::TestParamInfo<HostLayout>& info) {
                           return std::string(host_layout_name(info.param));
                         });

TEST(TransferEngineDeathTest, BadJobsFailOnTheCallersThread) {
  testing::FLAGS_gtest_death_test_style = "threadsafe";
  const KvPoolShape shape{1, 1, 4, 4, 2, KvDtype::kF32};
  KvPool device(shape);
  auto host = HostKvPool::create(shape, HostLayout::kLayerFirst);
  ASSERT_TRUE(host.has_value());
  EXPECT_DEATH(
      {
        TransferEngine engine(device, **host);
        engine.submit(TransferJob{TransferDirection::kDeviceToHost, pages({0, 1}), pages({0})});
      },
      "transfer job with 2 device pages and 1 host pages");
  EXPECT_DEATH(
      {
        TransferEngine engine(device, **host);
        engine.submit(TransferJob{TransferDirection::kHostToDevice, pages({0}), pages({4})});
      },
      "host page 4");
  EXPECT_DEATH(
      {
        TransferEngine engine(device, **host);
        engine.done(99);
      },
      "never issued");
}

// A load waits for no backup it does not depend on: one copy thread, twenty queued
// backups of 4 MiB each, then a load of other pages: it lands second (right after the
// backup already running), and the backups still all land.
TEST(TransferEngineOrderTest, ALoadGoesAheadOfQueuedBackupsItDoesNotDependOn) {
  const KvPoolShape shape{32, 8, 128, 64, 16, KvDtype::kBF16};  // 2 MiB a page
  KvPool device(shape);
  auto host = HostKvPool::create(shape, HostLayout::kLayerFirst);
  ASSERT_TRUE(host.has_value());
  TransferEngine engine(device, **host);
  std::vector<TransferTicket> backups;
  for (int32_t first = 0; first < 40; first += 2) {
    backups.push_back(engine.submit(TransferJob{
        TransferDirection::kDeviceToHost, pages({first, first + 1}), pages({first, first + 1})}));
  }
  const TransferTicket load = engine.submit(
      TransferJob{TransferDirection::kHostToDevice, pages({60, 61}), pages({60, 61})});
  // A load that reads a page a queued backup writes stays behind that backup.
  const TransferTicket dependent = engine.submit(
      TransferJob{TransferDirection::kHostToDevice, pages({62, 63}), pages({38, 39})});
  engine.wait(backups.back());
  engine.wait(load);
  engine.wait(dependent);
  const std::vector<TransferTicket> order = engine.take_completed();
  ASSERT_EQ(order.size(), backups.size() + 2);
  const auto at = [&](TransferTicket t) {
    return std::find(order.begin(), order.end(), t) - order.begin();
  };
  EXPECT_LE(at(load), 1);
  EXPECT_GT(at(dependent), at(backups.back()));
}

}  // namespace
}  // namespace strata
