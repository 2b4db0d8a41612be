#!/usr/bin/env bash
# Replays a Mooncake-format trace through `strata bench cluster --trace` (issue 33) on
# simulated workers: profiles/h100-qwen3-8b.json (Qwen3-8B on one H100, derived from the
# datasheet) behind one `strata route` per policy, for each worker count and seed. Each run
# writes out/bench-cluster-trace/w<W>-s<SEED><TAG>/ (results.json with every request, summary.md,
# charts, logs) and copies its summary, charts and results.json without the per-request
# records to docs/bench/cluster-trace/w<W>-s<SEED><TAG>/.
#
# The workers serve models/qwen3-8b-sim: Qwen3-8B's config.json (context 40,960 tokens,
# vocabulary 151,936) and the Qwen3 tokenizer, no weights (a simulated worker reads none).
#
# Environment (all optional):
#   WORKERS     worker counts                    (default: "16 32 64")
#   SCALES      --time-scale per worker count    (default: "0.2 0.1 0.05", one per WORKERS)
#   SEEDS       seeds                            (default: 1)
#   LIMIT       --trace-limit                    (default: 1000)
#   TRACE       the trace                        (default: ../shared/traces/mooncake_synthetic_trace.jsonl)
#   POLICIES    policies, comma-separated        (default: all five)
#   ARGS        more arguments for the scenario  (e.g. "--check")
#   TAG         a suffix of the run folders      (e.g. "-dilated4")
#   BUILD_DIR   build folder                     (default: build)
#   STRATA      the strata binary                (default: $BUILD_DIR/strata)
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

read -r -a workers <<<"${WORKERS:-16 32 64}"
read -r -a scales <<<"${SCALES:-0.2 0.1 0.05}"
read -r -a seeds <<<"${SEEDS:-1}"
limit=${LIMIT:-1000}
trace=${TRACE:-../shared/traces/mooncake_synthetic_trace.jsonl}
policies=${POLICIES:-round-robin,least-loaded,approximate,precise,default}
strata=${STRATA:-${BUILD_DIR:-build}/strata}
model=models/qwen3-8b-sim  # scripts/make-sim-model.sh
status=0

if [[ ${#scales[@]} != "${#workers[@]}" ]]; then
  echo "SCALES needs one time scale per worker count" >&2
  exit 2
fi
scripts/make-sim-model.sh || exit 2

for i in "${!workers[@]}"; do
  w=${workers[$i]}
  scale=${scales[$i]}
  for seed in "${seeds[@]}"; do
    run_dir=out/bench-cluster-trace/w$w-s$seed${TAG:-}
    docs=docs/bench/cluster-trace/w$w-s$seed${TAG:-}
    rm -rf "$run_dir"
    echo "== $w workers, time scale $scale, seed $seed (load: $(cut -d' ' -f1-3 /proc/loadavg))"
    # shellcheck disable=SC2086 # ARGS is split on purpose
    "$strata" bench cluster --spawn --simulate profiles/h100-qwen3-8b.json --model "$model" \
      --workers "$w" --trace "$trace" --trace-limit "$limit" --time-scale "$scale" \
      --policies "$policies" --seed "$seed" --out "$run_dir" ${ARGS:-}
    rc=$?
    [[ $rc != 0 ]] && status=1 && echo "== exited with $rc (see $run_dir/logs)"
    if [[ -f $run_dir/results.json ]]; then
      mkdir -p "$docs"
      rm -f "$docs"/*
      cp "$run_dir"/summary.md "$run_dir"/*.svg "$docs"/ 2>/dev/null
      python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); r.pop("phases",None); json.dump(r,open(sys.argv[2],"w"),indent=1)' \
        "$run_dir/results.json" "$docs/results.json"
    fi
  done
done
exit $status
