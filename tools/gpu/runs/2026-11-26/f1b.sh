#!/usr/bin/env bash
# One GPU, after the wheel proof: the plan for a family of shapes on cuda (varplan.sh), and the fast path beside PyTorch's caching allocator.
set -uo pipefail
export PYTHONUNBUFFERED=1
L=/tmp/f1b; mkdir -p $L
t0=$SECONDS
OUT=$L bash tools/gpu/varplan.sh 2>&1 | tail -12
echo "[$((SECONDS - t0)) s] === replay speed (gpt2m, then resnet50): torch / native / pluggable, 3 rounds"
OUT=$L SPEED=1 UNITTEST=0 bash tools/gpu/torch_backend.sh 2>&1 | grep -v "^\[" | cut -c1-400 | tail -12
OUT=$L/resnet50 FRAGCTL_REPLAY_TRACE=tests/data/resnet50.trace.csv.gz SPEED=1 UNITTEST=0 bash tools/gpu/torch_backend.sh 2>&1 | grep -v "^\[" | cut -c1-400 | tail -12
echo "[$((SECONDS - t0)) s] === fragctl replay on cuda, arena and caching"
build-gpu/tools/fragctl replay tests/data/gpt2m.trace.csv.gz tests/data/resnet50.trace.csv.gz --backend cuda --policy arena,caching --json > $L/replay-cuda.json 2>$L/replay-cuda.err
python3 - $L/replay-cuda.json <<'PY'
import json, sys
for r in json.load(open(sys.argv[1])):
    print({k: r.get(k) for k in ("trace", "policy", "reserved_over_requested", "backend_memory_calls", "median_ns", "p90_ns", "median_alloc_ns", "median_free_ns", "total_ms", "clock_overhead_ns")})
PY
tar -czf $OUT/f1b.tar.gz -C $L . ; echo "[$((SECONDS - t0)) s] done"
