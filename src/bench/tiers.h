// `strata bench tiers`: the TTFT of a prompt restored from each tier of the hierarchical
// cache (device, host, file store, Redis) and of a paused tool session, measured on the
// engine itself in process (no HTTP in the way).
//
// Threads: registration and the callback run on the main thread (CLI11); the engines it
// creates run their own scheduler threads.
#pragma once

#include <CLI/CLI.hpp>

namespace strata::bench {

// Registers `tiers` under `bench`; its callback stores the exit code in `exit_code`
// (0 done, 1 an error).
void add_bench_tiers(CLI::App& bench, int& exit_code);

}  // namespace strata::bench
