#!/usr/bin/env bash
# One GPU: one job (argument MODEL:STEPS) under native, expandable segments and the arena, three
# alternated rounds (tools/gpu/trainers.sh --livebytes via g_trainers_one.sh), within the call.
# Results: $OUT/h2.tar.gz. Ran as `h2.sh declm:24` and `h2.sh lora:10`.
set -uo pipefail
export PYTHONUNBUFFERED=1
start=$(date +%s)
L=/tmp/h2; rm -rf $L; mkdir -p $L
OUT=$L SHARE=${SHARE:-575} bash tools/gpu/runs/2026-11-26/g_trainers_one.sh "$1"
tar -czf $OUT/h2.tar.gz -C $L . 2>/dev/null; echo "done in $(( $(date +%s) - start )) s"
