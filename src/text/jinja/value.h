// The runtime value of the Jinja engine, with @huggingface/jinja's semantics.
//
// Kinds mirror the reference's RuntimeValue classes. Numbers are JavaScript doubles, with an
// integer/float distinction (IntegerValue vs FloatValue) that only changes printing and a
// few operators. Arrays and objects are shared by reference (copying a Value never copies
// a container), which gives the reference's identity semantics: `a == b` on two arrays is
// true only for the same array, and `message == user_messages[-1]` works as in JavaScript.
// Strings are immutable and shared.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace strata::jinja {

class Environment;
class Interpreter;
class Value;

using Array = std::vector<Value>;

enum class ValueKind : uint8_t {
  kUndefined,
  kNull,
  kBoolean,
  kInteger,
  kFloat,
  kString,
  kArray,      // also a tuple (is_tuple()), which the reference cannot print or unpack
  kObject,     // also keyword arguments (is_kwargs()), passed to functions as the last arg
  kNamespace,  // namespace(): the only mutable container
  kFunction,
};

// Insertion-ordered string-keyed map (a JavaScript Map). Objects are small in chat data, so
// lookups scan linearly.
class Object {
 public:
  using Entry = std::pair<std::string, Value>;

  size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }
  const Value* find(std::string_view key) const;
  // Inserts at the end, or replaces the value in place when the key exists (Map.set).
  void set(std::string_view key, Value value);
  // Appends without looking for an existing key. Precondition: `key` is not present
  // (e.g. when copying the members of a JSON object).
  void append_unique(std::string key, Value value);
  bool erase(std::string_view key);
  void clear() { entries_.clear(); }
  const std::vector<Entry>& entries() const { return entries_; }
  void reserve(size_t n) { entries_.reserve(n); }

 private:
  std::vector<Entry> entries_;
};

// A callable. `args` follows the reference's convention: positional arguments, then one
// trailing keyword-arguments object (Value::is_kwargs()) when the call had any. `env` is
// the environment at the call site (macros use dynamic scoping, as in the reference).
struct Function {
  using Callback = std::function<Value(Interpreter& interpreter, std::vector<Value>& args,
                                       const std::shared_ptr<Environment>& env)>;
  std::string name;  // for error messages
  Callback call;
};

class Value {
 public:
  Value() = default;  // undefined

  static Value null() { return Value(ValueKind::kNull); }
  static Value boolean(bool b) {
    Value v(ValueKind::kBoolean);
    v.number_ = b ? 1 : 0;
    return v;
  }
  static Value integer(double n) {
    Value v(ValueKind::kInteger);
    v.number_ = n;
    return v;
  }
  static Value floating(double n) {
    Value v(ValueKind::kFloat);
    v.number_ = n;
    return v;
  }
  static Value string(std::string s) {
    return string(std::make_shared<const std::string>(std::move(s)));
  }
  static Value string(std::shared_ptr<const std::string> s) {
    Value v(ValueKind::kString);
    v.ptr_ = std::move(s);
    return v;
  }
  static Value array(Array items) { return array(std::make_shared<Array>(std::move(items))); }
  static Value array(std::shared_ptr<Array> items) {
    Value v(ValueKind::kArray);
    v.ptr_ = std::move(items);
    return v;
  }
  static Value tuple(Array items) {
    Value v = array(std::move(items));
    v.flag_ = true;
    return v;
  }
  static Value object(Object entries) {
    return object(std::make_shared<Object>(std::move(entries)));
  }
  static Value object(std::shared_ptr<Object> entries) {
    Value v(ValueKind::kObject);
    v.ptr_ = std::move(entries);
    return v;
  }
  static Value kwargs(Object entries) {
    Value v = object(std::move(entries));
    v.flag_ = true;
    return v;
  }
  static Value name_space(std::shared_ptr<Object> entries) {
    Value v(ValueKind::kNamespace);
    v.ptr_ = std::move(entries);
    return v;
  }
  static Value function(std::shared_ptr<const Function> fn) {
    Value v(ValueKind::kFunction);
    v.ptr_ = std::move(fn);
    return v;
  }
  static Value function(std::string name, Function::Callback call) {
    return function(std::make_shared<const Function>(Function{std::move(name), std::move(call)}));
  }

  ValueKind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == ValueKind::kUndefined; }
  bool is_null() const { return kind_ == ValueKind::kNull; }
  bool is_boolean() const { return kind_ == ValueKind::kBoolean; }
  bool is_integer() const { return kind_ == ValueKind::kInteger; }
  bool is_float() const { return kind_ == ValueKind::kFloat; }
  bool is_number() const { return is_integer() || is_float(); }
  bool is_string() const { return kind_ == ValueKind::kString; }
  bool is_array() const { return kind_ == ValueKind::kArray; }
  bool is_tuple() const { return is_array() && flag_; }
  bool is_object() const { return kind_ == ValueKind::kObject; }  // includes kwargs
  bool is_kwargs() const { return is_object() && flag_; }
  bool is_namespace() const { return kind_ == ValueKind::kNamespace; }
  bool is_function() const { return kind_ == ValueKind::kFunction; }
  // ObjectValue or NamespaceValue: what attribute access and map(attribute=) accept.
  bool is_attribute_container() const { return is_object() || is_namespace(); }

  double number() const { return number_; }      // integer, float (and boolean as 0/1)
  bool boolean() const { return number_ != 0; }  // boolean
  const std::string& str() const { return *std::get<StringPtr>(ptr_); }
  const std::shared_ptr<const std::string>& str_ptr() const { return std::get<StringPtr>(ptr_); }
  Array& array() const { return *std::get<ArrayPtr>(ptr_); }
  const std::shared_ptr<Array>& array_ptr() const { return std::get<ArrayPtr>(ptr_); }
  Object& object() const { return *std::get<ObjectPtr>(ptr_); }  // object or namespace
  const std::shared_ptr<Object>& object_ptr() const { return std::get<ObjectPtr>(ptr_); }
  const Function& function() const { return *std::get<FunctionPtr>(ptr_); }

  // Address of the shared container or function (JavaScript object identity).
  const void* identity() const;

  // The reference's __bool__: numbers by value, strings non-empty, arrays and objects
  // non-empty, namespaces and functions always true, null and undefined false.
  bool truthy() const;

  // The reference's class name ("IntegerValue", "TupleValue", ...) for error messages.
  std::string_view type_name() const;

 private:
  using StringPtr = std::shared_ptr<const std::string>;
  using ArrayPtr = std::shared_ptr<Array>;
  using ObjectPtr = std::shared_ptr<Object>;
  using FunctionPtr = std::shared_ptr<const Function>;

  explicit Value(ValueKind kind) : kind_(kind) {}

  ValueKind kind_ = ValueKind::kUndefined;
  bool flag_ = false;  // tuple (arrays) or keyword arguments (objects)
  double number_ = 0;
  std::variant<std::monostate, StringPtr, ArrayPtr, ObjectPtr, FunctionPtr> ptr_;
};

// ---- printing, with the reference's exact formatting ----

// RuntimeValue.toString(): what {{ value }} prints (the caller skips null and undefined),
// also used for array elements when an array is converted to a string. Integers print
// with Number#toString, floats with a ".0" when integral, arrays/objects/namespaces as
// JSON; null and undefined print "undefined" (the reference's NullValue holds undefined).
// Throws for tuples, keyword arguments and functions, as the reference does (or would
// print JavaScript source).
void append_display(std::string& out, const Value& value);
std::string to_display(const Value& value);

// The reference's class name of `v` (Value::type_name) as a string, for error messages.
inline std::string type_of(const Value& v) {
  return std::string(v.type_name());
}

// `value.value.toString()`: the JavaScript string of the raw value, used by `~` and string
// `+`. Floats print without ".0" here, arrays join their elements' display with ",",
// objects and namespaces print "[object Map]". Precondition: not null/undefined.
void append_raw_string(std::string& out, const Value& value);

struct JsonOptions {
  std::optional<double> indent;  // spaces per level; 0 or unset means single-line
  bool ensure_ascii = false;     // escape code units >= 0x7F as \uXXXX
  std::optional<std::pair<std::string, std::string>> separators;  // {item, key}
  bool sort_keys = false;  // ICU root collation order (printable ASCII keys only)
};

// The reference's toJSON(): JSON.stringify for scalars, Python-like separators, indentation
// that keeps empty containers as [] and {}. `undefined_to_null` prints undefined as null
// (tojson) rather than "undefined" (printing an object).
void append_json(std::string& out, const Value& value, const JsonOptions& options, int depth,
                 bool undefined_to_null);

// JSON.stringify(string).
void append_json_string(std::string& out, std::string_view s, bool ensure_ascii);

// ---- comparisons ----

// JavaScript `==` on the raw values (loose equality: "1" == 1, "" == false, null ==
// undefined, containers by identity).
bool loose_equals(const Value& a, const Value& b);

// JavaScript `===` on the raw values (containers by identity, NaN unequal).
bool strict_equals(const Value& a, const Value& b);

// SameValueZero on the raw values (what Set uses: like === but NaN equals NaN).
bool same_value_zero(const Value& a, const Value& b);

// compareRuntimeValues(): the ordering of sort and dictsort. Numbers (and booleans)
// compare numerically, strings by UTF-16 code units (lowercased unless case_sensitive),
// null == null, undefined == undefined; any other pair throws.
int compare_values(const Value& a, const Value& b, bool case_sensitive);

}  // namespace strata::jinja
