#!/usr/bin/env bash
# One GPU: step time at the 16 MiB default (80dc410) in three alternated rounds of native and the
# arena (untraced), on vit (whose growth steps make the most extra calls at 16 MiB) and declm, 16
# steps: native's spread against the arena's mean step. Results: $OUT/j6.tar.gz.
set -uo pipefail
export PYTHONUNBUFFERED=1
start=$(date +%s)
L=/tmp/j6; rm -rf $L; mkdir -p $L
echo "commit: $(cat .carry/commit 2>/dev/null)"
OUT=$L timeout 560 bash tools/gpu/trainers.sh --models ${MODELS:-vit,declm} \
  --runs native,arena,native,arena,native,arena --steps 16 --budget 420 \
  2>&1 | grep -v "^\s*$" | cut -c1-240 | grep -v "^|" | tail -24
grep "^|" $L/trainers.md 2>/dev/null | cut -c1-300
tar -czf $OUT/j6.tar.gz -C $L . 2>/dev/null; echo "done in $(( $(date +%s) - start )) s"
