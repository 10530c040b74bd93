#!/usr/bin/env bash
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
source .devkit/devkit.sh unpack
echo "commit $(cat .carry/commit)"; t0=$SECONDS
(cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DFRAGCTL_BUILD_TESTS=OFF -DFRAGCTL_BUILD_BENCHMARKS=OFF -DFRAGCTL_WERROR=OFF \
  && cmake --build build-gpu -j 30 --target fragctl fragctl_cli fragctl_preload) > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
echo "[$((SECONDS - t0)) s] built"
BUILD=build-gpu OUT=/tmp timeout 200 bash tools/gpu/preload_peer_access.sh 2>&1 | cut -c1-1500
cp /tmp/preload-peer-fragctl.err $OUT/ 2>/dev/null; echo "[$((SECONDS - t0)) s] done"
