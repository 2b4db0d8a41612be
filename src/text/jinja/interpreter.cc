#include "text/jinja/interpreter.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <string>

#include "text/jinja/builtins.h"
#include "text/jinja/error.h"
#include "text/jinja/js_number.h"
#include "text/jinja/macro.h"
#include "text/jinja/unicode.h"

namespace strata::jinja {
namespace {

// Bound on nested macro (and caller) calls; the reference would exhaust the JavaScript stack.
constexpr int kMaxCallDepth = 100;

// Attaches the offset of `node` to an error that does not have one yet.
[[noreturn]] void rethrow_at(TemplateError& error, const Node& node) {
  if (error.offset == kNoOffset) error.offset = node.offset;
  throw;
}

// Array.prototype.at: ToIntegerOrInfinity, negative from the end, undefined out of range.
Value array_at(const Array& items, double index) {
  const double length = static_cast<double>(items.size());
  double k = std::isnan(index) ? 0.0 : std::trunc(index);
  if (k < 0) k += length;
  if (k < 0 || k >= length) return Value();
  return items[static_cast<size_t>(k)];
}

// utils.slice of the reference: Python-like bounds, except that an explicit stop of -1
// with a negative step means "through the first element".
template <typename T>
std::vector<T> js_slice(const std::vector<T>& items, std::optional<double> start,
                        std::optional<double> stop, std::optional<double> step_opt) {
  const double length = static_cast<double>(items.size());
  const double step = step_opt.value_or(1);
  const double direction = step > 0 ? 1 : (step < 0 ? -1 : 0);
  double s = 0;
  double e = 0;
  if (direction >= 0) {
    s = start.value_or(0);
    s = s < 0 ? std::max(length + s, 0.0) : std::min(s, length);
    e = stop.value_or(length);
    e = e < 0 ? std::max(length + e, 0.0) : std::min(e, length);
  } else {
    s = start.value_or(length - 1);
    s = s < 0 ? std::max(length + s, -1.0) : std::min(s, length - 1);
    e = stop.value_or(-1);
    e = e < -1 ? std::max(length + e, -1.0) : std::min(e, length - 1);
  }
  std::vector<T> out;
  for (double i = s; direction * i < direction * e; i += step) {
    out.push_back(items[static_cast<size_t>(i)]);
  }
  return out;
}

}  // namespace

// ---- Environment ----

Value Environment::lookup(std::string_view name) const {
  if (name == "namespace") {
    // Every scope of the reference starts with its own `namespace` binding, so the
    // innermost scope decides: its own assignment, else the built-in function.
    for (const auto& [key, value] : vars_) {
      if (key == name) return value;
    }
    return namespace_function();
  }
  for (const Environment* env = this; env != nullptr; env = env->parent_.get()) {
    for (const auto& [key, value] : env->vars_) {
      if (key == name) return value;
    }
  }
  return Value();
}

void Environment::set(std::string_view name, Value value) {
  for (auto& [key, v] : vars_) {
    if (key == name) {
      v = std::move(value);
      return;
    }
  }
  vars_.emplace_back(std::string(name), std::move(value));
}

bool Environment::has_own(std::string_view name) const {
  for (const auto& [key, value] : vars_) {
    if (key == name) return true;
  }
  return false;
}

// ---- Interpreter ----

Interpreter::~Interpreter() {
  for (const std::weak_ptr<Object>& weak : namespaces_) {
    if (std::shared_ptr<Object> ns = weak.lock()) ns->clear();
  }
}

void Interpreter::track_namespace(const std::shared_ptr<Object>& entries) {
  namespaces_.push_back(entries);
}

std::string Interpreter::render(const Program& program, const EnvPtr& globals) {
  std::string out;
  try {
    render_block(program.body, globals, out);
  } catch (const BreakSignal&) {
    throw_runtime("{% break %} outside of a for loop");
  } catch (const ContinueSignal&) {
    throw_runtime("{% continue %} outside of a for loop");
  }
  return out;
}

void Interpreter::render_block(const NodeList& statements, const EnvPtr& env, std::string& out) {
  for (const NodePtr& statement : statements) render_statement(*statement, env, out);
}

void Interpreter::render_statement(const Node& statement, const EnvPtr& env, std::string& out) {
  try {
    switch (statement.kind) {
      case NodeKind::kStringLiteral:
        out += *statement.as<StringLiteral>().value;
        return;
      case NodeKind::kComment:
        return;
      case NodeKind::kIf: {
        const If& node = statement.as<If>();
        const bool test = evaluate(*node.test, env).truthy();
        render_block(test ? node.body : node.alternate, env, out);
        return;
      }
      case NodeKind::kFor:
        render_for(statement.as<For>(), env, out);
        return;
      case NodeKind::kSet:
        execute_set(statement.as<SetStatement>(), env);
        return;
      case NodeKind::kMacro:
        define_macro(statement.as<Macro>(), env);
        return;
      case NodeKind::kBreak:
        throw BreakSignal{};
      case NodeKind::kContinue:
        throw ContinueSignal{};
      case NodeKind::kProgram:
        render_block(statement.as<Program>().body, env, out);
        return;
      default: {
        Value value;
        if (statement.kind == NodeKind::kCallStatement) {
          value = execute_call_statement(statement.as<CallStatement>(), env);
        } else if (statement.kind == NodeKind::kFilterStatement) {
          const FilterStatement& node = statement.as<FilterStatement>();
          std::string body;
          render_block(node.body, env, body);
          value = apply_filter(*this, Value::string(std::move(body)), *node.filter, env);
        } else {
          value = evaluate(statement, env);
        }
        if (!value.is_null() && !value.is_undefined()) append_display(out, value);
        return;
      }
    }
  } catch (TemplateError& error) {
    rethrow_at(error, statement);
  }
}

void Interpreter::render_for(const For& node, const EnvPtr& env, std::string& out) {
  auto scope = std::make_shared<Environment>(env);
  const Node* test = nullptr;
  Value iterable;
  if (node.iterable->kind == NodeKind::kSelectExpression) {
    const SelectExpression& select = node.iterable->as<SelectExpression>();
    iterable = evaluate(*select.lhs, scope);
    test = select.test.get();
  } else {
    iterable = evaluate(*node.iterable, scope);
  }
  if (!iterable.is_array() && !iterable.is_object()) {
    throw_runtime("Expected iterable or object type in for loop: got " + type_of(iterable),
                  node.iterable->offset);
  }
  Array keys;
  if (iterable.is_object()) {
    for (const Object::Entry& e : iterable.object().entries())
      keys.push_back(Value::string(e.first));
  }
  const Array& all_items = iterable.is_object() ? keys : iterable.array();

  const Node& loopvar = *node.loopvar;
  const bool unpack = loopvar.kind == NodeKind::kTupleLiteral;
  auto bind = [&loopvar, unpack](Environment& target, const Value& current) {
    if (!unpack) {
      target.set(loopvar.as<Identifier>().value, current);
      return;
    }
    const NodeList& names = loopvar.as<TupleLiteral>().items;
    for (size_t j = 0; j < names.size(); ++j) {
      if (names[j]->kind != NodeKind::kIdentifier) {
        throw_runtime("Cannot unpack into something that is not a name", names[j]->offset);
      }
      target.set(names[j]->as<Identifier>().value, current.array()[j]);
    }
  };

  // Select the items first (the reference evaluates the loop filter for every item before
  // rendering any iteration, so loop.length and loop.last count only selected items).
  Array items;
  items.reserve(all_items.size());
  for (const Value& current : all_items) {
    if (unpack) {
      if (!current.is_array() || current.is_tuple()) {
        throw_runtime("Cannot unpack non-iterable type: " + type_of(current), loopvar.offset);
      }
      const size_t want = loopvar.as<TupleLiteral>().items.size();
      const size_t have = current.array().size();
      if (want != have) {
        throw_runtime(std::string("Too ") + (want > have ? "few" : "many") + " items to unpack",
                      loopvar.offset);
      }
    }
    if (test != nullptr) {
      auto loop_scope = std::make_shared<Environment>(scope);
      bind(*loop_scope, current);
      if (!evaluate(*test, loop_scope).truthy()) continue;
    }
    items.push_back(current);
  }

  bool no_iteration = true;
  const double length = static_cast<double>(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    const double index = static_cast<double>(i);
    Object loop;
    loop.reserve(9);
    loop.append_unique("index", Value::integer(index + 1));
    loop.append_unique("index0", Value::integer(index));
    loop.append_unique("revindex", Value::integer(length - index));
    loop.append_unique("revindex0", Value::integer(length - index - 1));
    loop.append_unique("first", Value::boolean(i == 0));
    loop.append_unique("last", Value::boolean(i + 1 == items.size()));
    loop.append_unique("length", Value::integer(length));
    loop.append_unique("previtem", i > 0 ? items[i - 1] : Value());
    loop.append_unique("nextitem", i + 1 < items.size() ? items[i + 1] : Value());
    scope->set("loop", Value::object(std::move(loop)));
    bind(*scope, items[i]);

    const size_t mark = out.size();
    try {
      render_block(node.body, scope, out);
    } catch (const ContinueSignal&) {
      out.resize(mark);  // the reference drops the output of an interrupted iteration
      continue;
    } catch (const BreakSignal&) {
      out.resize(mark);
      break;
    }
    no_iteration = false;
  }
  if (no_iteration) render_block(node.default_block, scope, out);
}

void Interpreter::execute_set(const SetStatement& node, const EnvPtr& env) {
  Value rhs;
  if (node.value) {
    rhs = evaluate(*node.value, env);
  } else {
    std::string body;
    render_block(node.body, env, body);
    rhs = Value::string(std::move(body));
  }
  const Node& target = *node.assignee;
  switch (target.kind) {
    case NodeKind::kIdentifier:
      env->set(target.as<Identifier>().value, std::move(rhs));
      return;
    case NodeKind::kTupleLiteral: {
      const NodeList& names = target.as<TupleLiteral>().items;
      if (!rhs.is_array()) {
        throw_runtime("Cannot unpack non-iterable type in set: " + type_of(rhs), target.offset);
      }
      const Array& values = rhs.array();
      if (values.size() != names.size()) {
        throw_runtime(std::string("Too ") + (names.size() > values.size() ? "few" : "many") +
                          " items to unpack in set",
                      target.offset);
      }
      for (size_t i = 0; i < names.size(); ++i) {
        if (names[i]->kind != NodeKind::kIdentifier) {
          throw_runtime("Cannot unpack to non-identifier in set", names[i]->offset);
        }
        env->set(names[i]->as<Identifier>().value, values[i]);
      }
      return;
    }
    case NodeKind::kMemberExpression: {
      const MemberExpression& member = target.as<MemberExpression>();
      const Value object = evaluate(*member.object, env);
      if (!object.is_namespace()) {
        throw_runtime("cannot assign attribute on non-namespace object", target.offset);
      }
      if (member.property->kind != NodeKind::kIdentifier) {
        throw_runtime("Cannot assign to member with non-identifier property", target.offset);
      }
      object.object().set(member.property->as<Identifier>().value, std::move(rhs));
      return;
    }
    default:
      throw_runtime("Invalid LHS inside assignment expression", target.offset);
  }
}

void Interpreter::define_macro(const Macro& node, const EnvPtr& env) {
  const SpecialArguments special = find_special_arguments(node.args, node.body);
  const Macro* macro = &node;
  env->set(node.name,
           Value::function(node.name, [macro, special](Interpreter& self, std::vector<Value>& args,
                                                       const EnvPtr& call_env) {
             if (++self.call_depth_ > kMaxCallDepth) {
               --self.call_depth_;
               throw_runtime("macro calls nest deeper than " + std::to_string(kMaxCallDepth));
             }
             std::string out;
             try {
               auto scope = std::make_shared<Environment>(call_env);
               bind_macro_arguments(self, "'" + macro->name + "'", macro->args, special, args,
                                    scope);
               self.render_block(macro->body, scope, out);
             } catch (...) {
               --self.call_depth_;
               throw;
             }
             --self.call_depth_;
             return Value::string(std::move(out));
           }));
}

Value Interpreter::execute_call_statement(const CallStatement& node, const EnvPtr& env) {
  static const NodeList kNoParameters;
  const NodeList& parameters = node.caller_args ? *node.caller_args : kNoParameters;
  const SpecialArguments special = find_special_arguments(parameters, node.body);
  // The caller refers to the call block's scope weakly: a caller that outlives its block
  // (stored in a namespace) fails cleanly instead of keeping the scope alive.
  std::weak_ptr<Environment> weak_env = env;
  const CallStatement* statement = &node;
  const NodeList* caller_parameters = &parameters;
  Value caller =
      Value::function("caller", [weak_env, statement, caller_parameters, special](
                                    Interpreter& self, std::vector<Value>& args, const EnvPtr&) {
        EnvPtr block_env = weak_env.lock();
        if (!block_env) throw_runtime("caller() used after its call block ended");
        if (++self.call_depth_ > kMaxCallDepth) {
          --self.call_depth_;
          throw_runtime("macro calls nest deeper than " + std::to_string(kMaxCallDepth));
        }
        std::string out;
        try {
          auto scope = std::make_shared<Environment>(block_env);
          bind_macro_arguments(self, "None", *caller_parameters, special, args, scope);
          self.render_block(statement->body, scope, out);
        } catch (...) {
          --self.call_depth_;
          throw;
        }
        --self.call_depth_;
        return Value::string(std::move(out));
      });

  Object kwargs;
  std::vector<Value> args = evaluate_arguments(node.call->args, env, kwargs);
  args.push_back(Value::kwargs(std::move(kwargs)));
  const Value callee = evaluate(*node.call->callee, env);
  if (!callee.is_function()) {
    throw_runtime("Cannot call something that is not a function: got " + type_of(callee),
                  node.call->offset);
  }
  auto call_env = std::make_shared<Environment>(env);
  call_env->set("caller", std::move(caller));
  return callee.function().call(*this, args, call_env);
}

Value Interpreter::evaluate(const Node& node, const EnvPtr& env) {
  try {
    return evaluate_expression(node, env);
  } catch (TemplateError& error) {
    rethrow_at(error, node);
  }
}

Value Interpreter::evaluate_expression(const Node& node, const EnvPtr& env) {
  switch (node.kind) {
    case NodeKind::kStringLiteral:
      return Value::string(node.as<StringLiteral>().value);
    case NodeKind::kIntegerLiteral:
      return Value::integer(node.as<IntegerLiteral>().value);
    case NodeKind::kFloatLiteral:
      return Value::floating(node.as<FloatLiteral>().value);
    case NodeKind::kArrayLiteral:
    case NodeKind::kTupleLiteral: {
      const NodeList& items = node.kind == NodeKind::kArrayLiteral ? node.as<ArrayLiteral>().items
                                                                   : node.as<TupleLiteral>().items;
      Array values;
      values.reserve(items.size());
      for (const NodePtr& item : items) values.push_back(evaluate(*item, env));
      if (node.kind == NodeKind::kTupleLiteral) return Value::tuple(std::move(values));
      return Value::array(std::move(values));
    }
    case NodeKind::kObjectLiteral: {
      Object mapping;
      for (const auto& [key_node, value_node] : node.as<ObjectLiteral>().entries) {
        const Value key = evaluate(*key_node, env);
        if (!key.is_string()) {
          throw_runtime("Object keys must be strings: got " + type_of(key), key_node->offset);
        }
        mapping.set(key.str(), evaluate(*value_node, env));
      }
      return Value::object(std::move(mapping));
    }
    case NodeKind::kIdentifier:
      return env->lookup(node.as<Identifier>().value);
    case NodeKind::kCallExpression:
      return evaluate_call(node.as<CallExpression>(), env);
    case NodeKind::kMemberExpression:
      return evaluate_member(node.as<MemberExpression>(), env);
    case NodeKind::kUnaryExpression:
      return evaluate_unary(node.as<UnaryExpression>(), env);
    case NodeKind::kBinaryExpression:
      return evaluate_binary(node.as<BinaryExpression>(), env);
    case NodeKind::kFilterExpression: {
      const FilterExpression& f = node.as<FilterExpression>();
      const Value operand = evaluate(*f.operand, env);
      return apply_filter(*this, operand, *f.filter, env);
    }
    case NodeKind::kTestExpression:
      return evaluate_test(node.as<TestExpression>(), env);
    case NodeKind::kSelectExpression: {
      const SelectExpression& s = node.as<SelectExpression>();
      if (!evaluate(*s.test, env).truthy()) return Value();
      return evaluate(*s.lhs, env);
    }
    case NodeKind::kTernary: {
      const Ternary& t = node.as<Ternary>();
      return evaluate(*t.condition, env).truthy() ? evaluate(*t.true_expr, env)
                                                  : evaluate(*t.false_expr, env);
    }
    case NodeKind::kComment:
      return Value::null();
    default:
      throw_runtime("Unknown node type in an expression");
  }
}

Value Interpreter::evaluate_binary(const BinaryExpression& node, const EnvPtr& env) {
  const Value left = evaluate(*node.left, env);
  if (node.op == BinaryOp::kAnd) return left.truthy() ? evaluate(*node.right, env) : left;
  if (node.op == BinaryOp::kOr) return left.truthy() ? left : evaluate(*node.right, env);
  const Value right = evaluate(*node.right, env);
  if (node.op == BinaryOp::kEqual) return Value::boolean(loose_equals(left, right));
  if (node.op == BinaryOp::kNotEqual) return Value::boolean(!loose_equals(left, right));

  const bool membership = node.op == BinaryOp::kIn || node.op == BinaryOp::kNotIn;
  if (left.is_undefined() || right.is_undefined()) {
    // `x in undefined` is false and `x not in undefined` true; anything else throws.
    if (right.is_undefined() && membership) return Value::boolean(node.op == BinaryOp::kNotIn);
    throw_runtime("Cannot perform operation " + node.op_text + " on undefined values");
  }
  if (left.is_null() || right.is_null()) throw_runtime("Cannot perform operation on null values");
  if (node.op == BinaryOp::kConcat) {
    std::string s;
    append_raw_string(s, left);
    append_raw_string(s, right);
    return Value::string(std::move(s));
  }
  const bool left_numeric_like = left.is_number() || left.is_boolean();
  const bool right_numeric_like = right.is_number() || right.is_boolean();
  if (node.op == BinaryOp::kPower && left_numeric_like && right_numeric_like) {
    const double a = left.number();
    const double b = right.number();
    if (a == 0 && b < 0) throw_runtime("0.0 cannot be raised to a negative power");
    const double result = js_pow(a, b);
    if (!std::isfinite(result)) throw_runtime("Exponentiation result is not a finite real number");
    const bool is_float = left.is_float() || right.is_float() || b < 0;
    return is_float ? Value::floating(result) : Value::integer(result);
  }
  if (left.is_number() && right.is_number()) {
    const double a = left.number();
    const double b = right.number();
    const bool is_float = left.is_float() || right.is_float();
    auto numeric = [is_float](double r) {
      return is_float ? Value::floating(r) : Value::integer(r);
    };
    switch (node.op) {
      case BinaryOp::kAdd:
        return numeric(a + b);
      case BinaryOp::kSubtract:
        return numeric(a - b);
      case BinaryOp::kMultiply:
        return numeric(a * b);
      case BinaryOp::kDivide:
        return Value::floating(a / b);
      case BinaryOp::kFloorDivide:
        return numeric(std::floor(a / b));
      case BinaryOp::kModulo:
        return numeric(std::fmod(a, b));
      case BinaryOp::kLess:
        return Value::boolean(a < b);
      case BinaryOp::kGreater:
        return Value::boolean(a > b);
      case BinaryOp::kGreaterEqual:
        return Value::boolean(a >= b);
      case BinaryOp::kLessEqual:
        return Value::boolean(a <= b);
      default:
        break;
    }
  } else if (left.is_array() && right.is_array()) {
    if (node.op == BinaryOp::kAdd) {
      Array joined = left.array();
      joined.insert(joined.end(), right.array().begin(), right.array().end());
      return Value::array(std::move(joined));
    }
  } else if (right.is_array()) {
    if (membership) {
      bool member = false;
      for (const Value& item : right.array()) {
        if (strict_equals(item, left)) {
          member = true;
          break;
        }
      }
      return Value::boolean(node.op == BinaryOp::kIn ? member : !member);
    }
  }
  if ((left.is_string() || right.is_string()) && node.op == BinaryOp::kAdd) {
    std::string s;
    append_raw_string(s, left);
    append_raw_string(s, right);
    return Value::string(std::move(s));
  }
  if (left.is_string() && right.is_string() && membership) {
    const bool found = right.str().find(left.str()) != std::string::npos;
    return Value::boolean(node.op == BinaryOp::kIn ? found : !found);
  }
  if (left.is_string() && right.is_object() && membership) {
    const bool found = right.object().find(left.str()) != nullptr;
    return Value::boolean(node.op == BinaryOp::kIn ? found : !found);
  }
  throw_runtime("Unknown operator \"" + node.op_text + "\" between " + type_of(left) + " and " +
                type_of(right));
}

Value Interpreter::evaluate_unary(const UnaryExpression& node, const EnvPtr& env) {
  const Value argument = evaluate(*node.argument, env);
  if (node.op == "not") return Value::boolean(!argument.truthy());
  if (argument.is_number() || argument.is_boolean()) {
    const double sign = node.op == "-" ? -1 : 1;
    const double result = sign * argument.number();
    return argument.is_float() ? Value::floating(result) : Value::integer(result);
  }
  throw_runtime("Unknown operator \"" + node.op + "\" for " + type_of(argument));
}

Value get_member(Interpreter& /*interpreter*/, const Value& object, const Value& property) {
  if (object.is_attribute_container()) {
    if (!property.is_string()) {
      throw_runtime("Cannot access property with non-string: got " + type_of(property));
    }
    if (const Value* own = object.object().find(property.str())) return *own;
    Value builtin;
    if (object.is_object() && builtin_member(object, property.str(), builtin)) return builtin;
    return Value();
  }
  if (object.is_array() || object.is_string()) {
    if (property.is_integer()) {
      if (object.is_array()) return array_at(object.array(), property.number());
      std::string unit;
      if (!unicode::utf16_at(object.str(), property.number(), unit)) return Value();
      return Value::string(std::move(unit));
    }
    if (property.is_string()) {
      Value builtin;
      if (builtin_member(object, property.str(), builtin)) return builtin;
      return Value();
    }
    throw_runtime("Cannot access property with non-string/non-number: got " + type_of(property));
  }
  if (!property.is_string()) {
    throw_runtime("Cannot access property with non-string: got " + type_of(property));
  }
  return Value();
}

Value Interpreter::evaluate_member(const MemberExpression& node, const EnvPtr& env) {
  const Value object = evaluate(*node.object, env);
  Value property;
  if (node.computed) {
    if (node.property->kind == NodeKind::kSliceExpression) {
      return evaluate_slice(object, node.property->as<SliceExpression>(), env);
    }
    property = evaluate(*node.property, env);
  } else if (node.property->kind == NodeKind::kIntegerLiteral) {
    property = Value::integer(node.property->as<IntegerLiteral>().value);
  } else {
    property = Value::string(node.property->as<Identifier>().value);
  }
  return get_member(*this, object, property);
}

Value Interpreter::evaluate_slice(const Value& object, const SliceExpression& node,
                                  const EnvPtr& env) {
  if (!object.is_array() && !object.is_string()) {
    throw_runtime("Slice object must be an array or string");
  }
  auto bound = [&](const NodePtr& part, const char* what) -> std::optional<double> {
    const Value v = part ? evaluate(*part, env) : Value();
    if (v.is_undefined()) return std::nullopt;
    if (!v.is_integer())
      throw_runtime(std::string("Slice ") + what + " must be numeric or undefined");
    return v.number();
  };
  const std::optional<double> start = bound(node.start, "start");
  const std::optional<double> stop = bound(node.stop, "stop");
  const std::optional<double> step = bound(node.step, "step");
  if (object.is_array()) return Value::array(js_slice(object.array(), start, stop, step));
  // Strings slice by code points (the reference slices Array.from(string)).
  std::vector<std::string_view> chars;
  const std::string& s = object.str();
  size_t pos = 0;
  while (pos < s.size()) {
    const size_t begin = pos;
    unicode::decode(s, pos);
    chars.emplace_back(s.data() + begin, pos - begin);
  }
  std::string out;
  for (std::string_view c : js_slice(chars, start, stop, step)) out += c;
  return Value::string(std::move(out));
}

std::vector<Value> Interpreter::evaluate_arguments(const NodeList& args, const EnvPtr& env,
                                                   Object& kwargs) {
  std::vector<Value> positional;
  positional.reserve(args.size());
  for (const NodePtr& arg : args) {
    if (arg->kind == NodeKind::kSpreadExpression) {
      const Value v = evaluate(*arg->as<SpreadExpression>().argument, env);
      if (!v.is_array())
        throw_runtime("Cannot unpack non-iterable type: " + type_of(v), arg->offset);
      positional.insert(positional.end(), v.array().begin(), v.array().end());
    } else if (arg->kind != NodeKind::kKeywordArgumentExpression &&
               arg->kind != NodeKind::kKeywordSpreadExpression) {
      positional.push_back(evaluate(*arg, env));
    }
  }
  auto add = [&kwargs](const std::string& key, Value value, size_t offset) {
    if (kwargs.find(key) != nullptr) {
      throw_runtime("Got multiple values for keyword argument '" + key + "'", offset);
    }
    kwargs.set(key, std::move(value));
  };
  for (const NodePtr& arg : args) {
    if (arg->kind == NodeKind::kKeywordArgumentExpression) {
      const KeywordArgumentExpression& k = arg->as<KeywordArgumentExpression>();
      add(k.key, evaluate(*k.value, env), arg->offset);
    } else if (arg->kind == NodeKind::kKeywordSpreadExpression) {
      const Value v = evaluate(*arg->as<KeywordSpreadExpression>().argument, env);
      if (!v.is_object()) {
        throw_runtime("Argument after ** must be a mapping, not " + type_of(v), arg->offset);
      }
      for (const Object::Entry& e : v.object().entries()) add(e.first, e.second, arg->offset);
    }
  }
  return positional;
}

Value Interpreter::call(const Value& callee, std::vector<Value>& args, const EnvPtr& env) {
  if (!callee.is_function()) {
    throw_runtime("Cannot call something that is not a function: got " + type_of(callee));
  }
  return callee.function().call(*this, args, env);
}

Value Interpreter::evaluate_call(const CallExpression& node, const EnvPtr& env) {
  Object kwargs;
  std::vector<Value> args = evaluate_arguments(node.args, env, kwargs);
  if (!kwargs.empty()) args.push_back(Value::kwargs(std::move(kwargs)));

  // `object.method(...)`: call a built-in method without materialising a bound function.
  // Same order as the reference: arguments first, then the callee expression.
  const Node& callee_node = *node.callee;
  if (callee_node.kind == NodeKind::kMemberExpression) {
    const MemberExpression& member = callee_node.as<MemberExpression>();
    if (!member.computed && member.property->kind == NodeKind::kIdentifier) {
      Value object;
      try {
        object = evaluate(*member.object, env);
      } catch (TemplateError& error) {
        rethrow_at(error, callee_node);
      }
      const std::string& name = member.property->as<Identifier>().value;
      const bool own_key = object.is_attribute_container() && object.object().find(name) != nullptr;
      Value result;
      if (!own_key && (object.is_string() || object.is_array() || object.is_object()) &&
          call_builtin_method(*this, object, name, args, result)) {
        return result;
      }
      Value fn;
      try {
        fn = get_member(*this, object, Value::string(name));
      } catch (TemplateError& error) {
        rethrow_at(error, callee_node);
      }
      return call(fn, args, env);
    }
  }
  const Value fn = evaluate(callee_node, env);
  return call(fn, args, env);
}

Value Interpreter::evaluate_test(const TestExpression& node, const EnvPtr& env) {
  const Value operand = evaluate(*node.operand, env);
  std::vector<Value> args;
  if (!node.args.empty()) {
    Object kwargs;
    args = evaluate_arguments(node.args, env, kwargs);
    if (!kwargs.empty()) throw_runtime("test '" + node.test + "' takes no keyword arguments");
  }
  const bool result = apply_test(node.test, operand, args);
  return Value::boolean(node.negate ? !result : result);
}

}  // namespace strata::jinja
