// Errors inside the Jinja engine.
//
// The lexer, parser and interpreter report failures by throwing TemplateError; the public
// entry points (Template::parse, Template::render, ChatTemplate) catch it and return a
// Result, so no exception ever leaves the engine. Throwing keeps the recursive evaluator
// readable; the cost is paid only on the error path.
#pragma once

#include <cstddef>
#include <limits>
#include <string>

namespace strata::jinja {

inline constexpr size_t kNoOffset = std::numeric_limits<size_t>::max();

enum class TemplateErrorKind {
  kSyntax,       // the template text is not valid (lexer or parser)
  kUnsupported,  // a construct Strata does not implement (e.g. {% include %})
  kRuntime,      // evaluation failed (type error, unknown filter, ...)
  kRaised,       // the template called raise_exception(message)
};

struct TemplateError {
  TemplateErrorKind kind = TemplateErrorKind::kRuntime;
  std::string message;
  // Byte offset in the original template source of the construct that failed, or kNoOffset
  // while unknown (the nearest enclosing node fills it in as the error propagates).
  size_t offset = kNoOffset;
};

[[noreturn]] inline void throw_runtime(std::string message, size_t offset = kNoOffset) {
  throw TemplateError{TemplateErrorKind::kRuntime, std::move(message), offset};
}

[[noreturn]] inline void throw_syntax(std::string message, size_t offset) {
  throw TemplateError{TemplateErrorKind::kSyntax, std::move(message), offset};
}

[[noreturn]] inline void throw_unsupported(std::string message, size_t offset) {
  throw TemplateError{TemplateErrorKind::kUnsupported, std::move(message), offset};
}

}  // namespace strata::jinja
