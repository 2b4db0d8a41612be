// `strata bench ...`: the benchmark scenarios of the `strata` binary, one sub-subcommand
// each. In process: `forward` (the model's forward pass) and `tiers` (the engine's cache
// tiers). Over HTTP against a spawned or running server: `depth-sweep`, `tool-calls` and
// `load` (bench_cli.h).
//
// Threads: registration and the callbacks run on the main thread (CLI11).
#pragma once

#include <CLI/CLI.hpp>

namespace strata::bench {

// Adds the `bench` subcommand with every scenario under it to `app`. The scenario that
// runs stores its exit code in `exit_code`, which must outlive the parse.
void add_bench_command(CLI::App& app, int& exit_code);

}  // namespace strata::bench
