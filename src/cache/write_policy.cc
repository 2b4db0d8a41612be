#include "cache/write_policy.h"

#include <string>

namespace strata {

Result<WritePolicy> parse_write_policy(std::string_view name) {
  if (name == "write_through") return WritePolicy::kWriteThrough;
  if (name == "write_through_selective") return WritePolicy::kWriteThroughSelective;
  if (name == "write_back") return WritePolicy::kWriteBack;
  return make_error(ErrorCode::kInvalidArgument,
                    "unknown write policy '" + std::string(name) +
                        "' (write_through, write_through_selective or write_back)");
}

std::string_view write_policy_name(WritePolicy policy) {
  switch (policy) {
    case WritePolicy::kWriteThrough:
      return "write_through";
    case WritePolicy::kWriteThroughSelective:
      return "write_through_selective";
    case WritePolicy::kWriteBack:
      return "write_back";
  }
  return "write_through";
}

}  // namespace strata
