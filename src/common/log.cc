#include "common/log.h"

#include <string>

namespace strata {

bool set_log_level(std::string_view name) {
  const std::string n(name);
  if (n == "trace")
    spdlog::set_level(spdlog::level::trace);
  else if (n == "debug")
    spdlog::set_level(spdlog::level::debug);
  else if (n == "info")
    spdlog::set_level(spdlog::level::info);
  else if (n == "warn" || n == "warning")
    spdlog::set_level(spdlog::level::warn);
  else if (n == "error")
    spdlog::set_level(spdlog::level::err);
  else if (n == "off")
    spdlog::set_level(spdlog::level::off);
  else
    return false;
  return true;
}

}  // namespace strata
