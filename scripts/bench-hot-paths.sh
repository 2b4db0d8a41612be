#!/usr/bin/env bash
# The hot paths' regression guard (issue 56; README, "Benchmarks"): the radix tree's and the
# router's micro-benchmarks, each median against the baseline in docs/bench/hot-paths.json,
# figures more than 25 % worse and targets missed flagged. Run it before a change to cache/
# or router/ lands, on a quiet machine, and again if it flags something (timing is noisy).
#   scripts/bench-hot-paths.sh [--build DIR] [--quick] [--update]
# It builds the three benchmarks in the tree first (build/ by default).
set -euo pipefail
cd "$(dirname "$0")/.."
build=build
args=()
while (($#)); do
  case $1 in
    --build) build=$2; args+=(--build "$2"); shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
cmake --build "$build" -j "$(nproc)" --target bench_radix_tree bench_router_index \
  bench_router_index_scale >/dev/null
exec python3 scripts/hot_paths.py "${args[@]}"
