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
  local name=$1 hook=$2 mode=$3; shift 3
  TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK=$hook NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,REG \
    timeout 90 torchrun --nproc-per-node 2 benchmarks/interop/nccl_register.py "$mode" "$OUT/$name.json" "$@" \
    > "$OUT/$name.out" 2> "$OUT/$name.err"
  local rc=$?
  # NCCL writes its INFO lines to standard output.
  echo "--- $name rc=$rc NCCL lines naming registration: $(grep -ci 'regist' "$OUT/$name.out")"
  grep '^{' "$OUT/$name.out" | tail -1
  grep -v "^frame #" "$OUT/$name.err" | grep -iE "error|warn.*fragctl|Traceback|what\(\)" | head -4
}
for m in ${MODES:-native fragctl native-reg fragctl-reg fragctl-reg-1g native-pool fragctl-pool}; do
  case $m in
    fragctl-reg-1g) run $m 1 fragctl-reg map_chunk=1GiB ;;
    *-reg) run $m 1 $m ;;
    *) run $m 0 $m ;;
  esac
done
for m in ${MODES:-fragctl-reg fragctl-reg-1g}; do
  [ -f "$OUT/$m.out" ] || continue
  echo "--- $m: NCCL's registration lines (count, text without addresses)"
  grep -i "regist" "$OUT/$m.out" | sed -E 's/^[^ ]+ //; s/0x[0-9a-f]+/0x_/g; s/[0-9]{5,}/N/g' | sort | uniq -c | sort -rn | head -6
done
tar -czf "$OUT/logs.tar.gz" -C "$OUT" --exclude=logs.tar.gz . && find "$OUT" -type f ! -name logs.tar.gz ! -name "*.json" -delete
echo "[$((SECONDS - t0)) s] done"
