#!/usr/bin/env bash
# The two failure modes of the seed 003_* (issue 33), reproduced on simulated workers
# (profiles/h100-qwen3-8b.json) with `strata bench cluster`, and the default policy against them:
#
# Q2 (a cold worker never gets a session): the agentic workload, every session opening with
#   one shared boilerplate prompt, under `default-no-floor` (the default policy with
#   --load-floor-bonus 0: the cached boilerplate pulls each new session onto a warm worker)
#   and `default` (the load floor spreads new sessions). Reported: sessions per worker.
# Q1 (a saturated worker evicting in storms), twice:
#   - in the seed's setting (q1s): the agentic workload of Q2, more sessions at a time, on
#     workers whose KV pool holds a fair share of the live sessions but not all of them, under
#     `precise` (no floor, no backpressure: the boilerplate pulls every session onto one
#     worker), `default-no-floor` (backpressure alone: a saturated worker gets no new session
#     while another can take it) and `default` (floor and backpressure). The cluster has room
#     for the load; only its placement can saturate a worker. Reported: sessions and pages
#     evicted per worker, the cache hit (what the evictions cost), refusals, failures.
#   - overloaded (q1): a trace replayed faster than the workers' small KV pools hold, under
#     `precise` (no backpressure: every request is sent at once) and `default` (backpressure:
#     the router queues, then answers 429 with Retry-After, which the client honours,
#     --retry-refused). Reported: pages evicted per worker, refusals, requests lost.
# Writes out/bench-seed-003/<q>-s<SEED>/ and prints one line per policy and seed.
#
# Environment (all optional):
#   SEEDS        seeds                                     (default: "1 2 3")
#   PARTS        which runs                                (default: "q2 q1s q1")
#   Q2_WORKERS   workers of Q2                             (default: 4)
#   Q2_SESSIONS  sessions of Q2                            (default: 24)
#   Q1S_WORKERS  workers of Q1 in the seed's setting       (default: 4)
#   Q1S_SESSIONS its sessions                              (default: 64)
#   Q1S_RATE     its new sessions per second               (default: 2)
#   Q1S_KV       its workers' --worker-kv-tokens           (default: 4096)
#   Q1_WORKERS   workers of Q1                             (default: 8)
#   Q1_KV        each Q1 worker's --worker-kv-tokens       (default: 200000)
#   Q1_LIMIT     Q1's --trace-limit                        (default: 400)
#   Q1_SCALE     Q1's --time-scale                         (default: 0.05)
#   Q1_ROUTER    Q1's router arguments                     (default: "--queue-timeout-s 5")
#   TRACE        Q1's trace   (default: ../shared/traces/mooncake_synthetic_trace.jsonl)
#   BUILD_DIR    build folder                              (default: build)
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
read -r -a seeds <<<"${SEEDS:-1 2 3}"
parts=" ${PARTS:-q2 q1s q1} "
strata=${STRATA:-${BUILD_DIR:-build}/strata}
trace=${TRACE:-../shared/traces/mooncake_synthetic_trace.jsonl}
status=0
scripts/make-sim-model.sh || exit 2
mkdir -p out/bench-seed-003

common=(bench cluster --spawn --simulate profiles/h100-qwen3-8b.json --model models/qwen3-8b-sim)

report() {  # results.json q seed
  python3 - "$@" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
for w in r["workloads"]:
    for p in w["policies"]:
        ev = p.get("evicted_pages_per_worker") or []
        print("%s seed %s %-16s sessions/worker %-16s hit %5.1f %%  evicted pages/worker %-24s "
              "max %6s  429 %3d  retried %3d  queued %3d  failed %d of %d  TTFT p99 %.2f s"
              % (sys.argv[2], sys.argv[3], p["name"], p.get("sessions_per_worker"),
                 100 * p["cache_hit_fraction"], ev if len(ev) <= 8 else "%d workers" % len(ev),
                 max(ev) if ev else "-", p["router_rejected"], p.get("refused_retries", 0),
                 p["router_queue"]["queued"], p["failed_requests"], p["requests"],
                 p["ttft_s"]["p99"] or float("nan")))
PY
}

for seed in "${seeds[@]}"; do
  if [[ $parts == *" q2 "* ]]; then
  dir=out/bench-seed-003/q2-s$seed
  rm -rf "$dir"
  "$strata" "${common[@]}" --workers "${Q2_WORKERS:-4}" --workloads agentic \
    --sessions "${Q2_SESSIONS:-24}" --policies default-no-floor,default --seed "$seed" \
    --out "$dir" >"$dir.log" 2>&1 || { status=1; echo "== Q2 seed $seed: exit $? ($dir.log)"; }
  [[ -f $dir/results.json ]] && report "$dir/results.json" Q2 "$seed"
  fi

  if [[ $parts == *" q1s "* ]]; then
  dir=out/bench-seed-003/q1s-s$seed
  rm -rf "$dir"
  "$strata" "${common[@]}" --workers "${Q1S_WORKERS:-4}" --workloads agentic \
    --sessions "${Q1S_SESSIONS:-64}" --session-rate "${Q1S_RATE:-2}" \
    --worker-kv-tokens "${Q1S_KV:-4096}" --policies precise,default-no-floor,default \
    --seed "$seed" --out "$dir" >"$dir.log" 2>&1 || { status=1; echo "== Q1s seed $seed: exit $? ($dir.log)"; }
  [[ -f $dir/results.json ]] && report "$dir/results.json" Q1s "$seed"
  fi

  if [[ $parts == *" q1 "* ]]; then
  dir=out/bench-seed-003/q1-s$seed
  rm -rf "$dir"
  "$strata" "${common[@]}" --workers "${Q1_WORKERS:-8}" --worker-kv-tokens "${Q1_KV:-200000}" \
    --trace "$trace" --trace-limit "${Q1_LIMIT:-400}" --time-scale "${Q1_SCALE:-0.05}" \
    --policies precise,default --retry-refused --router-arg="${Q1_ROUTER:---queue-timeout-s 5}" \
    --seed "$seed" \
    --out "$dir" >"$dir.log" 2>&1 || { status=1; echo "== Q1 seed $seed: exit $? ($dir.log)"; }
  [[ -f $dir/results.json ]] && report "$dir/results.json" Q1 "$seed"
  fi
done
exit $status
