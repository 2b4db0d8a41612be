// `strata bench forward`: the forward pass's prefill and decode throughput, with a
// per-phase breakdown, measured in process on a model preset or a model folder.
//
// Threads: registration and the callback run on the main thread (CLI11); the model uses
// its own compute threads (--threads).
#pragma once

#include <CLI/CLI.hpp>

namespace strata::bench {

// Registers `forward` under `bench`; its callback stores the exit code in `exit_code`
// (0 done, 2 an error).
void add_bench_forward(CLI::App& bench, int& exit_code);

}  // namespace strata::bench
