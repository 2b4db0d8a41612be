#include "text/jinja/template.h"

#include <exception>
#include <new>
#include <string>
#include <utility>

#include "text/jinja/ast.h"
#include "text/jinja/builtins.h"
#include "text/jinja/error.h"
#include "text/jinja/interpreter.h"
#include "text/jinja/lexer.h"
#include "text/jinja/parser.h"
#include "text/jinja/unicode.h"
#include "text/jinja/value_json.h"

namespace strata::jinja {
namespace {

Error to_error(const TemplateError& e, std::string_view source) {
  if (e.kind == TemplateErrorKind::kRaised) return Error{ErrorCode::kInvalidArgument, e.message};
  std::string message = e.message;
  if (e.offset != kNoOffset) {
    const SourceLocation loc = locate(source, e.offset);
    message +=
        " (at line " + std::to_string(loc.line) + ", column " + std::to_string(loc.column) + ")";
  }
  const ErrorCode code = e.kind == TemplateErrorKind::kUnsupported ? ErrorCode::kUnsupported
                                                                   : ErrorCode::kInvalidArgument;
  return Error{code, std::move(message)};
}

}  // namespace

Result<Template> Template::parse(std::string source) {
  if (!unicode::is_valid_utf8(source)) {
    return make_error(ErrorCode::kInvalidArgument, "template source is not valid UTF-8");
  }
  auto shared_source = std::make_shared<const std::string>(std::move(source));
  try {
    const std::vector<Token> tokens = tokenize(*shared_source);
    std::shared_ptr<const Program> program = jinja::parse(tokens, shared_source->size());
    return Template(std::move(shared_source), std::move(program));
  } catch (const TemplateError& e) {
    return std::unexpected(to_error(e, *shared_source));
  } catch (const std::bad_alloc&) {
    return make_error(ErrorCode::kResourceExhausted, "out of memory while parsing a template");
  } catch (const std::exception& e) {
    return make_error(ErrorCode::kInternal, std::string("template parser failed: ") + e.what());
  }
}

Result<std::string> Template::render(const Object& context,
                                     const TemplateRenderOptions& options) const {
  try {
    auto globals = std::make_shared<Environment>(nullptr);
    declare_globals(*globals);
    for (const Object::Entry& e : context.entries()) {
      // The reference declares its globals first and refuses to redeclare them.
      if (is_global_name(e.first)) {
        return make_error(ErrorCode::kInvalidArgument, "Variable already declared: " + e.first);
      }
      globals->set(e.first, e.second);
    }
    Interpreter interpreter(RenderSettings{options.now});
    return interpreter.render(*program_, globals);
  } catch (const TemplateError& e) {
    return std::unexpected(to_error(e, *source_));
  } catch (const std::bad_alloc&) {
    return make_error(ErrorCode::kResourceExhausted, "out of memory while rendering a template");
  } catch (const std::exception& e) {
    return make_error(ErrorCode::kInternal, std::string("template rendering failed: ") + e.what());
  }
}

Result<std::string> Template::render(const nlohmann::ordered_json& context,
                                     const TemplateRenderOptions& options) const {
  if (!context.is_object()) {
    return make_error(ErrorCode::kInvalidArgument, "template context must be a JSON object");
  }
  const Value value = to_value(context);
  return render(value.object(), options);
}

}  // namespace strata::jinja
