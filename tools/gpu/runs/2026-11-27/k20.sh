#!/usr/bin/env bash
# One GPU: k19 found k18's SIGSEGV in the probe's cudaMemPoolTrimTo, before the fix as after it:
# the probe destroyed a stream it had freed on, and the trim's release_cached records the frees'
# event on the destroyed handle (known, not fixed: docs/reliability.md). The probe now destroys
# its stream last. The shim built here (devkit) and the probe compiled against the CUDA runtime,
# run under the new shim (arena, caching) and, as the negative control of the second free, under
# the shim of the wheel before the fix (.carry/oldwheel, 7d767eb) with caching. $OUT/k20.tar.gz.
set -uo pipefail
start=$(date +%s)
el() { echo "[$(( $(date +%s) - start )) s] $*"; }
echo "commit: $(cat .carry/commit)"
M=/tmp/k20; rm -rf $M; mkdir -p $M
source .devkit/devkit.sh unpack
B=/tmp/k20-build
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DFRAGCTL_BUILD_TESTS=OFF -DFRAGCTL_BUILD_BENCHMARKS=OFF \
  -DFRAGCTL_WERROR=OFF > $M/configure.log 2>&1 || { tail -20 $M/configure.log; exit 1; }
cmake --build $B --target fragctl_preload -j 16 > $M/build.log 2>&1 || { tail -30 $M/build.log; exit 1; }
shim=$(find $B -name 'libfragctl_preload.so' | head -1)
inc=$(dirname "$(find /usr/local /usr -name cuda_runtime_api.h 2>/dev/null | head -1)")
lib=$(dirname "$(find /usr/local /usr -name 'libcudart.so' 2>/dev/null | head -1)")
g++ -std=c++20 -O2 tests/interpose/preload_cuda_probe.cpp -I"$inc" -L"$lib" -Wl,-rpath,"$lib" -lcudart -ldl \
  -o $M/probe || exit 1
python3 -m pip install -q --no-index --no-deps --no-cache-dir --target /tmp/k20-old .carry/oldwheel/*.whl
old_shim=$(find /tmp/k20-old -name 'libfragctl_preload.so*' | head -1)
el "built"
run() {  # name shim policy
  LD_PRELOAD=$2 FRAGCTL_BACKEND=cuda FRAGCTL_POLICY=$3 timeout 60 $M/probe $M/$1.report.json > $M/$1.out 2> $M/$1.err
  echo "$1: exit $?"; cat $M/$1.out; grep -v "^\s*$" $M/$1.err | cut -c1-240 | head -8
}
run new-arena "$shim" arena
run new-caching "$shim" caching
run old-caching "$old_shim" caching
tar -czf $OUT/k20.tar.gz -C $M --exclude=probe . 2>/dev/null; el "done"
