#!/usr/bin/env bash
# One GPU: the step plan for a family of shapes (issue 32) replayed on cuda, plan off/on alternated, twice.
# Run from the repository root with .devkit carried; writes under $OUT.
# Passes when the cuda counts equal sim's (docs/benchmarks.md, "The plan for a family of shapes on replays"):
#   step_plan:true   declm40 31,377 calls, steps 11-40 36, reserved/requested 1.0060
#   step_plan:false  declm40 42,197 calls, steps 11-40 10,944, 1.0065
#   declm_fixed 16,378 (true) / 52,191 (false); gpt2m 3,868 and resnet50 794 either way.
set -uo pipefail
source .devkit/devkit.sh unpack
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader
t0=$SECONDS
FRAGCTL_BUILD_TYPE=Release FRAGCTL_BUILD_DIR=build-gpu tools/build.sh -DFRAGCTL_BUILD_TESTS=OFF \
  -DFRAGCTL_BUILD_BENCHMARKS=OFF -DFRAGCTL_WERROR=OFF > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
echo "[$((SECONDS - t0)) s] built"
T=benchmarks/trainers/declm_trace.py
python3 $T --out $OUT/declm40.trace.csv.gz --steps 40 > /dev/null
python3 $T --out $OUT/declm10.trace.csv.gz --steps 10 > /dev/null  # the 40-step model's first 10 steps
python3 $T --out $OUT/declm_fixed.trace.csv.gz --min-tokens 2048 --max-tokens 2048 --steps 20 > /dev/null
F=$(ls build-gpu/tools/fragctl build-gpu/fragctl 2>/dev/null | head -1)
for i in 1 2; do for c in step_plan:false step_plan:true; do
  timeout 120 $F replay $OUT/declm40.trace.csv.gz $OUT/declm10.trace.csv.gz $OUT/declm_fixed.trace.csv.gz \
    tests/data/gpt2m.trace.csv.gz tests/data/resnet50.trace.csv.gz --backend cuda --policy arena --conf $c --json \
    > $OUT/replay-${c/:/-}-$i.json 2> $OUT/replay-${c/:/-}-$i.err
  echo "$c run $i rc=$?"; done; done
python3 - $OUT <<'PY'
import glob, json, os, sys
for p in sorted(glob.glob(os.path.join(sys.argv[1], "replay-*.json"))):
    try:
        runs = {r["trace"]: r for r in json.load(open(p))}
    except Exception as e:
        print(os.path.basename(p), "unreadable", e); continue
    line = [os.path.basename(p)]
    for name, r in runs.items():
        line.append(f"{name} {r['backend_memory_calls']} calls {r['reserved_over_requested']:.4f} median {r['median_ns']:.0f} ns")
    if "declm40" in runs and "declm10" in runs:
        line.append(f"declm40 steps 11-40: {runs['declm40']['backend_memory_calls'] - runs['declm10']['backend_memory_calls']} calls")
    print(" | ".join(line))
PY
echo "[$((SECONDS - t0)) s] done"
