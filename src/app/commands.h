// The subcommands of the `strata` binary. Each adds itself to the CLI11 app; the
// callback it installs runs the command and sets the exit code through `exit_code`.
#pragma once

#include <CLI/CLI.hpp>

namespace strata::app {

// Each function registers one subcommand. `exit_code` receives the command's result.
void add_block_hashes_command(CLI::App& app, int& exit_code);
void add_make_model_command(CLI::App& app, int& exit_code);
void add_bench_command(CLI::App& app, int& exit_code);
// `strata bench tiers` (registered by add_bench_command).
void add_bench_tiers(CLI::App& bench, int& exit_code);
void add_serve_command(CLI::App& app, int& exit_code);

}  // namespace strata::app
