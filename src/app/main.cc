// strata: one binary, one subcommand per part of the product.
#include <CLI/CLI.hpp>

#include "app/commands.h"
#include "bench/bench_command.h"

int main(int argc, char** argv) {
  CLI::App app{"Strata: an LLM serving engine whose KV cache is a first-class resource"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "strata 0.1.0");
  int exit_code = 0;
  strata::app::add_serve_command(app, exit_code);
  strata::app::add_route_command(app, exit_code);
  strata::app::add_block_hashes_command(app, exit_code);
  strata::app::add_make_model_command(app, exit_code);
  strata::bench::add_bench_command(app, exit_code);
  CLI11_PARSE(app, argc, argv);
  return exit_code;
}
