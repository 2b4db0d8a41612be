// Small helpers the model's file writers and readers share (make_model.cc, make_gguf.cc,
// make_tokenizer.cc, gguf_tokenizer.cc): one definition each, so that the module stays
// unity-clean (README, Tests: no two files of a target may define one name in an anonymous
// namespace).
#pragma once

#include <nlohmann/json.hpp>

#include <filesystem>
#include <string>
#include <string_view>

#include "common/result.h"

namespace strata {

// `s` with ASCII letters lowered (names, types and flags: no locale).
std::string ascii_lower(std::string_view s);

// The JSON document in `path`. kNotFound: it cannot be opened; kCorrupt: "<path> is not
// valid JSON".
Result<nlohmann::json> read_json_file(const std::filesystem::path& path);

}  // namespace strata
