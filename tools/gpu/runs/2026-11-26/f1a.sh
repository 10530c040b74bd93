#!/usr/bin/env bash
# One GPU: the install proof of the wheel built on the project's machine (no devkit, nothing built here).
set -uo pipefail
export PYTHONUNBUFFERED=1
L=/tmp/f1a; mkdir -p $L
OUT=$L timeout 560 bash tools/gpu/wheel.sh 2>&1 | cut -c1-400
tar -czf $OUT/f1a.tar.gz -C $L . 2>/dev/null; echo done
