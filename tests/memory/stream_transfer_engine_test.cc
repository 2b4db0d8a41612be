#include "memory/stream_transfer_engine.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <random>
#include <set>
#include <vector>

#include "fake_copy_device.h"
#include "memory/host_kv_pool.h"
#include "memory/kv_pool.h"
#include "memory_test_util.h"

namespace strata {
namespace {

constexpr int32_t kStreamPages = 32;
constexpr int32_t kStreamLayers = 4;

KvPoolShape stream_shape() {
  return KvPoolShape{kStreamLayers, 2, 8, kStreamPages, 16, KvDtype::kBF16};
}

TransferJob backup(std::vector<PageId> device, std::vector<PageId> host) {
  return TransferJob{TransferDirection::kDeviceToHost, std::move(device), std::move(host)};
}
TransferJob load(std::vector<PageId> device, std::vector<PageId> host, bool by_layer = false) {
  return TransferJob{TransferDirection::kHostToDevice, std::move(device), std::move(host),
                     by_layer};
}

// The device pool is ordinary memory here (KvPool): the fake device copies with memcpy what
// a GPU would copy with its DMA engines, between the same block addresses.
class StreamTransferEngineTest : public testing::TestWithParam<HostLayout> {
 protected:
  StreamTransferEngineTest()
      : device_pool_(stream_shape()),
        host_(std::move(*HostKvPool::create(stream_shape(), GetParam()))),
        engine_(std::make_unique<StreamTransferEngine>(
            copies_, device_pool_.block_layout(), *host_->block_layout(),
            StreamTransferOptions{.stall_timeout_ms = 1000}, clock_)) {
    fill_random(device_pool_, 7);
  }

  bool landed(TransferTicket t) {
    for (const TransferOutcome& o : outcomes_) {
      if (o.ticket == t && o.result == TransferResult::kLanded) return true;
    }
    return false;
  }
  void poll() {
    for (TransferOutcome& o : engine_->take_completed()) outcomes_.push_back(std::move(o));
  }

  ManualClock clock_;
  FakeCopyDevice copies_;
  KvPool device_pool_;
  std::unique_ptr<HostKvPool> host_;
  std::unique_ptr<StreamTransferEngine> engine_;
  std::vector<TransferOutcome> outcomes_;
};

TEST_P(StreamTransferEngineTest, BytesBackedUpAndLoadedBackEqualTheOriginals) {
  const Bytes page3 = device_page(device_pool_, make_page_id(3));
  const Bytes page9 = device_page(device_pool_, make_page_id(9));
  const TransferTicket up = engine_->submit(backup(pages({3, 9}), pages({20, 5})));
  copies_.land_all();
  ASSERT_TRUE(engine_->done(up));
  EXPECT_EQ(host_page(*host_, make_page_id(20)), page3);
  EXPECT_EQ(host_page(*host_, make_page_id(5)), page9);

  // Loaded into other device pages, whole and layer by layer.
  const TransferTicket down = engine_->submit(load(pages({0}), pages({20})));
  const TransferTicket by_layer = engine_->submit(load(pages({1}), pages({5}), true));
  copies_.land_all();
  EXPECT_TRUE(engine_->wait(down));
  EXPECT_TRUE(engine_->wait(by_layer));
  EXPECT_EQ(device_page(device_pool_, make_page_id(0)), page3);
  EXPECT_EQ(device_page(device_pool_, make_page_id(1)), page9);

  poll();
  ASSERT_EQ(outcomes_.size(), 3u);
  for (const TransferOutcome& o : outcomes_) EXPECT_EQ(o.result, TransferResult::kLanded);
  const auto s = engine_->stats();
  EXPECT_EQ(s.jobs, 3u);
  EXPECT_EQ(s.pages_to_host, 2u);
  EXPECT_EQ(s.pages_to_device, 2u);
  EXPECT_EQ(s.bytes_to_device, 2 * device_pool_.page_bytes());
  EXPECT_EQ(engine_->in_flight(), 0u);
  EXPECT_EQ(copies_.live_events(), 0u);
}

TEST_P(StreamTransferEngineTest, NothingIsDoneBeforeTheDeviceSaysSoAndEachJobIsListedOnce) {
  const TransferTicket t = engine_->submit(backup(pages({1, 2}), pages({3, 4})));
  EXPECT_FALSE(engine_->done(t));
  poll();
  EXPECT_TRUE(outcomes_.empty());
  EXPECT_EQ(engine_->in_flight(), 1u);
  // The host pages are untouched until the copy lands (they hold zeros).
  EXPECT_EQ(host_page(*host_, make_page_id(3)), Bytes(host_->page_bytes()));

  ASSERT_TRUE(copies_.land(CopyQueue::kBackup));
  poll();
  ASSERT_EQ(outcomes_.size(), 1u);
  EXPECT_TRUE(landed(t));
  poll();
  EXPECT_EQ(outcomes_.size(), 1u);  // once
  EXPECT_TRUE(engine_->done(t));    // and still done
  EXPECT_TRUE(engine_->wait(t));
}

TEST_P(StreamTransferEngineTest, ALoadDoesNotQueueBehindBackups) {
  const TransferTicket up = engine_->submit(backup(pages({1, 2}), pages({3, 4})));
  const TransferTicket down = engine_->submit(load(pages({10}), pages({11})));
  // The load has its own queue: it lands while the backup has not even started.
  ASSERT_TRUE(copies_.land(CopyQueue::kLoad));
  EXPECT_TRUE(engine_->done(down));
  EXPECT_FALSE(engine_->done(up));
  copies_.land_all();
  EXPECT_TRUE(engine_->done(up));
}

TEST_P(StreamTransferEngineTest, AJobThatSharesAPageWithTheOtherQueueStartsAfterIt) {
  const Bytes original = device_page(device_pool_, make_page_id(2));
  // Back device page 2 up to host page 7, then (before it has landed) reuse device page 2
  // for a load of host page 8: the load must not overwrite page 2 before the backup read it.
  const TransferTicket up = engine_->submit(backup(pages({2}), pages({7})));
  const TransferTicket down = engine_->submit(load(pages({2}), pages({8})));
  EXPECT_FALSE(copies_.land(CopyQueue::kLoad));  // held back by the device, not the caller
  EXPECT_FALSE(engine_->done(down));
  ASSERT_TRUE(copies_.land(CopyQueue::kBackup));
  ASSERT_TRUE(copies_.land(CopyQueue::kLoad));
  EXPECT_TRUE(engine_->done(up));
  EXPECT_TRUE(engine_->done(down));
  EXPECT_EQ(host_page(*host_, make_page_id(7)), original);
  EXPECT_EQ(device_page(device_pool_, make_page_id(2)), host_page(*host_, make_page_id(8)));

  // The same for a host page: a backup into host page 8 waits for the load that reads it.
  const TransferTicket read = engine_->submit(load(pages({5}), pages({8})));
  const TransferTicket write = engine_->submit(backup(pages({6}), pages({8})));
  EXPECT_FALSE(copies_.land(CopyQueue::kBackup));
  copies_.land_all();
  EXPECT_TRUE(engine_->done(read));
  EXPECT_TRUE(engine_->done(write));
}

TEST_P(StreamTransferEngineTest, AJobWaitsForTheConflictingJobsInFlightOnly) {
  // Twelve backups in flight on pages of their own; a load whose only shared page is the
  // host page of the eighth waits for that one (and, on its queue, those before it), not for
  // the four after it.
  std::vector<TransferTicket> ups;
  for (int32_t j = 0; j < 12; ++j) ups.push_back(engine_->submit(backup(pages({j}), pages({j}))));
  const TransferTicket down = engine_->submit(load(pages({20}), pages({7})));
  for (int32_t j = 0; j < 7; ++j) ASSERT_TRUE(copies_.land(CopyQueue::kBackup)) << j;
  EXPECT_FALSE(copies_.land(CopyQueue::kLoad));
  ASSERT_TRUE(copies_.land(CopyQueue::kBackup));  // the eighth
  EXPECT_TRUE(copies_.land(CopyQueue::kLoad));
  EXPECT_TRUE(engine_->done(down));
  EXPECT_FALSE(engine_->done(ups[8]));

  // A job that has resolved orders nothing: a load of its page starts at once.
  EXPECT_TRUE(engine_->done(ups[0]));
  const TransferTicket again = engine_->submit(load(pages({0}), pages({21})));
  EXPECT_TRUE(copies_.land(CopyQueue::kLoad));
  EXPECT_TRUE(engine_->done(again));
  copies_.land_all();
  for (TransferTicket t : ups) EXPECT_TRUE(engine_->done(t));
}

TEST_P(StreamTransferEngineTest, ALayerByLayerLoadLetsComputeWaitForEachLayer) {
  const uint64_t batches_before = copies_.batches();
  const TransferTicket t = engine_->submit(load(pages({4, 5}), pages({1, 2}), true));
  EXPECT_EQ(copies_.batches() - batches_before, static_cast<uint64_t>(kStreamLayers));
  const auto& queued = copies_.queued(CopyQueue::kLoad);
  ASSERT_EQ(queued.size(), static_cast<size_t>(kStreamLayers));
  std::vector<CopyEvent> layer_events;
  for (const auto& b : queued) layer_events.push_back(b.event);

  // Compute waits for the event of the layer it needs, not for the whole load, and the
  // caller does not block: nothing has landed yet.
  for (int32_t l = 0; l < kStreamLayers; ++l) EXPECT_TRUE(engine_->wait_layer(t, l));
  EXPECT_EQ(copies_.compute_waits(), layer_events);
  EXPECT_FALSE(engine_->done(t));

  // Layer 0 landed: layer 1 has not.
  ASSERT_TRUE(copies_.land(CopyQueue::kLoad));
  EXPECT_FALSE(engine_->done(t));
  copies_.land_all();
  EXPECT_TRUE(engine_->done(t));
}

TEST_P(StreamTransferEngineTest, AnOpenLayerWaitKeepsItsEventsPastTheJobsResolution) {
  // The forward thread's wait (KvTransfers::layer_wait) names the job's events; the job may
  // resolve and be reported while the pass still runs, so its events are released only at
  // end_layer_wait.
  const TransferTicket t = engine_->submit(load(pages({6, 7}), pages({3, 4}), true));
  std::vector<CopyEvent> layer_events;
  for (const auto& b : copies_.queued(CopyQueue::kLoad)) layer_events.push_back(b.event);
  ASSERT_EQ(layer_events.size(), static_cast<size_t>(kStreamLayers));
  const LayerWait wait = engine_->layer_wait(t);
  EXPECT_TRUE(wait(0));
  EXPECT_TRUE(wait(1));
  copies_.land_all();
  poll();
  EXPECT_TRUE(landed(t));
  EXPECT_EQ(copies_.live_events(), layer_events.size());  // held for the open wait
  // Used after the job resolved: still live events (the fake checks), each layer its own.
  EXPECT_TRUE(wait(2));
  EXPECT_TRUE(wait(kStreamLayers - 1));
  EXPECT_EQ(copies_.compute_waits(),
            (std::vector<CopyEvent>{layer_events[0], layer_events[1], layer_events[2],
                                    layer_events[static_cast<size_t>(kStreamLayers - 1)]}));
  engine_->end_layer_wait(t);
  EXPECT_EQ(copies_.live_events(), 0u);

  // Closed before the job resolves: the events go when it does, as for any job.
  const TransferTicket u = engine_->submit(load(pages({8}), pages({9}), true));
  const LayerWait early = engine_->layer_wait(u);
  EXPECT_TRUE(early(0));
  engine_->end_layer_wait(u);
  EXPECT_EQ(copies_.live_events(), static_cast<size_t>(kStreamLayers));
  copies_.land_all();
  poll();
  EXPECT_TRUE(landed(u));
  EXPECT_EQ(copies_.live_events(), 0u);

  // A job already resolved, or refused, gets a wait that names no event.
  const size_t waits = copies_.compute_waits().size();
  EXPECT_TRUE(engine_->layer_wait(u)(0));
  engine_->end_layer_wait(u);
  copies_.refuse_next_enqueue();
  const TransferTicket refused = engine_->submit(load(pages({10}), pages({11}), true));
  EXPECT_TRUE(engine_->layer_wait(refused)(0));
  engine_->end_layer_wait(refused);
  EXPECT_EQ(copies_.compute_waits().size(), waits);
  poll();
}

TEST_P(StreamTransferEngineTest, AWholeJobIsOneBatchOfMergedSpans) {
  // Four consecutive device pages to four consecutive host pages.
  const uint64_t before = copies_.batches();
  engine_->submit(backup(pages({8, 9, 10, 11}), pages({12, 13, 14, 15})));
  EXPECT_EQ(copies_.batches() - before, 1u);
  const auto& batch = copies_.queued(CopyQueue::kBackup).back();
  // layer_first: one span per layer and K/V (the pages are adjacent on both sides);
  // page_first_direct: one span per page and layer... and adjacent K/V blocks on the host
  // side are not adjacent on the device side, so one per block.
  const size_t blocks = 4u * 2u * kStreamLayers;
  if (GetParam() == HostLayout::kLayerFirst) {
    EXPECT_EQ(batch.spans.size(), 2u * kStreamLayers);
  } else {
    EXPECT_EQ(batch.spans.size(), blocks);
  }
  size_t bytes = 0;
  for (const CopySpan& s : batch.spans) bytes += s.bytes;
  EXPECT_EQ(bytes, 4 * device_pool_.page_bytes());
  copies_.land_all();
  poll();
}

TEST_P(StreamTransferEngineTest, AFailedCopyFailsItsJobOnly) {
  const TransferTicket ok1 = engine_->submit(backup(pages({1}), pages({1})));
  copies_.fail_next_batch();
  const TransferTicket bad = engine_->submit(backup(pages({2}), pages({2})));
  const TransferTicket ok2 = engine_->submit(load(pages({3}), pages({3})));
  copies_.land_all();
  EXPECT_TRUE(engine_->wait(ok1));
  EXPECT_FALSE(engine_->wait(bad));
  EXPECT_TRUE(engine_->wait(ok2));
  poll();
  ASSERT_EQ(outcomes_.size(), 3u);
  EXPECT_TRUE(landed(ok1));
  EXPECT_TRUE(landed(ok2));
  const auto failed = std::find_if(outcomes_.begin(), outcomes_.end(),
                                   [&](const TransferOutcome& o) { return o.ticket == bad; });
  ASSERT_NE(failed, outcomes_.end());
  EXPECT_EQ(failed->result, TransferResult::kFailed);
  EXPECT_NE(failed->error.find("copy failed"), std::string::npos) << failed->error;
  EXPECT_TRUE(engine_->wait(bad));  // taken: the outcome was the answer (the header says so)
  EXPECT_EQ(engine_->stats().failed, 1u);
  EXPECT_EQ(engine_->stats().pages_to_host, 1u);
  EXPECT_EQ(copies_.live_events(), 0u);
}

TEST_P(StreamTransferEngineTest, ARefusedBatchFailsItsJobAndNothingElse) {
  copies_.refuse_next_enqueue();
  const TransferTicket refused = engine_->submit(load(pages({1}), pages({1}), true));
  const TransferTicket next = engine_->submit(load(pages({2}), pages({2}), true));
  EXPECT_FALSE(engine_->wait_layer(refused, 0));
  EXPECT_TRUE(engine_->wait_layer(next, 0));
  EXPECT_TRUE(engine_->done(refused));
  poll();
  copies_.land_all();
  poll();
  ASSERT_EQ(outcomes_.size(), 2u);
  EXPECT_EQ(outcomes_[0].ticket, refused);
  EXPECT_EQ(outcomes_[0].result, TransferResult::kFailed);
  EXPECT_NE(outcomes_[0].error.find("refused"), std::string::npos) << outcomes_[0].error;
  EXPECT_TRUE(landed(next));
}

TEST_P(StreamTransferEngineTest, AStalledJobIsReportedOnceAndHoldsItsPagesUntilItResolves) {
  engine_->submit(backup(pages({1}), pages({1})));
  clock_.advance_ms(999);
  poll();
  EXPECT_TRUE(outcomes_.empty());
  clock_.advance_ms(1);
  poll();
  ASSERT_EQ(outcomes_.size(), 1u);
  EXPECT_EQ(outcomes_[0].result, TransferResult::kStalled);
  clock_.advance_ms(5000);
  poll();
  EXPECT_EQ(outcomes_.size(), 1u);  // reported once
  EXPECT_EQ(engine_->in_flight(), 1u);
  EXPECT_EQ(copies_.live_events(), 1u);  // still the device's
  copies_.land_all();
  poll();
  ASSERT_EQ(outcomes_.size(), 2u);
  EXPECT_EQ(outcomes_[1].result, TransferResult::kLanded);
  EXPECT_EQ(engine_->stats().stalled, 1u);
}

TEST_P(StreamTransferEngineTest, DestroyingTheEngineWaitsForTheCopiesInFlight) {
  engine_->submit(backup(pages({1, 2}), pages({3, 4})));
  engine_->submit(load(pages({5}), pages({6}), true));
  EXPECT_GT(copies_.live_events(), 0u);
  engine_.reset();
  EXPECT_EQ(copies_.live_events(), 0u);
  EXPECT_TRUE(copies_.queued(CopyQueue::kLoad).empty());
  EXPECT_TRUE(copies_.queued(CopyQueue::kBackup).empty());
}

// Random jobs landed in a random order the device allows, against a model of each page's
// bytes: whatever the interleaving, every page ends as the jobs, in submission order per
// page, say.
TEST_P(StreamTransferEngineTest, RandomJobsInAnyOrderEndAsTheReferenceSays) {
  std::mt19937 gen(11);
  KvPool reference_device(stream_shape());
  auto reference_host = std::move(*HostKvPool::create(stream_shape(), GetParam()));
  for (int32_t p = 0; p < kStreamPages; ++p) {
    reference_device.copy_page_in(make_page_id(p), device_page(device_pool_, make_page_id(p)));
  }
  Bytes buf(device_pool_.page_bytes());
  for (int round = 0; round < 200; ++round) {
    const bool to_host = gen() % 2 == 0;
    std::vector<int32_t> dev(kStreamPages), host(kStreamPages);
    for (int32_t i = 0; i < kStreamPages; ++i)
      dev[static_cast<size_t>(i)] = host[static_cast<size_t>(i)] = i;
    std::shuffle(dev.begin(), dev.end(), gen);
    std::shuffle(host.begin(), host.end(), gen);
    const size_t n = 1 + gen() % 4;
    TransferJob job{to_host ? TransferDirection::kDeviceToHost : TransferDirection::kHostToDevice,
                    {},
                    {},
                    !to_host && gen() % 2 == 0};
    for (size_t i = 0; i < n; ++i) {
      job.device_pages.push_back(make_page_id(dev[i]));
      job.host_pages.push_back(make_page_id(host[i]));
      // The reference applies the job at once, in submission order.
      if (to_host) {
        reference_device.copy_page_out(make_page_id(dev[i]), buf);
        reference_host->write_page(make_page_id(host[i]), buf);
      } else {
        reference_host->read_page(make_page_id(host[i]), buf);
        reference_device.copy_page_in(make_page_id(dev[i]), buf);
      }
    }
    engine_->submit(std::move(job));
    // Land a random number of batches from random queues.
    for (uint32_t k = gen() % 4; k > 0; --k) {
      copies_.land(gen() % 2 == 0 ? CopyQueue::kLoad : CopyQueue::kBackup);
    }
    if (gen() % 8 == 0) poll();
  }
  copies_.land_all();
  poll();
  EXPECT_EQ(engine_->in_flight(), 0u);
  for (int32_t p = 0; p < kStreamPages; ++p) {
    EXPECT_EQ(device_page(device_pool_, make_page_id(p)),
              device_page(reference_device, make_page_id(p)))
        << "device page " << p;
    EXPECT_EQ(host_page(*host_, make_page_id(p)), host_page(*reference_host, make_page_id(p)))
        << "host page " << p;
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, StreamTransferEngineTest,
                         testing::Values(HostLayout::kLayerFirst, HostLayout::kPageFirstDirect),
                         [](const testing::TestParamInfo<HostLayout>& info) {
                           return std::string(host_layout_name(info.param));
                         });

TEST(KvBlockLayoutTest, BlocksAreWhereThePoolsPutThem) {
  KvPool pool(stream_shape());
  const KvBlockLayout l = pool.block_layout();
  EXPECT_EQ(l.block(2, make_page_id(5), 0), pool.k_block(2, make_page_id(5)));
  EXPECT_EQ(l.block(3, make_page_id(0), 1), pool.v_block(3, make_page_id(0)));
  EXPECT_TRUE(l.pages_adjacent());
  for (HostLayout layout : {HostLayout::kLayerFirst, HostLayout::kPageFirstDirect}) {
    auto host = std::move(*HostKvPool::create(stream_shape(), layout));
    const auto hl = host->block_layout();
    ASSERT_TRUE(hl.has_value());
    // A page written through the canonical buffer reads back from the layout's blocks:
    // [layer][K block][V block].
    Bytes page(host->page_bytes());
    for (size_t i = 0; i < page.size(); ++i) page[i] = static_cast<std::byte>(i * 7 + 3);
    host->write_page(make_page_id(6), page);
    for (int32_t layer = 0; layer < kStreamLayers; ++layer) {
      for (int kv = 0; kv < 2; ++kv) {
        const std::byte* b = hl->block(layer, make_page_id(6), kv);
        const size_t at =
            (static_cast<size_t>(layer) * 2 + static_cast<size_t>(kv)) * hl->block_bytes;
        EXPECT_TRUE(
            std::equal(b, b + hl->block_bytes, page.begin() + static_cast<std::ptrdiff_t>(at)))
            << host_layout_name(layout) << " layer " << layer << " kv " << kv;
      }
    }
  }
  auto page_first = std::move(*HostKvPool::create(stream_shape(), HostLayout::kPageFirst));
  EXPECT_FALSE(page_first->block_layout().has_value());
}

}  // namespace
}  // namespace strata
