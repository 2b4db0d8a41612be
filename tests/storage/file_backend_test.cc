#include "storage/file_backend.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <thread>
#include <vector>

#include "common/clock.h"

namespace strata::file_backend_test {

namespace fs = std::filesystem;

constexpr size_t kPageBytes = 3000;

std::vector<std::byte> page_bytes(uint64_t key, size_t n = kPageBytes) {
  std::mt19937_64 gen(key);
  std::vector<std::byte> out(n);
  for (std::byte& b : out) b = static_cast<std::byte>(gen());
  return out;
}

// A batch of values and their views, as the cache would pass them.
struct Batch {
  std::vector<uint64_t> keys;
  std::vector<std::vector<std::byte>> values;
  std::vector<std::span<const std::byte>> views;

  explicit Batch(std::vector<uint64_t> k, size_t n = kPageBytes) : keys(std::move(k)) {
    for (uint64_t key : keys) values.push_back(page_bytes(key, n));
    for (const auto& v : values) views.emplace_back(v);
  }
};

// Buffers to read a batch into.
struct ReadBuffers {
  std::vector<std::vector<std::byte>> bufs;
  std::vector<std::span<std::byte>> views;

  ReadBuffers(size_t count, size_t n = kPageBytes) : bufs(count, std::vector<std::byte>(n)) {
    for (auto& b : bufs) views.emplace_back(b);
  }
};

void expect_all_ok(const std::vector<Status>& results) {
  for (size_t i = 0; i < results.size(); ++i) {
    EXPECT_TRUE(results[i]) << i << ": " << results[i].error().message;
  }
}

// Sum of the sizes of value files (16-hex names) on disk, and how many there are.
std::pair<int64_t, size_t> disk_usage(const std::string& root) {
  int64_t bytes = 0;
  size_t count = 0;
  for (const auto& shard : fs::directory_iterator(root)) {
    if (!shard.is_directory()) continue;
    for (const auto& f : fs::directory_iterator(shard)) {
      if (f.path().filename().string().size() != 16) continue;
      bytes += static_cast<int64_t>(f.file_size());
      ++count;
    }
  }
  return {bytes, count};
}

class FileBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/strata-file-backend-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    config_.backend = "file";
    config_.name_space = "test-ns";
    config_.dir = dir_;
  }
  void TearDown() override {
    std::error_code ec;
    fs::permissions(dir_, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(dir_, ec);
  }

  std::unique_ptr<FileBackend> open() {
    auto backend = FileBackend::open(config_, clock_);
    EXPECT_TRUE(backend) << backend.error().message;
    return backend ? std::move(*backend) : nullptr;
  }

  std::string dir_;
  StorageConfig config_;
  ManualClock clock_;
};

TEST_F(FileBackendTest, BatchRoundTrip) {
  auto backend = open();
  ASSERT_TRUE(backend);
  const Batch batch({1, 2, 0xffffffffffffffffULL, 0x1234567890abcdefULL});
  expect_all_ok(backend->set(batch.keys, batch.views));
  EXPECT_EQ(backend->exists(batch.keys), std::vector<bool>(4, true));
  ReadBuffers read(batch.keys.size());
  expect_all_ok(backend->get(batch.keys, read.views));
  for (size_t i = 0; i < batch.keys.size(); ++i) EXPECT_EQ(read.bufs[i], batch.values[i]) << i;
  EXPECT_TRUE(fs::is_regular_file(dir_ + "/test-ns/12/1234567890abcdef"));

  const StorageStats stats = backend->stats();
  EXPECT_EQ(stats.set_written, 4u);
  EXPECT_EQ(stats.get_hits, 4u);
  EXPECT_EQ(stats.bytes_written, 4 * kPageBytes);
  EXPECT_EQ(stats.bytes_read, 4 * kPageBytes);
  EXPECT_EQ(stats.exists_calls, 1u);
  EXPECT_EQ(backend->used_bytes(), int64_t{4} * int64_t{kFrameHeaderBytes + kPageBytes});
}

// A server whose pages are of another KV dtype (issue 54) sharing the store: it never reads
// the other's values as its own, counts them, and leaves them for their owner.
TEST_F(FileBackendTest, ValuesOfAnotherPageFormatAreCountedAndKept) {
  config_.page_format = 0x10004;  // as kv_page_format names int8 pages
  auto int8_backend = open();
  config_.page_format = 0x10103;  // paired BF16 pages
  auto bf16_backend = open();
  ASSERT_TRUE(int8_backend && bf16_backend);
  const Batch batch({7, 8});
  expect_all_ok(int8_backend->set(batch.keys, batch.views));
  ReadBuffers read(batch.keys.size());
  const std::vector<Status> foreign = bf16_backend->get(batch.keys, read.views);
  for (const Status& s : foreign) {
    ASSERT_FALSE(s);
    EXPECT_EQ(s.error().code, ErrorCode::kCorrupt);
    EXPECT_NE(s.error().message.find("format"), std::string::npos) << s.error().message;
  }
  EXPECT_EQ(bf16_backend->stats().foreign_format_values, 2u);
  EXPECT_EQ(bf16_backend->stats().corrupt_values, 0u);
  EXPECT_EQ(bf16_backend->stats().get_hits, 0u);
  // Kept: their owner still reads them.
  expect_all_ok(int8_backend->get(batch.keys, read.views));
  for (size_t i = 0; i < batch.keys.size(); ++i) EXPECT_EQ(read.bufs[i], batch.values[i]) << i;
}

TEST_F(FileBackendTest, MissingKeys) {
  auto backend = open();
  ASSERT_TRUE(backend);
  const Batch batch({10});
  expect_all_ok(backend->set(batch.keys, batch.views));
  const std::vector<uint64_t> keys = {10, 11, 12};
  EXPECT_EQ(backend->exists(keys), (std::vector<bool>{true, false, false}));
  ReadBuffers read(3);
  const std::vector<Status> results = backend->get(keys, read.views);
  EXPECT_TRUE(results[0]);
  for (size_t i : {1, 2}) {
    ASSERT_FALSE(results[i]);
    EXPECT_EQ(results[i].error().code, ErrorCode::kNotFound);
  }
  EXPECT_EQ(backend->stats().get_misses, 2u);
  EXPECT_EQ(backend->stats().get_hits, 1u);
}

TEST_F(FileBackendTest, SetOfAnExistingKeyIsSkipped) {
  auto backend = open();
  ASSERT_TRUE(backend);
  const Batch first({5, 6});
  expect_all_ok(backend->set(first.keys, first.views));
  // The same keys with other bytes: the stored values stay.
  std::vector<std::byte> other(kPageBytes, std::byte{0x5a});
  const std::vector<std::span<const std::byte>> views = {other, other};
  expect_all_ok(backend->set(first.keys, views));
  EXPECT_EQ(backend->stats().set_written, 2u);
  EXPECT_EQ(backend->stats().set_skipped_existing, 2u);
  ReadBuffers read(2);
  expect_all_ok(backend->get(first.keys, read.views));
  EXPECT_EQ(read.bufs[0], first.values[0]);
  EXPECT_EQ(read.bufs[1], first.values[1]);
}

// Random writes of random sizes against a FIFO reference model of the capacity.
TEST_F(FileBackendTest, CapacityEvictsOldestFirstAndNeverExceedsTheCap) {
  const int64_t cap = 10 * int64_t{kFrameHeaderBytes + kPageBytes};
  config_.capacity_bytes = cap;
  auto backend = open();
  ASSERT_TRUE(backend);
  std::deque<std::pair<uint64_t, int64_t>> model;  // oldest first
  int64_t model_used = 0;
  uint64_t model_evicted = 0;
  std::mt19937 gen(7);
  for (int step = 0; step < 200; ++step) {
    const uint64_t key = gen() % 60;
    const size_t n = 500 + gen() % (2 * kPageBytes);
    const Batch batch({key}, n);
    const std::vector<Status> results = backend->set(batch.keys, batch.views);
    ASSERT_TRUE(results[0]) << results[0].error().message;
    const bool present =
        std::any_of(model.begin(), model.end(), [&](const auto& e) { return e.first == key; });
    if (!present) {
      const int64_t size = static_cast<int64_t>(kFrameHeaderBytes + n);
      while (model_used + size > cap) {
        model_used -= model.front().second;
        model.pop_front();
        ++model_evicted;
      }
      model.emplace_back(key, size);
      model_used += size;
    }
    ASSERT_EQ(backend->used_bytes(), model_used) << step;
    const auto [disk_bytes, disk_count] = disk_usage(backend->root());
    ASSERT_LE(disk_bytes, cap) << step;
    ASSERT_EQ(disk_bytes, model_used) << step;
    ASSERT_EQ(disk_count, model.size()) << step;
  }
  EXPECT_EQ(backend->stats().evicted, model_evicted);
  EXPECT_GT(model_evicted, 0u);
  for (const auto& [key, size] : model) {
    EXPECT_TRUE(fs::exists(backend->value_path(key))) << key;
  }
}

TEST_F(FileBackendTest, ValueLargerThanTheCapacityIsRefused) {
  config_.capacity_bytes = 1000;
  auto backend = open();
  ASSERT_TRUE(backend);
  const Batch batch({1});
  const std::vector<Status> results = backend->set(batch.keys, batch.views);
  ASSERT_FALSE(results[0]);
  EXPECT_EQ(results[0].error().code, ErrorCode::kResourceExhausted);
  EXPECT_EQ(backend->stats().set_errors, 1u);
  EXPECT_EQ(backend->used_bytes(), 0);
}

TEST_F(FileBackendTest, ReopeningRebuildsTheIndexInWriteOrder) {
  const Batch batch({1, 2, 3, 4});
  std::string root;
  {
    auto backend = open();
    ASSERT_TRUE(backend);
    expect_all_ok(backend->set(batch.keys, batch.views));
    root = backend->root();
    // File times are coarse; give the values distinct ages: key 3 oldest, then 1, 4, 2.
    const std::map<uint64_t, time_t> age = {{3, 1000}, {1, 2000}, {4, 3000}, {2, 4000}};
    for (const auto& [key, t] : age) {
      const timespec times[2] = {{t, 0}, {t, 0}};
      ASSERT_EQ(::utimensat(AT_FDCWD, backend->value_path(key).c_str(), times, 0), 0);
    }
  }
  auto reopened = open();
  ASSERT_TRUE(reopened);
  EXPECT_EQ(reopened->used_bytes(), 4 * int64_t{kFrameHeaderBytes + kPageBytes});
  EXPECT_EQ(reopened->exists(batch.keys), std::vector<bool>(4, true));
  ReadBuffers read(4);
  expect_all_ok(reopened->get(batch.keys, read.views));
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(read.bufs[i], batch.values[i]);
  reopened.reset();

  // Reopening with room for two values evicts the two oldest.
  config_.capacity_bytes = 2 * int64_t{kFrameHeaderBytes + kPageBytes};
  auto capped = open();
  ASSERT_TRUE(capped);
  EXPECT_EQ(capped->exists(batch.keys), (std::vector<bool>{false, true, false, true}));
  EXPECT_EQ(capped->stats().evicted, 2u);
  EXPECT_EQ(capped->used_bytes(), config_.capacity_bytes);
}

TEST_F(FileBackendTest, StrayFilesAreIgnoredAndNotCounted) {
  std::string root;
  {
    auto backend = open();
    ASSERT_TRUE(backend);
    const Batch batch({0xab00000000000001ULL});
    expect_all_ok(backend->set(batch.keys, batch.views));
    root = backend->root();
  }
  // A temp file left by a crash, a value-like name in the wrong shard, an upper-case name,
  // a file where a shard belongs and a foreign file.
  std::ofstream(root + "/ab/.tmp.ab00000000000002.123.0") << std::string(5000, 'x');
  fs::create_directories(root + "/cd");
  std::ofstream(root + "/cd/ab00000000000003") << std::string(5000, 'x');
  std::ofstream(root + "/ab/AB00000000000004") << std::string(5000, 'x');
  std::ofstream(root + "/ef") << "x";
  std::ofstream(root + "/README") << "x";

  auto reopened = open();
  ASSERT_TRUE(reopened);
  EXPECT_EQ(reopened->used_bytes(), int64_t{kFrameHeaderBytes + kPageBytes});
  const std::vector<uint64_t> keys = {0xab00000000000001ULL, 0xab00000000000002ULL,
                                      0xab00000000000004ULL};
  EXPECT_EQ(reopened->exists(keys), (std::vector<bool>{true, false, false}));
  EXPECT_TRUE(fs::exists(root + "/ab/.tmp.ab00000000000002.123.0"));
}

TEST_F(FileBackendTest, UnusableDirectoryIsAnError) {
  config_.dir = "/proc/strata-no-such-dir/kv";
  auto missing = FileBackend::open(config_, clock_);
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().code, ErrorCode::kIoError);
  EXPECT_NE(missing.error().message.find("/proc/strata-no-such-dir"), std::string::npos);

  std::ofstream(dir_ + "/a-file") << "x";
  config_.dir = dir_ + "/a-file";
  auto not_dir = FileBackend::open(config_, clock_);
  ASSERT_FALSE(not_dir);
  EXPECT_EQ(not_dir.error().code, ErrorCode::kIoError);
}

// Root writes through permissions: the read-only checks run in a child process that
// gives up root first (as `nobody`), so they run for every user.
void become_unprivileged() {
  if (::geteuid() != 0) return;
  if (::setgid(65534) != 0 || ::setuid(65534) != 0) std::_Exit(3);
}

TEST_F(FileBackendTest, ReadOnlyDirectoryIsAnErrorAtOpen) {
  fs::permissions(dir_, fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                            fs::perms::others_read | fs::perms::others_exec);
  fs::create_directories(dir_ + "/ro");
  fs::permissions(dir_ + "/ro", fs::perms::owner_read | fs::perms::owner_exec |
                                    fs::perms::others_read | fs::perms::others_exec);
  config_.dir = dir_ + "/ro";
  EXPECT_EXIT(
      {
        become_unprivileged();
        auto read_only = FileBackend::open(config_, clock_);
        std::_Exit(!read_only && read_only.error().code == ErrorCode::kIoError ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST_F(FileBackendTest, DirectoryVanishingAfterOpenGivesErrorsNotCrashes) {
  auto backend = open();
  ASSERT_TRUE(backend);
  const Batch before({1, 2});
  expect_all_ok(backend->set(before.keys, before.views));
  // Replace the namespace directory with a plain file: nothing can be created under it.
  fs::remove_all(backend->root());
  std::ofstream(backend->root()) << "x";
  const Batch after({3, 4});
  const std::vector<Status> results = backend->set(after.keys, after.views);
  for (const Status& s : results) {
    ASSERT_FALSE(s);
    EXPECT_EQ(s.error().code, ErrorCode::kIoError) << s.error().message;
  }
  EXPECT_EQ(backend->stats().set_errors, 2u);
  EXPECT_EQ(backend->exists(before.keys), std::vector<bool>(2, false));
  ReadBuffers read(2);
  for (const Status& s : backend->get(before.keys, read.views)) EXPECT_FALSE(s);
}

TEST_F(FileBackendTest, ReadOnlyDirectoryGivesWriteErrors) {
  auto backend = open();
  ASSERT_TRUE(backend);
  const auto read_exec = fs::perms::owner_read | fs::perms::owner_exec | fs::perms::group_read |
                         fs::perms::group_exec | fs::perms::others_read | fs::perms::others_exec;
  for (fs::path p = backend->root(); p.string().size() >= dir_.size(); p = p.parent_path()) {
    fs::permissions(p, read_exec);
  }
  const Batch batch({1});
  EXPECT_EXIT(
      {
        become_unprivileged();
        const std::vector<Status> results = backend->set(batch.keys, batch.views);
        std::_Exit(!results[0] && results[0].error().code == ErrorCode::kIoError ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
  fs::permissions(dir_, fs::perms::owner_all);  // let TearDown remove it
  for (fs::path p = backend->root(); p.string().size() > dir_.size(); p = p.parent_path()) {
    fs::permissions(p, fs::perms::owner_all);
  }
}

TEST_F(FileBackendTest, FailedWriteRemovesItsTempFileAndBreaksNothing) {
  auto backend = open();
  ASSERT_TRUE(backend);
  const Batch good({0x1100000000000001ULL});
  expect_all_ok(backend->set(good.keys, good.views));

  // A file size limit makes the write fail midway, as a full disk would.
  const Batch big({0x1100000000000002ULL}, 64 * 1024);
  rlimit old_limit;
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  const auto old_handler = ::signal(SIGXFSZ, SIG_IGN);
  rlimit small = old_limit;
  small.rlim_cur = 16 * 1024;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  const std::vector<Status> results = backend->set(big.keys, big.views);
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &old_limit), 0);
  ::signal(SIGXFSZ, old_handler);

  ASSERT_FALSE(results[0]);
  EXPECT_EQ(results[0].error().code, ErrorCode::kResourceExhausted) << results[0].error().message;
  EXPECT_EQ(backend->stats().set_errors, 1u);
  size_t files_in_shard = 0;
  for (const auto& f : fs::directory_iterator(backend->root() + "/11")) {
    EXPECT_EQ(f.path().filename(), "1100000000000001");
    ++files_in_shard;
  }
  EXPECT_EQ(files_in_shard, 1u);
  EXPECT_EQ(backend->used_bytes(), int64_t{kFrameHeaderBytes + kPageBytes});
  EXPECT_EQ(backend->exists(big.keys), std::vector<bool>{false});

  // The store still works: the old value reads back and the big one can now be written.
  ReadBuffers read(1);
  expect_all_ok(backend->get(good.keys, read.views));
  EXPECT_EQ(read.bufs[0], good.values[0]);
  expect_all_ok(backend->set(big.keys, big.views));
}

class CorruptFileTest : public FileBackendTest {
 protected:
  void SetUp() override {
    FileBackendTest::SetUp();
    backend_ = open();
    ASSERT_TRUE(backend_);
    expect_all_ok(backend_->set(batch_.keys, batch_.views));
    path_ = backend_->value_path(batch_.keys[0]);
  }

  // Reads key 0 and expects kCorrupt.
  void expect_corrupt(size_t dst_bytes = kPageBytes) {
    ReadBuffers read(1, dst_bytes);
    const std::vector<Status> results = backend_->get(std::span(batch_.keys).first(1), read.views);
    ASSERT_FALSE(results[0]);
    EXPECT_EQ(results[0].error().code, ErrorCode::kCorrupt);
    EXPECT_EQ(backend_->stats().corrupt_values, 1u);
  }

  // The damaged value is gone and can be written again.
  void expect_replaceable() {
    EXPECT_FALSE(fs::exists(path_));
    expect_all_ok(backend_->set(std::span(batch_.keys).first(1), std::span(batch_.views).first(1)));
    EXPECT_EQ(backend_->stats().set_written, 3u);
    ReadBuffers read(1);
    expect_all_ok(backend_->get(std::span(batch_.keys).first(1), read.views));
    EXPECT_EQ(read.bufs[0], batch_.values[0]);
  }

  const Batch batch_{{0x2200000000000001ULL, 0x2200000000000002ULL}};
  std::unique_ptr<FileBackend> backend_;
  std::string path_;
};

TEST_F(CorruptFileTest, FlippedPayloadByteIsDetected) {
  {
    std::fstream f(path_, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(kFrameHeaderBytes + 1234);
    f.put(static_cast<char>(~static_cast<unsigned char>(batch_.values[0][1234])));
  }
  expect_corrupt();
  expect_replaceable();
}

TEST_F(CorruptFileTest, TruncatedFileIsDetected) {
  fs::resize_file(path_, kFrameHeaderBytes + kPageBytes / 2);
  expect_corrupt();
  expect_replaceable();
}

TEST_F(CorruptFileTest, AnotherKeysFileIsDetected) {
  fs::copy_file(backend_->value_path(batch_.keys[1]), path_, fs::copy_options::overwrite_existing);
  expect_corrupt();
  expect_replaceable();
}

TEST_F(CorruptFileTest, WrongBufferSizeIsCorruptAndKeepsTheValue) {
  expect_corrupt(kPageBytes - 1);
  EXPECT_TRUE(fs::exists(path_));
  ReadBuffers read(1);
  expect_all_ok(backend_->get(std::span(batch_.keys).first(1), read.views));
  EXPECT_EQ(read.bufs[0], batch_.values[0]);
}

TEST_F(FileBackendTest, ConcurrentCallersSeeWholeValues) {
  auto backend = open();
  ASSERT_TRUE(backend);
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (uint64_t i = 0; i < 50; ++i) {
        const uint64_t key = (i + static_cast<uint64_t>(t) * 7) % 40;  // overlapping keys
        const Batch batch({key});
        if (!backend->set(batch.keys, batch.views)[0]) ++failures;
        ReadBuffers read(1);
        if (!backend->get(batch.keys, read.views)[0] || read.bufs[0] != batch.values[0]) {
          ++failures;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  const StorageStats stats = backend->stats();
  EXPECT_EQ(stats.set_written, 40u);
  EXPECT_EQ(stats.set_written + stats.set_skipped_existing, 200u);
  EXPECT_EQ(backend->used_bytes(), 40 * int64_t{kFrameHeaderBytes + kPageBytes});
}

TEST(FileBackendFactoryTest, MakeStorageBackendGivesTheFileBackend) {
  char tmpl[] = "/tmp/strata-file-factory-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  auto config = parse_storage_config("file", std::string(R"({"dir": ")") + tmpl + "\"}");
  ASSERT_TRUE(config) << config.error().message;
  auto unnamed = make_storage_backend(*config);  // the server has not set the namespace
  ASSERT_FALSE(unnamed);
  EXPECT_EQ(unnamed.error().code, ErrorCode::kInvalidArgument);
  config->name_space = "bf16-p16-0123456789abcdef";
  auto backend = make_storage_backend(*config);
  ASSERT_TRUE(backend) << backend.error().message;
  EXPECT_EQ((*backend)->name(), "file");
  EXPECT_TRUE(fs::is_directory(std::string(tmpl) + "/bf16-p16-0123456789abcdef"));
  fs::remove_all(tmpl);
}

}  // namespace strata::file_backend_test
