// Filters: the reference's applyFilter, branch for branch, then Jinja2 extensions where the
// reference would throw.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "text/jinja/builtins.h"
#include "text/jinja/error.h"
#include "text/jinja/js_number.h"
#include "text/jinja/unicode.h"

namespace strata::jinja {
namespace {

// Evaluated arguments of a filter call; absent for the `x | name` form.
struct FilterCall {
  std::vector<Value> args;
  Object kwargs;

  // `args.at(i) ?? kwargs.get(key) ?? fallback` (presence, not truthiness).
  Value get(size_t i, std::string_view key, Value fallback) const {
    if (i < args.size()) return args[i];
    if (!key.empty()) {
      if (const Value* v = kwargs.find(key)) return *v;
    }
    return fallback;
  }
  const Value* kwarg(std::string_view key) const { return kwargs.find(key); }
  bool empty() const { return args.empty() && kwargs.empty(); }
};

// JavaScript truthiness of a raw value (the reference tests `first.value` in indent).
bool raw_truthy(const Value& v) {
  if (v.is_array() || v.is_object() || v.is_namespace() || v.is_function()) return true;
  return v.truthy();
}

std::vector<std::string_view> code_points(const std::string& s) {
  std::vector<std::string_view> out;
  size_t pos = 0;
  while (pos < s.size()) {
    const size_t begin = pos;
    unicode::decode(s, pos);
    out.emplace_back(s.data() + begin, pos - begin);
  }
  return out;
}

// getAttributeValue: a dotted path through object keys and array indices.
Value attribute_value(const Value& item, std::string_view path) {
  Value value = item;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string_view part =
        path.substr(start, dot == std::string_view::npos ? std::string_view::npos : dot - start);
    if (value.is_attribute_container()) {
      const Value* v = value.object().find(part);
      value = v != nullptr ? *v : Value();
    } else if (value.is_array()) {
      const double index = js_parse_int(part);
      if (!std::isnan(index) && index >= 0 && index < static_cast<double>(value.array().size())) {
        value = value.array()[static_cast<size_t>(index)];
      } else {
        return Value();
      }
    } else {
      return Value();
    }
    if (dot == std::string_view::npos) break;
    start = dot + 1;
  }
  return value;
}

// Stable sort with compareRuntimeValues (sorting indices, so a throwing comparison leaves
// no half-moved values behind).
Array sorted(const Array& items, bool reverse, bool case_sensitive,
             const std::optional<std::string>& attribute) {
  std::vector<Value> keys;
  keys.reserve(items.size());
  for (const Value& item : items)
    keys.push_back(attribute ? attribute_value(item, *attribute) : item);
  std::vector<size_t> order(items.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    int c = compare_values(keys[a], keys[b], case_sensitive);
    if (reverse) c = -c;
    return c < 0;
  });
  Array out;
  out.reserve(items.size());
  for (size_t i : order) out.push_back(items[i]);
  return out;
}

std::string json_of(const Value& v, const JsonOptions& options, bool undefined_to_null) {
  std::string out;
  append_json(out, v, options, 0, undefined_to_null);
  return out;
}

// Array.prototype.join over raw values: null/undefined join as "".
std::string join_raw(const Array& items, std::string_view separator) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += separator;
    if (!items[i].is_null() && !items[i].is_undefined()) append_raw_string(out, items[i]);
  }
  return out;
}

std::string indent_lines(const std::string& s, double width, bool first, bool blank) {
  if (width < 0) throw_runtime("Invalid count value: " + js_number_to_string(width));
  const std::string pad(static_cast<size_t>(width), ' ');
  std::string out;
  size_t start = 0;
  size_t line = 0;
  while (true) {
    const size_t nl = s.find('\n', start);
    const std::string_view text(s.data() + start,
                                (nl == std::string::npos ? s.size() : nl) - start);
    if (line > 0) out.push_back('\n');
    if (!((!first && line == 0) || (!blank && text.empty()))) out += pad;
    out += text;
    if (nl == std::string::npos) break;
    start = nl + 1;
    ++line;
  }
  return out;
}

Value unique(const Array& items) {
  Array out;
  for (const Value& item : items) {
    bool seen = false;
    for (const Value& kept : out) {
      if (same_value_zero(kept, item)) {
        seen = true;
        break;
      }
    }
    if (!seen) out.push_back(item);
  }
  return Value::array(std::move(out));
}

[[noreturn]] void unknown_filter(std::string_view kind, std::string_view name) {
  throw_runtime("Unknown " + std::string(kind) + " filter: " + std::string(name));
}

// ---- Jinja2 extensions (only reached where the reference throws) ----

std::string html_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

// Python's round(): ties to even on the exact binary value (glibc's printf does the same).
double python_round(double value, int precision) {
  if (!std::isfinite(value)) return value;
  if (precision == 0) return std::nearbyint(value);
  char buf[512];
  std::snprintf(buf, sizeof(buf), "%.*f", precision, value);
  return js_string_to_number(buf);
}

Value length_of(const Value& operand, std::string_view name) {
  if (operand.is_string())
    return Value::integer(static_cast<double>(unicode::utf16_length(operand.str())));
  if (operand.is_array()) return Value::integer(static_cast<double>(operand.array().size()));
  if (operand.is_object()) return Value::integer(static_cast<double>(operand.object().size()));
  throw_runtime("Cannot apply filter \"" + std::string(name) + "\" to type: " + type_of(operand));
}

Value dispatch(Interpreter& interpreter, const Value& operand, std::string_view name,
               const FilterCall* call, const EnvPtr& env);

// Filters Strata adds. Returns nullopt when `name` is not one of them.
std::optional<Value> extension_filter(Interpreter& interpreter, const Value& operand,
                                      std::string_view name, const FilterCall* call,
                                      const EnvPtr& env) {
  static const FilterCall kNoCall;
  const FilterCall& c = call != nullptr ? *call : kNoCall;
  if (name == "default" || name == "d") {
    const Value fallback = c.get(0, "default_value", Value::string(""));
    const Value boolean = c.get(1, "boolean", Value::boolean(false));
    if (operand.is_undefined() || (boolean.truthy() && !operand.truthy())) return fallback;
    return operand;
  }
  if (name == "count") return length_of(operand, name);
  if (name == "escape" || name == "e") {
    if (operand.is_null() || operand.is_undefined()) return Value::string("");
    return Value::string(html_escape(to_display(operand)));
  }
  if (operand.is_string()) {
    const std::vector<std::string_view> chars = code_points(operand.str());
    if (name == "first") return chars.empty() ? Value() : Value::string(std::string(chars.front()));
    if (name == "last") return chars.empty() ? Value() : Value::string(std::string(chars.back()));
    if (name == "reverse") {
      std::string out;
      for (auto it = chars.rbegin(); it != chars.rend(); ++it) out += *it;
      return Value::string(std::move(out));
    }
    if (name == "list") {
      Array out;
      for (std::string_view ch : chars) out.push_back(Value::string(std::string(ch)));
      return Value::array(std::move(out));
    }
    if (name == "trim" && call != nullptr) {
      const Value chars_arg = c.get(0, "chars", Value::null());
      if (chars_arg.is_null()) return Value::string(std::string(unicode::trim(operand.str())));
      if (!chars_arg.is_string()) throw_runtime("trim(chars) needs a string");
      const std::vector<std::string_view> strip = code_points(chars_arg.str());
      auto stripped = [&strip](std::string_view ch) {
        return std::find(strip.begin(), strip.end(), ch) != strip.end();
      };
      size_t b = 0;
      size_t e = chars.size();
      while (b < e && stripped(chars[b])) ++b;
      while (e > b && stripped(chars[e - 1])) --e;
      std::string out;
      for (size_t i = b; i < e; ++i) out += chars[i];
      return Value::string(std::move(out));
    }
  }
  if (operand.is_object() && name == "list") {
    Array keys;
    for (const Object::Entry& e : operand.object().entries())
      keys.push_back(Value::string(e.first));
    return Value::array(std::move(keys));
  }
  if (operand.is_number() && name == "round") {
    const Value precision = c.get(0, "precision", Value::integer(0));
    const Value method = c.get(1, "method", Value::string("common"));
    if (!precision.is_integer() || precision.number() < 0 || precision.number() > 300) {
      throw_runtime("round: precision must be an integer in [0, 300]");
    }
    if (!method.is_string()) throw_runtime("round: method must be a string");
    const int p = static_cast<int>(precision.number());
    const double v = operand.number();
    if (method.str() == "common") {
      const double r = python_round(v, p);
      return operand.is_integer() ? Value::integer(r) : Value::floating(r);
    }
    if (method.str() != "ceil" && method.str() != "floor") {
      throw_runtime("round: method must be 'common', 'ceil' or 'floor'");
    }
    const double scale = std::pow(10.0, p);
    const double scaled = method.str() == "ceil" ? std::ceil(v * scale) : std::floor(v * scale);
    return Value::floating(scaled / scale);
  }
  if (!operand.is_array()) return std::nullopt;

  const Array& items = operand.array();
  if (name == "select" || name == "reject") {
    const bool select = name == "select";
    std::string test;
    std::vector<Value> test_args;
    if (!c.args.empty()) {
      if (!c.args[0].is_string())
        throw_runtime(std::string(name) + ": the test name must be a string");
      test = c.args[0].str();
      if (!is_known_test(test)) throw_runtime("Unknown test: " + test);
      test_args.assign(c.args.begin() + 1, c.args.end());
    }
    Array out;
    for (const Value& item : items) {
      const bool result = test.empty() ? item.truthy() : apply_test(test, item, test_args);
      if (result == select) out.push_back(item);
    }
    return Value::array(std::move(out));
  }
  if (name == "map" && !c.args.empty()) {
    if (!c.args[0].is_string()) throw_runtime("map: the filter name must be a string");
    const std::string filter = c.args[0].str();
    FilterCall rest;
    rest.args.assign(c.args.begin() + 1, c.args.end());
    rest.kwargs = c.kwargs;
    Array out;
    out.reserve(items.size());
    for (const Value& item : items) {
      out.push_back(dispatch(interpreter, item, filter, rest.empty() ? nullptr : &rest, env));
    }
    return Value::array(std::move(out));
  }
  if (name == "sum") {
    const Value attribute = c.get(0, "attribute", Value::null());
    Value total = c.get(1, "start", Value::integer(0));
    for (const Value& item : items) {
      const Value v = attribute.is_string() ? attribute_value(item, attribute.str()) : item;
      if (!v.is_number() && !v.is_boolean()) throw_runtime("sum: cannot add " + type_of(v));
      if (!total.is_number() && !total.is_boolean()) throw_runtime("sum: start must be a number");
      const double s = total.number() + v.number();
      total = total.is_float() || v.is_float() ? Value::floating(s) : Value::integer(s);
    }
    return total;
  }
  if (name == "min" || name == "max") {
    const Value case_sensitive = c.get(0, "case_sensitive", Value::boolean(false));
    const Value attribute = c.get(1, "attribute", Value::null());
    if (items.empty()) return Value();
    auto key = [&](const Value& item) {
      return attribute.is_string() ? attribute_value(item, attribute.str()) : item;
    };
    size_t best = 0;
    for (size_t i = 1; i < items.size(); ++i) {
      const int cmp = compare_values(key(items[i]), key(items[best]), case_sensitive.truthy());
      if (name == "min" ? cmp < 0 : cmp > 0) best = i;
    }
    return items[best];
  }
  if (name == "batch") {
    const Value size = c.get(0, "linecount", Value());
    if (!size.is_integer() || size.number() < 1)
      throw_runtime("batch: linecount must be a positive integer");
    const std::optional<Value> fill =
        c.args.size() > 1
            ? std::optional<Value>(c.args[1])
            : (c.kwarg("fill_with") ? std::optional<Value>(*c.kwarg("fill_with")) : std::nullopt);
    const size_t n = static_cast<size_t>(size.number());
    Array out;
    for (size_t i = 0; i < items.size(); i += n) {
      Array chunk(items.begin() + static_cast<std::ptrdiff_t>(i),
                  items.begin() + static_cast<std::ptrdiff_t>(std::min(items.size(), i + n)));
      if (fill && !fill->is_null()) {
        while (chunk.size() < n) chunk.push_back(*fill);
      }
      out.push_back(Value::array(std::move(chunk)));
    }
    return Value::array(std::move(out));
  }
  return std::nullopt;
}

// The identifier form `x | name` (the reference's first branch of applyFilter).
Value plain_filter(Interpreter& interpreter, const Value& operand, std::string_view name,
                   const EnvPtr& env) {
  if (name == "safe") return operand;
  if (name == "tojson") return Value::string(json_of(operand, JsonOptions{}, true));
  auto extension_or = [&](std::string_view kind) -> Value {
    if (std::optional<Value> v = extension_filter(interpreter, operand, name, nullptr, env))
      return *v;
    if (kind.empty()) {
      throw_runtime("Cannot apply filter \"" + std::string(name) +
                    "\" to type: " + type_of(operand));
    }
    unknown_filter(kind, name);
  };
  if (operand.is_array()) {
    const Array& items = operand.array();
    if (name == "list") return operand;
    if (name == "first") return items.empty() ? Value() : items.front();
    if (name == "last") return items.empty() ? Value() : items.back();
    if (name == "length") return Value::integer(static_cast<double>(items.size()));
    if (name == "reverse") return Value::array(Array(items.rbegin(), items.rend()));
    if (name == "sort") return Value::array(sorted(items, false, false, std::nullopt));
    if (name == "join") return Value::string(join_raw(items, ""));
    if (name == "string") return Value::string(json_of(operand, JsonOptions{}, false));
    if (name == "unique") return unique(items);
    return extension_or("ArrayValue");
  }
  if (operand.is_string()) {
    const std::string& s = operand.str();
    if (name == "length") return Value::integer(static_cast<double>(unicode::utf16_length(s)));
    if (name == "upper") return Value::string(unicode::to_upper(s));
    if (name == "lower") return Value::string(unicode::to_lower(s));
    if (name == "title" || name == "capitalize") {
      std::vector<Value> no_args;
      Value result;
      call_builtin_method(interpreter, operand, name, no_args, result);
      return result;
    }
    if (name == "trim") return Value::string(std::string(unicode::trim(s)));
    if (name == "indent") return Value::string(indent_lines(s, 4, false, false));
    if (name == "join" || name == "string") return operand;
    if (name == "int") {
      const double v = js_parse_int(s);
      return Value::integer(std::isnan(v) ? 0 : v);
    }
    if (name == "float") {
      const double v = js_parse_float(s);
      return Value::floating(std::isnan(v) ? 0 : v);
    }
    return extension_or("StringValue");
  }
  if (operand.is_number()) {
    const double v = operand.number();
    if (name == "abs")
      return operand.is_integer() ? Value::integer(std::fabs(v)) : Value::floating(std::fabs(v));
    if (name == "int") return Value::integer(std::floor(v));
    if (name == "float") return Value::floating(v);
    if (name == "string") return Value::string(to_display(operand));
    return extension_or("NumericValue");
  }
  if (operand.is_object()) {
    if (name == "length") return Value::integer(static_cast<double>(operand.object().size()));
    // `items` and the other dict methods (keys, values, dictsort) called without arguments.
    Value builtin;
    if (builtin_member(operand, name, builtin)) {
      std::vector<Value> no_args;
      Value result;
      call_builtin_method(interpreter, operand, name, no_args, result);
      return result;
    }
    return extension_or("ObjectValue");
  }
  if (operand.is_boolean()) {
    const bool b = operand.boolean();
    if (name == "bool") return operand;
    if (name == "int") return Value::integer(b ? 1 : 0);
    if (name == "float") return Value::floating(b ? 1 : 0);
    if (name == "string") return Value::string(b ? "true" : "false");
    return extension_or("BooleanValue");
  }
  return extension_or("");
}

// The call form `x | name(args)` (the reference's second branch of applyFilter).
Value call_filter(Interpreter& interpreter, const Value& operand, std::string_view name,
                  const FilterCall& call, const EnvPtr& env) {
  if (name == "tojson") {
    JsonOptions options;
    const Value indent = call.get(SIZE_MAX, "indent", Value::null());
    if (!indent.is_integer() && !indent.is_null()) throw_runtime("If set, indent must be a number");
    if (indent.is_integer()) options.indent = indent.number();
    const Value ensure_ascii = call.get(SIZE_MAX, "ensure_ascii", Value::boolean(false));
    if (!ensure_ascii.is_boolean()) throw_runtime("If set, ensure_ascii must be a boolean");
    options.ensure_ascii = ensure_ascii.boolean();
    const Value sort_keys = call.get(SIZE_MAX, "sort_keys", Value::boolean(false));
    if (!sort_keys.is_boolean()) throw_runtime("If set, sort_keys must be a boolean");
    options.sort_keys = sort_keys.boolean();
    const Value separators = call.get(SIZE_MAX, "separators", Value::null());
    if (separators.is_array()) {
      const Array& pair = separators.array();
      if (pair.size() != 2 || !pair[0].is_string() || !pair[1].is_string()) {
        throw_runtime("separators must be a tuple of two strings");
      }
      options.separators = std::make_pair(pair[0].str(), pair[1].str());
    } else if (!separators.is_null()) {
      throw_runtime("If set, separators must be a tuple of two strings");
    }
    return Value::string(json_of(operand, options, true));
  }
  if (name == "join") {
    if (!operand.is_string() && !operand.is_array()) {
      throw_runtime("Cannot apply filter \"join\" to type: " + type_of(operand));
    }
    const Value separator = call.get(0, "separator", Value::string(""));
    if (!separator.is_string()) throw_runtime("separator must be a string");
    if (operand.is_array()) return Value::string(join_raw(operand.array(), separator.str()));
    std::string out;
    bool first = true;
    for (std::string_view ch : code_points(operand.str())) {
      if (!first) out += separator.str();
      first = false;
      out += ch;
    }
    return Value::string(std::move(out));
  }
  if (name == "int" || name == "float") {
    const bool to_int = name == "int";
    const Value fallback = call.get(0, "default", to_int ? Value::integer(0) : Value::floating(0));
    if (operand.is_string()) {
      const double v = to_int ? js_parse_int(operand.str()) : js_parse_float(operand.str());
      if (std::isnan(v)) return fallback;
      return to_int ? Value::integer(v) : Value::floating(v);
    }
    if (operand.is_number()) return operand;
    if (operand.is_boolean()) {
      const double v = operand.boolean() ? 1 : 0;
      return to_int ? Value::integer(v) : Value::floating(v);
    }
    throw_runtime("Cannot apply filter \"" + std::string(name) + "\" to type: " + type_of(operand));
  }
  if (name == "default") {
    const Value fallback = call.args.empty() ? Value::string("") : call.args[0];
    const Value boolean = call.get(1, "boolean", Value::boolean(false));
    if (!boolean.is_boolean()) throw_runtime("`default` filter flag must be a boolean");
    if (operand.is_undefined() || (boolean.boolean() && !operand.truthy())) return fallback;
    return operand;
  }
  auto extension_or = [&](std::string_view kind) -> Value {
    if (std::optional<Value> v = extension_filter(interpreter, operand, name, &call, env))
      return *v;
    // `x | name()` with no arguments behaves like `x | name`.
    if (call.empty()) return plain_filter(interpreter, operand, name, env);
    if (kind.empty()) {
      throw_runtime("Cannot apply filter \"" + std::string(name) +
                    "\" to type: " + type_of(operand));
    }
    unknown_filter(kind, name);
  };
  if (operand.is_array()) {
    const Array& items = operand.array();
    if (name == "sort") {
      const Value reverse = call.get(0, "reverse", Value::boolean(false));
      if (!reverse.is_boolean()) throw_runtime("reverse must be a boolean");
      const Value case_sensitive = call.get(1, "case_sensitive", Value::boolean(false));
      if (!case_sensitive.is_boolean()) throw_runtime("case_sensitive must be a boolean");
      const Value attribute = call.get(2, "attribute", Value::null());
      if (!attribute.is_string() && !attribute.is_integer() && !attribute.is_null()) {
        throw_runtime("attribute must be a string, integer, or null");
      }
      std::optional<std::string> path;
      if (attribute.is_string()) path = attribute.str();
      if (attribute.is_integer()) path = js_number_to_string(attribute.number());
      return Value::array(sorted(items, reverse.boolean(), case_sensitive.boolean(), path));
    }
    if (name == "selectattr" || name == "rejectattr") {
      const bool select = name == "selectattr";
      for (const Value& item : items) {
        if (!item.is_attribute_container()) {
          throw_runtime("`" + std::string(name) + "` can only be applied to array of objects");
        }
      }
      // The reference requires string-literal arguments; any string expression is accepted here.
      if (call.args.empty() || !call.args[0].is_string()) {
        throw_runtime("`" + std::string(name) + "` needs an attribute name");
      }
      const std::string& attribute = call.args[0].str();
      std::string test;
      if (call.args.size() > 1) {
        if (!call.args[1].is_string())
          throw_runtime("arguments of `" + std::string(name) + "` must be strings");
        test = call.args[1].str();
        if (!is_known_test(test)) throw_runtime("Unknown test: " + test);
      }
      std::vector<Value> test_args(
          call.args.begin() +
              std::min<std::ptrdiff_t>(2, static_cast<std::ptrdiff_t>(call.args.size())),
          call.args.end());
      Array out;
      for (const Value& item : items) {
        const Value* a = item.object().find(attribute);
        bool result = false;
        if (a != nullptr) result = test.empty() ? a->truthy() : apply_test(test, *a, test_args);
        if (result == select) out.push_back(item);
      }
      return Value::array(std::move(out));
    }
    if (name == "map" && call.kwarg("attribute") != nullptr) {
      const Value attribute = *call.kwarg("attribute");
      if (!attribute.is_string()) throw_runtime("attribute must be a string");
      const Value* fallback = call.kwarg("default");
      Array out;
      out.reserve(items.size());
      for (const Value& item : items) {
        if (!item.is_attribute_container()) throw_runtime("items in map must be an object");
        const Value v = attribute_value(item, attribute.str());
        out.push_back(v.is_undefined() && fallback != nullptr ? *fallback : v);
      }
      return Value::array(std::move(out));
    }
    if (name == "map" && call.args.empty()) {
      throw_runtime("`map` expressions without `attribute` set are not currently supported.");
    }
    return extension_or("ArrayValue");
  }
  if (operand.is_string()) {
    if (name == "indent") {
      const Value width = call.get(0, "width", Value::integer(4));
      if (!width.is_integer()) throw_runtime("width must be a number");
      const Value first = call.get(1, "first", Value::boolean(false));
      const Value blank = call.get(2, "blank", Value::boolean(false));
      return Value::string(
          indent_lines(operand.str(), width.number(), raw_truthy(first), raw_truthy(blank)));
    }
    if (name == "replace") {
      std::vector<Value> args = call.args;
      args.push_back(Value::kwargs(call.kwargs));
      Value result;
      call_builtin_method(interpreter, operand, "replace", args, result);
      return result;
    }
    return extension_or("StringValue");
  }
  if (operand.is_object()) {
    Value builtin;
    if (builtin_member(operand, name, builtin)) {
      std::vector<Value> args = call.args;
      if (!call.kwargs.empty()) args.push_back(Value::kwargs(call.kwargs));
      Value result;
      call_builtin_method(interpreter, operand, name, args, result);
      return result;
    }
    return extension_or("ObjectValue");
  }
  return extension_or("");
}

Value dispatch(Interpreter& interpreter, const Value& operand, std::string_view name,
               const FilterCall* call, const EnvPtr& env) {
  if (call == nullptr) return plain_filter(interpreter, operand, name, env);
  return call_filter(interpreter, operand, name, *call, env);
}

}  // namespace

Value apply_filter(Interpreter& interpreter, const Value& operand, const Node& filter,
                   const EnvPtr& env) {
  if (filter.kind == NodeKind::kIdentifier) {
    return plain_filter(interpreter, operand, filter.as<Identifier>().value, env);
  }
  if (filter.kind == NodeKind::kCallExpression) {
    const CallExpression& call_node = filter.as<CallExpression>();
    if (call_node.callee->kind != NodeKind::kIdentifier) {
      throw_runtime("Unknown filter: a filter must be a name", filter.offset);
    }
    FilterCall call;
    call.args = interpreter.evaluate_arguments(call_node.args, env, call.kwargs);
    return call_filter(interpreter, operand, call_node.callee->as<Identifier>().value, call, env);
  }
  throw_runtime("Unknown filter: a filter must be a name or a call", filter.offset);
}

}  // namespace strata::jinja
