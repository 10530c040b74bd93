#!/usr/bin/env bash
# One GPU: at the session's start commit (11d33f5), the install proof of the wheel built on the
# project's machine and carried alone (tools/gpu/wheel.sh: no devkit; torch_checks under enable()
# and under `fragctl run`, torchrun, gpt2m), then the fast path per operation (tools/gpu/fastpath.sh:
# the five shared traces, PyTorch's caching allocator against the arena on cuda, three alternated
# rounds). Results: $OUT/j1.tar.gz.
set -uo pipefail
export PYTHONUNBUFFERED=1
start=$(date +%s)
L=/tmp/j1; rm -rf $L; mkdir -p $L
echo "commit: $(cat .carry/commit 2>/dev/null)"
(OUT=$L timeout 250 bash tools/gpu/wheel.sh 2>&1 | cut -c1-300)
echo "[wheel proof done at $(( $(date +%s) - start )) s]"
OUT=$L timeout $(( 575 - ($(date +%s) - start) )) bash tools/gpu/fastpath.sh 2>&1 | tail -6
cat $L/fastpath.md 2>/dev/null
tar -czf $OUT/j1.tar.gz -C $L . 2>/dev/null; echo "done in $(( $(date +%s) - start )) s"
