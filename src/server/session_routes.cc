// Tool-call sessions, behind the admin key when one is set: POST /session/tool_start and
// /session/tool_end, GET /session/kv_meta (docs/tool-sessions.md). The engine owns the
// waiting (a restore waiting for room, copies landing): its answer wakes the handler, which
// holds no thread meanwhile.
#include <chrono>
#include <future>
#include <limits>

#include "request/turn_record.h"
#include "server/request_parsing.h"
#include "server/routes.h"

namespace strata {
namespace {

using json = nlohmann::json;
using boost::asio::awaitable;

json session_json(const ToolSessionView& v) {
  return json{{"state", std::string(tool_session_state_name(v.state))},
              {"tier", v.tier},
              {"epoch", v.epoch},
              {"tokens", v.tokens},
              {"since", v.since_ms}};
}

Result<ToolSessionView> kv_meta(RouteContext& ctx, const std::string& id) {
  return ctx.engine.cache().kv_meta(id).get();
}

struct ToolSessionCall {
  std::string session_id;
  std::optional<int64_t> epoch;
};

Result<ToolSessionCall> parse_tool_call(const std::string& raw, bool start) {
  auto body = parse_json_object(raw);
  if (!body) return std::unexpected(body.error());
  for (const auto& [key, value] : body->items()) {
    if (key != "session_id" && key != "epoch") {
      return make_error(ErrorCode::kInvalidArgument, "unknown field '" + key + "'");
    }
  }
  auto id = get_string(*body, "session_id");
  if (!id) return std::unexpected(id.error());
  if (!id->has_value()) return make_error(ErrorCode::kInvalidArgument, "'session_id' is required");
  if (Status st = check_session_id(**id, "session_id"); !st) return std::unexpected(st.error());
  ToolSessionCall call{.session_id = **id};
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
  // The engine answers once the move has landed (and waits for room for a restore); the
  // handler sleeps until its waker is called, holding no thread.
  std::future<Result<ToolSessionView>> answer =
      start ? ctx.engine.cache().tool_start(call->session_id, ex.waker())
            : ctx.engine.cache().tool_end(call->session_id, static_cast<uint64_t>(*call->epoch),
                                          ex.waker());
  while (answer.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
    if (!co_await ex.wait(std::chrono::seconds(1))) co_return;  // client gone, or shutdown
  }
  Result<ToolSessionView> v = answer.get();
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
  if (Status st = check_session_id(id, "session_id"); !st) return error_response(st.error());
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
