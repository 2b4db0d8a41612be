#include "request/json_fields.h"

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <string>

#include "text/tokenizer/utf8.h"

namespace strata {

template <class Json>
Result<Json> parse_json_object_as(const std::string& body) {
  if (!utf8::is_valid(body)) return bad_argument("the request body is not valid UTF-8");
  Json j = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return bad_argument("the request body is not valid JSON");
  if (!j.is_object()) return bad_argument("the request body must be a JSON object");
  return j;
}

template <class Json>
Result<std::optional<bool>> get_bool(const Json& obj, const char* key) {
  const auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return std::optional<bool>();
  if (!it->is_boolean()) return bad_argument(std::string("'") + key + "' must be a boolean");
  return std::optional<bool>(it->template get<bool>());
}

template <class Json>
Result<std::optional<int64_t>> get_int(const Json& obj, const char* key, int64_t lo, int64_t hi) {
  const auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return std::optional<int64_t>();
  int64_t v;
  if (it->is_number_integer()) {
    if (it->is_number_unsigned() &&
        it->template get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
      return bad_argument(std::string("'") + key + "' is out of range");
    }
    v = it->template get<int64_t>();
  } else if (it->is_number_float() &&
             it->template get<double>() ==
                 static_cast<double>(static_cast<int64_t>(it->template get<double>()))) {
    v = static_cast<int64_t>(it->template get<double>());
  } else {
    return bad_argument(std::string("'") + key + "' must be an integer");
  }
  if (v < lo || v > hi) {
    return bad_argument(std::string("'") + key + "' must be in [" + std::to_string(lo) + ", " +
                        std::to_string(hi) + "], got " + std::to_string(v));
  }
  return std::optional<int64_t>(v);
}

template <class Json>
Result<std::optional<double>> get_number(const Json& obj, const char* key, double lo, double hi) {
  const auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return std::optional<double>();
  if (!it->is_number()) return bad_argument(std::string("'") + key + "' must be a number");
  const double v = it->template get<double>();
  if (!(v >= lo && v <= hi)) {
    return bad_argument(std::string("'") + key + "' must be in [" + std::to_string(lo) + ", " +
                        std::to_string(hi) + "]");
  }
  return std::optional<double>(v);
}

template <class Json>
Result<std::optional<std::string>> get_string(const Json& obj, const char* key) {
  const auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return std::optional<std::string>();
  if (!it->is_string()) return bad_argument(std::string("'") + key + "' must be a string");
  return std::optional<std::string>(it->template get<std::string>());
}

template <class Json>
Result<std::vector<int32_t>> parse_token_ids(const Json& value, const char* field) {
  if (!value.is_array())
    return bad_argument(std::string("'") + field + "' must be an array of token ids");
  std::vector<int32_t> out;
  out.reserve(value.size());
  for (const auto& v : value) {
    if (!v.is_number_integer() ||
        (v.is_number_unsigned() && v.template get<uint64_t>() > INT32_MAX) ||
        v.template get<int64_t>() < 0 || v.template get<int64_t>() > INT32_MAX) {
      return bad_argument(std::string("'") + field + "' must hold non-negative integer token ids");
    }
    out.push_back(static_cast<int32_t>(v.template get<int64_t>()));
  }
  return out;
}

template <class Json>
Result<std::vector<BlockHash>> parse_block_hashes(const Json& value) {
  if (!value.is_array()) return bad_argument("'block_hashes' must be an array of 64-bit integers");
  std::vector<BlockHash> out;
  out.reserve(value.size());
  for (const auto& v : value) {
    if (v.is_number_unsigned()) {
      out.push_back(v.template get<uint64_t>());
    } else if (v.is_number_integer()) {
      out.push_back(block_hash_from_wire(v.template get<int64_t>()));
    } else if (v.is_string()) {
      // Decimal strings, for clients whose JSON numbers are doubles (JavaScript).
      const std::string& s = v.template get_ref<const std::string&>();
      errno = 0;
      char* end = nullptr;
      if (!s.empty() && s[0] == '-') {
        const long long x = std::strtoll(s.c_str(), &end, 10);
        if (errno != 0 || end != s.c_str() + s.size() || s.size() < 2 ||
            !std::isdigit(static_cast<unsigned char>(s[1]))) {
          return bad_argument("'block_hashes' holds a string that is not a 64-bit integer: '" + s +
                              "'");
        }
        out.push_back(block_hash_from_wire(x));
      } else {
        const unsigned long long x = std::strtoull(s.c_str(), &end, 10);
        if (s.empty() || errno != 0 || end != s.c_str() + s.size() ||
            !std::isdigit(static_cast<unsigned char>(s[0]))) {
          return bad_argument("'block_hashes' holds a string that is not a 64-bit integer: '" + s +
                              "'");
        }
        out.push_back(x);
      }
    } else {
      return bad_argument("'block_hashes' must hold 64-bit integers (or their decimal strings)");
    }
  }
  return out;
}

// The two JSON kinds the routes read.
#define STRATA_JSON_FIELDS_INSTANTIATE(J)                                                      \
  template Result<J> parse_json_object_as<J>(const std::string&);                              \
  template Result<std::optional<bool>> get_bool<J>(const J&, const char*);                     \
  template Result<std::optional<int64_t>> get_int<J>(const J&, const char*, int64_t, int64_t); \
  template Result<std::optional<double>> get_number<J>(const J&, const char*, double, double); \
  template Result<std::optional<std::string>> get_string<J>(const J&, const char*);            \
  template Result<std::vector<BlockHash>> parse_block_hashes<J>(const J&);                     \
  template Result<std::vector<int32_t>> parse_token_ids<J>(const J&, const char*);

STRATA_JSON_FIELDS_INSTANTIATE(nlohmann::json)
STRATA_JSON_FIELDS_INSTANTIATE(nlohmann::ordered_json)
#undef STRATA_JSON_FIELDS_INSTANTIATE

}  // namespace strata
