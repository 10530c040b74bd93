#!/usr/bin/env bash
# NCCL collectives on fragctl memory on two GPUs (docs/benchmarks.md, "NCCL
# buffer registration and MemPool(allocator=...)"): builds the library and the
# native module, then runs benchmarks/interop/nccl_register.py in each mode.
# Logs under $OUT (or ./nccl_register_out).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-$PWD/nccl_register_out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader
t0=$SECONDS
(FRAGCTL_BUILD_TYPE=Release FRAGCTL_BUILD_DIR=build-gpu tools/build.sh -DFRAGCTL_BUILD_TESTS=OFF \
  -DFRAGCTL_BUILD_BENCHMARKS=OFF -DFRAGCTL_WERROR=OFF > "$OUT/build.log" 2>&1) || { tail -20 "$OUT/build.log"; exit 1; }
export FRAGCTL_LIBRARY=$PWD/build-gpu/libfragctl.so PYTHONPATH=$PWD/python FRAGCTL_TORCH_BUILD_DIR=$PWD/build-gpu/torch-native
python3 -c "from fragctl import _native; _native.load()" > "$OUT/native-build.log" 2>&1 || { tail -30 "$OUT/native-build.log"; exit 1; }
python3 -c "import torch, torch.cuda.nccl as n; print('torch', torch.__version__, 'nccl', n.version())"
echo "[$((SECONDS - t0)) s] built"
run() {  # run NAME HOOK MODE [options...]
  local name=$1 hook=$2; shift 2
  TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK=$hook NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=REG \
    timeout 90 torchrun --nproc-per-node 2 benchmarks/interop/nccl_register.py "$@" "$OUT/$name.json" \
    > "$OUT/$name.out" 2> "$OUT/$name.err"
  echo "--- $name rc=$? NCCL register lines: $(grep -ci 'regist' "$OUT/$name.err")"
  grep '^{' "$OUT/$name.out" | tail -1
  grep -v "^frame #" "$OUT/$name.err" | grep -iE "error|warn.*fragctl|Traceback|what\(\)" | head -4
}
run native 0 native
run fragctl 0 fragctl
run native-reg 1 native-reg
run fragctl-reg 1 fragctl-reg
run fragctl-reg-1g 1 fragctl-reg map_chunk=1GiB
run native-pool 0 native-pool
run fragctl-pool 0 fragctl-pool
grep -hi "regist" "$OUT"/fragctl-reg.err | sort | uniq -c | sort -rn | head -8
echo "[$((SECONDS - t0)) s] done"
