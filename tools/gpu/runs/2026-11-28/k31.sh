#!/usr/bin/env bash
# One GPU: lifetime placement (arena_policy.cpp, "Blocks that outlive a step") live on the job it
# was made for: the decoder LM with gradient accumulation (2 micro-batches) and evaluations, 24
# optimizer steps: the arena (traced: its replay at four lags is checked against the live ratio),
# native, the arena without it (lifetime_placement:false, run arena-nolifetime), expandable
# segments, the arena again. Results: $OUT/k31.tar.gz.
set -uo pipefail
export PYTHONUNBUFFERED=1
start=$(date +%s)
L=/tmp/k31; rm -rf $L; mkdir -p $L
echo "commit: $(cat .carry/commit 2>/dev/null)"
OUT=$L timeout 570 bash tools/gpu/trainers.sh --livebytes --models declm --accumulate 2 --eval-every 6 \
  --eval-batches 4 --runs arena,native,arena-nolifetime,expandable,arena --steps 24 --budget 470 \
  2>&1 | grep -v "^\s*$" | cut -c1-240 | grep -v "^|" | tail -16
grep "^|" $L/trainers.md 2>/dev/null | cut -c1-400
tar -czf $OUT/k31.tar.gz -C $L . 2>/dev/null; echo "done in $(( $(date +%s) - start )) s"
