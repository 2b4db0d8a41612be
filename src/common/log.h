// Logging through spdlog. One process-wide logger named "strata".
#pragma once

#include <spdlog/spdlog.h>

#include <string_view>

namespace strata {

// Sets the level from a name: trace, debug, info, warn, error, off. Returns false for
// an unknown name (the level is then unchanged).
bool set_log_level(std::string_view name);

}  // namespace strata

// Debug lines cost a level check when off (--log-level debug turns them on at run time).
#define STRATA_LOG_DEBUG(...)                                                 \
  do {                                                                        \
    if (spdlog::should_log(spdlog::level::debug)) spdlog::debug(__VA_ARGS__); \
  } while (0)
#define STRATA_LOG_INFO(...) spdlog::info(__VA_ARGS__)
#define STRATA_LOG_WARN(...) spdlog::warn(__VA_ARGS__)
#define STRATA_LOG_ERROR(...) spdlog::error(__VA_ARGS__)
