// The one description of the cache's figures (server/cache_figures.h): every counter of
// the structs the engine passes has a figure, and every shown figure is in the JSON of
// GET /cache/state and, where it has one, in /metrics, with its value.
#include "server/cache_figures.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "server/metrics.h"

namespace strata {
namespace {

// Counts the members of an aggregate: the most initializers it takes. Every member of the
// structs counted here is a scalar or a string, so brace elision cannot inflate the count.
struct AnyMember {
  template <class T>
  operator T() const;  // never called: only asked whether it converts
};

template <class T, class... Given>
consteval size_t member_count() {
  if constexpr (requires { T{Given{}..., AnyMember{}}; }) {
    return member_count<T, Given..., AnyMember>();
  } else {
    return sizeof...(Given);
  }
}

// The distinct members the figures read among alternatives `first` to `last` of
// CacheFigureSource (the member pointers into one struct).
size_t distinct_members_read(size_t first, size_t last) {
  std::vector<CacheFigureSource> seen;
  for (const CacheFigure& f : kCacheFigures) {
    if (f.source.index() < first || f.source.index() > last) continue;
    if (std::find(seen.begin(), seen.end(), f.source) == seen.end()) seen.push_back(f.source);
  }
  return seen.size();
}

TEST(CacheFiguresTest, EveryCounterOfThePassedStructsHasAFigure) {
  // CacheFigureSource: 0-3 TreeStats, 4 CacheState::Pool, 5 CacheState::Storage.
  EXPECT_EQ(distinct_members_read(0, 3), member_count<TreeStats>())
      << "a TreeStats member has no row in kCacheFigures (server/cache_figures.h): show it, "
         "or say there why it is internal";
  EXPECT_EQ(distinct_members_read(4, 4), member_count<CacheState::Pool>());
  EXPECT_EQ(distinct_members_read(5, 5) + 1, member_count<CacheState::Storage>())
      << "every Storage member but the backend's name is a counter with a figure";
}

TEST(CacheFiguresTest, EachFigureIsShownOnceOrSaysWhyNot) {
  std::set<std::pair<CacheSection, std::string_view>> keys;
  std::set<std::pair<CacheMetric, std::string_view>> samples;
  for (const CacheFigure& f : kCacheFigures) {
    const bool shown = f.section != CacheSection::kNone || f.metric != CacheMetric::kNone;
    EXPECT_NE(shown, !f.internal.empty()) << f.key << f.label << f.internal;
    EXPECT_EQ(f.section == CacheSection::kNone, f.key.empty()) << f.key;
    if (!f.key.empty()) {
      EXPECT_TRUE(keys.emplace(f.section, f.key).second) << f.key;
    }
    if (f.metric == CacheMetric::kNone) continue;
    const CacheMetricFamily& family = kCacheMetricFamilies[static_cast<size_t>(f.metric)];
    EXPECT_EQ(family.label.empty(), f.label.empty()) << family.name << " " << f.label;
    EXPECT_TRUE(samples.emplace(f.metric, f.label).second) << family.name << " " << f.label;
  }
}

// A state whose every figure's member holds a value of its own (1 for a flag).
CacheState state_with_distinct_values() {
  CacheState s;
  s.host = CacheState::Host{.write_policy = "write_through", .mem_layout = "layer_first"};
  s.storage = CacheState::Storage{.backend = "file"};
  uint64_t next = 3;
  for (const CacheFigure& f : kCacheFigures) {
    std::visit(
        [&](auto member) {
          using Member = decltype(member);
          auto set = [&](auto& value) {
            using Value = std::remove_reference_t<decltype(value)>;
            if constexpr (std::is_same_v<Value, bool>) {
              value = true;
            } else {
              value = static_cast<Value>(next);
            }
          };
          if constexpr (std::is_same_v<Member, int64_t CacheState::Pool::*>) {
            set(f.section == CacheSection::kHost ? s.host->pool.*member : s.device.*member);
          } else if constexpr (std::is_same_v<Member, uint64_t CacheState::Storage::*>) {
            set((*s.storage).*member);
          } else if constexpr (std::is_same_v<Member, int64_t EngineCounters::*> ||
                               std::is_same_v<Member, uint64_t EngineCounters::*>) {
            set(s.engine.*member);
          } else if constexpr (std::is_same_v<Member, int64_t CacheState::*>) {
            set(s.*member);
          } else {
            set(s.tree.*member);
          }
        },
        f.source);
    next += 7;
  }
  s.tree.page_size = 16;
  s.engine.auto_unpinned_host_blocks = 2;  // of auto_unpinned_blocks
  return s;
}

double as_double(CacheFigureValue v) {
  return std::visit([](auto x) { return static_cast<double>(x); }, v);
}

// The value of the sample `name{label="value"}` (or `name` when `label` is empty) in
// Prometheus text; nullopt when there is none.
std::optional<double> sample(const std::string& text, std::string_view name, std::string_view label,
                             std::string_view value) {
  std::string head(name);
  if (!label.empty()) head += "{" + std::string(label) + "=\"" + std::string(value) + "\"}";
  head += " ";
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.starts_with(head)) return std::stod(line.substr(head.size()));
  }
  return std::nullopt;
}

TEST(CacheFiguresTest, EveryShownFigureIsInTheJsonAndTheMetricsWithItsValue) {
  const CacheState s = state_with_distinct_values();
  const nlohmann::json j = cache_state_json(s);
  Metrics metrics;
  metrics.set_cache(s);
  const std::string text = metrics.serialize();
  for (const CacheFigure& f : kCacheFigures) {
    const double want = as_double(cache_figure_value(s, f));
    if (f.section != CacheSection::kNone) {
      const nlohmann::json* at = &j;
      for (std::string_view part : section_path(f.section)) {
        if (part.empty()) continue;
        ASSERT_TRUE(at->contains(std::string(part))) << part;
        at = &(*at)[std::string(part)];
      }
      ASSERT_TRUE(at->contains(std::string(f.key))) << f.key << " is missing from the JSON";
      EXPECT_EQ((*at)[std::string(f.key)].get<double>(), want) << f.key;
    }
    if (f.metric != CacheMetric::kNone) {
      const CacheMetricFamily& family = kCacheMetricFamilies[static_cast<size_t>(f.metric)];
      const auto got = sample(text, family.name, family.label, f.label);
      ASSERT_TRUE(got.has_value()) << family.name << " " << f.label << " is missing from:\n"
                                   << text;
      EXPECT_EQ(*got, want) << family.name << " " << f.label;
    }
  }
  // The derived figures, as the API always said them.
  EXPECT_EQ(j["device"]["capacity_tokens"], s.device.capacity_pages * 16);
  EXPECT_EQ(j["host"]["capacity_tokens"], s.host->pool.capacity_pages * 16);
  EXPECT_EQ(j["device"]["tokens_per_gb"],
            static_cast<int64_t>(1e9 / static_cast<double>(s.device.page_bytes) * 16));
  EXPECT_EQ(j["host"]["tokens_per_gb"],
            static_cast<int64_t>(1e9 / static_cast<double>(s.host->pool.page_bytes) * 16));
  EXPECT_TRUE(j.contains("kv_dtype"));
  EXPECT_EQ(j["hits"]["matched_tokens_total"], s.tree.matched_pages_total * 16);
  EXPECT_EQ(j["device"]["evictable_pages"], s.tree.cached_pages - s.tree.protected_pages);
  EXPECT_EQ(j["evictions"]["auto_unpinned_blocks_by_reason"]["device_room"],
            s.engine.auto_unpinned_blocks - 2);
  EXPECT_EQ(j["host"]["write_policy"], "write_through");
  EXPECT_EQ(j["host"]["mem_layout"], "layer_first");
  EXPECT_EQ(j["storage"]["backend"], "file");
}

TEST(CacheFiguresTest, WithoutHostOrStorageTheirSectionsAreNullAndTheEngineCountsStayInMetrics) {
  CacheState s = state_with_distinct_values();
  s.host.reset();
  s.storage.reset();
  const nlohmann::json j = cache_state_json(s);
  EXPECT_TRUE(j["host"].is_null());
  EXPECT_TRUE(j["storage"].is_null());
  Metrics metrics;
  metrics.set_cache(s);
  const std::string text = metrics.serialize();
  EXPECT_FALSE(sample(text, "strata_host_kv_pages", "state", "total").has_value());
  EXPECT_FALSE(sample(text, "strata_host_kv_pages", "state", "cached").has_value());
  const auto written = sample(text, "strata_tier_events_total", "event", "storage_pages_written");
  ASSERT_TRUE(written.has_value());
  EXPECT_EQ(*written, static_cast<double>(s.engine.storage_pages_written));
}

}  // namespace
}  // namespace strata
