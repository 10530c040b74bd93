#!/usr/bin/env bash
# One GPU: tools/gpu/call_cost.sh (native, expandable segments, enable("arena"), three rounds
# alternated). Ran at c75f015, after the arena stopped laying out plans the high-water rule refuses
# (the loop then written out here; tools/gpu/call_cost.sh is it), and as i4.sh at 51c0a91.
# Results: $OUT/${NAME:-i3}.tar.gz.
set -uo pipefail
export PYTHONUNBUFFERED=1
start=$(date +%s)
name=${NAME:-i3}
L=/tmp/$name; rm -rf $L; mkdir -p $L
echo "commit: $(cat .carry/commit 2>/dev/null)"
OUT=$L bash tools/gpu/call_cost.sh
tar -czf $OUT/$name.tar.gz -C $L . 2>/dev/null; echo "done in $(( $(date +%s) - start )) s"
