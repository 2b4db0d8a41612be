#include "bench/cluster_trace.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <unordered_map>
#include <utility>

#include <nlohmann/json.hpp>

#include "bench/text_generator.h"
#include "common/check.h"

namespace strata::bench {

namespace {

using json = nlohmann::ordered_json;  // as the module's other files (one unity unit)

std::unexpected<Error> line_error(int64_t line, const std::string& message) {
  return bad_argument("line " + std::to_string(line) + ": " + message);
}

// An integer field, in [min, INT64_MAX].
Result<int64_t> integer_field(const json& j, const char* name, int64_t line, int64_t min) {
  const auto it = j.find(name);
  if (it == j.end()) return line_error(line, std::string("missing '") + name + "'");
  if (!it->is_number_integer() ||
      (it->is_number_unsigned() &&
       it->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))) {
    return line_error(
        line, std::string("'") + name + "' must be an integer, got " + it->dump().substr(0, 40));
  }
  const auto v = it->get<int64_t>();
  if (v < min) {
    return line_error(line, std::string("'") + name + "' must be >= " + std::to_string(min) +
                                ", got " + std::to_string(v));
  }
  return v;
}

}  // namespace

Result<TraceRequest> parse_trace_line(std::string_view text, int64_t line, int64_t block_tokens) {
  if (block_tokens < 1) return bad_argument("--trace-block-tokens must be >= 1");
  const json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return line_error(line, "not a JSON object: " + std::string(text.substr(0, 60)));
  }
  TraceRequest r;
  r.line = line;
  const auto ts = j.find("timestamp");
  if (ts == j.end()) return line_error(line, "missing 'timestamp'");
  if (!ts->is_number() || !std::isfinite(ts->get<double>()) || ts->get<double>() < 0) {
    return line_error(
        line, "'timestamp' must be a number of milliseconds >= 0, got " + ts->dump().substr(0, 40));
  }
  r.timestamp_ms = ts->get<double>();
  auto input = integer_field(j, "input_length", line, 1);
  if (!input) return std::unexpected(input.error());
  r.input_tokens = *input;
  auto output = integer_field(j, "output_length", line, 1);
  if (!output) return std::unexpected(output.error());
  r.output_tokens = *output;
  const auto ids = j.find("hash_ids");
  if (ids == j.end()) return line_error(line, "missing 'hash_ids'");
  if (!ids->is_array()) return line_error(line, "'hash_ids' must be an array of integers");
  const int64_t needed = (r.input_tokens + block_tokens - 1) / block_tokens;
  if (static_cast<int64_t>(ids->size()) < needed) {
    return line_error(line, std::to_string(ids->size()) + " hash_ids cover " +
                                std::to_string(static_cast<int64_t>(ids->size()) * block_tokens) +
                                " tokens; input_length " + std::to_string(r.input_tokens) +
                                " needs " + std::to_string(needed) + " blocks of " +
                                std::to_string(block_tokens));
  }
  r.hash_ids.reserve(static_cast<size_t>(needed));
  for (int64_t i = 0; i < needed; ++i) {
    const json& id = (*ids)[static_cast<size_t>(i)];
    if (!id.is_number_integer() ||
        (id.is_number_unsigned() &&
         id.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))) {
      return line_error(line, "hash_ids[" + std::to_string(i) + "] must be an integer, got " +
                                  id.dump().substr(0, 40));
    }
    r.hash_ids.push_back(id.get<int64_t>());
  }
  if (const auto session = j.find("session_id"); session != j.end()) {
    if (session->is_string()) {
      r.session = session->get<std::string>();
    } else if (session->is_number_integer()) {
      r.session = session->dump();
    } else {
      return line_error(line, "'session_id' must be a string or an integer, got " +
                                  session->dump().substr(0, 40));
    }
    if (r.session.empty()) return line_error(line, "'session_id' must not be empty");
  }
  return r;
}

Result<std::vector<TraceRequest>> parse_trace(std::istream& in, const std::string& name,
                                              int64_t block_tokens, int64_t limit) {
  std::vector<TraceRequest> out;
  std::string text;
  int64_t line = 0;
  while ((limit <= 0 || static_cast<int64_t>(out.size()) < limit) && std::getline(in, text)) {
    ++line;
    if (!text.empty() && text.back() == '\r') text.pop_back();
    if (text.find_first_not_of(" \t") == std::string::npos) continue;
    auto r = parse_trace_line(text, line, block_tokens);
    if (!r) return bad_argument("trace " + name + ": " + r.error().message);
    out.push_back(std::move(*r));
  }
  if (in.bad()) return make_error(ErrorCode::kIoError, "trace " + name + ": read error");
  if (out.empty()) return bad_argument("trace " + name + ": no requests");
  std::stable_sort(out.begin(), out.end(), [](const TraceRequest& a, const TraceRequest& b) {
    return a.timestamp_ms < b.timestamp_ms;
  });
  return out;
}

Result<std::vector<TraceRequest>> load_trace(const std::filesystem::path& path,
                                             int64_t block_tokens, int64_t limit) {
  std::ifstream in(path);
  if (!in) return make_error(ErrorCode::kNotFound, "cannot open the trace " + path.string());
  return parse_trace(in, path.string(), block_tokens, limit);
}

TraceTokens::TraceTokens(uint64_t seed, int64_t block_tokens, std::vector<int32_t> vocabulary)
    : seed_(seed),
      block_tokens_(std::max<int64_t>(1, block_tokens)),
      vocabulary_(std::move(vocabulary)) {
  std::sort(vocabulary_.begin(), vocabulary_.end());
  vocabulary_.erase(std::unique(vocabulary_.begin(), vocabulary_.end()), vocabulary_.end());
  STRATA_CHECK(vocabulary_.size() >= 2);
}

std::vector<int32_t> TraceTokens::block(int64_t hash_id) const {
  BenchRng rng(derive_seed(seed_, "trace-block", static_cast<uint64_t>(hash_id)));
  std::vector<int32_t> out(static_cast<size_t>(block_tokens_));
  const auto top = static_cast<int64_t>(vocabulary_.size()) - 1;
  for (int32_t& t : out) t = vocabulary_[static_cast<size_t>(rng.uniform_int(0, top))];
  return out;
}

std::vector<int32_t> TraceTokens::prompt(const TraceRequest& r) const {
  std::vector<int32_t> out;
  out.reserve(static_cast<size_t>(r.input_tokens));
  for (int64_t id : r.hash_ids) {
    const std::vector<int32_t> b = block(id);
    const auto take =
        std::min<int64_t>(block_tokens_, r.input_tokens - static_cast<int64_t>(out.size()));
    if (take <= 0) break;
    out.insert(out.end(), b.begin(), b.begin() + take);
  }
  return out;
}

double TraceIdeal::block_fraction() const {
  return blocks > 0 ? static_cast<double>(seen_blocks) / static_cast<double>(blocks) : 0;
}

double TraceIdeal::token_fraction() const {
  return prompt_tokens > 0 ? static_cast<double>(hit_tokens) / static_cast<double>(prompt_tokens)
                           : 0;
}

TraceIdeal trace_ideal_hit(std::span<const TraceRequest> requests, int64_t block_tokens,
                           int64_t page_tokens) {
  STRATA_CHECK(block_tokens >= 1 && page_tokens >= 1);
  TraceIdeal ideal;
  // Per hash id: the most tokens of its block that a request so far brought.
  std::unordered_map<int64_t, int64_t> seen_tokens;
  for (const TraceRequest& r : requests) {
    int64_t hit = 0;
    bool run = true;
    for (size_t i = 0; i < r.hash_ids.size(); ++i) {
      const int64_t n =
          std::min(block_tokens, r.input_tokens - static_cast<int64_t>(i) * block_tokens);
      if (n <= 0) break;
      ++ideal.blocks;
      auto [it, inserted] = seen_tokens.try_emplace(r.hash_ids[i], 0);
      if (!inserted) ++ideal.seen_blocks;
      if (run) {
        hit += std::min(n, it->second);
        run = it->second >= n;
      }
      it->second = std::max(it->second, n);
    }
    hit = hit / page_tokens * page_tokens;
    ideal.prompt_tokens += r.input_tokens;
    ideal.hit_tokens += hit;
    ideal.hit_tokens_per_request.push_back(hit);
  }
  return ideal;
}

TraceFamilies trace_families(std::span<const TraceRequest> requests) {
  TraceFamilies f;
  std::unordered_map<int64_t, int64_t> by_block;        // first hash id -> family
  std::unordered_map<std::string, int64_t> by_session;  // session_id -> family
  for (const TraceRequest& r : requests) {
    const auto add = [&f](auto emplaced) {
      if (emplaced.second) ++f.count;
      f.family.push_back(emplaced.first->second);
      f.first.push_back(emplaced.second);
    };
    if (r.session.empty()) {
      add(by_block.try_emplace(r.hash_ids.empty() ? -1 : r.hash_ids.front(), f.count));
    } else {
      add(by_session.try_emplace(r.session, f.count));
    }
  }
  return f;
}

}  // namespace strata::bench
