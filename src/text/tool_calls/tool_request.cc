#include "text/tool_calls/tool_request.h"

#include <algorithm>

namespace strata {
namespace {

using ojson = nlohmann::ordered_json;

bool valid_function_name(const std::string& s) {
  if (s.empty() || s.size() > 64) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-';
  });
}

}  // namespace

Result<std::vector<std::string>> validate_tools(const ojson& tools) {
  if (!tools.is_array()) return bad_argument("'tools' must be an array");
  if (tools.size() > 128) return bad_argument("'tools' holds at most 128 tools");
  std::vector<std::string> names;
  for (size_t i = 0; i < tools.size(); ++i) {
    const ojson& t = tools[i];
    const std::string where = "tools[" + std::to_string(i) + "]";
    if (!t.is_object()) return bad_argument(where + " must be an object");
    const auto type = t.find("type");
    if (type == t.end() || !type->is_string() || *type != "function") {
      return bad_argument(where + ".type must be \"function\"");
    }
    const auto fn = t.find("function");
    if (fn == t.end() || !fn->is_object())
      return bad_argument(where + ".function must be an object");
    const auto name = fn->find("name");
    if (name == fn->end() || !name->is_string()) {
      return bad_argument(where + ".function.name must be a string");
    }
    const std::string n = name->get<std::string>();
    if (!valid_function_name(n)) {
      return bad_argument(where + ".function.name '" + n +
                          "' must be 1 to 64 letters, digits, underscores or dashes");
    }
    if (std::find(names.begin(), names.end(), n) != names.end()) {
      return bad_argument(where + ".function.name '" + n + "' is given twice");
    }
    if (const auto d = fn->find("description");
        d != fn->end() && !d->is_null() && !d->is_string()) {
      return bad_argument(where + ".function.description must be a string");
    }
    if (const auto p = fn->find("parameters"); p != fn->end() && !p->is_null()) {
      if (!p->is_object())
        return bad_argument(where + ".function.parameters must be a JSON Schema object");
      if (const auto pt = p->find("type"); pt != p->end() && !pt->is_string() && !pt->is_array()) {
        return bad_argument(where + ".function.parameters.type must be a string or an array");
      }
      if (const auto props = p->find("properties");
          props != p->end() && !props->is_null() && !props->is_object()) {
        return bad_argument(where + ".function.parameters.properties must be an object");
      }
      if (const auto req = p->find("required"); req != p->end() && !req->is_null()) {
        if (!req->is_array() ||
            !std::all_of(req->begin(), req->end(), [](const ojson& r) { return r.is_string(); })) {
          return bad_argument(where + ".function.parameters.required must be an array of strings");
        }
      }
    }
    if (const auto s = fn->find("strict"); s != fn->end() && !s->is_null() && !s->is_boolean()) {
      return bad_argument(where + ".function.strict must be a boolean");
    }
    names.push_back(n);
  }
  return names;
}

Result<ToolChoice> parse_tool_choice(const ojson* choice,
                                     const std::vector<std::string>& function_names) {
  ToolChoice out;
  out.mode = function_names.empty() ? ToolChoiceMode::kNone : ToolChoiceMode::kAuto;
  if (choice == nullptr || choice->is_null()) return out;
  if (choice->is_string()) {
    const std::string s = choice->get<std::string>();
    if (s == "none") {
      out.mode = ToolChoiceMode::kNone;
    } else if (s == "auto") {
      out.mode = function_names.empty() ? ToolChoiceMode::kNone : ToolChoiceMode::kAuto;
    } else if (s == "required") {
      if (function_names.empty()) return bad_argument("'tool_choice' \"required\" needs 'tools'");
      out.mode = ToolChoiceMode::kRequired;
    } else {
      return bad_argument(
          "'tool_choice' must be \"none\", \"auto\", \"required\" or "
          "{\"type\": \"function\", \"function\": {\"name\": ...}}, got \"" +
          s + "\"");
    }
    return out;
  }
  if (!choice->is_object()) {
    return bad_argument("'tool_choice' must be a string or {\"type\": \"function\", ...}");
  }
  const auto type = choice->find("type");
  if (type == choice->end() || !type->is_string() || *type != "function") {
    return bad_argument("'tool_choice.type' must be \"function\"");
  }
  const auto fn = choice->find("function");
  if (fn == choice->end() || !fn->is_object() || !fn->contains("name") ||
      !(*fn)["name"].is_string()) {
    return bad_argument("'tool_choice.function.name' must be a string");
  }
  out.function = (*fn)["name"].get<std::string>();
  if (std::find(function_names.begin(), function_names.end(), out.function) ==
      function_names.end()) {
    return bad_argument("'tool_choice' names the function '" + out.function +
                        "', which is not in 'tools'");
  }
  out.mode = ToolChoiceMode::kFunction;
  return out;
}

Status check_tool_choice(const ToolChoice& choice, const std::vector<ToolCall>& calls) {
  if (choice.mode == ToolChoiceMode::kRequired && calls.empty()) {
    return make_error(ErrorCode::kFailedPrecondition,
                      "tool_choice is \"required\" but the model's reply calls no tool");
  }
  if (choice.mode == ToolChoiceMode::kFunction) {
    if (calls.empty()) {
      return make_error(
          ErrorCode::kFailedPrecondition,
          "tool_choice names '" + choice.function + "' but the model's reply calls no tool");
    }
    for (const ToolCall& c : calls) {
      if (c.name != choice.function) {
        return make_error(ErrorCode::kFailedPrecondition, "tool_choice names '" + choice.function +
                                                              "' but the model's reply calls '" +
                                                              c.name + "'");
      }
    }
  }
  return {};
}

Status validate_message_tool_calls(const ojson& messages) {
  if (!messages.is_array()) return {};
  for (size_t i = 0; i < messages.size(); ++i) {
    const ojson& m = messages[i];
    if (!m.is_object()) continue;
    const auto tc = m.find("tool_calls");
    if (tc == m.end() || tc->is_null()) continue;
    if (!tc->is_array())
      return bad_argument("messages[" + std::to_string(i) + "].tool_calls must be an array");
    for (size_t k = 0; k < tc->size(); ++k) {
      const ojson& c = (*tc)[k];
      const std::string where =
          "messages[" + std::to_string(i) + "].tool_calls[" + std::to_string(k) + "]";
      if (!c.is_object()) return bad_argument(where + " must be an object");
      if (const auto id = c.find("id"); id != c.end() && !id->is_null() && !id->is_string()) {
        return bad_argument(where + ".id must be a string");
      }
      const auto fn = c.find("function");
      if (fn == c.end() || !fn->is_object())
        return bad_argument(where + ".function must be an object");
      const auto name = fn->find("name");
      if (name == fn->end() || !name->is_string()) {
        return bad_argument(where + ".function.name must be a string");
      }
      const auto args = fn->find("arguments");
      if (args != fn->end() && !args->is_string() && !args->is_object()) {
        return bad_argument(where + ".function.arguments must be a JSON string or an object");
      }
    }
  }
  return {};
}

bool normalize_tool_call_messages(ojson& messages) {
  if (!messages.is_array()) return false;
  bool changed = false;
  for (ojson& m : messages) {
    if (!m.is_object()) continue;
    if (const auto tc = m.find("tool_calls"); tc == m.end() || !tc->is_array()) continue;
    // Adding "content" may move the members (ordered_json keeps them in a vector): look
    // tool_calls up afterwards.
    if (const auto content = m.find("content"); content == m.end() || content->is_null()) {
      m["content"] = "";
      changed = true;
    }
    for (ojson& c : m["tool_calls"]) {
      if (!c.is_object()) continue;
      const auto fn = c.find("function");
      if (fn == c.end() || !fn->is_object()) continue;
      const auto args = fn->find("arguments");
      if (args == fn->end() || !args->is_string()) continue;
      ojson parsed = ojson::parse(args->get<std::string>(), nullptr, /*allow_exceptions=*/false);
      if (parsed.is_discarded() || !parsed.is_object()) continue;
      *args = std::move(parsed);
      changed = true;
    }
  }
  return changed;
}

}  // namespace strata
