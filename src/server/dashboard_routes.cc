// The cache dashboard on a worker (`strata serve`): the page and its assets, and what the
// page needs to know of this server (dashboard/dashboard_routes.h). The page reads the
// cache through the API it already has: /cache/state?detail=tree, /cache/events,
// /cache/node, /metrics, and steers it with /cache/{pin,unpin,evict,flush}.
#include "dashboard/dashboard_routes.h"

#include "server/routes.h"

namespace strata {

void add_dashboard_routes(http::Server& server, RouteContext& ctx) {
  dashboard::add_dashboard_routes(server, [&ctx] {
    return dashboard::DashboardConfig{.mode = "worker",
                                      .auth_required = !ctx.options.admin_api_key.empty(),
                                      .model = ctx.options.model_name,
                                      .page_size = ctx.engine.options().page_size};
  });
}

}  // namespace strata
