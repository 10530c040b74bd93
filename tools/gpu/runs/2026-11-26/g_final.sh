#!/usr/bin/env bash
# One GPU: the merged plan (planstart and fastpath100) live: declm (24 steps) native and arena alternated
# twice, then lora (10 steps) native, arena and arena. Results: $OUT/g_final.tar.gz.
set -uo pipefail
export PYTHONUNBUFFERED=1
start=$(date +%s)
F=/tmp/g_final; rm -rf $F; mkdir -p $F
RUNS=native,arena,native,arena OUT=$F SHARE=300 bash tools/gpu/runs/2026-11-26/g_trainers_one.sh declm:24
left=$(( 570 - ($(date +%s) - start) ))
RUNS=native,arena,arena OUT=$F SHARE=$left bash tools/gpu/runs/2026-11-26/g_trainers_one.sh lora:10
tar -czf $OUT/g_final.tar.gz -C $F . 2>/dev/null; echo "done in $(( $(date +%s) - start )) s"
