#!/usr/bin/env bash
# One GPU: where the fast path's time goes on the GPU machine's CPU. The same Release
# build replays the shared traces on `sim` (arena), three rounds alternated with and
# without glibc's transparent huge pages for its heap (GLIBC_TUNABLES=glibc.malloc.hugetlb=1);
# a tight loop over each trace's operations (.carry/hot.cpp, no clock per operation)
# through the whole stack and through the arena alone, the plan on and off. Results: $OUT/k10.tar.gz.
set -uo pipefail
start=$(date +%s)
L=/tmp/k10; rm -rf $L; mkdir -p $L
echo "commit: $(cat .carry/commit 2>/dev/null)"
source .devkit/devkit.sh unpack
{ lscpu | grep -E "Model name|MHz|L1d|L2|L3|^CPU\(s\)|Hypervisor"; echo "thp: $(cat /sys/kernel/mm/transparent_hugepage/enabled) defrag: $(cat /sys/kernel/mm/transparent_hugepage/defrag)";
  echo "clocksource: $(cat /sys/devices/system/clocksource/clocksource0/current_clocksource)"; } | tee $L/cpu.txt
cmake -S . -B /tmp/bk10 -G Ninja -DCMAKE_BUILD_TYPE=Release -DFRAGCTL_BUILD_TESTS=OFF -DFRAGCTL_BUILD_BENCHMARKS=OFF \
  -DFRAGCTL_WERROR=OFF > $L/build.log 2>&1 && cmake --build /tmp/bk10 --target fragctl_cli fragctl >> $L/build.log 2>&1 || { tail -20 $L/build.log; }
g++ -std=c++20 -O2 -I include -I /tmp/bk10/include -I $DEVKIT_PREFIX/usr/include .carry/hot.cpp -o /tmp/hot \
  -L/tmp/bk10 -lfragctl -Wl,-rpath,/tmp/bk10 -L$DEVKIT_PREFIX/usr/lib/x86_64-linux-gnu -labsl_status -labsl_statusor 2>&1 | tail -5
echo "[built at $(( $(date +%s) - start )) s]"
cli=/tmp/bk10/tools/fragctl
T="tests/data/gpt2m.trace.csv.gz tests/data/resnet50.trace.csv.gz benchmarks/traces/sample.trace.csv.gz"
summ() { python3 -c "
import json,sys
for r in json.load(open(sys.argv[1])): print(sys.argv[2], r['trace'], r['policy'], 'median', r['median_ns'], 'alloc', r['median_alloc_ns'], 'free', r['median_free_ns'], 'p90', r['p90_ns'], 'clock', r['clock_overhead_ns'])
" "$1" "$2"; }
/tmp/hot tests/data/resnet50.trace.csv.gz 2 2>/dev/null | tail -1
CLOCKS=1 /tmp/hot tests/data/resnet50.trace.csv.gz 2 2>/dev/null | tail -2 | head -1
for round in 1 2 3; do
  for tun in none hugetlb; do
    if [ $tun = hugetlb ]; then export GLIBC_TUNABLES=glibc.malloc.hugetlb=1; else unset GLIBC_TUNABLES; fi
    $cli replay $T --backend sim --policy arena --json > $L/r$round-$tun.json 2> $L/r$round-$tun.err
    summ $L/r$round-$tun.json "r$round $tun replay"
    for lvl in 0 4; do
      for conf in "" "step_plan:false"; do
        for t in gpt2m:20 resnet50:40; do
          echo "r$round $tun level=$lvl conf=$conf $(LEVEL=$lvl CONF=$conf /tmp/hot tests/data/${t%%:*}.trace.csv.gz ${t##*:} 2>/dev/null | tail -1)"
        done
      done
    done
  done
done 2>&1 | tee $L/rounds.txt
unset GLIBC_TUNABLES
echo "[rounds done at $(( $(date +%s) - start )) s]"
command -v perf >/dev/null && echo "perf: yes" || echo "perf: none"
tar -czf $OUT/k10.tar.gz -C $L . 2>/dev/null; echo "done in $(( $(date +%s) - start )) s"
