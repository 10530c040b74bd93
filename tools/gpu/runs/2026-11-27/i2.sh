#!/usr/bin/env bash
# One GPU: what one PyTorch allocation and free cost through each allocator, from Python
# (tools/gpu/call_cost.sh: benchmarks/torch_replay/call_cost.py, three rounds alternated), then
# the five shared traces' replays beside PyTorch's caching allocator (tools/gpu/fastpath.sh) at
# this commit. Results: $OUT/i2.tar.gz. (As run at 9aec1d4 the call-cost loop was written out
# here; tools/gpu/call_cost.sh is that loop.)
set -uo pipefail
export PYTHONUNBUFFERED=1
start=$(date +%s)
L=/tmp/i2; rm -rf $L; mkdir -p $L
echo "commit: $(cat .carry/commit 2>/dev/null)"
DEVOUT=$OUT
OUT=$L source tools/gpu/call_cost.sh
echo "[call cost done at $(( $(date +%s) - start )) s]"
FRAGCTL_FASTPATH_BUILD=$build OUT=$L/fastpath timeout $(( 585 - ($(date +%s) - start) )) bash tools/gpu/fastpath.sh 2>&1 | tail -4
cat $L/fastpath/fastpath.md 2>/dev/null | tail -12
tar -czf $DEVOUT/i2.tar.gz -C $L . 2>/dev/null; echo "done in $(( $(date +%s) - start )) s"
