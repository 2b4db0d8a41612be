// Helpers shared by the model tests: scratch folders in the build tree, whole-file reads.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

namespace strata {

// An empty folder <build>/test-tmp/<name>_<pid> (emptied when it exists).
inline std::filesystem::path fresh_test_dir(const std::string& name) {
  const std::filesystem::path dir = std::filesystem::path(STRATA_BINARY_DIR) / "test-tmp" /
                                    (name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

inline std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace strata
