#include "pd/pd_peers.h"

#include <utility>

#include "common/check.h"

namespace strata::pd {

Status PeerTableOptions::validate() const {
  if (peer_timeout_ms < 1 || peer_timeout_ms > 600'000) {
    return make_error(ErrorCode::kInvalidArgument, "PD peers: peer_timeout_ms must be 1..600000");
  }
  if (max_peers < 1 || max_peers > 65'536) {
    return make_error(ErrorCode::kInvalidArgument, "PD peers: max_peers must be 1..65536");
  }
  return {};
}

PeerTable::PeerTable(PeerTableOptions options) : options_(options) {
  const auto valid = options_.validate();
  STRATA_CHECK_MSG(valid.has_value(), valid.error().message);
}

Result<HelloOutcome> PeerTable::on_hello(const Hello& hello, int64_t now_ms) {
  auto it = peers_.find(hello.worker_id);
  if (it == peers_.end()) {
    if (peers_.size() >= options_.max_peers) {
      // Forget the dead peer silent the longest; live peers are never pushed out.
      auto oldest = peers_.end();
      for (auto p = peers_.begin(); p != peers_.end(); ++p) {
        if (!p->second.alive &&
            (oldest == peers_.end() || p->second.last_heard_ms < oldest->second.last_heard_ms)) {
          oldest = p;
        }
      }
      if (oldest == peers_.end()) {
        return make_error(ErrorCode::kResourceExhausted,
                          "PD peers: " + std::to_string(options_.max_peers) +
                              " peers alive, no room for " + hello.worker_id);
      }
      peers_.erase(oldest);
    }
    PeerInfo info;
    info.worker_id = hello.worker_id;
    info.role = hello.role;
    info.incarnation = hello.incarnation;
    info.alive = true;
    info.last_heard_ms = now_ms;
    peers_.emplace(hello.worker_id, std::move(info));
    return HelloOutcome::kNew;
  }
  PeerInfo& p = it->second;
  const bool was_alive = p.alive;
  p.last_heard_ms = now_ms;
  p.alive = true;
  p.role = hello.role;
  if (p.incarnation != hello.incarnation) {
    p.incarnation = hello.incarnation;
    // A restart while it looked alive is a death the timeout never saw.
    if (was_alive) ++p.deaths;
    return HelloOutcome::kRestarted;
  }
  return was_alive ? HelloOutcome::kUnchanged : HelloOutcome::kRevived;
}

HeardOutcome PeerTable::on_heard(std::string_view worker_id, int64_t now_ms) {
  auto it = peers_.find(std::string(worker_id));
  if (it == peers_.end()) return HeardOutcome::kUnknown;
  PeerInfo& p = it->second;
  p.last_heard_ms = now_ms;
  if (p.alive) return HeardOutcome::kAlive;
  p.alive = true;
  return HeardOutcome::kRevived;
}

bool PeerTable::mark_dead(std::string_view worker_id) {
  auto it = peers_.find(std::string(worker_id));
  if (it == peers_.end() || !it->second.alive) return false;
  it->second.alive = false;
  ++it->second.deaths;
  return true;
}

std::vector<std::string> PeerTable::tick(int64_t now_ms) {
  std::vector<std::string> dead;
  for (auto& [id, p] : peers_) {
    if (p.alive && now_ms - p.last_heard_ms > options_.peer_timeout_ms) {
      p.alive = false;
      ++p.deaths;
      dead.push_back(id);
    }
  }
  return dead;
}

bool PeerTable::alive(std::string_view worker_id) const {
  auto it = peers_.find(std::string(worker_id));
  return it != peers_.end() && it->second.alive;
}

std::optional<PeerInfo> PeerTable::find(std::string_view worker_id) const {
  auto it = peers_.find(std::string(worker_id));
  if (it == peers_.end()) return std::nullopt;
  return it->second;
}

std::vector<PeerInfo> PeerTable::list() const {
  std::vector<PeerInfo> out;
  out.reserve(peers_.size());
  for (const auto& [id, p] : peers_) out.push_back(p);
  return out;
}

size_t PeerTable::alive_count() const {
  size_t n = 0;
  for (const auto& [id, p] : peers_) n += p.alive ? 1 : 0;
  return n;
}

}  // namespace strata::pd
