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
setup_log=${OUT:-gpu-results}/call_cost-setup.log
# trainers_setup.sh exits the shell on a failed build, so no handler after
# `source` runs: the trap tells the log's end on the console (a descriptor
# saved first), not into the log the setup's output still goes to. A
# caller that sources this script (runs/2026-11-27/i2.sh) gets its own
# EXIT trap back.
caller_trap=$(trap -p EXIT)
exec {console}>&1
trap 'tail -5 "$setup_log" >&$console' EXIT
source tools/gpu/trainers_setup.sh call_cost > "$setup_log" 2>&1
eval "${caller_trap:-trap - EXIT}"
exec {console}>&-
tail -3 "$setup_log"
mkdir -p "$out/call_cost"
timeout 200 "$python" -c "import torch, fragctl.torch; fragctl.torch.enable('arena'); torch.empty(1, device='cuda'); print('native module ready')" 2>&1 | tail -2
for round in 1 2 3; do
  order="native expandable arena"
  [ $round = 2 ] && order="arena expandable native"
  for mode in $order; do
    timeout 120 "$python" benchmarks/torch_replay/call_cost.py --mode $mode --json "$out/call_cost/$mode-$round.json" 2>&1 | tail -4
  done
done
