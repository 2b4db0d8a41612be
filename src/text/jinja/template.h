// A parsed Jinja template: parse once, render many times (concurrently if wanted: a
// Template is immutable and every render has its own state).
//
// The language and its results are those of @huggingface/jinja 0.5.11 (the renderer that
// transformers.js uses), with trim_blocks and lstrip_blocks on as that renderer sets them;
// see docs/chat-templates.md for the supported subset, the extensions and the differences.
#pragma once

#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/result.h"
#include "text/jinja/value.h"

namespace strata::jinja {

struct Program;

struct TemplateRenderOptions {
  // Local time that strftime_now() formats; the current local time when unset.
  std::optional<std::tm> now;
};

class Template {
 public:
  // Parses `source`. Errors (kInvalidArgument for syntax errors, kUnsupported for Jinja
  // statements Strata does not implement) name the construct and its line and column.
  static Result<Template> parse(std::string source);

  // Renders with `context` (an object whose members become template variables; key order
  // is kept, which `tojson` and `items()` expose). Errors are kInvalidArgument: for
  // raise_exception() the message is exactly the template's; for other failures it names
  // the problem with its line and column.
  Result<std::string> render(const nlohmann::ordered_json& context,
                             const TemplateRenderOptions& options = {}) const;
  // Same, from an already converted context (see to_value in value_json.h).
  Result<std::string> render(const Object& context,
                             const TemplateRenderOptions& options = {}) const;

  const std::string& source() const { return *source_; }

 private:
  Template(std::shared_ptr<const std::string> source, std::shared_ptr<const Program> program)
      : source_(std::move(source)), program_(std::move(program)) {}

  std::shared_ptr<const std::string> source_;
  std::shared_ptr<const Program> program_;
};

}  // namespace strata::jinja
