#include "bench/agentic_trace.h"

#include <algorithm>
#include <cmath>
#include <ostream>
#include <utility>

#include <nlohmann/json.hpp>

#include "bench/text_generator.h"

namespace strata::bench {

namespace {

// "<flag><text>", appended (g++ 12 warns falsely on chains of string +).
std::string flag_message(const char* flag, const std::string& text) {
  std::string m(flag);
  m += text;
  return m;
}

Status check_range(int64_t lo, int64_t hi, int64_t min, const char* lo_flag, const char* hi_flag) {
  if (lo < min) return bad_argument(flag_message(lo_flag, " must be >= " + std::to_string(min)));
  if (hi < lo) return bad_argument(flag_message(hi_flag, std::string(" must be >= ") + lo_flag));
  return {};
}

Status check_positive(double v, const char* flag) {
  if (!std::isfinite(v) || v <= 0) return bad_argument(flag_message(flag, " must be a number > 0"));
  return {};
}

// An exponential draw with the given mean.
double exponential(BenchRng& rng, double mean) {
  return -mean * std::log(1.0 - rng.uniform01());  // uniform01 < 1: finite
}

// The index drawn from weights 1 / (k + 1)^skew, k in [0, n).
int64_t zipf(BenchRng& rng, int64_t n, double skew) {
  double total = 0;
  for (int64_t k = 0; k < n; ++k) total += std::pow(static_cast<double>(k + 1), -skew);
  double x = rng.uniform01() * total;
  for (int64_t k = 0; k < n; ++k) {
    x -= std::pow(static_cast<double>(k + 1), -skew);
    if (x < 0) return k;
  }
  return n - 1;
}

}  // namespace

Status validate(const AgenticTraceOptions& o) {
  if (o.sessions < 1) return bad_argument("--sessions must be >= 1");
  if (o.templates < 1) return bad_argument("--templates must be >= 1");
  if (o.block_tokens < 1) return bad_argument("--block-tokens must be >= 1");
  if (!std::isfinite(o.template_skew) || o.template_skew < 0) {
    return bad_argument("--template-skew must be a number >= 0");
  }
  for (const Status& s : {
           check_range(o.template_tokens_min, o.template_tokens_max, 1, "--template-tokens-min",
                       "--template-tokens-max"),
           check_range(o.task_tokens_min, o.task_tokens_max, 1, "--task-tokens-min",
                       "--task-tokens-max"),
           check_range(o.calls_min, o.calls_max, 1, "--calls-min", "--calls-max"),
           check_range(o.output_tokens_min, o.output_tokens_max, 1, "--output-tokens-min",
                       "--output-tokens-max"),
           check_range(o.tool_tokens_min, o.tool_tokens_max, 1, "--tool-tokens-min",
                       "--tool-tokens-max"),
           check_positive(o.session_rate_per_s, "--session-rate"),
           check_positive(o.tool_seconds_mean, "--tool-seconds"),
           check_positive(o.seconds_per_output_token, "--seconds-per-output-token"),
       }) {
    if (!s) return s;
  }
  if (o.template_tokens_max + o.task_tokens_max > o.max_prompt_tokens) {
    return bad_argument("--max-prompt-tokens must hold the largest template and task (" +
                        std::to_string(o.template_tokens_max + o.task_tokens_max) + " tokens)");
  }
  return {};
}

std::vector<AgenticTraceLine> make_agentic_trace(const AgenticTraceOptions& o) {
  const int64_t bt = o.block_tokens;
  // Templates: their lengths, and the hash ids of their whole blocks, numbered from 0.
  std::vector<int64_t> template_tokens;
  std::vector<int64_t> template_first_id;
  int64_t next_id = 0;
  {
    BenchRng rng(derive_seed(o.seed, "agentic-templates", 0));
    for (int64_t t = 0; t < o.templates; ++t) {
      template_tokens.push_back(rng.uniform_int(o.template_tokens_min, o.template_tokens_max));
      template_first_id.push_back(next_id);
      next_id += template_tokens.back() / bt;
    }
  }
  std::vector<AgenticTraceLine> lines;
  BenchRng arrivals(derive_seed(o.seed, "agentic-arrivals", 0));
  double start_s = 0;
  for (int64_t s = 0; s < o.sessions; ++s) {
    if (s > 0) start_s += exponential(arrivals, 1.0 / o.session_rate_per_s);
    BenchRng rng(derive_seed(o.seed, "agentic-session", static_cast<uint64_t>(s)));
    const int64_t tpl = zipf(rng, o.templates, o.template_skew);
    const int64_t tpl_blocks = template_tokens[static_cast<size_t>(tpl)] / bt;
    const int64_t calls = rng.uniform_int(o.calls_min, o.calls_max);
    int64_t prompt = template_tokens[static_cast<size_t>(tpl)] +
                     rng.uniform_int(o.task_tokens_min, o.task_tokens_max);
    std::vector<int64_t> ids;  // the stream's blocks so far
    double at_s = start_s;
    for (int64_t c = 0; c < calls && prompt <= o.max_prompt_tokens; ++c) {
      const int64_t blocks = (prompt + bt - 1) / bt;
      while (static_cast<int64_t>(ids.size()) < blocks) {
        const auto k = static_cast<int64_t>(ids.size());
        ids.push_back(k < tpl_blocks ? template_first_id[static_cast<size_t>(tpl)] + k : next_id++);
      }
      const int64_t output = rng.uniform_int(o.output_tokens_min, o.output_tokens_max);
      AgenticTraceLine line;
      line.request.timestamp_ms = std::round(at_s * 1000.0);
      line.request.input_tokens = prompt;
      line.request.output_tokens = output;
      line.request.hash_ids = ids;
      line.session = "agent-" + std::to_string(s);
      line.call = c;
      lines.push_back(std::move(line));
      at_s += static_cast<double>(output) * o.seconds_per_output_token +
              exponential(rng, o.tool_seconds_mean);
      prompt += output + rng.uniform_int(o.tool_tokens_min, o.tool_tokens_max);
    }
  }
  std::stable_sort(lines.begin(), lines.end(),
                   [](const AgenticTraceLine& a, const AgenticTraceLine& b) {
                     return a.request.timestamp_ms < b.request.timestamp_ms;
                   });
  for (size_t i = 0; i < lines.size(); ++i) lines[i].request.line = static_cast<int64_t>(i) + 1;
  return lines;
}

void write_trace_jsonl(std::ostream& out, const std::vector<AgenticTraceLine>& lines) {
  for (const AgenticTraceLine& l : lines) {
    nlohmann::ordered_json j;
    j["timestamp"] = static_cast<int64_t>(l.request.timestamp_ms);
    j["input_length"] = l.request.input_tokens;
    j["output_length"] = l.request.output_tokens;
    j["hash_ids"] = l.request.hash_ids;
    j["session_id"] = l.session;
    out << j.dump() << '\n';
  }
}

}  // namespace strata::bench
