#!/usr/bin/env bash
# One GPU: kvgen for 64 requests under the arena at 9bfadb1 (run at a2f8c77; rerun it at 6015220 or later)
# (a regrown plan raises held memory only
# for sizes its history bears out), one untraced run: the job held 1.416 of its live bytes at
# a157691 (k34, k35, k36), its trace replays at 1.0017 with the change. Results on stdout.
set -uo pipefail
export PYTHONUNBUFFERED=1
start=$(date +%s)
L=/tmp/k37; rm -rf $L; mkdir -p $L
echo "commit: $(cat .carry/commit 2>/dev/null)"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
OUT=$L timeout 215 bash tools/gpu/trainers.sh --models kvgen --runs arena --steps 64 --budget 150 \
  2>&1 | grep -v "^\s*$" | cut -c1-240 | grep -v "^|" | grep -v "python package" | tail -4
grep "^| kvgen" $L/trainers.md 2>/dev/null | cut -c1-300
python3 - $L <<'PY'
import glob, json, sys
for p in sorted(glob.glob(sys.argv[1] + "/*-fragctl_arena.json")):
    r = json.load(open(p)); f = r.get("fragctl") or {}
    a = f.get("memory_calls_after_step") or []
    before = (f.get("memory_calls_before_step") or [0])[0]
    per = [a[i] - (a[i - 1] if i else before) for i in range(len(a))]
    print(f"{r.get('model')}: steps {len(per)}, ratio {f.get('reserved_over_requested')}, calls {f.get('memory_calls')}, "
          f"steps 11-{len(per)}: {[(i + 1, c) for i, c in enumerate(per) if i >= 10 and c]}")
PY
echo "done in $(( $(date +%s) - start )) s"
