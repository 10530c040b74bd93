#!/usr/bin/env bash
# One GPU: issue 32's capacity (deliverable 4), expandable segments against the arena, bisected to 1% of the
# cap (benchmarks/trainers/capacity.py through tools/gpu/capacity.sh), optionally after trainer runs
# (g_trainers.sh's MODEL:STEPS arguments given in TRAIN). The whole call ends within 570 s. Results:
# $OUT/g_cap.tar.gz.
#   TRAIN="kvgen:8" tools/gpu/runs/2026-11-26/g_cap.sh t5,vit,moe
set -uo pipefail
export PYTHONUNBUFFERED=1
start=$(date +%s)
C=/tmp/g_cap; rm -rf $C; mkdir -p $C
if [ -n "${TRAIN:-}" ]; then
  OUT=$C bash tools/gpu/runs/2026-11-26/g_trainers_one.sh ${TRAIN} 2>&1 | tail -25
fi
left=$(( 560 - ($(date +%s) - start) ))
echo "=== capacity $1, $left s"
OUT=$C/capacity timeout $left bash tools/gpu/capacity.sh --models "$1" --setups expandable,arena --steps ${STEPS:-6} \
  --budget $(( left - 90 )) 2>&1 | grep -v "^\s*$" | cut -c1-200 | tail -60
tar -czf $OUT/g_cap.tar.gz -C $C . 2>/dev/null; echo "done in $(( $(date +%s) - start )) s"
