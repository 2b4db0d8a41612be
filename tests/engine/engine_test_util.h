// Helpers shared by the engine tests: run a request stream to its end.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/engine.h"

namespace strata {

struct Outcome {
  std::vector<int32_t> tokens;
  FinishReason reason = FinishReason::kError;
  RequestUsage usage;
  std::string error;
};

inline Outcome drain(RequestStream& stream) {
  Outcome out;
  for (int i = 0; i < 6000; ++i) {
    for (StreamItem& item : stream.wait(10)) {
      for (const auto& t : item.tokens) out.tokens.push_back(t.token);
      if (item.finish) {
        out.reason = *item.finish;
        out.usage = item.usage;
        out.error = item.error;
        return out;
      }
    }
  }
  ADD_FAILURE() << "request did not finish";
  return out;
}

}  // namespace strata
