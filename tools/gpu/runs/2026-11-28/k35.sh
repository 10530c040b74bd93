#!/usr/bin/env bash
# One GPU: one traced arena run of each named job (FRAGCTL_TRACE, --livebytes) for N steps, so that
# the driver calls a longer job makes after its first steps (k33: moe over 96 steps, 711-748 in
# steps 11-96) can be replayed and examined on `sim`. Usage: k35.sh MODELS STEPS.
# Results: $OUT/k35.tar.gz (the traces, trainers.md with the replay fidelity, per-run JSON).
set -uo pipefail
export PYTHONUNBUFFERED=1
start=$(date +%s)
models=${1:?models} steps=${2:?steps}
L=/tmp/k35; rm -rf $L; mkdir -p $L
echo "commit: $(cat .carry/commit 2>/dev/null)  models: $models  steps: $steps"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
OUT=$L timeout 575 bash tools/gpu/trainers.sh --livebytes --models "$models" --runs arena --steps "$steps" --budget 480 \
  2>&1 | grep -v "^\s*$" | cut -c1-240 | grep -v "^|" | tail -12
grep "^|" $L/trainers.md 2>/dev/null | cut -c1-300
tar -czf $OUT/k35.tar.gz -C $L . 2>/dev/null; ls -la $OUT; echo "done in $(( $(date +%s) - start )) s"
