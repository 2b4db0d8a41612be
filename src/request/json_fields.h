// Typed reading of JSON request fields, shared by the worker (`strata serve`) and the
// router (`strata route`), so that both accept and refuse the same inputs with the same
// messages. Every check fails with kInvalidArgument and a message that names the field.
//
// Each function is defined for both JSON kinds the routes use: nlohmann::json (fields
// read by key) and nlohmann::ordered_json (what is rendered: messages, tools, kwargs keep
// the client's key order).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cache/block_hash.h"
#include "common/result.h"

namespace strata {

// Parses a body as a JSON object (kInvalidArgument for malformed JSON, invalid UTF-8
// or a non-object).
template <class Json>
Result<Json> parse_json_object_as(const std::string& body);
inline Result<nlohmann::json> parse_json_object(const std::string& body) {
  return parse_json_object_as<nlohmann::json>(body);
}

// Typed optional getters: absent or null gives nullopt; a wrong type or range is an error.
template <class Json>
Result<std::optional<bool>> get_bool(const Json& obj, const char* key);
template <class Json>
Result<std::optional<int64_t>> get_int(const Json& obj, const char* key, int64_t lo, int64_t hi);
template <class Json>
Result<std::optional<double>> get_number(const Json& obj, const char* key, double lo, double hi);
template <class Json>
Result<std::optional<std::string>> get_string(const Json& obj, const char* key);

// Block hashes from JSON: signed or unsigned 64-bit integers, or their decimal strings
// (JavaScript clients cannot hold 64-bit integers exactly). A negative number is the
// two's complement of the unsigned hash (block_hash_from_wire).
template <class Json>
Result<std::vector<BlockHash>> parse_block_hashes(const Json& value);

// Token ids from JSON: non-negative 32-bit integers.
template <class Json>
Result<std::vector<int32_t>> parse_token_ids(const Json& value, const char* field);

}  // namespace strata
