// When a device page gets its host copy (hierarchical cache only; SGLang HiCache's
// --hicache-write-policy). Public: `strata serve` parses it, the engine's options carry it.
#pragma once

#include <cstdint>
#include <string_view>

#include "common/result.h"

namespace strata {

enum class WritePolicy : uint8_t {
  kWriteThrough,           // when the block is inserted
  kWriteThroughSelective,  // when the block's node was hit write_through_threshold times
  kWriteBack,              // when the block is evicted from the device
};
// "write_through", "write_through_selective", "write_back".
Result<WritePolicy> parse_write_policy(std::string_view name);
std::string_view write_policy_name(WritePolicy policy);

}  // namespace strata
