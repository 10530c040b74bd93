#!/usr/bin/env bash
# One GPU: whether a virtual-memory driver call waits for a busy GPU (benchmarks/vmm/vmm_busy.py),
# then lora for 24 steps under native and the arena, three alternated rounds, after the arena stopped
# waiting for frees in flight below its high-water mark (tools/gpu/trainers.sh --livebytes via
# tools/gpu/runs/2026-11-26/g_trainers_one.sh). Results: $OUT/i7.tar.gz.
set -uo pipefail
export PYTHONUNBUFFERED=1
start=$(date +%s)
L=/tmp/i7; rm -rf $L; mkdir -p $L
echo "commit: $(cat .carry/commit 2>/dev/null)"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $L/gpu.txt
python3 benchmarks/vmm/vmm_busy.py --busy-ms 100 --repeat 5 --mib 32 2>&1 | tee $L/vmm_busy.jsonl
RUNS=native,arena,native,arena,native,arena OUT=$L SHARE=${SHARE:-500} \
  bash tools/gpu/runs/2026-11-26/g_trainers_one.sh lora:24
tar -czf $OUT/i7.tar.gz -C $L . 2>/dev/null; echo "done in $(( $(date +%s) - start )) s"
