#!/usr/bin/env bash
# One GPU: k18's preload_cuda_probe ended by SIGSEGV after writing its report (under arena and
# caching). Where, and is it the change: the shim built here at this commit (devkit), the probe
# with a line on stderr after each check (.carry/probe_diag.cpp, not kept), the probe as it was
# before the second-free checks (.carry/probe_before.cpp, HEAD~1's), each under the new shim and
# under the shim of the wheel before the fix (.carry/oldwheel, at 7d767eb); a backtrace with gdb
# where the machine has it. Results: $OUT/k19.tar.gz.
set -uo pipefail
start=$(date +%s)
el() { echo "[$(( $(date +%s) - start )) s] $*"; }
echo "commit: $(cat .carry/commit)"
M=/tmp/k19; rm -rf $M; mkdir -p $M
source .devkit/devkit.sh unpack
B=/tmp/k19-build
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DFRAGCTL_BUILD_TESTS=OFF -DFRAGCTL_BUILD_BENCHMARKS=OFF \
  -DFRAGCTL_WERROR=OFF > $M/configure.log 2>&1 || { tail -20 $M/configure.log; exit 1; }
cmake --build $B --target fragctl_preload -j 16 > $M/build.log 2>&1 || { tail -30 $M/build.log; exit 1; }
shim=$(find $B -name 'libfragctl_preload.so' | head -1)
inc=$(dirname "$(find /usr/local /usr -name cuda_runtime_api.h 2>/dev/null | head -1)")
lib=$(dirname "$(find /usr/local /usr -name 'libcudart.so' 2>/dev/null | head -1)")
echo "cuda include $inc lib $lib"
for p in probe_diag probe_before; do
  g++ -std=c++20 -O1 -g .carry/$p.cpp -I"$inc" -L"$lib" -Wl,-rpath,"$lib" -lcudart -ldl -o $M/$p || exit 1
done
python3 -m pip install -q --no-index --no-deps --no-cache-dir --target /tmp/k19-old .carry/oldwheel/*.whl
old_shim=$(find /tmp/k19-old -name 'libfragctl_preload.so*' | head -1)
el "built; old shim $old_shim"
run() {  # name shim policy probe
  LD_PRELOAD=$2 FRAGCTL_BACKEND=cuda FRAGCTL_POLICY=$3 timeout 60 $M/$4 $M/$1.report.json > $M/$1.out 2> $M/$1.err
  local rc=$?
  echo "$1: exit $rc; last stderr lines:"; grep -v "^\s*$" $M/$1.err | tail -3 | cut -c1-200; cat $M/$1.out
}
run diag-new-arena "$shim" arena probe_diag
run before-new-arena "$shim" arena probe_before
run before-old-arena "$old_shim" arena probe_before
run before-new-caching "$shim" caching probe_before
run diag-old-caching "$old_shim" caching probe_diag
run diag-new-caching "$shim" caching probe_diag
if command -v gdb > /dev/null; then
  FRAGCTL_BACKEND=cuda FRAGCTL_POLICY=arena timeout 120 gdb -batch -ex "set environment LD_PRELOAD=$shim" \
    -ex run -ex bt --args $M/probe_before $M/gdb.report.json > $M/gdb.txt 2>&1
  grep -A25 "SIGSEGV" $M/gdb.txt | head -40
else
  echo "no gdb"
fi
tar -czf $OUT/k19.tar.gz -C $M --exclude=probe_diag --exclude=probe_before . 2>/dev/null; el "done"
