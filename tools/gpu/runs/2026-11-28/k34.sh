#!/usr/bin/env bash
# One GPU: issue 32's other jobs for 64 steps under the arena, one untraced run each, to see
# whether "no driver call after the first steps" (measured over 16-32 steps) holds over a longer
# job. moe over 96 steps (k33) made 711-748 calls in 8-10 of its steps 11-96: the steps whose drawn
# sequence length and routing reach sizes not seen before. Usage: k34.sh MODELS (comma list).
# Results: $OUT/k34-<first model>.tar.gz.
set -uo pipefail
export PYTHONUNBUFFERED=1
start=$(date +%s)
models=${1:?models}
L=/tmp/k34-${models%%,*}; rm -rf $L; mkdir -p $L
echo "commit: $(cat .carry/commit 2>/dev/null)  models: $models"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
OUT=$L timeout 575 bash tools/gpu/trainers.sh --models "$models" --runs arena --steps 64 --budget 480 \
  2>&1 | grep -v "^\s*$" | cut -c1-240 | grep -v "^|" | tail -12
grep "^|" $L/trainers.md 2>/dev/null | cut -c1-300
python3 - $L <<'PY'
import glob, json, sys
for p in sorted(glob.glob(sys.argv[1] + "/*-fragctl_arena.json")):
    r = json.load(open(p)); f = r.get("fragctl") or {}
    a = f.get("memory_calls_after_step") or []
    before = (f.get("memory_calls_before_step") or [0])[0]
    per = [a[i] - (a[i - 1] if i else before) for i in range(len(a))]
    late = [(i + 1, c) for i, c in enumerate(per) if i >= 10 and c]
    print(f"{r.get('model')}: calls {f.get('memory_calls')}, steps 1-10 {sum(per[:10])}, steps 11-{len(per)} {sum(per[10:])} in {len(late)} steps: {late}")
PY
tar -czf $OUT/k34-${models%%,*}.tar.gz -C $L . 2>/dev/null; echo "done in $(( $(date +%s) - start )) s"
