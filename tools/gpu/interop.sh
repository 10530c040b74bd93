#!/usr/bin/env bash
# Interop checks (docs/interop.md): peer access on two GPUs with main's tree and, as the control,
# the tree of 3567a29 unpacked in .before/ (git archive 3567a29 | tar -x -C .before); MemPool on one.
# Run from the repository root with .devkit and .before carried; OUT names the results folder.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
source .devkit/devkit.sh unpack
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader
nvidia-smi topo -m | head -4
t0=$SECONDS
build() {  # build TREE: libfragctl.so and the native module of TREE
  (cd "$1" && FRAGCTL_BUILD_TYPE=Release FRAGCTL_BUILD_DIR=build-gpu tools/build.sh -DFRAGCTL_BUILD_TESTS=OFF \
    -DFRAGCTL_BUILD_BENCHMARKS=OFF -DFRAGCTL_WERROR=OFF > $OUT/build-$(basename $1).log 2>&1) || { tail -20 $OUT/build-$(basename $1).log; return 1; }
}
build . && build .before || exit 1
echo "[$((SECONDS - t0)) s] built"
run() {  # run TREE ARGS...
  local tree=$1; shift
  FRAGCTL_LIBRARY=$PWD/$tree/build-gpu/libfragctl.so PYTHONPATH=$PWD/$tree/python FRAGCTL_TORCH_BUILD_DIR=$PWD/$tree/build-gpu/torch-native \
    timeout 240 python3 benchmarks/interop/peer_access.py "$@" 2>$OUT/err-$(basename $tree)-$#.txt | tail -1
  echo "rc=${PIPESTATUS[0]}"
  grep -v "^frame #" $OUT/err-$(basename $tree)-$#.txt | grep -iE "error|illegal|what" | head -3
}
echo "--- PyTorch's own allocator"; run . --no-enable
echo "--- fragctl, main"; run .
echo "--- fragctl, before (3567a29): control"; run .before
echo "--- MemPool under the native route (main) and PyTorch"
for route in native torch; do
  FRAGCTL_LIBRARY=$PWD/build-gpu/libfragctl.so PYTHONPATH=$PWD/python FRAGCTL_TORCH_BUILD_DIR=$PWD/build-gpu/torch-native \
    timeout 120 python3 tests/python/torch_checks.py $route mempool 2>$OUT/mempool-$route.err | tail -1; echo "rc=${PIPESTATUS[0]}"
  grep -v "^frame #" $OUT/mempool-$route.err | grep -iE "error|what" | head -3
done
echo "[$((SECONDS - t0)) s] done"
