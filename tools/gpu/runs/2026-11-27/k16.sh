#!/usr/bin/env bash
# One GPU: the session's last code from the wheel alone (no devkit, no build): the install proof
# (tools/gpu/wheel.sh), then, with the wheel's own command, a trace with two streams
# (.carry/streams.trace.csv: a block allocated and freed on each, then one more) replayed on cuda
# through graph_pool, graph_pool:arena, caching and arena (before 442ffc2 a graph pool's teardown
# used the destroyed streams: the runtime's invalid-handle error in the log), and a misspelt
# FRAGCTL_ variable whose name holds ESC, whose warning must show it written out. Results:
# $OUT/k16.tar.gz.
set -uo pipefail
start=$(date +%s)
el() { echo "[$(( $(date +%s) - start )) s] $*"; }
echo "commit: $(cat .carry/commit)"
M=/tmp/k16; rm -rf $M; mkdir -p $M
(OUT=$M timeout 300 bash tools/gpu/wheel.sh 2>&1 | cut -c1-300 | tail -25)
el "wheel proof done"
export PYTHONPATH=/tmp/fragctl-site
python3 -m fragctl replay .carry/streams.trace.csv --backend cuda --policy graph_pool,graph_pool:arena,caching,arena \
  > $M/streams.out 2> $M/streams.err
echo "replay exit $?; stderr lines: $(wc -l < $M/streams.err)"; cat $M/streams.out; head -5 $M/streams.err
env $'FRAGCTL_POLIC\x1bY=arena' python3 -c "import fragctl; a = fragctl.Allocator('arena', backend='cuda'); print('allocator on', a.stats()['backend'])" \
  > $M/misspelt.out 2> $M/misspelt.err
echo "a misspelt variable holding ESC: exit $?; raw ESC bytes on stderr: $(grep -c $'\x1b' $M/misspelt.err)"; cat $M/misspelt.out; head -3 $M/misspelt.err
tar -czf $OUT/k16.tar.gz -C $M . 2>/dev/null; el "done"
