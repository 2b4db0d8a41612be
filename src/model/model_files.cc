#include "model/model_files.h"

#include <fstream>
#include <sstream>

namespace strata {

std::string ascii_lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

Result<nlohmann::json> read_json_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(ErrorCode::kNotFound, "cannot open " + path.string());
  std::ostringstream buf;
  buf << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(buf.str(), nullptr, false);
  if (j.is_discarded()) {
    return make_error(ErrorCode::kCorrupt, path.string() + " is not valid JSON");
  }
  return j;
}

}  // namespace strata
