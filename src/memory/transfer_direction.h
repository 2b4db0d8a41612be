// Which way a KV copy goes between the device pool and the host pool. One vocabulary for
// the tree's requested copies (cache/radix_tree.h) and the copy threads' jobs
// (memory/transfer_engine.h): a backup goes device -> host, a load-back host -> device.
#pragma once

#include <cstdint>

namespace strata {

enum class TransferDirection : uint8_t { kDeviceToHost, kHostToDevice };

}  // namespace strata
