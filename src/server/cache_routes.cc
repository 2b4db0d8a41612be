// The cache-control API, behind the admin key when one is set: pin and unpin blocks (by
// block hash or by content), evict blocks, flush, and the cache's state; and the seed's
// paths (/hicache/pin_blocks, /hicache/unpin_blocks, /flush_cache). Each runs on the HTTP
// worker pool and reaches the tree only through Engine::call on the scheduler thread.
#include "engine/pin_policy.h"
#include "server/request_parsing.h"
#include "server/routes.h"

namespace strata {
namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

Result<std::vector<BlockHash>> hashes_from_body(const RouteContext& ctx, const json& body,
                                                const std::string& raw_body) {
  auto salt = get_string(body, "cache_salt");
  if (!salt) return std::unexpected(salt.error());
  const int32_t ps = ctx.engine.options().page_size;
  const int forms = static_cast<int>(body.contains("block_hashes")) +
                    static_cast<int>(body.contains("token_ids")) +
                    static_cast<int>(body.contains("messages"));
  if (forms != 1) {
    return make_error(ErrorCode::kInvalidArgument,
                      "give exactly one of 'block_hashes', 'token_ids' or 'messages'");
  }
  if (body.contains("block_hashes")) return parse_block_hashes(body["block_hashes"]);
  if (body.contains("token_ids")) {
    auto ids = parse_token_ids(body["token_ids"], "token_ids");
    if (!ids) return std::unexpected(ids.error());
    return hash_blocks(*ids, ps, salt->value_or(""));
  }
  if (auto v = validate_messages(body["messages"]); !v) return std::unexpected(v.error());
  const ojson full = ojson::parse(raw_body);
  const ojson* tools =
      full.contains("tools") && full["tools"].is_array() ? &full["tools"] : nullptr;
  auto add_gen = get_bool(body, "add_generation_prompt");
  if (!add_gen) return std::unexpected(add_gen.error());
  auto ids = ctx.chat_tokens(full["messages"], tools, add_gen->value_or(false),
                             full.value("chat_template_kwargs", ojson::object()));
  if (!ids) return std::unexpected(ids.error());
  return hash_blocks(*ids, ps, salt->value_or(""));
}

http::Response pin_blocks(RouteContext& ctx, const http::Request& req, bool pin, bool legacy) {
  auto body = parse_json_object(req.body);
  if (!body) return error_response(body.error());
  if (legacy && !body->contains("block_hashes")) {
    return error_response(400, "'block_hashes' is required", "invalid_argument");
  }
  auto hashes = hashes_from_body(ctx, *body, req.body);
  if (!hashes) return error_response(hashes.error());
  if (!pin) {
    const UnpinResult r =
        ctx.engine.call([h = *hashes](EngineState& s) { return s.tree.unpin(h); }).get();
    return json_response(200, json{{"unpinned_count", r.unpinned},
                                   {"unknown_count", r.unknown},
                                   {"not_pinned_count", r.not_pinned}});
  }
  auto ttl = get_int(*body, "ttl_s", 0, 365LL * 24 * 3600);
  if (!ttl) return error_response(ttl.error());
  auto priority = get_int(*body, "priority", kMinPinPriority, kMaxPinPriority);
  if (!priority) return error_response(priority.error());
  const PinOptions opts{.ttl_ms = ttl->value_or(0) * 1000,
                        .priority = static_cast<int32_t>(priority->value_or(0))};
  // The cache-control API is behind the admin key: an admin's pin.
  auto result = ctx.engine
                    .call([h = *hashes, opts](EngineState& s) {
                      return apply_pin(s, h, opts, PinAuthority::kAdmin);
                    })
                    .get();
  if (!result && result.error().code != ErrorCode::kResourceExhausted) {
    return error_response(result.error());
  }
  if (!result) return error_response(400, result.error().message, "pin_budget_exceeded");
  return json_response(200,
                       json{{"pinned_count", result->pinned}, {"unknown_count", result->unknown}});
}

http::Response evict(RouteContext& ctx, const http::Request& req) {
  auto body = parse_json_object(req.body);
  if (!body) return error_response(body.error());
  if (!body->contains("block_hashes"))
    return error_response(400, "'block_hashes' is required", "invalid_argument");
  auto hashes = parse_block_hashes((*body)["block_hashes"]);
  if (!hashes) return error_response(hashes.error());
  auto desc = get_bool(*body, "descendants");
  if (!desc) return error_response(desc.error());
  const EvictBlocksResult r = ctx.engine
                                  .call([h = *hashes, d = desc->value_or(false)](EngineState& s) {
                                    return s.tree.evict_blocks(h, d);
                                  })
                                  .get();
  return json_response(200, json{{"evicted_blocks", r.evicted_blocks},
                                 {"skipped_locked", r.skipped_locked},
                                 {"skipped_pinned", r.skipped_pinned},
                                 {"skipped_has_children", r.skipped_has_children},
                                 {"unknown", r.unknown}});
}

http::Response flush(RouteContext& ctx, const http::Request& req) {
  if (!req.body.empty()) {
    auto body = parse_json_object(req.body);
    if (!body) return error_response(body.error());
  }
  const FlushResult r = ctx.engine.call([](EngineState& s) { return s.tree.flush(); }).get();
  return json_response(
      200, json{{"evicted",
                 {{"device", r.evicted_pages}, {"host", r.evicted_host_pages}, {"storage", 0}}},
                {"pinned_preserved", r.pinned_preserved},
                {"locked_skipped", r.locked_skipped}});
}

http::Response state(RouteContext& ctx, const http::Request& req) {
  const std::string detail = req.query_param("detail");
  if (!detail.empty() && detail != "tree") {
    return error_response(400, "'detail' must be 'tree'", "invalid_argument");
  }
  const bool tree = detail == "tree";
  json out =
      ctx.engine
          .call([tree](EngineState& s) {
            const TreeStats t = s.tree.stats();
            json j;
            j["page_size"] = t.page_size;
            j["device"] = {
                {"capacity_pages", s.device_pages.num_pages()},
                {"capacity_tokens", static_cast<int64_t>(s.device_pages.num_pages()) * t.page_size},
                {"free_pages", s.device_pages.num_free()},
                {"used_pages", s.device_pages.num_allocated()},
                {"cached_pages", t.cached_pages},
                {"request_pages", s.request_private_pages},
                {"pinned_blocks", t.pinned_blocks},
                {"soft_pinned_blocks", t.soft_pinned_blocks},
                {"protected_pages", t.protected_pages},
                {"evictable_pages", t.cached_pages - t.protected_pages},
                {"locked_nodes", t.locked_nodes}};
            j["host"] = nullptr;
            j["storage"] = nullptr;
            if (s.host_pages != nullptr) {
              j["host"] = {
                  {"capacity_pages", s.host_pages->num_pages()},
                  {"capacity_tokens",
                   static_cast<int64_t>(s.host_pages->num_pages()) * t.page_size},
                  {"free_pages", s.host_pages->num_free()},
                  {"used_pages", s.host_pages->num_allocated()},
                  {"cached_pages", t.host_cached_pages},
                  {"host_only_pages", t.host_only_pages},
                  {"protected_pages", t.host_protected_pages},
                  {"evictable_pages", t.host_evictable_pages},
                  {"write_policy", std::string(write_policy_name(s.options.hicache.write_policy))},
                  {"mem_layout", std::string(host_layout_name(s.options.hicache.layout))},
                  {"transfers_in_flight", t.io_pending_nodes}};
            }
            if (s.storage != nullptr) {
              const StorageStats st = s.storage->stats();
              j["storage"] = {{"backend", std::string(s.storage->name())},
                              {"stored_pages_known", t.stored_pages},
                              {"pages_written_total", s.counters.storage_pages_written},
                              {"prefetches_total", s.counters.prefetches_started},
                              {"prefetch_pages_read_total", s.counters.prefetch_pages_read},
                              {"prefetch_timeouts_total", s.counters.prefetch_timeouts},
                              {"faults_total", s.counters.storage_faults},
                              {"get_hits", st.get_hits},
                              {"get_misses", st.get_misses},
                              {"get_errors", st.get_errors},
                              {"corrupt_values", st.corrupt_values},
                              {"set_written", st.set_written},
                              {"set_skipped_existing", st.set_skipped_existing},
                              {"set_errors", st.set_errors},
                              {"bytes_read", st.bytes_read},
                              {"bytes_written", st.bytes_written}};
            }
            j["nodes_count"] = t.num_nodes;
            j["hits"] = {{"match_calls", t.match_calls},
                         {"matched_tokens_total",
                          t.matched_pages_total * static_cast<uint64_t>(t.page_size)},
                         {"cached_prompt_tokens_total", s.counters.cached_prompt_tokens},
                         {"cached_host_tokens_total", s.counters.cached_host_tokens},
                         {"cached_storage_tokens_total", s.counters.cached_storage_tokens},
                         {"prompt_tokens_total", s.counters.prompt_tokens}};
            j["evictions"] = {{"evicted_pages_total", t.evicted_pages_total},
                              {"demoted_pages_total", t.demoted_pages_total},
                              {"host_evicted_pages_total", t.host_evicted_pages_total},
                              {"backed_up_pages_total", t.backed_up_pages_total},
                              {"loaded_pages_total", t.loaded_pages_total},
                              {"backups_skipped_total", t.backups_skipped_total},
                              {"loads_failed_total", s.counters.loads_failed},
                              {"auto_unpinned_blocks_total", s.counters.auto_unpinned_blocks},
                              {"expired_pins_total", t.expired_pins_total}};
            j["requests"] = {{"running", s.counters.running}, {"waiting", s.counters.waiting}};
            if (tree) {
              json nodes = json::array();
              for (const NodeSnapshot& n : s.tree.snapshot()) {
                json hs = json::array();
                for (BlockHash h : n.block_hashes) hs.push_back(block_hash_to_wire(h));
                json tiers = json::array();
                if (n.on_device) tiers.push_back("device");
                if (n.on_host) tiers.push_back("host");
                if (n.in_storage) tiers.push_back("storage");
                nodes.push_back(json{{"id", n.id},
                                     {"parent", n.parent_id},
                                     {"tokens", n.num_tokens},
                                     {"block_hashes", hs},
                                     {"tiers", tiers},
                                     {"lock_ref", n.lock_ref},
                                     {"pin_counts", n.pin_counts},
                                     {"pin_ref", n.pin_ref},
                                     {"last_access_ms", n.last_access_ms},
                                     {"hit_count", n.hit_count},
                                     {"loading", n.loading},
                                     {"session_protected", n.host_ref > 0},
                                     {"evictable", n.evictable}});
              }
              j["nodes"] = std::move(nodes);
            }
            return j;
          })
          .get();
  return json_response(200, out);
}

}  // namespace

void add_cache_routes(http::Server& server, RouteContext& ctx) {
  auto add = [&](const char* method, const char* path,
                 std::function<http::Response(const http::Request&)> fn) {
    server.route(method, path, admin_only(ctx, blocking(std::move(fn))));
  };
  add("POST", "/cache/pin",
      [&ctx](const http::Request& r) { return pin_blocks(ctx, r, true, false); });
  add("POST", "/cache/unpin",
      [&ctx](const http::Request& r) { return pin_blocks(ctx, r, false, false); });
  add("POST", "/hicache/pin_blocks",
      [&ctx](const http::Request& r) { return pin_blocks(ctx, r, true, true); });
  add("POST", "/hicache/unpin_blocks",
      [&ctx](const http::Request& r) { return pin_blocks(ctx, r, false, true); });
  add("POST", "/cache/evict", [&ctx](const http::Request& r) { return evict(ctx, r); });
  add("POST", "/cache/flush", [&ctx](const http::Request& r) { return flush(ctx, r); });
  add("POST", "/flush_cache", [&ctx](const http::Request& r) { return flush(ctx, r); });
  add("GET", "/cache/state", [&ctx](const http::Request& r) { return state(ctx, r); });
}

}  // namespace strata
