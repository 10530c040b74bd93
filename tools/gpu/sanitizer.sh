#!/usr/bin/env bash
# The GPU tests under NVIDIA's compute-sanitizer (memcheck, leak check) on a
# CUDA machine (docs/reliability.md, "GPU check"). About 3 minutes, build
# included.
#
#   OUT=gpu-results tools/gpu/sanitizer.sh
#
# Steps, each reported even when an earlier one failed:
#  1. build the CUDA test programs and the fragctl command (RelWithDebInfo,
#     in ${FRAGCTL_SANITIZER_BUILD:-build-gpu-sanitizer});
#  2. run cuda_backend_test, backend_contract_test and backend_select_test
#     under `compute-sanitizer --tool memcheck --leak-check full`;
#  3. replay a real trace through every policy on the cuda backend under
#     memcheck (every policy's driver calls, on the device, start to finish);
#  4. for information, the CUDA API errors the tests provoke on purpose
#     (out-of-memory and misuse tests) with --report-api-errors all.
# Steps 2 and 3 report API errors as "no": the tests make calls that must
# fail (an allocation larger than the device, a double free the driver
# refuses), which memcheck would otherwise count as errors.
# Writes $OUT/sanitizer/*.log and $OUT/sanitizer/summary.txt; prints the
# summary. COMPUTE_SANITIZER names the tool (default: from PATH or
# /usr/local/cuda/bin).
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu/common.sh sanitizer
build=${FRAGCTL_SANITIZER_BUILD:-build-gpu-sanitizer}
summary=$out/summary.txt
: > "$summary"
result() { printf '%-34s %s\n' "$1" "$2" | tee -a "$summary"; }

[ -f .devkit/devkit.sh ] && source .devkit/devkit.sh unpack

sanitizer=${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}
if [ ! -x "$sanitizer" ]; then
  result "compute-sanitizer" "MISSING ($sanitizer)"
  exit 1
fi
{
  date -u +"date: %Y-%m-%d %H:%M UTC"
  echo "gpu: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)"
  echo "sanitizer: $("$sanitizer" --version 2>/dev/null | tail -1)"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet 2>/dev/null || echo ' (modified)')"
} | tee "$out/machine.txt"

# --- 1. build ---------------------------------------------------------------------------
programs=(cuda_backend_test backend_contract_test backend_select_test)
note "building ${programs[*]} fragctl"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFRAGCTL_BUILD_TESTS=ON \
  -DFRAGCTL_BUILD_BENCHMARKS=OFF -DFRAGCTL_WERROR=OFF > "$out/build.log" 2>&1 &&
  cmake --build "$build" -j "$(nproc)" --target "${programs[@]}" fragctl_cli >> "$out/build.log" 2>&1
build_rc=$?
if [ $build_rc -ne 0 ]; then
  result "build" "FAILED (see build.log)"
  grep -E "error:|FAILED" "$out/build.log" | head -20
else
  result "build" "ok ($((SECONDS - t0)) s)"
fi

# Runs one program under memcheck with a time limit; the verdict comes from
# the sanitizer's ERROR SUMMARY and the program's own exit status.
memcheck() {
  local name=$1 limit=$2; shift 2
  local log=$out/$name.log
  timeout --kill-after=10 "$limit" "$sanitizer" --tool memcheck --leak-check full --report-api-errors no \
    --error-exitcode 86 --print-limit 50 "$@" > "$log" 2>&1
  local rc=$?
  local errors
  errors=$(grep -Eo 'ERROR SUMMARY: [0-9]+' "$log" | tail -1 | grep -Eo '[0-9]+$')
  local verdict
  case $rc in
    0) verdict="clean" ;;
    86) verdict="MEMCHECK ERRORS" ;;
    124|137) verdict="TIMED OUT after ${limit}s" ;;
    *) verdict="FAILED (exit $rc)" ;;
  esac
  local skipped
  # One line per skipped test, with its time; the closing list repeats them without.
  skipped=$(grep -cE "^\[  SKIPPED \] .* \([0-9]+ ms\)$" "$log" 2>/dev/null)
  result "$name" "$verdict, ${errors:-?} sanitizer errors${skipped:+, $skipped skipped}"
}

# --- 2. the GPU test programs -------------------------------------------------------------
if [ $build_rc -eq 0 ]; then
  for p in "${programs[@]}"; do
    exe=$(find "$build/tests" -type f -name "$p" -perm -u+x | head -1)
    note "memcheck $p"
    FRAGCTL_TEST_DATA=$PWD/tests/data memcheck "$p" 90 "$exe"
  done

  # --- 3. every policy on the device, replaying a real trace -----------------------------
  note "memcheck fragctl replay --backend cuda --policy all"
  memcheck replay_all_policies 120 "$build/tools/fragctl" replay tests/data/resnet50.trace.csv.gz \
    --policy all --backend cuda

  # --- 4. API errors the tests provoke (information) --------------------------------------
  exe=$(find "$build/tests" -type f -name cuda_backend_test -perm -u+x | head -1)
  timeout 90 "$sanitizer" --tool memcheck --report-api-errors all --print-limit 200 "$exe" \
    > "$out/api_errors.log" 2>&1
  result "api errors (on purpose, info)" \
    "$(grep -c 'Program hit' "$out/api_errors.log") calls failed: $(grep -Eo 'Program hit [A-Za-z_]+' "$out/api_errors.log" | sort | uniq -c | sort -rn | head -4 | awk '{printf "%s x%s ", $4, $1}')"
fi

note "done; logs in $out"
echo "--- summary"
cat "$summary"
! grep -qE "FAILED|ERRORS|TIMED OUT|MISSING" "$summary"
