#!/usr/bin/env bash
# The whole test suite, from a fresh Debian 12 machine: installs what is missing,
# builds the release tree and an ASan+UBSan tree, and runs every test through CTest.
# The sanitizer trees compile at the lowest priority while the tests before them run.
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

stage "release build"
configure build -DCMAKE_BUILD_TYPE=RelWithDebInfo "${flags[@]}"
# What the tests run first (target strata_tested: the test programs and the binary); the
# rest of the tree (the micro-benchmarks) compiles beside the tests, below.
cmake --build build -j "$jobs" --target strata_tested

sanitizers=1
[[ "${STRATA_SKIP_SANITIZERS:-0}" == 1 ]] && sanitizers=0
tsan_tests=(engine_tests memory_tests storage_tests http_tests pd_tests pd_engine_tests router_tests)
logs=$root/build/background-build-logs
rm -rf "$logs"
mkdir -p "$logs"
export jobs sanitizers logs
if ((sanitizers)); then
  # The sanitizer trees build while the release tests run, at the lowest CPU priority
  # (nice 19: the tests keep the cores whenever they want them, and the compilers take what
  # the tests leave idle: waits on servers, sleeps, single-threaded stretches).
  # -O1 for the ASan tree, as AddressSanitizer's documentation advises: the tests' model
  # arithmetic runs several times faster than at -O0 (the SIMD helpers are inlined), which
  # is most of its test time; every check stays (README, Tests).
  configure build-asan -DCMAKE_BUILD_TYPE=Debug -DSTRATA_SANITIZE=ON \
            -DSTRATA_BUILD_BENCH=OFF "${flags[@]}" -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g1"
  # -O1 for the TSan tree too (ThreadSanitizer's documentation: -O1 or -O2): `http`'s unit
  # compiles in 109 s of CPU instead of 149 s at -O2.
  configure build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSTRATA_TSAN=ON \
            -DSTRATA_BUILD_BENCH=OFF "${flags[@]}" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG"
fi
# The background builds, one after the other: the rest of the release tree, then (unless
# skipped) the ASan tree, then the TSan tree's test programs. Each writes "<rc> <seconds>"
# to <name>.done; a failure stops the ones after it. Its own session (setsid), so that an
# early exit stops its compilers too (trap below).
setsid nice -n 19 bash -c '
  build() {
    local name=$1 s=$SECONDS rc
    shift
    cmake --build "$@" >"$logs/$name.log" 2>&1; rc=$?
    echo "$rc $((SECONDS - s))" >"$logs/$name.done"
    ((rc == 0)) || exit 1
  }
  build release-rest build -j "$jobs"
  ((sanitizers)) || exit 0
  build asan build-asan -j "$jobs"
  build tsan build-tsan -j "$jobs" --target "$@"' \
  background-builds "${tsan_tests[@]}" &
builds_pid=$!
trap 'kill -- -$builds_pid 2>/dev/null || true; report' EXIT
# Waits for a background build (release-rest, asan or tsan); its log's end on a failure.
wait_build() {
  while [[ ! -f "$logs/$1.done" ]]; do
    if ! kill -0 "$builds_pid" 2>/dev/null && [[ ! -f "$logs/$1.done" ]]; then
      echo "== the $1 build stopped without a result"; tail -n 60 "$logs/$1.log" 2>/dev/null; exit 1
    fi
    sleep 2
  done
  local rc secs
  read -r rc secs <"$logs/$1.done"
  timings+=("$(printf '%5d s  %s' "$secs" "$1 build (beside the tests, nice 19)")")
  if ((rc != 0)); then
    echo "== the $1 build failed"; tail -n 60 "$logs/$1.log"; exit 1
  fi
}

stage "release tests"
(cd build && ctest --output-on-failure -j "$jobs")
stage "waiting for the rest of the release tree (micro-benchmarks)"
wait_build release-rest

if ((sanitizers)); then
  stage "waiting for the ASan + UBSan build"
  wait_build asan
  stage "sanitizer tests"
  (cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
     UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
     STRATA_SANITIZER_BUILD=1 ctest --output-on-failure -j "$jobs")

  stage "waiting for the ThreadSanitizer build (threaded modules)"
  wait_build tsan
  stage "ThreadSanitizer tests"
  # Each program has ten minutes (they take well under two): a hang fails the run with its
  # name instead of running into CI's limit.
  for t in "${tsan_tests[@]}"; do
    echo "-- $t"
    UCX_MEM_EVENTS=no TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:suppressions=$root/scripts/tsan.supp \
      timeout -k 10 600 "build-tsan/tests/$t" --gtest_brief=1 ||
      { echo "== $t failed or hung (exit $?)"; exit 1; }
  done
fi
stage ""
echo "== all tests passed"
