#!/usr/bin/env bash
# Two GPUs (nvidia-h200-x2), issue 21: ZeRO-3 beside FSDP2 on two H200s, one round of three
# variants (FSDP2 on PyTorch's allocator, zero3.shard under enable("arena"), FSDP2 under
# enable("arena"); a 1.26 B Llama, 50 steps, NCCL), then a rank that stops (nccl_hang.py).
# Laid out for the session's last 6 minutes of device time. Results: $OUT/zero3_multi/ and $OUT/k47.tar.gz.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
start=$(date +%s)
cp .carry/commit .commit 2>/dev/null
echo "commit: $(cat .carry/commit 2>/dev/null)"
REPEAT=1 VARIANTS=fsdp2,zero3-arena,fsdp2-arena BENCH_ARGS="--job-timeout 75" OUT=$OUT timeout 320 bash tools/gpu/zero3_multi.sh 2>&1 | cut -c1-300
echo "done in $(( $(date +%s) - start )) s"
