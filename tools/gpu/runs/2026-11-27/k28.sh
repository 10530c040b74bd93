#!/usr/bin/env bash
# One GPU: as k26, at the code after the last read of the session's change (fee9234: one loop over
# the shim's used allocators; std locks): 1. the install proof from the wheel alone
# (tools/gpu/wheel.sh: torch_checks under enable() and under fragctl run, torchrun, gpt2m); 2. the
# shim built here (devkit) running tests/interpose/preload_cuda_probe.cpp under arena, caching and
# buckets:caching. $OUT/k28.tar.gz.
set -uo pipefail
start=$(date +%s)
el() { echo "[$(( $(date +%s) - start )) s] $*"; }
echo "commit: $(cat .carry/commit)"
M=/tmp/k28; rm -rf $M; mkdir -p $M
(OUT=$M timeout 300 bash tools/gpu/wheel.sh 2>&1 | cut -c1-300 | tail -25)
el "wheel proof done"
source .devkit/devkit.sh unpack
build_shim() {  # source dir, build dir
  cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFRAGCTL_BUILD_TESTS=OFF -DFRAGCTL_BUILD_BENCHMARKS=OFF \
    -DFRAGCTL_WERROR=OFF > "$2.configure.log" 2>&1 || { tail -20 "$2.configure.log"; return 1; }
  cmake --build "$2" --target fragctl_preload -j 16 > "$2.build.log" 2>&1 || { tail -30 "$2.build.log"; return 1; }
}
build_shim . /tmp/k28-new || exit 1
inc=$(dirname "$(find /usr/local /usr -name cuda_runtime_api.h 2>/dev/null | head -1)")
lib=$(dirname "$(find /usr/local /usr -name 'libcudart.so' 2>/dev/null | head -1)")
g++ -std=c++20 -O2 tests/interpose/preload_cuda_probe.cpp -I"$inc" -L"$lib" -Wl,-rpath,"$lib" -lcudart -ldl \
  -pthread -o $M/probe || exit 1
el "built"
for code in new; do
  shim=$(find /tmp/k28-$code -name 'libfragctl_preload.so' | head -1)
  for policy in arena caching buckets:caching; do
    LD_PRELOAD=$shim FRAGCTL_BACKEND=cuda FRAGCTL_POLICY=$policy timeout 120 $M/probe $M/$code.$policy.report.json \
      > $M/$code.$policy.out 2> $M/$code.$policy.err
    echo "probe, $code shim, $policy: exit $?"; cat $M/$code.$policy.out
    grep -v "^\s*$" $M/$code.$policy.err | cut -c1-240 | head -6
  done
done
el "probes done"
tar -czf $OUT/k28.tar.gz -C $M --exclude=probe . 2>/dev/null; el "done"
