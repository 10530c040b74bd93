#!/usr/bin/env bash
# Two GPUs: the NCCL hang of issue 31 (nccl_hang.py) and the step plan of issue 32 replayed on cuda (plan off/on, alternated). Run from the repository root with .devkit carried.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
source .devkit/devkit.sh unpack
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader
t0=$SECONDS
FRAGCTL_BUILD_TYPE=Release FRAGCTL_BUILD_DIR=build-gpu tools/build.sh -DFRAGCTL_BUILD_TESTS=OFF \
  -DFRAGCTL_BUILD_BENCHMARKS=OFF -DFRAGCTL_WERROR=OFF > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
echo "[$((SECONDS - t0)) s] built"
NCCL=$(python3 -c "import nvidia.nccl,os;print(os.path.join(list(nvidia.nccl.__path__)[0],'lib','libnccl.so.2'))")
export FRAGCTL_LIBRARY=$PWD/build-gpu/libfragctl.so PYTHONPATH=$PWD/python FRAGCTL_NCCL_LIBRARY=$NCCL
echo "--- nccl_hang.py --timeout 12"
h0=$SECONDS
timeout 100 python3 benchmarks/zero3/nccl_hang.py --timeout 12 --out $OUT/hang > $OUT/hang.json 2> $OUT/hang.err
echo "rc=$? after $((SECONDS - h0)) s"; cat $OUT/hang.json; grep -E "fragctl|Watchdog|ending" $OUT/hang.err | cut -c1-400 | head -12
ps aux | grep -c "[n]ccl_hang" | sed 's/^/processes left: /'
echo "[$((SECONDS - t0)) s] --- step plan: cuda replay of the fixed-shape declm model, plan off/on, twice"
python3 benchmarks/trainers/declm_trace.py --out $OUT/declm_fixed.trace.csv.gz --min-tokens 2048 --max-tokens 2048 --steps 20 > /dev/null
F=$(ls build-gpu/tools/fragctl build-gpu/fragctl 2>/dev/null | head -1)
for i in 1 2; do for c in step_plan:false step_plan:true; do
  timeout 60 $F replay $OUT/declm_fixed.trace.csv.gz tests/data/gpt2m.trace.csv.gz --backend cuda --policy arena --conf $c --json > $OUT/replay-${c/:/-}-$i.json 2>$OUT/replay-${c/:/-}-$i.err
  echo "$c run $i rc=$?"; done; done
python3 - $OUT <<'PY'
import json,sys,glob,os
for p in sorted(glob.glob(os.path.join(sys.argv[1],"replay-*.json"))):
    try: d=json.load(open(p))
    except Exception as e: print(p,"unreadable",e); continue
    print(os.path.basename(p), json.dumps(d)[:1500])
PY
echo "[$((SECONDS - t0)) s] done"
