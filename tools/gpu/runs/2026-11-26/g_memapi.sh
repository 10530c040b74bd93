#!/usr/bin/env bash
# One GPU: torch_checks memory_api under `fragctl run` (LD_PRELOAD, PyTorch's cudaMallocAsync backend), the
# check whose MemPool part a0fb4b1 leaves out on that backend (not run on a GPU since that change).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=/tmp/g_memapi source tools/gpu/trainers_setup.sh memapi > /dev/null 2>&1 || { echo build failed; exit 1; }
echo "built in $(( $(date +%s) - start )) s"
export PYTHONPATH=$PWD/python FRAGCTL_LIBRARY=$PWD/$build/libfragctl.so
echo "=== memory_api under fragctl run"
timeout 90 python3 -m fragctl run --policy arena --preload $build/libfragctl_preload.so -- \
  python3 tests/python/torch_checks.py torch memory_api 2>/tmp/ma.err | tail -3 | cut -c1-400
echo "rc ${PIPESTATUS[0]}"; grep -i "error\|fragctl run" /tmp/ma.err | head -5
