#include "bench/cluster_workload.h"

#include <algorithm>
#include <cmath>
#include <utility>

namespace strata::bench {

namespace {

Status token_range(const char* what, int64_t lo, int64_t hi) {
  if (lo < 1 || hi < lo) {
    return make_error(ErrorCode::kInvalidArgument,
                      std::string(what) + " token range must satisfy 1 <= min <= max, got " +
                          std::to_string(lo) + ".." + std::to_string(hi));
  }
  return {};
}

}  // namespace

std::vector<double> poisson_arrivals(BenchRng& rng, double rate_per_s, int64_t count) {
  std::vector<double> out;
  out.reserve(static_cast<size_t>(std::max<int64_t>(count, 0)));
  double t = 0;
  for (int64_t i = 0; i < count; ++i) {
    // Inverse transform of the exponential; 1 - u is in (0, 1], so the log is finite.
    t += -std::log(1.0 - rng.uniform01()) / rate_per_s;
    out.push_back(t);
  }
  return out;
}

Status validate(const SharedPrefixShape& s) {
  if (s.groups < 1) return make_error(ErrorCode::kInvalidArgument, "--groups must be >= 1");
  if (s.users_per_group < 1) {
    return make_error(ErrorCode::kInvalidArgument, "--users-per-group must be >= 1");
  }
  if (s.prefix_tokens < 16) {
    return make_error(ErrorCode::kInvalidArgument, "shared prefixes must be >= 16 tokens");
  }
  if (auto st = token_range("question", s.question_min_tokens, s.question_max_tokens); !st) {
    return st;
  }
  if (s.rates_per_s.empty()) return make_error(ErrorCode::kInvalidArgument, "--rates is empty");
  for (double r : s.rates_per_s) {
    if (!(r > 0) || r > 1000) {
      return make_error(ErrorCode::kInvalidArgument, "--rates must be in (0, 1000] per second");
    }
  }
  if (s.requests_per_rate < 1) {
    return make_error(ErrorCode::kInvalidArgument, "--requests-per-rate must be >= 1");
  }
  return {};
}

int64_t shared_prefix_tokens(double kv_fraction, int32_t workers, int64_t pool_tokens,
                             int32_t groups) {
  const double total =
      kv_fraction * static_cast<double>(workers) * static_cast<double>(pool_tokens);
  const auto each = static_cast<int64_t>(std::floor(total / std::max(1, groups)));
  return std::max<int64_t>(64, each);
}

Result<SharedPrefixWorkload> make_shared_prefix_workload(uint64_t seed,
                                                         const SharedPrefixShape& shape,
                                                         const TokenCounter& counter) {
  if (auto st = validate(shape); !st) return std::unexpected(st.error());
  SharedPrefixWorkload w;
  w.shape = shape;
  for (int32_t g = 0; g < shape.groups; ++g) {
    TextGenerator gen(derive_seed(seed, "cluster-prefix", static_cast<uint64_t>(g)), counter);
    auto text = gen.text(shape.prefix_tokens);
    if (!text) return std::unexpected(text.error());
    w.prefixes.push_back(std::move(*text));
  }
  for (size_t level = 0; level < shape.rates_per_s.size(); ++level) {
    BenchRng rng(derive_seed(seed, "cluster-arrivals", level));
    const std::vector<double> arrivals =
        poisson_arrivals(rng, shape.rates_per_s[level], shape.requests_per_rate);
    std::vector<SharedPrefixRequest> requests;
    for (int64_t i = 0; i < shape.requests_per_rate; ++i) {
      SharedPrefixRequest r;
      r.level = static_cast<int32_t>(level);
      r.index = i;
      r.arrival_s = arrivals[static_cast<size_t>(i)];
      r.group = static_cast<int32_t>(rng.uniform_int(0, shape.groups - 1));
      r.user = static_cast<int32_t>(rng.uniform_int(0, shape.users_per_group - 1));
      // A question names its user, so that two users' questions never coincide.
      TextGenerator gen(derive_seed(seed, "cluster-question", level * 1'000'000 + i), counter);
      auto q = gen.text_in_range(shape.question_min_tokens, shape.question_max_tokens);
      if (!q) return std::unexpected(q.error());
      r.question = "User ";
      r.question += std::to_string(r.group);
      r.question += ".";
      r.question += std::to_string(r.user);
      r.question += ": ";
      r.question += q->text;
      r.question_tokens = q->tokens;
      requests.push_back(std::move(r));
    }
    w.levels.push_back(std::move(requests));
  }
  return w;
}

nlohmann::ordered_json shared_prefix_messages(const SharedPrefixWorkload& w,
                                              const SharedPrefixRequest& r) {
  using ojson = nlohmann::ordered_json;
  return ojson::array(
      {ojson{{"role", "system"}, {"content", w.prefixes[static_cast<size_t>(r.group)].text}},
       ojson{{"role", "user"}, {"content", r.question}}});
}

Status validate(const AgenticShape& s) {
  if (s.sessions < 1) return make_error(ErrorCode::kInvalidArgument, "--sessions must be >= 1");
  if (!(s.session_rate_per_s > 0)) {
    return make_error(ErrorCode::kInvalidArgument, "--session-rate must be > 0");
  }
  if (s.boilerplate_tokens < 16) {
    return make_error(ErrorCode::kInvalidArgument, "--boilerplate-tokens must be >= 16");
  }
  if (auto st = token_range("task", s.task_min_tokens, s.task_max_tokens); !st) return st;
  if (auto st = token_range("tool result", s.tool_result_min_tokens, s.tool_result_max_tokens);
      !st) {
    return st;
  }
  if (s.tool_calls < 0) return make_error(ErrorCode::kInvalidArgument, "--tool-calls must be >= 0");
  if (s.pause_min_s < 0 || s.pause_max_s < s.pause_min_s) {
    return make_error(ErrorCode::kInvalidArgument, "tool pauses need 0 <= MIN <= MAX");
  }
  return {};
}

Result<AgenticWorkload> make_agentic_workload(uint64_t seed, const std::string& stream,
                                              const AgenticShape& shape,
                                              const TokenCounter& counter) {
  if (auto st = validate(shape); !st) return std::unexpected(st.error());
  AgenticWorkload w;
  w.shape = shape;
  TextGenerator boiler(derive_seed(seed, "cluster-boilerplate", 0), counter);
  auto b = boiler.text(shape.boilerplate_tokens);
  if (!b) return std::unexpected(b.error());
  w.boilerplate = std::move(*b);
  BenchRng arrivals_rng(derive_seed(seed, stream + "-arrivals", 0));
  const std::vector<double> arrivals =
      poisson_arrivals(arrivals_rng, shape.session_rate_per_s, shape.sessions);
  for (int32_t i = 0; i < shape.sessions; ++i) {
    AgentSession s;
    s.index = i;
    s.arrival_s = arrivals[static_cast<size_t>(i)];
    TextGenerator gen(derive_seed(seed, stream + "-session", static_cast<uint64_t>(i)), counter);
    auto task = gen.text_in_range(shape.task_min_tokens, shape.task_max_tokens);
    if (!task) return std::unexpected(task.error());
    s.task = "Task ";
    s.task += std::to_string(i);
    s.task += ": ";
    s.task += task->text;
    for (int32_t c = 0; c < shape.tool_calls; ++c) {
      auto result = gen.text_in_range(shape.tool_result_min_tokens, shape.tool_result_max_tokens);
      if (!result) return std::unexpected(result.error());
      s.tool_results.push_back(std::move(result->text));
      s.pauses_s.push_back(gen.rng().uniform(shape.pause_min_s, shape.pause_max_s));
    }
    w.sessions.push_back(std::move(s));
  }
  return w;
}

}  // namespace strata::bench
