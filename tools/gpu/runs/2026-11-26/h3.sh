#!/usr/bin/env bash
# One GPU: training with evaluation between steps, as a Trainer with eval_steps does: ${MODELS:-declm,vit},
# 24 steps, an evaluation of 4 batches after steps 6, 12 and 18 (train_one.py --eval-every 6), under
# native, expandable segments and the arena (traced). Results: $OUT/h3.tar.gz. Ran at af879b2
# (declm,vit: the arena's loss NaN from step 13, fixed in 7e3d7f5) and at 7b9b637 (MODELS=declm,vit,t5,moe).
set -uo pipefail
export PYTHONUNBUFFERED=1
start=$(date +%s)
L=/tmp/h3; rm -rf $L; mkdir -p $L
OUT=$L timeout 575 bash tools/gpu/trainers.sh --livebytes --models ${MODELS:-declm,vit} --runs native,expandable,arena \
  --steps 24 --eval-every 6 --eval-batches 4 --budget 440 2>&1 | grep -v "^\s*$" | cut -c1-240 | grep -v "^|" | tail -30
grep "^|" $L/trainers.md 2>/dev/null | cut -c1-400
tar -czf $OUT/h3.tar.gz -C $L . 2>/dev/null; echo "done in $(( $(date +%s) - start )) s"
