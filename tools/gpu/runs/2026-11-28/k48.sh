#!/usr/bin/env bash
# One GPU: k48.sh STEPS. moe at one shape (--fixed-shapes) for STEPS steps under the arena,
# traced (--livebytes): k44 found 95-308 driver calls in every step after the first at one
# shape (its routing still varies per step), more than vit, resnet and kvgen's 32-63; the trace
# comes back (cut into 15 MB parts) to replay on sim whether they are the same re-stitching
# at each step's peak (docs/benchmarks.md, "Jobs at one shape"). Not run yet. Results: $OUT/k48.*.
set -uo pipefail
export PYTHONUNBUFFERED=1
start=$(date +%s)
steps=${1:-16}
L=/tmp/k48; rm -rf $L; mkdir -p $L
echo "commit: $(cat .carry/commit 2>/dev/null)"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
OUT=$L timeout 400 bash tools/gpu/trainers.sh --fixed-shapes --livebytes --models moe --runs arena --steps "$steps" \
  --budget 300 2>&1 | grep -v "^\s*$" | cut -c1-240 | grep -v "^|" | tail -6
grep "^|" $L/trainers.md 2>/dev/null | cut -c1-300
(cd $L && for t in *.trace.csv.gz; do split -b 15000000 $t $OUT/$t.part-; done) 2>&1
tar -czf $OUT/k48.results.tar.gz -C $L --exclude='*.trace.csv.gz' . 2>/dev/null
ls -la $OUT; echo "done in $(( $(date +%s) - start )) s"
