#!/usr/bin/env bash
# One GPU: the session's code live (a trace reader that judges a file's start; the plan's
# period search by prefix hashes): the install proof from the wheel alone (tools/gpu/wheel.sh),
# then declm (shapes drawn per step, the plan's main customer) under the arena, native and
# the arena again, 16 steps, live bytes and the plan's figures. Results: $OUT/k12.tar.gz.
set -uo pipefail
export PYTHONUNBUFFERED=1
start=$(date +%s)
L=/tmp/k12; rm -rf $L; mkdir -p $L
echo "commit: $(cat .carry/commit 2>/dev/null)"
(OUT=$L timeout 240 bash tools/gpu/wheel.sh 2>&1 | cut -c1-300 | tail -25)
echo "[wheel proof done at $(( $(date +%s) - start )) s]"
OUT=$L timeout $(( 585 - ($(date +%s) - start) )) bash tools/gpu/trainers.sh --livebytes --models declm \
  --runs arena,native,arena --steps 16 --budget 280 \
  2>&1 | grep -v "^\s*$" | cut -c1-240 | grep -v "^|" | tail -20
grep "^|" $L/trainers.md 2>/dev/null | cut -c1-400
tar -czf $OUT/k12.tar.gz -C $L . 2>/dev/null; echo "done in $(( $(date +%s) - start )) s"
