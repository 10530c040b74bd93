#!/usr/bin/env bash
# One GPU: the fast path after the arena's granule counts by span (83e4f48), beside the code
# before it (9c4f8db, carried as .carry/base.tar.gz) and PyTorch's caching allocator: the three
# shared traces replayed on cuda, each allocator in its own process, three rounds in a Latin
# square (torch, old, new / new, torch, old / old, new, torch); then bench_loop old and new
# alternated (the tight loop on sim, no clock per operation), and the bound on a fused front
# (.carry/fused.cpp, not kept: the whole stack, the policy alone, and a lock, the statistics'
# counters and the limit inline over the policy, 30 rounds rotated). Results: $OUT/k13.tar.gz.
set -uo pipefail
start=$(date +%s)
el() { echo "[$(( $(date +%s) - start )) s] $*"; }
source .devkit/devkit.sh unpack
L=/tmp/k13; rm -rf $L; mkdir -p $L/base
tar -xzf .carry/base.tar.gz -C $L/base
echo "commit: $(cat .carry/commit)  base: 9c4f8db"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
echo "cpu: $(nproc) x $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
torch_dir=$(python3 -c 'import torch, os; print(os.path.dirname(torch.__file__))')
torch_abi=$(python3 -c 'import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))')
build() {  # src dir, build dir
  cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFRAGCTL_BUILD_TESTS=OFF \
    -DFRAGCTL_BUILD_BENCHMARKS=ON -DFRAGCTL_WERROR=OFF > "$2.log" 2>&1 &&
    cmake --build "$2" --target fragctl_cli bench_loop fragctl -j 6 >> "$2.log" 2>&1 || echo "build $2 failed"
}
build . $L/new & build $L/base $L/old &
(cmake -S benchmarks/torch_replay -B $L/tr -G Ninja -DCMAKE_BUILD_TYPE=Release -DTORCH_DIR="$torch_dir" \
   -DTORCH_CXX11_ABI="$torch_abi" && cmake --build $L/tr -j 4) > $L/tr.log 2>&1 &
wait
el "built"; tail -2 $L/new.log $L/old.log $L/tr.log | cut -c1-200
T="tests/data/gpt2m.trace.csv.gz tests/data/resnet50.trace.csv.gz benchmarks/traces/sample.trace.csv.gz"
run() {  # allocator round
  case $1 in
    torch) env -u PYTORCH_CUDA_ALLOC_CONF -u PYTORCH_ALLOC_CONF timeout 90 $L/tr/torch_replay replay $T > $L/torch-$2.json 2> $L/torch-$2.err ;;
    *) timeout 90 $L/$1/tools/fragctl replay $T --policy arena --backend cuda --json > $L/$1-$2.json 2> $L/$1-$2.err ;;
  esac
  echo "  $1 round $2: exit $?"
}
run torch 1; run old 1; run new 1
run new 2; run torch 2; run old 2
run old 3; run new 3; run torch 3
el "replays done"
python3 - $L <<'PY'
import json, os, statistics, sys
L = sys.argv[1]
def load(p):
    try: runs = json.load(open(p))
    except Exception: return {}
    runs = runs if isinstance(runs, list) else [runs]
    return {os.path.basename(str(r.get("trace"))).split(".")[0]: r for r in runs}
res = {a: [load(f"{L}/{a}-{r}.json") for r in (1, 2, 3)] for a in ("torch", "old", "new")}
print("| trace | torch r1/r2/r3 | arena 9c4f8db r1/r2/r3 | arena 83e4f48 r1/r2/r3 | median of rounds torch / old / new | clock ns | new reserved/requested, calls | old reserved/requested, calls |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
for t in ("gpt2m", "resnet50", "sample"):
    cells, meds = [], []
    for a in ("torch", "old", "new"):
        v = [r.get(t, {}).get("median_ns") for r in res[a]]
        cells.append(" / ".join("-" if x is None else f"{x:.0f}" for x in v))
        g = [x for x in v if x is not None]; meds.append(f"{statistics.median(g):.0f}" if g else "-")
    clk = [r[t]["clock_overhead_ns"] for r in res["new"] if t in r]
    def rr(a):
        r = next((r[t] for r in res[a] if t in r), None)
        return f"{r['reserved_over_requested']:.4f}, {r['backend_memory_calls']}" if r else "-"
    print(f"| {t} | {cells[0]} | {cells[1]} | {cells[2]} | {' / '.join(meds)} | {statistics.median(clk):.0f} | {rr('new')} | {rr('old')} |" if clk else f"| {t} | {cells} |")
PY
for r in 1 2 3; do
  for v in old new; do
    echo "bench_loop $v round $r"
    timeout 60 $L/$v/benchmarks/bench_loop --traces=tests/data/gpt2m.trace.csv.gz,tests/data/resnet50.trace.csv.gz,benchmarks/traces/sample.trace.csv.gz --rounds=10 2>/dev/null | grep arena
  done
done
el "bench_loop done"
P=$DEVKIT_PREFIX/usr
g++ -std=c++20 -O2 -I include -I . -I src -I $L/new/include -I $P/include .carry/fused.cpp -o $L/fused \
  -L$L/new -lfragctl -Wl,-rpath,$L/new -L$P/lib/x86_64-linux-gnu -labsl_statusor -labsl_status -labsl_hash \
  -labsl_raw_hash_set -labsl_city -labsl_low_level_hash 2> $L/fused.err || tail -5 $L/fused.err
for t in gpt2m resnet50; do
  echo "fused bound, $t (ns/op, 10 rounds each, rotated):"
  timeout 60 $L/fused tests/data/$t.trace.csv.gz 2>/dev/null | sort | awk '{a[$1]=a[$1]" "$2} END{for(k in a) print "  " k ":" a[k]}'
done
el "done"
tar -czf $OUT/k13.tar.gz -C $L --exclude=new --exclude=old --exclude=tr --exclude=base --exclude=fused . 2>/dev/null
