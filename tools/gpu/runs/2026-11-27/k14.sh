#!/usr/bin/env bash
# One GPU, the machine of k13 still warm: the install proof from the wheel alone
# (tools/gpu/wheel.sh: torch_checks under enable() and fragctl run, torchrun, gpt2m), then six
# more rounds of k13's replays (the binaries k13 built in /tmp/k13), torch, 9c4f8db and
# 83e4f48 rotated, for the quiet rounds. Results: $OUT/k14.tar.gz.
set -uo pipefail
start=$(date +%s)
el() { echo "[$(( $(date +%s) - start )) s] $*"; }
echo "commit: $(cat .carry/commit)"
M=/tmp/k14; rm -rf $M; mkdir -p $M
(OUT=$M timeout 300 bash tools/gpu/wheel.sh 2>&1 | cut -c1-300 | tail -25)
el "wheel proof done"
L=/tmp/k13
[ -x $L/new/tools/fragctl ] || { echo "k13's binaries are gone"; exit 1; }
T="tests/data/gpt2m.trace.csv.gz tests/data/resnet50.trace.csv.gz benchmarks/traces/sample.trace.csv.gz"
run() {
  case $1 in
    torch) env -u PYTORCH_CUDA_ALLOC_CONF -u PYTORCH_ALLOC_CONF timeout 90 $L/tr/torch_replay replay $T > $M/torch-$2.json 2> $M/torch-$2.err ;;
    *) timeout 90 $L/$1/tools/fragctl replay $T --policy arena --backend cuda --json > $M/$1-$2.json 2> $M/$1-$2.err ;;
  esac
}
for r in 4 5 6 7 8 9; do
  case $((r % 3)) in
    1) run torch $r; run old $r; run new $r ;;
    2) run new $r; run torch $r; run old $r ;;
    0) run old $r; run new $r; run torch $r ;;
  esac
done
el "replays done"
python3 - $M <<'PY'
import json, os, statistics, sys
M = sys.argv[1]
def load(p):
    try: runs = json.load(open(p))
    except Exception: return {}
    runs = runs if isinstance(runs, list) else [runs]
    return {os.path.basename(str(r.get("trace"))).split(".")[0]: r for r in runs}
for t in ("gpt2m", "resnet50", "sample"):
    line = [t]
    for a in ("torch", "old", "new"):
        v = [load(f"{M}/{a}-{r}.json").get(t, {}).get("median_ns") for r in range(4, 10)]
        g = sorted(x for x in v if x is not None)
        line.append(f"{a}: " + " / ".join("-" if x is None else f"{x:.0f}" for x in v) + (f" (lowest {g[0]:.0f}, median {statistics.median(g):.0f})" if g else ""))
    print(" | ".join(line))
PY
tar -czf $OUT/k14.tar.gz -C $M . 2>/dev/null; el "done"
