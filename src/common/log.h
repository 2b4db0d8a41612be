// Logging through spdlog. One process-wide logger named "strata".
#pragma once

#include <spdlog/spdlog.h>

#include <string_view>

namespace strata {

// Sets the level from a name: trace, debug, info, warn, error, off. Returns false for
// an unknown name (the level is then unchanged).
bool set_log_level(std::string_view name);

}  // namespace strata

#define STRATA_LOG_DEBUG(...) SPDLOG_DEBUG(__VA_ARGS__)
#define STRATA_LOG_INFO(...) spdlog::info(__VA_ARGS__)
#define STRATA_LOG_WARN(...) spdlog::warn(__VA_ARGS__)
#define STRATA_LOG_ERROR(...) spdlog::error(__VA_ARGS__)
