#!/usr/bin/env bash
# Call 1 (2 GPUs): the merged tree's checks. Builds into build-gpu (kept on the warm machine).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
source .devkit/devkit.sh unpack
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader
echo "commit $(cat .carry/commit)"
t0=$SECONDS; L=/tmp/logs; mkdir -p $L
export FRAGCTL_LIBRARY=$PWD/build-gpu/libfragctl.so PYTHONPATH=$PWD/python FRAGCTL_TORCH_BUILD_DIR=$PWD/build-gpu/torch-native
(cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DFRAGCTL_BUILD_TESTS=OFF -DFRAGCTL_BUILD_BENCHMARKS=OFF -DFRAGCTL_WERROR=OFF \
  && cmake --build build-gpu -j 30 --target fragctl fragctl_cli fragctl_preload) > $L/build.log 2>&1 &
b=$!
python3 -c "from fragctl import _native; _native.load()" > $L/native.log 2>&1 & n=$!
wait $b || { tail -30 $L/build.log; exit 1; }
wait $n; echo "[$((SECONDS - t0)) s] built; native rc=$?"; grep -iE "error" $L/native.log | head -5
F=$(ls build-gpu/tools/fragctl build-gpu/fragctl 2>/dev/null | head -1)
echo "=== memsplit (torchrun 2)"
mkdir -p $L/ms
FRAGCTL_REPORT="$L/ms/run.{rank}.json" timeout 120 torchrun --nproc-per-node 2 tools/gpu/memsplit_check.py > $L/memsplit.log 2>&1; echo "[$((SECONDS - t0)) s] memsplit rc=$?"
grep -E "check|OOM message|after the group|used but|Error|error" $L/memsplit.log | cut -c1-400 | head -30
$F report $L/ms/run.*.json 2>&1 | head -70
echo "=== torch_checks native"
for c in ipc mempool memory_api snapshot graph; do
  timeout 90 python3 tests/python/torch_checks.py native $c > $L/check-$c.log 2>&1; echo "[$((SECONDS - t0)) s] torch_checks native $c rc=$?"; tail -1 $L/check-$c.log | cut -c1-400
done
echo "=== ipc pairs"
pids=()
for pair in "arena fragctl" "caching fragctl" "caching native" "arena native" "native fragctl" "native native"; do
  set -- $pair
  (timeout 200 python3 benchmarks/interop/ipc_share.py --producer $1 --consumer $2 > $L/ipc-$1-$2.json 2> $L/ipc-$1-$2.err; echo "rc=$?" >> $L/ipc-$1-$2.json) &
  pids+=($!)
done
wait "${pids[@]}"
for f in $L/ipc-*.json; do echo "--- $(basename $f)"; cut -c1-600 $f; grep -v "^frame #" ${f%.json}.err | grep -iE "error|what" | head -2 | cut -c1-300; done
echo "[$((SECONDS - t0)) s] === peer access"
for a in --no-enable ""; do timeout 120 python3 benchmarks/interop/peer_access.py $a 2>$L/peer$a.err | tail -1 | cut -c1-800; echo "rc=${PIPESTATUS[0]}"; grep -iE "error|illegal" $L/peer$a.err | head -3; done
echo "[$((SECONDS - t0)) s] === pause/resume"
timeout 120 python3 benchmarks/interop/pause_resume.py --keep host 2>&1 | grep "^{" | cut -c1-800
tar -czf $OUT/c1-logs.tar.gz -C $L . ; echo "[$((SECONDS - t0)) s] done"
