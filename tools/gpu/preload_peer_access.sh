#!/usr/bin/env bash
# Peer access under LD_PRELOAD on two GPUs (docs/interop.md, "Peer access"):
# benchmarks/interop/peer_access.py --preload under `fragctl run --policy
# arena` with PyTorch's cudaMallocAsync backend, so every tensor is arena
# memory the shim serves and the grants come from its intercepted
# cudaDeviceEnablePeerAccess. Then PyTorch's own cudaMallocAsync (no shim) as
# the reference. With CONTROL_PRELOAD=path/to/an/older/libfragctl_preload.so
# (a build without the interception) it runs that too: it should fail (an
# illegal memory access on cuda:1, or inexact copies).
# Run from the repository root after building libfragctl.so, fragctl_preload
# and the fragctl command into build-gpu/ (BUILD=dir names another; e.g.
# FRAGCTL_BUILD_DIR=build-gpu tools/build.sh -DFRAGCTL_BUILD_TESTS=OFF).
# Passes when the fragctl run prints "ok": true (every copy exact, and
# "fragctl": {"0": {"allocator": "arena", "live_bytes": >0}, "1": ...})
# with rc=0; the reference run must say "ok": true too.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync
build=${BUILD:-build-gpu}
out=${OUT:-/tmp}
run() {  # run NAME PRELOAD
  echo "--- $1"
  FRAGCTL_LIBRARY=$(dirname "$2")/libfragctl.so PYTHONPATH=$PWD/python \
    timeout 240 python3 -m fragctl run --policy arena --preload "$2" -- \
    python3 benchmarks/interop/peer_access.py --preload 2>"$out/preload-peer-$1.err" | tail -1
  echo "rc=${PIPESTATUS[0]}"
  grep -v "^frame #" "$out/preload-peer-$1.err" | grep -iE "error|illegal|what" | head -3
}
run fragctl "$PWD/$build/libfragctl_preload.so"
echo "--- PyTorch's cudaMallocAsync (no shim)"
PYTHONPATH=$PWD/python timeout 240 python3 benchmarks/interop/peer_access.py --no-enable | tail -1
echo "rc=${PIPESTATUS[0]}"
if [[ -n "${CONTROL_PRELOAD:-}" ]]; then run control "$CONTROL_PRELOAD"; fi
