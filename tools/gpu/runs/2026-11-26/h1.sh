#!/usr/bin/env bash
# One GPU: the install proof of the wheel at the session's last commit (tools/gpu/wheel.sh: no devkit,
# nothing built but the native module's first-use compile), then lora for 24 steps under the arena
# (traced) and native, to see the plan after the 10 steps measured so far. Results: $OUT/h1.tar.gz.
set -uo pipefail
export PYTHONUNBUFFERED=1
start=$(date +%s)
L=/tmp/h1; rm -rf $L; mkdir -p $L
(OUT=$L timeout 240 bash tools/gpu/wheel.sh 2>&1 | cut -c1-400)
echo "[wheel proof done at $(( $(date +%s) - start )) s]"
left=$(( 565 - ($(date +%s) - start) ))
RUNS=arena,native OUT=$L SHARE=$left bash tools/gpu/runs/2026-11-26/g_trainers_one.sh lora:24
tar -czf $OUT/h1.tar.gz -C $L . 2>/dev/null; echo "done in $(( $(date +%s) - start )) s"
