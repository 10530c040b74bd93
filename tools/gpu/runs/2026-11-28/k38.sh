#!/usr/bin/env bash
# One GPU: k38.sh UNTRACED TRACED STEPS. First one untraced arena run of each UNTRACED job for
# STEPS steps (kvgen at 64 requests: 1.416 live before 9bfadb1/6015220, 1.0017-1.0021 on the
# replay of its live trace after), with the driver calls of each step after step 10; then one
# traced arena run (FRAGCTL_TRACE, --livebytes) of each TRACED job, so that the driver calls
# after their first steps over 64 steps (k34: lora 6,111 in 11 steps, 5,151 in step 40; vit
# 1,433 in 11) can be replayed on `sim`. Traces come back cut into 15 MB parts (16 MiB a file
# comes back). Results: $OUT/k38.*.
set -uo pipefail
export PYTHONUNBUFFERED=1
start=$(date +%s)
untraced=$1 traced=$2 steps=${3:-64}
el() { echo "[$(( $(date +%s) - start )) s] $*"; }
L=/tmp/k38; rm -rf $L; mkdir -p $L/u $L/t
echo "commit: $(cat .carry/commit 2>/dev/null)  untraced: $untraced  traced: $traced  steps: $steps"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
calls() {
  python3 - "$1" <<'PY'
import glob, json, sys
for p in sorted(glob.glob(sys.argv[1] + "/*-fragctl_arena.json")):
    r = json.load(open(p)); f = r.get("fragctl") or {}
    a = f.get("memory_calls_after_step") or []
    before = (f.get("memory_calls_before_step") or [0])[0]
    per = [a[i] - (a[i - 1] if i else before) for i in range(len(a))]
    print(f"{r.get('model')}: steps {len(per)}, ratio {f.get('reserved_over_requested')}, calls {f.get('memory_calls')}, "
          f"steps 1-10 {sum(per[:10])}, after: {[(i + 1, c) for i, c in enumerate(per) if i >= 10 and c]}")
PY
}
if [ -n "$untraced" ]; then
  OUT=$L/u timeout 400 bash tools/gpu/trainers.sh --models "$untraced" --runs arena --steps "$steps" --budget 330 \
    2>&1 | grep -v "^\s*$" | cut -c1-240 | grep -v "^|" | grep -v "python package" | tail -4
  grep "^|" $L/u/trainers.md 2>/dev/null | cut -c1-300
  calls $L/u; el "untraced done"
fi
if [ -n "$traced" ]; then
  left=$(( 580 - ($(date +%s) - start) ))
  OUT=$L/t timeout $left bash tools/gpu/trainers.sh --livebytes --models "$traced" --runs arena --steps "$steps" \
    --budget $(( left - 60 )) 2>&1 | grep -v "^\s*$" | cut -c1-240 | grep -v "^|" | grep -v "python package" | tail -6
  grep "^|" $L/t/trainers.md 2>/dev/null | cut -c1-300
  calls $L/t
  for t in $L/t/*.trace.csv.gz; do
    [ -f "$t" ] && (cd $L/t && split -b 15000000 "$(basename "$t")" "$OUT/k38.$(basename "$t" .trace.csv.gz).part-")
  done
fi
tar -czf $OUT/k38.results.tar.gz -C $L --exclude='*.trace.csv.gz' . 2>/dev/null
ls -la $OUT; el "done"
