// The Jinja parser: builds the same tree as @huggingface/jinja 0.5.11's parse(), including
// its operator precedence (tests bind tighter than `*`, filters tighter than tests, unary
// minus binds to the filtered operand) and its quirks (commas between call arguments are
// optional, `a if b` without else is a select expression).
//
// One extension: a test may take arguments, `x is divisibleby(3)` or `x is eq 2`, which
// Python Jinja2 accepts and the reference rejects.
#pragma once

#include <memory>
#include <vector>

#include "text/jinja/ast.h"
#include "text/jinja/lexer.h"

namespace strata::jinja {

// Parses a token stream into a Program. Throws TemplateError (kSyntax, or kUnsupported for
// Jinja statements Strata does not implement, such as include or extends).
std::unique_ptr<Program> parse(const std::vector<Token>& tokens, size_t source_size);

}  // namespace strata::jinja
