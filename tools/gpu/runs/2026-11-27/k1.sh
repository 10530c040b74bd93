#!/usr/bin/env bash
# One GPU: why the arena's fast path is slower on the GPU machine than on the build machine.
# The same Release fragctl_cli replays the three shared traces with the arena and caching on
# `sim` and on `cuda`, five rounds alternated (sim first in odd rounds), on the same host; then
# perf (where the machine has it) over one cuda and one sim replay. Results: $OUT/k1.tar.gz.
set -uo pipefail
start=$(date +%s)
L=/tmp/k1; rm -rf $L; mkdir -p $L
echo "commit: $(cat .carry/commit 2>/dev/null)"
source .devkit/devkit.sh unpack
lscpu | grep -E "Model name|MHz|L2|L3|^CPU\(s\)|Hypervisor" | tee $L/cpu.txt
cat /sys/devices/system/clocksource/clocksource0/current_clocksource | tee -a $L/cpu.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a $L/cpu.txt
cmake -S . -B /tmp/bk1 -G Ninja -DCMAKE_BUILD_TYPE=Release -DFRAGCTL_BUILD_TESTS=OFF -DFRAGCTL_BUILD_BENCHMARKS=OFF \
  -DFRAGCTL_WERROR=OFF > $L/build.log 2>&1 && cmake --build /tmp/bk1 --target fragctl_cli >> $L/build.log 2>&1 || { tail -20 $L/build.log; }
echo "[built at $(( $(date +%s) - start )) s]"
cli=/tmp/bk1/tools/fragctl
T="tests/data/gpt2m.trace.csv.gz tests/data/resnet50.trace.csv.gz benchmarks/traces/sample.trace.csv.gz"
summ() { python3 -c "
import json,sys
for r in json.load(open(sys.argv[1])): print(sys.argv[2], r['trace'], r['policy'], r['backend'], r['median_ns'], r['median_alloc_ns'], r['median_free_ns'], r['p90_ns'], r['clock_overhead_ns'], r['backend_memory_calls'], round(r['reserved_over_requested'],4))
" "$1" "$2"; }
for round in 1 2 3 4 5; do
  if [ $((round % 2)) = 1 ]; then order="sim cuda"; else order="cuda sim"; fi
  for b in $order; do
    $cli replay $T --backend $b --policy arena,caching --json > $L/r$round-$b.json 2> $L/r$round-$b.err
    summ $L/r$round-$b.json $round
  done
done | tee $L/rounds.txt
echo "[rounds done at $(( $(date +%s) - start )) s]"
if command -v perf >/dev/null; then
  for b in cuda sim; do
    perf stat -e task-clock,cycles,instructions,cache-misses,page-faults -- $cli replay tests/data/gpt2m.trace.csv.gz --backend $b --policy arena --json > /dev/null 2> $L/perfstat-$b.txt
    tail -15 $L/perfstat-$b.txt
    perf record -F 20000 -g -o $L/perf-$b.data -- $cli replay tests/data/gpt2m.trace.csv.gz tests/data/gpt2m.trace.csv.gz --backend $b --policy arena --json > /dev/null 2>&1
    perf report -i $L/perf-$b.data --no-children --percent-limit 0.7 --stdio 2>/dev/null | grep -v "^$" | head -80 > $L/perfrep-$b.txt
    rm -f $L/perf-$b.data
  done
else
  echo "no perf on this machine"
fi
tar -czf $OUT/k1.tar.gz -C $L . 2>/dev/null; echo "done in $(( $(date +%s) - start )) s"
