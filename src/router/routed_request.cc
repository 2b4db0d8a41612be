#include "router/routed_request.h"

#include "request/anthropic_request.h"
#include "request/chat_request.h"
#include "request/json_fields.h"
#include "request/responses_request.h"
#include "request/turn_record.h"
#include "text/tokenizer/utf8.h"

namespace strata::router {

using ojson = nlohmann::ordered_json;

namespace {

// A prompt's ids within the limit: nullopt when it is known to be longer.
Result<std::optional<std::vector<int32_t>>> within_limit(Result<std::vector<int32_t>> ids) {
  if (ids) return std::optional<std::vector<int32_t>>(std::move(*ids));
  if (ids.error().code == ErrorCode::kResourceExhausted) {
    return std::optional<std::vector<int32_t>>();
  }
  return std::unexpected(ids.error());
}

// What stands for a referenced item while the router reads a Responses body: an assistant
// message for a message item, a function call for a call; nullopt (refused as the worker
// refuses it: not found) for an id that names no item of a Strata response.
std::optional<ojson> placeholder_item(const std::string& item_id) {
  if (!response_of_item(item_id)) return std::nullopt;
  if (item_id.starts_with("fc_")) {
    return ojson{{"type", "function_call"},
                 {"call_id", item_id},
                 {"name", "referenced"},
                 {"arguments", "{}"}};
  }
  return ojson{{"type", "message"}, {"role", "assistant"}, {"content", ""}};
}

// The x-session-id header's value, checked as a worker checks it.
Result<std::string> header_session_id(std::string_view header_session) {
  if (Status st = check_session_id(header_session, "x-session-id"); !st) {
    return std::unexpected(st.error());
  }
  return std::string(header_session);
}

// The request's cache_salt ("" when none, or not a string: the worker refuses that).
std::string cache_salt_of(const ojson& body) {
  auto salt = body.find("cache_salt");
  return salt != body.end() && salt->is_string() ? salt->get<std::string>() : std::string();
}

// The prompt of a chat request as tokens (none without a chat template, or when longer
// than the limit: too_long). read_chat_request normalizes the messages in place. With a
// session (r.session) and its conversation's record (`turn_lookup`), also the prompt its
// worker computes by continuing it.
Status read_chat_tokens(const PromptReader& reader, ojson& chat_body, size_t max_prompt_tokens,
                        const TurnLookup& turn_lookup, RoutedRequest& r) {
  const std::string salt = cache_salt_of(chat_body);
  auto read = read_chat_request(chat_body, GenerationPrompt::kAlways);
  if (!read) return std::unexpected(read.error());
  if (reader.chat() == nullptr) return {};
  std::shared_ptr<const TurnEntry> entry;
  if (!r.session.empty()) {
    r.record_key = record_key(
        r.session, conversation_root(read->messages, read->tools ? &*read->tools : nullptr,
                                     read->template_kwargs));
    if (turn_lookup) entry = turn_lookup(TurnKey::kSession, r.record_key);
  }
  const TurnEntry* record = entry.get();
  auto ids = within_limit(reader.chat_tokens(*read, max_prompt_tokens));
  if (!ids) return std::unexpected(ids.error());
  r.too_long = !*ids;
  if (*ids) r.tokens = std::move(**ids);
  if (record != nullptr) {
    auto continued = continue_turn(reader, read->messages, read->tools ? &*read->tools : nullptr,
                                   read->template_kwargs, salt, record->record, max_prompt_tokens);
    if (continued) {
      r.exact_worker = record->worker;
      r.exact_tokens = std::move(*continued);
    }
  }
  return {};
}

}  // namespace

Result<RoutedRequest> read_routed_request(const PromptReader& reader, const std::string& body,
                                          std::string_view header_session, RoutedApi api,
                                          size_t max_prompt_tokens, const TurnLookup& turn_lookup,
                                          const AnthropicReadOptions& anthropic) {
  auto parsed = parse_json_object_as<ojson>(body);
  if (!parsed) return std::unexpected(parsed.error());
  ojson& j = *parsed;
  RoutedRequest r;
  if (api == RoutedApi::kResponses) {
    auto refs = item_references(j);
    if (!refs) return std::unexpected(refs.error());
    // The rest of the body is read with each reference standing for an output item of its
    // kind (its worker puts the stored item there), so that the router refuses what the
    // worker will; the placeholders' text is never rendered.
    r.item_references = std::move(*refs);
    if (auto st = resolve_item_references(j, placeholder_item); !st) {
      return std::unexpected(st.error());
    }
    auto read = read_responses_request(j);
    if (!read) return std::unexpected(read.error());
    r.stream = read->stream;
    r.store = read->store;
    if (!read->prompt_cache_key.empty()) {
      r.session = read->prompt_cache_key;
    } else if (!header_session.empty()) {
      auto session = header_session_id(header_session);
      if (!session) return std::unexpected(session.error());
      r.session = std::move(*session);
    }
    const ojson& c = read->chat_body;
    auto salt = c.find("cache_salt");
    r.pd_local_only =
        salt != c.end() && salt->is_string() && !salt->get_ref<const std::string&>().empty();
    if (r.store) r.instructions = read->instructions;
    if (read->previous_response_id || !r.item_references.empty()) {
      r.previous_response_id = std::move(read->previous_response_id);
      // The worker continues the previous response's recorded tokens when this request has
      // its instructions (they are not carried over) and its cache_salt
      // (responses_routes.cc: prepare_response).
      std::shared_ptr<const TurnEntry> record;
      if (r.previous_response_id && turn_lookup) {
        record = turn_lookup(TurnKey::kResponse, *r.previous_response_id);
      }
      if (record && record->instructions == read->instructions &&
          record->record.cache_salt == cache_salt_of(c)) {
        r.exact_worker = record->worker;
        r.exact_tokens = record->record.tokens;
      }
      return r;
    }
    // The worker's reading without a previous response (responses_routes.cc:
    // prepare_response): instructions, then the input, as a chat request.
    ojson chat = responses_chat_body(*read, ojson::array());
    if (auto st = read_chat_tokens(reader, chat, max_prompt_tokens, turn_lookup, r); !st) {
      return std::unexpected(st.error());
    }
    return r;
  }
  if (api == RoutedApi::kAnthropicMessages) {
    auto read = read_anthropic_request(j, AnthropicEndpoint::kMessages, anthropic);
    if (!read) return std::unexpected(read.error());
    r.stream = read->stream;
    // The worker's key for the request's engine session (the header goes upstream with it).
    auto session = anthropic_session(*read, header_session);
    if (!session) return std::unexpected(session.error());
    r.session = std::move(*session);
    ojson& c = read->chat_body;
    auto salt = c.find("cache_salt");
    r.pd_local_only =
        salt != c.end() && salt->is_string() && !salt->get_ref<const std::string&>().empty();
    if (auto st = read_chat_tokens(reader, c, max_prompt_tokens, turn_lookup, r); !st) {
      return std::unexpected(st.error());
    }
    return r;
  }
  auto stream = get_bool(j, "stream");
  if (!stream) return std::unexpected(stream.error());
  r.stream = stream->value_or(false);
  auto session = get_string(j, "session_id");
  if (!session) return std::unexpected(session.error());
  if (*session) {
    if (Status st = check_session_id(**session, "session_id"); !st) {
      return std::unexpected(st.error());
    }
    r.session = **session;
  } else if (!header_session.empty()) {
    auto hs = header_session_id(header_session);
    if (!hs) return std::unexpected(hs.error());
    r.session = std::move(*hs);
    j["session_id"] = r.session;  // the worker keys its records on it too
    r.rewritten_body = j.dump();
  }
  auto set = [&](const char* key) {
    auto it = j.find(key);
    return it != j.end() && !it->is_null() && *it != false && *it != 0 && *it != "";
  };
  r.pd_local_only = set("cache_salt") || set("logprobs") || set("top_logprobs");
  if (api == RoutedApi::kChatCompletions) {
    if (auto st = read_chat_tokens(reader, j, max_prompt_tokens, turn_lookup, r); !st) {
      return std::unexpected(st.error());
    }
    return r;
  }
  auto prompt = parse_completion_prompt(j);
  if (!prompt) return std::unexpected(prompt.error());
  if (prompt->text) {
    auto ids = within_limit(
        reader.text_tokens(*prompt->text, /*add_special_tokens=*/true, max_prompt_tokens));
    if (!ids) return std::unexpected(ids.error());
    r.too_long = !*ids;
    if (*ids) r.tokens = std::move(**ids);
  } else if (max_prompt_tokens > 0 && prompt->token_ids.size() > max_prompt_tokens) {
    r.too_long = true;
  } else {
    r.tokens = std::move(prompt->token_ids);
  }
  return r;
}

}  // namespace strata::router
