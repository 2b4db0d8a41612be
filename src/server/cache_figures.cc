// The figures' values and the JSON of GET /cache/state, written by one loop over
// kCacheFigures (cache_figures.h).
#include "server/cache_figures.h"

#include <type_traits>

namespace strata {

bool has_section(const CacheState& state, CacheSection section) {
  switch (section) {
    case CacheSection::kHost:
      return state.host.has_value();
    case CacheSection::kStorage:
      return state.storage.has_value();
    default:
      return true;
  }
}

std::array<std::string_view, 2> section_path(CacheSection section) {
  switch (section) {
    case CacheSection::kNone:
    case CacheSection::kTop:
      return {};
    case CacheSection::kDevice:
      return {"device"};
    case CacheSection::kHost:
      return {"host"};
    case CacheSection::kStorage:
      return {"storage"};
    case CacheSection::kHits:
      return {"hits"};
    case CacheSection::kEvictions:
      return {"evictions"};
    case CacheSection::kAutoUnpinnedByReason:
      return {"evictions", "auto_unpinned_blocks_by_reason"};
    case CacheSection::kRequests:
      return {"requests"};
  }
  return {};
}

CacheFigureValue cache_figure_value(const CacheState& state, const CacheFigure& figure) {
  const CacheState::Pool& pool =
      figure.section == CacheSection::kHost ? state.host->pool : state.device;
  // The member's value, widened: signed stays signed, unsigned stays unsigned.
  const CacheFigureValue read = std::visit(
      [&](auto member) -> CacheFigureValue {
        using Member = decltype(member);
        const auto& from = [&]() -> const auto& {
          if constexpr (std::is_same_v<Member, int32_t TreeStats::*> ||
                        std::is_same_v<Member, bool TreeStats::*> ||
                        std::is_same_v<Member, int64_t TreeStats::*> ||
                        std::is_same_v<Member, uint64_t TreeStats::*>) {
            return state.tree.*member;
          } else if constexpr (std::is_same_v<Member, int64_t CacheState::Pool::*>) {
            return pool.*member;
          } else if constexpr (std::is_same_v<Member, uint64_t CacheState::Storage::*>) {
            return (*state.storage).*member;
          } else if constexpr (std::is_same_v<Member, int64_t EngineCounters::*> ||
                               std::is_same_v<Member, uint64_t EngineCounters::*>) {
            return state.engine.*member;
          } else {
            static_assert(std::is_same_v<Member, int64_t CacheState::*>);
            return state.*member;
          }
        }
        ();
        if constexpr (std::is_unsigned_v<std::remove_cvref_t<decltype(from)>> &&
                      !std::is_same_v<std::remove_cvref_t<decltype(from)>, bool>) {
          return static_cast<uint64_t>(from);
        } else {
          return static_cast<int64_t>(from);
        }
      },
      figure.source);
  switch (figure.derivation) {
    case CacheDerivation::kAsIs:
      return read;
    case CacheDerivation::kTokens:
      // As the JSON always said it: pages (signed or not) times the page size.
      return std::visit(
          [&](auto pages) -> CacheFigureValue {
            return pages * static_cast<decltype(pages)>(state.tree.page_size);
          },
          read);
    case CacheDerivation::kLessProtected:
      return state.tree.cached_pages - state.tree.protected_pages;
    case CacheDerivation::kLessHostRoom:
      return state.engine.auto_unpinned_blocks - state.engine.auto_unpinned_host_blocks;
    case CacheDerivation::kTokensPerGb:
      return pool.page_bytes > 0 ? static_cast<int64_t>(1e9 / static_cast<double>(pool.page_bytes) *
                                                        state.tree.page_size)
                                 : int64_t{0};
  }
  return read;
}

nlohmann::json cache_state_json(const CacheState& state) {
  nlohmann::json out = nlohmann::json::object();
  out["host"] = nullptr;
  out["storage"] = nullptr;
  for (const CacheFigure& figure : kCacheFigures) {
    if (figure.section == CacheSection::kNone || !has_section(state, figure.section)) continue;
    nlohmann::json* at = &out;
    for (std::string_view part : section_path(figure.section)) {
      if (!part.empty()) at = &(*at)[std::string(part)];
    }
    std::visit([&](auto value) { (*at)[std::string(figure.key)] = value; },
               cache_figure_value(state, figure));
  }
  if (state.host) {
    out["host"]["write_policy"] = state.host->write_policy;
    out["host"]["mem_layout"] = state.host->mem_layout;
  }
  if (state.storage) out["storage"]["backend"] = state.storage->backend;
  out["kv_dtype"] = state.kv_dtype;
  return out;
}

}  // namespace strata
