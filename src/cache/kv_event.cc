#include "cache/kv_event.h"

namespace strata {

std::string_view medium_wire_name(Medium m) {
  switch (m) {
    case Medium::kDevice:
      return "GPU";
    case Medium::kHost:
      return "CPU_PINNED";
    case Medium::kStorage:
      return "DISK";
  }
  return "GPU";
}

}  // namespace strata
