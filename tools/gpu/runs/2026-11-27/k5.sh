#!/usr/bin/env bash
# One GPU: the install proof at this session's commit (the wheel built on the project's machine
# with tools/wheel.sh, carried alone in dist/, no devkit: tools/gpu/wheel.sh), then vit for 40
# steps, native and the arena in three alternated rounds (how much of a longer job the growth
# steps are). Results: $OUT/k5.tar.gz.
set -uo pipefail
export PYTHONUNBUFFERED=1
start=$(date +%s)
L=/tmp/k5; rm -rf $L; mkdir -p $L
echo "commit: $(cat .carry/commit 2>/dev/null)"
(OUT=$L timeout 260 bash tools/gpu/wheel.sh 2>&1 | cut -c1-300 | tail -40)
echo "[wheel proof done at $(( $(date +%s) - start )) s]"
OUT=$L timeout $(( 580 - ($(date +%s) - start) )) bash tools/gpu/trainers.sh --models vit \
  --runs native,arena,native,arena,native,arena --steps 40 --budget 300 \
  2>&1 | grep -v "^\s*$" | cut -c1-240 | grep -v "^|" | tail -14
grep "^|" $L/trainers.md 2>/dev/null | cut -c1-300
tar -czf $OUT/k5.tar.gz -C $L . 2>/dev/null; echo "done in $(( $(date +%s) - start )) s"
