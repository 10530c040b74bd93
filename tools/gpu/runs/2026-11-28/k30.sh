#!/usr/bin/env bash
# One GPU: moe (top-2 of 8) for 32 steps at the 16 MiB default, three alternated rounds of native,
# expandable segments and the arena, untraced: whether the arena's mean step is within native's
# spread once the growth steps are a smaller part of the job (at 16 steps its means were 2.1-8.9%
# above native's, spread 1.8%; at 24 steps and 32 MiB spans within). Results: $OUT/k30.tar.gz.
set -uo pipefail
export PYTHONUNBUFFERED=1
start=$(date +%s)
L=/tmp/k30; rm -rf $L; mkdir -p $L
echo "commit: $(cat .carry/commit 2>/dev/null)"
OUT=$L timeout 580 bash tools/gpu/trainers.sh --models moe \
  --runs native,expandable,arena,expandable,arena,native,arena,native,expandable --steps 32 --budget 470 \
  2>&1 | grep -v "^\s*$" | cut -c1-240 | grep -v "^|" | tail -20
grep "^|" $L/trainers.md 2>/dev/null | cut -c1-400
tar -czf $OUT/k30.tar.gz -C $L . 2>/dev/null; echo "done in $(( $(date +%s) - start )) s"
