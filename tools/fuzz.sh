#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/) with clang, AddressSanitizer and
# UndefinedBehaviorSanitizer, and runs each for a bounded time over its seed
# corpus (docs/reliability.md, "Fuzzing").
#
#   tools/fuzz.sh [SECONDS] [TARGET...]
#
# SECONDS per target (default ${FRAGCTL_FUZZ_SECONDS:-25}); TARGETs among
# config trace pickle stats_json report report_render alloc_sequence
# (default: all). Built in ${FRAGCTL_FUZZ_DIR:-build-asan}, the address build
# of tools/sanitize.sh
# (same configuration, tools/sanitize/configure.sh, so nothing is built twice);
# new inputs go to <build>/fuzz-corpus/<target> (the committed seeds in
# fuzz/corpus/ are only read), crashes to <build>/fuzz-artifacts/. A crash
# fails the script and prints how to turn it into a regression test. Needs
# clang and libclang-rt-14-dev (installed with tools/install-deps.sh when
# missing and allowed).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-${FRAGCTL_FUZZ_SECONDS:-25}}
[ $# -gt 0 ] && shift
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(config trace pickle stats_json report report_render alloc_sequence)
dir=${FRAGCTL_FUZZ_DIR:-build-asan}  # the address build of tools/sanitize.sh

source tools/sanitize/configure.sh
sanitize_configure "$dir" address
t0=$SECONDS
cmake --build "$dir" -j "$(nproc)" --target "${targets[@]/#/fuzz_}"
echo "== fuzz: built in $((SECONDS - t0)) s"

export ASAN_OPTIONS="detect_leaks=1:halt_on_error=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
failed=()
for t in "${targets[@]}"; do
  work=$dir/fuzz-corpus/$t
  artifacts=$dir/fuzz-artifacts/$t/
  mkdir -p "$work" "$artifacts"
  log=$dir/fuzz-$t.log
  # The first directory receives new inputs; the seeds are read from the second.
  if "$dir/fuzz/fuzz_$t" -max_total_time="$seconds" -timeout=20 -rss_limit_mb=3072 -max_len=8192 \
      -print_final_stats=1 -artifact_prefix="$artifacts" "$work" "fuzz/corpus/$t" > "$log" 2>&1; then
    echo "   ok   fuzz_$t: $(grep -m1 -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$') runs," \
      "$(ls "$work" | wc -l) corpus inputs"
  else
    echo "   FAIL fuzz_$t (log: $log)"
    grep -E -A30 "ERROR:|invariant_violation|what\(\)" "$log" | head -60
    ls "$artifacts"
    failed+=("$t")
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  cat <<EOF
== fuzz: ${#failed[@]} target(s) found a bug: ${failed[*]}
   Reproduce: $dir/fuzz/fuzz_<target> <artifact>
   Then copy the artifact to fuzz/regressions/<target>/<what-it-found> (run by
   tests/reliability/fuzz_corpus_test) and add a test that names the bug.
EOF
  exit 1
fi
echo "== fuzz: ${#targets[@]} target(s), ${seconds} s each, no crash"
