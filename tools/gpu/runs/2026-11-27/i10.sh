#!/usr/bin/env bash
# One GPU: spans of 16 MiB against 32 (map_chunk) on the two variable-shape jobs nearest 1.01 (moe,
# declm), 24 steps: native, expandable segments, then the arena and the arena with map_chunk:16MiB
# alternated twice (the first arena run traced). Ratio, device memory, driver calls per step, step
# time side by side. Results: $OUT/i10.tar.gz.
set -uo pipefail
export PYTHONUNBUFFERED=1
start=$(date +%s)
L=/tmp/i10; rm -rf $L; mkdir -p $L
echo "commit: $(cat .carry/commit 2>/dev/null)"
OUT=$L timeout 560 bash tools/gpu/trainers.sh --livebytes --models ${MODELS:-moe,declm} \
  --runs native,expandable,arena,arena-16,arena,arena-16 --steps 24 --budget 440 2>&1 | grep -v "^\s*$" | cut -c1-240 | grep -v "^|" | tail -30
grep "^|" $L/trainers.md 2>/dev/null | cut -c1-400
tar -czf $OUT/i10.tar.gz -C $L . 2>/dev/null; echo "done in $(( $(date +%s) - start )) s"
