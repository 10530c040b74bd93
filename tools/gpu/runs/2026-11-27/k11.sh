#!/usr/bin/env bash
# One GPU: whether huge pages for the heap speed the fast path on the GPU machine's CPU (k10
# hinted so, within its noise). One Release build; six rounds, each replaying the shared traces
# (`fragctl replay`, arena on sim, per-operation medians) and running bench_loop (tight loop,
# mean ns/op, whole stack and policy alone) once without and once with
# GLIBC_TUNABLES=glibc.malloc.hugetlb=1, the order alternated round by round. Results: $OUT/k11.tar.gz.
set -uo pipefail
start=$(date +%s)
L=/tmp/k11; rm -rf $L; mkdir -p $L
echo "commit: $(cat .carry/commit 2>/dev/null)"
source .devkit/devkit.sh unpack
{ lscpu | grep -E "Model name|MHz|^CPU\(s\)"; echo "thp: $(cat /sys/kernel/mm/transparent_hugepage/enabled)"; } | tee $L/cpu.txt
cmake -S . -B /tmp/bk11 -G Ninja -DCMAKE_BUILD_TYPE=Release -DFRAGCTL_BUILD_TESTS=OFF -DFRAGCTL_BUILD_BENCHMARKS=ON \
  -DFRAGCTL_WERROR=OFF > $L/build.log 2>&1 && cmake --build /tmp/bk11 --target fragctl_cli bench_loop >> $L/build.log 2>&1 || { tail -20 $L/build.log; }
echo "[built at $(( $(date +%s) - start )) s]"
cli=/tmp/bk11/tools/fragctl; loop=/tmp/bk11/benchmarks/bench_loop
T="tests/data/gpt2m.trace.csv.gz tests/data/resnet50.trace.csv.gz benchmarks/traces/sample.trace.csv.gz"
summ() { python3 -c "
import json,sys
for r in json.load(open(sys.argv[1])): print(sys.argv[2], 'replay', r['trace'], 'median', r['median_ns'], 'clock', r['clock_overhead_ns'])
" "$1" "$2"; }
one() {  # $1 round, $2 none|hugetlb
  if [ $2 = hugetlb ]; then export GLIBC_TUNABLES=glibc.malloc.hugetlb=1; else unset GLIBC_TUNABLES; fi
  $cli replay $T --backend sim --policy arena --json > $L/r$1-$2.json 2> $L/r$1-$2.err
  summ $L/r$1-$2.json "r$1 $2"
  $loop --traces=tests/data/gpt2m.trace.csv.gz,tests/data/resnet50.trace.csv.gz --rounds=10 2>/dev/null | grep -E "^\| (gpt2m|resnet50)" | sed "s/^/r$1 $2 loop /"
  unset GLIBC_TUNABLES
}
for round in 1 2 3 4 5 6; do
  if [ $((round % 2)) = 1 ]; then one $round none; one $round hugetlb; else one $round hugetlb; one $round none; fi
done 2>&1 | tee $L/rounds.txt
echo "[rounds done at $(( $(date +%s) - start )) s]"
tar -czf $OUT/k11.tar.gz -C $L . 2>/dev/null; echo "done in $(( $(date +%s) - start )) s"
