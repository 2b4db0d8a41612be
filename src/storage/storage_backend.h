// The storage tier (L3) of the hierarchical KV cache: one interface over the backends
// (file, redis), their configuration, and the framing that lets a read prove that the
// bytes it got are the complete value it asked for.
//
// Values. A value is one page's KV bytes (page_bytes, the same for every page of one
// server, typically 100 KB to 2 MB), opaque here. Keys are 64-bit block hashes. A
// namespace (StorageConfig::name_space) isolates models and KV shapes that share a store.
// Every stored value is framed (see "Framing" below) with its key and namespace, so a
// damaged, truncated, extended or foreign value is reported kCorrupt, never ok.
//
// Ownership. The hierarchical cache owns one StorageBackend (make_storage_backend).
// Callers own every buffer passed in and out; a backend keeps no reference after a call.
//
// Threading. Every StorageBackend call is thread-safe and blocking (file I/O or a network
// round trip per batch), so the cache calls them from its storage thread, never from the
// scheduler thread. A call answers one result per item of its batch.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/clock.h"
#include "common/result.h"

namespace strata {

struct StorageConfig {
  std::string backend;     // "file" or "redis"
  std::string name_space;  // required, set by the server (not the JSON); [A-Za-z0-9._-],
                           // 1..128 chars, not starting with '.'
  // What a value's bytes are (kv_page_format: the KV dtype and block order), set by the
  // server (not the JSON), written into every frame and checked on every read: a value of
  // another format is never read as this server's (issue 54). 0: unspecified.
  uint32_t page_format = 0;
  // file
  std::string dir = "./strata-kv-store";  // root directory; values under dir/<name_space>/
  int64_t capacity_bytes = 0;  // cap on stored bytes (framing included), >= 0; 0: unbounded
  // redis
  std::string host = "127.0.0.1";  // server address (name or IP)
  int port = 6379;                 // TCP port, 1..65535
  int db = 0;                      // database index for SELECT, >= 0
  std::string password;            // AUTH password; empty: no AUTH
  int timeout_ms = 1000;           // per socket read/write, >= 1; connects use min(this, 500)
  // prefetch (parsed here because they arrive in the same JSON; used by the cache)
  int prefetch_threshold = 256;                 // tokens, >= 0
  double prefetch_timeout_base = 0.5;           // seconds, >= 0
  double prefetch_timeout_per_ki_token = 0.25;  // seconds per 1024 tokens, >= 0
};

// Parses --hicache-storage-backend and --hicache-storage-backend-extra-config (a JSON
// object string, "@path" naming a JSON file, or empty for the defaults). Keys are the
// StorageConfig field names above, except name_space (the server sets it). Unknown keys,
// wrong types, out-of-range values and keys of the other backend are kInvalidArgument
// errors naming the key; an unreadable "@path" is kIoError naming the path.
Result<StorageConfig> parse_storage_config(std::string_view backend, std::string_view extra_config);

// Tallies since the backend was made. Item counters count batch items, not calls.
struct StorageStats {
  uint64_t exists_calls = 0;          // exists() calls
  uint64_t exists_errors = 0;         // keys answered false because the backend failed
  uint64_t get_hits = 0;              // values read and verified
  uint64_t get_misses = 0;            // keys not in the store
  uint64_t get_errors = 0;            // items failed by the backend (I/O, connection)
  uint64_t corrupt_values = 0;        // values that failed their checks
  uint64_t set_written = 0;           // values written
  uint64_t set_skipped_existing = 0;  // values not written because the store had them
  uint64_t set_errors = 0;            // items not written: I/O error or capacity full
  uint64_t bytes_read = 0;            // payload bytes of get_hits
  uint64_t bytes_written = 0;         // payload bytes of set_written
  uint64_t evicted = 0;               // values removed to keep under capacity
  // Intact values of the key asked for whose frame names another page format (another KV
  // dtype or block order, or an older frame version): answered kCorrupt, kept (they are
  // another server's), never read as this one's.
  uint64_t foreign_format_values = 0;
};

class StorageBackend {  // thread-safe: every call may come from any thread
 public:
  virtual ~StorageBackend() = default;
  virtual std::string_view name() const = 0;
  // One answer per key. A backend error answers false and is counted.
  virtual std::vector<bool> exists(std::span<const uint64_t> keys) = 0;
  // Reads each value into dst[i] (caller-owned, exactly the value's size). Per item:
  // ok; kNotFound; kCorrupt (bad framing, checksum, wrong key/namespace, short or long
  // value: dst content then unspecified, never to be used); kIoError (backend down).
  // A value found damaged is removed from the store so that a later set can replace it;
  // an intact value merely of another size than dst[i] is kept.
  virtual std::vector<Status> get(std::span<const uint64_t> keys,
                                  std::span<const std::span<std::byte>> dst) = 0;
  // Writes values; keys already present are not rewritten (skipped, counted, ok).
  // kResourceExhausted when the capacity (or the disk) is full; kIoError when the
  // backend is down.
  virtual std::vector<Status> set(std::span<const uint64_t> keys,
                                  std::span<const std::span<const std::byte>> values) = 0;
  virtual StorageStats stats() const = 0;
};

// Makes the configured backend. kInvalidArgument for a bad backend name or a missing or
// bad namespace;
// the file backend fails with kIoError when its directory cannot be created or read. The
// redis backend is made even while Redis is unreachable (its calls then answer kIoError
// until it comes back), so that serving goes on without L3. `clock` paces reconnect
// back-off and log throttling; it must outlive the backend.
Result<std::unique_ptr<StorageBackend>> make_storage_backend(
    const StorageConfig& config, const Clock& clock = SteadyClock::instance());

// kInvalidArgument unless `name_space` is usable as a path component and a key part.
Status validate_storage_namespace(std::string_view name_space);

// ---- Framing ----
//
// A stored value is a 56-byte header followed by the payload. Header fields are
// little-endian:
//
//   offset  0  u32  magic "STKV"
//   offset  4  u16  format version (2)
//   offset  6  u16  header bytes (56)
//   offset  8  u64  key
//   offset 16  u64  namespace hash (storage_namespace_hash)
//   offset 24  u64  payload bytes
//   offset 32  u64  XXH3-64 of the payload
//   offset 40  u32  page format (StorageConfig::page_format: the payload's KV dtype and
//                   block order)
//   offset 44  u32  0
//   offset 48  u64  XXH3-64 of bytes 0..47 (so a damaged header is never trusted)
//
// Version 1 (48 bytes, no page format; before issue 54) is read as a foreign format: kept,
// counted, never used.

inline constexpr size_t kFrameHeaderBytes = 56;

uint64_t storage_namespace_hash(std::string_view name_space);

// The header of `payload` stored under `key` in the namespace with `namespace_hash`.
void encode_frame_header(uint64_t key, uint64_t namespace_hash, std::span<const std::byte> payload,
                         std::span<std::byte, kFrameHeaderBytes> header, uint32_t page_format = 0);

// Header then payload, in one buffer (what the redis backend stores).
std::vector<std::byte> frame_value(uint64_t key, uint64_t namespace_hash,
                                   std::span<const std::byte> payload, uint32_t page_format = 0);

// The outcome of checking a value read back. `damaged` tells the store to drop the value:
// it is not an intact value of this key and namespace. A kCorrupt status with `damaged`
// false is an intact value whose payload size differs from the caller's buffer.
struct FrameCheck {
  Status status;
  bool damaged = false;
  // An intact value of this key and namespace in another page format (or frame version):
  // kCorrupt, not damaged, counted as StorageStats::foreign_format_values.
  bool foreign_format = false;
};

// Checks a header read back against the key and namespace asked for, and its declared
// payload length against `stored_payload_bytes` (what follows the header in the store)
// and `dst_bytes` (the caller's buffer).
FrameCheck check_frame_header(std::span<const std::byte, kFrameHeaderBytes> header, uint64_t key,
                              uint64_t namespace_hash, uint64_t stored_payload_bytes,
                              size_t dst_bytes, uint32_t page_format = 0);

// Checks the payload against the checksum of a header that check_frame_header accepted.
FrameCheck check_frame_payload(std::span<const std::byte, kFrameHeaderBytes> header,
                               std::span<const std::byte> payload);

// Checks a whole stored value (header then payload) and copies its payload into dst.
FrameCheck unframe_value(std::span<const std::byte> stored, uint64_t key, uint64_t namespace_hash,
                         std::span<std::byte> dst, uint32_t page_format = 0);

// ---- Shared by the backends ----

// The counters behind StorageStats. Each is an independent tally, so relaxed atomics.
struct StorageCounters {
  std::atomic<uint64_t> exists_calls{0}, exists_errors{0}, get_hits{0}, get_misses{0},
      get_errors{0}, corrupt_values{0}, set_written{0}, set_skipped_existing{0}, set_errors{0},
      bytes_read{0}, bytes_written{0}, evicted{0}, foreign_format_values{0};

  static void add(std::atomic<uint64_t>& counter, uint64_t n = 1) {
    counter.fetch_add(n, std::memory_order_relaxed);
  }
  StorageStats snapshot() const;
};

// Lets a backend log a failure at most once per `interval_ms`, so that a dead backend
// under a steady stream of batches logs a line every few seconds, not one per item.
// Thread-safe.
class LogThrottle {
 public:
  explicit LogThrottle(const Clock& clock, int64_t interval_ms = 5000)
      : clock_(clock), interval_ms_(interval_ms) {}
  // True when a line may be logged now; `suppressed` is then the number of failures
  // swallowed since the last line.
  bool allow(uint64_t& suppressed);

 private:
  const Clock& clock_;
  const int64_t interval_ms_;
  std::mutex mutex_;
  bool logged_ = false;      // GUARDED_BY(mutex_)
  int64_t last_log_ms_ = 0;  // GUARDED_BY(mutex_)
  uint64_t suppressed_ = 0;  // GUARDED_BY(mutex_)
};

// The 16 lowercase hex digits of a key, as used in file names and Redis keys.
std::string storage_key_hex(uint64_t key);

}  // namespace strata
