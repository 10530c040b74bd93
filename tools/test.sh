#!/usr/bin/env bash
# Builds fragctl with its tests and runs the whole suite with CTest. GPU
# tests run where a GPU is present and are skipped, with a message, elsewhere.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install-deps.sh
build=${FRAGCTL_BUILD_DIR:-build}
FRAGCTL_BUILD_DIR=$build tools/build.sh -DFRAGCTL_BUILD_TESTS=ON "$@"
ctest --test-dir "$build" --output-on-failure -j "$(nproc)" --timeout 900
