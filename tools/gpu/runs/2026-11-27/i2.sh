#!/usr/bin/env bash
# One GPU: what one PyTorch allocation and free cost through each allocator, from Python
# (benchmarks/torch_replay/call_cost.py; native, expandable segments, fragctl.torch.enable("arena"),
# each in its own process, three rounds alternated), then the five shared traces' replays beside
# PyTorch's caching allocator (tools/gpu/fastpath.sh) at this commit. Results: $OUT/i2.tar.gz.
set -uo pipefail
export PYTHONUNBUFFERED=1
start=$(date +%s)
L=/tmp/i2; rm -rf $L; mkdir -p $L/call_cost
echo "commit: $(cat .carry/commit 2>/dev/null)"
DEVOUT=$OUT
OUT=$L source tools/gpu/trainers_setup.sh call_cost > $L/setup.log 2>&1 || { tail -5 $L/setup.log; exit 1; }
tail -3 $L/setup.log
# the native module compiles on first use: once, before the timed processes
timeout 200 python3 -c "import torch, fragctl.torch; fragctl.torch.enable('arena'); torch.empty(1, device='cuda'); print('native module ready')" 2>&1 | tail -2
for round in 1 2 3; do
  order="native expandable arena"; [ $round = 2 ] && order="arena expandable native"
  for mode in $order; do
    timeout 120 python3 benchmarks/torch_replay/call_cost.py --mode $mode --json $L/call_cost/$mode-$round.json 2>&1 | tail -3
  done
done
echo "[call cost done at $(( $(date +%s) - start )) s]"
FRAGCTL_FASTPATH_BUILD=$build OUT=$L/fastpath timeout $(( 585 - ($(date +%s) - start) )) bash tools/gpu/fastpath.sh 2>&1 | tail -4
cat $L/fastpath/fastpath.md 2>/dev/null | tail -12
tar -czf $DEVOUT/i2.tar.gz -C $L . 2>/dev/null; echo "done in $(( $(date +%s) - start )) s"
