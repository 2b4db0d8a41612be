#!/bin/sh
# CTest bench_cluster_trace_replicas (issue 33): the tiny trace through two router replicas
# sharing session bindings in a private redis-server, the first replica killed halfway;
# every request must still be answered in full (check_trace_results.py). No time is checked.
# Usage: run_trace_replicas.sh STRATA MODEL_DIR PROFILE TRACE OUT CHECK_SCRIPT
set -eu
strata=$1 model=$2 profile=$3 trace=$4 out=$5 check=$6
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no >/dev/null 2>&1 &
redis_pid=$!
trap 'kill $redis_pid 2>/dev/null || true' EXIT
i=0
until redis-cli -p "$port" ping >/dev/null 2>&1; do
  i=$((i + 1))
  [ "$i" -lt 100 ] || { echo "redis-server did not start" >&2; exit 1; }
  sleep 0.1
done
rm -rf "$out"
"$strata" bench cluster --spawn --simulate "$profile" --model "$model" --workers 4 \
  --worker-kv-tokens 8192 --trace "$trace" --trace-block-tokens 64 --trace-limit 20 \
  --time-scale 0.5 --policies default --trace-sessions --routers 2 \
  --session-store "redis://127.0.0.1:$port" --kill-router-at 0.5 --out "$out"
/usr/bin/python3 "$check" "$out/results.json" "$trace" 20 default 2,killed
