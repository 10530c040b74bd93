#!/usr/bin/env bash
# One GPU: lora for 24 steps, the arena first: four arena runs (the first traced, FRAGCTL_TRACE) alternated with
# three native runs, so that three untraced arena runs sit beside three native ones (i7.sh traced one
# of its three). Same code as i7.sh (tools/gpu/trainers.sh --livebytes via
# tools/gpu/runs/2026-11-26/g_trainers_one.sh). Results: $OUT/i8.tar.gz.
set -uo pipefail
export PYTHONUNBUFFERED=1
start=$(date +%s)
L=/tmp/i8; rm -rf $L; mkdir -p $L
echo "commit: $(cat .carry/commit 2>/dev/null)"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $L/gpu.txt
RUNS=arena,native,arena,native,arena,native,arena OUT=$L SHARE=${SHARE:-540} \
  bash tools/gpu/runs/2026-11-26/g_trainers_one.sh lora:24
tar -czf $OUT/i8.tar.gz -C $L . 2>/dev/null; echo "done in $(( $(date +%s) - start )) s"
