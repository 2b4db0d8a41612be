#include "text/jinja/value.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "text/jinja/error.h"
#include "text/jinja/js_number.h"
#include "text/jinja/unicode.h"

namespace strata::jinja {
namespace {

constexpr char kHexDigits[] = "0123456789abcdef";

void append_u_escape(std::string& out, uint32_t unit) {
  out += "\\u";
  out.push_back(kHexDigits[(unit >> 12) & 0xF]);
  out.push_back(kHexDigits[(unit >> 8) & 0xF]);
  out.push_back(kHexDigits[(unit >> 4) & 0xF]);
  out.push_back(kHexDigits[unit & 0xF]);
}

// ICU root collation (what String.prototype.localeCompare uses) of printable ASCII, in
// order: punctuation and symbols, digits, then letters with lowercase before uppercase.
// Letters share a primary weight with their other case; case only breaks primary ties
// (tertiary level). jinja_tests checks this order against Node.
constexpr std::string_view kAsciiCollationOrder =
    " _-,;:!?.'\"()[]{}@*/\\&#%`^+<=>|~$0123456789"
    "aAbBcCdDeEfFgGhHiIjJkKlLmMnNoOpPqQrRsStTuUvVwWxXyYzZ";

struct CollationWeights {
  int primary;
  int tertiary;
};

CollationWeights collation_weights(char c) {
  const size_t index = kAsciiCollationOrder.find(c);
  const bool letter = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
  if (!letter) return {static_cast<int>(index), 0};
  const char lower = static_cast<char>(c | 0x20);
  return {static_cast<int>(kAsciiCollationOrder.find(lower)), c == lower ? 0 : 1};
}

void check_collatable(std::string_view key) {
  for (char c : key) {
    if (c < 0x20 || c > 0x7E) {
      throw_runtime(
          "tojson(sort_keys=true) supports only printable ASCII keys (the reference sorts "
          "with ICU collation); got key " +
          std::string(key));
    }
  }
}

// String.prototype.localeCompare for printable ASCII: primary weights first, then case.
int locale_compare(std::string_view a, std::string_view b) {
  for (int level = 0; level < 2; ++level) {
    const size_t n = std::min(a.size(), b.size());
    for (size_t i = 0; i < n; ++i) {
      const CollationWeights wa = collation_weights(a[i]);
      const CollationWeights wb = collation_weights(b[i]);
      const int x = level == 0 ? wa.primary : wa.tertiary;
      const int y = level == 0 ? wb.primary : wb.tertiary;
      if (x != y) return x < y ? -1 : 1;
    }
    if (a.size() != b.size()) return a.size() < b.size() ? -1 : 1;
  }
  return 0;
}

// The JavaScript type of a runtime value's raw `.value`.
enum class RawKind { kUndefined, kBoolean, kNumber, kString, kObject };

RawKind raw_kind(const Value& v) {
  switch (v.kind()) {
    case ValueKind::kUndefined:
    case ValueKind::kNull:  // the reference's NullValue holds JavaScript undefined
      return RawKind::kUndefined;
    case ValueKind::kBoolean:
      return RawKind::kBoolean;
    case ValueKind::kInteger:
    case ValueKind::kFloat:
      return RawKind::kNumber;
    case ValueKind::kString:
      return RawKind::kString;
    default:
      return RawKind::kObject;
  }
}

// ToPrimitive of an object-like raw value (an Array's join, a Map's "[object Map]").
std::string to_primitive_string(const Value& v) {
  if (v.is_function()) {
    throw_runtime("comparing a function with a value is not supported");
  }
  std::string out;
  append_raw_string(out, v);
  return out;
}

bool loose_equals_raw(const Value& a, const Value& b);

bool loose_equals_number(double x, const Value& b) {
  switch (raw_kind(b)) {
    case RawKind::kNumber:
    case RawKind::kBoolean:
      return x == b.number();
    case RawKind::kString:
      return x == js_string_to_number(b.str());
    case RawKind::kObject:
      return x == js_string_to_number(to_primitive_string(b));
    case RawKind::kUndefined:
      return false;
  }
  return false;
}

bool loose_equals_raw(const Value& a, const Value& b) {
  const RawKind ka = raw_kind(a);
  const RawKind kb = raw_kind(b);
  if (ka == kb) return strict_equals(a, b);
  if (ka == RawKind::kUndefined || kb == RawKind::kUndefined) return false;
  if (ka == RawKind::kBoolean || ka == RawKind::kNumber) return loose_equals_number(a.number(), b);
  if (kb == RawKind::kBoolean || kb == RawKind::kNumber) return loose_equals_number(b.number(), a);
  // One string and one object: the object converts to its primitive string.
  const std::string pa = ka == RawKind::kObject ? to_primitive_string(a) : a.str();
  const std::string pb = kb == RawKind::kObject ? to_primitive_string(b) : b.str();
  return pa == pb;
}

bool is_numeric_like(const Value& v) {
  return v.is_number() || v.is_boolean();
}

}  // namespace

// ---- Object ----

const Value* Object::find(std::string_view key) const {
  for (const Entry& e : entries_) {
    if (e.first == key) return &e.second;
  }
  return nullptr;
}

void Object::set(std::string_view key, Value value) {
  for (Entry& e : entries_) {
    if (e.first == key) {
      e.second = std::move(value);
      return;
    }
  }
  entries_.emplace_back(std::string(key), std::move(value));
}

void Object::append_unique(std::string key, Value value) {
  entries_.emplace_back(std::move(key), std::move(value));
}

bool Object::erase(std::string_view key) {
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (it->first == key) {
      entries_.erase(it);
      return true;
    }
  }
  return false;
}

// ---- Value ----

const void* Value::identity() const {
  switch (ptr_.index()) {
    case 1:
      return std::get<StringPtr>(ptr_).get();
    case 2:
      return std::get<ArrayPtr>(ptr_).get();
    case 3:
      return std::get<ObjectPtr>(ptr_).get();
    case 4:
      return std::get<FunctionPtr>(ptr_).get();
    default:
      return nullptr;
  }
}

bool Value::truthy() const {
  switch (kind_) {
    case ValueKind::kUndefined:
    case ValueKind::kNull:
      return false;
    case ValueKind::kBoolean:
      return number_ != 0;
    case ValueKind::kInteger:
    case ValueKind::kFloat:
      return number_ != 0 && !std::isnan(number_);
    case ValueKind::kString:
      return !str().empty();
    case ValueKind::kArray:
      return !array().empty();
    case ValueKind::kObject:
      return !object().empty();
    case ValueKind::kNamespace:
    case ValueKind::kFunction:
      return true;
  }
  return false;
}

std::string_view Value::type_name() const {
  switch (kind_) {
    case ValueKind::kUndefined:
      return "UndefinedValue";
    case ValueKind::kNull:
      return "NullValue";
    case ValueKind::kBoolean:
      return "BooleanValue";
    case ValueKind::kInteger:
      return "IntegerValue";
    case ValueKind::kFloat:
      return "FloatValue";
    case ValueKind::kString:
      return "StringValue";
    case ValueKind::kArray:
      return flag_ ? "TupleValue" : "ArrayValue";
    case ValueKind::kObject:
      return flag_ ? "KeywordArgumentsValue" : "ObjectValue";
    case ValueKind::kNamespace:
      return "NamespaceValue";
    case ValueKind::kFunction:
      return "FunctionValue";
  }
  return "UnknownValue";
}

// ---- printing ----

void append_display(std::string& out, const Value& value) {
  switch (value.kind()) {
    case ValueKind::kUndefined:
    case ValueKind::kNull:
      out += "undefined";
      return;
    case ValueKind::kBoolean:
      out += value.boolean() ? "true" : "false";
      return;
    case ValueKind::kInteger:
      out += js_number_to_string(value.number());
      return;
    case ValueKind::kFloat: {
      const double v = value.number();
      if (v == 0 && std::signbit(v)) {
        out += "-0.0";
      } else if (std::isfinite(v) && std::fmod(v, 1.0) == 0) {
        out += js_to_fixed1(v);
      } else {
        out += js_number_to_string(v);
      }
      return;
    }
    case ValueKind::kString:
      out += value.str();
      return;
    case ValueKind::kArray:
    case ValueKind::kObject:
    case ValueKind::kNamespace:
      append_json(out, value, JsonOptions{}, 0, /*undefined_to_null=*/false);
      return;
    case ValueKind::kFunction:
      throw_runtime("cannot print function '" + value.function().name + "'");
  }
}

std::string to_display(const Value& value) {
  std::string out;
  append_display(out, value);
  return out;
}

void append_raw_string(std::string& out, const Value& value) {
  switch (value.kind()) {
    case ValueKind::kUndefined:
    case ValueKind::kNull:
      out += "undefined";
      return;
    case ValueKind::kBoolean:
      out += value.boolean() ? "true" : "false";
      return;
    case ValueKind::kInteger:
    case ValueKind::kFloat:
      out += js_number_to_string(value.number());
      return;
    case ValueKind::kString:
      out += value.str();
      return;
    case ValueKind::kArray: {
      bool first = true;
      for (const Value& item : value.array()) {
        if (!first) out.push_back(',');
        first = false;
        append_display(out, item);
      }
      return;
    }
    case ValueKind::kObject:
    case ValueKind::kNamespace:
      out += "[object Map]";
      return;
    case ValueKind::kFunction:
      throw_runtime("cannot convert function '" + value.function().name + "' to a string");
  }
}

void append_json_string(std::string& out, std::string_view s, bool ensure_ascii) {
  out.push_back('"');
  size_t pos = 0;
  while (pos < s.size()) {
    const unsigned char b = static_cast<unsigned char>(s[pos]);
    if (b < 0x80) {
      ++pos;
      switch (b) {
        case '"':
          out += "\\\"";
          break;
        case '\\':
          out += "\\\\";
          break;
        case '\b':
          out += "\\b";
          break;
        case '\f':
          out += "\\f";
          break;
        case '\n':
          out += "\\n";
          break;
        case '\r':
          out += "\\r";
          break;
        case '\t':
          out += "\\t";
          break;
        default:
          if (b < 0x20 || (ensure_ascii && b == 0x7F)) {
            append_u_escape(out, b);
          } else {
            out.push_back(static_cast<char>(b));
          }
      }
      continue;
    }
    const size_t start = pos;
    const char32_t cp = unicode::decode(s, pos);
    if (!ensure_ascii) {
      if (cp == unicode::kReplacementChar && pos - start != 3) {
        out += "\xEF\xBF\xBD";  // an invalid byte: what JavaScript would hold after decoding
      } else {
        out.append(s.substr(start, pos - start));
      }
    } else if (cp < 0x10000) {
      append_u_escape(out, cp);
    } else {
      const uint32_t v = cp - 0x10000;
      append_u_escape(out, 0xD800 + (v >> 10));
      append_u_escape(out, 0xDC00 + (v & 0x3FF));
    }
  }
  out.push_back('"');
}

void append_json(std::string& out, const Value& value, const JsonOptions& options, int depth,
                 bool undefined_to_null) {
  switch (value.kind()) {
    case ValueKind::kNull:
      out += "null";
      return;
    case ValueKind::kUndefined:
      out += undefined_to_null ? "null" : "undefined";
      return;
    case ValueKind::kBoolean:
      out += value.boolean() ? "true" : "false";
      return;
    case ValueKind::kInteger:
    case ValueKind::kFloat:
      out += std::isfinite(value.number()) ? js_number_to_string(value.number()) : "null";
      return;
    case ValueKind::kString:
      append_json_string(out, value.str(), options.ensure_ascii);
      return;
    case ValueKind::kArray:
    case ValueKind::kObject:
    case ValueKind::kNamespace:
      if (!value.is_tuple() && !value.is_kwargs()) break;
      [[fallthrough]];
    case ValueKind::kFunction:
      throw_runtime("Cannot convert to JSON: " + std::string(value.type_name()));
  }

  const bool indented = options.indent.has_value() && *options.indent != 0;
  std::string item_separator = ", ";
  std::string key_separator = ": ";
  if (options.separators) {
    item_separator = options.separators->first;
    key_separator = options.separators->second;
  } else if (indented) {
    item_separator = ",";
  }
  std::string indent_unit;
  if (indented) {
    if (*options.indent < 0) {
      throw_runtime("Invalid count value: " + js_number_to_string(*options.indent));
    }
    indent_unit.assign(static_cast<size_t>(*options.indent), ' ');
  }
  std::string base_padding = "\n";
  for (int i = 0; i < depth; ++i) base_padding += indent_unit;
  const std::string children_padding = base_padding + indent_unit;

  if (value.is_array()) {
    const Array& items = value.array();
    out.push_back('[');
    if (indented && !items.empty()) out += children_padding;
    for (size_t i = 0; i < items.size(); ++i) {
      if (i > 0) {
        out += item_separator;
        if (indented) out += children_padding;
      }
      append_json(out, items[i], options, depth + 1, undefined_to_null);
    }
    if (indented && !items.empty()) out += base_padding;
    out.push_back(']');
    return;
  }

  const std::vector<Object::Entry>& entries = value.object().entries();
  std::vector<const Object::Entry*> order;
  order.reserve(entries.size());
  for (const Object::Entry& e : entries) order.push_back(&e);
  if (options.sort_keys) {
    for (const Object::Entry* e : order) check_collatable(e->first);
    std::stable_sort(order.begin(), order.end(),
                     [](const Object::Entry* a, const Object::Entry* b) {
                       return locale_compare(a->first, b->first) < 0;
                     });
  }
  out.push_back('{');
  for (size_t i = 0; i < order.size(); ++i) {
    if (i > 0) out += item_separator;
    if (indented) out += children_padding;
    append_json_string(out, order[i]->first, options.ensure_ascii);
    out += key_separator;
    append_json(out, order[i]->second, options, depth + 1, undefined_to_null);
  }
  if (indented && !order.empty()) out += base_padding;
  out.push_back('}');
}

// ---- comparisons ----

bool strict_equals(const Value& a, const Value& b) {
  const RawKind ka = raw_kind(a);
  if (ka != raw_kind(b)) return false;
  switch (ka) {
    case RawKind::kUndefined:
      return true;
    case RawKind::kBoolean:
    case RawKind::kNumber:
      return a.number() == b.number();
    case RawKind::kString:
      return a.str() == b.str();
    case RawKind::kObject:
      return a.identity() == b.identity();
  }
  return false;
}

bool same_value_zero(const Value& a, const Value& b) {
  if (raw_kind(a) == RawKind::kNumber && raw_kind(b) == RawKind::kNumber &&
      std::isnan(a.number()) && std::isnan(b.number())) {
    return true;
  }
  return strict_equals(a, b);
}

bool loose_equals(const Value& a, const Value& b) {
  return loose_equals_raw(a, b);
}

int compare_values(const Value& a, const Value& b, bool case_sensitive) {
  if (a.is_null() && b.is_null()) return 0;
  if (a.is_null() || b.is_null()) {
    throw_runtime("Cannot compare " + std::string(a.type_name()) + " with " +
                  std::string(b.type_name()));
  }
  if (a.is_undefined() && b.is_undefined()) return 0;
  if (a.is_undefined() || b.is_undefined()) {
    throw_runtime("Cannot compare " + std::string(a.type_name()) + " with " +
                  std::string(b.type_name()));
  }
  if (is_numeric_like(a) && is_numeric_like(b)) {
    const double x = a.number();
    const double y = b.number();
    return x < y ? -1 : (x > y ? 1 : 0);
  }
  if (a.type_name() != b.type_name()) {
    throw_runtime("Cannot compare different types: " + std::string(a.type_name()) + " and " +
                  std::string(b.type_name()));
  }
  if (a.is_string()) {
    if (case_sensitive) return unicode::compare_utf16(a.str(), b.str());
    return unicode::compare_utf16(unicode::to_lower(a.str()), unicode::to_lower(b.str()));
  }
  throw_runtime("Cannot compare type: " + std::string(a.type_name()));
}

}  // namespace strata::jinja
