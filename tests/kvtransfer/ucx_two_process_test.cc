// UcxTransport between two processes, as prefill and decode workers run: bytes land
// exactly, and a peer process killed (SIGKILL) in the middle of a transfer fails it on the
// survivor's side, on either side, without taking the survivor down.
//
// Each test forks before it makes any transport, so the child starts single-threaded.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include <chrono>
#include <cstring>
#include <future>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kvtransfer/ucx_transport.h"

namespace strata {
namespace {

using namespace std::chrono_literals;

constexpr size_t kRegionBytes = size_t{64} << 20;

bool write_all(int fd, const void* p, size_t n) {
  const auto* b = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t w = ::write(fd, b, n);
    if (w <= 0) return false;
    b += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}
bool read_all(int fd, void* p, size_t n) {
  auto* b = static_cast<char*>(p);
  while (n > 0) {
    const ssize_t r = ::read(fd, b, n);
    if (r <= 0) return false;
    b += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}
bool send_blob(int fd, const std::vector<std::byte>& blob) {
  const uint64_t n = blob.size();
  return write_all(fd, &n, sizeof n) && write_all(fd, blob.data(), n);
}
bool receive_blob(int fd, std::vector<std::byte>& blob) {
  uint64_t n = 0;
  if (!read_all(fd, &n, sizeof n) || n > (uint64_t{1} << 24)) return false;
  blob.resize(n);
  return read_all(fd, blob.data(), n);
}

std::unique_ptr<UcxTransport> transport(const std::string& tls) {
  UcxTransportOptions options;
  options.transports = tls;
  auto t = UcxTransport::create(options);
  return t ? std::move(*t) : nullptr;
}

void fill(std::vector<std::byte>& v, uint64_t seed) {
  std::mt19937_64 gen(seed);
  for (size_t i = 0; i + 8 <= v.size(); i += 8) {
    const uint64_t x = gen();
    std::memcpy(v.data() + i, &x, 8);
  }
}

// Many small runs, so that a transfer is still in flight when the peer is killed.
std::vector<PageRun> strided_runs(size_t bytes, uint64_t piece) {
  std::vector<PageRun> runs;
  for (uint64_t off = 0; off + piece <= bytes; off += 2 * piece) runs.push_back({off, off, piece});
  return runs;
}

struct Child {
  pid_t pid = -1;
  int to_child = -1, from_child = -1;
  Child() = default;
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  ~Child() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
    if (to_child >= 0) ::close(to_child);
    if (from_child >= 0) ::close(from_child);
  }
};

// Forks `body(read_fd, write_fd)` into a child that dies with its parent.
template <typename Body>
bool fork_child(Child& child, Body body) {
  int down[2], up[2];
  if (::pipe(down) != 0 || ::pipe(up) != 0) return false;
  const pid_t parent = ::getpid();
  child.pid = ::fork();
  if (child.pid < 0) return false;
  if (child.pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(1);
    ::close(down[1]);
    ::close(up[0]);
    body(down[0], up[1]);
    ::_exit(0);
  }
  ::close(down[0]);
  ::close(up[1]);
  child.to_child = down[1];
  child.from_child = up[0];
  return true;
}

// The child is the decode side: it registers a region, hands over its address and
// descriptor, and on each command byte answers with the XXH3 of its region.
void decode_child(const std::string& tls, int in, int out) {
  auto ucx = transport(tls);
  if (!ucx) ::_exit(2);
  std::vector<std::byte> region(kRegionBytes);
  auto id = ucx->register_region(region.data(), region.size());
  if (!id) ::_exit(3);
  if (!send_blob(out, ucx->address()) || !send_blob(out, *ucx->region_descriptor(*id))) {
    ::_exit(4);
  }
  char command;
  while (read_all(in, &command, 1)) {
    std::promise<uint64_t> hash;
    // Through the progress thread: ordered after the bytes its worker wrote.
    ucx->post([&] { hash.set_value(XXH3_64bits(region.data(), region.size())); });
    const uint64_t h = hash.get_future().get();
    if (!write_all(out, &h, sizeof h)) break;
  }
  ucx.reset();
}

class UcxTwoProcessTest : public testing::TestWithParam<std::string> {};

TEST_P(UcxTwoProcessTest, BytesLandInAnotherProcess) {
  const std::string tls = GetParam();
  Child child;
  ASSERT_TRUE(fork_child(child, [&](int in, int out) { decode_child(tls, in, out); }));
  std::vector<std::byte> address, descriptor;
  ASSERT_TRUE(receive_blob(child.from_child, address));
  ASSERT_TRUE(receive_blob(child.from_child, descriptor));

  for (UcxDataPath path : {UcxDataPath::kMessages, UcxDataPath::kPut}) {
    SCOPED_TRACE(path == UcxDataPath::kPut ? "put" : "messages");
    if (path == UcxDataPath::kPut && tls == "tcp") continue;  // emulated: docs/kv-transfer.md
    std::vector<std::byte> src(kRegionBytes);  // outlives the transport that reads it
    UcxTransportOptions options;
    options.transports = tls;
    options.data_path = path;
    auto ucx = UcxTransport::create(options);
    ASSERT_TRUE(ucx) << ucx.error().message;
    fill(src, path == UcxDataPath::kPut ? 2 : 1);
    auto local = (*ucx)->register_region(src.data(), src.size());
    auto peer = (*ucx)->connect(address);
    ASSERT_TRUE(local && peer);
    auto remote = (*ucx)->import_region(*peer, descriptor);
    ASSERT_TRUE(remote) << remote.error().message;
    // The whole region in runs of mixed sizes, in a shuffled order.
    std::vector<PageRun> runs;
    std::mt19937 gen(5);
    for (uint64_t off = 0; off < kRegionBytes;) {
      const uint64_t n = std::min<uint64_t>(kRegionBytes - off, 4096 << (gen() % 8));
      runs.push_back({off, off, n});
      off += n;
    }
    std::shuffle(runs.begin(), runs.end(), gen);
    std::promise<Status> done;
    ASSERT_TRUE((*ucx)->put_runs(*peer, *remote, *local, runs, 60'000,
                                 [&](Status s) { done.set_value(std::move(s)); }));
    auto f = done.get_future();
    ASSERT_EQ(f.wait_for(120s), std::future_status::ready);
    Status s = f.get();
    ASSERT_TRUE(s) << s.error().message;
    char command = 'h';
    ASSERT_TRUE(write_all(child.to_child, &command, 1));
    uint64_t h = 0;
    ASSERT_TRUE(read_all(child.from_child, &h, sizeof h));
    EXPECT_EQ(h, XXH3_64bits(src.data(), src.size()));
  }
}

TEST_P(UcxTwoProcessTest, DecodeKilledMidTransferFailsTheSender) {
  const std::string tls = GetParam();
  Child child;
  ASSERT_TRUE(fork_child(child, [&](int in, int out) { decode_child(tls, in, out); }));
  std::vector<std::byte> address, descriptor;
  ASSERT_TRUE(receive_blob(child.from_child, address));
  ASSERT_TRUE(receive_blob(child.from_child, descriptor));
  std::vector<std::byte> src(kRegionBytes);  // outlives the transport that reads it
  UcxTransportOptions options;
  options.transports = tls;
  auto ucx = UcxTransport::create(options);
  ASSERT_TRUE(ucx);
  auto local = (*ucx)->register_region(src.data(), src.size());
  auto peer = (*ucx)->connect(address);
  ASSERT_TRUE(local && peer);
  auto remote = (*ucx)->import_region(*peer, descriptor);
  ASSERT_TRUE(remote) << remote.error().message;
  const auto runs = strided_runs(kRegionBytes, 256);
  std::vector<std::promise<Status>> done(4);
  for (auto& d : done) {
    Status started = (*ucx)->put_runs(*peer, *remote, *local, runs, 3000,
                                      [&d](Status s) { d.set_value(std::move(s)); });
    // On a loaded machine (a CI run under ASan) an earlier transfer may pass its 3 s
    // deadline before the kill: the peer has failed then, and a new transfer is refused at
    // once with that failure (the callback never runs). Counted below like any failure.
    if (!started) d.set_value(std::move(started));
  }
  ::kill(child.pid, SIGKILL);
  ::waitpid(child.pid, nullptr, 0);
  child.pid = -1;
  int failed = 0;
  for (auto& d : done) {
    auto f = d.get_future();
    ASSERT_EQ(f.wait_for(120s), std::future_status::ready);
    Status s = f.get();
    if (!s) {
      ++failed;
      EXPECT_TRUE(s.error().code == ErrorCode::kIoError || s.error().code == ErrorCode::kTimeout)
          << s.error().message;
    }
  }
  // Transfers that completed before the kill are fine; a new one must fail.
  std::promise<Status> late;
  auto started = (*ucx)->put_runs(*peer, *remote, *local, runs, 3000,
                                  [&late](Status s) { late.set_value(std::move(s)); });
  if (started) {
    auto f = late.get_future();
    ASSERT_EQ(f.wait_for(120s), std::future_status::ready);
    EXPECT_FALSE(f.get());
  }
}

// The prefill process dies while its bytes stream in: the decode side (this process)
// must notice nothing worse than a peer gone. UCX 1.13's emulated puts abort the target
// in this case (docs/kv-transfer.md), which is why messages are the default data path.
TEST_P(UcxTwoProcessTest, PrefillKilledMidTransferLeavesTheDecodeSideRunning) {
  const std::string tls = GetParam();
  // Over tcp the decode side then takes new prefill peers as before, three times over.
  // Over shared memory one round: a writer killed in the middle of a message can leave
  // UCX 1.13's shared-memory receive FIFO with an element it never completed, after
  // which new shared-memory peers' handshakes time out (docs/kv-transfer.md); the decode
  // side must still survive it.
  const int rounds = tls == "tcp" ? 3 : 1;
  // The children fork first, while this process has one thread; each waits for the
  // address and descriptor of the transport made after.
  std::vector<Child> children(static_cast<size_t>(rounds));
  for (Child& child : children) {
    ASSERT_TRUE(fork_child(child, [&](int in, int out) {
      std::vector<std::byte> address, descriptor;
      if (!receive_blob(in, address) || !receive_blob(in, descriptor)) ::_exit(1);
      auto sender = transport(tls);
      if (!sender) ::_exit(2);
      std::vector<std::byte> src(kRegionBytes, std::byte{0x42});
      auto local = sender->register_region(src.data(), src.size());
      auto peer = sender->connect(address);
      if (!local || !peer) ::_exit(3);
      auto remote = sender->import_region(*peer, descriptor);
      if (!remote) ::_exit(4);
      const auto runs = strided_runs(kRegionBytes, 512);
      for (int i = 0; i < 4; ++i) {
        if (!sender->put_runs(*peer, *remote, *local, runs, 60'000, [](Status) {})) ::_exit(5);
      }
      const char ready = 'r';
      write_all(out, &ready, 1);
      char wait;
      read_all(in, &wait, 1);  // killed here, mid-transfer
      ::_exit(0);
    }));
  }
  std::vector<std::byte> region(kRegionBytes);  // outlives the transport that writes it
  auto ucx = transport(tls);
  ASSERT_TRUE(ucx);
  auto id = ucx->register_region(region.data(), region.size());
  ASSERT_TRUE(id);
  const auto address = ucx->address();
  const auto descriptor = *ucx->region_descriptor(*id);
  for (int round = 0; round < rounds; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    Child& child = children[static_cast<size_t>(round)];
    ASSERT_TRUE(send_blob(child.to_child, address) && send_blob(child.to_child, descriptor));
    char ready = 0;
    ASSERT_TRUE(read_all(child.from_child, &ready, 1));
    std::this_thread::sleep_for(std::chrono::milliseconds(round * 5));
    ::kill(child.pid, SIGKILL);
    ::waitpid(child.pid, nullptr, 0);
    child.pid = -1;
    // Let the worker see the rest of the dead peer's bytes and its disconnect.
    std::this_thread::sleep_for(200ms);
  }
  // Still alive and serving.
  std::promise<bool> alive;
  ucx->post([&] { alive.set_value(true); });
  auto f = alive.get_future();
  ASSERT_EQ(f.wait_for(60s), std::future_status::ready);
  EXPECT_GT(ucx->stats().messages_received, 0u);
}

INSTANTIATE_TEST_SUITE_P(Transports, UcxTwoProcessTest, testing::Values("tcp", "sm"),
                         [](const testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

}  // namespace
}  // namespace strata
