#!/usr/bin/env bash
# One GPU: kvgen for STEPS steps (k36.sh STEPS, default 40; run with 40, then 64) under the arena,
# traced (FRAGCTL_TRACE, --livebytes), to replay on
# `sim` why its held memory reaches 1.416 of the live bytes over 64 steps (k34, k35: the replay
# gives 1.416 at every lag) where 16 steps held 1.004. k35's tarball was over the 16 MiB a file
# that comes back, so the trace comes back cut into 15 MB parts. Results: $OUT/k36.*.
set -uo pipefail
export PYTHONUNBUFFERED=1
start=$(date +%s)
L=/tmp/k36; rm -rf $L; mkdir -p $L
echo "commit: $(cat .carry/commit 2>/dev/null)"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
OUT=$L timeout 500 bash tools/gpu/trainers.sh --livebytes --models kvgen --runs arena --steps "${1:-40}" --budget 420 \
  2>&1 | grep -v "^\s*$" | cut -c1-240 | grep -v "^|" | tail -8
grep "^|" $L/trainers.md 2>/dev/null | cut -c1-300
tar -czf $OUT/k36.results.tar.gz -C $L --exclude='*.trace.csv.gz' . 2>/dev/null
(cd $L && split -b 15000000 kvgen-arena.trace.csv.gz $OUT/k36.trace.part-) 2>&1
ls -la $OUT; echo "done in $(( $(date +%s) - start )) s"
