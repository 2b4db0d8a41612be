// The families of routes, one file each. Each adds its handlers to the HTTP server; every
// handler's behaviour is documented in the README and checked by tests/server/*.mjs.
#pragma once

#include "http/server.h"
#include "server/route_context.h"

namespace strata {

// /v1/chat/completions, /v1/completions, /v1/models (openai_routes.cc).
void add_openai_routes(http::Server& server, RouteContext& ctx);
// /v1/messages, /v1/messages/count_tokens: Anthropic's Messages API (anthropic_routes.cc).
void add_anthropic_routes(http::Server& server, RouteContext& ctx);
// /v1/responses, /v1/responses/{id}: OpenAI's Responses API (responses_routes.cc).
void add_responses_routes(http::Server& server, RouteContext& ctx);
// /tokenize, /detokenize (tokenizer_routes.cc).
void add_tokenizer_routes(http::Server& server, RouteContext& ctx);
// /cache/{pin,unpin,evict,flush,state,node}, /hicache/{pin,unpin}_blocks, /flush_cache
// (cache_routes.cc), behind the admin key.
void add_cache_routes(http::Server& server, RouteContext& ctx);
// /session/{tool_start,tool_end,kv_meta} (session_routes.cc), behind the admin key.
void add_session_routes(http::Server& server, RouteContext& ctx);
// /health, /metrics (health_routes.cc).
void add_health_routes(http::Server& server, RouteContext& ctx);
// /server_info, /load: what a router needs to know of a worker (worker_info_routes.cc).
void add_worker_info_routes(http::Server& server, RouteContext& ctx);
// /cache/events: the KV events as server-sent events, behind the admin key
// (cache_events_routes.cc).
void add_cache_events_routes(http::Server& server, RouteContext& ctx);
// /dashboard, its assets and /dashboard/config (dashboard_routes.cc), open.
void add_dashboard_routes(http::Server& server, RouteContext& ctx);

}  // namespace strata
