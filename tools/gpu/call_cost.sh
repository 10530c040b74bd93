#!/usr/bin/env bash
# One GPU: what one PyTorch allocation and free cost from Python under native, expandable segments
# and fragctl.torch.enable("arena") (benchmarks/torch_replay/call_cost.py; docs/benchmarks-guide.md),
# each in its own process, three rounds alternated (round 2 in the reverse order). Builds
# libfragctl.so as tools/gpu/trainers.sh does (tools/gpu/trainers_setup.sh) and compiles the native
# module once before the timed processes. Run from the repository root with .devkit carried:
#
#   OUT=gpu-results tools/gpu/call_cost.sh
#
# Writes $OUT/call_cost/MODE-ROUND.json and $OUT/call_cost-{machine.txt,build.log,pip.log}; sets
# `build` for a caller that sources it.
set -uo pipefail
mkdir -p "${OUT:-gpu-results}"
source tools/gpu/trainers_setup.sh call_cost > "${OUT:-gpu-results}/call_cost-setup.log" 2>&1 ||
  { tail -5 "${OUT:-gpu-results}/call_cost-setup.log"; exit 1; }
tail -3 "$out/call_cost-setup.log"
mkdir -p "$out/call_cost"
timeout 200 "$python" -c "import torch, fragctl.torch; fragctl.torch.enable('arena'); torch.empty(1, device='cuda'); print('native module ready')" 2>&1 | tail -2
for round in 1 2 3; do
  order="native expandable arena"
  [ $round = 2 ] && order="arena expandable native"
  for mode in $order; do
    timeout 120 "$python" benchmarks/torch_replay/call_cost.py --mode $mode --json "$out/call_cost/$mode-$round.json" 2>&1 | tail -4
  done
done
