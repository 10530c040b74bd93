#!/usr/bin/env bash
# One GPU: tools/gpu/call_cost.sh again (native, expandable segments, enable("arena"), three rounds
# alternated), after the arena stopped laying out plans the high-water rule refuses. Results:
# $OUT/i3.tar.gz. (As run at c75f015 the loop was written out here; tools/gpu/call_cost.sh is it.)
set -uo pipefail
export PYTHONUNBUFFERED=1
start=$(date +%s)
L=/tmp/i3; rm -rf $L; mkdir -p $L
echo "commit: $(cat .carry/commit 2>/dev/null)"
OUT=$L bash tools/gpu/call_cost.sh
tar -czf $OUT/i3.tar.gz -C $L . 2>/dev/null; echo "done in $(( $(date +%s) - start )) s"
