#include "cache/pin_table.h"

#include <algorithm>
#include <string>

namespace strata {

bool PinTable::pin(BlockHash hash, const PinOptions& options, int64_t now_ms) {
  Record& rec = records_[hash];
  if (options.ttl_ms <= 0) {
    ++rec.hard;
    return false;
  }
  const bool first_soft = rec.soft.empty();
  const SoftPin p{.ttl_ms = options.ttl_ms,
                  .expiry_ms = now_ms + options.ttl_ms,
                  .priority = options.priority,
                  .seq = next_seq_++};
  rec.soft.push_back(p);
  expiry_.insert({p.expiry_ms, hash, p.seq});
  if (first_soft) ++soft_pinned_blocks_;
  return first_soft;
}

PinChange PinTable::remove_soft(BlockHash hash, Record& rec, size_t at) {
  PinChange change{.hash = hash, .pins_removed = 1, .soft_cleared = false};
  const SoftPin& p = rec.soft[at];
  expiry_.erase({p.expiry_ms, hash, p.seq});
  rec.soft.erase(rec.soft.begin() + static_cast<std::ptrdiff_t>(at));
  if (rec.soft.empty()) {
    change.soft_cleared = true;
    --soft_pinned_blocks_;
    if (rec.hard == 0) records_.erase(hash);
  }
  return change;
}

PinChange PinTable::unpin_one(BlockHash hash) {
  const auto it = records_.find(hash);
  if (it == records_.end()) return PinChange{.hash = hash};
  Record& rec = it->second;
  if (rec.hard > 0) {
    --rec.hard;
    if (rec.hard == 0 && rec.soft.empty()) records_.erase(it);
    return PinChange{.hash = hash, .pins_removed = 1};
  }
  // The soft pin of the highest priority; ties: the longest TTL, then the oldest (the
  // vector is in the order the pins were made).
  size_t best = 0;
  for (size_t k = 1; k < rec.soft.size(); ++k) {
    const SoftPin& a = rec.soft[k];
    const SoftPin& b = rec.soft[best];
    if (a.priority > b.priority || (a.priority == b.priority && a.ttl_ms > b.ttl_ms)) best = k;
  }
  return remove_soft(hash, rec, best);
}

PinChange PinTable::release_all(BlockHash hash) {
  const auto it = records_.find(hash);
  if (it == records_.end()) return PinChange{.hash = hash};
  const Record& rec = it->second;
  PinChange change{.hash = hash,
                   .pins_removed = rec.hard + static_cast<uint32_t>(rec.soft.size()),
                   .soft_cleared = !rec.soft.empty()};
  for (const SoftPin& p : rec.soft) expiry_.erase({p.expiry_ms, hash, p.seq});
  if (change.soft_cleared) --soft_pinned_blocks_;
  records_.erase(it);
  return change;
}

void PinTable::refresh(BlockHash hash, int64_t now_ms) {
  const auto it = records_.find(hash);
  if (it == records_.end()) return;
  for (SoftPin& p : it->second.soft) {
    const int64_t expiry = now_ms + p.ttl_ms;
    if (expiry == p.expiry_ms) continue;
    expiry_.erase({p.expiry_ms, hash, p.seq});
    p.expiry_ms = expiry;
    expiry_.insert({p.expiry_ms, hash, p.seq});
  }
}

std::optional<PinChange> PinTable::expire_one(int64_t now_ms) {
  if (expiry_.empty() || std::get<0>(*expiry_.begin()) > now_ms) return std::nullopt;
  const auto [expiry_ms, hash, seq] = *expiry_.begin();
  Record& rec = records_.at(hash);
  const auto at = std::find_if(rec.soft.begin(), rec.soft.end(),
                               [seq = seq](const SoftPin& p) { return p.seq == seq; });
  return remove_soft(hash, rec, static_cast<size_t>(at - rec.soft.begin()));
}

void PinTable::clear() {
  records_.clear();
  expiry_.clear();
  soft_pinned_blocks_ = 0;
}

uint32_t PinTable::count(BlockHash hash) const {
  const auto it = records_.find(hash);
  if (it == records_.end()) return 0;
  return it->second.hard + static_cast<uint32_t>(it->second.soft.size());
}

uint32_t PinTable::hard_count(BlockHash hash) const {
  const auto it = records_.find(hash);
  return it == records_.end() ? 0 : it->second.hard;
}

uint32_t PinTable::soft_count(BlockHash hash) const {
  const auto it = records_.find(hash);
  return it == records_.end() ? 0 : static_cast<uint32_t>(it->second.soft.size());
}

int64_t PinTable::max_soft_ttl_ms(BlockHash hash) const {
  const auto it = records_.find(hash);
  if (it == records_.end()) return 0;
  int64_t ttl_ms = 0;
  for (const SoftPin& p : it->second.soft) ttl_ms = std::max(ttl_ms, p.ttl_ms);
  return ttl_ms;
}

PinPriority PinTable::priority(BlockHash hash) const {
  const auto it = records_.find(hash);
  if (it == records_.end() || it->second.soft.empty()) return PinPriority();
  PinPriority p = PinPriority::lowest();
  for (const SoftPin& s : it->second.soft) p = std::max(p, s.priority);
  return p;
}

int64_t PinTable::soft_pinned_blocks_at_most(PinPriority priority) const {
  int64_t n = 0;
  for (const auto& [hash, rec] : records_) {
    if (rec.soft.empty()) continue;
    const bool all_at_most = std::all_of(rec.soft.begin(), rec.soft.end(),
                                         [&](const SoftPin& s) { return s.priority <= priority; });
    n += all_at_most ? 1 : 0;
  }
  return n;
}

std::vector<BlockHash> PinTable::release_order(std::span<const Candidate> candidates) const {
  struct Keyed {
    bool hard;
    PinPriority priority;
    uint64_t tick;
    BlockHash hash;
  };
  std::vector<Keyed> keyed;
  keyed.reserve(candidates.size());
  for (const Candidate& c : candidates) {
    keyed.push_back(Keyed{hard_count(c.hash) > 0, priority(c.hash), c.last_access_tick, c.hash});
  }
  std::stable_sort(keyed.begin(), keyed.end(), [](const Keyed& a, const Keyed& b) {
    if (a.hard != b.hard) return !a.hard;
    if (a.priority != b.priority) return a.priority < b.priority;
    return a.tick < b.tick;
  });
  std::vector<BlockHash> out;
  out.reserve(keyed.size());
  for (const Keyed& k : keyed) out.push_back(k.hash);
  return out;
}

Status PinTable::check() const {
  auto fail = [](const std::string& what) {
    return make_error(ErrorCode::kInternal, "pin table: " + what);
  };
  int64_t soft_blocks = 0;
  size_t soft_pins = 0;
  for (const auto& [hash, rec] : records_) {
    if (rec.hard == 0 && rec.soft.empty()) return fail("an empty record was kept");
    if (!rec.soft.empty()) ++soft_blocks;
    for (const SoftPin& p : rec.soft) {
      ++soft_pins;
      if (p.ttl_ms <= 0) return fail("a soft pin without a TTL");
      if (!expiry_.contains({p.expiry_ms, hash, p.seq})) {
        return fail("a soft pin is missing from the expiry order");
      }
    }
  }
  if (soft_blocks != soft_pinned_blocks_) return fail("soft pinned block count drifted");
  if (soft_pins != expiry_.size()) return fail("the expiry order has stale entries");
  return {};
}

}  // namespace strata
