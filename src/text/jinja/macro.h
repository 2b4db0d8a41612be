// Macro calls: which special names (`kwargs`, `varargs`) a macro body reads, and binding
// call arguments to parameters, as @huggingface/jinja 0.5.11 does
// (findAccessedSpecialMacroArguments and bindMacroArguments, which follow Python Jinja2). Internal
// to the engine.
#pragma once

#include <string>
#include <vector>

#include "text/jinja/ast.h"
#include "text/jinja/interpreter.h"
#include "text/jinja/value.h"

namespace strata::jinja {

// Whether a macro (or call block) body reads `kwargs` / `varargs` before declaring them;
// only then does the macro accept extra keyword / positional arguments.
struct SpecialArguments {
  bool kwargs = false;
  bool varargs = false;
};

SpecialArguments find_special_arguments(const NodeList& parameters, const NodeList& body);

// Binds `args` (the reference's calling convention: positional, then a keyword-arguments
// object) to `parameters` in `scope`. Every parameter is bound before defaults are
// evaluated, so a default may refer to another parameter. Throws TemplateError for an
// unexpected keyword argument or too many positional arguments.
void bind_macro_arguments(Interpreter& interpreter, const std::string& display_name,
                          const NodeList& parameters, SpecialArguments special,
                          const std::vector<Value>& args, const EnvPtr& scope);

}  // namespace strata::jinja
