// Reading a tokenizer.json component's config (a normalizer, pre-tokenizer or decoder
// entry) the way the reference (@lenml/tokenizers, in JavaScript) reads it.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace strata {

// The component's "type", or "" when it is absent or not a string.
inline std::string component_type(const nlohmann::json& config) {
  const auto it = config.find("type");
  return it != config.end() && it->is_string() ? it->get<std::string>() : std::string();
}

// JavaScript truthiness of an optional boolean-ish field: absent and null are false,
// numbers are true unless 0, strings unless empty, anything else is true.
inline bool component_truthy(const nlohmann::json& config, const char* key) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) return false;
  if (it->is_boolean()) return it->get<bool>();
  if (it->is_number()) return it->get<double>() != 0;
  if (it->is_string()) return !it->get<std::string>().empty();
  return true;
}

}  // namespace strata
