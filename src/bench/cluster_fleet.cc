#include "bench/cluster_fleet.h"

#include <signal.h>

#include <chrono>
#include <thread>

#include "bench/traffic.h"

namespace strata::bench {

namespace {

// The port of "http://127.0.0.1:PORT"; 0 when there is none.
int url_port(const std::string& url) {
  const size_t colon = url.rfind(':');
  if (colon == std::string::npos) return 0;
  try {
    return std::stoi(url.substr(colon + 1));
  } catch (const std::exception&) {
    return 0;
  }
}

}  // namespace

Result<std::unique_ptr<Fleet>> Fleet::start(const FleetOptions& o) {
  if (o.workers < 1) return make_error(ErrorCode::kInvalidArgument, "a fleet needs >= 1 worker");
  std::unique_ptr<Fleet> f(new Fleet());
  f->options_ = o;
  // Every worker is forked first, then awaited: dozens of (simulated) workers start
  // together rather than one after the other.
  auto worker_spawn = [&o](int32_t i, bool wait_ready) {
    SpawnOptions so;
    so.strata_bin = o.strata_bin;
    so.model_dir = o.model_dir;
    so.extra_args = o.worker_args;
    so.log_path = o.log_dir / (o.log_prefix + "-worker-" + std::to_string(i + 1) + ".log");
    so.kv_events = true;
    so.start_timeout_s = o.start_timeout_s;
    so.wait_ready = wait_ready;
    return so;
  };
  for (int32_t i = 0; i < o.workers; ++i) {
    auto p = ServerProcess::start(worker_spawn(i, false));
    if (!p) return std::unexpected(p.error());
    f->workers_.push_back(std::move(*p));
  }
  for (int32_t i = 0; i < o.workers; ++i) {
    auto& w = f->workers_[static_cast<size_t>(i)];
    // A free port picked for a worker may be taken before it binds it (by a connection of
    // another process): such a worker is started again, alone, on other ports.
    for (int attempt = 1;; ++attempt) {
      auto st = w->wait_ready(o.start_timeout_s);
      if (st) break;
      if (attempt == 3) return std::unexpected(st.error());
      auto again = ServerProcess::start(worker_spawn(i, false));
      if (!again) return std::unexpected(again.error());
      w = std::move(*again);
    }
    f->worker_urls_.push_back(w->url());
    f->kv_events_.push_back(w->kv_events_endpoint());
    f->kv_replay_.push_back(w->kv_events_replay_endpoint());
    f->restarts_.push_back(0);
  }
  if (o.routers < 1) return make_error(ErrorCode::kInvalidArgument, "a fleet needs >= 1 router");
  for (int32_t j = 0; j < o.routers; ++j) {
    SpawnOptions ro;
    ro.strata_bin = o.strata_bin;
    ro.command = "route";
    ro.model_dir = o.model_dir;
    for (const std::string& url : f->worker_urls_) {
      ro.extra_args.push_back("--worker");
      ro.extra_args.push_back(url);
    }
    ro.extra_args.insert(ro.extra_args.end(), o.router_args.begin(), o.router_args.end());
    const std::string suffix = o.routers > 1 ? "-router-" + std::to_string(j + 1) : "-router";
    ro.log_path = o.log_dir / (o.log_prefix + suffix + ".log");
    ro.start_timeout_s = o.start_timeout_s;
    auto r = ServerProcess::start(ro);
    if (!r) return std::unexpected(r.error());
    f->router_urls_.push_back((*r)->url());
    f->routers_.push_back(std::move(*r));
  }
  for (const std::string& url : f->router_urls_) {
    auto joined = wait_workers_joined(ServerClient(url), f->worker_urls_.size(), o.join_timeout_s);
    if (!joined) return std::unexpected(joined.error());
  }
  return f;
}

Fleet::~Fleet() {
  stop();
}

Status Fleet::kill_worker(size_t i) {
  if (i >= workers_.size() || !workers_[i]) {
    return make_error(ErrorCode::kInvalidArgument, "no running worker " + std::to_string(i));
  }
  ::kill(workers_[i]->pid(), SIGKILL);
  (void)workers_[i]->stop(5);  // reaps it
  workers_[i].reset();
  return {};
}

Status Fleet::restart_worker(size_t i) {
  if (i >= workers_.size() || workers_[i]) {
    return make_error(ErrorCode::kInvalidArgument, "worker " + std::to_string(i) + " is running");
  }
  ++restarts_[i];
  SpawnOptions so;
  so.strata_bin = options_.strata_bin;
  so.model_dir = options_.model_dir;
  so.extra_args = options_.worker_args;
  so.log_path = options_.log_dir / (options_.log_prefix + "-worker-" + std::to_string(i + 1) +
                                    "-restart-" + std::to_string(restarts_[i]) + ".log");
  so.kv_events = true;
  so.port = url_port(worker_urls_[i]);
  so.kv_events_endpoint = kv_events_[i];
  so.kv_events_replay_endpoint = kv_replay_[i];
  so.start_timeout_s = options_.start_timeout_s;
  // The killed process's ports may linger a moment: a few tries.
  std::string last;
  for (int attempt = 0; attempt < 5; ++attempt) {
    auto p = ServerProcess::start(so);
    if (p) {
      workers_[i] = std::move(*p);
      return {};
    }
    last = p.error().message;
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  return make_error(ErrorCode::kIoError,
                    "restarting worker " + std::to_string(i + 1) + ": " + last);
}

Status Fleet::kill_router(size_t i) {
  if (i >= routers_.size() || !routers_[i]) {
    return make_error(ErrorCode::kInvalidArgument, "no running router " + std::to_string(i));
  }
  ::kill(routers_[i]->pid(), SIGKILL);
  (void)routers_[i]->stop(5);  // reaps it
  routers_[i].reset();
  return {};
}

Fleet::CpuSeconds Fleet::cpu_seconds() const {
  CpuSeconds out;
  for (const auto& r : routers_) out.routers.push_back(r ? r->cpu_seconds() : -1);
  for (const auto& w : workers_) out.workers.push_back(w ? w->cpu_seconds() : -1);
  return out;
}

void Fleet::stop() {
  for (auto& r : routers_) {
    if (r) (void)r->stop();
    r.reset();
  }
  // SIGTERM to every worker first, so that they shut down together.
  for (auto& w : workers_) {
    if (w && w->pid() > 0) ::kill(w->pid(), SIGTERM);
  }
  for (auto& w : workers_) {
    if (w) (void)w->stop();
    w.reset();
  }
}

Result<nlohmann::json> wait_workers_joined(const ServerClient& router, size_t expected,
                                           double timeout_s) {
  const double deadline = monotonic_s() + timeout_s;
  std::string last = "no answer";
  while (monotonic_s() < deadline) {
    if (interrupted()) return make_error(ErrorCode::kFailedPrecondition, "interrupted");
    auto j = router.get_json("/workers");
    if (j && j->contains("workers") && (*j)["workers"].is_array()) {
      const auto& list = (*j)["workers"];
      size_t ready = 0;
      for (const auto& w : list) {
        const bool joined = w.value("joined", false) && w.value("eligible", false);
        const auto load = w.value("load", nlohmann::json::object());
        if (joined && load.value("total_pages", int64_t{0}) > 0) ++ready;
      }
      if (ready == list.size() && ready >= std::max<size_t>(expected, 1)) return *j;
      last = std::to_string(ready) + " of " + std::to_string(list.size()) + " workers ready";
    } else if (!j) {
      last = j.error().message;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return make_error(ErrorCode::kTimeout, "the router's workers did not all join within " +
                                             std::to_string(static_cast<int>(timeout_s)) + " s (" +
                                             last + ")");
}

}  // namespace strata::bench
