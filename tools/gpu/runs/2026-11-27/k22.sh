#!/usr/bin/env bash
# One GPU: the session's last code (2ff9b14: the stream hook reverted, the review fixes). 1. The
# install proof from the wheel alone (tools/gpu/wheel.sh). 2. The shim built here (devkit) and
# tests/interpose/preload_cuda_probe.cpp compiled against the CUDA runtime (the second cudaFree
# refused; the probe destroys its stream last, the known crash), run under arena and caching.
# $OUT/k22.tar.gz.
set -uo pipefail
start=$(date +%s)
el() { echo "[$(( $(date +%s) - start )) s] $*"; }
echo "commit: $(cat .carry/commit)"
M=/tmp/k22; rm -rf $M; mkdir -p $M
(OUT=$M timeout 300 bash tools/gpu/wheel.sh 2>&1 | cut -c1-300 | tail -25)
el "wheel proof done"
source .devkit/devkit.sh unpack
B=/tmp/k22-build
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DFRAGCTL_BUILD_TESTS=OFF -DFRAGCTL_BUILD_BENCHMARKS=OFF \
  -DFRAGCTL_WERROR=OFF > $M/configure.log 2>&1 || { tail -20 $M/configure.log; exit 1; }
cmake --build $B --target fragctl_preload -j 16 > $M/build.log 2>&1 || { tail -30 $M/build.log; exit 1; }
shim=$(find $B -name 'libfragctl_preload.so' | head -1)
inc=$(dirname "$(find /usr/local /usr -name cuda_runtime_api.h 2>/dev/null | head -1)")
lib=$(dirname "$(find /usr/local /usr -name 'libcudart.so' 2>/dev/null | head -1)")
g++ -std=c++20 -O2 tests/interpose/preload_cuda_probe.cpp -I"$inc" -L"$lib" -Wl,-rpath,"$lib" -lcudart -ldl \
  -o $M/probe || exit 1
el "built"
for policy in arena caching; do
  LD_PRELOAD=$shim FRAGCTL_BACKEND=cuda FRAGCTL_POLICY=$policy timeout 60 $M/probe $M/$policy.report.json \
    > $M/$policy.out 2> $M/$policy.err
  echo "probe, $policy: exit $?"; cat $M/$policy.out; grep -v "^\s*$" $M/$policy.err | cut -c1-240 | head -6
done
tar -czf $OUT/k22.tar.gz -C $M --exclude=probe . 2>/dev/null; el "done"
