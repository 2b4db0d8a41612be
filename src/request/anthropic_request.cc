#include "request/anthropic_request.h"

#include <algorithm>

#include "request/chat_request.h"
#include "request/json_fields.h"
#include "request/turn_record.h"
#include "text/tokenizer/utf8.h"

namespace strata {
namespace {

using ojson = nlohmann::ordered_json;

#define STRATA_TRY_ASSIGN(var, expr)                     \
  auto var##_r = (expr);                                 \
  if (!var##_r) return std::unexpected(var##_r.error()); \
  auto var = std::move(*var##_r)

// Reads the breakpoints of one request in Anthropic's order, checking their number and
// that no longer TTL follows a shorter one.
class BreakpointReader {
 public:
  // Reads `block`'s cache_control (absent or null: no breakpoint). `cut` makes the
  // request as it stands after the block; it is called only for a breakpoint.
  template <class Cut>
  Status read(const ojson& block, const std::string& where, Cut&& cut) {
    const auto cc = block.find("cache_control");
    if (cc == block.end() || cc->is_null()) return {};
    STRATA_TRY_ASSIGN(ttl_s, read_cache_control(*cc, where + ".cache_control"));
    return add(ttl_s, where, cut());
  }

  Status add(int64_t ttl_s, const std::string& where, CacheBreakpoint bp) {
    if (out_.size() == kMaxCacheBreakpoints) {
      return bad_argument("A maximum of " + std::to_string(kMaxCacheBreakpoints) +
                          " blocks with cache_control may be provided (" + where + " is one more)");
    }
    if (!out_.empty() && ttl_s > out_.back().ttl_s) {
      return bad_argument(where +
                          ".cache_control: a ttl='1h' cache_control block must not come after "
                          "a ttl='5m' one (the order is tools, system, messages)");
    }
    bp.ttl_s = ttl_s;
    out_.push_back(std::move(bp));
    return {};
  }

  static Result<int64_t> read_cache_control(const ojson& cc, const std::string& where) {
    if (!cc.is_object()) return bad_argument(where + " must be an object");
    STRATA_TRY_ASSIGN(type, get_string(cc, "type"));
    if (!type || *type != "ephemeral") {
      return bad_argument(where + ".type must be \"ephemeral\"");
    }
    STRATA_TRY_ASSIGN(ttl, get_string(cc, "ttl"));
    if (!ttl || *ttl == "5m") return kEphemeral5mTtlS;
    if (*ttl == "1h") return kEphemeral1hTtlS;
    return bad_argument(where + ".ttl must be \"5m\" or \"1h\", not \"" + *ttl + "\"");
  }

  std::vector<CacheBreakpoint> take() { return std::move(out_); }

 private:
  std::vector<CacheBreakpoint> out_;
};

// A text block's text ({"type": "text", "text": "..."}), checked.
Result<std::string> text_of(const ojson& block, const std::string& where) {
  const auto text = block.find("text");
  if (text == block.end() || !text->is_string()) {
    return bad_argument(where + ".text must be a string");
  }
  return text->get<std::string>();
}

Result<std::string> block_type(const ojson& block, const std::string& where) {
  if (!block.is_object()) return bad_argument(where + " must be an object");
  const auto type = block.find("type");
  if (type == block.end() || !type->is_string()) {
    return bad_argument(where + ".type must be a string");
  }
  return type->get<std::string>();
}

std::unexpected<Error> unsupported_block(const std::string& where, const std::string& type,
                                         const std::string& allowed) {
  return bad_argument(where + ": content block type '" + type +
                      "' is not supported here (supported: " + allowed + ")");
}

// Text blocks are joined with a newline into one chat message's content.
void append_text(std::string& to, const std::string& text) {
  if (!to.empty()) to += "\n";
  to += text;
}

// The `system` field: a string, or text blocks (each may be a breakpoint). With
// `strip_billing`, Claude Code's billing line goes into `stripped` instead of the prompt: the
// first block when it is that line alone, or a string's first line.
Result<std::optional<ojson>> read_system(const ojson& body, size_t num_tools, BreakpointReader& bps,
                                         bool strip_billing, std::string& stripped) {
  const auto sys = body.find("system");
  if (sys == body.end() || sys->is_null()) return std::optional<ojson>();
  std::string text;
  if (sys->is_string()) {
    text = sys->get<std::string>();
    const size_t eol = text.find('\n');
    if (strip_billing && is_billing_header(std::string_view(text).substr(0, eol))) {
      stripped = text.substr(0, eol);
      text = eol == std::string::npos ? std::string() : text.substr(eol + 1);
    }
  } else if (sys->is_array()) {
    for (size_t i = 0; i < sys->size(); ++i) {
      const std::string where = "system[" + std::to_string(i) + "]";
      STRATA_TRY_ASSIGN(type, block_type((*sys)[i], where));
      if (type != "text") return unsupported_block(where, type, "text");
      STRATA_TRY_ASSIGN(t, text_of((*sys)[i], where));
      if (i == 0 && strip_billing && is_billing_header(t)) {
        stripped = t;
      } else {
        append_text(text, t);
      }
      auto st = bps.read((*sys)[i], where, [&] {
        return CacheBreakpoint{
            .messages = ojson::array({ojson{{"role", "system"}, {"content", text}}}),
            .num_tools = num_tools};
      });
      if (!st) return std::unexpected(st.error());
    }
  } else {
    return bad_argument("'system' must be a string or an array of text blocks");
  }
  // A system prompt that was only the billing line is none, as if never sent.
  if (text.empty() && !stripped.empty()) return std::optional<ojson>();
  return std::optional<ojson>(ojson{{"role", "system"}, {"content", std::move(text)}});
}

// The `tools` field as chat-completions function tools. Server tools (a `type` other than
// "custom": bash, web_search, ...) run at Anthropic, not here: refused.
Result<ojson> read_tools(const ojson& tools, BreakpointReader& bps) {
  if (!tools.is_array()) return bad_argument("'tools' must be an array");
  ojson out = ojson::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const ojson& t = tools[i];
    const std::string where = "tools[" + std::to_string(i) + "]";
    if (!t.is_object()) return bad_argument(where + " must be an object");
    STRATA_TRY_ASSIGN(type, get_string(t, "type"));
    if (type && *type != "custom") {
      return bad_argument(where + ".type '" + *type +
                          "' is a server tool, which Strata does not run (client tools only)");
    }
    STRATA_TRY_ASSIGN(name, get_string(t, "name"));
    if (!name) return bad_argument(where + ".name is required");
    STRATA_TRY_ASSIGN(description, get_string(t, "description"));
    const auto schema = t.find("input_schema");
    if (schema == t.end() || !schema->is_object()) {
      return bad_argument(where + ".input_schema must be an object (a JSON Schema)");
    }
    ojson function{{"name", *name}};
    if (description) function["description"] = *description;
    function["parameters"] = *schema;
    out.push_back(ojson{{"type", "function"}, {"function", std::move(function)}});
    auto st = bps.read(t, where, [&] { return CacheBreakpoint{.num_tools = i + 1}; });
    if (!st) return std::unexpected(st.error());
  }
  return out;
}

// `tool_choice` as chat-completions' (auto -> "auto", any -> "required", tool -> the named
// function, none -> "none"); disable_parallel_tool_use is checked and has no effect (a
// reply may hold several calls, as in chat completions).
Result<ojson> read_tool_choice(const ojson& choice) {
  if (!choice.is_object()) return bad_argument("'tool_choice' must be an object");
  STRATA_TRY_ASSIGN(type, get_string(choice, "type"));
  STRATA_TRY_ASSIGN(parallel, get_bool(choice, "disable_parallel_tool_use"));
  (void)parallel;
  if (!type) return bad_argument("tool_choice.type is required");
  if (*type == "auto") return ojson("auto");
  if (*type == "any") return ojson("required");
  if (*type == "none") return ojson("none");
  if (*type == "tool") {
    STRATA_TRY_ASSIGN(name, get_string(choice, "name"));
    if (!name) return bad_argument("tool_choice.name is required for type 'tool'");
    return ojson{{"type", "function"}, {"function", {{"name", *name}}}};
  }
  return bad_argument("tool_choice.type must be one of auto, any, tool, none, not '" + *type + "'");
}

// Builds the chat messages of `messages`, block by block, so that a breakpoint can cut the
// conversation just after its block.
class MessageMapper {
 public:
  MessageMapper(ojson out, size_t num_tools, BreakpointReader& bps)
      : out_(std::move(out)), num_tools_(num_tools), bps_(bps) {}

  Status add(const ojson& m, size_t index) {
    const std::string where = "messages[" + std::to_string(index) + "]";
    if (!m.is_object()) return bad_argument(where + " must be an object");
    STRATA_TRY_ASSIGN(role, get_string(m, "role"));
    if (!role || (*role != "user" && *role != "assistant" && *role != "system")) {
      return bad_argument(where + ".role must be \"user\", \"assistant\" or \"system\"");
    }
    role_ = *role;
    const auto content = m.find("content");
    if (content == m.end()) return bad_argument(where + ".content is required");
    if (content->is_string()) {
      text_ = content->get<std::string>();
      has_text_ = true;
      flush();
      return {};
    }
    if (!content->is_array()) {
      return bad_argument(where + ".content must be a string or an array of content blocks");
    }
    for (size_t i = 0; i < content->size(); ++i) {
      const ojson& block = (*content)[i];
      const std::string bw = where + ".content[" + std::to_string(i) + "]";
      STRATA_TRY_ASSIGN(type, block_type(block, bw));
      if (type == "text") {
        STRATA_TRY_ASSIGN(t, text_of(block, bw));
        append_text(text_, t);
        has_text_ = true;
      } else if (type == "tool_use" && role_ == "assistant") {
        if (auto st = add_tool_use(block, bw); !st) return st;
      } else if (type == "tool_result" && role_ == "user") {
        if (auto st = add_tool_result(block, bw); !st) return st;
      } else {
        return unsupported_block(bw, type,
                                 role_ == "user"     ? "text, tool_result"
                                 : role_ == "system" ? "text"
                                                     : "text, tool_use");
      }
      auto st = bps_.read(block, bw, [&] {
        return CacheBreakpoint{.messages = with_pending(), .num_tools = num_tools_};
      });
      if (!st) return st;
    }
    flush();
    return {};
  }

  ojson take() {
    flush();
    return std::move(out_);
  }
  const ojson& messages() const { return out_; }

 private:
  Status add_tool_use(const ojson& block, const std::string& where) {
    STRATA_TRY_ASSIGN(id, get_string(block, "id"));
    STRATA_TRY_ASSIGN(name, get_string(block, "name"));
    if (!id) return bad_argument(where + ".id must be a string");
    if (!name) return bad_argument(where + ".name must be a string");
    const auto input = block.find("input");
    if (input == block.end() || !input->is_object()) {
      return bad_argument(where + ".input must be an object");
    }
    calls_.push_back(ojson{
        {"id", *id}, {"type", "function"}, {"function", {{"name", *name}, {"arguments", *input}}}});
    return {};
  }

  // A tool result is a chat `tool` message; text before it in the same message goes
  // first, as its own user message.
  Status add_tool_result(const ojson& block, const std::string& where) {
    STRATA_TRY_ASSIGN(id, get_string(block, "tool_use_id"));
    if (!id) return bad_argument(where + ".tool_use_id must be a string");
    STRATA_TRY_ASSIGN(is_error, get_bool(block, "is_error"));
    (void)is_error;
    std::string text;
    const auto content = block.find("content");
    if (content != block.end() && !content->is_null()) {
      if (content->is_string()) {
        text = content->get<std::string>();
      } else if (content->is_array()) {
        for (size_t i = 0; i < content->size(); ++i) {
          const std::string cw = where + ".content[" + std::to_string(i) + "]";
          STRATA_TRY_ASSIGN(type, block_type((*content)[i], cw));
          if (type != "text") return unsupported_block(cw, type, "text");
          STRATA_TRY_ASSIGN(t, text_of((*content)[i], cw));
          append_text(text, t);
        }
      } else {
        return bad_argument(where + ".content must be a string or an array of text blocks");
      }
    }
    flush();
    out_.push_back(ojson{{"role", "tool"}, {"tool_call_id", *id}, {"content", std::move(text)}});
    return {};
  }

  // The message being built, if it has anything.
  std::optional<ojson> pending() const {
    if (!has_text_ && calls_.empty()) return std::nullopt;
    ojson m{{"role", role_}, {"content", text_}};
    if (!calls_.empty()) m["tool_calls"] = calls_;
    return m;
  }
  ojson with_pending() const {
    ojson all = out_;
    if (auto m = pending()) all.push_back(std::move(*m));
    return all;
  }
  void flush() {
    if (auto m = pending()) out_.push_back(std::move(*m));
    text_.clear();
    has_text_ = false;
    calls_ = ojson::array();
  }

  ojson out_;
  size_t num_tools_;
  BreakpointReader& bps_;
  std::string role_;
  std::string text_;
  bool has_text_ = false;
  ojson calls_ = ojson::array();
};

}  // namespace

bool is_billing_header(std::string_view text) {
  constexpr std::string_view kPrefix = "x-anthropic-billing-header:";
  if (!text.starts_with(kPrefix)) return false;
  std::string_view rest = text.substr(kPrefix.size());
  while (!rest.empty() && rest.back() == ' ') rest.remove_suffix(1);
  size_t fields = 0;
  while (!rest.empty()) {
    if (rest.front() != ' ') return false;
    rest.remove_prefix(1);
    const size_t eq = rest.find('=');
    const size_t semi = rest.find(';');
    if (eq == std::string_view::npos || semi == std::string_view::npos || eq == 0 ||
        semi < eq + 2 || semi - eq - 1 > 128) {
      return false;
    }
    for (char c : rest.substr(0, eq)) {
      if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-')) return false;
    }
    for (char c : rest.substr(eq + 1, semi - eq - 1)) {
      if (static_cast<unsigned char>(c) <= ' ' || c == 0x7f) return false;
    }
    rest.remove_prefix(semi + 1);
    ++fields;
  }
  return fields > 0;
}

Result<AnthropicRequest> read_anthropic_request(const ojson& body, AnthropicEndpoint endpoint,
                                                const AnthropicReadOptions& options) {
  if (!body.is_object()) return bad_argument("the body must be a JSON object");
  AnthropicRequest r;
  ojson& chat = r.chat_body;
  BreakpointReader bps;
  STRATA_TRY_ASSIGN(model, get_string(body, "model"));
  if (model) chat["model"] = *model;
  size_t num_tools = 0;
  if (const auto t = body.find("tools"); t != body.end() && !t->is_null()) {
    STRATA_TRY_ASSIGN(tools, read_tools(*t, bps));
    num_tools = tools.size();
    if (!tools.empty()) chat["tools"] = std::move(tools);
  }
  STRATA_TRY_ASSIGN(system, read_system(body, num_tools, bps, options.strip_billing_header,
                                        r.stripped_billing_header));
  const auto messages = body.find("messages");
  if (messages == body.end() || !messages->is_array()) {
    return bad_argument("'messages' is required: an array of messages");
  }
  if (messages->empty()) return bad_argument("'messages' must not be empty");
  MessageMapper mapper(system ? ojson::array({*system}) : ojson::array(), num_tools, bps);
  for (size_t i = 0; i < messages->size(); ++i) {
    if (auto st = mapper.add((*messages)[i], i); !st) return std::unexpected(st.error());
  }
  chat["messages"] = mapper.take();
  // The automatic mode: a breakpoint on the last block, i.e. the whole conversation.
  if (const auto cc = body.find("cache_control"); cc != body.end() && !cc->is_null()) {
    STRATA_TRY_ASSIGN(ttl_s, BreakpointReader::read_cache_control(*cc, "cache_control"));
    auto st = bps.add(ttl_s, "cache_control",
                      CacheBreakpoint{.messages = chat["messages"], .num_tools = num_tools});
    if (!st) return std::unexpected(st.error());
  }
  r.breakpoints = bps.take();
  if (const auto c = body.find("tool_choice"); c != body.end() && !c->is_null()) {
    STRATA_TRY_ASSIGN(choice, read_tool_choice(*c));
    chat["tool_choice"] = std::move(choice);
  }
  if (endpoint == AnthropicEndpoint::kCountTokens) return r;

  STRATA_TRY_ASSIGN(max_tokens, get_int(body, "max_tokens", 1, 1 << 24));
  if (!max_tokens) return bad_argument("'max_tokens' is required: an integer >= 1");
  chat["max_tokens"] = *max_tokens;
  STRATA_TRY_ASSIGN(temperature, get_number(body, "temperature", 0.0, 1.0));
  if (temperature) chat["temperature"] = *temperature;
  STRATA_TRY_ASSIGN(top_p, get_number(body, "top_p", 0.0, 1.0));
  if (top_p) chat["top_p"] = *top_p;
  STRATA_TRY_ASSIGN(top_k, get_int(body, "top_k", 0, 1 << 20));
  if (top_k) chat["top_k"] = *top_k;
  STRATA_TRY_ASSIGN(stream, get_bool(body, "stream"));
  r.stream = stream.value_or(false);
  chat["stream"] = r.stream;
  if (const auto s = body.find("stop_sequences"); s != body.end() && !s->is_null()) {
    if (!s->is_array() ||
        !std::all_of(s->begin(), s->end(), [](const ojson& x) { return x.is_string(); })) {
      return bad_argument("'stop_sequences' must be an array of strings");
    }
    if (!s->empty()) chat["stop"] = *s;
  }
  // Strata's extensions, read by parse_generation_params as on chat completions.
  for (const char* key : {"forced_output", "ignore_eos", "cache_salt", "seed", "priority"}) {
    if (const auto it = body.find(key); it != body.end()) chat[key] = *it;
  }
  if (const auto md = body.find("metadata"); md != body.end() && !md->is_null()) {
    if (!md->is_object()) return bad_argument("'metadata' must be an object");
    STRATA_TRY_ASSIGN(user, get_string(*md, "user_id"));
    if (user && !user->empty()) {  // empty: no user, and no session from it
      if (Status st = check_session_id(*user, "metadata.user_id"); !st) {
        return std::unexpected(st.error());
      }
    }
    if (user) r.user_id = std::move(*user);
  }
  return r;
}

Result<std::string> anthropic_session(const AnthropicRequest& request,
                                      std::string_view header_session) {
  if (!header_session.empty()) {
    if (Status st = check_session_id(header_session, "x-session-id"); !st) {
      return std::unexpected(st.error());
    }
    return std::string(header_session);
  }
  return request.user_id;
}

size_t breakpoint_prefix_tokens(const PromptReader& reader, const ojson* all_tools,
                                const ojson& template_kwargs, const CacheBreakpoint& bp,
                                const std::vector<int32_t>& prompt) {
  std::optional<ojson> tools;
  if (all_tools != nullptr) {
    tools = ojson::array();
    for (size_t i = 0; i < bp.num_tools && i < all_tools->size(); ++i) {
      tools->push_back((*all_tools)[i]);
    }
  }
  auto ids = reader.chat_tokens(bp.messages, tools ? &*tools : nullptr,
                                /*add_generation_prompt=*/false, template_kwargs);
  if (!ids) return 0;
  const size_t n = std::min(ids->size(), prompt.size());
  size_t k = 0;
  while (k < n && (*ids)[k] == prompt[k]) ++k;
  return k;
}

CacheUsage cache_usage(int64_t prompt_tokens, int64_t cached_tokens,
                       std::vector<PlacedBreakpoint> breakpoints) {
  CacheUsage u;
  cached_tokens = std::clamp<int64_t>(cached_tokens, 0, prompt_tokens);
  u.cache_read_input_tokens = cached_tokens;
  std::sort(breakpoints.begin(), breakpoints.end(),
            [](const PlacedBreakpoint& a, const PlacedBreakpoint& b) {
              return a.num_tokens < b.num_tokens;
            });
  int64_t covered = cached_tokens;  // tokens counted so far, from the start
  for (const PlacedBreakpoint& bp : breakpoints) {
    const int64_t end = std::min<int64_t>(static_cast<int64_t>(bp.num_tokens), prompt_tokens);
    if (end <= covered) continue;
    const int64_t created = end - covered;
    u.cache_creation_input_tokens += created;
    (bp.ttl_s >= kEphemeral1hTtlS ? u.ephemeral_1h_input_tokens : u.ephemeral_5m_input_tokens) +=
        created;
    covered = end;
  }
  u.input_tokens = prompt_tokens - covered;
  return u;
}

}  // namespace strata

#undef STRATA_TRY_ASSIGN
