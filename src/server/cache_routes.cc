// The cache-control API, behind the admin key when one is set: pin and unpin blocks (by
// block hash or by content), evict blocks, flush, the cache's state and one node's content;
// and the seed's paths (/hicache/pin_blocks, /hicache/unpin_blocks, /flush_cache). Each
// runs on the HTTP worker pool, translates JSON into a cache-control command
// (engine/cache_control.h) and its answer back; errors map to statuses in one table
// (responses.cc, http_status).
#include <algorithm>
#include <charconv>

#include "server/cache_figures.h"
#include "server/request_parsing.h"
#include "server/routes.h"

namespace strata {
namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

// Per page, its soft pins' longest TTL in seconds (0: none), as /cache/state?detail=tree and
// /cache/node say it.
json ttls_s(const std::vector<int64_t>& ttl_ms) {
  json out = json::array();
  for (int64_t ms : ttl_ms) out.push_back(ms % 1000 == 0 ? json(ms / 1000) : json(ms / 1000.0));
  return out;
}

// The blocks a /cache/{pin,unpin} body names, read as the router reads them
// (request/prompt_reader.h: read_cache_target).
Result<std::vector<BlockHash>> hashes_from_body(const RouteContext& ctx,
                                                const std::string& raw_body) {
  auto target = read_cache_target(ojson::parse(raw_body), ctx.reader());
  if (!target) return std::unexpected(target.error());
  return target->hashes(ctx.engine.options().page_size);
}

http::Response pin_blocks(RouteContext& ctx, const http::Request& req, bool pin, bool legacy) {
  auto body = parse_json_object(req.body);
  if (!body) return error_response(body.error());
  if (legacy && !body->contains("block_hashes")) {
    return error_response(400, "'block_hashes' is required", "invalid_argument");
  }
  auto hashes = hashes_from_body(ctx, req.body);
  if (!hashes) return error_response(hashes.error());
  if (!pin) {
    auto r = ctx.engine.cache().unpin(std::move(*hashes)).get();
    if (!r) return error_response(r.error());
    return json_response(200, json{{"unpinned_count", r->unpinned},
                                   {"unknown_count", r->unknown},
                                   {"not_pinned_count", r->not_pinned}});
  }
  auto ttl = get_int(*body, "ttl_s", 0, 365LL * 24 * 3600);
  if (!ttl) return error_response(ttl.error());
  auto priority = get_int(*body, "priority", PinPriority::kMin, PinPriority::kMax);
  if (!priority) return error_response(priority.error());
  auto valid_priority = PinPriority::make(priority->value_or(0));
  if (!valid_priority) return error_response(valid_priority.error());
  // The cache-control API is behind the admin key: an admin's pin.
  auto result = ctx.engine.cache()
                    .pin(PinCommand{.hashes = std::move(*hashes),
                                    .ttl_ms = ttl->value_or(0) * 1000,
                                    .priority = *valid_priority,
                                    .authority = PinAuthority::kAdmin})
                    .get();
  if (!result) return error_response(result.error());
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
  auto r = ctx.engine.cache()
               .evict_blocks(EvictBlocksCommand{.hashes = std::move(*hashes),
                                                .descendants = desc->value_or(false)})
               .get();
  if (!r) return error_response(r.error());
  return json_response(200, json{{"evicted_blocks", r->evicted_blocks},
                                 {"skipped_locked", r->skipped_locked},
                                 {"skipped_pinned", r->skipped_pinned},
                                 {"skipped_has_children", r->skipped_has_children},
                                 {"unknown", r->unknown}});
}

http::Response flush(RouteContext& ctx, const http::Request& req) {
  if (!req.body.empty()) {
    auto body = parse_json_object(req.body);
    if (!body) return error_response(body.error());
  }
  auto r = ctx.engine.cache().flush().get();
  if (!r) return error_response(r.error());
  return json_response(
      200, json{{"evicted",
                 {{"device", r->evicted_pages}, {"host", r->evicted_host_pages}, {"storage", 0}}},
                {"pinned_preserved", r->pinned_preserved},
                {"locked_skipped", r->locked_skipped}});
}

// /cache/state?detail=tree: the nodes, each with its tiers.
json tree_json(const std::vector<CacheState::Node>& tree) {
  json nodes = json::array();
  for (const CacheState::Node& n : tree) {
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
                         {"soft_pin_ttl_s", ttls_s(n.soft_pin_ttl_ms)},
                         {"pin_ref", n.pin_ref},
                         {"soft_pinned_blocks", n.soft_pinned_blocks},
                         {"last_access_ms", n.last_access_ms},
                         {"hit_count", n.hit_count},
                         {"loading", n.loading},
                         {"session_protected", n.host_ref > 0},
                         {"evictable", n.evictable}});
  }
  return nodes;
}

http::Response state(RouteContext& ctx, const http::Request& req) {
  const std::string detail = req.query_param("detail");
  if (!detail.empty() && detail != "tree") {
    return error_response(400, "'detail' must be 'tree'", "invalid_argument");
  }
  // Read before the state: the snapshot holds at least every batch before it (a router
  // replays its KV events from there, router/event_subscriber.h).
  const uint64_t next_seq = ctx.cache_events.next_seq();
  auto r = ctx.engine.cache().state(StateQuery{.with_tree = detail == "tree"}).get();
  if (!r) return error_response(r.error());
  json answer = cache_state_json(*r);
  answer["kv_events_next_seq"] = next_seq;
  if (r->nodes) answer["nodes"] = tree_json(*r->nodes);
  return json_response(200, answer);
}

// GET /cache/node?id=ID: one node's content, for the dashboard's hover and click.
http::Response node(RouteContext& ctx, const http::Request& req) {
  const std::string id_text = req.query_param("id");
  uint64_t id = 0;
  const auto [end, ec] = std::from_chars(id_text.data(), id_text.data() + id_text.size(), id);
  if (id_text.empty() || ec != std::errc() || end != id_text.data() + id_text.size()) {
    return error_response(400,
                          "'id' must be a node id (a non-negative integer) from "
                          "/cache/state?detail=tree",
                          "invalid_argument");
  }
  auto r = ctx.engine.cache().node(id).get();
  if (!r) return error_response(r.error());
  const CacheState::Node& n = r->node;
  json hashes = json::array();
  for (BlockHash h : n.block_hashes) hashes.push_back(block_hash_to_wire(h));
  // As /detokenize says it; null where /detokenize refuses (an id outside the tokenizer's
  // vocabulary: the model's may be larger, and a generated token may be any of it).
  json text = nullptr;
  const auto vocab = static_cast<int32_t>(ctx.tokenizer.vocab_size());
  if (std::all_of(r->token_ids.begin(), r->token_ids.end(),
                  [vocab](int32_t t) { return t < vocab; })) {
    if (auto decoded = ctx.tokenizer.decode(r->token_ids)) text = std::move(*decoded);
  }
  return json_response(200, json{{"id", n.id},
                                 {"parent", n.parent_id},
                                 {"tokens", n.num_tokens},
                                 {"token_ids", r->token_ids},
                                 {"text", std::move(text)},
                                 {"block_hashes", std::move(hashes)},
                                 {"on_device", n.on_device},
                                 {"on_host", n.on_host},
                                 {"in_storage", n.in_storage},
                                 {"loading", n.loading},
                                 {"pin_ref", n.pin_ref},
                                 {"soft_pinned_blocks", n.soft_pinned_blocks},
                                 {"pin_counts", n.pin_counts},
                                 {"soft_pin_ttl_s", ttls_s(n.soft_pin_ttl_ms)},
                                 {"lock_ref", n.lock_ref},
                                 {"hit_count", n.hit_count},
                                 {"last_access_ms", n.last_access_ms},
                                 {"session_protected", n.host_ref > 0},
                                 {"evictable", n.evictable}});
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
  add("GET", "/cache/node", [&ctx](const http::Request& r) { return node(ctx, r); });
}

}  // namespace strata
