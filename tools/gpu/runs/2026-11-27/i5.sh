#!/usr/bin/env bash
# One GPU: the wheel's install proof at the session's last commit (tools/gpu/wheel.sh: the wheel built
# here by tools/wheel.sh and carried alone in dist/, no devkit: torch_checks under enable() and under
# `fragctl run`, the gpt2m trainer), then declm for 12 steps under native and the arena
# (tools/gpu/trainers.sh --livebytes). Results: $OUT/i5.tar.gz.
set -uo pipefail
export PYTHONUNBUFFERED=1
start=$(date +%s)
L=/tmp/i5; rm -rf $L; mkdir -p $L
echo "commit: $(cat .carry/commit 2>/dev/null)"
(OUT=$L timeout 270 bash tools/gpu/wheel.sh 2>&1 | cut -c1-400)
echo "[wheel proof done at $(( $(date +%s) - start )) s]"
left=$(( 570 - ($(date +%s) - start) ))
RUNS=native,arena OUT=$L SHARE=$left bash tools/gpu/runs/2026-11-26/g_trainers_one.sh declm:12
tar -czf $OUT/i5.tar.gz -C $L . 2>/dev/null; echo "done in $(( $(date +%s) - start )) s"
