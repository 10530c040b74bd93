#!/usr/bin/env bash
# One GPU: k46.sh MODELS STEPS. Jobs at one shape (--fixed-shapes) under PyTorch's native
# allocator, expandable segments and the arena, alternated three times: what the arena's
# steady calls per step at one shape (k43-k45: vit 39, resnet 32-36, made by best fit
# re-stitching at each step's peak) cost in step time, and the device memory of each set-up.
# Results: $OUT/k46.*.
set -uo pipefail
export PYTHONUNBUFFERED=1
start=$(date +%s)
models=${1:-vit,resnet} steps=${2:-16}
L=/tmp/k46; rm -rf $L; mkdir -p $L
echo "commit: $(cat .carry/commit 2>/dev/null)  models: $models  steps: $steps"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
OUT=$L timeout 560 bash tools/gpu/trainers.sh --fixed-shapes --models "$models" \
  --runs native,expandable,arena,native,expandable,arena,native,expandable,arena --steps "$steps" \
  --budget 440 2>&1 | grep -v "^\s*$" | cut -c1-240 | grep -v "^|" | grep -v "python package" | tail -8
grep "^|" $L/trainers.md 2>/dev/null | cut -c1-300
python3 - "$L" <<'PY'
import glob, json, sys
for p in sorted(glob.glob(sys.argv[1] + "/*.json")):
    try:
        r = json.load(open(p))
    except Exception:
        continue
    if not isinstance(r, dict) or "model" not in r:
        continue
    f = r.get("fragctl") or {}
    a = f.get("memory_calls_after_step") or []
    before = (f.get("memory_calls_before_step") or [0])[0]
    per = [a[i] - (a[i - 1] if i else before) for i in range(len(a))]
    print(f"{p.split('/')[-1]}: median step {1e3 * r.get('median_step_s', 0):.1f} ms, peak device "
          f"{r.get('peak_device_used_bytes', 0) / 2**30:.2f} GiB, calls per step {per}")
PY
tar -czf $OUT/k46.results.tar.gz -C $L . 2>/dev/null
echo "done in $(( $(date +%s) - start )) s"
