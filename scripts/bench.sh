#!/usr/bin/env bash
# Runs the micro-benchmarks and the forward-pass benchmark whose numbers are recorded in
# docs/benchmarks.md, and prints them. The machine, the build and the load matter: run on
# an idle machine and compare CPU times.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
scripts/install-deps.sh >/dev/null
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j "$(nproc)" >/dev/null
echo "== machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores"
args=(--benchmark_repetitions=3 --benchmark_report_aggregates_only=true)
echo "== radix tree (src/bench/micro/radix_tree_bench.cc)"
build/src/bench/micro/bench_radix_tree "${args[@]}" 2>/dev/null | grep -E "median|Benchmark"
for b in bench_tokenizer bench_jinja; do
  if [[ -x build/src/bench/micro/$b ]]; then
    echo "== $b"
    build/src/bench/micro/$b "${args[@]}" 2>/dev/null | grep -E "median|Benchmark"
  fi
done
echo "== forward pass (strata bench forward: bench preset, llama, F32, 2 threads)"
build/strata bench forward --threads 2
