#!/usr/bin/env bash
# Our own agentic trace (issue 33) through the cluster benchmark: for each seed,
# `strata bench make-trace` writes out/bench-agentic-trace/agentic-s<SEED>.jsonl (agent
# sessions on shared system prompts, prompts growing call by call: src/bench/agentic_trace.h),
# then scripts/bench-cluster-trace.sh replays it on simulated workers behind each policy
# (run folders out/bench-cluster-trace/w<W>-s<SEED>-agentic, copies under
# docs/bench/cluster-trace/).
#
# Environment (all optional; the rest as scripts/bench-cluster-trace.sh):
#   SEEDS        seeds: of the trace and of the replay   (default: "1 2 3")
#   WORKERS      simulated workers                       (default: 64)
#   SCALE        --time-scale of the replay              (default: 1)
#   DILATION     --simulate-time-scale of the workers    (default: 4: every step 4x its profile's
#                time, and arrivals 4x slower, so that two cores keep up; divide times by it)
#   TRACE_ARGS   `make-trace` options                    (default: 200 sessions starting at 16 a
#                second, 4-16 calls each of 32-160 output tokens, 1 s of tool time between
#                calls: about 60 calls/s at the peak, round-robin's saturation at 64 workers
#                on the H100 profile, docs/benchmarks.md)
#   POLICIES     policies                                (default: all five)
#   BUILD_DIR    build folder                            (default: build)
#   TAG_SUFFIX   appended to the run folders' "-agentic", so that a rerun of some policies
#                does not overwrite an earlier run's files (e.g. "-floor")
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
read -r -a seeds <<<"${SEEDS:-1 2 3}"
workers=${WORKERS:-64}
scale=${SCALE:-1}
dilation=${DILATION:-4}
strata=${STRATA:-${BUILD_DIR:-build}/strata}
status=0
mkdir -p out/bench-agentic-trace
for seed in "${seeds[@]}"; do
  trace=out/bench-agentic-trace/agentic-s$seed.jsonl
  # shellcheck disable=SC2086 # TRACE_ARGS is split on purpose
  "$strata" bench make-trace --out "$trace" --seed "$seed" ${TRACE_ARGS:---sessions 200 \
    --session-rate 16 --calls-min 4 --calls-max 16 --tool-seconds 1 --output-tokens-min 32 \
    --output-tokens-max 160} || exit 2
  # The arrivals stretched by the dilation: the same trace in slow motion.
  WORKERS=$workers SCALES=$(python3 -c "print($scale * $dilation)") SEEDS=$seed LIMIT=0 \
    TRACE=$trace TAG=-agentic${TAG_SUFFIX:-} \
    ARGS="--trace-sessions --server-arg=--simulate-time-scale --server-arg=$dilation ${ARGS:-}" \
    scripts/bench-cluster-trace.sh || status=1
done
exit $status
