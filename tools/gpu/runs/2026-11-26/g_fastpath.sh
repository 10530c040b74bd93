#!/usr/bin/env bash
# One GPU: the fast path per operation after the fastpath100 merge (tools/gpu/fastpath.sh): the five shared
# traces through PyTorch's caching allocator and the arena on cuda, three alternated rounds.
set -uo pipefail
F=/tmp/g_fastpath; rm -rf $F; mkdir -p $F
OUT=$F timeout 420 bash tools/gpu/fastpath.sh 2>&1 | tail -12
cat $F/fastpath.md
cp $F/fastpath.md $F/fastpath.log $OUT/ 2>/dev/null; echo done
