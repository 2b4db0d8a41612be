#include "bench/target.h"

#include <chrono>
#include <sstream>
#include <thread>

#include "text/tokenizer/tokenizer.h"

namespace strata::bench {

namespace {

int64_t int_at(const nlohmann::json& j, const char* key) {
  if (!j.is_object() || !j.contains(key) || !j[key].is_number()) return 0;
  return j[key].get<int64_t>();
}

}  // namespace

Status validate(const TargetOptions& o) {
  if (o.spawn == !o.url.empty()) {
    return make_error(ErrorCode::kInvalidArgument,
                      "give exactly one of --url URL (a running server) and --spawn");
  }
  if (o.spawn && o.model_dir.empty()) {
    return make_error(ErrorCode::kInvalidArgument, "--spawn needs --model DIR");
  }
  if (!o.url.empty() && o.url.rfind("http://", 0) != 0) {
    return make_error(ErrorCode::kInvalidArgument,
                      "--url must start with http:// (got '" + o.url + "')");
  }
  if (!o.model_dir.empty() && !std::filesystem::exists(o.model_dir + "/tokenizer.json")) {
    return make_error(ErrorCode::kInvalidArgument,
                      "--model " + o.model_dir + " has no tokenizer.json");
  }
  if (!o.server_args.empty() && !o.spawn) {
    return make_error(ErrorCode::kInvalidArgument, "--server-arg only applies with --spawn");
  }
  return {};
}

std::vector<std::string> split_args(const std::vector<std::string>& args) {
  std::vector<std::string> out;
  for (const std::string& a : args) {
    std::istringstream in(a);
    std::string word;
    while (in >> word) out.push_back(word);
  }
  return out;
}

Result<ServerHandle> open_server(const TargetOptions& o, const std::vector<std::string>& extra_args,
                                 const std::filesystem::path& log_path, bool kv_events) {
  ServerHandle h;
  h.api_key = o.api_key;
  if (!o.spawn) {
    h.url = o.url;
    while (!h.url.empty() && h.url.back() == '/') h.url.pop_back();
    h.kv_events_endpoint = o.kv_events_endpoint;
    if (auto st = h.client().wait_healthy(10, {}); !st) return std::unexpected(st.error());
    return h;
  }
  SpawnOptions so;
  so.strata_bin = o.strata_bin.empty() ? self_executable() : o.strata_bin;
  so.model_dir = o.model_dir;
  so.extra_args = split_args(o.server_args);
  so.extra_args.insert(so.extra_args.end(), extra_args.begin(), extra_args.end());
  so.log_path = log_path;
  so.kv_events = kv_events;
  so.start_timeout_s = o.start_timeout_s;
  auto p = ServerProcess::start(so);
  if (!p) return std::unexpected(p.error());
  h.url = (*p)->url();
  h.kv_events_endpoint = (*p)->kv_events_endpoint();
  h.log_path = log_path;
  h.process = std::move(*p);
  return h;
}

Result<TokenCounter> make_token_counter(const TargetOptions& o) {
  if (!o.model_dir.empty()) {
    auto tok = Tokenizer::load(o.model_dir);
    if (!tok) {
      return make_error(tok.error().code, "tokenizer of --model: " + tok.error().message);
    }
    std::shared_ptr<const Tokenizer> shared(std::move(*tok));
    return TokenCounter([shared](std::string_view text) -> Result<int64_t> {
      auto ids = shared->encode(text, EncodeOptions{.add_special_tokens = false});
      if (!ids) return std::unexpected(ids.error());
      return static_cast<int64_t>(ids->size());
    });
  }
  ServerClient client(o.url, o.api_key);
  return TokenCounter([client](std::string_view text) -> Result<int64_t> {
    auto r = client.post_json("/tokenize",
                              nlohmann::json{{"prompt", text}, {"add_special_tokens", false}});
    if (!r) return std::unexpected(r.error());
    if (!r->contains("count")) {
      return make_error(ErrorCode::kCorrupt, "POST /tokenize answered without 'count'");
    }
    return (*r)["count"].get<int64_t>();
  });
}

bool serve_supports(const std::string& strata_bin, const std::string& option) {
  const std::string bin = strata_bin.empty() ? self_executable() : strata_bin;
  const std::string help = command_output("'" + bin + "' serve --help 2>/dev/null");
  return help.find(option) != std::string::npos;
}

Result<CacheState> read_cache_state(const ServerClient& client) {
  auto j = client.get_json("/cache/state");
  if (!j) return std::unexpected(j.error());
  CacheState s;
  s.raw = *j;
  s.page_size = int_at(*j, "page_size");
  if (j->contains("device")) {
    const auto& d = (*j)["device"];
    s.capacity_tokens = int_at(d, "capacity_tokens");
    s.capacity_pages = int_at(d, "capacity_pages");
    s.cached_pages = int_at(d, "cached_pages");
    s.pinned_blocks = int_at(d, "pinned_blocks");
  }
  if (j->contains("host") && (*j)["host"].is_object()) {
    s.has_host = true;
    s.host_capacity_tokens = int_at((*j)["host"], "capacity_tokens");
  }
  if (j->contains("evictions")) {
    s.evicted_pages_total = int_at((*j)["evictions"], "evicted_pages_total");
    s.auto_unpinned_blocks_total = int_at((*j)["evictions"], "auto_unpinned_blocks_total");
  }
  if (j->contains("requests")) {
    s.running = int_at((*j)["requests"], "running");
    s.waiting = int_at((*j)["requests"], "waiting");
  }
  if (s.capacity_tokens <= 0 || s.page_size <= 0) {
    return make_error(
        ErrorCode::kCorrupt,
        "GET /cache/state lacks page_size or device.capacity_tokens: " + j->dump().substr(0, 300));
  }
  if (s.capacity_pages <= 0) s.capacity_pages = s.capacity_tokens / s.page_size;
  return s;
}

Result<bool> wait_idle(const ServerClient& client, double timeout_s) {
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    auto s = read_cache_state(client);
    if (!s) return std::unexpected(s.error());
    if (s->running == 0 && s->waiting == 0) return true;
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() >
        timeout_s) {
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

Result<std::string> served_model_id(const ServerClient& client) {
  auto j = client.get_json("/v1/models");
  if (!j) return std::unexpected(j.error());
  if (!j->contains("data") || !(*j)["data"].is_array() || (*j)["data"].empty() ||
      !(*j)["data"][0].contains("id")) {
    return make_error(ErrorCode::kCorrupt, "GET /v1/models has no data[0].id");
  }
  return (*j)["data"][0]["id"].get<std::string>();
}

}  // namespace strata::bench
