#!/usr/bin/env bash
# One GPU, two parts. 1. vit, resnet and kvgen at one shape (--fixed-shapes) for STEPS steps
# under the arena, traced (--livebytes): k43/k44 found driver calls in every step after the
# first few (vit 39, resnet 32-36, kvgen 62-63) at a held size that no longer moves; the
# traces come back (cut into 15 MB parts) to replay on sim why.
# 2. The install proof from the wheel alone (tools/gpu/wheel.sh, as k42), rerun after the
# session's Python-facing changes. Results: $OUT/k45.*.
set -uo pipefail
export PYTHONUNBUFFERED=1
start=$(date +%s)
steps=${1:-16}
L=/tmp/k45; rm -rf $L; mkdir -p $L/vit $L/wheel
echo "commit: $(cat .carry/commit 2>/dev/null)"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
OUT=$L/vit timeout 270 bash tools/gpu/trainers.sh --fixed-shapes --livebytes --models vit,resnet,kvgen --runs arena --steps "$steps" \
  --budget 200 2>&1 | grep -v "^\s*$" | cut -c1-240 | grep -v "^|" | tail -6
grep "^|" $L/vit/trainers.md 2>/dev/null | cut -c1-300
(cd $L/vit && for t in *.trace.csv.gz; do split -b 15000000 $t $OUT/$t.part-; done) 2>&1
echo "[$(( $(date +%s) - start )) s] wheel proof"
(OUT=$L/wheel timeout 300 bash tools/gpu/wheel.sh 2>&1 | cut -c1-300 | tail -25)
tar -czf $OUT/k45.results.tar.gz -C $L --exclude='*.trace.csv.gz' . 2>/dev/null
ls -la $OUT; echo "done in $(( $(date +%s) - start )) s"
