#include "dashboard/assets.h"

#include <xxhash.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <utility>

#include "dashboard/embedded_files.h"

#ifndef STRATA_VERSION
#error "STRATA_VERSION must be defined by the build (CMakeLists.txt)"
#endif

namespace strata::dashboard {
namespace {

// What stays embedded whatever STRATA_DASHBOARD_DIR says: the vendored library.
constexpr std::array<std::string_view, 2> kVendored = {"d3.min.js", "d3-LICENSE.txt"};

bool vendored(std::string_view name) {
  return std::find(kVendored.begin(), kVendored.end(), name) != kVendored.end();
}

std::string etag_of(std::string_view bytes) {
  char hex[24];
  std::snprintf(hex, sizeof hex, "\"%016llx\"",
                static_cast<unsigned long long>(XXH3_64bits(bytes.data(), bytes.size())));
  return hex;
}

struct Entry {
  std::string_view name;
  std::string_view bytes;
  std::string etag;
};

// The embedded table with each file's ETag, hashed once.
const std::vector<Entry>& embedded() {
  static const std::vector<Entry> table = [] {
    std::vector<Entry> out;
    for (size_t i = 0; i < kNumEmbeddedFiles; ++i) {
      const EmbeddedFile& f = kEmbeddedFiles[i];
      const std::string_view bytes(reinterpret_cast<const char*>(f.bytes), f.size);
      out.push_back(Entry{.name = f.name, .bytes = bytes, .etag = etag_of(bytes)});
    }
    std::sort(out.begin(), out.end(),
              [](const Entry& a, const Entry& b) { return a.name < b.name; });
    return out;
  }();
  return table;
}

const Entry* find_embedded(std::string_view name) {
  const auto& table = embedded();
  const auto it = std::lower_bound(table.begin(), table.end(), name,
                                   [](const Entry& e, std::string_view n) { return e.name < n; });
  return it != table.end() && it->name == name ? &*it : nullptr;
}

// STRATA_DASHBOARD_DIR, or "" when unset.
const std::filesystem::path& override_dir() {
  static const std::filesystem::path dir = [] {
    const char* v = std::getenv("STRATA_DASHBOARD_DIR");
    return std::filesystem::path(v != nullptr ? v : "");
  }();
  return dir;
}

std::optional<std::string> read_file(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return std::nullopt;
  std::ifstream f(path, std::ios::binary);
  if (!f) return std::nullopt;
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

}  // namespace

std::string_view content_type_for(std::string_view name) {
  struct Row {
    std::string_view extension, type;
  };
  static constexpr Row kTypes[] = {
      {".html", "text/html; charset=utf-8"},
      {".js", "text/javascript; charset=utf-8"},
      {".css", "text/css; charset=utf-8"},
      {".svg", "image/svg+xml"},
      {".png", "image/png"},
      {".json", "application/json"},
      {".txt", "text/plain; charset=utf-8"},
  };
  for (const Row& row : kTypes) {
    if (name.size() > row.extension.size() && name.ends_with(row.extension)) return row.type;
  }
  return {};
}

bool valid_asset_name(std::string_view name) {
  if (name.empty() || name.size() > 128 || name.front() == '.') return false;
  for (const char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    if (!ok) return false;
  }
  return !content_type_for(name).empty();
}

std::optional<Asset> find_asset(std::string_view name) {
  if (!valid_asset_name(name)) return std::nullopt;
  const std::filesystem::path& dir = override_dir();
  if (!dir.empty() && !vendored(name)) {
    if (auto bytes = read_file(dir / std::string(name))) {
      std::string etag = etag_of(*bytes);
      return Asset{.content_type = std::string(content_type_for(name)),
                   .etag = std::move(etag),
                   .body = std::move(*bytes)};
    }
  }
  const Entry* e = find_embedded(name);
  if (e == nullptr) return std::nullopt;
  return Asset{.content_type = std::string(content_type_for(name)),
               .etag = e->etag,
               .body = std::string(e->bytes)};
}

std::vector<std::string> embedded_asset_names() {
  std::vector<std::string> out;
  for (const Entry& e : embedded()) out.emplace_back(e.name);
  return out;
}

std::vector<std::string> asset_names() {
  std::vector<std::string> out = embedded_asset_names();
  const std::filesystem::path& dir = override_dir();
  std::error_code ec;
  if (!dir.empty()) {
    for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
      std::string name = entry.path().filename().string();
      if (entry.is_regular_file(ec) && valid_asset_name(name)) out.push_back(std::move(name));
    }
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

bool etag_matches(std::string_view if_none_match, std::string_view etag) {
  auto trim = [](std::string_view s) {
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
    return s;
  };
  auto opaque = [](std::string_view tag) {
    if (tag.starts_with("W/")) tag.remove_prefix(2);
    return tag;
  };
  if (trim(if_none_match) == "*") return true;
  while (!if_none_match.empty()) {
    const size_t comma = if_none_match.find(',');
    const std::string_view tag = trim(if_none_match.substr(0, comma));
    if (!tag.empty() && opaque(tag) == opaque(etag)) return true;
    if (comma == std::string_view::npos) break;
    if_none_match.remove_prefix(comma + 1);
  }
  return false;
}

std::string_view strata_version() {
  return STRATA_VERSION;
}

}  // namespace strata::dashboard
