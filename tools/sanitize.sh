#!/usr/bin/env bash
# The test suite under sanitizers, on sim (docs/reliability.md, "Sanitizers").
#
#   tools/sanitize.sh [address] [thread]        (no argument: both)
#
# address  AddressSanitizer + UndefinedBehaviorSanitizer (LeakSanitizer
#          included): the whole test suite through CTest, built in
#          ${FRAGCTL_ASAN_DIR:-build-asan}.
# thread   ThreadSanitizer: the test programs that run threads
#          (FRAGCTL_TSAN_TESTS, program names; default below), each run
#          directly, built in ${FRAGCTL_TSAN_DIR:-build-tsan}.
#
# Builds use clang (tools/sanitize/configure.sh: -O0 for address, -O1 for
# thread, line tables, assertions on, no benchmarks, warnings not fatal: the
# normal build checks them). The address build also holds the fuzzers, which
# tools/fuzz.sh then runs without building again. A sanitizer report fails
# the test that produced it (halt_on_error), which fails this script.
# Suppressions, each with its reason, are in tools/sanitize/.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
jobs=$(nproc)

# Programs that start threads, or whose code is shared between threads.
default_tsan_tests="concurrency_stress_test adaptors_test fork_safety_test stats_export_test sim_backend_test
  caching_conformance_test arena_conformance_test buckets_arena_conformance_test
  warmup_arena_conformance_test capi_test interposer_test thread_communicator_test
  block_manager_test"
tsan_tests=""
for t in ${FRAGCTL_TSAN_TESTS:-$default_tsan_tests}; do
  if [ -n "$(find tests -name "$t.cpp" -print -quit)" ]; then
    tsan_tests="$tsan_tests $t"
  else
    echo "sanitize: no tests/**/$t.cpp here" >&2
    exit 2  # a thread run that checks less than asked must not pass
  fi
done

source tools/sanitize/configure.sh

run_address() {
  local dir=${FRAGCTL_ASAN_DIR:-build-asan}
  echo "== sanitize: address,undefined (whole suite) in $dir"
  sanitize_configure "$dir" address
  local t0=$SECONDS
  cmake --build "$dir" -j "$jobs"
  echo "== sanitize: built in $((SECONDS - t0)) s"
  export ASAN_OPTIONS="detect_leaks=1:check_initialization_order=1:detect_stack_use_after_return=1:halt_on_error=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
  export LSAN_OPTIONS="suppressions=$root/tools/sanitize/lsan.supp${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
  # Not under a sanitizer: the consumer tests install the sanitized library
  # and link plain programs against it; Python cannot load it without
  # preloading the sanitizer runtime.
  t0=$SECONDS
  ctest --test-dir "$dir" --output-on-failure -j "$jobs" --timeout 600 -E '^(consumer_find_package|c_api_consumer_find_package|python_)'
  echo "== sanitize: address,undefined suite passed in $((SECONDS - t0)) s"
}

run_thread() {
  local dir=${FRAGCTL_TSAN_DIR:-build-tsan}
  echo "== sanitize: thread ($(echo $tsan_tests | wc -w) programs) in $dir"
  sanitize_configure "$dir" thread
  local t0=$SECONDS
  # shellcheck disable=SC2086
  cmake --build "$dir" -j "$jobs" --target $tsan_tests
  echo "== sanitize: built in $((SECONDS - t0)) s"
  export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$root/tools/sanitize/tsan.supp${TSAN_OPTIONS:+:$TSAN_OPTIONS}"
  export FRAGCTL_TEST_DATA=$root/tests/data
  t0=$SECONDS
  local failed=()
  for t in $tsan_tests; do
    local exe
    exe=$(find "$dir/tests" -type f -name "$t" -perm -u+x | head -1)
    if [ -z "$exe" ]; then
      echo "sanitize: $t was not built" >&2
      failed+=("$t")
      continue
    fi
    if "$exe" --gtest_brief=1 > "$dir/$t.tsan.log" 2>&1; then
      echo "   ok   $t"
    else
      echo "   FAIL $t (log: $dir/$t.tsan.log)"
      tail -60 "$dir/$t.tsan.log"
      failed+=("$t")
    fi
  done
  [ ${#failed[@]} -eq 0 ] || { echo "== sanitize: thread: ${#failed[@]} program(s) failed: ${failed[*]}"; return 1; }
  echo "== sanitize: thread passed in $((SECONDS - t0)) s"
}

modes=("$@")
[ ${#modes[@]} -gt 0 ] || modes=(address thread)
for mode in "${modes[@]}"; do
  case $mode in
    address) run_address ;;
    thread) run_thread ;;
    *) echo "usage: tools/sanitize.sh [address] [thread]" >&2; exit 2 ;;
  esac
done
