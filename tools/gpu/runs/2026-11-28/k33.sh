#!/usr/bin/env bash
# One GPU: moe (top-2 of 8) for 96 steps at the 16 MiB default, three alternated rounds of native,
# expandable segments and the arena, untraced: the step-time target at a longer job. At 32 steps
# (k30) the arena's steady steps 11-32 were native's and its growth steps 3-10 cost 70-130 ms more
# in all, so one run of three landed +6.5% against native's 5.1% spread. Results: $OUT/k33.tar.gz.
set -uo pipefail
export PYTHONUNBUFFERED=1
start=$(date +%s)
L=/tmp/k33; rm -rf $L; mkdir -p $L
echo "commit: $(cat .carry/commit 2>/dev/null)"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
OUT=$L timeout 575 bash tools/gpu/trainers.sh --models moe \
  --runs native,expandable,arena,expandable,arena,native,arena,native,expandable --steps 96 --budget 470 \
  2>&1 | grep -v "^\s*$" | cut -c1-240 | grep -v "^|" | tail -20
grep "^|" $L/trainers.md 2>/dev/null | cut -c1-400
tar -czf $OUT/k33.tar.gz -C $L . 2>/dev/null; echo "done in $(( $(date +%s) - start )) s"
