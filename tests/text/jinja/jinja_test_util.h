// Helpers shared by the Jinja tests: file access, running Node, the fixed clock.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <sstream>
#include <string>

#include <sys/wait.h>
#include <unistd.h>

namespace strata::jinja::test_support {

inline const std::string kDataDir = std::string(STRATA_SOURCE_DIR) + "/tests/text/jinja";
inline const std::string kNodeModules = std::string(STRATA_SOURCE_DIR) + "/tools/js/node_modules";

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline bool sanitizer_build() {
  const char* v = std::getenv("STRATA_SANITIZER_BUILD");
  return v != nullptr && std::string(v) == "1";
}

// The time render_reference.mjs fixes for strftime_now(): 2024-07-26 13:45:00 local.
inline std::tm reference_now() {
  std::tm t{};
  t.tm_year = 2024 - 1900;
  t.tm_mon = 6;
  t.tm_mday = 26;
  t.tm_hour = 13;
  t.tm_min = 45;
  return t;
}

struct CommandResult {
  int exit_code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};

// Runs a shell command, capturing stdout and stderr. Node comes from PATH.
inline CommandResult run_command(const std::string& command) {
  CommandResult result;
  char err_path[] = "/tmp/strata_jinja_stderr_XXXXXX";
  const int fd = mkstemp(err_path);
  if (fd >= 0) close(fd);
  const std::string full = command + " 2>" + err_path;
  FILE* pipe = popen(full.c_str(), "r");
  if (pipe == nullptr) {
    result.err = "popen failed";
    return result;
  }
  char buf[65536];
  size_t n = 0;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) result.out.append(buf, n);
  const int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  result.err = read_file(err_path);
  std::remove(err_path);
  return result;
}

// A shell-safe single-quoted argument.
inline std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out.push_back(c);
    }
  }
  return out + "'";
}

// Environment for Node: a fixed locale so Intl month names are English.
inline std::string node_command(const std::string& script, const std::string& args) {
  return "LC_ALL=C LANG=C node " + shell_quote(script) + " " + args;
}

}  // namespace strata::jinja::test_support
