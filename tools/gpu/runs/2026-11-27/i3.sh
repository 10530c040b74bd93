#!/usr/bin/env bash
# One GPU: benchmarks/torch_replay/call_cost.py again (native, expandable segments, enable("arena"),
# three rounds alternated), after the arena stopped laying out plans the high-water rule refuses.
# Results: $OUT/i3.tar.gz.
set -uo pipefail
export PYTHONUNBUFFERED=1
start=$(date +%s)
L=/tmp/i3; rm -rf $L; mkdir -p $L/call_cost
echo "commit: $(cat .carry/commit 2>/dev/null)"
DEVOUT=$OUT
OUT=$L source tools/gpu/trainers_setup.sh call_cost > $L/setup.log 2>&1 || { tail -5 $L/setup.log; exit 1; }
tail -3 $L/setup.log
timeout 200 python3 -c "import torch, fragctl.torch; fragctl.torch.enable('arena'); torch.empty(1, device='cuda'); print('native module ready')" 2>&1 | tail -2
for round in 1 2 3; do
  order="native expandable arena"; [ $round = 2 ] && order="arena expandable native"
  for mode in $order; do
    timeout 120 python3 benchmarks/torch_replay/call_cost.py --mode $mode --json $L/call_cost/$mode-$round.json 2>&1 | tail -3
  done
done
tar -czf $DEVOUT/i3.tar.gz -C $L . 2>/dev/null; echo "done in $(( $(date +%s) - start )) s"
