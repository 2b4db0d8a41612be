#include "request/turn_record.h"

#include <xxhash.h>

#include <charconv>
#include <cinttypes>
#include <cstdio>
#include <limits>
#include <memory>

#include "text/tokenizer/utf8.h"

namespace strata {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

namespace {

// The digests hash compact JSON text with XXH3 (the hashing library the house uses), one
// record separator after each value, so that no two sequences of values hash the same text.
class Digest {
 public:
  Digest() { XXH3_64bits_reset(state_.get()); }
  void bytes(std::string_view b) { XXH3_64bits_update(state_.get(), b.data(), b.size()); }
  void value(const ojson& j) {
    bytes(j.dump(-1, ' ', false, ojson::error_handler_t::replace));
    bytes(std::string_view("\x1e", 1));
  }
  void context(const ojson* tools, const ojson& template_kwargs) {
    value(tools != nullptr ? *tools : ojson(nullptr));
    value(template_kwargs);
  }
  uint64_t done() const { return XXH3_64bits_digest(state_.get()); }

 private:
  struct Free {
    void operator()(XXH3_state_t* s) const { XXH3_freeState(s); }
  };
  std::unique_ptr<XXH3_state_t, Free> state_{XXH3_createState()};
};

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016" PRIx64, v);
  return buf;
}

}  // namespace

uint64_t conversation_digest(const ojson& messages, size_t num_messages, const ojson* tools,
                             const ojson& template_kwargs) {
  Digest d;
  d.context(tools, template_kwargs);
  if (messages.is_array()) {
    for (size_t i = 0; i < num_messages && i < messages.size(); ++i) d.value(messages[i]);
  }
  return d.done();
}

uint64_t conversation_root(const ojson& messages, const ojson* tools,
                           const ojson& template_kwargs) {
  Digest d;
  d.bytes("root");
  d.context(tools, template_kwargs);
  if (messages.is_array()) {
    for (const ojson& m : messages) {
      const std::string role = m.is_object() ? m.value("role", "") : "";
      if (role != "system" && role != "developer") break;
      d.value(m);
    }
  }
  return d.done();
}

std::string record_key(std::string_view session, uint64_t root) {
  return std::string(session) + "#" + hex64(root);
}

std::optional<std::vector<int32_t>> continue_turn(const PromptReader& reader, const ojson& messages,
                                                  const ojson* tools, const ojson& template_kwargs,
                                                  std::string_view cache_salt,
                                                  const ConversationRecord& record,
                                                  size_t max_tokens) {
  if (reader.chat() == nullptr) return std::nullopt;
  if (record.cache_salt != cache_salt || !messages.is_array() ||
      messages.size() <= record.num_messages + 1 || !messages[record.num_messages].is_object() ||
      messages[record.num_messages].value("role", "") != "assistant") {
    return std::nullopt;
  }
  if (conversation_digest(messages, record.num_messages, tools, template_kwargs) != record.digest) {
    return std::nullopt;
  }
  const ojson& echoed = messages[record.num_messages];
  const std::string echoed_text = echoed.contains("content") && echoed["content"].is_string()
                                      ? echoed["content"].get<std::string>()
                                      : "";
  // The client must echo what was generated (the tail of it: clients often drop a
  // reasoning block); an edited turn is rendered afresh.
  // A turn with tool calls is echoed as its content without the markup: the generated
  // text must contain it.
  const bool with_calls = echoed.contains("tool_calls") && echoed["tool_calls"].is_array() &&
                          !echoed["tool_calls"].empty();
  const std::string& generated = record.completion_text;
  const bool echoes = with_calls ? generated.find(echoed_text) != std::string::npos
                                 : generated.size() >= echoed_text.size() &&
                                       generated.compare(generated.size() - echoed_text.size(),
                                                         echoed_text.size(), echoed_text) == 0;
  if (!echoes) return std::nullopt;
  const ChatRenderOptions options = reader.render_options(tools, true, template_kwargs);
  std::vector<int32_t> out = record.tokens;
  if (out.empty()) return std::nullopt;
  // The template's rendering is searched for the stop token's text after the previous
  // messages: only a control token's (special: <|im_end|>) can be told from the reply's own
  // text there.
  Result<ChatContinuation> cont =
      make_error(ErrorCode::kFailedPrecondition, "the stop token is no control token");
  if (reader.tokenizer().is_special(out.back())) {
    cont = reader.chat()->render_continuation(messages, record.num_messages, record.stop_text,
                                              options);
  }
  if (!cont) {
    // The model ended its turn with another stop token than the one the template closes
    // turns with (a random or base model's <|endoftext|> where Qwen3's template writes
    // <|im_end|>; a request's own stop_token_ids): the turn is closed as the template closes
    // it, with the tokenizer's end-of-turn token in the stop token's place. Nothing cached is
    // lost: the stop token was sampled, never fed, so it has no KV.
    const std::optional<std::string>& eos = reader.tokenizer().special_token_strings().eos_token;
    const std::optional<int32_t> eos_id =
        eos ? reader.tokenizer().token_to_id(*eos) : std::optional<int32_t>();
    if (eos_id && *eos != record.stop_text) {
      cont = reader.chat()->render_continuation(messages, record.num_messages, *eos, options);
      if (cont) out.back() = *eos_id;
    }
  }
  if (!cont) return std::nullopt;
  // Too long alone means too long in all: the caller then reads (and refuses) the whole
  // rendering.
  auto more = reader.tokenizer().encode(
      cont->continuation, EncodeOptions{.add_special_tokens = false, .max_tokens = max_tokens});
  if (!more) return std::nullopt;
  out.insert(out.end(), more->begin(), more->end());
  return out;
}

json turn_record_json(const ConversationRecord& record) {
  return json{{"num_messages", record.num_messages}, {"tokens", record.tokens},
              {"stop_text", record.stop_text},       {"completion_text", record.completion_text},
              {"cache_salt", record.cache_salt},     {"digest", hex64(record.digest)}};
}

Result<ConversationRecord> read_turn_record(const json& field) {
  auto bad = [](const std::string& what) {
    return make_error(ErrorCode::kInvalidArgument, std::string(kTurnRecordField) + ": " + what);
  };
  if (!field.is_object()) return bad("must be an object");
  ConversationRecord r;
  auto n = field.find("num_messages");
  if (n == field.end() || !n->is_number_unsigned()) {
    return bad("'num_messages' must be an integer >= 0");
  }
  r.num_messages = n->get<size_t>();
  auto tokens = field.find("tokens");
  if (tokens == field.end() || !tokens->is_array()) return bad("'tokens' must be an array");
  r.tokens.reserve(tokens->size());
  for (const json& t : *tokens) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 ||
        t.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
      return bad("'tokens' must hold token ids");
    }
    r.tokens.push_back(static_cast<int32_t>(t.get<int64_t>()));
  }
  for (auto [key, out] : {std::pair<const char*, std::string*>{"stop_text", &r.stop_text},
                          {"completion_text", &r.completion_text},
                          {"cache_salt", &r.cache_salt}}) {
    auto it = field.find(key);
    if (it == field.end() || !it->is_string()) {
      return bad(std::string("'") + key + "' must be a string");
    }
    *out = it->get<std::string>();
  }
  auto digest = field.find("digest");
  if (digest == field.end() || !digest->is_string() ||
      digest->get_ref<const std::string&>().size() != 16) {
    return bad("'digest' must be 16 hex digits");
  }
  const std::string& d = digest->get_ref<const std::string&>();
  uint64_t v = 0;
  const auto [end, ec] = std::from_chars(d.data(), d.data() + d.size(), v, 16);
  if (ec != std::errc() || end != d.data() + d.size() || d.find_first_of("ABCDEF") != d.npos) {
    return bad("'digest' must be 16 hex digits");
  }
  r.digest = v;
  return r;
}

Status check_session_id(std::string_view id, std::string_view what) {
  if (id.empty() || id.size() > kMaxSessionIdBytes || !utf8::is_valid(id)) {
    std::string message = "'";  // appended, not `+`: g++ 12's -Wrestrict misfires on that
    message.append(what);
    message.append("' must be 1 to 256 bytes of valid UTF-8");
    static_assert(kMaxSessionIdBytes == 256, "the message says 256");
    return make_error(ErrorCode::kInvalidArgument, std::move(message));
  }
  return {};
}

}  // namespace strata
