# Sourced by tools/sanitize.sh and tools/fuzz.sh: the sanitizer builds.
#
#   sanitize_configure DIR address   ASan + UBSan + libFuzzer coverage, tests
#                                    and fuzzers (one build serves the
#                                    address suite and tools/fuzz.sh)
#   sanitize_configure DIR thread    ThreadSanitizer, tests
#
# clang, because libFuzzer needs it and its sanitizer builds compile faster.
# Address builds are -O0 (half the compile time of -O1; the suite still runs
# in under a minute), thread builds -O1 (TSan at -O0 is too slow for the
# stress test). Line tables for symbolized reports; warnings are not fatal
# (the normal build checks them). Installs clang where missing and allowed.
sanitize_need_clang() {
  if ! command -v clang++ >/dev/null ||
     ! compgen -G "/usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a" >/dev/null; then
    tools/install-deps.sh --tests clang libclang-rt-14-dev llvm
  fi
}

sanitize_configure() {
  local dir=$1 mode=$2 sanitize opt tests_fuzzers
  case $mode in
    address) sanitize=address,undefined,fuzzer-no-link opt=-O0 tests_fuzzers=ON ;;
    thread) sanitize=thread opt=-O1 tests_fuzzers=OFF ;;
    *) echo "sanitize_configure: unknown mode $mode" >&2; return 2 ;;
  esac
  sanitize_need_clang
  local args=(-G Ninja -DCMAKE_BUILD_TYPE=Debug
    "-DCMAKE_CXX_FLAGS_DEBUG=$opt -gline-tables-only" "-DCMAKE_C_FLAGS_DEBUG=$opt -gline-tables-only"
    -DFRAGCTL_SANITIZE="$sanitize" -DFRAGCTL_BUILD_TESTS=ON -DFRAGCTL_BUILD_FUZZERS=$tests_fuzzers
    -DFRAGCTL_BUILD_BENCHMARKS=OFF -DFRAGCTL_WERROR=OFF)
  [ -f "${CUDA_HOME:-/usr/local/cuda}/include/cuda.h" ] || args+=(-DFRAGCTL_WITH_CUDA=OFF)
  CC=clang CXX=clang++ cmake -S . -B "$dir" "${args[@]}" >/dev/null
}

# llvm-symbolizer turns the sanitizers' addresses into file:line.
if [ -z "${ASAN_SYMBOLIZER_PATH:-}" ]; then
  for s in llvm-symbolizer /usr/lib/llvm-*/bin/llvm-symbolizer; do
    if command -v "$s" >/dev/null 2>&1; then export ASAN_SYMBOLIZER_PATH=$(command -v "$s"); break; fi
  done
fi
