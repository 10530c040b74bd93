#!/usr/bin/env bash
# One GPU: spans of 16 MiB as the default (80dc410) on kvgen and frozen (the two jobs not run live at 16 MiB yet), 16 steps:
# native, expandable segments, the arena (traced), the arena at the old 32 MiB (arena-32), the arena again: ratio, device memory against expandable segments, driver calls per step, step time.
# Results: $OUT/j5.tar.gz.
set -uo pipefail
export PYTHONUNBUFFERED=1
start=$(date +%s)
L=/tmp/j5; rm -rf $L; mkdir -p $L
echo "commit: $(cat .carry/commit 2>/dev/null)"
OUT=$L timeout 575 bash tools/gpu/trainers.sh --livebytes --models ${MODELS:-kvgen,frozen} \
  --runs native,expandable,arena,arena-32,arena --steps 16 --budget 470 \
  2>&1 | grep -v "^\s*$" | cut -c1-240 | grep -v "^|" | tail -30
grep "^|" $L/trainers.md 2>/dev/null | cut -c1-400
tar -czf $OUT/j5.tar.gz -C $L . 2>/dev/null; echo "done in $(( $(date +%s) - start )) s"
