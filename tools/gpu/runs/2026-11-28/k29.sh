#!/usr/bin/env bash
# One GPU: the replay clock (8477285, util::op_clock: the invariant TSC, fenced) against the
# steady_clock it replaces, on the three shared traces, for PyTorch's caching allocator
# (benchmarks/torch_replay) and fragctl's arena on cuda. The code before it (1c888d4, carried
# as .carry/base.tar.gz) has the same allocator and the old clock in both replays, so old
# against new is the clock alone. Four columns, each in its own process, six rounds in
# rotated order. Results on stdout and $OUT/k29.tar.gz.
set -uo pipefail
start=$(date +%s)
el() { echo "[$(( $(date +%s) - start )) s] $*"; }
source .devkit/devkit.sh unpack
L=/tmp/k29; rm -rf $L; mkdir -p $L/base
tar -xzf .carry/base.tar.gz -C $L/base
echo "commit: $(cat .carry/commit)  base: 1c888d4"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
echo "cpu: $(nproc) x $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
echo "clocksource: $(cat /sys/devices/system/clocksource/clocksource0/current_clocksource) (available: $(cat /sys/devices/system/clocksource/clocksource0/available_clocksource))"
echo "tsc flags: $(grep -m1 -o -w 'constant_tsc\|nonstop_tsc\|tsc_known_freq\|rdtscp' /proc/cpuinfo | tr '\n' ' ')"
torch_dir=$(python3 -c 'import torch, os; print(os.path.dirname(torch.__file__))')
torch_abi=$(python3 -c 'import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))')
build() {  # src dir, build dir
  cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFRAGCTL_BUILD_TESTS=OFF \
    -DFRAGCTL_BUILD_BENCHMARKS=OFF -DFRAGCTL_WERROR=OFF > "$2.log" 2>&1 &&
    cmake --build "$2" --target fragctl_cli -j 6 >> "$2.log" 2>&1 || echo "build $2 failed"
}
build_tr() {  # src dir, build dir
  (cmake -S "$1/benchmarks/torch_replay" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTORCH_DIR="$torch_dir" \
     -DTORCH_CXX11_ABI="$torch_abi" && cmake --build "$2" -j 2) > "$2.log" 2>&1 || echo "build $2 failed"
}
build . $L/new & build $L/base $L/old & build_tr . $L/trnew & build_tr $L/base $L/trold &
wait
el "built"
T="tests/data/gpt2m.trace.csv.gz tests/data/resnet50.trace.csv.gz benchmarks/traces/sample.trace.csv.gz"
run() {  # column round
  case $1 in
    torch_old|torch_new) env -u PYTORCH_CUDA_ALLOC_CONF -u PYTORCH_ALLOC_CONF timeout 90 $L/tr${1#torch_}/torch_replay replay $T > $L/$1-$2.json 2> $L/$1-$2.err ;;
    arena_old|arena_new) timeout 90 $L/${1#arena_}/tools/fragctl replay $T --policy arena --backend cuda --json > $L/$1-$2.json 2> $L/$1-$2.err ;;
  esac
  echo "  $1 round $2: exit $?"
}
cols=(torch_old torch_new arena_old arena_new)
for r in 1 2 3 4 5 6; do
  for i in 0 1 2 3; do run ${cols[$(( (i + r - 1) % 4 ))]} $r; done
done
el "replays done"
python3 - $L <<'PY'
import json, os, statistics, sys
L = sys.argv[1]
cols = ("torch_old", "torch_new", "arena_old", "arena_new")
def load(p):
    try: runs = json.load(open(p))
    except Exception: return {}
    runs = runs if isinstance(runs, list) else [runs]
    return {os.path.basename(str(r.get("trace"))).split(".")[0]: r for r in runs}
res = {c: [load(f"{L}/{c}-{r}.json") for r in range(1, 7)] for c in cols}
print("median ns per operation, rounds 1-6, then the median of rounds; clock = median empty interval (ns), clock source")
for t in ("gpt2m", "resnet50", "sample"):
    print(f"## {t}")
    for c in cols:
        v = [r.get(t, {}).get("median_ns") for r in res[c]]
        clk = [r.get(t, {}).get("clock_overhead_ns") for r in res[c]]
        src = {r.get(t, {}).get("clock", "steady_clock (old)") for r in res[c] if t in r}
        g = [x for x in v if x is not None]; k = [x for x in clk if x is not None]
        print(f"{c:10s} " + " ".join("-" if x is None else f"{x:6.1f}" for x in v)
              + f" | median {statistics.median(g):6.1f}" * bool(g) + f" | clock {statistics.median(k):5.1f} {sorted(src)}" * bool(k))
    for a, b in (("arena_new", "torch_new"), ("arena_old", "torch_old")):
        q = [r1[t]["median_ns"] / r2[t]["median_ns"] for r1, r2 in zip(res[a], res[b]) if t in r1 and t in r2]
        if q: print(f"  {a}/{b} by round: median {statistics.median(q):.3f} [{min(q):.3f}-{max(q):.3f}]")
    r = next((r[t] for r in res["arena_new"] if t in r), None)
    if r: print(f"  arena_new reserved/requested {r['reserved_over_requested']:.4f}, driver memory calls {r['backend_memory_calls']}, median alloc {r['median_alloc_ns']:.1f} free {r['median_free_ns']:.1f}")
PY
mkdir -p "${OUT:-/tmp}"; (cd $L && tar -czf "${OUT:-/tmp}/k29.tar.gz" *.json *.err *.log)
el "done"
