#!/usr/bin/env bash
# One GPU: gradient accumulation and evaluations, as a Trainer with gradient_accumulation_steps=2 and
# eval_steps=6 runs: ${MODELS:-declm,t5}, 24 optimizer steps of 2 micro-batches, an evaluation of 4 batches
# after steps 6, 12 and 18, under native, expandable segments and the arena (traced). Results: $OUT/h4.tar.gz.
set -uo pipefail
export PYTHONUNBUFFERED=1
start=$(date +%s)
L=/tmp/h4; rm -rf $L; mkdir -p $L
OUT=$L timeout 560 bash tools/gpu/trainers.sh --livebytes --models ${MODELS:-declm,t5} --runs native,expandable,arena \
  --steps 24 --accumulate 2 --eval-every 6 --eval-batches 4 --budget 400 2>&1 | grep -v "^\s*$" | cut -c1-240 | grep -v "^|" | tail -30
grep "^|" $L/trainers.md 2>/dev/null | cut -c1-400
tar -czf $OUT/h4.tar.gz -C $L . 2>/dev/null; echo "done in $(( $(date +%s) - start )) s"
