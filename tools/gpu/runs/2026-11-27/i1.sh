#!/usr/bin/env bash
# One GPU: lora for 24 steps under native and the arena, three alternated rounds, then expandable
# segments once if the call's time allows (tools/gpu/trainers.sh --livebytes via
# tools/gpu/runs/2026-11-26/g_trainers_one.sh): issue 32's step time within native's spread on the
# one job whose 10-step runs were above it. Results: $OUT/i1.tar.gz.
set -uo pipefail
export PYTHONUNBUFFERED=1
start=$(date +%s)
L=/tmp/i1; rm -rf $L; mkdir -p $L
echo "commit: $(cat .carry/commit 2>/dev/null)"
RUNS=native,arena,native,arena,native,arena,expandable OUT=$L SHARE=${SHARE:-570} \
  bash tools/gpu/runs/2026-11-26/g_trainers_one.sh lora:24
tar -czf $OUT/i1.tar.gz -C $L . 2>/dev/null; echo "done in $(( $(date +%s) - start )) s"
