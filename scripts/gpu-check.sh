#!/usr/bin/env bash
# The GPU checks (docs/cuda.md; issues 30 and 31), in two halves, because the GPU machine
# (the `device` tool's: an H100/H200 with CUDA, PyTorch and CMake, but none of the Debian
# libraries Strata builds against, and nothing downloadable) cannot build Strata itself:
#
#   scripts/gpu-check.sh prepare   here, on a machine with the build's dependencies and
#                                  nvcc (no GPU needed): builds the CUDA tree (build-cuda,
#                                  -DSTRATA_CUDA=ON, cuda_tests only; x86-64-v3, AVX2, not
#                                  this machine's -march=native: the GPU machine's processor
#                                  is another), fails on a register
#                                  spill in any kernel (ptxas -v), and stages what the GPU
#                                  machine runs in .gpu-check/: the test program (CUDA's
#                                  runtime linked in statically) and the shared libraries it
#                                  loads from outside the base system
#   scripts/gpu-check.sh run       on the GPU machine, carrying .gpu-check: every check with
#                                  STRATA_REQUIRE_GPU=1 (a missing GPU fails instead of
#                                  skipping), the output in $OUT (or .gpu-check/results)
#   scripts/gpu-check.sh smoke     the same, short: the device probe and one size of each
#                                  kernel (for reruns within the device time)
#
# With the device tool: add .gpu-check to .git/info/exclude once, run `prepare` here, then
#   run(command="scripts/gpu-check.sh run", carry=[".gpu-check"], timeout_s=300)
# Each check prints what it compared; a failure names the kernel, the shape and the values.
# The checks: the kernels against the CPU engine's code (tests/cuda/cuda_kernels_test.cc),
# the whole forward pass on the GPU against the CPU engine's (tests/cuda/gpu_model_test.cc),
# the KV tiers' copies through CUDA streams, bytes and bandwidth per I/O path and host
# layout (tests/cuda/cuda_copy_test.cc), and the engine with the host tier on the GPU
# (tests/cuda/gpu_engine_test.cc: outputs after a load-back, overlapped or not, and a next
# turn's TTFT by tier).
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
  if ! cmake --build build-cuda -j "$jobs" --target cuda_tests 2>&1 | tee "$log" | grep -v "^ptxas info"; then
    echo "gpu-check prepare: the build failed"; exit 1
  fi
  # ptxas -v: "N bytes stack frame, N bytes spill stores, N bytes spill loads" per kernel.
  if grep -E "[1-9][0-9]* bytes spill (stores|loads)" "$log"; then
    echo "gpu-check prepare: a kernel spills registers (above)"; exit 1
  fi
  echo "-- ptxas: $(grep -c "Compiling entry function" "$log") kernels compiled, no spills"
  rm -f "$log"
  rm -rf "$stage_dir"
  mkdir -p "$stage_dir/bin" "$stage_dir/lib"
  cp build-cuda/tests/cuda_tests "$stage_dir/bin/"
  strip --strip-debug "$stage_dir/bin/cuda_tests"
  # The shared libraries it loads, but for the C library's own and the driver's (the GPU
  # machine has its own, matched to its kernel).
  ldd build-cuda/tests/cuda_tests | awk '/=> \// {print $3}' | while read -r lib; do
    case $(basename "$lib") in
      libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|ld-linux*|libcuda.so.*) ;;
      *) cp -L "$lib" "$stage_dir/lib/" ;;
    esac
  done
  echo "-- staged in .gpu-check: $(du -sh "$stage_dir" | cut -f1) ($(ls "$stage_dir/lib" | wc -l) libraries)"
}

run_checks() {
  local smoke=$1 out=${OUT:-$stage_dir/results}
  [[ -x "$stage_dir/bin/cuda_tests" ]] ||
    { echo "gpu-check: nothing staged; run 'scripts/gpu-check.sh prepare' first"; exit 1; }
  mkdir -p "$out"
  export LD_LIBRARY_PATH=$stage_dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  # cuBLASLt (loaded at run time by cuda/gemm.h, never staged: hundreds of MB): the GPU
  # machine's CUDA, or the one PyTorch's wheels bring.
  local cublas
  for cublas in /usr/local/cuda/lib64 \
      "$(python3 -c 'import nvidia.cublas, os; print(os.path.join(os.path.dirname(nvidia.cublas.__file__), "lib"))' 2>/dev/null)"; do
    if [[ -n $cublas && -e $cublas/libcublasLt.so.13 ]]; then
      export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$cublas
      echo "-- cuBLASLt from $cublas"
      break
    fi
  done
  export STRATA_REQUIRE_GPU=1
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 |
    tee "$out/device.txt" || true
  # Smoke: the kernel tests at fewer shapes (STRATA_GPU_SMOKE, read by tests/cuda).
  if ((smoke)); then export STRATA_GPU_SMOKE=1; fi
  local rc=0
  "$stage_dir/bin/cuda_tests" 2>&1 | tee "$out/cuda_tests.txt" ||
    rc=$?
  if ((rc != 0)); then echo "== gpu-check: cuda_tests failed (exit $rc)"; exit 1; fi
  # The KV tiers' copy bandwidth per I/O path and host layout, against cudaMemcpy (issue 31).
  grep -F "[copy bandwidth]" "$out/cuda_tests.txt" >"$out/copy_bandwidth.txt" || true
  cat "$out/copy_bandwidth.txt"
  # A next turn's TTFT with its prefix on the GPU and on the host, the load-back overlapped
  # layer by layer or not (issue 31; tests/cuda/gpu_engine_test.cc).
  grep -F "[tier ttft]" "$out/cuda_tests.txt" >"$out/tier_ttft.txt" || true
  cat "$out/tier_ttft.txt"
  echo "== gpu-check: all passed"
}

case $mode in
  prepare) prepare ;;
  run) run_checks 0 ;;
  smoke) run_checks 1 ;;
  *) echo "usage: scripts/gpu-check.sh prepare|run|smoke"; exit 2 ;;
esac
