#!/usr/bin/env bash
# One GPU, at the session's last code: 1. the install proof from the wheel alone (tools/gpu/wheel.sh:
# torch_checks under enable() and under fragctl run, torchrun, gpt2m); 2. t5 with gradient
# accumulation (2 micro-batches, evaluations), 24 steps: the arena with and without lifetime
# placement, native between them (its replay had moved 1.0094 -> 1.0082). $OUT/k32.tar.gz.
set -uo pipefail
export PYTHONUNBUFFERED=1
start=$(date +%s)
el() { echo "[$(( $(date +%s) - start )) s] $*"; }
echo "commit: $(cat .carry/commit)"
M=/tmp/k32; rm -rf $M; mkdir -p $M/wheel $M/t5
(OUT=$M/wheel timeout 300 bash tools/gpu/wheel.sh 2>&1 | cut -c1-300 | tail -25)
el "wheel proof done"
OUT=$M/t5 timeout $(( 585 - ($(date +%s) - start) )) bash tools/gpu/trainers.sh --models t5 --accumulate 2 \
  --eval-every 6 --eval-batches 4 --runs arena,native,arena-nolifetime --steps 24 --budget 240 \
  2>&1 | grep -v "^\s*$" | cut -c1-240 | grep -v "^|" | tail -8
grep "^|" $M/t5/trainers.md 2>/dev/null | cut -c1-400
tar -czf $OUT/k32.tar.gz -C $M . 2>/dev/null; el "done"
