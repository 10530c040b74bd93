#!/usr/bin/env bash
# One GPU: the two variable-shape jobs nearest 1.01 (declm, moe), 24 steps, under native, expandable
# segments and the arena twice (the first traced), after the arena stopped waiting for frees in flight
# below its high-water mark (5e500e5): the ratio, device memory against expandable segments, driver
# calls per step. Results: $OUT/i9.tar.gz.
set -uo pipefail
export PYTHONUNBUFFERED=1
start=$(date +%s)
L=/tmp/i9; rm -rf $L; mkdir -p $L
echo "commit: $(cat .carry/commit 2>/dev/null)"
OUT=$L timeout 560 bash tools/gpu/trainers.sh --livebytes --models ${MODELS:-declm,moe} \
  --runs native,expandable,arena,arena --steps 24 --budget 430 2>&1 | grep -v "^\s*$" | cut -c1-240 | grep -v "^|" | tail -30
grep "^|" $L/trainers.md 2>/dev/null | cut -c1-400
tar -czf $OUT/i9.tar.gz -C $L . 2>/dev/null; echo "done in $(( $(date +%s) - start )) s"
