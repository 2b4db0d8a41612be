#include "storage/storage_backend.h"

#include <xxhash.h>

#include <bit>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "storage/file_backend.h"
#include "storage/redis_backend.h"

namespace strata {

namespace {

static_assert(std::endian::native == std::endian::little,
              "the frame header is written in host order, which must be little-endian");

constexpr uint32_t kFrameMagic = 0x564B5453;  // "STKV" read as a little-endian u32
constexpr uint16_t kFrameVersion = 2;
constexpr size_t kHeaderChecksumOffset = 48;
constexpr uint16_t kFrameVersion1 = 1;  // 48 bytes, no page format

// ---- config parsing ----

using Json = nlohmann::json;

Status invalid(const std::string& message) {
  return make_error(ErrorCode::kInvalidArgument, "storage config: " + message);
}

Status read_int64(const Json& v, std::string_view key, int64_t min, int64_t max, int64_t& out) {
  if (!v.is_number_integer()) {
    return invalid("key '" + std::string(key) + "' must be an integer, got " + v.dump());
  }
  // An unsigned value above int64's range is out of range too.
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(max)) {
    return invalid("key '" + std::string(key) + "' is out of range: " + v.dump());
  }
  const int64_t value = v.get<int64_t>();
  if (value < min || value > max) {
    return invalid("key '" + std::string(key) + "' must be in [" + std::to_string(min) + ", " +
                   std::to_string(max) + "], got " + v.dump());
  }
  out = value;
  return {};
}

Status read_int(const Json& v, std::string_view key, int min, int max, int& out) {
  int64_t wide = 0;
  if (auto s = read_int64(v, key, min, max, wide); !s) return s;
  out = static_cast<int>(wide);
  return {};
}

Status read_seconds(const Json& v, std::string_view key, double& out) {
  if (!v.is_number()) {
    return invalid("key '" + std::string(key) + "' must be a number, got " + v.dump());
  }
  const double value = v.get<double>();
  if (!(value >= 0.0) || value > 1e6) {
    return invalid("key '" + std::string(key) + "' must be in [0, 1e6] seconds, got " + v.dump());
  }
  out = value;
  return {};
}

Status read_string(const Json& v, std::string_view key, bool allow_empty, std::string& out) {
  if (!v.is_string()) {
    return invalid("key '" + std::string(key) + "' must be a string, got " + v.dump());
  }
  std::string value = v.get<std::string>();
  if (value.empty() && !allow_empty) return invalid("key '" + std::string(key) + "' is empty");
  out = std::move(value);
  return {};
}

// One accepted key: which backend it belongs to ("" for all) and how it is stored.
struct KeyRule {
  std::string_view name;
  std::string_view backend;
  std::function<Status(const Json&, StorageConfig&)> apply;
};

const std::vector<KeyRule>& key_rules() {
  static const std::vector<KeyRule> rules = {
      {"dir", "file",
       [](const Json& v, StorageConfig& c) { return read_string(v, "dir", false, c.dir); }},
      {"capacity_bytes", "file",
       [](const Json& v, StorageConfig& c) {
         return read_int64(v, "capacity_bytes", 0, std::numeric_limits<int64_t>::max(),
                           c.capacity_bytes);
       }},
      {"host", "redis",
       [](const Json& v, StorageConfig& c) { return read_string(v, "host", false, c.host); }},
      {"port", "redis",
       [](const Json& v, StorageConfig& c) { return read_int(v, "port", 1, 65535, c.port); }},
      {"db", "redis",
       [](const Json& v, StorageConfig& c) {
         return read_int(v, "db", 0, std::numeric_limits<int>::max(), c.db);
       }},
      {"password", "redis",
       [](const Json& v, StorageConfig& c) {
         return read_string(v, "password", true, c.password);
       }},
      {"timeout_ms", "redis",
       [](const Json& v, StorageConfig& c) {
         return read_int(v, "timeout_ms", 1, 3'600'000, c.timeout_ms);
       }},
      {"prefetch_threshold", "",
       [](const Json& v, StorageConfig& c) {
         return read_int(v, "prefetch_threshold", 0, std::numeric_limits<int>::max(),
                         c.prefetch_threshold);
       }},
      {"prefetch_timeout_base", "",
       [](const Json& v, StorageConfig& c) {
         return read_seconds(v, "prefetch_timeout_base", c.prefetch_timeout_base);
       }},
      {"prefetch_timeout_per_ki_token", "",
       [](const Json& v, StorageConfig& c) {
         return read_seconds(v, "prefetch_timeout_per_ki_token", c.prefetch_timeout_per_ki_token);
       }},
  };
  return rules;
}

// The JSON text of the extra config: inline, or the contents of the file after '@'.
Result<std::string> extra_config_text(std::string_view extra_config) {
  if (extra_config.empty() || extra_config.front() != '@') return std::string(extra_config);
  const std::string path(extra_config.substr(1));
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return make_error(ErrorCode::kIoError,
                      "storage config: cannot read extra config file '" + path + "'");
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) {
    return make_error(ErrorCode::kIoError,
                      "storage config: error reading extra config file '" + path + "'");
  }
  return text.str();
}

Status apply_extra_config(const Json& object, StorageConfig& config) {
  for (const auto& [key, value] : object.items()) {
    const KeyRule* rule = nullptr;
    for (const KeyRule& r : key_rules()) {
      if (r.name == key) rule = &r;
    }
    if (rule == nullptr) return invalid("unknown key '" + key + "'");
    if (!rule->backend.empty() && rule->backend != config.backend) {
      return invalid("key '" + key + "' belongs to the " + std::string(rule->backend) +
                     " backend, not " + config.backend);
    }
    if (auto s = rule->apply(value, config); !s) return s;
  }
  return {};
}

uint64_t load_u64(const std::byte* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

void store_u64(std::byte* p, uint64_t v) {
  std::memcpy(p, &v, sizeof v);
}

FrameCheck corrupt(bool damaged, std::string message) {
  return FrameCheck{make_error(ErrorCode::kCorrupt, std::move(message)), damaged};
}

}  // namespace

Result<StorageConfig> parse_storage_config(std::string_view backend,
                                           std::string_view extra_config) {
  StorageConfig config;
  if (backend != "file" && backend != "redis") {
    return make_error(
        ErrorCode::kInvalidArgument,
        "unknown storage backend '" + std::string(backend) + "'; expected 'file' or 'redis'");
  }
  config.backend = std::string(backend);
  auto text = extra_config_text(extra_config);
  if (!text) return std::unexpected(text.error());
  if (text->find_first_not_of(" \t\r\n") == std::string::npos) return config;
  Json object;
  try {
    object = Json::parse(*text);
  } catch (const Json::parse_error& e) {
    return make_error(ErrorCode::kInvalidArgument,
                      std::string("storage config: malformed JSON: ") + e.what());
  }
  if (!object.is_object()) return std::unexpected(invalid("expected a JSON object").error());
  if (auto s = apply_extra_config(object, config); !s) return std::unexpected(s.error());
  return config;
}

Status validate_storage_namespace(std::string_view name_space) {
  if (name_space.empty()) {
    return make_error(ErrorCode::kInvalidArgument,
                      "storage namespace is not set (the server sets it to tell models apart)");
  }
  if (name_space.size() > 128) {
    return make_error(ErrorCode::kInvalidArgument,
                      "storage namespace must have at most 128 characters, got " +
                          std::to_string(name_space.size()));
  }
  if (name_space.front() == '.') {
    return make_error(ErrorCode::kInvalidArgument, "storage namespace must not start with '.'");
  }
  for (char ch : name_space) {
    const bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                    (ch >= '0' && ch <= '9') || ch == '.' || ch == '_' || ch == '-';
    if (!ok) {
      return make_error(ErrorCode::kInvalidArgument,
                        "storage namespace '" + std::string(name_space) +
                            "' may hold only letters, digits, '.', '_' and '-'");
    }
  }
  return {};
}

Result<std::unique_ptr<StorageBackend>> make_storage_backend(const StorageConfig& config,
                                                             const Clock& clock) {
  if (auto s = validate_storage_namespace(config.name_space); !s) {
    return std::unexpected(s.error());
  }
  if (config.backend == "file") {
    auto backend = FileBackend::open(config, clock);
    if (!backend) return std::unexpected(backend.error());
    return std::unique_ptr<StorageBackend>(std::move(*backend));
  }
  if (config.backend == "redis") {
    auto backend = RedisBackend::create(config, clock);
    if (!backend) return std::unexpected(backend.error());
    return std::unique_ptr<StorageBackend>(std::move(*backend));
  }
  return make_error(ErrorCode::kInvalidArgument,
                    "unknown storage backend '" + config.backend + "'; expected 'file' or 'redis'");
}

uint64_t storage_namespace_hash(std::string_view name_space) {
  return XXH3_64bits(name_space.data(), name_space.size());
}

void encode_frame_header(uint64_t key, uint64_t namespace_hash, std::span<const std::byte> payload,
                         std::span<std::byte, kFrameHeaderBytes> header, uint32_t page_format) {
  std::byte* h = header.data();
  const uint32_t magic = kFrameMagic;
  const uint16_t version = kFrameVersion;
  const uint16_t header_bytes = kFrameHeaderBytes;
  std::memcpy(h, &magic, 4);
  std::memcpy(h + 4, &version, 2);
  std::memcpy(h + 6, &header_bytes, 2);
  store_u64(h + 8, key);
  store_u64(h + 16, namespace_hash);
  store_u64(h + 24, payload.size());
  store_u64(h + 32, XXH3_64bits(payload.data(), payload.size()));
  const uint32_t zero = 0;
  std::memcpy(h + 40, &page_format, 4);
  std::memcpy(h + 44, &zero, 4);
  store_u64(h + kHeaderChecksumOffset, XXH3_64bits(h, kHeaderChecksumOffset));
}

std::vector<std::byte> frame_value(uint64_t key, uint64_t namespace_hash,
                                   std::span<const std::byte> payload, uint32_t page_format) {
  std::vector<std::byte> stored(kFrameHeaderBytes + payload.size());
  encode_frame_header(key, namespace_hash, payload,
                      std::span<std::byte, kFrameHeaderBytes>(stored.data(), kFrameHeaderBytes),
                      page_format);
  if (!payload.empty()) {
    std::memcpy(stored.data() + kFrameHeaderBytes, payload.data(), payload.size());
  }
  return stored;
}

FrameCheck check_frame_header(std::span<const std::byte, kFrameHeaderBytes> header, uint64_t key,
                              uint64_t namespace_hash, uint64_t stored_payload_bytes,
                              size_t dst_bytes, uint32_t page_format) {
  const std::byte* h = header.data();
  uint32_t magic;
  uint16_t version, header_bytes;
  std::memcpy(&magic, h, 4);
  std::memcpy(&version, h + 4, 2);
  std::memcpy(&header_bytes, h + 6, 2);
  if (magic != kFrameMagic) return corrupt(true, "stored value has no frame header");
  if (version == kFrameVersion1) {
    FrameCheck c = corrupt(false, "stored value has frame version 1, without a page format");
    c.foreign_format = true;
    return c;
  }
  if (version != kFrameVersion || header_bytes != kFrameHeaderBytes) {
    return corrupt(true, "stored value has frame version " + std::to_string(version) +
                             ", expected " + std::to_string(kFrameVersion));
  }
  if (XXH3_64bits(h, kHeaderChecksumOffset) != load_u64(h + kHeaderChecksumOffset)) {
    return corrupt(true, "stored value's frame header fails its checksum");
  }
  if (load_u64(h + 8) != key) return corrupt(true, "stored value belongs to another key");
  if (load_u64(h + 16) != namespace_hash) {
    return corrupt(true, "stored value belongs to another namespace");
  }
  uint32_t stored_format;
  std::memcpy(&stored_format, h + 40, 4);
  if (stored_format != page_format) {
    FrameCheck c =
        corrupt(false, "stored value holds pages of format " + std::to_string(stored_format) +
                           ", this server's are " + std::to_string(page_format));
    c.foreign_format = true;
    return c;
  }
  const uint64_t declared = load_u64(h + 24);
  if (declared != stored_payload_bytes) {
    return corrupt(true, "stored value is " + std::string(declared > stored_payload_bytes
                                                              ? "truncated"
                                                              : "longer than its header says"));
  }
  if (declared != dst_bytes) {
    return corrupt(false, "stored value has " + std::to_string(declared) +
                              " payload bytes, the buffer " + std::to_string(dst_bytes));
  }
  return FrameCheck{};
}

FrameCheck check_frame_payload(std::span<const std::byte, kFrameHeaderBytes> header,
                               std::span<const std::byte> payload) {
  if (XXH3_64bits(payload.data(), payload.size()) != load_u64(header.data() + 32)) {
    return corrupt(true, "stored value's payload fails its checksum");
  }
  return FrameCheck{};
}

FrameCheck unframe_value(std::span<const std::byte> stored, uint64_t key, uint64_t namespace_hash,
                         std::span<std::byte> dst, uint32_t page_format) {
  if (stored.size() < kFrameHeaderBytes) {
    return corrupt(true, "stored value is shorter than a frame header");
  }
  const auto header = stored.first<kFrameHeaderBytes>();
  const auto payload = stored.subspan(kFrameHeaderBytes);
  FrameCheck check =
      check_frame_header(header, key, namespace_hash, payload.size(), dst.size(), page_format);
  if (check.status) check = check_frame_payload(header, payload);
  if (check.status && !payload.empty()) std::memcpy(dst.data(), payload.data(), payload.size());
  return check;
}

StorageStats StorageCounters::snapshot() const {
  auto v = [](const std::atomic<uint64_t>& c) { return c.load(std::memory_order_relaxed); };
  return StorageStats{v(exists_calls),         v(exists_errors),        v(get_hits),
                      v(get_misses),           v(get_errors),           v(corrupt_values),
                      v(set_written),          v(set_skipped_existing), v(set_errors),
                      v(bytes_read),           v(bytes_written),        v(evicted),
                      v(foreign_format_values)};
}

bool LogThrottle::allow(uint64_t& suppressed) {
  const int64_t now_ms = clock_.now_ms();
  std::lock_guard lock(mutex_);
  if (logged_ && now_ms - last_log_ms_ < interval_ms_) {
    ++suppressed_;
    return false;
  }
  logged_ = true;
  last_log_ms_ = now_ms;
  suppressed = suppressed_;
  suppressed_ = 0;
  return true;
}

std::string storage_key_hex(uint64_t key) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(key));
  return std::string(buf, 16);
}

}  // namespace strata
