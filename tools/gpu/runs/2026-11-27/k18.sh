#!/usr/bin/env bash
# One GPU: the code of the red-team fixes (the preload shim's second free, rounded-size frees,
# sim waits). 1. The install proof from the wheel alone (tools/gpu/wheel.sh). 2. With the devkit,
# libfragctl_preload.so and tests/interpose/preload_cuda_probe built here (Release), the probe
# run under LD_PRELOAD with FRAGCTL_POLICY=arena and =caching: cudaMalloc/cudaMallocAsync memory
# in kernels and copies, a second cudaFree of a block refused (cudaErrorInvalidValue), the block
# handed out there next whole device memory, the report's counts. 3. The negative control: the
# same probe under the shim of the wheel before the fix (.carry/old-7d767eb.whl, at 7d767eb)
# with caching, where the second cudaFree reaches the real runtime. Results: $OUT/k18.tar.gz.
set -uo pipefail
start=$(date +%s)
el() { echo "[$(( $(date +%s) - start )) s] $*"; }
echo "commit: $(cat .carry/commit)"
M=/tmp/k18; rm -rf $M; mkdir -p $M
(OUT=$M timeout 300 bash tools/gpu/wheel.sh 2>&1 | cut -c1-300 | tail -25)
el "wheel proof done"
source .devkit/devkit.sh unpack
B=/tmp/k18-build
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DFRAGCTL_BUILD_TESTS=ON -DFRAGCTL_BUILD_BENCHMARKS=OFF \
  -DFRAGCTL_WERROR=OFF > $M/configure.log 2>&1 || { tail -20 $M/configure.log; exit 1; }
cmake --build $B --target fragctl_preload preload_cuda_probe -j 16 > $M/build.log 2>&1 || { tail -30 $M/build.log; exit 1; }
el "built"
probe=$(find $B -name preload_cuda_probe -type f -perm -u+x | head -1)
shim=$(find $B -name 'libfragctl_preload.so' | head -1)
for policy in arena caching; do
  LD_PRELOAD=$shim FRAGCTL_BACKEND=cuda FRAGCTL_POLICY=$policy timeout 60 $probe $M/probe-$policy.report.json \
    > $M/probe-$policy.out 2> $M/probe-$policy.err
  echo "probe under the new shim, $policy: exit $?"; cat $M/probe-$policy.out; grep -v "^\s*$" $M/probe-$policy.err | cut -c1-240 | head -6
done
mkdir -p /tmp/k18-old && python3 -m pip install -q --no-index --no-deps --no-cache-dir --target /tmp/k18-old .carry/old-7d767eb.whl
old_shim=$(find /tmp/k18-old -name 'libfragctl_preload.so*' | head -1)
LD_PRELOAD=$old_shim FRAGCTL_BACKEND=cuda FRAGCTL_POLICY=caching timeout 60 $probe $M/probe-old-caching.report.json \
  > $M/probe-old-caching.out 2> $M/probe-old-caching.err
echo "probe under the shim before the fix, caching: exit $?"; cat $M/probe-old-caching.out; grep -v "^\s*$" $M/probe-old-caching.err | cut -c1-240 | head -8
tar -czf $OUT/k18.tar.gz -C $M . 2>/dev/null; el "done"
