#include "memory/copy_device.h"

#include <string>

namespace strata {

Result<CopyPath> parse_copy_path(std::string_view name) {
  if (name == "direct") return CopyPath::kDirect;
  if (name == "kernel") return CopyPath::kKernel;
  return bad_argument("unknown I/O backend '" + std::string(name) + "' (direct or kernel)");
}

std::string_view copy_path_name(CopyPath path) {
  return path == CopyPath::kDirect ? "direct" : "kernel";
}

}  // namespace strata
