// Worker kinds and roles, and how each kind's load report reads (worker_kind.h).
#include "router/worker_kind.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>

#include "request/json_fields.h"

namespace strata::router {

namespace {

constexpr std::array<std::pair<std::string_view, WorkerKind>, 5> kKinds{{
    {"strata", WorkerKind::kStrata},
    {"vllm", WorkerKind::kVllm},
    {"sglang", WorkerKind::kSglang},
    {"llamacpp", WorkerKind::kLlamaCpp},
    {"openai", WorkerKind::kOpenAi},
}};

constexpr std::array<std::pair<std::string_view, WorkerRole>, 3> kRoles{{
    {"mixed", WorkerRole::kMixed},
    {"prefill", WorkerRole::kPrefill},
    {"decode", WorkerRole::kDecode},
}};

constexpr std::array<std::pair<std::string_view, PdTransport>, 2> kTransports{{
    {"ucx", PdTransport::kUcx},
    {"storage", PdTransport::kStorage},
}};

// The names of a table, "a, b or c".
template <typename Table>
std::string names_of(const Table& table) {
  std::string out;
  for (size_t i = 0; i < table.size(); ++i) {
    if (i > 0) out += i + 1 == table.size() ? " or " : ", ";
    out += table[i].first;
  }
  return out;
}

// A number as Prometheus writes one; nullopt when it does not parse or is not finite.
std::optional<double> finite_number(std::string_view v) {
  while (!v.empty() && (v.back() == '\r' || v.back() == ' ')) v.remove_suffix(1);
  double x = 0;
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  if (ec != std::errc() || end != v.data() + v.size() || !std::isfinite(x)) return std::nullopt;
  return x;
}

int64_t count_of(double x) {
  return static_cast<int64_t>(std::clamp(x, 0.0, 1e15));
}

}  // namespace

Result<WorkerKind> parse_worker_kind(std::string_view name) {
  for (const auto& [n, kind] : kKinds) {
    if (n == name) return kind;
  }
  return bad_argument("unknown worker kind '" + std::string(name) + "' (it must be " +
                      names_of(kKinds) + ")");
}

std::string_view worker_kind_name(WorkerKind kind) {
  for (const auto& [n, k] : kKinds) {
    if (k == kind) return n;
  }
  return "strata";
}

bool publishes_kv_events(WorkerKind kind) {
  return kind == WorkerKind::kStrata || kind == WorkerKind::kVllm || kind == WorkerKind::kSglang;
}

int default_block_size(WorkerKind kind) {
  return publishes_kv_events(kind) ? 0 : kApproximateBlockSize;
}

Result<WorkerRole> parse_worker_role(std::string_view name) {
  for (const auto& [n, role] : kRoles) {
    if (n == name) return role;
  }
  return bad_argument("unknown worker role '" + std::string(name) + "' (it must be " +
                      names_of(kRoles) + ")");
}

std::string_view worker_role_name(WorkerRole role) {
  for (const auto& [n, r] : kRoles) {
    if (r == role) return n;
  }
  return "mixed";
}

Result<PdTransport> parse_pd_transport(std::string_view name) {
  for (const auto& [n, transport] : kTransports) {
    if (n == name) return transport;
  }
  return bad_argument("unknown PD transport '" + std::string(name) + "' (it must be " +
                      names_of(kTransports) + ")");
}

std::string_view pd_transport_name(PdTransport transport) {
  for (const auto& [n, t] : kTransports) {
    if (t == transport) return n;
  }
  return "none";
}

Result<StrataLoad> read_strata_load(std::string_view body) {
  const nlohmann::json j = nlohmann::json::parse(body, nullptr, false);
  if (!j.is_object()) return bad_argument("GET /load: not a JSON object");
  // Each field: absent or null reads 0; any other type, or a negative count, is an error
  // that names it (json_fields.h).
  const auto count = [](const nlohmann::json& obj, const char* key, int64_t& out) -> Status {
    auto v = get_int(obj, key, 0, INT64_MAX);
    if (!v) return std::unexpected(std::move(v).error());
    out = v->value_or(0);
    return {};
  };
  StrataLoad load;
  auto id = get_string(j, "instance_id");
  if (!id) return std::unexpected(std::move(id).error());
  load.instance_id = id->value_or("");
  auto fraction = get_number(j, "load_fraction", 0.0, std::numeric_limits<double>::max());
  if (!fraction) return std::unexpected(std::move(fraction).error());
  load.load_fraction = fraction->value_or(0.0);
  for (const auto& [key, out] :
       {std::pair{"running", &load.running}, std::pair{"waiting", &load.waiting},
        std::pair{"queued_prefill_tokens", &load.queued_prefill_tokens},
        std::pair{"max_running_requests", &load.max_running_requests},
        std::pair{"recommended_pause_ms", &load.recommended_pause_ms}}) {
    if (Status st = count(j, key, *out); !st) return std::unexpected(std::move(st).error());
  }
  auto next_seq = get_int(j, "kv_events_next_seq", 0, INT64_MAX);
  if (!next_seq) return std::unexpected(std::move(next_seq).error());
  load.kv_events_next_seq = *next_seq;
  if (auto d = j.find("device"); d != j.end() && !d->is_null()) {
    if (!d->is_object()) return bad_argument("'device' must be an object");
    load.has_device = true;
    for (const auto& [key, out] : {std::pair{"free_pages", &load.free_pages},
                                   std::pair{"evictable_pages", &load.evictable_pages},
                                   std::pair{"total_pages", &load.total_pages}}) {
      if (Status st = count(*d, key, *out); !st) return std::unexpected(std::move(st).error());
    }
  }
  return load;
}

std::string_view load_source_name(LoadSource source) {
  switch (source) {
    case LoadSource::kRouter:
      return "router";
    case LoadSource::kStrataLoad:
      return "load";
    case LoadSource::kMetrics:
      return "metrics";
    case LoadSource::kSlots:
      return "slots";
    case LoadSource::kSlotsAndMetrics:
      return "slots+metrics";
  }
  return "router";
}

std::optional<double> prometheus_value(std::string_view text, std::string_view name) {
  std::optional<double> sum;
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    const std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    if (line.empty() || line[0] == '#' || !line.starts_with(name)) continue;
    // `name{labels} value [timestamp]` or `name value [timestamp]`; a label value may hold
    // spaces, so the value follows the last '}'.
    std::string_view rest = line.substr(name.size());
    if (!rest.empty() && rest[0] == '{') {
      const size_t close = rest.rfind('}');
      if (close == std::string_view::npos) continue;
      rest = rest.substr(close + 1);
    }
    // Not followed by a space: another metric whose name starts with this one.
    if (rest.empty() || rest[0] != ' ') continue;
    while (!rest.empty() && rest[0] == ' ') rest.remove_prefix(1);
    if (auto v = finite_number(rest.substr(0, rest.find(' ')))) sum = sum.value_or(0) + *v;
  }
  return sum;
}

std::optional<LoadReport> read_engine_metrics(WorkerKind kind, std::string_view text) {
  const bool vllm = kind == WorkerKind::kVllm;
  if (!vllm && kind != WorkerKind::kSglang) return std::nullopt;
  const auto running =
      prometheus_value(text, vllm ? "vllm:num_requests_running" : "sglang:num_running_reqs");
  const auto waiting =
      prometheus_value(text, vllm ? "vllm:num_requests_waiting" : "sglang:num_queue_reqs");
  auto usage = prometheus_value(text, vllm ? "vllm:kv_cache_usage_perc" : "sglang:token_usage");
  if (!usage && vllm) usage = prometheus_value(text, "vllm:gpu_cache_usage_perc");
  if (!running && !waiting && !usage) return std::nullopt;
  LoadReport r;
  r.source = LoadSource::kMetrics;
  r.running = count_of(running.value_or(0));
  r.waiting = count_of(waiting.value_or(0));
  const double u = std::max(usage.value_or(0), 0.0);
  r.load_fraction = u + (r.waiting > 0 && u >= 0.9 ? 1.0 : 0.0);
  return r;
}

Result<LlamaCppSlots> read_llamacpp_slots(std::string_view body) {
  const nlohmann::json j = nlohmann::json::parse(body, nullptr, false);
  if (!j.is_array() || j.empty()) {
    return bad_argument("GET /slots: not a JSON array of slots (llama.cpp's answer)");
  }
  LlamaCppSlots s;
  for (const nlohmann::json& slot : j) {
    if (!slot.is_object()) return bad_argument("GET /slots: a slot that is not an object");
    bool busy = false;
    if (auto p = slot.find("is_processing"); p != slot.end() && p->is_boolean()) {
      busy = p->get<bool>();
    } else if (auto st = slot.find("state"); st != slot.end() && st->is_number_integer()) {
      busy = st->get<int64_t>() != 0;
    } else {
      return bad_argument("GET /slots: a slot without 'is_processing' (or 'state')");
    }
    ++s.total;
    s.busy += busy ? 1 : 0;
    if (auto n = slot.find("n_ctx"); n != slot.end() && n->is_number_integer()) {
      s.n_ctx = std::max(s.n_ctx, std::max<int64_t>(0, n->get<int64_t>()));
    }
  }
  return s;
}

std::optional<LoadReport> read_llamacpp_load(const LlamaCppSlots* slots,
                                             const std::string_view* metrics) {
  std::optional<double> processing, deferred, prompt_tokens;
  if (metrics != nullptr) {
    processing = prometheus_value(*metrics, "llamacpp:requests_processing");
    deferred = prometheus_value(*metrics, "llamacpp:requests_deferred");
    prompt_tokens = prometheus_value(*metrics, "llamacpp:prompt_tokens_total");
  }
  const bool named = processing || deferred || prompt_tokens;
  if (slots == nullptr && !named) return std::nullopt;
  LoadReport r;
  r.source = slots == nullptr ? LoadSource::kMetrics
             : named          ? LoadSource::kSlotsAndMetrics
                              : LoadSource::kSlots;
  r.running = slots != nullptr ? slots->busy : count_of(processing.value_or(0));
  r.waiting = count_of(deferred.value_or(0));
  if (prompt_tokens) r.prompt_tokens_total = count_of(*prompt_tokens);
  if (slots != nullptr) {
    r.max_running = slots->total;
    r.context_tokens = slots->n_ctx;
    r.load_fraction =
        static_cast<double>(r.running + r.waiting) / static_cast<double>(slots->total);
  } else {
    r.load_fraction = r.waiting > 0 ? 1.0 : 0.0;
  }
  return r;
}

}  // namespace strata::router
