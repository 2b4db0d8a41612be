#!/usr/bin/env bash
# Router replicas sharing session bindings (issue 33): the same trace through one router and
# through three replicas of it in front of the same simulated workers, the replicas sharing
# bindings through a private redis-server; then three replicas of which the first is killed
# (SIGKILL) halfway through the arrivals. Every request carries its prefix family as its
# session (--trace-sessions); requests go through the replicas in turn, as behind an L4
# balancer, and a request whose replica is gone is sent through the next one.
# Writes out/bench-router-replicas/<config>-s<SEED>/ and prints one line per run: the hit
# fraction (of the prompt tokens, and of the trace's ideal), failed requests, failovers.
#
# Environment (all optional):
#   WORKERS   simulated workers             (default: 16)
#   SCALE     --time-scale                  (default: 0.4)
#   SEEDS     seeds                         (default: "1 2 3")
#   LIMIT     --trace-limit                 (default: 1000)
#   TRACE     the trace                     (default: ../shared/traces/mooncake_synthetic_trace.jsonl)
#   CONFIGS   which runs                    (default: "one-router three-replicas three-one-killed")
#   BUILD_DIR build folder                  (default: build)
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

workers=${WORKERS:-16}
scale=${SCALE:-0.4}
read -r -a seeds <<<"${SEEDS:-1 2 3}"
limit=${LIMIT:-1000}
trace=${TRACE:-../shared/traces/mooncake_synthetic_trace.jsonl}
strata=${STRATA:-${BUILD_DIR:-build}/strata}
status=0

# The simulated workers' model folder (Qwen3-8B's config and tokenizer, no weights).
scripts/make-sim-model.sh || exit 2
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no >/dev/null 2>&1 &
redis_pid=$!
trap 'kill $redis_pid 2>/dev/null' EXIT
for _ in $(seq 50); do
  redis-cli -p "$port" ping >/dev/null 2>&1 && break
  sleep 0.1
done

run() {  # name seed args...
  local name=$1 seed=$2
  shift 2
  local dir=out/bench-router-replicas/$name-s$seed
  rm -rf "$dir"
  "$strata" bench cluster --spawn --simulate profiles/h100-qwen3-8b.json \
    --model models/qwen3-8b-sim --workers "$workers" --trace "$trace" --trace-limit "$limit" \
    --time-scale "$scale" --policies default --trace-sessions --seed "$seed" --out "$dir" \
    "$@" >"$dir.log" 2>&1 || { status=1; echo "== $name seed $seed failed (see $dir.log)"; }
  python3 - "$dir/results.json" "$name" "$seed" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
p = [w for w in r["workloads"] if w["name"] == "trace"][0]["policies"][0]
# A request sent again through another replica finds its own first attempt's prefill
# cached: the hit over the requests sent once is the one comparable with the other runs.
once = [q for q in r["phases"][0]["requests"] if q["ok"] and not q.get("router_failovers")]
hit_once = sum(q["cached_tokens"] for q in once) / max(1, sum(q["prompt_tokens"] for q in once))
ideal_once = sum(q["ideal_hit_tokens"] for q in once) / max(1, sum(q["prompt_tokens"] for q in once))
killed = p["router_killed_at_s"]
print("%-16s seed %s: hit %.2f %% (%.3f of the ideal %.2f %%); sent once: %.2f %% of %.2f %% "
      "(%.3f); %d of %d failed, %d failovers, TTFT p50 %.0f ms p99 %.0f ms, replicas %d%s"
      % (sys.argv[2], sys.argv[3], 100 * p["cache_hit_fraction"], p["hit_of_ideal"],
         100 * p["ideal_hit_fraction"], 100 * hit_once, 100 * ideal_once,
         hit_once / ideal_once if ideal_once else float("nan"), p["failed_requests"],
         p["requests"], p["router_failovers"], 1000 * p["ttft_s"]["p50"],
         1000 * p["ttft_s"]["p99"], p["router_replicas"],
         ", first killed at %.1f s" % killed if killed is not None else ""))
PY
}

mkdir -p out/bench-router-replicas
echo "== $workers simulated workers, $limit requests of $trace at time scale $scale (load: $(cut -d' ' -f1-3 /proc/loadavg))"
configs=" ${CONFIGS:-one-router three-replicas three-one-killed} "
for seed in "${seeds[@]}"; do
  [[ $configs == *" one-router "* ]] && run one-router "$seed"
  [[ $configs == *" three-replicas "* ]] &&
    run three-replicas "$seed" --routers 3 --session-store "redis://127.0.0.1:$port"
  [[ $configs == *" three-one-killed "* ]] &&
    run three-one-killed "$seed" --routers 3 --session-store "redis://127.0.0.1:$port" \
      --kill-router-at 0.5
done
exit $status
