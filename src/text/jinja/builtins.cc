// Methods, tests and globals. Filters are in filters.cc.
#include <algorithm>
#include <cmath>
#include <ctime>
#include <limits>
#include <string>
#include <string_view>

#include "text/jinja/builtins.h"
#include "text/jinja/error.h"
#include "text/jinja/js_number.h"
#include "text/jinja/unicode.h"

namespace strata::jinja {
namespace {

// range() refuses to build more items than this (the reference has no limit; a chat
// template never needs one this large).
constexpr double kMaxRangeItems = 1'000'000;

const Value* arg(const std::vector<Value>& args, size_t i) {
  return i < args.size() ? &args[i] : nullptr;
}

bool is_ascii_word(unsigned char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

// utils.titleCase: /\b\w/g upper-cased (ASCII word characters, as JavaScript's \w and \b).
std::string title_case(std::string_view s) {
  std::string out(s);
  for (size_t i = 0; i < out.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(out[i]);
    const bool boundary = i == 0 || !is_ascii_word(static_cast<unsigned char>(out[i - 1]));
    if (boundary && c >= 'a' && c <= 'z') out[i] = static_cast<char>(c - 32);
  }
  return out;
}

// charAt(0).toUpperCase() + slice(1): only the first UTF-16 code unit changes, so a
// string starting with an astral character is returned unchanged.
std::string capitalize(std::string_view s) {
  if (s.empty()) return std::string();
  size_t pos = 0;
  const char32_t cp = unicode::decode(s, pos);
  if (cp >= 0x10000) return std::string(s);
  return unicode::to_upper(s.substr(0, pos)) + std::string(s.substr(pos));
}

// Splits on runs of JavaScript whitespace; the start of each run is recorded so that a
// maxsplit can return the remainder.
struct Word {
  size_t begin;
  size_t end;
};
std::vector<Word> whitespace_words(std::string_view s) {
  std::vector<Word> words;
  size_t pos = 0;
  while (pos < s.size()) {
    if (size_t len = unicode::whitespace_length_at(s, pos)) {
      pos += len;
      continue;
    }
    const size_t begin = pos;
    while (pos < s.size() && unicode::whitespace_length_at(s, pos) == 0) unicode::decode(s, pos);
    words.push_back({begin, pos});
  }
  return words;
}

std::vector<std::string> split_on(std::string_view s, std::string_view sep) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    const size_t found = s.find(sep, start);
    if (found == std::string_view::npos) break;
    parts.emplace_back(s.substr(start, found - start));
    start = found + sep.size();
  }
  parts.emplace_back(s.substr(start));
  return parts;
}

std::string join(const std::vector<std::string>& parts, size_t from, std::string_view sep) {
  std::string out;
  for (size_t i = from; i < parts.size(); ++i) {
    if (i > from) out += sep;
    out += parts[i];
  }
  return out;
}

Value string_array(std::vector<std::string> parts) {
  Array out;
  out.reserve(parts.size());
  for (std::string& p : parts) out.push_back(Value::string(std::move(p)));
  return Value::array(std::move(out));
}

// str.split(sep=None, maxsplit=-1) as the reference implements it.
Value string_split(const std::string& s, const std::vector<Value>& args) {
  const Value sep = args.size() > 0 ? args[0] : Value::null();
  if (!sep.is_string() && !sep.is_null()) throw_runtime("sep argument must be a string or null");
  const Value maxsplit = args.size() > 1 ? args[1] : Value::integer(-1);
  if (!maxsplit.is_integer()) throw_runtime("maxsplit argument must be a number");
  const double limit = maxsplit.number();
  std::vector<std::string> result;
  if (sep.is_null()) {
    const std::string_view text = unicode::trim_start(s);
    for (const Word& w : whitespace_words(text)) {
      if (limit != -1 && static_cast<double>(result.size()) >= limit) {
        result.emplace_back(text.substr(w.begin));
        break;
      }
      result.emplace_back(text.substr(w.begin, w.end - w.begin));
    }
    return string_array(std::move(result));
  }
  if (sep.str().empty()) throw_runtime("empty separator");
  result = split_on(s, sep.str());
  const double length = static_cast<double>(result.size());
  if (limit != -1 && length > limit) {
    // result.push(result.splice(limit).join(sep)); splice takes a negative start from the end.
    const double start = limit >= 0 ? limit : std::max(length + limit, 0.0);
    const size_t from = static_cast<size_t>(start);
    std::string rest = join(result, from, sep.str());
    result.resize(from);
    result.push_back(std::move(rest));
  }
  return string_array(std::move(result));
}

// Python's str.rsplit(sep=None, maxsplit=-1) (extension), whitespace as JavaScript's.
Value string_rsplit(const std::string& s, const std::vector<Value>& args) {
  const Value sep = args.size() > 0 ? args[0] : Value::null();
  if (!sep.is_string() && !sep.is_null()) throw_runtime("rsplit: sep must be a string or none");
  const Value maxsplit = args.size() > 1 ? args[1] : Value::integer(-1);
  if (!maxsplit.is_integer()) throw_runtime("rsplit: maxsplit must be an integer");
  const double limit =
      maxsplit.number() < 0 ? std::numeric_limits<double>::infinity() : maxsplit.number();
  std::vector<std::string> result;
  if (sep.is_null()) {
    const std::string_view text = unicode::trim_end(s);
    const std::vector<Word> words = whitespace_words(text);
    size_t splits = 0;
    size_t i = words.size();
    while (i > 0) {
      --i;
      if (static_cast<double>(splits) >= limit) {
        result.emplace_back(unicode::trim_end(text.substr(0, words[i].end)));
        break;
      }
      result.emplace_back(text.substr(words[i].begin, words[i].end - words[i].begin));
      ++splits;
    }
  } else {
    if (sep.str().empty()) throw_runtime("empty separator");
    std::vector<std::string> parts = split_on(s, sep.str());
    const size_t splits = parts.size() - 1;
    if (static_cast<double>(splits) <= limit) return string_array(std::move(parts));
    // The leftmost parts that exceed maxsplit stay joined.
    const size_t keep = splits - static_cast<size_t>(limit);
    std::vector<std::string> out;
    out.push_back(join(std::vector<std::string>(
                           parts.begin(), parts.begin() + static_cast<std::ptrdiff_t>(keep + 1)),
                       0, sep.str()));
    for (size_t i = keep + 1; i < parts.size(); ++i) out.push_back(std::move(parts[i]));
    return string_array(std::move(out));
  }
  std::reverse(result.begin(), result.end());
  return string_array(std::move(result));
}

// utils.replace: Python-like str.replace; an empty pattern matches at every code point
// boundary.
std::string replace_all(const std::string& s, const std::string& from, const std::string& to,
                        double count) {
  if (count == 0) return s;
  double remaining = count < 0 ? std::numeric_limits<double>::infinity() : count;
  std::string out;
  if (from.empty()) {
    size_t pos = 0;
    while (true) {
      if (remaining > 0) {
        out += to;
        --remaining;
      }
      if (pos >= s.size()) break;
      const size_t begin = pos;
      unicode::decode(s, pos);
      out.append(s, begin, pos - begin);
    }
    return out;
  }
  size_t start = 0;
  while (remaining > 0) {
    const size_t found = s.find(from, start);
    if (found == std::string::npos) break;
    out.append(s, start, found - start);
    out += to;
    start = found + from.size();
    --remaining;
  }
  out.append(s, start, std::string::npos);
  return out;
}

// Code point offsets for Python's str.find/count (extensions): start/end in code points.
std::vector<size_t> code_point_offsets(std::string_view s) {
  std::vector<size_t> offsets;
  size_t pos = 0;
  while (pos < s.size()) {
    offsets.push_back(pos);
    unicode::decode(s, pos);
  }
  offsets.push_back(s.size());
  return offsets;
}

// Python slice bounds [start, end) in code points, clamped.
std::pair<size_t, size_t> python_bounds(const std::vector<Value>& args, size_t first,
                                        size_t length) {
  auto bound = [&](size_t i, double fallback) {
    const Value* v = arg(args, i);
    if (v == nullptr || v->is_null()) return fallback;
    if (!v->is_integer()) throw_runtime("slice indices must be integers or none");
    double x = v->number();
    if (x < 0) x = std::max(0.0, x + static_cast<double>(length));
    return std::min(x, static_cast<double>(length));
  };
  const double start = bound(first, 0);
  const double end = bound(first + 1, static_cast<double>(length));
  return {static_cast<size_t>(start), static_cast<size_t>(std::max(start, end))};
}

bool starts_or_ends_with(const std::string& s, const std::vector<Value>& args, bool ends,
                         std::string_view method) {
  if (args.empty()) throw_runtime(std::string(method) + "() requires at least one argument");
  auto test = [&](const std::string& p) { return ends ? s.ends_with(p) : s.starts_with(p); };
  const Value& pattern = args[0];
  if (pattern.is_string()) return test(pattern.str());
  if (pattern.is_array()) {
    for (const Value& item : pattern.array()) {
      if (!item.is_string())
        throw_runtime(std::string(method) + "() tuple elements must be strings");
      if (test(item.str())) return true;
    }
    return false;
  }
  throw_runtime(std::string(method) + "() argument must be a string or tuple of strings");
}

bool call_string_method(const std::string& s, std::string_view name, std::vector<Value>& args,
                        Value& result) {
  if (name == "upper") {
    result = Value::string(unicode::to_upper(s));
  } else if (name == "lower") {
    result = Value::string(unicode::to_lower(s));
  } else if (name == "strip") {
    // The reference ignores strip's argument and trims whitespace (a known difference from
    // Python, kept for exactness; see docs/chat-templates.md).
    result = Value::string(std::string(unicode::trim(s)));
  } else if (name == "lstrip") {
    result = Value::string(std::string(unicode::trim_start(s)));
  } else if (name == "rstrip") {
    result = Value::string(std::string(unicode::trim_end(s)));
  } else if (name == "title") {
    result = Value::string(title_case(s));
  } else if (name == "capitalize") {
    result = Value::string(capitalize(s));
  } else if (name == "startswith" || name == "endswith") {
    result = Value::boolean(starts_or_ends_with(s, args, name == "endswith", name));
  } else if (name == "split") {
    result = string_split(s, args);
  } else if (name == "replace") {
    if (args.size() < 2) throw_runtime("replace() requires at least two arguments");
    if (!args[0].is_string() || !args[1].is_string())
      throw_runtime("replace() arguments must be strings");
    Value count = Value::null();
    if (args.size() > 2) {
      if (args[2].is_kwargs()) {
        const Value* c = args[2].object().find("count");
        count = c != nullptr ? *c : Value::null();
      } else {
        count = args[2];
      }
    }
    if (!count.is_integer() && !count.is_null() && !count.is_undefined()) {
      throw_runtime("replace() count argument must be a number or null");
    }
    const double n = count.is_integer() ? count.number() : -1;
    result = Value::string(replace_all(s, args[0].str(), args[1].str(), n));
  } else if (name == "rsplit") {
    result = string_rsplit(s, args);
  } else if (name == "find" || name == "count") {
    if (args.empty() || !args[0].is_string())
      throw_runtime(std::string(name) + "() needs a string");
    const std::vector<size_t> offsets = code_point_offsets(s);
    const auto [begin, end] = python_bounds(args, 1, offsets.size() - 1);
    const std::string_view window(s.data() + offsets[begin], offsets[end] - offsets[begin]);
    const std::string& needle = args[0].str();
    if (name == "find") {
      const size_t found = window.find(needle);
      if (found == std::string_view::npos) {
        result = Value::integer(-1);
      } else {
        const size_t byte = offsets[begin] + found;
        result = Value::integer(static_cast<double>(
            std::lower_bound(offsets.begin(), offsets.end(), byte) - offsets.begin()));
      }
    } else if (needle.empty()) {
      result = Value::integer(static_cast<double>(end - begin + 1));
    } else {
      double n = 0;
      for (size_t at = window.find(needle); at != std::string_view::npos;
           at = window.find(needle, at + needle.size())) {
        ++n;
      }
      result = Value::integer(n);
    }
  } else if (name == "join") {
    if (args.empty() || !args[0].is_array()) throw_runtime("join() needs a list of strings");
    std::string out;
    bool first = true;
    for (const Value& item : args[0].array()) {
      if (!item.is_string()) throw_runtime("join() needs a list of strings");
      if (!first) out += s;
      first = false;
      out += item.str();
    }
    result = Value::string(std::move(out));
  } else {
    return false;
  }
  return true;
}

Value object_items(const Object& object) {
  Array items;
  items.reserve(object.size());
  for (const Object::Entry& e : object.entries()) {
    items.push_back(Value::array(Array{Value::string(e.first), e.second}));
  }
  return Value::array(std::move(items));
}

Value object_dictsort(const Object& object, const std::vector<Value>& args) {
  Object kwargs;
  std::vector<Value> positional;
  for (const Value& a : args) {
    if (a.is_kwargs()) {
      kwargs = a.object();
    } else {
      positional.push_back(a);
    }
  }
  auto option = [&](size_t i, std::string_view key, Value fallback) {
    if (i < positional.size()) return positional[i];
    if (const Value* v = kwargs.find(key)) return *v;
    return fallback;
  };
  const Value case_sensitive = option(0, "case_sensitive", Value::boolean(false));
  if (!case_sensitive.is_boolean()) throw_runtime("case_sensitive must be a boolean");
  const Value by = option(1, "by", Value::string("key"));
  if (!by.is_string()) throw_runtime("by must be a string");
  if (by.str() != "key" && by.str() != "value") throw_runtime("by must be either 'key' or 'value'");
  const Value reverse = option(2, "reverse", Value::boolean(false));
  if (!reverse.is_boolean()) throw_runtime("reverse must be a boolean");

  const Array pairs = object_items(object).array();
  const size_t index = by.str() == "key" ? 0 : 1;
  std::vector<size_t> order(pairs.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    int c =
        compare_values(pairs[a].array()[index], pairs[b].array()[index], case_sensitive.boolean());
    if (reverse.boolean()) c = -c;
    return c < 0;
  });
  Array sorted;
  sorted.reserve(order.size());
  for (size_t i : order) sorted.push_back(pairs[i]);
  return Value::array(std::move(sorted));
}

bool call_object_method(const Value& object, std::string_view name, std::vector<Value>& args,
                        Value& result) {
  const Object& entries = object.object();
  if (name == "get") {
    const Value* key = arg(args, 0);
    if (key == nullptr || !key->is_string()) {
      throw_runtime("Object key must be a string: got " +
                    (key == nullptr ? std::string("nothing") : type_of(*key)));
    }
    if (const Value* v = entries.find(key->str())) {
      result = *v;
    } else {
      result = args.size() > 1 ? args[1] : Value::null();
    }
  } else if (name == "items") {
    result = object_items(entries);
  } else if (name == "keys") {
    Array keys;
    for (const Object::Entry& e : entries.entries()) keys.push_back(Value::string(e.first));
    result = Value::array(std::move(keys));
  } else if (name == "values") {
    Array values;
    for (const Object::Entry& e : entries.entries()) values.push_back(e.second);
    result = Value::array(std::move(values));
  } else if (name == "dictsort") {
    result = object_dictsort(entries, args);
  } else {
    return false;
  }
  return true;
}

constexpr std::string_view kStringMethods[] = {
    "upper",    "lower", "strip",   "title",  "capitalize", "rstrip", "lstrip", "startswith",
    "endswith", "split", "replace", "rsplit", "find",       "count",  "join",
};
constexpr std::string_view kObjectMethods[] = {"get", "items", "keys", "values", "dictsort"};

template <size_t N>
bool contains(const std::string_view (&names)[N], std::string_view name) {
  return std::find(std::begin(names), std::end(names), name) != std::end(names);
}

// The reference's tests (Environment.TESTS).
constexpr std::string_view kReferenceTests[] = {
    "boolean", "callable", "odd",       "even",     "false",   "true",     "none",
    "string",  "number",   "integer",   "iterable", "mapping", "sequence", "lower",
    "upper",   "defined",  "undefined", "equalto",  "eq",
};
// Python Jinja2 tests Strata adds (the reference rejects test arguments).
constexpr std::string_view kExtensionTests[] = {
    "ne", "divisibleby", "gt", "ge", "lt", "le", "greaterthan", "lessthan", "in", "sameas", "float",
};

double numeric_arg(const std::vector<Value>& args, std::string_view test) {
  if (args.empty() || !(args[0].is_number() || args[0].is_boolean())) {
    throw_runtime("test '" + std::string(test) + "' needs a number argument");
  }
  return args[0].number();
}

double operand_number(const Value& operand, std::string_view test) {
  if (!operand.is_number() && !operand.is_boolean()) {
    throw_runtime("cannot apply test '" + std::string(test) + "' to " + type_of(operand));
  }
  return operand.number();
}

// The `in` operator's membership rules (strings, arrays, object keys).
bool contained_in(const Value& item, const Value& container) {
  if (container.is_array()) {
    for (const Value& x : container.array()) {
      if (strict_equals(x, item)) return true;
    }
    return false;
  }
  if (container.is_string() && item.is_string())
    return container.str().find(item.str()) != std::string::npos;
  if (container.is_object() && item.is_string())
    return container.object().find(item.str()) != nullptr;
  throw_runtime("test 'in' cannot look for " + type_of(item) + " in " + type_of(container));
}

std::string strftime_like_reference(const std::tm& t, std::string_view format) {
  static constexpr std::string_view kShortMonths[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                                      "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
  static constexpr std::string_view kLongMonths[] = {
      "January", "February", "March",     "April",   "May",      "June",
      "July",    "August",   "September", "October", "November", "December"};
  auto pad2 = [](int n) { return n < 10 ? "0" + std::to_string(n) : std::to_string(n); };
  const int month = std::clamp(t.tm_mon, 0, 11);
  std::string out;
  size_t i = 0;
  while (i < format.size()) {
    if (format[i] == '%' && i + 1 < format.size()) {
      const char c = format[i + 1];
      std::string piece;
      bool matched = true;
      switch (c) {
        case 'Y':
          piece = std::to_string(t.tm_year + 1900);
          break;
        case 'm':
          piece = pad2(t.tm_mon + 1);
          break;
        case 'd':
          piece = pad2(t.tm_mday);
          break;
        case 'b':
          piece = kShortMonths[month];
          break;
        case 'B':
          piece = kLongMonths[month];
          break;
        case 'H':
          piece = pad2(t.tm_hour);
          break;
        case 'M':
          piece = pad2(t.tm_min);
          break;
        case '%':
          piece = "%";
          break;
        default:
          matched = false;
      }
      if (matched) {
        out += piece;
        i += 2;
        continue;
      }
    }
    out.push_back(format[i]);
    ++i;
  }
  return out;
}

// normalizeNamespaceEntry: a [key, value] pair (or a two-character string).
std::pair<std::string, Value> namespace_entry(const Value& pair) {
  Array values;
  if (pair.is_array()) {
    values = pair.array();
  } else if (pair.is_string()) {
    const std::string& s = pair.str();
    size_t pos = 0;
    while (pos < s.size()) {
      const size_t begin = pos;
      unicode::decode(s, pos);
      values.push_back(Value::string(s.substr(begin, pos - begin)));
    }
  }
  if (values.size() != 2) {
    throw_runtime("namespace expected an object or an iterable of [key, value] pairs");
  }
  if (!values[0].is_string()) throw_runtime("namespace keys must be strings");
  return {values[0].str(), values[1]};
}

Value make_namespace(Interpreter& interpreter, std::vector<Value>& args) {
  std::vector<Value> positional = args;
  const Value* kwargs = nullptr;
  if (!positional.empty() && positional.back().is_kwargs()) kwargs = &args.back();
  if (kwargs != nullptr) positional.pop_back();
  if (positional.size() > 1) {
    throw_runtime("namespace expected at most 1 argument, got " +
                  std::to_string(positional.size()));
  }
  auto entries = std::make_shared<Object>();
  if (positional.size() == 1) {
    const Value& source = positional[0];
    if (source.is_object()) {
      for (const Object::Entry& e : source.object().entries()) entries->set(e.first, e.second);
    } else if (source.is_array()) {
      for (const Value& pair : source.array()) {
        auto [key, value] = namespace_entry(pair);
        entries->set(key, std::move(value));
      }
    } else {
      throw_runtime("'" + type_of(source) + "' object is not iterable");
    }
  }
  if (kwargs != nullptr) {
    for (const Object::Entry& e : kwargs->object().entries()) entries->set(e.first, e.second);
  }
  interpreter.track_namespace(entries);
  return Value::name_space(std::move(entries));
}

Value make_range(std::vector<Value>& args) {
  for (const Value& a : args) {
    if (!a.is_number()) throw_runtime("range() arguments must be numbers, got " + type_of(a));
  }
  if (args.empty() || args.size() > 3) throw_runtime("range() takes 1 to 3 arguments");
  double start = 0;
  double stop = args[0].number();
  double step = 1;
  if (args.size() >= 2) {
    start = args[0].number();
    stop = args[1].number();
  }
  if (args.size() == 3) step = args[2].number();
  if (step == 0) throw_runtime("range() step must not be zero");
  const double count = std::ceil((stop - start) / step);
  if (count > kMaxRangeItems) {
    throw_runtime("range() of more than " + js_number_to_string(kMaxRangeItems) + " items");
  }
  Array items;
  auto push = [&items](double i) {
    items.push_back(std::floor(i) == i ? Value::integer(i) : Value::floating(i));
  };
  if (step > 0) {
    for (double i = start; i < stop; i += step) push(i);
  } else {
    for (double i = start; i > stop; i += step) push(i);
  }
  return Value::array(std::move(items));
}

}  // namespace

bool builtin_member(const Value& object, std::string_view name, Value& out) {
  if (object.is_string() || object.is_array()) {
    if (name == "length") {
      out = Value::integer(static_cast<double>(
          object.is_string() ? unicode::utf16_length(object.str()) : object.array().size()));
      return true;
    }
    if (object.is_array() || !contains(kStringMethods, name)) return false;
  } else if (object.is_object()) {
    if (!contains(kObjectMethods, name)) return false;
  } else {
    return false;
  }
  std::string method(name);
  out = Value::function(
      method, [object, method](Interpreter& interpreter, std::vector<Value>& args, const EnvPtr&) {
        Value result;
        call_builtin_method(interpreter, object, method, args, result);
        return result;
      });
  return true;
}

bool call_builtin_method(Interpreter& /*interpreter*/, const Value& object, std::string_view name,
                         std::vector<Value>& args, Value& result) {
  if (object.is_string()) return call_string_method(object.str(), name, args, result);
  if (object.is_object()) return call_object_method(object, name, args, result);
  return false;
}

bool is_known_test(std::string_view name) {
  return contains(kReferenceTests, name) || contains(kExtensionTests, name);
}

bool apply_test(std::string_view name, const Value& operand, const std::vector<Value>& args) {
  if (name == "boolean") return operand.is_boolean();
  if (name == "callable") return operand.is_function();
  if (name == "odd" || name == "even") {
    if (!operand.is_integer())
      throw_runtime("cannot " + std::string(name) + " on " + type_of(operand));
    const bool even = std::fmod(operand.number(), 2) == 0;
    return name == "even" ? even : !even;
  }
  if (name == "false") return operand.is_boolean() && !operand.boolean();
  if (name == "true") return operand.is_boolean() && operand.boolean();
  if (name == "none") return operand.is_null();
  if (name == "string") return operand.is_string();
  if (name == "number") return operand.is_number();
  if (name == "integer") return operand.is_integer();
  if (name == "iterable") return (operand.is_array() && !operand.is_tuple()) || operand.is_string();
  if (name == "mapping") return operand.is_object();
  if (name == "sequence") return operand.is_array() || operand.is_object() || operand.is_string();
  if (name == "lower")
    return operand.is_string() && operand.str() == unicode::to_lower(operand.str());
  if (name == "upper")
    return operand.is_string() && operand.str() == unicode::to_upper(operand.str());
  if (name == "defined") return !operand.is_undefined();
  if (name == "undefined") return operand.is_undefined();
  if (name == "equalto" || name == "eq" || name == "ne") {
    if (args.empty()) throw_runtime("test '" + std::string(name) + "' needs an argument");
    const bool equal = strict_equals(operand, args[0]);
    return name == "ne" ? !equal : equal;
  }
  if (name == "divisibleby") {
    const double divisor = numeric_arg(args, name);
    if (divisor == 0) throw_runtime("divisibleby(0)");
    return std::fmod(operand_number(operand, name), divisor) == 0;
  }
  if (name == "gt" || name == "greaterthan")
    return operand_number(operand, name) > numeric_arg(args, name);
  if (name == "ge") return operand_number(operand, name) >= numeric_arg(args, name);
  if (name == "lt" || name == "lessthan")
    return operand_number(operand, name) < numeric_arg(args, name);
  if (name == "le") return operand_number(operand, name) <= numeric_arg(args, name);
  if (name == "in") {
    if (args.empty()) throw_runtime("test 'in' needs an argument");
    return contained_in(operand, args[0]);
  }
  if (name == "sameas") {
    if (args.empty()) throw_runtime("test 'sameas' needs an argument");
    return strict_equals(operand, args[0]);
  }
  if (name == "float") return operand.is_float();
  throw_runtime("Unknown test: " + std::string(name));
}

const Value& namespace_function() {
  static const Value fn =
      Value::function("namespace", [](Interpreter& interpreter, std::vector<Value>& args,
                                      const EnvPtr&) { return make_namespace(interpreter, args); });
  return fn;
}

bool is_global_name(std::string_view name) {
  static constexpr std::string_view kNames[] = {"false", "true",         "none", "raise_exception",
                                                "range", "strftime_now", "True", "False",
                                                "None",  "namespace"};
  return contains(kNames, name);
}

void declare_globals(Environment& globals) {
  globals.set("false", Value::boolean(false));
  globals.set("true", Value::boolean(true));
  globals.set("none", Value::null());
  globals.set(
      "raise_exception",
      Value::function(
          "raise_exception", [](Interpreter&, std::vector<Value>& args, const EnvPtr&) -> Value {
            std::string message;
            if (!args.empty() && !args[0].is_null() && !args[0].is_undefined()) {
              append_raw_string(message, args[0]);
            }
            throw TemplateError{TemplateErrorKind::kRaised, std::move(message), kNoOffset};
          }));
  globals.set("range", Value::function("range", [](Interpreter&, std::vector<Value>& args,
                                                   const EnvPtr&) { return make_range(args); }));
  globals.set("strftime_now",
              Value::function("strftime_now", [](Interpreter& interpreter, std::vector<Value>& args,
                                                 const EnvPtr&) {
                if (args.empty() || !args[0].is_string()) {
                  throw_runtime("strftime_now() needs a format string");
                }
                std::tm now{};
                if (interpreter.settings().now) {
                  now = *interpreter.settings().now;
                } else {
                  const std::time_t t = std::time(nullptr);
                  localtime_r(&t, &now);
                }
                return Value::string(strftime_like_reference(now, args[0].str()));
              }));
  globals.set("True", Value::boolean(true));
  globals.set("False", Value::boolean(false));
  globals.set("None", Value::null());
}

}  // namespace strata::jinja
