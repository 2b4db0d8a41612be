#include "storage/file_backend.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <tuple>

#include "common/check.h"
#include "common/log.h"

namespace strata {

namespace {

bool is_lower_hex(std::string_view s) {
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

std::string errno_text(int err) {
  return std::strerror(err);
}

// A failed write: a full disk (or a file size limit) is a capacity problem for the cache,
// anything else an I/O fault.
Status write_error(const std::string& what, int err) {
  const bool full = err == ENOSPC || err == EDQUOT || err == EFBIG;
  return make_error(full ? ErrorCode::kResourceExhausted : ErrorCode::kIoError,
                    what + ": " + errno_text(err));
}

// Writes all of `bytes`; false with errno set on failure.
bool write_all(int fd, std::span<const std::byte> bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    bytes = bytes.subspan(static_cast<size_t>(n));
  }
  return true;
}

// Reads exactly dst.size() bytes at `offset`; false on an error or end of file.
bool read_exact(int fd, std::span<std::byte> dst, off_t offset) {
  while (!dst.empty()) {
    const ssize_t n = ::pread(fd, dst.data(), dst.size(), offset);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    dst = dst.subspan(static_cast<size_t>(n));
    offset += n;
  }
  return true;
}

// Closes a descriptor when it goes out of scope.
class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  ~FdCloser() {
    if (fd_ >= 0) ::close(fd_);
  }
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;

 private:
  int fd_;
};

}  // namespace

FileBackend::FileBackend(const StorageConfig& config, const Clock& clock, std::string root)
    : root_(std::move(root)),
      capacity_bytes_(config.capacity_bytes),
      namespace_hash_(storage_namespace_hash(config.name_space)),
      page_format_(config.page_format),
      log_throttle_(clock) {}

Result<std::unique_ptr<FileBackend>> FileBackend::open(const StorageConfig& config,
                                                       const Clock& clock) {
  if (auto s = validate_storage_namespace(config.name_space); !s) {
    return std::unexpected(s.error());
  }
  if (config.dir.empty()) {
    return make_error(ErrorCode::kInvalidArgument, "file storage: dir is empty");
  }
  if (config.capacity_bytes < 0) {
    return make_error(ErrorCode::kInvalidArgument, "file storage: capacity_bytes is negative");
  }
  const std::string root = config.dir + "/" + config.name_space;
  for (const std::string& d : {config.dir, root}) {
    if (::mkdir(d.c_str(), 0755) != 0 && errno != EEXIST) {
      const int err = errno;
      return make_error(ErrorCode::kIoError,
                        "file storage: cannot create directory '" + d + "': " + errno_text(err));
    }
  }
  if (::access(root.c_str(), R_OK | W_OK | X_OK) != 0) {
    const int err = errno;
    return make_error(ErrorCode::kIoError,
                      "file storage: directory '" + root + "' is not usable: " + errno_text(err));
  }
  std::unique_ptr<FileBackend> backend(new FileBackend(config, clock, root));
  if (auto s = backend->scan(); !s) return std::unexpected(s.error());
  return backend;
}

std::string FileBackend::value_path(uint64_t key) const {
  const std::string hex = storage_key_hex(key);
  return root_ + "/" + hex.substr(0, 2) + "/" + hex;
}

int64_t FileBackend::used_bytes() const {
  std::lock_guard lock(mutex_);
  return used_bytes_;
}

Status FileBackend::scan() {
  DIR* dir = ::opendir(root_.c_str());
  if (dir == nullptr) {
    const int err = errno;
    return make_error(ErrorCode::kIoError,
                      "file storage: cannot read directory '" + root_ + "': " + errno_text(err));
  }
  std::vector<ScannedValue> found;
  Status status;
  while (const dirent* entry = ::readdir(dir)) {
    const std::string_view name = entry->d_name;
    if (name.size() != 2 || !is_lower_hex(name)) continue;
    status = scan_shard(std::string(name), found);
    if (!status) break;
  }
  ::closedir(dir);
  if (!status) return status;

  // Oldest first, so that eviction order survives a restart.
  std::sort(found.begin(), found.end(), [](const ScannedValue& a, const ScannedValue& b) {
    return std::tie(a.mtime.tv_sec, a.mtime.tv_nsec, a.key) <
           std::tie(b.mtime.tv_sec, b.mtime.tv_nsec, b.key);
  });
  std::lock_guard lock(mutex_);
  for (const ScannedValue& v : found) index_insert(v.key, v.size_bytes);
  if (capacity_bytes_ > 0) {
    if (auto s = make_room(0); !s) return s;
  }
  STRATA_LOG_INFO("file storage: {} holds {} values, {} bytes", root_, index_.size(), used_bytes_);
  return {};
}

Status FileBackend::scan_shard(const std::string& shard_name,
                               std::vector<ScannedValue>& out) const {
  const std::string shard = root_ + "/" + shard_name;
  DIR* dir = ::opendir(shard.c_str());
  if (dir == nullptr) {
    const int err = errno;
    if (err == ENOTDIR) return {};  // a stray file with a shard's name
    return make_error(ErrorCode::kIoError,
                      "file storage: cannot read directory '" + shard + "': " + errno_text(err));
  }
  while (const dirent* entry = ::readdir(dir)) {
    // Only a value's name counts: temp files start with '.', and a key is filed under
    // its own first two hex digits.
    const std::string_view name = entry->d_name;
    if (name.size() != 16 || !is_lower_hex(name) || name.substr(0, 2) != shard_name) continue;
    struct stat st;
    if (::fstatat(::dirfd(dir), entry->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    if (!S_ISREG(st.st_mode)) continue;
    out.push_back(ScannedValue{std::stoull(std::string(name), nullptr, 16),
                               static_cast<int64_t>(st.st_size), st.st_mtim});
  }
  ::closedir(dir);
  return {};
}

std::vector<bool> FileBackend::exists(std::span<const uint64_t> keys) {
  StorageCounters::add(counters_.exists_calls);
  std::vector<bool> found(keys.size(), false);
  for (size_t i = 0; i < keys.size(); ++i) {
    struct stat st;
    const std::string path = value_path(keys[i]);
    if (::stat(path.c_str(), &st) == 0) {
      found[i] = S_ISREG(st.st_mode);
    } else if (const int err = errno; err != ENOENT && err != ENOTDIR) {
      StorageCounters::add(counters_.exists_errors);
      log_failure("file storage: stat '" + path + "': " + errno_text(err));
    }
  }
  return found;
}

std::vector<Status> FileBackend::get(std::span<const uint64_t> keys,
                                     std::span<const std::span<std::byte>> dst) {
  STRATA_CHECK_MSG(keys.size() == dst.size(), "get: one buffer per key");
  std::vector<Status> results;
  results.reserve(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) results.push_back(get_one(keys[i], dst[i]));
  return results;
}

Status FileBackend::get_one(uint64_t key, std::span<std::byte> dst) {
  const std::string path = value_path(key);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT || err == ENOTDIR) {
      StorageCounters::add(counters_.get_misses);
      return make_error(ErrorCode::kNotFound, "no stored value " + storage_key_hex(key));
    }
    StorageCounters::add(counters_.get_errors);
    log_failure("file storage: open '" + path + "': " + errno_text(err));
    return make_error(ErrorCode::kIoError, "file storage: open '" + path + "': " + errno_text(err));
  }
  FdCloser closer(fd);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    StorageCounters::add(counters_.get_errors);
    return make_error(ErrorCode::kIoError, "file storage: stat '" + path + "': " + errno_text(err));
  }
  std::array<std::byte, kFrameHeaderBytes> header;
  FrameCheck check;
  const auto file_bytes = static_cast<uint64_t>(st.st_size);
  if (file_bytes < kFrameHeaderBytes || !read_exact(fd, header, 0)) {
    check =
        FrameCheck{make_error(ErrorCode::kCorrupt, "stored value is shorter than a header"), true};
  } else {
    check = check_frame_header(header, key, namespace_hash_, file_bytes - kFrameHeaderBytes,
                               dst.size(), page_format_);
    if (check.status && !read_exact(fd, dst, kFrameHeaderBytes)) {
      check = FrameCheck{make_error(ErrorCode::kCorrupt, "stored value shrank while read"), true};
    }
    if (check.status) check = check_frame_payload(header, dst);
  }
  if (!check.status) {
    StorageCounters::add(check.foreign_format ? counters_.foreign_format_values
                                              : counters_.corrupt_values);
    log_failure("file storage: '" + path + "': " + check.status.error().message);
    if (check.damaged) drop_damaged(key);
    return check.status;
  }
  StorageCounters::add(counters_.get_hits);
  StorageCounters::add(counters_.bytes_read, dst.size());
  return {};
}

std::vector<Status> FileBackend::set(std::span<const uint64_t> keys,
                                     std::span<const std::span<const std::byte>> values) {
  STRATA_CHECK_MSG(keys.size() == values.size(), "set: one value per key");
  std::vector<Status> results;
  results.reserve(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    Status s = set_one(keys[i], values[i]);
    if (!s) {
      StorageCounters::add(counters_.set_errors);
      log_failure(s.error().message);
    }
    results.push_back(std::move(s));
  }
  return results;
}

Status FileBackend::set_one(uint64_t key, std::span<const std::byte> value) {
  const auto size_bytes = static_cast<int64_t>(kFrameHeaderBytes + value.size());
  const std::string path = value_path(key);
  std::lock_guard lock(mutex_);
  struct stat st;
  if (::stat(path.c_str(), &st) == 0) {
    StorageCounters::add(counters_.set_skipped_existing);
    return {};
  }
  if (const int err = errno; err != ENOENT) {
    return make_error(ErrorCode::kIoError, "file storage: stat '" + path + "': " + errno_text(err));
  }
  if (capacity_bytes_ > 0 && size_bytes > capacity_bytes_) {
    return make_error(ErrorCode::kResourceExhausted,
                      "file storage: a value of " + std::to_string(size_bytes) +
                          " bytes exceeds the capacity of " + std::to_string(capacity_bytes_));
  }
  if (auto s = make_room(size_bytes); !s) return s;
  if (auto s = write_atomically(key, value); !s) return s;
  index_insert(key, size_bytes);
  StorageCounters::add(counters_.set_written);
  StorageCounters::add(counters_.bytes_written, value.size());
  return {};
}

Status FileBackend::make_room(int64_t size_bytes) {
  if (capacity_bytes_ == 0) return {};
  while (used_bytes_ + size_bytes > capacity_bytes_ && !write_order_.empty()) {
    const uint64_t victim = write_order_.front();
    const std::string path = value_path(victim);
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
      const int err = errno;
      return make_error(ErrorCode::kIoError,
                        "file storage: cannot evict '" + path + "': " + errno_text(err));
    }
    index_erase(victim);
    StorageCounters::add(counters_.evicted);
  }
  return {};
}

Status FileBackend::write_atomically(uint64_t key, std::span<const std::byte> value) {
  const std::string hex = storage_key_hex(key);
  const std::string shard = root_ + "/" + hex.substr(0, 2);
  if (::mkdir(shard.c_str(), 0755) != 0 && errno != EEXIST) {
    const int err = errno;
    return write_error("file storage: cannot create '" + shard + "'", err);
  }
  const std::string temp = shard + "/.tmp." + hex + "." + std::to_string(::getpid()) + "." +
                           std::to_string(temp_counter_.fetch_add(1));
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int err = errno;
    return write_error("file storage: cannot create '" + temp + "'", err);
  }

  std::array<std::byte, kFrameHeaderBytes> header;
  encode_frame_header(key, namespace_hash_, value, header, page_format_);
  int err = 0;
  if (!write_all(fd, header) || !write_all(fd, value)) err = errno;
  if (::close(fd) != 0 && err == 0) err = errno;
  const std::string path = shard + "/" + hex;
  if (err == 0 && ::rename(temp.c_str(), path.c_str()) != 0) err = errno;
  if (err != 0) {
    ::unlink(temp.c_str());
    return write_error("file storage: cannot write '" + path + "'", err);
  }
  return {};
}

void FileBackend::drop_damaged(uint64_t key) {
  const std::string path = value_path(key);
  std::lock_guard lock(mutex_);
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    const int err = errno;
    log_failure("file storage: cannot remove damaged '" + path + "': " + errno_text(err));
  }
  index_erase(key);
}

void FileBackend::index_insert(uint64_t key, int64_t size_bytes) {
  index_erase(key);
  write_order_.push_back(key);
  index_.emplace(key, IndexEntry{size_bytes, std::prev(write_order_.end())});
  used_bytes_ += size_bytes;
}

void FileBackend::index_erase(uint64_t key) {
  const auto it = index_.find(key);
  if (it == index_.end()) return;
  used_bytes_ -= it->second.size_bytes;
  write_order_.erase(it->second.order_it);
  index_.erase(it);
}

void FileBackend::log_failure(const std::string& message) {
  uint64_t suppressed = 0;
  if (log_throttle_.allow(suppressed)) {
    STRATA_LOG_WARN("{} ({} similar failures not logged)", message, suppressed);
  }
}

}  // namespace strata
