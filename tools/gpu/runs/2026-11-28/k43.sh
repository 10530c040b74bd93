#!/usr/bin/env bash
# One GPU: k43.sh MODELS STEPS TAG. One untraced arena run of each job of MODELS for STEPS steps
# with --fixed-shapes (every step the shape of the job's first draw: a job whose shapes
# repeat), and the driver calls of each step after step 10 (issue 32: "0 driver calls per
# steady step on jobs whose shapes repeat"; every job of the issue's table draws its shapes,
# so none had been run at one shape before). Results: $OUT/TAG.*.
set -uo pipefail
export PYTHONUNBUFFERED=1
start=$(date +%s)
models=$1 steps=${2:-48} tag=${3:-k43}
el() { echo "[$(( $(date +%s) - start )) s] $*"; }
L=/tmp/$tag; rm -rf $L; mkdir -p $L
echo "commit: $(cat .carry/commit 2>/dev/null)  models: $models  steps: $steps"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
OUT=$L timeout 540 bash tools/gpu/trainers.sh --fixed-shapes --models "$models" --runs arena --steps "$steps" \
  --budget 420 2>&1 | grep -v "^\s*$" | cut -c1-240 | grep -v "^|" | grep -v "python package" | tail -4
grep "^|" $L/trainers.md 2>/dev/null | cut -c1-300
python3 - "$L" <<'PY'
import glob, json, sys
for p in sorted(glob.glob(sys.argv[1] + "/*-fragctl_arena.json")):
    r = json.load(open(p)); f = r.get("fragctl") or {}
    a = f.get("memory_calls_after_step") or []
    before = (f.get("memory_calls_before_step") or [0])[0]
    per = [a[i] - (a[i - 1] if i else before) for i in range(len(a))]
    last = max([i + 1 for i, c in enumerate(per) if c] or [0])
    print(f"{r.get('model')}: fixed {r.get('fixed_shapes')}, steps {len(per)}, ratio {f.get('reserved_over_requested')}, "
          f"calls {f.get('memory_calls')}, per step 1-10 {per[:10]}, after step 10: "
          f"{[(i + 1, c) for i, c in enumerate(per) if i >= 10 and c]}, last step with calls {last}, "
          f"median step {1e3 * r.get('median_step_s', 0):.1f} ms")
PY
tar -czf $OUT/$tag.results.tar.gz -C $L . 2>/dev/null
el "done"
