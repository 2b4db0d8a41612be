// Prefill/decode disaggregation end to end inside one process: a prefill engine and a
// decode engine over a real control plane (ZeroMQ on loopback) and a real data plane (UCX
// over tcp, or the file store), against a colocated engine's greedy output; and the
// faults: an unknown or dead prefill worker, a rejected order, a stalled room, a
// cancelled request, forged messages. Every test ends with page audits on both sides.
#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "../engine/engine_test_util.h"
#include "engine/engine.h"
#include "engine/engine_test_access.h"
#include "model/make_model.h"
#include "pd/pd_channel.h"
#include "pd_test_util.h"

namespace strata {
namespace {

using namespace std::chrono_literals;

constexpr const char* kLayout = "test-layout;tiny";

class PdEngineTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    setenv("UCX_TLS", "tcp", 0);
    // One model per engine: a Model serves one forward pass at a time (model.h).
    for (auto& m : models_) {
      auto model = make_preset_model(ModelPreset::kTiny, Architecture::kLlama, 7,
                                     ModelOptions{.num_threads = 1});
      ASSERT_TRUE(model.has_value()) << model.error().message;
      m = std::move(*model);
    }
    store_dir_ = std::filesystem::temp_directory_path() /
                 ("strata-pd-test-" + std::to_string(::getpid()) + "-" +
                  std::to_string(reinterpret_cast<uintptr_t>(this)));
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(store_dir_, ec);
  }

  EngineOptions base() const { return pd_test_options(GetParam(), store_dir_, kLayout, 1024); }

  std::unique_ptr<Engine> start(EngineOptions o) {
    if (put_) o.pd.ucx_data_path = "put";
    EXPECT_LT(engines_made_, models_.size());
    auto e = Engine::create(models_[engines_made_++ % models_.size()].get(), o, nullptr);
    EXPECT_TRUE(e.has_value()) << (e ? "" : e.error().message);
    return e ? std::move(*e) : nullptr;
  }

  std::unique_ptr<Engine> start_prefill(EngineOptions o) {
    o.pd.role = WorkerRole::kPrefill;
    o.pd.worker_id = "prefill-1";
    o.pd.bind = "tcp://127.0.0.1:0";
    return start(o);
  }

  std::unique_ptr<Engine> start_decode(const std::string& endpoint, EngineOptions o) {
    o.pd.role = WorkerRole::kDecode;
    o.pd.worker_id = "decode-1";
    o.pd.prefill_peers = {endpoint};
    return start(o);
  }

  // Waits until the decode engine sees `peer` alive.
  static bool wait_peer(Engine& decode, const std::string& peer) {
    for (int i = 0; i < 400; ++i) {
      for (const auto& p : decode.pd_info().peers_alive) {
        if (p == peer) return true;
      }
      std::this_thread::sleep_for(10ms);
    }
    return false;
  }

  static Outcome run(Engine& e, std::vector<int32_t> prompt, int32_t max_tokens,
                     const std::string& peer = "prefill-1") {
    RequestSpec spec;
    spec.prompt = std::move(prompt);
    spec.sampling.temperature = 0;
    spec.max_tokens = max_tokens;
    spec.prefill_peer = peer;
    auto stream = e.submit(std::move(spec));
    EXPECT_TRUE(stream.has_value());
    return stream ? drain(**stream) : Outcome{};
  }

  static void expect_audited(Engine& e) { expect_pd_audited(e); }

  std::array<std::unique_ptr<Model>, 3> models_;
  size_t engines_made_ = 0;
  std::filesystem::path store_dir_;
  bool put_ = false;  // UCX one-sided puts instead of messages
};

TEST_P(PdEngineTest, GreedyOutputEqualsColocatedForSeveralLengths) {
  auto colocated = start(base());
  auto prefill = start_prefill(base());
  ASSERT_TRUE(colocated && prefill);
  const std::string endpoint = prefill->pd_info().endpoint;
  ASSERT_FALSE(endpoint.empty());
  auto decode = start_decode(endpoint, base());
  ASSERT_TRUE(decode);
  ASSERT_TRUE(wait_peer(*decode, "prefill-1"));
  int salt = 100;
  for (int n : {1, 3, 4, 5, 16, 37, 64, 101}) {
    const auto prompt = test_prompt(n, ++salt);
    Outcome want = run_greedy(*colocated, prompt, 12);
    Outcome got = run(*decode, prompt, 12);
    EXPECT_EQ(got.tokens, want.tokens) << "prompt of " << n << " tokens";
    EXPECT_EQ(got.reason, want.reason);
    EXPECT_TRUE(got.usage.kv_transferred) << n;
    EXPECT_EQ(got.usage.kv_transfer_tokens, n) << n;
    EXPECT_GT(got.usage.kv_transfer_bytes, 0);
  }
  const EngineCounters dc = decode->counters();
  EXPECT_EQ(dc.pd_rooms_done, 8u);
  EXPECT_EQ(dc.pd_rooms_ordered, 8u);
  // The prefill engine publishes its counters after the iteration that sent PrefillDone.
  EngineCounters pc = prefill->counters();
  for (int i = 0; i < 200 && pc.pd_orders_done < 8; ++i) {
    std::this_thread::sleep_for(5ms);
    pc = prefill->counters();
  }
  EXPECT_EQ(pc.pd_orders_done, 8u);
  EXPECT_EQ(pc.pd_pages_sent, dc.pd_pages_received);
  expect_audited(*decode);
  expect_audited(*prefill);
}

// Puts are a UCX data path: this suite runs over UCX only.
class PdPutTest : public PdEngineTest {};

TEST_P(PdPutTest, GreedyOutputOverOneSidedPuts) {
  put_ = true;
  auto colocated = start(base());
  auto prefill = start_prefill(base());
  auto decode = start_decode(prefill->pd_info().endpoint, base());
  ASSERT_TRUE(wait_peer(*decode, "prefill-1"));
  int salt = 300;
  for (int n : {5, 64, 101}) {
    const auto prompt = test_prompt(n, ++salt);
    Outcome want = run_greedy(*colocated, prompt, 8);
    Outcome got = run(*decode, prompt, 8);
    EXPECT_EQ(got.tokens, want.tokens) << n;
    EXPECT_TRUE(got.usage.kv_transferred) << n;
  }
  expect_audited(*decode);
  expect_audited(*prefill);
}

TEST_P(PdEngineTest, OnlyTheUncachedPartMovesAndThePrefillCacheIsUsed) {
  auto colocated = start(base());
  auto prefill = start_prefill(base());
  auto decode = start_decode(prefill->pd_info().endpoint, base());
  ASSERT_TRUE(wait_peer(*decode, "prefill-1"));
  const auto prefix = test_prompt(40, 7);
  // The decode worker holds the prefix (a local turn, no peer named).
  Outcome local = run(*decode, prefix, 1, "");
  EXPECT_FALSE(local.usage.kv_transferred);
  auto prompt = prefix;
  for (int32_t t : test_prompt(30, 8)) prompt.push_back(t);
  Outcome want = run_greedy(*colocated, prompt, 10);
  Outcome got = run(*decode, prompt, 10);
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_TRUE(got.usage.kv_transferred);
  EXPECT_EQ(got.usage.cached_tokens, 40);
  EXPECT_EQ(got.usage.kv_transfer_tokens, 70 - 40);
  // The same prompt again from another decode request: the prefill worker's own radix
  // cache holds it now, so it computes only the last token (and still sends every page).
  const uint64_t steps_before = prefill->counters().forward_steps;
  auto other = prompt;
  other.push_back(5);
  Outcome again = run(*decode, other, 4);
  EXPECT_TRUE(again.usage.kv_transferred);
  EXPECT_LE(prefill->counters().forward_steps - steps_before, 2u);
  expect_audited(*decode);
  expect_audited(*prefill);
}

TEST_P(PdEngineTest, UnknownPeerAndShortOrSaltedPromptsPrefillLocally) {
  auto colocated = start(base());
  auto prefill = start_prefill(base());
  auto decode = start_decode(prefill->pd_info().endpoint, base());
  ASSERT_TRUE(wait_peer(*decode, "prefill-1"));
  const auto prompt = test_prompt(50, 3);
  Outcome want = run_greedy(*colocated, prompt, 8);
  Outcome got = run(*decode, prompt, 8, "no-such-worker");
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_FALSE(got.usage.kv_transferred);
  EXPECT_EQ(decode->counters().pd_fallbacks[static_cast<size_t>(PdFallback::kPeerUnavailable)], 1u);
  RequestSpec salted;
  salted.prompt = test_prompt(50, 4);
  salted.sampling.temperature = 0;
  salted.max_tokens = 3;
  salted.cache_salt = "tenant";
  salted.prefill_peer = "prefill-1";
  Outcome s = drain(**decode->submit(salted));
  EXPECT_EQ(s.reason, FinishReason::kLength);
  EXPECT_FALSE(s.usage.kv_transferred);
  expect_audited(*decode);
}

TEST_P(PdEngineTest, RejectedOrderPrefillsLocally) {
  auto colocated = start(base());
  EngineOptions po = base();
  po.pd.max_queued_prefill_tokens = 10;  // every longer order is rejected
  auto prefill = start_prefill(po);
  auto decode = start_decode(prefill->pd_info().endpoint, base());
  ASSERT_TRUE(wait_peer(*decode, "prefill-1"));
  const auto prompt = test_prompt(60, 9);
  Outcome want = run_greedy(*colocated, prompt, 8);
  Outcome got = run(*decode, prompt, 8);
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_FALSE(got.usage.kv_transferred);
  EXPECT_EQ(decode->counters().pd_fallbacks[static_cast<size_t>(PdFallback::kRejected)], 1u);
  EXPECT_EQ(prefill->counters().pd_orders_rejected, 1u);
  // A short one still goes remote, and the rejection did not make the peer unusable.
  Outcome short_one = run(*decode, test_prompt(8, 10), 4);
  EXPECT_TRUE(short_one.usage.kv_transferred);
  expect_audited(*decode);
  expect_audited(*prefill);
}

TEST_P(PdEngineTest, PrefillWorkerDyingMidRoomEndsInALocalPrefillWithoutLeaks) {
  auto colocated = start(base());
  EngineOptions po = base();
  po.chunked_prefill_size = 4;  // a long prefill: one page a step
  auto prefill = start_prefill(po);
  auto decode = start_decode(prefill->pd_info().endpoint, base());
  ASSERT_TRUE(wait_peer(*decode, "prefill-1"));
  const auto prompt = test_prompt(200, 11);
  Outcome want = run_greedy(*colocated, prompt, 6);
  RequestSpec spec;
  spec.prompt = prompt;
  spec.sampling.temperature = 0;
  spec.max_tokens = 6;
  spec.prefill_peer = "prefill-1";
  auto stream = decode->submit(spec);
  ASSERT_TRUE(stream.has_value());
  // Kill the prefill worker once it took the order.
  for (int i = 0; i < 500 && prefill->counters().pd_orders_accepted == 0; ++i) {
    std::this_thread::sleep_for(2ms);
  }
  prefill.reset();
  Outcome got = drain(**stream);
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_FALSE(got.usage.kv_transferred);
  const EngineCounters dc = decode->counters();
  uint64_t fallbacks = 0;
  for (uint64_t f : dc.pd_fallbacks) fallbacks += f;
  EXPECT_EQ(fallbacks, 1u);
  expect_audited(*decode);
}

// A fake prefill worker: accepts orders and never answers, or sends forged messages.
class FakePrefill {
 public:
  explicit FakePrefill(const std::string& transport) {
    pd::ChannelOptions o;
    o.worker_id = "prefill-1";
    o.role = pd::Role::kPrefill;
    o.bind_endpoint = "tcp://127.0.0.1:0";
    o.kv_layout = std::string(kLayout) + ";transport=" + transport;
    o.heartbeat_ms = 50;
    o.peer_timeout_ms = 400;
    auto c = pd::Channel::start(o);
    EXPECT_TRUE(c.has_value());
    channel = std::move(*c);
  }
  // The next order received, within two seconds.
  std::optional<pd::PrefillOrder> next_order() {
    for (int i = 0; i < 200; ++i) {
      channel->wait(10);
      for (auto& in : channel->poll().messages) {
        if (auto* o = std::get_if<pd::PrefillOrder>(&in.message)) return *o;
      }
    }
    return std::nullopt;
  }
  std::unique_ptr<pd::Channel> channel;
};

TEST_P(PdEngineTest, StalledRoomFailsAndQuarantinesItsPagesThenPrefillsLocally) {
  auto colocated = start(base());
  FakePrefill fake(GetParam());
  EngineOptions o = base();
  o.pd.stall_ms = 200;
  auto decode = start_decode(fake.channel->endpoint(), o);
  ASSERT_TRUE(wait_peer(*decode, "prefill-1"));
  const auto prompt = test_prompt(30, 12);
  Outcome want = run_greedy(*colocated, prompt, 5);
  RequestSpec spec;
  spec.prompt = prompt;
  spec.sampling.temperature = 0;
  spec.max_tokens = 5;
  spec.prefill_peer = "prefill-1";
  auto stream = decode->submit(spec);
  ASSERT_TRUE(stream.has_value());
  auto order = fake.next_order();
  ASSERT_TRUE(order.has_value());
  ASSERT_TRUE(fake.channel->send("decode-1", pd::OrderAccepted{order->room}).has_value());
  // Forged: a room that does not exist, from the right peer. Refused, nothing applied.
  ASSERT_TRUE(fake.channel
                  ->send("decode-1",
                         pd::PrefillDone{
                             pd::RoomId{order->room == pd::RoomId{1} ? uint64_t{2} : uint64_t{1}},
                             7, 30, 0, 0})
                  .has_value());
  Outcome got = drain(**stream);  // the stall deadline, then a local prefill
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_FALSE(got.usage.kv_transferred);
  EXPECT_EQ(decode->counters().pd_fallbacks[static_cast<size_t>(PdFallback::kTimeout)], 1u);
  // The peer never said it stopped writing: the pages wait out the quarantine.
  expect_audited(*decode);
  // A stall never blacklists: the next order goes to the same peer.
  RequestSpec again = spec;
  again.prompt = test_prompt(20, 13);
  auto s2 = decode->submit(again);
  ASSERT_TRUE(s2.has_value());
  EXPECT_TRUE(fake.next_order().has_value());
  (**s2).cancel();
  drain(**s2);
  expect_audited(*decode);
}

TEST_P(PdEngineTest, CancelledRequestCancelsItsRoom) {
  FakePrefill fake(GetParam());
  auto decode = start_decode(fake.channel->endpoint(), base());
  ASSERT_TRUE(wait_peer(*decode, "prefill-1"));
  RequestSpec spec;
  spec.prompt = test_prompt(30, 14);
  spec.sampling.temperature = 0;
  spec.max_tokens = 5;
  spec.prefill_peer = "prefill-1";
  auto stream = decode->submit(spec);
  auto order = fake.next_order();
  ASSERT_TRUE(order.has_value());
  ASSERT_TRUE(fake.channel->send("decode-1", pd::OrderAccepted{order->room}).has_value());
  std::this_thread::sleep_for(50ms);
  (**stream).cancel();
  Outcome got = drain(**stream);
  EXPECT_EQ(got.reason, FinishReason::kCancelled);
  // The decode worker sends Cancel; the prefill worker's PrefillFailed ends the quarantine.
  bool cancelled = false;
  for (int i = 0; i < 200 && !cancelled; ++i) {
    fake.channel->wait(10);
    for (auto& in : fake.channel->poll().messages) {
      if (std::holds_alternative<pd::Cancel>(in.message)) cancelled = true;
    }
  }
  EXPECT_TRUE(cancelled);
  ASSERT_TRUE(
      fake.channel->send("decode-1", pd::PrefillFailed{order->room, "cancelled"}).has_value());
  expect_audited(*decode);
}

INSTANTIATE_TEST_SUITE_P(Transports, PdEngineTest, ::testing::Values("ucx", "storage"),
                         [](const auto& info) { return info.param; });
INSTANTIATE_TEST_SUITE_P(Ucx, PdPutTest, ::testing::Values("ucx"),
                         [](const auto& info) { return info.param; });

TEST(PdOptionsTest, BadCombinationsAreRefused) {
  EngineOptions o;
  o.pd.role = WorkerRole::kDecode;
  EXPECT_FALSE(validate(o).has_value());  // decode without peers
  o.pd.prefill_peers = {"tcp://127.0.0.1:1"};
  EXPECT_TRUE(validate(o).has_value());
  o.pd.bind = "tcp://127.0.0.1:0";
  EXPECT_FALSE(validate(o).has_value());  // bind is for prefill workers
  o.pd.bind.clear();
  o.pd.ucx_data_path = "teleport";
  EXPECT_FALSE(validate(o).has_value());
  o.pd.ucx_data_path = "put";
  EXPECT_TRUE(validate(o).has_value());
  o.pd.transport = "carrier-pigeon";
  EXPECT_FALSE(validate(o).has_value());
  o.pd.transport = "storage";
  EXPECT_FALSE(validate(o).has_value());  // storage needs a backend
  o.pd.transport = "ucx";
  o.pd.peer_timeout_ms = o.pd.heartbeat_ms;
  EXPECT_FALSE(validate(o).has_value());
  EXPECT_FALSE(parse_worker_role("boss").has_value());
  EXPECT_EQ(*parse_worker_role("prefill"), WorkerRole::kPrefill);
}

}  // namespace
}  // namespace strata
