#!/usr/bin/env bash
# One GPU: issue 32's new jobs (t5, lora, vit, kvgen) under native, expandable segments and the arena.
set -uo pipefail
export PYTHONUNBUFFERED=1
L=/tmp/f1c; mkdir -p $L
OUT=$L timeout 420 bash tools/gpu/trainers.sh --livebytes --models t5,lora,vit,kvgen --runs native,expandable,arena --steps 6 --budget 300 2>&1 | grep -v "^\s*$" | cut -c1-300 | tail -70

echo "=== memory_api under fragctl run (LD_PRELOAD, cudaMallocAsync backend)"
export PYTHONPATH=$PWD/python FRAGCTL_LIBRARY=$PWD/build-trainers/libfragctl.so
timeout 50 python3 -m fragctl run --policy arena --preload build-trainers/libfragctl_preload.so -- python3 tests/python/torch_checks.py torch memory_api 2>/tmp/ma.err | tail -1 | cut -c1-300
grep "fragctl run" /tmp/ma.err
tar -czf $OUT/f1c.tar.gz -C $L . 2>/dev/null; echo done
