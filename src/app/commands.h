// The subcommands of the `strata` binary. Each adds itself to the CLI11 app; the
// callback it installs runs the command and sets the exit code through `exit_code`.
// `strata bench` lives with the benchmarks (bench/bench_command.h).
#pragma once

#include <CLI/CLI.hpp>

namespace strata::app {

// Each function registers one subcommand. `exit_code` receives the command's result.
void add_block_hashes_command(CLI::App& app, int& exit_code);
void add_make_model_command(CLI::App& app, int& exit_code);
void add_serve_command(CLI::App& app, int& exit_code);
void add_route_command(CLI::App& app, int& exit_code);

}  // namespace strata::app
