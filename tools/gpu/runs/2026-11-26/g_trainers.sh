#!/usr/bin/env bash
# One GPU: issue 32's jobs live with the family plan. Each argument is MODEL:STEPS; each model runs native,
# expandable segments and the arena three times in alternation (tools/gpu/trainers.sh --livebytes), the whole
# call ending within 560 s of its start. Results: $OUT/g_trainers.tar.gz.
set -uo pipefail
export PYTHONUNBUFFERED=1
start=$(date +%s)
L=/tmp/g_trainers; rm -rf $L; mkdir -p $L
RUNS=${RUNS:-native,expandable,arena,native,expandable,arena,native,expandable,arena}
n=$#
for spec in "$@"; do
  model=${spec%%:*} steps=${spec##*:}
  left=$(( 560 - ($(date +%s) - start) ))
  share=$(( left / n )); n=$(( n - 1 ))
  [ $share -lt 60 ] && { echo "$model: no time left"; continue; }
  echo "=== $model, $steps steps, $share s"
  OUT=$L/$model timeout $share bash tools/gpu/trainers.sh --livebytes --models $model --runs $RUNS --steps $steps \
    --budget $(( share - 45 )) 2>&1 | grep -v "^\s*$" | cut -c1-240 | grep -v "^|" | tail -30
  grep "^|" $L/$model/trainers.md | cut -c1-400
done
tar -czf $OUT/g_trainers.tar.gz -C $L . 2>/dev/null; echo "done in $(( $(date +%s) - start )) s"
