// Tool-call sessions, behind the admin key when one is set: POST /session/tool_start and
// /session/tool_end, GET /session/kv_meta (docs/tool-sessions.md). The engine's calls run
// on the HTTP worker pool; the waits between them (a restore waiting for room, copies in
// flight settling) are timers on the I/O strand, so no thread is held while they wait.
#include <chrono>
#include <limits>

#include "server/request_parsing.h"
#include "server/routes.h"

namespace strata {
namespace {

using json = nlohmann::json;
using SteadyClock = std::chrono::steady_clock;
using boost::asio::awaitable;

json session_json(const ToolSessionView& v) {
  return json{{"state", std::string(tool_session_state_name(v.state))},
              {"tier", v.tier},
              {"epoch", v.epoch},
              {"tokens", v.tokens},
              {"since", v.since_ms}};
}

bool transitional(ToolSessionState s) {
  return s == ToolSessionState::kOffloading || s == ToolSessionState::kRestoring;
}

Result<ToolSessionView> kv_meta(RouteContext& ctx, const std::string& id) {
  return ctx.engine.cache().kv_meta(id).get();
}

// Waits until the session's copies landed, so that the answer says where its KV is.
awaitable<Result<ToolSessionView>> settle(RouteContext& ctx, http::Exchange& ex,
                                          const std::string& id, ToolSessionView v) {
  const auto deadline = SteadyClock::now() + std::chrono::seconds(30);
  while (transitional(v.state) && SteadyClock::now() < deadline && !ex.abandoned()) {
    co_await ex.sleep(std::chrono::milliseconds(2));
    auto now = co_await ex.offload([&] { return kv_meta(ctx, id); });
    if (!now) co_return now;
    const int64_t moved = v.moved_tokens;
    v = *now;
    v.moved_tokens = moved;
  }
  co_return v;
}

struct ToolCall {
  std::string session_id;
  std::optional<int64_t> epoch;
};

Result<ToolCall> parse_tool_call(const std::string& raw, bool start) {
  auto body = parse_json_object(raw);
  if (!body) return std::unexpected(body.error());
  for (const auto& [key, value] : body->items()) {
    if (key != "session_id" && key != "epoch") {
      return make_error(ErrorCode::kInvalidArgument, "unknown field '" + key + "'");
    }
  }
  auto id = get_string(*body, "session_id");
  if (!id) return std::unexpected(id.error());
  if (!id->has_value() || (*id)->empty() || (*id)->size() > 256) {
    return make_error(ErrorCode::kInvalidArgument,
                      "'session_id' (1 to 256 characters) is required");
  }
  ToolCall call{.session_id = **id};
  if (!start) {
    auto e = get_int(*body, "epoch", 0, std::numeric_limits<int64_t>::max());
    if (!e) return std::unexpected(e.error());
    if (!e->has_value()) return make_error(ErrorCode::kInvalidArgument, "'epoch' is required");
    call.epoch = **e;
  } else if (body->contains("epoch")) {
    return make_error(ErrorCode::kInvalidArgument, "tool_start takes no 'epoch'");
  }
  return call;
}

awaitable<void> tool_session(RouteContext& ctx, http::Exchange& ex, bool start) {
  auto call = parse_tool_call(ex.request().body, start);
  if (!call) {
    co_await ex.respond(error_response(call.error()));
    co_return;
  }
  auto once = [&] {
    return start ? ctx.engine.cache().tool_start(call->session_id).get()
                 : ctx.engine.cache()
                       .tool_end(call->session_id, static_cast<uint64_t>(*call->epoch))
                       .get();
  };
  auto r = co_await ex.offload(once);
  // The engine makes room for a restore by retracting running requests; a restore that
  // still finds none (only other resuming sessions hold the pool) is retried for a while
  // as their pages come back; the session stays OFFLOADED in between.
  const auto retry_until = SteadyClock::now() + std::chrono::seconds(10);
  while (!start && !r && r.error().code == ErrorCode::kOutOfPages &&
         SteadyClock::now() < retry_until && !ex.abandoned()) {
    co_await ex.sleep(std::chrono::milliseconds(5));
    r = co_await ex.offload(once);
  }
  if (!r) {
    co_await ex.respond(error_response(r.error()));
    co_return;
  }
  auto v = co_await settle(ctx, ex, call->session_id, *r);
  if (!v) {
    co_await ex.respond(error_response(v.error()));
    co_return;
  }
  json out = session_json(*v);
  out[start ? "offloaded_tokens" : "restored_tokens"] = v->moved_tokens;
  co_await ex.respond(json_response(200, out));
}

http::Response kv_meta_route(RouteContext& ctx, const http::Request& req) {
  const std::string id = req.query_param("session_id");
  if (id.empty() || id.size() > 256) {
    return error_response(400, "'session_id' (1 to 256 characters) is required",
                          "invalid_argument");
  }
  auto r = kv_meta(ctx, id);
  if (!r) return error_response(r.error());
  return json_response(200, session_json(*r));
}

}  // namespace

void add_session_routes(http::Server& server, RouteContext& ctx) {
  server.route("POST", "/session/tool_start",
               admin_only(ctx, [&ctx](http::Exchange& ex) { return tool_session(ctx, ex, true); }));
  server.route("POST", "/session/tool_end", admin_only(ctx, [&ctx](http::Exchange& ex) {
                 return tool_session(ctx, ex, false);
               }));
  server.route("GET", "/session/kv_meta",
               admin_only(ctx, blocking([&ctx](const http::Request& req) {
                            return kv_meta_route(ctx, req);
                          })));
}

}  // namespace strata
