// Conversion of JSON data into template values, as the reference's
// convertToRuntimeValues converts parsed JSON: integral numbers (also 1.0) become integers,
// other numbers floats, objects keep their member order.
//
// Member order matters: `tojson` and `items()` print members in order, so a tool schema
// must arrive in the order the client sent it. nlohmann::ordered_json keeps that order;
// nlohmann::json sorts keys, so converting from it renders keys alphabetically.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "text/jinja/value.h"

namespace strata::jinja {

template <typename Json>
Value to_value(const Json& json) {
  using Type = typename Json::value_t;
  switch (json.type()) {
    case Type::null:
    case Type::discarded:
      return Value::null();
    case Type::boolean:
      return Value::boolean(json.template get<bool>());
    case Type::number_integer:
      return Value::integer(static_cast<double>(json.template get<int64_t>()));
    case Type::number_unsigned:
      return Value::integer(static_cast<double>(json.template get<uint64_t>()));
    case Type::number_float: {
      const double d = json.template get<double>();
      if (std::isfinite(d) && std::floor(d) == d) return Value::integer(d);
      return Value::floating(d);
    }
    case Type::string:
      return Value::string(json.template get_ref<const std::string&>());
    case Type::array: {
      Array items;
      items.reserve(json.size());
      for (const auto& item : json) items.push_back(to_value(item));
      return Value::array(std::move(items));
    }
    case Type::object: {
      Object entries;
      entries.reserve(json.size());
      for (auto it = json.begin(); it != json.end(); ++it)
        entries.append_unique(it.key(), to_value(it.value()));
      return Value::object(std::move(entries));
    }
    case Type::binary:
      break;
  }
  return Value::null();
}

}  // namespace strata::jinja
