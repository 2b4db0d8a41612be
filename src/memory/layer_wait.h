// What a forward pass calls before it reads layer `layer` of a sequence's cached KV while the
// pages of its prefix are still being copied in (a load-back overlapped with the pass,
// docs/hierarchical-cache.md): on return that layer's pages are readable by what the pass
// issues next. The CPU engine's wait blocks until the copy threads have landed the layer
// (TransferEngine); a GPU's makes the compute stream wait for the layer's copy event and
// returns at once (StreamTransferEngine). Made by KvTransfers::layer_wait on the scheduler
// thread, called from the thread that runs the pass, layers in increasing order. An error is
// a device fault: the pass fails.
#pragma once

#include <cstdint>
#include <functional>

#include "common/result.h"

namespace strata {

using LayerWait = std::function<Status(int32_t layer)>;

}  // namespace strata
