#!/usr/bin/env bash
# One GPU: lora and vit for 64 steps under the arena, untraced, with FRAGCTL_LOG_LEVEL=debug: the
# step plan's decisions in the live jobs, against those the replays of their k38 traces print at
# lag 0 (lora: found in step 4, never started before step 42; vit: found in step 4, never started;
# docs/benchmarks.md "Every job for 64 steps: kvgen live, lora and vit traced"). Results: $OUT/k41.*.
set -uo pipefail
export PYTHONUNBUFFERED=1
start=$(date +%s)
L=/tmp/k41; rm -rf $L; mkdir -p $L
echo "commit: $(cat .carry/commit 2>/dev/null)"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
FRAGCTL_LOG_LEVEL=debug OUT=$L timeout 560 bash tools/gpu/trainers.sh --models lora,vit --runs arena --steps 64 \
  --budget 470 2>&1 | grep -v "^\s*$" | cut -c1-240 | grep -v "^|" | grep -v "python package" | tail -4
grep "^|" $L/trainers.md 2>/dev/null | cut -c1-300
for m in lora vit; do
  log=$L/$m-fragctl_arena.log
  echo "== $m: $(grep -c 'arena step plan' $log 2>/dev/null) plan lines"
  grep "arena step plan" $log 2>/dev/null | sed 's/\[fragctl\] \[debug\] arena step plan: //' |
    sed -E 's/[0-9]+/N/g' | cut -c1-110 | sort | uniq -c | sort -rn | head -12
  grep "arena step plan" $log 2>/dev/null | grep -v "not started\|waits for" | cut -c1-230 | head -12
done
tar -czf $OUT/k41.tar.gz -C $L --exclude='*.trace.csv.gz' . 2>/dev/null; echo "done in $(( $(date +%s) - start )) s"
