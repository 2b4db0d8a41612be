// Built-in filters, tests, methods and global functions, with @huggingface/jinja 0.5.11's
// behaviour wherever it defines one. Where the reference throws (an unknown filter, a test
// with arguments, a Python string method it lacks), Strata implements Python Jinja2's
// behaviour instead: `select`/`reject`, `map('filter')`, `default` without parentheses,
// `count`, `min`, `max`, `sum`, `batch`, `round`, `escape`, `trim(chars)`, tests such as
// `divisibleby(n)`, and the string methods `find`, `count`, `rsplit`, `join`. These
// extensions never change a rendering the reference produces; docs/chat-templates.md
// lists them.
#pragma once

#include <memory>
#include <string_view>
#include <vector>

#include "text/jinja/ast.h"
#include "text/jinja/interpreter.h"
#include "text/jinja/value.h"

namespace strata::jinja {

// `operand | filter` where `filter` is an Identifier or a CallExpression node.
Value apply_filter(Interpreter& interpreter, const Value& operand, const Node& filter,
                   const EnvPtr& env);

// `operand is name(args...)` (without `not`). Throws for an unknown test.
bool apply_test(std::string_view name, const Value& operand, const std::vector<Value>& args);

// True when `name` names a test (selectattr/rejectattr/select validate names with it).
bool is_known_test(std::string_view name);

// The built-in member `name` of a string, array or object (the reference's `builtins`):
// a method bound to `object`, or the `length` of a string or array. False when none.
bool builtin_member(const Value& object, std::string_view name, Value& out);

// Calls the built-in method `name` of `object` directly (what calling builtin_member's
// result does, without creating the bound function). False when there is no such method.
bool call_builtin_method(Interpreter& interpreter, const Value& object, std::string_view name,
                         std::vector<Value>& args, Value& result);

// Declares the reference's globals: true/false/none (and title-case forms), range,
// raise_exception, strftime_now. (`namespace` is resolved by Environment::lookup.)
void declare_globals(Environment& globals);

// True for the names declare_globals binds (and `namespace`): the reference refuses a
// render context that redefines them.
bool is_global_name(std::string_view name);

// The `namespace` function shared by every scope.
const Value& namespace_function();

}  // namespace strata::jinja
