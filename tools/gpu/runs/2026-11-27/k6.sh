#!/usr/bin/env bash
# One GPU (after k5.sh, the trainers' build kept): declm for 32 steps, native and the arena in
# three alternated rounds. Results: $OUT/k6.tar.gz.
set -uo pipefail
export PYTHONUNBUFFERED=1
start=$(date +%s)
L=/tmp/k6; rm -rf $L; mkdir -p $L
echo "commit: $(cat .carry/commit 2>/dev/null)"
OUT=$L timeout 580 bash tools/gpu/trainers.sh --models declm \
  --runs native,arena,native,arena,native,arena --steps 32 --budget 480 \
  2>&1 | grep -v "^\s*$" | cut -c1-240 | grep -v "^|" | tail -14
grep "^|" $L/trainers.md 2>/dev/null | cut -c1-300
tar -czf $OUT/k6.tar.gz -C $L . 2>/dev/null; echo "done in $(( $(date +%s) - start )) s"
