// Evaluation of a parsed template with @huggingface/jinja 0.5.11's semantics: its scoping
// (a for loop opens one scope for all iterations; macros see the caller's variables), its
// undefined handling (attributes of undefined are undefined; most operators on undefined
// throw), its loop-control behaviour (output of an iteration cut short by break/continue is
// dropped) and its printing rules. Filters, tests and methods live in builtins.h.
//
// Internal to the engine: use Template (template.h) or ChatTemplate (chat_template.h).
// Errors are thrown as TemplateError and caught by those entry points.
#pragma once

#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "text/jinja/ast.h"
#include "text/jinja/value.h"

namespace strata::jinja {

// A scope. The reference gives every scope its own `namespace` function; `lookup` emulates
// that without storing it. Environments are shared so that a `caller` function can refer
// to the scope of its call block; functions hold environments only weakly, so values never
// keep scopes alive in a cycle.
class Environment {
 public:
  explicit Environment(std::shared_ptr<Environment> parent) : parent_(std::move(parent)) {}

  // The value of `name` in this scope or an enclosing one; undefined when unbound.
  Value lookup(std::string_view name) const;
  // Binds `name` in this scope (the reference's setVariable).
  void set(std::string_view name, Value value);
  bool has_own(std::string_view name) const;

 private:
  std::shared_ptr<Environment> parent_;
  std::vector<std::pair<std::string, Value>> vars_;
};

using EnvPtr = std::shared_ptr<Environment>;

struct RenderSettings {
  // The local time strftime_now() formats; the current local time when unset.
  std::optional<std::tm> now;
};

// Unwinds to the innermost for loop ({% break %} / {% continue %}).
struct BreakSignal {};
struct ContinueSignal {};

class Interpreter {
 public:
  explicit Interpreter(RenderSettings settings) : settings_(std::move(settings)) {}
  ~Interpreter();
  Interpreter(const Interpreter&) = delete;
  Interpreter& operator=(const Interpreter&) = delete;

  // Renders `program` in `globals`. Throws TemplateError.
  std::string render(const Program& program, const EnvPtr& globals);

  Value evaluate(const Node& node, const EnvPtr& env);

  // Evaluates call arguments as the reference does: all positional arguments (with `*`
  // unpacking) first, then keyword arguments (with `**` unpacking) into `kwargs`.
  std::vector<Value> evaluate_arguments(const NodeList& args, const EnvPtr& env, Object& kwargs);

  // Calls a function value with the reference's argument convention (see Function).
  Value call(const Value& callee, std::vector<Value>& args, const EnvPtr& env);

  // Registers a namespace so that its contents are released at the end of the render
  // (namespaces are the only mutable containers, hence the only way to build a cycle).
  void track_namespace(const std::shared_ptr<Object>& entries);

  const RenderSettings& settings() const { return settings_; }

 private:
  void render_block(const NodeList& statements, const EnvPtr& env, std::string& out);
  void render_statement(const Node& statement, const EnvPtr& env, std::string& out);
  void render_for(const For& node, const EnvPtr& env, std::string& out);
  void execute_set(const SetStatement& node, const EnvPtr& env);
  void define_macro(const Macro& node, const EnvPtr& env);
  Value execute_call_statement(const CallStatement& node, const EnvPtr& env);

  Value evaluate_expression(const Node& node, const EnvPtr& env);
  Value evaluate_binary(const BinaryExpression& node, const EnvPtr& env);
  Value evaluate_unary(const UnaryExpression& node, const EnvPtr& env);
  Value evaluate_member(const MemberExpression& node, const EnvPtr& env);
  Value evaluate_slice(const Value& object, const SliceExpression& node, const EnvPtr& env);
  Value evaluate_call(const CallExpression& node, const EnvPtr& env);
  Value evaluate_test(const TestExpression& node, const EnvPtr& env);

  RenderSettings settings_;
  int call_depth_ = 0;
  std::vector<std::weak_ptr<Object>> namespaces_;
};

// Attribute lookup of the reference's MemberExpression for a computed or constant property:
// object keys then dict methods, array/string indices, string methods, `length`.
Value get_member(Interpreter& interpreter, const Value& object, const Value& property);

}  // namespace strata::jinja
