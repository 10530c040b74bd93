#!/usr/bin/env bash
# One GPU, at the session's last code: 1. the install proof from the wheel alone (tools/gpu/wheel.sh,
# the wheel built on the project's machine, carried in dist/); 2. declm for 24 steps under the arena
# with FRAGCTL_LOG_LEVEL=debug: the step plan's decisions in a live job's log (they had never been
# written before this session's change; docs/policies/arena.md "Reading the plan's decisions").
# Results: $OUT/k39.tar.gz.
set -uo pipefail
export PYTHONUNBUFFERED=1
start=$(date +%s)
el() { echo "[$(( $(date +%s) - start )) s] $*"; }
echo "commit: $(cat .carry/commit)"
M=/tmp/k39; rm -rf $M; mkdir -p $M/wheel $M/declm
(OUT=$M/wheel timeout 300 bash tools/gpu/wheel.sh 2>&1 | cut -c1-300 | tail -25)
el "wheel proof done"
FRAGCTL_LOG_LEVEL=debug OUT=$M/declm timeout $(( 585 - ($(date +%s) - start) )) bash tools/gpu/trainers.sh --models declm \
  --runs arena --steps 24 --budget 200 2>&1 | grep -v "^\s*$" | cut -c1-240 | grep -v "^|" | grep -v "python package" | tail -4
grep "^|" $M/declm/trainers.md 2>/dev/null | cut -c1-300
echo "plan lines in the job's log: $(grep -c 'arena step plan' $M/declm/declm-fragctl_arena.log 2>/dev/null)"
grep "arena step plan" $M/declm/declm-fragctl_arena.log 2>/dev/null | cut -c1-260 | head -24
tar -czf $OUT/k39.tar.gz -C $M . 2>/dev/null; el "done"
