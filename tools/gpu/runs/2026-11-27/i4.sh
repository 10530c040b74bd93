#!/usr/bin/env bash
# One GPU: tools/gpu/call_cost.sh at this commit (call_cost.py now times torch.cuda.memory_allocated()
# too, after the pool state stopped reading every granule). Results: $OUT/i4.tar.gz.
set -uo pipefail
export PYTHONUNBUFFERED=1
start=$(date +%s)
L=/tmp/i4; rm -rf $L; mkdir -p $L
echo "commit: $(cat .carry/commit 2>/dev/null)"
OUT=$L bash tools/gpu/call_cost.sh
tar -czf $OUT/i4.tar.gz -C $L . 2>/dev/null; echo "done in $(( $(date +%s) - start )) s"
