#!/usr/bin/env bash
# One GPU: moe (top-2 of 8, the job nearest 1.01) for 24 steps in three alternated rounds of native,
# expandable segments and the arena, untraced, after one traced arena run first (the replay's input):
# the ratio at the default 32 MiB spans over more runs, device memory, driver calls per step, step
# time and its spread. Results: $OUT/j2.tar.gz.
set -uo pipefail
export PYTHONUNBUFFERED=1
start=$(date +%s)
L=/tmp/j2; rm -rf $L; mkdir -p $L
echo "commit: $(cat .carry/commit 2>/dev/null)"
OUT=$L timeout 570 bash tools/gpu/trainers.sh --livebytes --models ${MODELS:-moe} \
  --runs arena,native,expandable,arena,expandable,arena,native,arena,native,expandable --steps 24 --budget 470 \
  2>&1 | grep -v "^\s*$" | cut -c1-240 | grep -v "^|" | tail -30
grep "^|" $L/trainers.md 2>/dev/null | cut -c1-400
tar -czf $OUT/j2.tar.gz -C $L . 2>/dev/null; echo "done in $(( $(date +%s) - start )) s"
