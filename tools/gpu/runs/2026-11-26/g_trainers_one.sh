#!/usr/bin/env bash
# One GPU: one job MODEL:STEPS under native, expandable segments and the arena, three alternated runs each
# (tools/gpu/trainers.sh --livebytes), within ${SHARE:-280} s; results in $OUT/MODEL (no archive).
set -uo pipefail
export PYTHONUNBUFFERED=1
RUNS=${RUNS:-native,expandable,arena,native,expandable,arena,native,expandable,arena}
model=${1%%:*} steps=${1##*:} share=${SHARE:-280}
echo "=== $model, $steps steps, $share s"
OUT=$OUT/$model timeout $share bash tools/gpu/trainers.sh --livebytes --models $model --runs $RUNS --steps $steps \
  --budget $(( share - 45 )) 2>&1 | grep -v "^\s*$" | cut -c1-240 | grep -v "^|" | tail -30
grep "^|" $OUT/$model/trainers.md 2>/dev/null | cut -c1-400
