#!/usr/bin/env bash
# One GPU: traces of the two jobs whose growth steps are above native's time (vit's step 3,
# declm's step 7; docs/benchmarks.md "The default span size, live"), to replay their calls per
# step and kind on sim: the arena (traced), native, the arena again, 16 steps. Results: $OUT/k2.tar.gz.
set -uo pipefail
export PYTHONUNBUFFERED=1
start=$(date +%s)
L=/tmp/k2; rm -rf $L; mkdir -p $L
echo "commit: $(cat .carry/commit 2>/dev/null)"
OUT=$L timeout 575 bash tools/gpu/trainers.sh --livebytes --models vit,declm \
  --runs arena,native,arena --steps 16 --budget 470 \
  2>&1 | grep -v "^\s*$" | cut -c1-240 | grep -v "^|" | tail -30
grep "^|" $L/trainers.md 2>/dev/null | cut -c1-400
ls -la $L
tar -czf $OUT/k2.tar.gz -C $L . 2>/dev/null; ls -la $OUT; echo "done in $(( $(date +%s) - start )) s"
