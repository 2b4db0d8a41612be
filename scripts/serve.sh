#!/usr/bin/env bash
# The first README command: installs what is missing, builds, and starts the server.
# With no arguments it serves a demo model (Qwen3 architecture, random weights, the real
# Qwen3 tokenizer and chat template) on http://127.0.0.1:8000. Any argument is passed to
# `strata serve`, e.g.:  scripts/serve.sh --model /path/to/Qwen3-0.6B --port 8080
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j "$(nproc)" --target strata
exec build/strata serve "$@"
