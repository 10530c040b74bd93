#!/usr/bin/env bash
# CUDA IPC checks (docs/interop.md, "Sharing tensors between processes"; issue 30, item 1):
# cuMemCreate with and without the shareable handle type, then benchmarks/interop/ipc_share.py for
# each producer and consumer pairing. Run from the repository root with .devkit carried; OUT names
# the results folder.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
source .devkit/devkit.sh unpack
source tools/gpu/common.sh ipc
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader | head -1
echo "ptrace_scope=$(cat /proc/sys/kernel/yama/ptrace_scope 2>/dev/null || echo none) kernel=$(uname -r)"
note "cuMemCreate by handle type (before the build, on a quiet machine)"
python3 benchmarks/vmm/create_handle_type.py --rounds 15 --count 64 | tee $out/create_handle_type.json
(FRAGCTL_BUILD_TYPE=Release FRAGCTL_BUILD_DIR=build-gpu tools/build.sh -DFRAGCTL_BUILD_TESTS=OFF \
  -DFRAGCTL_BUILD_BENCHMARKS=OFF -DFRAGCTL_WERROR=OFF > $out/build.log 2>&1) || { tail -30 $out/build.log; exit 1; }
export FRAGCTL_LIBRARY=$PWD/build-gpu/libfragctl.so PYTHONPATH=$PWD/python FRAGCTL_TORCH_BUILD_DIR=$PWD/build-gpu/torch-native
note "built; the native module next"
python3 -c "import torch, fragctl.torch; fragctl.torch.enable(); torch.empty(1, device='cuda'); print(fragctl.torch.route())" \
  > $out/native-build.log 2>&1 || { tail -30 $out/native-build.log; exit 1; }
note "native module built"
pids=()
for pair in "arena fragctl" "caching fragctl" "caching native" "arena native" "native fragctl" "native native"; do
  set -- $pair
  (timeout 240 python3 benchmarks/interop/ipc_share.py --producer $1 --consumer $2 > $out/ipc-$1-$2.json \
    2> $out/ipc-$1-$2.err; echo "rc=$?" >> $out/ipc-$1-$2.json) &
  pids+=($!)
done
wait "${pids[@]}"
for f in $out/ipc-*.json; do echo "--- $(basename $f)"; cat $f; grep -v "^frame #" ${f%.json}.err | grep -iE "error|what" | head -3; done
note "done"
