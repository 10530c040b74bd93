#!/usr/bin/env bash
# One GPU: a traced arena run of every other job of issue 32 (moe, t5, lora, kvgen, frozen; 16
# steps) and of declm and t5 with gradient accumulation and evaluations (--accumulate 2
# --eval-every 6, 24 steps), so that a change of the plan's start rule can be judged on sim
# replays of every kind of job. Results: $OUT/k3.tar.gz.
set -uo pipefail
export PYTHONUNBUFFERED=1
start=$(date +%s)
L=/tmp/k3; rm -rf $L; mkdir -p $L/a $L/b
echo "commit: $(cat .carry/commit 2>/dev/null)"
OUT=$L/a timeout 330 bash tools/gpu/trainers.sh --livebytes --models moe,t5,lora,kvgen,frozen \
  --runs arena --steps 16 --budget 240 2>&1 | grep -v "^\s*$" | cut -c1-240 | grep -v "^|" | tail -12
grep "^|" $L/a/trainers.md 2>/dev/null | cut -c1-300
echo "[first set done at $(( $(date +%s) - start )) s]"
OUT=$L/b timeout $(( 580 - ($(date +%s) - start) )) bash tools/gpu/trainers.sh --livebytes --models declm,t5 \
  --runs arena --steps 24 --accumulate 2 --eval-every 6 --eval-batches 4 --budget 200 2>&1 | grep -v "^\s*$" | cut -c1-240 | grep -v "^|" | tail -12
grep "^|" $L/b/trainers.md 2>/dev/null | cut -c1-300
rm -f $L/*/declm-model*
tar -czf $OUT/k3.tar.gz -C $L . 2>/dev/null; ls -la $OUT; echo "done in $(( $(date +%s) - start )) s"
