#!/usr/bin/env bash
# One GPU: the step plan for a family of shapes (issue 32, docs/policies/arena.md "The steady-state
# plan") replayed on cuda, plan off and on, alternated, twice. Run from the repository root with
# .devkit carried; OUT names the results folder. It passes when the cuda counts equal sim's
# (docs/benchmarks.md, "The plan for a family of shapes on replays"):
#   step_plan-true:  declm40 31377 calls 1.0060, declm40 steps 11-40: 36 calls
#   step_plan-false: declm40 42197 calls 1.0065, declm40 steps 11-40: 10944 calls
#   declm_fixed 16378 calls (true) and 52191 (false); gpt2m 3868 and resnet50 794 with either.
set -uo pipefail
source .devkit/devkit.sh unpack
source tools/gpu/common.sh varplan
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader | head -1
FRAGCTL_BUILD_TYPE=Release FRAGCTL_BUILD_DIR=build-gpu tools/build.sh -DFRAGCTL_BUILD_TESTS=OFF \
  -DFRAGCTL_BUILD_BENCHMARKS=OFF -DFRAGCTL_WERROR=OFF > $out/build.log 2>&1 || { tail -30 $out/build.log; exit 1; }
note "built"
model=benchmarks/trainers/declm_trace.py
python3 $model --out $out/declm40.trace.csv.gz --steps 40 2> /dev/null
python3 $model --out $out/declm10.trace.csv.gz --steps 10 2> /dev/null  # the 40-step model's first 10 steps
python3 $model --out $out/declm_fixed.trace.csv.gz --min-tokens 2048 --max-tokens 2048 --steps 20 2> /dev/null
cli=$(ls build-gpu/tools/fragctl build-gpu/fragctl 2>/dev/null | head -1)
traces="$out/declm40.trace.csv.gz $out/declm10.trace.csv.gz $out/declm_fixed.trace.csv.gz"
traces+=" tests/data/gpt2m.trace.csv.gz tests/data/resnet50.trace.csv.gz"
for run in 1 2; do
  for plan in false true; do
    timeout 150 $cli replay $traces --backend cuda --policy arena --conf step_plan:$plan --json \
      > $out/step_plan-$plan-$run.json 2> $out/step_plan-$plan-$run.err
    note "step_plan:$plan run $run rc=$?"
  done
done
python3 - $out <<'PY'
import glob, json, os, sys
for path in sorted(glob.glob(os.path.join(sys.argv[1], "step_plan-*.json"))):
    try:
        runs = {r["trace"]: r for r in json.load(open(path))}
    except (OSError, ValueError) as e:
        print(os.path.basename(path), "unreadable:", e)
        continue
    cells = [f"{t} {r['backend_memory_calls']} calls {r['reserved_over_requested']:.4f} median {r['median_ns']:.0f} ns"
             for t, r in runs.items()]
    if "declm40" in runs and "declm10" in runs:
        steps = runs["declm40"]["backend_memory_calls"] - runs["declm10"]["backend_memory_calls"]
        cells.append(f"declm40 steps 11-40: {steps} calls")
    print(os.path.basename(path)[:-5] + ": " + " | ".join(cells))
PY
note "done"
