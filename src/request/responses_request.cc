#include "request/responses_request.h"

#include <algorithm>

#include "request/json_fields.h"
#include "request/turn_record.h"

namespace strata {
namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

#define STRATA_TRY_ASSIGN(var, expr)                     \
  auto var##_r = (expr);                                 \
  if (!var##_r) return std::unexpected(var##_r.error()); \
  auto var = std::move(*var##_r)

Result<std::string> type_of(const ojson& item, const std::string& where) {
  if (!item.is_object()) return bad_argument(where + " must be an object");
  const auto type = item.find("type");
  if (type == item.end() || type->is_null()) return std::string();
  if (!type->is_string()) return bad_argument(where + ".type must be a string");
  return type->get<std::string>();
}

Result<std::string> required_string(const ojson& obj, const char* key, const std::string& where) {
  STRATA_TRY_ASSIGN(s, get_string(obj, key));
  if (!s) return bad_argument(where + "." + key + " must be a string");
  return *s;
}

// Text parts are joined with a newline into one chat message's content.
void append_part_text(std::string& to, const std::string& text) {
  if (!to.empty()) to += "\n";
  to += text;
}

// A message's content: a string, or text parts (input_text; output_text and refusal in an
// assistant message).
Result<std::string> read_content(const ojson& content, bool assistant, const std::string& where) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) {
    return bad_argument(where + " must be a string or an array of content parts");
  }
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    const std::string pw = where + "[" + std::to_string(i) + "]";
    STRATA_TRY_ASSIGN(type, type_of(content[i], pw));
    const bool ok = assistant ? (type == "output_text" || type == "refusal" || type == "input_text")
                              : type == "input_text";
    if (!ok) {
      return bad_argument(pw + ": content part type '" + type +
                          "' is not supported here (supported: " +
                          (assistant ? "output_text, refusal" : "input_text") + ")");
    }
    STRATA_TRY_ASSIGN(t, required_string(content[i], type == "refusal" ? "refusal" : "text", pw));
    append_part_text(text, t);
  }
  return text;
}

// Builds the chat messages of `input` item by item: function calls join the assistant
// message before them (a reply's text and its calls are one chat turn).
class InputMapper {
 public:
  Status add(const ojson& item, size_t index) {
    const std::string where = "input[" + std::to_string(index) + "]";
    STRATA_TRY_ASSIGN(type, type_of(item, where));
    if (type.empty() || type == "message") return add_message(item, where);
    if (type == "function_call") return add_call(item, where, /*custom=*/false);
    if (type == "custom_tool_call") return add_call(item, where, /*custom=*/true);
    if (type == "function_call_output" || type == "custom_tool_call_output") {
      return add_output(item, where);
    }
    // Strata returns no reasoning items; a client that echoes one from elsewhere loses
    // nothing the template would render.
    if (type == "reasoning") return {};
    return bad_argument(where + ": input item type '" + type +
                        "' is not supported (supported: message, function_call, "
                        "function_call_output, custom_tool_call, custom_tool_call_output, "
                        "reasoning)");
  }
  ojson take() { return std::move(out_); }

 private:
  Status add_message(const ojson& item, const std::string& where) {
    STRATA_TRY_ASSIGN(role, get_string(item, "role"));
    if (!role ||
        (*role != "user" && *role != "assistant" && *role != "system" && *role != "developer")) {
      return bad_argument(where + ".role must be one of user, assistant, system, developer");
    }
    const auto content = item.find("content");
    if (content == item.end()) return bad_argument(where + ".content is required");
    STRATA_TRY_ASSIGN(text, read_content(*content, *role == "assistant", where + ".content"));
    out_.push_back(ojson{{"role", *role == "developer" ? "system" : *role}, {"content", text}});
    return {};
  }

  // A function call, or a custom tool's call (its free-form `input` read as the arguments
  // {"input": ...} of the function the model was offered: custom_tool_arguments).
  Status add_call(const ojson& item, const std::string& where, bool custom) {
    STRATA_TRY_ASSIGN(call_id, required_string(item, "call_id", where));
    STRATA_TRY_ASSIGN(own_name, required_string(item, "name", where));
    STRATA_TRY_ASSIGN(name_space, get_string(item, "namespace"));
    const std::string name =
        name_space && !name_space->empty() ? qualified_tool_name(*name_space, own_name) : own_name;
    std::string arguments;
    if (custom) {
      STRATA_TRY_ASSIGN(input, required_string(item, "input", where));
      arguments = custom_tool_arguments(input);
    } else {
      STRATA_TRY_ASSIGN(text, required_string(item, "arguments", where));
      arguments = std::move(text);
    }
    const ojson args = ojson::parse(arguments, nullptr, /*allow_exceptions=*/false);
    if (!args.is_object()) {
      return bad_argument(where + ".arguments must be a JSON object's text");
    }
    ojson call{{"id", call_id},
               {"type", "function"},
               {"function", {{"name", name}, {"arguments", arguments}}}};
    if (out_.empty() || out_.back().value("role", "") != "assistant") {
      out_.push_back(ojson{{"role", "assistant"}, {"content", ""}});
    }
    ojson& m = out_.back();
    if (!m.contains("tool_calls")) m["tool_calls"] = ojson::array();
    m["tool_calls"].push_back(std::move(call));
    return {};
  }

  Status add_output(const ojson& item, const std::string& where) {
    STRATA_TRY_ASSIGN(call_id, required_string(item, "call_id", where));
    const auto output = item.find("output");
    if (output == item.end()) return bad_argument(where + ".output is required");
    STRATA_TRY_ASSIGN(text, read_content(*output, false, where + ".output"));
    out_.push_back(ojson{{"role", "tool"}, {"tool_call_id", call_id}, {"content", text}});
    return {};
  }

  ojson out_ = ojson::array();
};

// Notes a tool type left out of the prompt (once).
void omit(ResponsesRequest& r, const std::string& type) {
  if (std::find(r.omitted_tools.begin(), r.omitted_tools.end(), type) == r.omitted_tools.end()) {
    r.omitted_tools.push_back(type);
  }
}

// One function tool in Responses' flat shape as a chat-completions function tool, named
// `name` (its own, or qualified by its namespace).
Result<ojson> read_function_tool(const ojson& t, const std::string& where,
                                 const std::string& name) {
  STRATA_TRY_ASSIGN(description, get_string(t, "description"));
  STRATA_TRY_ASSIGN(strict, get_bool(t, "strict"));
  (void)strict;
  ojson function{{"name", name}};
  if (description) function["description"] = *description;
  const auto params = t.find("parameters");
  if (params != t.end() && !params->is_null()) {
    if (!params->is_object()) return bad_argument(where + ".parameters must be an object");
    function["parameters"] = *params;
  }
  return ojson{{"type", "function"}, {"function", std::move(function)}};
}

// A custom tool ({"type": "custom", name, description, format}: its input is free-form text,
// Codex's apply_patch for its own models) as the function the model is offered: one string
// parameter, `input`. A grammar's definition is given to the model in the description (it
// is not enforced: decoding is not constrained).
Result<ojson> read_custom_tool(const ojson& t, const std::string& where, const std::string& name) {
  STRATA_TRY_ASSIGN(description, get_string(t, "description"));
  std::string text = description.value_or("");
  const auto format = t.find("format");
  if (format != t.end() && !format->is_null()) {
    if (!format->is_object()) return bad_argument(where + ".format must be an object");
    STRATA_TRY_ASSIGN(syntax, get_string(*format, "syntax"));
    STRATA_TRY_ASSIGN(definition, get_string(*format, "definition"));
    if (definition && !definition->empty()) {
      if (!text.empty()) text += "\n\n";
      text += "The input follows this " + syntax.value_or(std::string("grammar")) + " grammar:\n" +
              *definition;
    }
  }
  ojson function{{"name", name}};
  if (!text.empty()) function["description"] = text;
  function["parameters"] =
      ojson{{"type", "object"},
            {"properties",
             {{"input", {{"type", "string"}, {"description", "The tool's input, as text"}}}}},
            {"required", ojson::array({"input"})}};
  return ojson{{"type", "function"}, {"function", std::move(function)}};
}

// `tools`: function tools, custom tools and `namespace` groups of them, as chat-completions
// function tools (a namespace's flattened in place, qualified names); every other type is
// left out and noted in r.omitted_tools.
Result<ojson> read_tools(const ojson& tools, ResponsesRequest& r) {
  if (!tools.is_array()) return bad_argument("'tools' must be an array");
  ojson out = ojson::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const ojson& t = tools[i];
    const std::string where = "tools[" + std::to_string(i) + "]";
    STRATA_TRY_ASSIGN(type, type_of(t, where));
    if (type == "function") {
      STRATA_TRY_ASSIGN(name, required_string(t, "name", where));
      STRATA_TRY_ASSIGN(fn, read_function_tool(t, where, name));
      out.push_back(std::move(fn));
    } else if (type == "custom") {
      STRATA_TRY_ASSIGN(name, required_string(t, "name", where));
      STRATA_TRY_ASSIGN(fn, read_custom_tool(t, where, name));
      out.push_back(std::move(fn));
      r.custom_tools.insert(name);
    } else if (type == "namespace") {
      STRATA_TRY_ASSIGN(ns, required_string(t, "name", where));
      const auto members = t.find("tools");
      if (members == t.end() || !members->is_array()) {
        return bad_argument(where + ".tools must be an array");
      }
      for (size_t k = 0; k < members->size(); ++k) {
        const ojson& m = (*members)[k];
        const std::string mw = where + ".tools[" + std::to_string(k) + "]";
        STRATA_TRY_ASSIGN(mtype, type_of(m, mw));
        if (mtype != "function" && mtype != "custom") {
          omit(r, mtype);
          continue;
        }
        STRATA_TRY_ASSIGN(own, required_string(m, "name", mw));
        const std::string name = qualified_tool_name(ns, own);
        if (mtype == "custom") {
          STRATA_TRY_ASSIGN(fn, read_custom_tool(m, mw, name));
          out.push_back(std::move(fn));
          r.custom_tools.insert(name);
        } else {
          STRATA_TRY_ASSIGN(fn, read_function_tool(m, mw, name));
          out.push_back(std::move(fn));
        }
        r.namespaced[name] = ResponsesRequest::NamespacedName{.name_space = ns, .name = own};
      }
    } else {
      omit(r, type);
    }
  }
  return out;
}

// `tool_choice`: "auto" | "none" | "required" | {"type": "function", "name": ...,
// "namespace"?}. A choice of a tool left out of the prompt (a hosted tool: {"type":
// "web_search"}, ...) is refused by name.
Result<ojson> read_responses_tool_choice(const ojson& choice) {
  if (choice.is_string()) {
    const std::string s = choice.get<std::string>();
    if (s == "auto" || s == "none" || s == "required") return ojson(s);
    return bad_argument("'tool_choice' must be auto, none, required or a function, not '" + s +
                        "'");
  }
  STRATA_TRY_ASSIGN(type, type_of(choice, "tool_choice"));
  if (type == "allowed_tools") {
    return bad_argument(
        "tool_choice.type 'allowed_tools' is not supported (a string, or type "
        "'function')");
  }
  if (type != "function" && type != "custom") {
    return bad_argument("tool_choice names the tool type '" + type +
                        "', which Strata does not run: such tools are left out of the prompt "
                        "(only function tools, and namespaces of them, are offered to the model)");
  }
  STRATA_TRY_ASSIGN(name, required_string(choice, "name", "tool_choice"));
  STRATA_TRY_ASSIGN(name_space, get_string(choice, "namespace"));
  const std::string qualified =
      name_space && !name_space->empty() ? qualified_tool_name(*name_space, name) : name;
  return ojson{{"type", "function"}, {"function", {{"name", qualified}}}};
}

// `text.format` must be plain text: structured output is not offered on any route.
Status check_text(const ojson& text) {
  if (!text.is_object()) return bad_argument("'text' must be an object");
  const auto format = text.find("format");
  if (format == text.end() || format->is_null()) return {};
  STRATA_TRY_ASSIGN(type, type_of(*format, "text.format"));
  if (!type.empty() && type != "text") {
    return bad_argument("text.format.type '" + type + "' is not supported (only 'text')");
  }
  return {};
}

}  // namespace

std::string custom_tool_arguments(std::string_view input) {
  return ojson{{"input", input}}.dump(-1, ' ', false, ojson::error_handler_t::replace);
}

std::optional<std::string> custom_tool_input(std::string_view arguments) {
  const ojson args = ojson::parse(arguments, nullptr, /*allow_exceptions=*/false);
  if (!args.is_object() || !args.contains("input") || !args["input"].is_string()) {
    return std::nullopt;
  }
  return args["input"].get<std::string>();
}

std::string qualified_tool_name(std::string_view name_space, std::string_view name) {
  std::string out(name_space);
  if (!name_space.ends_with("__")) out += "__";
  out += name;
  return out;
}

Result<std::vector<std::string>> item_references(const ojson& body) {
  std::vector<std::string> out;
  const auto input = body.find("input");
  if (input == body.end() || !input->is_array()) return out;
  for (size_t i = 0; i < input->size(); ++i) {
    const ojson& item = (*input)[i];
    if (!item.is_object()) continue;
    const auto type = item.find("type");
    if (type == item.end() || *type != "item_reference") continue;
    const auto id = item.find("id");
    if (id == item.end() || !id->is_string()) {
      return bad_argument("input[" + std::to_string(i) + "].id must be a string");
    }
    out.push_back(id->get<std::string>());
  }
  return out;
}

std::optional<std::string> response_of_item(std::string_view item_id) {
  const size_t first = item_id.find('_');
  const size_t last = item_id.rfind('_');
  if (first == std::string_view::npos || last <= first + 1 || last + 1 == item_id.size()) {
    return std::nullopt;
  }
  const std::string_view prefix = item_id.substr(0, first);
  if (prefix != "msg" && prefix != "fc") return std::nullopt;
  return "resp_" + std::string(item_id.substr(first + 1, last - first - 1));
}

Error item_not_found(const std::string& item_id) {
  return Error{ErrorCode::kInvalidArgument, "Item with id '" + item_id + "' not found."};
}

Status resolve_item_references(
    ojson& body, const std::function<std::optional<ojson>(const std::string& item_id)>& find) {
  auto refs = item_references(body);
  if (!refs) return std::unexpected(refs.error());
  if (refs->empty()) return {};
  for (ojson& item : body["input"]) {
    if (!item.is_object() || !item.contains("type") || item["type"] != "item_reference") continue;
    const std::string id = item["id"].get<std::string>();
    std::optional<ojson> found = find(id);
    if (!found) return std::unexpected(item_not_found(id));
    item = std::move(*found);
  }
  return {};
}

std::optional<int64_t> retention_ttl_s(const std::string& retention) {
  if (retention == "in_memory" || retention == "in-memory") return kRetentionInMemoryTtlS;
  if (retention == "24h") return kRetention24hTtlS;
  return std::nullopt;
}

Result<ResponsesRequest> read_responses_request(const ojson& body) {
  if (!body.is_object()) return bad_argument("the body must be a JSON object");
  ResponsesRequest r;
  ojson& chat = r.chat_body;
  STRATA_TRY_ASSIGN(model, get_string(body, "model"));
  if (model) chat["model"] = *model;
  for (const char* refused : {"background", "conversation", "prompt"}) {
    const auto it = body.find(refused);
    if (it != body.end() && !it->is_null() && !(it->is_boolean() && !it->get<bool>())) {
      return bad_argument(std::string("'") + refused + "' is not supported by Strata");
    }
  }
  STRATA_TRY_ASSIGN(instructions, get_string(body, "instructions"));
  r.instructions = instructions;
  if (instructions) r.echo["instructions"] = *instructions;
  STRATA_TRY_ASSIGN(previous, get_string(body, "previous_response_id"));
  r.previous_response_id = previous;

  const auto input = body.find("input");
  if (input == body.end() || input->is_null()) {
    return bad_argument("'input' is required: a string or an array of input items");
  }
  if (input->is_string()) {
    r.input_messages.push_back(ojson{{"role", "user"}, {"content", input->get<std::string>()}});
  } else if (input->is_array()) {
    InputMapper mapper;
    for (size_t i = 0; i < input->size(); ++i) {
      if (auto st = mapper.add((*input)[i], i); !st) return std::unexpected(st.error());
    }
    r.input_messages = mapper.take();
  } else {
    return bad_argument("'input' must be a string or an array of input items");
  }

  r.echo["tools"] = json::array();
  if (const auto t = body.find("tools"); t != body.end() && !t->is_null()) {
    STRATA_TRY_ASSIGN(tools, read_tools(*t, r));
    if (!tools.empty()) chat["tools"] = std::move(tools);
    r.echo["tools"] = json::parse(t->dump());
  }
  r.echo["tool_choice"] = "auto";
  if (const auto c = body.find("tool_choice"); c != body.end() && !c->is_null()) {
    STRATA_TRY_ASSIGN(choice, read_responses_tool_choice(*c));
    chat["tool_choice"] = std::move(choice);
    r.echo["tool_choice"] = json::parse(c->dump());
  }
  STRATA_TRY_ASSIGN(parallel, get_bool(body, "parallel_tool_calls"));
  r.echo["parallel_tool_calls"] = parallel.value_or(true);
  if (parallel) chat["parallel_tool_calls"] = *parallel;

  STRATA_TRY_ASSIGN(max_tokens, get_int(body, "max_output_tokens", 1, 1 << 24));
  r.echo["max_output_tokens"] = nullptr;
  if (max_tokens) {
    chat["max_tokens"] = *max_tokens;
    r.echo["max_output_tokens"] = *max_tokens;
  }
  STRATA_TRY_ASSIGN(temperature, get_number(body, "temperature", 0.0, 2.0));
  r.echo["temperature"] = temperature.value_or(1.0);
  if (temperature) chat["temperature"] = *temperature;
  STRATA_TRY_ASSIGN(top_p, get_number(body, "top_p", 0.0, 1.0));
  r.echo["top_p"] = top_p.value_or(1.0);
  if (top_p) chat["top_p"] = *top_p;
  STRATA_TRY_ASSIGN(stream, get_bool(body, "stream"));
  r.stream = stream.value_or(false);
  chat["stream"] = r.stream;
  STRATA_TRY_ASSIGN(store, get_bool(body, "store"));
  r.store = store.value_or(true);

  STRATA_TRY_ASSIGN(key, get_string(body, "prompt_cache_key"));
  if (key) {
    if (Status st = check_session_id(*key, "prompt_cache_key"); !st) {
      return std::unexpected(st.error());
    }
    r.prompt_cache_key = *key;
  }
  STRATA_TRY_ASSIGN(retention, get_string(body, "prompt_cache_retention"));
  if (retention) {
    r.retention_ttl_s = retention_ttl_s(*retention);
    if (!r.retention_ttl_s) {
      return bad_argument("'prompt_cache_retention' must be \"in_memory\" or \"24h\", not \"" +
                          *retention + "\"");
    }
    r.retention = *retention;
  }

  if (const auto t = body.find("text"); t != body.end() && !t->is_null()) {
    if (auto st = check_text(*t); !st) return std::unexpected(st.error());
  }
  STRATA_TRY_ASSIGN(truncation, get_string(body, "truncation"));
  if (truncation && *truncation != "disabled" && *truncation != "auto") {
    return bad_argument("'truncation' must be \"disabled\" or \"auto\"");
  }
  if (const auto md = body.find("metadata"); md != body.end() && !md->is_null()) {
    if (!md->is_object()) return bad_argument("'metadata' must be an object");
    r.echo["metadata"] = json::parse(md->dump());
  } else {
    r.echo["metadata"] = json::object();
  }
  STRATA_TRY_ASSIGN(user, get_string(body, "user"));
  if (user) r.echo["user"] = *user;
  // Strata's extensions, read by parse_generation_params as on chat completions.
  for (const char* key_name : {"forced_output", "ignore_eos", "cache_salt", "seed", "priority"}) {
    if (const auto it = body.find(key_name); it != body.end()) chat[key_name] = *it;
  }
  return r;
}

ojson responses_chat_body(const ResponsesRequest& r, const ojson& history) {
  ojson chat = r.chat_body;
  ojson messages = ojson::array();
  if (r.instructions) messages.push_back(ojson{{"role", "system"}, {"content", *r.instructions}});
  for (const ojson& m : history) messages.push_back(m);
  for (const ojson& m : r.input_messages) messages.push_back(m);
  chat["messages"] = std::move(messages);
  return chat;
}

}  // namespace strata

#undef STRATA_TRY_ASSIGN
