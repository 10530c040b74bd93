#!/usr/bin/env bash
# One GPU: the wheel's install proof after granule_map's one derivation of the mapped runs (the memory
# map under torch.cuda.memory_snapshot() walks them): tools/gpu/wheel.sh with the snapshot check added
# to the enable() checks. Results: $OUT/i6.tar.gz.
set -uo pipefail
export PYTHONUNBUFFERED=1
L=/tmp/i6; rm -rf $L; mkdir -p $L
echo "commit: $(cat .carry/commit 2>/dev/null)"
CHECKS="memory_api snapshot record_stream graph cudnn_benchmark hf_trainer" OUT=$L timeout 400 bash tools/gpu/wheel.sh 2>&1 | cut -c1-300
tar -czf $OUT/i6.tar.gz -C $L . 2>/dev/null
