#!/usr/bin/env bash
# Configures and builds fragctl into ${FRAGCTL_BUILD_DIR:-build}. Extra
# arguments go to cmake's configure step.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${FRAGCTL_BUILD_DIR:-build}
args=(-G Ninja -DCMAKE_BUILD_TYPE=${FRAGCTL_BUILD_TYPE:-RelWithDebInfo})
# CUDA headers are optional at build time: without them the cuda backend is left out.
if [ ! -f "${CUDA_HOME:-/usr/local/cuda}/include/cuda.h" ]; then
  echo "fragctl: no CUDA headers (set CUDA_HOME); building without the cuda backend" >&2
  args+=(-DFRAGCTL_WITH_CUDA=OFF)
fi
cmake -S . -B "$build" "${args[@]}" "$@" >/dev/null
cmake --build "$build" -j "$(nproc)" ${FRAGCTL_KEEP_GOING:+-- -k 0}
