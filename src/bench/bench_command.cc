#include "bench/bench_command.h"

#include "bench/bench_cli.h"
#include "bench/forward.h"
#include "bench/tiers.h"

namespace strata::bench {

void add_bench_command(CLI::App& app, int& exit_code) {
  CLI::App* bench = app.add_subcommand("bench", "Benchmark scenarios");
  bench->require_subcommand(1);
  add_bench_forward(*bench, exit_code);
  add_bench_tiers(*bench, exit_code);
  add_bench_scenarios(*bench, exit_code);
}

}  // namespace strata::bench
