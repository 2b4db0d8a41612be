#include "router/api_answers.h"

#include "common/log.h"
#include "request/error_shape.h"
#include "request/turn_record.h"

namespace strata::router {

using nlohmann::json;

namespace {

// What a worker's `usage` (in a body or a stream chunk) says about the prompt.
struct UsageReport {
  bool present = false;                       // the data carries a usage object
  std::optional<int64_t> cached_tokens;       // usage.prompt_tokens_details.cached_tokens
  std::optional<int64_t> kv_transfer_tokens;  // usage.kv_transfer.tokens (a remote prefill)
};

UsageReport reported_usage(std::string_view data) {
  UsageReport out;
  // Every usage object names prompt_tokens (Anthropic's: cache_read_input_tokens; the
  // Responses API's: input_tokens_details); most stream chunks carry none (cheap skip).
  const bool anthropic = data.find("\"cache_read_input_tokens\"") != std::string_view::npos;
  const bool responses = data.find("\"input_tokens_details\"") != std::string_view::npos;
  if (!anthropic && !responses && data.find("\"prompt_tokens\"") == std::string_view::npos) {
    return out;
  }
  json j = json::parse(data, nullptr, false);
  if (!j.is_object()) return out;
  // A Messages stream reports its usage whole in message_delta (top-level usage);
  // message_start's message.usage is not read, so nothing is counted twice. A Responses
  // stream reports it in response.completed's (or .incomplete's) response.usage, and an
  // unstreamed response at the top level.
  const json* usage = j.contains("usage") ? &j["usage"] : nullptr;
  if (responses && !usage && j.contains("response") && j["response"].is_object()) {
    usage = j["response"].contains("usage") ? &j["response"]["usage"] : nullptr;
  }
  if (usage == nullptr || !usage->is_object()) return out;
  const json& u = *usage;
  out.present = true;
  if (anthropic) {
    if (u.contains("cache_read_input_tokens") && u["cache_read_input_tokens"].is_number_integer()) {
      out.cached_tokens = u["cache_read_input_tokens"].get<int64_t>();
    }
    return out;
  }
  const char* details = responses ? "input_tokens_details" : "prompt_tokens_details";
  if (u.contains(details) && u[details].is_object()) {
    const json& d = u[details];
    if (d.contains("cached_tokens") && d["cached_tokens"].is_number_integer()) {
      out.cached_tokens = d["cached_tokens"].get<int64_t>();
    }
  }
  if (u.contains("kv_transfer") && u["kv_transfer"].is_object()) {
    const json& k = u["kv_transfer"];
    if (k.contains("tokens") && k["tokens"].is_number_integer()) {
      out.kv_transfer_tokens = k["tokens"].get<int64_t>();
    }
  }
  return out;
}

AnsweredRecord read_answered_record(const json& field) {
  AnsweredRecord out{.present = true};
  if (field.is_null()) return out;
  auto rec = read_turn_record(field);
  if (rec) {
    out.record = std::move(*rec);
  } else {
    STRATA_LOG_DEBUG("route: a worker's {}: {}", kTurnRecordField, rec.error().message);
  }
  return out;
}

}  // namespace

void count_usage(Router::Impl& r, const RouteChoice& c, std::string_view data) {
  const UsageReport u = reported_usage(data);
  if (!u.present) return;
  if (u.cached_tokens) {
    r.metrics.reported_cached_tokens.Increment(static_cast<double>(*u.cached_tokens));
  }
  if (u.kv_transfer_tokens) {
    r.metrics.pd_kv_transfer_tokens.Increment(static_cast<double>(*u.kv_transfer_tokens));
  } else if (c.prefill) {
    r.metrics.pd_remote_without_transfer.Increment();
  }
}

http::Response api_error(RoutedApi api, int status, const std::string& message,
                         const std::string& code) {
  if (api != RoutedApi::kAnthropicMessages) return router_error(status, message, code);
  return http::Response{.status = status,
                        .content_type = "application/json",
                        .body = dump_json(anthropic_error_json(status, message))};
}
http::Response api_error(RoutedApi api, const Error& e) {
  return api_error(api, http_status(e.code), e.message, std::string(error_code_name(e.code)));
}

std::string StreamFramer::event(const std::string& data) {
  if (api_ != RoutedApi::kAnthropicMessages && api_ != RoutedApi::kResponses) {
    return "data: " + data + "\n\n";
  }
  const json j = json::parse(data, nullptr, false);
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) {
    return "data: " + data + "\n\n";
  }
  const std::string& type = j["type"].get_ref<const std::string&>();
  if (api_ == RoutedApi::kResponses) {
    if (auto seq = j.find("sequence_number"); seq != j.end() && seq->is_number_integer()) {
      next_sequence_ = seq->get<int64_t>() + 1;
    }
    if (type == "response.created" && j.contains("response") && j["response"].is_object()) {
      const json& response = j["response"];
      if (response.contains("id") && response["id"].is_string()) {
        response_id_ = response["id"].get<std::string>();
      }
    }
  }
  return "event: " + type + "\ndata: " + data + "\n\n";
}

std::string StreamFramer::error(const std::string& message) const {
  if (api_ == RoutedApi::kAnthropicMessages) {
    return "event: error\ndata: " + dump_json(anthropic_error_json(502, message)) + "\n\n";
  }
  if (api_ == RoutedApi::kResponses) {
    const json e{{"type", "error"},
                 {"code", "upstream_error"},
                 {"message", message},
                 {"param", nullptr},
                 {"sequence_number", next_sequence_}};
    return "event: error\ndata: " + dump_json(e) + "\n\n";
  }
  return "data: " + dump_json(error_json(502, message, "upstream_error")) + "\n\n";
}

AnsweredRecord take_answered_record(std::string& body, bool keep) {
  const std::string field(kTurnRecordField);
  if (body.find("\"" + field + "\"") == std::string::npos) return {};
  json j = json::parse(body, nullptr, false);
  if (!j.is_object()) return {};
  auto it = j.find(field);
  if (it == j.end()) return {};
  AnsweredRecord out = read_answered_record(*it);
  if (auto id = j.find("id"); id != j.end() && id->is_string()) {
    out.response_id = id->get<std::string>();
  }
  if (!keep) {
    j.erase(it);
    body = dump_json(j);
  }
  return out;
}

std::optional<AnsweredRecord> answered_record_event(std::string_view data) {
  const std::string prefix = "{\"" + std::string(kTurnRecordField) + "\"";
  if (!data.starts_with(prefix)) return std::nullopt;
  const json j = json::parse(data, nullptr, false);
  if (!j.is_object() || !j.contains(std::string(kTurnRecordField))) return std::nullopt;
  return read_answered_record(j[std::string(kTurnRecordField)]);
}

void learn_turn(Router::Impl& r, const RouteChoice& c, RoutedApi api, const RoutedRequest& p,
                const std::string& response_id, AnsweredRecord answered) {
  if (!p.record_key.empty() && answered.present) {
    r.learned_turn(*c.worker, TurnKey::kSession, p.record_key, answered.record, {});
  }
  if (api == RoutedApi::kResponses && p.store && !response_id.empty() && answered.record) {
    r.learned_turn(*c.worker, TurnKey::kResponse, response_id, std::move(answered.record),
                   p.instructions);
  }
}

}  // namespace strata::router
