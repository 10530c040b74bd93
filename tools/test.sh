#!/usr/bin/env bash
# Builds fragctl with its tests, benchmarks and warnings as errors, and runs
# the whole suite with CTest. GPU tests run where a GPU is present and are
# skipped, with a message, elsewhere.
# Installs what the tests need (tools/install-deps.sh --tests) and the
# optional extras in FRAGCTL_TEST_EXTRAS, by default "--hip --browser --torch":
# the HIP headers (the HIP backend is compiled), chromium (the HTML report's
# browser test) and Debian's PyTorch (the fragctl.torch service tests).
# FRAGCTL_TEST_EXTRAS= leaves them out; the HIP backend is then not built and
# the browser and torch tests skip, each with a message.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck disable=SC2086  # the extras are words
tools/install-deps.sh --tests ${FRAGCTL_TEST_EXTRAS---hip --browser --torch}
build=${FRAGCTL_BUILD_DIR:-build}
FRAGCTL_BUILD_DIR=$build tools/build.sh -DFRAGCTL_BUILD_TESTS=ON -DFRAGCTL_BUILD_BENCHMARKS=ON -DFRAGCTL_WERROR=ON "$@"
# The wheel users install (tests/python/test_wheel.py tests it): a Release
# build of the library and the CLI, self-contained, warnings as errors; it is
# also the check that -O3 adds no warning.
rm -f "$build"/wheel/fragctl-*.whl
FRAGCTL_WHEEL_BUILD_DIR=${FRAGCTL_WHEEL_BUILD_DIR:-$build-wheel} FRAGCTL_WHEEL_CMAKE_ARGS=-DFRAGCTL_WERROR=ON \
  tools/wheel.sh "$build/wheel"
ctest --test-dir "$build" --output-on-failure -j "$(nproc)" --timeout 900
