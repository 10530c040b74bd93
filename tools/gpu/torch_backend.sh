#!/usr/bin/env bash
# On a GPU machine with PyTorch 2.x: builds libfragctl.so, then runs
# tests/python/test_torch_backend.py (every check under PyTorch's allocator
# and under fragctl's native and pluggable routes; the native backend is
# compiled on first use) and the replay speed (benchmarks/torch_replay/replay_speed.py)
# of each route in alternation.
# UNITTEST=0 or SPEED=0 leave a part out.
# Results: ${OUT:-gpu-results}/torch_backend/{unittest.log,results.jsonl,speed.jsonl}.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu/common.sh torch_backend
[ -f .devkit/devkit.sh ] && source .devkit/devkit.sh unpack
note "building libfragctl.so"
FRAGCTL_BUILD_TYPE=Release FRAGCTL_BUILD_DIR=build-gpu tools/build.sh -DFRAGCTL_BUILD_TESTS=OFF \
  -DFRAGCTL_BUILD_BENCHMARKS=OFF -DFRAGCTL_WERROR=OFF > "$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
export FRAGCTL_LIBRARY=$PWD/build-gpu/libfragctl.so PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
export FRAGCTL_TORCH_BUILD_DIR=$PWD/build-gpu/torch-native PYTHONUNBUFFERED=1
note "compiling the native backend"
python3 -c "import fragctl._native as n; n.load(verbose=False); print('native backend built')" 2>&1 | tail -5
if [ "${UNITTEST:-1}" = 1 ]; then
  note "unittest"
  FRAGCTL_TORCH_RESULTS=$out/results.jsonl python3 -m unittest tests/python/test_torch_backend.py -v \
    2>&1 | tee "$out/unittest.log" | grep -E '^(test_|Ran|OK|FAILED)|Error|ok$|FAIL' | head -60
fi
if [ "${SPEED:-1}" = 1 ]; then
  note "replay speed (gpt2m trace through each route's allocator, in C++), alternating"
  for round in 1 2 3; do
    for route in torch native pluggable; do
      python3 benchmarks/torch_replay/replay_speed.py $route 2>/dev/null | tail -1 |
        sed "s/^/{\"round\": $round, \"route\": \"$route\", \"r\": /; s/$/}/" | tee -a "$out/speed.jsonl"
    done
  done
fi
note "done"
