// The command line of the scenarios that run over HTTP: `strata bench depth-sweep`,
// `strata bench tool-calls`, `strata bench load` and `strata bench cluster`, with the
// options they share (--url or --spawn --model with --server-arg, --out, --seed, --quick,
// --check), and `strata bench make-trace` (an agentic trace for `cluster --trace`,
// agentic_trace.h). The in-process scenarios (`forward`, `tiers`) register themselves;
// bench_command.h gathers them all under the `bench` command.
//
// Threads: registration and the callbacks run on the main thread (CLI11).
#pragma once

#include <CLI/CLI.hpp>

namespace strata::bench {

// Registers the scenarios under `bench`; a scenario's callback stores its exit code in
// `exit_code` (0 passed, 1 a check failed, 2 an error).
void add_bench_scenarios(CLI::App& bench, int& exit_code);

}  // namespace strata::bench
