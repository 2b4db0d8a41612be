// The completion of a KV page transfer, shared by the transports.
#pragma once

#include <functional>

#include "common/result.h"

namespace strata {

// Called exactly once with the transfer's outcome, on the transport's own thread, never
// inside the call that started the transfer. It may start another transfer; it must not
// block for long (it holds up the transport's other completions) nor destroy the
// transport.
using TransferDone = std::function<void(Status)>;

}  // namespace strata
