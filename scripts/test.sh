#!/usr/bin/env bash
# The whole test suite, from a fresh Debian 12 machine: installs what is missing,
# builds the release tree and an ASan+UBSan tree, and runs every test through CTest: the
# GoogleTest programs and the black-box HTTP suites in the ASan+UBSan tree, the benchmarks'
# quick runs, the browser test and the unit tests with release-only sizes in the release one.
# The sanitizer trees compile beside the release build and its tests.
#   scripts/test.sh            everything
#   STRATA_SKIP_SANITIZERS=1   only the release build's tests
# It sets STRATA_REQUIRE_BROWSER=1: the dashboard's browser tests fail, rather than skip,
# when Chromium is missing.
# The ThreadSanitizer stage builds and runs the test programs of the threaded modules
# (engine scheduler + transfer threads + tool sessions, host pool and transfers, storage
# worker and backends, the HTTP server and client, the P/D control plane's channel,
# disaggregation through two engines with UCX: UCX_MEM_EVENTS=no, see docs/kv-transfer.md,
# and the router's index, event intake and worker polling).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
jobs=${STRATA_JOBS:-$(nproc)}

# Each stage's wall time, printed at the end (and at a failure).
stage_start=$SECONDS
stage_name=""
timings=()
stage() {
  if [[ -n "$stage_name" ]]; then timings+=("$(printf '%5d s  %s' $((SECONDS - stage_start)) "$stage_name")"); fi
  stage_name=$1
  stage_start=$SECONDS
  [[ -n "$stage_name" ]] && echo "== $stage_name"
  return 0
}
report() {
  stage ""
  echo "== stage times (whole run $((SECONDS / 60)) min $((SECONDS % 60)) s)"
  printf '%s\n' "${timings[@]}"
}
trap report EXIT

stage "install dependencies"
scripts/install-deps.sh
# install-deps.sh installed Chromium: a browser test that would skip for want of it fails
# instead (tests/server/dashboard.test.mjs), so a skipped browser test cannot pass CI.
export STRATA_REQUIRE_BROWSER=1

# Line tables only (-g1): file:line in backtraces and sanitizer reports, and about a quarter
# less compile time than full debug info (-g), which the builds of this script are dominated
# by (README, Tests: measured per translation unit).
# Every tree is a unity build (CMake compiles all of a target's sources as one translation
# unit): Boost.Beast's, Asio's coroutines' and GoogleTest's templates are instantiated once
# per target instead of once per file (README, Tests).
flags=(-DCMAKE_UNITY_BUILD=ON -DCMAKE_UNITY_BUILD_BATCH_SIZE=0
       -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG")

# Ninja (Debian's ninja-build, from install-deps.sh) schedules every tree's compilations as
# one graph: a target's objects compile while the libraries it links are still being built,
# where Make builds target after target and leaves a core idle at each link. A tree that
# was configured earlier keeps its generator (CMake refuses to switch one).
configure() {
  local dir=$1
  shift
  local gen=()
  if [[ ! -f "$dir/CMakeCache.txt" ]] && command -v ninja >/dev/null; then gen=(-G Ninja); fi
  cmake -S . -B "$dir" "${gen[@]}" "$@" >/dev/null
}

sanitizers=1
[[ "${STRATA_SKIP_SANITIZERS:-0}" == 1 ]] && sanitizers=0

stage "release build"
# With the sanitizer trees, the GoogleTest programs run there (every one under ASan+UBSan,
# the threaded modules' under TSan too) and the release tree builds, besides the binary and
# the micro-benchmarks, only cuda_tests (the one tree with CUDA) and the programs whose
# randomized and long-input tests run at full size only outside the sanitizers
# (tests/CMakeLists.txt, STRATA_RELEASE_UNIT_TESTS). The black-box HTTP suites run in the
# ASan tree, where they check the server's memory as well (STRATA_HTTP_SUITES); the release
# tree runs the benchmarks' quick runs and the dashboard's browser test.
unit_tests=OFF
((sanitizers)) || unit_tests=ON
configure build -DCMAKE_BUILD_TYPE=RelWithDebInfo "${flags[@]}" -DSTRATA_UNIT_TESTS=$unit_tests \
          -DSTRATA_HTTP_SUITES=$unit_tests
tsan_tests=(engine_tests router_tests pd_tests pd_engine_tests memory_tests http_tests storage_tests)
logs=$root/build/background-build-logs
rm -rf "$logs"
mkdir -p "$logs"
export jobs logs
if ((sanitizers)); then
  # -O1 for the ASan tree, as AddressSanitizer's documentation advises: the tests' model
  # arithmetic runs several times faster than at -O0 (the SIMD helpers are inlined), which
  # is most of its test time; every check stays (README, Tests). The modules that do not
  # compute compile at -O0 in both sanitizer trees (CMakeLists.txt,
  # STRATA_SANITIZER_LIGHT_MODULES). Its GoogleTest programs run as 4 shards each, every
  # shard one process, rather than one process per test (tests/CMakeLists.txt,
  # STRATA_GTEST_SHARDS): an ASan process takes ~0.2 s to start, ~1,500 times.
  configure build-asan -DCMAKE_BUILD_TYPE=Debug -DSTRATA_SANITIZE=ON -DSTRATA_GTEST_SHARDS=4 \
            -DSTRATA_BUILD_BENCH=OFF "${flags[@]}" -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g1"
  # -O1 for the TSan tree too (ThreadSanitizer's documentation: -O1 or -O2): `http`'s unit
  # compiles in 109 s of CPU instead of 149 s at -O2.
  configure build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSTRATA_TSAN=ON \
            -DSTRATA_BUILD_BENCH=OFF "${flags[@]}" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG"
fi

# Background builds, each chain its own session (setsid), so that an early exit stops its
# compilers too (trap below). They run at nice 19, but on a kernel with autogroup scheduling
# (Debian's: /proc/sys/kernel/sched_autogroup_enabled) a new session is a new group, and
# groups share the CPU equally whatever their processes' nice: a chain takes about half the
# cores while the release build or the tests want them, and all they leave idle (a build's
# links and its last unit alone, the tests' waits on servers). The whole run is bound by its
# total CPU either way; what matters is that no core idles and no long stage runs alone at
# the end. Each chain builds one after the other and writes "<rc> <seconds>" to
# <name>.done; a failure stops the ones after it.
chain_pids=()
start_chain() {
  setsid nice -n 19 bash -c '
    build() {
      local name=$1 s=$SECONDS rc
      shift
      cmake --build "$@" >"$logs/$name.log" 2>&1; rc=$?
      echo "$rc $((SECONDS - s))" >"$logs/$name.done"
      ((rc == 0)) || exit 1
    }
    '"$1" background-builds "${tsan_tests[@]}" &
  chain_pids+=($!)
}
trap 'for p in "${chain_pids[@]}"; do kill -- -"$p" 2>/dev/null || true; done; report' EXIT
# The sanitizer trees start at once, beside the release build: the ASan tree (the longest
# build, on the critical path), then the TSan tree's test programs (beside the ASan tests,
# which start once the ASan tree is built); the TSan programs run last, in the foreground,
# $jobs at a time.
export root
# The ASan tree builds its binary first (asan-binary), so that the black-box suites can
# run there while its GoogleTest programs compile.
if ((sanitizers)); then
  start_chain 'build asan-binary build-asan -j "$jobs" --target strata &&
    build asan build-asan -j "$jobs" && build tsan build-tsan -j "$jobs" --target "$@"'
fi
# What the tests run first (target strata_tested: the test programs and the binary); the
# rest of the tree (the micro-benchmarks) compiles beside the tests, below.
cmake --build build -j "$jobs" --target strata_tested
start_chain 'build release-rest build -j "$jobs"'

# Waits for a background build (release-rest, asan or tsan); its log's end on a failure.
wait_build() {
  while [[ ! -f "$logs/$1.done" ]]; do
    local alive=0 p
    for p in "${chain_pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    if ((!alive)) && [[ ! -f "$logs/$1.done" ]]; then
      echo "== the $1 build stopped without a result"; tail -n 60 "$logs/$1.log" 2>/dev/null; exit 1
    fi
    sleep 2
  done
  local rc secs
  read -r rc secs <"$logs/$1.done"
  timings+=("$(printf '%5d s  %s' "$secs" "$1 build (beside the others)")")
  if ((rc != 0)); then
    echo "== the $1 build failed"; tail -n 60 "$logs/$1.log"; exit 1
  fi
}

stage "release tests"
(cd build && ctest --output-on-failure -j "$jobs")
stage "waiting for the rest of the release tree (micro-benchmarks)"
wait_build release-rest

if ((sanitizers)); then
  asan_ctest() {
    (cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
       UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
       STRATA_SANITIZER_BUILD=1 ctest --output-on-failure -j "$jobs" "$@")
  }
  # The black-box suites (label blackbox, tests/CMakeLists.txt) need only the binary: they
  # run while the rest of the ASan tree (its GoogleTest programs) compiles beside them.
  stage "waiting for the ASan + UBSan binary"
  wait_build asan-binary
  stage "sanitizer tests: black-box suites"
  asan_ctest -L blackbox
  stage "waiting for the ASan + UBSan build"
  wait_build asan
  stage "sanitizer tests: GoogleTest programs"
  asan_ctest -LE blackbox

  stage "waiting for the ThreadSanitizer build (threaded modules)"
  wait_build tsan
  # The ThreadSanitizer programs, $jobs at a time (the longest first: tsan_tests' order),
  # each under a ten-minute timeout (they take well under one: a hang fails the run with
  # its name instead of running into CI's limit); each one's output in its log.
  stage "ThreadSanitizer tests"
  run_tsan_test() {
    local rc=0
    UCX_MEM_EVENTS=no TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:suppressions=$root/scripts/tsan.supp \
      timeout -k 10 600 "build-tsan/tests/$1" --gtest_brief=1 >"$logs/tsan-$1.log" 2>&1 || rc=$?
    echo "$rc" >"$logs/tsan-$1.rc"
  }
  tsan_pids=()
  for t in "${tsan_tests[@]}"; do
    while :; do  # a free slot: fewer than $jobs of the started programs still running
      running=0
      for p in "${tsan_pids[@]}"; do kill -0 "$p" 2>/dev/null && running=$((running + 1)); done
      ((running < jobs)) && break
      sleep 1
    done
    run_tsan_test "$t" &
    tsan_pids+=($!)
  done
  wait "${tsan_pids[@]}" || true
  failed=""
  for t in "${tsan_tests[@]}"; do
    echo "-- $t: $(grep -E "tests? from .* ran" "$logs/tsan-$t.log" | tail -n 1 || true)"
    rc=$(cat "$logs/tsan-$t.rc" 2>/dev/null || echo missing)
    if [[ "$rc" != 0 ]]; then
      echo "== $t failed or hung under ThreadSanitizer (exit $rc)"; cat "$logs/tsan-$t.log"
      failed=1
    fi
  done
  [[ -z "$failed" ]] || exit 1
fi
stage ""
echo "== all tests passed"
