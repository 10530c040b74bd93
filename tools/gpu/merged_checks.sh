#!/usr/bin/env bash
# Checks of the merged tree on 2 GPUs (NPROC=1 for one): the memory split (issue 31), the native module with IPC, forwarding pools and spans (issue 30). Run from the repository root with .devkit carried.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
source .devkit/devkit.sh unpack
t0=$SECONDS
FRAGCTL_BUILD_TYPE=Release FRAGCTL_BUILD_DIR=build-gpu tools/build.sh -DFRAGCTL_BUILD_TESTS=OFF \
  -DFRAGCTL_BUILD_BENCHMARKS=OFF -DFRAGCTL_WERROR=OFF > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
echo "[$((SECONDS - t0)) s] built $(git rev-parse --short HEAD 2>/dev/null)"
export FRAGCTL_LIBRARY=$PWD/build-gpu/libfragctl.so PYTHONPATH=$PWD/python FRAGCTL_TORCH_BUILD_DIR=$PWD/build-gpu/torch-native
python3 -c "from fragctl import _native; _native.load()" > $OUT/native.log 2>&1; echo "[$((SECONDS - t0)) s] native module rc=$?"; grep -E "error" $OUT/native.log | head -5
mkdir -p $OUT/ms
FRAGCTL_REPORT="$OUT/ms/run.{rank}.json" timeout 120 torchrun --nproc-per-node ${NPROC:-2} tools/gpu/memsplit_check.py > $OUT/memsplit.log 2>&1; echo "[$((SECONDS - t0)) s] memsplit rc=$?"
grep -E "check|OOM message|after the group|split" $OUT/memsplit.log | cut -c1-300 | head -30
F=$(ls build-gpu/tools/fragctl build-gpu/fragctl 2>/dev/null | head -1)
$F report $OUT/ms/run.*.json 2>&1 | head -60
for c in ipc mempool memory_api snapshot graph; do
  timeout 90 python3 tests/python/torch_checks.py native $c > $OUT/check-$c.log 2>&1; echo "[$((SECONDS - t0)) s] torch_checks native $c rc=$?"; tail -2 $OUT/check-$c.log | cut -c1-300
done
