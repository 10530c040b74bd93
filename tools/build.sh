#!/usr/bin/env bash
# Configures and builds fragctl into ${FRAGCTL_BUILD_DIR:-build} (Ninja,
# ${FRAGCTL_BUILD_TYPE:-RelWithDebInfo}). Extra arguments go to cmake's
# configure step. Without CUDA or HIP headers those backends are left out
# with a warning (cmake/FragctlDependencies.cmake).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${FRAGCTL_BUILD_DIR:-build}
args=(-G Ninja -DCMAKE_BUILD_TYPE=${FRAGCTL_BUILD_TYPE:-RelWithDebInfo})
cmake -S . -B "$build" "${args[@]}" "$@" >/dev/null
cmake --build "$build" -j "$(nproc)" ${FRAGCTL_KEEP_GOING:+-- -k 0}
