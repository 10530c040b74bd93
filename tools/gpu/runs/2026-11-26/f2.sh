#!/usr/bin/env bash
# Two GPUs, the merged tree after the evening's branches: natpools' checks, the memory split report, LD_PRELOAD peer access, zero3 speed.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
source .devkit/devkit.sh unpack
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader
echo "commit $(cat .carry/commit)"
t0=$SECONDS; L=/tmp/f2; mkdir -p $L/ms
export FRAGCTL_LIBRARY=$PWD/build-gpu/libfragctl.so PYTHONPATH=$PWD/python FRAGCTL_TORCH_BUILD_DIR=$PWD/build-gpu/torch-native
(cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DFRAGCTL_BUILD_TESTS=OFF -DFRAGCTL_BUILD_BENCHMARKS=OFF -DFRAGCTL_WERROR=OFF \
  && cmake --build build-gpu -j 30 --target fragctl fragctl_cli fragctl_preload) > $L/build.log 2>&1 & b=$!
python3 -c "from fragctl import _native; _native.load()" > $L/native.log 2>&1 & n=$!
wait $b || { tail -30 $L/build.log; exit 1; }
wait $n; echo "[$((SECONDS - t0)) s] built; native rc=$?"; grep -iE "error" $L/native.log | head -5
echo "=== torch_checks (natpools)"
for c in "native mempool_graph" "native memory_api" "torch memory_api" "native ipc_control" "native mempool"; do
  timeout 100 python3 tests/python/torch_checks.py $c > "$L/check-${c/ /-}.log" 2>&1; echo "[$((SECONDS - t0)) s] $c rc=$?"; tail -1 "$L/check-${c/ /-}.log" | cut -c1-700
done
echo "=== memsplit + report"
FRAGCTL_REPORT="$L/ms/run.{rank}.json" timeout 120 torchrun --nproc-per-node 2 tools/gpu/memsplit_check.py > $L/memsplit.log 2>&1; echo "[$((SECONDS - t0)) s] memsplit rc=$?"
grep -c "check .*: ok" $L/memsplit.log; grep "FAILED" $L/memsplit.log | head
build-gpu/tools/fragctl report $L/ms/run.*.json 2>&1 | sed -n '/Device memory that is not/,$p' | head -24
echo "=== LD_PRELOAD peer access"
BUILD=build-gpu OUT=$L timeout 200 bash tools/gpu/preload_peer_access.sh 2>&1 | cut -c1-900
echo "[$((SECONDS - t0)) s] === cuBLAS workspace"
timeout 60 python3 tools/gpu/cublas_workspace.py arena 2>&1 | tail -6 | cut -c1-300
tar -czf $OUT/f2.tar.gz -C $L . ; echo "[$((SECONDS - t0)) s] === zero3"
FRAGCTL_BUILD_DIR=$PWD/build-gpu REPEAT=2 HANG=0 VARIANTS=fsdp2,zero3-arena,zero3-arena-ahead2 OUT=$OUT timeout 400 bash tools/gpu/zero3_multi.sh 2>&1 | grep -E "^\||zero3_multi" | cut -c1-400
echo "[$((SECONDS - t0)) s] done"
