#!/usr/bin/env bash
# The main job: builds fragctl and replays the bundled sample training trace
# through every policy, printing the comparison table. Uses the CUDA backend
# when a GPU is present, else the host simulator.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install-deps.sh
FRAGCTL_BUILD_DIR=${FRAGCTL_BUILD_DIR:-build} tools/build.sh -DFRAGCTL_BUILD_TESTS=OFF -DFRAGCTL_BUILD_BENCHMARKS=OFF
exec "${FRAGCTL_BUILD_DIR:-build}/tools/fragctl" replay benchmarks/traces/sample.trace.csv.gz --policy all "$@"
