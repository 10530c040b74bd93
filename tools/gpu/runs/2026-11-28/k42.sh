#!/usr/bin/env bash
# One GPU, at the session's last code: the install proof from the wheel alone (tools/gpu/wheel.sh:
# the wheel built on the project's machine, carried in dist/; no build, no devkit). Results on stdout
# and in $OUT/k42.tar.gz.
set -uo pipefail
export PYTHONUNBUFFERED=1
start=$(date +%s)
echo "commit: $(cat .carry/commit)"
M=/tmp/k42; rm -rf $M; mkdir -p $M
(OUT=$M timeout 400 bash tools/gpu/wheel.sh 2>&1 | cut -c1-300 | tail -25)
tar -czf $OUT/k42.tar.gz -C $M . 2>/dev/null; echo "done in $(( $(date +%s) - start )) s"
