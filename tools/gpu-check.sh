#!/usr/bin/env bash
# On a GPU machine: build, run the whole test suite (GPU tests included) and
# replay the traces through every policy on the cuda backend, beside sim.
# Writes logs and JSON results into ${OUT:-gpu-results}. Warnings are not
# fatal here: the GPU image's newer compiler warns inside fmt's headers.
#   tools/gpu-check.sh [TRACE...]
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-results}
mkdir -p "$out"
{
  date -u +"date: %Y-%m-%d %H:%M UTC"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  nvcc --version | tail -1
} | tee "$out/machine.txt"
FRAGCTL_KEEP_GOING=1 FRAGCTL_BUILD_TYPE=Release FRAGCTL_BUILD_DIR=build-gpu tools/build.sh -DFRAGCTL_BUILD_TESTS=ON -DFRAGCTL_WERROR=OFF ${FRAGCTL_CMAKE_ARGS:-} \
  > "$out/build.log" 2>&1 || { grep -E "error:|FAILED" "$out/build.log" | grep -v Werror | head -40; exit 1; }
ctest --test-dir build-gpu -j 8 --timeout 600 --output-on-failure > "$out/ctest.log" 2>&1
echo "ctest exit $?"; grep -E "tests passed|tests failed|Failed|\*\*\*" "$out/ctest.log" | tail -30
grep -h "no CUDA device" build-gpu/Testing/Temporary/LastTest.log | head -3
traces=("$@")
[ ${#traces[@]} -gt 0 ] || traces=(tests/data/gpt2m.trace.csv.gz tests/data/resnet50.trace.csv.gz benchmarks/traces/sample.trace.csv.gz)
for backend in cuda sim; do
  build-gpu/tools/fragctl replay "${traces[@]}" --policy all --backend "$backend" \
    --json > "$out/replay-$backend.json" 2> "$out/replay-$backend.err"
  build-gpu/tools/fragctl replay "${traces[@]}" --policy all --backend "$backend" 2>/dev/null | tee "$out/replay-$backend.txt"
done
